"""Attacks on the float64 enclosures of softmax averages (evaluate/softmax_radius.py,
docs/numerics.md#softmax-averages-in-the-enclosures), each judged by an evaluation written here
in mpmath with every weight kept: e^(−g) and the tail weight W against mpmath near every power
of two and past the floor, boxes against averages of points at their corners with the *worst*
midpoint (the best key's carrier, so that an accurate float average cannot hide a box too
small), random float64 softmax models (several heads, α ≠ 0, V = p·qᵀ, ρ ∉ {0, 1}, τ ≠ 1,
repeated rows, subnormal and huge coordinates, rational inputs) whose enclosed outputs and pair
bounds must hold the 400-digit values, a verdict at the edge of the limit, a score overflow
whose nan the enclosures once turned into a finite output (an OK where the model's own float64
pass is nan), and temperatures the ball pass refuses."""

from __future__ import annotations

import math
from dataclasses import replace
from fractions import Fraction

import mpmath
import numpy as np
import pytest
from test_verify_bounds import reference

import exactformer as ef
from exactformer.evaluate import PassStats, enclose, forward
from exactformer.evaluate.head_radius import score_error
from exactformer.evaluate.softmax_radius import exp_neg_upper, softmax_box, tail_weight
from exactformer.model import FF, SA, Block, Head, ScoreMatrix, Transformer, ValueMatrix
from exactformer.verification import decide


def mpf(v) -> mpmath.mpf:
    f = Fraction(v) if isinstance(v, Fraction) else Fraction(float(v))
    return mpmath.mpf(f.numerator) / f.denominator


# ------------------------------------------------------------------------------ e^(−g), W
def _gaps() -> np.ndarray:
    """Gaps at, just below and just above k·ln 2 (where y = g·log2 e crosses an integer and
    the chord is tight), around the floor 1000·ln 2 ≈ 693.147, subnormal and huge ones."""
    ln2 = mpmath.log(2)
    out = [0.0, 5e-324, 2.2250738585072014e-308, 1e-300, 1e-16, 2.0 ** -52, 0.5, 1.0, 744.5,
           745.2, 1e300, 1.7976931348623157e308, math.inf]
    for k in [*range(0, 40), *range(680, 1003)]:
        g = float(k * ln2)
        out += [g, float(np.nextafter(g, 0)), float(np.nextafter(g, math.inf)),
                float(np.nextafter(np.nextafter(g, 0), 0))]
    rng = np.random.default_rng(7)
    return np.array(out + list(rng.uniform(0, 800, 2000)) +
                    list(np.exp(rng.uniform(-745, 700, 500))))


def test_exp_neg_upper_bounds_e_to_the_minus_g_at_every_power_of_two():
    g = _gaps()
    b = exp_neg_upper(g)
    with mpmath.workdps(40):
        for gi, bi in zip(g.tolist(), b.tolist(), strict=True):
            true = mpmath.exp(-mpf(gi)) if math.isfinite(gi) else mpmath.mpf(0)
            assert mpf(bi) >= true, gi
            if gi < 690:
                assert mpf(bi) <= true * mpmath.mpf("1.0625"), gi  # the chord's 6.2 %


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seed", range(4))
def test_tail_weight_bounds_the_other_keys_weight_for_all_scores_in_their_boxes(seed, causal):
    """W ≥ Σ_{l≠b} w_l e^(s_l/τ) / (w_b e^(s_b/τ) + Σ_{l≠b} …) at the worst scores of the
    boxes (s_b at its lower end, the others at their upper ends); a certified key beats every
    other over the boxes. Multiplicities up to 7000, τ from 10^-3 to 10^3. ``causal``: row i's
    keys are 0..i, and its best key is one of them."""
    rng = np.random.default_rng(seed)
    with mpmath.workdps(60):
        for _ in range(150):
            n = int(rng.integers(1, 7))
            scale = float(rng.choice([1, 10, 100, 1e3, 1e6]))
            S = rng.normal(0, scale, (n, n))
            if rng.random() < 0.3:
                S = np.round(S)
            E = np.abs(rng.normal(0, 1, (n, n))) * scale * \
                float(rng.choice([0, 1e-16, 1e-3, 1, 10]))
            w = rng.integers(1, 8, n).astype(float) * float(rng.choice([1, 1000]))
            tau = float(rng.choice([1.0, 0.5, 3.0, 1e-3, 1e3, 0.1, 7.0]))
            best, certain, W = tail_weight(S, E, w, tau, causal)
            assert not causal or (best <= np.arange(n)).all()
            for i in np.flatnonzero(certain).tolist():
                b = best[i]
                low = mpf(S[i, b]) - mpf(E[i, b])
                others = [l for l in range(i + 1 if causal else n) if l != b]
                assert all(low > mpf(S[i, l]) + mpf(E[i, l]) for l in others)
                num = mpmath.fsum(mpf(w[l]) * mpmath.exp((mpf(S[i, l]) + mpf(E[i, l]) - low) /
                                                         mpf(tau)) for l in others)
                assert mpf(W[i]) >= num / (mpf(w[b]) + num)


# ------------------------------------------------------------------------------ boxes
def _worst_box(rng, causal: bool):
    """One sequence of rank-one scores q·k_l (τ, multiplicities, carrier radii) and its
    softmax boxes (``causal``: over each row's prefix) about the *best key's carrier*, not the
    float average."""
    n = int(rng.integers(2, 6))
    k = rng.normal(0, 1, n)
    q = float(rng.choice([1, 5, 20, 50, 200, 700])) * float(rng.choice([-1, 1]))
    tau = float(rng.choice([1.0, 0.5, 3.0, 0.1, 10.0]))
    w = rng.integers(1, 8, n).astype(float)
    C = rng.normal(0, 1, (n, 2))
    C_rad = np.abs(rng.normal(0, 1e-3, (n, 2))) if rng.random() < 0.5 else np.zeros((n, 2))
    qa, X = np.full(n, q), np.stack([k, np.zeros(n)], axis=1)
    S = np.outer(qa, k)
    E = score_error(X, np.zeros((n, 2)), qa, np.zeros(n), k, np.zeros(n), 0.0)
    Sm = np.where(np.tri(n, dtype=bool), S, -np.inf) if causal else S
    mid, rad = softmax_box(C[np.argmax(Sm, axis=1)], S, E, w, tau, C, C_rad, causal=causal)
    return q, k, tau, w, C, C_rad, mid, rad


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seed", range(3))
def test_boxes_about_the_best_key_hold_the_averages_at_their_corners(seed, causal):
    """Every average of carriers drawn at a corner (or the centre) of their boxes is in the
    row's box (``causal``: row i's average over keys 0..i); with the midpoint at the best
    key, the radius is the blur itself, so a W that missed a multiplicity, τ or the chord's
    slack would show (the largest error/radius ratio seen is 1 − 10^-15; a row of one key,
    radius 0, is held to the 80-digit reference's own rounding)."""
    rng = np.random.default_rng(100 + seed)
    with mpmath.workdps(80):
        for _ in range(150):
            q, k, tau, w, C, C_rad, mid, rad = _worst_box(rng, causal)
            n = len(k)
            z = [mpf(w[l]) * mpmath.exp(mpf(q) * mpf(k[l]) / mpf(tau)) for l in range(n)]
            for corner in range(3):
                sign = [[0 if corner == 0 else (1 if (corner + l + t) % 2 else -1)
                         for t in range(2)] for l in range(n)]
                for t, i in np.ndindex(2, n):
                    keys = range(i + 1) if causal else range(n)
                    v = mpmath.fsum(z[l] * (mpf(C[l, t]) + sign[l][t] * mpf(C_rad[l, t]))
                                    for l in keys) / mpmath.fsum(z[l] for l in keys)
                    slack = mpmath.mpf(10) ** -70 * (1 + abs(v))  # the reference's rounding
                    assert abs(v - mpf(mid[i, t])) <= mpf(rad[i, t]) + slack, (i, t)


def test_the_blur_of_two_keys_is_their_weight_within_the_chord():
    """Keys 0 (weight 3) and 1 (weight 1), scores 0 and 20, τ = 1: the average is 1 −
    3/(3 + e^20) from the best key; the box about the best key is at most 6.3 % wider than
    that, and holds it."""
    C, w = np.array([[0.0], [1.0]]), np.array([3.0, 1.0])
    S = np.array([[0.0, 20.0], [0.0, 20.0]])
    mid, rad = softmax_box(np.array([[1.0], [1.0]]), S, np.full((2, 2), 1e-15), w, 1.0, C,
                           np.zeros((2, 1)))
    with mpmath.workdps(40):
        dev = 3 / (3 + mpmath.exp(20))
        assert (mid == 1.0).all()
        assert all(dev <= mpf(r) <= dev * mpmath.mpf("1.063") for r in rad[:, 0])


# ------------------------------------------------------------------------------ random models
def _vec(rng, d: int, scale: float) -> np.ndarray:
    kind = int(rng.integers(0, 4))
    if kind == 0:
        return rng.integers(-3, 4, d).astype(float) * scale
    if kind == 1:
        return rng.normal(0, 1, d) * scale
    if kind == 2:
        v = np.zeros(d)
        v[rng.integers(0, d)] = scale * rng.choice([-1, 1])
        return v
    return rng.uniform(-1, 1, d) * scale


def _random_model(rng) -> Transformer:
    """1–3 blocks (an FF sometimes), 1–3 heads each with α ∈ {0, ½, −1, 3, 10³}, score scales
    up to 10^160 (gaps from ties to overflow), V = β·I, p·qᵀ or both, ρ ∈ {0, 1, ½, −1.5}."""
    d = int(rng.integers(1, 4))
    blocks = []
    for _ in range(int(rng.integers(1, 4))):
        ff = None
        if rng.random() < 0.4:
            width = int(rng.integers(1, 3))
            ff = FF(float(rng.choice([0.0, 1.0, 0.5])), rng.normal(0, 1, (width, d)),
                    rng.normal(0, 1, width) * float(rng.choice([1, 1e3])),
                    rng.normal(0, 1, (d, width)))
        heads = []
        for _ in range(int(rng.integers(1, 4))):
            scale = float(rng.choice([1, 10, 300, 1e3, 1e5, 1e10, 1e160]))
            A = ScoreMatrix(float(rng.choice([0.0, 0.0, 0.5, -1.0, 3.0, 1e3])),
                            _vec(rng, d, 1.0), _vec(rng, d, scale))
            kind = int(rng.integers(0, 3))
            if kind == 0:
                V = ValueMatrix(float(rng.choice([1.0, 0.5, -2.0])), np.zeros(d), np.zeros(d))
            elif kind == 1:
                V = ValueMatrix(0.0, _vec(rng, d, 1.0), _vec(rng, d, 1.0))
            else:
                V = ValueMatrix(float(rng.choice([1.0, 0.25])), _vec(rng, d, 1.0),
                                _vec(rng, d, 1.0))
            heads.append(Head(A, V))
        blocks.append(Block(ff, SA(float(rng.choice([0.0, 1.0, 0.5, -1.5])), heads=heads)))
    return Transformer(d=d, attention="softmax", blocks=blocks,
                       tau=float(rng.choice([1.0, 1.0, 0.5, 3.0, 1e-3, 1e3, 0.1])), exact=False)


def _random_inputs(rng, d: int) -> list[np.ndarray]:
    """1–3 sequences of 1–4 rows: small integers, normals, subnormal to 10^300 magnitudes,
    integers a hair apart (near ties), or a repeated row (a multiplicity)."""
    xs = []
    for _ in range(int(rng.integers(1, 4))):
        n, kind = int(rng.integers(1, 5)), int(rng.integers(0, 5))
        if kind == 0:
            X = rng.integers(-3, 4, (n, d)).astype(float)
        elif kind == 1:
            X = rng.normal(0, 1, (n, d))
        elif kind == 2:
            X = rng.normal(0, 1, (n, d)) * float(rng.choice([1e-310, 1e-200, 1e100, 1e300]))
        elif kind == 3:
            X = rng.integers(-3, 4, (n, d)) + rng.normal(0, 1e-12, (n, d))
        else:
            X = rng.integers(-2, 3, (n, d)).astype(float)
            if n > 1:
                X[-1] = X[0]
        xs.append(X)
    return xs


@pytest.mark.parametrize("seed", range(0, 60))
def test_random_softmax_models_are_enclosed(seed):
    """Every finite radius of the enclosure pass bounds the distance of its float output from
    the 400-digit value of the stored floats (the same models held for 3200 seeds)."""
    rng = np.random.default_rng(seed)
    model = _random_model(rng)
    xs = _random_inputs(rng, model.d)
    outs, rads = enclose(model, xs, None)
    with mpmath.workdps(400):
        refs = reference(model, [[[Fraction(float(v)) for v in r] for r in x] for x in xs])
        for o, r, ref in zip(outs, rads, refs, strict=True):
            for (i, t), rv in np.ndenumerate(r):
                if math.isfinite(rv):
                    assert math.isfinite(o[i, t])
                    assert abs(ref[i][t] - mpf(o[i, t])) <= mpf(rv), (i, t)


@pytest.mark.parametrize("seed", range(6))
def test_pair_bounds_on_rational_inputs_hold_the_true_hausdorff_distance(seed):
    """Rational inputs (k/3, k/7, …: radius one unit in the last place) and targets near the
    outputs: every finite pair bound of the enclosures is ≥ the 400-digit Hausdorff distance."""
    rng = np.random.default_rng(seed)
    model = _random_model(rng)
    xs = [np.array([[Fraction(int(rng.integers(-9, 10)), int(rng.choice([1, 3, 7, 10])))
                     for _ in range(model.d)] for _ in range(int(rng.integers(1, 4)))],
                   dtype=object) for _ in range(int(rng.integers(1, 4)))]
    xs = [np.array(list(dict.fromkeys(tuple(r) for r in x.tolist())), dtype=object)
          for x in xs]  # distinct tokens
    with mpmath.workdps(400):
        refs = reference(model, [x.tolist() for x in xs])
    ys = []
    for ref in refs:
        Y = np.array([[float(v) for v in r] for r in ref]) * (1 + rng.normal(0, 1e-12))
        ys.append(np.array([[Fraction(v) for v in r] for r in dict.fromkeys(map(tuple, Y))],
                           dtype=object))
    data = ef.Dataset.from_arrays(xs, ys).padded(model.d)
    _, bounds, _ = decide._float_and_enclosure(model, data, PassStats(), False, math.inf)
    assert any(math.isfinite(b) for b in bounds)
    with mpmath.workdps(400):
        for ref, Y, b in zip(refs, ys, bounds, strict=True):
            if not math.isfinite(b):
                continue
            Ym = [[mpf(v) for v in r] for r in Y]

            def dist(u, v):
                return mpmath.sqrt(mpmath.fsum((s - t) ** 2 for s, t in zip(u, v, strict=True)))
            h = max(max(min(dist(u, v) for v in Ym) for u in ref),
                    max(min(dist(u, v) for u in ref) for v in Ym))
            assert h <= mpf(b)


# ------------------------------------------------------------------------------ verify
def _two_keys(s: float, tau: float) -> tuple[Transformer, ef.Dataset]:
    """Tokens (0, 1), (0, 2), (0, 3), (1, 1): an FF sets every second coordinate to 1
    (x₂ − relu(x₂ − 1)), so three tokens meet at (0, 1) (one row of multiplicity 3); then
    scores s·x_l1 make (1, 1) every row's best key. Every output is 1 − 3/(3 + e^(s/τ)) in
    its first coordinate; the target is (1, 1)."""
    ff = FF(1.0, np.array([[0.0, 1.0]]), np.array([-1.0]), np.array([[0.0], [-1.0]]))
    sa = SA(0.0, ScoreMatrix(0.0, np.array([1.0, 0.0]), np.array([0.0, s])),
            ValueMatrix(1.0, np.zeros(2), np.zeros(2)))
    model = Transformer(d=2, attention="softmax", blocks=[Block(ff, None), Block(None, sa)],
                        tau=tau, exact=False)
    data = ef.Dataset.from_arrays([np.array([[0.0, 1.0], [0.0, 2.0], [0.0, 3.0], [1.0, 1.0]])],
                                  [np.array([[1.0, 1.0]])])
    return model, data


@pytest.mark.parametrize("s, tau", [(20.0, 1.0), (12.0, 0.5), (45.0, 3.0)])
def test_a_verdict_at_the_edge_of_the_limit(s, tau):
    """The true relative error e = 3/(3 + e^(s/τ))/3 (scale 3): a tolerance 2.2 e is OK by
    the enclosures, one 1 % below e is never OK. The enclosures' bound is 2 e, not e: the box
    [1 − W, 1] is right (W within the chord's 6 % of the truth), but its radius is taken about
    the float average 1 − 3/(3 + e^(s/τ)), near the box's lower end, and the distance to the
    target adds the same error again; between e and 2 e the ball pass decides."""
    model, data = _two_keys(s, tau)
    with mpmath.workdps(50):
        rel = float(1 / (3 + mpmath.exp(mpmath.mpf(s) / mpmath.mpf(tau))))
    above = ef.verify(model, data, tolerance=rel * 2.2)
    assert above.ok and above.arithmetic == "enclosures", above.table()
    assert 1.99 * rel <= max(above.extra["hausdorff_bound"]) / 3 <= 2.01 * rel
    assert ef.verify(model, data, tolerance=rel * 1.1).ok  # by the ball pass
    assert not ef.verify(model, data, tolerance=rel * 0.99).ok


def _overflowing(d: int) -> Transformer:
    """One head whose scores (10^200 x₁)² overflow: the float64 pass's average is nan."""
    a = np.zeros(d)
    a[0] = 1e200
    sa = SA(0.0, ScoreMatrix(0.0, a, a), ValueMatrix(1.0, np.zeros(d), np.zeros(d)))
    return Transformer(d=d, attention="softmax", blocks=[Block(None, sa)], tau=1.0, exact=False)


def test_an_overflow_stays_nan_in_the_enclosures(monkeypatch):
    """A sequence of one token: its box is one point, which the enclosures once took as the
    output where the model's float64 pass gives nan, so verify found no non-finite output and,
    with the independent check skipped (over its budget on large data), said OK."""
    model = _overflowing(2)
    x = np.array([[1.0, 2.0]])
    with np.errstate(all="ignore"):
        assert np.isnan(forward(model, [x])[0]).all()
    outs, rads = enclose(model, [x], None)
    assert np.isnan(outs[0]).all() and np.isinf(rads[0]).all()
    monkeypatch.setattr(decide, "INDEPENDENT_BUDGET", 0)
    data = ef.Dataset.from_arrays([x, 2 * x], [x, 2 * x])
    report = ef.verify(model, data)
    assert not report.ok and report.nonfinite_pairs == [0, 1], report.table()
    assert "skipped" in report.extra["independent float64 check"]


@pytest.mark.parametrize("tau", [-1.0, 0.0, -0.0, math.inf, math.nan])
def test_a_temperature_the_ball_pass_refuses_is_refused_before_the_enclosures(tau):
    """Sequences of one token are enclosed exactly whatever τ, so the enclosures alone would
    say OK for τ = −1 or ∞, which the ball pass and the model files refuse."""
    sa = SA(0.0, ScoreMatrix(0.0, np.array([1.0, 0.0]), np.array([1.0, 0.0])),
            ValueMatrix(1.0, np.zeros(2), np.zeros(2)))
    model = Transformer(d=2, attention="softmax", blocks=[Block(None, sa)], tau=1.0, exact=False)
    x = np.array([[1.0, 2.0]])
    data = ef.Dataset.from_arrays([x], [x])
    assert ef.verify(model, data).ok
    with pytest.raises(ValueError, match="temperature tau must be positive"):
        ef.verify(replace(model, tau=tau), data)
    with pytest.raises(ValueError, match="temperature tau must be positive"):
        ef.verify(model, data, tau=tau)
