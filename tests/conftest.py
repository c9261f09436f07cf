"""Shared helpers and hypothesis strategies for the exactformer test suite."""

from __future__ import annotations

import math
import os
import random
import sys
import warnings
from fractions import Fraction

import numpy as np
from hypothesis import strategies as st

import exactformer as ef
from exactformer.data import DuplicatePairWarning

# torch spreads even a 4×4 softmax over a thread pool as wide as the machine; on a busy 2-core
# machine those threads wait on each other and one op takes ~1000× longer (24 ms, not 24 µs).
# The tests' tensors are tiny: one thread. Set before any test module imports torch.
os.environ.setdefault("OMP_NUM_THREADS", "1")


def dense_pass(model, x: np.ndarray, dtype, arr=None, exp=np.exp, pre=None
               ) -> list[np.ndarray]:
    """The model on one sequence in ``dtype`` (states after every block), a reference written
    from the layer definitions alone: the tokens zero-padded and the stored positions added,
    every FF as η·x + W·relu(U·x + b), every attention as ρ·x + V·(average of the rows of
    highest score ⟨A x_i, x_l⟩, over l ≤ i in a causal model; hardmax ties averaged) or their
    softmax average at the model's τ. ``arr`` converts parameters (default: through float64),
    ``exp`` is the softmax's exponential, ``pre`` a list that receives each block's FF
    pre-activations (None for a block without FF)."""
    if arr is None:
        def arr(a):
            return np.asarray(np.asarray(a, dtype=float), dtype=dtype)

    X = np.zeros((len(x), model.d), dtype=dtype)
    X[:, :x.shape[1]] = arr(x)
    if model.positions is not None:
        X = X + arr(model.positions[:len(x)])
    seen = np.tril(np.ones((len(x), len(x)), dtype=bool)) if model.causal else \
        np.ones((len(x), len(x)), dtype=bool)
    states = []
    for blk in model.blocks:
        Z = None
        if blk.ff is not None:
            f = blk.ff
            Z = X @ arr(f.U).T + arr(f.b)
            X = X * arr(f.eta) + np.maximum(Z, arr(0)) @ arr(f.W).T
        if pre is not None:
            pre.append(Z)
        if blk.sa is not None:
            out = X * arr(blk.sa.rho)
            for h in blk.sa.heads:
                S = (X @ arr(h.A.dense()).T) @ X.T
                S = np.where(seen, S, S.min() - 1)  # later rows: below every score
                if model.attention == "softmax":
                    E = exp((S - S.max(axis=1, keepdims=True)) / arr(model.tau))
                    E = np.where(seen, E, arr(0))
                    weights = E / E.sum(axis=1, keepdims=True)
                else:
                    top = S == S.max(axis=1, keepdims=True)  # counts through ``arr``: an
                    # exact pass gets 1/|C| as a Fraction, not bool/int = a float
                    weights = arr(top.astype(int)) / arr(top.sum(axis=1, keepdims=True))
                out = out + (weights @ X) @ arr(h.V.dense()).T
            X = out
        states.append(X)
    return states


def token_set(a) -> set:
    """The rows of ``a`` as a set of tuples of Fractions (exact comparison)."""
    return {tuple(Fraction(v) for v in row) for row in np.asarray(a, dtype=object)}


def exact_outputs(model, dataset) -> list[np.ndarray]:
    xs, _ = dataset.fractions()
    return ef.forward(model, xs, arithmetic="exact")


def assert_interpolates_exactly(model, dataset) -> None:
    """Exact forward pass: the set of output tokens equals the target set (zero-padded to the
    model's width: a keyed model is wider than its data), for every pair."""
    outs = exact_outputs(model, dataset)
    _, ys = dataset.padded(model.d).fractions()
    assert len(outs) == dataset.N
    for j, (o, x, y) in enumerate(zip(outs, dataset.inputs, ys, strict=True)):
        assert o.shape == (len(x), model.d), f"pair {j}: the model is not length preserving"
        assert all(isinstance(v, Fraction) for v in o.flat)
        assert token_set(o) == token_set(y), f"pair {j}: output set differs from target set"


def hausdorff(a, b) -> float:
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    D = np.sqrt(((a[:, None, :] - b[None, :, :]) ** 2).sum(-1))
    return float(max(D.min(axis=1).max(), D.min(axis=0).max()))


def block_bounds(model, dataset) -> tuple[int, int]:
    """(design bound R + max(1, Σm−N) + Σm, the paper's hardmax bound 2Σm + 2N + 1)."""
    N, sm = dataset.N, dataset.total_m
    return model.meta["R"] + max(1, sm - N) + sm, 2 * sm + 2 * N + 1


def paper(*args, **kwargs):
    """ef.compile with the paper's hat construction (docs/hardmax.md), for the tests of that
    construction; every other test builds the default."""
    return ef.compile(*args, construction="paper", **kwargs)


def padded_targets(model, data) -> list[np.ndarray]:
    _, ys = data.floats()
    return [np.pad(y, ((0, 0), (0, model.d - y.shape[1]))) for y in ys]


def float_error(model, data, dtype) -> float:
    """Largest Hausdorff distance of :func:`dense_pass`'s outputs (set data) from the padded
    targets; NaN if any output is NaN (np.max keeps it, so every ``<=`` against it fails)."""
    xs, _ = data.floats()
    errors = [0.0]
    for x, y in zip(xs, padded_targets(model, data), strict=True):
        o = dense_pass(model, x, dtype)[-1].astype(float)
        D = np.sqrt(((o[:, None, :] - y[None, :, :]) ** 2).sum(-1))
        errors += [D.min(axis=1).max(), D.min(axis=0).max()]
    return float(np.max(errors))


def make_dataset(inputs, targets) -> ef.Dataset:
    """Dataset.from_arrays, failing the test if the data were unexpectedly merged."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", DuplicatePairWarning)
        return ef.Dataset.from_arrays(inputs, targets)


# ------------------------------------------------------------------------------ strategies
def coordinates(rational: bool):
    if rational:
        return st.fractions(min_value=-3, max_value=3, max_denominator=7)
    return st.integers(-3, 3).map(Fraction)


@st.composite
def datasets(draw, N=None, d=None, rational=None, single_token=False, m_equals_n=False,
             max_pool=6):
    """Exact datasets whose inputs are drawn from a small shared pool of tokens.

    Small pools make many sequences share tokens, which forces separation rounds. Targets are
    drawn from a pool that mixes input tokens and fresh points, so a target may coincide with an
    input token.
    """
    d = draw(st.integers(2, 6)) if d is None else d
    N = draw(st.integers(1, 8)) if N is None else N
    if rational is None:
        rational = draw(st.booleans())
    coord = coordinates(rational)
    token = st.tuples(*[coord] * d)
    if single_token:
        pool_size = draw(st.integers(N, max(N, max_pool)))
    else:
        pool_size = draw(st.integers(max(1, math.ceil(math.log2(N + 1))), max_pool))
    pool = draw(st.lists(token, min_size=pool_size, max_size=pool_size, unique=True))
    if single_token:
        sets = [frozenset([i]) for i in draw(st.permutations(range(pool_size)))[:N]]
    else:
        subset = st.frozensets(st.integers(0, pool_size - 1), min_size=1)
        sets = draw(st.lists(subset, min_size=N, max_size=N, unique=True))
    fresh = draw(st.lists(token, min_size=max_pool, max_size=max_pool, unique=True))
    target_pool = list(dict.fromkeys(pool + fresh))
    plain = not rational and draw(st.booleans())  # plain ints give a float64-backed dataset

    def tok(t):
        return [int(v) for v in t] if plain else list(t)

    inputs, targets = [], []
    for s in sets:
        order = draw(st.permutations(sorted(s)))
        n = len(order)
        m = n if m_equals_n else draw(st.integers(1, n))
        inputs.append([tok(pool[i]) for i in order])
        ys = draw(st.lists(st.sampled_from(target_pool), min_size=m, max_size=m, unique=True))
        targets.append([tok(y) for y in ys])
    return make_dataset(inputs, targets)


def conflict_data(seed: int = 0, n: int = 14, length: int = 6, d: int = 4) -> ef.CausalDataset:
    """Random sequences over three tokens in R^d with a random target per ordered prefix: many
    contexts at one point with different targets, so separation takes several rounds."""
    rng = random.Random(seed)
    pool: list[list[int]] = []
    while len(pool) < 3:  # distinct tokens: equal ones would make equal prefixes disagree
        v = [rng.randint(-3, 3) for _ in range(d)]
        if v not in pool:
            pool.append(v)
    outs = [[rng.randint(-3, 3) for _ in range(d)] for _ in range(4)]
    seqs = [[rng.randrange(3) for _ in range(length)] for _ in range(n)]
    by_prefix: dict[tuple, list] = {}
    return ef.CausalDataset.from_arrays(
        [[pool[t] for t in s] for s in seqs],
        [[by_prefix.setdefault(tuple(s[: i + 1]), rng.choice(outs)) for i in range(len(s))]
         for s in seqs])


def folder_bridge(folder):
    """(the TransformerLens bridge of an exported folder, the folder's own copy of
    lens_helpers that loaded it: imported from the folder, not from exactformer)."""
    sys.path.insert(0, str(folder / "transformer_lens"))
    try:
        import lens_helpers
    finally:
        sys.path.remove(str(folder / "transformer_lens"))
    return lens_helpers.load_bridge(folder / "transformer_lens"), lens_helpers
