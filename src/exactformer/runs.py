"""Runs of hat layers applied in one sweep (see docs/numerics.md#runs-of-hat-layers).

Consecutive residual FF layers with no attention between them, all made of hats reading one
direction f (the leader and interpolation phases: one layer per hat, tens of thousands of
layers), are applied row by row instead of layer by layer: a row goes through the windows of
the run that can reach it, in layer order, and after each move looks up the first window of a
*later* layer that can reach its new position. FF layers act on each row alone, so this is the
same computation as the layer-by-layer pass, with every row of a step in one vectorised call.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from . import enclosure


@dataclass
class Run:
    """Blocks [start, end) whose windows all read f: per window its block, its ends and its
    units U_k = σ_k·f, b_k, W_k = ω_k·w (``enclosure.gadget_form``)."""

    start: int
    end: int
    f: np.ndarray
    layer: np.ndarray  # (J,) block index of each window, nondecreasing
    lo: np.ndarray
    hi: np.ndarray
    sig: np.ndarray  # (J, h)
    b: np.ndarray  # (J, h)
    om: np.ndarray  # (J, h)
    w: np.ndarray  # (J, d)


def plan_runs(blocks, ridges) -> dict[int, Run]:
    """The runs of a float64 pass, keyed by their first block: maximal stretches of two or
    more blocks whose FF is a ridge layer of gadget hats (all of one width) on one direction,
    with no attention."""
    runs, cur = {}, []

    def close():
        if len(cur) >= 2:
            runs[cur[0][0]] = _run(cur)
        cur.clear()

    for i, (blk, ridge) in enumerate(zip(blocks, ridges, strict=True)):
        parts = _hat_parts(blk, ridge)
        if parts is None or (cur and not _same_run(cur[-1][1][0], parts[0])):
            close()
        if parts is not None:
            cur.append((i, parts))
    close()
    return runs


def _hat_parts(blk, ridge):
    """[(f, lo, hi, σ, b, ω, w)] for a block that can join a run, else None."""
    if blk.ff is None or ridge is None or (blk.sa is not None and not blk.sa.is_identity()):
        return None
    out = []
    for r, part in ridge:
        form = enclosure.gadget_form(part.U, part.b, part.W)
        if form is None or not np.array_equal(form[0], r.f):
            return None
        f, sig, w, om = form
        out.append((f, float(r.lo), float(r.hi), sig, part.b, om, w))
    return out


def _same_run(a, b) -> bool:
    """Can the windows a and b (see :func:`_hat_parts`) share a run: one width, one f."""
    return len(a[3]) == len(b[3]) and np.array_equal(a[0], b[0])


def _run(blocks: list) -> Run:
    rows = [(i, *p) for i, parts in blocks for p in parts]
    if len({len(r[4]) for r in rows}) != 1:  # every window must have the same width
        rows = rows[:0]
    return Run(blocks[0][0], blocks[-1][0] + 1, rows[0][1] if rows else None,
               np.array([r[0] for r in rows]), np.array([r[2] for r in rows]),
               np.array([r[3] for r in rows]), np.array([r[4] for r in rows]),
               np.array([r[5] for r in rows]), np.array([r[6] for r in rows]),
               np.array([r[7] for r in rows]))


# ------------------------------------------------------------------------------ applying
def apply_run(st, run: Run, stats, scale: float) -> bool:
    """Apply the run to the state; False (nothing done) when it cannot be swept: windows of
    one layer that the rows' radii make overlap. ``st`` is the evaluator's state."""
    if run.f is None or not len(run.layer):
        return False
    sp = st.projection(run.f)
    sp.refresh()
    tracked = st.rad is not None
    widening = st.reach(run.f) if tracked else 0.0
    stab = _Stabber.widened(run, widening, tracked)
    if stab is None:
        return False
    rows, wins = _first_windows(sp, stab.lo_w, stab.hi_w)
    if stats.enabled:
        _clearance(sp, run, stats, scale)
    while len(rows):
        moved = _step(st, run, rows, wins)
        if tracked:
            stab, widening = _rewiden(st, run, rows, stab, widening)
        t = st.P[rows] @ run.f
        st.moved(rows[moved])  # refreshes every sorted index, this run's included
        st.grew(rows[~moved])  # rows near a window: their radius grew
        nxt = stab.next(t, run.layer[wins])
        keep = nxt >= 0
        rows, wins = rows[keep], nxt[keep]
    return True


def _rewiden(st, run: Run, rows, stab, widening: float):
    """The windows are widened by the rows' reach along f. When a row that just took a step
    now reaches further, widen them again (to twice that, so this happens rarely); if that
    would make two windows of one layer overlap, give those rows up (radius inf: their pairs
    go to the exact pass) and keep the windows."""
    own = enclosure.dot_radius(st.P[rows], st.rad[rows], run.f)
    grown = np.isfinite(own) & (own > widening)
    if not grown.any():
        return stab, widening
    wider = _Stabber.widened(run, 2 * float(own[grown].max()), True)
    if wider is not None:
        return wider, 2 * float(own[grown].max())
    st.rad[rows[grown]] = np.inf
    return stab, widening


def _overlap_in_a_layer(layer, lo, hi) -> bool:
    """Do two windows of one layer overlap (as open intervals)?"""
    order = np.lexsort((lo, layer))
    same = layer[order][1:] == layer[order][:-1]
    return bool((same & (hi[order][:-1] > lo[order][1:])).any())


def _first_windows(sp, lo, hi) -> tuple[np.ndarray, np.ndarray]:
    """Every row with lo < t < hi for some window, with the first such window."""
    i0 = np.searchsorted(sp.sorted_t, lo, side="right")
    i1 = np.searchsorted(sp.sorted_t, hi, side="left")
    count = np.maximum(i1 - i0, 0)
    win = np.repeat(np.arange(len(lo)), count)
    starts = np.repeat(i0, count) + (np.arange(count.sum()) - np.repeat(np.cumsum(count) - count,
                                                                          count))
    rows = sp.order[starts]
    order = np.lexsort((win, rows))
    rows, win = rows[order], win[order]
    first = np.concatenate([[True], rows[1:] != rows[:-1]]) if len(rows) else rows.astype(bool)
    return rows[first], win[first]


class _Stabber:
    """The first window (in run order) of a layer after a given one whose interval (already
    widened by the rows' reach) holds t."""

    @classmethod
    def widened(cls, run: Run, widening: float, tracked: bool):
        """The run's windows widened by ``widening`` plus the rounding of their ends (none
        for a plain float pass), or None when two windows of one layer would overlap."""
        if not tracked:
            return cls(run.layer, run.lo, run.hi)
        pad = enclosure.window_pad(widening, run.lo, run.hi)
        lo, hi = enclosure.lower(run.lo, pad), enclosure.upper(run.hi, pad)
        return None if _overlap_in_a_layer(run.layer, lo, hi) else cls(run.layer, lo, hi)

    def __init__(self, layer, lo, hi):
        self.lo_w, self.hi_w = lo, hi
        self.order = np.argsort(lo, kind="stable")
        self.lo, self.hi = lo[self.order], hi[self.order]
        self.layer = layer[self.order]
        self.hi_max = np.maximum.accumulate(self.hi)  # largest hi among windows up to here

    def next(self, t, after) -> np.ndarray:
        k = np.searchsorted(self.lo, t, side="left") - 1  # windows 0..k have lo < t
        out = np.full(len(t), -1)
        kk = np.maximum(k, 0)
        hit = (k >= 0) & (self.hi[kk] > t) & (self.layer[kk] > after)
        out[hit] = self.order[kk[hit]]
        prev = np.where(k >= 1, self.hi_max[np.maximum(k - 1, 0)], -np.inf)
        for i in np.flatnonzero((k >= 1) & (prev > t)).tolist():  # nested windows: scan back
            out[i] = self._scan(t[i], after[i], k[i])
        return out

    def _scan(self, t, after, k) -> int:
        best = -1
        for j in range(k, -1, -1):
            if self.hi_max[j] <= t:
                break
            if self.hi[j] > t and self.layer[j] > after:
                o = int(self.order[j])
                best = o if best < 0 else min(best, o)
        return best


def _clearance(sp, run: Run, stats, scale: float) -> None:
    """The hat clearance at the start of the run: each window's distance to the nearest row
    outside it, over the coordinate scale times |f|."""
    st_ = sp.sorted_t
    i0 = np.searchsorted(st_, run.lo, side="right")
    i1 = np.searchsorted(st_, run.hi, side="left")
    below = np.where(i0 > 0, run.lo - st_[np.maximum(i0 - 1, 0)], np.inf)
    above = np.where(i1 < len(st_), st_[np.minimum(i1, len(st_) - 1)] - run.hi, np.inf)
    gap = float(np.minimum(below, above).min(initial=np.inf))
    if math.isfinite(gap):
        stats._min("hat_clearance", gap / (scale * float(np.linalg.norm(run.f))))


def _step(st, run: Run, rows, wins) -> np.ndarray:
    """Apply window wins[i] to row rows[i] (each row once); returns which rows moved."""
    X = st.P[rows]
    if st.rad is not None:
        return _tracked_step(st, run, rows, wins, X)
    t = X @ run.f
    inside = (t > run.lo[wins]) & (t < run.hi[wins])
    Z = t[:, None] * run.sig[wins] + run.b[wins]
    change = (np.maximum(Z, 0.0) * run.om[wins]).sum(axis=1)[:, None] * run.w[wins]
    st.P[rows[inside]] = X[inside] + change[inside]
    return inside


def _tracked_step(st, run: Run, rows, wins, X) -> np.ndarray:
    """:func:`_step` with radii (``enclosure.gadget_rows``): rows inside their window move,
    rows only near it keep their value and add the bound on the change their box allows."""
    r = st.rad[rows]
    g = enclosure.gadget_rows(X, r, run.f, run.sig[wins], run.b[wins], run.om[wins],
                              run.w[wins], run.lo[wins], run.hi[wins])
    st.P[rows[g.inside]] = X[g.inside] + g.change[g.inside]
    st.rad[rows] = np.where(g.inside[:, None], g.whole, enclosure.up(r + g.alone, 2))
    return g.inside
