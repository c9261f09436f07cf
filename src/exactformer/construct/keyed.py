"""Keyed set models: models whose every gadget after the first reads exact small numbers.

The hat construction (docs/hardmax.md) reads every gadget on a projected line whose gaps shrink
like 1/(number of points)², and a hat is zero beyond its window only because large ReLU terms
cancel, which they do to rounding alone. A keyed model reads the data once, with one-sided
caps, and from then on works in coordinates of its own holding small integers times powers of
two, which every binary format represents and adds exactly (docs/keyed.md):

1. **Tagging.** A cap relu(s·(f·x − b) − M·marks) fires at one token, extreme in direction f
   among the tokens not yet marked; a clip of its value then writes the token's *code*, a word
   of {−1, 0, 1}^q of weight w times C, exactly. Tokens in the way of the next tags are marked
   by a cap alone (a *peel*).
2. **Separation.** Round r sets heights 1, 2, … on its tagged tests; a rank-one hardmax head
   adds λ_r·(the height of the highest test the sequence holds) to two signature
   coordinates. With several heads, consecutive rounds share a layer, a head each.
3. **Collapse.** A unit clears the last round's heights, then one hardmax head
   (A = I/M + a·cᵀ, V = I, ρ = 0): every tagged token attends to itself, every other token
   to the tagged token of its sequence with the highest priority (its exact tag mark plus a
   small integer direction on its code). Each sequence is now a set of copies of its tagged
   tokens.
4. **Moves.** One ReLU per (tagged token, sequence): it reads the code and the signature and
   writes target − token, and sets every coordinate of the model's own to 0.

Every inactive unit adds exactly 0 and every active one after the caps computes its argument
without rounding, so a float32 pass errs only in the data it reads and in its one write of
target − token (docs/numerics.md#keyed-models-the-bound-for-set-data).

This module holds the plan and the gadgets both keyed models share (``prepare``) and the
hardmax model's collapse and moves (``build``); ``keyed_softmax`` holds the softmax model's.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from fractions import Fraction
from itertools import combinations

import numpy as np
from tqdm import tqdm

from ..model import FF, SA, Block, Head, ScoreMatrix, Transformer, ValueMatrix
from ..numbers import num, safe_floats, zeros
from ..record import Construction, Span
from .gadgets import balance_scale, power_of_two_below
from .generic import ConstructionError
from .position_keys import code_size, code_words
from .separation import TokenTable

SIGNATURE_BITS = 16  # signatures below 2^16: every move's argument is exact in float32
DRAWS = 64  # multiplier draws tried before giving up
EXPOSED = 2.0 ** -30  # a cap needs a margin of at least this much of the data's extent
FLOAT32_MARGIN = 2.0 ** -16  # below this (of |f|·extent) a float32 cap may misfire
SLOTS = 8  # at most this many tags per layer: each holds a slot coordinate for one layer


class NotKeyable(ConstructionError):
    """The keyed construction does not apply to these data; the hat construction does."""


# ----------------------------------------------------------------------------- coordinates
@dataclass(frozen=True)
class Layout:
    """Where the model's own coordinates sit after the d data coordinates. The tagging's slots
    and the separation's heights share the *work* coordinates: every slot is 0 again when the
    tagging ends (docs/keyed.md#coordinates)."""

    d: int
    slots: int  # cap outputs awaiting their clip (one layer each)
    q: int  # code length
    with_moved: bool = False  # softmax models: a last coordinate, 1 once a token has moved
    heights: int = 1  # the most rounds of a separation layer: a height coordinate each
    bent: bool = False  # bent signatures: each round also has a bend coordinate
    keys: int = 0  # causal models: the position key's length, after the code

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
    def peel(self) -> int:
        """A peel's cap value, in (1, 2] (inexact in floats; the collapse overwrites it)."""
        return self.d + 4

    def slot(self, i: int) -> int:
        """A cap writes its value here; in the next layer its clip reads it and resets it to
        0 while another cap may write it again, at another token (docs/keyed.md#tagging)."""
        assert 0 <= i < self.slots
        return self.d + 5 + i

    def height(self, h: int = 0) -> int:
        """The heights that the rounds read by head h of a separation layer set."""
        assert 0 <= h < self.heights
        return self.d + 5 + h

    def bend(self, h: int = 0) -> int:
        """Bent signatures: the bend (:func:`levels`) of the round at head slot h."""
        assert self.bent and 0 <= h < self.heights
        return self.d + 5 + self.heights + h

    def round_coordinates(self, h: int) -> list[int]:
        """The work coordinates the round at head slot h sets: its height, and its bend if
        bent."""
        return [self.height(h)] + ([self.bend(h)] if self.bent else [])

    def separation_coordinates(self) -> list[int]:
        """The work coordinates the separation sets: heights, and bends if bent."""
        return [self.height(h) for h in range(self.heights)] + \
            ([self.bend(h) for h in range(self.heights)] if self.bent else [])

    @property
    def code(self) -> slice:
        start = self.d + 5 + max(self.slots, self.heights * (1 + self.bent))
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


# ----------------------------------------------------------------------------- codes
def priority_direction(words: np.ndarray, groups: list[list[int]], seed: int
                       ) -> np.ndarray:
    """An integer vector g, entries as small as found, such that in every group of words (the
    leader tags a sequence holds) one word has the largest g·ς: the tag its other tokens
    collapse onto. Balanced ternary (g_c = 3^c, injective on words) when no small g does."""
    rng = np.random.default_rng(seed)
    q = words.shape[1]
    for r in (1, 2, 4, 8, 16):
        for _ in range(16):
            g = rng.integers(-r, r + 1, size=q)
            if all(_one_top(words[grp] @ g) for grp in groups):
                return g
    return 3 ** np.arange(q, dtype=np.int64)


def _one_top(values: np.ndarray) -> bool:
    return len(values) == 0 or int((values == values.max()).sum()) == 1


# ----------------------------------------------------------------------------- the plan
@dataclass
class Cap:
    """A cap at table token ``token``: direction f, threshold b (f·x_t − b is half its margin
    g, every other unmarked token at or below −g/2) and the scale s, a power of two with
    s·g/2 ∈ (1, 2]."""

    token: int
    f: np.ndarray
    b: object
    s: object
    top: object  # the largest f·x over all tokens


@dataclass
class Plan:
    """What the keyed construction will build, decided on the data before any layer."""

    steps: list[tuple[list[Cap], list[Cap]]]  # per exposure step: (tags, peels)
    leader_tags: list[int]  # table tokens whose copies become leaders
    rounds: list[list[int]]  # per separation round its tests, lowest height first
    reps: np.ndarray  # representative sequence of each sequence (equal input sets)
    owners: list[np.ndarray]  # per table token, the representatives holding it


def plan(table: TokenTable, m: list[int], exact: bool, per_round: int, progress: bool
         ) -> Plan:
    """Choose the tagged tokens (every sequence holds at least m_j leader tags), the tests
    that separate the sequences sharing a leader tag, and the order of caps that tags them."""
    seqs = table.seqs()
    reps = _representatives(seqs)
    owners = _owners(table, reps)
    X = safe_floats(table.points).astype(float)
    unmarked = np.ones(len(X), dtype=bool)
    need = np.array([m[j] if reps[j] == j else 0 for j in range(table.N)])
    chosen: list[int] = []
    steps: list = []
    bar = tqdm(total=int(need.sum()), desc="keyed: leader tags", disable=not progress)
    while need.any():
        caps = _exposed(X, unmarked, table.points, exact)
        useful = [c for c in caps if need[owners[c.token]].any()]
        before = int(need.sum())
        tags = _cover(useful, owners, need)
        bar.update(before - int(need.sum()))
        chosen += [c.token for c in tags]
        tagged = {c.token for c in tags}
        peels = [c for c in caps if c.token not in tagged] if need.any() else []
        steps.append((tags, peels))
        unmarked[[c.token for c in tags + peels]] = False
    bar.close()
    rounds = _tests(chosen, owners, seqs, per_round)
    tests = [t for r in rounds for t in r]
    wanted = set(tests)  # a test that was peeled is tagged instead, by the same cap
    steps = [(tags + [c for c in peels if c.token in wanted],
              [c for c in peels if c.token not in wanted]) for tags, peels in steps]
    done = {c.token for tags, _ in steps for c in tags}
    steps += tag_steps(X, table.points, [t for t in dict.fromkeys(tests) if t not in done],
                       unmarked, exact)
    return Plan(steps, chosen, rounds, reps, owners)


def tag_steps(X: np.ndarray, points: np.ndarray, wanted: list[int], unmarked: np.ndarray,
              exact: bool) -> list[tuple[list[Cap], list[Cap]]]:
    """Exposure steps until every token of ``wanted`` is tagged: a step tags the wanted
    tokens that are exposed among the ``unmarked`` ones (updated in place), or, when none
    is, peels every exposed token."""
    steps: list = []
    missing = list(wanted)
    while missing:
        caps = _exposed(X, unmarked, points, exact)
        want = set(missing)
        tags = [c for c in caps if c.token in want]
        peels = [] if tags else caps
        steps.append((tags, peels))
        unmarked[[c.token for c in tags + peels]] = False
        done = {c.token for c in tags}
        missing = [t for t in missing if t not in done]
    return steps


def _representatives(seqs: list[np.ndarray]) -> np.ndarray:
    """For each sequence, the first sequence with the same set of tokens (whose targets are
    the same set: contradictory duplicates are refused by the data rules)."""
    first: dict[frozenset, int] = {}
    return np.array([first.setdefault(frozenset(s.tolist()), j) for j, s in enumerate(seqs)])


def _owners(table: TokenTable, reps: np.ndarray) -> list[np.ndarray]:
    """For each table token, the representative sequences holding it."""
    keep = reps[table.seq_of] == table.seq_of
    tok, seq = table.token_of[keep], table.seq_of[keep]
    order = np.argsort(tok, kind="stable")
    tok, seq = tok[order], seq[order]
    cuts = np.searchsorted(tok, np.arange(len(table.points) + 1))
    return [seq[cuts[t]:cuts[t + 1]] for t in range(len(table.points))]


def _exposed(X: np.ndarray, unmarked: np.ndarray, points: np.ndarray, exact: bool
             ) -> list[Cap]:
    """A cap for every unmarked token that is extreme among the unmarked ones, widest margin
    (relative to |f| and the data's extent) first. The direction is x_t − p with p the point
    of the other tokens' hull nearest to x_t, approached by a few steps of Gilbert's
    algorithm from their centroid: the cap of widest margin has that direction."""
    ids = np.flatnonzero(unmarked)
    if len(ids) == 1:  # alone: any direction, the marks keep the others below the cap
        f = np.zeros(X.shape[1])
        f[0] = 1.0
        return [_cap(int(ids[0]), f, points, ids, exact)]
    P = X[ids]
    found = []
    for lo in range(0, len(ids), 1024):
        own = np.arange(lo, min(lo + 1024, len(ids)))
        F, rel = _gilbert(P, own)
        found += [(-rel[i], int(ids[own[i]]), F[i]) for i in np.flatnonzero(rel > EXPOSED)]
    found.sort(key=lambda c: c[0])
    caps = [c for c in (_cap(t, f, points, ids, exact) for _, t, f in found) if c is not None]
    return caps or [_farthest_cap(points, ids, exact)]


def _farthest_cap(points: np.ndarray, ids: np.ndarray, exact: bool) -> Cap:
    """The cap of the unmarked token farthest from their centroid c, in direction x − c
    unrounded: |y − c| ≤ |x − c| gives (y − c)·(x − c) < |x − c|² for every other y, so its
    margin is positive in any data (it may be small)."""
    P = points[ids]
    c = P.sum(axis=0) / len(ids)
    far = max(range(len(ids)), key=lambda i: float(np.dot(P[i] - c, P[i] - c)))
    cap = _cap_along(int(ids[far]), P[far] - c, points, ids, exact)
    if cap is None:
        raise NotKeyable("two tokens are too close together for a cap in float64")
    return cap


def _clear(g, values: np.ndarray, exact: bool) -> bool:
    """A usable margin: positive (rational builds), or far above float64's rounding of the
    values f·x (float64 builds)."""
    if exact:
        return g > 0
    return g > 2.0 ** -40 * float(np.abs(values).max(initial=0.0))


GILBERT_STEPS = 12


def _gilbert(P: np.ndarray, own: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For the rows ``own`` of P: a direction f = x − p (p near the point of the hull of the
    other rows closest to x) and the margin (f·x − max over the others of f·y) / (|f|·extent)."""
    x = P[own]
    p = np.broadcast_to(P.mean(axis=0), x.shape).copy()
    extent = float(np.abs(P).max(initial=0.0)) or 1.0
    rows = np.arange(len(own))
    for step in range(GILBERT_STEPS + 1):
        F = x - p
        G = F @ P.T
        mine = G[rows, own].copy()
        G[rows, own] = -np.inf
        best = np.argmax(G, axis=1)
        if step == GILBERT_STEPS:
            break
        y = P[best]
        dy = y - p
        with np.errstate(invalid="ignore", divide="ignore"):
            gamma = np.clip(np.einsum("ij,ij->i", F, dy) / np.einsum("ij,ij->i", dy, dy), 0, 1)
        p = p + np.nan_to_num(gamma)[:, None] * dy
    with np.errstate(invalid="ignore", divide="ignore"):
        rel = (mine - G[rows, best]) / (np.linalg.norm(F, axis=1) * extent)
    return F, np.nan_to_num(rel, nan=-1.0)


def _cap(t: int, f_float: np.ndarray, points: np.ndarray, ids: np.ndarray, exact: bool
         ) -> Cap | None:
    """The cap of token t in direction f (rounded to 20 significant bits per entry) against the
    unmarked tokens ``ids``, its margin recomputed in the model's arithmetic; None if the
    rounded direction loses the margin."""
    scale = 2.0 ** (20 - math.frexp(float(np.abs(f_float).max()))[1])
    f = np.round(f_float * scale) / scale
    if exact:
        f = np.array([Fraction(v) for v in f], dtype=object)
    return _cap_along(t, f, points, ids, exact)


def _cap_along(t: int, f: np.ndarray, points: np.ndarray, ids: np.ndarray, exact: bool
               ) -> Cap | None:
    """The cap of token t in the exact direction f against the unmarked tokens ``ids``: its
    margin g computed in the model's arithmetic, b halfway, s with s·g/2 ∈ (1, 2]; None
    without a usable margin (:func:`_clear`)."""
    values = points @ f
    own = values[t]
    others = values[ids[ids != t]]
    if len(others):
        second = others.max()
    else:  # alone: any margin of the data's own size (marks keep the others below the cap)
        spread = max(abs(v) for v in values)
        second = own - (spread if spread > 0 else num(1, exact))
    g = own - second
    if not _clear(g, values, exact):
        return None
    return Cap(t, f, own - g / 2, power_of_two_below(num(4, exact) / g), values.max())


def _cover(caps: list[Cap], owners: list[np.ndarray], need: np.ndarray) -> list[Cap]:
    """Greedily the caps whose tokens serve the most sequences still short of leader tags
    (fewest other holders on a tie); ``need`` is lowered in place."""
    pool = {c.token: c for c in caps}
    out = []
    while pool:
        best = max(pool, key=lambda t: (int((need[owners[t]] > 0).sum()), -len(owners[t])))
        if not (need[owners[best]] > 0).any():
            break
        out.append(pool.pop(best))
        need[owners[best]] = np.maximum(need[owners[best]] - 1, 0)
    return out


def _tests(tags: list[int], owners: list[np.ndarray], seqs: list[np.ndarray],
           per_round: int) -> list[list[int]]:
    """Separation rounds of up to ``per_round`` tests at heights 1, 2, …: a sequence's outcome
    in a round is the height of the highest test it holds (0 if none). Pairs of sequences
    holding a common leader tag must end with different outcomes in some round. Each test is
    greedily the token in the most symmetric differences of pairs the round has not told apart
    yet (a leader tag wins a tie: it needs no tag of its own); a further test joins a round
    only if the round then tells more pairs apart (a higher test held by both sequences of a
    pair undoes its split). The first test of a round tells at least one pair apart, so the
    rounds end."""
    pairs = sorted({(int(a), int(b)) for t in tags for a, b in combinations(owners[t], 2)})
    if not pairs:
        return []
    P = np.array(pairs)
    sets = [set(s.tolist()) for s in seqs]
    diffs = [np.fromiter(sets[a] ^ sets[b], dtype=np.int64) for a, b in P]
    score = np.zeros(len(owners), dtype=np.int64)
    for dlt in diffs:
        np.add.at(score, dlt, 1)
    bonus = np.zeros(len(owners), dtype=np.int64)
    bonus[tags] = 1
    alive = np.ones(len(P), dtype=bool)
    rounds = []
    while alive.any():
        outcome = np.zeros(len(seqs), dtype=np.int64)
        split = np.zeros(len(P), dtype=bool)
        tests: list[int] = []
        while len(tests) < per_round:
            t = int(np.argmax(np.where(np.isin(np.arange(len(score)), tests), -1,
                                       score * 2 + bonus)))
            if t in tests or score[t] <= 0:
                break
            trial = outcome.copy()
            trial[owners[t]] = len(tests) + 1
            now = alive & (trial[P[:, 0]] != trial[P[:, 1]])
            if tests and now.sum() <= split.sum():
                break
            for k in np.flatnonzero(now & ~split):
                np.subtract.at(score, diffs[k], 1)
            for k in np.flatnonzero(split & ~now):
                np.add.at(score, diffs[k], 1)
            outcome, split = trial, now
            tests.append(t)
        alive &= ~split
        rounds.append(tests)
    return rounds


# ----------------------------------------------------------------------------- building
@dataclass
class Built:
    """The keyed model's blocks and what the record keeps of them."""

    blocks: list[Block]
    D: int
    phases: list[tuple[str, int, int]]
    R: int
    keyed: dict  # the record's "keyed" object (record.Construction.keyed)


@dataclass
class Prepared:
    """What every keyed model shares before its collapse: the plan, the layout and code words,
    the scales, the signatures, each leader tag's hull batches and the tagging layers."""

    table: TokenTable
    p: Plan
    lay: Layout
    word: dict
    scales: _Scales
    sig: Signatures
    orders: dict  # leader tag → its hull batches of (sequence, g)
    sep_layers: list[list[int]]  # the rounds of each separation layer
    tag_layers: list[Block]
    keyed: dict  # the record's "keyed" object, without the fields a tail adds


def prepare(inputs: list[np.ndarray], m: list[int], exact: bool, width: int, heads: int,
            seed: int, progress: bool, floor: np.ndarray | None = None) -> Prepared:
    """Plan, codes, signatures, hull batches, scales and tagging layers of the keyed model
    of the data (docs/keyed.md); NotKeyable where it does not apply. Up to ``heads`` rounds
    share a separation layer. ``floor``: softmax models only, the point their data reset sets
    every token's data to before the collapse (the layout then has the ``moved``
    coordinate)."""
    table = TokenTable.build(inputs)
    with np.errstate(over="ignore"):
        if not np.isfinite(np.square(safe_floats(table.points).astype(float)).sum(axis=1)).all():
            raise NotKeyable("tokens too large for float64: their squared norms overflow, and "
                             "every cap and score reads them")
    p = plan(table, m, exact, width - 1, progress)
    tested = [t for r in p.rounds for t in r]
    leaders = set(p.leader_tags)
    every_tag = p.leader_tags + [t for t in dict.fromkeys(tested) if t not in leaders]
    q, w = code_size(len(every_tag))
    words = code_words(len(every_tag), q, w).astype(np.int64)
    word = dict(zip(every_tag, words, strict=True))
    index = {t: i for i, t in enumerate(every_tag)}
    groups = [[index[t] for t in s.tolist() if t in leaders]
              for j, s in enumerate(table.seqs()) if p.reps[j] == j]
    g = priority_direction(words[:len(p.leader_tags)], groups, seed)
    sep_layers, sig, orders = separation(table, p, width, heads, w, seed, floor is not None)
    lay = Layout(table.points.shape[1], min(width // 4, SLOTS), q, floor is not None,
                 max(map(len, sep_layers), default=1), sig.bent)
    points = table.points if floor is None else np.vstack([table.points, floor[None, :]])
    scales = _Scales.of(points, w, g, words[:len(p.leader_tags)], sig.top, exact)
    tag_layers = tagging(p.steps, lay, word, scales.C, width, exact)
    margin = smallest_margin(p.steps, table.points)
    warn_narrow_caps(margin, stacklevel=7)
    warn_wide_moves(orders, sig.top, w, floor is not None)
    peels = sum(len(pe) for _, pe in p.steps)
    record = {"coordinates": q, "weight": w, "tags": len(every_tag), "peels": peels,
              "moves": sig.moves, "tag_layers": len(tag_layers), "heights": lay.heights,
              "bent": sig.bent, "scale": str(scales.C),
              "cap_margin": f"{margin:.3g}"}
    return Prepared(table, p, lay, word, scales, sig, orders, sep_layers, tag_layers, record)


def phases(prep: Prepared, n_rounds: int, n_collapse: int, total: int
           ) -> list[tuple[str, int, int]]:
    """The record's phases: tagging, separation, collapse, interpolation."""
    a = len(prep.tag_layers)
    b = a + n_rounds
    return [("tagging", 0, a), ("separation", a, b), ("collapse", b, b + n_collapse),
            ("interpolation", b + n_collapse, total)]


def build(inputs: list[np.ndarray], targets: list[np.ndarray], m: list[int], exact: bool,
          width: int, heads: int, seed: int, progress: bool = False) -> Built:
    """The keyed hardmax model of the data (docs/keyed.md); NotKeyable where it does not
    apply."""
    prep = prepare(inputs, m, exact, width, heads, seed, progress)
    p, lay, sc = prep.p, prep.lay, prep.scales
    sep = rounds(prep, exact)
    clear = ff_layer(height_resets(lay, exact), exact) if p.rounds else None
    collapse = Block(clear, _collapse(lay, sc, exact))
    moves = _moves(prep, targets, width, exact)
    blocks = prep.tag_layers + sep + [collapse] + moves
    return Built(blocks, lay.D, phases(prep, len(sep), 1, len(blocks)), len(p.rounds),
                 prep.keyed)


def model_of(built: Built, N: int, sum_m: int, seed: int, exact: bool, attention: str
             ) -> Transformer:
    """The keyed model of ``built`` with its record; a softmax one at τ = 1, its score scales
    folded into the attention matrices."""
    softmax = attention == "softmax"
    record = Construction(kind=attention, seed=seed, N=N, sum_m=sum_m, R=built.R,
                          phases=[Span(name, a, b) for name, a, b in built.phases],
                          keyed=built.keyed, theta="1" if softmax else None,
                          folded=True if softmax else None)
    return Transformer(d=built.D, attention=attention, blocks=built.blocks,
                       tau=num(1, exact) if softmax else None, exact=exact, record=record)


def warn_narrow_caps(margin: float, stacklevel: int) -> None:
    """Warn when the smallest cap margin (:func:`smallest_margin`) is below FLOAT32_MARGIN:
    a float32 pass may then tag the wrong token."""
    if margin < FLOAT32_MARGIN:
        warnings.warn(f"keyed model: a cap's margin is {margin:.2g} of the data's extent, below "
                      "2^-16, so a float32 pass may tag the wrong token there (rational and "
                      "float64 passes are unaffected; docs/keyed.md#tagging)", RuntimeWarning,
                      stacklevel=stacklevel)


def smallest_margin(steps: list, points: np.ndarray) -> float:
    """The smallest cap margin g over |f|·(the data's largest |coordinate|): g > 2/s since
    s·g/2 > 1. A float32 cap errs by about 2⁻²⁴·8·|f|·|x|/g, which the clip absorbs while it
    is below ¼."""
    extent = float(np.abs(safe_floats(points)).max(initial=0.0)) or 1.0
    caps = [c for tags, peels in steps for c in tags + peels]
    return min((2 / float(c.s)) / (float(np.linalg.norm(safe_floats(c.f))) * extent)
               for c in caps)


@dataclass
class _Scales:
    """The collapse's numbers: the code scale C and priority weight M (powers of two), the
    priority direction g on codes and the offset G on the mark (priority G + g·ς ≥ 1 on a
    leader tag, 0 on every other token), and the signature unit (signatures are stored as
    integers times it, at most 1). See docs/keyed.md#collapse."""

    C: object
    M: object
    g: np.ndarray
    G: int
    sig_unit: object
    w: int

    @classmethod
    def of(cls, points: np.ndarray, w: int, g: np.ndarray, leader_words: np.ndarray,
           top_sigma: int, exact: bool) -> _Scales:
        top = float(np.max(np.linalg.norm(safe_floats(points).astype(float), axis=1),
                           initial=0.0))
        # |state|² outside the code at the collapse: data, one, σ, mark, peel (docs/keyed.md)
        B = top * top + 10
        two = num(2, exact)
        M = two ** math.ceil(math.log2(4 * B))
        spread = int(np.abs(leader_words @ g).max(initial=0))
        G = spread + 1
        C = two ** math.ceil(math.log2(2 * (2 * B + float(M) * (G + spread))) / 2)
        return cls(C, M, g, G, two ** -math.ceil(math.log2(top_sigma + 1)), w)


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
    :func:`move_limit` (and where its multipliers are found). The blocks counted:
    separation, collapse (a softmax model's data reset and separation clear, ``width`` units
    a layer) and moves (two units a move in a softmax model)."""
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


def move_limit(w: int, softmax: bool) -> float:
    """The largest move weight K that a float32 pass reads faithfully. A hardmax move's
    argument is an integer, exact while K·(2w + 1) < 2^24 (the limit keeps a factor 2 below).
    A softmax one carries the softmax blur, so float32 rounds it: by at most about
    (w + 4)·2⁻²⁴·4wK, its w + 4 terms summing to about 4wK, which K·w·(w + 4) ≤ 2^18 keeps
    within 1/16 (the clip pairs absorb 3/16; docs/keyed.md#moves)."""
    return 2.0 ** 18 / (w * (w + 4)) if softmax else 2.0 ** 23 / (2 * w + 1)


def warn_wide_moves(orders: dict, top: int, w: int, softmax: bool, stacklevel: int = 7
                    ) -> None:
    """Warn when a move's weight K is beyond :func:`move_limit`: a float32 pass may then
    misread that move's argument (a lexicographic direction on widely spread signatures)."""
    K = widest_move(orders, top)
    if K > move_limit(w, softmax):
        warnings.warn(f"keyed model: a move's weight K = 2^{math.log2(K):.0f} is beyond what "
                      "a float32 pass reads faithfully (rational and float64 passes are "
                      "unaffected; docs/keyed.md#moves)", RuntimeWarning,
                      stacklevel=stacklevel)


def widest_direction(orders: dict) -> int:
    """The largest |g|₁ over every state's direction, at least 1."""
    return max([1] + [abs(g[0]) + abs(g[1]) for batches in orders.values()
                      for batch in batches for _, g in batch])


def widest_move(orders: dict, top: int) -> float:
    """The largest move weight K over every state's direction."""
    return max((float(move_weight(g, top, False)) for batches in orders.values()
                for batch in batches for _, g in batch), default=1.0)


def normal_reach(w: int, top: int, softmax: bool) -> int:
    """The largest |g|₁ of a hull normal: its move weight K ≤ 2·(2·|g|₁·top + 2) stays
    within :func:`move_limit`; at least 8, as the small directions."""
    return max(8, int(move_limit(w, softmax) / 2 - 2) // (2 * max(top, 1)))


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


def vec(D: int, entries: dict, exact: bool) -> np.ndarray:
    v = zeros(D, exact)
    for i, x in entries.items():
        v[i] = num(x, exact) if not isinstance(x, (Fraction, float)) else x
    return v


def tagging(steps: list, lay: Layout, word: dict, C, width: int, exact: bool) -> list[Block]:
    """The tagging layers: the unit writing 1 to the ``one`` coordinate, then per exposure
    step its tags (a cap to a slot, then a clip to the code C·ς and the mark, and the slot
    reset, one layer later) and its peels (a cap to the mark)."""
    D = lay.D
    layers: list[list] = [[(zeros(D, exact), num(1, exact), vec(D, {lay.one: 1}, exact))]]
    slots_used: list[int] = [0]
    layer = 0
    for tags, peels in steps:
        last = layer
        for cap, is_tag in [(c, True) for c in tags] + [(c, False) for c in peels]:
            while True:
                while len(layers) <= layer + 1:
                    layers.append([])
                    slots_used.append(0)
                if is_tag and (slots_used[layer] >= lay.slots or len(layers[layer]) >= width
                               or len(layers[layer + 1]) + 3 > width):
                    layer += 1
                    continue
                if not is_tag and len(layers[layer]) >= width:
                    layer += 1
                    continue
                break
            M = _exclusion(cap)
            u = zeros(D, exact)
            u[:lay.d] = cap.f * cap.s
            # marked: the mark, or a slot the layer before wrote (its clip acts in this layer)
            for i in [lay.mark, lay.peel] + [lay.slot(i) for i in range(lay.slots)]:
                u[i] = -M
            if is_tag:
                slot = lay.slot(slots_used[layer])
                slots_used[layer] += 1
                layers[layer].append((u, -cap.b * cap.s, vec(D, {slot: 1}, exact)))
                layers[layer + 1] += _clip(slot, lay, word[cap.token], C, exact)
            else:
                layers[layer].append((u, -cap.b * cap.s, vec(D, {lay.peel: 1}, exact)))
            last = max(last, layer)
        layer = last + 1
    while layers and not layers[-1]:
        layers.pop()
    return [Block(ff_layer(units, exact), None) for units in layers]


def _exclusion(cap: Cap):
    """M: the smallest power of two ≥ 1.25·(s·(largest f·x − b) + 1) (the reach is > 1: the
    cap's own token is above b). A marked token has a mark or slot value ≥ 1 (a cap's value
    s·g/2 ∈ (1, 2], or a clip's exact 1), so M·mark outweighs the cap's reach by 1, with room
    for a float pass's rounding of the mark."""
    return power_of_two_below((cap.s * (cap.top - cap.b) + 1) * 5 / 4) * 2


def _clip(slot: int, lay: Layout, word: np.ndarray, C, exact: bool) -> list:
    """The clip pair of the slot value v times (code C·ς, mark), exactly 1 times them for
    v ≥ ¾ and 0 for v = 0, and the reset that sets the slot back to 0."""
    out = on_code(lay, word, C, exact)
    out[lay.mark] = num(1, exact)
    return clip_pair(vec(lay.D, {slot: 1}, exact), num(0, exact), out, exact) + \
        [reset_unit(lay, slot, exact)]


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


def on_code(lay: Layout, word: np.ndarray, factor, exact: bool) -> np.ndarray:
    """The D-vector with factor·word on the code coordinates and 0 elsewhere."""
    v = zeros(lay.D, exact)
    v[lay.code] = np.array([num(int(c), exact) for c in word], dtype=v.dtype) * factor
    return v


def code_reader(lay: Layout, word: np.ndarray, sc: _Scales, weight, exact: bool) -> np.ndarray:
    """The row weight·(ς·z_code)/C: weight·w at the token with code ς, ≤ weight·(w − 1) at any
    other code and 0 where there is none."""
    return on_code(lay, word, weight / sc.C, exact)


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
        return code_reader(lay, word[t], sc, two, exact), 1 - two * sc.w, out

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


def _collapse(lay: Layout, sc: _Scales, exact: bool) -> SA:
    """ρ = 0, V = I, scores ⟨x_i, x_l⟩/M + priority_l with priority G·mark + g·code/C (the
    query's ``one`` is 1): a leader tag's own code term C²·w/M beats every other score; an
    untagged token's best is the leader tag of highest priority in its sequence. These are
    the scores ⟨x_i, x_l⟩ + M·priority_l divided by the power of two M, so every argmax is the
    same in any binary arithmetic, and the weight M stays out of the parameters
    (docs/keyed.md#collapse)."""
    return SA(num(0, exact), collapse_scores(lay, sc, num(1, exact), exact),
              ValueMatrix(num(1, exact), zeros(lay.D, exact), zeros(lay.D, exact)))


def collapse_scores(lay: Layout, sc: _Scales, beta, exact: bool) -> ScoreMatrix:
    """β times the collapse scores: A = (β/M)·I + (a/t)·(t·e_one)ᵀ with a = β·(G·e_mark +
    g·code/C), t the power of two nearest √|a|. t cancels exactly in binary arithmetic and
    keeps |a/t|² + t², the two rows the ρ/η layout's W_q and W_k hold, near its smallest."""
    a = on_code(lay, sc.g, beta / sc.C, exact)
    a[lay.mark] = num(sc.G, exact) * beta
    size = math.sqrt(sum(float(v) ** 2 for v in a))
    t = num(2, exact) ** (round(math.log2(size) / 2) if size > 0 else 0)
    return ScoreMatrix(beta / sc.M, a / t, vec(lay.D, {lay.one: t}, exact))


def _moves(prep: Prepared, targets: list[np.ndarray], width: int, exact: bool
           ) -> list[Block]:
    """One unit per (leader tag, holding sequence), the holders of a tag taken from the
    largest g·σ down, so that each unit fires at its own state alone (docs/keyed.md#moves);
    it writes target − token and sets the model's own coordinates to 0."""
    def unit(t, g, j, target):
        return _move_unit(prep, t, g, j, target - prep.table.points[t], exact)

    return [Block(ff_layer(units, exact), None)
            for units in schedule(move_queues(prep, targets, unit), width)]


def move_queues(prep: Prepared, targets: list[np.ndarray], unit) -> list[list[list]]:
    """Per leader tag its hull batches, each a list of ``unit(t, g, j, target)`` for its
    (sequence j, direction g) states: what :func:`schedule` lays out."""
    slot_of = target_slots(prep.table, prep.p, targets)
    return [[[unit(t, g, j, targets[j][slot_of[(j, t)]]) for j, g in batch]
             for batch in prep.orders[t]] for t in prep.p.leader_tags]


def move_argument(prep: Prepared, t: int, g, j: int, exact: bool, shifted: bool = False):
    """(u, b, K): the argument K·(ς·code/C − w) + 2·g·(σ − σ_j) + 1 of the (tag t, sequence j)
    state, 1 at it and ≤ −1 at every other state present; K (:func:`move_weight`) makes any
    other code's −K outweigh every signature term. ``shifted``: codes raised by C (the
    softmax collapse), read as code − C."""
    lay, sc, word = prep.lay, prep.scales, prep.word[t]
    K = move_weight(g, prep.sig.top, exact)
    u = code_reader(lay, word, sc, K, exact)
    for c, gc in zip(lay.sigma, g, strict=True):
        u[c] = num(2 * gc, exact) / sc.sig_unit
    bias = num(1 - 2 * int(np.dot(g, prep.sig.values[j])), exact) - \
        K * (sc.w + (int(word.sum()) if shifted else 0))
    return u, bias, K


def _move_unit(prep: Prepared, t: int, g, j: int, move, exact: bool):
    """The (tag t, sequence j) state's unit on its :func:`move_argument`: it adds ``move`` to
    the data coordinates and sets code, signature, one and mark to 0."""
    lay, sc, word, sigma = prep.lay, prep.scales, prep.word[t], prep.sig.values[j]
    u, bias, _ = move_argument(prep, t, g, j, exact)
    out = on_code(lay, word, -sc.C, exact)
    out[:lay.d] = move
    out[lay.one] = out[lay.mark] = num(-1, exact)
    for c, v in zip(lay.sigma, sigma, strict=True):
        out[c] = -num(int(v), exact) * sc.sig_unit
    return u, bias, out


def move_weight(g, top: int, exact: bool):
    """K: the smallest power of two above 2·|g|₁·top + 1, ``top`` the largest signature
    entry: any other code's −K outweighs every signature term of a move's argument."""
    return num(2, exact) ** math.ceil(math.log2(2 * (abs(g[0]) + abs(g[1])) * top + 2))


def target_slots(table: TokenTable, p: Plan, targets: list[np.ndarray]) -> dict:
    """(sequence, leader tag) → the index of its target: the sequence's leader tags in order
    take its targets in order, cyclically (a sequence holds at least m_j of them)."""
    leaders = set(p.leader_tags)
    out = {}
    for j, s in enumerate(table.seqs()):
        if p.reps[j] == j:
            mine = [t for t in s.tolist() if t in leaders]
            out.update({(j, t): i % len(targets[j]) for i, t in enumerate(mine)})
    return out


def schedule(queues: list[list[list]], width: int, size=None) -> list[list]:
    """Layers of at most ``width`` units, an item taking ``size(item)`` of them (default 1).
    Each queue is one tag's batches: the items of a batch may share a layer (each fires at
    its own state alone while the batch's states are all present), but a batch starts only
    after the one before it has acted. Longest queues first."""
    size = size or (lambda item: 1)
    layers = []
    while any(queues):
        layer: list = []
        room = width
        for q in sorted((q for q in queues if q), key=lambda q: -sum(map(len, q))):
            take = 0
            while take < len(q[0]) and size(q[0][take]) <= room:
                room -= size(q[0][take])
                take += 1
            layer += q[0][:take]
            del q[0][:take]
            if not q[0]:
                q.pop(0)
            if room == 0:
                break
        layers.append(layer)
    return layers


DIRECTIONS = sorted(((a, b) for a in range(-4, 5) for b in range(-4, 5)
                     if (a, b) != (0, 0) and math.gcd(a, b) == 1),
                    key=lambda g: (abs(g[0]) + abs(g[1]), g))


def hull_batches(values: np.ndarray, owners: np.ndarray, reach: int):
    """Batches of (sequence, g): each pair of a batch is the unique largest g·σ over the pairs
    not yet taken (before the batch), so the batch's units can act in one layer. g is a small
    integer direction (smallest |g|₁ first), else a normal of the pairs' convex hull at the
    pair, of |g|₁ ≤ ``reach`` (points in convex position all go in one batch; 0: none). A
    set none of these orders gives its lexicographic largest pair alone."""
    left = list(range(len(owners)))
    while left:
        batch: dict[int, tuple] = {}
        for g in DIRECTIONS:
            proj = values[left] @ np.array(g)
            if _one_top(proj):
                batch.setdefault(left[int(np.argmax(proj))], g)
        for i, g in (hull_normals(values[left]) if reach else {}).items():
            proj = values[left] @ np.array(g)
            if left[i] not in batch and abs(g[0]) + abs(g[1]) <= reach and _one_top(proj) \
                    and int(np.argmax(proj)) == i:
                batch[left[i]] = g
        if not batch:  # lexicographic: (B, 1) with B above every spread of the second entry
            spread = int(np.ptp(values[left][:, 1])) + 1
            g = (spread, 1)
            proj = values[left] @ np.array(g)
            batch[left[int(np.argmax(proj))]] = g
        yield [(int(owners[i]), g) for i, g in batch.items()]
        left = [i for i in left if i not in batch]


def hull_normals(points: np.ndarray) -> dict[int, tuple[int, int]]:
    """Per vertex of the convex hull of distinct integer points (its row index), an integer
    direction g at which it is the unique largest g·x: the sum of the outward normals of its
    two edges, which lies strictly inside its normal cone (the two ends, with the edge
    itself, when the points are collinear)."""
    order = sorted(range(len(points)), key=lambda i: (int(points[i][0]), int(points[i][1])))
    if len(order) < 2:
        return {}

    def cross(o, a, b):
        (ox, oy), (ax, ay), (bx, by) = (points[o], points[a], points[b])
        return int(ax - ox) * int(by - oy) - int(ay - oy) * int(bx - ox)

    hull: list[int] = []
    for sweep in (order, order[::-1]):  # Andrew's monotone chain: lower, then upper hull
        start = len(hull)
        for i in sweep:
            while len(hull) >= start + 2 and cross(hull[-2], hull[-1], i) <= 0:
                hull.pop()
            hull.append(i)
        hull.pop()
    out = {}
    for k, v in enumerate(hull):
        before = points[hull[k - 1]] - points[v]
        after = points[hull[(k + 1) % len(hull)]] - points[v]
        g = (int(after[1] - before[1]), int(before[0] - after[0])) if len(hull) > 2 else \
            (int(-before[0]), int(-before[1]))
        c = math.gcd(*g)
        out[v] = (g[0] // c, g[1] // c)
    return out
