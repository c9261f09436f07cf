"""Attention-free stretches of the plain dense float64 pass (:mod:`.dense`): each layer on
the distinct rows, and a residual FF only on the rows its bounds leave in doubt
(docs/numerics.md#runtime-ranges)."""

from __future__ import annotations

import numpy as np

from .boxes import Boxes, few, stretch_weight


def stretch(X: np.ndarray, blocks, i: int, j: int, peak_of) -> np.ndarray:
    """Blocks i..j−1, none of which mixes tokens, on the rows X (each row alone);
    ``peak_of(k)`` records block k's peaks. A residual FF (η = 1, W finite) on finite rows
    after a layer that wrote few rows goes by :func:`_bounded_ff` on :class:`.boxes.Boxes` kept
    across the layers; any other layer, or one whose bounds or values are not finite, on
    every row and column (:func:`_plain_ff`): a layer that writes most rows gains nothing
    from boxes."""
    X = np.array(X, dtype=float)  # rows contiguous: layers gather rows
    weight = stretch_weight(b.ff for b in blocks[i:j])
    boxes, written = None, len(X)
    for k in range(i, j):
        peak, ff = peak_of(k), blocks[k].ff
        if ff is not None and len(X):
            residual = ff.eta == 1 and np.isfinite(ff.W).all()  # (relu 0 · inf = nan)
            if boxes is None and residual and few(written, len(X)) and np.isfinite(X).all():
                boxes = Boxes(X, weight)
            written = _bounded_ff(X, boxes, ff, peak) if boxes is not None and residual else None
            if written is None:
                X, written, boxes = *_plain_ff(X, ff, peak), None
            elif boxes.stale():
                boxes = None
        if len(X):
            top = np.abs(X).max() if boxes is None else boxes.top()
            if ff is not None:
                peak.note("FF output", top)
            peak.note("state", top)
    return X


def _plain_ff(X: np.ndarray, ff, peak) -> tuple[np.ndarray, int]:
    """η·x + W·relu(U·x + b) on every row and column of X, as the plain pass computes it;
    and the number of rows where a unit is > 0."""
    Z = peak("FF pre-activation", X @ ff.U.T + ff.b)
    X = ff.eta * X + np.maximum(Z, 0.0) @ ff.W.T
    return X, int(np.asfortranarray(Z > 0).any(axis=1).sum())


def _bounded_ff(X: np.ndarray, boxes: Boxes, ff, peak) -> int | None:
    """A residual FF on the finite rows X, in place; the number of rows written, or None
    (X untouched) where it cannot go so. A row whose units are all ≤ 0 gains exactly 0, so
    the layer is evaluated only on the dirty rows, the boxes whose bound lets a unit be > 0
    and those whose bound on |U·x + b| reaches the largest one evaluated: its
    pre-activations' peak is then the plain pass's, and it writes only the rows where a
    unit is > 0 (:meth:`.boxes.Boxes.leave`). With a peak limit only the boxes whose bound
    passes it are evaluated for the peak; the others' bound is recorded in their place, also
    when no row is evaluated at all."""
    reads = np.flatnonzero(ff.U.any(axis=0))
    U = ff.U[:, reads]
    high, size = boxes.bounds(reads, U, ff.b)
    if not (np.isfinite(high).all() and np.isfinite(size).all()):
        return None
    first = high > 0
    first[np.argmax(size)] = True
    rows = boxes.rows(np.flatnonzero(first), with_dirty=True)
    Z = np.asfortranarray(X[np.ix_(rows, reads)] @ U.T + ff.b)  # (row reductions: fast)
    top = np.abs(Z).max(initial=0.0)
    more = (size >= top) & ~first
    if peak.limit is not None:  # boxes whose bound is within the limit: that bound will do
        top = max(top, size[more & (size <= peak.limit)].max(initial=0.0))
        more &= size > peak.limit
    more = np.flatnonzero(more)
    if len(more):
        extra = boxes.rows(more, with_dirty=False, reads=reads)
        rows = np.concatenate([rows, extra])
        Z = np.asfortranarray(np.concatenate([Z, X[np.ix_(extra, reads)] @ U.T + ff.b]))
    if not np.isfinite(Z).all():
        return None
    if len(X) and len(ff.b):  # (a limit's bound may stand for every row: Z can be empty)
        peak.note("FF pre-activation", max(np.abs(Z).max(initial=0.0), top))
    active = (Z > 0).any(axis=1)
    on = rows[active]
    if len(on):
        writes = np.flatnonzero(ff.W.any(axis=1))
        X[np.ix_(on, writes)] += np.maximum(Z[active], 0.0) @ ff.W[writes].T
        boxes.leave(X, None, on)
    return len(on)
