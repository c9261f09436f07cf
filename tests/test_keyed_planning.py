"""The keyed set models' planning on shared tokens (docs/keyed.md#separation, #moves): the
separation tests, the hull batches and the move schedule, on random memberships alone (no
geometry), against plain references that list every pair or sort every queue."""

from __future__ import annotations

from itertools import combinations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from exactformer.construct import keyed_moves
from exactformer.construct.keyed_tests import plan_tests

SETTINGS = settings(max_examples=150, deadline=None)


@st.composite
def memberships(draw):
    """(tags, owners, seqs): N sequences as distinct random subsets of a pool of T tokens
    (small pools: heavy sharing), some tokens leader tags, ``owners`` each token's
    holders."""
    T = draw(st.integers(1, 12))
    subsets = st.frozensets(st.integers(0, T - 1), min_size=1)
    sets = draw(st.lists(subsets, min_size=1, max_size=14, unique=True))
    seqs = [np.array(sorted(s), dtype=np.int64) for s in sets]
    owners = [np.array([j for j, s in enumerate(sets) if t in s], dtype=np.int64)
              for t in range(T)]
    tags = sorted(draw(st.sets(st.integers(0, T - 1), min_size=1)))
    return tags, owners, seqs


def outcomes(rounds: list[list[int]], owners: list[np.ndarray], N: int) -> np.ndarray:
    """Each sequence's outcome per round: the rank (from 1) of the highest test it holds."""
    out = np.zeros((N, len(rounds)), dtype=np.int64)
    for r, tests in enumerate(rounds):
        for i, t in enumerate(tests, start=1):
            out[owners[t], r] = i
    return out


def reference_tests(tags, owners, seqs, per_round):
    """plan_tests' greedy on the listed pairs (a pair once per leader tag it shares)."""
    pairs = [(a, b) for t in tags for a, b in combinations(owners[t].tolist(), 2)]
    sets = [set(s.tolist()) for s in seqs]
    alive = list(pairs)
    rounds = []
    while alive:
        outcome = [0] * len(seqs)
        tests: list[int] = []
        together = alive
        while len(tests) < per_round:
            score = [sum(t in sets[a] ^ sets[b] for a, b in together) for t in range(len(owners))]
            pick = [-1 if t in tests else 2 * score[t] + (t in tags) for t in range(len(owners))]
            t = int(np.argmax(pick))
            if t in tests or score[t] <= 0:
                break
            trial = list(outcome)
            for j in owners[t].tolist():
                trial[j] = len(tests) + 1
            now = [(a, b) for a, b in alive if trial[a] == trial[b]]
            if tests and len(now) >= len(together):
                break
            outcome, together = trial, now
            tests.append(t)
        alive = together
        rounds.append(tests)
    return rounds


@SETTINGS
@given(m=memberships(), per_round=st.sampled_from([1, 2, 3, 7]))
def test_tests_tell_every_pair_apart_as_the_listed_pairs_do(m, per_round):
    """Every two holders of a leader tag end with different outcomes; each round has 1 to
    ``per_round`` distinct tests; and the class counts choose the very tests the greedy
    chooses on the listed pairs."""
    tags, owners, seqs = m
    rounds = plan_tests(tags, owners, seqs, per_round)
    out = outcomes(rounds, owners, len(seqs))
    for t in tags:
        rows = [tuple(out[j]) for j in owners[t].tolist()]
        assert len(set(rows)) == len(rows)
    assert all(1 <= len(r) <= per_round and len(set(r)) == len(r) for r in rounds)
    assert rounds == reference_tests(tags, owners, seqs, per_round)


def reference_schedule(queues, width, size):
    """schedule() with every queue sorted again for every layer."""
    layers = []
    while any(queues):
        layer, room = [], width
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


@SETTINGS
@given(shape=st.lists(st.lists(st.integers(1, 5), max_size=4), max_size=8),
       width=st.sampled_from([2, 3, 4, 8]), sized=st.booleans())
def test_schedule_keeps_batches_in_order_and_longest_queues_first(shape, width, sized):
    """Every item once, layers within ``width``, a batch only after the one before it, and
    the layers the queues sorted for every layer give."""
    queues = [[[(k, b, i) for i in range(n)] for b, n in enumerate(q)] for k, q in enumerate(shape)]
    size = (lambda item: 1 + item[2] % 2) if sized else (lambda item: 1)
    layers = keyed_moves.schedule([[list(b) for b in q] for q in queues], width, size)
    at = {item: i for i, layer in enumerate(layers) for item in layer}
    assert sorted(at) == sorted(item for q in queues for b in q for item in b)
    assert all(sum(map(size, layer)) <= width for layer in layers)
    for q in queues:
        for before, after in zip(q, q[1:], strict=False):
            assert max(at[x] for x in before) < min(at[x] for x in after)
    assert layers == reference_schedule([[list(b) for b in q] for q in queues], width, size)


@SETTINGS
@given(pts=st.lists(st.tuples(st.integers(0, 30), st.integers(0, 30)), min_size=1,
                    max_size=25, unique=True), reach=st.sampled_from([0, 8, 1000]))
def test_each_hull_batch_state_is_the_unique_largest_of_those_left(pts, reach):
    """Each state of a batch is the unique largest g·σ over the states not taken before the
    batch, so every unit of the batch fires at its own state alone; every state is taken
    once."""
    values = np.array(pts, dtype=np.int64)
    owners = np.arange(100, 100 + len(pts))
    left = set(range(len(pts)))
    for batch in keyed_moves.hull_batches(values, owners, reach):
        assert batch
        for j, g in batch:
            i = int(j) - 100
            proj = {k: int(values[k] @ np.array(g)) for k in left}
            assert all(proj[i] > v for k, v in proj.items() if k != i)
        left -= {int(j) - 100 for j, _ in batch}
    assert not left
