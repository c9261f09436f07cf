"""Softmax models of one sequence (docs/keyed.md#one-sequence): no attention layer, within the
paper's bound 2m + 3 at width 4 for every d up to 16, exact by the test's own rational pass,
and faithful in float32 by its own passes in several summation orders."""

from __future__ import annotations

import warnings
from fractions import Fraction

import numpy as np
from conftest import dense_pass, float_error, token_set
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_runtime_proof import PASSES, TOL, pass_error

import exactformer as ef
from exactformer.construct import keyed_one_sequence, keyed_softmax
from exactformer.verification import prove_runtime

SETTINGS = settings(max_examples=25, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


def _tokens(rng, kind: str, n: int, d: int) -> np.ndarray:
    """n distinct tokens: on a half-integer grid, Gaussian at a random scale, or on a line."""
    if kind == "grid":
        out: dict = {}
        while len(out) < n:
            t = tuple(rng.integers(-3, 4, d) / 2)
            out[t] = None
        return np.array(list(out))
    if kind == "gauss":
        return rng.standard_normal((n, d)) * 10.0 ** rng.uniform(-3, 3)
    return np.outer(rng.permutation(n) + 1.0, rng.standard_normal(d)) + rng.standard_normal(d)


def _exact_outputs(model, data) -> np.ndarray:
    """The test's own dense pass in Fractions on the one sequence."""
    x = data.fractions()[0][0]
    return dense_pass(model, x, object, arr=lambda a: np.vectorize(Fraction, otypes=[object])(
        np.asarray(a, dtype=object)))[-1]


@SETTINGS
@given(seed=st.integers(0, 2**31 - 1), d=st.integers(2, 16), m=st.integers(1, 6),
       kind=st.sampled_from(["grid", "gauss", "line"]), exact=st.booleans(), data=st.data())
def test_one_sequence_is_within_the_bound_exact_and_faithful(seed, d, m, kind, exact, data):
    """No option given: no attention layer, at most 2m + 3 blocks, every output token in the
    target set by the test's exact pass (rational builds) and within 1e-5 of the scale by its
    float32 pass; where the runtime proof says float32 is faithful, none of the test's own
    float32 passes misses."""
    rng = np.random.default_rng(seed)
    n = data.draw(st.integers(m, 4 * m + 2))
    ds = ef.Dataset.from_arrays([_tokens(rng, kind, n, d)], [rng.standard_normal((m, d))])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a narrow gap: said, not tested here
        model = ef.compile(ds, attention="softmax", seed=seed, exact=exact)
    assert model.n_blocks <= 2 * m + 3
    assert all(block.sa is None for block in model.blocks)
    assert model.record.keyed["moves"] == model.record.keyed["tags"] == m - 1
    if exact:
        _, ys = ds.padded(model.d).fractions()
        assert token_set(_exact_outputs(model, ds)) == token_set(ys[0])
    assert float_error(model, ds, np.float32) <= TOL * ds.coordinate_scale()
    if prove_runtime(model, ds, "float32").ok:
        for p in [q for q in PASSES if not q.tf32][:6]:
            assert pass_error(model, ds, p) <= TOL, (p.order, p.fma)


def test_the_left_out_tag_is_a_window_where_there_is_one():
    """Five collinear tokens, five targets: the ends are caps, the middle ones windows (six
    units each against three or four). The tag left out is a window, so every cap is kept;
    its token ends at the anchor, each tagged token at its own target, and the model's own
    coordinates at 0."""
    x = np.array([[k, 2.0 * k] for k in range(5)])
    y = np.array([[float(k), -1.0] for k in range(5)])
    ds = ef.Dataset.from_arrays([x], [y])
    inputs, targets = ds.fractions()
    prep = keyed_softmax.prepare(inputs, [5], True, 4, 1, 0, False, softmax=True, caps=True)
    caps = sum(tag.side != 0 for tag in prep.p.tags)
    assert 0 < caps < 5
    built = keyed_one_sequence.build(prep, targets, 4, True)
    assert built.keyed["tags"] == 4 and built.keyed["caps"] == caps
    model = ef.compile(ds, attention="softmax")
    assert model.n_blocks <= 2 * 5 + 3
    assert token_set(_exact_outputs(model, ds)) == token_set(ds.padded(model.d).fractions()[1][0])


def test_explain_lists_the_anchor_and_the_moves_not_the_data_reset():
    """``explain`` on a one-sequence model: its moves are the anchor, on every token, and one
    unit a kept tag, on that tag's token alone; the data reset units (balanced by a power of
    two, so not x_c − relu(x_c) literally) are resets, not moves."""
    rng = np.random.default_rng(4)
    x = _tokens(rng, "grid", 6, 9)
    ds = ef.Dataset.from_arrays([x], [rng.integers(-4, 5, (3, 9)).astype(float)])
    model = ef.compile(ds, attention="softmax")
    moves = ef.explain(model, ds, pair=0)["keyed"]["moves"]
    assert sorted(len(m["tokens"]) for m in moves) == [1] * model.record.keyed["tags"] + [6]
