"""The zoo's check.py (exactformer/export/lens_check.py) must not pass a model whose
TransformerLens outputs are nan for some pairs: Python's ``max`` keeps a number when a nan
follows it, so a largest error taken with it read 0 for a folder whose later pairs gave nan,
and check.py printed "OK  error/scale 0"."""

from __future__ import annotations

import json
import math
import shutil

import pytest

pytest.importorskip("transformer_lens")
torch = pytest.importorskip("torch")
from conftest import folder_bridge  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

from exactformer.export import lens_check, zoo  # noqa: E402


def _tamper_weights(folder) -> None:
    """An unused layer-0 MLP unit made to fire only on tokens whose first coordinate is 5
    and to write 5e306·1e308 = inf into a coordinate: those tokens' sequences end in nan,
    every other sequence's outputs stay bit for bit as they were."""
    path = folder / "transformer_lens" / "model.safetensors"
    t = load_file(str(path))
    w_in, b_in = t["blocks.0.mlp.in.weight"], t["blocks.0.mlp.in.bias"]
    w_out = t["blocks.0.mlp.out.weight"]
    u = next(u for u in range(w_in.shape[0])
             if not w_in[u].any() and not b_in[u] and not w_out[:, u].any())
    w_in[u, 0], b_in[u], w_out[5, u] = 1e307, -4.5e307, 1e308
    save_file(t, str(path))


def _no_exclusive_units(folder) -> None:
    """circuit.json made to say that every pair uses every unit and head, so that no
    ablation is tested (what remains are the targets, the unused units and the patch)."""
    path = folder / "circuit.json"
    doc = json.loads(path.read_text())
    units, heads = {}, {}
    for e in doc["pairs"]:
        for mine, theirs in ((units, e["units"]), (heads, e["heads"])):
            for k, v in theirs.items():
                mine[k] = sorted(set(mine.get(k, [])) | set(v))
    for e in doc["pairs"]:
        e["units"], e["heads"] = units, heads
    path.write_text(json.dumps(doc))


def test_check_fails_a_folder_whose_later_pairs_give_nan(tmp_path):
    zoo.write_model(zoo.ENTRIES[0], tmp_path / "demo-keyed")  # set data, pair 0 unaffected
    folder = tmp_path / "tampered"
    shutil.copytree(tmp_path / "demo-keyed", folder)
    _tamper_weights(folder)
    _no_exclusive_units(folder)
    # independently of check.py: the folder's own loader, every pair run alone
    bridge, lens_helpers = folder_bridge(folder)
    data = json.loads((folder / "data.json").read_text())
    finite = []
    for seq in data["inputs"]:
        x, _ = lens_helpers.pad_batch([[[float(v) for v in r] for r in seq]],
                                      bridge.cfg.d_model)
        with torch.no_grad():
            finite.append(bool(torch.isfinite(bridge(x, return_type="logits")).all()))
    assert finite[0] and not all(finite)  # the nan pairs come after a finite one
    report = lens_check.check(folder)
    assert math.isnan(report["error"]) and not report["targets"]
    assert not report["ok"]
    (tmp_path / "index.json").write_text(json.dumps({"models": [{"name": "tampered"}]}))
    assert lens_check.main([str(tmp_path), "tampered"]) == 1
    assert lens_check.check(tmp_path / "demo-keyed")["ok"]  # the untouched folder passes
