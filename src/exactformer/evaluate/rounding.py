"""Float64 rounding bounds shared by the enclosures (docs/numerics.md#enclosures): a sum's
rounding, a bound's own inflation, and outward ends of a midpoint–radius box."""

from __future__ import annotations

import numpy as np

U = 2.0 ** -53  # unit roundoff of float64
TINY = 2.0 ** -1022  # absolute slack per operation: covers underflow to subnormals or zero
FLOOR = 2.0 ** -510  # > sqrt(2^-1022): a distance whose square underflows is below it


def rounding(S, n: int, out=None):
    """Bound on the rounding error of a float64 sum of n products (any order, FMA or not)
    whose absolute values add up to S (S computed in float64 itself); into ``out`` (which
    may be S) when given, with the same operations."""
    if out is None:
        return (2 * n + 4) * U * S + (2 * n + 4) * TINY
    np.multiply(S, (2 * n + 4) * U, out=out)
    out += (2 * n + 4) * TINY
    return out


def up(r, n: int, out=None):
    """``r`` (a nonnegative bound computed with at most n float operations) inflated so that
    it bounds the exactly computed quantity too; into ``out`` (which may be r) when given,
    with the same operations."""
    if out is None:
        return r * (1 + 4 * (n + 2) * U) + (n + 2) * TINY
    np.multiply(r, 1 + 4 * (n + 2) * U, out=out)
    out += (n + 2) * TINY
    return out


def lower(m, r):
    """A float ≤ m − r exactly (one step below the rounded difference; m itself where r is
    0, so that an exact value keeps a zero-width hull)."""
    return np.where(r == 0, m, np.nextafter(m - r, -np.inf))


def upper(m, r):
    """A float ≥ m + r exactly (m itself where r is 0)."""
    return np.where(r == 0, m, np.nextafter(m + r, np.inf))
