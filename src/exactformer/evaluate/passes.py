"""The evaluation interface: forward passes (set or causal), enclosures and predictions.

:func:`forward` runs a model in exact, float64 or mpmath arithmetic (:mod:`.arithmetic`), over
multisets of rows (:mod:`.state`), applying ridge windows only where rows are (:mod:`.windows`),
in a process pool when large (:mod:`.jobs`); causal models go to :mod:`.causal`.
:func:`enclose` is the float64 pass with rigorous radii (docs/numerics.md#enclosures).
"""

from __future__ import annotations

import math

import mpmath
import numpy as np

from ..model import Transformer
from .arithmetic import Arithmetic, PassStats, max_abs
from .causal import forward_causal, with_positions
from .jobs import Job, chunk_bounds, run_parallel
from .state import RowState


def forward(model: Transformer, inputs: list[np.ndarray], arithmetic: str = "float",
            dps: int = 50, snapshots: set[int] | None = None, stats: PassStats | None = None,
            tau=None, progress: bool = False, workers: int | None = None):
    """Run the model on every input sequence; return the n_j×d outputs (length preserving).

    ``snapshots``: block indices (0 = the input, i = after block i) whose positions are also
    returned, as a dict, in a second return value. ``tau`` overrides the model's temperature.
    ``progress`` shows a progress bar over the blocks (over the chunks when parallel).
    ``workers``: processes for exact and mp passes (default: the CPUs this process may use).
    Sequences never interact, so a large pass is split into that many chunks of sequences run
    in a process pool; outputs, snapshots and ``stats`` equal those of a serial pass. Float
    passes and small inputs stay serial (see docs/verification.md).
    """
    if model.causal:  # ordered outputs under the causal mask (docs/causal.md)
        if snapshots is not None:
            raise ValueError("snapshots are not available for causal models")
        return forward_causal(model, inputs, arithmetic, dps, stats, tau, progress)
    ar = Arithmetic(arithmetic, dps)
    stats = PassStats() if stats is None else stats
    xs = [np.asarray(x) for x in inputs]
    with mpmath.workdps(dps):
        if model.positions is not None:  # added in the pass's arithmetic (exactly when exact)
            xs = with_positions(ar.array(model.positions), [ar.array(x) for x in xs])
        scale = max(1.0, max(max_abs(x) for x in xs))
        job = Job.of(model, ar, tau)
        bounds = chunk_bounds(xs, model.n_blocks, ar, workers)
        if len(bounds) == 1:
            outs, snaps = job.run(xs, snapshots, stats, scale, progress)
        else:
            outs, snaps = run_parallel(job, xs, bounds, snapshots, stats, scale, progress)
    return (outs, snaps) if snapshots is not None else outs


def enclose(model: Transformer, inputs: list[np.ndarray], radii: list[np.ndarray] | None,
            stats: PassStats | None = None, progress: bool = False, give_up: float = math.inf):
    """The float64 pass of a float64 hardmax model with a radius on every coordinate: returns
    the float64 outputs and per token a bound on the distance of the *exact* evaluation of
    the stored numbers on the exact inputs from them, given the inputs' own radii
    (docs/numerics.md#enclosures); ``radii`` None: exact inputs (radius 0). Radii are inf
    where nothing is known. The outputs are a
    float64 evaluation in which gadget layers act as their affine pieces (a flat top adds its
    move exactly), so they can differ from :func:`forward`'s in the last bits. ``stats``
    records the pass's margins. A row whose radius exceeds ``give_up`` where a layer changes
    it gets radius inf (verify passes its tolerance limit: such a row could not be certified
    anyway); radii no layer touches are returned as they are."""
    if model.exact or model.attention != "hardmax" or model.causal or \
            model.positions is not None:
        raise ValueError("enclosures are made for float64 hardmax set-to-set models without "
                         "stored positions")
    stats = PassStats() if stats is None else stats
    xs = [np.asarray(x, dtype=float) for x in inputs]
    ar = Arithmetic("float")
    st = RowState(xs, ar, [] if radii is None else [np.asarray(r, dtype=float) for r in radii])
    st.give_up = give_up
    with np.errstate(all="ignore"):  # overflow shows as inf or nan, and radii become inf
        Job.of(model, ar, None).walk(st, None, stats, max(1.0, max(max_abs(x) for x in xs)),
                                      progress)
    return st.outputs(), [np.where(np.isfinite(r), r, np.inf) for r in st.radii()]


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
    """The set of distinct output tokens for one input sequence X (n×d); for a causal model
    the ordered outputs, row i the prediction after x_1..x_i."""
    if arithmetic is None:
        arithmetic = "exact" if model.exact and model.attention == "hardmax" else "float"
    (out,) = forward(model, [np.asarray(X)], arithmetic, dps)
    return out if model.causal else distinct_rows(out)
