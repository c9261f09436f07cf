"""Hardmax ties larger than the format's integers (docs/numerics.md#proofs-for-reduced-
precision-runtimes), checked by an evaluator of the test's own.

The exports weigh a tie of |C| keys by hit / hit.sum(): the count is summed in float32 but
stored in the format, so bfloat16 stores 257 as 256 and weighs each key 2⁻⁸, not fl(1/257),
and the weights sum to 257/256 (float16: 2049 keys). The proof models the weights as
fl(1/|C|), but such a tie needs n > 2^p keys, and its output's rounding bound θ·M then counts
n + … roundings of 2^-p each: θ ≥ (1 + 2^-p)^(2^p) − 1 > 1.7, far beyond the count's
2^-p. A count that is a power of two, the only case proved exact, is stored exactly."""

from __future__ import annotations

import numpy as np
import pytest

from exactformer.model import SA, Block, ScoreMatrix, Transformer, ValueMatrix
from exactformer.verification.formats import get_format, round_to
from exactformer.verification.runtime_proof import enclose_runtime


def _store(x, runtime: str) -> float:
    fmt = get_format(runtime)
    return float(round_to(float(np.float32(x)), fmt.bits, fmt.emin))


def _tie_pass(vals, runtime: str, order: str, seed: int = 0) -> float:
    """One evaluation of a tie over every key: ones summed in float32 and stored, each weight
    1/count in float32 and stored, Σ w·x_l in float32 in ``order``, stored."""
    n = len(vals)
    w = np.float32(_store(1.0 / _store(float(n), runtime), runtime))
    terms = [np.float32(w * np.float32(v)) for v in vals]
    if order == "fma":
        return _store(float(np.sum(np.float64(w) * np.asarray(vals, dtype=np.float64))), runtime)
    if order == "rev":
        terms = terms[::-1]
    elif order == "perm":
        terms = [terms[i] for i in np.random.default_rng(seed).permutation(n)]
    acc = np.float32(0)
    for t in terms:
        acc = np.float32(acc + t)
    return _store(float(acc), runtime)


def _tie_model() -> Transformer:
    """d = 2, hardmax with zero scores (every key ties), ρ = 0, V = I: the output is the
    keys' average."""
    sa = SA(0.0, ScoreMatrix(0.0, np.zeros(2), np.zeros(2)),
            ValueMatrix(1.0, np.zeros(2), np.zeros(2)))
    return Transformer(2, "hardmax", [Block(None, sa)], exact=False)


@pytest.mark.parametrize("runtime, n", [("bfloat16", 257), ("bfloat16", 259),
                                        ("bfloat16", 385), ("float16", 2049)])
def test_a_tie_whose_count_the_format_rounds_stays_in_the_box(runtime, n):
    assert _store(float(n), runtime) != n  # 257 → 256, 259 → 260, 385 → 384, 2049 → 2048
    x = np.zeros((n, 2))
    x[:, 0] = 1.5
    x[:, 1] = [(128 + j % 128) * 2.0 ** (-8 - j // 128) for j in range(n)]
    (mid, rad), = enclose_runtime(_tie_model(), [x], get_format(runtime))
    outs = [_tie_pass(x[:, 0], runtime, order, seed) for order, seed in
            (("seq", 0), ("rev", 0), ("perm", 1), ("perm", 2), ("fma", 0))]
    assert max(abs(o - 1.5) for o in outs) > 0  # the rounded count moves the average
    assert all(abs(o - mid[0, 0]) <= rad[0, 0] for o in outs)
    assert rad[0, 0] > 1.7 * 1.5  # θ·M with θ ≥ (1 + 2^-p)^(2^p) − 1
    torch = pytest.importorskip("torch")
    from exactformer.export.modules import NativeTransformer
    from exactformer.export.rho_eta import to_rho_eta

    dt = getattr(torch, runtime)
    with torch.no_grad():
        for module in (NativeTransformer(_tie_model(), dtype=dt, ff="dense"),
                       to_rho_eta(_tie_model(), dtype=dt)):
            out = module(torch.tensor(x[None], dtype=dt))[0].double().numpy()
            assert (np.abs(out - mid) <= rad).all()
