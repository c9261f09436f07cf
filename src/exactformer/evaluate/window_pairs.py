"""Window–flip pairs: a tagging window enclosed only on the rows near it
(docs/numerics.md#window-flip-pairs).

A keyed model tags a token with a *window* (two units ω·relu(u·x + b) + ω·relu(−u·x − b)
into a slot k) and, one layer later, a *flip* (slot ← slot − relu(slot) + relu(1 − slot)).
The window writes every row, but wherever its slot reaches 1 the flip sets the slot to an
exact 0 again, in exact arithmetic and in any float evaluation (relu(1 − v) has a negative
argument, v − relu(v) cancels). So on a row whose slot is ≥ 0 on its box and whose |u·x + b|
is at least (1 + 2⁻¹⁰)/ω on its box (and in the float evaluation at its point), the two layers
together only set the slot to 0. A tracking pass looks those rows up in the sorted index of u
(scaled by a power of two: every tag of one shared direction reads the same index) and
encloses the window and the flip on the others alone, which are a few rows of thousands.

A pair is recognised from the weights, exactly: at block L the units that write k are two,
with U rows u and −u (u not reading k), biases b and −b, and W columns ω·e_k (ω > 0); the
other units of layer L write nothing u reads; block L has no attention; at block L + 1 the
units that read or write k are exactly relu(x_k)·(−e_k) and relu(1 − x_k)·e_k. Between the
two layers the far rows' slot holds its old value instead of the window's: nothing reads it
there (the other units of layer L + 1 do not touch k), and the flip overwrites it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..model import FF
from .enclosure import lower, rounding, up, upper
from .layers import dense_tracking, ff_rows

MARGIN = 2.0 ** -10  # the window's value must clear 1 by this fraction of it
PAIR_ROWS = 1024  # rows a pass must hold for a pair to be taken: on fewer, enclosing the
# two layers densely costs less than the lookups (measured: 200 rows, 0.6 against 0.7 s)


@dataclass(eq=False)  # (a pass keys its open pairs by identity)
class Pair:
    """A window at block ``start`` on slot ``k`` and its flip at ``start + 1``: the units'
    indices in each layer, the window's direction f = u / 2^e (largest |entry| in [1, 2)),
    its bias β = b / 2^e and the half-width g = (1 + MARGIN) / (ω·2^e) of the interval of f·x
    on which the window may stay below 1."""

    start: int
    k: int
    window: np.ndarray
    flip: np.ndarray
    f: np.ndarray
    beta: float
    g: float

    def near(self, st) -> np.ndarray:
        """The rows of the tracking pass ``st`` on which the pair must be enclosed: f·x within
        g of −β plus every bound on the rows' reach, or a slot that may be < 0 or is not
        finite, or anything else not finite on the columns the window reads."""
        sp = st.projection(self.f)
        eps = st.reach(self.f)
        half = up(self.g + 2 * eps + rounding(abs(self.beta), 2), 6)
        rows, _ = sp.rows_in(lower(-self.beta, half), upper(-self.beta, half))
        P, r = st.P[:, self.k], st.rad[:, self.k]
        reads = np.flatnonzero(self.f)
        with np.errstate(invalid="ignore", over="ignore"):
            odd = ~(lower(P, r) >= 0) | ~np.isfinite(upper(P, r)) | ~np.isfinite(sp.t) | \
                ~np.isfinite(st.rad[:, reads]).all(axis=1)
        return np.union1d(rows, np.flatnonzero(odd))


def window_pairs(ffs: list, alone: list[bool]) -> dict[int, list[Pair]]:
    """block L -> the pairs whose window is in L, over the blocks' FFs ``ffs`` in float64
    (None where a block has none); ``alone``: per block, whether it has no attention (or an
    identity one)."""
    out: dict[int, list[Pair]] = {}
    plain = [finite_residual(ff) for ff in ffs]
    for L in range(len(ffs) - 1):
        a, b = ffs[L], ffs[L + 1]
        if not (plain[L] and plain[L + 1] and alone[L]):
            continue
        writes = a.W != 0
        lone = writes.sum(axis=0) == 1  # units writing one coordinate, as a window's do
        for k in np.flatnonzero((writes.sum(axis=1) == 2) & (writes[:, lone].sum(axis=1) == 2)
                                & (b.U != 0).any(axis=0)).tolist():
            pair = _pair(L, k, a, b)
            if pair is not None:
                out.setdefault(L, []).append(pair)
    return out


def finite_residual(ff: FF | None) -> bool:
    """A float64 residual FF (η = 1) with finite parameters."""
    return ff is not None and ff.eta == 1 and all(
        np.asarray(v).dtype == float and np.isfinite(v).all() for v in (ff.U, ff.b, ff.W))


def _pair(L: int, k: int, a: FF, b: FF) -> Pair | None:
    """The pair on slot k with its window in ``a`` and its flip in ``b``, or None."""
    win = np.flatnonzero(a.W[k])
    if len(win) != 2:
        return None
    i, j = win.tolist()
    u, omega = a.U[i], a.W[k, i]
    ek = np.zeros(a.W.shape[0])
    ek[k] = 1.0
    if not (omega > 0 and np.array_equal(a.W[:, i], omega * ek)
            and np.array_equal(a.W[:, j], omega * ek) and np.array_equal(a.U[j], -u)
            and a.b[j] == -a.b[i] and u[k] == 0 and u.any()):
        return None
    others = np.setdiff1d(np.arange(len(a.b)), win)
    if a.W[np.ix_(np.flatnonzero(u), others)].any():
        return None  # another unit writes what the window reads
    flip = np.flatnonzero((b.U[:, k] != 0) | (b.W[k] != 0))
    if len(flip) != 2 or not _is_flip(b, flip, ek):
        return None
    scale = 2.0 ** (np.frexp(np.abs(u).max())[1] - 1)
    f, beta = u / scale, a.b[i] / scale
    if not (np.array_equal(f * scale, u) and beta * scale == a.b[i]):
        return None  # (underflow: no exact scaling)
    g = up((1 + MARGIN) / (omega * scale), 3)
    return Pair(L, k, win, flip, f, float(beta), float(g)) if np.isfinite(g) else None


def _is_flip(b: FF, units: np.ndarray, ek: np.ndarray) -> bool:
    """Whether ``units`` of ``b`` are relu(x_k)·(−e_k) and relu(1 − x_k)·e_k, in some order."""
    forms = {(tuple(b.U[t]), float(b.b[t]), tuple(b.W[:, t])) for t in units.tolist()}
    return forms == {(tuple(ek), 0.0, tuple(-ek)), (tuple(-ek), 1.0, tuple(ek))}


def apply(st, ff: FF, opening: list[Pair], closing: dict) -> dict:
    """The FF ``ff`` of one block on the tracking pass ``st``, where the pairs ``opening``
    have their window and the pairs of ``closing`` (pair -> its near rows and the far rows
    whose slot is not 0) their flip; returns the pairs opened here in that form. The other
    units go first, on every row (they read the slots' old values and write nothing a window
    reads), then each flip and each window on its near rows."""
    near = {p: p.near(st) for p in opening}  # (from the layer's input)
    mine = [p.window for p in opening] + [p.flip for p in closing]
    rest = np.setdiff1d(np.arange(len(ff.b)), np.concatenate(mine))
    if len(rest):
        dense_tracking(st, _units(ff, rest))
    for p, (rows, dirty) in closing.items():
        if len(rows):
            ff_rows(st, _units(ff, p.flip), rows)
        if len(dirty):  # the window took the slot to ≥ 1 there, and the flip to 0
            st.P[dirty, p.k], st.rad[dirty, p.k] = 0.0, 0.0
            st.moved(dirty, np.array([p.k]))
    opened = {}
    for p, rows in near.items():
        if len(rows):
            ff_rows(st, _units(ff, p.window), rows)
        far = np.ones(len(st.P), dtype=bool)
        far[rows] = False
        opened[p] = (rows, np.flatnonzero(far & ((st.P[:, p.k] != 0) | (st.rad[:, p.k] != 0))))
    return opened


def _units(ff: FF, units: np.ndarray) -> FF:
    """The residual FF of some of ``ff``'s units."""
    return FF(1.0, ff.U[units], ff.b[units], ff.W[:, units])
