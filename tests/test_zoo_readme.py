"""The zoo's README must not call float32 faithful where the folder's own proof says FAILED:
its one column, "float32 faithful (measured)", listed both exports of the paper demo (one
float32 run each, then judged within 1e-3 of the scale) while the folder's config.json
recorded the float32 proof (every evaluation of the dense computation, within 1e-5) as
FAILED."""

from __future__ import annotations

import json
from fractions import Fraction

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformer_lens")
from safetensors.torch import load_file  # noqa: E402

from exactformer.export import zoo  # noqa: E402


def dense_float32(folder, x: np.ndarray) -> np.ndarray:
    """The test's own float32 pass of a hardmax Hub folder's stored parameters (one head
    per layer): FF x ← η·x + W·relu(U·x + b), SA x ← ρ·x + V·(hardmax average)."""
    config = json.loads((folder / "config.json").read_text())
    t = {k: v.float() for k, v in load_file(str(folder / "model.safetensors")).items()
         if not k.startswith("eval.")}
    x = torch.as_tensor(x, dtype=torch.float32)
    for i, blk in enumerate(config["blocks"]):
        if blk["ff"]:
            g = {k: t[f"blocks.{i}.ff.{k}"] for k in ("eta", "U", "b", "W")}
            x = g["eta"] * x + torch.relu(x @ g["U"].T + g["b"]) @ g["W"].T
        if blk["sa"]:
            g = {k: t[f"blocks.{i}.sa.{k}"] for k in ("rho", "alpha", "a", "c", "beta", "p",
                                                     "q")}
            S = (x @ g["c"])[:, None] * (x @ g["a"])[None, :] + g["alpha"] * (x @ x.T)
            hit = (S == S.amax(dim=-1, keepdim=True)).float()
            y = (hit / hit.sum(dim=-1, keepdim=True)) @ x
            x = g["rho"] * x + g["beta"] * y + (y @ g["q"])[:, None] * g["p"]
    return x.double().numpy()


def test_the_readme_shows_the_float32_proof_beside_the_measured_run(tmp_path):
    entry = next(e for e in zoo.ENTRIES if e.name == "demo-paper")
    folder = tmp_path / entry.name
    row = zoo.write_model(entry, folder)
    data = json.loads((folder / "data.json").read_text())
    xs = [np.array([[float(Fraction(v)) for v in r] for r in s]) for s in data["inputs"]]
    ys = [np.array([[float(Fraction(v)) for v in r] for r in s]) for s in data["targets"]]
    scale = max(np.abs(a).max() for a in xs + ys)
    worst = 0.0
    for x, y in zip(xs, ys, strict=True):
        D = np.linalg.norm(dense_float32(folder, x)[:, None] - y[None], axis=-1)
        worst = float(np.max([worst, D.min(axis=1).max(), D.min(axis=0).max()]))
    assert 1e-5 < worst / scale  # the premise: float32 is not faithful within 1e-5
    readme = zoo.zoo_readme({"models": [row]})
    assert "faithful" not in readme
    header, _, line = readme.splitlines()[-3:]
    assert "float32 proof" in header and "1e-05 × scale (measured)" in header
    assert line.rstrip().endswith("| FAILED |")
    proofs = json.loads((folder / "config.json").read_text())["runtime_proofs"]
    assert proofs["float32"] == "FAILED" == row["runtime_proofs"]["float32"]
