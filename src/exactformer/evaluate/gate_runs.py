"""Runs of gated layers enclosed at once (docs/numerics.md#runs-of-gated-layers).

The keyed construction's moves are thousands of consecutive gated layers (:mod:`.gates`), each
changing a few rows. A tracking pass takes a run of them as one step: the run's *merged* gate
(every unit of every layer) names the rows S that some layer may change; a row outside S is
left as it is by the first layer, so the second sees it unchanged, and so on. On S the run is
the one FF F that holds every layer's units side by side, provided that

(a) on each row's box the units that may be on all belong to one layer k, and
(b) on the box F's enclosure gives that row, every unit of the layers after k is certainly off:

then each layer other than k adds exactly 0 to the row, before and after k's change, so the
layers in order compute F, and F's enclosure is theirs. A row that breaks (a) or (b) goes
through the layers one by one (a row of the construction that several moves could take,
the first of which turns the others off).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..model import side_by_side
from . import enclosure
from .gates import Gate, merged, same_form

RUN_UNITS = 64  # units of F at most: 16 layers of width 4 (measured best at 10⁴ sequences);
# a run of wide layers costs more as one F than layer by layer


@dataclass
class GateRun:
    """Blocks [start, end), their merged gate, F's parameters in float64 (η = 1) and each
    unit's layer in the run."""

    start: int
    end: int
    gate: Gate
    U: np.ndarray
    b: np.ndarray
    W: np.ndarray
    layer: np.ndarray

    def apply(self, st) -> None:
        """The run on the tracking pass ``st``: F at once on the rows where (a) and (b) hold,
        the layers in order on the others (rows are independent: an FF acts on each row
        alone)."""
        rows = self.gate.rows(st)
        if rows is None:  # most rows: F on every row, as cheap as one layer on them
            rows = np.arange(len(st.P))
        if not len(rows):
            return
        X, r = st.P[rows], st.rad[rows]
        own, mixed = self._own_layer(enclosure.maybe_on(X, r, self.U, self.b))
        out, rad = X.copy(), r.copy()
        fit = np.flatnonzero(~mixed)
        if len(fit):
            Xf, rf = out[fit], rad[fit]
            enclosure.ff_dense_into(Xf, rf, 1.0, self.U, self.b, self.W)
            later = self.layer[None, :] > own[fit, None]
            handed = (enclosure.maybe_on(Xf, rf, self.U, self.b) & later).any(axis=1)
            mixed[fit[handed]] = True
            keep = ~handed
            out[fit[keep]], rad[fit[keep]] = Xf[keep], rf[keep]
        if mixed.any():
            out[mixed], rad[mixed] = self._in_order(X[mixed], r[mixed])
        st.P[rows], st.rad[rows] = out, rad
        st.moved(rows)

    def _in_order(self, X, r) -> tuple[np.ndarray, np.ndarray]:
        """The run's layers one after another on the rows X ± r."""
        X, r = X.copy(), r.copy()
        for k in range(self.end - self.start):
            units = self.layer == k
            enclosure.ff_dense_into(X, r, 1.0, self.U[units], self.b[units], self.W[:, units])
        return X, r

    def _own_layer(self, on: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per row, the one layer whose units may be on (the run's length where none is),
        and whether units of two layers may be on."""
        last = self.end - self.start
        first = np.where(on, self.layer, last).min(axis=1)
        top = np.where(on, self.layer, -1).max(axis=1)
        return first, (top >= 0) & (top != first)


def gate_runs(blocks: list, gates: list) -> dict[int, GateRun]:
    """first block -> GateRun for consecutive blocks, :data:`RUN_UNITS` units at most, whose
    FFs are gated layers with one Q, R and key weight and whose attention is absent or the
    identity; ``blocks`` in float64."""
    out, i = {}, 0
    while i < len(blocks):
        j, units = i, 0
        while j < len(blocks) and gates[j] is not None \
                and units + len(blocks[j].ff.b) <= RUN_UNITS \
                and (blocks[j].sa is None or blocks[j].sa.is_identity()) \
                and same_form(gates[i], gates[j]):
            units += len(blocks[j].ff.b)
            j += 1
        if j - i >= 2:
            out[i] = _run(blocks, gates, i, j)
        i = max(j, i + 1)
    return out


def _run(blocks: list, gates: list, i: int, j: int) -> GateRun:
    ff, layer = side_by_side([b.ff for b in blocks[i:j]])
    return GateRun(i, j, merged(gates[i:j]), ff.U, ff.b, ff.W, layer)
