"""Staged runs in the runtime proofs (verification/runtime_staged.py,
docs/numerics.md#staged-runs): runs of residual layers enclosed a stage at a time, each row
through its own layer with the other layers' units held off, hold every float32 and TF32
evaluation of the layers in order, in the test's own summation orders (test_runtime_proof's
Pass), on stacks whose layers read what earlier ones write."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_runtime_proof import Pass
from test_staged_runs import random_stack

from exactformer.model import FF, Block, Transformer
from exactformer.verification import runtime_proof, runtime_staged
from exactformer.verification.formats import get_format


def staged_counts(monkeypatch) -> dict:
    """Counts of the staged runs taken and of the stages enclosed, every run staged whatever
    share of the rows it may change."""
    seen = {"runs": 0, "stages": 0}
    apply, rows = runtime_staged.apply_staged, runtime_proof.ff_rows

    def spy_apply(*args):
        done = apply(*args)
        seen["runs"] += done is not None
        return done

    def spy_rows(*args, off=None):
        seen["stages"] += off is not None
        return rows(*args, off=off)

    monkeypatch.setattr(runtime_staged, "LIVE_SHARE", 1.0)
    monkeypatch.setattr(runtime_proof, "apply_staged", spy_apply)
    monkeypatch.setattr(runtime_proof, "ff_rows", spy_rows)
    return seen


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1), generic=st.booleans(),
       runtime=st.sampled_from(["float32", "tf32"]))
def test_a_staged_run_holds_every_pass_of_its_layers(seed, generic, runtime):
    """Random runs (test_staged_runs.random_stack: layers reading what earlier ones write,
    dyadic or generic weights and rows), every run staged."""
    blocks, X = random_stack(np.random.default_rng(seed), generic)
    model = Transformer(d=X.shape[1], attention="hardmax", blocks=blocks, exact=False)
    fmt = get_format(runtime)
    with pytest.MonkeyPatch.context() as mp:
        seen = staged_counts(mp)
        (mid, rad), = runtime_proof.enclose_runtime(model, [X], fmt)
    layers, _ = runtime_proof.prepare(model, fmt)
    assert seen["runs"] == len(runtime_staged.staged_runs(layers, fmt, set()))
    passes = [Pass("seq"), Pass("rev"), Pass("perm", seed=seed % 97), Pass(fma=True),
              Pass("pairwise"), Pass("columns", seed=1)]
    for p in passes:
        p.tf32 = runtime == "tf32"
        out = p.run(model, X)
        assert (np.abs(out - mid) <= rad).all(), (p.order, p.fma)


def test_a_snap_and_its_pair_are_proved_in_two_stages(monkeypatch):
    """A snap (relu(2a − 1/2) into its own coordinate, a reading a code), a layer later the
    pair relu(s) − relu(s − 1) that reads it, writes a move and `moved` and clears s, then a
    second snap of the same code that `moved` turns off (docs/keyed.md#softmax): the run
    takes two stages, and every coordinate is proved exact in float32, the moved row at its
    target."""
    snap = Block(FF(1.0, np.array([[2.0, 0.0, 0.0, -4.0]]), np.array([-0.5]),
                    np.array([[0.0], [0.0], [1.0], [0.0]])), None)
    pair = Block(FF(1.0, np.array([[0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 1.0, 0.0]]),
                    np.array([0.0, -1.0]),
                    np.array([[0.0, 0.0], [0.375, -0.375], [-1.0, 0.0], [1.0, -1.0]])), None)
    model = Transformer(d=4, attention="hardmax", blocks=[snap, pair, snap], exact=False)
    X = np.array([[1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0], [0.125, 0.0, 0.0, 0.0]])
    seen = staged_counts(monkeypatch)
    (mid, rad), = runtime_proof.enclose_runtime(model, [X], get_format("float32"))
    assert seen == {"runs": 1, "stages": 2}
    assert not rad.any()
    assert mid.tolist() == [[1.0, 0.375, 0.0, 1.0], [0.0] * 4, [0.125, 0.0, 0.0, 0.0]]


def test_a_run_that_overflows_hands_its_layers_back():
    """A move that takes a row past float32's range in the run's first layer: the layouts'
    zero attention before the next FF multiplies that row's inf by 0, nan in every row of
    the sequence. The staged run hands the layers back to the layer-by-layer pass, which
    leaves every row unknown."""
    U = np.array([[1.0, 0.0, 0.0]])
    blocks = [Block(FF(1.0, U, np.array([-0.5]), np.array([[-1.0], [0.0], [3e38]])), None),
              Block(FF(1.0, -U, np.array([-0.5]), np.array([[0.0], [0.0], [1.0]])), None)]
    model = Transformer(d=3, attention="hardmax", blocks=blocks, exact=False)
    fmt = get_format("float32")
    layers, _ = runtime_proof.prepare(model, fmt)
    assert list(runtime_staged.staged_runs(layers, fmt, set())) == [0]
    X = np.array([[1.0, 0.0, 2.5e38], [0.0, 1.0, 1.0], [0.0, 0.0, 1.0]])
    (mid, rad), = runtime_proof.enclose_runtime(model, [X], fmt)
    assert np.isinf(rad).all()
    (mid, rad), = runtime_proof.enclose_runtime(model, [X[1:]], fmt)  # without it: finite
    assert np.isfinite(rad).all() and mid[0, 2] == 1.0
