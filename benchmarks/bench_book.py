"""A book recited by a constructed causal model: build, verify and generate back 10^4 to 10^6
characters, with time and peak memory (docs/causal.md#example-reciting-a-text).

The text is, by default, the concatenated docstrings of the running Python's standard library
(module, class and function docstrings in source order, files sorted by path, tests, IDLE, tkinter
and bundled packages left out, joined by blank lines): about 1.5 × 10^6 characters of English
prose that every machine with Python has, offline. ``--file TEXT`` takes any UTF-8 text instead.
Each row builds examples/recite.py's next-character data (characters as small integer vectors
in R^8) with ``exactformer.compile(..., causal=True, width=W, exact=False)``, checks it with
``exactformer.verify`` (the call whose time the row reports), and generates the text back from
its first character with a :class:`~exactformer.tools.decode.Decoder`, feeding each output,
snapped to the nearest character, back in. Generation is reported as the decoder's setup time
and characters per second after it.

Each row runs in a fresh process, so its peak resident memory (after the build, the
verification and the generation) is its own. Printed and written to
benchmarks/results/book.md (or --out).

    python benchmarks/bench_book.py      # 10^4 (width 4 and 1024), 10^5 (1024), 10^6 (4096)
    python benchmarks/bench_book.py --verify-max 100000   # 10^6 built and generated only
"""

from __future__ import annotations

import argparse
import ast
import datetime
import importlib.util
import json
import os
import platform
import resource
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).parent / "results"
EXAMPLES = Path(__file__).parents[1] / "examples"
ROWS = "10000:4,10000:1024,100000:1024,1000000:4096"
LEFT_OUT = {"test", "tests", "idlelib", "tkinter", "turtledemo", "site-packages", "lib2to3",
            "ensurepip", "dist-packages"}
COLUMNS = ["characters", "width", "alphabet", "L", "P", "P positions", "build s", "verify s",
           "verify / build", "verdict", "decoder setup s", "generation chars/s",
           "generated exactly", "peak MiB build", "peak MiB verify", "peak MiB generation"]


def stdlib_docstrings() -> str:
    """The docstrings of the standard library's Python sources (see the module docstring)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    parts = []
    for path in sorted(root.rglob("*.py")):
        if LEFT_OUT & set(path.relative_to(root).parts):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                 ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc:
                    parts.append(doc)
    return "\n\n".join(parts)


def book_text(chars: int, file: str | None = None) -> str:
    """The first ``chars`` characters of the file (UTF-8) or of the standard library's
    docstrings; a ValueError when the source is shorter."""
    text = recite_module().read_text(file) if file else stdlib_docstrings()
    if len(text) < chars:
        raise ValueError(f"{file or 'the standard library docstrings'}: {len(text)} characters, "
                         f"fewer than the {chars} asked for")
    return text[:chars]


def source_name(file: str | None) -> str:
    return (f"`{Path(file).name}`" if file else
            f"the docstrings of the Python {platform.python_version()} standard library")


def recite_module():
    """examples/recite.py, imported from its file."""
    spec = importlib.util.spec_from_file_location("recite", EXAMPLES / "recite.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def peak_mib() -> float:
    """This process's peak resident memory so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure(chars: int, width: int, file: str | None, verify: bool) -> dict:
    """One row, in this process: build, verify, generate back."""
    import exactformer as ef
    from exactformer.tools.decode import Decoder, nearest

    recite = recite_module()
    text = book_text(chars, file)
    alphabet, vocab = recite.alphabet_vectors([text])
    data = recite.next_character_data([text], alphabet, vocab)
    t0 = time.perf_counter()
    model = ef.compile(data, exact=False, causal=True, width=width)
    t1 = time.perf_counter()
    row = {"characters": chars, "width": width, "alphabet": len(alphabet), "L": model.n_blocks,
           "P": model.n_params(), "P positions": int(np.size(model.positions)),
           "build s": f"{t1 - t0:.2f}", "peak MiB build": f"{peak_mib():.0f}"}
    if verify:
        report = ef.verify(model, data)
        t2 = time.perf_counter()
        row.update({"verify s": f"{t2 - t1:.2f}", "verify / build": f"{(t2 - t1) / (t1 - t0):.2f}",
                    "verdict": "OK" if report.ok else "FAILED"})
    else:
        row.update({"verify s": "not run", "verify / build": "", "verdict": "not run"})
    row["peak MiB verify"] = f"{peak_mib():.0f}" if verify else ""
    del data
    t3 = time.perf_counter()
    dec = Decoder(model)
    t4 = time.perf_counter()
    out, got = dec.push(vocab[alphabet.index(text[0])]), [text[0]]
    for _ in range(chars - 1):
        k = nearest(vocab, out)
        got.append(alphabet[k])
        if len(got) < chars:
            out = dec.push(vocab[k])
    t5 = time.perf_counter()
    row.update({"decoder setup s": f"{t4 - t3:.2f}",
                "generation chars/s": f"{(chars - 1) / (t5 - t4):.0f}",
                "generated exactly": "yes" if "".join(got) == text else "NO",
                "peak MiB generation": f"{peak_mib():.0f}"})
    return row


def measure_in_child(chars: int, width: int, file: str | None, verify: bool) -> dict:
    """:func:`measure` in a fresh Python process (this script with --child), so that the peak
    memory is the row's own."""
    cmd = [sys.executable, __file__, "--child", f"{chars}:{width}"] + \
        (["--file", file] if file else []) + ([] if verify else ["--verify-max", "0"])
    done = subprocess.run(cmd, capture_output=True, text=True, env=os.environ)
    if done.returncode:
        raise RuntimeError(f"row {chars}:{width} failed:\n{done.stderr}")
    return json.loads(done.stdout.splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default=ROWS, help="characters:width, comma-separated")
    ap.add_argument("--file", help="a UTF-8 text instead of the standard library's docstrings")
    ap.add_argument("--verify-max", type=int, default=None,
                    help="verify only rows of at most this many characters (default: all)")
    ap.add_argument("--out", default=str(RESULTS / "book.md"))
    ap.add_argument("--child", help=argparse.SUPPRESS)  # one row, printed as JSON
    args = ap.parse_args(argv)
    if args.child:
        chars, width = (int(v) for v in args.child.split(":"))
        print(json.dumps(measure(chars, width, args.file, args.verify_max != 0)))
        return 0
    cases = [tuple(int(v) for v in r.split(":")) for r in args.rows.split(",")]
    command = " ".join(["python benchmarks/bench_book.py",
                        *(argv if argv is not None else sys.argv[1:])])
    load0 = os.getloadavg()[0]
    rows = []
    for chars, width in cases:
        verify = args.verify_max is None or chars <= args.verify_max
        rows.append(measure_in_child(chars, width, args.file, verify))
        print(" | ".join(f"{c} {rows[-1][c]}" for c in COLUMNS), flush=True)
        # after every row, so that a run stopped early keeps the rows it finished
        write_table(rows, command, (load0, os.getloadavg()[0]), args.file, args.out)
    print("\n" + Path(args.out).read_text())
    return 0 if all(r["verdict"] in ("OK", "not run") and r["generated exactly"] == "yes"
                    for r in rows) else 1


def write_table(rows: list[dict], command: str, load: tuple, file: str | None, out: str,
                note: str = "") -> None:
    from exactformer.modelio import write_text_atomic
    from exactformer.tables import markdown_table
    text = "\n\n".join([
        "# A book recited: build, verify and generation at 10^4 to 10^6 characters",
        f"Measured {datetime.date.today()} on {platform.machine()} ({os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}, numpy {np.__version__}); `{command}`. Load "
        f"average {load[0]:.1f} before and {load[1]:.1f} after (wall-clock times; a load "
        "above 1 means other processes shared the CPUs)." + note,
        f"Text: {source_name(file)}, its first `characters` characters. Model: "
        "examples/recite.py's next-character data (characters as integer vectors in R^8), "
        "hardmax, float64 parameters, built from position keys (docs/causal.md#position-keys: "
        "`width` key units a layer, R_c = 0; P positions counts the stored keys). Verify: "
        "`exactformer.verify` (OK: the exact evaluation of the stored float64 parameters, "
        "bounded by float64 enclosures, is within 1e-9 × the coordinate scale at every "
        "position). Generation: the text generated back from its first character, each output "
        "snapped to the nearest character; decoder setup (preparing the layers' lookup "
        "tables) is reported apart from the "
        "characters per second after it. Peak MiB: the row's own process's peak resident "
        "memory after each stage.",
        markdown_table(rows, COLUMNS)]) + "\n"
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(Path(out), text)


if __name__ == "__main__":
    sys.exit(main())
