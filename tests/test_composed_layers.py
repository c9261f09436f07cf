"""Composed layers (evaluate/composed.py, docs/numerics.md#composed-layers): residual FF
layers each reading nothing the ones before them write are one layer in exact arithmetic, and
a tracking pass that takes them as one still holds the exact evaluation of the layers in order
(the Fraction evaluator of test_gates.py, every unit on every row)."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from test_gate_runs import holds
from test_gates import reference

from exactformer.evaluate import composed, enclose, forward
from exactformer.evaluate.arithmetic import Arithmetic
from exactformer.evaluate.jobs import Job
from exactformer.evaluate.layers import ff_rows
from exactformer.model import FF, Block, Transformer


@st.composite
def stacks(draw):
    """2 to 6 residual layers on D = 3 to 6 coordinates, 1 to 4 units each, every unit reading
    one or two coordinates and writing one to three (weights small dyadics or generic floats,
    biases of either sign), so that some layers read what an earlier one wrote; and rows, some
    exactly 0 where units read."""
    D = draw(st.integers(3, 6))
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
    generic = draw(st.booleans())
    blocks = []
    for _ in range(draw(st.integers(2, 6))):
        h = int(rng.integers(1, 5))
        U, W = np.zeros((h, D)), np.zeros((D, h))
        for k in range(h):
            U[k, rng.choice(D, int(rng.integers(1, 3)), replace=False)] = \
                rng.integers(-4, 5, size=1) / 2 + (rng.standard_normal() if generic else 0)
            W[rng.choice(D, int(rng.integers(1, 4)), replace=False), k] = \
                rng.integers(-8, 9) / 4 + (rng.standard_normal() if generic else 0)
        b = rng.integers(-4, 1, size=h) / 2.0 + (rng.random(h) < 0.1)  # (> 0: not composed)
        blocks.append(Block(FF(1.0, U, b, W), None))
    X = rng.integers(-8, 9, size=(int(rng.integers(1, 8)), D)) / 4
    X[rng.random(X.shape) < 0.4] = 0.0
    if generic:
        X = X + rng.standard_normal(X.shape) * (X != 0)
    return blocks, X


def as_fractions(rows) -> list[list[Fraction]]:
    return [[Fraction(v) for v in row] for row in rows]


@settings(max_examples=150, deadline=None)
@given(stacks())
def test_a_composed_layer_is_its_layers_in_order(stack):
    """In Fractions, each composed layer gives every row what its layers in order give."""
    blocks, X = stack
    for first, c in composed.composed_layers(blocks, [True] * len(blocks)).items():
        assert reference([Block(c.ff, None)], X) == reference(blocks[first:c.end], X)
        assert c.end - first >= 2 and c.ff.width <= composed.COMPOSED_UNITS


@settings(max_examples=150, deadline=None)
@given(stacks())
def test_the_enclosure_of_composed_layers_holds_the_exact_pass(stack):
    blocks, X = stack
    model = Transformer(d=X.shape[1], attention="hardmax", blocks=blocks, exact=False)
    holds(model, [X], reference(blocks, X))


def test_pairs_of_snaps_compose_and_a_layer_that_reads_a_write_does_not(monkeypatch):
    """A snapped softmax model's two layers of pairs (each reading its own snap coordinate,
    writing the data and clearing its snap) compose; the snap layer after them reads what
    they write and starts anew. The enclosure applies the composed layer to the rows one
    pair moves and the layers in order to a row both may move; the plain float pass applies
    every layer."""
    D = 5  # data 0..1, snaps 2..3, moved 4
    pair = [(2, [0.5, -0.25]), (3, [-1.0, 0.75])]
    blocks = []
    for snap, move in pair:
        U = np.zeros((2, D))
        U[:, snap] = 1.0
        W = np.zeros((D, 2))
        W[:2, 0], W[:2, 1] = move, np.negative(move)
        W[4, :], W[snap, 0] = [1.0, -1.0], -1.0
        blocks.append(Block(FF(1.0, U, np.array([0.0, -1.0]), W), None))
    U = np.zeros((1, D))
    U[0, 4] = -2.0  # a snap reads `moved`
    W = np.zeros((D, 1))
    W[2, 0] = 1.0
    blocks.append(Block(FF(1.0, U, np.array([-0.5]), W), None))
    found = composed.composed_layers(blocks, [True] * 3)
    assert list(found) == [0] and found[0].end == 2
    model = Transformer(d=D, attention="hardmax", blocks=blocks, exact=False)
    assert Job.of(model, Arithmetic("float"), None).composed.keys() == {0}
    X = np.array([[0.0, 0.0, 1.5, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0, 0.0],
                  [1.0, 2.0, 0.0, 0.0, 0.0], [0.0, 0.0, 1.0, 2.0, 0.0]])
    widths = []

    def spy(st_, ff, rows):
        widths.append((ff.width, len(rows)))
        return ff_rows(st_, ff, rows)

    monkeypatch.setattr(composed, "ff_rows", spy)
    holds(model, [X], reference(blocks, X))
    assert widths == [(4, 2), (2, 1), (2, 1)]
    Y = X.copy()
    for blk in blocks:
        Y = Y + np.maximum(Y @ blk.ff.U.T + blk.ff.b, 0.0) @ blk.ff.W.T
    assert np.array_equal(forward(model, [X])[0], Y)
    assert as_fractions(X) != reference(blocks, X)


def test_a_row_two_composed_layers_move_keeps_the_float_pass_of_the_layers():
    """1 + 10^16 − 10^16, one term a layer, both reading x_1 = 1: the layers compose, but the
    row has units of both on, so the enclosure takes the layers in order and its float64
    value is theirs, 0 (the composed layer would sum the two moves first: 1), with the
    exact 1 inside its box."""
    up = FF(1.0, np.array([[0.0, 1.0]]), np.array([0.0]), np.array([[1e16], [0.0]]))
    down = FF(1.0, np.array([[0.0, 1.0]]), np.array([0.0]), np.array([[-1e16], [0.0]]))
    model = Transformer(d=2, attention="hardmax", blocks=[Block(up, None), Block(down, None)],
                        exact=False)
    assert Job.of(model, Arithmetic("float"), None).composed.keys() == {0}
    X = np.array([[1.0, 1.0]])
    (out,), (rad,) = enclose(model, [X], [np.zeros(X.shape)])
    assert out[0, 0] == 0.0 == forward(model, [X])[0][0, 0] and rad[0, 0] >= 1.0
    holds(model, [X], reference(model.blocks, X))
