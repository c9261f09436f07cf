"""Shared helpers and hypothesis strategies for the exactformer test suite."""

from __future__ import annotations

import math
import os
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


def token_set(a) -> set:
    """The rows of ``a`` as a set of tuples of Fractions (exact comparison)."""
    return {tuple(Fraction(v) for v in row) for row in np.asarray(a, dtype=object)}


def exact_outputs(model, dataset) -> list[np.ndarray]:
    xs, _ = dataset.fractions()
    return ef.forward(model, xs, arithmetic="exact")


def assert_interpolates_exactly(model, dataset) -> None:
    """Exact forward pass: the set of output tokens equals the target set, for every pair."""
    outs = exact_outputs(model, dataset)
    _, ys = dataset.fractions()
    assert len(outs) == dataset.N
    for j, (o, x, y) in enumerate(zip(outs, dataset.inputs, ys, strict=True)):
        assert o.shape == x.shape, f"pair {j}: the model is not length preserving"
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
