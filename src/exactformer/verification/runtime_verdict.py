"""``prove_runtime``: is a model faithful in float32, TF32, bfloat16 or float16, in any order?

PROVED FAITHFUL IN <runtime> when the enclosures of :mod:`.runtime_proof` put every pair
(every constrained position of causal data) within the tolerance of its target, for every
evaluation of the exported dense computation in that runtime; for causal data with a
vocabulary, when every such position decodes to its target (:mod:`.runtime_decode`). Otherwise
a witness is sought: an actual evaluation in the runtime (NumPy float32 arithmetic, stores
rounded to the format, every dot product summed in a stated order, :func:`witness_pass`);
FAILED when one misses the tolerance (decodes a position wrong), UNDECIDED (with the bound or
margin that fell short) when none does.
docs/numerics.md#proofs-for-reduced-precision-runtimes, docs/verification.md.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from fractions import Fraction

import numpy as np

from ..data import CausalDataset
from ..distance import data_scale, hausdorff, relative, smallest, worst
from ..evaluate.enclosure import hausdorff_upper, up
from ..model import Transformer
from ..numbers import float_below, pad_columns
from ..tables import format_table
from .formats import DEFAULT_EXP_ULPS, Format, get_format, round_to, stored
from .runtime_decode import decoded_wrong, decoding_margins, target_indices
from .runtime_proof import enclose_runtime

DEFAULT_TOLERANCE = 1e-5  # relative to the data's coordinate scale
# A measured run's tolerance by dtype (error / coordinate scale): verify's in float64, the
# runtime proofs' in float32 and below (float32_verdict, lens_verdict, a Hub folder as saved).
RUN_TOLERANCE = {"float64": 1e-9, "float32": DEFAULT_TOLERANCE}
ORDERS = ("sequential", "reversed")  # the witness passes' summation orders
WITNESS_SEQUENCES = 64  # sequences a witness pass takes at once (it stops at a miss)
COVERED = {  # the layouts whose graph each proof covers (TransformerLens: float32 only)
    "float32": "dense FFs: torch ff=dense, rho-eta, TransformerLens; any summation order",
    "tf32": "dense FFs: torch ff=dense, rho-eta (not TransformerLens); any order",
}
COVERED_16 = "dense FFs: torch ff=dense, rho-eta (TransformerLens exports no 16-bit " \
    "format); any summation order"
CRITERIA = {"distance": "every output within the tolerance of its target",
            "decoding": "every position decodes to its target (the nearest vocabulary vector)"}


@dataclass
class RuntimeVerdict:
    """The outcome of :func:`prove_runtime` for one runtime (errors relative to the scale)."""

    runtime: str
    verdict: str  # "PROVED FAITHFUL IN <runtime>", "FAILED" or "UNDECIDED"
    tolerance: float
    bound: float  # largest proved error bound over the pairs (inf: some pair unbounded)
    proved: int  # pairs (causal: positions) proved within the tolerance
    checked: int
    exp_ulps: float
    seconds: float
    witness: str | None = None  # the evaluation that missed, when FAILED
    witness_error: float | None = None  # its error, or the witness passes' largest
    criterion: str = "distance"  # or "decoding": every position decodes to its target
    margin: float | None = None  # decoding: the least proved margin / scale (> 0: decodes)

    @property
    def ok(self) -> bool:
        return self.verdict.startswith("PROVED")

    def rows(self) -> list[tuple[str, object]]:
        rows = [("runtime", self.runtime), ("verdict", self.verdict),
                ("computation", COVERED.get(self.runtime, COVERED_16)),
                ("criterion", CRITERIA[self.criterion]),
                ("tolerance / scale", f"{self.tolerance:.3g}"),
                ("proved error bound / scale", f"{self.bound:.3g}"),
                *([("decoding margin / scale", f"{self.margin:.3g}")]
                  if self.margin is not None else []),
                ("positions proved to decode" if self.criterion == "decoding" else
                 "pairs proved", f"{self.proved} of {self.checked}"),
                ("exp error bound", f"{self.exp_ulps:g} float32 ulps"),
                ("proof time", f"{self.seconds:.2f} s")]
        if self.witness is not None:
            rows.append(("witness", self.witness))
        if self.witness_error is not None:
            rows.append(("witness error / scale", f"{self.witness_error:.3g}"))
        return rows

    def table(self) -> str:
        return format_table(self.rows())

    def reason(self) -> str:
        """Why the verdict is not a proof ("" when it is): the witness, else what fell short."""
        if self.ok:
            return ""
        if self.witness is not None:
            return f"{self.witness} (error {self.witness_error:.3g} × scale)"
        if self.criterion == "decoding":
            return (f"{self.checked - self.proved} of {self.checked} positions not proved to "
                    f"decode (least margin {self.margin:.3g} × scale)")
        return f"the bound {self.bound:.3g} × scale is above the tolerance {self.tolerance:g}"

    def to_dict(self) -> dict:
        return asdict(self) | {"ok": self.ok}


def prove_runtime(model: Transformer, dataset, runtime: str = "float32",
                  tolerance: float = DEFAULT_TOLERANCE, exp_ulps: float = DEFAULT_EXP_ULPS,
                  witness: bool = True) -> RuntimeVerdict:
    """Prove that every evaluation of ``model``'s exported dense computation in ``runtime``
    ("float32", "tf32", "bfloat16", "float16") reproduces ``dataset`` within ``tolerance`` ×
    the data's coordinate scale (Hausdorff distance per pair; per constrained position for
    causal data), exp within ``exp_ulps`` float32 ulps. ``witness``: when not proved, look
    for a failing evaluation (else the verdict is UNDECIDED)."""
    fmt = get_format(runtime)
    if not 0 < tolerance < math.inf:
        raise ValueError(f"tolerance must be positive and finite, got {tolerance!r}")
    if model.causal != isinstance(dataset, CausalDataset):
        raise ValueError("a causal model is judged on causal data and a set model on set "
                         "data (load the data with causal=True for a causal model)")
    t0 = time.perf_counter()
    data = dataset.padded(model.d)
    xs, ys = data.floats()
    scale = _scale(data)
    boxes = enclose_runtime(model, xs, fmt, exp_ulps)
    bounds = _bounds(boxes, ys, getattr(data, "known", None))
    limit = Fraction(tolerance) * scale
    held = np.array(bounds, dtype=float) <= float_below(limit)  # (nan and inf: not held)
    bound = relative(worst(bounds), scale) if bounds else 0.0
    verdict = RuntimeVerdict(runtime, f"PROVED FAITHFUL IN {runtime}", tolerance, bound,
                             int(held.sum()), len(bounds), exp_ulps, 0.0)
    if getattr(data, "vocabulary", None) is not None:
        margins = decoding_margins(data.vocabulary, _at_known([m for m, _ in boxes], data),
                                   _at_known([r for _, r in boxes], data), _targets(data))
        held = margins > 0
        verdict.criterion, verdict.proved = "decoding", int(held.sum())
        verdict.margin = relative(smallest(margins), scale) if len(margins) else np.inf
    if verdict.proved < len(bounds):
        verdict.verdict = "UNDECIDED"
        if witness:
            _seek_witness(verdict, model, data, fmt, _open_sequences(held, data))
    verdict.seconds = time.perf_counter() - t0
    return verdict


def _open_sequences(held: np.ndarray, data) -> list[int]:
    """The sequences holding a pair (causal: a constrained position) not proved: the only
    ones a witness can come from, since each sequence is evaluated on its own."""
    if not isinstance(data, CausalDataset):
        return [int(j) for j in np.flatnonzero(~held)]
    return sorted({int(j) for j in _owners(data)[~held]})


def _owners(data: CausalDataset) -> np.ndarray:
    """The sequence of each constrained position, in data order."""
    return np.repeat(np.arange(len(data.known)), [int(np.sum(k)) for k in data.known])


def _at_known(arrays, data: CausalDataset) -> np.ndarray:
    """The rows of ``arrays`` (one n_j × D per sequence) at the constrained positions,
    stacked in data order."""
    return np.concatenate([a[k] for a, k in zip(arrays, data.known, strict=True)])


def _targets(data: CausalDataset) -> np.ndarray:
    """The vocabulary index of each constrained position's target (−1: none)."""
    return target_indices(data.vocabulary, _at_known(data.floats()[1], data))


def _scale(data) -> Fraction:
    """The data's scale, exactly (causal data: over the inputs and the constrained targets)."""
    exact = any(a.dtype == object for a in (*data.inputs, *data.targets))
    xs, ys = data.fractions() if exact else data.floats()
    if isinstance(data, CausalDataset):
        ys = [y[k] for y, k in zip(ys, data.known, strict=True)]
    return data_scale(xs, ys)


def _bounds(boxes, ys, known) -> list[float]:
    """Per pair (set data) or per constrained position (causal), an upper bound on the
    distance of every enclosed output from the target (float64 targets carry half an ulp)."""
    out = []
    for (m, r), y in zip(boxes, ys, strict=True):
        y_rad = np.abs(y) * 2.0 ** -53
        if known is None:
            h = hausdorff_upper(m[None], r[None], y[None], y_rad[None])[0]
            out.append(float(h) if np.isfinite(h) else np.inf)
    if known is not None:
        for (m, r), y, k in zip(boxes, ys, known, strict=True):
            rows = np.flatnonzero(k)
            with np.errstate(over="ignore", invalid="ignore"):
                d = np.sqrt(((m[rows] - y[rows]) ** 2).sum(axis=1))
                rr = np.sqrt(((r[rows] + np.abs(y[rows]) * 2.0 ** -53) ** 2).sum(axis=1))
                b = up((d + rr) * (1 + 2.0 ** -40) + 2.0 ** -500, 8)
            out.extend(float(v) if np.isfinite(v) else np.inf for v in b)
    return out


def _seek_witness(verdict: RuntimeVerdict, model, data, fmt: Format, seqs: list[int]) -> None:
    """Run the witness passes on the sequences ``seqs``, :data:`WITNESS_SEQUENCES` at a time;
    the first batch that misses the tolerance (decodes a position wrong, by the decoding
    criterion) makes the verdict FAILED, so a model that fails everywhere is refuted after
    one batch rather than one pass over every sequence."""
    largest = 0.0
    judge = _Judge(data, verdict)
    for order in ORDERS:
        how = f"NumPy {fmt.name} pass (float32 accumulation, {order} summation, no FMA)"
        for a in range(0, len(seqs), WITNESS_SEQUENCES):
            batch = seqs[a:a + WITNESS_SEQUENCES]
            outs = dict(zip(batch, witness_pass(model, [judge.xs[j] for j in batch], fmt,
                                                order), strict=True))
            miss, err = judge(outs)
            if miss:
                verdict.verdict, verdict.witness, verdict.witness_error = "FAILED", \
                    f"{how} {miss} (of sequences {batch[0]}..{batch[-1]})", err
                return
            largest = max(largest, err)
    verdict.witness_error = largest


class _Judge:
    """What the witness passes' outputs are judged against, read from the data once: its
    inputs and targets, the scale, and (decoding) each constrained position's target."""

    def __init__(self, data, verdict: RuntimeVerdict):
        self.data, self.tolerance, self.decoding = data, verdict.tolerance, \
            verdict.criterion == "decoding"
        self.xs, self.ys = data.floats()
        causal = isinstance(data, CausalDataset)
        self.scale = data.coordinate_scale() if causal else _scale(data)
        self.targets = _targets(data) if self.decoding else None
        self.owners = _owners(data) if self.decoding else None

    def __call__(self, outs: dict) -> tuple[str | None, float]:
        """How the outputs ``outs`` (by sequence index) miss (None: they do not), and their
        error over the data's scale."""
        err = self.error(outs)
        if not self.decoding:
            return (None if err <= self.tolerance else "misses the tolerance"), err
        rows = np.concatenate([outs[j][self.data.known[j]] for j in sorted(outs)])
        pick = np.isin(self.owners, list(outs))
        wrong = decoded_wrong(self.data.vocabulary, rows, self.targets[pick])
        return (f"decodes {wrong} of {len(rows)} positions wrong" if wrong else None), err

    def error(self, outs: dict) -> float:
        """The largest distance of ``outs`` from their targets (causal: at the constrained
        positions), over the scale."""
        if isinstance(self.data, CausalDataset):
            errs = [float(np.linalg.norm(o[i] - self.ys[j][i])) for j, o in outs.items()
                    for i in np.flatnonzero(self.data.known[j])]
            return relative(worst([0.0, *errs]), self.scale)
        return relative(worst(hausdorff(o, self.ys[j]) for j, o in outs.items()), self.scale)


# ------------------------------------------------------------------------------ witness pass
class _Runtime:
    """NumPy float32 arithmetic with every result stored in ``fmt`` (values kept as
    float64 arrays of format values) and dot products summed in ``order``."""

    def __init__(self, fmt: Format, order: str):
        self.fmt, self.reverse = fmt, order == "reversed"

    def store(self, a) -> np.ndarray:
        return stored(np.asarray(a, dtype=np.float64), self.fmt)

    def op(self, f, *args) -> np.ndarray:
        with np.errstate(all="ignore"):
            return self.store(f(*(np.asarray(a, dtype=np.float64).astype(np.float32)
                                  for a in args)).astype(np.float64))

    def cut(self, a) -> np.ndarray:
        bits = self.fmt.matmul_bits
        return a if bits is None else round_to(a, bits, self.fmt.emin)

    def dot(self, A, B) -> np.ndarray:
        """Σ_j A[..., :, j] · B[..., j, :] (a matrix product), one float32 term at a time."""
        A32, B32 = (self.cut(np.asarray(t, dtype=np.float64)).astype(np.float32)
                    for t in (A, B))
        shape = np.broadcast_shapes(A32.shape[:-1] + (1,), B32.shape[:-2] + (1, B32.shape[-1]))
        acc = np.zeros(shape, dtype=np.float32)
        steps = range(A32.shape[-1])
        with np.errstate(all="ignore"):
            for j in reversed(steps) if self.reverse else steps:
                acc = acc + A32[..., :, j, None] * B32[..., j, None, :]
        return self.store(acc.astype(np.float64))


def witness_pass(model: Transformer, inputs: list[np.ndarray], fmt: Format,
                 order: str = "sequential") -> list[np.ndarray]:
    """One evaluation of the exported dense computation in ``fmt``: weights and inputs
    stored in the format, float32 products and sums, every dot product in ``order``."""
    rt = _Runtime(fmt, order)
    params = model.to_float() if model.exact else model
    xs = pad_columns([np.asarray(x, dtype=float) for x in inputs], model.d)
    outs: list = [None] * len(xs)
    for n in sorted({len(x) for x in xs}):
        js = [j for j, x in enumerate(xs) if len(x) == n]
        X = rt.store(np.stack([xs[j] for j in js]))
        if params.positions is not None:
            X = rt.op(np.add, X, rt.store(np.asarray(params.positions[:n], dtype=float)))
        allowed = np.tril(np.ones((n, n), dtype=bool)) if model.causal else None
        for blk in params.blocks:
            X = _witness_block(rt, X, blk, model, allowed)
        for j, y in zip(js, X, strict=True):
            outs[j] = y
    return outs


def _witness_block(rt: _Runtime, X, blk, model, allowed):
    w = rt.store
    if blk.ff is not None:
        ff = blk.ff
        Z = rt.op(np.add, rt.dot(X, w(ff.U).T), w(ff.b))
        A = np.maximum(Z, 0.0)
        X = rt.op(np.add, rt.op(np.multiply, w(float(ff.eta)), X), rt.dot(A, w(ff.W).T))
    if blk.sa is None or blk.sa.is_identity():
        return X
    out = rt.op(np.multiply, w(float(blk.sa.rho)), X)
    for h in blk.sa.heads:
        P = rt.dot(X, w(h.A.c)[:, None])
        Q = rt.dot(X, w(h.A.a)[:, None])
        S = rt.op(np.multiply, P, np.swapaxes(Q, 1, 2))
        if float(h.A.alpha) != 0:
            G = rt.dot(X, np.swapaxes(X, 1, 2))
            S = rt.op(np.add, S, rt.op(np.multiply, w(float(h.A.alpha)), G))
        if allowed is not None:
            S = np.where(allowed, S, -np.inf)
        Y = rt.dot(_weights(rt, S, model), X)
        T = rt.dot(Y, w(h.V.q)[:, None])
        out = rt.op(np.add, out, rt.op(np.multiply, w(float(h.V.beta)), Y))
        out = rt.op(np.add, out, rt.op(np.multiply, T, w(h.V.p)))
    return out


def _weights(rt: _Runtime, S, model):
    """The attention weights of the torch module: the argmax set averaged (hardmax), or
    exp(s − max) over its float32 sum (softmax at the model's τ)."""
    top = S.max(axis=2, keepdims=True)
    if model.attention == "hardmax":
        hit = (S == top).astype(np.float64)
        return rt.op(np.divide, hit, hit.sum(axis=2, keepdims=True))
    tau = 1.0 if model.tau is None else float(model.tau)
    if tau != 1:
        S = rt.op(np.divide, S, rt.store(tau))
        top = S.max(axis=2, keepdims=True)
    with np.errstate(all="ignore"):
        e = np.exp(S.astype(np.float32) - top.astype(np.float32)).astype(np.float64)
    Z = rt.dot(e, np.ones(S.shape[:-1] + (1,)))
    return rt.op(np.divide, e, Z)
