"""Lowest-bit bounds of the attention's terms π_il·x_lj in the runtime proofs (the exactness
test of an average: docs/numerics.md#proofs-for-reduced-precision-runtimes). NumPy only.
"""

from __future__ import annotations

import numpy as np

from .formats import Format, fits
from .runtime_boxes import quantum

BATCH_CELLS = 2 ** 21  # terms (B·n·n·D) of the exactness test handled at once


def term_bits(Pm, Pr, Xm, Xr, fmt: Format) -> tuple[np.ndarray, np.ndarray]:
    """Lower bounds on the lowest bits of the weights (B×n×n: inf where the weight is
    certainly 0, 0 where it is uncertain or TF32 may cut it) and of the keys (B×n×D)."""
    lbP = np.where((Pm != 0) | (Pr > 0), quantum(Pm, Pr, fmt), np.inf)
    lbP = np.where(Pr > 0, 0.0, lbP)
    if fmt.matmul_bits is not None:
        lbP = np.where(fits(Pm, fmt.matmul_bits) & (Pr == 0), lbP, 0.0)
    return lbP, key_bits(Xm, Xr, fmt)


def key_bits(Xm, Xr, fmt: Format) -> np.ndarray:
    """Lower bounds on the lowest bits of the keys (B×n×D): 0 where TF32 may cut one."""
    lbX = quantum(Xm, Xr, fmt)
    if fmt.matmul_bits is not None:
        lbX = np.where(fits(Xm, fmt.matmul_bits) & (Xr == 0), lbX, 0.0)
    return lbX


def min_products(lbP, lbX) -> np.ndarray:
    """min over keys l of lbP[b, i, l]·lbX[b, l, j] (a nan product, 0·inf, counts as inf),
    for the m ≤ n query rows i of lbP (B×m×n).
    A 0 weight bit against a finite key bit makes it 0, and a coordinate no key has a finite
    bit in makes it inf: both are found for all rows at once, and the min over keys runs
    only on rows with some other coordinate."""
    B, n, D = lbX.shape
    m = lbP.shape[1]  # the query rows: n, or fewer (runtime_attention.shared_query)
    zero = ((lbP == 0).astype(float) @ np.isfinite(lbX).astype(float)) > 0
    empty = ~np.isfinite(lbX).any(axis=1, keepdims=True)
    q = np.where(empty, np.inf, np.zeros((B, m, D)))
    rows = np.flatnonzero(~(zero | empty).all(axis=2).reshape(-1))
    lbP = lbP.reshape(B * m, n)[rows]
    step = max(1, BATCH_CELLS // max(1, n * D))
    with np.errstate(over="ignore", invalid="ignore"):
        for s in range(0, len(rows), step):
            prod = lbP[s:s + step, :, None] * lbX[rows[s:s + step] // m]
            q.reshape(B * m, D)[rows[s:s + step]] = np.where(np.isnan(prod), np.inf,
                                                              prod).min(axis=1)
    return q
