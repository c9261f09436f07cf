"""Causal attention: token i attends to l ≤ i, and the positions added first (docs/causal.md).

A causal pass is a set pass whose rows stay in input order and are never merged
(:class:`.state.CausalState`) and whose attention layers are applied by :func:`apply_causal_sa`;
the autoregressive decoder (:mod:`exactformer.tools.decode`) shares these kernels.
"""

from __future__ import annotations

import mpmath
import numpy as np

from ..model import SA
from ..numbers import pad_columns, safe_float, safe_floats, sparse_dot
from .arithmetic import FLOAT, Arithmetic, PassStats
from .attention import float_scores, softmax_average
from .causal_radius import causal_float_softmax, causal_head_average
from .layers import apply_sa
from .state import RowState


def with_positions(positions, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """Row i of ``positions`` (D columns, the model's width) added to the token at position i,
    tokens of dimension d < D zero-padded first (None: the inputs unchanged). A sequence
    longer than the rows is an error naming it (see docs/causal.md)."""
    if positions is None:
        return inputs
    out = []
    for j, x in enumerate(pad_columns(inputs, positions.shape[1])):
        if len(x) > len(positions):
            raise ValueError(f"sequence {j} has {len(x)} tokens but the model stores "
                             f"{len(positions)} positions")
        out.append(np.asarray(x) + positions[: len(x)])
    return out


def apply_causal_sa(st: RowState, sa: SA, attention: str, tau, stats: PassStats) -> None:
    """ρ·x_i plus every head's V_h applied to its causal average (docs/heads.md). A tracking
    pass (radii) writes as a set pass does, with causal averages and their radii
    (:mod:`.causal_radius`)."""
    if st.rad is not None:
        apply_sa(st, sa, attention, tau, stats, average=causal_head_average)
        return
    P = st.P
    new = P if sa.rho == 1 else P * sa.rho
    for head in sa.heads:
        new = _add_causal_head(st, P, new, head, attention, tau, stats)
    st.P = new
    st.changed_everything()


def _add_causal_head(st: RowState, P, new, head, attention: str, tau, stats: PassStats):
    """``new`` plus V·(the head's causal averages of the rows P)."""
    A, V = head.A, head.V
    qa, ka = sparse_dot(P, A.c), sparse_dot(P, A.a)
    out = np.empty_like(P)
    for s, e in st.segments():
        if attention == "hardmax":
            out[s:e] = causal_hardmax_rows(P[s:e], qa[s:e], ka[s:e], A.alpha, stats)
        else:
            out[s:e] = causal_softmax_rows(P[s:e], qa[s:e], ka[s:e], A.alpha, tau, st.ar)
    if V.beta != 0:
        new = new + out * V.beta
    cols = [k for k, v in enumerate(V.p) if v != 0]
    if cols:  # only the columns that p·(q·y) changes, q·y over q's nonzero entries
        new = new.copy() if new is P else new
        new[:, cols] = new[:, cols] + np.outer(sparse_dot(out, V.q), V.p[cols])
    return new


def causal_hardmax_rows(X, qa, ka, alpha, stats: PassStats) -> np.ndarray:
    """Row i: the average of x_l over the argmax set of s_il (l ≤ i), decided exactly in the
    arithmetic of X. With α = 0 a :class:`CausalScan` does it in O(n); otherwise each row's
    scores are compared (:func:`causal_row`)."""
    out = np.empty_like(X)
    if alpha != 0:
        for i in range(len(X)):
            out[i] = causal_row(X, qa, ka, alpha, i, np.arange(i + 1), "hardmax", None, stats)
        return out
    scan = CausalScan(float(np.abs(safe_floats(qa)).max()) *
                      float(np.abs(safe_floats(ka)).max()))
    for i in range(len(X)):
        out[i] = scan.push(qa[i], ka[i], X[i], stats)
    return out


class CausalScan:
    """Causal hardmax with scores q_i·k_l (A = a·cᵀ, α = 0), one token at a time: the argmax
    set of row i is where k_l is the prefix maximum (q_i > 0), the prefix minimum (q_i < 0) or
    the whole prefix (q_i = 0), so running extremes suffice. ``scale`` normalises margins."""

    def __init__(self, scale: float = 1.0):
        self.hi, self.lo = _PrefixExtreme(1), _PrefixExtreme(-1)
        self.total, self.n, self.scale = None, 0, scale or 1.0

    def push(self, q, k, x, stats: PassStats) -> np.ndarray:
        """Append the token x (query q = c·x, key k = a·x) and return its attention output."""
        self.hi.add(k, x)
        self.lo.add(k, x)
        self.total = x if self.total is None else self.total + x
        self.n += 1
        ext = self.hi if q > 0 else self.lo if q < 0 else None
        if ext is None:
            stats.hardmax_ties += int(self.n > 1)
            return self.total / self.n
        stats.hardmax_ties += int(ext.mixed)
        if ext.second is not None:
            gap = abs(safe_float(q)) * abs(safe_float(ext.best) - safe_float(ext.second))
            stats.note_min("hardmax_margin", gap / self.scale)
        return ext.sum if ext.count == 1 else ext.sum / ext.count


class _PrefixExtreme:
    """Running maximum (sign 1) or minimum (sign −1) of keys, the sum and count of the points
    attaining it, whether they differ, and the runner-up key."""

    def __init__(self, sign: int):
        self.sign, self.best, self.second = sign, None, None
        self.sum, self.count, self.first, self.mixed = None, 0, None, False

    def _beats(self, k, other) -> bool:
        return other is None or (k > other if self.sign > 0 else k < other)

    def add(self, k, x) -> None:
        if self._beats(k, self.best):
            self.second, self.best = self.best, k
            self.sum, self.count, self.first, self.mixed = x, 1, x, False
        elif k == self.best:
            self.sum, self.count = self.sum + x, self.count + 1
            self.mixed = self.mixed or any(a != b for a, b in zip(x, self.first, strict=True))
        elif self._beats(k, self.second):
            self.second = k


def causal_row(X, qa, ka, alpha, i: int, idx: np.ndarray, attention: str, tau,
               stats: PassStats | None = None, ar: Arithmetic | None = None) -> np.ndarray:
    """The attention output of row i over the keys ``idx`` (⊆ 0..i): hardmax averages the
    argmax set (exact comparisons in X's arithmetic), softmax weights exp((s − max)/τ)."""
    sc = qa[i] * ka[idx]
    if alpha != 0:
        sc = sc + (X[idx] @ X[i]) * alpha
    best = max(sc)
    if attention == "hardmax":
        hit = idx[[v == best for v in sc]]
        if stats is not None:
            stats.hardmax_ties += int(any(any(a != b for a, b in zip(X[l], X[hit[0]], strict=True))
                                          for l in hit))
            rest = [v for v in sc if v != best]
            if rest:
                scale = safe_float(max(abs(v) for v in sc)) or 1.0
                stats.note_min("hardmax_margin", safe_float(best - max(rest)) / scale)
        return X[hit].sum(axis=0) / len(hit)
    z = (sc - best) / tau
    return softmax_average(z, X[idx], FLOAT if ar is None else ar)


def causal_softmax_rows(X, qa, ka, alpha, tau, ar: Arithmetic) -> np.ndarray:
    """Row i: Σ_{l ≤ i} softmax_l(s_il/τ)·x_l. High-precision passes drop, at the pass's own
    precision, the keys whose weights cannot matter, as :func:`softmax_rows_mp` does."""
    n = len(X)
    if not ar.is_object:
        with np.errstate(invalid="ignore", over="ignore"):
            return causal_float_softmax(float_scores(X, qa, ka, alpha), X, tau, ar)
    out = np.empty_like(X)
    for i in range(n):
        idx = np.arange(i + 1)
        sc = qa[i] * ka[idx]
        if alpha != 0:
            sc = sc + (X[idx] @ X[i]) * alpha
        z = (sc - max(sc)) / tau
        cut = -(mpmath.mp.prec + 8) * mpmath.ln2 - mpmath.log(i + 1)
        keep = np.array([v >= cut for v in z], dtype=bool)
        out[i] = softmax_average(z[keep], X[idx[keep]], ar)
    return out
