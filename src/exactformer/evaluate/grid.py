"""Sums that no evaluation can round: the grid certificate (docs/numerics.md#grid).

Every nonzero float is odd·q with q a power of two, its *lowest bit*. Terms that are all
multiples of q, and whose every partial sum is at most S in magnitude, are added exactly in
any order and any blocking, fused or not, by a format of p significant bits whenever
S < q·2^p and q is no finer than the format's smallest step: each partial sum is then a
representable multiple of q. The products x·v of a dot product are multiples of the product of
their lowest bits, and single terms are partial sums too, so the products are exact as well.
The float64 enclosures (:mod:`.enclosure`) and the runtime proofs (verification/runtime_*)
both stand on these two functions; the keyed construction's flips, clips, resets and moves are
such sums, which is why their enclosures do not widen (docs/keyed.md).
"""

from __future__ import annotations

import numpy as np

FLOAT64 = (53, 2.0 ** -1074, float(np.finfo(np.float64).max))  # (bits, smallest step, largest)
MARGIN = 2.0 ** -40  # relative: covers the rounding of a size computed in float64


def lowbit(x) -> np.ndarray:
    """The value of the lowest set bit of each |x| (x = odd·lowbit), inf for 0 and for
    non-finite x: every sum of such terms is a multiple of the smallest. From the bits: with
    that bit cleared, |x| keeps its exponent (the leading bit stays) and loses exactly the
    lowest bit, so the difference is exact (Sterbenz); a normal power of two, whose stored
    fraction is 0, is its own lowest bit."""
    a = np.abs(np.asarray(x, dtype=np.float64))
    bits = a.view(np.int64)
    low = a - (bits & (bits - 1)).view(np.float64)
    power = (bits & FRACTION) == 0
    with np.errstate(invalid="ignore"):
        return np.where(np.isfinite(a) & (a != 0), np.where(power, a, low), np.inf)


FRACTION = (1 << 52) - 1  # the stored fraction bits of a float64


def fits_exactly(size, q, bits: int, tiny: float) -> np.ndarray:
    """Every partial sum of terms that are multiples of q, each at most ``size`` in
    magnitude, is stored exactly by a format of ``bits`` significant bits whose smallest step
    is ``tiny``, whatever the order: a multiple of q below q·(2^bits + 1) is at most
    q·2^bits, which ``bits`` bits store, so a bound inflated by less than q still decides
    (for 53 bits the float64 threshold rounds down to q·2^53, which is safe)."""
    with np.errstate(invalid="ignore", over="ignore"):
        return (q >= tiny) & (size < q * (2.0 ** bits + 1))


def supports(V: np.ndarray) -> list[np.ndarray]:
    """The rows of V grouped by the columns they read (a layer has few distinct ones)."""
    groups: dict = {}
    for i, row in enumerate(V != 0):
        groups.setdefault(row.tobytes(), []).append(i)
    return [np.array(g) for g in groups.values()]


def exact_dots(X: np.ndarray, V: np.ndarray, c, fmt=FLOAT64, held=None) -> np.ndarray:
    """Per row x of ``X`` (n×d) and row v of ``V`` (k×d): whether x·v + c_k is computed
    exactly by every evaluation in the format ``fmt`` = (bits, smallest step, largest
    number); n×k booleans.
    ``c``: k constants, or n×k (a term of each row's own, such as η·x_k). The terms' lowest
    bit is bounded below per group of dot products reading the same columns, so that a unit
    reading one exact code is not judged by the data another unit reads. ``held`` (n×d): per
    row, columns whose x is an exact 0 that is no term of the row's sums (a staged run's other
    layers, :mod:`.staged`): their entries of v are not the row's terms either."""
    bits, tiny, huge = fmt
    c = np.broadcast_to(np.asarray(c, dtype=np.float64), (len(X), len(V)))
    lx = lowbit(X)
    lv = lowbit(V)  # (a zero entry's lowbit is inf)
    if held is None:
        qv = lv.min(axis=1, initial=np.inf)[None, :]
    else:  # per pattern of held columns (a stage's rows hold a few: one a layer)
        pats, which = np.unique(held, axis=0, return_inverse=True)
        qv = np.where(pats[:, None, :], np.inf, lv[None]).min(axis=2, initial=np.inf)
        qv = qv[which.reshape(-1)]
    q = lowbit(c).copy()
    with np.errstate(over="ignore", invalid="ignore"):
        for rows in supports(V):
            qx = lx[:, V[rows[0]] != 0].min(axis=1, initial=np.inf)
            q[:, rows] = np.minimum(q[:, rows], qx[:, None] * qv[:, rows])
        Xp, Xn, Vp, Vn = (np.maximum(a, 0.0) for a in (X, -X, V, -V))
        pos = Xp @ Vp.T + Xn @ Vn.T + np.maximum(c, 0.0)
        neg = Xp @ Vn.T + Xn @ Vp.T + np.maximum(-c, 0.0)
        size = np.maximum(pos, neg) * (1 + MARGIN)
    return fits_exactly(size, q, bits, tiny) & (size <= huge)  # no partial sum overflows
