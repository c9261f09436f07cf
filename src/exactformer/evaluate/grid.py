"""Dot products that no evaluation can round: the grid certificate (docs/numerics.md#grid).

Every nonzero float is odd·2^e; call e its *lowest bit* and the bit length of ``odd`` its
*significant bits*. A product x·v is exact in a format of p bits when the significant bits of
x and v add up to at most p, or one of them is a power of two (one significant bit), and it
does not fall below the format's smallest subnormal.
Exact terms t_1 … t_n are all multiples of 2^L, L their smallest lowest bit; every partial sum
of them, in any order and any blocking, with or without FMA, is a multiple of 2^L between −N
and P (the sums of the negative and of the positive terms). When max(P, N) ≤ 2^(p+L), every
such partial sum is a p-bit float, so the computed dot product is exact however it was
computed. The keyed construction's flips, clips, resets and moves are such sums, which is why
their enclosures do not widen (docs/keyed.md).
"""

from __future__ import annotations

import numpy as np

FLOAT64 = (53, -1074)  # (significant bits p, lowest bit of the smallest subnormal)
NO_BIT = 1 << 20  # the "lowest bit" given to a zero: above every finite one


def bits(A: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per entry: (lowest bit, significant bits) as int64; a zero gives (NO_BIT, 0), a
    non-finite entry (−NO_BIT, NO_BIT) so that any term it enters is never certified."""
    A = np.asarray(A, dtype=np.float64)
    finite = np.isfinite(A)
    m, e = np.frexp(np.where(finite, A, 0.0))
    odd = np.abs(m * 2.0 ** 53).astype(np.int64)  # the 53-bit integer mantissa, exactly
    low = odd & -odd  # its lowest set bit, a power of 2 (0 for a zero)
    tz = np.frexp(low.astype(np.float64))[1] - 1
    lowest = np.where(odd == 0, NO_BIT, e.astype(np.int64) - 53 + tz)
    sig = np.where(odd == 0, 0, 53 - tz)
    return np.where(finite, lowest, -NO_BIT), np.where(finite, sig, NO_BIT)


def exact_dots(X: np.ndarray, V: np.ndarray, c: np.ndarray, fmt=FLOAT64) -> np.ndarray:
    """Per row x of ``X`` (n×d) and row v of ``V`` (k×d): whether x·v + c_k is computed
    exactly in the format ``fmt`` = (p, lowest subnormal bit) by every evaluation; n×k
    booleans. ``c``: k constants, or n×k (a term of each row's own, such as η·x_k). The dot products are taken in groups that read the same columns, and only
    those columns are looked at (zero weights add exact zeros)."""
    c = np.broadcast_to(np.asarray(c, dtype=np.float64), (len(X), len(V)))
    read = np.flatnonzero(V.any(axis=0))
    X, V = X[:, read], V[:, read]
    xb, vb, cb = bits(X), bits(V), bits(c)
    out = np.empty((len(X), len(V)), dtype=bool)
    patterns, which = np.unique(V != 0, axis=0, return_inverse=True)
    for g, pattern in enumerate(patterns):
        cols, rows = np.flatnonzero(pattern), np.flatnonzero(which.reshape(-1) == g)
        step = max(1, CHUNK // max(1, len(rows) * len(cols)))
        for s in range(0, len(X), step):
            at = slice(s, s + step)
            out[at, rows] = _exact_rows(
                X[at][:, cols], [b[at][:, cols] for b in xb], V[np.ix_(rows, cols)],
                [b[np.ix_(rows, cols)] for b in vb], c[at][:, rows],
                [b[at][:, rows] for b in cb], fmt)
    return out


CHUNK = 1 << 20  # (row, dot product, term) triples looked at at once


def _exact_rows(X, xb, V, vb, c, cb, fmt) -> np.ndarray:
    """:func:`exact_dots` on a few rows and dot products that read every column of X, given
    the :func:`bits` of X, V and c."""
    p, emin = fmt
    (lx, sx), (lv, sv), (lc, sc) = xb, vb, cb
    x, v = X[:, None, :], V[None, :, :]
    live = x != 0
    a, w = sx[:, None, :], sv[None, :, :]
    fits = (~live | (a + w <= p) | (a == 1) | (w == 1)).all(axis=2)
    low = np.where(live, lx[:, None, :] + lv[None, :, :], NO_BIT).min(axis=2, initial=NO_BIT)
    low = np.minimum(low, np.where(c != 0, lc, NO_BIT))
    with np.errstate(over="ignore", invalid="ignore"):
        T = x * v
        pos = np.maximum(T, 0).sum(axis=2) + np.maximum(c, 0)
        neg = np.maximum(-T, 0).sum(axis=2) + np.maximum(-c, 0)
        size = np.maximum(pos, neg) * (1 + 4 * (V.shape[1] + 2) * 2.0 ** -p)
        room = np.ldexp(1.0, np.clip(p + low, -2000, 2000))
    return fits & (sc <= p) & (low >= emin) & (size <= room) & np.isfinite(size)
