"""Blocks whose attention mixes tokens, in the plain dense float64 pass (:mod:`.dense`): a
run of them on a batch of equal-length sequences as one (tokens × d) array, column by
column (docs/numerics.md#runtime-ranges)."""

from __future__ import annotations

import numpy as np


def mixing_run(X: np.ndarray, n: int, blocks, peak_of, attention: str, tau: float,
               causal: bool) -> np.ndarray:
    """``blocks`` (each mixes tokens) on X, a batch of sequences of length n stacked as
    (tokens × d) rows; ``peak_of(i)`` records the i-th block's peaks. The columns' largest
    |values| ``top`` are kept current, so a layer touches only the columns it reads and
    writes on finite data: x + 0 is x."""
    X = np.asfortranarray(X)
    if n == 0:
        return X
    top = np.abs(X).max(axis=0, initial=0.0)
    seen = np.tril(np.ones((n, n), dtype=bool)) if causal else None
    for i, blk in enumerate(blocks):
        peak = peak_of(i)
        if blk.ff is not None:
            X = _ff(X, blk.ff, top, peak)
        X = _attend(X, blk.sa, n, attention, tau, seen, top, peak)
        peak.note("state", top.max(initial=0.0))
    return X


def _ff(X: np.ndarray, ff, top: np.ndarray, peak) -> np.ndarray:
    """One FF on the rows X, with ``top``, the columns' largest |value|, kept. A residual
    FF (η = 1) on finite rows changes only the rows where a unit is active (elsewhere it
    adds exactly 0), so only those are written (:func:`_write`). Only where every value and
    W are finite: an inf (inf·0 = nan) reaches every column in the plain pass, and so it
    does here."""
    reads, writes = np.flatnonzero(ff.U.any(axis=0)), np.flatnonzero(ff.W.any(axis=1))
    Z = None
    if ff.eta == 1 and np.isfinite(top).all() and np.isfinite(ff.W).all():  # (0·inf = nan)
        Z = np.asfortranarray(X[:, reads] @ ff.U[:, reads].T + ff.b)  # (row reductions: fast)
    if Z is None or not np.isfinite(Z).all():
        Z = peak("FF pre-activation", X @ ff.U.T + ff.b)
        X = np.asfortranarray(ff.eta * X + np.maximum(Z, 0.0) @ ff.W.T)
        top[:] = np.abs(X).max(axis=0, initial=0.0)
    else:
        on = np.flatnonzero((peak("FF pre-activation", Z) > 0).any(axis=1))
        if len(on):
            _write(X, on, writes, np.maximum(Z[on], 0.0) @ ff.W[writes].T, top)
    peak.note("FF output", top.max(initial=0.0))
    return X


def _write(X: np.ndarray, on: np.ndarray, writes: np.ndarray, add: np.ndarray,
           top: np.ndarray) -> None:
    """X[on, writes] += add, ``on`` the rows where a unit is active (every other row would
    gain exactly 0), with ``top`` kept the columns' largest |value|: a column's largest can
    fall only where a row of ``on`` reached it, and only such a column is read again."""
    before = np.abs(X[np.ix_(on, writes)]).max(axis=0)
    X[np.ix_(on, writes)] += add
    top[writes] = np.maximum(top[writes], np.abs(X[np.ix_(on, writes)]).max(axis=0))
    fell = writes[before >= top[writes]]
    if len(fell):
        top[fell] = np.abs(X[:, fell]).max(axis=0)


def _attend(X: np.ndarray, sa, n: int, attention: str, tau: float, seen, top: np.ndarray,
            peak) -> np.ndarray:
    """x ↦ ρ·x + Σ_h (M_h X) V_hᵀ on the rows X, each head's term computed from X before
    any is added, then added in head order, as the plain pass adds them; ``top`` kept."""
    if sa is None or sa.is_identity():
        return X
    small = bool(top.max(initial=0.0) <= np.finfo(float).max / 2)  # (nan: False)
    terms = [_head(X, head, n, attention, tau, seen, peak, small) for head in sa.heads]
    if sa.rho != 1 or not small:
        X = np.asfortranarray(sa.rho * X)
    written = np.full(X.shape[1], sa.rho != 1 or not small)
    for cols, term in terms:
        X[:, cols] += term
        written[cols] = True
    top[written] = np.abs(X[:, written]).max(axis=0, initial=0.0)
    return X


def _head(X: np.ndarray, head, n: int, attention: str, tau: float, seen, peak, small: bool
          ) -> tuple[np.ndarray, np.ndarray]:
    """One head's term (M X) Vᵀ on the rows X (sequences of n rows), M its attention of
    the scores ⟨A x_i, x_l⟩, as (the columns it writes, their values).

    * A coordinate that A or V gives weight 0 adds only exact zeros to a product of finite
      numbers, so on ``small`` X (every |x| at most half the largest float64, where no
      average M X overflows) the products read only the columns of A and V that are not
      zero, and the head writes only V's nonzero rows when every score is finite.
      Otherwise every column, as in the plain pass (inf·0 = nan).
    * Tokens of one sequence whose queries A x_i are equal have equal score rows, so such a
      sequence (a separation head's: A reads the coordinate 1 of every token) gets one
      score row, computed as the plain pass computes each of them: n products, not n².
      Its weights are that row's (under a causal mask, each token's masked copy of it).
    """
    A, V = head.A.dense(), head.V.dense()
    a_rows, a_cols = _support(A, small)
    B = len(X) // n
    q = (X[:, a_cols] @ A[np.ix_(a_rows, a_cols)].T).reshape(B, n, -1)  # A x_i, A's rows
    keys = X[:, a_rows].reshape(B, n, -1)
    alike = (q == q[:, :1]).all(axis=(1, 2))
    parts = [(np.flatnonzero(alike), slice(0, 1)), (np.flatnonzero(~alike), slice(None))]
    S = [peak("scores", q[b][:, rows] @ np.swapaxes(keys[b], 1, 2)) for b, rows in parts]
    v_rows, v_cols = _support(V, small and all(np.isfinite(s).all() for s in S))
    Vt, values = V[np.ix_(v_rows, v_cols)].T, X[:, v_cols].reshape(B, n, -1)
    term = np.empty((B, n, len(v_rows)))
    for (b, _), s in zip(parts, S, strict=True):
        term[b] = (_attention(s, seen, attention, tau) @ values[b]) @ Vt
    return v_rows, term.reshape(B * n, -1)


def _attention(S: np.ndarray, seen, attention: str, tau: float) -> np.ndarray:
    """The attention weights of the scores S (rows: queries), under the causal mask
    ``seen`` when given: hardmax averages the argmax set, softmax weighs by exp(S/τ)."""
    if seen is not None:
        S = np.where(seen, S, -np.inf)
    if attention == "hardmax":
        M = (S == S.max(axis=2, keepdims=True)).astype(float)
    else:
        M = np.exp((S - S.max(axis=2, keepdims=True)) / tau)
    return M / M.sum(axis=2, keepdims=True)


def _support(A: np.ndarray, narrow: bool) -> tuple[np.ndarray, np.ndarray]:
    """The rows and the columns of A that hold a nonzero entry; every one unless
    ``narrow``."""
    if not narrow:
        every = np.arange(A.shape[0])
        return every, every
    return np.flatnonzero(A.any(axis=1)), np.flatnonzero(A.any(axis=0))
