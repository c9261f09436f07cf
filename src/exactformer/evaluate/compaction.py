"""Grouping equal rows of one sequence, exactly, so a state can merge them into multisets.

Float64 rows are grouped by a hash of their bits and compared bit for bit; exact and mpmath rows
by their float images first and exactly only where images collide (docs/numerics.md).
"""

from __future__ import annotations

import numpy as np

from ..numbers import mix64
from .arithmetic import float_image

HASH_CHUNK = 1 << 15  # rows hashed at once (4 to 5 times faster than whole columns)


def distinct_within(seq: np.ndarray, col: np.ndarray) -> bool:
    """True when no two rows of one sequence have equal float64 values ``col`` (one column,
    or the float images of an exact one: equal points have equal images), so that no two
    rows of a sequence are equal and a compaction has nothing to merge. One sort of
    (sequence, top bits of the value's bits) packed into 64 bits; a tie there (equal values,
    values that differ only in the bits left out, bitwise equal NaNs) answers False."""
    key = np.sort(_sequence_key(seq, (col + 0.0).view(np.uint64)))
    return not (key[1:] == key[:-1]).any()


def float_row_groups(seq: np.ndarray, arrays: list[np.ndarray]
                      ) -> tuple[np.ndarray, np.ndarray]:
    """Compaction groups of a float64 state (the columns of ``arrays`` side by side):
    ``inv[r]`` is the group of row r and ``first[g]`` a row of group g; groups are in
    sequence order. Rows are sorted by (sequence, a 64-bit hash of their bits) and a row joins
    the row before it when sequence and every bit agree (adding 0.0 turns −0.0 into 0.0; NaN
    rows merge only with bitwise equal ones). Two equal rows that a hash collision keeps
    apart stay two rows, which costs time only: rows carry their multiplicities. Column by
    column, so no copy of all rows is made (a sort of byte keys held three)."""
    cols = [a[:, c] for a in arrays for c in range(a.shape[1])]
    h = np.zeros(len(seq), dtype=np.uint64)
    for at in range(0, len(seq), HASH_CHUNK):  # all columns of a chunk: it stays in the cache
        part = h[at:at + HASH_CHUNK]
        for c, col in enumerate(cols):
            part ^= mix64((col[at:at + HASH_CHUNK] + 0.0).view(np.uint64) + np.uint64(c + 1))
    order = _by_sequence_and_hash(seq, h)
    same = (seq[order][1:] == seq[order][:-1]) & (h[order][1:] == h[order][:-1])
    for col in cols:
        bits = (col + 0.0).view(np.uint64)[order]
        same &= bits[1:] == bits[:-1]
    starts = np.concatenate([[True], ~same])
    inv = np.empty(len(seq), dtype=np.int64)
    inv[order] = np.cumsum(starts) - 1
    return order[starts], inv


def _by_sequence_and_hash(seq: np.ndarray, h: np.ndarray) -> np.ndarray:
    """Rows ordered by sequence, then by hash: one sort of (sequence, top bits of the hash)
    packed into 64 bits, four times faster than a two-key lexsort. Rows whose keys tie are
    equal or collide in those bits; a collision that parts two equal rows keeps them two
    rows (as a full-hash collision would)."""
    return np.argsort(_sequence_key(seq, h))


def _sequence_key(seq: np.ndarray, bits: np.ndarray) -> np.ndarray:
    """Per row one 64-bit key: the sequence number in the top bits, the top bits of ``bits``
    (uint64) below it, so that sorting the keys orders rows by sequence, then by ``bits``."""
    shift = np.uint64(max(int(seq.max(initial=0)).bit_length(), 1))  # (seq ≥ 0: indices)
    return (seq.astype(np.uint64) << (np.uint64(64) - shift)) | (bits >> shift)


def _float_row_keys(seq: np.ndarray, P: np.ndarray) -> np.ndarray:
    """One fixed-size byte string per row, equal exactly when (sequence, point) are: sorting
    these is twice as fast as ``np.unique(axis=0)``. Adding 0.0 turns −0.0 into 0.0, so the
    bytes compare like the numbers (NaN rows merge only with bitwise equal NaN rows)."""
    key = np.ascontiguousarray(np.column_stack([seq.astype(float), P + 0.0]))
    return key.view(np.dtype((np.void, key.shape[1] * key.itemsize))).ravel()


def object_row_groups(seq: np.ndarray, P: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Compaction groups of an exact or mpmath state: ``inv[r]`` is the group of row r, groups
    numbered by first sight in sequence order (so rows stay contiguous by sequence), and
    ``first[g]`` is the row first seen in group g.

    Rows are grouped by (sequence, float image) with one sort of byte keys, and the grouping
    is kept when every row equals its group's first row exactly (float images are a function
    of the exact values, so different groups are different points). When two different points
    share a float image, the rows are keyed exactly instead (:func:`_row_keys`)."""
    order = np.argsort(seq, kind="stable")
    Pf = float_image(P)
    label = None
    if Pf is not None:
        _, rep, label = np.unique(_float_row_keys(seq, Pf), return_index=True,
                                  return_inverse=True)
        label = label.reshape(-1)
        if not np.asarray(P == P[rep[label]], dtype=bool).all():
            label = None
    if label is None:
        keys = _row_keys(seq, P)
        index: dict = {}
        label = np.fromiter((index.setdefault(k, len(index)) for k in keys), dtype=np.int64,
                            count=len(keys))
    _, seen, group = np.unique(label[order], return_index=True, return_inverse=True)
    number = np.empty(len(seen), dtype=np.int64)
    number[np.argsort(seen)] = np.arange(len(seen))
    inv = np.empty(len(order), dtype=np.int64)
    inv[order] = number[group.reshape(-1)]
    return order[np.sort(seen)], inv


def _row_keys(seq: np.ndarray, P: np.ndarray) -> list:
    """A hashable key per row of an object array, equal exactly when (sequence, point) are.

    Hashing big rationals is the slow part of compaction, so a row whose (sequence, float
    image) no other row shares gets that image's number (an int) as its key; only rows that
    share a float image are keyed by their exact values (a tuple, never equal to an int).
    """
    Pf = float_image(P)
    if Pf is None:
        return list(zip(seq.tolist(), *P.T.tolist(), strict=True))
    _, fid, count = np.unique(np.column_stack([seq, Pf]), axis=0, return_inverse=True,
                              return_counts=True)
    fid = fid.reshape(-1)
    keys: list = fid.tolist()
    for r in np.flatnonzero(count[fid] > 1).tolist():
        keys[r] = (int(seq[r]), *P[r].tolist())
    return keys
