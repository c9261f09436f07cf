"""Position keys (construct/position_keys.py) and key layers (evaluate/keys.py).

Every claim is checked against reference passes written here, apart from the package's
evaluators: a dense pass in Fractions (exact) and a plain dense NumPy pass in float32 /
float16, each FF as η·x + W·relu(U·x + b) with the positions added to the zero-padded tokens.
A key lookup that went wrong would be a wrong verdict, so the evaluator is also fed rows made
to sit on the edge of the lookup's argument (other keys, scaled keys, ties, near keys).
"""

from __future__ import annotations

import math
from fractions import Fraction
from itertools import product

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import exactformer as ef
from exactformer.construct.position_keys import code_size, code_words, keyed_positions
from exactformer.evaluate import enclose, forward_causal, key_layers, keys
from exactformer.model import FF, Block, Transformer
from exactformer.tools.decode import Decoder, generate

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ----------------------------------------------------------------------- reference passes
def frac(a) -> np.ndarray:
    """``a`` (floats, ints or Fractions) as an object array of exact Fractions."""
    def one(v):
        return Fraction(int(v)) if isinstance(v, (int, np.integer)) else Fraction(v)
    return np.vectorize(one, otypes=[object])(np.asarray(a, dtype=object))


def mp_fraction(v) -> Fraction:
    """An mpmath number as the exact binary fraction it is (``man_exp`` drops the sign)."""
    man, exp = v.man_exp
    return (-1 if v < 0 else 1) * Fraction(int(man)) * Fraction(2) ** int(exp)


def pad(x: np.ndarray, D: int, zero) -> np.ndarray:
    x = np.asarray(x, dtype=object if zero == Fraction(0) else None)
    return np.concatenate([x, np.full((len(x), D - x.shape[1]), zero, dtype=x.dtype)], axis=1)


def exact_pass(model, x) -> list[np.ndarray]:
    """The rows after the positions and after every block, in Fractions."""
    X = pad(frac(x), model.d, Fraction(0))
    if model.positions is not None:
        X = X + frac(model.positions)[: len(X)]
    out = [X]
    for blk in model.blocks:
        assert blk.sa is None
        ff = blk.ff
        U, b, W = frac(ff.U), frac(ff.b), frac(ff.W)
        Z = np.vectorize(lambda v: max(v, Fraction(0)), otypes=[object])(X.dot(U.T) + b)
        X = X * Fraction(ff.eta) + Z.dot(W.T)
        out.append(X)
    return out


def float_pass(model, x, dtype) -> list[np.ndarray]:
    """The same pass with every parameter, token and position cast to ``dtype``."""
    def cast(a):
        return np.asarray(np.asarray(a, dtype=float), dtype=dtype)

    with np.errstate(all="ignore"):
        X = cast(pad(np.asarray(x, dtype=float), model.d, 0.0))
        if model.positions is not None:
            X = X + cast(model.positions)[: len(X)]
        out = [X]
        for blk in model.blocks:
            ff = blk.ff
            Z = np.maximum(X @ cast(ff.U).T + cast(ff.b), dtype(0))
            X = dtype(float(ff.eta)) * X + Z @ cast(ff.W).T
            assert X.dtype == dtype
            out.append(X)
    return out


def as_floats(rows) -> np.ndarray:
    return np.array([[float(v) for v in r] for r in rows])


def float_ff(ff: FF) -> FF:
    return FF(float(ff.eta), *(np.asarray(a, dtype=float) for a in (ff.U, ff.b, ff.W)))


def close(a, exact, tol: float, size=None) -> bool:
    """|a − exact| ≤ tol·size coordinatewise; size: the row's largest exact |value| (or 1)
    unless given."""
    a, exact = np.asarray(a, dtype=float), frac(exact)
    if size is None:
        size = max([abs(v) for v in exact.flat] + [Fraction(1)])
    return all(abs(Fraction(float(u)) - v) <= Fraction(tol) * size
               for u, v in zip(a.flat, exact.flat, strict=True))


# ------------------------------------------------------------------------------- data
@st.composite
def keyed_data(draw, max_n=60, fractions=True):
    """Causal data a position lookup serves: one text, or 2–3 sequences (of different
    lengths) that agree wherever they are constrained and differ elsewhere; a small
    vocabulary (tokens repeat), targets the next token or random, some null."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    d, V, n = draw(st.integers(2, 16)), draw(st.integers(1, 6)), draw(st.integers(1, max_n))
    if fractions and draw(st.booleans()):
        vocab = frac(rng.integers(-9, 10, (V, d))) / frac(rng.integers(1, 8, (V, d)))
    else:
        vocab = rng.standard_normal((V, d)) * 10.0 ** draw(st.integers(-3, 3))
    x = vocab[rng.integers(0, V, n)]
    y = np.concatenate([x[1:], vocab[:1]]) if draw(st.booleans()) else vocab[rng.integers(0, V, n)]
    null = draw(st.sampled_from([0.0, 0.2, 0.6]))
    seqs = []
    for j in range(draw(st.sampled_from([1, 1, 2, 3]))):
        m = n if j == 0 else int(rng.integers(1, n + 1))
        known = rng.random(m) >= null
        tokens = np.array(x[:m])
        other = ~known & (rng.random(m) < 0.5)
        tokens[other] = vocab[rng.integers(0, V, int(other.sum()))]
        seqs.append((tokens, [y[i].tolist() if known[i] else None for i in range(m)]))
    if all(t is None for _, ts in seqs for t in ts):
        seqs[0][1][0] = y[0].tolist()
    return ef.CausalDataset.from_arrays([t.tolist() for t, _ in seqs], [ts for _, ts in seqs])


def check_targets_exact(model, data) -> bool:
    """The exact pass of the model meets (target, 0…0) at every constrained position: exactly
    for rational parameters; for float64 ones up to the rounding of (target − token)/(c/2),
    at most 2^-53·|target − token| ≤ 2^-52·scale, with the key coordinates exactly 0.
    Returns whether every one is met exactly."""
    limit = Fraction(2) ** -52 * Fraction(data.coordinate_scale())
    equal = True
    for x, y, k in zip(*data.fractions(), data.known, strict=True):
        out = exact_pass(model, x)[-1][k]
        equal &= bool((out == pad(y, model.d, Fraction(0))[k]).all())
        assert (out[:, data.d:] == 0).all()
        assert max((abs(v) for v in (out[:, : data.d] - y[k]).flat), default=0) <= limit
    assert equal or not model.exact
    return equal


# ------------------------------------------------------------------ 1. the construction
@settings(max_examples=40, **SETTINGS)
@given(keyed_data(), st.sampled_from([4, 8, 64]), st.sampled_from(["hardmax", "softmax"]),
       st.booleans())
def test_keyed_construction_is_exact_and_small(data, width, attention, exact):
    assume(exact or not data.exact)
    model = ef.compile(data, attention=attention, exact=exact, width=width)
    rec = model.record
    xs, ys = data.fractions()
    found = keyed_positions(xs, ys, data.known)
    keyed = [i for i, p in enumerate(found) if p is not None]
    q, w = code_size(len(keyed))
    assert rec.position_code is not None and rec.R == 0 and rec.moves == len(keyed)
    assert (rec.position_code["coordinates"], rec.position_code["weight"]) == (q, w)
    assert model.d == data.d + q and all(b.sa is None for b in model.blocks)
    assert model.n_blocks == math.ceil(len(keyed) / width) and model.max_width() <= width
    P = frac(model.positions)
    assert len(P) >= max(data.lengths)
    assert model.n_params() <= model.n_blocks * (width * (2 * model.d + 1) + 1)
    # the keys: c·σ_i, σ_i distinct of weight w, c a power of two at the keyed data's top
    c = Fraction(rec.position_code["scale"])
    top = max(abs(v) for i in keyed for v in (*found[i][0], *found[i][1]))
    assert c == 1 if top == 0 else c <= top < 2 * c
    assert 1 in (c.numerator, c.denominator) and (c.numerator * c.denominator).bit_count() == 1
    assert (P[:, : data.d] == 0).all()
    sig = P[keyed, data.d:] / c
    assert len({tuple(s) for s in sig}) == len(keyed)
    assert all(set(s) <= {-1, 0, 1} and sum(v != 0 for v in s) == w for s in sig)
    unkeyed = [i for i in range(len(P)) if i not in keyed]
    assert (P[unkeyed] == 0).all()
    equal = check_targets_exact(model, data)
    report = ef.verify(model, data)
    assert report.ok and report.proved >= exact and (equal or not report.proved)


@settings(max_examples=20, **SETTINGS)
@given(keyed_data(), st.booleans(), st.data())
def test_softmax_without_attention_is_verified_as_its_hardmax_twin(data, exact, draws):
    """A position-keys model has no attention layer, so softmax and hardmax compute one
    function: verify decides it by the hardmax path (exact pass, or enclosures), reports it
    as softmax, and a moved output weight of a rational model FAILS, never PROVED."""
    assume(exact or not data.exact)
    model = ef.compile(data, attention="softmax", exact=exact)
    twin = Transformer(d=model.d, attention="hardmax", blocks=model.blocks, exact=model.exact,
                       causal=True, positions=model.positions)
    report, want = ef.verify(model, data), ef.verify(twin, data)
    assert report.attention == "softmax" and report.ok
    assert (report.verdict(), report.errors) == (want.verdict(), want.errors)
    assume(exact and model.n_blocks)
    i = draws.draw(st.integers(0, model.n_blocks - 1))
    ff = model.blocks[i].ff
    W = ff.W.copy()
    W[0, draws.draw(st.integers(0, ff.width - 1))] += Fraction(1, 1024)
    blocks = list(model.blocks)
    blocks[i] = Block(FF(ff.eta, ff.U, ff.b, W), None)
    moved = Transformer(d=model.d, attention="softmax", blocks=blocks, exact=True, causal=True,
                        positions=model.positions)
    assert not ef.verify(moved, data).proved


def test_code_size_is_the_smallest_code():
    for n in range(1, 300):
        q, w = code_size(n)
        assert math.comb(q, w) * 2**w >= n
        assert all(math.comb(q, v) * 2**v < n for v in range(1, w))
        assert all(math.comb(q - 1, v) * 2**v < n for v in range(1, q))
        words = code_words(n, q, w)
        assert words.shape == (n, q) and len({tuple(r) for r in words}) == n
        assert ((words != 0).sum(axis=1) == w).all() and set(words.flat) <= {-1, 0, 1}


# ------------------------------------------------------------- 2. float32 faithfulness
@settings(max_examples=40, **SETTINGS)
@given(keyed_data(fractions=False), st.sampled_from([4, 8, 64]),
       st.sampled_from(["hardmax", "softmax"]))
def test_plain_float32_and_float16_passes_hit_the_targets(data, width, attention):
    """The moved coordinate is fl(fl(x) + fl(W)·z) with z = relu(…) a power of two computed
    exactly (the key sums are small integers times powers of two) and every other unit adding
    exactly 0: error ≤ u·(|x| + |t − x| + |t|) ≤ 4u·scale, u the unit roundoff (2^-24 in
    float32, below issue 20's 1e-5; 2^-11 in float16); the key coordinates cancel exactly."""
    model = ef.compile(data, attention=attention, exact=False, width=width)
    scale = data.coordinate_scale()
    for x, y, k in zip(*data.floats(), data.known, strict=True):
        if not k.any():
            continue
        for dtype in (np.float32, np.float16):
            bound = 4 * np.finfo(dtype).eps / 2
            out = float_pass(model, x, dtype)[-1]
            err = np.abs(out[k, : data.d].astype(float) - y[k]).max()
            assert err <= bound * scale, (dtype, err / scale)
            assert (out[k, data.d:] == 0).all()
        if attention == "hardmax":  # an enclosure's key coordinates keep radius 0
            (mid,), (rad,) = enclose(model, [x], None)
            assert (mid[k, data.d:] == 0).all() and (rad[k, data.d:] == 0).all()


@settings(max_examples=30, **SETTINGS)
@given(keyed_data(fractions=False), st.sampled_from([4, 8, 64]))
def test_verify_reports_the_errors_of_a_plain_float64_pass(data, width):
    """Without attention verify's float64 pass is its enclosure pass: the report's float64
    errors must be those of the plain float64 pass above, to the bit (the key sums and the one
    active unit's product are exact, so the summation order cannot matter)."""
    model = ef.compile(data, exact=False, width=width)
    report = ef.verify(model, data)
    assert report.ok and report.position_keys
    for j, (x, y, k) in enumerate(zip(*data.floats(), data.known, strict=True)):
        out = float_pass(model, x, np.float64)[-1]
        target = np.hstack([y[k], np.zeros((int(k.sum()), model.d - data.d))])
        err = np.sqrt(((out[k] - target) ** 2).sum(axis=1))
        assert report.errors_float64[j] == err.max(initial=0.0)


# ------------------------------------------------------------ 3. bit-for-bit pass-through
def own_layer(model, row_q, d) -> int | None:
    """The block with a unit whose key (U's sign on the key coordinates) is the row's."""
    for n, blk in enumerate(model.blocks):
        for u in np.sign(np.asarray(blk.ff.U, dtype=float)[:, d:]):
            if np.array_equal(u, np.sign(row_q)) and (row_q != 0).any():
                return n
    return None


@settings(max_examples=30, **SETTINGS)
@given(keyed_data(max_n=40, fractions=False), st.sampled_from([4, 8]), st.integers(0, 10**6))
def test_rows_pass_every_block_but_their_own_bit_for_bit(data, width, seed):
    model = ef.compile(data, exact=False, width=width)
    d, P = data.d, np.asarray(model.positions, dtype=float)
    rng = np.random.default_rng(seed)
    rows = [np.asarray(x, dtype=float) for x in data.inputs]
    n = len(P)  # adversarial: data-like tokens with no key, or another position's key
    tok = rng.standard_normal((n, d)) * data.coordinate_scale()
    other = P[rng.permutation(n), d:] * rng.integers(0, 2, (n, 1))
    rows.append(np.concatenate([tok, other - P[:, d:]], axis=1))
    for x, dtype in product(rows, (np.float32, np.float16)):
        snaps = float_pass(model, x, dtype)
        for i in range(len(x)):
            own = own_layer(model, snaps[0][i, d:], d)
            for n_ in range(model.n_blocks):
                before, after = snaps[n_][i], snaps[n_ + 1][i]
                if n_ == own:
                    assert (after[d:] == 0).all()
                else:
                    assert np.array_equal(before, after), (i, n_, own)


# ------------------------------------------- 4. key lookups against the reference, adversarially
def key_form(model, d):
    """(c, κ, b, w) of a constructed keyed model, read from its stored parameters."""
    ff = model.blocks[0].ff
    U = frac(ff.U)[:, d:]
    kappa = max(abs(v) for v in U.flat)
    return (Fraction(model.record.position_code["scale"]), kappa, Fraction(ff.b[0]),
            model.record.position_code["weight"])


def adversarial_q(rng, P, d, c, kappa, b, w):
    """Key-coordinate parts (after the position is added), each on an edge of the lookup:
    other keys, scaled keys (quiet or not, own unit on or off, ties), near keys (one entry
    more, one less, halved: a tie, doubled), −key, huge and tiny, random."""
    sig = [row / c for row in frac(P)[:, d:] if (row != 0).any()]
    s = sig[int(rng.integers(len(sig)))]
    g_on = -b / (kappa * w)  # the own unit's pre-activation is 0
    gs = [c, c / 2, c / 4, 2 * c, 3 * c, 10 * c, Fraction(1e300), Fraction(1e-300)]
    gs += [g_on * t for t in (1, Fraction(1023, 1024), Fraction(1025, 1024))]
    if w > 1:  # κ·g·(w − 1) + b = 0: the other units' edge
        gs += [-b / (kappa * (w - 1)) * t for t in (1, Fraction(1023, 1024), Fraction(1025, 1024))]
    out = [g * s for g in gs] + [-c * s, 0 * s, frac(rng.standard_normal(len(s))) * c]
    on, off = np.flatnonzero(s != 0), np.flatnonzero(s == 0)
    for k, v in [(off[:1], Fraction(1)), (on[:1], Fraction(0)), (on[-1:], s[on[-1]] / 2),
                 (on[-1:], 2 * s[on[-1]])]:
        near = s.copy()
        near[k] = v
        out.append(c * near)
    return out


def adversarial_inputs(rng, model, d):
    """One sequence as long as the stored positions, model.d wide: data-like tokens (some
    huge or tiny) and key coordinates chosen so that token + position is adversarial."""
    c, kappa, b, w = key_form(model, d)
    P = frac(model.positions)
    rows = []
    for i in range(len(P)):
        qs = adversarial_q(rng, P, d, c, kappa, b, w)
        v = qs[int(rng.integers(len(qs)))]
        tok = frac(rng.standard_normal(d) * float(c))
        tok[0] *= [1, 1, Fraction(10**300), Fraction(1e-300)][int(rng.integers(4))]
        rows.append(np.concatenate([tok, np.asarray(v, dtype=object) - P[i, d:]]))
    return np.array(rows, dtype=object), as_floats(rows)


def check_mp(rows, exact, sizes) -> None:
    """60-digit rows within 10^-45 of the exact ones, relative to each row's size."""
    for row, e, size in zip(rows, exact, sizes, strict=True):
        assert all(abs(mp_fraction(u) - v) <= size / 10**45 for u, v in zip(row, e, strict=True))


def reference(model, x):
    """The exact outputs, and per row its largest |value| on the way (at least 1)."""
    snaps = exact_pass(model, x)
    return snaps[-1], [max([abs(v) for s in snaps for v in s[i]] + [Fraction(1)])
                       for i in range(len(x))]


def check_exact(model, x) -> None:
    """The exact pass and decoder equal the Fraction reference; the 60-digit pass is near."""
    ref, sizes = reference(model, x)
    assert (forward_causal(model, [x], "exact")[0] == ref).all()
    dec = Decoder(model, "exact")
    assert all((dec.push(r) == e).all() for r, e in zip(x, ref, strict=True))
    check_mp(forward_causal(model, [x], "mp", dps=60)[0], ref, sizes)


def check_against_reference(model, x_exact, x_float) -> None:
    """:func:`check_exact`, then for the float64 model: float pass and decoder within 1e-9
    relative (to the row's largest value on the way), enclosure containing the exact value
    (all against the reference of the inputs as floats)."""
    check_exact(model, x_exact)
    floats = model if not model.exact else model.to_float()
    ref, sizes = reference(floats, frac(x_float))
    (out,) = forward_causal(floats, [x_float], "float")
    assert all(close(o, e, 1e-9, z) for o, e, z in zip(out, ref, sizes, strict=True))
    dec = Decoder(floats, "float")
    assert all(close(dec.push(r), e, 1e-9, z) for r, e, z in zip(x_float, ref, sizes, strict=True))
    (mid,), (rad,) = enclose(floats, [x_float], None)
    for m, r, e in zip(mid.flat, rad.flat, ref.flat, strict=True):
        assert r == math.inf or abs(Fraction(float(m)) - e) <= Fraction(float(r))


@settings(max_examples=40, **SETTINGS)
@given(keyed_data(max_n=30), st.sampled_from([4, 8]), st.booleans(), st.integers(0, 10**6))
def test_key_lookup_equals_the_dense_reference_on_adversarial_rows(data, width, exact, seed):
    assume(exact or not data.exact)
    model = ef.compile(data, exact=exact, width=width)
    x_exact, x_float = adversarial_inputs(np.random.default_rng(seed), model, data.d)
    check_against_reference(model, x_exact if model.exact else frac(x_float), x_float)


@settings(max_examples=10, **SETTINGS)
@given(keyed_data(max_n=12), st.booleans(), st.integers(0, 10**6))
def test_exact_pass_takes_rationals_beyond_the_float_range(data, exact, seed):
    """An exact pass is exact for any rationals: key coordinates 10^±400 times a key (or
    plus one), a token coordinate of 10^400, both in the exact pass and the decoder."""
    assume(exact or not data.exact)
    model = ef.compile(data, exact=exact)
    rng, d = np.random.default_rng(seed), data.d
    P = frac(model.positions)
    big = Fraction(10) ** 400
    rows = []
    for i in range(len(P)):
        s = P[int(rng.integers(len(P))), d:]
        g = [big, 1 / big, big + 1, 1 + 1 / big][int(rng.integers(4))]
        tok = frac(rng.integers(-3, 4, d))
        tok[0] *= [1, big][int(rng.integers(2))]
        rows.append(np.concatenate([tok, g * s - P[i, d:]]))
    check_exact(model, np.array(rows, dtype=object))


def test_non_finite_token_coordinates_stay_non_finite_and_raise_nothing():
    """inf/nan in a token coordinate, at a row whose key fires, whose key coordinates are 0,
    or in a key coordinate: every pass runs, keeps the row non-finite (an enclosure with an
    infinite radius there) and leaves the other rows as the reference has them."""
    x = [[1.0, 2.0], [0.5, -1.0], [3.0, 1.0]]
    model = ef.compile(ef.CausalDataset.from_arrays([x], [[*x[1:], [1.0, 1.0]]]), exact=False)
    d, clean = 2, pad(np.array(x), model.d, 0.0)
    ref = exact_pass(model, frac(clean))[-1]
    for bad, (col, no_key), i in product((np.inf, -np.inf, np.nan),
                                         ((0, False), (1, True), (d, False)), range(3)):
        X = clean.copy()
        X[i, col] = bad
        if no_key:
            X[i, d:] = -np.asarray(model.positions, dtype=float)[i, d:]
        with np.errstate(all="ignore"):
            (out,), ((mid,), (rad,)) = (forward_causal(model, [X], "float"),
                                        enclose(model, [X], None))
            dec = Decoder(model, "float")
            pushed = np.array([dec.push(r) for r in X])
        for o in (out, mid, pushed):
            assert not np.isfinite(o[i]).all()
            assert all(close(o[k], ref[k], 1e-9) for k in range(3) if k != i)
        assert (rad[i][~np.isfinite(mid[i])] == np.inf).all()


# ----------------------------------------------- hand-built key layers, and near misses
def ternary(q: int, w: int) -> list[tuple]:
    return [t for t in product((-1, 0, 1), repeat=q) if sum(v != 0 for v in t) == w]


def hand_layers(rng, D: int, Q: list[int], w: int, exact: bool, layers: int) -> list[FF]:
    """Key layers on Q of weight w with random κ (not a power of two) and bias per layer;
    W also writes the key coordinates, some units moving a row onto a later unit's key."""
    codes = ternary(len(Q), w)
    out = []
    for _ in range(layers):
        kappa = Fraction(int(rng.integers(1, 30)), int(rng.integers(1, 30))) * 3
        bias = -kappa * Fraction(int(rng.integers(1, 8 * w + 1)), 4)
        pick = rng.choice(len(codes), int(rng.integers(1, min(6, len(codes)) + 1)), replace=False)
        U = np.full((len(pick), D), Fraction(0), dtype=object)
        for r, k in enumerate(pick):
            U[r, Q] = [kappa * v for v in codes[k]]
        W = frac(rng.integers(-4, 5, (D, len(pick)))) / 3
        for r in range(len(pick)):
            if rng.random() < 0.5:  # from g·σ (g = 1) onto another code: a chain of moves
                z = max(kappa * w + bias, Fraction(0)) or Fraction(1)
                W[Q, r] = (np.array(codes[int(rng.integers(len(codes)))]) - np.array(
                    codes[pick[r]])) / z
        b = np.full(len(pick), bias, dtype=object)
        out.append(FF(Fraction(1), U, b, W) if exact else float_ff(FF(1, U, b, W)))
    return out


def hand_rows(rng, n: int, D: int, Q: list[int], ffs: list[FF]) -> np.ndarray:
    """Rows whose Q-part is g·τ for the layers' own codes (and near them), g at the edges."""
    Us = [frac(ff.U) for ff in ffs]
    kappas = [max(abs(v) for v in U.flat) for U in Us]
    w = sum(v != 0 for v in Us[0][0])
    codes = [U[k, Q] / kappa for U, kappa in zip(Us, kappas, strict=True)
             for k in range(len(U))]
    gs = [Fraction(1), Fraction(1, 2), Fraction(3), Fraction(10**6)]
    gs += [-Fraction(ff.b[0]) / (kappa * v) for ff, kappa in zip(ffs, kappas, strict=True)
           for v in {w, max(w - 1, 1)}]  # the own unit or the others at 0: ties
    X = frac(rng.integers(-5, 6, (n, D))) / 2
    for i in range(n):
        tau = codes[int(rng.integers(len(codes)))].copy()
        if rng.random() < 0.3:
            tau[int(rng.integers(len(Q)))] = [0, 1, -1, Fraction(1, 2)][int(rng.integers(4))]
        X[i, Q] = tau * gs[int(rng.integers(len(gs)))]
    return X


@settings(max_examples=80, **SETTINGS)
@given(st.integers(0, 2**32 - 1), st.booleans(), st.sampled_from(["1", "q", "any"]),
       st.integers(1, 2))
def test_hand_built_key_layers_are_recognised_and_looked_up_exactly(seed, exact, wkind,
                                                                    groups):
    """Key layers not from the construction (κ not a power of two, biases and κ differing by
    layer, w = 1, w = q or any), in one or two interleaved groups on their own coordinates Q
    and weights, and rows keyed for either group or half for each."""
    rng = np.random.default_rng(seed)
    D = int(rng.integers(3, 9))
    parts = []
    for _ in range(groups):
        Q = sorted(rng.choice(D, int(rng.integers(1, min(D, 5) + 1)), replace=False).tolist())
        w = {"1": 1, "q": len(Q), "any": int(rng.integers(1, len(Q) + 1))}[wkind]
        parts.append((Q, w, hand_layers(rng, D, Q, w, exact, int(rng.integers(1, 5)))))
    ffs = [(ff, w) for _, w, layers in parts for ff in layers]
    ffs = [ffs[k] for k in rng.permutation(len(ffs))]
    found = key_layers([ff for ff, _ in ffs])
    assert all(k is not None and k.w == w for k, (_, w) in zip(found, ffs, strict=True))
    union = {v for Q, _, _ in parts for v in Q}
    assert all(set(np.asarray(k.Q).tolist()) <= union for k in found)
    model = Transformer(d=D, attention="hardmax", blocks=[Block(ff, None) for ff, _ in ffs],
                        exact=exact, causal=True)
    rows = [hand_rows(rng, 12, D, Q, layers) for Q, _, layers in parts]
    if groups == 2:
        mixed = rows[0].copy()
        mixed[:, parts[1][0]] = rows[1][:, parts[1][0]]
        rows.append(mixed)
    X = np.concatenate(rows)
    check_against_reference(model, X if exact else frac(as_floats(X)), as_floats(X))


NEAR_MISSES = ["equal codes", "one bias", "half entry", "eta", "first unit reads nothing"]


@settings(max_examples=40, **SETTINGS)
@given(st.integers(0, 2**32 - 1), st.booleans(), st.sampled_from(NEAR_MISSES))
def test_near_miss_layers_are_refused_and_evaluated_densely(seed, exact, miss):
    """A key layer plus one unit of a fresh code, then broken in one place: the recogniser
    refuses it, and every pass still equals the reference (densely)."""
    rng = np.random.default_rng(seed)
    D, Q, w = 5, [1, 2, 4], 2
    (ff,) = hand_layers(rng, D, Q, w, True, 1)
    U, b, W, eta = frac(ff.U), frac(ff.b), frac(ff.W), Fraction(1)
    kappa = max(abs(v) for v in U.flat)
    used = {tuple(np.sign(np.asarray(r[Q], dtype=float)).astype(int)) for r in U}
    fresh = [t for t in ternary(len(Q), w) if t not in used][0]
    new = np.full(D, Fraction(0), dtype=object)
    new[Q] = [kappa * v for v in fresh]
    U, b = np.concatenate([U, new[None]]), np.append(b, b[0])
    W = np.concatenate([W, frac(rng.integers(-4, 5, (D, 1)))], axis=1)
    assert key_layers([FF(eta, U, b, W)])[0] is not None
    X = hand_rows(rng, 10, D, Q, [FF(eta, U, b, W)])  # rows keyed for the layer before the break
    if miss == "equal codes":
        U[-1] = U[0]
    elif miss == "one bias":
        b[-1] = b[-1] * 2
    elif miss == "half entry":
        U[-1, Q[fresh.index(next(v for v in fresh if v))]] /= 2
    elif miss == "first unit reads nothing":
        U[0] = Fraction(0)
    else:
        eta = Fraction(1, 2)
    bad = FF(eta, U, b, W) if exact else float_ff(FF(eta, U, b, W))
    assert key_layers([bad])[0] is None
    model = Transformer(d=D, attention="hardmax", blocks=[Block(bad, None)], exact=exact,
                        causal=True)
    check_against_reference(model, X if exact else frac(as_floats(X)), as_floats(X))


# ----------------------------------------------------------------- 5. decoder, generation
@settings(max_examples=10, **SETTINGS)
@given(keyed_data(max_n=20), st.integers(0, 10**6))
def test_mp_decoder_keeps_its_digits(data, seed):
    """Decoder(model, "mp", dps) agrees with the 60-digit reference to 45 digits, as the mp
    pass does, on a keyed model's own inputs and on adversarial rows."""
    model = ef.compile(data)
    x_exact, _ = adversarial_inputs(np.random.default_rng(seed), model, data.d)
    for x in (*data.fractions()[0], x_exact):
        ref, sizes = reference(model, x)
        dec = Decoder(model, "mp", dps=60)
        check_mp([dec.push(r) for r in x], ref, sizes)


@settings(max_examples=30, **SETTINGS)
@given(keyed_data(max_n=40), st.sampled_from([4, 8, 64]), st.booleans())
def test_decoder_matches_the_pass(data, width, exact):
    assume(exact or not data.exact)
    model = ef.compile(data, exact=exact, width=width)
    xs = data.fractions()[0] if exact else data.floats()[0]
    arithmetic = "exact" if exact else "float"
    for x, out in zip(xs, forward_causal(model, xs, arithmetic), strict=True):
        dec = Decoder(model)
        for r, o in zip(x, out, strict=True):
            pushed = dec.push(r)
            assert (pushed == o).all() if exact else close(pushed, o, 1e-12)


@settings(max_examples=30, **SETTINGS)
@given(st.integers(0, 2**32 - 1), st.integers(2, 16), st.integers(1, 60), st.booleans(),
       st.sampled_from([4, 64]))
def test_generation_recites_the_text(seed, d, n, exact, width):
    rng = np.random.default_rng(seed)
    vocab = rng.standard_normal((int(rng.integers(1, 8)), d)) * 10.0 ** rng.integers(-3, 4)
    x = vocab[rng.integers(0, len(vocab), n)]
    data = ef.CausalDataset.from_arrays([x.tolist()], [[*x[1:].tolist(), vocab[0].tolist()]])
    model = ef.compile(data, exact=exact, width=width)
    said = generate(model, x[:1], n - 1, vocabulary=vocab)
    assert np.array_equal(np.asarray(said, dtype=float).reshape(n - 1, d), x[1:])


# -------------------------------------------------------------------------- 6. fallback
@settings(max_examples=6, **SETTINGS)
@given(st.integers(0, 2**32 - 1), st.booleans())
def test_a_position_with_two_constraints_falls_back_to_hats(seed, exact):
    """Two sequences with different (token, target) at one constrained position: no lookup by
    position can serve them, so the keyed causal model by default, and the paper's hat
    construction (no code, no extra coordinates) on request."""
    rng = np.random.default_rng(seed)
    d, n = int(rng.integers(2, 4)), int(rng.integers(2, 6))
    vocab = rng.integers(-4, 5, (4, d)).astype(float) / 2
    vocab[1] = vocab[0] + 1
    a, b = vocab[rng.integers(0, 4, n)], vocab[rng.integers(0, 4, n)]
    a[0], b[0] = vocab[0], vocab[1]
    data = ef.CausalDataset.from_arrays([a.tolist(), b.tolist()],
                                        [[*a[1:].tolist(), None], [*b[1:].tolist(), None]])
    xs, ys = data.fractions()
    assert keyed_positions(xs, ys, data.known) is None
    model = ef.compile(data, exact=exact, construction="paper")
    assert model.record.position_code is None and model.d == data.d
    assert ef.verify(model, data).ok
    keyed = ef.compile(data, exact=exact)
    assert keyed.record.keyed is not None and ef.verify(keyed, data).ok


def test_snapshots_inside_and_at_the_end_of_a_key_run():
    """A set model of three key layers (one stretch): every snapshot, including the one at the
    stretch's end, equals a plain float64 dense pass written here."""
    from exactformer.evaluate import forward
    U = np.array([[0, 0, 1.0, 1.0], [0, 0, 1.0, -1.0]])
    W = np.zeros((4, 2))
    W[0, 0], W[1, 1], W[2, 0] = 1.0, 1.0, -2.0  # the first unit also clears its own key
    ffs = [FF(1.0, U * k, np.array([-1.5, -1.5]) * k, W / k) for k in (1.0, 2.0, 4.0)]
    model = Transformer(d=4, attention="hardmax", blocks=[Block(f, None) for f in ffs],
                        exact=False)
    assert all(k is not None for k in key_layers(ffs))
    xs = [np.array([[0, 0, 1.0, 1.0], [0, 0, 1.0, -1.0], [1, 2, 0, 0], [0, 0, 3.0, 3.0]])]
    outs, snaps = forward(model, xs, "float", snapshots={0, 1, 2, 3})
    x = xs[0]
    for i, f in enumerate(ffs, start=1):
        x = x + np.maximum(x @ f.U.T + f.b, 0) @ f.W.T
        assert np.array_equal(np.unique(snaps[i][0], axis=0), np.unique(x, axis=0)), i
    assert np.array_equal(np.unique(outs[0], axis=0), np.unique(x, axis=0))
    _, end = forward(model, xs, "float", snapshots={3})  # only at the stretch's end
    assert np.array_equal(np.unique(end[3][0], axis=0), np.unique(x, axis=0))


# ------------------------------------------------------------- 6. chunked moves and writes
@settings(max_examples=20, **SETTINGS)
@given(keyed_data(max_n=40, fractions=False), st.sampled_from([4, 8]), st.integers(1, 7))
def test_moves_in_small_chunks_equal_one_chunk(data, width, chunk):
    """Key rows are keyed and moved in chunks (keys.MOVE_CHUNK rows, for the cache): any
    chunk size gives the same float outputs and radii, bit for bit."""
    model = ef.compile(data, exact=False, width=width)
    xs = data.floats()[0]
    ref = forward_causal(model, xs, "float"), *enclose(model, xs, None)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(keys, "MOVE_CHUNK", chunk)
        got = forward_causal(model, xs, "float"), *enclose(model, xs, None)
    for a, b in zip(ref, got, strict=True):
        assert all(np.array_equal(u, v) for u, v in zip(a, b, strict=True))
