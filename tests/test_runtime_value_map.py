"""The attention's value map in the runtime proofs (docs/numerics.md#proofs-for-reduced-
precision-runtimes) as each layout computes it, checked by evaluations of the test's own.

* The ρ/η and TransformerLens exports store the dense V = β·I + p·qᵀ formed from the model's
  own parameters and converted once, which need not be β·I + p·qᵀ of the stored factors that
  the torch module reads: a proof may not call the value exact on the factors alone.
* TF32 cuts the inputs of every matrix product, the layer's own intermediates too: the torch
  module's average y before q·y, the ρ/η layout's V·x_l before the average."""

from __future__ import annotations

import numpy as np
import pytest

import exactformer as ef
from exactformer.model import SA, Block, ScoreMatrix, Transformer, ValueMatrix
from exactformer.verification import prove_runtime

TOL = 1e-5


def _one_head(p, q) -> Transformer:
    """d = 2, one hardmax head with equal scores (every key a candidate), ρ = β = 0,
    V = p·qᵀ: the output is V times the keys' average."""
    sa = SA(0.0, ScoreMatrix(0.0, np.zeros(2), np.zeros(2)),
            ValueMatrix(0.0, np.asarray(p, dtype=float), np.asarray(q, dtype=float)))
    return Transformer(2, "hardmax", [Block(None, sa)], exact=False)


def _error(out: np.ndarray, target: np.ndarray) -> float:
    """Largest distance of an output row from the one target row, over the target's scale."""
    return float(np.abs(out - target).max() / np.abs(target).max())


def test_dense_value_matrix_of_the_exports_is_not_the_product_of_stored_factors():
    torch = pytest.importorskip("torch")
    from exactformer.export.rho_eta import to_rho_eta

    # p stores in bfloat16 as 1 (its offset is below half a unit), q = 1.75 exactly: the
    # torch module computes 1·1.75 = 1.75, but the exports' V = p·q = 1.7558… rounds up to
    # 1.7578125, one bfloat16 unit above
    p0 = 1 + 2.0 ** -8 - 2.0 ** -12
    model = _one_head([p0, 0.0], [1.75, 0.0])
    x, y = np.array([[1.0, 0.0]]), np.array([[1.75, 0.0]])
    data = ef.Dataset.from_arrays([x], [y])
    stored_v = float(torch.tensor(p0 * 1.75, dtype=torch.float64).to(torch.bfloat16).float())
    assert stored_v == 1.7578125
    module = to_rho_eta(model, dtype=torch.bfloat16)
    with torch.no_grad():
        out = module(torch.tensor(x[None], dtype=torch.bfloat16))[0].double().numpy()
    assert _error(out, y) > TOL  # the exported layout misses the tolerance
    assert not prove_runtime(model, data, "bfloat16").ok


def _cut(a, truncate: bool) -> np.ndarray:
    """TF32's cut of a matrix product's input: 11 significant bits, rounded to nearest even
    or truncated, via float64."""
    m, e = np.frexp(np.asarray(a, dtype=np.float64))
    s = np.ldexp(m, 11)
    return np.ldexp(np.trunc(s) if truncate else np.rint(s), e - 11)


def _tf32_pass(model: Transformer, x: np.ndarray, layout: str, truncate: bool) -> np.ndarray:
    """One TF32 evaluation of a one-head, ρ = β = 0 hardmax layer with equal scores: weights
    1/n on every key; ``layout`` "torch": p·(q·y) with y = π·X (both products cut), "rho-eta":
    π·(X Vᵀ) (both products cut). float32 sums in order."""
    h = model.blocks[0].sa.heads[0]
    f32 = np.float32
    p, q = np.asarray(h.V.p, dtype=f32), np.asarray(h.V.q, dtype=f32)
    X = np.asarray(x, dtype=f32)
    pi = np.full((len(X), len(X)), f32(1.0 / len(X)), dtype=f32)

    def mm(A, B):
        A, B = _cut(A, truncate).astype(f32), _cut(B, truncate).astype(f32)
        out = np.zeros((A.shape[0], B.shape[1]), dtype=f32)
        for k in range(A.shape[1]):
            out = out + A[:, k, None] * B[None, k, :]
        return out

    if layout == "torch":
        y = mm(pi, X)
        return (mm(y, q[:, None]) * p[None, :]).astype(float)
    V = np.asarray(h.V.dense(), dtype=f32)
    return mm(pi, mm(X, V.T)).astype(float)


@pytest.mark.parametrize("layout", ["torch", "rho-eta"])
def test_tf32_cuts_the_layers_own_intermediates(layout):
    if layout == "torch":
        # two 11-bit keys averaged: y = 1 + 2^-11 has 12 bits, and q·y reads y cut
        model = _one_head([1.0, 0.0], [1.0, 0.0])
        x = np.array([[1.0, 0.0], [1 + 2.0 ** -10, 0.0]])
        y = np.array([[1 + 2.0 ** -11, 0.0]])
    else:
        # V = 3, x = 1 + 2^-10: both 11-bit, but V·x = 3075·2^-10 has 12 bits
        model = _one_head([3.0, 0.0], [1.0, 0.0])
        x = np.array([[1 + 2.0 ** -10, 0.0]])
        y = np.array([[3 * (1 + 2.0 ** -10), 0.0]])
    data = ef.Dataset.from_arrays([x], [y])
    worst = max(_error(_tf32_pass(model, x, layout, t), y) for t in (False, True))
    assert worst > TOL  # some TF32 evaluation misses the tolerance
    assert not prove_runtime(model, data, "tf32").ok
    assert prove_runtime(model, data, "float32").ok  # without the cut it is exact
