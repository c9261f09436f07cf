"""The keyed set models' moves: one unit per (leader tag, holding sequence) state.

The unit reads the state's code and signature, K·(ς·code/C − w) + 2·g·(σ − σ_j) + 1, which is
exactly 1 at its state and ≤ −1 at every other state present, and writes target − token
(docs/keyed.md#moves). The holders of one tag are taken in *hull batches*: each state of a
batch is the unique largest g·σ among the states not yet moved, so a batch shares a layer.
"""

from __future__ import annotations

import heapq
import math
import warnings
from typing import TYPE_CHECKING

import numpy as np

from ..model import Block
from ..numbers import num
from .keyed_units import code_reader, ff_layer, on_code

if TYPE_CHECKING:
    from .keyed import Plan, Prepared
    from .separation import TokenTable


def one_top(values: np.ndarray) -> bool:
    """Whether the largest value is taken once (or there are none)."""
    return len(values) == 0 or int((values == values.max()).sum()) == 1


def move_limit(w: int, softmax: bool) -> float:
    """The largest move weight K that a float32 pass reads faithfully. A hardmax move's
    argument is an integer, exact while K·(2w + 1) < 2^24 (the limit keeps a factor 2 below).
    A softmax one carries the softmax blur, so float32 rounds it: by at most about
    (w + 4)·2⁻²⁴·5wK, its w + 4 terms summing to about 5wK (codes raised by 9C/8), which
    K·w·(w + 4) ≤ 2^18 keeps within 5/64 (snaps and clip pairs absorb 3/16;
    docs/keyed.md#softmax)."""
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


def move_layers(prep: Prepared, targets: list[np.ndarray], width: int, exact: bool
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


def move_argument(prep: Prepared, t: int, g, j: int, exact: bool, shift=0):
    """(u, b, K): the argument K·(ς·code/C − w) + 2·g·(σ − σ_j) + 1 of the (tag t, sequence j)
    state, 1 at it and ≤ −1 at every other state present; K (:func:`move_weight`) makes any
    other code's −K outweigh every signature term. ``shift``: codes raised by shift·C (the
    softmax collapse), read as code − shift·C."""
    lay, sc, word = prep.lay, prep.scales, prep.word[t]
    K = move_weight(g, prep.sig.top, exact)
    u = code_reader(lay, word, sc.C, K, exact)
    for c, gc in zip(lay.sigma, g, strict=True):
        u[c] = num(2 * gc, exact) / sc.sig_unit
    bias = num(1 - 2 * int(np.dot(g, prep.sig.values[j])), exact) - \
        K * (sc.w + shift * int(word.sum()))
    return u, bias, K


def _move_unit(prep: Prepared, t: int, g, j: int, move, exact: bool):
    """The (tag t, sequence j) state's unit on its :func:`move_argument`: it adds ``move`` to
    the data coordinates and sets code, signature, one and mark to 0. On grid data the bias
    is read mostly from ``one`` (:func:`eight_bits_above`)."""
    lay, sc, word, sigma = prep.lay, prep.scales, prep.word[t], prep.sig.values[j]
    u, bias, _ = move_argument(prep, t, g, j, exact)
    if prep.p.grid:
        high = eight_bits_above(int(bias))
        u[lay.one], bias = num(high, exact), bias - num(high, exact)
    out = on_code(lay, word, -sc.C, exact)
    out[:lay.d] = move
    out[lay.one] = out[lay.mark] = num(-1, exact)
    for c, v in zip(lay.sigma, sigma, strict=True):
        out[c] = -num(int(v), exact) * sc.sig_unit
    return u, bias, out


def eight_bits_above(bias: int) -> int:
    """The part of a move's integer bias that grid models read from the ``one`` coordinate:
    bias + 1 cut toward 0 to 8 significant bits (0 for bias ≥ −1). The rest, bias − part,
    is at most −1, so a moved state (one = 0) still reads a negative argument; for
    |bias| < 2^16 it has at most 8 bits, as has the argument's product at its own state,
    1 − rest (docs/numerics.md#low-precision-set-models)."""
    m = -(bias + 1)
    if m <= 0:
        return 0
    shift = max(m.bit_length() - 8, 0)
    return -((m >> shift) << shift)


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
    after the one before it has acted. Each layer visits the queues with the most items left
    first (ties in their given order), kept in a heap so that a layer costs the queues it
    visits, not all of them (docs/keyed.md#moves)."""
    size = size or (lambda item: 1)
    heap = [(-sum(map(len, q)), k) for k, q in enumerate(queues) if q]
    heapq.heapify(heap)
    layers = []
    while heap:
        layer: list = []
        room, visited = width, []
        while heap and room > 0:
            left, k = heapq.heappop(heap)
            q = queues[k]
            take = 0
            while take < len(q[0]) and size(q[0][take]) <= room:
                room -= size(q[0][take])
                take += 1
            layer += q[0][:take]
            del q[0][:take]
            if not q[0]:
                q.pop(0)
            visited.append((left + take, k))
        for item in visited:
            if item[0] < 0:
                heapq.heappush(heap, item)
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
    set none of these orders gives its lexicographic largest pair alone. Every direction is
    tried on every pair left at once (:func:`unique_tops`)."""
    left = np.arange(len(owners))
    while len(left):
        points = values[left]
        batch: dict[int, tuple] = {}
        for i, g in zip(unique_tops(points, DIRECTIONS), DIRECTIONS, strict=True):
            if i >= 0:
                batch.setdefault(int(left[i]), g)
        normals = [(i, g) for i, g in (hull_normals(points) if reach else {}).items()
                   if abs(g[0]) + abs(g[1]) <= reach]
        tops = unique_tops(points, [g for _, g in normals])
        for (i, g), top in zip(normals, tops, strict=True):
            if top == i:
                batch.setdefault(int(left[i]), g)
        if not batch:  # lexicographic: (B, 1) with B above every spread of the second entry
            g = (int(np.ptp(points[:, 1])) + 1, 1)
            batch[int(left[int(np.argmax(points @ np.array(g)))])] = g
        yield [(int(owners[i]), g) for i, g in batch.items()]
        left = left[~np.isin(left, list(batch))]


def unique_tops(points: np.ndarray, directions: list) -> list[int]:
    """Per direction g, the row of ``points`` that is the unique largest g·x, or −1 where
    the largest is taken twice."""
    if not directions:
        return []
    proj = points @ np.array(directions, dtype=np.int64).T
    top = proj.max(axis=0)
    once = (proj == top).sum(axis=0) == 1
    return np.where(once, proj.argmax(axis=0), -1).tolist()


def hull_normals(points: np.ndarray) -> dict[int, tuple[int, int]]:
    """Per vertex of the convex hull of distinct integer points (its row index), an integer
    direction g at which it is the unique largest g·x: the sum of the outward normals of its
    two edges, which lies strictly inside its normal cone (the two ends, with the edge
    itself, when the points are collinear). Python integers throughout: exact, and quicker
    than NumPy scalars one at a time."""
    points = [(int(x), int(y)) for x, y in np.asarray(points).tolist()]
    order = sorted(range(len(points)), key=points.__getitem__)
    if len(order) < 2:
        return {}

    def cross(o, a, b):
        (ox, oy), (ax, ay), (bx, by) = (points[o], points[a], points[b])
        return (ax - ox) * (by - oy) - (ay - oy) * (bx - ox)

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
        (x, y), (px, py) = points[v], points[hull[k - 1]]
        nx, ny = points[hull[(k + 1) % len(hull)]]
        g = (ny - py, px - nx) if len(hull) > 2 else (x - px, y - py)
        c = math.gcd(*g)
        out[v] = (g[0] // c, g[1] // c)
    return out
