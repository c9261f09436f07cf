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
from .rows import Rows


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
    with no attention. Every window's gadget form is found in batch (:class:`_Windows`)."""
    wins = [(i, r, part) for i, (blk, ridge) in enumerate(zip(blocks, ridges, strict=True))
            if blk.ff is not None and ridge is not None
            and (blk.sa is None or blk.sa.is_identity()) for r, part in ridge]
    if not wins:
        return {}
    t = _Windows.of(wins)
    good = np.ones(len(blocks), dtype=bool)  # every window of the block is a gadget
    good[t.layer[~t.ok]] = False
    first = np.flatnonzero(np.concatenate([[True], t.layer[1:] != t.layer[:-1]]))
    first = first[good[t.layer[first]]]  # the first window of every good block
    a, b = first[:-1], first[1:]
    joins = ((t.layer[b] == t.layer[a] + 1) & (t.width[b] == t.width[a])
             & (t.f[b] == t.f[a]).all(axis=1))  # next block, same width and f
    cuts = [0, *(np.flatnonzero(~joins) + 1).tolist(), len(first)]
    return {int(t.layer[first[s]]): t.run(int(first[s]), int(first[e - 1]))
            for s, e in zip(cuts[:-1], cuts[1:], strict=True) if e - s >= 2}


FORM_CHUNK = 16384  # windows whose gadget forms are found at once (bounds temporary memory)


@dataclass
class _Windows:
    """The windows of all blocks that may join a run, in block order: per window its block,
    width (units), row in the arrays of its width, gadget test, form f and ends; per width the
    forms' σ, b, ω, w (``enclosure.gadget_forms``)."""

    layer: np.ndarray
    width: np.ndarray
    slot: np.ndarray
    ok: np.ndarray  # a gadget whose f is its ridge's f
    f: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    by_width: dict

    @classmethod
    def of(cls, wins: list) -> _Windows:
        """From (block, ridge, part) triples."""
        n = len(wins)
        width = np.array([len(part.b) for _, _, part in wins])
        slot, ok = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=bool)
        f, by_width = np.zeros((n, len(wins[0][1].f))), {}
        for h in sorted(set(width.tolist())):
            idx = np.flatnonzero(width == h)
            slot[idx] = np.arange(len(idx))
            ok[idx], f[idx], *by_width[h] = _forms([wins[j] for j in idx.tolist()])
        lo = np.array([float(r.lo) for _, r, _ in wins])
        hi = np.array([float(r.hi) for _, r, _ in wins])
        e = _power_of(f, [lo, hi, *(by_width[h][0] for h in by_width)], width, slot)
        for h, (sig, *_) in by_width.items():
            idx = np.flatnonzero(width == h)
            sig[slot[idx]] = np.ldexp(sig[slot[idx]], e[idx][:, None])
        return cls(np.array([i for i, _, _ in wins]), width, slot, ok,
                   np.ldexp(f, -e[:, None]), np.ldexp(lo, -e), np.ldexp(hi, -e), by_width)

    def run(self, w0: int, last: int) -> Run:
        """The run of the blocks from window w0's to window ``last``'s; without windows (never
        swept) when they are not all of one width."""
        w1 = int(np.searchsorted(self.layer, self.layer[last], side="right"))
        start, end = int(self.layer[w0]), int(self.layer[last]) + 1
        h = int(self.width[w0])
        if (self.width[w0:w1] != h).any():
            e = np.array([])
            return Run(start, end, None, e, e, e, e, e, e, e)
        s = slice(int(self.slot[w0]), int(self.slot[w0]) + w1 - w0)
        sig, b, om, w = (a[s] for a in self.by_width[h])
        return Run(start, end, self.f[w0], self.layer[w0:w1], self.lo[w0:w1], self.hi[w0:w1],
                   sig, b, om, w)


def _power_of(f, arrays, width, slot) -> np.ndarray:
    """Per window the power of two 2^e with f = 2^e·g, g's first nonzero entry in [1, 2): a
    layer stored with its units scaled by a power of two (balancing, docs/numerics.md) reads
    c·f, and windows on f·x = 2^e·(g·x) are the same windows on g·x with ends over 2^e and
    slopes σ times 2^e, so layers of any balance join one run, bitwise the same computation.
    e = 0 where a scaled end or slope would not be exact (a subnormal or an overflow)."""
    j = np.argmax(f != 0, axis=1)
    e = np.frexp(np.abs(f[np.arange(len(f)), j]))[1] - 1
    lo, hi, *sigs = arrays
    exact = np.ones(len(f), dtype=bool)
    for a in (lo, hi):
        exact &= np.ldexp(np.ldexp(a, -e), e) == a
    for h, sig in zip(sorted(set(width.tolist())), sigs, strict=True):
        idx = np.flatnonzero(width == h)
        s = sig[slot[idx]]
        exact[idx] &= (np.ldexp(np.ldexp(s, e[idx][:, None]), -e[idx][:, None]) == s).all(axis=1)
    g = np.ldexp(f, -e[:, None])
    exact &= (np.ldexp(g, e[:, None]) == f).all(axis=1)
    return np.where(exact, e, 0)


def _forms(wins: list) -> tuple:
    """(ok, f, σ, b, ω, w) of windows of one width, a chunk of windows at a time; ok where the
    window is a gadget whose f is its ridge's f."""
    out = []
    for s in range(0, len(wins), FORM_CHUNK):
        chunk = wins[s:s + FORM_CHUNK]
        b = np.array([p.b for _, _, p in chunk])
        ok, f, sig, w, om = enclosure.gadget_forms(
            np.array([p.U for _, _, p in chunk]), b, np.array([p.W for _, _, p in chunk]))
        ok &= (f == np.array([r.f for _, r, _ in chunk])).all(axis=1)
        out.append((ok, f, sig, b, om, w))
    return tuple(np.concatenate(a) for a in zip(*out, strict=True))


# ------------------------------------------------------------------------------ applying
def apply_run(st: Rows, run: Run, stats) -> bool:
    """Apply the run to the state; False (nothing done) when it cannot be swept: windows of
    one layer that overlap. ``st`` is the evaluator's state."""
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
    rows, wins = _give_up_shared(st, stab, rows, wins, sp.t[rows])
    if stats.enabled:
        _clearance(sp, run, stats)
    while len(rows):
        moved = _step(st, run, rows, wins)
        if tracked:
            stab, widening = _rewiden(st, run, rows, stab, widening)
        t = st.P[rows] @ run.f
        st.moved(rows[moved])  # refreshes every sorted index, this run's included
        st.grew(rows[~moved])  # rows near a window: their radius grew
        nxt = stab.next(t, run.layer[wins])
        keep = nxt >= 0
        rows, wins = _give_up_shared(st, stab, rows[keep], nxt[keep], t[keep])
    return True


def _give_up_shared(st: Rows, stab, rows, wins, t):
    """Rows whose box reaches a second window of their window's layer (widened windows of
    one layer can overlap where hats touch) are given up: radius inf, no further steps, their
    sequences go to the exact pass. The others go on."""
    shared = stab.shared(t, wins)
    if shared is None or not shared.any():
        return rows, wins
    st.rad[rows[shared]] = np.inf
    st.grew(rows[shared])
    return rows[~shared], wins[~shared]


def _rewiden(st: Rows, run: Run, rows, stab, widening: float):
    """The windows are widened by the rows' reach along f. When a row that just took a step
    now reaches further, widen them again (to twice that, so this happens rarely); rows that
    the wider windows let reach two windows of one layer are given up as they come
    (:func:`_give_up_shared`)."""
    own = enclosure.dot_radius(st.P[rows], st.rad[rows], run.f)
    grown = np.isfinite(own) & (own > widening)
    if not grown.any():
        return stab, widening
    return _Stabber.widened(run, 2 * float(own[grown].max()), True), 2 * float(own[grown].max())


def _overlap_in_a_layer(layer, lo, hi) -> bool:
    """Do two windows of one layer overlap (as open intervals)?"""
    order = np.lexsort((lo, layer))
    same = layer[order][1:] == layer[order][:-1]
    return bool((same & (hi[order][:-1] > lo[order][1:])).any())


def _layer_neighbours(layer, lo, hi) -> tuple[np.ndarray, np.ndarray]:
    """Per window, the largest hi among the windows of its layer that start before it and the
    smallest lo among those that start after it (−inf, inf where there are none)."""
    left, right = np.full(len(lo), -np.inf), np.full(len(lo), np.inf)
    order = np.lexsort((lo, layer))
    ends = np.flatnonzero(np.diff(layer[order])) + 1
    for seg in np.split(order, ends):
        if len(seg) > 1:
            left[seg[1:]] = np.maximum.accumulate(hi[seg[:-1]])
            right[seg[:-1]] = np.minimum.accumulate(lo[seg[1:]][::-1])[::-1]
    return left, right


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
        for a plain float pass), or None when two windows of one layer overlap unwidened."""
        if _overlap_in_a_layer(run.layer, run.lo, run.hi):
            return None
        if not tracked:
            return cls(run.layer, run.lo, run.hi, tracked=False)
        pad = enclosure.window_pad(widening, run.lo, run.hi)
        return cls(run.layer, enclosure.lower(run.lo, pad), enclosure.upper(run.hi, pad),
                   tracked=True)

    def __init__(self, layer, lo, hi, tracked: bool):
        self.lo_w, self.hi_w = lo, hi
        self.order = np.argsort(lo, kind="stable")
        self.lo, self.hi = lo[self.order], hi[self.order]
        self.layer = layer[self.order]
        self.hi_max = np.maximum.accumulate(self.hi)  # largest hi among windows up to here
        # only widened windows can overlap: a plain float pass needs no neighbours
        self.neighbours = _layer_neighbours(layer, lo, hi) if tracked else None

    def shared(self, t, wins) -> np.ndarray:
        """Which values t, each inside window wins[i], are inside another window of that
        window's layer too (windows of a layer do not overlap unwidened, so those before it
        end below it and those after it start above it). None in a plain float pass."""
        if self.neighbours is None:
            return None
        left_hi, right_lo = self.neighbours
        return (t < left_hi[wins]) | (t > right_lo[wins])

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


def _clearance(sp, run: Run, stats) -> None:
    """The hat clearance at the start of the run: each window's distance to the nearest row
    outside it, over |f| (a distance in the tokens' space)."""
    st_ = sp.sorted_t
    i0 = np.searchsorted(st_, run.lo, side="right")
    i1 = np.searchsorted(st_, run.hi, side="left")
    below = np.where(i0 > 0, run.lo - st_[np.maximum(i0 - 1, 0)], np.inf)
    above = np.where(i1 < len(st_), st_[np.minimum(i1, len(st_) - 1)] - run.hi, np.inf)
    gap = float(np.minimum(below, above).min(initial=np.inf))
    if math.isfinite(gap):
        stats.note_min("hat_clearance", gap / float(np.linalg.norm(run.f)))


def _step(st: Rows, run: Run, rows, wins) -> np.ndarray:
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


def _tracked_step(st: Rows, run: Run, rows, wins, X) -> np.ndarray:
    """:func:`_step` with radii (``enclosure.gadget_rows``): rows inside their window move,
    rows only near it keep their value and add the bound on the change their box allows."""
    r = st.rad[rows]
    g = enclosure.gadget_rows(X, r, run.f, run.sig[wins], run.b[wins], run.om[wins],
                              run.w[wins], run.lo[wins], run.hi[wins])
    st.P[rows[g.inside]] = X[g.inside] + g.change[g.inside]
    st.rad[rows] = np.where(g.inside[:, None], g.whole, enclosure.up(r + g.alone, 2))
    return g.inside
