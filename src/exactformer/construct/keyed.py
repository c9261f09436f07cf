"""Keyed set models: models whose every gadget after the first reads exact small numbers.

The hat construction (docs/hardmax.md) reads every gadget on a projected line whose gaps shrink
like 1/(number of points)², and a hat is zero beyond its window only because large ReLU terms
cancel, which they do to rounding alone. A keyed model reads the data once, with one-sided
caps, and from then on works in coordinates of its own holding small integers times powers of
two, which every binary format represents and adds exactly (docs/keyed.md):

1. **Tagging.** A cap (a token extreme along a shared direction) or a window (any token, on
   the direction where its gap to the other tokens' projections is widest) fires at one
   token; a clip of its value then writes the token's *code*, a word of {−1, 0, 1}^q of
   weight w times C, exactly (construct/tagging.py). A constant number of units a tag, so
   the block count never depends on the input lengths.
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

Every inactive unit adds exactly 0 and every active one after the tagging computes its argument
without rounding, so a float32 pass errs only in the data it reads and in its one write of
target − token (docs/numerics.md#keyed-models-the-bound-for-set-data).

This module is the spine: the plan (``plan``), what both keyed set models share
(``prepare``), the hardmax model's collapse, and ``build``, which calls the phases in order:
construct/tagging.py, keyed_tests.py, keyed_separation.py, the collapse here, keyed_moves.py
(the softmax model's collapse and moves: keyed_softmax.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from ..model import SA, Block, ScoreMatrix, Transformer, ValueMatrix
from ..numbers import num, safe_floats, zeros
from ..record import Construction, Span
from .keyed_moves import move_layers, one_top, warn_wide_moves
from .keyed_separation import Signatures, height_resets, rounds, separation
from .keyed_tests import plan_tests
from .keyed_units import SLOTS, Layout, ff_layer, on_code, vec, zero_units
from .position_keys import code_size, code_words
from .separation import TokenTable
from .tagging import (
    NotKeyable,
    Survey,
    Tag,
    cover,
    data_grid,
    float32_gap,
    smallest_gap,
    tagging,
    warn_close_tokens,
    windows,
)

SIGNATURE_BITS = 16  # signatures below 2^16: every move's argument is exact in float32
DRAWS = 64  # multiplier draws tried before giving up


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
            if all(one_top(words[grp] @ g) for grp in groups):
                return g
    return 3 ** np.arange(q, dtype=np.int64)


# ----------------------------------------------------------------------------- the plan
@dataclass
class Plan:
    """What the keyed construction will build, decided on the data before any layer."""

    tags: list[Tag]  # every tagged token's gadget: the leader tags', then the other tests'
    leader_tags: list[int]  # table tokens whose copies become leaders
    rounds: list[list[int]]  # per separation round its tests, lowest height first
    reps: np.ndarray  # representative sequence of each sequence (equal input sets)
    owners: list[np.ndarray]  # per table token, the representatives holding it
    margin: float  # the float32 margin of the tags' gaps (tagging.float32_gap)
    grid: bool = False  # grid windows were built: the moves keep 8-bit numbers too


def plan(table: TokenTable, m: list[int], exact: bool, per_round: int, seed: int,
         progress: bool = False, grid: bool = True, caps: bool = False) -> Plan:
    """Choose the tagged tokens (every sequence holds at least m_j leader tags: its own
    tokens where every sequence has enough, :func:`_own_tags`, else chosen by
    :func:`tagging.cover`), the tests that separate the sequences sharing a leader tag, and
    every tag's gadget (``grid``: on grid data, :func:`tagging.windows`' integer directions;
    hardmax models only, docs/numerics.md#low-precision-set-models; ``caps``: caps on the
    tokens extreme on a direction, chosen first as leaders, docs/keyed.md#tagging)."""
    seqs = table.seqs()
    reps = _representatives(seqs)
    owners = _owners(table, reps)
    survey = Survey.of(table.points, seed, token_name(table))
    margin = float32_gap(table.points.shape[1])
    need = np.array([m[j] if reps[j] == j else 0 for j in range(table.N)])
    chosen, rounds = _own_tags(survey, owners, need, margin, caps), []
    if chosen is None:
        chosen = cover(survey, owners, need, margin, caps)
        rounds = plan_tests(chosen, owners, seqs, per_round)
    tagged = chosen + [t for t in dict.fromkeys(t for r in rounds for t in r)
                       if t not in set(chosen)]
    grid = grid and data_grid(table.points) is not None
    tags = windows(survey, tagged, exact, seed, progress, grid, margin if caps else None)
    return Plan(tags, chosen, rounds, reps, owners, margin, grid)


def _own_tags(survey: Survey, owners: list[np.ndarray], need: np.ndarray, margin: float,
              caps: bool) -> list[int] | None:
    """Leader tags each held by one sequence alone (:func:`tagging.cover` on those tokens),
    where every sequence short of tags holds enough of its own and float32 reads each
    within its margin; else None. Such tags need no separation, so tokens that sequences
    gain in common inside the data's hull change no block count, even where sharing them
    would save tags (docs/keyed.md#tagging)."""
    alone = [o if len(o) == 1 else o[:0] for o in owners]
    left = need.copy()
    own = cover(survey, alone, left, margin, caps)
    t = np.array(own, dtype=np.int64)
    read = (survey.gaps[t] >= margin) | (caps & (survey.cap_gaps[t] >= margin))
    return None if left.any() or not read.all() else own


def token_name(table: TokenTable):
    """Table token → "X_j[i]", its first place in the inputs (0-based)."""
    first = np.full(len(table.points), -1)
    k = np.arange(len(table.token_of))
    first[table.token_of[::-1]] = k[::-1]
    starts = np.searchsorted(table.seq_of, np.arange(table.N))

    def name(t: int) -> str:
        j = int(table.seq_of[first[t]])
        return f"X_{j}[{int(first[t] - starts[j])}]"
    return name


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
    pending: list  # softmax: data-reset units the tagging had no room for, before the collapse


def prepare(inputs: list[np.ndarray], m: list[int], exact: bool, width: int, heads: int,
            seed: int, progress: bool, softmax: bool = False, scratch: int = 0,
            caps: bool = False) -> Prepared:
    """Plan, codes, signatures, hull batches, scales and tagging layers of the keyed model
    of the data (docs/keyed.md); NotKeyable where it does not apply. Up to ``heads`` rounds
    share a separation layer. ``softmax``: the layout also has the ``moved`` coordinate and
    ``scratch`` snap coordinates (docs/keyed.md#softmax). ``caps``: see :func:`plan`."""
    table = TokenTable.build(inputs)
    with np.errstate(over="ignore"):
        if not np.isfinite(np.square(safe_floats(table.points).astype(float)).sum(axis=1)).all():
            raise NotKeyable("tokens too large for float64: their squared norms overflow, and "
                             "every cap and score reads them")
    p = plan(table, m, exact, width - 1, seed, progress, grid=not softmax, caps=caps)
    leaders = set(p.leader_tags)
    every_tag = [tag.token for tag in p.tags]
    q, w = code_size(len(every_tag))
    words = code_words(len(every_tag), q, w).astype(np.int64)
    word = dict(zip(every_tag, words, strict=True))
    index = {t: i for i, t in enumerate(every_tag)}
    groups = [[index[t] for t in s.tolist() if t in leaders]
              for j, s in enumerate(table.seqs()) if p.reps[j] == j]
    g = priority_direction(words[:len(p.leader_tags)], groups, seed)
    sep_layers, sig, orders = separation(table, p, width, heads, w, seed, softmax)
    lay = Layout(table.points.shape[1], slots(width), q, softmax,
                 max(map(len, sep_layers), default=1), sig.bent, scratch=scratch)
    scales = _Scales.of(table.points, w, g, words[:len(p.leader_tags)], sig.top, exact)
    tag_layers, pending = _tag_layers(p, lay, word, scales.C, width, exact,
                                      data_signs(table.points))
    record = {"coordinates": q, "weight": w, "tags": len(every_tag),
              "moves": sig.moves, "tag_layers": len(tag_layers), "heights": lay.heights,
              "caps": sum(tag.side != 0 for tag in p.tags), "bent": sig.bent,
              "scale": str(scales.C),
              "cap_margin": f"{smallest_gap(p.tags):.3g}",
              "float32_margin": f"{p.margin:.3g}"}
    return Prepared(table, p, lay, word, scales, sig, orders, sep_layers, tag_layers, record,
                    pending)


def warn_data(prep: Prepared, softmax: bool) -> None:
    """The build's warnings on the data of the model it keeps: tokens closer than the float32
    margin, moves wider than float32 reads."""
    warn_close_tokens(prep.p.tags, prep.p.margin, token_name(prep.table), stacklevel=7)
    warn_wide_moves(prep.orders, prep.sig.top, prep.scales.w, softmax)


def relaid(prep: Prepared, scratch: int, width: int, exact: bool, floor=None) -> Prepared:
    """``prep`` with ``scratch`` snap coordinates and its tagging laid out again for that
    layout: the same plan, codes and tags. ``floor``: the data reset takes coordinates whose
    tokens have both signs to it in one unit (:func:`.keyed_units.zero_units`)."""
    lay = replace(prep.lay, scratch=scratch)
    tag_layers, pending = _tag_layers(prep.p, lay, prep.word, prep.scales.C, width, exact,
                                      data_signs(prep.table.points), floor)
    return replace(prep, lay=lay, tag_layers=tag_layers, pending=pending)


def _tag_layers(p: Plan, lay: Layout, word: dict, C, width: int, exact: bool, signs,
                floor=None) -> tuple[list[Block], list]:
    """The tagging layers; a softmax layout's (``moved``) also reset every data coordinate
    (to 0, or to ``floor`` where tokens have both signs there) once the last window has read
    them (``signs``: each coordinate's sign over the tokens, 0 where they have both), where
    the layers have room (the rest is returned, for the layers before the collapse;
    docs/keyed.md#softmax)."""
    tail = zero_units(lay, signs, exact, floor) if lay.with_moved else []
    return tagging(p.tags, lay, word, C, width, exact, tail)


def data_signs(points: np.ndarray) -> list[int]:
    """Per data coordinate 1 where every token is ≥ 0 there, −1 where every one is ≤ 0 (not
    all 0), else 0; compared exactly (a rational −10⁻⁴⁰⁰ is negative, though its float is −0)."""
    X = np.asarray(points)
    pos, neg = (X >= 0).all(axis=0), (X <= 0).all(axis=0)
    return [1 if p else -1 if q else 0 for p, q in zip(pos.tolist(), neg.tolist(), strict=True)]


def slots(width: int) -> int:
    """Slot coordinates: a tag holds its slot for about four layers, about width/7 tags start
    in a layer, so width/2 keep the layers full (two at width 4), up to SLOTS."""
    return max(2, min(width // 2, SLOTS))


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
    warn_data(prep, softmax=False)
    p, lay, sc = prep.p, prep.lay, prep.scales
    sep = rounds(prep, exact)
    clear = ff_layer(height_resets(lay, exact), exact) if p.rounds else None
    collapse = Block(clear, _collapse(lay, sc, exact))
    moves = move_layers(prep, targets, width, exact)
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
        # |state|² outside the code at the collapse: data, one, σ, mark (docs/keyed.md)
        B = top * top + 10
        two = num(2, exact)
        M = two ** math.ceil(math.log2(4 * B))
        spread = int(np.abs(leader_words @ g).max(initial=0))
        G = spread + 1
        C = two ** math.ceil(math.log2(2 * (2 * B + float(M) * (G + spread))) / 2)
        return cls(C, M, g, G, two ** -math.ceil(math.log2(top_sigma + 1)), w)


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


