"""Keyed causal models (docs/causal.md#keyed-causal-models): causal data whose texts disagree
at a position, built with ``keys=True``; exact in rational arithmetic (hardmax), proved exact
in ball arithmetic (softmax), and within float32's rounding of every target in a plain dense
causal pass written here, independent of the package's evaluators.
"""

from __future__ import annotations

import json
import random
import warnings
from fractions import Fraction

import numpy as np
import pytest
from conftest import conflict_data, dense_pass
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import exactformer as ef
from exactformer.cli import main as cli_main
from exactformer.construct.position_keys import keyed_positions
from exactformer.data import CausalDataset
from exactformer.modelio import load_model, save_model
from exactformer.record import record_from_meta
from exactformer.tools.decode import Decoder

SETTINGS = settings(max_examples=25, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


# ------------------------------------------------------------------------------ the data
@st.composite
def texts(draw, max_d=16, max_len=8, max_texts=8):
    """Texts over a small shared vocabulary in R^d (integers, dyadic or generic floats), the
    target of a position a function of its ordered prefix (drawn from a pool, so texts
    disagree at one point), some null; kept only where position keys do not apply."""
    d = draw(st.integers(2, max_d))
    kind = draw(st.sampled_from(["integer", "dyadic", "float"]))
    rng = random.Random(draw(st.integers(0, 2 ** 31)))
    scale = draw(st.sampled_from([1.0, 1e-3, 1e4]))

    def vector():
        if kind == "integer":
            return [rng.randint(-3, 3) for _ in range(d)]
        if kind == "dyadic":
            return [Fraction(rng.randint(-64, 64), 16) for _ in range(d)]
        return [rng.uniform(-1, 1) * scale for _ in range(d)]

    vocab, size = [], draw(st.integers(1, 5))
    while len(vocab) < size:
        v = vector()
        if v not in vocab:
            vocab.append(v)
    outs = vocab + [vector() for _ in range(draw(st.integers(1, 3)))]
    seqs = [[rng.randrange(len(vocab)) for _ in range(rng.randint(1, max_len))]
            for _ in range(draw(st.integers(2, max_texts)))]
    null = draw(st.sampled_from([0.0, 0.2, 0.5]))
    by_prefix: dict[tuple, list] = {}
    targets = [[None if rng.random() < null else
                by_prefix.setdefault(tuple(s[:i + 1]), rng.choice(outs)) for i in range(len(s))]
               for s in seqs]
    data = CausalDataset.from_arrays([[vocab[t] for t in s] for s in seqs], targets)
    xs, ys = data.fractions()
    if keyed_positions(xs, ys, data.known) is not None:
        data = conflict_data(rng.randrange(1000), n=4, length=4)
    return data


# ------------------------------------------------------------------------------ the dense pass
def fractions(a) -> np.ndarray:
    """Parameters as they are stored (Fractions in a rational model): an exact dense pass."""
    return np.asarray(a, dtype=object)


def dense_error(model, data, dtype) -> float:
    """The largest distance of a constrained output of the dense pass from its padded
    target."""
    xs, ys = data.floats()
    worst = 0.0
    for x, y, k in zip(xs, ys, data.known, strict=True):
        o = dense_pass(model, x, dtype)[-1].astype(float)
        Y = np.pad(y, ((0, 0), (0, model.d - y.shape[1])))
        worst = max([worst] + np.linalg.norm(o[k] - Y[k], axis=1).tolist())
    return worst


def check(model, data) -> None:
    """Keyed, proved exact by verify (rational builds; float64 builds: within its tolerance),
    and within 1e-5 of the scale in float32 (1e-12 in float64) in the test's own dense
    pass."""
    assert model.record.keyed is not None and model.d > data.d
    report = ef.verify(model, data)
    assert report.ok and (report.proved or not model.exact), report.table()
    assert report.blocks == report.blocks_design == model.n_blocks
    scale = data.coordinate_scale() or 1.0
    floats = model.to_float()
    assert dense_error(floats, data, np.float64) <= 1e-12 * scale
    assert dense_error(floats, data, np.float32) <= 1e-5 * scale


def exact_outputs_hit(model, data) -> bool:
    """``==`` on Fractions at every constrained position, from the package's exact pass."""
    xs, ys = data.fractions()
    outs = ef.forward(model, xs, arithmetic="exact")
    zero = [Fraction(0)] * (model.d - data.d)
    return all(list(o[i]) == list(y[i]) + zero
               for o, y, k in zip(outs, ys, data.known, strict=True)
               for i in np.flatnonzero(k))


# ------------------------------------------------------------------------------ properties
@SETTINGS
@given(data=texts(), width=st.sampled_from([4, 8, 16, 64]), h=st.sampled_from([1, 2, 16]),
       seed=st.integers(0, 2 ** 31 - 1))
def test_hardmax_keyed_texts_are_exact_and_faithful_in_float32(data, width, h, seed):
    model = ef.compile(data, causal=True, keys=True, width=width, heads=min(h, width),
                       seed=seed)
    assert exact_outputs_hit(model, data)
    check(model, data)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=texts(max_d=6, max_len=5, max_texts=5), width=st.sampled_from([4, 16]),
       h=st.sampled_from([1, 4]))
def test_softmax_keyed_texts_are_proved_and_faithful_in_float32(data, width, h):
    model = ef.compile(data, causal=True, keys=True, attention="softmax", width=width,
                       heads=min(h, width))
    assert model.attention == "softmax"
    check(model, data)


@SETTINGS
@given(data=texts(max_d=5), width=st.sampled_from([4, 16]))
def test_float64_builds_hit_the_targets(data, width):
    model = ef.compile(data, causal=True, keys=True, width=width, exact=False)
    check(model, data)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=texts(max_d=6), width=st.sampled_from([4, 16]))
def test_every_argument_after_the_tagging_is_exact_in_float32(data, width):
    """After the caps every unit reads small integers times powers of two: its float32
    pre-activation equals the exact one at every row, so a row no unit reaches passes the
    layer bit for bit, whatever its target rounding did to its data."""
    model = ef.compile(data, causal=True, keys=True, width=width)
    tagged = model.record.phase("tagging").end
    xs, _ = data.fractions()
    for x in xs:
        pre_exact, pre_f32 = [], []
        dense_pass(model, np.asarray(x, dtype=object), object, fractions, pre=pre_exact)
        f32 = dense_pass(model.to_float(), np.asarray(x, dtype=float), np.float32,
                         pre=pre_f32)
        for k in range(tagged, model.n_blocks):
            if pre_exact[k] is None:
                continue
            Zf = pre_f32[k]
            assert np.array_equal(np.vectorize(Fraction)(Zf.astype(float)), pre_exact[k]), k
            quiet = (Zf <= 0).all(axis=1)
            if model.blocks[k].sa is None:
                assert np.array_equal(f32[k][quiet], f32[k - 1][quiet])  # bit for bit


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=texts(max_d=6), width=st.sampled_from([4, 16]), h=st.sampled_from([1, 4]))
def test_every_row_fires_at_most_once_and_exactly(data, width, h):
    """Every unit after the separation writes −1 to the ``one`` coordinate at activation 1:
    a final ``one`` of exactly 0 or 1 at every row, unconstrained ones included, says that
    no row fired twice or at an activation other than 1, so nothing grows without bound
    where the data leave a position free."""
    model = ef.compile(data, causal=True, keys=True, width=width, heads=min(h, width))
    one = data.d  # the coordinate after the data (docs/keyed.md#coordinates)
    xs, _ = data.fractions()
    for x, k in zip(xs, data.known, strict=True):
        final = dense_pass(model, np.asarray(x, dtype=object), object, fractions)[-1]
        assert set(final[:, one].tolist()) <= {0, 1}
        assert all(v == 0 for v in final[k, one])


def test_conflicting_texts_take_fewer_blocks_than_the_hats():
    data = conflict_data()
    hat = ef.compile(data, causal=True, construction="paper")
    model = ef.compile(data, causal=True)  # the default construction
    assert model.n_blocks < hat.n_blocks
    check(model, data)
    assert dense_error(hat.to_float(), data, np.float32) > 1e-5 * data.coordinate_scale()


def test_heads_share_the_separation_layers():
    data = conflict_data(seed=3, n=20, length=8)
    one = ef.compile(data, causal=True, keys=True, width=16)
    many = ef.compile(data, causal=True, keys=True, width=16, heads=8)
    assert many.record.keyed["rounds"] == one.record.keyed["rounds"] > 1
    assert many.record.R < one.record.R
    assert many.max_heads() > 1
    check(many, data)


def test_position_keys_still_serve_agreeing_texts():
    data = CausalDataset.from_arrays([[[1, 0], [0, 1], [1, 1]], [[1, 0], [0, 1]]],
                                     [[[0, 1], [1, 1], [2, 0]], [[0, 1], [1, 1]]])
    model = ef.compile(data, causal=True, keys=True)
    assert model.record.position_code is not None and model.record.keyed is None


def test_the_check_can_fail():
    """A model one move short of the data is caught by the exact check and by verify."""
    data = conflict_data(seed=1, n=6, length=4)
    model = ef.compile(data, causal=True, keys=True)
    last = model.blocks[-1].ff
    last.W[:, 0] = last.W[:, 0] * 0
    assert not exact_outputs_hit(model, data)
    assert not ef.verify(model, data).ok


def test_decoder_matches_the_full_pass():
    data = conflict_data(seed=2, n=8, length=6)
    model = ef.compile(data, causal=True, keys=True, width=8, heads=2)
    xs, _ = data.fractions()
    full = ef.forward(model, xs, arithmetic="exact")
    for x, o in zip(xs, full, strict=True):
        dec = Decoder(model, "exact")
        rows = [dec.push(t) for t in x]
        assert all(list(a) == list(b) for a, b in zip(rows, o, strict=True))


def test_record_round_trip_and_cli(tmp_path, capsys):
    data = conflict_data(seed=4, n=6, length=5)
    model = ef.compile(data, causal=True, keys=True, attention="softmax")
    path = tmp_path / "m.json"
    save_model(model, path)
    back = load_model(path)
    assert back.record.keyed == model.record.keyed
    assert record_from_meta(json.loads(path.read_text())["meta"]).keyed["rounds"] >= 1
    src = tmp_path / "d.json"
    src.write_text(json.dumps({"causal": True, "inputs": [x.tolist() for x in data.inputs],
                               "targets": [[list(map(int, t)) if k else None
                                            for t, k in zip(y, kn, strict=True)]
                                           for y, kn in zip(data.targets, data.known,
                                                            strict=True)]}))
    out = tmp_path / "k.json"
    assert cli_main(["build", str(src), "-o", str(out), "--keys"]) == 0
    assert cli_main(["verify", str(out), str(src)]) == 0
    text = capsys.readouterr().out
    assert "PROVED EXACT" in text and "keyed" in text


def test_close_tokens_warn_that_float32_may_misfire():
    a = [1.0, 0.0]
    b = [1.0, 1e-9]
    data = CausalDataset.from_arrays([[a, a], [b, a]], [[[0, 1], [1, 1]], [[0, 1], [2, 2]]])
    with pytest.warns(RuntimeWarning, match="float32 pass may tag the wrong token"):
        model = ef.compile(data, causal=True, keys=True, exact=False)
    assert ef.verify(model, data).ok


@pytest.mark.parametrize("attention", ["hardmax", "softmax"])
def test_transformer_lens_float32(attention):
    """The tool users run: a keyed causal model as a TransformerLens bridge in float32 stays
    within 1e-5 of the scale at every constrained position (the hat model does not)."""
    pytest.importorskip("transformer_lens")
    from exactformer.export import lens_verdict, to_lens
    data = conflict_data(seed=5, n=8, length=6)
    verdict = lens_verdict(to_lens(ef.compile(data, keys=True, attention=attention),
                                   "float32"), data)
    assert verdict.interpolates and verdict.error <= 1e-5 * data.coordinate_scale()
    hat = lens_verdict(to_lens(ef.compile(data, attention=attention, construction="paper"),
                               "float32"), data)
    assert hat.error > 1e-5 * data.coordinate_scale()


def test_a_free_row_above_two_states_of_a_batch_fires_once():
    """Row (1, 2) has no target and is above two states of one hull batch of the cell
    (2, C); the batch is split so that it fires at one unit, exactly once."""
    A, B, C = [-3, 2], [-1, -1], [0, 1]
    data = CausalDataset.from_arrays(
        [[A, B, C], [C, B, C], [B, A, C], [B, B, C]],
        [[None, [-1, 3], [-3, 2]], [None, [-1, 3], None], [None, None, [-1, -1]],
         [None, [0, 1], [0, 1]]])
    model = ef.compile(data, causal=True, keys=True, width=16, heads=2, seed=497)
    outs = ef.forward(model, data.fractions()[0], arithmetic="exact")
    assert {o[i][data.d] for o in outs for i in range(len(o))} <= {0, 1}
    assert exact_outputs_hit(model, data)


def test_huge_coordinates_stay_finite_in_a_float32_export():
    """Keyed heads have α = 0: a torch export must not form 0·⟨x_i, x_l⟩, which is nan once
    |x|² overflows float32 (here |x| ≈ 1e19)."""
    torch = pytest.importorskip("torch")
    from exactformer.export import apply, to_torch
    s = 1e19
    a, b = [s, .5 * s], [.25 * s, s]
    data = CausalDataset.from_arrays([[a, a], [b, a]],
                                     [[[0, s], [s, s]], [[0, s], [2 * s, .5 * s]]])
    model = ef.compile(data, causal=True, keys=True)
    outs = apply(to_torch(model.to_float(), torch.float32, ff="dense"), data.floats()[0])
    _, ys = data.floats()
    for o, y in zip(outs, ys, strict=True):
        assert np.isfinite(o).all()
        assert np.abs(np.asarray(o)[:, :data.d] - y).max() <= 1e-5 * s


def test_a_lone_token_cap_has_a_margin_of_the_data_scale():
    """The last unmarked token's cap takes a margin of the data's size: at coordinates of 2^24
    a margin of 1 fell below float32's rounding and the cap missed its token."""
    s = 2.0 ** 24
    a, b, c = [s, -2 * s], [s, -s], [s, 3 * s]
    data = CausalDataset.from_arrays(
        [[a, b], [a, a], [c, c, a, a], [c, c], [b, b, c]],
        [[None, None], [None, None], [[s, -s], [s, -s], [s, 3 * s], [s, -s]], [None, None],
         [[s, -s], None, [s, -2 * s]]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no float32 warning: every margin is wide
        model = ef.compile(data, causal=True, keys=True, width=64, seed=995)
    assert float(model.record.keyed["cap_margin"]) > 2.0 ** -16
    assert dense_error(model.to_float(), data, np.float32) <= 1e-5 * data.coordinate_scale()
