"""The residual-MLP baseline: exact interpolation on the flattened input (docs/baselines.md).

A ResNet sees one sequence as one vector: the n_j tokens in their given order, flattened and
zero-padded to D = n_max·d coordinates. Its blocks are z ↦ z + W·relu(U·z + b) with width ≤ 4.
The construction moves every flattened input onto its flattened target, zero-padded to D (so the
output's first m_j·d coordinates are the target tokens in their given order, the rest are 0):

* a generic direction f ∈ Z^D makes f·z pairwise distinct over every flattened input and every
  padded target (checked exactly with ``==``, redrawn on a coincidence);
* one block per input: a flat-top hat (4 ReLUs, ``construct.gadgets.hat_units``) on t = f·z,
  centred at the input's value, as wide as half the gap to every other point present at that
  moment, adds target − input. Hats run in an order where no input lands on an input that has
  not moved yet; when every remaining input waits on another, the wait-for chain runs into a
  cycle (such as two pairs whose targets are each other's inputs), and one input *on that
  cycle* first moves to a fresh point above all values.

Count. Every block has width 4 and reads all D coordinates, so

    L = K + c,    P = L·4·(2D + 1),    D = n_max·d,

with K the number of distinct flattened inputs that differ from their padded target (K = N for
typical data) and c the number of cycles broken (0 unless targets are other inputs). With N
pairs of length n that is P ≈ 8·N·n·d: it grows with the sequence length, unlike the
transformer's O(d·Σm_j).

Two different inputs have the same flattened vector only when one is the other followed by zero
tokens; a ResNet on this encoding cannot tell them apart, so that is an error unless their
padded targets agree too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np

from ..construct.gadgets import ff_from_units, hat_units
from ..construct.generic import (
    ConstructionError,
    Draws,
    best_draw,
    relative_gap,
    separated,
)
from ..data import Dataset
from ..numbers import to_fraction_array

WIDTH = 4


def resnet_param_count(blocks: int, D: int, width: int = WIDTH) -> int:
    """Parameters of ``blocks`` residual blocks of the given width on R^D: U, b and W."""
    return blocks * width * (2 * D + 1)


@dataclass
class ResBlock:
    """z ↦ z + W·relu(U·z + b), U ∈ R^{w×D}, b ∈ R^w, W ∈ R^{D×w}."""

    U: np.ndarray
    b: np.ndarray
    W: np.ndarray

    def n_params(self) -> int:
        return self.U.size + self.b.size + self.W.size


@dataclass
class ResNet:
    """A residual MLP on flattened sequences of ``n_max`` tokens in R^d (D = n_max·d)."""

    d: int
    n_max: int
    blocks: list[ResBlock]
    meta: dict = field(default_factory=dict)

    @property
    def D(self) -> int:
        return self.n_max * self.d

    @property
    def n_blocks(self) -> int:
        return len(self.blocks)

    def max_width(self) -> int:
        return max((blk.U.shape[0] for blk in self.blocks), default=0)

    def n_params(self) -> int:
        return sum(blk.n_params() for blk in self.blocks)

    def forward(self, Z: np.ndarray, arithmetic: str = "exact") -> np.ndarray:
        """Run the rows of Z (k×D) through every block: Fractions ("exact") or float64."""
        if arithmetic not in ("exact", "float"):
            raise ValueError(f"arithmetic must be 'exact' or 'float', got {arithmetic!r}")
        conv = to_fraction_array if arithmetic == "exact" else (
            lambda a: np.asarray(a, dtype=float))
        Z = conv(Z)
        for blk in self.blocks:
            H = Z @ conv(blk.U).T + conv(blk.b)
            Z = Z + np.where((H > 0).astype(bool), H, 0 * H) @ conv(blk.W).T
        return Z


def flatten(dataset: Dataset, n_max: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Inputs and targets as N×(n_max·d) Fraction arrays: tokens in order, zero-padded."""
    n_max = n_max or max(dataset.input_lengths)
    xs, ys = dataset.fractions()
    D = n_max * dataset.d

    def pad(seqs):
        out = np.empty((len(seqs), D), dtype=object)
        out.fill(Fraction(0))
        for j, s in enumerate(seqs):
            out[j, : s.size] = s.reshape(-1)
        return out

    return pad(xs), pad(ys)


def _key(v: np.ndarray) -> tuple:
    return tuple(v.tolist())


def _distinct_points(X: np.ndarray, Y: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """(input, target) per distinct flattened input; an input with two targets is an error."""
    seen: dict[tuple, int] = {}
    points = []
    for j in range(X.shape[0]):
        k = _key(X[j])
        if k in seen:
            i = seen[k]
            if _key(points[i][1]) != _key(Y[j]):
                raise ValueError(
                    f"pairs {i} and {j}: the zero-padded flattened inputs are equal (one input is "
                    "the other followed by zero tokens) but the targets differ; a ResNet on "
                    "this encoding cannot tell them apart")
            continue
        seen[k] = len(points)
        points.append((X[j], Y[j]))
    return points


def build_resnet(dataset: Dataset, seed: int = 0) -> ResNet:
    """Construct a residual MLP (width 4, rational parameters) that maps every flattened
    input exactly onto its zero-padded flattened target."""
    X, Y = flatten(dataset)
    D = X.shape[1]
    points = _distinct_points(X, Y)
    draws = Draws(seed, exact=True)
    every = {_key(v): v for pair in points for v in pair}
    fixed = np.array(list(every.values()), dtype=object)

    def score(f):
        vals = list(fixed @ f)
        return relative_gap(vals) if separated(vals, True) else None

    f = best_draw(lambda: draws.vector(D), score, what="ResNet direction")
    blocks, cycles = _hat_blocks(points, f, max(fixed @ f))
    meta = {"seed": seed, "N": dataset.N, "distinct_inputs": len(points),
            "moved": len(blocks) - cycles, "cycles": cycles}
    return ResNet(d=dataset.d, n_max=D // dataset.d, blocks=blocks, meta=meta)


def _hat_blocks(points, f: np.ndarray, top) -> tuple[list[ResBlock], int]:
    """One hat block per move, and the number of cycles broken.

    Each input moves once onto its target, and an input on a cycle of the wait-for graph first
    steps aside once to a fresh point above ``top`` (f·z of every point present), so at most
    K + K/2 moves finish K inputs; more would mean a bug, reported instead of looping on.
    """
    pos = [x for x, _ in points]
    dest = [y for _, y in points]
    done = [_key(x) == _key(y) for x, y in points]
    blocks, cycles = [], 0
    limit = 2 * len(points)
    for _ in range(limit + 1):
        if all(done):
            return blocks, cycles
        i, ready = _next_move(pos, dest, done)
        if ready:
            goal = dest[i]
        else:
            top += 1
            goal = pos[i] + f * (top - pos[i] @ f) / (f @ f)
            cycles += 1
        blocks.append(_hat_block(pos, i, goal, f))
        pos[i], done[i] = goal, ready
    raise ConstructionError(
        f"ResNet construction: inputs {[i for i, ok in enumerate(done) if not ok]} are still "
        f"not on their targets after {limit} blocks (at most 3 per 2 inputs are needed)")


def _next_move(pos, dest, done) -> tuple[int, bool]:
    """(i, True) for an unfinished input whose target no unfinished input occupies, or, when
    every unfinished input waits on another, (i, False) for an input on a cycle of that
    wait-for relation, which must step aside first.

    Each unfinished input waits on at most one other (positions are distinct), so the relation
    is a function; a walk of len(pos) steps along it from any input ends on a cycle, whereas the
    first unfinished input may only lead into one (and stepping it aside would free nothing).
    """
    at = {_key(pos[k]): k for k in range(len(pos)) if not done[k]}
    waits = {i: at[_key(dest[i])] for i in range(len(pos))
             if not done[i] and _key(dest[i]) in at}
    ready = [i for i in range(len(pos)) if not done[i] and i not in waits]
    if ready:
        return ready[0], True
    i = done.index(False)
    for _ in range(len(pos)):
        i = waits[i]
    return i, False


def _hat_block(pos, i: int, goal: np.ndarray, f: np.ndarray) -> ResBlock:
    """The block that moves pos[i] to ``goal`` and no other current position: a flat-top hat
    on f·z as wide as half the gap to the nearest other position (docs/gadgets.md)."""
    c = pos[i] @ f
    others = [abs(p @ f - c) for k, p in enumerate(pos) if k != i]
    delta = min([Fraction(1)] + others) / 2
    units = hat_units(f, Fraction(0), c, delta, goal - pos[i])
    ff = ff_from_units(units, Fraction(1), len(f), exact=True)
    return ResBlock(ff.U, ff.b, ff.W)


@dataclass
class ResNetReport:
    """Exact equality per pair (Fractions, ``==``) and the float64 error of the same network."""

    exact_equal: list[bool]
    max_error_float64: float
    blocks: int
    params: int
    max_width: int

    @property
    def ok(self) -> bool:
        return all(self.exact_equal)


def verify_resnet(net: ResNet, dataset: Dataset) -> ResNetReport:
    """Run every flattened input through ``net`` in rational and in float64 arithmetic and
    compare with the zero-padded flattened target: exactly, and by max absolute error."""
    X, Y = flatten(dataset, net.n_max)
    out = net.forward(X, "exact")
    equal = [_key(o) == _key(y) for o, y in zip(out, Y, strict=True)]
    err = np.abs(net.forward(X, "float") - Y.astype(float)).max()
    return ResNetReport(equal, float(err), net.n_blocks, net.n_params(), net.max_width())
