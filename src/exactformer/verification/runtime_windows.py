"""Window–flip pairs in the runtime proofs (docs/numerics.md#window-flip-pairs-in-the-proofs).

A tagging window writes its slot k at every row and the flip one layer later sets it back to
0 wherever the window reached 1 (:mod:`..evaluate.window_pairs`). Enclosed layer by layer, the
two layers cost a full enclosure of every distinct token each. In every runtime evaluation
that stores values in a format without cut matrix inputs (float32, bfloat16, float16) the
pair leaves a *far* row's slot at an exact 0 and nothing else changed: at the window one unit
is certainly off and the other's stored output a makes the stored slot + ω·a ≥ 1 (finite),
whatever the summation order; the flip then forms v − relu(v) + relu(1 − v) = v − v + 0, an
exact 0 in any order (1 − v ≤ 0 rounds to ≤ 0). So at a far row the window's units (at the
window) and the flip's (at the flip) are held off, as :mod:`.runtime_staged` holds a run's
other layers off: they are no term of any other column's sums, and the slot is set to 0 at
the flip. Only the near rows and the layers' other units are enclosed. TF32 cuts the flip's
input v to 11 bits, so v − relu(v) need not be 0 there: its proofs take the layers one by one.
NumPy only.
"""

from __future__ import annotations

import numpy as np

from ..evaluate.enclosure import U as U64
from ..evaluate.enclosure import lower, up, upper
from ..evaluate.window_pairs import Pair, window_pairs
from ..model import FF
from .formats import Format, theta
from .runtime_boxes import Weights, ff_units, finite, may_overflow, stored_residual
from .runtime_keys import coarse_bound

WINDOW_TERMS = 3  # terms of the slot's sum at the window: x_k and the window's two units


def runtime_pairs(layers: list, fmt: Format, taken: set) -> dict[int, list[Pair]]:
    """block L -> the window–flip pairs whose window is in L, read from the weights as the
    runtime stores them (the window's with any conversion radius, the flip's exact), none
    on a block of ``taken`` (the key stretches'); none in a format that cuts matrix inputs
    (``layers``: runtime_proof.prepare's)."""
    if fmt.matmul_bits is not None:
        return {}
    ffs = [_as_ff(ff) if i not in taken and stored_residual(ff, fmt) else None
           for i, (ff, _) in enumerate(layers)]  # (a stretch's layers: not read)
    out = {}
    for L, ps in window_pairs(ffs, [sa is None for _, sa in layers]).items():
        flip = layers[L + 1][0]
        ps = [p for p in ps if not (flip.U_r[p.flip].any() or flip.b_r[p.flip].any()
                                     or flip.W_r[:, p.flip].any())]
        if ps:
            out[L] = ps
    return out


def _as_ff(w: Weights) -> FF:
    return FF(1.0, w.U, w.b, w.W)


def pair_layer(Xm, Xr, w: Weights, opening: list[Pair], closing: dict, fmt: Format,
               maybe_on, ff_rows):
    """The FF ``w`` of one block on the rows Xm ± Xr (finite, every one), where the pairs
    ``opening`` have their window and those of ``closing`` (pair -> its far rows) their flip:
    (new arrays, the opened pairs' far rows). A far row of a closing pair holds that pair's
    units off and gets slot 0; of an opening pair, holds its window's units off and keeps its
    slot for the flip to clear. The rows at which no other unit may be on pass as they are.
    Where a row the layer computes may not be finite, no pair is opened (the zero attention the
    layouts run before the flip would spread nan, and the caller's rows be found again).
    ``maybe_on`` and ``ff_rows``: runtime_proof's."""
    held = np.zeros((len(Xm), len(w.U)), dtype=bool)
    for p, far in closing.items():
        held[np.ix_(far, p.flip)] = True
    opened = dict(zip(opening, far_rows(Xm, Xr, w, opening, fmt), strict=True)) if opening \
        else {}
    Ym, Yr = _held_layer(Xm, Xr, w, held, opened, fmt, maybe_on, ff_rows)
    if opened and not finite(Ym, Yr):
        opened = {}
        Ym, Yr = _held_layer(Xm, Xr, w, held, opened, fmt, maybe_on, ff_rows)
    for p, far in closing.items():
        Ym[far, p.k], Yr[far, p.k] = 0.0, 0.0
    return Ym, Yr, opened


def _held_layer(Xm, Xr, w: Weights, held, opened: dict, fmt: Format, maybe_on, ff_rows):
    """The layer on every row, with ``held`` and the windows of ``opened`` at their far rows
    held off."""
    held = held.copy()
    for p, far in opened.items():
        held[np.ix_(far, p.window)] = True
    rows = np.flatnonzero((maybe_on(Xm, Xr, w, fmt) & ~held).any(axis=1))
    Ym, Yr = Xm.copy(), Xr.copy()
    if len(rows):
        Ym[rows], Yr[rows] = ff_rows(Xm[rows], Xr[rows], w, fmt, off=held[rows])
    return Ym, Yr


def far_rows(Xm, Xr, w: Weights, pairs: list[Pair], fmt: Format) -> list[np.ndarray]:
    """Per pair of ``pairs`` (windows of the layer ``w``), the rows at which, in every
    runtime evaluation, one of the window's units is off and the stored slot + ω·a is at
    least 1 and finite: the slot is ≥ 0 on the row's box, and ω·a, the other unit's stored
    output a times its weight ω, is at least 1 + θ·S (S the sum of the slot's terms' sizes,
    θ of :data:`WINDOW_TERMS` terms): the slot's rounding in any order cannot take it below
    1. Every window's units are bounded in one product."""
    Z, R = coarse_bound(Xm, Xr, ff_units(w, np.concatenate([p.window for p in pairs])), fmt)
    th, tiny = theta(WINDOW_TERMS + 2, 3, fmt), 2 * WINDOW_TERMS * fmt.tiny
    out = []
    with np.errstate(invalid="ignore", over="ignore"):
        for n, p in enumerate(pairs):
            slot_lo, slot_hi = lower(Xm[:, p.k], Xr[:, p.k]), upper(Xm[:, p.k], Xr[:, p.k])
            far = np.zeros(len(Xm), dtype=bool)
            for on, off in ((2 * n, 2 * n + 1), (2 * n + 1, 2 * n)):
                unit = p.window[on - 2 * n]
                omega, omega_r = w.W[p.k, unit], w.W_r[p.k, unit]
                a_lo, a_hi = lower(Z[:, on], R[:, on]), upper(Z[:, on], R[:, on])
                size = up(slot_hi + upper(omega, omega_r) * a_hi, 2)
                least = lower(lower(omega, omega_r) * a_lo, U64 * lower(omega, omega_r) * a_lo)
                enough = least >= upper(1.0, up(th * size + tiny, 3))
                far |= (Z[:, off] <= -R[:, off]) & (R[:, off] < np.inf) & (a_lo > 0) & \
                    enough & ~may_overflow(size, 1 + th, tiny, fmt) & \
                    ~may_overflow(a_hi, 1.0, 0.0, fmt)
            out.append(np.flatnonzero(far & (slot_lo >= 0) & np.isfinite(slot_hi)))
    return out
