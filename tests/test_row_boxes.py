"""Rows in boxes across FF layers (evaluate/boxes.py). The bounds hold every row a box keeps,
its radius included; an enclosure pass that keeps boxes (evaluate/layers.py, dense_tracking)
gives the outputs and radii of a pass without them, and its boxes hold the layers' exact
values, in Fractions, at every corner of the input boxes."""

from __future__ import annotations

import itertools
from fractions import Fraction
from unittest import mock

import numpy as np
from hypothesis import Phase, given, settings
from hypothesis import strategies as st
from test_dense_pass import small
from test_gates import reference

from exactformer.evaluate import boxes, enclose, jobs, layers
from exactformer.model import FF, Block, Transformer


# no explain phase: its tracing takes minutes on a failure
@settings(max_examples=100, deadline=None, phases=[Phase.generate, Phase.shrink])
@given(data=st.data())
def test_boxes_hold_every_clean_row_within_their_bounds(data):
    """After any changes: each row is dirty or in one box, whose bounds hold the row's
    x ± r on every column measured (every column, or those the weight reads); each box's
    largest |value| and the rows' are exact (within one float step with radii); a box that
    ``rows`` gives one row of (for the columns ``reads``) agrees on them; the bounds of
    U·x + b hold at every corner of every row's x ± r (on small integers and quarters, where
    the sums are exact), and are inf where U reads a column not measured."""
    d = data.draw(st.integers(1, 4))
    X = data.draw(small((data.draw(st.integers(1, 40)), d), -4, 4))
    scale = data.draw(st.sampled_from([None, 0, 1]))  # no radii, radii 0, radii
    r = None if scale is None else data.draw(small(X.shape, 0, 2)) / 4 * scale
    weight = data.draw(small((d,), 0, 2))
    read_only = data.draw(st.booleans()) and weight.any()
    measured = np.flatnonzero(weight) if read_only else np.arange(d)
    with mock.patch.object(boxes, "GROUP", data.draw(st.integers(1, 5))), \
            mock.patch.object(boxes, "ABSORB", data.draw(st.integers(1, 9))):
        bx = boxes.Boxes(X, weight, r, read_only=read_only)
        for _ in range(data.draw(st.integers(0, 4))):
            on = np.array(sorted(set(data.draw(st.lists(st.integers(0, len(X) - 1), min_size=1)))))
            X[on] += data.draw(small((len(on), d), -3, 3))
            if r is not None:
                r[on] = data.draw(small((len(on), d), 0, 2)) / 4
            bx.leave(X, r, on)
        every = np.arange(len(bx.members))
        assert sorted(bx.rows(every, with_dirty=True)) == list(range(len(X)))
        size = np.abs(X) if r is None else np.abs(X) + r
        if not read_only:  # (ends of x ± r are rounded outward: one float step)
            assert size.max() <= bx.top() <= np.nextafter(size.max(), np.inf)
            assert r is not None or bx.top() == size.max()
        reads = np.array(sorted(set(data.draw(st.lists(st.sampled_from(measured.tolist()),
                                                        min_size=1)))))
        some = bx.rows(every, with_dirty=False, reads=reads) if not read_only else None
        U, b = data.draw(small((2, len(reads)), -2, 2)), data.draw(small((2,), -5, 5))
        high, top = bx.bounds(reads, U, b)
        at = bx.at[reads]
        for g in every:
            rows = bx.rows(np.array([g]), with_dirty=False)
            R = np.zeros((len(rows), d)) if r is None else r[rows]
            low, up = X[rows] - R, X[rows] + R
            assert (bx.lo[:, g] <= low[:, measured]).all() and \
                (up[:, measured] <= bx.hi[:, g]).all()
            if not read_only:
                top_g = size[rows].max(initial=0.0)
                assert top_g <= bx.peak[g] <= np.nextafter(top_g, np.inf)
            if some is not None and r is None:
                kept = X[np.intersect1d(rows, some)][:, reads]
                assert len(rows) == 0 or all((kept == x).all(axis=1).any()
                                             for x in X[rows][:, reads])
            for signs in itertools.product([-1, 1], repeat=len(reads)):
                Z = (X[rows][:, reads] + np.array(signs) * R[:, reads]) @ U.T + b
                assert (Z <= high[g]).all() and (np.abs(Z) <= top[g]).all()
        assert (at >= 0).all()
        unread = np.setdiff1d(np.arange(d), measured)
        if len(unread):
            assert np.isinf(bx.bounds(unread[:1], np.ones((1, 1)), np.zeros(1))[0]).all()


@st.composite
def sparse_stack(draw):
    """Rows of small integers (some with radii of quarters) and a stack of residual FF
    layers whose units fire on a few rows (a bias below most U·x, as a keyed model's
    moves), on random weights (no gated or key layer: every layer goes densely); a last
    coordinate, 1, that no layer reads or writes (a layer that touches every coordinate
    counts as changing every row)."""
    d = draw(st.integers(2, 4))
    n = draw(st.integers(4, 40))
    X = np.column_stack([draw(small((n, d), -4, 4)), np.ones(n)])
    R = np.column_stack([draw(small((n, d), 0, 2)) / 4 * draw(st.sampled_from([0, 1])),
                         np.zeros(n)])
    blocks = []
    for _ in range(draw(st.integers(2, 10))):
        h = draw(st.integers(2, 4))
        U, W = np.zeros((h, d + 1)), np.zeros((d + 1, h))
        U[:, :d], W[:d] = draw(small((h, d), -2, 2)), draw(small((d, h), -3, 3)) / 4
        blocks.append(Block(FF(1.0, U, draw(small((h,), -14, 0)), W), None))
    return blocks, X, R


def corners(X: np.ndarray, R: np.ndarray) -> np.ndarray:
    """Every corner of every row's box X ± R (rows whose radius is 0: the row itself)."""
    out = []
    for x, r in zip(X, R, strict=True):
        for signs in itertools.product([-1, 1], repeat=len(x)):
            out.append(x + np.array(signs) * r)
    return np.unique(np.array(out), axis=0)


def spied(monkeypatch) -> dict:
    """Counts of the boxes' bounds asked, and of the boxes they ruled out."""
    seen = {"bounds": 0, "ruled out": 0}
    bounds = boxes.Boxes.bounds

    def spy(self, reads, U, b):
        high, top = bounds(self, reads, U, b)
        seen["bounds"] += 1
        seen["ruled out"] += int((high <= 0).sum())
        return high, top
    monkeypatch.setattr(boxes.Boxes, "bounds", spy)
    return seen


# no explain phase: its tracing takes minutes on a failure
@settings(max_examples=100, deadline=None, phases=[Phase.generate, Phase.shrink])
@given(case=sparse_stack(), group=st.sampled_from([1, 2, 3, 32]),
       absorb=st.sampled_from([1, 2, 5, 128]))
def test_an_enclosure_pass_on_boxes_equals_one_without_and_holds_every_corner(case, group,
                                                                               absorb):
    """Boxes made after every layer (patched: any row count and any stretch), small or not
    and absorbing dirty rows early or late: the outputs and radii equal those of the pass
    without boxes, and the exact layers, from every corner of every input box, stay within
    the output boxes."""
    blocks, X, R = case
    model = Transformer(d=X.shape[1], attention="hardmax", blocks=blocks, exact=False)
    plain = enclose(model, [X], [R])
    with mock.patch.object(layers, "BOX_ROWS", 1), mock.patch.object(jobs, "BOX_LAYERS", 1), \
            mock.patch.object(boxes, "FEW", 1), mock.patch.object(boxes, "GROUP", group), \
            mock.patch.object(boxes, "ABSORB", absorb):
        out, rad = enclose(model, [X], [R])
    assert np.array_equal(out[0], plain[0][0]) and np.array_equal(rad[0], plain[1][0])
    points = corners(X, R)
    want = reference(blocks, points)
    start = [row.tolist() for row in np.concatenate([X - R, X + R])]
    for p, w in zip(points.tolist(), want, strict=True):
        i = next(i for i in range(len(X)) if all(
            lo <= v <= hi for lo, v, hi in zip(start[i], p, start[len(X) + i], strict=True)))
        assert all(abs(Fraction(o) - v) <= Fraction(e)
                   for o, v, e in zip(out[0][i], w, rad[0][i], strict=True)), (i, p)


def test_moves_of_one_row_each_leave_the_other_boxes_unread(monkeypatch):
    """64 rows (c, c², 0, 1), c = 0…63, and ten layers, each with a unit −(c − k)² + 1/2
    that fires at c = k alone and adds 1 to that row's data, beside a unit that never fires
    (no layer touches the last coordinate: a layer that reads or writes every coordinate
    counts as changing every row): the boxes (of 4 rows) are asked at every layer but the
    first, rule out most boxes, and the outputs are the exact moves."""
    seen = spied(monkeypatch)
    c = np.arange(64, dtype=float)
    X = np.column_stack([c, c ** 2, np.zeros(64), np.ones(64)])
    blocks = [Block(FF(1.0, np.array([[2.0 * k, -1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]]),
                       np.array([0.5 - k * k, -1000.0]),
                       np.array([[0.0, 0.0], [0.0, 0.0], [2.0, 0.0], [0.0, 0.0]])), None)
              for k in range(0, 40, 4)]
    model = Transformer(d=4, attention="hardmax", blocks=blocks, exact=False)
    monkeypatch.setattr(layers, "BOX_ROWS", 1)
    monkeypatch.setattr(jobs, "BOX_LAYERS", 1)
    monkeypatch.setattr(boxes, "GROUP", 4)
    monkeypatch.setattr(jobs, "staged_runs", lambda blocks, plain, weights, gated: {})  # (a staged
    # run would take them at once: here every layer goes to the boxes)
    out, rad = enclose(model, [X], [np.zeros(X.shape)])
    want = X.copy()
    want[0:40:4, 2] = 1.0
    assert np.array_equal(out[0], want) and not rad[0].any()
    assert seen["bounds"] == len(blocks) - 1
    assert seen["ruled out"] > seen["bounds"] * 16 // 2  # of 16 boxes each time
