"""TF32 and the score's α term in the runtime proofs (docs/numerics.md#proofs-for-reduced-
precision-runtimes), checked by an evaluator of the test's own.

The ρ/η layout forms q = x·W_qᵀ with W_q = [α·I; cᵀ], a matrix product: TF32 cuts α and x_ij,
and cuts the product α·x_ij again as an input of q·k, so the term α·x_ij·x_lj passes through
four cuts, cut(cut(α)·cut(x_ij))·cut(x_lj), where the torch module's α·(x·xᵀ) has two. A
truncating cut loses up to 1 − (1 + t)^−4 ≈ 4t (t = 2⁻¹⁰), and the proof allowed 2t + t².
"""

from __future__ import annotations

import numpy as np
import pytest

import exactformer as ef
from exactformer.model import SA, Block, ScoreMatrix, Transformer, ValueMatrix
from exactformer.verification import prove_runtime
from exactformer.verification.formats import get_format
from exactformer.verification.runtime_proof import enclose_runtime

TOL = 1e-5
F32 = np.float32
ORDERS = ("seq", "rev", "pairwise", "perm", "blocked", "fma")


# ------------------------------------------------------------------------------ the test's own
def _cut(a, mode: str) -> np.ndarray:
    """TF32's cut of a matrix product's input to 11 significant bits: "rne" (to nearest, ties
    to even) or "trunc" (toward zero)."""
    m, e = np.frexp(np.asarray(a, dtype=F32).astype(np.float64))
    s = np.ldexp(m, 11)
    return np.ldexp(np.trunc(s) if mode == "trunc" else np.rint(s), e - 11).astype(F32)


def _sum(terms: list, order: str, rng) -> np.ndarray:
    """float32 sum of ``terms`` in ``order`` ("fma": one rounding of the exact sum)."""
    if order == "fma":
        return np.sum([t.astype(np.float64) for t in terms], axis=0).astype(F32)
    if order == "rev":
        terms = terms[::-1]
    elif order == "perm":
        terms = [terms[i] for i in rng.permutation(len(terms))]
    if order == "pairwise":
        while len(terms) > 1:
            terms = [terms[i] + terms[i + 1] if i + 1 < len(terms) else terms[i]
                     for i in range(0, len(terms), 2)]
        return terms[0]
    if order == "blocked":
        terms = [_sum(terms[i:i + 2], "seq", rng) for i in range(0, len(terms), 2)][::-1]
    acc = terms[0]
    for t in terms[1:]:
        acc = acc + t
    return acc


def _mm(A, B, mode: str, order: str, rng) -> np.ndarray:
    A, B = _cut(A, mode), _cut(B, mode)
    return _sum([A[:, j, None] * B[None, j, :] for j in range(A.shape[1])], order, rng)


def rho_eta_tf32(model: Transformer, X: np.ndarray, mode: str, order: str,
                 seed: int = 0) -> np.ndarray:
    """The ρ/η export's one softmax layer in TF32: Q = X·W_qᵀ, K = X·W_kᵀ, V = X·W_vᵀ,
    S = Q·Kᵀ, weights exp(S − max) over their float32 sum, ρ·x + weights·V; every matrix
    product's inputs cut, float32 everywhere."""
    rng = np.random.default_rng(seed)
    sa = model.blocks[0].sa
    h = sa.heads[0]
    d = model.d
    X = np.asarray(X, dtype=F32)
    W_q = np.vstack([np.eye(d) * float(h.A.alpha), np.asarray(h.A.c, float)[None, :]])
    W_k = np.vstack([np.eye(d), np.asarray(h.A.a, float)[None, :]])
    W_v = np.asarray(h.V.dense(), dtype=float)
    Q, K, V = (_mm(X, W.astype(F32).T, mode, order, rng) for W in (W_q, W_k, W_v))
    S = _mm(Q, K.T, mode, order, rng)
    E = np.exp(S - S.max(axis=1, keepdims=True))
    P = E / _sum([E[:, j] for j in range(E.shape[1])], order, rng)[:, None]
    return (F32(float(sa.rho)) * X + _mm(P, V, mode, order, rng)).astype(float)


def exact(model: Transformer, X: np.ndarray) -> np.ndarray:
    """The layer in float64 (far below the tolerances here)."""
    sa, h = model.blocks[0].sa, model.blocks[0].sa.heads[0]
    S = X @ np.asarray(h.A.dense(), float).T @ X.T
    E = np.exp(S - S.max(axis=1, keepdims=True))
    return float(sa.rho) * X + (E / E.sum(axis=1, keepdims=True)) @ X @ \
        np.asarray(h.V.dense(), float).T


# ------------------------------------------------------------------------------ the case
def _case(m: int = 5, K: float = 7.0):
    """d = m + 2, softmax at τ = 1, ρ = 0, V = e_v·e_vᵀ, c = e_g, a = −100·e_v. Token A holds
    a = 1058/1024 − 2⁻²⁰ in m score coordinates: its score with itself, α·m·a² ≈ 5.5, beats
    B's 0, and the output is π_AB·X, B's weight times its value X = 1. TF32 truncation: cut(α)
    = 1055/1024, cut(a) = 1057/1024, and their product 1055·1057·2⁻²⁰ = (2²⁰ + 65·2¹⁰ + 1023)·
    2⁻²⁰ loses 1023·2⁻²⁰ more: the score drops by ~3.85t of itself, π_AB grows. B's flag
    makes its own score −98 (its output ≈ 0), and a second sequence, one token K·e_g, sets
    the data's scale to K."""
    d, v, g = m + 2, m, m + 1
    alpha = 1056 / 1024 - 2.0 ** -20
    a_vec, c_vec, p = np.zeros(d), np.zeros(d), np.zeros(d)
    a_vec[v], c_vec[g], p[v] = -100.0, 1.0, 1.0
    sa = SA(0.0, ScoreMatrix(alpha, a_vec, c_vec), ValueMatrix(0.0, p, p.copy()))
    model = Transformer(d, "softmax", [Block(None, sa)], exact=False)
    x = np.zeros((2, d))
    x[0, :m] = 1058 / 1024 - 2.0 ** -20
    x[1, v], x[1, g] = 1.0, 1.0
    xk = np.zeros((1, d))
    xk[0, g] = K
    return model, [x, xk]


def test_a_truncating_tf32_rho_eta_pass_misses_where_the_proof_said_proved():
    model, xs = _case()
    data = ef.Dataset.from_arrays(xs, [exact(model, x) for x in xs])
    scale = 7.0
    err = max(np.abs(rho_eta_tf32(model, x, "trunc", order) - exact(model, x)).max()
              for x in xs for order in ORDERS) / scale
    assert err > TOL  # 1.18e-5: every truncating order gives 0.0041351 for 0.0040526
    assert prove_runtime(model, data, "float32").ok
    verdict = prove_runtime(model, data, "tf32")
    assert not verdict.ok  # was PROVED FAITHFUL IN tf32, bound 8.6e-6
    assert verdict.bound >= err


@pytest.mark.parametrize("m", [4, 5, 6])
def test_every_tf32_rho_eta_pass_lies_in_the_proofs_box(m):
    model, xs = _case(m)
    (mid, rad), _ = enclose_runtime(model, xs, get_format("tf32"))
    for mode in ("rne", "trunc"):
        for order in ORDERS:
            out = rho_eta_tf32(model, xs[0], mode, order, seed=m)
            assert (np.abs(out - mid) <= rad).all(), (mode, order, out - mid, rad)


@pytest.mark.parametrize("seed", range(6))
def test_random_alpha_scores_stay_in_the_box(seed):
    """α and the tokens drawn just above 11-bit numbers (where a truncating cut loses most);
    every pass, truncating or rounding, in every order, lies in the proof's box."""
    rng = np.random.default_rng(seed)
    d, n = 3, 4

    def near_cut(size):
        base = rng.integers(1024, 2048, size=size) / 1024.0 * 2.0 ** rng.integers(-1, 2, size)
        return (base + 2.0 ** -10 * (1 - 2.0 ** -10)) * rng.choice([-1, 1], size)

    alpha = float(near_cut(1)[0]) * 0.5
    sa = SA(0.0, ScoreMatrix(alpha, np.zeros(d), np.zeros(d)),
            ValueMatrix(1.0, np.zeros(d), np.zeros(d)))
    model = Transformer(d, "softmax", [Block(None, sa)], exact=False)
    x = near_cut((n, d))
    (mid, rad), = enclose_runtime(model, [x], get_format("tf32"))
    for mode in ("rne", "trunc"):
        for order in ORDERS:
            out = rho_eta_tf32(model, x, mode, order, seed=seed)
            assert (np.abs(out - mid) <= rad).all(), (mode, order)


def test_the_exported_rho_eta_module_computes_the_evaluators_graph():
    """The export's own module, its matrix products' inputs truncated to 11 bits, gives the
    test evaluator's output: the α term is cut as the evaluator cuts it."""
    torch = pytest.importorskip("torch")
    from torch.overrides import TorchFunctionMode

    from exactformer.export.rho_eta import to_rho_eta

    def trunc(a):
        m, e = torch.frexp(a)
        return torch.ldexp(torch.trunc(torch.ldexp(m, torch.tensor(11.0))), (e - 11).float())

    class TruncatedTF32(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func in (torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__,
                        torch.nn.functional.linear):
                args = tuple(trunc(a) if isinstance(a, torch.Tensor) else a for a in args)
            return func(*args, **(kwargs or {}))

    model, xs = _case()
    module = to_rho_eta(model, dtype=torch.float32)
    with torch.no_grad(), TruncatedTF32():
        out = module(torch.tensor(xs[0][None], dtype=torch.float32))[0].double().numpy()
    ours = rho_eta_tf32(model, xs[0], "trunc", "seq")
    assert np.abs(out - ours).max() <= 1e-9
    assert np.abs(out - exact(model, xs[0])).max() / 7.0 > TOL
