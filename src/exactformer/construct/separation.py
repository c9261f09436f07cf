"""Projection and separation: every token to one number u, then rounds until no point is shared.

After the projection every token is (u, 0, …) with u = a·x + a0 ∈ [1, 2], distinct tokens having
distinct u. A separation round lifts one *test* token above every u (a hat) and lets every token
add λ_r·(its sequence's max u) to its second coordinate (a rank-one hardmax attention). After the
rounds, sequences that share a token have different second coordinates σ_j, so no point is
shared. A layer of width 4k can lift up to k tests in one round to heights T_1 < … < T_k, and a
sequence's max is then the highest test it holds: k + 1 outcomes per round (docs/heads.md). The
rounds are planned on classes of sequences (partition refinement), then the multipliers λ are
drawn, then the blocks are built: nothing is patched afterwards. See docs/hardmax.md#separation.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tqdm import tqdm

from ..model import SA, Block, Head, ScoreMatrix, ValueMatrix
from ..numbers import num, unit, zeros
from ..record import Lift
from .gadgets import ff_from_units, hat_units, projection_unit
from .generic import ConstructionError, Draws, best_draw, check_sloped_hat, generic_score
from .partition import Partition, refinement


@dataclass
class TokenTable:
    """Distinct input tokens (rows of ``points``) and every (sequence, token id) membership.

    ``seq_of[k]``, ``token_of[k]``: the k-th membership, grouped by sequence in input order."""

    points: np.ndarray
    seq_of: np.ndarray
    token_of: np.ndarray
    N: int

    @classmethod
    def build(cls, inputs: list[np.ndarray]) -> TokenTable:
        flat = np.concatenate(inputs, axis=0)
        seq_of = np.repeat(np.arange(len(inputs)), [len(x) for x in inputs])
        if flat.dtype != object:
            flat += 0.0  # −0.0 made +0.0 (in the fresh copy): equal rows have equal bits
            first, token_of = _distinct_rows(flat)
            order = np.argsort(first, kind="stable")  # ids in order of first appearance
            rank = np.empty_like(order)
            rank[order] = np.arange(len(order))
            return cls(flat[first[order]], seq_of, rank[token_of], len(inputs))
        ids: dict[tuple, int] = {}
        token_of = np.array([ids.setdefault(tuple(r.tolist()), len(ids)) for r in flat])
        rows = np.empty((len(ids), flat.shape[1]), dtype=object)
        rows[token_of] = flat
        return cls(rows, seq_of, token_of, len(inputs))

    def seqs(self) -> list[np.ndarray]:
        """Token ids of each sequence."""
        return np.split(self.token_of, np.flatnonzero(np.diff(self.seq_of)) + 1)


def _distinct_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The first index of every distinct row of a float64 array and every row's group.

    Rows are sorted by a hash of their bits (one integer sort, not a sort of byte strings);
    equal rows have equal hashes, so each run of equal hashes must hold one row, which is
    checked with == against the run's first row; a run holding two rows (a collision) falls
    back to a sort of the rows."""
    bits = rows.view(np.uint64)
    mult = (np.arange(1, rows.shape[1] + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
            ) | np.uint64(1)  # odd multipliers; products and sums wrap modulo 2^64
    blocks = range(0, len(rows), 1 << 16)  # blocks of rows: no temporary the size of ``rows``
    h = np.concatenate([(bits[s:s + (1 << 16)] * mult).sum(axis=1, dtype=np.uint64)
                        for s in blocks])
    order = np.argsort(h)
    hs = h[order]
    starts = np.flatnonzero(np.concatenate([[True], hs[1:] != hs[:-1]]))
    token_of = np.empty(len(rows), dtype=np.int64)
    token_of[order] = np.repeat(np.arange(len(starts)), np.diff(np.append(starts, len(rows))))
    first = np.minimum.reduceat(order, starts)  # the first index of each run
    rep = rows[first]
    if all((rows[s:s + (1 << 16)] == rep[token_of[s:s + (1 << 16)]]).all() for s in blocks):
        return first, token_of
    _, first, token_of = np.unique(rows.view(np.dtype((np.void, rows.strides[0]))),
                                   return_index=True, return_inverse=True)
    return first, token_of.reshape(-1)


@dataclass
class Plan:
    """The rounds, decided on token ranks before any number is drawn: ``tests[r]`` are the
    tokens lifted in round r, lowest height first (None: a round without a lift);
    ``maxima[r, j]`` the rank of sequence j's largest u after round r (ranks ≥ T are the lift
    heights, in order); ``classes`` the final class of every sequence (equal signatures,
    pairwise token-disjoint)."""

    tests: list[list[tuple[int, int]] | None]  # per round (channel, token), in lift order
    maxima: np.ndarray
    rows: list[tuple[int, int]]  # (round, channel) of every row of ``maxima``
    classes: np.ndarray


@dataclass
class Separation:
    """The finished separation blocks and where they leave every token."""

    blocks: list[Block]
    u: list  # u of every distinct token after its lift (if any)
    sigma: list  # the second coordinate σ_j of every token of sequence j
    tests: list[list[tuple[int, int]] | None]  # per round (channel, token), in lift order
    lifts: list[Lift]
    channels: dict[tuple[int, int], object]  # (channel ≥ 1, token) → its height on e_{c+1}

    @property
    def R(self) -> int:
        return len(self.blocks)

    def tested(self) -> list[int | None]:
        """Every lifted token in lift order, None for a round without a lift (the record's
        ``tests``)."""
        return [t for r in self.tests for t in ([None] if r is None else [q for _, q in r])]


def project(table: TokenTable, draws: Draws) -> tuple[np.ndarray, object, list]:
    """A direction with a·x distinct over distinct tokens, rescaled so that u ∈ [1, 2]."""
    exact = draws.exact
    a = best_draw(lambda: draws.vector(table.points.shape[1]),
                  lambda a: generic_score(table.points @ a, exact), what="projection direction")
    t = table.points @ a
    lo, hi = min(t), max(t)
    spread = (hi - lo) if hi != lo else num(1, exact)
    a_s = a / spread
    a0 = 1 - lo / spread
    return a_s, a0, list(table.points @ a_s + a0)


def plan_rounds(table: TokenTable, u_rank: np.ndarray, progress: bool = False,
                per_round: int = 1, channels: int = 1) -> Plan:
    """Greedy tests until no two sequences of one class share a token (R ≤ N − 1).

    Sequences with equal signatures form a class; a class is unresolved while two of its
    sequences share a token. Lifting token p splits every class C into C ∩ owners(p) and
    C ∖ owners(p); the greedy takes the token that splits most pairs among the sequences of
    unresolved classes that hold a repeated token (:class:`Partition`, whose work per round is
    proportional to the memberships of the sequences it moves and of those still involved).
    Each round splits an unresolved class, so at most N − 1 rounds are needed. A first round
    without a lift records the sequences' own maxima when that already splits a shared token.
    With ``per_round`` > 1 a round takes further tests (:func:`_round_tests`) on ``channels``
    registers: channel 0 is u, channel c ≥ 1 a free coordinate read by its own head
    (docs/heads.md).
    """
    N, T = table.N, len(u_rank)
    seq, tok = table.seq_of, table.token_of
    cur = [np.full(N, -1, dtype=np.int64) for _ in range(channels)]
    np.maximum.at(cur[0], seq, u_rank[tok])
    part = Partition(seq, tok, T, np.zeros(N, dtype=np.int64))
    if part.weight == 0:
        return Plan([], np.zeros((0, N), dtype=np.int64), [], part.classes())
    tests, maxima, rows = [], [], []
    own = Partition(seq, tok, T, cur[0])
    if own.weight < part.weight:
        part = own
        tests.append(None)
        maxima.append(cur[0].copy())
        rows.append((0, 0))
    owners = _owners(seq, tok, T)
    lifted = 0
    bar = tqdm(desc="separation rounds", unit="round", disable=not progress, leave=False, delay=1)
    with bar:
        while (p := part.best_test()) is not None:
            if len(tests) >= N:
                raise ConstructionError(f"separation did not finish in N = {N} rounds")
            bar.update()
            chosen, part = _round_tests(p, part, owners, per_round, channels)
            for i, (c, q) in enumerate(chosen):  # the highest test held is the register's max
                cur[c][owners[q]] = T + lifted + i
            lifted += len(chosen)
            for c in sorted({0} | {c for c, _ in chosen}):
                maxima.append(cur[c].copy())
                rows.append((len(tests), c))
            tests.append(chosen)
    return Plan(tests, np.array(maxima, dtype=np.int64).reshape(-1, N), rows, part.classes())


def _round_tests(p: int, part: Partition, owners: list[np.ndarray], per_round: int,
                 channels: int) -> tuple[list[tuple[int, int]], Partition]:
    """The tests of one round as (channel, token), starting with (0, p), and the classes after
    it (``part`` itself, refined, when the round can hold one test). In each channel the i-th
    test is lifted to the i-th height, so a sequence's outcome there is the highest test it
    holds (0: none). Each further test is the greedy best on the classes refined so far, put
    in the channel where the true outcome split lowers the repeated weight most (a fresh
    channel is an independent presence bit); none that lowers it ends the round."""
    keys = {0: np.zeros(len(part.label), dtype=np.int64)}
    keys[0][owners[p]] = 1
    chosen = [(0, p)]
    after = part if per_round == 1 else part.copy()
    after.split(*refinement(part.label, list(keys.values())))
    weight = after.weight
    while len(chosen) < per_round and weight > 0:
        q = after.best_test()
        if q is None or q in [t for _, t in chosen]:
            break
        best = None
        for c in sorted(keys) + ([len(keys)] if len(keys) < channels else []):
            trial = dict(keys)
            trial[c] = keys.get(c, np.zeros(len(part.label), dtype=np.int64)).copy()
            trial[c][owners[q]] = sum(ch == c for ch, _ in chosen) + 1
            w = part.weight_after(*refinement(part.label, list(trial.values())))
            if best is None or w < best[0]:
                best = (w, c, trial)
        if best[0] >= weight:
            break
        weight, c, keys = best
        after = part.copy()
        after.split(*refinement(part.label, list(keys.values())))
        chosen.append((c, q))
    return chosen, after


def _owners(seq: np.ndarray, tok: np.ndarray, T: int) -> list[np.ndarray]:
    """Per token, the sequences holding it."""
    order = np.argsort(tok, kind="stable")
    cuts = np.searchsorted(tok[order], np.arange(1, T))
    return np.split(seq[order], cuts)


def separate(table: TokenTable, draws: Draws, score_scale=1, progress: bool = False,
             per_round: int = 1, heads: int = 1) -> Separation:
    """Plan the rounds, draw their multipliers and build their blocks. ``score_scale``
    multiplies every attention matrix A (softmax models fold 1/τ into it); ``per_round``
    tests at most share a round (a layer of width 4·per_round), on at most ``heads`` channels
    (one head each; channel c ≥ 1 uses the free coordinate e_{c+1}, so at most d − 1)."""
    exact = draws.exact
    d = table.points.shape[1]
    a, a0, u = project(table, draws)
    order = sorted(range(len(u)), key=u.__getitem__)
    u_rank = np.empty(len(u), dtype=np.int64)
    u_rank[order] = np.arange(len(u))
    plan = plan_rounds(table, u_rank, progress, per_round, max(1, min(heads, d - 1)))
    N = table.N
    if not plan.tests:
        return Separation([], u, [num(0, exact)] * N, [], [], {})
    n_lifts = sum(len(t) for t in plan.tests if t is not None)
    heights = [num(3 + k, exact) for k in range(n_lifts)]  # every u ≤ 2 < 3
    value = np.empty(len(u) + n_lifts + 1, dtype=object if exact else float)
    value[:] = [u[i] for i in order] + heights + [num(0, exact)]  # rank → value; −1 → 0
    M = value[plan.maxima]  # one row per (round, channel); a channel c ≥ 1 is 0 where unlifted
    lams = _multipliers(M, plan.classes, heights[-1] if heights else num(3, exact), draws)
    sigma = list(np.asarray(lams) @ M)
    blocks, lifts, channels = _round_blocks(table, a, a0, u, order, plan, heights, lams, draws,
                                            score_scale)
    lifted = list(u)
    for x, h in zip(lifts, heights, strict=True):
        if x.channel == 0:
            lifted[x.token] = h
    return Separation(blocks, lifted, sigma, plan.tests, lifts, channels)


def _multipliers(M: np.ndarray, classes: np.ndarray, top, draws: Draws) -> list:
    """λ_r with σ = λ·M distinct over the final classes (sequences that shared a token are in
    different classes); among valid draws, the widest relative gap."""
    reps = np.unique(classes, return_index=True)[1]
    Mc = M[:, reps]

    def score(lams):
        return generic_score(np.asarray(lams) @ Mc, draws.exact)

    return best_draw(lambda: [draws.rational(1, 2, 1024) / top for _ in range(len(M))], score,
                     what="separation multipliers")


def _round_blocks(table, a, a0, u, order, plan: Plan, heights, lams, draws, score_scale):
    """One block per round: the lift hats (or only the projection, first block) and one
    rank-one hardmax head per channel used, adding λ·(the sequence's max of the channel) to the
    second coordinate. Every hat reads u on a half-gap window (pairwise disjoint); channel 0
    lifts along e1, channel c along e_{c+1}."""
    exact, d = draws.exact, table.points.shape[1]
    e = [unit(d, i, exact) for i in range(d)]
    pos = {t: i for i, t in enumerate(order)}
    lam_of = dict(zip(plan.rows, lams, strict=True))
    blocks, lifts, k = [], [], 0
    now = [{} for _ in range(max(1, d - 1))]  # per channel: every lifted token's height
    for r, chosen in enumerate(plan.tests):
        units = [projection_unit(a, a0, e[0])] if r == 0 else []
        for c, p in chosen or []:
            # heights are integers ≥ 3 and every unlifted u ≤ 2: a lifted token has room 1/2
            x = now[0].get(p, u[p])
            delta = num(1, exact) / 2 if p in now[0] else _half_gap(u, order, pos[p], exact)
            move = e[c + 1 if c else 0] * (heights[k] - now[c].get(p, 0 * x if c else x))
            now[c][p] = heights[k]
            if r == 0:  # a hat without plateau: float64 must place it robustly
                check_sloped_hat(a, table.points[p], a0, delta, exact)
            units += hat_units(a, a0, x, delta, move, plateau=False) if r == 0 else \
                hat_units(e[0], 0 * x, x, delta, move)
            lifts.append(Lift(r, int(p), str(x), str(heights[k]), str(delta),
                              str(lam_of[r, c]), channel=c))
            k += 1
        ff = ff_from_units(units, num(0 if r == 0 else 1, exact), d, exact)
        heads = [Head(ScoreMatrix(num(0, exact), e[c + 1 if c else 0] * score_scale, e[0]),
                      ValueMatrix(num(0, exact), e[1] * lam_of[r, c], e[c + 1 if c else 0]))
                 for rr, c in plan.rows if rr == r]
        blocks.append(Block(ff, SA(num(1, exact), heads=heads)))
    channels = {(c, t): h for c in range(1, len(now)) for t, h in now[c].items()}
    return blocks, lifts, channels


def _half_gap(u, order, i, exact):
    """Half the distance from the i-th smallest u to its neighbours (at most 1/2)."""
    c = u[order[i]]
    near = [abs(u[order[k]] - c) for k in (i - 1, i + 1) if 0 <= k < len(order)]
    return min([num(1, exact)] + near) / 2


def separated_positions(inputs: list[np.ndarray], table: TokenTable, sep: Separation,
                        exact: bool) -> list[np.ndarray]:
    """Where hardmax separation leaves every token: the input itself when R = 0, else
    (u, σ_j, 0, …) — in exact arithmetic, as the construction computed it."""
    if not sep.R:
        return inputs
    kind = object if exact else float
    u, sigma = np.empty(len(sep.u), dtype=kind), np.empty(table.N, dtype=kind)
    u[:], sigma[:] = sep.u, sep.sigma
    flat = zeros((len(table.token_of), table.points.shape[1]), exact)
    flat[:, 0] = u[table.token_of]
    flat[:, 1] = sigma[table.seq_of]
    lifted: dict[int, np.ndarray] = {}  # channel c ≥ 1 → height on e_{c+1} per token
    for (c, t), h in sep.channels.items():  # lifted on a free coordinate (docs/heads.md)
        lifted.setdefault(c, zeros(len(u), exact))[t] = h
    for c, height in lifted.items():
        flat[:, c + 1] = height[table.token_of]
    return np.split(flat, np.flatnonzero(np.diff(table.seq_of)) + 1)
