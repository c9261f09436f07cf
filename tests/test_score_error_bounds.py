"""The score error bound of general hardmax heads at the ends of float64: products that
underflow before a large α scales them, and a rival whose interval overflows (found by an
adversarial review with its own Fraction evaluator)."""

from __future__ import annotations

from fractions import Fraction

import numpy as np

import exactformer as ef
from exactformer.evaluate import PassStats, enclosure, head_radius
from exactformer.evaluate.attention import float_hardmax_rows, float_scores_batch
from exactformer.model import FF, SA, Block, ScoreMatrix, Transformer, ValueMatrix

# Points whose pairwise products lie in the subnormal range: each product rounds to a
# multiple of 2^-1074, and with a large α those absolute rounding errors are scaled up far
# beyond the (2n+4)·2^-1022 slack that score_error adds after the α factor. Row 1's float
# scores are α·[3, 2, 4]·2^-1074 (key 2 alone), its exact ones α·[3.71875, 1.90625,
# 3.71875]·2^-1074 (keys 0 and 2 tie).
POINTS = np.array([[3.625, 2.375], [0.125, 1.375], [0.875, 2.625]])
ALPHA = 2.0 ** 1000


def _exact_average(X, w, alpha, i):
    Xe = [[Fraction(v) for v in row] for row in X]
    sc = [Fraction(alpha) * sum(a * b for a, b in zip(Xe[i], x, strict=True)) for x in Xe]
    best = max(sc)
    idx = [l for l, s in enumerate(sc) if s == best]
    W = sum(Fraction(w[l]) for l in idx)
    return [sum(Fraction(w[l]) * Xe[l][j] for l in idx) / W for j in range(X.shape[1])]


def test_head_radius_holds_the_exact_average_when_alpha_scales_subnormal_products():
    X = (POINTS * 2.0 ** -537)[None]
    r = np.zeros_like(X)
    z = np.zeros((1, 3))
    S = float_scores_batch(X, z, z, ALPHA)
    top, bottom = S.max(axis=-1), S.min(axis=-1)
    w = np.ones((1, 3))
    avg = float_hardmax_rows(S, X, w, PassStats(), X, top, bottom)
    rad = head_radius.head_radius(S, top, bottom, X, r, z, z, z, z, ALPHA, X, r, avg)
    for i in range(3):
        ex = _exact_average(X[0], w[0], ALPHA, i)
        for j in range(2):
            assert abs(ex[j] - Fraction(avg[0, i, j])) <= Fraction(rad[0, i, j]), (i, j)


def test_verify_refuses_a_model_whose_exact_argmax_differs_under_a_large_alpha():
    """Scale the points into the subnormal-product range (η = 2^-537, exact), attend with
    α = 2^1000, scale back (η = 2^537). The float pass sends token 1 to token 2, the exact
    evaluation to the mean of tokens 0 and 2; targets = the float outputs. verify said OK,
    decided by float64 enclosures."""
    def scale(e):
        return FF(e, np.zeros((1, 2)), np.zeros(1), np.zeros((2, 1)))
    z = np.zeros(2)
    model = Transformer(2, "hardmax", [
        Block(scale(2.0 ** -537), SA(0.0, ScoreMatrix(ALPHA, z.copy(), z.copy()),
                                     ValueMatrix(1.0, z.copy(), z.copy()))),
        Block(scale(2.0 ** 537), None)], exact=False)
    f = ef.forward(model, [POINTS], arithmetic="float")[0]
    e = ef.forward(model, [POINTS], arithmetic="exact")[0]
    assert [float(v) for v in e[1]] == [2.25, 2.5] and f[1].tolist() == [0.875, 2.625]
    report = ef.verify(model, ef.Dataset.from_arrays([POINTS], [np.unique(f, axis=0)]))
    assert not report.ok


def test_sole_candidate_with_a_rival_whose_lower_end_overflows():
    """A rival scoring −max_float with an error bound that makes its lower end overflow is
    "unknown" (a candidate) for the full hull, but the shortcut proves the row sole. That
    is sound (the rival's exact score is ≤ S + E, far below the best): the radius is only
    narrower than the full hull's, and holds the exact average."""
    X = np.array([[[1.0], [-1.0]]])
    r = np.zeros_like(X)
    q, q_rad = np.array([[-1.0, 1.0]]), np.array([[3e-10, 0.0]])
    k, k_rad = np.array([[1.7976931348623157e308, 2.0]]), np.zeros((1, 2))
    alpha = 1e-300
    S = float_scores_batch(X, q, k, alpha)
    top, bottom = S.max(axis=-1), S.min(axis=-1)
    assert np.isfinite(S).all()
    sole = head_radius.sole_candidates(S, top, bottom, X, r, q, q_rad, k, k_rad, alpha)
    E = head_radius.score_error(X, r, q, q_rad, k, k_rad, alpha)
    assert np.isneginf(enclosure.lower(S, E)[0, 0, 0])  # the full hull: key 0 unknown
    assert sole[0, 0]
    avg = float_hardmax_rows(S, X, np.ones((1, 2)), PassStats(), X, top, bottom)
    rad = head_radius.head_radius(S, top, bottom, X, r, q, q_rad, k, k_rad, alpha, X, r, avg)
    full = head_radius.hull_radius(avg, *head_radius._candidate_hull(S, X, r, q, q_rad, k, k_rad,
                                                                 alpha, X, r))
    assert (rad <= full).all() and (rad[0, 0] < full[0, 0]).all()
    assert avg[0, 0, 0] == -1.0 and rad[0, 0, 0] <= 2.0 ** -51  # key 1 alone
