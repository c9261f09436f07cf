"""Hardmax heads with rank-one scores, every sequence at once, recomputed only where rows moved.

A head with scores (c·x_i)(a·x_l) (α = 0: every separation head and the collapse) needs, per
sequence, only the rows holding the largest and the smallest key a·x: a query with c·x > 0
averages the first, one with c·x < 0 the second, one with c·x = 0 the whole sequence. Its
results for a sequence depend on nothing but that sequence's rows in the columns c, a and the
carrier read, so a pass keeps them per head (:class:`HeadCache`) and recomputes a layer only for
the sequences with a row changed since the head last ran: in the separation phase a layer
moves the copies of one token and the attention writes a column the heads do not read, so each
layer touches a few sequences instead of all of them (docs/numerics.md#rank-one-attention-for-
all-sequences-at-once).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..numbers import safe_floats, sparse_dot
from . import enclosure, head_radius
from .rows import Rows, Segments


@dataclass
class Result:
    """One head's average (and radius, or None) per row, and per segment the ties and the
    smallest score margin seen (inf where none)."""

    avg: np.ndarray
    rad: np.ndarray | None
    ties: np.ndarray
    margin: np.ndarray


def head(X, r, w, sg: Segments, c, a, q, stats: bool) -> Result:
    """The head on the rows X (radii r, or None; multiplicities w): carrier x·q per row, or
    the points themselves when q is None. Decided on the keys in the pass's own numbers
    (exactly in exact and mp passes, on the float keys in float64); ``stats``: also find
    ties and margins."""
    qa, ka = sparse_dot(X, c), sparse_dot(X, a)
    C = X if q is None else sparse_dot(X, q)[:, None]
    avg = np.empty(C.shape, dtype=C.dtype)
    ties, margin = np.zeros(sg.n, dtype=np.int64), np.full(sg.n, np.inf)
    for sign, rows, best in _query_classes(qa, ka, sg):
        avg[rows] = _masked_means(C, w, best, sg)[sg.seg[rows]]
        if stats:
            _record(X, qa, ka, sign, rows, best, sg, ties, margin)
    if r is None:
        return Result(avg, None, ties, margin)
    q_rad, k_rad = enclosure.dot_radius(X, r, c), enclosure.dot_radius(X, r, a)
    C_rad = r if q is None else enclosure.dot_radius(X, r, q)[:, None]
    rad = head_radius.rank_one_radius(avg, qa, q_rad, ka, k_rad, C, C_rad, sg.seg, sg.starts)
    return Result(avg, rad, ties, margin)


def _query_classes(qa, ka, sg: Segments):
    """(sign, rows, best keys) for the signs of c·x (1, −1, 0) that some row has: the rows
    of that sign, and the rows of their sequences holding the largest key, the smallest
    key, or every row."""
    pos, neg = (qa > 0).astype(bool), (qa < 0).astype(bool)
    for sign, mask, pick in ((1, pos, np.maximum), (-1, neg, np.minimum), (0, ~pos & ~neg, None)):
        rows = np.flatnonzero(mask)
        if not len(rows):
            continue
        best = np.arange(len(sg.seg)) if pick is None else \
            np.flatnonzero((ka == pick.reduceat(ka, sg.starts)[sg.seg]).astype(bool))
        yield sign, rows, best


def _firsts(s: np.ndarray) -> np.ndarray:
    """Where each run of equal values in ``s`` begins."""
    return np.flatnonzero(np.concatenate([[True], s[1:] != s[:-1]]))


def _masked_means(P, w, rows, sg: Segments) -> np.ndarray:
    """Per segment, the w-weighted mean of P over ``rows`` (increasing); 0 for a segment
    without such rows. The weights are normalised first, so a single row comes back exactly
    (w/w = 1) in float64 too."""
    out = np.zeros((sg.n, P.shape[1]), dtype=P.dtype)
    if P.dtype == object:
        out[:] = 0 * w[0]
    if not len(rows):
        return out
    s = sg.seg[rows]
    first = _firsts(s)
    wm = w[rows]
    total = np.add.reduceat(wm, first)
    frac = wm / np.repeat(total, np.diff(np.append(first, len(rows))))
    out[s[first]] = np.add.reduceat(frac[:, None] * P[rows], first, axis=0)
    return out


def _record(X, qa, ka, sign: int, rows, best, sg: Segments, ties, margin) -> None:
    """Into the per-segment ``ties`` and ``margin``, for the queries ``rows`` whose c·x has
    sign ``sign``: the queries whose best keys hold two distinct points, and the smallest
    best-minus-second score gap over the sequence's score scale (float images of the scores;
    queries with c·x = 0 have no gap)."""
    s = sg.seg[rows]
    if (np.bincount(sg.seg[best], minlength=sg.n) > 1)[s].any():  # only those can tie
        tied = _two_points(X, best, sg)[s]
        ties += np.bincount(s[tied], minlength=sg.n)
    qf = safe_floats(np.asarray(qa[rows]))
    ok = qf != 0
    if sign == 0 or not ok.any():
        return
    kf = safe_floats(np.asarray(ka))
    key = sign * kf  # the scores of these queries order the keys by sign·a·x
    rest = key.copy()
    rest[best] = -np.inf
    with np.errstate(all="ignore"):
        gap = np.maximum.reduceat(key, sg.starts) - np.maximum.reduceat(rest, sg.starts)
        scale = np.maximum.reduceat(np.abs(safe_floats(np.asarray(qa))), sg.starts) * \
            np.maximum.reduceat(np.abs(kf), sg.starts)
        m = np.abs(qf) * (gap / scale)[s]
    ok &= np.isfinite(m)
    np.minimum.at(margin, s[ok], m[ok])


def _two_points(X, rows, sg: Segments) -> np.ndarray:
    """Per segment: do its ``rows`` (increasing) hold two distinct points? Column by column,
    each row against its segment's first, dropping the segments already found to: the first
    column decides most (every row of a separation head's sequence is a query)."""
    s = sg.seg[rows]
    first = _firsts(s)
    rep = rows[np.repeat(first, np.diff(np.append(first, len(rows))))]
    out = np.zeros(sg.n, dtype=bool)
    left = np.arange(len(rows))
    for c in range(X.shape[1]):
        differ = np.asarray(X[rows[left], c] != X[rep[left], c], dtype=bool)
        out[s[left[differ]]] = True
        left = left[~out[s[left]]]
        if not len(left):
            break
    return out


RECOMPUTED = 0.25  # above this share of changed rows, a cached head is computed afresh


class HeadCache:
    """Per head of a pass (its c, a and carrier), the last :class:`Result` and the state's
    epoch when it was brought up to date. The state stamps every row it changes with a new
    epoch (``row_epoch``) and every column an attention layer writes (``col_epoch``); a
    result is reused for the sequences none of whose rows changed since, and recomputed
    from scratch when a column the head reads was written. Cleared whenever the rows are
    renumbered (compaction) or all change (a dense layer)."""

    def __init__(self):
        self.entries: dict = {}

    def clear(self) -> None:
        self.entries.clear()

    def result(self, st: Rows, c, a, q, stats: bool) -> Result:
        """The head's result on the state's current rows; ``st`` is the pass's state (rows
        P, radii rad, weights(), segment_index(), epoch, row_epoch, col_epoch)."""
        key = (tuple(c.tolist()), tuple(a.tolist()), None if q is None else tuple(q.tolist()))
        reads = np.flatnonzero(np.any([v != 0 for v in (c, a) + (() if q is None else (q,))],
                                      axis=0))
        sg = st.segment_index()
        old = self.entries.get(key)
        res = None
        if old is not None and q is not None and not (st.col_epoch[reads] > old[0]).any():
            res = self._updated(st, old, sg, c, a, q, stats)
        if res is None:
            res = head(st.P, st.rad, st.weights(), sg, c, a, q, stats)
        if q is not None:  # a column per row; a point carrier is followed by a compaction
            self.entries[key] = (st.epoch, res)
        return res

    @staticmethod
    def _updated(st: Rows, old: tuple, sg, c, a, q, stats: bool) -> Result | None:
        """The cached result ``old`` with the sequences whose rows changed recomputed; None
        where they hold more than :data:`RECOMPUTED` of the rows: the head on every row then
        costs less than copying theirs."""
        res = old[1]
        changed = np.flatnonzero(st.row_epoch > old[0])
        if not len(changed):
            return res
        segs = np.unique(sg.seg[changed])
        rows, sub = sg.subset(segs)
        if len(rows) > RECOMPUTED * len(st.row_epoch):
            return None
        part = head(st.P[rows], None if st.rad is None else st.rad[rows],
                    st.weights()[rows], sub, c, a, q, stats)
        res.avg[rows] = part.avg
        if res.rad is not None:
            res.rad[rows] = part.rad
        res.ties[segs], res.margin[segs] = part.ties, part.margin
        return res
