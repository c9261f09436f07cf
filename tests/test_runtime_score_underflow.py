"""The score's α term below the normal numbers in the runtime proofs (docs/numerics.md#proofs-
for-reduced-precision-runtimes), checked by an evaluator of the test's own.

The ρ/η layout stores q_j = α·x_ij (its W_q = [α·I; cᵀ]) before q·k multiplies it by the
key's x_lj: where q_j falls below the smallest normal number it may lose up to one, and a
large key scales that loss up. The proof added a smallest normal number per operation,
times max(1, |α|), to a score: right for the torch module's α·(x·xᵀ), short for q·k."""

from __future__ import annotations

import numpy as np
import pytest

import exactformer as ef
from exactformer.model import SA, Block, ScoreMatrix, Transformer, ValueMatrix
from exactformer.verification import prove_runtime
from exactformer.verification.formats import get_format
from exactformer.verification.runtime_proof import enclose_runtime

F32 = np.float32
L = 2.0 ** 30


def _case():
    """d = 2, hardmax, ρ = 1, V = I, α = 2⁻⁷⁰; tokens A = 2⁻⁷⁰·(1 + 2⁻¹⁰, 1), B = L·e_0,
    C = L·e_1. A's scores with B and C are 2⁻¹¹⁰·(1 + 2⁻¹⁰) and 2⁻¹¹⁰, apart by 2⁻¹²⁰, far
    beyond float32's rounding of them: A copies B. But α·x_A = 2⁻¹⁴⁰·(1 + 2⁻¹⁰, 1) lies among
    float32's subnormals, spaced 2⁻¹⁴⁹, where both round to 2⁻¹⁴⁰: the ρ/η layout's scores
    tie and A averages B and C, half the scale away."""
    sa = SA(1.0, ScoreMatrix(2.0 ** -70, np.zeros(2), np.zeros(2)),
            ValueMatrix(1.0, np.zeros(2), np.zeros(2)))
    model = Transformer(2, "hardmax", [Block(None, sa)], exact=False)
    x = np.array([[2.0 ** -70 * (1 + 2.0 ** -10), 2.0 ** -70], [L, 0.0], [0.0, L]])
    return model, x, x + x[[1, 1, 2]]


def _rho_eta_float32(model: Transformer, x: np.ndarray) -> np.ndarray:
    """The ρ/η layout's hardmax layer in float32: q = α·x stored, S = q·xᵀ, the argmax set
    averaged, ρ·x + average (V = I)."""
    sa = model.blocks[0].sa
    X = x.astype(F32)
    Q = F32(float(sa.heads[0].A.alpha)) * X  # one nonzero term per entry: the product
    S = Q @ X.T
    hit = (S == S.max(axis=1, keepdims=True)).astype(F32)
    return (X + (hit / hit.sum(axis=1, keepdims=True)) @ X).astype(float)


def test_an_underflowing_query_times_a_large_key_is_not_proved():
    model, x, y = _case()
    q = F32(2.0 ** -70) * x[0].astype(F32)
    assert q[0] == q[1]  # both round to the same subnormal
    err = np.abs(_rho_eta_float32(model, x) - y).max() / L
    assert err == 0.5
    data = ef.Dataset.from_arrays([x], [y])
    assert not prove_runtime(model, data, "float32").ok  # was PROVED, bound 7.7e-7
    (mid, rad), = enclose_runtime(model, [x], get_format("float32"))
    assert (np.abs(_rho_eta_float32(model, x) - mid) <= rad).all()


def test_the_exported_rho_eta_module_ties_where_the_torch_module_does_not():
    torch = pytest.importorskip("torch")
    from exactformer.export.modules import NativeTransformer
    from exactformer.export.rho_eta import to_rho_eta

    model, x, y = _case()
    t = torch.tensor(x[None], dtype=torch.float32)
    with torch.no_grad():
        rho_eta = to_rho_eta(model, dtype=torch.float32)(t)[0].double().numpy()
        native = NativeTransformer(model, dtype=torch.float32, ff="dense")(t)[0].double().numpy()
    assert np.array_equal(rho_eta, _rho_eta_float32(model, x))
    assert np.abs(rho_eta - y).max() / L == 0.5
    assert np.abs(native - y).max() / L < 1e-5
