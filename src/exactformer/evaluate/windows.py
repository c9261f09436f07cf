"""Ridge windows: FF layers that add exactly zero outside an interval of f·x.

FF layers whose hidden units all read one direction f, and that add exactly zero outside an
interval of f·x (every gadget of the construction), are applied only to the rows inside the
interval (docs/numerics.md#ridge-windows). :func:`ridges_of` is the one recogniser: it cuts every
layer of a model into its windows, float64 layers of hats in batch, any other layer by the exact
test of :func:`ridge_window`; :func:`direction_scales` is the shared "one direction" test (also
behind the profile form of the torch export).
"""

from __future__ import annotations

import gc
import math
from contextlib import contextmanager
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np

from ..model import FF
from ..numbers import safe_floats, to_fraction, to_fraction_array
from .arithmetic import EXACT, Arithmetic


@dataclass
class Ridge:
    """An FF with η = 1 that adds exactly zero unless lo < f·x < hi."""

    f: np.ndarray
    lo: object
    hi: object
    f_norm: float | None = field(default=None, compare=False, repr=False)

    @property
    def norm(self) -> float:
        """‖f‖ in float64 (a window's clearance is reported relative to it); batch-built
        windows get it with the batch."""
        if self.f_norm is None:
            self.f_norm = float(np.linalg.norm(safe_floats(np.asarray(self.f))))
        return self.f_norm


def ridge_window(ff: FF) -> Ridge | None:
    """Detect whether ``ff`` is a ridge window, deciding exactly on the exact values of its
    parameters (floats included, so float models qualify too).

    Every gadget repeats one row f in U (scale k = 1); other rank-one U are decided with
    Fractions. The layer must add exactly zero beyond its outermost breakpoints.
    """
    if ff.eta != 1:
        return None
    U, b, W = ff.U, ff.b, ff.W
    if any(a.dtype == float and not np.isfinite(a).all() for a in (U, b, W)):
        return None  # inf or nan: no exact window; the layer is applied densely
    found = direction_scales(U)
    if found is None:
        return None
    f, ks = found
    for i, k in enumerate(ks):
        if k == 0 and b[i] > 0 and any(v != 0 for v in W[:, i]):
            return None  # a constant shift everywhere
    bps = _breakpoints(b, ks)
    for sign in (1, -1):  # beyond the last breakpoint on each side the sum must vanish
        act = [i for i in range(len(ks)) if ks[i] * sign > 0]
        if not act:
            continue
        w = W[:, act[0]]
        signs = [1 if np.array_equal(W[:, i], w) else -1 if np.array_equal(W[:, i], -w)
                 else 0 for i in act]
        if all(signs):  # columns ±w (every hat): two scalar conditions
            rows = [(signs, [ks[i] for i in act]), (signs, [b[i] for i in act])]
        else:
            rows = [(list(W[r, act]), list(vals)) for r in range(W.shape[0])
                    if any(v != 0 for v in W[r, act])
                    for vals in ([ks[i] for i in act], [b[i] for i in act])]
        if not all(_zero_dot(x, y) for x, y in rows):
            return None
    return Ridge(f if f.dtype == float else to_fraction_array(f), min(bps), max(bps))


def _breakpoints(b: np.ndarray, ks: list) -> list:
    """The units' breakpoints −b_i/k_i (k_i ≠ 0), exactly: float biases with k = 1 are their
    own exact negations, anything else goes through Fractions."""
    if b.dtype == float and all(k in (0, 1) for k in ks):
        return [-v for v, k in zip(b.tolist(), ks, strict=True) if k]
    return [-to_fraction(b[i]) / to_fraction(ks[i]) for i in range(len(ks)) if ks[i] != 0]


def direction_scales(U: np.ndarray) -> tuple[np.ndarray, list] | None:
    """(f, k) with every row U_i = k_i·f exactly, f the first nonzero row, or None when the
    hidden units do not all read one direction (or all are zero): the one test behind the ridge
    windows here and the profile form of the torch export (docs/numerics.md). Every gadget
    repeats f itself (k = 1, decided on the numbers as they are); other rows are decided in
    Fractions."""
    nz = [i for i in range(U.shape[0]) if any(v != 0 for v in U[i])] if U.dtype == object \
        else np.flatnonzero(U.any(axis=1)).tolist()
    if not nz:
        return None
    f = U[nz[0]]
    if U.dtype != object and ((U[nz] != 0) != (f != 0)).any():
        return None  # k·f (k ≠ 0) has f's zeros: units reading other coordinates (keyed)
    if U.dtype != object and (U[nz] == f).all() or \
            all(i not in nz or np.array_equal(U[i], f) for i in range(U.shape[0])):
        return f, [1 if i in nz else 0 for i in range(U.shape[0])]
    if U.dtype != object and _surely_not_rank_one(U[nz], f):
        return None
    ks = _row_scales(to_fraction_array(U), nz[0])
    return None if ks is None else (f, ks)


def _surely_not_rank_one(rows: np.ndarray, f: np.ndarray) -> bool:
    """Whether some float row is certainly no multiple of f: its cross product with f,
    U_ij·f_j0 − U_ij0·f_j, is 0 in exact arithmetic for a multiple, and its float value is
    then within the rounding of the two products and their difference (a keyed layer's
    units read different codes on one support: decided here, not in Fractions)."""
    j0 = int(np.flatnonzero(f)[0])
    with np.errstate(over="ignore", invalid="ignore"):
        a, b = rows * f[j0], np.outer(rows[:, j0], f)
        return bool((np.abs(a - b) > 4 * 2.0 ** -53 * (np.abs(a) + np.abs(b)) + 2.0 ** -1000)
                    .any())


def _row_scales(U: np.ndarray, first: int) -> list | None:
    """k_i with U[i] = k_i·U[first] exactly, or None if U is not rank one that way."""
    f = U[first]
    j0 = next(j for j, v in enumerate(f) if v != 0)
    ks = []
    for i in range(U.shape[0]):
        k = U[i, j0] / f[j0]
        if any(U[i, j] != k * f[j] for j in range(U.shape[1])):
            return None
        ks.append(k)
    return ks


def _zero_dot(xs: list, ys: list) -> bool:
    """Σ x·y == 0 exactly. Floats are binary fractions, so their products are summed as
    integers over a common power-of-two denominator; anything else goes through Fraction."""
    if all(isinstance(v, (float, np.floating, int)) for v in xs + ys):
        terms = []
        for x, y in zip(xs, ys, strict=True):
            (a, p), (c, q) = float(x).as_integer_ratio(), float(y).as_integer_ratio()
            terms.append((a * c, p * q))
        den = max((q for _, q in terms), default=1)
        return sum(n * (den // q) for n, q in terms) == 0
    return sum((to_fraction(x) * to_fraction(y) for x, y in zip(xs, ys, strict=True)),
               Fraction(0)) == 0


HAT_CHUNK = 4096  # layers stacked at once by the batch hat test (bounds its temporary memory)
FLOAT64 = np.dtype(np.float64)


def ridges_of(ffs: list, params: list, ar: Arithmetic) -> list:
    """Every layer of ``ffs`` (None for a block without FF) cut into ridge windows, each with
    its units taken from the same layer of ``params`` (the layer's numbers for the pass:
    float64 in a float64 pass; exact and mp passes convert a part when they apply it, see
    :meth:`Arithmetic.convert`), and the window's direction and ends in the pass's arithmetic: a
    wide layer of k hats on one direction is k windows, so a token outside every window is never
    touched (docs/heads.md). None: apply the layer densely.

    Float64 hat layers (every unit reads one row f, the columns of each hat are ±w) are
    recognised in batch, all layers of one shape at once (:func:`_hat_windows`,
    docs/numerics.md#ridge-windows); every other layer goes through :func:`_ridge_cuts`."""
    out: list = [None] * len(ffs)
    shapes: dict = {}
    for i, ff in enumerate(ffs):
        if ff is not None and len(ff.b) and ff.U.dtype == ff.b.dtype == ff.W.dtype == FLOAT64:
            shapes.setdefault((ff.U.shape, ff.W.shape), []).append(i)
    with paused_gc():
        for idx in shapes.values():
            for s in range(0, len(idx), HAT_CHUNK):
                chunk = idx[s:s + HAT_CHUNK]
                found = _hat_windows([ffs[i] for i in chunk], [params[i] for i in chunk], ar)
                for i, windows in zip(chunk, found, strict=True):
                    out[i] = windows
    return [out[i] if out[i] is not None or ff is None else _ridge_cuts(ff, params[i], ar)
            for i, ff in enumerate(ffs)]


def ridges_in(ff: FF, params: FF, ar: Arithmetic) -> list[tuple[Ridge, FF]] | None:
    """:func:`ridges_of` for one layer."""
    return ridges_of([ff], [params], ar)[0]


@contextmanager
def paused_gc():
    """No cyclic garbage collection inside: building the windows of a large model creates
    hundreds of thousands of small acyclic objects, and the collections they would trigger
    (each walking every live object of the model) cost a third of the preparation."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _hat_windows(ffs: list[FF], params: list[FF], ar: Arithmetic) -> list:
    """:func:`ridges_of` for float64 layers of one shape: per layer its hats, or None where the
    layer is not a residual layer of hats on one row f (:func:`_hat_cuts`). A hat's units are
    the pass's own layer when the hat is the whole layer in breakpoint order (every
    constructed width-4 layer), else views of the layer's units in that order: a large model's
    windows add no copy of its parameters."""
    U, b, W = (np.array([getattr(ff, k) for ff in ffs]) for k in "UbW")
    ok, order, opens, lo, hi = _hat_cuts(U, b, W, np.array([ff.eta == 1 for ff in ffs]))
    layers = np.flatnonzero(ok)
    row, start = np.nonzero(opens[layers])  # every hat: its layer (among ``layers``), 1st unit
    h = b.shape[1]
    end = np.full(len(start), h)  # a hat ends where the next one of its layer starts
    nxt = row[1:] == row[:-1]
    end[:-1][nxt] = start[1:][nxt]
    if ar.is_object:  # each distinct direction converted once (±0 convert alike)
        rows, which = np.unique(U[layers, 0], axis=0, return_inverse=True)
        fs = list(ar.array(rows)[which.reshape(-1)])
    else:
        fs = [ffs[layer].U[0] for layer in layers.tolist()]
    norms = np.linalg.norm(U[layers, 0], axis=1).tolist()
    in_order = (order == np.arange(h)).all(axis=1)
    units = {layer: params[layer] if in_order[layer] else _units_in(params[layer], order[layer])
             for layer in layers.tolist()}
    out: list = [None] * len(ffs)
    for layer in layers.tolist():
        out[layer] = []
    for m, layer, a, e, lo_, hi_ in zip(row.tolist(), layers[row].tolist(), start.tolist(),
                                        end.tolist(), ar.array(lo).tolist(),
                                        ar.array(hi).tolist(), strict=True):
        p = units[layer]
        part = p if e - a == h else FF(p.eta, p.U[a:e], p.b[a:e], p.W[:, a:e])
        out[layer].append((Ridge(fs[m], lo_, hi_, norms[m]), part))
    return out


def _units_in(ff: FF, order: np.ndarray) -> FF:
    """``ff`` with its hidden units in the order ``order`` (the same function)."""
    return FF(ff.eta, ff.U[order], ff.b[order], ff.W[:, order])


def _hat_cuts(U, b, W, eta):
    """The hats of float64 layers of one shape (U n×h×d, b n×h, W n×d×h, η = 1 where ``eta``):
    ok (n,), the units in window order (n×h), where a hat opens in that order (n×h), and
    every hat's window ends lo, hi (in layer and window order).

    A layer is ok when every unit reads its first row f (nonzero) and its units, in some order,
    form consecutive hats: columns ±w, signs summing to 0 and Σ ±b_i exactly 0 (math.fsum is
    exact), which makes each hat add exactly zero outside (−max b, −min b): floats, exact, no
    outward rounding needed. The order tried first is breakpoint order (units sorted by −b,
    stable); a layer whose hats touch at a shared breakpoint can tie there in the wrong order,
    so a layer that fails is tried again with its units grouped into hats in their own order
    (:func:`_grouped_order`)."""
    ok = (eta.astype(bool) & U[:, 0].any(axis=1) & (U == U[:, :1]).all(axis=(1, 2))
          & np.isfinite(b).all(axis=1))
    order = np.argsort(-b, axis=1, kind="stable")
    hats, opens = _hats_in(b, W, ok, order)
    retry = np.flatnonzero(ok & ~hats)
    if len(retry):
        mine, _ = _hats_in(b[retry], W[retry], ok[retry], np.tile(np.arange(b.shape[1]),
                                                                  (len(retry), 1)))
        again = retry[mine]
        if len(again):
            order[again] = _grouped_order(b[again], W[again])
            hats[again], opens[again] = _hats_in(b[again], W[again], ok[again], order[again])
    ok &= hats
    bs = np.take_along_axis(b, order, axis=1)
    starts = np.flatnonzero(opens[ok])
    sorted_b = bs[ok].ravel()
    return (ok, order, opens, -np.maximum.reduceat(sorted_b, starts),
            -np.minimum.reduceat(sorted_b, starts))


def _hats_in(b, W, ok, order) -> tuple[np.ndarray, np.ndarray]:
    """Do the units of each layer, in ``order``, form consecutive hats, and where does each
    hat open? Each unit's sign is taken relative to its predecessor's column (a column that
    is not ± its predecessor must open a hat, and the sign a hat starts with does not
    matter); every earlier hat sums to exactly 0, so a hat closes exactly where the layer's
    prefix sums of signs and of ±b are both 0."""
    n, h = b.shape
    bs = np.take_along_axis(b, order, axis=1)
    cols = np.take_along_axis(np.swapaxes(W, 1, 2), order[:, :, None], axis=1)  # n×h×d
    step = np.where((cols[:, 1:] == cols[:, :-1]).all(axis=2), 1,
                    np.where((cols[:, 1:] == -cols[:, :-1]).all(axis=2), -1, 0))
    sign = np.cumprod(np.concatenate([np.ones((n, 1), dtype=np.int64),
                                      np.where(step == 0, 1, step)], axis=1), axis=1)
    closes = (np.cumsum(sign, axis=1) == 0) & ok[:, None]
    terms = (sign * bs).tolist()
    for layer, k in np.argwhere(closes).tolist():
        closes[layer, k] = _sums_to_zero(terms[layer][:k + 1])
    hats = closes[:, -1] & ~((step == 0) & ~closes[:, :-1]).any(axis=1)
    return hats, np.concatenate([np.ones((n, 1), dtype=bool), closes[:, :-1]], axis=1)


def _grouped_order(b, W) -> np.ndarray:
    """For layers whose units form consecutive hats in their own order: the units sorted by
    their hat's window (its smallest breakpoint −max b), hats with the same smallest
    breakpoint kept apart in their own order, then by −b within the hat."""
    _, opens = _hats_in(b, W, np.ones(len(b), dtype=bool),
                        np.tile(np.arange(b.shape[1]), (len(b), 1)))
    hat = np.cumsum(opens, axis=1) - 1
    first = np.array([np.maximum.reduceat(row, np.flatnonzero(o))[g]
                      for row, o, g in zip(b, opens, hat, strict=True)])
    return np.array([np.lexsort((-row, g, -top))
                     for row, top, g in zip(b, first, hat, strict=True)])


def _sums_to_zero(terms: list) -> bool:
    """Is the exact sum of these floats 0? (math.fsum rounds correctly; a sum beyond float
    range is not 0.)"""
    try:
        return math.fsum(terms) == 0
    except OverflowError:
        return False


def _ridge_cuts(ff: FF, params: FF, ar: Arithmetic) -> list[tuple[Ridge, FF]] | None:
    """The ridge windows of one layer that is not a float64 layer of hats; see
    :func:`ridges_of`. A rational layer of hats is cut by :func:`_hat_groups` on an mpq copy
    (a linear test with comparisons a fifth of a Fraction's); anything else, and a rational
    layer that test does not cut, by the general test (:func:`ridge_groups`, quadratically
    many Fraction operations)."""
    q = ff.converted(EXACT.scalar, EXACT.array) if ff.U.dtype == object else None
    cuts = _hat_groups(q) if q is not None else None
    cuts = cuts if cuts is not None else ridge_groups(ff)
    if cuts is None:
        return None
    one_f = reads_one_row(ff if q is None else q)
    out = []
    for idx in cuts:
        if one_f:  # every unit reads f with scale 1: the breakpoints are −b, exactly
            lo, hi = -ff.b[idx].max(), -ff.b[idx].min()
            r = Ridge(ff.U[0], *((float(lo), float(hi)) if ff.b.dtype == float else (lo, hi)))
        else:
            r = ridge_window(_sub_ff(ff, idx))
        lo, hi = ar.scalar(r.lo), ar.scalar(r.hi)
        if not ar.is_object:  # rounded outward: the float window holds the exact one
            lo = lo if Fraction(lo) <= to_fraction(r.lo) else float(np.nextafter(lo, -np.inf))
            hi = hi if Fraction(hi) >= to_fraction(r.hi) else float(np.nextafter(hi, np.inf))
        out.append((Ridge(ar.array(r.f), lo, hi), _sub_ff(params, idx)))
    return out


def reads_one_row(ff: FF) -> bool:
    """A layer whose hidden units all read the same nonzero row f, compared exactly (float64
    and rational parameters alike)."""
    U = ff.U
    return bool((U[0] != 0).any()) and bool((U == U[0]).all())


def _hat_groups(ff: FF) -> list[list[int]] | None:
    """:func:`ridge_groups` for a rational residual layer (exact values, as mpq) whose units
    all read one row f and whose columns are ±w per hat: units in breakpoint order close a
    window when their signs sum to 0 and Σ ±b_i is exactly 0, the test :func:`_hat_cuts`
    makes on float64 layers. None when the layer is not of that form."""
    if ff.eta != 1 or not reads_one_row(ff):
        return None
    b, W = ff.b, ff.W
    groups, cur, w, signs, terms = [], [], None, 0, []
    for i in np.argsort(-b, kind="stable").tolist():
        col = W[:, i]
        if not cur:
            w, sign = col, 1
        elif (col == w).all():
            sign = 1
        elif (col == -w).all():
            sign = -1
        else:
            return None
        cur.append(i)
        signs += sign
        terms.append(sign * b[i])
        if signs == 0 and sum(terms) == 0 and (w != 0).any():
            groups.append(cur)
            cur, terms = [], []
    return groups if not cur and groups else None


def ridge_groups(ff: FF) -> list[list[int]] | None:
    """The hidden units of ``ff`` split into consecutive groups (by breakpoint along their
    common direction) that are each a ridge window, or None when ``ff`` is not a ridge window
    at all. One group when the layer cannot be cut. Decided by :func:`ridge_window` on
    growing groups; float64 hat layers are cut faster by :func:`_hat_cuts`."""
    if ridge_window(ff) is None:
        return None
    U, b = ff.U, ff.b
    live = [i for i in range(U.shape[0]) if any(v != 0 for v in U[i])]
    f = U[live[0]]
    if not all(np.array_equal(U[i], f) for i in live) or len(live) < U.shape[0]:
        return [list(range(U.shape[0]))]
    order = sorted(live, key=(lambda i: -b[i]) if b.dtype == float else
                   (lambda i: -to_fraction(b[i])))
    groups, cur = [], []
    for i in order:
        cur.append(i)
        if ridge_window(_sub_ff(ff, cur)) is not None:
            groups.append(cur)
            cur = []
    return groups if not cur else [list(range(U.shape[0]))]


def _sub_ff(ff: FF, idx: list[int]) -> FF:
    return FF(ff.eta, ff.U[idx], ff.b[idx], ff.W[:, idx])
