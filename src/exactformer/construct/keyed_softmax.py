"""Keyed softmax set models: the keyed construction with softmax attention (docs/keyed.md#softmax).

Tagging and the separation tests are those of the keyed hardmax model (``keyed.prepare``).
Softmax attention never picks one row, so every attention output is a little off the hardmax
one; the construction bounds by how much and makes every later unit blind to it:

* **Separation** scores β_s·height: each token of a sequence gets the same weights, so its
  signature is the same real number for every token of the sequence, within a bound of the
  hardmax signature.
* **Data reset.** Before the collapse, one unit per data coordinate sets every token's data
  to a dyadic point ``floor`` below all of them (x − relu(x − floor)), exactly, and one unit
  clears the last round's heights.
* **Collapse** (ρ = 0) with the hardmax scores times β_c and
  V = I + (C·(code indicator) + (anchor − floor) on the data)·e_oneᵀ: each token becomes its
  leader tag's state within a bound, its data exactly ``anchor`` (the targets' rounded mean:
  every row has it), its code entries shifted into [0, 2C] so that nothing is near a ReLU's
  kink.
* **Moves** are clip pairs relu(2a − ½) − relu(2a − 3/2) of the hardmax move's argument a
  (1 at its own state, ≤ −1 elsewhere, off by < 1/16 after the softmax layers): exactly 1 or
  0 in real arithmetic, they write target − anchor and mark the token as moved.
* **Reset.** One unit relu(x_c)·(−e_c) per coordinate of the model's own (all ≥ 0) ends with
  each token exactly its target and the model's coordinates exactly 0.

β_s and β_c are powers of two chosen from the data's sizes so that the bounds hold.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from ..model import SA, Block, ValueMatrix
from ..numbers import num, to_fraction, zeros
from .gadgets import power_of_two_below
from .keyed import Built, Prepared, collapse_scores, phases, prepare
from .keyed_moves import move_argument, move_queues, schedule, widest_direction, widest_move
from .keyed_separation import height_resets, rounds
from .keyed_units import Layout, clip_pair, ff_layer, on_code, reset_unit, vec, with_tail

BLUR = 32  # every softmax layer moves a move's argument by less than 1/BLUR


def build(inputs: list[np.ndarray], targets: list[np.ndarray], m: list[int], exact: bool,
          width: int, heads: int, seed: int, progress: bool = False) -> Built:
    """The keyed softmax model of the data (τ = 1, the score scales folded into A), up to
    ``heads`` rounds to a separation layer."""
    floor = data_floor(inputs, exact)
    anchor = target_anchor(targets, exact)
    prep = prepare(inputs, m, exact, width, heads, seed, progress, floor=floor)
    p, lay = prep.p, prep.lay
    beta_s, beta_c = score_scales(prep, max(len(x) for x in inputs), exact)
    sep = rounds(prep, exact, score_scale=beta_s)
    clear = height_resets(lay, exact) if p.rounds else []
    reset = [ff_layer(units, exact)
             for units in _chunks(_data_reset(lay, floor, exact) + clear, width)]
    collapse = [Block(ff, None) for ff in reset[:-1]] + \
        [Block(reset[-1], _collapse(prep, beta_c, anchor - floor, exact))]
    moves = _moves(prep, targets, anchor, width, exact)
    layers = with_tail(moves, _own_reset(lay, bool(p.rounds), exact), width)  # data, moved only
    layers = with_tail(layers, [reset_unit(lay, lay.moved, exact)], width, start=len(moves))
    blocks = prep.tag_layers + sep + collapse + \
        [Block(ff_layer(units, exact), None) for units in layers]
    keyed = {**prep.keyed, "scores": [str(beta_s), str(beta_c)]}
    return Built(blocks, lay.D, phases(prep, len(sep), len(collapse), len(blocks)),
                 len(p.rounds), keyed)


def data_floor(inputs: list[np.ndarray], exact: bool) -> np.ndarray:
    """Per data coordinate a dyadic number at or below every token's: the largest multiple of
    2⁻²⁰ of the coordinate's extent (a power of two at or below its largest |x_c|) not above
    its smallest x_c, so ball arithmetic holds it exactly. 0 for a coordinate that is 0 on
    every token."""
    X = np.vstack(inputs)  # each column's extremes first: one exact conversion per value kept
    out = []
    for lo, extent in zip(X.min(axis=0), np.abs(X).max(axis=0), strict=True):
        lo, extent = to_fraction(lo), to_fraction(extent)
        if extent == 0:
            out.append(num(0, exact))
            continue
        step = max(power_of_two_below(extent), Fraction(1, 1 << 1000)) * Fraction(1, 1 << 20)
        out.append(num(math.floor(lo / step) * step, exact))
    return np.array(out, dtype=object if exact else float)


def target_anchor(targets: list[np.ndarray], exact: bool) -> np.ndarray:
    """Per data coordinate the point the collapse moves every token's data to, so that a
    move writes target − anchor: the targets' mean, rounded to a multiple of 2⁻¹⁰ of their
    extent in that coordinate (a power of two at or below their largest |y_c|; 0 where every
    target is 0). Moves write each vector twice (a clip pair), so centring them on the
    targets keeps ‖θ‖² near the targets' spread rather than their size
    (docs/keyed.md#softmax)."""
    Y = np.vstack(targets)
    out = []
    for mean, extent in zip(Y.mean(axis=0), np.abs(Y).max(axis=0), strict=True):
        if extent == 0:
            out.append(num(0, exact))
            continue
        step = max(power_of_two_below(to_fraction(extent)), Fraction(1, 1 << 1000)) / (1 << 10)
        out.append(num(round(to_fraction(mean) / step) * step, exact))
    return np.array(out, dtype=object if exact else float)


def score_scales(prep: Prepared, n: int, exact: bool) -> tuple:
    """(β_s, β_c), powers of two. A round's average height falls short of the highest by at
    most (n − 1)·e^(−β_s) (heights of tests differ by at least 1), and its average bend (bent
    signatures) by at most T times that, T the steepest slope of the bend against the height
    (T = 1 unbent); that moves a move's argument by at most 2·|g|₁·λ·R·T·(n − 1)·e^(−β_s). The
    collapse mixes other rows in with weights ≤ e^(−β_c/2) (its score margins are ≥ ½), which
    moves it by at most 2·K·q·(n − 1)·e^(−β_c/2). Each is kept below 1/BLUR."""
    g1 = widest_direction(prep.orders)
    K = widest_move(prep.orders, prep.sig.top)
    lam = int(np.abs(prep.sig.lam).max(initial=1))
    R = max(len(prep.p.rounds), 1)
    steps = np.diff(prep.sig.levels, axis=0)
    T = max(1, math.ceil(max((b / a for a, b in steps), default=1))) if prep.sig.bent else 1
    two = num(2, exact)
    beta_c = two ** math.ceil(math.log2(2 * math.log(2 * BLUR * K * prep.lay.q * n)))
    return separation_scale(g1 * lam * R * T, n, exact), beta_c


def separation_scale(spread: int, n: int, exact: bool):
    """β_s: the smallest power of two with e^(β_s) ≥ 2·BLUR·spread·n, which keeps the rounds'
    shift of a move's argument, at most 2·spread·(n − 1)·e^(−β_s) (spread = |g|₁·λ·R·T), below
    1/BLUR."""
    return num(2, exact) ** math.ceil(math.log2(math.log(2 * BLUR * spread * n)))


def _chunks(units: list, width: int) -> list[list]:
    """``units`` in layers of at most ``width``."""
    return [units[i:i + width] for i in range(0, len(units), width)]


def _data_reset(lay: Layout, floor: np.ndarray, exact: bool) -> list:
    """Every data coordinate set to floor_c (every token has x_c ≥ floor_c)."""
    return [reset_unit(lay, c, exact, to=floor[c]) for c in range(lay.d)]


def _collapse(prep: Prepared, beta, lift: np.ndarray, exact: bool) -> SA:
    """The hardmax collapse's scores (keyed.py) times β, ρ = 0, and
    V = I + (C·1_code + lift on the data)·e_oneᵀ: each row becomes the average of its
    sequence's rows with every code entry raised by C and the data, floor on every row,
    moved to floor + lift (the anchor)."""
    lay, sc = prep.lay, prep.scales
    shift = on_code(lay, np.ones(lay.q, dtype=np.int64), sc.C, exact)
    shift[:lay.d] = lift
    return SA(num(0, exact), collapse_scores(lay, sc, beta, exact),
              ValueMatrix(num(1, exact), shift, vec(lay.D, {lay.one: 1}, exact)))


def _moves(prep: Prepared, targets: list[np.ndarray], anchor: np.ndarray, width: int,
           exact: bool) -> list[list]:
    """The units of each move layer: one clip pair per (leader tag, holding sequence), in the
    hardmax model's hull batches and schedule (two units per state), each writing
    target − anchor."""
    def pair(t, g, j, target):
        return _clip_pair(prep, t, g, j, target - anchor, exact)

    return [[u for p in pairs for u in p]
            for pairs in schedule(move_queues(prep, targets, pair), width // 2)]


def _clip_pair(prep: Prepared, t: int, g, j: int, move, exact: bool) -> list:
    """The hardmax move's argument a (``move_argument``, codes read as code − C), less
    2K·moved, as relu(2a − ½) − relu(2a − 3/2) times (move on the data, 1 on moved)."""
    lay = prep.lay
    u, bias, K = move_argument(prep, t, g, j, exact, shifted=True)
    u[lay.moved] = -2 * K
    out = zeros(lay.D, exact)
    out[:lay.d] = move
    out[lay.moved] = num(1, exact)
    return clip_pair(u, bias, out, exact)


def _own_reset(lay: Layout, rounds: bool, exact: bool) -> list:
    """Every coordinate of the model's own that may be nonzero but ``moved`` set to 0 (σ only
    after ``rounds``): each is ≥ 0 after the collapse (codes shifted), so x_c − relu(x_c) is
    exactly 0. No move writes them, so these resets may share the last move layer; ``moved``
    is reset after it."""
    coords = [lay.one, *(lay.sigma if rounds else ()), lay.mark,
              *range(lay.code.start, lay.code.stop)]
    return [reset_unit(lay, c, exact) for c in coords]
