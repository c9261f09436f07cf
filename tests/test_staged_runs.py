"""Staged runs (evaluate/staged.py, docs/numerics.md#staged-runs): a tracking pass takes a run
of residual FF layers at once, each row through the layers that may act on it, in order, one
enclosure a stage with every other layer's units held off. Checked against the exact layers in
order (the Fraction evaluator of test_gates.py, every unit on every row), on stacks whose layers
read what earlier ones write."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_gate_runs import holds
from test_gates import reference

from exactformer.evaluate import enclose, enclosure, forward, staged
from exactformer.evaluate.arithmetic import Arithmetic
from exactformer.evaluate.jobs import Job
from exactformer.model import FF, Block, Transformer


def random_stack(rng, generic: bool):
    """2 to 6 residual layers on D = 3 to 6 coordinates, 1 to 4 units each, every unit reading
    one or two coordinates and writing one to three (weights small dyadics, or ``generic``
    floats, biases of either sign), so that some layers read what an earlier one wrote; and
    rows, some exactly 0 where units read."""
    D = int(rng.integers(3, 7))
    blocks = []
    for _ in range(int(rng.integers(2, 7))):
        h = int(rng.integers(1, 5))
        U, W = np.zeros((h, D)), np.zeros((D, h))
        for k in range(h):
            U[k, rng.choice(D, int(rng.integers(1, 3)), replace=False)] = \
                rng.integers(-4, 5, size=1) / 2 + (rng.standard_normal() if generic else 0)
            W[rng.choice(D, int(rng.integers(1, 4)), replace=False), k] = \
                rng.integers(-8, 9) / 4 + (rng.standard_normal() if generic else 0)
        b = rng.integers(-4, 1, size=h) / 2.0 + (rng.random(h) < 0.1)  # (> 0: no run)
        blocks.append(Block(FF(1.0, U, b, W), None))
    X = rng.integers(-8, 9, size=(int(rng.integers(1, 8)), D)) / 4
    X[rng.random(X.shape) < 0.4] = 0.0
    if generic:
        X = X + rng.standard_normal(X.shape) * (X != 0)
    return blocks, X


@st.composite
def stacks(draw):
    """:func:`random_stack` from a drawn seed, dyadic or generic."""
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
    return random_stack(rng, draw(st.booleans()))


def counted(monkeypatch) -> dict:
    """Counts of the runs staged and of the stages enclosed (every run staged, whatever
    share of the rows it may change)."""
    seen = {"runs": 0, "stages": 0}
    apply, into = staged.StagedRun.apply, enclosure.ff_dense_into

    def spy_apply(self, st_):
        taken = apply(self, st_)
        seen["runs"] += taken
        return taken

    def spy_into(*args, off=None):
        seen["stages"] += off is not None
        return into(*args, off=off)

    monkeypatch.setattr(staged, "LIVE_SHARE", 1.0)
    monkeypatch.setattr(staged.StagedRun, "apply", spy_apply)
    monkeypatch.setattr(enclosure, "ff_dense_into", spy_into)
    return seen


@settings(max_examples=150, deadline=None)
@given(stack=stacks())
def test_a_staged_run_holds_the_exact_layers_in_order(stack):
    """Every exact coordinate of the layers in order, in Fractions, lies in the box the
    staged pass gives it; layers of the stacks read what earlier ones write."""
    blocks, X = stack
    model = Transformer(d=X.shape[1], attention="hardmax", blocks=blocks, exact=False)
    with pytest.MonkeyPatch.context() as mp:
        seen = counted(mp)
        holds(model, [X], reference(blocks, X))
    runs = Job.of(model, Arithmetic("float"), None).staged
    assert seen["runs"] == len(runs)  # (every run found is taken)


def test_a_snap_and_the_pair_that_reads_it_go_in_stages(monkeypatch):
    """A snap (relu(2a − 1/2) into its own coordinate, a reading a code) and, a layer later,
    the pair relu(s) − relu(s − 1) that reads it, writes a move and `moved` and clears s
    (docs/keyed.md#softmax); then a second snap of the same code that `moved` turns off. The
    run is staged: the moved row goes through the snap and the pair (two stages), the
    second snap stays off, and the outputs are the exact layers' and the float pass's."""
    D = 4  # code 0, data 1, snap 2, moved 3
    snap = Block(FF(1.0, np.array([[2.0, 0.0, 0.0, -4.0]]), np.array([-0.5]),
                    np.array([[0.0], [0.0], [1.0], [0.0]])), None)
    pair = Block(FF(1.0, np.array([[0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 1.0, 0.0]]),
                    np.array([0.0, -1.0]),
                    np.array([[0.0, 0.0], [0.375, -0.375], [-1.0, 0.0], [1.0, -1.0]])), None)
    blocks = [snap, pair, snap]
    model = Transformer(d=D, attention="hardmax", blocks=blocks, exact=False)
    assert list(Job.of(model, Arithmetic("float"), None).staged) == [0]
    X = np.array([[1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0], [0.125, 0.0, 0.0, 0.0]])
    seen = counted(monkeypatch)
    (out,), (rad,) = enclose(model, [X], [np.zeros(X.shape)])
    assert seen == {"runs": 1, "stages": 2}
    want = reference(blocks, X)
    assert [[Fraction(v) for v in row] for row in out] == want and not rad.any()
    assert np.array_equal(out, forward(model, [X])[0])
    assert out[0, 1] == 0.375 and out[0, 3] == 1.0 and out[0, 2] == 0.0


def test_a_row_two_layers_move_keeps_the_float_pass_of_the_layers(monkeypatch):
    """1 + 10^16 − 10^16, one term a layer, both reading x_1 = 1: the row goes through both
    layers, one stage each, so its float64 value is theirs, 0 (one layer holding both units
    would sum the two moves first: 1), with the exact 1 inside its box."""
    up = FF(1.0, np.array([[0.0, 1.0]]), np.array([0.0]), np.array([[1e16], [0.0]]))
    down = FF(1.0, np.array([[0.0, 1.0]]), np.array([0.0]), np.array([[-1e16], [0.0]]))
    model = Transformer(d=2, attention="hardmax", blocks=[Block(up, None), Block(down, None)],
                        exact=False)
    assert Job.of(model, Arithmetic("float"), None).staged.keys() == {0}
    X = np.array([[1.0, 1.0]])
    seen = counted(monkeypatch)
    (out,), (rad,) = enclose(model, [X], [np.zeros(X.shape)])
    assert seen == {"runs": 1, "stages": 2}
    assert out[0, 0] == 0.0 == forward(model, [X])[0][0, 0] and rad[0, 0] >= 1.0
    holds(model, [X], reference(model.blocks, X))


def test_held_off_units_are_no_part_of_the_row():
    """ff_dense_into with ``off``: each row gets its own layer's units alone. Two layers'
    units side by side, every unit on at every row: the exact value of each row's own layer
    lies in its box, and the value of all four units (what the row would get were the other
    layer's units not held off) does not."""
    rng = np.random.default_rng(7)
    U, b = np.abs(rng.standard_normal((4, 3))), np.array([0.0, -0.25, 0.0, -0.5])
    W = rng.standard_normal((3, 4))
    X = np.abs(rng.standard_normal((6, 3))) + 1.0
    assert (X @ U.T + b > 0).all()  # every unit on at every row
    layer = np.array([0, 0, 1, 1])
    own = np.array([0, 1, 0, 1, 1, 0])
    out, rad = X.copy(), np.zeros(X.shape)
    enclosure.ff_dense_into(out, rad, 1.0, U, b, W, off=layer[None, :] != own[:, None])
    both = reference([Block(FF(1.0, U, b, W), None)], X)
    for i, k in enumerate(own):
        units = layer == k
        alone = reference([Block(FF(1.0, U[units], b[units], W[:, units]), None)], X[i:i + 1])
        box = list(zip(out[i], rad[i], strict=True))
        assert all(abs(Fraction(o) - v) <= Fraction(e)
                   for (o, e), v in zip(box, alone[0], strict=True))
        assert not all(abs(Fraction(o) - v) <= Fraction(e)
                       for (o, e), v in zip(box, both[i], strict=True))


def test_a_held_off_weight_does_not_deny_the_grid_certificate(monkeypatch):
    """A layer with a generic weight (0.1) on a coordinate, then a snap-like write of 0.75
    into it, the pair that moves it on and clears it, and a unit that reads the cleared
    coordinate at bias 0 and would spread any radius left there 10⁶-fold. Layers in order
    keep every radius 0 (every sum is on a common quantum, docs/numerics.md#grid); so must
    the staged run, whose row holds the generic weight's unit off."""
    rest = np.array([[-1.0, 0.0, 1.0]])
    layers = [([[0.0, 0.0, 1.0]], [-1.0], [[0.0], [0.1], [0.0]]),
              ([[1.0, 0.0, 0.0]], [-0.5], [[0.0], [0.75], [0.0]]),
              ([[0.0, 1.0, 0.0], [0.0, 1.0, 0.0]], [0.0, -1.0], [[0.0, 0.0], [-1.0, 1.0],
                                                                  [1.0, -1.0]]),
              ([[0.0, 1.0, 0.0]], [0.0], [[1e6], [0.0], [0.0]])]
    blocks = [Block(FF(1.0, np.vstack([U, rest]), np.array(b + [-4.0]),
                       np.hstack([W, [[0.0], [0.0], [1.0]]])), None) for U, b, W in layers]
    model = Transformer(d=3, attention="hardmax", blocks=blocks, exact=False)
    X = np.array([[1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    seen = counted(monkeypatch)
    (out,), (rad,) = enclose(model, [X], [np.zeros(X.shape)])
    assert seen["runs"] == 1 and seen["stages"] >= 2
    assert out[0].tolist() == [1.0, 0.0, 0.375] and not rad.any()


def test_a_row_that_is_not_finite_goes_through_its_layers_one_by_one(monkeypatch):
    """An infinite radius on a coordinate that only the run's second layer reads: in the
    merged layer's products it would meet the first layer's zero weights (inf·0 = nan) and
    make that layer's units undecided. The row goes through the layers one by one, as in
    order: the first layer keeps the radius of the coordinate it writes."""
    L0 = FF(1.0, np.array([[2.0, 0, 0, 0], [-1.0, 0, 0, 0.5]]), np.array([-1.0, -4.0]),
            np.array([[0.0, 0], [0.25, 0], [0, 0], [0, 1.0]]))
    L1 = FF(1.0, np.array([[0, 0, 1.0, 0], [0, 0, -1.0, 0.5]]), np.array([-1.0, -4.0]),
            np.array([[0.0, 0], [0, 0], [0, 0], [1.0, 1.0]]))
    model = Transformer(d=4, attention="hardmax", blocks=[Block(L0, None), Block(L1, None)],
                        exact=False)
    X = np.array([[0.0, 3.0, 5.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    R = np.array([[0.1, 0.001, np.inf, 0.0], [0.0, 0.0, 0.0, 0.0]])
    seen = counted(monkeypatch)
    (out,), (rad,) = enclose(model, [X], [R])
    assert seen["runs"] == 1
    assert out[0, 1] == 3.0 and rad[0, 1] == 0.001
