"""Attention heads computed per sequence: the cache of rank-one heads and the batches of
general hardmax heads change no result.

A rank-one head is recomputed only for the sequences whose rows changed since it last ran
(``rank_one.HeadCache``); a result reused for a sequence that did change would be a wrong
output or, in a tracking pass, a radius too small. Each test here compares the pass with the
cache against the same pass recomputing every head from scratch, bit for bit, and the
batched general heads against one sequence at a time and a hull written out in the test.
"""

from __future__ import annotations

from unittest.mock import patch

import numpy as np
from conftest import datasets
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_enclosure import (
    check_containment,
    compiled,
    float_coordinates,
    hat,
    head,
    random_inputs,
    transformer,
)

import exactformer as ef
from exactformer.evaluate import PassStats, enclose, enclosure, head_radius, rank_one
from exactformer.evaluate.attention import float_hardmax_rows, float_scores_batch
from exactformer.model import SA, Block


def no_cache():
    """A context in which every head is recomputed from scratch."""
    original = rank_one.HeadCache.result

    def fresh(self, *args, **kwargs):
        self.clear()
        return original(self, *args, **kwargs)

    return patch.object(rank_one.HeadCache, "result", fresh)


def runs(model, xs, give_up: float):
    """Enclosure (outputs, radii, stats), float and exact outputs of ``xs``."""
    xf = [np.array([[float(v) for v in row] for row in x]) for x in xs]
    stats = PassStats()
    mids, rads = enclose(model, xf, [np.zeros_like(x) for x in xf], stats, give_up=give_up)
    return (mids, rads, stats, ef.forward(model, xf, "float"),
            ef.forward(model, [np.array(x, dtype=object) for x in xs], "exact"))


def assert_same(a, b) -> None:
    """Two results of :func:`runs`, equal bit for bit (nan where nan)."""
    for one, two in zip(a[:2] + a[3:], b[:2] + b[3:], strict=True):
        for u, v in zip(one, two, strict=True):
            assert u.shape == v.shape
            if u.dtype == object:
                assert (u == v).all()
            else:
                assert np.array_equal(u, v, equal_nan=True)
    assert a[2] == b[2]


@st.composite
def hat_and_head_models(draw, d: int, near: tuple):
    """Blocks of a hat on e1 near the inputs' coordinates and one rank-one head that every
    block repeats (only the written column p changes), as in the separation rounds."""
    c, a, q = (draw(st.lists(st.sampled_from([0.0, 1.0, -1.0, 0.5]), min_size=d, max_size=d))
               for _ in range(3))
    e1 = [1.0] + [0.0] * (d - 1)
    blocks = []
    for _ in range(draw(st.integers(2, 5))):
        start = draw(st.sampled_from(near)) - draw(st.sampled_from([0.5, 0.25]))
        lift = draw(st.lists(st.sampled_from([0.0, 1.0, -2.0]), min_size=d, max_size=d))
        p = draw(st.lists(st.sampled_from([0.0, 0.5, 1.0]), min_size=d, max_size=d))
        sa = SA(1.0, heads=[head(0.0, a, c, 0.0, p, q)])
        blocks.append(Block(hat(e1, lift, start, draw(st.sampled_from([0.5, 0.25]))), sa))
    return transformer(blocks, d)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(d=st.integers(2, 3), data=st.data(), give_up=st.sampled_from([np.inf, 1e-300]),
       share=st.sampled_from([rank_one.RECOMPUTED, 1.0]))
def test_repeated_heads_reuse_nothing_stale(d, data, give_up, share):
    """Hats move some rows between repeats of one head; a head's column written by one block
    is read by the next when p meets c, a or q. With and without the cache (its sequences
    updated one by one, ``share`` 1, or afresh past a share of changed rows), every output,
    radius and statistic is the same, and the exact evaluation lies within the radii."""
    xs = data.draw(random_inputs(d, rational=True))
    model = data.draw(hat_and_head_models(d, float_coordinates(xs)))
    with patch.object(rank_one, "RECOMPUTED", share):
        cached = runs(model, xs, give_up)
    with no_cache():
        assert_same(cached, runs(model, xs, give_up))
    check_containment(model, xs)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=datasets(N=None, max_pool=5), shape=st.sampled_from([(4, 1), (8, 2)]),
       give_up=st.sampled_from([np.inf, 1e-12]))
def test_constructed_models_reuse_nothing_stale(data, shape, give_up):
    """Constructed models (separation rounds repeat one head over shared tokens): the cache
    changes no output, radius or statistic."""
    model = compiled(data, *shape)
    xs, _ = data.fractions()
    cached = runs(model, xs, give_up)
    with no_cache():
        assert_same(cached, runs(model, xs, give_up))


@given(lengths=st.lists(st.integers(1, 5), min_size=1, max_size=8), data=st.data())
def test_segments_subset(lengths, data):
    """The rows of chosen segments, renumbered, are those segments' ranges in order."""
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    sg = rank_one.Segments(np.repeat(np.arange(len(lengths)), lengths), starts)
    segs = np.array(sorted(data.draw(st.sets(st.integers(0, len(lengths) - 1), min_size=1))))
    rows, sub = sg.subset(segs)
    assert rows.tolist() == [r for s in segs for r in range(starts[s], starts[s] + lengths[s])]
    assert sub.seg.tolist() == [i for i, s in enumerate(segs) for _ in range(lengths[s])]
    assert sub.starts.tolist() == np.concatenate([[0], np.cumsum(
        [lengths[s] for s in segs])[:-1]]).tolist()


def naive_hull_radius(X, r, q, q_rad, k, k_rad, alpha, C, C_rad, avg):
    """One sequence, row by row: the hull of the carrier boxes of every key whose score
    interval reaches the row's best certain score (written out with loops)."""
    S = float_scores_batch(X, q, k, alpha)
    E = head_radius.score_error(X, r, q, q_rad, k, k_rad, alpha)
    out = np.empty(C.shape)
    for i in range(len(X)):
        hi, lo = enclosure.upper(S[i], E[i]), enclosure.lower(S[i], E[i])
        best = max(v for v in lo if not np.isnan(v))
        cand = [j for j in range(len(X)) if not (np.isfinite(hi[j]) and np.isfinite(lo[j]))
                or hi[j] >= best]
        c_lo = np.min([C[j] for j in cand], axis=0)
        c_hi = np.max([C[j] for j in cand], axis=0)
        c_rad = np.max([C_rad[j] for j in cand], axis=0)
        out[i] = head_radius.hull_radius(avg[i], c_lo, c_hi, c_rad)
    return out


@settings(max_examples=40, deadline=None)
@given(B=st.integers(1, 4), n=st.integers(1, 5), d=st.integers(2, 3), data=st.data())
def test_batched_general_heads(B, n, d, data):
    """A batch of sequences gives each sequence's own hardmax averages, statistics and radii
    (small integer points, so every float sum is exact); rows repeated within a sequence and
    wide radii make keys tie or overlap, so rows have several candidates."""
    pts = st.lists(st.integers(-3, 3).map(float), min_size=d, max_size=d)
    X = np.array(data.draw(st.lists(st.lists(pts, min_size=n, max_size=n), min_size=B,
                                    max_size=B)))
    r = np.full(X.shape, data.draw(st.sampled_from([0.0, 1e-3, 2.0])))
    c = np.array(data.draw(pts))
    a = np.array(data.draw(pts))
    alpha = data.draw(st.sampled_from([0.0, 1.0, -0.5]))
    w = np.ones((B, n))
    q, k = X @ c, X @ a
    q_rad, k_rad = np.abs(r) @ np.abs(c), np.abs(r) @ np.abs(a)
    together = PassStats()
    S = float_scores_batch(X, q, k, alpha)
    ends = S.max(axis=-1), S.min(axis=-1)
    avg = float_hardmax_rows(S, X, w, together, X, *ends)
    rad = head_radius.head_radius(S, *ends, X, r, q, q_rad, k, k_rad, alpha, X, r, avg)
    alone = PassStats()
    for b in range(B):
        one = float_hardmax_rows(S[b], X[b], w[b], alone, X[b], ends[0][b], ends[1][b])
        assert np.array_equal(one, avg[b])
        args = (X[b], r[b], q[b], q_rad[b], k[b], k_rad[b], alpha, X[b], r[b], avg[b])
        assert np.array_equal(head_radius.head_radius(S[b], ends[0][b], ends[1][b], *args),
                              rad[b])
        assert np.array_equal(naive_hull_radius(*args), rad[b])
    assert together == alone


@settings(max_examples=150, deadline=None)
@given(B=st.integers(1, 3), n=st.integers(1, 6), d=st.integers(1, 3), data=st.data())
def test_sole_candidate_shortcut_at_float_ties(B, n, d, data):
    """Rows whose best float score has a rival within a few ulps, radii from 0 to far wider
    than the gaps, and rank-one parts of either sign: the shortcut that takes a row's sole
    candidate without the n × n error bounds gives the radii of the hull written out here,
    bit for bit, whichever rows it proves sole."""
    base = np.array(data.draw(st.lists(st.floats(-2, 2, allow_subnormal=False), min_size=d,
                                       max_size=d)))
    ulps = st.integers(-4, 4)
    steps = np.array(data.draw(st.lists(st.lists(st.lists(ulps, min_size=d, max_size=d),
                                                 min_size=n, max_size=n),
                                        min_size=B, max_size=B)), dtype=float)
    scale = data.draw(st.sampled_from([1.0, 2.0 ** 20, 2.0 ** -20]))
    X = (base + steps * np.spacing(np.abs(base) + 1.0)) * scale
    r = np.abs(X) * data.draw(st.sampled_from([0.0, 2.0 ** -53, 2.0 ** -50, 1e-3]))
    c, a = (np.array(data.draw(st.lists(st.sampled_from([0.0, 1.0, -0.5]), min_size=d,
                                        max_size=d))) for _ in range(2))
    alpha = data.draw(st.sampled_from([0.0, 1.0, -1.0]))
    q, k = X @ c, X @ a
    q_rad, k_rad = np.abs(r) @ np.abs(c), np.abs(r) @ np.abs(a)
    S = float_scores_batch(X, q, k, alpha)
    ends = S.max(axis=-1), S.min(axis=-1)
    avg = float_hardmax_rows(S, X, np.ones((B, n)), PassStats(), X, *ends)
    rad = head_radius.head_radius(S, *ends, X, r, q, q_rad, k, k_rad, alpha, X, r, avg)
    for b in range(B):
        args = (X[b], r[b], q[b], q_rad[b], k[b], k_rad[b], alpha, X[b], r[b], avg[b])
        assert np.array_equal(naive_hull_radius(*args), rad[b])
