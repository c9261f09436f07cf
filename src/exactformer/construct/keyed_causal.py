"""Keyed causal models: texts that disagree at a position, exact to float32's rounding.

Position keys (construct/position_keys.py) serve causal data whose every position has one
constrained (token, target). Where texts disagree, ``compile(data, causal=True, keys=True)``
builds this model from the gadgets of the keyed set model (construct/keyed.py; the design:
docs/causal.md#keyed-causal-models):

1. **Keys and tags.** Position i stores c·σ_i in key coordinates of the model's own (σ_i a
   word of {−1, 0, 1}^q of weight w). Tags (construct/tagging.py) give the tokens that later
   units must tell apart an exact code c·ς: the tests' tokens, and the tokens of every
   position where several constrained tokens meet.
2. **Separation.** A test is a point (position l, token y). Its unit reads the key and the
   code, 1 at the point and ≤ −1 at every other, and sets the test's rank in its round as a
   height; a causal rank-one hardmax head adds λ·(the height of the highest test in the
   prefix) to the signature σ. Rounds go on until every two constrained contexts at one point
   with different targets hold different signatures (construct/causal_rounds.py plans them).
3. **Moves.** A *cell* is a position with one constrained token, or a (position, token) at a
   position with several. One unit per state (cell, σ) reads the key, the code where the
   cell has one, and σ where the cell has several states (taken in hull batches, as in the
   set model); it writes target − token and sets key, code, mark and one to 0. A clip pair
   replaces it where an unconstrained row could fire above 1, so no row fires twice.
4. **Resets.** σ and the heights (all ≥ 0) back to 0.

A softmax model has the same layers, its rounds' scores scaled by β, and a clip pair for
every unit that reads σ, which the softmax blur reaches (docs/causal.md#keyed-causal-models).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tqdm import tqdm

from ..data import CausalDataset
from ..model import Block, Transformer
from ..numbers import num, zeros
from ..record import CausalConstruction, Span
from .causal_rounds import Contexts, conflicted, contexts, plan_round
from .generic import Draws
from .keyed import slots, token_name
from .keyed_moves import (
    hull_batches,
    move_weight,
    normal_reach,
    schedule,
    warn_wide_moves,
    widest_direction,
)
from .keyed_separation import (
    Signatures,
    draw_multipliers,
    levels,
    pack_rounds,
    separation_layers,
)
from .keyed_softmax import separation_scale
from .keyed_units import Layout, clip_pair, ff_layer, on_code, reset_unit, with_tail
from .position_keys import code_size, code_words, key_scale
from .separation import TokenTable
from .tagging import Survey, float32_gap, smallest_gap, tagging, warn_close_tokens


@dataclass
class _Data:
    """The contexts (rows in sequence order: position and token id of each) and the
    constrained ones (their row, position, token id, point id and target id)."""

    ctx: Contexts
    table: TokenTable
    tok: list[np.ndarray]  # per sequence: the token id of each position
    every_pos: np.ndarray
    every_token: np.ndarray
    flat: np.ndarray  # the row of each constrained context
    pos: np.ndarray
    token: np.ndarray
    point: np.ndarray
    target: np.ndarray
    targets: list  # target vectors by id
    shared: set[int]  # positions whose constrained contexts hold more than one token


def _data(dataset: CausalDataset, exact: bool) -> _Data:
    xs, ys = dataset.fractions() if exact else dataset.floats()
    ctx = contexts(xs, ys, list(dataset.known), exact, dataset.d)
    table = TokenTable.build(xs)
    flat = np.flatnonzero(np.concatenate(ctx.known))
    every_pos = np.concatenate([np.arange(len(x)) for x in xs])
    ids: dict[tuple, int] = {}
    Y = [row for y in ys for row in y]
    target = np.array([ids.setdefault(tuple(Y[r].tolist()), len(ids)) for r in flat.tolist()],
                      dtype=np.int64)
    targets = [None] * len(ids)
    for r, t in zip(flat.tolist(), target.tolist(), strict=True):
        targets[t] = Y[r]
    pos, token = every_pos[flat], table.token_of[flat]
    pairs = np.unique(np.stack([pos, token], axis=1), axis=0).reshape(-1, 2)
    at, count = np.unique(pairs[:, 0], return_counts=True)
    return _Data(ctx, table, table.seqs(), every_pos, table.token_of, flat, pos, token,
                 np.concatenate(ctx.pid)[flat], target, targets, set(at[count > 1].tolist()))


def _rounds(data: _Data, per_round: int, seed: int, progress: bool
            ) -> tuple[list[list[int]], np.ndarray]:
    """The rounds' test points (lowest height first) and every context's outcome per round
    (rows in sequence order): the rank of the highest test its prefix holds, 0 if none. Each
    round's heights are fresh, so a round is planned on zero registers with its tests at
    heights 1, 2, …"""
    ctx = data.ctx
    ctx.per_layer, ctx.channels = per_round, 1
    draws = Draws(seed, ctx.exact)
    zero = {0: np.zeros(len(ctx.first), dtype=np.int64)}
    cls, tests, outcomes = ctx.pid, [], []
    bar = tqdm(desc="keyed causal separation rounds", unit="round", disable=not progress,
               leave=False, delay=1)
    while conflicts := conflicted(ctx, cls):  # each round splits a conflicting pair
        rnd = plan_round(ctx, cls, zero, conflicts, draws, 1)
        tests.append([p for _, p in rnd.tests])
        outcomes.append(np.concatenate([np.asarray(m, dtype=np.int64) for m in rnd.maxima[0]]))
        cls = rnd.cls
        bar.update()
    bar.close()
    rows = sum(map(len, ctx.xs))
    return tests, (np.stack(outcomes, axis=1) if outcomes else
                   np.zeros((rows, 0), dtype=np.int64))


def _signatures(data: _Data, tests: list[list[int]], outcomes: np.ndarray, seed: int
                ) -> tuple[Signatures, np.ndarray]:
    """Multipliers such that constrained contexts at one point with different targets hold
    different signature pairs (keyed.draw_multipliers), and every context's signature pair
    (rows in sequence order)."""
    lv = levels(max(map(len, tests), default=1), False)
    mine = outcomes[data.flat]

    def apart(values: np.ndarray) -> bool:
        rows = np.column_stack([data.point, values])
        return len(np.unique(np.column_stack([rows, data.target]), axis=0)) == \
            len(np.unique(rows, axis=0))

    lam, values = draw_multipliers(mine, mine, int(lv[-1].max()), apart, seed,
                                   "the contexts of a point")
    every = np.stack([outcomes @ lam[:, 0], outcomes @ lam[:, 1]], axis=1)
    return Signatures(lam, values, 0, False, lv), every


@dataclass
class _Cell:
    """Where one group of units reads: a position, and the token where its code is read;
    its states (signature pair, target id, token id) in hull batches, and the signature
    pairs of the unconstrained contexts that its units' reader also matches."""

    position: int
    token: int | None
    states: list[tuple[tuple[int, int], int, int]]
    batches: list[list[tuple[int, tuple[int, int]]]]  # (state index, g)
    loose: np.ndarray


def _cells(data: _Data, every: np.ndarray, tagged: dict, reach: int) -> list[_Cell]:
    """The cells of the constrained contexts, in position order. A cell reads the code of its
    token wherever the token is tagged (at a shared position it always is), so that a row
    of another tagged token never fires its units."""
    found: dict[tuple, dict] = {}
    for r, (p, t) in enumerate(zip(data.pos.tolist(), data.token.tolist(), strict=True)):
        states = found.setdefault((p, t if p in data.shared or t in tagged else None), {})
        states.setdefault(tuple(int(v) for v in every[data.flat[r]]), (int(data.target[r]), t))
    free = np.ones(len(every), dtype=bool)
    free[data.flat] = False
    loose: dict[tuple, list[int]] = {}  # unconstrained rows by (position,) and (position, token)
    for r in np.flatnonzero(free).tolist():
        p, t = int(data.every_pos[r]), int(data.every_token[r])
        loose.setdefault((p, None), []).append(r)
        loose.setdefault((p, t), []).append(r)
    cells = []
    for (p, t), states in sorted(found.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)):
        listed = [(s, tg, tk) for s, (tg, tk) in states.items()]
        if len(listed) == 1:
            batches = [[(0, (0, 0))]]
        else:
            sig = np.array([s for s, _, _ in listed], dtype=np.int64)
            batches = [list(b) for b in hull_batches(sig, np.arange(len(listed)), reach)]
        rows = every[loose.get((p, t), [])].reshape(-1, 2)
        cells.append(_Cell(p, t, listed, [sub for batch in batches
                                          for sub in _one_hit(batch, listed, rows)], rows))
    return cells


def _one_hit(batch: list, states: list, loose: np.ndarray) -> list[list]:
    """``batch`` split, first fit, so that every unconstrained row of the cell is at or above
    (in the state's direction g) at most one state of each part. Such a row fires at that
    state's unit alone, at activation exactly 1, and with its key then 0 at no later unit; two
    units of one layer would both fire at it. A part of a hull batch is still one: each of
    its states is the largest among those not yet moved."""
    parts: list[tuple[list, np.ndarray]] = []
    for s, g in batch:
        hits = loose @ np.asarray(g) >= int(np.dot(g, states[s][0]))
        for items, taken in parts:
            if not (taken & hits).any():
                items.append((s, g))
                taken |= hits
                break
        else:
            parts.append(([(s, g)], hits.copy()))
    return [items for items, _ in parts]


@dataclass
class _Codes:
    """The model's codes: c, the position keys and every tagged token's word."""

    lay: Layout
    c: object
    keys: np.ndarray  # n × q_p words
    word: dict  # token id → word
    w_key: int
    w_code: int
    sig_unit: object
    tags: list  # every tagged token's gadget (tagging.Tag)
    margin: float  # the float32 margin of the tags' gaps (tagging.float32_gap)


def _reader(co: _Codes, position: int, token: int | None, K, exact: bool
            ) -> tuple[np.ndarray, object]:
    """(u, b) of K·(σ_i·key/c + ς·code/c − w_key − w_code) + 1: 1 at the position's key (and
    the token's code), ≤ 1 − K at any other key or code and where there is none."""
    lay = co.lay
    u = zeros(lay.D, exact)
    u[lay.key] = np.array([num(int(v), exact) for v in co.keys[position]], dtype=u.dtype) * \
        (K / co.c)
    w = co.w_key
    if token is not None:
        u = u + on_code(lay, co.word[token], K / co.c, exact)
        w += co.w_code
    return u, num(1, exact) - K * w


def _clear_own(co: _Codes, position: int, token: int | None, exact: bool) -> np.ndarray:
    """The output that sets the key of the position, the code and mark of the token (if it
    is tagged) and the ``one`` coordinate to 0."""
    lay = co.lay
    out = zeros(lay.D, exact)
    out[lay.key] = np.array([num(-int(v), exact) for v in co.keys[position]],
                            dtype=out.dtype) * co.c
    if token is not None and token in co.word:
        out = out + on_code(lay, co.word[token], -co.c, exact)
        out[lay.mark] = num(-1, exact)
    out[lay.one] = num(-1, exact)
    return out


def _move_units(data: _Data, co: _Codes, cell: _Cell, state: int, g, top: int, softmax: bool,
                exact: bool) -> list:
    """The units of one state: its argument (:func:`_reader`, plus 2·g·(σ − σ_s) where the
    cell has several states) is 1 at the state and ≤ −1 at every other state present. One
    ReLU, or a clip pair (exactly 1 for arguments ≥ ¾) where the argument reads σ and may
    exceed 1 elsewhere: in a softmax model (the blur reaches σ), or at an unconstrained
    context above the state in direction g. So every row a unit fires at is set to exactly
    0 in key, code, mark and one, and no row fires twice (docs/causal.md#keyed-causal-models)."""
    lay = co.lay
    sigma, target, token = cell.states[state]
    K = move_weight(g, top, exact)
    u, b = _reader(co, cell.position, cell.token, K, exact)
    for k, gk in zip(lay.sigma, g, strict=True):
        u[k] = num(2 * gk, exact) / co.sig_unit
    b = b - num(2 * int(np.dot(g, sigma)), exact)
    out = _clear_own(co, cell.position, token, exact)
    out[:lay.d] = data.targets[target] - data.table.points[token]
    above = bool((cell.loose @ np.asarray(g) > int(np.dot(g, sigma))).any())
    if any(g) and (softmax or above):
        return clip_pair(u, b, out, exact)
    return [(u, b, out)]


def build(dataset: CausalDataset, attention: str, exact: bool, width: int, heads: int,
          seed: int, progress: bool = False) -> Transformer:
    """The keyed causal model of ``dataset`` (see the module docstring): up to ``heads``
    rounds share a separation layer, ``width`` units a layer; NotKeyable where no window can
    isolate a token it needs."""
    softmax = attention == "softmax"
    data = _data(dataset, exact)
    tests, outcomes = _rounds(data, width - 1, seed, progress)
    sig, every = _signatures(data, tests, outcomes, seed)
    top = int(every.max(initial=0))  # unconstrained rows too: K must outweigh their σ
    layers = pack_rounds(tests, width, min(heads, width))
    co = _codes(data, tests, layers, width, top, seed, exact)
    w = co.w_key + co.w_code
    cells = _cells(data, every, co.word, normal_reach(w, top, softmax))
    orders = {k: cell.batches for k, cell in enumerate(cells)}
    warn_wide_moves(orders, top, w, softmax, stacklevel=5)
    beta = _score_scale(data, tests, sig, orders, exact) if softmax else num(1, exact)
    tag_layers, _ = tagging(co.tags, co.lay, co.word, co.c, width, exact)
    sep = separation_layers(layers, tests, sig, co.lay, co.sig_unit,
                            lambda r, p, out: (*_test_reader(data, co, p, exact), out),
                            beta, exact)
    queues = [[[_move_units(data, co, cells[k], s, g, top, softmax, exact)
                for s, g in batch] for batch in orders[k]] for k in range(len(cells))]
    moves = [[u for item in layer for u in item] for layer in schedule(queues, width, len)]
    moves = with_tail(moves, _resets(co.lay, tests, exact), width)
    blocks = tag_layers + sep + [Block(ff_layer(units, exact), None) for units in moves]
    return Transformer(d=co.lay.D, attention=attention, blocks=blocks, exact=exact,
                       causal=True, positions=_positions(co, exact),
                       record=_record(dataset, attention, seed, co, tests, cells,
                                      (len(tag_layers), len(sep), len(blocks)),
                                      beta if softmax else None),
                       tau=num(1, exact) if softmax else None)


def _record(dataset: CausalDataset, attention: str, seed: int, co: _Codes, tests: list,
            cells: list[_Cell], sizes: tuple[int, int, int], beta
            ) -> CausalConstruction:
    """The record: phases tagging, separation, interpolation (``sizes``: tagging and
    separation layers, all blocks), the position code and the ``keyed`` object."""
    a, r, total = sizes
    keyed = {"coordinates": co.lay.q, "weight": co.w_code, "tags": len(co.word),
             "rounds": len(tests),
             "tag_layers": a, "heights": co.lay.heights,
             "cap_margin": f"{smallest_gap(co.tags):.3g}", "float32_margin": f"{co.margin:.3g}"}
    if beta is not None:
        keyed["scores"] = [str(beta)]
    return CausalConstruction(
        kind=f"causal-{attention}", seed=seed, N=dataset.N, constrained=dataset.constrained,
        stored_positions=len(co.keys), R=r, moves=sum(len(cell.states) for cell in cells),
        phases=[Span("tagging", 0, a), Span("separation", a, a + r),
                Span("interpolation", a + r, total)],
        position_code={"coordinates": co.keys.shape[1], "weight": co.w_key,
                       "scale": str(co.c)},
        keyed=keyed)


def _test_reader(data: _Data, co: _Codes, p: int, exact: bool) -> tuple:
    """(u, b) of a test point's unit: 1 at the point, ≤ −1 at every other."""
    j, i = data.ctx.first[p]
    return _reader(co, i, int(data.tok[j][i]), num(2, exact), exact)


def _score_scale(data: _Data, tests: list, sig: Signatures, orders: dict, exact: bool):
    """β: the rounds' scores β·height keep every move's argument within 1/BLUR of its
    hardmax value (keyed_softmax.separation_scale with |g|₁ the largest of the moves)."""
    return separation_scale(widest_direction(orders) * int(np.abs(sig.lam).max(initial=1)) *
                            max(len(tests), 1), max(map(len, data.ctx.xs)), exact)


def _resets(lay: Layout, tests: list, exact: bool) -> list:
    """σ and the heights (after rounds), all ≥ 0, set to 0: no move writes them, since a
    position's one unit may serve several signatures."""
    coords = list(lay.sigma) + lay.separation_coordinates() if tests else []
    return [reset_unit(lay, c, exact) for c in coords]


def _codes(data: _Data, tests: list[list[int]], layers: list[list[int]], width: int,
           top: int, seed: int, exact: bool) -> _Codes:
    """The layout, the keys and words, and the tags: the tokens of the tests and of the
    shared positions are tagged (construct/tagging.py)."""
    wanted = {int(data.tok[j][i]) for r in tests for p in r for j, i in [data.ctx.first[p]]}
    wanted |= {int(t) for t, p in zip(data.token, data.pos, strict=True) if int(p) in data.shared}
    survey = Survey.of(data.table.points, seed, token_name(data.table))
    margin = float32_gap(data.ctx.d)
    tags = [survey.tag(t, exact) for t in sorted(wanted)]
    tagged = [tag.token for tag in tags]
    q, w = code_size(len(tagged))
    n = max(map(len, data.ctx.xs))
    q_p, w_p = code_size(n)
    lay = Layout(data.ctx.d, slots(width), q, False, max(map(len, layers), default=1), False,
                 keys=q_p)
    every = np.concatenate([data.table.points] + ([np.array(data.targets)] if data.targets
                                                 else []))
    two = num(2, exact)
    co = _Codes(lay, key_scale(every, exact), code_words(n, q_p, w_p).astype(np.int64),
                dict(zip(tagged, code_words(len(tagged), q, w).astype(np.int64), strict=True)),
                w_p, w, two ** -int(np.ceil(np.log2(top + 1))), tags, margin)
    warn_close_tokens(tags, margin, token_name(data.table), stacklevel=6)
    return co


def _positions(co: _Codes, exact: bool) -> np.ndarray:
    """Row i: c·σ_i on the key coordinates, 0 elsewhere."""
    P = zeros((len(co.keys), co.lay.D), exact)
    P[:, co.lay.key] = np.vectorize(lambda v: num(int(v), exact), otypes=[P.dtype])(co.keys) * \
        co.c
    return P
