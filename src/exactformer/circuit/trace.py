"""The pass that the circuit is read from: every hidden unit's activation and every head's
weights and output, layer by layer, on the TransformerLens layout's blocks (docs/circuit.md).

The pass computes each layer from its parts (η·x + W·relu(U·x + b); ρ·x + Σ_h V_h·(π^h x))
and checks every block's result against the repository's evaluator
(:func:`exactformer.evaluate.forward`: one pass with every block's snapshot for set models,
each block alone for causal ones, which have no snapshots): equal in exact arithmetic
(hardmax models, rational or float64 numbers, read exactly), within 10^(10−dps) of the
scale in mpmath (softmax models, which no finite arithmetic evaluates exactly). A mismatch
is an error, never a circuit. So an activation that this pass calls 0 is 0 in the model's
exact evaluation. Sequences never interact: any subset of the data can be traced alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import mpmath
import numpy as np

from ..data import CausalDataset, Dataset
from ..evaluate import Arithmetic, forward, relu, with_positions
from ..lens_plan import is_identity_sa, layer_blocks, part_turns
from ..model import FF, SA, Transformer
from ..numbers import pad_columns
from ..verification.decide import check_kind

ROLE_OF_PHASE = {"tagging": "tag", "interpolation": "move"}  # other phases keep their names


class TraceMismatch(RuntimeError):
    """The layer-by-layer pass disagrees with the evaluator (a bug, never a verdict)."""


@dataclass
class MLPTrace:
    """TL block ``block``'s MLP: one of our FF layers (``model_block``), or the turn of a
    non-residual SA. ``acts[j]`` is (n_j, units) — TL units 0.. of this block — and
    ``roles`` one per unit."""

    block: int
    model_block: int
    phase: str
    roles: list[str]
    acts: list[np.ndarray]
    writes: np.ndarray | None = None  # (D, own units): the FF's W, for reports


@dataclass
class AttnTrace:
    """TL block ``block``'s attention (our block ``model_block``): per sequence j the
    weights ``patterns[j]`` (H, n_j, n_j), query by key, and each head's output
    ``outputs[j]`` (H, n_j, D), V_h times its average."""

    block: int
    model_block: int
    phase: str
    patterns: list[np.ndarray]
    outputs: list[np.ndarray]


@dataclass
class Trace:
    """Every MLP and attention of the TL layout on the traced sequences, the states after
    each of our blocks (``states[b][j]``, b = 0 the input), and the arithmetic used; the
    numbers are the pass's own (gmpy2 ``mpq`` in exact arithmetic, ``mpf`` in mp)."""

    model: Transformer
    sequences: list[int]
    arithmetic: str
    mlps: list[MLPTrace] = field(default_factory=list)
    attns: list[AttnTrace] = field(default_factory=list)
    states: list[list[np.ndarray]] = field(default_factory=list)


def phase_names(model: Transformer) -> list[str]:
    """Each of our blocks' phase in the construction record ("block" where none says)."""
    names = ["block"] * model.n_blocks
    for span in (model.record.phases if model.record is not None else []):
        for b in range(span.start, min(span.end, model.n_blocks)):
            names[b] = span.name
    return names


def trace(model: Transformer, data: Dataset | CausalDataset, sequences=None,
          dps: int = 50) -> Trace:
    """Run ``model`` on ``data``'s sequences (all, or the indices ``sequences``) layer by
    layer, in exact arithmetic (hardmax) or mpmath at ``dps`` digits (softmax), each block's
    result checked against the evaluator's."""
    check_kind(model, data)  # causal models on causal data, set models on set data
    sequences = list(range(data.N)) if sequences is None else list(sequences)
    kind = "exact" if model.attention == "hardmax" else "mp"
    ar = Arithmetic(kind, dps)
    with mpmath.workdps(dps):
        xs = [ar.array(x) for x in pad_columns([data.inputs[j] for j in sequences], model.d)]
        if model.positions is not None:
            xs = with_positions(ar.array(model.positions), xs)
        out = Trace(model, sequences, kind, states=[list(xs)])
        reference = _reference(model, xs, ar)
        where, names = layer_blocks(model), phase_names(model)
        for b, blk in enumerate(model.blocks):
            ff_at, sa_at = where[b]
            ys = xs
            if blk.ff is not None:
                ys = _ff(out, ar, blk.ff, ys, ff_at, b, names[b])
            if not is_identity_sa(blk.sa):
                ys = _sa(out, ar, blk.sa, ys, sa_at, b, names[b])
            _check(out, ar, reference(b, blk, xs), ys, f"block {b}")
            xs = ys
            out.states.append(list(xs))
    return out


def _reference(model: Transformer, xs, ar):
    """(b, block, inputs) → the evaluator's outputs of block b: for set models from one pass
    with every block's snapshot, for causal ones (no snapshots) by running that block alone
    on the traced inputs."""
    if not model.causal:
        plain = replace(model, positions=None, record=None)
        _, snaps = forward(plain, xs, ar.kind, ar.dps, workers=1,
                           snapshots=set(range(1, model.n_blocks + 1)))
        return lambda b, blk, inputs: snaps[b + 1]
    return lambda b, blk, inputs: forward(replace(model, blocks=[blk], positions=None,
                                                  record=None), inputs, ar.kind, ar.dps,
                                          workers=1)


def _ff(out: Trace, ar, ff: FF, xs, at: int, b: int, phase: str):
    """The units of an FF (and its turn units) on every sequence; the FF's outputs."""
    f = ar.convert(ff)
    role = ROLE_OF_PHASE.get(phase, phase)
    acts, ys = [], []
    for X in xs:
        A = relu(X.dot(f.U.T) + f.b) if f.width else np.zeros((len(X), 0), dtype=object)
        ys.append(X * f.eta + A.dot(f.W.T))
        acts.append(_with_turns(A, X, part_turns(("ff", ff))))
    roles = [_unit_role(ff, k, role) for k in range(ff.width)]
    roles += ["turn"] * (acts[0].shape[1] - ff.width) if acts else []
    out.mlps.append(MLPTrace(at, b, phase, roles, acts, ff.W))
    return ys


def _with_turns(A, X, turning: bool):
    """A part's TL units: its own activations, then relu(x) and relu(−x) if it turns."""
    return np.concatenate([A, relu(X), relu(-X)], axis=1) if turning else A


def _unit_role(ff: FF, k: int, role: str) -> str:
    """``role``, or "reset" for a unit relu(s·(x_c − f))/s·(−1) (s ≠ 0, balanced by any
    power of two): it sets coordinate c to f on the tokens on its side, 0 or a floor
    (docs/keyed.md)."""
    u, w = ff.U[k], ff.W[:, k]
    nz = [c for c in range(len(u)) if u[c] != 0]
    if len(nz) == 1 and u[nz[0]] * w[nz[0]] == -1 and sum(v != 0 for v in w) == 1:
        return "reset"
    return role


def _sa(out: Trace, ar, sa: SA, xs, at: int, b: int, phase: str):
    """Each head's weights and output on every sequence, and the turn units of a
    non-residual SA (the TL MLP of the same block); the SA's outputs."""
    s = ar.convert(sa)
    tau = 1 if out.model.tau is None else ar.scalar(out.model.tau)
    pats, outs, ys = [], [], []
    for X in xs:
        P = np.stack([_pattern(X, h, out.model.attention, out.model.causal, tau, ar)
                      for h in s.heads])
        O = np.stack([_value(P[k].dot(X), h) for k, h in enumerate(s.heads)])
        pats.append(P)
        outs.append(O)
        ys.append(X * s.rho + O.sum(axis=0))
    out.attns.append(AttnTrace(at, b, phase, pats, outs))
    if sa.rho != 1:
        acts = [_with_turns(np.zeros((len(X), 0), dtype=object), X, True) for X in xs]
        out.mlps.append(MLPTrace(at, b, phase, ["turn"] * (2 * out.model.d), acts))
    return ys


def _pattern(X, head, attention: str, causal: bool, tau, ar) -> np.ndarray:
    """(n, n) weights of one head: hardmax averages the argmax set (tokens counted),
    softmax normalises exp(s/τ); a causal query sees keys l ≤ i."""
    A = head.A
    S = X.dot(X.T) * A.alpha + np.outer(X.dot(A.c), X.dot(A.a))
    n = len(X)
    P = np.zeros((n, n), dtype=object)
    for i in range(n):
        keys = range(i + 1) if causal else range(n)
        row = [S[i, k] for k in keys]
        best = max(row)
        if attention == "hardmax":
            top = [k for k, v in zip(keys, row, strict=True) if v == best]
            for k in top:
                P[i, k] = ar.scalar(1) / len(top)
        else:
            e = [mpmath.exp((v - best) / tau) for v in row]
            total = sum(e)
            for k, v in zip(keys, e, strict=True):
                P[i, k] = v / total
    return ar.array(P) if attention == "hardmax" else P


def _value(avg: np.ndarray, head) -> np.ndarray:
    """V·y = β·y + p·(q·y) for every row y of ``avg``."""
    V = head.V
    return avg * V.beta + np.outer(avg.dot(V.q), V.p)


def _check(out: Trace, ar, theirs, ys, what: str) -> None:
    """The evaluator's output of a block must be the one computed from its parts: equal in
    exact arithmetic (gmpy2's mpq compares exactly with its Fractions), within 10^(10−dps)
    of the scale in mpmath."""
    for j, (mine, ref) in zip(out.sequences, zip(ys, theirs, strict=True), strict=True):
        if ar.kind == "exact":
            ok = bool((mine == ref).all())
        else:
            scale = max([abs(v) for v in ref.ravel()] + [mpmath.mpf(1)])
            ok = max((abs(a - r) for a, r in zip(mine.ravel(), ref.ravel(), strict=True)),
                     default=0) <= scale * mpmath.mpf(10) ** (10 - ar.dps)
        if not ok:
            raise TraceMismatch(f"{what}, sequence {j}: the traced layer differs from the "
                                "evaluator's")
