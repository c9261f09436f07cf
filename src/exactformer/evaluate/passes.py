"""The evaluation interface: forward passes (set or causal), enclosures and predictions.

:func:`forward` runs a model in exact, float64 or mpmath arithmetic (:mod:`.arithmetic`), over
multisets of rows (:mod:`.state`), applying ridge windows only where rows are (:mod:`.windows`),
in a process pool when large (:mod:`.jobs`); causal models go to :mod:`.causal`.
:func:`enclose` is the float64 pass with rigorous radii (docs/numerics.md#enclosures).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import replace

import mpmath
import numpy as np
from threadpoolctl import threadpool_limits

from ..model import Transformer
from ..numbers import pad_columns, safe_floats
from .arithmetic import Arithmetic, PassStats
from .causal import with_positions
from .causal_radius import tracked
from .enclosure import float_radius, sum_error
from .jobs import Job, chunk_bounds, run_parallel


def forward(model: Transformer, inputs: list[np.ndarray], arithmetic: str = "float",
            dps: int = 50, snapshots: set[int] | None = None, stats: PassStats | None = None,
            tau=None, progress: bool = False, workers: int | None = None):
    """Run the model on every input sequence; return the n_j×D outputs (length preserving).

    Inputs of dimension d < D = ``model.d`` are read zero-padded, (x, 0, …, 0) ∈ R^D
    (docs/architecture.md#data-narrower-than-the-model); d > D is an error naming both.

    ``snapshots``: block indices (0 = the input, i = after block i) whose positions are also
    returned, as a dict, in a second return value. ``tau`` overrides the model's temperature.
    ``progress`` shows a progress bar over the blocks (over the chunks when parallel).
    ``workers``: processes for exact and mp passes (default: the CPUs this process may use).
    Sequences never interact, so a large pass is split into that many chunks of sequences run
    in a process pool; outputs, snapshots and ``stats`` equal those of a serial pass. Float
    passes and small inputs stay serial (see docs/verification.md). A causal model gives its
    ordered outputs under the causal mask (:func:`forward_causal`).
    """
    if model.causal and snapshots is not None:
        raise ValueError("snapshots are not available for causal models")
    return _run(model, inputs, Arithmetic(arithmetic, dps), snapshots, stats, tau, progress,
                workers, model.causal)


def forward_causal(model: Transformer, inputs: list[np.ndarray], arithmetic: str = "float",
                   dps: int = 50, stats: PassStats | None = None, tau=None,
                   progress: bool = False, workers: int | None = None) -> list[np.ndarray]:
    """Run the model under the causal mask (token i attends to l ≤ i) on every sequence;
    positions are added first. The outputs are ordered: row i is the prediction after
    x_1..x_i (docs/causal.md)."""
    return _run(model, inputs, Arithmetic(arithmetic, dps), None, stats, tau, progress,
                workers, True)


def _run(model, inputs, ar: Arithmetic, snapshots, stats, tau, progress, workers,
         causal: bool):
    stats = PassStats() if stats is None else stats
    with mpmath.workdps(ar.dps):
        xs = _with_positions(model, inputs, ar)
        job = Job.of(model, ar, tau, causal)
        bounds = chunk_bounds(xs, model.n_blocks, ar, workers)
        if len(bounds) == 1:
            outs, snaps = job.run(xs, snapshots, stats, progress)
        else:
            outs, snaps = run_parallel(job, xs, bounds, snapshots, stats, progress)
    return (outs, snaps) if snapshots is not None else outs


def _with_positions(model: Transformer, inputs, ar: Arithmetic) -> list[np.ndarray]:
    """The inputs zero-padded to the model's width, with the model's positions added in the
    pass's arithmetic (exactly when exact)."""
    xs = pad_columns(inputs, model.d)
    if model.positions is None:
        return xs
    return with_positions(ar.array(model.positions), [ar.array(x) for x in xs])


def enclose(model: Transformer, inputs: list[np.ndarray], radii: list[np.ndarray] | None,
            stats: PassStats | None = None, progress: bool = False, give_up: float = math.inf):
    """The float64 pass of a float64 model (hardmax or softmax, set or causal) with a radius on
    every coordinate: returns the float64 outputs and per token a bound on the distance of
    the *exact* evaluation of the stored numbers on the exact inputs from them, given the
    inputs' own radii (docs/numerics.md#enclosures; softmax averages:
    #softmax-averages-in-the-enclosures); ``radii`` None: exact inputs (radius 0). Inputs
    (and radii) narrower than the model are zero-padded, as by :func:`forward`. Radii are
    inf where nothing is known. The outputs are a float64 evaluation in which gadget layers act
    as their affine pieces (a flat top adds its move exactly), so they can differ from
    :func:`forward`'s in the last bits, or be finite where it overflows; they are its values
    exactly when every layer was a key lookup (``stats.floats_plain``). ``stats`` records the
    pass's margins. A row whose radius exceeds ``give_up`` where a layer changes it gets
    radius inf (verify passes its tolerance limit: such a row could not be certified anyway);
    radii no layer touches are returned as they are.

    Causal models (outputs in input order): rank-one hardmax heads are tracked with their
    causal hulls, softmax heads with their prefixes' boxes (:mod:`.causal_radius`); the blocks
    up to the last attention layer with another hardmax head run as an exact pass, whose
    outputs enter the tracking pass rounded to floats with their rounding as radius; without
    such a layer the positions are added in float64, their rounding bounded exactly. Their
    inputs must be exact (``radii`` None).
    """
    if model.exact or (model.positions is not None and not model.causal):
        raise ValueError("enclosures are made for float64 models (set models without stored "
                         "positions)")
    stats = PassStats() if stats is None else stats
    xs = pad_columns([np.asarray(x, dtype=float) for x in inputs], model.d)
    radii = None if radii is None else pad_columns(radii, model.d)
    job = Job.of(model, Arithmetic("float"), None)
    start = 0
    if model.causal:
        if radii is not None:
            raise ValueError("a causal enclosure takes exact inputs (radii None)")
        start, xs, radii = _causal_start(model, xs, stats)
    st = job.state(xs, [] if radii is None else [np.asarray(r, dtype=float) for r in radii])
    st.give_up = give_up
    with np.errstate(all="ignore"), _one_blas_thread(xs):  # overflow: inf/nan, radii inf
        job.walk(st, None, stats, progress, start)
    stats.floats_plain = start == 0 and _lookups_only(job)
    return st.outputs(), [np.where(np.isfinite(r), r, np.inf) for r in st.radii()]


def _lookups_only(job: Job) -> bool:
    """Whether a tracking walk computed the float values of the plain float pass: no
    attention, every FF in a stretch of key layers, and every row looked up, none applied
    densely. A key lookup computes the same floats with radii or without; the tracked form of
    other layers need not (a hat's active units are taken as their affine piece)."""
    covered: set = set()
    for first, (end, run) in job.key_runs.items():
        if run.dense_rows:
            return False
        covered.update(range(first, end))
    return all((b.sa is None or b.sa.is_identity()) and (b.ff is None or i in covered)
               for i, b in enumerate(job.blocks))


def _one_blas_thread(xs):
    """The enclosure pass's matrix products are thin (many rows by d and a few units): BLAS
    threads gain nothing there, and on a busy machine they spin against other work (one
    product 20× slower measured on the 2-core machine under load; docs/numerics.md#cost).
    A pass over few tokens (``xs``) runs as it is: its products are too small to matter,
    and the limit's first use scans the process's libraries, longer than the whole pass."""
    if sum(len(x) for x in xs) < SMALL_PASS:
        return contextlib.nullcontext()
    return threadpool_limits(1, user_api="blas")


SMALL_PASS = 2048  # tokens below which an enclosure leaves the BLAS threads as they are


def _causal_start(model: Transformer, xs: list[np.ndarray], stats: PassStats):
    """Where a causal enclosure starts tracking (after the last attention layer that it cannot
    track, :func:`.causal_radius.tracked`), and the rows there as floats with radii: from an
    exact pass over the blocks before, or the float sums of tokens and positions when there
    are none (``xs`` already at the model's width)."""
    untracked = [i for i, b in enumerate(model.blocks)
                 if b.mixes() and not tracked(b.sa, model.attention)]
    start = untracked[-1] + 1 if untracked else 0
    if start:
        head = replace(model, blocks=model.blocks[:start])
        exact = forward_causal(head, xs, "exact", stats=stats)
        floats = [safe_floats(x) for x in exact]
        return start, floats, [float_radius(x, f) for x, f in zip(exact, floats, strict=True)]
    if model.positions is None:
        return 0, xs, [np.zeros(x.shape) for x in xs]
    sums = _with_positions(model, xs, Arithmetic("float"))
    P = np.asarray(model.positions, dtype=float)
    return 0, sums, [sum_error(x, P[: len(x)], s) for x, s in zip(xs, sums, strict=True)]


def distinct_rows(a: np.ndarray) -> np.ndarray:
    """The distinct rows of ``a`` in first-seen order (exact comparison)."""
    seen, keep = set(), []
    for i, row in enumerate(a):
        k = tuple(row.tolist())
        if k not in seen:
            seen.add(k)
            keep.append(i)
    return a[keep]


def predict(model: Transformer, X, arithmetic: str | None = None, dps: int = 50) -> np.ndarray:
    """The set of distinct output tokens (in R^D) for one input sequence X (n×d, d ≤ D,
    zero-padded as by :func:`forward`); for a causal model the ordered outputs, row i the
    prediction after x_1..x_i. Numbers as :func:`run` returns them."""
    (out,) = run(model, [X], arithmetic, dps)
    return out


def run(model: Transformer, inputs, arithmetic: str | None = None, dps: int = 50,
        progress: bool = False) -> list[np.ndarray]:
    """The model's outputs for every sequence of ``inputs`` (a dataset, or a list of n_j×d
    arrays): for a set model the distinct output tokens of each (first seen first), for a
    causal model the output at every position (docs/running.md).

    The numbers a user expects (docs/running.md#which-numbers-come-back): a rational hardmax
    model runs exactly; on exact inputs (Fractions) its outputs are Fractions, on float inputs
    they are those exact outputs rounded to float64, so that an output equal to a float target
    is that float. Other models (float64 parameters, or softmax, which no finite arithmetic
    evaluates exactly) run in float64. An explicit ``arithmetic`` ("exact", "float", "mp")
    always wins, its outputs in its own numbers.

    A model wider than the data (a keyed model keeps coordinates of its own) gives outputs in
    the data's d coordinates when every other coordinate of every output is exactly 0, as on
    the data it was built for; otherwise the whole width, so that nothing is hidden."""
    xs = list(inputs.inputs) if hasattr(inputs, "inputs") else [np.asarray(x) for x in inputs]
    to_floats = arithmetic is None and not any(x.dtype == object for x in xs)
    if arithmetic is None:
        arithmetic = "exact" if model.exact and model.attention == "hardmax" else "float"
    outs = forward(model, xs, arithmetic, dps, progress=progress)
    if to_floats:
        outs = [safe_floats(o) if o.dtype == object else o for o in outs]
    d = min((x.shape[1] for x in xs), default=model.d)
    if all(o.size == 0 or (o[:, d:] == 0).all() for o in outs):
        outs = [o[:, :d] for o in outs]
    return outs if model.causal else [distinct_rows(o) for o in outs]
