"""``exactformer info`` (and the Hub card, which shares its rows) says of a keyed model that it
is "exact to float32 rounding in a plain float32 pass". Data at 1e30 make the construction
store A.alpha = 2.4e-63, which float32 holds as 0: an independent float32 pass (plain NumPy,
below, not exactformer's evaluator) then misses the targets: its scores α·⟨x_i, x_l⟩ are 0 · inf
= nan here, and a pass that forms A first misses by 1.3 × the data's scale. The claim must be
withdrawn with the reason there, and kept where the pass does reproduce."""

from __future__ import annotations

import warnings
from fractions import Fraction

import numpy as np
import pytest

import exactformer as ef
from exactformer import cli
from exactformer.data import Dataset, builtin
from exactformer.summary import decides


def scaled(data, s: Fraction) -> Dataset:
    return Dataset.from_arrays([[[v * s for v in t] for t in x] for x in data.inputs],
                               [[[v * s for v in t] for t in y] for y in data.targets])


def float32_pass(model, x: np.ndarray) -> np.ndarray:
    """The model's FF→SA blocks in float32 from its parameters, written here independently."""
    f32 = np.float32
    D = model.d
    y = np.zeros((len(x), D), f32)
    y[:, :x.shape[1]] = x
    for blk in model.blocks:
        if blk.ff is not None:
            ff = blk.ff
            U, b, W = (np.asarray(a, float).astype(f32) for a in (ff.U, ff.b, ff.W))
            y = f32(float(ff.eta)) * y + np.maximum(y @ U.T + b, 0) @ W.T
        if blk.sa is not None:
            out = f32(float(blk.sa.rho)) * y
            for head in blk.sa.heads:
                A, V = head.A, head.V
                qa, qc = (np.asarray(v, float).astype(f32) for v in (A.a, A.c))
                s = f32(float(A.alpha)) * (y @ y.T) + np.outer(y @ qc, y @ qa)
                w = (s == s.max(axis=1, keepdims=True)).astype(f32)
                avg = (w / w.sum(axis=1, keepdims=True)) @ y
                p, q = (np.asarray(v, float).astype(f32) for v in (V.p, V.q))
                out = out + f32(float(V.beta)) * avg + np.outer(avg @ q, p)
            y = out
    return y.astype(float)


def relative_error(model, data) -> float:
    xs, ys = data.floats()
    scale = max(np.abs(np.concatenate(xs)).max(), np.abs(np.concatenate(ys)).max())
    worst = 0.0
    for x, t in zip(xs, ys, strict=True):
        with np.errstate(all="ignore"):
            out = float32_pass(model, x)
        target = np.zeros((len(t), model.d))
        target[:, :t.shape[1]] = t
        dist = np.sqrt(((out[:, None] - target[None]) ** 2).sum(-1))
        dist[~np.isfinite(dist)] = np.inf  # nan (inf · 0) is a miss, not a max() skipped
        worst = max(worst, dist.min(1).max(), dist.min(0).max())
    return worst / scale


@pytest.mark.parametrize("s", [Fraction(1), Fraction(10) ** 30])
def test_info_claims_float32_only_where_a_float32_pass_reproduces(s, tmp_path, capsys):
    assert ef.compile(builtin.demo()).attention == "hardmax"
    data = scaled(builtin.demo(), s)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = ef.compile(data)
    err = relative_error(model, data)
    claim = "keyed: exact to float32 rounding in a plain float32 pass"
    said = decides(model)
    if s == 1:
        assert err <= 1e-6 and claim in said
    else:
        assert err > 1.0  # inf (nan outputs): A.alpha = 2.43e-63 is 0 in float32
        assert claim not in said and "NOT exact in float32" in said and "A.alpha" in said
    path = tmp_path / "m.json"
    ef.save_model(model, path)
    assert cli.main(["info", str(path)]) == 0
    assert (claim in capsys.readouterr().out) == (s == 1)
