"""Caps (docs/keyed.md#tagging): a token extreme on a shared direction is tagged by one unit
relu(s·(±f·x − c)) and the clip, where a window needs a window, a flip and the clip. A
softmax model that the windows take past the paper's bound (two sequences of few targets in
many coordinates) is tagged with caps where it can: it never has more blocks than with
windows alone, and it is still exact and faithful in every float32 order of the test's own
passes."""

from __future__ import annotations

import warnings

import numpy as np
from conftest import float_error
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_default import paper_bound
from test_runtime_proof import PASSES, TOL, pass_error

import exactformer as ef
from exactformer.construct import keyed_softmax
from exactformer.construct.keyed_softmax import snap_group
from exactformer.construct.tagging import Survey, float32_gap
from exactformer.verification import prove_runtime

SETTINGS = settings(max_examples=15, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])
F32 = np.float32


def _unit_in_float32(u: np.ndarray, b, X: np.ndarray, rng) -> np.ndarray:
    """u·x + b for every row of X in float32: each product rounded, the d + 1 terms summed in
    an order of their own per row."""
    terms = np.concatenate([X.astype(F32) * np.asarray(u, dtype=F32),
                            np.full((len(X), 1), b, dtype=F32)], axis=1)
    out = np.empty(len(X), dtype=F32)
    for i, row in enumerate(terms):
        acc = F32(0)
        for v in row[rng.permutation(len(row))]:
            acc = F32(acc + v)
        out[i] = acc
    return out


@SETTINGS
@given(seed=st.integers(0, 2**31 - 1), d=st.integers(2, 8), n=st.integers(2, 40),
       offset=st.sampled_from([0.0, 1.0, 300.0]))
def test_a_cap_is_on_at_its_token_alone_in_float32(seed, d, n, offset):
    """Every cap the survey allows (gap at least the float32 margin): its argument in float32,
    summed in random orders, is in [¾, 2^21) at its token, where the clip writes exactly 1,
    and ≤ 0 at every other token, so the unit adds an exact 0 there. Data off the origin
    (``offset``) make the inputs' own float32 rounding count."""
    rng = np.random.default_rng(seed)
    X = offset + rng.standard_normal((n, d))
    survey = Survey.of(X, seed)
    margin = float32_gap(d)
    capped = [t for t in range(n) if survey.cap_gaps[t] >= margin]
    assert capped  # the extremes of 32 directions among n ≥ 2 generic points
    for t in capped:
        tag = survey.cap(t, exact=False)
        u, b = tag.side * tag.s * tag.f, -tag.s * tag.c
        for _ in range(3):
            a = _unit_in_float32(u, b, X, rng)
            assert 0.75 <= a[t] < 2.0**21
            assert (np.delete(a, t) <= 0).all()


def _windows_only(ds: ef.Dataset, seed: int) -> int:
    """The block count of the build's variants with windows alone (its first try)."""
    inputs, targets = ds.fractions()
    m = ds.target_lengths
    prep = keyed_softmax.prepare(inputs, m, True, 4, 1, seed, False, softmax=True,
                                 scratch=snap_group(4))
    bound = 2 * sum(m) + 3 * ds.N
    built = keyed_softmax._fitted(prep, targets, bound, max(map(len, inputs)), 4, True)
    return len(built.blocks)


@SETTINGS
@given(seed=st.integers(0, 2**31 - 1), d=st.integers(10, 16), data=st.data())
def test_two_sequences_in_many_coordinates_with_caps(seed, d, data):
    """Two softmax sequences of one or two targets each in 10 to 16 coordinates, no option
    given: never more blocks than windows alone give, within 2Σm + 3N, PROVED EXACT, within
    1e-5 of the scale in the test's own float32 pass, and where proved faithful in float32 no
    pass of the test's own misses."""
    rng = np.random.default_rng(seed)
    m = [data.draw(st.integers(1, 2)) for _ in range(2)]
    xs = [rng.integers(-9, 10, (k + data.draw(st.integers(0, 3)), d)) / 4 for k in m]
    ds = ef.Dataset.from_arrays(xs, [rng.integers(-9, 10, (k, d)).astype(float) for k in m])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        model = ef.compile(ds, attention="softmax", seed=seed)
        assert model.n_blocks <= min(_windows_only(ds, seed), paper_bound(ds, "softmax"))
    assert ef.verify(model, ds).verdict() == "PROVED EXACT"
    assert float_error(model, ds, np.float32) <= 1e-5 * ds.coordinate_scale()
    if prove_runtime(model, ds, "float32").ok:
        for p in [q for q in PASSES if not q.tf32][:6]:
            assert pass_error(model, ds, p) <= TOL, (p.order, p.fma, p.lens, p.value)


def test_caps_are_taken_only_past_the_bound():
    """Two sequences of three points each in the plane fit the bound with windows: no cap. In
    20 coordinates, with one target each, they do not (one unit a data coordinate, and the
    resets, leave no room in 2Σm + 3N = 10 blocks): their tags are caps, and the model is
    within the bound and exact. One sequence of three points needs neither caps nor
    attention (docs/keyed.md#one-sequence)."""
    rng = np.random.default_rng(1)
    x = [rng.integers(-9, 10, (3, 2)).astype(float) / 4 for _ in range(2)]
    y = [rng.integers(-9, 10, (3, 2)).astype(float) for _ in range(2)]
    two = ef.compile(ef.Dataset.from_arrays(x, y), attention="softmax")
    assert two.record.keyed["caps"] == 0 and two.n_blocks <= 2 * 6 + 3 * 2
    wide_data = ef.Dataset.from_arrays(
        [rng.integers(-9, 10, (3, 20)).astype(float) / 4 for _ in range(2)],
        [rng.integers(-9, 10, (1, 20)).astype(float) for _ in range(2)])
    wide = ef.compile(wide_data, attention="softmax")
    assert wide.record.keyed["caps"] == 2 and wide.n_blocks <= 2 * 2 + 3 * 2
    assert _windows_only(wide_data, 0) > wide.n_blocks
    assert ef.verify(wide, wide_data).verdict() == "PROVED EXACT"
    one_data = ef.Dataset.from_arrays(x[:1], y[:1])
    one = ef.compile(one_data, attention="softmax")
    assert one.record.keyed["caps"] == 0 and one.n_blocks <= 9
    assert all(block.sa is None for block in one.blocks)
    assert ef.verify(one, one_data).verdict() == "PROVED EXACT"
    hard = ef.compile(one_data)  # hardmax fits its bound with windows
    assert hard.record.keyed["caps"] == 0
