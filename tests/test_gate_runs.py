"""Runs of gated layers (evaluate/gate_runs.py): a tracking pass encloses a run of move
layers as one wide FF on the rows its merged gate names. Checked against the Fraction
evaluator of test_gates.py (every unit of every layer on every row, in order): the boxes hold
it on stacks of layers that may hand a row from one layer's key to the next (where the run
must go layer by layer), and on keyed models, where the runs are taken."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_gates import SETTINGS, reference

import exactformer as ef
from exactformer.data import builtin
from exactformer.evaluate import enclose, forward, gate_runs
from exactformer.evaluate.gates import gate_layers
from exactformer.model import FF, Block, Transformer


def holds(model: Transformer, xs: list[np.ndarray], want: list) -> None:
    """Every exact coordinate ``want`` lies in the enclosure's box of it."""
    out, rad = enclose(model, xs, [np.zeros(x.shape) for x in xs])
    out, rad = np.concatenate(out), np.concatenate(rad)
    for i, row in enumerate(want):
        for j, v in enumerate(row):
            assert abs(Fraction(out[i, j]) - v) <= Fraction(rad[i, j]), (i, j)


def counted(monkeypatch) -> dict:
    """Counts, during a test, of the runs taken, of the rows their gates named and of the
    rows that went through a run's layers one by one."""
    seen = {"runs": 0, "rows": 0, "in order": 0}
    apply, in_order = gate_runs.GateRun.apply, gate_runs.GateRun._in_order

    def spy_apply(self, st_):
        seen["runs"] += 1
        rows = self.gate.rows(st_)
        seen["rows"] += len(st_.P) if rows is None else len(rows)
        return apply(self, st_)

    def spy_order(self, X, r):
        seen["in order"] += len(X)
        return in_order(self, X, r)

    monkeypatch.setattr(gate_runs.GateRun, "apply", spy_apply)
    monkeypatch.setattr(gate_runs.GateRun, "_in_order", spy_order)
    return seen


KEYS = [np.array(t) for t in ([1, 1, 0], [1, 0, 1], [0, 1, 1], [1, -1, 0], [0, 1, -1],
                              [-1, 0, 1])]  # weight 2 on three key coordinates


@st.composite
def move_stack(draw):
    """2 to 8 move layers on a key of three coordinates (weight 2) and a rest column `one`:
    each unit fires at its own key and writes the data column, and may move its row to
    another key (which a later layer may read: the run must then go layer by layer)."""
    D = 5  # key 0..2, one 3, data 4
    blocks = []
    for _ in range(draw(st.integers(2, 8))):
        h = draw(st.integers(1, 4))
        U, b, W = np.zeros((h, D)), np.zeros(h), np.zeros((D, h))
        for k in range(h):
            sigma = KEYS[draw(st.integers(0, len(KEYS) - 1))]
            U[k, :3], U[k, 3] = 4 * sigma, draw(st.sampled_from([-1.0, 0.0, 1.0]))
            b[k] = -4 * 2 + 2 - U[k, 3]  # 2 at its key (with one = 1), ≤ −2 at the others
            W[4, k] = draw(st.integers(-4, 4)) / 4
            if draw(st.booleans()):
                W[:3, k] = (KEYS[draw(st.integers(0, len(KEYS) - 1))] - sigma) / 2
        blocks.append(Block(FF(1.0, U, b, W), None))
    n = draw(st.integers(1, 10))
    X = np.zeros((n, D))
    X[:, :3] = [KEYS[draw(st.integers(0, len(KEYS) - 1))] for _ in range(n)]
    X[:, 3] = 1.0
    X[:, 4] = [draw(st.integers(-8, 8)) / 8 for _ in range(n)]
    return blocks, X


@settings(max_examples=150, **SETTINGS)
@given(move_stack())
def test_a_run_of_moves_is_enclosed_as_its_layers_in_order(case):
    """Whether a run goes at once or layer by layer, its boxes hold the layers' exact
    values in order; the exact pass equals them too."""
    blocks, X = case
    model = Transformer(d=X.shape[1], attention="hardmax", blocks=blocks, exact=False)
    assert all(g is not None for g in gate_layers([b.ff for b in blocks]))
    want = reference(blocks, X)
    exact = forward(model, [X], arithmetic="exact", workers=1)[0]
    assert [[Fraction(v) for v in row] for row in exact.tolist()] == want
    holds(model, [X], want)


def test_a_row_handed_to_a_later_layers_key_sends_the_run_layer_by_layer(monkeypatch):
    """Layer 1 moves its key's row to layer 2's key, which layer 2 then moves: the wide FF
    would take only the first move, so its boxes would miss the second; the run must see
    that layer 2 may fire on layer 1's output, and take that row layer by layer."""
    seen = counted(monkeypatch)
    D, s1, s2 = 5, KEYS[0], KEYS[3]
    U1, U2 = np.zeros((1, D)), np.zeros((1, D))
    U1[0, :3], U2[0, :3] = 4 * s1, 4 * s2
    U1[0, 3] = U2[0, 3] = 1.0  # `one` as the rest: a gated layer, not a key layer
    W1, W2 = np.zeros((D, 1)), np.zeros((D, 1))
    W1[:3, 0], W1[4, 0] = (s2 - s1) / 2, 0.5  # at its key z = 2: the row becomes s2
    W2[4, 0] = 1.0
    blocks = [Block(FF(1.0, U, np.array([-7.0]), W), None) for U, W in ((U1, W1), (U2, W2))]
    X = np.array([[*s1, 1.0, 0.0], [*KEYS[1], 1.0, 0.25]])
    model = Transformer(d=D, attention="hardmax", blocks=blocks, exact=False)
    want = reference(blocks, X)
    assert want[0][4] == 3  # both moves
    holds(model, [X], want)
    assert seen == {"runs": 1, "rows": 1, "in order": 1}


def test_a_row_two_layers_would_take_goes_layer_by_layer(monkeypatch):
    """Layers 1 and 2 both fire at key s1; layer 1 moves the row to a key neither reads, so
    layer 2 then leaves it: the wide FF would take both moves (data 3, not 1), so the run
    must see two layers' units on at the row's box and take it layer by layer."""
    seen = counted(monkeypatch)
    D, s1, away = 5, KEYS[0], KEYS[2]
    U = np.zeros((1, D))
    U[0, :3], U[0, 3] = 4 * s1, 1.0
    W1, W2 = np.zeros((D, 1)), np.zeros((D, 1))
    W1[:3, 0], W1[4, 0] = (away - s1) / 2, 0.5  # at its key z = 2: data 1, key away
    W2[4, 0] = 1.0
    blocks = [Block(FF(1.0, U, np.array([-7.0]), W), None) for W in (W1, W2)]
    X = np.array([[*s1, 1.0, 0.0]])
    model = Transformer(d=D, attention="hardmax", blocks=blocks, exact=False)
    want = reference(blocks, X)
    assert want[0][4] == 1 and want[0][:3] == [Fraction(int(v)) for v in away]
    holds(model, [X], want)
    assert seen == {"runs": 1, "rows": 1, "in order": 1}


@pytest.mark.parametrize("seed", [3, 4])
def test_a_keyed_models_moves_go_as_runs_and_stay_exact(monkeypatch, seed):
    """A float64 keyed hardmax model of shared-token data: its moves are taken as runs,
    most rows at once; the enclosure's boxes hold the exact pass, and verify says OK."""
    seen = counted(monkeypatch)
    data = builtin.shared_pool(30, 4, 12, 6, 3, seed=seed)
    model = ef.compile(data, exact=False)
    xs = data.floats()[0]
    want = forward(model, xs, arithmetic="exact", workers=1)
    out, rad = enclose(model, xs, [np.zeros(x.shape) for x in xs])
    for o, r, w in zip(out, rad, want, strict=True):
        for v, e, x in zip(o.flat, r.flat, w.flat, strict=True):
            assert abs(Fraction(v) - Fraction(x)) <= Fraction(e)
    assert seen["runs"] > 0 and seen["in order"] < seen["rows"]  # most rows at once
    assert ef.verify(model, data).verdict() == "OK"
