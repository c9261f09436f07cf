"""Wide layers whose hats touch at a shared breakpoint, and enclosures of causal models.

Hats of one layer that end where the next begins tie in breakpoint order; the window
recogniser must still cut them (docs/numerics.md#ridge-windows), and a tracking run of such
layers, whose widened windows overlap at the shared points, must give up exactly the rows that
reach two windows of a layer. Causal enclosures run an exact pass up to the last attention layer
and track from there. Every claim is checked against an exact evaluation written here.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
from conftest import paper
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_causal import causal_data
from test_enclosure import apply, assert_contains, exact, exact_block, ref_forward

import exactformer as ef
from exactformer.evaluate import Arithmetic, enclose, forward, forward_causal, ridges_of
from exactformer.model import FF, Block, Transformer

FLOAT = Arithmetic("float")


def touching_layer(f, w, starts, delta, flat, order) -> tuple[FF, list]:
    """Flat-top hats on t = f·x, hat k rising over (s_k, s_k + δ), flat for ``flat``, falling
    to zero at s_k + 2δ + flat, where hat k + 1 starts; the hats' units are laid out in
    ``order``. Returns the layer and the hats' windows (in t), exactly."""
    units = []
    for k in order:
        s = starts[k]
        for p, sign in ((s, 1), (s + delta, -1), (s + delta + flat, -1), (s + 2 * delta + flat, 1)):
            units.append((p, sign * w[k]))
    U = np.array([f] * len(units), dtype=float)
    b = np.array([-p for p, _ in units], dtype=float)
    W = np.array([col for _, col in units], dtype=float).T
    windows = [(starts[k], starts[k] + 2 * delta + flat) for k in range(len(starts))]
    return FF(1.0, U, b, W), windows


@st.composite
def touching_models(draw):
    """Set models of two to four wide layers of touching hats on one direction (a run), and
    inputs inside hats, exactly at shared breakpoints and within a few ulps of them."""
    d = draw(st.integers(2, 3))
    f = np.zeros(d)
    f[0] = 1.0
    hats = draw(st.integers(2, 5))
    delta, flat = 2.0 ** -draw(st.integers(1, 3)), 2.0 ** -draw(st.integers(0, 2))
    span = 2 * delta + flat
    layers, windows = [], []
    for layer in range(draw(st.integers(2, 4))):
        origin = float(draw(st.integers(-4, 4))) + layer * hats * span
        starts = [origin + k * span for k in range(hats)]
        w = [np.array([0.0, *(draw(st.sampled_from([0.25, -0.5, 1.0])) for _ in range(d - 1))])
             for _ in range(hats)]  # moves orthogonal to f: a token stays in its hat's range
        order = draw(st.permutations(range(hats)))
        ff, wins = touching_layer(f, w, starts, delta, flat, order)
        layers.append(ff)
        windows.append(wins)
    points = sorted({p for wins in windows for lo, hi in wins for p in (lo, hi)})
    ts = []
    for _ in range(draw(st.integers(1, 6))):
        p = draw(st.sampled_from(points))
        ts.append(draw(st.sampled_from([p, p + delta / 2, float(np.nextafter(p, np.inf)),
                                        float(np.nextafter(p, -np.inf)), p + 2.0 ** -40])))
    xs = [np.array([[t, *draw(st.lists(st.sampled_from([0.0, 1.0, -2.0]), min_size=d - 1,
                                        max_size=d - 1))] for t in ts[:k]])
          for k in range(1, len(ts) + 1)]
    xs = [np.unique(x, axis=0) for x in xs]
    model = Transformer(d=d, attention="hardmax", blocks=[Block(ff, None) for ff in layers],
                        exact=False)
    return model, windows, xs


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=touching_models())
def test_touching_hats_are_cut_and_enclosed(case):
    model, windows, xs = case
    found = ridges_of([b.ff for b in model.blocks], [b.ff for b in model.blocks], FLOAT)
    for ridges, wins in zip(found, windows, strict=True):
        assert ridges is not None
        assert sorted((float(r.lo), float(r.hi)) for r, _ in ridges) == sorted(wins)
    ref = ref_forward(model, xs)
    got = forward(model, [x.astype(object) for x in xs], "exact")
    assert [[list(map(Fraction, row)) for row in o] for o in got] == ref
    mids, rads = enclose(model, xs, None)
    assert_contains(mids, rads, ref)
    floats = forward(model, xs, "float")
    for o, e in zip(floats, ref, strict=True):
        assert np.abs(o - np.array(e, dtype=float)).max() <= 1e-12


def ref_causal(model: Transformer, xs) -> list[list[list[Fraction]]]:
    """The exact causal evaluation: positions added, FF token by token, hardmax attention of
    token i over tokens 0..i (ties averaged)."""
    blocks = [exact_block(b) for b in model.blocks]
    pos = [[exact(v) for v in row] for row in model.positions]
    outs = []
    for x in xs:
        X = [[exact(v) + p for v, p in zip(row, pos[i], strict=True)] for i, row in enumerate(x)]
        for ff, sa in blocks:
            if ff is not None:
                eta, U, b, W = ff
                X = [[eta * v + dv for v, dv in zip(row, apply(W, [
                    max(Fraction(0), z + bk) for z, bk in zip(apply(U, row), b, strict=True)]),
                    strict=True)] for row in X]
            if sa is not None:
                rho, heads = sa
                new = [[rho * v for v in row] for row in X]
                for A, V in heads:
                    for i, row in enumerate(X):
                        Ax = apply(A, row)
                        S = [sum((s * t for s, t in zip(Ax, y, strict=True)), Fraction(0))
                             for y in X[:i + 1]]
                        hit = [X[l] for l, s in enumerate(S) if s == max(S)]
                        mean = [sum(c, Fraction(0)) / len(hit) for c in zip(*hit, strict=True)]
                        new[i] = [o + v for o, v in zip(new[i], apply(V, mean), strict=True)]
                X = new
        outs.append(X)
    return outs


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=causal_data(max_len=6), width=st.sampled_from([4, 8]))
def test_causal_enclosures_hold_the_exact_evaluation(data, width):
    model = paper(data, exact=False, causal=True, width=width)
    xs, _ = data.padded(model.d).floats()  # keyed models own coordinates beyond the data's
    ref = ref_causal(model, xs)
    mids, rads = enclose(model, xs, None)
    assert_contains(mids, rads, ref)
    assert all(np.isfinite(r).all() for r in rads)  # constructed models: nothing given up
    exact_pass = forward_causal(model, xs, "exact")
    assert [[list(row) for row in o] for o in exact_pass] == ref


def test_a_causal_enclosure_takes_exact_inputs_only():
    data = ef.CausalDataset.from_arrays([[[0.0, 1.0], [1.0, 0.0]]], [[[1.0, 1.0], None]])
    model = paper(data, exact=False, causal=True)
    xs, _ = data.floats()
    try:
        enclose(model, xs, [np.zeros_like(x) for x in xs])
    except ValueError as e:
        assert "exact inputs" in str(e)
    else:
        raise AssertionError("radii were accepted")
    assert math.isfinite(float(enclose(model, xs, None)[1][0].max()))
