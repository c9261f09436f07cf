"""The keyed set models' separation: rounds of tests that tell apart the sequences sharing a
leader tag (docs/keyed.md#separation).

Round r sets heights 1, 2, … on its tagged tests (read by their codes); a rank-one hardmax
head adds λ_r·(the height of the highest test the sequence holds) to the signature (σ₁, σ₂).
With several heads consecutive rounds share a layer; with bent signatures a round's outcomes
are vertices of a convex chain (docs/keyed.md#bent-signatures).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING

import numpy as np

from ..model import SA, Block, Head, ScoreMatrix, ValueMatrix
from ..numbers import num
from .keyed_moves import hull_batches, move_limit, normal_reach, schedule, widest_move
from .keyed_units import Layout, code_reader, ff_layer, on_code, reset_unit, vec
from .tagging import NotKeyable

if TYPE_CHECKING:
    from .keyed import Plan, Prepared
    from .separation import TokenTable

SIGNATURE_BITS = 16  # signatures below 2^16: every move's argument is exact in float32
DRAWS = 64  # multiplier draws tried before giving up


@dataclass
class Signatures:
    lam: np.ndarray  # R × 2 integer multipliers
    values: np.ndarray  # N × 2 integer signatures (the representatives' rows; others 0)
    moves: int
    bent: bool  # σ₂ sums the bend of the outcome instead of its height
    levels: np.ndarray  # (T + 1) × 2: the height and the bend a test of rank 0 … T sets

    @property
    def top(self) -> int:
        """The largest signature entry (entries are ≥ 0)."""
        return int(self.values.max(initial=0))


def levels(T: int, bent: bool) -> np.ndarray:
    """Row i: the height and the bend that the test of rank i of a round sets (row 0: no
    test held). Plain: (i, i). Bent: the partial sums of the T primitive integer vectors
    (x ≥ 1, y ≥ 0) of smallest norm, in order of slope, a strictly convex chain with
    strictly increasing heights, so each outcome of a round is a vertex of their hull and the
    highest test still has the highest height; its entries grow like T^1.5, not like the
    parabola's T² (docs/keyed.md#bent-signatures)."""
    if not bent:
        return np.repeat(np.arange(T + 1, dtype=np.int64)[:, None], 2, axis=1)
    r = 1
    while True:
        vs = sorted(((x, y) for x in range(1, r + 1) for y in range(r + 1)
                     if math.gcd(x, y) == 1), key=lambda v: (v[0] ** 2 + v[1] ** 2, v[1]))[:T]
        if len(vs) == T and vs[-1][0] ** 2 + vs[-1][1] ** 2 <= r * r:
            break  # every vector shorter than the T-th is in the box
        r *= 2
    vs.sort(key=lambda v: Fraction(v[1], v[0]))
    out = np.zeros((T + 1, 2), dtype=np.int64)
    out[1:] = np.cumsum(np.array(vs, dtype=np.int64).reshape(-1, 2), axis=0)
    return out


def separation(table: TokenTable, p: Plan, width: int, heads: int, w: int, seed: int,
               softmax: bool) -> tuple[list[list[int]], Signatures, dict]:
    """The separation layers, the signatures and each leader tag's hull batches: of plain
    signatures with small directions, plain ones with hull normals too, and (two heads or
    more) bent ones (two heads a round, a tag's holders in convex position) with hull
    normals, the first with the fewest blocks; hull normals cost larger move weights, so an
    alternative to the first is kept only while every move weight is within
    :func:`move_limit` (and where its multipliers are found). The blocks counted, an
    estimate that weighs the options alike: separation, collapse (a softmax model's data
    reset and separation clear counted as ``width`` units a layer before it, though the reset
    mostly shares the tagging's last layers) and moves (two units a move in a softmax model,
    as plain pairs; snapped ones take three)."""
    options = [(False, False), (False, True)] + ([(True, True)] if heads >= 2 else [])
    best = None
    for bent, normals in options if p.rounds else options[:1]:
        layers = pack_rounds(p.rounds, width, min(heads, width) // (1 + bent), 1 + bent)
        if layers is None:
            continue
        try:
            sig = _signatures(table, p, seed, bent)
        except NotKeyable:
            if best is None:  # the plain signatures: nothing to fall back on
                raise
            continue
        reach = normal_reach(w, sig.top, softmax) if normals else 0
        orders = {t: list(hull_batches(sig.values[p.owners[t]], p.owners[t], reach))
                  for t in p.leader_tags}
        if best is not None and widest_move(orders, sig.top) > move_limit(w, softmax):
            continue  # an alternative to the plain signatures must keep float32 faithful
        queues = [[list(batch) for batch in orders[t]] for t in p.leader_tags]
        clears = max(map(len, layers), default=0) * (1 + bent)
        collapse = -(-(table.points.shape[1] + clears) // width) if softmax else 1
        blocks = len(layers) + collapse + len(schedule(queues, width // (1 + softmax)))
        if best is None or blocks < best[0]:
            best = (blocks, layers, sig, orders)
    return best[1:]


def _signatures(table: TokenTable, p: Plan, seed: int, bent: bool) -> Signatures:
    """Multipliers λ_r (two per round, integers in [1, top]) such that the sequences holding a
    common leader tag get distinct signature pairs Σ_r λ_r·(outcome of round r), each below
    2^16, an outcome being the :func:`levels` of the rank of the highest test held (``bent``:
    the second entry sums its bends); top is doubled from 2 until a draw works."""
    R = len(p.rounds)
    rank = np.zeros((table.N, R), dtype=np.int64)  # each representative's outcome per round
    for r, tests in enumerate(p.rounds):
        for i, t in enumerate(tests, start=1):
            rank[p.owners[t], r] = i
    lv = levels(max((len(r) for r in p.rounds), default=1), bent)
    owners = p.owners

    def apart(values: np.ndarray) -> bool:
        return all(len({tuple(v) for v in values[owners[t]]}) == len(owners[t])
                   for t in p.leader_tags)

    lam, values = draw_multipliers(lv[rank, 0], lv[rank, 1], int(lv[-1].max()), apart, seed,
                                   "the holders of a tag")
    return Signatures(lam, values, sum(len(owners[t]) for t in p.leader_tags), bent, lv)


def draw_multipliers(held: np.ndarray, second: np.ndarray, tallest: int, apart, seed: int,
                     what: str) -> tuple[np.ndarray, np.ndarray]:
    """Multipliers λ (R × 2 integers in [1, top]) and the signatures (held @ λ₀, second @
    λ₁) (``held``, ``second``: one row of R outcomes per row told apart, entries at most
    ``tallest``) that ``apart`` accepts, each entry below 2^16; top is doubled from 2 until a
    draw works, since small signatures keep the moves' weights small."""
    R = held.shape[1]
    rng = np.random.default_rng(seed)
    top, limit = 1, max(1, ((1 << SIGNATURE_BITS) - 1) // (max(R, 1) * tallest))
    while True:
        top = min(2 * top, limit)
        for _ in range(DRAWS // 8 if top < limit else DRAWS):
            lam = rng.integers(1, top + 1, size=(R, 2))
            values = np.stack([held @ lam[:, 0], second @ lam[:, 1]], axis=1)
            if apart(values):
                return lam, values
        if top == limit:
            break
    raise NotKeyable(f"no multipliers among {DRAWS} draws told apart {what}")


def pack_rounds(rounds: list[list[int]], width: int, per_layer: int, coordinates: int = 1
                ) -> list[list[int]] | None:
    """The separation layers: consecutive rounds sharing one layer, at most ``per_layer`` of
    them, each with ``coordinates`` work coordinates of its own (its height, and its bend
    when bent). A layer's FF holds its rounds' tests and a reset of every coordinate it
    reuses (one an earlier layer set), at most ``width`` units; a round that does not fit
    the current layer starts one of its own. None if a round does not fit a layer alone: a
    round has at most width − 1 tests, so that happens only with two coordinates a round."""
    layers: list[list[int]] = []
    dirty = 0  # rounds' coordinate sets the layers before the current one used: 0, 1, …
    for r, tests in enumerate(rounds):
        cur = layers[-1] if layers else []
        units = sum(len(rounds[i]) for i in cur) + len(tests) + \
            coordinates * min(len(cur) + 1, dirty)
        if cur and len(cur) < per_layer and units <= width:
            cur.append(r)
            continue
        dirty = max(dirty, len(cur))
        if len(tests) + coordinates * min(1, dirty) > width:
            return None
        layers.append([r])
    return layers


def rounds(prep: Prepared, exact: bool, score_scale=1) -> list[Block]:
    """The separation layers (``prep.sep_layers``) of a set model: the i-th test of a round
    is a tagged token, read by its code (erased, at its last round, from a test that is no
    leader tag); see :func:`separation_layers` and docs/keyed.md#separation."""
    p, lay, word, sc = prep.p, prep.lay, prep.word, prep.scales
    leaders = set(p.leader_tags)
    last_use = {t: r for r, tests in enumerate(p.rounds) for t in tests}
    two = num(2, exact)

    def test_unit(r: int, t: int, out: np.ndarray) -> tuple:
        if t not in leaders and last_use[t] == r:  # no longer tagged
            out = out + on_code(lay, word[t], -sc.C, exact)
            out[lay.mark] = num(-1, exact)
        return code_reader(lay, word[t], sc.C, two, exact), 1 - two * sc.w, out

    return separation_layers(prep.sep_layers, p.rounds, prep.sig, lay, sc.sig_unit, test_unit,
                             score_scale, exact)


def separation_layers(sep_layers: list[list[int]], tests: list[list[int]], sig: Signatures,
                      lay: Layout, sig_unit, test_unit, score_scale, exact: bool
                      ) -> list[Block]:
    """One block per separation layer. The round at head slot h of a layer: its FF sets the
    height of rank i (:func:`levels`) on the round's i-th test in height coordinate h, and its
    bend in bend coordinate h if bent, by ``test_unit(round, test, out)`` → (u, b, out'),
    whose argument is 1 at the test and ≤ −1 elsewhere; the FF also resets the coordinates an
    earlier layer set. Then σ += λ_r·(the highest test's height, and bend), by scores
    ``score_scale``·height (docs/keyed.md#separation)."""
    blocks, dirty = [], 0
    for group in sep_layers:
        units, heads = [], []
        for h, r in enumerate(group):
            for i, t in enumerate(tests[r], start=1):
                height, bend = (int(v) for v in sig.levels[i])
                out = vec(lay.D, {lay.height(h): height}, exact)
                if lay.bent:
                    out[lay.bend(h)] = num(bend, exact)
                units.append(test_unit(r, t, out))
            heads += _round_heads(lay, sig_unit, sig.lam[r], h, score_scale, exact)
        reused = [c for h in range(min(len(group), dirty)) for c in lay.round_coordinates(h)]
        units += [reset_unit(lay, c, exact) for c in reused]
        dirty = max(dirty, len(group))
        blocks.append(Block(ff_layer(units, exact), SA(num(1, exact), heads=heads)))
    return blocks


def _round_heads(lay: Layout, sig_unit, lam: np.ndarray, h: int, score_scale, exact: bool
                ) -> list[Head]:
    """The heads of the round at head slot h, scores ``score_scale``·height_l: one head adding
    λ·height to (σ₁, σ₂), or, bent, one adding λ₁·height to σ₁ and one λ₂·bend to σ₂."""
    D = lay.D
    scores = ScoreMatrix(num(0, exact), vec(D, {lay.height(h): score_scale}, exact),
                         vec(D, {lay.one: 1}, exact))

    def head(into: dict, read: int) -> Head:
        return Head(scores, ValueMatrix(num(0, exact), vec(D, into, exact),
                                        vec(D, {read: 1}, exact)))

    s1, s2 = (int(v) * sig_unit for v in lam)
    if not lay.bent:
        return [head({lay.sigma[0]: s1, lay.sigma[1]: s2}, lay.height(h))]
    return [head({lay.sigma[0]: s1}, lay.height(h)), head({lay.sigma[1]: s2}, lay.bend(h))]


def height_resets(lay: Layout, exact: bool) -> list:
    """Every coordinate the separation set (all ≥ 0) back to 0, in the collapse block, so that
    none enters the collapse's scores."""
    return [reset_unit(lay, c, exact) for c in lay.separation_coordinates()]
