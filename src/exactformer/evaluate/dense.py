"""A plain dense float64 pass: the reference that checks the fast evaluator independently."""

from __future__ import annotations

import math

import numpy as np

from ..model import Transformer, first_mixing
from ..numbers import pad_columns


def dense_forward(model: Transformer, inputs: list[np.ndarray], tau=None,
                  peaks: dict | None = None) -> list[np.ndarray]:
    """A plain float64 pass, written apart from :func:`forward` to check it independently:
    every token of every sequence, every layer dense (A and V as d×d matrices, full n×n
    scores, under the causal mask in a causal model), no multisets and no ridge windows.
    Sequences of equal length run as one batch through an attention layer; a stretch of
    blocks without attention acts on each token alone, so it runs once per distinct token
    of all sequences (:func:`_tokenwise`). Overflow is not trapped: it shows as inf or nan
    in the outputs (see docs/verification.md). Inputs narrower than the model are
    zero-padded and the model's positions added, as by :func:`forward`. ``peaks``, a dict,
    receives the largest |value| of each intermediate, keyed (block, part), part one of "FF
    pre-activation", "FF output", "scores", "state" (docs/numerics.md#runtime-ranges).
    """
    params = model.to_float() if model.exact else model
    t = float(tau if tau is not None else (model.tau if model.tau is not None else 1))
    xs = pad_columns([np.asarray(x, dtype=float) for x in inputs], model.d)
    if not xs:
        return []
    if params.positions is not None:
        xs = [x + np.asarray(params.positions[:len(x)], dtype=float) for x in xs]
    blocks, i = params.blocks, 0
    with np.errstate(all="ignore"):
        while i < len(blocks):
            j = first_mixing(blocks, i)
            if j > i:
                xs = _tokenwise(xs, blocks, i, j, peaks)
            if j < len(blocks):
                xs = _batched(xs, blocks[j], j, model, t, peaks)
            i = j + 1
    return xs


def _tokenwise(xs: list[np.ndarray], blocks, i: int, j: int, peaks) -> list[np.ndarray]:
    """Blocks i..j−1, none of which mixes tokens, on every distinct row of all sequences,
    given back to each token. The largest |value| of each column is kept current, so a
    residual FF (η = 1) touches only the columns its units read and write: x + 0 is x."""
    X, inv = np.unique(np.concatenate(xs) + 0.0, axis=0, return_inverse=True)  # −0 = 0
    X = np.asfortranarray(X)
    top = np.abs(X).max(axis=0)
    for k in range(i, j):
        peak = _Peaks(peaks, k)
        if blocks[k].ff is not None:
            X = _tokenwise_ff(X, blocks[k].ff, top, peak)
        peak.note("state", top.max())
    return np.split(X[inv.reshape(-1)], np.cumsum([len(x) for x in xs])[:-1])


def _tokenwise_ff(X: np.ndarray, ff, top: np.ndarray, peak) -> np.ndarray:
    """One FF on the rows X (rows × d), with ``top``, the columns' largest |value|, kept.
    A residual FF (η = 1) on finite rows changes only the rows where a unit is active
    (elsewhere it adds exactly 0), so only those are written (:func:`_write`); a layer of
    many rows and few active ones, as a keyed model's moves, then costs its pre-activations
    alone. Only where every value is finite: an inf (inf·0 = nan) reaches every column in the
    plain pass, and so it does here."""
    reads, writes = np.flatnonzero(ff.U.any(axis=0)), np.flatnonzero(ff.W.any(axis=1))
    Z = None
    if ff.eta == 1 and np.isfinite(top).all():
        Z = X[:, reads] @ ff.U[:, reads].T + ff.b
    if Z is None or not np.isfinite(Z).all():
        Z = peak("FF pre-activation", X @ ff.U.T + ff.b)
        X = np.asfortranarray(ff.eta * X + np.maximum(Z, 0.0) @ ff.W.T)
        top[:] = np.abs(X).max(axis=0)
    else:
        on = np.flatnonzero((peak("FF pre-activation", Z) > 0).any(axis=1))
        if len(on):
            _write(X, on, writes, np.maximum(Z[on], 0.0) @ ff.W[writes].T, top)
    peak.note("FF output", top.max())
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


def _batched(xs: list[np.ndarray], blk, i: int, model: Transformer, tau: float, peaks
             ) -> list[np.ndarray]:
    """Block i, whose attention mixes tokens, on each batch of sequences of one length."""
    out: list = [None] * len(xs)
    for n in sorted({len(x) for x in xs}):
        js = [j for j, x in enumerate(xs) if len(x) == n]
        seen = np.tril(np.ones((n, n), dtype=bool)) if model.causal else None
        Y = _dense_block(np.stack([xs[j] for j in js]), blk, model.attention, tau, seen,
                         _Peaks(peaks, i))
        for j, y in zip(js, Y, strict=True):
            out[j] = y
    return out


class _Peaks:
    """Records the largest |value| of block ``i``'s parts into ``peaks`` (None: nothing)."""

    def __init__(self, peaks: dict | None, i: int):
        self.peaks, self.i = peaks, i

    def __call__(self, part: str, values: np.ndarray) -> np.ndarray:
        if self.peaks is not None and values.size:
            self.note(part, np.abs(values).max())
        return values

    def note(self, part: str, top) -> None:
        """Record ``top``, a largest |value| of the part (nan stays nan)."""
        if self.peaks is not None:
            top, key = float(top), (self.i, part)
            self.peaks[key] = top if math.isnan(top) else max(self.peaks.get(key, 0.0), top)


def _dense_block(X: np.ndarray, blk, attention: str, tau: float, seen, peak) -> np.ndarray:
    """One block x ↦ SA(FF(x)) on a (B, n, d) batch, densely, in float64 (``seen``: the
    causal mask, None for set models): every token, every score (:func:`_head_into`)."""
    if blk.ff is not None:
        ff = blk.ff
        Z = peak("FF pre-activation", X @ ff.U.T + ff.b)
        X = peak("FF output", ff.eta * X + np.maximum(Z, 0.0) @ ff.W.T)
    if blk.sa is None or blk.sa.is_identity():
        return peak("state", X)
    small = X.size == 0 or np.abs(X).max() <= np.finfo(float).max / 2  # (nan: False)
    out = blk.sa.rho * X
    for head in blk.sa.heads:
        _head_into(out, X, head, attention, tau, seen, peak, small)
    return peak("state", out)


def _head_into(out: np.ndarray, X: np.ndarray, head, attention: str, tau: float, seen, peak,
               small: bool) -> None:
    """out += (M X) Vᵀ for one head on a (B, n, d) batch, M its attention of the scores
    ⟨A x_i, x_l⟩ (docs/numerics.md#runtime-ranges).

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
    q = X[..., a_cols] @ A[np.ix_(a_rows, a_cols)].T  # A x_i, on A's nonzero rows
    keys = X[..., a_rows]
    alike = (q == q[:, :1]).all(axis=(1, 2))
    parts = [(np.flatnonzero(alike), slice(0, 1)), (np.flatnonzero(~alike), slice(None))]
    S = [peak("scores", q[b][:, rows] @ np.swapaxes(keys[b], 1, 2)) for b, rows in parts]
    v_rows, v_cols = _support(V, small and all(np.isfinite(s).all() for s in S))
    Vt, values = V[np.ix_(v_rows, v_cols)].T, X[..., v_cols]
    for (b, _), s in zip(parts, S, strict=True):
        term = (_attention(s, seen, attention, tau) @ values[b]) @ Vt
        out[np.ix_(b, np.arange(X.shape[1]), v_rows)] += term


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
