"""Runs of residual FF layers in the runtime proofs, enclosed in stages
(docs/numerics.md#staged-runs, docs/numerics.md#proofs-for-reduced-precision-runtimes).

The float64 enclosures' staged runs (:mod:`..evaluate.staged`) for every runtime evaluation:
a residual layer whose units are certainly off at a row's box adds an exact 0 there in every
runtime, so each row goes through the layers that may act on it, in order. At a stage each row
takes the first layer at or after its place with a unit that may be on at its box, and one
enclosure takes every row of the stage through the run's units side by side, each row with
every other layer's units held off (``off`` of :func:`.runtime_proof.ff_rows`: what its own
layer computes, whose dot products hold no such terms). A keyed softmax model's thousands of
move layers (a snap, then the pair that reads it) so cost a few enclosures a run, not one a
layer. NumPy only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .formats import Format
from .runtime_boxes import Weights, finite, side_by_side, stored_residual

RUN_UNITS = 256  # units side by side at most (as evaluate/staged.py)
LIVE_SHARE = 0.5  # the share of the rows up to which a run is staged


@dataclass
class StagedRun:
    """Blocks [start, end) as one layer of every layer's units side by side (``merged``),
    each unit's layer in the run in ``layer``."""

    start: int
    end: int
    merged: Weights
    layer: np.ndarray


def staged_runs(layers: list, fmt: Format, taken: set) -> dict[int, StagedRun]:
    """First block -> :class:`StagedRun` for every maximal stretch of two or more blocks,
    none in ``taken`` (the key stretches'), whose FF is residual (η exactly 1), with W stored
    finite, and with no attention, :data:`RUN_UNITS` units in all at most (``layers``:
    runtime_proof.prepare's)."""
    ok = [i not in taken and stored_residual(ff, fmt) and sa is None and len(ff.U) > 0
          for i, (ff, sa) in enumerate(layers)]
    out, i = {}, 0
    while i < len(layers):
        j, units = i, 0
        while j < len(layers) and ok[j] and units + len(layers[j][0].U) <= RUN_UNITS:
            units += len(layers[j][0].U)
            j += 1
        if j - i >= 2:
            out[i] = StagedRun(i, j, *side_by_side([ff for ff, _ in layers[i:j]]))
        i = max(j, i + 1)
    return out


def apply_staged(Xm, Xr, run: StagedRun, fmt: Format, maybe_on, ff_rows):
    """The run's layers on the rows Xm ± Xr, as new arrays; None where most rows may change
    (the layers one by one take them for less) or a row may stop being finite on the way (the
    zero attention the layouts run before each FF may then spread nan through its sequence:
    the caller goes layer by layer). ``maybe_on`` and ``ff_rows``: runtime_proof's."""
    if not finite(Xm, Xr):
        return None
    w, n = run.merged, int(run.layer[-1]) + 1
    on = maybe_on(Xm, Xr, w, fmt)
    rows = np.flatnonzero(on.any(axis=1))
    if len(rows) > LIVE_SHARE * len(Xm):
        return None
    Ym, Yr, on = Xm.copy(), Xr.copy(), on[rows]
    place = np.zeros(len(rows), dtype=np.int64)  # each row's next layer in the run
    todo = np.arange(len(rows))
    while len(todo):
        layer = np.where(on & (run.layer >= place[todo, None]), run.layer, n).min(axis=1)
        todo, layer = todo[layer < n], layer[layer < n]
        if not len(todo):
            break
        at = rows[todo]
        Fm, Fr = ff_rows(Ym[at], Yr[at], w, fmt, off=run.layer != layer[:, None])
        if not finite(Fm, Fr):
            return None
        Ym[at], Yr[at] = Fm, Fr
        place[todo] = layer + 1
        on = maybe_on(Fm, Fr, w, fmt)
    return Ym, Yr
