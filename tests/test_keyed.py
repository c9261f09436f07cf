"""Keyed set models (docs/keyed.md), hardmax and softmax: exact in rational (hardmax) or real
(softmax, proved in ball arithmetic) arithmetic, and exact to float32 rounding in a plain dense
pass written here, independent of the package's evaluators.

The dense pass below is what any hand-written transformer does: every FF as
η·x + W·relu(U·x + b), every attention as ρ·x + V·(average of the rows of highest score
⟨A x_i, x_l⟩, or their softmax average), in one number type throughout.
"""

from __future__ import annotations

import json
import warnings
from fractions import Fraction
from itertools import combinations
from unittest import mock

import mpmath
import numpy as np
import pytest
from conftest import conflict_data, datasets, dense_pass, float_error, make_dataset, token_set
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import exactformer as ef
from exactformer.cli import main as cli_main
from exactformer.construct import keyed, keyed_moves, keyed_separation, keyed_softmax
from exactformer.data import builtin
from exactformer.evaluate import enclosure
from exactformer.model import Transformer
from exactformer.modelio import load_model, save_model
from exactformer.record import RecordError, record_from_meta

SETTINGS = settings(max_examples=30, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
seeds = st.integers(0, 2**31 - 1)
widths = st.sampled_from([4, 8, 16, 64])
heads = st.sampled_from([1, 2, 16])  # separation rounds that may share an attention layer


def mp_error(model, data, digits: int = 60, pairs: int = 8) -> float:
    """The same dense pass in mpmath at ``digits`` digits, from the exact parameters and data:
    the largest Hausdorff distance to the exact targets over the first ``pairs`` pairs (a
    measurement, independent of the package's ball arithmetic; object arrays are slow)."""
    def mp(v):
        f = Fraction(v)
        return mpmath.mpf(f.numerator) / f.denominator

    def arr(a):
        return np.vectorize(mp, otypes=[object])(np.asarray(a, dtype=object))

    xs, ys = data.fractions()
    worst = mpmath.mpf(0)
    with mpmath.workdps(digits):
        for x, y in zip(xs[:pairs], ys[:pairs], strict=True):
            o = dense_pass(model, np.asarray(x, dtype=object), object, arr,
                           np.vectorize(mpmath.exp))[-1]
            Y = np.pad(arr(y), ((0, 0), (0, model.d - data.d)), constant_values=mpmath.mpf(0))
            D = [[mpmath.sqrt(sum((a - b) ** 2 for a, b in zip(r, t, strict=True))) for t in Y]
                 for r in o]
            worst = max([worst] + [min(row) for row in D] +
                        [min(D[i][k] for i in range(len(o))) for k in range(len(Y))])
        return float(worst)


def check_keyed(model, data) -> None:
    """Exact in rationals (proved by verify), and within 1e-5 of the data's scale in a
    float32 dense pass."""
    assert model.record.keyed is not None and model.d > data.d
    xs, ys = data.fractions()
    for j, (o, y) in enumerate(zip(ef.forward(model, xs, arithmetic="exact"), ys, strict=True)):
        assert o.shape == (len(xs[j]), model.d)
        assert token_set(o) == token_set(np.pad(y, ((0, 0), (0, model.d - data.d)),
                                                constant_values=Fraction(0))), f"pair {j}"
    report = ef.verify(model, data)
    assert report.ok and report.proved and report.verdict() == "PROVED EXACT"
    assert report.blocks == report.blocks_design == model.n_blocks
    scale = data.coordinate_scale() or 1.0
    assert float_error(model.to_float(), data, np.float32) <= 1e-5 * scale


def check_keyed_softmax(model, data) -> None:
    """Proved exact in real arithmetic by verify's ball pass; within 10⁻³⁰ of the scale in
    the test's own 60-digit pass, 10⁻¹² in float64 and 10⁻⁵ in float32."""
    assert model.attention == "softmax" and model.record.keyed is not None
    report = ef.verify(model, data)
    assert report.ok and report.proved and report.verdict() == "PROVED EXACT", report.proof
    assert report.blocks == report.blocks_design == model.n_blocks
    scale = data.coordinate_scale() or 1.0
    assert mp_error(model, data) <= 1e-30 * scale
    floats = model.to_float()
    assert float_error(floats, data, np.float64) <= 1e-12 * scale
    assert float_error(floats, data, np.float32) <= 1e-5 * scale


# ------------------------------------------------------------------------------ properties
@SETTINGS
@given(ds=datasets(), seed=seeds, width=widths, h=heads)
def test_random_shared_pools(ds, seed, width, h):
    check_keyed(ef.compile(ds, seed=seed, width=width, heads=min(h, width), keys=True), ds)


@SETTINGS
@given(ds=datasets(), seed=seeds, width=widths, h=st.sampled_from([2, 3, 16]))
def test_heads_share_separation_layers(ds, seed, width, h):
    """With heads, consecutive rounds share a separation layer, a head and a height coordinate
    each: the same rounds, tags and moves, and one block fewer per round that joined a layer.
    Bent signatures take two heads a round, and only where they save blocks; neither they nor
    hull normals take a move weight past what float32 reads faithfully unless the one-head
    model's already is."""
    def build(**kw):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model = ef.compile(ds, seed=seed, width=width, keys=True, **kw)
        return model, any("move's weight" in str(c.message) for c in caught)

    (one, one_wide), (many, many_wide) = build(), build(heads=min(h, width))
    assert one_wide or not many_wide
    bent = many.record.keyed["bent"]
    sep = many.record.phase("separation")
    layers = [len(many.blocks[i].sa.heads) // (1 + bent) for i in range(sep.start, sep.end)]
    assert sum(layers) == many.record.R == one.record.R
    assert max(layers, default=1) == many.record.keyed["heights"] <= min(h, width) // (1 + bent)
    if bent:
        assert many.n_blocks < one.n_blocks
        return
    assert many.n_blocks == one.n_blocks - (one.record.R - len(layers))
    slots = keyed.slots(width)  # the heights reuse the slots
    assert many.d == one.d + max(0, many.record.keyed["heights"] - slots)
    for name in ("tagging", "collapse", "interpolation"):
        a, b = one.record.phase(name), many.record.phase(name)
        assert a.end - a.start == b.end - b.start
    for i in range(sep.start, sep.end):
        assert len(many.blocks[i].ff.b) <= width


@SETTINGS
@given(ds=datasets(), seed=seeds, width=widths, h=heads)
def test_every_slot_is_zero_when_the_tagging_ends(ds, seed, width, h):
    """The separation's heights live in the tagging's slots, so every slot must be exactly 0
    on every token after the tagging layers (and every height 0 before them)."""
    model = ef.compile(ds, seed=seed, width=width, heads=min(h, width), keys=True)
    tagging = model.record.phase("tagging")
    head = Transformer(d=model.d, attention="hardmax", blocks=model.blocks[:tagging.end],
                       exact=True)
    per_round = 1 + model.record.keyed["bent"]  # a height, and a bend if bent
    work = slice(ds.d + 4, ds.d + 4 + max(keyed.slots(width),
                                          per_round * model.record.keyed["heights"]))
    for x in ef.forward(head, ds.fractions()[0], arithmetic="exact"):
        assert (np.asarray(x)[:, work] == 0).all()


@settings(SETTINGS, max_examples=12)  # two builds and a proof each: within the time limit
@given(N=st.integers(8, 16), d=st.integers(2, 5), seed=seeds, width=st.sampled_from([16, 64]),
       h=st.sampled_from([2, 5, 16]), attention=st.sampled_from(["hardmax", "softmax"]))
def test_bent_signatures_on_nested_data(N, d, seed, width, h, attention):
    """Nested sets (a shared core and one token of each sequence's own) need one tall round,
    whose plain signatures are collinear: its holders would move two per layer. Bent
    signatures put them in convex position, every tag's holders move in one batch, and the
    model is exact with fewer blocks than the one-head model: wherever one tag's chain, not
    the width, sets the move layers (a softmax move takes two units, so width 64 there)."""
    ds = builtin.nested(N, d, seed=seed % 1000)
    width = 64 if attention == "softmax" else width
    model = ef.compile(ds, attention=attention, seed=seed, width=width, heads=min(h, width),
                       keys=True)
    assert model.record.keyed["bent"]
    sep = model.record.phase("separation")
    assert all(len(model.blocks[i].sa.heads) % 2 == 0 for i in range(sep.start, sep.end))
    one = ef.compile(ds, attention=attention, seed=seed, width=width, keys=True)
    assert model.n_blocks < one.n_blocks
    (check_keyed if attention == "hardmax" else check_keyed_softmax)(model, ds)


@pytest.mark.parametrize("T", [1, 2, 3, 7, 29, 63, 120])
def test_bent_levels_are_a_convex_chain_with_rising_heights(T):
    """Every outcome of a bent round (ranks 0 … T) is a strict vertex of their hull, heights
    rise with the rank (the highest test keeps the highest score), and the entries stay within
    T^1.5 (the parabola h·(h − 1)/2 reaches T²/2); plain levels are the ranks themselves."""
    lv = keyed_separation.levels(T, bent=True)
    assert lv.shape == (T + 1, 2) and (lv[0] == 0).all()
    assert (np.diff(lv[:, 0]) >= 1).all()
    assert sorted(keyed_moves.hull_normals(lv)) == list(range(T + 1))
    assert lv.max() <= max(1.0, T ** 1.5)
    assert (keyed_separation.levels(T, bent=False) == np.arange(T + 1)[:, None]).all()


@settings(max_examples=300, deadline=None)
@given(pts=st.lists(st.tuples(st.integers(-40, 40), st.integers(-40, 40)), min_size=1,
                    max_size=12, unique=True))
def test_hull_normals_isolate_every_vertex(pts):
    """Each direction hull_normals gives makes its point the unique largest, and it gives one
    for every strict vertex: every point in no closed triangle (or segment) of three (two)
    others, checked here with exact cross products."""
    P = np.array(pts, dtype=np.int64)
    normals = keyed_moves.hull_normals(P)
    for i, g in normals.items():
        proj = P @ np.array(g)
        assert (proj[i] > np.delete(proj, i)).all()

    def cross(o, a, b):
        return (a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0])

    def inside(x, tri):
        signs = [cross(tri[k], tri[(k + 1) % 3], x) for k in range(3)]
        if all(s == 0 for s in signs):  # a degenerate triangle: on one of its segments
            return any(cross(a, b, x) == 0 and min(a[0], b[0]) <= x[0] <= max(a[0], b[0])
                       and min(a[1], b[1]) <= x[1] <= max(a[1], b[1])
                       for a, b in combinations(tri, 2))
        return all(s >= 0 for s in signs) or all(s <= 0 for s in signs)

    for i, x in enumerate(pts):
        others = pts[:i] + pts[i + 1:]
        hidden = any(inside(x, tri) for tri in combinations(others, 3)) or \
            any(inside(x, (a, b, b)) for a, b in combinations(others, 2))
        assert (i in normals) == (len(pts) > 1 and not hidden)


@settings(max_examples=200, deadline=None)
@given(sizes=st.lists(st.integers(1, 63), max_size=12), width=st.sampled_from([4, 8, 64]),
       h=st.integers(1, 16), coordinates=st.sampled_from([1, 2]))
def test_packed_rounds_fit_their_layer_and_are_packed_greedily(sizes, width, h, coordinates):
    """Layers take consecutive rounds, at most h, with their tests and the resets of the
    coordinates they reuse (``coordinates`` a round) in ``width`` units; a round starts a new
    layer only when it does not fit the current one. None exactly when a round cannot fit a
    layer of its own, which one coordinate a round never causes."""
    rounds = [list(range(min(n, width - 1))) for n in sizes]
    layers = keyed_separation.pack_rounds(rounds, width, h, coordinates)

    def units(layer, dirty):
        return sum(len(rounds[r]) for r in layer) + coordinates * min(len(layer), dirty)

    if layers is None:
        assert coordinates == 2 and any(len(r) + 2 > width for r in rounds[1:])
        return
    assert [r for layer in layers for r in layer] == list(range(len(rounds)))
    dirty = 0
    for i, layer in enumerate(layers):
        assert 1 <= len(layer) <= h and units(layer, dirty) <= width
        if i + 1 < len(layers):
            grown = layer + [layers[i + 1][0]]
            assert len(grown) > h or units(grown, dirty) > width
        dirty = max(dirty, len(layer))


@SETTINGS
@given(ds=datasets(d=2, N=8, max_pool=4), seed=seeds)
def test_dimension_two_few_tokens(ds, seed):
    check_keyed(ef.compile(ds, seed=seed, keys=True), ds)


@SETTINGS
@given(ds=datasets(m_equals_n=True), seed=seeds, width=widths)
def test_targets_as_long_as_inputs(ds, seed, width):
    check_keyed(ef.compile(ds, seed=seed, width=width, keys=True), ds)


@SETTINGS
@given(ds=datasets(N=1), seed=seeds)
def test_one_sequence(ds, seed):
    check_keyed(ef.compile(ds, seed=seed, keys=True), ds)


@SETTINGS
@given(ds=datasets(single_token=True), seed=seeds)
def test_single_token_inputs(ds, seed):
    check_keyed(ef.compile(ds, seed=seed, keys=True), ds)


@st.composite
def float_datasets(draw):
    """Generic float data in R^d, d = 2 … 16: tokens from a shared pool (so sequences share
    tokens and need separation), targets anywhere."""
    rng = np.random.default_rng(draw(seeds))
    d, N, pool = draw(st.integers(2, 16)), draw(st.integers(1, 12)), draw(st.integers(3, 24))
    tokens = rng.standard_normal((pool, d)) * draw(st.sampled_from([1e-3, 1.0, 1e3]))
    inputs, targets, seen = [], [], set()
    for _ in range(N):
        n = int(rng.integers(1, min(pool, 8) + 1))
        pick = tuple(sorted(rng.choice(pool, n, replace=False).tolist()))
        if pick in seen:
            continue
        seen.add(pick)
        inputs.append(tokens[list(pick)])
        targets.append(rng.standard_normal((int(rng.integers(1, n + 1)), d)))
    return make_dataset(inputs, targets)


@SETTINGS
@given(data=float_datasets(), width=widths, h=heads)
def test_float32_dense_pass_meets_the_goal(data, width, h):
    """A float64 build of generic float data: float64 within 1e-12 of the scale, and the
    float32 dense pass of the test within 1e-5 (docs/numerics.md bounds it by about 3·2⁻²⁴)
    whenever every cap's margin is at least 2^-16 of the extent, as the build reports."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        model = ef.compile(data, exact=False, width=width, heads=min(h, width), keys=True)
    scale = data.coordinate_scale()
    assert float_error(model, data, np.float64) <= 1e-12 * scale
    if float(model.record.keyed["cap_margin"]) >= float(model.record.keyed["float32_margin"]):
        assert float_error(model, data, np.float32) <= 1e-5 * scale


@SETTINGS
@given(ds=datasets(), seed=seeds)
def test_float32_states_are_exact_after_the_collapse(ds, seed):
    """Every state after the collapse, in float32, is the exact state rounded to float32 (the
    data read as float32): the caps are the only inexact step, their clips write exact codes
    and the collapse replaces every row that only a cap marked. The data coordinates pass
    every layer before the moves bit for bit."""
    model = ef.compile(ds, seed=seed, keys=True)
    end = model.record.phase("collapse").end
    xs, _ = ds.fractions()
    head = Transformer(d=model.d, attention="hardmax", blocks=model.blocks[:end], exact=True)
    exact = ef.forward(head, xs, arithmetic="exact")
    for x, want in zip(xs, exact, strict=True):
        x32 = np.asarray(np.asarray(x, dtype=float), dtype=np.float32)
        states = dense_pass(model.to_float(), x32, np.float32)
        assert states[end - 1].tobytes() == np.asarray(np.asarray(want, dtype=float),
                                                       dtype=np.float32).tobytes()
        for s in states[:end - 1]:
            assert s[:, :ds.d].tobytes() == x32.tobytes()


def test_rows_below_every_unit_pass_bit_for_bit():
    """In the float32 dense pass, a row at which no unit of a layer is active leaves the
    layer bit for bit; in the moves only the moved rows have an active unit, one each, and
    they leave with the model's own coordinates 0."""
    data = builtin.vocabulary(60, 40, 8, 3, 8)
    model = ef.compile(data, keys=True).to_float()
    start = model.record.phase("interpolation").start
    xs, _ = data.floats()
    for x in xs[:20]:
        X = np.zeros((len(x), model.d), dtype=np.float32)
        X[:, :data.d] = x
        for k, blk in enumerate(model.blocks):
            before = X
            X = dense_pass(block_model(model, k), before, np.float32)[-1]
            if blk.ff is None:
                continue
            f = blk.ff
            H = np.maximum(before @ f.U.T.astype(np.float32) + f.b.astype(np.float32), 0)
            after = before + H @ f.W.T.astype(np.float32)
            idle = ~(H > 0).any(axis=1)
            assert after[idle].tobytes() == before[idle].tobytes()
            if k >= start:
                assert (H > 0).sum(axis=1).max() <= 1
                assert not after[~idle, data.d:].any()


def block_model(model, k):
    """Block k alone, as a model."""
    return Transformer(d=model.d, attention="hardmax", blocks=[model.blocks[k]], exact=False)


# ------------------------------------------------------------------------------ examples
@pytest.mark.parametrize("width", [4, 64])
def test_vocabulary_family(width):
    data = builtin.vocabulary(60, 40, 8, 3, 8)
    model = ef.compile(data, width=width, keys=True)
    check_keyed(model, data)
    hats = ef.compile(data, width=width)
    assert model.n_blocks <= hats.n_blocks  # 97 against 308 at width 4


def test_the_check_can_fail():
    """Moving one target by a little makes the float32 check and the exact check fail."""
    data = builtin.demo()
    model = ef.compile(data, keys=True)
    last = model.blocks[-1].ff
    last.W[0, 0] += Fraction(1, 1000)
    with pytest.raises(AssertionError):
        check_keyed(model, data)


def test_record_round_trip(tmp_path):
    data = builtin.demo()
    model = ef.compile(data, keys=True, width=64, heads=16)
    assert model.record.keyed["heights"] == 3  # demo's three rounds share one layer
    path = tmp_path / "m.json"
    save_model(model, path)
    back = load_model(path)
    assert back.record.keyed == model.record.keyed
    assert [p.name for p in back.record.phases] == ["tagging", "separation", "collapse",
                                                     "interpolation"]
    meta = json.loads(path.read_text())["meta"]
    del meta["keyed"]["heights"]  # files written before heads: one height coordinate
    assert record_from_meta(meta).keyed["heights"] == 1
    for field, bad in (("tags", "7"), ("heights", -1)):
        broken = json.loads(path.read_text())["meta"]
        broken["keyed"][field] = bad
        with pytest.raises(RecordError, match=f"meta.keyed.{field}"):
            record_from_meta(broken)


def test_keyed_causal_softmax_takes_a_temperature():
    """Texts that disagree at a position (no position keys): the keyed causal softmax model at
    τ = 1/2 is the τ = 1 model with every score matrix's α and a halved, proved exact."""
    causal = conflict_data(n=4, length=4, d=2)
    one = ef.compile(causal, attention="softmax")
    half = ef.compile(causal, attention="softmax", tau="1/2")
    assert one.record.keyed is not None and half.tau == Fraction(1, 2)
    heads = [(h1.A, h2.A) for a, b in zip(one.blocks, half.blocks, strict=True) if a.sa
             for h1, h2 in zip(a.sa.heads, b.sa.heads, strict=True)]
    assert heads and all(A2.alpha == A1.alpha / 2 and list(A2.a) == [v / 2 for v in A1.a]
                         for A1, A2 in heads)
    assert ef.verify(half, causal).verdict() == "PROVED EXACT"


def test_cli_build_keys(tmp_path, capsys):
    data = tmp_path / "d.json"
    data.write_text(json.dumps({"inputs": [[[0, 1], [2, 3]], [[0, 1], [5, 5]]],
                                "targets": [[[1, 1]], [[4, 4], [6, 6]]]}))
    out = tmp_path / "m.json"
    assert cli_main(["build", str(data), "-o", str(out), "--keys"]) == 0
    assert cli_main(["verify", str(out), str(data)]) == 0
    assert "PROVED EXACT" in capsys.readouterr().out
    assert load_model(out).record.keyed is not None


# ------------------------------------------------------------------------------ enclosures
def test_dense_enclosure_keeps_untouched_radii():
    """A coordinate that no unit which may be on writes keeps its radius exactly; one written
    by an undecided unit does not; one written from exact inputs alone (x and the units that
    write it read only coordinates of radius 0, and no sum rounds) is exact, whatever the
    radii elsewhere in the row."""
    X = np.array([[1.0, 0.0, 0.5]])
    r = np.array([[1e-9, 2e-9, 0.0]])
    U = np.array([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    b = np.array([-1.0, 0.0])  # unit 0 certainly off; unit 1 on
    W = np.array([[0.0, 0.0], [5.0, 0.0], [0.0, 1.0]])
    out, rad = enclosure.ff_dense(X, r, 1.0, U, b, W)
    assert rad[0, 0] == r[0, 0] and rad[0, 1] == r[0, 1]  # unit 0 is off, coordinate 0 unread
    assert rad[0, 2] == 0 and out[0, 2] == 1.0  # 0.5 + relu(0.5), exactly
    U2 = U.copy()
    U2[1, 0] = 2.0 ** -40  # unit 1 also reads x0 = 1 ± 1e-9
    out, rad = enclosure.ff_dense(X, r, 1.0, U2, b, W)
    assert rad[0, 2] >= 1e-9 * 2.0 ** -40 and abs(out[0, 2] - 1.0) <= 2.0 ** -39
    unsure = np.array([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0]])  # unit 0: x1 = 0 ± 2e-9, undecided
    _, rad = enclosure.ff_dense(X, r, 1.0, unsure, np.array([0.0, -1.0]), W)
    assert rad[0, 1] > r[0, 1]


def test_transformer_lens_float32():
    """The tool users run: the keyed model as a TransformerLens bridge in float32 stays within
    1e-5 of the scale (hat models of these data miss by about the scale)."""
    pytest.importorskip("transformer_lens")
    from exactformer.export import lens_verdict, to_lens
    data = builtin.vocabulary(30, 20, 6, 3, 6)
    verdict = lens_verdict(to_lens(ef.compile(data, keys=True), "float32"), data)
    assert verdict.interpolates and verdict.error <= 1e-5 * data.coordinate_scale()


def test_dense_enclosure_keeps_no_radius_around_a_nan():
    """A unit that may be on and overflows to inf makes inf·0 = nan in a coordinate its W
    does not write: that coordinate is not x any more, and its radius must not say so."""
    out, rad = enclosure.ff_dense(np.array([[1.0, 2.0]]), np.zeros((1, 2)), 1.0,
                                  np.array([[1e308, 1e308]]), np.array([0.0]),
                                  np.array([[1e-308], [0.0]]))
    assert np.isnan(out[0, 1]) and not rad[0, 1] < np.inf


def test_moves_beyond_float32s_faithful_range_warn():
    """A move direction whose weight K is beyond what float32 reads faithfully (a
    lexicographic one on spread signatures) is named; the small directions the builds use
    stay silent. A softmax argument is rounded, so its limit is lower."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        keyed_moves.warn_wide_moves({0: [[(0, (4, 4))]]}, 1000, 2, softmax=False)
        keyed_moves.warn_wide_moves({0: [[(0, (4, 4))]]}, 1000, 2, softmax=True)
    for softmax, g in ((False, (1 << 16, 1)), (True, (64, 1))):
        with pytest.warns(RuntimeWarning, match="float32 pass reads faithfully"):
            keyed_moves.warn_wide_moves({0: [[(0, g)]]}, 1000, 2, softmax)


def test_close_tokens_warn_that_float32_may_misfire():
    """Tokens about 1e-6 apart (of a scale about 2.4): the caps' margins fall below 2^-16
    of the extent, where float32 can tag the wrong token; the build says so, and the model
    is still exact."""
    x = np.array([[-0.41306, -2.44147], [0.18905, -0.52275], [-0.32542, 0.77381],
                  [0.28121, -0.55382]])
    y = x.copy()
    y[1] += [-1e-6, 3e-7]
    data = make_dataset([x, y[[3, 0, 2, 1]]], [[[0, 3], [10, 1]], [[-1, 2], [10, -3]]])
    with pytest.warns(RuntimeWarning, match="float32 pass may tag the wrong token"):
        model = ef.compile(data, keys=True, seed=2)
    assert float(model.record.keyed["cap_margin"]) < float(model.record.keyed["float32_margin"])
    assert ef.verify(model, data).verdict() == "PROVED EXACT"


# ------------------------------------------------------------------------------ softmax
@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(ds=datasets(), seed=seeds, width=widths, h=heads)
def test_softmax_random_shared_pools(ds, seed, width, h):
    """Rational coordinates (denominators up to 7) included: their targets are no binary
    numbers, so the ball pass proves them through its exact parts."""
    check_keyed_softmax(ef.compile(ds, attention="softmax", seed=seed, width=width,
                                   heads=min(h, width), keys=True), ds)


@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(ds=datasets(), seed=seeds, width=widths)
def test_softmax_last_move_layer_marks_nothing(ds, seed, width):
    """No unit reads ``moved`` after the last move layer, so its moves do not mark: the
    reset of ``moved`` may share that layer. The model has at most the blocks of one whose
    every move marks, no unit after the reset reads or writes ``moved``, and it is exact."""
    def marked(lay, layers):
        return layers, (len(layers) if any(u[2][lay.moved] != 0 for layer in layers
                                             for u in layer) else None)

    model = ef.compile(ds, attention="softmax", seed=seed, width=width, keys=True)
    with mock.patch.object(keyed_softmax, "_unmarked_last", marked):
        before = ef.compile(ds, attention="softmax", seed=seed, width=width, keys=True)
    assert model.n_blocks <= before.n_blocks
    moved = model.d - 1
    touch = [i for i, b in enumerate(model.blocks) if b.ff is not None and
             (any(v != 0 for v in b.ff.W[moved]) or any(v != 0 for v in b.ff.U[:, moved]))]
    resets = [i for i in touch if any(list(u).count(0) == len(u) - 1 and u[moved] != 0
                                      for u in model.blocks[i].ff.U)]
    assert not resets or max(touch) == resets[-1]
    check_keyed_softmax(model, ds)


@settings(max_examples=8, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(ds=st.one_of(datasets(d=2, N=8, max_pool=4), datasets(m_equals_n=True),
                    datasets(N=1), datasets(single_token=True)), seed=seeds)
def test_softmax_small_cases(ds, seed):
    check_keyed_softmax(ef.compile(ds, attention="softmax", seed=seed, keys=True), ds)


@settings(max_examples=10, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(data=float_datasets(), width=widths, h=heads)
def test_softmax_float32_dense_pass_meets_the_goal(data, width, h):
    """A float64 softmax build of generic float data, d = 2 … 16: verify's bound decides it
    OK, float64 within 1e-12 and float32 within 1e-5 of the scale (under the caps' margin)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        model = ef.compile(data, attention="softmax", exact=False, width=width,
                           heads=min(h, width), keys=True)
    scale = data.coordinate_scale()
    assert ef.verify(model, data).ok
    assert float_error(model, data, np.float64) <= 1e-12 * scale
    if float(model.record.keyed["cap_margin"]) >= float(model.record.keyed["float32_margin"]):
        assert float_error(model, data, np.float32) <= 1e-5 * scale


@pytest.mark.parametrize("width", [4, 64])
def test_softmax_vocabulary_family(width):
    """Fewer blocks than the hat softmax model at width 4 (on vocabulary(60, 40, 8, 3, 8):
    161 against 309)."""
    data = builtin.vocabulary(30, 20, 6, 3, 6)
    model = ef.compile(data, attention="softmax", width=width, keys=True)
    check_keyed_softmax(model, data)
    if width == 4:
        assert model.n_blocks <= ef.compile(data, attention="softmax").n_blocks


def test_softmax_check_can_fail():
    """A collapse whose scores are 1/64 of the built ones lets the softmax blur reach the
    moves: the model misses its targets in real arithmetic, and neither verify nor the test's
    own checks let it pass."""
    data = builtin.demo()
    model = ef.compile(data, attention="softmax", keys=True)
    head = model.blocks[model.record.phase("collapse").end - 1].sa.heads[0]
    head.A.alpha, head.A.a = head.A.alpha / 64, head.A.a / 64
    report = ef.verify(model, data)
    assert not report.ok and not report.proved
    with pytest.raises(AssertionError):
        check_keyed_softmax(model, data)


def test_softmax_record_and_cli(tmp_path, capsys):
    data = builtin.demo()
    model = ef.compile(data, attention="softmax", keys=True)
    assert model.tau == 1 and model.record.kind == "softmax"
    report = ef.verify(model, data)  # proved, no snap line: the mpmath measurement is skipped
    assert report.proved and "hausdorff_mp" not in report.extra
    assert report.extra["mp pass"].startswith("not run") and "mp digits" not in report.extra
    beta_s, beta_c = (Fraction(v) for v in model.record.keyed["scores"])
    assert beta_s >= 1 and beta_c >= 1
    path = tmp_path / "m.json"
    save_model(model, path)
    assert load_model(path).record.keyed == model.record.keyed
    src = tmp_path / "d.json"
    src.write_text(json.dumps({"inputs": [[[0, 1], [2, 3]], [[0, 1], [5, 5]]],
                               "targets": [[[1, 1]], [[4, 4], [6, 6]]]}))
    out = tmp_path / "s.json"
    assert cli_main(["build", str(src), "-o", str(out), "--keys", "--attention", "softmax"]) == 0
    assert cli_main(["verify", str(out), str(src)]) == 0
    assert "PROVED EXACT" in capsys.readouterr().out


def test_softmax_transformer_lens_float32():
    """A keyed softmax model as a TransformerLens bridge in float32 interpolates within 1e-5
    of the scale."""
    pytest.importorskip("transformer_lens")
    from exactformer.export import lens_verdict, to_lens
    data = builtin.vocabulary(30, 20, 6, 3, 6)
    model = ef.compile(data, attention="softmax", keys=True)
    verdict = lens_verdict(to_lens(model, "float32"), data)
    assert verdict.interpolates and verdict.error <= 1e-5 * data.coordinate_scale()


# ------------------------------------------------------------------------------ collapse margins
def collapse_margins(model, data) -> list:
    """Per row of the exact states before the collapse, its best stored collapse score less
    its second best (rows of one-token sequences skipped), the softmax score scale divided
    out."""
    c = model.record.phase("collapse")
    head = Transformer(d=model.d, attention=model.attention, blocks=model.blocks[:c.end - 1],
                       exact=True, tau=model.tau)
    sa = model.blocks[c.end - 1]
    xs, _ = data.fractions()
    states = ef.forward(head, xs, arithmetic="exact") if model.attention == "hardmax" else \
        [np.asarray(s, dtype=object) for s in _exact_before_collapse(model, xs)]
    if sa.ff is not None:  # the block's FF: heights cleared (softmax: the last data reset)
        states = [_ff_exact(sa.ff, X) for X in states]
    A = sa.sa.heads[0].A.dense()
    scale = Fraction(model.record.keyed["scores"][1]) if model.attention == "softmax" else 1
    out = []
    for X in states:
        S = (X @ A.T) @ X.T
        for row in S:
            best = sorted(row, reverse=True)
            if len(best) > 1:
                out.append((best[0] - best[1]) / scale)
    return out


def _ff_exact(ff, X):
    H = X @ ff.U.T + ff.b
    H = np.where(H > 0, H, Fraction(0))
    return X * ff.eta + H @ ff.W.T


def _exact_before_collapse(model, xs):
    """A softmax model's states before its collapse with every softmax average replaced by the
    hardmax one: the states the collapse's margins are stated for (docs/keyed.md#collapse)."""
    c = model.record.phase("collapse")
    hard = Transformer(d=model.d, attention="hardmax", blocks=model.blocks[:c.end - 1],
                       exact=True)
    return ef.forward(hard, xs, arithmetic="exact")


@SETTINGS
@given(ds=datasets(), seed=seeds, width=widths)
def test_collapse_margins(ds, seed, width):
    """Every row's best collapse score beats its second by at least ½ (docs/keyed.md#collapse)
    on the exact states the collapse head scores."""
    model = ef.compile(ds, seed=seed, width=width, keys=True)
    assert min(collapse_margins(model, ds), default=1) >= Fraction(1, 2)


@pytest.mark.parametrize("attention", ["hardmax", "softmax"])
def test_collapse_margins_with_a_tall_round(attention):
    """nested(30, 3) at width 64 holds one round of 29 tests: heights up to 29 reach the
    collapse block, whose FF must clear them before its head scores the states."""
    data = builtin.nested(30, 3)
    model = ef.compile(data, attention=attention, width=64, keys=True)
    xs, _ = data.fractions()
    states = _exact_before_collapse(model, xs)
    assert max(max(X[:, data.d + 4]) for X in states) >= 20  # the first height coordinate
    assert min(collapse_margins(model, data)) >= Fraction(1, 2)


@pytest.mark.parametrize("scale", [1e-12, 1e-8, 1e8])
def test_softmax_tiny_and_huge_scales(scale):
    """Data and targets at scale 10⁻¹² … 10⁸: the data reset's dyadic point lies within the
    data's own extent, so each write f + (target − f) rounds at the data's scale (an absolute
    step of 2⁻²⁰ once made it 10⁻² of the scale at 10⁻¹²)."""
    rng = np.random.default_rng(3)
    P = rng.standard_normal((8, 2)) * scale
    picks = [[0, 1, 2], [1, 3], [4, 5, 6], [2, 7], [0, 5], [3, 6, 7]]
    data = make_dataset([P[k] for k in picks],
                        [rng.standard_normal((1, 2)) * scale for _ in picks])
    model = ef.compile(data, attention="softmax", keys=True, exact=False)
    s = data.coordinate_scale()
    assert ef.verify(model, data).ok
    assert float_error(model, data, np.float64) <= 1e-12 * s
    assert float_error(model, data, np.float32) <= 1e-5 * s


@pytest.mark.parametrize("attention", ["hardmax", "softmax"])
def test_tokens_beyond_float64_squares_are_refused_clearly(attention):
    """|x|² of 10¹⁶⁰ overflows float64, which every cap and collapse score would read."""
    data = make_dataset([[[1e160, 0], [0, 1e160]], [[1e160, 0]]], [[[1, 1]], [[2, 2]]])
    with pytest.raises(keyed.NotKeyable, match="too large for float64"):
        ef.compile(data, attention=attention, keys=True)


@pytest.mark.parametrize("top", [1e300, 1.7e308])
def test_tokens_whose_differences_overflow_float64_fall_back_and_stay_exact(top):
    """No option given: data whose squared norms (here even differences) overflow float64 get
    the paper's construction, with a warning that says so, proved exact; its generic choices
    compare exact gaps, whose float64 differences would overflow (an OverflowError once)."""
    data = make_dataset([[[top, 1.0], [-top, 1.0]], [[top, 1.0]]], [[[1.0, 1.0]], [[2.0, 2.0]]])
    with pytest.warns(RuntimeWarning, match="does not apply"):
        model = ef.compile(data)
    assert model.record.keyed is None
    assert ef.verify(model, data).verdict() == "PROVED EXACT"
