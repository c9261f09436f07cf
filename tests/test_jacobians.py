"""evaluate/jacobians.jacobians against each pattern's Jacobian in rational arithmetic: J
within rounding(S, n) of it in every entry, and every entry called exact equal to it.
Weights mix dyadic values (whose sums are exact), generic floats and exact cancellations (a
unit pair whose slopes sum to 0, whose J must be exactly η·I)."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from exactformer.evaluate.jacobians import jacobians
from exactformer.evaluate.rounding import rounding


def _weight(draw, rng: np.random.Generator) -> float:
    kind = draw(st.sampled_from(["zero", "dyadic", "generic", "big", "tiny"]))
    if kind == "zero":
        return 0.0
    if kind == "dyadic":
        return float(rng.integers(-64, 65)) * 2.0 ** int(rng.integers(-12, 4))
    scale = {"generic": 1.0, "big": 2.0 ** 40, "tiny": 2.0 ** -40}[kind]
    return float(rng.normal()) * scale


@st.composite
def layers(draw):
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
    o, h, i = draw(st.integers(1, 5)), draw(st.integers(1, 9)), draw(st.integers(1, 5))
    W = np.array([[_weight(draw, rng) for _ in range(h)] for _ in range(o)])
    U_ = np.array([[_weight(draw, rng) for _ in range(i)] for _ in range(h)])
    if h >= 2 and draw(st.booleans()):  # a pair of units reading one row, slopes cancelling
        U_[1] = U_[0]
        W[:, 1] = -W[:, 0]
    patterns = rng.random((draw(st.integers(1, 12)), h)) < draw(st.sampled_from([0.2, 0.6, 1]))
    if draw(st.booleans()):  # a layer's output rows alone: η the rows of I they hold
        outputs = np.sort(rng.choice(i, size=min(o, i), replace=False))
        eta = np.eye(i)[outputs]
        W = W[:len(outputs)]
    else:
        W = W[:i] if o >= i else np.vstack([W, np.zeros((i - o, h))])
        eta = draw(st.sampled_from([0.0, 1.0, 0.5, 0.1]))
    return W, U_, patterns, eta


def _eye(eta, c: int, j: int) -> Fraction:
    return Fraction(float(eta[c, j])) if np.ndim(eta) else Fraction(eta) * (c == j)


def _exact_jacobian(W, U_, pattern, eta) -> list[list[Fraction]]:
    o, i = W.shape[0], U_.shape[1]
    return [[_eye(eta, c, j) +
             sum((Fraction(W[c, k]) * Fraction(U_[k, j]) for k in np.flatnonzero(pattern)),
                 Fraction(0))
             for j in range(i)] for c in range(o)]


@settings(max_examples=150, deadline=None)
@given(layers())
def test_each_pattern_jacobian_lies_within_its_rounding_and_exact_entries_are_exact(layer):
    W, U_, patterns, eta = layer
    jac = jacobians(W, U_, patterns, eta)
    for p, pattern in enumerate(patterns):
        true = _exact_jacobian(W, U_, pattern, eta)
        n = int(jac.n[p])
        for c in range(W.shape[0]):
            for j in range(U_.shape[1]):
                got, want = Fraction(float(jac.J[p, c, j])), true[c][j]
                if n == 0 or jac.exact[p, c, j]:
                    assert got == want, (p, c, j)
                else:
                    bound = Fraction(float(rounding(jac.S[p, c, j], n)))
                    assert abs(got - want) <= bound, (p, c, j)


def test_a_cancelling_pair_gives_exactly_eta_times_the_identity_with_no_rounding():
    U_ = np.array([[0.1, 0.7], [0.1, 0.7]])
    W = np.array([[0.3, -0.3], [1.9, -1.9]])
    jac = jacobians(W, U_, np.array([[True, True], [True, False]]), 1.0)
    assert (jac.J[0] == np.eye(2)).all() and jac.n[0] == 2
    assert not (jac.J[1] == np.eye(2)).all()
