"""Rows that hold the same numbers: a layer that acts on each row alone computes them once.

The plain dense pass runs each attention-free stretch on the distinct rows of all sequences
(:mod:`.dense`). In an enclosure, after the first attention a keyed model's rows are no
longer pooled (each sequence's rows carry its signature), but the few coordinates a
separation layer reads and writes, with their radii, repeat across sequences: 50 000 rows
hold about 4 000 distinct parts (docs/numerics.md#enclosures).
"""

from __future__ import annotations

import numpy as np

TWIN_ROWS = 2 ** 14  # rows from which a dense FF looks for equal rows first
HASH_ROWS = 4096  # rows hashed (and compared) at a time: their columns stay in the cache,
# and no temporary as large as the array is allocated (fresh memory is slow to touch)
_MIX = np.uint64(0x9E3779B97F4A7C15)  # odd: multiplying by it permutes the 64-bit words


def distinct(A: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(first, inv) with A[first[inv]] bitwise equal to A, row by row (float64 rows, nan and
    −0.0 included: equal bits are equal inputs to any float computation). Rows are grouped by
    a hash of their bits and every row is compared with its group's first; a row that differs
    (a hash collision) becomes a group of its own."""
    bits = np.ascontiguousarray(A).view(np.uint64)
    blocks = [slice(a, a + HASH_ROWS) for a in range(0, len(A), HASH_ROWS)]
    h = np.zeros(len(A), dtype=np.uint64)
    for rows in blocks:  # (a column of every row at once: 10× slower)
        block, g = bits[rows], h[rows]
        for j in range(bits.shape[1]):  # (wraps around modulo 2^64)
            g ^= block[:, j]
            g *= _MIX
            g ^= g >> np.uint64(31)
    _, first, inv = np.unique(h, return_index=True, return_inverse=True)
    inv = inv.reshape(-1)
    odd = np.concatenate([np.zeros(0, dtype=np.int64)] + [
        rows.start + np.flatnonzero((bits[rows] != bits[first[inv[rows]]]).any(axis=1))
        for rows in blocks])
    if len(odd):
        inv[odd] = len(first) + np.arange(len(odd))
        first = np.concatenate([first, odd])
    return first, inv
