"""Every Python block of README.md and docs/*.md runs as written.

Each page's ```python blocks run in order, in one fresh namespace, inside an empty temporary
directory, so a block may use what an earlier block of the same page defined and nothing
else. A page whose blocks import an optional extra (torch, transformer_lens, matplotlib) is
skipped only where that extra is not installed; ``make test`` installs them all. Other blocks
(shell commands, outputs) are not run.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
EXTRAS = ("torch", "transformer_lens", "matplotlib", "safetensors")
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def blocks(page: Path) -> list[str]:
    return BLOCK.findall(page.read_text(encoding="utf-8"))


def test_the_block_pattern_finds_fenced_python_only(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("```\nshell\n```\n```python\na = 1\n```\ntext\n```python\nb = a\n```\n")
    assert blocks(page) == ["a = 1\n", "b = a\n"]


@pytest.mark.parametrize("page", [p for p in PAGES if blocks(p)],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_every_python_block_runs(page, tmp_path, monkeypatch):
    code = blocks(page)
    for extra in EXTRAS:
        if re.search(rf"^\s*(import|from) {extra}\b", "".join(code), re.M):
            pytest.importorskip(extra)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # a page may add an export folder
    monkeypatch.delitem(sys.modules, "lens_helpers", raising=False)
    namespace: dict = {"__name__": "__doc_snippet__"}
    for k, source in enumerate(code):
        try:
            exec(compile(source, f"{page.name} python block {k + 1}", "exec"), namespace)
        except Exception as e:
            raise AssertionError(f"{page.relative_to(ROOT)}, python block {k + 1} "
                                 f"fails: {type(e).__name__}: {e}") from e
