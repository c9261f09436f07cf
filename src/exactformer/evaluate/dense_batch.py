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


ROWS = 1 << 14  # rows whose pre-activations are formed at once (they stay in cache)


def _ff(X: np.ndarray, ff, top: np.ndarray, peak) -> np.ndarray:
    """One FF on the rows X, with ``top``, the columns' largest |value|, kept. A residual
    FF (η = 1) on finite rows changes only the rows where a unit is active (elsewhere it
    adds exactly 0), so only those are written (:func:`_write`), their pre-activations
    formed a block of rows at a time (:func:`_active`). Only where every value and W are
    finite: an inf (inf·0 = nan) reaches every column in the plain pass, and so it does
    here."""
    writes = np.flatnonzero(ff.W.any(axis=1))
    if ff.eta == 1 and np.isfinite(top).all() and np.isfinite(ff.W).all():  # (0·inf = nan)
        found = _active(X, ff)
        if found is not None:
            on, Z, largest = found
            peak.note("FF pre-activation", largest)
            if len(on):
                _write(X, on, writes, np.maximum(Z, 0.0) @ ff.W[writes].T, top)
            peak.note("FF output", top.max(initial=0.0))
            return X
    Z = peak("FF pre-activation", X @ ff.U.T + ff.b)
    X = np.asfortranarray(ff.eta * X + np.maximum(Z, 0.0) @ ff.W.T)
    top[:] = np.abs(X).max(axis=0, initial=0.0)
    peak.note("FF output", top.max(initial=0.0))
    return X


def _active(X: np.ndarray, ff) -> tuple[np.ndarray, np.ndarray, float] | None:
    """(the rows where some unit is active, their pre-activations, the largest |pre-activation|
    of every row), reading only the columns U reads, :data:`ROWS` rows at a time; None if
    a pre-activation is not finite."""
    reads = np.flatnonzero(ff.U.any(axis=0))
    Ut, on, Zs, largest = ff.U[:, reads].T, [], [], 0.0
    for a in range(0, len(X), ROWS):
        Z = X[a:a + ROWS, reads] @ Ut + ff.b
        if not np.isfinite(Z).all():
            return None
        largest = max(largest, float(np.abs(Z).max(initial=0.0)))
        rows = np.flatnonzero((Z > 0).any(axis=1))
        on.append(rows + a)
        Zs.append(Z[rows])
    return (np.concatenate(on), np.concatenate(Zs), largest) if on else \
        (np.zeros(0, dtype=int), np.zeros((0, ff.U.shape[0])), largest)


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
    the scores ⟨A x_i, x_l⟩, as (the columns it writes, their values), formed for a block
    of about :data:`ROWS` rows of whole sequences at a time (:func:`_head_rows`).

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
    step = max(1, ROWS // n) * n

    def term(v_support):
        return [_head_rows(X[i:i + step], A, V, (a_rows, a_cols), v_support, n, attention,
                           tau, seen, peak) for i in range(0, len(X), step)]
    v_rows, v_cols = _support(V, small)
    parts = term((v_rows, v_cols))
    if not all(finite for _, finite in parts):
        v_rows = v_cols = np.arange(V.shape[0])
        if small:
            parts = term((v_rows, v_cols))
    return v_rows, np.concatenate([t for t, _ in parts])


def _head_rows(X: np.ndarray, A: np.ndarray, V: np.ndarray, a_support, v_support, n: int,
               attention: str, tau: float, seen, peak) -> tuple[np.ndarray, bool]:
    """:func:`_head`'s term on the rows X of whole sequences, reading the (rows, columns)
    of A and V given, and whether every score is finite."""
    (a_rows, a_cols), (v_rows, v_cols) = a_support, v_support
    B = len(X) // n
    q = (X[:, a_cols] @ A[np.ix_(a_rows, a_cols)].T).reshape(B, n, -1)  # A x_i, A's rows
    keys = X[:, a_rows].reshape(B, n, -1)
    alike = (q == q[:, :1]).all(axis=(1, 2))
    parts = [(np.flatnonzero(alike), slice(0, 1)), (np.flatnonzero(~alike), slice(None))]
    S = [peak("scores", q[b][:, rows] @ np.swapaxes(keys[b], 1, 2)) for b, rows in parts]
    Vt, values = V[np.ix_(v_rows, v_cols)].T, X[:, v_cols].reshape(B, n, -1)
    term = np.empty((B, n, len(v_rows)))
    for (b, _), s in zip(parts, S, strict=True):
        term[b] = (_attention(s, seen, attention, tau) @ values[b]) @ Vt
    return term.reshape(B * n, -1), all(bool(np.isfinite(s).all()) for s in S)


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
