"""Tagging: the keyed model's only reading of the data (docs/keyed.md#tagging).

A tag gives one table token an exact code C·ς and mark, with the same six units (a window)
or three (a cap) whatever the token and however many tokens there are, so the block count
never grows with the input lengths:

* **Shared directions.** K directions f_k with 20-bit entries are drawn once; every token is
  projected on each and the projections sorted (``Survey``, O(K·T log T)). A token's *gap* on
  f_k is its distance to its nearer neighbour in that order over |f_k|₁ times the data's
  extent; its tag reads the direction where the gap is widest.
* **Grid windows.** On grid data (coordinates integer multiples of one power of two, few bits)
  a tag reads instead a small integer direction on which its token's projection is unique,
  with c = f·t exactly: exact in TF32 and, where the sums fit 8 bits, bfloat16
  (docs/numerics.md#low-precision-set-models).
* **The window** (two units): s·relu(f·x − c) + s·relu(c − f·x) into a slot, with c within
  g/64 of f·t and s·g ∈ [2, 4): at most 1/16 at t, at least 1.96 at every other token.
* **The flip** (two units, a layer later): slot ← relu(1 − slot), in [15/16, 1] at t and an
  exact 0 elsewhere, where every unit is off and slot − relu(slot) cancels exactly.
* **The clip** (two units, a layer later): relu(2v − ½) − relu(2v − 3/2) of the slot value v
  writes C·ς and the mark, exactly 1 for v ∈ [¾, 2^21) in any binary arithmetic and 0 at
  v = 0. The next tag's flip on the slot clears v; a last unit per slot clears the rest.
* **The cap** (one unit; softmax models past the paper's bound): a token extreme on ±f by a
  gap g is read by relu(s·(±f·x − c)), c within g/64 of ±f·t − g/2: in [15/16, 33/16) at t, an
  exact 0 at every other token, so the clip reads it with no flip.

So float32 tags the tokens exact arithmetic tags while its rounding of s·(f·x − c) stays
below ⅛: the gap must exceed ``float32_gap(d)`` (derived in docs/keyed.md#tagging); the build
warns, naming the two tokens, where the data leave a tag no such gap.
"""

from __future__ import annotations

import heapq
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
from tqdm import tqdm

from ..evaluate.grid import lowbit
from ..model import Block
from ..numbers import num, safe_floats
from .gadgets import power_of_two_below
from .generic import ConstructionError
from .keyed_units import Layout, clip_pair, ff_layer, fill, on_code, reset_unit, vec

DIRECTIONS = 32  # shared directions: a token's gap is its widest over these
DIRECTION_BITS = 20  # significant bits of a direction's entries: exact in float32
TRUSTED = 2.0 ** -30  # a gap below this (of |f|₁·extent) is not read from float64 projections
UNIT32 = 2.0 ** -24  # float32's unit roundoff
GRID_BITS = 11  # grid data: every coordinate x/Q below 2^11, so TF32's inputs hold it


def float32_gap(d: int) -> float:
    """The smallest gap (of |f|₁·extent) a float32 pass reads faithfully: f·x − c over d data
    coordinates and a bias rounds by at most (2d + 3)·2⁻²⁴·|f|₁·extent (the data's own
    rounding included), times s ≤ 4/g; the tag's value tolerates ⅛ (docs/keyed.md#tagging)."""
    return 32 * (2 * d + 3) * UNIT32


class NotKeyable(ConstructionError):
    """The keyed construction does not apply to these data (tokens too close for float64)."""


def _table_token(t: int) -> str:
    return f"table token {t}"


@dataclass(frozen=True)
class Tag:
    """The window that tags table token ``token``: along direction f, centre c, scale s a
    power of two; ``gap``: g/(|f|₁·extent), g the distance along f to the nearest other
    token, ``neighbour``."""

    token: int
    f: np.ndarray
    c: object
    s: object
    gap: float
    neighbour: int
    side: int = 0  # 0: a window; ±1: a cap, relu(s·(±f·x − c)), on t alone (t extreme on ±f)


@dataclass
class Survey:
    """The shared directions and, per table token, the direction where its gap is widest:
    what every tag is chosen and built from."""

    points: np.ndarray
    F: np.ndarray  # K × d float64 directions with DIRECTION_BITS-bit entries
    extent: float
    gaps: np.ndarray  # per token: its widest gap (0: none trusted)
    best: np.ndarray  # per token: (direction, neighbour) of that gap
    cap_gaps: np.ndarray  # per token: its widest gap as an extreme of a direction (0: none)
    cap_best: np.ndarray  # per token: (direction, side ±1, neighbour) of that gap
    name: Callable[[int], str]  # how errors name a token

    @classmethod
    def of(cls, points: np.ndarray, seed: int, name: Callable[[int], str] | None = None
           ) -> Survey:
        """The survey of ``points`` on :func:`_directions` drawn from ``seed``; ``name``
        names a table token in errors (keyed.token_name: "X_j[i]")."""
        X = safe_floats(points).astype(float)
        T, d = X.shape
        extent = float(np.abs(X).max(initial=0.0)) or 1.0
        F = _directions(d, seed)
        gaps = np.ones(T) if T == 1 else np.zeros(T)  # alone: a gap of the data's size
        best = np.zeros((T, 2), dtype=np.int64)
        cap_gaps, cap_best = np.zeros(T), np.zeros((T, 3), dtype=np.int64)
        if T == 1:
            cap_gaps[0], cap_best[0] = 1.0, (0, 1, 0)
        for k, f in enumerate(F if T > 1 else []):
            proj = X @ f
            order = np.argsort(proj, kind="stable")
            step = np.diff(proj[order]) / (np.abs(f).sum() * extent)
            left = np.concatenate([[np.inf], step])
            right = np.concatenate([step, [np.inf]])
            gap = np.minimum(left, right)
            gap[gap < TRUSTED] = 0.0
            nb = np.where(left < right, np.roll(order, 1), np.roll(order, -1))
            wider = gap > gaps[order]
            gaps[order[wider]] = gap[wider]
            best[order[wider]] = np.stack([np.full(wider.sum(), k), nb[wider]], axis=1)
            for side, t, g, n in ((1, order[-1], step[-1], order[-2]),
                                  (-1, order[0], step[0], order[1])):
                if g >= TRUSTED and g > cap_gaps[t]:
                    cap_gaps[t], cap_best[t] = g, (k, side, n)
        return cls(points, F, extent, gaps, best, cap_gaps, cap_best, name or _table_token)

    def tag(self, t: int, exact: bool) -> Tag:
        """The window of token t on its widest direction: c within g/64 of f·t, s·g ∈ [2, 4)
        (:meth:`_placed`). NotKeyable if t has no trusted gap."""
        k, nb = (int(v) for v in self.best[t])
        return self._placed(t, k, float(self.gaps[t]), nb, 0, exact)

    def cap(self, t: int, exact: bool) -> Tag:
        """The cap of token t, an extreme of a direction ±f (side ±1) with its widest such
        gap g: c within g/64 of ±f·t − g/2 and s·g ∈ [2, 4), so relu(s·(±f·x − c)) is in
        [15/16, 33/16) at t and an exact 0 at every other token (:meth:`_placed`)."""
        k, side, nb = (int(v) for v in self.cap_best[t])
        return self._placed(t, k, float(self.cap_gaps[t]), nb, side, exact)

    def _placed(self, t: int, k: int, gap: float, nb: int, side: int, exact: bool) -> Tag:
        """The window (side 0) or cap (side ±1) of token t on direction k, its gap g
        recomputed so that it holds in the model's arithmetic (float64 projections are
        trusted to 4(d + 1) units of 2⁻⁵³ of |f|₁·extent)."""
        f_float = self.F[k]
        norm = float(np.abs(f_float).sum()) * self.extent
        g = gap * norm * (1 - 2.0 ** -10) - 4 * (len(f_float) + 1) * 2.0 ** -53 * norm
        if g <= 0:
            X = safe_floats(self.points).astype(float)
            near = np.abs(X - X[t]).max(axis=1)
            near[t] = np.inf
            raise NotKeyable(f"input token {self.name(t)} has no gap of 2^-30 of the "
                             "data's extent to its neighbours along any direction tried (its "
                             f"nearest token: {self.name(int(np.argmin(near)))}): too close "
                             "for a window the float64 survey can place")
        f = np.array([Fraction(v) for v in f_float], dtype=object) if exact else f_float
        g = num(g, exact)
        s = power_of_two_below(num(4, exact) / g)
        s = s / 2 if s * g >= 4 else s
        centre = np.dot(self.points[t], f)
        centre = centre if side == 0 else side * centre - g / 2
        c = _on_grid(centre, power_of_two_below(g / 32), exact)
        return Tag(t, f, c, s, gap, nb, side)


# ----------------------------------------------------------------------------- grid windows
def data_grid(points: np.ndarray) -> float | None:
    """Q, the largest power of two of which every coordinate of ``points`` is an integer
    multiple, where every |x|/Q is below 2^GRID_BITS (so each coordinate has at most
    GRID_BITS significant bits); None for other data (docs/keyed.md#tagging)."""
    X = safe_floats(points).astype(float)
    nonzero = X[X != 0]
    if not np.isfinite(X).all() or not len(nonzero):
        return None if len(nonzero) else 1.0
    Q = float(lowbit(nonzero).min())
    return Q if float(np.abs(nonzero).max()) < Q * 2.0 ** GRID_BITS else None


def windows(survey: Survey, tokens: list[int], exact: bool, seed: int, progress: bool,
            grid: bool, cap_gap: float | None = None) -> list[Tag]:
    """Each token's tag. With ``grid`` (grid data, :func:`data_grid`) a token's window
    reads a small integer direction on which no other token projects where it does, with
    c = f·t exactly: every runtime computes such a window exactly wherever the partial sums
    fit its format (docs/numerics.md#low-precision-set-models). Other tokens (and every
    token without ``grid``) read their widest shared direction (:meth:`Survey.tag`). Given
    ``cap_gap`` (a float32 margin), a token extreme on a direction by at least that gap gets
    a cap instead (:meth:`Survey.cap`: half the units of a window, docs/keyed.md#tagging)."""
    found = grid_directions(survey, tokens, seed) if grid else {}

    def tag(t: int) -> Tag:
        if cap_gap is not None and survey.cap_gaps[t] >= cap_gap:
            return survey.cap(t, exact)
        return _grid_tag(t, *found[t], survey, exact) if t in found else survey.tag(t, exact)
    return [tag(t) for t in tqdm(tokens, desc="keyed: tags", disable=not progress)]


def grid_directions(survey: Survey, tokens: list[int], seed: int) -> dict:
    """token → (f, g, neighbour): an integer direction f of entries in [−r, r], r = 1, 2, 4, …
    below 2^(GRID_BITS − 1), on which the token's projection is at g from every other
    token's (its nearest being ``neighbour``), g at least the float32 margin of
    |f|₁·extent (:func:`float32_gap`, so float32 reads it as it reads a shared direction);
    the smallest |f|₁ of the first r that has one, DIRECTIONS directions drawn per r.
    Projections of grid data are exact in float64."""
    X = safe_floats(survey.points).astype(float)
    margin = float32_gap(X.shape[1])
    rng = np.random.default_rng([seed, X.shape[1], 1])
    left, out = list(dict.fromkeys(tokens)), {}
    r = 1
    while left and r < 2 ** (GRID_BITS - 1):
        F = rng.integers(-r, r + 1, size=(DIRECTIONS, X.shape[1])).astype(float)
        F = F[np.abs(F).sum(axis=1) > 0]
        F = F[np.argsort(np.abs(F).sum(axis=1), kind="stable")]
        gaps, nbs = _direction_gaps(X @ F.T, left)
        wide = gaps >= margin * np.abs(F).sum(axis=1) * survey.extent
        for i, t in enumerate(left):
            k = np.flatnonzero(wide[i])
            if len(k):
                out[t] = (F[k[0]], float(gaps[i, k[0]]), int(nbs[i, k[0]]))
        left = [t for t in left if t not in out]
        r *= 2
    return out


def _direction_gaps(P: np.ndarray, tokens: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Per token (rows) and direction (columns of the projections P, T × K): the distance
    to the nearest other projection (inf alone, 0 where another token shares it) and that
    token."""
    T = len(P)
    order = np.argsort(P, axis=0, kind="stable")
    rank = np.argsort(order, axis=0, kind="stable")[tokens]
    sortedP = np.take_along_axis(P, order, axis=0)
    cols = np.arange(P.shape[1])
    here = sortedP[rank, cols]
    below = np.where(rank > 0, here - sortedP[np.maximum(rank - 1, 0), cols], np.inf)
    above = np.where(rank < T - 1, sortedP[np.minimum(rank + 1, T - 1), cols] - here, np.inf)
    nb = np.where(below < above, order[np.maximum(rank - 1, 0), cols],
                  order[np.minimum(rank + 1, T - 1), cols])
    return np.minimum(below, above), nb


def _grid_tag(t: int, f: np.ndarray, g: float, neighbour: int, survey: Survey, exact: bool
              ) -> Tag:
    """The window of token t along the integer direction f whose nearest other projection
    is at g (inf: t alone, read as a gap of the data's size): c = f·t exactly (float64
    holds it on grid data), s·g ∈ [2, 4)."""
    norm = float(np.abs(f).sum()) * survey.extent
    g = min(g, norm)
    gn = num(g, exact)
    s = power_of_two_below(num(4, exact) / gn)
    s = s / 2 if s * gn >= 4 else s
    c = num(float(survey.points[t] @ f), exact)
    fx = np.array([Fraction(v) for v in f], dtype=object) if exact else f
    return Tag(t, fx, c, s, g / norm, neighbour)


def _directions(d: int, seed: int) -> np.ndarray:
    """K generic directions, each entry rounded to DIRECTION_BITS significant bits of the
    row's largest (so exact in float32 and a power-of-two scale away from integers)."""
    F = np.random.default_rng([seed, d]).standard_normal((DIRECTIONS, d))
    scale = np.ldexp(1.0, DIRECTION_BITS - np.frexp(np.abs(F).max(axis=1))[1])[:, None]
    return np.round(F * scale) / scale


def _on_grid(v, step, exact: bool):
    """v rounded to a multiple of the power of two ``step``."""
    if exact:
        return Fraction(round(Fraction(v) / step)) * step
    return float(np.round(float(v) / float(step)) * float(step))


# ----------------------------------------------------------------------------- choosing
def cover(survey: Survey, owners: list[np.ndarray], need: np.ndarray, margin: float,
          caps: bool = False) -> list[int]:
    """Leader tags, greedily: tokens whose gap float32 reads first, then those held by the
    most sequences still short of tags (``need``, lowered in place), fewer other holders,
    (with ``caps``) tokens a cap tags within the margin, wider gaps. A token's count only
    falls as tags are taken, so a lazy heap keeps this O(memberships · log T)."""
    def key(t: int, needy: int) -> tuple:
        g = float(survey.gaps[t])
        cap = caps and float(survey.cap_gaps[t]) >= margin
        return (-int(g >= margin or cap), -needy, len(owners[t]), -int(cap), -g, t)

    def needy(t: int) -> int:
        return int((need[owners[t]] > 0).sum())

    heap = [key(t, needy(t)) for t in range(len(owners)) if len(owners[t]) and needy(t)]
    heapq.heapify(heap)
    chosen = []
    while heap and need.any():
        top = heapq.heappop(heap)
        t = top[-1]
        now = needy(t)
        if now == 0:
            continue
        if now != -top[1]:
            heapq.heappush(heap, key(t, now))
            continue
        chosen.append(t)
        need[owners[t]] = np.maximum(need[owners[t]] - 1, 0)
    return chosen


def smallest_gap(tags: list[Tag]) -> float:
    """The narrowest tag's gap (of |f|₁·extent), 1 without tags."""
    return min((tag.gap for tag in tags), default=1.0)


def warn_close_tokens(tags: list[Tag], margin: float, name, stacklevel: int) -> None:
    """One warning when a tag's gap is below the float32 margin, naming the token and its
    neighbour by ``name(table token)`` (e.g. "X_3[5]"): a float32 pass may tag the wrong
    token there; exact and float64 passes are unaffected."""
    narrow = [tag for tag in tags if tag.gap < margin]
    if narrow:
        tag = min(narrow, key=lambda tag: tag.gap)
        warnings.warn(f"keyed model: input tokens {name(tag.token)} and {name(tag.neighbour)} "
                      f"are {tag.gap:.2g} of the data's extent apart along the best of "
                      f"{DIRECTIONS} directions, below this model's float32 margin "
                      f"{margin:.2g}, so a float32 pass may tag the wrong token there "
                      f"({len(narrow)} tag{'s' if len(narrow) > 1 else ''} so narrow; exact "
                      "and float64 passes are unaffected; docs/keyed.md#tagging)",
                      RuntimeWarning, stacklevel=stacklevel)


# ----------------------------------------------------------------------------- layers
def tagging(tags: list[Tag], lay: Layout, word: dict, C, width: int, exact: bool,
            tail: list = ()) -> tuple[list[Block], list]:
    """The tagging layers: the unit writing 1 to the ``one`` coordinate, then the tags'
    stages (:func:`_stages`) by list scheduling. Layer by layer: the next stage of every
    started tag, oldest first, each a layer after the one before; then new tags on free
    slots while there is room. A slot is free again in the layer of its tag's clip: the next
    tag's window adds to the clipped value v there, and its flip clears both, since
    relu(1 − v − window) is an exact 0 and slot − relu(slot) cancels exactly (a cap's reset
    clears v instead). Last, one reset per slot clears the value its last tag left. At width
    4 a window's 6 units take 1.5 layers, a cap's 3 or 4 one (docs/keyed.md#tagging).
    ``tail``: units that may act once no window or cap reads the data any more (softmax
    models: the data reset), placed in the room left from the last reading's layer on;
    returns the layers and the tail units that found no room."""
    layers: list[list] = [[(vec(lay.D, {}, exact), num(1, exact), vec(lay.D, {lay.one: 1},
                                                                    exact))]]
    waiting = list(reversed(tags))
    started: list[list] = []  # [stages left, slot, the first layer the next stage may take]
    free = list(range(lay.slots))
    last = {}  # slot → the layer of its last clip
    k = reading = 0  # reading: the last layer with a window
    while waiting or started:
        if k == len(layers):
            layers.append([])
        layer = layers[k]
        for job in [j for j in started if j[2] <= k]:
            if len(layer) + len(job[0][0]) <= width:
                layer += job[0].pop(0)
                job[2] = k + 1
                if not job[0]:
                    free.append(job[1])
                    last[job[1]] = k
        started = [job for job in started if job[0]]
        while waiting and free:
            stages = _stages(waiting[-1], lay, free[0], free[0] in last, word, C, exact)
            if len(layer) + len(stages[0]) > width:
                break
            waiting.pop()
            layer += stages.pop(0)
            reading = k
            started.append([stages, free.pop(0), k + 1])
        k += 1
    for slot, k in sorted(last.items(), key=lambda item: item[1]):
        while k < len(layers) and len(layers[k]) >= width:
            k += 1
        if k == len(layers):
            layers.append([])
        layers[k].append(reset_unit(lay, lay.slot(slot), exact))
    layers, rest = fill(layers, list(tail), width, start=reading)
    return [Block(ff_layer(units, exact), None) for units in layers], rest


def _stages(tag: Tag, lay: Layout, i: int, used: bool, word: dict, C, exact: bool
            ) -> list[list]:
    """The units of each stage of ``tag`` on slot i: the window's reading of the data, then
    the flip relu(1 − slot) in place of the slot, then the clip. A cap's value is the clip's
    argument itself: its reading, then the clip; on a slot an earlier tag ``used``, a reset
    beside the cap clears the value that tag left (no token has both, so the sum is exact)."""
    D, slot = lay.D, lay.slot(i)
    u = vec(D, {}, exact)
    u[:lay.d] = tag.f * tag.s
    into = vec(D, {slot: 1}, exact)
    out = on_code(lay, word[tag.token], C, exact)
    out[lay.mark] = num(1, exact)
    clip = clip_pair(into, num(0, exact), out, exact)
    if tag.side:
        reading = [(tag.side * u, -tag.c * tag.s, into)]
        return [[reset_unit(lay, slot, exact)] + reading if used else reading, clip]
    return [[(u, -tag.c * tag.s, into), (-u, tag.c * tag.s, into)],
            [reset_unit(lay, slot, exact), (-into, num(1, exact), into)], clip]
