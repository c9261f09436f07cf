"""Keyed softmax set models: the keyed construction with softmax attention (docs/keyed.md#softmax).

Tagging and the separation tests are those of the keyed hardmax model (``keyed.prepare``).
Softmax attention never picks one row, so every attention output is a little off the hardmax
one; the construction bounds by how much and makes every later unit blind to it:

* **Separation** scores β_s·height: each token of a sequence gets the same weights, so its
  signature is the same real number for every token of the sequence, within a bound of the
  hardmax signature.
* **Data reset.** In the tagging's last layers, once no window reads the data, one unit per
  data coordinate whose tokens share a sign, two where they do not, set it to exactly 0
  (``keyed_units.zero_units``; or, where the model would break the paper's bound, one unit
  to a dyadic floor); with rounds, units before the collapse clear the heights.
* **Collapse** (ρ = 0) with the hardmax scores times β_c and V = I + (9C/8)·(code
  indicator)·e_oneᵀ: each token becomes its leader tag's state within a bound, its data
  exactly 0, its code entries raised into [C/8, 17C/8], clear of every ReLU's kink whatever
  the layout's rounding.
* **Moves.** One constant unit writes the ``anchor`` (the targets' rounded mean) into the data.
  Each state's move reads the hardmax move's argument a (1 at its own state, ≤ −1 elsewhere,
  off by < 1/16 after the softmax layers): *snapped*, a unit stores s = relu(2a − ½) and a
  layer later relu(s) − relu(s − 1) writes target − anchor and marks the token as moved, two
  rounded products in any summation order; or, where snaps would break the paper's bound, the
  plain clip pair relu(2a − ½) − relu(2a − 3/2) of a itself. Both are exactly 1 or 0 in real
  arithmetic.
* **Reset.** One unit relu(x_c)·(−e_c) per coordinate of the model's own (all ≥ 0) ends with
  each token exactly its target and the model's coordinates exactly 0; the last move layer
  marks nothing, so the reset of ``moved`` may share it.

β_s and β_c are powers of two chosen from the data's sizes so that the bounds hold.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from ..model import SA, Block, ValueMatrix
from ..numbers import num, to_fraction, zeros
from . import keyed_one_sequence
from .gadgets import power_of_two_below
from .keyed import (
    Built,
    Prepared,
    collapse_scores,
    data_signs,
    phases,
    prepare,
    relaid,
    warn_data,
)
from .keyed_moves import move_argument, move_queues, schedule, widest_direction, widest_move
from .keyed_separation import height_resets, rounds
from .keyed_units import (
    Layout,
    chunks,
    clip_pair,
    ff_layer,
    on_code,
    reset_unit,
    vec,
    with_tail,
)

BLUR = 32  # every softmax layer moves a move's argument by less than 1/BLUR
RAISE = Fraction(9, 8)  # the collapse raises every code entry by RAISE·C, off 0 by C/8


def build(inputs: list[np.ndarray], targets: list[np.ndarray], m: list[int], exact: bool,
          width: int, heads: int, seed: int, progress: bool = False) -> Built:
    """The keyed softmax model of the data (τ = 1, the score scales folded into A), up to
    ``heads`` rounds to a separation layer. Its moves are snapped (float32-provable, a quarter
    block more a move at width 4) wherever the model then stays within the paper's bound
    2Σm + 3N, else plain clip pairs; past the bound still, a coordinate of both signs is reset
    in one unit, not two, and then the tokens extreme on a direction are tagged by caps (the
    model with fewer blocks is kept; docs/keyed.md#size)."""
    bound, n = 2 * sum(m) + 3 * len(inputs), max(map(len, inputs))
    best = None
    for caps in (False, True):
        prep = prepare(inputs, m, exact, width, heads, seed, progress, softmax=True,
                       scratch=snap_group(width), caps=caps)
        built = _fitted(prep, targets, bound, n, width, exact)
        if best is None or len(built.blocks) < len(best[1].blocks):
            best = prep, built
        if len(built.blocks) <= bound:
            break
    warn_data(best[0], softmax=True)
    return best[1]


def _fitted(prep: Prepared, targets: list[np.ndarray], bound: int, n: int, width: int,
            exact: bool) -> Built:
    """The first of these models of ``prep`` within ``bound`` blocks, else the last: snapped
    moves, plain clip pairs, plain pairs with a one-unit reset of the coordinates of both
    signs (:func:`data_floor`). One sequence: its model without attention
    (``keyed_one_sequence``), with the floor where the exact reset breaks the bound."""
    if len(targets) == 1:
        built = keyed_one_sequence.build(prep, targets, width, exact)
        if len(built.blocks) > bound:
            floor = data_floor(prep.table.points, exact)
            built = keyed_one_sequence.build(prep, targets, width, exact, floor)
        return built
    anchor = target_anchor(targets, exact)
    built = _assemble(prep, targets, anchor, anchor, n, width, exact, snaps=True)
    if len(built.blocks) > bound:
        prep = relaid(prep, 0, width, exact)
        built = _assemble(prep, targets, anchor, anchor, n, width, exact, snaps=False)
    if len(built.blocks) > bound:
        floor = data_floor(prep.table.points, exact)
        prep = relaid(prep, 0, width, exact, floor)
        built = _assemble(prep, targets, anchor, anchor - floor, n, width, exact, snaps=False)
    return built


def _assemble(prep: Prepared, targets: list[np.ndarray], anchor: np.ndarray, lift: np.ndarray,
              n: int, width: int, exact: bool, snaps: bool) -> Built:
    """The blocks after the tagging: separation, data reset, collapse, moves (snapped or
    plain clip pairs, writing target − anchor) and the final resets; ``lift``: what the
    anchor unit adds to the data, reset to 0 (or to a floor) before the collapse."""
    p, lay = prep.p, prep.lay
    beta_s, beta_c = score_scales(prep, n, exact)
    sep = rounds(prep, exact, score_scale=beta_s)
    before = prep.pending + (height_resets(lay, exact) if p.rounds else [])
    clear = [ff_layer(units, exact) for units in chunks(before, width)] or [None]
    collapse = [Block(ff, None) for ff in clear[:-1]] + \
        [Block(clear[-1], _collapse(prep, beta_c, exact))]
    moves = (_snapped_moves if snaps else _paired_moves)(prep, targets, anchor, width, exact)
    moves, last = _unmarked_last(lay, with_tail(moves, [_anchor_unit(lay, lift, exact)],
                                                width, start=0))
    layers = with_tail(moves, _own_reset(lay, bool(p.rounds), exact), width)  # data, moved only
    if last is not None:
        layers = with_tail(layers, [reset_unit(lay, lay.moved, exact)], width, start=last)
    blocks = prep.tag_layers + sep + collapse + \
        [Block(ff_layer(units, exact), None) for units in layers]
    keyed = {**prep.keyed, "scores": [str(beta_s), str(beta_c)], "snaps": snaps}
    return Built(blocks, lay.D, phases(prep, len(sep), len(collapse), len(blocks)),
                 len(p.rounds), keyed)


def data_floor(points: np.ndarray, exact: bool) -> np.ndarray:
    """Per data coordinate whose tokens have both signs a dyadic number at or below every
    token's: the largest multiple of 2⁻²⁰ of the coordinate's extent (a power of two at or
    below its largest |x_c|) not above its smallest x_c, held exactly by ball arithmetic; 0
    elsewhere (those coordinates are reset to exactly 0)."""
    out = []
    for col, sign in zip(np.asarray(points).T, data_signs(points), strict=True):
        if sign != 0:
            out.append(num(0, exact))
            continue
        lo, extent = to_fraction(col.min()), to_fraction(np.abs(col).max())
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


def _collapse(prep: Prepared, beta, exact: bool) -> SA:
    """The hardmax collapse's scores (keyed.py) times β, ρ = 0, and V = I + (9C/8)·1_code·e_oneᵀ:
    each row becomes the average of its sequence's rows with every code entry raised by 9C/8
    into [C/8, 17C/8], which no layout's rounding takes near 0 (the torch module and
    TransformerLens add the raise after the average); the data, 0 on every row, stay exactly
    0."""
    lay, sc = prep.lay, prep.scales
    shift = on_code(lay, np.ones(lay.q, dtype=np.int64), RAISE * sc.C, exact)
    return SA(num(0, exact), collapse_scores(lay, sc, beta, exact),
              ValueMatrix(num(1, exact), shift, vec(lay.D, {lay.one: 1}, exact)))


def _anchor_unit(lay: Layout, lift: np.ndarray, exact: bool) -> tuple:
    """relu(1)·lift on the data: every token's data, 0 (or the floor) after the collapse,
    becomes the anchor, so that a move writes target − anchor (:func:`target_anchor`)."""
    out = zeros(lay.D, exact)
    out[:lay.d] = lift
    return zeros(lay.D, exact), num(1, exact), out


def snap_group(width: int) -> int:
    """The states whose snaps share a layer: ``width`` below 12 (a layer of snaps, then two of
    their pairs), else width // 3, so that each layer holds one group's pairs beside the next
    group's snaps and the snaps need only width // 3 coordinates."""
    return width if width < 12 else width // 3


def _snapped_moves(prep: Prepared, targets: list[np.ndarray], anchor: np.ndarray, width: int,
                   exact: bool) -> list[list]:
    """The units of each move layer: per group of :func:`snap_group` (leader tag, holding
    sequence) states, in the hardmax model's hull batches and schedule, their snaps (one unit
    a state) and a layer later their clip pairs (two units a state), each writing
    target − anchor. A group's snaps share the layer of the previous group's pairs where
    there is room and the two groups hold no common tag (a later batch of a tag waits until
    the one before has moved); the pairs read the snaps' values in the layer's input, so both
    groups may use the same snap coordinates."""
    def state(t, g, j, target):
        return t, g, j, target - anchor

    per, layers, before = snap_group(width), [], None
    for group in schedule(move_queues(prep, targets, state), per):
        snaps = [_snap(prep, k, *item, exact) for k, item in enumerate(group)]
        tags = {item[0] for item in group}
        if before is not None and 3 * per <= width and not tags & before:
            layers[-1] = layers[-1] + snaps
        else:
            layers.append(snaps)
        layers += chunks([u for k, item in enumerate(group)
                           for u in _snapped_pair(prep, k, item[3], exact)], width)
        before = tags
    return layers


def _paired_moves(prep: Prepared, targets: list[np.ndarray], anchor: np.ndarray, width: int,
                  exact: bool) -> list[list]:
    """The units of each move layer without snaps: one clip pair relu(2a − ½) − relu(2a − 3/2)
    of the move's argument a per state, in the same batches and schedule, writing
    target − anchor. Exact in real arithmetic; in floats each unit rounds a on its own."""
    def pair(t, g, j, target):
        u, bias = _argument(prep, t, g, j, exact)
        return clip_pair(u, bias, _move_out(prep.lay, target - anchor, exact), exact)

    return [[u for p in pairs for u in p]
            for pairs in schedule(move_queues(prep, targets, pair), width // 2)]


def _argument(prep: Prepared, t: int, g, j: int, exact: bool) -> tuple:
    """The hardmax move's argument a (``move_argument``, codes read as code − 9C/8), less
    2K·moved, as (u, b)."""
    u, bias, K = move_argument(prep, t, g, j, exact, shift=num(RAISE, exact))
    u[prep.lay.moved] = -2 * K
    return u, bias


def _move_out(lay: Layout, move, exact: bool) -> np.ndarray:
    """A move's output: ``move`` on the data and 1 on ``moved``."""
    out = zeros(lay.D, exact)
    out[:lay.d] = move
    out[lay.moved] = num(1, exact)
    return out


def _snap(prep: Prepared, k: int, t: int, g, j: int, move, exact: bool) -> tuple:
    """relu(2a − ½) of the move's argument a (:func:`_argument`) into snap coordinate k: 0
    where a ≤ ¼, at least 1 where a ≥ ¾ (its own state, whatever the rounding of a), and
    small, so that the pair's terms s·move and (s − 1)·move round little
    (docs/keyed.md#softmax)."""
    u, bias = _argument(prep, t, g, j, exact)
    half = num(Fraction(1, 2), exact)
    return 2 * u, 2 * bias - half, vec(prep.lay.D, {prep.lay.snap(k): 1}, exact)


def _snapped_pair(prep: Prepared, k: int, move, exact: bool) -> list:
    """relu(s) − relu(s − 1) of snap k's value s, times (move on the data, 1 on moved): both
    units read the same stored s, so s − (s − 1) is exactly 1 (s ≥ 1) and a data cell gets
    s·move − (s − 1)·move, two rounded products, in any arithmetic. The first unit also
    clears s."""
    lay = prep.lay
    out = _move_out(lay, move, exact)
    read = vec(lay.D, {lay.snap(k): 1}, exact)
    clear = vec(lay.D, {lay.snap(k): -1}, exact)
    return [(read, num(0, exact), out + clear), (read, num(-1, exact), -out)]


def _unmarked_last(lay: Layout, layers: list[list]) -> tuple[list[list], int | None]:
    """``layers`` with the last move layer's units no longer writing ``moved``, which no
    later unit reads, and the first layer the reset of ``moved`` may take: that last layer
    (its units read the marks of the earlier ones), or None where no unit marks any more.
    This saves the layer of its own that the reset would otherwise take."""
    def writes(unit):
        return unit[2][lay.moved] != 0

    marking = [i for i, layer in enumerate(layers) if any(map(writes, layer))]
    if not marking or any(unit[0][lay.moved] != 0 for layer in layers[marking[-1] + 1:]
                          for unit in layer):
        return layers, len(layers) if marking else None
    k = marking[-1]
    layers = layers[:k] + [[_unmarked(lay, unit) for unit in layers[k]]] + layers[k + 1:]
    return layers, (k if len(marking) > 1 else None)


def _unmarked(lay: Layout, unit: tuple) -> tuple:
    """``unit`` writing nothing into ``moved``."""
    u, b, out = unit
    out = out.copy()
    out[lay.moved] = 0 * out[lay.moved]
    return u, b, out


def _own_reset(lay: Layout, rounds: bool, exact: bool) -> list:
    """Every coordinate of the model's own that may be nonzero but ``moved`` set to 0 (σ only
    after ``rounds``): each is ≥ 0 after the collapse (codes shifted), so x_c − relu(x_c) is
    exactly 0. No move writes them, so these resets may share the last move layer; ``moved``
    is reset where :func:`_unmarked_last` says."""
    coords = [lay.one, *(lay.sigma if rounds else ()), lay.mark,
              *range(lay.code.start, lay.code.stop)]
    return [reset_unit(lay, c, exact) for c in coords]
