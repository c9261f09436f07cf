"""Built-in datasets: the demo, random benchmark data and adversarial families.

Exact families use small rational coordinates so that they stress the construction (shared
tokens, nested sets, interior points, common maxima) rather than float rounding.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from .sets import Dataset


def _frac(a) -> list:
    return [[Fraction(int(v)) if float(v).is_integer() else Fraction(float(v)) for v in row]
            for row in np.asarray(a)]


def shared_pool(N: int, d: int, pool: int, n_max: int, m_max: int | None = None,
                seed: int = 0, m_equals_n: bool = False) -> Dataset:
    """N sequences of 1..n_max tokens drawn from a pool of ``pool`` integer tokens (heavy
    sharing); targets of 1..m_max integer tokens (m_j = n_j if ``m_equals_n``)."""
    rng = np.random.default_rng(seed)
    points = _distinct_integer_points(rng, pool, d, 6)

    def draw():
        n = int(rng.integers(1, min(n_max, pool) + 1))
        idx = tuple(sorted(rng.choice(pool, n, replace=False).tolist()))
        return idx, idx

    def make(idx):
        m = len(idx) if m_equals_n else int(rng.integers(1, min(len(idx), m_max or len(idx)) + 1))
        return _frac(points[list(idx)]), _frac(_distinct_integer_points(rng, m, d, 4))

    pairs = _distinct_draws(N, draw, make, f"shared_pool: sequences from a pool of {pool}")
    return Dataset.from_arrays([x for x, _ in pairs], [y for _, y in pairs])


def _distinct_draws(N: int, draw, make, what: str, tries_per_item: int = 100) -> list:
    """``make(value)`` for each of the first N draws ``draw() -> (key, value)`` with a new key.

    ``make`` runs only for a new key, so the generator's stream (and every dataset drawn from a
    seed) is what a plain rejection loop gives. After ``tries_per_item``·N draws it gives up with
    a ValueError: the family has fewer than N distinct members (or nearly so)."""
    seen, out = set(), []
    for _ in range(tries_per_item * N):
        if len(out) == N:
            break
        key, value = draw()
        if key not in seen:
            seen.add(key)
            out.append(make(value))
    if len(out) < N:
        raise ValueError(f"{what}: only {len(out)} distinct of the {N} requested after "
                         f"{tries_per_item * N} draws; ask for fewer")
    return out


def _distinct_integer_points(rng, k: int, d: int, radius: int, tries: int = 1000) -> np.ndarray:
    """k distinct points of {-radius..radius}^d, drawn together (redrawn on a repeat)."""
    if k > (2 * radius + 1) ** d:
        raise ValueError(f"cannot draw {k} distinct points with integer coordinates in "
                         f"[-{radius}, {radius}]^{d}: there are only {(2 * radius + 1) ** d}")
    for _ in range(tries):
        p = rng.integers(-radius, radius + 1, size=(k, d))
        if len({tuple(r) for r in p.tolist()}) == k:
            return p
    raise ValueError(f"no {k} distinct points in [-{radius}, {radius}]^{d} in {tries} draws; "
                     "ask for fewer")


def uniform(N: int, n: int, m: int, d: int, seed: int = 0) -> Dataset:
    """Float data: N sequences of n tokens uniform in [0,1]^d, m uniform target tokens each."""
    rng = np.random.default_rng(seed)
    xs = rng.random((N, n, d))
    ys = rng.random((N, m, d))
    return Dataset.from_arrays(list(xs), list(ys))


def vocabulary(N: int, vocab: int, n: int, m: int, d: int, seed: int = 0) -> Dataset:
    """Text-like float data: sequences of n distinct words from a fixed vocabulary of
    ``vocab`` random vectors, each mapped to m of its own words (a keyword set)."""
    rng = np.random.default_rng(seed)
    table = rng.standard_normal((vocab, d))

    def draw():
        idx = rng.choice(vocab, n, replace=False)
        return frozenset(idx.tolist()), idx

    words = np.array(_distinct_draws(N, draw, lambda idx: idx,
                                     f"vocabulary: sets of {n} of {vocab} words"))
    xs = table[words]  # one N×n×d gather: the same values as a gather per sequence, faster
    return Dataset.from_arrays(xs, xs[:, :m])


def nested(N: int, d: int, base: int = 3, seed: int = 0) -> Dataset:
    """X_k = X_1 ∪ {z_k}: every input contains the first one."""
    rng = np.random.default_rng(seed)
    pts = _distinct_integer_points(rng, base + N, d, 6)
    core = pts[:base]
    xs = [core] + [np.vstack([core, pts[base + k]]) for k in range(1, N)]
    ys = [_distinct_integer_points(rng, int(rng.integers(1, len(x) + 1)), d, 4) for x in xs]
    return Dataset.from_arrays([_frac(x) for x in xs], [_frac(y) for y in ys])


def interior(N: int, d: int, seed: int = 0) -> Dataset:
    """Sequences whose extra tokens lie strictly inside the convex hull of shared corners."""
    rng = np.random.default_rng(seed)
    corners = np.vstack([np.eye(d) * 8, -np.eye(d) * 8])
    xs, ys = [], []
    for k in range(N):
        inner = [Fraction(int(v), 7) for v in rng.integers(-6, 7, size=d)]
        inner[k % d] = Fraction(k + 1, N + 2)  # keeps the interior points distinct
        x = _frac(corners) + [inner]
        xs.append(x)
        ys.append(_frac(_distinct_integer_points(rng, int(rng.integers(1, 3)), d, 4)))
    return Dataset.from_arrays(xs, ys)


def one_token_apart(N: int, d: int, seed: int = 0) -> Dataset:
    """Sequences that differ only in one interior token (all other tokens shared)."""
    rng = np.random.default_rng(seed)
    shell = _frac(np.vstack([np.eye(d) * 5, -np.eye(d) * 5]))
    xs, ys = [], []
    for k in range(N):
        t = [Fraction(0)] * d
        t[0] = Fraction(k + 1, N + 1)
        t[1] = Fraction(-k, 2 * N + 1)
        xs.append(shell + [t])
        ys.append(_frac(_distinct_integer_points(rng, int(rng.integers(1, 4)), d, 4)))
    return Dataset.from_arrays(xs, ys)


def shared_maximum(N: int, d: int, seed: int = 0) -> Dataset:
    """Every sequence contains the same far-out token (the maximum along every direction with
    a positive coordinate sum), plus 1–3 tokens drawn from a small pool."""
    rng = np.random.default_rng(seed)
    big = [Fraction(100)] * d
    pool = _distinct_integer_points(rng, max(4, N // 2 + 3), d, 5)

    def draw():
        idx = tuple(sorted(rng.choice(len(pool), int(rng.integers(1, 4)), replace=False)))
        return idx, idx

    def make(idx):
        return ([big] + _frac(pool[list(idx)]),
                _frac(_distinct_integer_points(rng, int(rng.integers(1, 3)), d, 4)))

    pairs = _distinct_draws(N, draw, make, f"shared_maximum: subsets of a pool of {len(pool)}")
    return Dataset.from_arrays([x for x, _ in pairs], [y for _, y in pairs])


def demo() -> Dataset:
    """The demo: 12 sequences in R^3 over a pool of 7 tokens (heavy sharing), 1–3 targets."""
    return shared_pool(N=12, d=3, pool=7, n_max=5, m_max=3, seed=2026)
