"""The exact pass's rational backend (gmpy2 mpq inside, Fraction outside) and parallel passes.

The plain-Fraction reference pass and the random models come from test_evaluate.py.
"""

from __future__ import annotations

import importlib.util
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_evaluate import (
    F,
    attend,
    fracs,
    hat_ff,
    inputs_for,
    model_of,
    models,
    ref_forward,
    rows,
    vectors,
)

import exactformer as ef
import exactformer.evaluate as ev
from exactformer.data.builtin import shared_pool
from exactformer.data.causal import CausalDataset
from exactformer.evaluate import Arithmetic, PassStats, compaction, jobs, layers, windows
from exactformer.evaluate.arithmetic import stable_argsort
from exactformer.evaluate.jobs import chunk_bounds
from exactformer.evaluate.state import RowState
from exactformer.model import FF, Block
from exactformer.tools.decode import Decoder, generate

SETTINGS = settings(max_examples=25, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


def all_fractions(outs) -> bool:
    """Every value is a Fraction over Python ints (no backend number leaks out)."""
    return all(type(v) is Fraction and type(v.numerator) is int and type(v.denominator) is int
               for o in outs for v in o.flat)


@SETTINGS
@given(data=st.data())
def test_exact_pass_equals_fraction_reference(data):
    model = data.draw(models())
    X = data.draw(inputs_for(model.d))
    got, snaps = ef.forward(model, X, "exact", snapshots=set(range(model.n_blocks + 1)),
                            workers=1)
    assert [rows(g) for g in got] == ref_forward(model, X)
    assert all_fractions(got)
    assert all(all_fractions(s) for s in snaps.values())


def test_values_below_float_resolution():
    # 1 ± 2^-80 have the float image of 1, and 2^900 squares beyond float range: compaction
    # and the sorted index must still separate, merge and order these points exactly
    tiny = Fraction(1, 2 ** 80)
    for big in (Fraction(2) ** 900, Fraction(3)):
        X = [F([[1, 0], [1 + tiny, 0], [1, 0], [big, 1], [1 - tiny, 0]]),
             F([[1 + tiny, 0], [1 + tiny, 0], [big, 2]])]
        model = model_of(2,
                         Block(hat_ff([1, 0], Fraction(1), Fraction(1, 2 ** 70), F([0, 5])),
                               attend((0, [0, 1], [0, 1]), V=(0, [1, 0], [0, 1]), rho=1)),
                         Block(hat_ff([1, 1], Fraction(2), Fraction(1), F([1, 0])), None))
        got = ef.forward(model, X, "exact", workers=1)
        assert [rows(g) for g in got] == ref_forward(model, X)
        assert all_fractions(got)


@SETTINGS
@given(data=st.data())
def test_rational_hat_layers_cut_into_windows(data):
    # several hats on one direction f (every unit reads f itself, as in constructed models)
    # take the linear cut of _hat_groups: each group must pass the general window test, and
    # the pass must equal the plain per-token reference
    d = data.draw(st.integers(2, 3))
    f = data.draw(vectors(d, nonzero=True))
    ff = None
    for _ in range(data.draw(st.integers(1, 4))):
        hat = hat_ff(f, data.draw(fracs()), data.draw(fracs(Fraction(1, 8), 2)),
                     data.draw(vectors(d, nonzero=True)), plateau=data.draw(st.booleans()))
        ff = hat if ff is None else FF(ff.eta, np.vstack([ff.U, hat.U]),
                                       np.concatenate([ff.b, hat.b]),
                                       np.hstack([ff.W, hat.W]))
    groups = windows._hat_groups(ff)
    if groups is not None:
        assert sorted(i for g in groups for i in g) == list(range(ff.width))
        assert all(ev.ridge_window(windows._sub_ff(ff, g)) is not None for g in groups)
    model = model_of(d, Block(ff, None))
    X = data.draw(inputs_for(d, max_len=8))
    assert [rows(g) for g in ef.forward(model, X, "exact", workers=1)] == ref_forward(model, X)


@SETTINGS
@given(data=st.data())
def test_attention_decided_below_float_resolution(data):
    # points 2^-70 apart share their float images: the float pre-filter of α ≠ 0 attention
    # keeps several candidates and exact scores decide; rows with a single candidate skip them
    d = data.draw(st.integers(2, 3))
    base = data.draw(st.lists(vectors(d, lo=-2, hi=2, den=4), min_size=1, max_size=3))
    tiny = Fraction(1, 2 ** 70)
    pool = [[v + tiny * data.draw(st.integers(-1, 1)) for v in b] for b in base for _ in (0, 1)]
    X = [F(data.draw(st.lists(st.sampled_from(pool), min_size=1, max_size=6)))
         for _ in range(data.draw(st.integers(1, 3)))]
    A = (data.draw(st.sampled_from([1, -1, Fraction(1, 3)])),
         data.draw(vectors(d, lo=-1, hi=1, den=2)), data.draw(vectors(d, lo=-1, hi=1, den=2)))
    sa = attend(A, V=(1, [0] * d, [0] * d), rho=data.draw(st.sampled_from([0, 1])))
    model = model_of(d, Block(None, sa))
    assert [rows(g) for g in ef.forward(model, X, "exact", workers=1)] == ref_forward(model, X)


def test_compaction_beyond_float_range():
    # 10^400 has no float image: the rows are then keyed by their exact values only
    big, tiny = Fraction(10) ** 400, Fraction(1, 2 ** 80)
    X = [F([[big, 1], [big, 1 + tiny], [big, 1], [1, 0]]), F([[big, 1]])]
    state = RowState(X, Arithmetic("exact"))
    state.compact()
    assert state.seq.tolist() == [0, 0, 0, 1] and state.cnt.tolist() == [2, 1, 1, 1]
    assert [rows(o) for o in state.outputs()] == [rows(x) for x in X]


@SETTINGS
@given(data=st.data())
def test_exact_dense_ff_equals_the_matrix_formula(data):
    # repeated rows of U are dotted once, zero entries and zero weights skipped, η·x left out
    # for η = 0: the values must be those of η·x + W·relu(U·x + b) computed in Fractions
    d, n = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 6))
    rows_u = data.draw(st.lists(vectors(d), min_size=1, max_size=3))
    U = F([data.draw(st.sampled_from(rows_u)) for _ in range(data.draw(st.integers(1, 5)))])
    w = U.shape[0]
    ff = FF(Fraction(data.draw(st.sampled_from([0, 1, Fraction(1, 2)]))), U,
            F(data.draw(vectors(w))), F([data.draw(vectors(w)) for _ in range(d)]))
    X = F([data.draw(vectors(d)) for _ in range(n)])
    zero = Fraction(0)
    want = X * ff.eta + np.maximum(X @ ff.U.T + ff.b, zero) @ ff.W.T
    ar = Arithmetic("exact")
    got = layers.exact_dense_ff(ar.array(X), ff.converted(ar.scalar, ar.array))
    assert rows(ar.public(got)) == rows(want)


@SETTINGS
@given(st.lists(st.tuples(st.integers(0, 2), st.lists(
    st.sampled_from([0, 1, Fraction(-1, 3), 1 + Fraction(1, 2 ** 80), 1 - Fraction(1, 2 ** 80),
                     Fraction(2) ** 1100, Fraction(2) ** 1100 + 1]), min_size=2, max_size=2)),
    min_size=1, max_size=30))
def test_compaction_groups_are_exact_points(rows_):
    # grouping by float images must give exactly the groups of equal (sequence, point): rows
    # 2^-80 apart share a float image, 2^1100 has none; groups are numbered by first sight
    # in sequence order, which keeps the rows of a sequence contiguous
    seq = np.array([q for q, _ in rows_])
    P = Arithmetic("exact").array(F([p for _, p in rows_]))
    first, inv = compaction.object_row_groups(seq, P)
    order = sorted(range(len(rows_)), key=lambda r: seq[r])
    keys = [(int(seq[r]), *rows_[r][1]) for r in order]
    want = {k: i for i, k in enumerate(dict.fromkeys(keys))}
    assert [want[k] for k in keys] == inv[order].tolist()
    assert [keys[order.index(r)] for r in first.tolist()] == list(dict.fromkeys(keys))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.fractions(-2, 2, max_denominator=4) |
                st.sampled_from([Fraction(1, 3) + Fraction(1, 2 ** 70), Fraction(10) ** 320]),
                max_size=30))
def teststable_argsort_matches_numpy(values):
    t = Arithmetic("exact").array(np.array(values, dtype=object))
    want = np.argsort(np.array(values, dtype=object), kind="stable")
    np.testing.assert_array_equal(stable_argsort(t), want)


def test_backend_conversions():
    ar = Arithmetic("exact")
    a = ar.array(np.array([[1, -2], [3, 4]]))
    b = ar.array(np.array([0.1, -2.5]))
    assert ar.public(a).tolist() == [[1, -2], [3, 4]]
    assert ar.public(b).tolist() == [Fraction(0.1), Fraction(-5, 2)]
    assert all_fractions([ar.public(a), ar.public(b)])
    with pytest.raises(ValueError, match="not finite"):
        ar.array(np.array([np.inf]))


@settings(max_examples=200, deadline=None)
@given(v=st.floats(allow_nan=False, allow_infinity=False)
       | st.sampled_from([5e-324, -5e-324, -0.0, 2.0 ** -1074, 1.7976931348623157e308]))
def test_exact_scalars_of_floats_are_their_binary_values(v):
    """A finite float (Python or NumPy) enters an exact pass as its exact binary value, one at
    a time or in an array; a non-finite one is refused."""
    ar = Arithmetic("exact")
    for x in (v, np.float64(v)):
        assert ar.public(np.array([ar.scalar(x)], dtype=object))[0] == Fraction(v)
    assert ar.public(ar.array(np.array([v])))[0] == Fraction(v)
    with pytest.raises(ValueError, match="not finite"):
        ar.scalar(float("nan"))


# ------------------------------------------------------------------------------ parallel
def test_pass_stats_merge():
    a = PassStats(hardmax_margin=0.5, hardmax_ties=2, hat_clearance=None)
    a.merge(PassStats(hardmax_margin=0.25, hardmax_ties=3, hat_clearance=0.1))
    a.merge(PassStats())
    assert a == PassStats(hardmax_margin=0.25, hardmax_ties=5, hat_clearance=0.1)


def testchunk_bounds(monkeypatch):
    xs = [np.zeros((n, 2)) for n in (5, 1, 1, 9, 2, 2, 3)]
    exact = Arithmetic("exact")
    monkeypatch.setattr(jobs, "PARALLEL_MIN_WORK", 1)
    for workers in (2, 3, 7, 50):
        b = chunk_bounds(xs, 10, exact, workers)
        assert b[0][0] == 0 and b[-1][1] == len(xs) and 1 < len(b) <= workers
        assert all(s < e and e == s2 for (s, e), (s2, _) in zip(b, b[1:] + [(len(xs), 0)],
                                                               strict=True))
    assert chunk_bounds(xs, 10, exact, 1) == [(0, 7)]
    assert chunk_bounds(xs, 10, Arithmetic("float"), 4) == [(0, 7)]  # float stays serial
    monkeypatch.setattr(jobs, "PARALLEL_MIN_WORK", 10 ** 9)
    assert chunk_bounds(xs, 10, exact, 4) == [(0, 7)]  # too little work for a pool
    with pytest.raises(ValueError, match="workers must be at least 1"):
        chunk_bounds(xs, 10, exact, 0)


def run(model, X, arithmetic, workers):
    stats = PassStats()
    outs, snaps = ef.forward(model, X, arithmetic, dps=30, stats=stats, workers=workers,
                             snapshots={0, 1, model.n_blocks})
    return [o.tolist() for o in outs], {k: [o.tolist() for o in v] for k, v in snaps.items()}, \
        stats


@settings(max_examples=8, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                 HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_parallel_equals_serial(data, monkeypatch):
    monkeypatch.setattr(jobs, "PARALLEL_MIN_WORK", 0)
    model = data.draw(models(max_blocks=4))
    X = [x for _ in range(3) for x in data.draw(inputs_for(model.d))]  # 3 to 9 sequences
    for arithmetic in ("exact", "mp"):
        serial = run(model, X, arithmetic, 1)
        parallel = run(model, X, arithmetic, 3)
        assert parallel == serial
        if arithmetic == "exact":
            assert all_fractions(np.array(o, dtype=object) for o in parallel[0])


def test_verify_with_workers(monkeypatch):
    monkeypatch.setattr(jobs, "PARALLEL_MIN_WORK", 0)
    data = shared_pool(N=8, d=2, pool=5, n_max=4, m_max=2, seed=3)
    model = ef.compile(data)
    serial = ef.verify(model, data, workers=1).to_dict()
    parallel = ef.verify(model, data, workers=2).to_dict()
    assert parallel == serial and serial["ok"] and serial["arithmetic"] == "exact"


def test_bench_exact_quick_table(tmp_path):
    spec = importlib.util.spec_from_file_location(
        "bench_exact", Path(__file__).resolve().parents[1] / "benchmarks" / "bench_exact.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "exact.md"
    assert bench.main(["--quick", "--workers", "2", "--out", str(out)]) == 0
    lines = [line.split("|")[1:-1] for line in out.read_text().splitlines()
             if line.startswith(("| image-like", "| vocabulary"))]
    assert len(lines) == 2
    for cells in lines:
        r = dict(zip(bench.COLUMNS, (c.strip() for c in cells), strict=True))
        assert r["verdict"] == "EXACT"
        assert float(r["ratio (1)"]) > 0 and float(r["ratio (k)"]) > 0


def test_causal_passes_and_generation_return_fractions():
    # the decoder and the causal pass run on mpq too; what they hand out must be Fractions
    data = CausalDataset.from_arrays([[[1, 0, 2], [0, 1, -1], [2, 2, 0]]],
                                     [[[0, 1, -1], [2, 2, 0], None]])
    model = ef.compile(data)
    outs = ef.forward(model, data.inputs, "exact")
    assert all_fractions(outs)
    assert [rows(o)[:2] for o in outs] == [rows(data.padded(model.d).inputs[0][1:])]
    dec = Decoder(model)
    assert all_fractions([dec.push(x) for x in data.inputs[0]])
    tokens = generate(model, data.inputs[0][:1], 2)
    assert all_fractions([tokens]) and rows(tokens) == rows(data.padded(model.d).inputs[0][1:])
