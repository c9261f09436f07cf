"""Each phase of the construction on its own: a broken phase fails here, not only end to end.

* separation: afterwards no point is shared by two sequences, and R ≤ N − 1;
* leaders and collapse: afterwards each sequence is exactly its m_j leader points;
* interpolation: each hat moves its own leader onto its target and no other point;
* snaps (softmax): a snap maps its whole flat interval exactly onto its target and leaves the
  line outside its window alone.
"""

from __future__ import annotations

from fractions import Fraction

import mpmath
import numpy as np
from conftest import datasets, paper, token_set
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import exactformer as ef
from exactformer.construct.generic import Draws
from exactformer.construct.leaders import _Axis, _isolations, _pick, choose_leaders
from exactformer.construct.partition import Partition, refinement
from exactformer.construct.separation import (
    TokenTable,
    _distinct_rows,
    separate,
    separated_positions,
)
from exactformer.data import builtin

PHASE = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def ff_exact(ff, x):
    """FF(x) = η·x + W·relu(U·x + b) in Fractions, written out without the package."""
    h = [max(Fraction(0), sum((u * v for u, v in zip(row, x, strict=True)), Fraction(0)) + bb)
         for row, bb in zip(ff.U, ff.b, strict=True)]
    return tuple(ff.eta * x[k] + sum((ff.W[k, i] * h[i] for i in range(len(h))), Fraction(0))
                 for k in range(len(x)))


def snapshot(model, data, index, arithmetic="exact"):
    xs, _ = data.fractions()
    _, snaps = ef.forward(model, xs, arithmetic, snapshots={index})
    return snaps[index]


@PHASE
@given(datasets())
def test_separation_leaves_no_shared_point(data):
    xs, _ = data.fractions()
    table = TokenTable.build(xs)
    sep = separate(table, Draws(0, True))
    assert sep.R <= data.N - 1
    model = ef.Transformer(d=data.d, attention="hardmax", blocks=sep.blocks, exact=True)
    outs = ef.forward(model, xs, "exact") if sep.R else xs
    sets = [token_set(o) for o in outs]
    for j in range(len(sets)):
        assert len(sets[j]) == len(xs[j]), f"sequence {j}: two of its tokens merged"
        for k in range(j):
            assert not sets[j] & sets[k], f"sequences {k} and {j} still share a point"
    # the construction's own belief about the positions is what the layers do
    believed = separated_positions(xs, table, sep, True)
    assert [token_set(b) for b in believed] == sets


@settings(max_examples=50, deadline=None)
@given(st.lists(st.lists(st.sampled_from([0.0, -0.0, 1.5, -2.0, 1e-300, 3.0]), min_size=3,
                         max_size=3), min_size=1, max_size=30))
def test_distinct_rows_groups_equal_rows(rows):
    """Equal rows (−0.0 = 0.0) and only those share a group; each group's first index is the
    first row holding it."""
    a = np.array(rows) + 0.0
    first, group = _distinct_rows(a)
    keys = [tuple(r) for r in a.tolist()]
    for i in range(len(keys)):
        for k in range(len(keys)):
            assert (group[i] == group[k]) == (keys[i] == keys[k])
    assert sorted(first.tolist()) == sorted(keys.index(k) for k in set(keys))
    assert all(group[f] == g for g, f in enumerate(first))


def test_distinct_rows_over_several_blocks():
    """More rows than one hashing block: the grouping is the byte sort's."""
    rng = np.random.default_rng(0)
    rows = rng.standard_normal((50, 3))[rng.integers(0, 50, 70_000)]
    first, group = _distinct_rows(rows)
    _, first_ref, group_ref = np.unique(rows.view(np.dtype((np.void, rows.strides[0]))),
                                        return_index=True, return_inverse=True)
    assert sorted(first.tolist()) == sorted(first_ref.tolist())
    assert (first[group] == first_ref[group_ref.reshape(-1)]).all()


def test_token_table_survives_a_hash_collision():
    """Two different rows whose bit hashes collide are still two tokens (the sort fallback)."""
    m0, m1 = (np.arange(1, 3, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)) | np.uint64(1)
    a = np.array([1.25, -3.5]).view(np.uint64)
    for t in range(1, 10 ** 5):  # B = A + t·(m1, −m0) in bits: the same hash
        b = (a + np.array([m1, ~m0 + np.uint64(1)]) * np.uint64(t)).view(np.float64)
        if np.isfinite(b).all() and (np.abs(b) > 1e-300).all():
            break
    rows = np.array([[1.25, -3.5], b.tolist(), [1.25, -3.5]])
    bits = rows.view(np.uint64)
    assert (bits[0] * np.array([m0, m1])).sum(dtype=np.uint64) == \
        (bits[1] * np.array([m0, m1])).sum(dtype=np.uint64)
    table = TokenTable.build([rows[:2], rows[2:]])
    assert len(table.points) == 2
    assert table.token_of.tolist() == [0, 1, 0]


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_pick_takes_the_most_isolated_tokens_ties_to_the_earlier(data):
    """Per sequence: the forced extreme token (if any), the P-leader (largest u' of the
    others) and then the most isolated tokens, equal isolations going to the earlier position
    (spacings of 1 and 2 make many ties); the moves list the forced token first."""
    lens = data.draw(st.lists(st.integers(1, 5), min_size=1, max_size=6))
    m = [data.draw(st.integers(1, n)) for n in lens]
    n, start = sum(lens), np.cumsum([0] + lens)
    perm = data.draw(st.permutations(range(n)))
    u = np.cumsum(data.draw(st.lists(st.sampled_from([1.0, 2.0]), min_size=n, max_size=n)))
    u = u[list(perm)]
    movable = [j for j in range(len(m)) if m[j] >= 2]
    first = None
    if movable and data.draw(st.booleans()):
        j = data.draw(st.sampled_from(movable))
        first = (j, data.draw(st.integers(0, lens[j] - 1)), 1)
    by_u = np.argsort(u)
    iso = _isolations(u, by_u)
    chosen, moves = _pick(_Axis(None, None, u, start, first), by_u, iso, m)
    expected_moves = []
    for j in range(len(m)):
        pos = range(lens[j])
        forced = [first[1]] if first and first[0] == j else []
        rest = [i for i in pos if i not in forced]
        leader = max(rest, key=lambda i: u[start[j] + i])
        rest.remove(leader)
        rest.sort(key=lambda i: (-iso[start[j] + i], i))
        circle = forced + rest[:m[j] - 1 - len(forced)]
        assert chosen[j] == [leader] + circle, f"sequence {j}"
        expected_moves += [(j, i) for i in circle]
    if first:
        assert moves[0] == first[:2]
    assert sorted(moves) == sorted(expected_moves)


def recount(sets: list[frozenset], classes: np.ndarray, T: int):
    """Repeated weight, per-sequence repeated tokens and every token's split score, counted
    from scratch class by class (the greedy of docs/hardmax.md#choosing-the-test-token)."""
    weight, nrep, score = 0, [0] * len(sets), [0] * T
    for c in set(classes.tolist()):
        js = [j for j in range(len(sets)) if classes[j] == c]
        for t in range(T):
            holders = [j for j in js if t in sets[j]]
            if len(holders) >= 2:
                weight += len(holders)
                for j in holders:
                    nrep[j] += 1
        involved = [j for j in js if nrep[j]]
        for t in range(T):
            a = sum(t in sets[j] for j in involved)
            score[t] += a * (len(involved) - a)
    return weight, nrep, score


def same_partition(a, b) -> bool:
    return len({(x, y) for x, y in zip(a.tolist(), b.tolist(), strict=True)}) == \
        len(set(a.tolist())) == len(set(b.tolist()))


token_sets = st.integers(2, 7).flatmap(lambda pool: st.lists(
    st.frozensets(st.integers(0, pool - 1), min_size=1, max_size=5), min_size=2, max_size=10,
    unique=True))


@settings(max_examples=60, deadline=None)
@given(sets=token_sets, data=st.data())
def test_partition_bookkeeping_matches_a_recount(sets, data):
    """Every round's incremental counts equal a recount from scratch: the repeated weight, the
    involved sequences, the greedy's test, and (for refinements by several keys, as rounds
    with several tests make) the predicted weight of a split."""
    N, T = len(sets), max(t for s in sets for t in s) + 1
    seq = np.repeat(np.arange(N), [len(s) for s in sets])
    tok = np.array([t for s in sets for t in sorted(s)])
    part = Partition(seq, tok, T, np.zeros(N, dtype=np.int64))
    for _ in range(N):
        weight, nrep, score = recount(sets, part.classes(), T)
        assert part.weight == weight
        assert part.nrep.tolist() == nrep
        assert part.scores().tolist() == score
        fresh = Partition(seq, tok, T, part.label)
        assert (part.size[part.label] == fresh.size[fresh.label]).all()
        p = part.best_test()
        if not weight:
            assert p is None
            return
        assert score.index(max(score)) == p
        keys = [np.array([int(p in s) for s in sets])]
        keys += [np.array(data.draw(st.lists(st.integers(0, 2), min_size=N, max_size=N)))
                 for _ in range(data.draw(st.integers(0, 2)))]
        moved, group = refinement(part.label, keys)
        expected = np.unique(np.stack([part.label] + keys), axis=1, return_inverse=True)[1]
        predicted = part.weight_after(moved, group)
        part.split(moved, group)
        assert same_partition(part.label, expected.reshape(-1))
        assert part.weight == predicted
    assert part.best_test() is None, f"not separated after N = {N} rounds"


@PHASE
@given(datasets())
def test_collapse_leaves_exactly_the_leaders(data):
    xs, _ = data.fractions()
    table = TokenTable.build(xs)
    draws = Draws(0, True)
    sep = separate(table, draws)
    lead = choose_leaders(separated_positions(xs, table, sep, True), data.target_lengths, draws)
    model = ef.Transformer(d=data.d, attention="hardmax", blocks=sep.blocks + lead.blocks,
                           exact=True)
    outs = ef.forward(model, xs, "exact")
    every = set()
    for j, (o, pts, m) in enumerate(zip(outs, lead.points, data.target_lengths, strict=True)):
        assert token_set(o) == token_set(pts), f"sequence {j} is not its leaders"
        assert len(token_set(o)) == m
        assert not every & token_set(o), f"sequence {j} shares a leader"
        every |= token_set(o)


@PHASE
@given(datasets())
def test_each_interpolation_hat_moves_only_its_leader(data):
    model = paper(data, seed=0)
    span = model.record.phase("interpolation")
    points = {p for seq in snapshot(model, data, span.start) for p in token_set(seq)}
    _, ys = data.fractions()
    targets = [tuple(t) for y in ys for t in y.tolist()]
    assert span.end - span.start == len(targets) == data.total_m
    for k, blk in enumerate(model.blocks[span.start:span.end]):
        assert blk.sa is None
        moved = {p: ff_exact(blk.ff, p) for p in points}
        changed = [p for p, q in moved.items() if q != p]
        assert len(changed) <= 1, f"hat {k} moves {len(changed)} points"
        if changed:
            assert moved[changed[0]] == targets[k], f"hat {k} misses its target"
        points = set(moved.values())


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.tuples(st.integers(1, 4), st.integers(2, 4)).flatmap(lambda nd: datasets(*nd)),
       st.randoms(use_true_random=False))
def test_snap_maps_its_whole_interval_onto_its_target(data, rnd):
    model = paper(data, attention="softmax", seed=0)
    span = model.record.phase("snap")
    proj = model.blocks[span.start - 1].ff
    e = proj.W[:, 0]  # the projection writes onto the line of e
    windows = model.record.snap_windows
    _, ys = data.fractions()
    for blk, win in zip(model.blocks[span.start:span.end], windows, strict=True):
        c1, c2, c3, c4 = (Fraction(c) for c in win.window)
        y = tuple(ys[win.sequence][win.slot])
        for s in (c2, c3, (c2 + c3) / 2, c2 + (c3 - c2) * Fraction(rnd.randint(0, 999), 999)):
            assert ff_exact(blk.ff, tuple(e * s)) == y
        for s in (c1, c4, c1 - 1, c4 + Fraction(1, 3)):
            x = tuple(e * s)
            assert ff_exact(blk.ff, x) == x


def test_snaps_on_the_demo_are_flat_where_the_tokens_are():
    data = builtin.demo()
    model = paper(data, attention="softmax")
    span = model.record.phase("snap")
    line = snapshot(model, data, span.start, "mp")
    row = model.blocks[span.start].ff.U[0]  # c·f' with f'·e = 1 (c: the layer's balancing)
    row = row / (row @ model.blocks[span.start - 1].ff.W[:, 0])
    reader = np.array([mpmath.mpf(Fraction(v).numerator) / Fraction(v).denominator
                       for v in row], dtype=object)
    flats = [tuple(mpmath.mpf(Fraction(c).numerator) / Fraction(c).denominator
                   for c in w.window[1:3]) for w in model.record.snap_windows]
    for seq in line:  # every token lies (in 50 digits) inside exactly one flat piece
        for t in np.array(seq, dtype=object) @ reader:
            assert sum(a < t < b for a, b in flats) == 1
