"""Applying one FF or SA layer to a pass's rows, in any arithmetic, with or without radii.

An FF is applied window by window to the rows inside each ridge window, or densely; an SA layer
writes ρ·x plus every head's term column by column, in place (docs/numerics.md, docs/heads.md).
In a tracking pass (``st.rad`` set) every write also grows the rows' radii
(docs/numerics.md#enclosures).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..model import FF, SA, ValueMatrix
from ..numbers import safe_float, sparse_dot
from . import enclosure
from .arithmetic import PassStats, relu
from .attention import head_average
from .boxes import Boxes, few
from .gates import Gate
from .grid import exact_dots
from .keys import KeyLayer, KeyRun
from .state import RowState, SortedProjection
from .windows import Ridge

DENSE_ROWS = 2 ** 16  # rows per slice of a dense FF in an enclosure pass
BOX_ROWS = 2048  # rows from which an enclosure pass keeps them in boxes (evaluate/boxes.py)


def apply_ff(st: RowState, ff: FF, ridges: list[tuple[Ridge, FF]] | None, stats: PassStats,
             key: KeyLayer | None = None, gate: Gate | None = None,
             weight: np.ndarray | None = None):
    """Apply an FF: each ridge window only to the rows inside it (every window's change is
    computed from the layer's input, then the changes are added), a key layer by looking up
    each row's key, a gated layer to the rows that hold its units' keys, anything else
    densely (``weight``: see :func:`dense_tracking`)."""
    if key is not None:
        KeyRun([st.ar.convert(ff)], [key]).apply(st, ff_rows)
        return
    rows = None if gate is None else gate.rows(st)
    if rows is not None:
        if len(rows):
            ff_rows(st, st.ar.convert(ff), rows)
        return
    if ridges is not None:
        moves, spread = [], []
        for ridge, part in ridges:
            sp = st.projection(ridge.f)
            if st.rad is not None:
                change, terms, gap = _ridge_spread(st, sp, ridge, part)
                if gap is not None and stats.enabled:
                    stats.note_min("hat_clearance", gap / ridge.norm)
                rows = terms[0]
                spread.append(terms)
                moves.append((rows, change))
                continue
            rows, gap = sp.rows_in(ridge.lo, ridge.hi)
            if gap is not None and stats.enabled:
                stats.note_min("hat_clearance", safe_float(gap) / ridge.norm)
            if len(rows):
                X, part = st.P[rows], st.ar.convert(part)
                moves.append((rows, relu(X @ part.U.T + part.b) @ part.W.T))
        if spread:
            st.rad = enclosure.ridge_radius(st.rad, spread)
            st.grew(np.concatenate([np.concatenate([s[0], s[3]]) for s in spread]))
        for rows, change in moves:
            st.P[rows] = st.P[rows] + change
            st.moved(rows)
        return
    if st.rad is not None:
        dense_tracking(st, ff, weight)
        return
    if st.ar.kind == "exact":
        st.P = exact_dense_ff(st.P, st.ar.convert(ff))
    else:
        ff = st.ar.convert(ff)
        st.P = st.P * ff.eta + relu(st.P @ ff.U.T + ff.b) @ ff.W.T
    st.changed_everything()
    if ff.eta == 0:
        st.compact()


def dense_tracking(st: RowState, ff: FF, weight: np.ndarray | None = None) -> None:
    """A dense FF on a tracking pass, each row alone. The rows a layer leaves as they are
    (x + 0, radius included: a keyed layer changes a few) keep their place in every sorted
    index and their keys and classes (:meth:`RowState.moved`). After a layer that changed
    few rows, a residual FF takes only the rows of the boxes whose bound lets a unit be on
    (:class:`.boxes.Boxes`, sorted by ``weight``: what the stretch's FFs weigh each
    coordinate; None: no new boxes); any other, in slices written back in place."""
    boxes = current_boxes(st, ff, weight)
    if boxes is not None:
        reads = np.flatnonzero(ff.U.any(axis=0))
        high, _ = boxes.bounds(reads, ff.U[:, reads], ff.b)
        if np.isfinite(high).all():
            rows = boxes.rows(np.flatnonzero(high > 0), with_dirty=True)
            st.few_changed = few(ff_rows(st, ff, rows), len(st.P))
            return
    changed, everything = [], False
    for s in range(0, len(st.P), DENSE_ROWS):
        rows = slice(s, s + DENSE_ROWS)  # views: written in place
        live = enclosure.ff_dense_into(st.P[rows], st.rad[rows], ff.eta, ff.U, ff.b, ff.W)
        everything |= live is None
        if live is not None:
            changed.append(live + s)
    if not everything:
        rows = np.concatenate(changed) if changed else np.zeros(0, dtype=np.int64)
        st.moved(rows, np.flatnonzero(ff.W.any(axis=1)))  # (the columns its units write)
        st.few_changed = few(len(rows), len(st.P))
        return
    st.changed_everything()
    if ff.eta == 0:
        st.compact()


def ff_rows(st: RowState, ff: FF, rows: np.ndarray) -> int:
    """The FF ``ff`` (η = 1, in the pass's arithmetic) on ``rows`` alone, densely; returns how
    many rows it changed (in a tracking pass, those of ``rows`` whose units may be on)."""
    X, cols = st.P[rows], None
    if st.rad is not None:
        r = st.rad[rows]
        live = enclosure.ff_dense_into(X, r, ff.eta, ff.U, ff.b, ff.W)
        if live is not None:
            rows, X, r = rows[live], X[live], r[live]  # (the rest are as they were)
            cols = np.flatnonzero(ff.W.any(axis=1))  # (written alone: no inf·0 elsewhere)
        st.P[rows], st.rad[rows] = X, r
    elif st.ar.kind == "exact":
        st.P[rows] = exact_dense_ff(X, ff)
    else:
        st.P[rows] = X * ff.eta + relu(X @ ff.U.T + ff.b) @ ff.W.T
    st.moved(rows, cols)
    return len(rows)


def current_boxes(st: RowState, ff: FF, weight: np.ndarray | None) -> Boxes | None:
    """The tracking pass's boxes for the residual FF ``ff`` (η = 1, W finite), brought up to
    date: every row changed since they were last asked leaves its box, and an attention
    write of any column drops them. Made anew, sorted by ``weight``, after a layer that
    changed few (:func:`.boxes.few`) of :data:`BOX_ROWS` rows or more, all finite; None for any
    other FF or state."""
    boxes = st.boxes
    residual = ff.eta == 1 and bool(np.isfinite(ff.W).all())  # (relu 0 · inf = nan)
    if boxes is not None and (not residual or (st.col_epoch > boxes.epoch).any()):
        boxes = st.boxes = None
    if boxes is not None:
        boxes.leave(st.P, st.rad, np.flatnonzero(st.row_epoch > boxes.epoch))
        boxes.epoch = st.epoch
        if boxes.stale():
            boxes = st.boxes = None
    if boxes is None and residual and weight is not None and st.few_changed and \
            len(st.P) >= BOX_ROWS and np.isfinite(st.P).all() and np.isfinite(st.rad).all():
        boxes = st.boxes = Boxes(st.P, weight, st.rad, st.epoch, read_only=True)
    return boxes


def exact_dense_ff(P: np.ndarray, ff: FF) -> np.ndarray:
    """η·x + W·relu(U·x + b) on every row of an exact pass, with far fewer rational operations
    than the matrix products: each distinct row of U is dotted once and over its nonzero
    entries only (the first leader layer's units all read one row), each output coordinate
    sums only the units with a nonzero weight, and η·x is left out when η = 0."""
    dots: dict = {}
    H = np.empty((len(P), ff.U.shape[0]), dtype=object)
    for i, u in enumerate(ff.U):
        key = tuple(u.tolist())
        if key not in dots:
            dots[key] = sparse_dot(P, u)
        H[:, i] = relu(dots[key] + ff.b[i])
    out = np.empty_like(P)
    for k in range(P.shape[1]):
        move = sparse_dot(H, ff.W[k])
        out[:, k] = move if ff.eta == 0 else P[:, k] * ff.eta + move
    return out


def _ridge_spread(st: RowState, sp: SortedProjection, ridge: Ridge, part: FF):
    """For a tracking pass: the change of the rows inside the window by their float f·x,
    the radius terms of every row whose box may reach the window (also those within the
    rows' reach of its ends; see :func:`enclosure.ridge_radius`), and the distance from the
    window to the nearest row outside it (the hat clearance)."""
    w = float(enclosure.window_pad(st.reach(ridge.f), ridge.lo, ridge.hi))
    near, gap = sp.rows_in(enclosure.lower(ridge.lo, w), enclosure.upper(ridge.hi, w))
    t = sp.t[near]
    gaps = np.concatenate([[] if gap is None else [gap + w], ridge.lo - t[t <= ridge.lo],
                           t[t >= ridge.hi] - ridge.hi])
    gap = float(gaps.min()) if len(gaps) else None
    if id(part) not in st.forms:  # the job holds its parts for the whole pass
        st.forms[id(part)] = enclosure.gadget_form(part.U, part.b, part.W)
    form = st.forms[id(part)]
    X, r = st.P[near], st.rad[near]
    if form is not None and np.array_equal(form[0], ridge.f):  # lo, hi are along ridge.f
        f, sig, w_, om = form
        n = len(near)
        g = enclosure.gadget_rows(X, r, f, np.tile(sig, (n, 1)), np.tile(part.b, (n, 1)),
                                  np.tile(om, (n, 1)), np.tile(w_, (n, 1)),
                                  np.full(n, ridge.lo), np.full(n, ridge.hi))
        inside = g.inside
        return g.change[inside], (near[inside], g.whole[inside], g.alone[inside],
                                  near[~inside], g.alone[~inside]), gap
    inside = (t > ridge.lo) & (t < ridge.hi)
    rows, out = near[inside], near[~inside]
    change, whole, alone = enclosure.ff_change(X[inside], r[inside], part.U, part.b, part.W)
    zone = enclosure.zone_change(X[~inside], r[~inside], part.U, part.b, part.W, ridge.f,
                                 ridge.lo, ridge.hi)
    return change, (rows, whole, alone, out, zone), gap


def apply_sa(st: RowState, sa: SA, attention: str, tau, stats: PassStats,
             average=head_average):
    """ρ·x_i plus, for every head, V_h applied to the head's own average (docs/heads.md).
    Every head reads the layer's input. A head with V = p·qᵀ (β = 0) averages only the scalar
    x·q and changes only the columns where p ≠ 0, so sorted indices along other directions
    survive the layer. ``average``: how a head averages (a causal tracking pass gives
    :func:`.causal_radius.causal_head_average`).

    Equal points are merged only when ρ = 0 (each token replaced by averages, as in the
    collapse), before the layer (a data reset before a keyed collapse makes most rows of a
    sequence equal) and after it: with ρ ≠ 0 distinct points almost never meet, and an
    unmerged pair of equal rows only costs time, never changes a result (they carry their
    multiplicities)."""
    if sa.rho == 0:  # equal rows give equal averages: merge them before the n² scores
        st.compact()
    dots: dict = {}
    terms = [t for head in sa.heads
             if (t := _head_term(st, head, attention, tau, stats, dots, average)) is not None]
    _write_terms(st, sa.rho, terms)
    if sa.rho == 0:
        st.compact()


WRITE_CHUNK = 1 << 14  # rows written at once: a column's temporaries stay in a core's L2 cache


def _write_terms(st: RowState, rho, terms: list[_Term]) -> None:
    """The rows become ρ·x plus the heads' terms, one column of one chunk of rows at a time
    and in place (a column of the column-major rows is one contiguous array, and no row-sized
    temporary is made). A tracking pass grows each radius by |ρ|·r, the terms' radii and the
    rounding of the products and the sums: ρ·x and up to two products per head, whose sizes
    are charged one by one (:func:`_write_column`). With ρ = 1 the product is exact and only
    the written columns change."""
    k = 2 * len(terms) + 2
    written = sorted({c for t in terms for c in t.cols})
    cols = written if rho == 1 else list(range(st.P.shape[1]))
    reading = {c: [t for t in terms if c in t.cols] for c in cols}
    for at in range(0, len(st.P), WRITE_CHUNK):
        rows = slice(at, at + WRITE_CHUNK)
        for c in cols:
            _write_column(st, rho, k, [t.column(c, rows) for t in reading[c]], rows, c)
    if cols:
        st.changed_columns(np.asarray(cols))


def _write_column(st: RowState, rho, k: int, parts: list, rows: slice, c: int) -> None:
    """:func:`_write_terms` on column c of the rows ``rows``, given the terms' values there.
    The rounding is charged on the size of every product the column sums (each part's
    factors), not on the part's value: a head's β·m_c and p_c·(q·m) may cancel to a value far
    below their own roundings, and where q·m is exact (docs/numerics.md#exact-rows) its radius
    is 0 and covers none of them (β = −(2^80 + 2^29), p = q = 2^40·(1 + 2^-52) on m = 1 gave
    the float 0 with a radius near 2^-1000 for the exact 2^-24)."""
    x = st.P[rows, c]
    new = x if rho == 1 else x * rho
    if st.rad is not None:
        size = np.abs(new)
        r = st.rad[rows, c]
        exact = r == 0  # (with the sum unrounded: ρ·x is then exact too)
        if rho != 1:
            r = abs(rho) * r + enclosure.rounding(size, 1)
        for _, vr, factors, known in parts:
            for a, w in factors:
                size += np.abs(a) * abs(float(w))
            r += vr
            exact &= known
        size = enclosure.rounding(size, k, out=size)
        unrounded = _exact_column(x, rho, parts)
        size[unrounded] = 0.0  # docs/numerics.md#grid
        r += size
        r = enclosure.up(r, 4 * k, out=r)
        r[exact & unrounded] = 0.0  # docs/numerics.md#exact-rows
        st.rad[rows, c] = r
    for v, *_ in parts:
        new += v
    if rho != 1:
        x[:] = new


def _exact_column(x, rho, parts: list) -> np.ndarray:
    """Rows where ρ·x plus the terms' products is a sum no evaluation rounds (the heads'
    values v = a·p are such products, ``parts`` carries their factors)."""
    factors = [(x, rho)] + [f for _, _, fs, _ in parts for f in fs]
    X = np.stack([a for a, _ in factors], axis=1)
    w = np.array([[float(wt) for _, wt in factors]])
    return exact_dots(X, w, np.zeros(1))[:, 0]


@dataclass(frozen=True)
class _Term:
    """What one head adds to the rows, kept as the head's average so that the values are
    formed column by column: column c gains p_c·avg (β = 0: avg is the average of x·q), or
    β·avg_c + p_c·(q·avg) (avg is the average point). ``avg_rad``, ``s_rad``: radii of avg
    and q·avg in a tracking pass, else None."""

    V: ValueMatrix
    cols: frozenset
    avg: np.ndarray
    avg_rad: np.ndarray | None
    s: np.ndarray | None = None
    s_rad: np.ndarray | None = None

    def column(self, c: int, rows: slice) -> tuple:
        """The term's values in column c of the rows ``rows``, in a tracking pass their radii
        (else None), the factors of its products, and (tracking) where the averages it reads
        have radius 0, so that the term is exact (docs/numerics.md#exact-rows)."""
        p, beta = self.V.p[c], self.V.beta
        if beta == 0:
            val, factors = self.avg[rows, 0] * p, [(self.avg[rows, 0], p)]
            if self.avg_rad is None:
                return val, None, factors, None
            src = self.avg_rad[rows, 0]
            return val, src * float(abs(p)), factors, src == 0
        val = self.avg[rows, c] * beta + self.s[rows] * p
        factors = [(self.avg[rows, c], beta), (self.s[rows], p)]
        if self.avg_rad is None:
            return val, None, factors, None
        src, s_src = self.avg_rad[rows, c], self.s_rad[rows]
        known = (src == 0) & ((s_src == 0) | ((p == 0) & np.isfinite(self.s[rows])))
        return val, abs(beta) * src + s_src * abs(p), factors, known


def _head_term(st: RowState, head, attention: str, tau, stats: PassStats, dots: dict,
               average=head_average) -> _Term | None:
    """What one head adds (its average, computed from the layer's input); None when V = 0.
    ``dots`` holds the layer's products x·v already computed (heads often read the same
    vector)."""
    V = head.V
    if V.beta == 0:
        cols = frozenset(k for k, v in enumerate(V.p) if v != 0)
        if not cols:
            return None
        return _Term(V, cols, *average(st, head.A, V.q, attention, tau, stats, dots))
    avg, avg_rad = average(st, head.A, None, attention, tau, stats, dots)
    s_rad = None if avg_rad is None else enclosure.dot_radius(avg, avg_rad, V.q)
    return _Term(V, frozenset(range(st.P.shape[1])), avg, avg_rad, sparse_dot(avg, V.q),
                 s_rad)
