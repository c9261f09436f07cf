"""The zoo's check.py (exactformer/export/lens_check.py) judges the targets within 1e-9 of the
data's scale. It floored that scale at 1, so for data at 1e-30 the tolerance was 1e-9
absolute: a folder whose data.json targets were doubled after export (the bridge misses them
by 0.75 × their scale, measured here with the folder's own loader and NumPy) printed
"OK  error/scale 6e-30"."""

from __future__ import annotations

import json
import shutil
from fractions import Fraction

import numpy as np
import pytest

pytest.importorskip("transformer_lens")
torch = pytest.importorskip("torch")

from conftest import folder_bridge  # noqa: E402

from exactformer.data import Dataset, builtin  # noqa: E402
from exactformer.export import lens_check, zoo  # noqa: E402

S = Fraction(10) ** -30


def _tiny() -> Dataset:
    d = builtin.demo()
    return Dataset.from_arrays([[[v * S for v in t] for t in x] for x in d.inputs],
                               [[[v * S for v in t] for t in y] for y in d.targets])


def _relative_error(folder) -> float:
    """Hausdorff error of the folder's bridge on its data.json over that data's scale."""
    bridge, lens_helpers = folder_bridge(folder)
    data = json.loads((folder / "data.json").read_text())
    rows = [[[float(Fraction(v)) for v in r] for r in s] for s in data["inputs"]]
    ys = [np.array([[float(Fraction(v)) for v in r] for r in s]) for s in data["targets"]]
    scale = max(max(np.abs(np.array(x)).max() for x in rows), max(np.abs(y).max() for y in ys))
    worst = 0.0
    for x, y in zip(rows, ys, strict=True):
        xt, _ = lens_helpers.pad_batch([x], bridge.cfg.d_model)
        with torch.no_grad():
            out = bridge(xt, return_type="logits")[0].double().numpy()
        target = np.zeros((len(y), out.shape[1]))
        target[:, :y.shape[1]] = y
        dist = np.sqrt(((out[:, None] - target[None]) ** 2).sum(-1))
        worst = max(worst, dist.min(1).max(), dist.min(0).max())
    return worst / scale


def test_check_judges_tiny_data_on_their_own_scale(tmp_path):
    entry = zoo.Entry("tiny", "demo at 1e-30", _tiny, "demo × 1e-30")
    zoo.write_model(entry, tmp_path / "tiny")
    assert _relative_error(tmp_path / "tiny") <= 1e-9
    assert lens_check.check(tmp_path / "tiny")["ok"]  # the untouched folder passes
    folder = tmp_path / "doubled"
    shutil.copytree(tmp_path / "tiny", folder)
    doc = json.loads((folder / "data.json").read_text())
    doc["targets"] = [[[str(2 * Fraction(v)) for v in r] for r in s] for s in doc["targets"]]
    (folder / "data.json").write_text(json.dumps(doc))
    assert _relative_error(folder) > 0.5  # 0.75: the targets are not reproduced
    report = lens_check.check(folder)
    assert report["error"] > 0.5 and not report["targets"] and not report["ok"]
