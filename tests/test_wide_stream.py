"""Models wider than their data (d_model = D > d): the data are read zero-padded.

The reference is a constructed model embedded into R^(d+k) by zero-padding its parameters
(:func:`widen`, written here, not in the package): on the padded data it computes the padded
outputs of the original, so every verdict, error and export must be the original's, and
every output must come back in R^D with exactly 0 in the extra coordinates
(docs/architecture.md#data-narrower-than-the-model).
"""

from __future__ import annotations

import json
from dataclasses import replace
from fractions import Fraction

import numpy as np
import pytest
from conftest import datasets, paper
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import exactformer as ef
from exactformer.cli import main
from exactformer.data import CausalDataset, builtin
from exactformer.evaluate import enclose, forward_causal
from exactformer.model import FF, SA, Block, Head, ScoreMatrix, ValueMatrix
from exactformer.tools.decode import Decoder, generate

SETTINGS = settings(max_examples=12, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# ------------------------------------------------------------------------------ the embedding
def zero_columns(a: np.ndarray, k: int, axis: int) -> np.ndarray:
    """``a`` with k zero rows (axis 0) or columns (axis 1) appended, in its own arithmetic."""
    shape = list(a.shape)
    shape[axis] = k
    zeros = np.full(shape, Fraction(0), dtype=object) if a.dtype == object else np.zeros(shape)
    return np.concatenate([a, zeros], axis=axis)


def widen(model, k: int):
    """``model`` on R^(d+k): U gets k zero columns, W k zero rows, b stays; a, c, p, q of every
    head get k zeros (α·I and β·I then act on the extra coordinates too, which are 0 on padded
    data); positions get k zero columns."""
    def ff(f):
        return None if f is None else FF(f.eta, zero_columns(f.U, k, 1), f.b,
                                         zero_columns(f.W, k, 0))

    def vec(v):
        return zero_columns(v[None, :], k, 1)[0]

    def sa(s):
        if s is None:
            return None
        return SA(s.rho, heads=[Head(ScoreMatrix(h.A.alpha, vec(h.A.a), vec(h.A.c)),
                                     ValueMatrix(h.V.beta, vec(h.V.p), vec(h.V.q)))
                                for h in s.heads])

    positions = None if model.positions is None else zero_columns(model.positions, k, 1)
    return replace(model, d=model.d + k, blocks=[Block(ff(b.ff), sa(b.sa)) for b in model.blocks],
                   positions=positions)


def padded(a, k: int) -> np.ndarray:
    return zero_columns(np.asarray(a), k, 1)


def same_rows(a, b) -> bool:
    """Exact equality of two arrays of numbers (Fractions or floats), row for row."""
    return [tuple(map(Fraction, r)) for r in np.asarray(a)] == \
        [tuple(map(Fraction, r)) for r in np.asarray(b)]


def last_moving_row(model) -> tuple[int, int]:
    """(block, row i < d) of the last FF layer with a nonzero output row: copying that row of W
    into an extra coordinate makes the tokens that layer moves leave it nonzero."""
    for j in range(len(model.blocks) - 1, -1, -1):
        ff = model.blocks[j].ff
        if ff is not None:
            rows = [i for i in range(ff.W.shape[0]) if any(v != 0 for v in ff.W[i])]
            if rows:
                return j, rows[0]
    raise AssertionError("no FF layer moves anything")


def leak_into_extra(model, d: int):
    """A copy of the widened ``model`` whose last moving FF writes into coordinate d too."""
    j, i = last_moving_row(model)
    blocks = list(model.blocks)
    ff = blocks[j].ff
    W = ff.W.copy()
    W[d] = W[i]
    blocks[j] = Block(FF(ff.eta, ff.U, ff.b, W), blocks[j].sa)
    return replace(model, blocks=blocks)


@st.composite
def models(draw):
    """(data, model): random set data (shared tokens, d = 2..4), hardmax or softmax, rational
    or float64 parameters, one head or (d ≥ 3, width 8) two."""
    data = draw(datasets(N=draw(st.integers(1, 5)), d=draw(st.integers(2, 4)), max_pool=5))
    attention = draw(st.sampled_from(["hardmax", "softmax"]))
    exact = draw(st.booleans())
    assume(exact or not data.exact or _float64_ok(data))
    wide = data.d >= 3 and draw(st.booleans())
    kw = {"width": 8, "heads": 2} if wide else {}
    return data, paper(data, attention=attention, exact=exact, seed=draw(st.integers(0, 9)),
                            **kw)


def _float64_ok(data) -> bool:
    try:
        data.check_float64()
    except ef.DatasetError:
        return False
    return True


@st.composite
def causal_models(draw):
    """(data, model) for causal data over a small pool (tokens repeat, some positions
    unconstrained), hardmax or softmax, rational or float64 parameters."""
    d = draw(st.integers(2, 3))
    pool = draw(st.lists(st.tuples(*[st.integers(-3, 3)] * d), min_size=2, max_size=4,
                         unique=True))
    seqs = draw(st.lists(st.lists(st.integers(0, len(pool) - 1), min_size=1, max_size=5),
                         min_size=1, max_size=5))
    by_prefix: dict[tuple, object] = {}
    ys = [[by_prefix.setdefault(tuple(s[: i + 1]), None if i and draw(st.booleans()) else
                                list(draw(st.sampled_from(pool)))) for i in range(len(s))]
          for s in seqs]
    data = CausalDataset.from_arrays([[list(pool[t]) for t in s] for s in seqs], ys)
    attention = draw(st.sampled_from(["hardmax", "softmax"]))
    return data, paper(data, attention=attention, exact=draw(st.booleans()))


# ------------------------------------------------------------------------------ data
@SETTINGS
@given(datasets(max_pool=5), st.integers(1, 3))
def test_padding_keeps_the_data_and_their_validity(data, k):
    wide = data.padded(data.d + k)
    assert data.padded(data.d) is data and wide.d == data.d + k and wide.padded_from == data.d
    for a, b in zip(data.inputs + data.targets, wide.inputs + wide.targets, strict=True):
        assert same_rows(b[:, : data.d], a) and all(v == 0 for v in b[:, data.d:].flat)
    again = ef.Dataset.from_arrays([x.tolist() for x in wide.inputs],
                                   [y.tolist() for y in wide.targets])
    assert again.exact == wide.exact and wide.padded(data.d + k) is wide
    for a, b in zip(again.inputs + again.targets, wide.inputs + wide.targets, strict=True):
        assert same_rows(a, b)
    with pytest.raises(ValueError, match=f"d = {data.d}, more than .* d_model = {data.d - 1}"):
        data.padded(data.d - 1)


# ------------------------------------------------------------------------------ set models
@SETTINGS
@given(models(), st.integers(1, 2))
def test_a_widened_model_verifies_as_the_original(case, k):
    data, model = case
    wide = widen(model, k)
    r0, r1 = ef.verify(model, data), ef.verify(wide, data)
    assert r1.verdict() == r0.verdict() and r1.ok
    assert r1.exact_equal == r0.exact_equal and r1.within_tolerance == r0.within_tolerance
    scale = r0.coordinate_scale or 1  # (a distance to a set moves no more than its points)
    tol = 1e-12 * scale + _float_spread(model, wide, data.floats()[0], k, scale)
    assert np.allclose(r1.hausdorff_float64, r0.hausdorff_float64, rtol=0, atol=tol)
    assert (r1.d, r1.d_model, r0.d_model) == (data.d, data.d + k, None)
    assert "d_model" not in r0.to_dict() and r1.to_dict()["d_model"] == data.d + k
    assert f"{data.N} / {data.d}  (zero-padded to d_model = {data.d + k})" in r1.table()
    leaky = leak_into_extra(wide, data.d)
    xs = data.fractions()[0] if model.exact else data.floats()[0]
    arithmetic = "exact" if model.attention == "hardmax" else "float"
    outs = ef.forward(leaky, xs, arithmetic)
    assume(any(np.abs(np.asarray(o[:, data.d], dtype=float)).max() > 1e-6 for o in outs))
    assert not ef.verify(leaky, data).ok  # the extra coordinates are compared too


@SETTINGS
@given(models(), st.integers(1, 2))
def test_forward_and_predict_give_the_originals_padded(case, k):
    check_padded(*case, k)


def test_an_ill_conditioned_float_softmax_model_widens_too():
    """A float64 hat softmax model whose float pass is 10⁻¹¹ off its own 60-digit value: the
    wide pass sums a row in another order and lands 1.8·10⁻¹⁰ from the narrow one (hypothesis
    found it); both are within their own errors, and the 60-digit passes agree."""
    F = Fraction
    data = ef.Dataset.from_arrays(
        [[[F(3), F(0)], [F(-1), F(0)]], [[F(3), F(0)], [F(-1), F(0)], [F(3), F(3)]],
         [[F(3), F(3)]], [[F(3), F(0)], [F(3), F(3)]], [[F(3), F(0)]]],
        [[[F(0), F(-2)], [F(3), F(0)]], [[F(3), F(0)]], [[F(3), F(0)]],
         [[F(3), F(0)], [F(-1), F(0)]], [[F(3), F(0)]]])
    check_padded(data, paper(data, attention="softmax", exact=False, seed=2), 2)


def check_padded(data, model, k: int) -> None:
    """The model widened by k zero coordinates gives the original outputs and predictions,
    zero-padded: exactly for rational hardmax models, else within float64's own errors."""
    wide = widen(model, k)
    exact = model.exact and model.attention == "hardmax"
    xs = data.fractions()[0] if exact else data.floats()[0]
    arithmetic = "exact" if exact else "float"
    scale = data.coordinate_scale() or 1
    tol = 1e-12 * scale + _float_spread(model, wide, xs, k, scale)
    for o, w in zip(ef.forward(model, xs, arithmetic), ef.forward(wide, xs, arithmetic),
                    strict=True):
        assert w.shape == (o.shape[0], data.d + k)
        if exact:
            assert same_rows(w, padded(o, k))
        else:
            assert np.abs(np.asarray(w, float) - padded(o, k)).max() <= tol
    # predict drops the widened coordinates, exactly 0 on every output: the original's tokens
    p0, p1 = ef.predict(model, xs[0]), ef.predict(wide, xs[0])
    assert p1.shape[1] == p0.shape[1] == data.d
    if exact:
        assert same_rows(p1, p0)
    else:  # float rounding may split or merge near-equal rows: each is near one of the others
        near = np.abs(np.asarray(p1, float)[:, None] - np.asarray(p0, float)[None]).max(axis=2)
        assert (near.min(axis=1) <= tol).all()
    if not model.exact and model.attention == "hardmax":
        out, rad = enclose(wide, data.floats()[0], None)
        ref, rad0 = enclose(model, data.floats()[0], None)
        for o, r, o0, r0 in zip(out, rad, ref, rad0, strict=True):
            # both enclose one exact value (BLAS may sum the wider rows in another order)
            assert (np.abs(o - padded(o0, k)) <= r + padded(r0, k)).all()
            # radii: rounding bounds grow with D
            assert (r[:, : data.d] <= 4 * r0 + 1e-300).all() and \
                (r[:, data.d:] <= 4 * r0.max() + 1e-300).all()


def _float_spread(model, wide, xs, k: int, scale: float, run=ef.forward) -> float:
    """For a softmax model: the narrow and the wide float64 pass's largest distances from a
    60-digit pass of the same stored numbers (``run``: the set or the causal pass), added
    (their difference is at most that, plus the 60-digit passes' own); 0 for a hardmax
    model. The two float
    passes may sum a row in another order (BLAS picks kernels by shape, with or without FMA),
    and a hat softmax model can amplify that one rounding far beyond 10⁻¹²·scale, so they can
    only be held to their own errors. The 60-digit passes, free of that, must agree to
    10⁻⁴⁰·scale: the widening itself changes nothing."""
    if model.attention != "softmax":
        return 0.0
    narrow = wider = 0.0
    for o, w, om, wm in zip(run(model, xs, "float"), run(wide, xs, "float"),
                            run(model, xs, "mp", dps=60), run(wide, xs, "mp", dps=60),
                            strict=True):
        d = om.shape[1]
        gap = max(abs(v) for v in np.concatenate([(wm[:, :d] - om).ravel(), wm[:, d:].ravel()]))
        assert gap <= 1e-40 * scale  # in mpmath: a float conversion would round both
        om, wm = np.asarray(om, dtype=float), np.asarray(wm, dtype=float)
        narrow = max(narrow, float(np.abs(o - om).max()))
        wider = max(wider, float(np.abs(w - wm).max()))
    return narrow + wider


def test_data_wider_than_the_model_are_refused(tmp_path, capsys):
    data = builtin.shared_pool(N=3, d=3, pool=5, n_max=3, m_max=2, seed=0)
    model = paper(data)
    wide_data = data.padded(4)
    for run in (lambda: ef.verify(model, wide_data), lambda: ef.forward(model, wide_data.inputs),
                lambda: ef.predict(model, wide_data.inputs[0])):
        with pytest.raises(ValueError, match="d = 4, more than the model's width d_model = 3"):
            run()
    ef.save_model(model, tmp_path / "m.json")
    (tmp_path / "data.json").write_text(json.dumps(wide_data.to_json_dict()))
    assert main(["verify", str(tmp_path / "m.json"), str(tmp_path / "data.json")]) == 2
    assert "d = 4, more than the model's width d_model = 3" in capsys.readouterr().err


def test_files_and_the_cli_keep_the_width(tmp_path, capsys):
    data = builtin.shared_pool(N=4, d=2, pool=6, n_max=3, m_max=2, seed=3)
    model = widen(paper(data), 2)
    ef.save_model(model, tmp_path / "m.json")
    floats = widen(paper(data, exact=False), 2)
    ef.save_model(floats, tmp_path / "m.npz")
    for path, ref in (("m.json", model), ("m.npz", floats)):
        again = ef.load_model(tmp_path / path)
        assert again.d == 4 and again.parameters() == ref.parameters()
    (tmp_path / "data.json").write_text(json.dumps(data.to_json_dict()))
    assert main(["verify", str(tmp_path / "m.json"), str(tmp_path / "data.json")]) == 0
    assert "zero-padded to d_model = 4" in capsys.readouterr().out
    assert main(["info", str(tmp_path / "m.json")]) == 0
    assert f"{model.n_blocks} × 4 × 4 × 1" in capsys.readouterr().out


# ------------------------------------------------------------------------------ causal models
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(causal_models(), st.integers(1, 2))
def test_a_widened_causal_model_verifies_and_runs_as_the_original(case, k):
    data, model = case
    wide = widen(model, k)
    r0, r1 = ef.verify(model, data), ef.verify(wide, data)
    assert r1.verdict() == r0.verdict() and r1.ok
    assert r1.exact_equal == r0.exact_equal and r1.first_failure is None
    scale = r0.coordinate_scale or 1  # errors of the plain float64 passes: their own at most
    spread = _float_spread(model, wide, data.floats()[0], k, scale, forward_causal)
    assert np.allclose(r1.errors, r0.errors, rtol=0, atol=1e-12 * scale + spread)
    assert (r1.d, r1.d_model) == (data.d, model.d + k)
    assert ("d_model" in r0.to_dict()) == (model.d > data.d)  # keyed models own coordinates
    exact = model.exact and model.attention == "hardmax"
    xs = data.fractions()[0] if exact else data.floats()[0]
    arithmetic = "exact" if exact else "float"
    for o, w in zip(forward_causal(model, xs, arithmetic), forward_causal(wide, xs, arithmetic),
                    strict=True):
        if exact:
            assert same_rows(w, padded(o, k))
        else:
            assert np.abs(np.asarray(w, float) - padded(o, k)).max() <= 1e-9
    leaky = leak_into_extra(wide, data.d)
    outs = forward_causal(leaky, xs, arithmetic)
    assume(any(np.abs(np.asarray(o[kn, data.d], dtype=float)).max() > 1e-6
               for o, kn in zip(outs, data.known, strict=True)))
    assert not ef.verify(leaky, data).ok


def test_generation_with_a_narrow_prompt_and_vocabulary(tmp_path, capsys):
    texts, alphabet = ["0abcab", "1cabba", "2bacab"], "012abc"
    vocab = np.array([[k - 2, (5 * k) % 7 - 3] for k in range(len(alphabet))])
    vec = {c: [int(v) for v in vocab[j]] for j, c in enumerate(alphabet)}
    data = CausalDataset.from_arrays([[vec[c] for c in t] for t in texts],
                                     [[vec[c] for c in t[1:]] + [None] for t in texts])
    for kw in ({}, {"attention": "softmax"}, {"exact": False}):
        model = paper(data, **kw)
        wide = widen(model, 3)
        for j, t in enumerate(texts):
            got = generate(wide, data.inputs[j][:1], len(t) - 1, vocabulary=vocab)
            assert got.shape == (len(t) - 1, 2)
            assert same_rows(got, generate(model, data.inputs[j][:1], len(t) - 1,
                                           vocabulary=vocab))
            free = generate(wide, data.inputs[j][:2], 1)  # no vocabulary: the output in R^D
            ref = generate(model, data.inputs[j][:2], 1)
            assert free.shape == (1, 5)
            assert np.abs(np.asarray(free, float) - padded(np.asarray(ref, float), 3)).max() \
                <= 1e-9
        with pytest.raises(ValueError, match="d = 6, more than the model's width d_model = 5"):
            generate(wide, np.zeros((1, 6)), 1)
        ef.save_model(wide, tmp_path / "wide.json")
        (tmp_path / "vocab.json").write_text(json.dumps(
            {c: [int(v) for v in vec[c]] for c in alphabet}))
        assert main(["generate", str(tmp_path / "wide.json"), "--prompt", "0",
                     "--vocabulary", str(tmp_path / "vocab.json")]) == 0
        assert capsys.readouterr().out.strip() == texts[0][1:]
        dec0, dec1 = Decoder(model), Decoder(wide)
        for x in data.inputs[0]:  # the decoder itself takes d-dimensional tokens
            o0, o1 = dec0.push(x), dec1.push(x)
            assert np.abs(np.asarray(o1, float) - padded(np.asarray(o0, float)[None], 3)[0]
                          ).max() <= 1e-9


def test_plot_draws_narrow_data_in_the_models_space(tmp_path):
    pytest.importorskip("matplotlib")
    from exactformer.tools.plot import plot_phases
    data = builtin.shared_pool(N=3, d=2, pool=5, n_max=3, m_max=2, seed=1)
    model = paper(data)
    fig = plot_phases(widen(model, 1), data, tmp_path / "wide.png")
    assert "(data in R^2, zero-padded)" in fig.get_suptitle()
    with pytest.raises(ValueError, match="d = 3, more than the model's width d_model = 2"):
        plot_phases(model, data.padded(3), tmp_path / "bad.png")
    assert not (tmp_path / "bad.png").exists()


# ------------------------------------------------------------------------------ exports
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(models(), st.integers(1, 2))
def test_torch_layouts_run_narrow_data(case, k):
    et = pytest.importorskip("exactformer.export")
    data, model = case
    wide = widen(model, k)
    xs = data.floats()[0]
    for layout in et.LAYOUTS:
        m0, m1 = et.convert(model, layout), et.convert(wide, layout)
        for o, w in zip(et.apply(m0, xs), et.apply(m1, xs), strict=True):
            assert w.shape[1] == data.d + k
            assert np.abs(w - padded(o, k)).max() <= 1e-9 * (data.coordinate_scale() or 1)
        assert abs(et.max_error(m1, data) - et.max_error(m0, data)) <= 1e-9
    v0, v1 = et.float32_verdict(model, data), et.float32_verdict(wide, data)
    assert v1.interpolates == v0.interpolates
    assert abs(v1.error_float64 - v0.error_float64) <= 1e-9


def test_transformer_lens_and_the_hub_folder_with_narrow_data(tmp_path):
    et = pytest.importorskip("exactformer.export")
    pytest.importorskip("transformer_lens")
    data = builtin.shared_pool(N=4, d=3, pool=6, n_max=3, m_max=2, seed=2)
    model = paper(data, exact=False)
    wide = widen(model, 2)
    v0 = et.lens_verdict(et.to_lens(model), data)
    v1 = et.lens_verdict(et.to_lens(wide), data)
    assert v1.interpolates and v0.interpolates and abs(v1.error - v0.error) <= 1e-9
    with pytest.raises(ValueError, match="d = 6, more than the model's width d_model = 5"):
        et.lens_verdict(et.to_lens(wide), data.padded(6))
    module = et.to_torch(wide)
    module.save_pretrained(tmp_path / "hub", data=data, report=ef.verify(wide, data))
    card = (tmp_path / "hub" / "README.md").read_text()
    assert "| token dimension d | 3 (data in R^3, zero-padded to d_model = 5) |" in card
    plain = tmp_path / "plain"
    et.to_torch(model).save_pretrained(plain, data=data)
    assert "| token dimension d | 3 |" in (plain / "README.md").read_text()
    with pytest.raises(ValueError, match="d = 6, more than the model's width d_model = 5"):
        module.save_pretrained(tmp_path / "bad", data=data.padded(6))
    assert not (tmp_path / "bad").exists()  # nothing half-written


def test_training_loss_of_a_wider_module_on_narrow_data():
    pytest.importorskip("torch")
    et = pytest.importorskip("exactformer.export")
    from exactformer.tools import train
    data = builtin.shared_pool(N=3, d=2, pool=5, n_max=3, m_max=2, seed=4)
    model = paper(data, exact=False)
    def loss(model) -> float:
        return train.loss(et.to_rho_eta(model), data).detach().item()

    assert loss(model) <= 1e-12 and loss(widen(model, 2)) <= 1e-12
    assert loss(leak_into_extra(widen(model, 2), 2)) > 1e-6  # the extra coordinates count
