"""The coordinates of a keyed model and the units its phases are made of.

A keyed model (docs/keyed.md) is wider than its data: after the d data coordinates it keeps
coordinates of its own (``Layout``), which hold small integers times powers of two. Every
phase writes its FF layers from the few unit shapes here: a clip pair that turns a value
≥ ¾ into an exact 1, a reset that sets a non-negative coordinate back to 0, and code readers.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from ..model import FF
from ..numbers import num, zeros
from .gadgets import balance_scale

SLOTS = 16  # at most this many tags in flight: each holds a slot coordinate meanwhile


@dataclass(frozen=True)
class Layout:
    """Where the model's own coordinates sit after the d data coordinates. The tagging's slots
    and the separation's heights share the *work* coordinates: every slot is 0 again when the
    tagging ends (docs/keyed.md#coordinates)."""

    d: int
    slots: int  # tag values awaiting their clip
    q: int  # code length
    with_moved: bool = False  # softmax models: a last coordinate, 1 once a token has moved
    heights: int = 1  # the most rounds of a separation layer: a height coordinate each
    bent: bool = False  # bent signatures: each round also has a bend coordinate
    keys: int = 0  # causal models: the position key's length, after the code
    scratch: int = 0  # softmax models: the snaps' coordinates, work ones once tags are done

    @property
    def one(self) -> int:
        return self.d

    @property
    def sigma(self) -> tuple[int, int]:
        return self.d + 1, self.d + 2

    @property
    def mark(self) -> int:
        """1 exactly on a tagged token (a clip writes it)."""
        return self.d + 3

    @property
    def work(self) -> int:
        """The first work coordinate: slots during the tagging, heights after it."""
        return self.d + 4

    def slot(self, i: int) -> int:
        """A tag writes its value here; a later layer's clip reads it and resets it to 0,
        while another tag may start writing it in that layer (docs/keyed.md#tagging)."""
        assert 0 <= i < self.slots
        return self.work + i

    def height(self, h: int = 0) -> int:
        """The heights that the rounds read by head h of a separation layer set."""
        assert 0 <= h < self.heights
        return self.work + h

    def bend(self, h: int = 0) -> int:
        """Bent signatures: the bend (keyed_separation.levels) of the round at head slot h."""
        assert self.bent and 0 <= h < self.heights
        return self.work + self.heights + h

    def round_coordinates(self, h: int) -> list[int]:
        """The work coordinates the round at head slot h sets: its height, and its bend if
        bent."""
        return [self.height(h)] + ([self.bend(h)] if self.bent else [])

    def separation_coordinates(self) -> list[int]:
        """The work coordinates the separation sets: heights, and bends if bent."""
        return [self.height(h) for h in range(self.heights)] + \
            ([self.bend(h) for h in range(self.heights)] if self.bent else [])

    def snap(self, k: int) -> int:
        """Softmax models: where the k-th snap of a move layer stores its value
        (docs/keyed.md#softmax)."""
        assert 0 <= k < self.scratch
        return self.work + k

    @property
    def code(self) -> slice:
        start = self.work + max(self.slots, self.heights * (1 + self.bent), self.scratch)
        return slice(start, start + self.q)

    @property
    def key(self) -> slice:
        """Causal models: c·σ_i of position i, stored with the positions
        (docs/causal.md#keyed-causal-models)."""
        return slice(self.code.stop, self.code.stop + self.keys)

    @property
    def moved(self) -> int:
        """Softmax models: 1 exactly on a token whose move has acted (docs/keyed.md#softmax)."""
        assert self.with_moved
        return self.D - 1

    @property
    def D(self) -> int:
        return self.key.stop + int(self.with_moved)


def vec(D: int, entries: dict, exact: bool) -> np.ndarray:
    """The D-vector with the given entries and 0 elsewhere."""
    v = zeros(D, exact)
    for i, x in entries.items():
        v[i] = num(x, exact) if not isinstance(x, (Fraction, float)) else x
    return v


def ff_layer(units: list[tuple[np.ndarray, object, np.ndarray]], exact: bool) -> FF:
    """The residual layer of ``units`` (u, b, w), each balanced by its own power of two
    (docs/numerics.md#balancing): keyed layers are no ridge windows, so nothing asks their
    rows to stay one row."""
    dtype = object if exact else float
    U = np.array([u for u, _, _ in units], dtype=dtype)
    b = np.array([c for _, c, _ in units], dtype=dtype)
    W = np.array([v for _, _, v in units], dtype=dtype).T.copy()
    for i in range(len(b)):
        c = balance_scale(U[i], b[i:i + 1], W[:, i], exact)
        U[i], b[i], W[:, i] = U[i] * c, b[i] * c, W[:, i] / c
    return FF(num(1, exact), U, b, W)


def clip_pair(u: np.ndarray, b, out: np.ndarray, exact: bool) -> list:
    """relu(2a − ½) − relu(2a − 3/2) of the argument a = u·x + b, times ``out``: exactly 1 for
    a ≥ ¾ and 0 for a ≤ ¼."""
    half = num(Fraction(1, 2), exact)
    return [(2 * u, 2 * b - half, out), (2 * u, 2 * b - 3 * half, -out)]


def reset_unit(lay: Layout, c: int, exact: bool, to=None) -> tuple:
    """x_c − relu(x_c − to)·1 = ``to`` (default 0) on every token with x_c ≥ ``to``: the
    coordinate set to a constant, exactly in real arithmetic (and in floats for to = 0)."""
    to = num(0, exact) if to is None else to
    return vec(lay.D, {c: 1}, exact), num(0, exact) - to, vec(lay.D, {c: -1}, exact)


def zero_units(lay: Layout, signs, exact: bool, floor=None) -> list:
    """Units that set each data coordinate c to a constant, per ``signs[c]``, the sign every
    token has there: 1 (all ≥ 0), x_c − relu(x_c) = 0; −1 (all ≤ 0), x_c + relu(−x_c) = 0;
    0 (both), both units, one off while the other cancels x_c, or with ``floor`` one unit
    x_c − relu(x_c − floor_c) = floor_c (floor_c at or below every token's x_c). Each is exact
    in any arithmetic but the floor, which is exact in real arithmetic only."""
    one = num(1, exact)
    out = []
    for c, sign in enumerate(signs):
        if sign == 0 and floor is not None:
            out.append(reset_unit(lay, c, exact, to=floor[c]))
            continue
        if sign >= 0:
            out.append(reset_unit(lay, c, exact))
        if sign <= 0:
            out.append((vec(lay.D, {c: -one}, exact), num(0, exact), vec(lay.D, {c: one}, exact)))
    return out


def on_code(lay: Layout, word: np.ndarray, factor, exact: bool) -> np.ndarray:
    """The D-vector with factor·word on the code coordinates and 0 elsewhere."""
    v = zeros(lay.D, exact)
    v[lay.code] = np.array([num(int(c), exact) for c in word], dtype=v.dtype) * factor
    return v


def code_reader(lay: Layout, word: np.ndarray, C, weight, exact: bool) -> np.ndarray:
    """The row weight·(ς·z_code)/C: weight·w at the token with code ς (codes C·ς), ≤
    weight·(w − 1) at any other code and 0 where there is none."""
    return on_code(lay, word, weight / C, exact)


def chunks(units: list, width: int) -> list[list]:
    """``units`` in layers of at most ``width``."""
    return [units[i:i + width] for i in range(0, len(units), width)]


def with_tail(layers: list[list], units: list, width: int, start: int | None = None
              ) -> list[list]:
    """``layers`` with ``units`` added in the room left from layer ``start`` on (default the
    last layer), then in layers of their own: a unit reads its layer's input, so a reset may
    share the layer of the last units that read what it resets."""
    layers, rest = fill(layers, units, width, start)
    return layers + chunks(rest, width)


def fill(layers: list[list], units: list, width: int, start: int | None = None
         ) -> tuple[list[list], list]:
    """``layers`` with as many of ``units`` as the room left from layer ``start`` on (default
    the last layer; none where there are no layers) takes, in order, and the units left
    over."""
    layers = [list(layer) for layer in layers]
    k = max(len(layers) - 1, 0) if start is None else start
    for i, unit in enumerate(units):
        while k < len(layers) and len(layers[k]) >= width:
            k += 1
        if k == len(layers):
            return layers, list(units[i:])
        layers[k].append(unit)
    return layers, []
