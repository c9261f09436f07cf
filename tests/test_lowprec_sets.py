"""Keyed set models of grid data are proved faithful in bfloat16 and TF32 (docs/numerics.md,
"Low-precision set models"), and the proofs are checked here by evaluations of the test's
own: a torch bfloat16 pass, and NumPy passes that store every result in bfloat16 (or cut
every matrix product's inputs to TF32's 11 bits) and sum every dot product in float32 in a
random order of its terms."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import exactformer as ef
from exactformer.construct.keyed_moves import eight_bits_above
from exactformer.verification import prove_runtime
from exactformer.verification.formats import get_format
from exactformer.verification.runtime_boxes import linear

SETTINGS = settings(max_examples=15, deadline=None, derandomize=False,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
TOL = 1e-5
F32 = np.float32


# ------------------------------------------------------------------------------ the test's own
def bf16(a):
    """float32 → bfloat16 (round to nearest even on the bit pattern), as float32."""
    a = np.asarray(a, dtype=F32)
    u = np.ascontiguousarray(a).reshape(-1).view(np.uint32)
    u = (u + np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return u.view(F32).reshape(a.shape)


def tf32(a):
    """float32 cut to 11 significant bits (TF32's matrix inputs), ties to even."""
    m, e = np.frexp(np.asarray(a, dtype=np.float64))
    return np.ldexp(np.rint(np.ldexp(m, 11)), e - 11).astype(F32)


class LowPass:
    """An evaluation of the dense graph: bfloat16 stores (``bf16=True``: every weight, input
    and result rounded to bfloat16) or TF32 (float32 stores, matrix inputs cut to 11 bits);
    every dot product summed in float32 in a random order of its terms."""

    def __init__(self, bf16: bool, seed: int):
        self.store = bf16_store if bf16 else (lambda a: np.asarray(a, dtype=F32))
        self.cut = (lambda a: a) if bf16 else tf32
        self.rng = np.random.default_rng(seed)

    def dot(self, A, B):
        A, B = self.cut(self.store(A)), self.cut(self.store(B))
        order = self.rng.permutation(A.shape[-1])
        acc = np.zeros(A.shape[:-1] + B.shape[-1:], dtype=F32)
        for j in order:
            acc = acc + A[..., :, j, None] * B[..., j, None, :]
        return self.store(acc)

    def run(self, model, x):
        st = self.store
        X = np.zeros((len(x), model.d), dtype=F32)
        X[:, :x.shape[1]] = x
        X = st(X)
        for blk in model.blocks:
            if blk.ff is not None:
                f = blk.ff
                Z = st(self.dot(X, _w(f.U).T) + st(_w(f.b)))
                X = st(st(_w(f.eta) * X) + self.dot(np.maximum(Z, F32(0)), _w(f.W).T))
            if blk.sa is not None and not blk.sa.is_identity():
                out = st(_w(blk.sa.rho) * X)
                for h in blk.sa.heads:
                    S = st(st(_w(h.A.alpha)) * self.dot(X, X.T))
                    S = st(S + st(self.dot(X, _w(h.A.c)[:, None]) *
                                  self.dot(X, _w(h.A.a)[:, None]).T))
                    hit = (S == S.max(axis=1, keepdims=True)).astype(F32)
                    Y = self.dot(st(hit / hit.sum(axis=1, keepdims=True)), X)
                    out = st(out + st(_w(h.V.beta) * Y) +
                             st(self.dot(Y, _w(h.V.q)[:, None]) * _w(h.V.p)))
                X = out
        return X.astype(np.float64)


def bf16_store(a):
    return bf16(np.asarray(a, dtype=F32))


def _w(a):
    return np.asarray(np.asarray(a, dtype=float), dtype=F32)


def torch_bf16_pass(model, x):
    """The same graph in torch, every tensor bfloat16 (torch's own matmul and rounding)."""
    import torch

    def t(a):
        return torch.tensor(np.asarray(np.asarray(a, dtype=float), dtype=F32)
                            ).to(torch.bfloat16)

    X = torch.zeros((len(x), model.d), dtype=torch.bfloat16)
    X[:, :x.shape[1]] = t(x)
    for blk in model.blocks:
        if blk.ff is not None:
            f = blk.ff
            X = t(f.eta) * X + torch.relu(X @ t(f.U).T + t(f.b)) @ t(f.W).T
        if blk.sa is not None and not blk.sa.is_identity():
            out = t(blk.sa.rho) * X
            for h in blk.sa.heads:
                S = t(h.A.alpha) * (X @ X.T) + (X @ t(h.A.c))[:, None] * (X @ t(h.A.a))[None, :]
                hit = (S == S.max(dim=1, keepdim=True).values).to(torch.bfloat16)
                Y = (hit / hit.sum(dim=1, keepdim=True)) @ X
                out = out + t(h.V.beta) * Y + (Y @ t(h.V.q))[:, None] * t(h.V.p)[None, :]
            X = out
    return X.float().numpy().astype(np.float64)


def worst_error(model, data, run) -> float:
    """The largest Hausdorff distance of a pass's outputs to the targets, over the scale."""
    xs, ys = data.padded(model.d).floats()
    errs = []
    for x, y in zip(xs, ys, strict=True):
        out = run(model, x)
        dist = np.linalg.norm(out[:, None, :] - y[None, :, :], axis=2)
        errs.append(max(dist.min(axis=1).max(), dist.min(axis=0).max()))
    return max(errs) / data.coordinate_scale()


# ------------------------------------------------------------------------------ data
@st.composite
def grid_sets(draw):
    """Small-integer set data: d = 2…5, N = 1…6 sequences drawn from a shared pool (so
    separation rounds occur), m_j = n_j distinct integer targets."""
    d = draw(st.integers(2, 5))
    seed = draw(st.integers(0, 2 ** 32 - 1))
    rng = np.random.default_rng(seed)
    pool = np.unique(rng.integers(-8, 9, size=(draw(st.integers(1, 8)), d)), axis=0)
    sets = {tuple(sorted(rng.choice(len(pool), size=int(rng.integers(1, len(pool) + 1)),
                                    replace=False)))
            for _ in range(draw(st.integers(1, 6)))}
    xs, ys = [], []
    for idx in sorted(sets):
        y = np.unique(rng.integers(-8, 9, size=(len(idx) + 4, d)), axis=0)
        xs.append(pool[list(idx)].astype(float))
        ys.append(y[rng.permutation(len(y))][:len(idx)].astype(float))
    return ef.Dataset.from_arrays(xs, ys)


def build(data):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return ef.compile(data)


def brief_example():
    rng = np.random.default_rng(0)
    xs = [rng.integers(-8, 9, size=(n, 3)).astype(float) for n in (5, 7, 4, 6)]
    return ef.Dataset.from_arrays(xs, [x[:2] + 1 for x in xs])


# ------------------------------------------------------------------------------ properties
@SETTINGS
@given(data=grid_sets(), seed=st.integers(0, 2 ** 16))
def test_grid_sets_are_proved_in_bfloat16_and_tf32_and_reproduced(data, seed):
    model = build(data)
    for runtime in ("bfloat16", "tf32"):
        verdict = prove_runtime(model, data, runtime)
        assert verdict.ok, verdict.table()
    for k in range(2):
        assert worst_error(model, data, LowPass(True, seed + k).run) <= TOL
        assert worst_error(model, data, LowPass(False, seed + k).run) <= TOL
    assert worst_error(model, data, torch_bf16_pass) <= TOL


def test_the_brief_example_is_proved_in_every_16_and_32_bit_runtime():
    data = brief_example()
    model = build(data)
    for runtime in ("float32", "tf32", "bfloat16"):
        assert prove_runtime(model, data, runtime).ok, runtime
    assert worst_error(model, data, torch_bf16_pass) == 0


def test_the_demo_s_wide_moves_are_proved_in_bfloat16():
    """The demo's hull-normal move has K = 256 and bias −261, which bfloat16 cannot store:
    proved only because grid models read that bias mostly from the ``one`` coordinate."""
    from exactformer.data import builtin

    data = builtin.demo()
    model = build(data)
    assert prove_runtime(model, data, "bfloat16").ok
    assert worst_error(model, data, torch_bf16_pass) <= TOL
    assert worst_error(model, data, LowPass(True, 0).run) <= TOL


def _move_layer(model):
    return model.blocks[model.record.phase("interpolation").start].ff


@pytest.mark.parametrize("ulps", [1, 3])
@pytest.mark.parametrize("where", ["erase", "bias"])
def test_a_weight_moved_by_bfloat16_ulps_is_never_proved(ulps, where):
    """A move erases its tag's code exactly and fires with argument exactly 1: its erasing
    weight, or its bias, moved by a few bfloat16 ulps leaves a residue or scales its write."""
    data = brief_example()
    model = build(data).to_float()
    assert prove_runtime(model, data, "bfloat16").ok
    ff = _move_layer(model)
    if where == "erase":
        W = np.array(ff.W, dtype=float)
        c = data.d + 4 + int(np.argmax(np.abs(W[data.d + 4:, 0])))
        W[c, 0] *= 1 + ulps * 2.0 ** -7
        ff.W = W
    else:
        b = np.array(ff.b, dtype=float)
        b[0] += np.sign(b[0]) * ulps * 2.0 ** (np.frexp(b[0])[1] - 8)
        ff.b = b
    assert not prove_runtime(model, data, "bfloat16").ok


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1), k=st.integers(1, 5), big=st.booleans())
def test_a_dot_product_called_exact_is_exact_in_every_bfloat16_order(seed, k, big):
    """``linear`` calls a bfloat16 dot product exact from its terms' lowest bits: then every
    order of its terms in the float32 accumulator, the product stored in bfloat16 and the
    bias added and stored, or the bias accumulated with the terms and stored once, gives the
    exact value. ``big``: values whose sums pass 8 bits (the accumulator's exactness)."""
    rng = np.random.default_rng(seed)
    top = 2000 if big else 40
    X = bf16(rng.integers(-top, top + 1, size=(6, k)) * 2.0 ** rng.integers(-4, 5, size=(1, k)))
    W = bf16(rng.integers(-40, 41, size=(3, k)) * 2.0 ** rng.integers(-4, 5, size=(3, k)))
    b = bf16(rng.integers(-top, top + 1, size=3) * 2.0 ** rng.integers(-4, 5, size=3))
    X, W, b = (a.astype(np.float64) for a in (X, W, b))
    fmt = get_format("bfloat16")
    _, _, rnd, q = linear(X, np.zeros_like(X), W, np.zeros_like(W), b, np.zeros_like(b), fmt)
    exact = X @ W.T + b
    for i, u in zip(*np.nonzero(q > 0), strict=True):
        assert rnd[i, u] == 0
        terms = [F32(t) for t in X[i] * W[u]]
        for _ in range(3):
            acc = F32(0)
            for j in rng.permutation(len(terms)):
                acc = F32(acc + terms[j])
            assert float(bf16(F32(bf16(acc) + F32(b[u])))) == exact[i, u]
            fused = F32(b[u])
            for j in rng.permutation(len(terms)):
                fused = F32(fused + terms[j])
            assert float(bf16(fused)) == exact[i, u]


def test_a_sum_past_the_float32_accumulator_is_not_called_exact():
    """2^25 + 1 − 2^25: the product and the result (1) are bfloat16 numbers, but a partial
    sum needs 26 bits, so the float32 accumulator gives 0 in one order and 1 in another."""
    X, W, b = np.array([[2.0 ** 13, 1.0, 2.0 ** 13]]), np.array([[2.0 ** 12, 1.0, -2.0 ** 12]]), \
        np.zeros(1)
    _, _, rnd, q = linear(X, np.zeros_like(X), W, np.zeros_like(W), b, np.zeros_like(b),
                          get_format("bfloat16"))
    assert q[0, 0] == 0 and rnd[0, 0] > 0
    assert F32(F32(F32(2.0 ** 25) + F32(1)) - F32(2.0 ** 25)) == 0


def test_a_move_s_bias_splits_into_two_eight_bit_parts():
    """Grid models read a move's bias mostly from the ``one`` coordinate: that part holds at
    most 8 bits, the rest is ≤ −1 (a moved state stays off), and below 2^16 the rest and
    1 − rest hold 8 bits too."""
    from exactformer.verification.formats import fits

    for bias in [-1, -2, -7, -129, -255, -256, -257, -261, -1000, -12345, -(2 ** 16) + 1,
                 -(2 ** 23) + 1]:
        high = eight_bits_above(bias)
        rest = bias - high
        assert rest <= -1 and high <= 0 and fits(np.array([high], dtype=float), 8).all()
        if bias > -(2 ** 16):
            assert fits(np.array([rest, 1 - rest], dtype=float), 8).all(), bias


@settings(max_examples=10, deadline=None)
@given(data=grid_sets())
def test_grid_windows_keep_the_generic_build_s_blocks_and_width(data):
    """The grid windows change the tags' directions (and the moves' biases), not L or D: those
    of the build on the shared directions; and the model stays proved in float32."""
    from exactformer.construct import keyed

    model = build(data)
    generic, keyed.data_grid = keyed.data_grid, lambda points: None
    try:
        shared = build(data)
    finally:
        keyed.data_grid = generic
    assert (model.n_blocks, model.d) == (shared.n_blocks, shared.d)
    assert not np.array_equal(np.asarray(model.blocks[0].ff.U, dtype=float),
                              np.asarray(shared.blocks[0].ff.U, dtype=float))
    assert prove_runtime(model, data, "float32").ok


def test_data_grid_reads_one_power_of_two_within_eleven_bits():
    from exactformer.construct.tagging import data_grid

    assert data_grid(np.array([[3.0, -8.0], [0.0, 1.0]])) == 1.0
    assert data_grid(np.array([[0.75, 2.0]])) == 0.25
    assert data_grid(np.array([[2047.0, 1.0]])) == 1.0
    assert data_grid(np.array([[2048.5, 1.0]])) is None  # 2^11 halves: beyond 11 bits
    assert data_grid(np.array([[0.1, 1.0]])) is None
    assert data_grid(np.zeros((2, 3))) == 1.0
