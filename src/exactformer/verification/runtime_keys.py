"""Key layers in the runtime proofs: the key lemma, and stretches of key layers enclosed at once.

A key layer (:mod:`..evaluate.keys`) can turn on, at a row whose key part is an exact scaled
key g·τ, only the unit whose key is τ, and the lemma holds in every runtime evaluation where
κ·g·(w − 1) plus the runtime's rounding stays ≤ −b (:func:`key_rows`). A position-key model is
hundreds of such layers with no attention between them, each moving a few rows; enclosed layer
by layer, each costs a fixed few milliseconds. A :class:`Stretch` of them is enclosed at once
(docs/numerics.md#stretches-of-key-layers): each row's key is read once; a row that no unit of
any layer may turn on passes as it is; a row that exactly one unit may turn on is enclosed
through that unit alone, every such row in one enclosure of the units side by side, and is
then checked to be left alone by every layer; any other row goes through the layers one by
one. NumPy only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..evaluate.enclosure import TINY
from ..evaluate.enclosure import U as U64
from ..evaluate.keys import KeyLayer, key_layers, row_keys
from ..model import FF
from .formats import ACC, Format, matmul_input_error, theta
from .runtime_boxes import Weights, ff_units, finite, scalar, side_by_side, stored_residual


def coarse_terms(k: int, fmt: Format) -> tuple[float, float, float]:
    """(c, t, grow) of the coarse bound R = c·S + t + grow·(|U|·r) on a pre-activation of
    k − 1 terms of sizes S (runtime_proof.maybe_on): the runtime's θ, its cut matmul inputs
    and float64's own rounding of Z and R."""
    grow = 1 + 4 * (k + 8) * U64
    c = (theta(k + 2, 2, fmt) + matmul_input_error(fmt) + (2 * k + 4) * U64) * grow
    return c, (4 * k + 20) * TINY + (2 * k + 8) * fmt.tiny, grow


def coarse_bound(Xm, Xr, w: Weights, fmt: Format):
    """(Z, R) per row and unit: every runtime value of the unit's stored pre-activation at the
    row's box lies in [Z − R, Z + R], compared exactly (runtime_proof.maybe_on); R is inf where a
    partial sum may overflow, and then nothing is known (Z may be ±inf or nan)."""
    k = int((w.U != 0).sum(axis=1).max(initial=0)) + 1
    c, t, grow = coarse_terms(k, fmt)
    with np.errstate(invalid="ignore", over="ignore"):
        Z = Xm @ w.U.T
        Z += w.b
        R = (np.abs(Xm) + Xr) @ (np.abs(w.U) + w.U_r).T
        R += np.abs(w.b) + w.b_r
        big = ~(R * 2 < ACC.huge)
        R *= c
        R += t
        if Xr.any():
            R += (Xr @ np.abs(w.U).T) * grow
        if w.U_r.any() or w.b_r.any():  # a weight stored either of two ways: its radius
            R += ((np.abs(Xm) + Xr) @ w.U_r.T + w.b_r) * grow
        R[big] = np.inf
    return Z, R


def key_layer(w: Weights) -> KeyLayer | None:
    """The layer as a key layer, read from the weights as the runtime stores them (exactly:
    no conversion radius), or None."""
    if not _stored_exactly(w) or len(w.U) < 2:
        return None
    return key_layers([_as_ff(w)])[0]


def _stored_exactly(w: Weights) -> bool:
    return not (w.U_r.any() or w.b_r.any())


def _as_ff(w: Weights) -> FF:
    return FF(scalar(w.eta), w.U, w.b, w.W)


def key_rows(Xm, Xr, w: Weights, fmt: Format, key: KeyLayer):
    """Rows the key lemma decides, and the unit each may turn on (−1: none). A finite row
    whose key part is exactly g·τ (no radius there), τ of weight at most w, has
    U_i·x + b ≤ κ·g·(w − 1) + b at every unit i but the one with key τ, every term of the
    unit's sum bounded by S = κ·g·w + |b|; the unit is off in every runtime evaluation when
    κ·g·(w − 1) + c·S + t ≤ −b with :func:`coarse_terms`' c and t (no radius: no spread),
    all positive terms, so a float64 sum inflated by (1 + 16u) bounds the exact one, and
    when no partial sum can overflow."""
    code, g, weight = row_keys(Xm[:, key.Q], Xr[:, key.Q])
    finite = np.isfinite(Xm).all(axis=1) & np.isfinite(Xr).all(axis=1)
    lone = finite & _lone(g, weight, float(key.kappa), float(key.b), key.w, fmt)
    at = np.minimum(np.searchsorted(key.codes, code), len(key.codes) - 1)
    unit = np.where((weight == key.w) & (key.codes[at] == code), key.units[at], -1)
    return lone, unit


def _lone(g, weight, kappa: float, b: float, w: int, fmt: Format) -> np.ndarray:
    """:func:`key_rows`' test of the rows' keys (scale ``g``, ``weight``), finiteness aside."""
    c, t, _ = coarse_terms(w + 1, fmt)
    with np.errstate(over="ignore", invalid="ignore"):
        size = kappa * g * w - b
        need = (kappa * g * (w - 1) + c * size + t) * (1 + 16 * U64) + TINY
        return (weight >= 0) & (weight <= w) & (need <= -b) & (size * 2 < ACC.huge)


@dataclass
class Stretch:
    """Blocks [start, end): FF key layers on one Q and weight w, no attention; their distinct
    (κ, b); the layers, and every unit of every layer side by side in one layer (a layer's
    units start at ``offset``); every unit's key, sorted, with its layer and its index
    there."""

    start: int
    end: int
    Q: np.ndarray
    w: int
    kappa_b: np.ndarray  # the layers' distinct (κ, b)
    layers: list[Weights]
    offset: np.ndarray
    side: Weights
    codes: np.ndarray
    layer: np.ndarray
    unit: np.ndarray


def stretches(layers: list, fmt: Format) -> dict[int, Stretch]:
    """First block -> :class:`Stretch` for every maximal stretch of two or more blocks whose
    FF is a residual key layer stored exactly and finite (η = 1; U and b with no conversion
    radius; W stored finite) on one Q and w, with no attention (``layers``:
    runtime_proof.prepare's)."""
    ok = [stored_residual(ff, fmt) and sa is None and _stored_exactly(ff) and len(ff.U) >= 2
          for ff, sa in layers]
    keys = key_layers([_as_ff(ff) if good else None
                       for (ff, _), good in zip(layers, ok, strict=True)])
    out, i = {}, 0
    while i < len(layers):
        j = i
        while j < len(layers) and keys[j] is not None and keys[i] is not None and \
                keys[j].w == keys[i].w and np.array_equal(keys[j].Q, keys[i].Q):
            j += 1
        if j - i >= 2:
            out[i] = _stretch(i, j, [ff for ff, _ in layers[i:j]], keys[i:j])
        i = max(j, i + 1)
    return out


def _stretch(start: int, end: int, ffs: list[Weights], keys: list[KeyLayer]) -> Stretch:
    sizes = np.array([len(ff.U) for ff in ffs])
    side, _ = side_by_side(ffs)
    codes = np.concatenate([k.codes for k in keys])
    layer = np.repeat(np.arange(len(keys)), [len(k.codes) for k in keys])
    unit = np.concatenate([k.units for k in keys])
    order = np.argsort(codes, kind="stable")
    kappa_b = np.unique([(float(k.kappa), float(k.b)) for k in keys], axis=0)
    return Stretch(start, end, keys[0].Q, keys[0].w, kappa_b, ffs,
                   np.concatenate([[0], np.cumsum(sizes)[:-1]]), side, codes[order],
                   layer[order], unit[order])


def apply_stretch(Xm, Xr, s: Stretch, fmt: Format, ff_box):
    """The stretch's layers on the rows Xm ± Xr (finite, every one), as new arrays; None
    where a row may stop being finite on the way (then the zero attention the layouts run
    before each FF may spread nan through its sequence: the caller goes layer by layer).
    ``ff_box``: one FF layer's enclosure (runtime_proof.ff_box)."""
    if not finite(Xm, Xr):
        return None
    lone, layer, unit = _hits(Xm, Xr, s, fmt)
    Ym, Yr = Xm.copy(), Xr.copy()
    once = np.flatnonzero(lone & (layer >= 0))
    alone = np.ones(len(once), dtype=bool)
    if len(once):
        moving = ff_units(s.side, np.unique(s.offset[layer[once]] + unit[once]))
        Fm, Fr = ff_box(Xm[once], Xr[once], moving, fmt)
        if not finite(Fm, Fr):
            return None
        after, hit, _ = _hits(Fm, Fr, s, fmt)
        alone = after & (hit == -1)
        Ym[once[alone]], Yr[once[alone]] = Fm[alone], Fr[alone]
    slow = np.union1d(np.flatnonzero(~lone | (layer == -2)), once[~alone])
    for ff in s.layers if len(slow) else ():
        Ym[slow], Yr[slow] = ff_box(Ym[slow], Yr[slow], ff, fmt)
        if not finite(Ym[slow], Yr[slow]):
            return None
    return Ym, Yr


def _hits(Xm, Xr, s: Stretch, fmt: Format):
    """Per row: whether the key lemma decides it in every layer of the stretch, and the one
    unit of the stretch that may turn on there, as (layer, unit in the layer): layer −1
    where none may, −2 where several may."""
    code, g, weight = row_keys(Xm[:, s.Q], Xr[:, s.Q])
    lone = np.ones(len(Xm), dtype=bool)
    for kappa, b in s.kappa_b.tolist():
        lone &= _lone(g, weight, kappa, b, s.w, fmt)
    lo = np.searchsorted(s.codes, code, side="left")
    n = np.where(weight == s.w, np.searchsorted(s.codes, code, side="right") - lo, 0)
    at = np.minimum(lo, len(s.codes) - 1)
    layer = np.where(n == 1, s.layer[at], np.where(n == 0, -1, -2))
    return lone, layer, np.where(n == 1, s.unit[at], -1)
