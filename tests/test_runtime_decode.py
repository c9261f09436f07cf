"""Decoding proofs (docs/numerics.md#decoding-to-a-vocabulary): every text model PROVED
FAITHFUL by decoding is run here by evaluators of the test's own — float32 or bfloat16 stores
with float32 accumulation, every dot product in a random order or a random pairwise tree — and
each constrained position must decode to its target by the project's decoder. The margin
itself is checked against exact rational arithmetic on boxes built next to the decision
boundary, and a tampered weight or vocabulary entry never keeps a proof."""

from __future__ import annotations

import json
import warnings
from fractions import Fraction
from itertools import product

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import exactformer as ef
from exactformer.cli import main as cli_main
from exactformer.data import DatasetError
from exactformer.data.text import text_embedding, vocabulary_json
from exactformer.modelio import save_model
from exactformer.tools.decode import nearest
from exactformer.verification.runtime_decode import decoding_margins

F32 = np.float32


# ------------------------------------------------------------------------------ the test's own
def _store(a, fmt: str) -> np.ndarray:
    """float32, or bfloat16 (float32's top 16 bits, rounded to nearest even), as float32."""
    a = np.asarray(np.asarray(a, dtype=np.float64), dtype=F32)
    if fmt == "float32":
        return a
    bits = a.view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.astype(np.uint32).view(F32)


class Runtime:
    """Every value stored in ``fmt``, every operation in float32, each dot product summed in a
    random permutation of its terms or a random pairwise tree (drawn per product)."""

    def __init__(self, fmt: str, seed: int):
        self.fmt, self.rng = fmt, np.random.default_rng(seed)

    def s(self, a):
        return _store(a, self.fmt)

    def dot(self, A, B):
        A, B = self.s(A), self.s(B)
        terms = [A[..., :, j, None] * B[..., j, None, :] for j in range(A.shape[-1])]
        terms = [terms[i] for i in self.rng.permutation(len(terms))]
        if not terms:
            return self.s(np.zeros(A.shape[:-1] + B.shape[-1:]))
        if self.rng.random() < 0.5:
            while len(terms) > 1:
                terms = [terms[i] + terms[i + 1] if i + 1 < len(terms) else terms[i]
                         for i in range(0, len(terms), 2)]
        acc = terms[0]
        for t in terms[1:]:
            acc = acc + t
        return self.s(acc)

    def run(self, model, x) -> np.ndarray:
        s, n = self.s, len(x)
        X = np.zeros((n, model.d))
        X[:, :x.shape[1]] = x
        X = s(X)
        if model.positions is not None:
            X = s(X + s(np.asarray(model.positions[:n], dtype=float)))
        with np.errstate(all="ignore"):
            for blk in model.blocks:
                if blk.ff is not None:
                    ff = blk.ff
                    Z = s(self.dot(X, s(ff.U).T) + s(ff.b))
                    X = s(s(s(float(ff.eta)) * X) + self.dot(np.maximum(Z, 0), s(ff.W).T))
                if blk.sa is not None and not blk.sa.is_identity():
                    X = self._attention(X, blk.sa, model)
        return X.astype(np.float64)

    def _attention(self, X, sa, model):
        s, n = self.s, len(X)
        out = s(s(float(sa.rho)) * X)
        for h in sa.heads:
            S = s(self.dot(X, s(h.A.c)[:, None]) * self.dot(X, s(h.A.a)[:, None]).T)
            if float(h.A.alpha) != 0:
                S = s(S + s(s(float(h.A.alpha)) * self.dot(X, X.T)))
            S = np.where(np.tril(np.ones((n, n), bool)), S, -np.inf)
            if model.attention == "hardmax":
                hit = (S == S.max(axis=1, keepdims=True)).astype(F32)
                weights = s(hit / hit.sum(axis=1, keepdims=True))
            else:
                tau = F32(1 if model.tau is None else float(model.tau))
                E = s(np.exp(s(s(S / tau) - s(S / tau).max(axis=1, keepdims=True))))
                weights = s(E / self.dot(E, np.ones((n, 1))))
            Y = self.dot(weights, X)
            out = s(out + s(s(float(h.V.beta)) * Y))
            out = s(out + s(self.dot(Y, s(h.V.q)[:, None]) * s(h.V.p)))
        return out


def wrong_decodes(model, data, fmt: str, seed: int) -> int:
    """Constrained positions that a :class:`Runtime` pass does not decode to their targets."""
    rt, wrong = Runtime(fmt, seed), 0
    for x, y, k in zip(*data.floats(), data.known, strict=True):
        out = rt.run(model, x)
        wrong += sum(nearest(data.vocabulary, out[i]) != nearest(data.vocabulary, y[i])
                     for i in np.flatnonzero(k))
    return wrong


def torch_wrong_decodes(model, data) -> int:
    """Constrained positions that the torch module in bfloat16 (``ff="dense"``, the graph
    proved) does not decode to their targets; 0 without torch."""
    try:
        import torch

        from exactformer import export as et
    except ImportError:
        return 0
    outs = et.apply(et.to_torch(model, dtype=torch.bfloat16, ff="dense"), data.floats()[0])
    return sum(nearest(data.vocabulary, np.asarray(o[i], dtype=float)) !=
               nearest(data.vocabulary, y[i])
               for o, y, k in zip(outs, data.floats()[1], data.known, strict=True)
               for i in np.flatnonzero(k))


def _build(data, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return ef.compile(data, **kw)


@st.composite
def texts(draw):
    """Random texts (distinct first characters, so they never disagree) over a random
    vocabulary: small integer vectors, or those plus Gaussian noise, with unused symbols."""
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 20)))
    n, size, d = draw(st.integers(1, 3)), draw(st.integers(2, 6)), draw(st.integers(2, 5))
    alphabet = "abcdefghij"[:max(size, n) + draw(st.integers(0, 2))]
    embedding = text_embedding(alphabet, d, seed=int(rng.integers(1000)))
    if draw(st.booleans()):
        embedding = {c: v + 0.3 * rng.standard_normal(d) for c, v in embedding.items()}
    seqs = [alphabet[j] + "".join(rng.choice(list(alphabet[:size]), int(rng.integers(1, 9))))
            for j in range(n)]
    return ef.CausalDataset.from_text(seqs, embedding)


# ------------------------------------------------------------------------------ properties
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=texts(), attention=st.sampled_from(["hardmax", "softmax"]),
       fmt=st.sampled_from(["float32", "bfloat16"]))
def test_every_proved_decoding_survives_random_orders(data, attention, fmt):
    model = _build(data, attention=attention, exact=False)
    v = ef.prove_runtime(model, data, fmt)
    assert v.criterion == "decoding" and v.verdict in (f"PROVED FAITHFUL IN {fmt}", "FAILED",
                                                       "UNDECIDED")
    if v.ok:
        assert v.margin > 0 and v.proved == v.checked
        for seed in range(3):
            assert wrong_decodes(model, data, fmt, seed) == 0, v.table()
        if fmt == "bfloat16":
            assert torch_wrong_decodes(model, data) == 0, v.table()
    elif v.verdict == "FAILED":
        assert "decodes" in v.witness


@st.composite
def near_boundary(draw):
    """A vocabulary, a target t and a box whose nearest point to another entry v lies on
    their bisector, moved either way by a few ulps up to 2^-8 of its size; sometimes a point,
    sometimes with large coordinates beyond the vocabulary's (which only the decoder's
    float64 sums see)."""
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 20)))
    V, d = draw(st.integers(2, 4)), draw(st.integers(1, 3))
    vocab = rng.integers(-4, 5, (V, d)).astype(float)
    if draw(st.booleans()):
        vocab += rng.standard_normal((V, d)) * 0.5
    k, j = rng.choice(V, 2, replace=False)
    t, v = vocab[k], vocab[j]
    assume(not np.array_equal(t, v))
    r = np.zeros(d) if draw(st.booleans()) else np.abs(rng.standard_normal(d)) * 0.1
    w = t - v
    # on the bisector: y·w = (|t|² − |v|²)/2 at the box's corner nearest v
    corner = (t + v) / 2
    m = corner + r * np.sign(w)
    step = draw(st.integers(-8, 8)) * 2.0 ** draw(st.integers(-56, -8))
    m = m + step * (np.abs(m).max() + 1) * w / np.abs(w).max()
    extra = draw(st.sampled_from([0, 1, 2]))
    big = float(draw(st.sampled_from([0.0, 1.0, 1e3, 1e6])))
    Ym = np.concatenate([m, np.full(extra, big)])[None]
    Yr = np.concatenate([r, np.zeros(extra)])[None]
    return vocab, Ym, Yr, int(k)


def _exact_min(vocab, m, r, k, u) -> Fraction:
    """The least over the box m ± r of |y − u|² − |y − t|², exactly."""
    t, v = (list(map(Fraction, vocab[i])) for i in (k, u))
    return sum(2 * Fraction(mj) * (tj - vj) - 2 * Fraction(rj) * abs(tj - vj) + vj * vj - tj * tj
               for mj, rj, tj, vj in zip(m, r, t, v, strict=False))


@settings(max_examples=400, deadline=None)
@given(case=near_boundary())
def test_a_positive_margin_is_exactly_right(case):
    """Margin > 0 only where every entry is exactly farther from every point of the box than
    the target, and the float64 decoder picks the target at the box's representable corners."""
    vocab, Ym, Yr, k = case
    margin = decoding_margins(vocab, Ym, Yr, np.array([k]))[0]
    if not margin > 0:
        return
    d = vocab.shape[1]
    for u in range(len(vocab)):
        if u != k:
            assert _exact_min(vocab, Ym[0, :d], Yr[0, :d], k, u) > 0
    for signs in product((-1, 0, 1), repeat=Ym.shape[1]):
        y = Ym[0] + np.array(signs) * Yr[0]
        exact = all(Fraction(a) == Fraction(b) + s * Fraction(c)
                    for a, b, s, c in zip(y, Ym[0], signs, Yr[0], strict=True))
        if exact:
            assert nearest(vocab, y) == k


def test_boxes_that_cannot_be_proved():
    """A box over the boundary, a nan or inf box, a target absent (−1) and a duplicate entry
    are never proved."""
    vocab = np.array([[0.0, 0.0], [2.0, 0.0], [0.0, 3.0]])
    Ym = np.array([[0.5, 0.0], [0.9, 0.0], [np.nan, 0.0], [np.inf, 0.0], [0.0, 0.0],
                   [0.0, 0.0]])
    Yr = np.array([[0.4, 0.0], [0.2, 0.0], [0.0, 0.0], [0.0, 0.0], [np.inf, 0.0], [0.0, 0.0]])
    m = decoding_margins(vocab, Ym, Yr, np.array([0, 0, 0, 0, 0, -1]))
    assert m[0] > 0 and not (m[1:] > 0).any()
    dup = np.array([[0.0, 0.0], [2.0, 0.0], [0.0, 0.0]])
    assert not decoding_margins(dup, Ym[:1], Yr[:1], np.array([0]))[0] > 0


def test_repeated_boxes_are_bounded_once_each_with_its_own_target():
    """Equal boxes are bounded once (a text repeats them): the margins of a stack with
    repeats equal each box's alone, and one box with two targets gets two margins."""
    rng = np.random.default_rng(5)
    vocab = rng.integers(-4, 5, (6, 3)).astype(float)
    Ym = np.repeat(vocab[:3] + 0.01, 4, axis=0)
    Yr = np.full(Ym.shape, 0.01)
    Yr[::5] = 0.3
    index = np.tile([0, 1, 2, 0], 3)
    alone = [decoding_margins(vocab, Ym[i:i + 1], Yr[i:i + 1], index[i:i + 1])[0]
             for i in range(len(Ym))]
    np.testing.assert_array_equal(decoding_margins(vocab, Ym, Yr, index), alone)
    assert len(set(alone)) > 3 and alone[0] != alone[1]


def test_vocabularies_the_proof_refuses():
    data = ef.CausalDataset.from_text("abcab", {c: np.array([i, 1.0]) for i, c in
                                               enumerate("abc")})
    assert data.vocabulary.shape == (3, 2)
    for bad, why in [([[0, 1], [1, 1], [0, 1]], "are equal"), ([[0, 1], [1, 1]], "not a voc"),
                     ([[Fraction(1, 3), 1], [0, 1], [1, 1], [2, 1]], "float64"),
                     ([[0, 1, 0]], "V×2")]:
        with pytest.raises(DatasetError, match=why):
            data.with_vocabulary(bad)


# ------------------------------------------------------------------------------ tampering
def _generic_text(seed=3, chars=300):
    """One text over generic float vectors: bfloat16 outputs miss their targets by far more
    than the tolerance but decode right."""
    rng = np.random.default_rng(seed)
    text = "".join(rng.choice(list("abcdefgh"), size=chars))
    emb = {c: v + 0.3 * rng.standard_normal(8) for c, v in text_embedding(text + "xy",
                                                                          8).items()}
    return text, emb, ef.CausalDataset.from_text(text, emb)


def test_a_vocabulary_entry_moved_next_to_a_target_ends_the_proof():
    text, emb, data = _generic_text()
    model = _build(data, exact=False)
    v = ef.prove_runtime(model, data, "bfloat16")
    assert v.ok and v.bound > v.tolerance  # proved by decoding, not by distance
    emb["x"] = emb[text[1]] + v.bound * data.coordinate_scale() / 4
    moved = ef.prove_runtime(model, ef.CausalDataset.from_text(text, emb), "bfloat16")
    assert not moved.ok and moved.margin <= 0


def test_a_tampered_weight_ends_the_proof():
    """The smallest change of one written coordinate (either way) at which a float32 pass
    of the test decodes some position wrong: the float32 proof must not stand."""
    _, _, data = _generic_text(chars=120)
    model = _build(data, exact=False)
    assert ef.prove_runtime(model, data, "float32").ok
    ff = model.blocks[0].ff
    u = int(np.flatnonzero(np.abs(ff.W[:8]).sum(axis=0))[0])
    j = int(np.argmax(np.abs(ff.W[:8, u])))
    base = float(ff.W[j, u])
    for grow in np.concatenate([np.linspace(-0.05, -3, 60), np.linspace(0.05, 3, 60)]):
        ff.W[j, u] = base * (1 + grow)
        if wrong_decodes(model, data, "float32", 0):
            break
    else:
        pytest.fail("no change decodes wrong")
    assert not ef.prove_runtime(model, data, "float32").ok


# ------------------------------------------------------------------------------ reports
def test_cli_and_hub_say_decoding(tmp_path, capsys):
    text, emb, data = _generic_text(chars=200)
    save_model(_build(data, exact=False), tmp_path / "m.json")
    (tmp_path / "d.json").write_text(json.dumps(data.to_json_dict()))
    (tmp_path / "v.json").write_text(vocabulary_json(emb))
    args = ["verify", str(tmp_path / "m.json"), str(tmp_path / "d.json"), "--runtime",
            "bfloat16", "--json", str(tmp_path / "r.json")]
    assert cli_main(args) == 1  # by distance: 0.3-sized noise misses 1e-5 in bfloat16
    assert json.loads((tmp_path / "r.json").read_text())["runtimes"][0]["criterion"] == \
        "distance"
    assert cli_main([*args, "--vocabulary", str(tmp_path / "v.json")]) == 0
    assert cli_main([*args[:3], "--vocabulary", str(tmp_path / "v.json")]) == 2  # no --runtime
    out = capsys.readouterr().out
    assert "decodes to its target" in out and "PROVED FAITHFUL IN bfloat16" in out
    doc = json.loads((tmp_path / "r.json").read_text())["runtimes"][0]
    assert doc["criterion"] == "decoding" and doc["margin"] > 0 and doc["ok"]
    pytest.importorskip("torch")
    from exactformer import export as et

    et.to_torch(ef.load_model(tmp_path / "m.json")).save_pretrained(tmp_path / "hub", data=data)
    config = json.loads((tmp_path / "hub" / "config.json").read_text())
    assert config["runtime_proof_criterion"] == "decoding"
    assert config["runtime_proofs"]["bfloat16"] == "PROVED FAITHFUL IN bfloat16"
    assert "decodes every constrained position" in (tmp_path / "hub" / "README.md").read_text()
