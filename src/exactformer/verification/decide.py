"""The decision procedure of ``verify``: which evaluation decides each kind of model.

A verdict is a bound, never a measurement (docs/verification.md#what-verify-decides):

* hardmax, rational parameters: exact pass, output sets compared with ``==``;
* hardmax, float64 parameters: float64 enclosures, then the exact pass, compared exactly;
* softmax: a rigorous ball-arithmetic bound (``bound``), compared with the limit in rationals;
  PROVED EXACT when certify's judgement of the same pass closes; float64 models (set, or
  causal at their own τ) first by the float64 enclosures (OK where they put every pair, or
  every constrained position, within the limit);
* float64 models, set or causal: any inf or nan output of their own float64 pass fails.

Causal models are checked position by position (:func:`verify_causal`).
"""

from __future__ import annotations

import math
from dataclasses import replace
from fractions import Fraction

import mpmath
import numpy as np

from ..data import CausalDataset, Dataset
from ..distance import (
    as_set,
    clearance,
    data_scale,
    hausdorff_checked,
    hausdorff_sq,
    hausdorff_stack,
    pair_distances,
    per_pair,
    relative,
    worst,
)
from ..evaluate import (
    Arithmetic,
    PassStats,
    dense_forward,
    distinct_rows,
    enclose,
    enclosure,
    forward,
    forward_causal,
)
from ..evaluate.jobs import one_job_per_model
from ..model import Transformer, first_mixing
from ..numbers import float_below, safe_float, safe_floats, to_fraction_array
from ..record import CausalConstruction
from .bound import bound_causal, bound_set
from .causal_enclosure import causal_bounds, softmax_by_enclosures
from .certify import FLOAT64_NOTE
from .data_check import data_check, kind_mismatch
from .float_twin import float_twin, floats_exactly, proved_equal
from .margins import snap_margins, snap_start
from .report import CausalReport, Report, fmt
from .shape import causal_sizes, hats_of, model_fields


def verify(model: Transformer, dataset: Dataset, tolerance: float = 1e-9,
           progress: bool = False, digits: int = 50, tau=None,
           workers: int | None = None) -> Report:
    """Check every pair (see docs/verification.md).

    * hardmax, rational parameters: proved in exact arithmetic (set equality with ``==``);
    * hardmax, float64 parameters: judged by the exact value of the stored floats against
      ``tolerance`` × the data's coordinate scale — settled by float64 enclosures where their
      bound is within it, else by an exact pass compared exactly. A second, independent
      float64 implementation (a plain dense NumPy pass) is reported beside it;
    * softmax: OK when a ball-arithmetic bound (no weight dropped, precision doubled up to
      16 × ``digits`` decimal digits) puts every pair within 10^-(digits−10) × scale (rational
      parameters) or ``tolerance`` × scale (float64; a set model without a snap line is first
      tried by the float64 enclosures, which settle it where they put every pair within);
      PROVED EXACT when the same pass shows every output to be exactly a target; UNDECIDED
      (not ok) when the bound stays too wide; the error measured at ``digits`` digits and the
      snap margins are reported beside it (no measurement where there is no snap line and
      the bound puts every pair within);
    * float64 models whose float64 outputs are inf or nan fail.

    ``tau`` evaluates a softmax model at another temperature than the one it was built for.
    ``workers``: processes for the exact and mp passes (see :func:`forward`).
    A causal model (or a :class:`CausalDataset`) is checked position by position instead:
    :func:`verify_causal`.
    """
    if model.causal or isinstance(dataset, CausalDataset):
        return verify_causal(model, dataset, tolerance, progress, digits, tau)
    used_tau = _used_tau(model, tau)
    checked = data_check(model, dataset)
    dataset = check_layers(model, dataset)
    xs_f, ys_f = dataset.floats() if not dataset.exact else \
        [[safe_floats(a) for a in part] for part in dataset.fractions()]
    scale = data_scale(*((xs_f, ys_f) if not dataset.exact else dataset.fractions()))
    stats = PassStats()
    snap = snap_start(model)
    outs_f, snaps_f, enclosed, hd = _first_pass(model, dataset, xs_f, stats, progress, tau,
                                                snap, safe_float(Fraction(tolerance) * scale))
    hd = per_pair(hausdorff_stack, outs_f, ys_f) if hd is None else hd
    extra: dict = {}
    tolerance = softmax_tolerance(model, digits, tolerance)
    limit = Fraction(tolerance) * scale
    if model.attention == "hardmax":
        exact_equal, within = _decide_hardmax(model, dataset, limit, extra, progress, workers,
                                              enclosed)
        undecided, arithmetic, proved, proof = _hardmax_verdict(model, exact_equal)
    else:
        exact_equal = None
        within, undecided, arithmetic, proved, proof = _softmax_verdict(
            model, dataset, limit, digits, tau, (snap, snaps_f), extra, progress, workers,
            scale, enclosed)
    nonfinite = _nonfinite(model, outs_f, xs_f, ys_f, tau, extra)
    if model.attention == "softmax":
        extra["temperature τ (τ* of the geometry)"] = (f"{float(used_tau):.6g} "
                                                      f"({_tau_star(model)})")
    scale_f = safe_float(scale)
    report = Report(
        **model_fields(model, dataset), arithmetic=arithmetic, exact_equal=exact_equal,
        hausdorff_float64=hd,
        max_hausdorff_float64=worst(hd), relative_error_float64=relative(worst(hd), scale_f),
        coordinate_scale=scale_f, hardmax_margin=stats.hardmax_margin,
        hardmax_ties=stats.hardmax_ties, hat_clearance=clearance(stats, scale_f),
        tolerance=tolerance, extra=extra, within_tolerance=within, nonfinite_pairs=nonfinite,
        undecided_pairs=undecided, proved=proved, proof=proof, data=checked)
    report.proved = report.proved and report.ok  # a proof never outranks a failed check
    return report


def _used_tau(model: Transformer, tau):
    """The temperature a softmax model is verified at (``tau``, else its own, else 1 as every
    pass reads a model built without one), refused unless positive and finite (as
    balls.Layers: the enclosures, which may decide alone, would take any τ)."""
    used = tau if tau is not None else (model.tau if model.tau is not None else 1)
    if model.attention == "softmax" and not 0 < used < math.inf:
        raise ValueError(f"the model's temperature tau must be positive and finite, got "
                         f"{used}")
    return used


def _hardmax_verdict(model: Transformer, exact_equal) -> tuple[list, str, bool, str]:
    """(undecided pairs, arithmetic, proved, proof) of a set hardmax model: rational models
    compare sets with ==, float64 ones the exact outputs with the tolerance, exactly."""
    arithmetic = "exact" if model.exact else "exact-floats"
    proved = exact_equal is not None and all(exact_equal)
    return [], arithmetic, proved, "exact rational arithmetic (==)" if proved else "not proved"


def _nonfinite(model: Transformer, outs_f, xs_f, ys_f, tau, extra: dict) -> list[int]:
    """A float64 model's pairs whose outputs are inf or nan in its own float64 pass or the
    independent one (:func:`_independent`, recorded in ``extra``): failures in the model's
    own arithmetic. None for rational models."""
    if model.exact:
        return []
    nonfinite = [j for j, o in enumerate(outs_f) if not np.isfinite(o).all()]
    return sorted(set(nonfinite) | set(_independent(model, xs_f, ys_f, tau, extra)))


def _blocks_design(rec: CausalConstruction, model: Transformer) -> int:
    """The blocks the construction's record accounts for: R_c + ⌈moves/k⌉ (+ 1 projection
    in softmax), ⌈moves/width⌉ for position keys (one unit per move, docs/causal.md), or
    the blocks of a keyed causal model's phases (tagging, separation, moves and resets)."""
    if rec.keyed is not None:
        return sum(p.end - p.start for p in rec.phases)
    if rec.position_code is not None:
        return -(-rec.moves // model.max_width())
    return rec.R + -(-rec.moves // hats_of(model)) + \
        (1 if model.attention == "softmax" and rec.moves else 0)


def check_layers(model: Transformer, dataset):
    """The data as the model reads them: zero-padded to its width D = ``model.d`` (a
    ValueError naming both when d > D; docs/verification.md#data-narrower-than-the-model),
    after checking that the model has no FF layer without units (the file formats refuse one;
    a model built in memory is checked here). Every check after this one compares outputs in
    R^D with the padded targets, so extra coordinates must come out exactly 0."""
    padded = dataset.padded(model.d)
    empty = next((i for i, b in enumerate(model.blocks) if b.ff is not None and b.ff.width == 0),
                 None)
    if empty is not None:
        raise ValueError(f"block {empty}: an FF layer needs at least one unit (use ff=None)")
    return padded


def softmax_tolerance(model: Transformer, digits: int, tolerance: float) -> float:
    """Rational softmax models are held to 10^-(digits−10): their snaps are flat on the data,
    so their error is 0 or a sign of a wrong model; every other model to ``tolerance``."""
    return 10.0 ** -(digits - 10) if model.attention == "softmax" and model.exact else tolerance


# ------------------------------------------------------------------------------ softmax
def _softmax_verdict(model, dataset, limit, digits, tau, snapped, extra, progress, workers,
                     scale, enclosed=None):
    """(within per pair, undecided pairs, arithmetic, proved, proof) of a softmax model,
    decided by the float64 enclosures when their bounds (``enclosed``, per pair) put every
    pair within the limit (OK, never a proof of exactness), else by the ball bound. One
    mpmath pass at ``digits`` digits is reported beside it (``hausdorff_mp``), and its
    positions on the snap line give the snap margins (``snapped``: the first snap block and
    the float pass's snapshots). A model without a snap line that the bound proves exact gets no
    mpmath pass: it would only measure the 0 the proof shows (keyed softmax models,
    docs/keyed.md#softmax), nor one whose every pair the bound puts within the limit: it would
    only measure what the bound already shows, at the cost of a pass in mpmath (30 s where the
    bound takes 4 on a keyed float64 model)."""
    below = float_below(limit)
    if enclosed is not None and all(b <= below for b in enclosed):  # (nan is never ≤)
        extra["hausdorff_bound"] = enclosed
        extra["mp pass"] = "not run: the float64 enclosures put every pair within the limit"
        extra["decided by"] = f"float64 enclosures: {len(enclosed)} pairs"
        return [True] * len(enclosed), [], "enclosures", False, \
            "not proved exact: float64 enclosures bound every pair within the limit" + \
            FLOAT64_NOTE
    b = bound_set(model, dataset, limit, digits, tau)
    if snapped[0] is not None or not all(s == "within" for s in b.status):
        _mp_measurement(model, dataset, digits, tau, snapped, extra, progress, workers, scale)
    else:
        extra["mp pass"] = ("not run: proved exact by the ball bound" if b.proof.proved else
                            "not run: the ball bound puts every pair within the limit")
    extra["hausdorff_bound"] = b.upper
    within = [s == "within" for s in b.status]
    undecided = [j for j, s in enumerate(b.status) if s == "undecided"]
    if undecided:
        extra["undecided"] = (f"the bound is too wide at {b.bits} bits for pairs "
                              f"{undecided[:10]}: measured error {fmt(worst(b.measured))}")
    if tau is not None and tau != model.tau:
        return within, undecided, f"ball{b.bits}", False, \
            "not proved (evaluated at another temperature)"
    if b.proof.proved:
        return within, undecided, f"ball{b.bits}", True, f"ball arithmetic at {b.bits} bits"
    note = "" if model.exact else FLOAT64_NOTE
    return within, undecided, f"ball{b.bits}", False, \
        f"not proved exact: {b.proof.reason}{_refuted(b.proof, b.status)}{note}"


def _refuted(proof, status: list[str]) -> str:
    """What an exact output off its target means for its pair: within the limit it is not
    exact but not wrong either; beyond it, the model is wrong on the pair."""
    if not proof.refuted or proof.refuted_pair is None:
        return ""
    if status[proof.refuted_pair] == "within":
        return " (the pair is within the limit: not exact, not wrong)"
    return " (beyond the limit: the model is wrong on this pair)"


def _mp_measurement(model, dataset, digits, tau, snapped, extra, progress, workers, scale
                    ) -> None:
    """The report's mpmath pass: ``hausdorff_mp`` per pair and the snap margins."""
    snap, snaps_f = snapped
    at = {snap} if snap is not None else set()
    xs, ys = dataset.fractions()
    outs, snaps = forward(model, xs, "mp", dps=digits, progress=progress, tau=tau,
                          snapshots=at, workers=workers)
    extra["hausdorff_mp"] = _mp_errors(outs, ys, digits)
    extra["mp digits"] = digits
    if snap is not None and snap in snaps_f:
        extra.update(snap_margins(model, snap, snaps[snap], snaps_f[snap],
                                  safe_float(scale) or 1.0))


def _mp_errors(outs, ys, digits: int) -> list[float]:
    """The Hausdorff errors of an mpmath pass, in its own precision: a measurement only."""
    ar = Arithmetic("mp", digits)
    with mpmath.workdps(digits):
        return [safe_float(mpmath.sqrt(hausdorff_sq(distinct_rows(o), ar.array(y))))
                for o, y in zip(outs, ys, strict=True)]


# ------------------------------------------------------------------------------ hardmax
def _decide_hardmax(model, dataset, limit: Fraction, extra: dict, progress: bool, workers,
                    bounds):
    """Exact evaluation (floats read as their exact binary values). Rational models: set
    equality. Float64 models: a pair is within tolerance when its enclosure (a float64 pass
    with error bounds, docs/numerics.md#enclosures) proves the exact Hausdorff distance
    ≤ limit; every other pair gets the exact pass, its squared distance compared with limit²
    exactly. ``extra["hausdorff_exact"]``: the exact distance, or the enclosure's bound.
    ``bounds``: per pair, the enclosure's upper bound (float64 models; None: none made)."""
    if model.exact:  # the inputs enter as they are: the exact pass reads floats exactly
        ys = [to_fraction_array(y) for y in dataset.targets]
        outs = forward(model, list(dataset.inputs), "exact", progress=progress, workers=workers)
        return [as_set(o) == as_set(y) for o, y in zip(outs, ys, strict=True)], None
    bounds = bounds if bounds is not None else [math.nan] * dataset.N
    cap = float_below(limit)
    within = [b <= cap for b in bounds]  # nan (unknown) is never ≤
    rest = [j for j, ok in enumerate(within) if not ok]
    dist = [float(b) for b in bounds]
    if rest:
        xs, ys = _subset_fractions(dataset, rest)
        outs = forward(model, xs, "exact", progress=progress, workers=workers)
        for j, o, y in zip(rest, outs, ys, strict=True):
            sq = hausdorff_sq(distinct_rows(o), y)
            within[j], dist[j] = sq <= limit * limit, float(np.sqrt(safe_float(sq)))
    extra["hausdorff_exact"] = dist
    extra["decided by"] = (f"float64 enclosures: {len(within) - len(rest)} pairs; exact pass: "
                           f"{len(rest)} pairs")
    return None, within


def _first_pass(model, dataset, xs_f, stats, progress: bool, tau, snap, limit: float):
    """The float64 pass every verify runs: (outputs, snapshots at the first snap block, the
    enclosure's per-pair bounds or None, the outputs' per-pair float64 Hausdorff distances
    or None). A float64 model without stored positions gets the enclosure pass
    (docs/numerics.md#enclosures) when hardmax, or when softmax at its own temperature and
    without a snap line (the mpmath measurement of a snap line reads the plain pass's
    snapshots); any other model the plain float pass."""
    own_tau = tau is None or tau == model.tau
    if not model.exact and model.positions is None and \
            (model.attention == "hardmax" or (snap is None and own_tau)):
        outs, bounds, hd = _float_and_enclosure(model, dataset, stats, progress, limit)
        return outs, {}, bounds, hd
    at = {snap} if snap is not None else set()
    return (*_float_pass(model, xs_f, stats, progress, tau, at), None, None)


def _float_pass(model, xs_f, stats, progress, tau, at):
    """The fast evaluator in float64: outputs and snapshots. A rational model with a parameter
    beyond float64's range has no float64 form: its outputs are reported as inf."""
    try:
        with np.errstate(all="ignore"):  # overflow shows as inf/nan in the outputs
            return forward(model, xs_f, "float", stats=stats, progress=progress, tau=tau,
                           snapshots=at)
    except OverflowError:
        return [np.full(x.shape, math.inf) for x in xs_f], {}


def _float_and_enclosure(model, dataset, stats, progress: bool, limit: float
                         ) -> tuple[list, list[float], list[float]]:
    """The enclosure pass's float64 outputs (recording ``stats``) and, per pair, its upper
    bound on the exact Hausdorff distance (nan when unknown) and the outputs' float64
    Hausdorff distance. Rows whose radius passes ``limit`` are given up on at once (their
    pairs go to the exact pass)."""
    if dataset.exact:
        xs, ys = dataset.fractions()
        xs_f, ys_f = [safe_floats(x) for x in xs], [safe_floats(y) for y in ys]
        xs_r = [enclosure.float_radius(x, f) for x, f in zip(xs, xs_f, strict=True)]
        ys_r = [enclosure.float_radius(y, f) for y, f in zip(ys, ys_f, strict=True)]
    else:
        xs_f, ys_f = dataset.floats()
        xs_r, ys_r = None, [np.zeros_like(y) for y in ys_f]  # float data are exact
    # a softmax layer's blur can widen a code beyond the limit for a while: the clip pairs
    # after it are flat there and take it back (docs/keyed.md#softmax)
    give_up = limit if model.attention == "hardmax" else math.inf
    outs, rads = enclose(model, xs_f, xs_r, stats, progress, give_up=give_up)
    both = per_pair(_distance_and_bound, outs, rads, ys_f, ys_r)
    return outs, [b for _, b in both], [h for h, _ in both]


def _distance_and_bound(O, o_rad, Y, y_rad) -> np.ndarray:
    """Per stacked pair (:func:`per_pair`), the float64 Hausdorff distance of O and Y and the
    enclosure's upper bound on the exact one, from one matrix of distances."""
    with np.errstate(invalid="ignore", over="ignore"):
        D = pair_distances(O, Y)
    return np.stack([hausdorff_checked(D), enclosure.hausdorff_upper(O, o_rad, Y, y_rad, D)],
                    axis=1)


def _subset_fractions(dataset, rows: list[int]) -> tuple[list, list]:
    """The pairs ``rows`` as object arrays of Fractions (exact for float data too)."""
    return ([to_fraction_array(dataset.inputs[j]) for j in rows],
            [to_fraction_array(dataset.targets[j]) for j in rows])


INDEPENDENT_BUDGET = 2e9  # dense float64 operations the independent check may spend


def _independent(model, xs, ys, tau, extra: dict) -> list[int]:
    """The float64 error of a second implementation, :func:`dense_forward` (every token,
    every layer dense, written apart from the pass that decides), recorded in ``extra``;
    returns the pairs whose outputs are not finite there. ``xs``, ``ys``: the data in
    float64 (docs/verification.md#what-verify-decides)."""
    cost = model.n_blocks * model.d * sum(len(x) ** 2 for x in xs)
    if cost > INDEPENDENT_BUDGET:
        extra["independent float64 check"] = f"skipped ({cost:.2g} dense operations)"
        return []
    outs = dense_forward(model, xs, tau=tau)
    hd = per_pair(hausdorff_stack, [np.asarray(o, dtype=float) for o in outs], ys)
    extra["float64 max Hausdorff error (NumPy dense)"] = fmt(worst(hd))
    return [j for j, o in enumerate(outs) if not np.isfinite(o).all()]


def _tau_star(model: Transformer) -> str:
    rec = model.record
    return "n/a" if rec is None or rec.tau_star is None else f"{rec.tau_star:.6g}"


# ------------------------------------------------------------------------------ causal
def check_kind(model: Transformer, dataset) -> None:
    """ValueError unless the model and the data are of one kind: a causal model judged on
    causal data (a target or null per position), a set-to-set model on set data."""
    if model.causal != isinstance(dataset, CausalDataset):
        raise ValueError(kind_mismatch(model.causal))


def verify_causal(model: Transformer, dataset: CausalDataset, tolerance: float = 1e-9,
                  progress: bool = False, digits: int = 50, tau=None) -> CausalReport:
    """Check a causal model position by position, in order (not as sets).

    Hardmax: an exact pass (floats read as their exact binary values); rational models compare
    every constrained output with ``==`` to its target, float64 ones compare the exact squared
    distance with (``tolerance`` × scale)², exactly. Softmax: float64 models at their own τ on
    float data first by their causal enclosure, OK where it bounds every constrained position
    within the limit (:func:`.causal_enclosure.softmax_by_enclosures`); otherwise the ball
    bound of every constrained position against 10^-(digits−10) × scale (rational parameters)
    or ``tolerance`` × scale, UNDECIDED where it stays too wide. Float64 models fail on any inf or
    nan output of their float64 pass. The scale is the data's own largest |coordinate|
    (docs/verification.md). A softmax model with no layer that attends (position keys) is
    decided as hardmax: the two compute one function.
    """
    check_kind(model, dataset)
    checked = data_check(model, dataset)
    dataset = check_layers(model, dataset)
    # with no layer that attends (position keys), softmax computes what hardmax does
    runs = model if first_mixing(model.blocks) < model.n_blocks else \
        replace(model, attention="hardmax")
    if model.attention == "softmax" and tau is not None and not tau > 0:  # (as balls.Layers)
        raise ValueError(f"the model's temperature tau must be positive, got {tau}")
    if dataset.exact:
        xs, ys = dataset.fractions()
        xs_f, ys_f = [[safe_floats(a) for a in part] for part in (xs, ys)]  # inf beyond float64
    else:  # float data: Fractions only where a pass needs them (10^6 positions cost minutes)
        xs = ys = None
        xs_f, ys_f = dataset.floats()
    exact_scale = data_scale(xs_f if xs is None else xs,
                             [y[k] for y, k in zip(ys_f if ys is None else ys, dataset.known,
                                                   strict=True)])
    enclosed, outs_f, stats = _causal_float_passes(runs, dataset, xs, xs_f, progress, tau)
    err_f = _position_errors(outs_f, ys_f, dataset.known)
    tolerance = softmax_tolerance(runs, digits, tolerance)
    limit = Fraction(tolerance) * exact_scale
    if runs.attention == "hardmax":
        found = _causal_hardmax(runs, dataset, enclosed, ys_f, limit, progress)
    else:
        found = softmax_by_enclosures(enclosed, dataset, ys_f, limit) or \
            _causal_softmax(runs, dataset, limit, digits, tau)
    nonfinite = [] if model.exact else \
        [j for j, o in enumerate(outs_f) if not np.isfinite(np.asarray(o, dtype=float)).all()]
    rec = model.record if isinstance(model.record, CausalConstruction) else None
    return CausalReport(
        attention=model.attention, N=dataset.N,
        tokens=dataset.total_n, constrained=dataset.constrained, blocks=model.n_blocks,
        blocks_design=None if rec is None else _blocks_design(rec, model),
        position_keys=rec is not None and rec.position_code is not None and rec.keyed is None,
        keyed=rec is not None and rec.keyed is not None,
        R=None if rec is None else rec.R, max_width=model.max_width(),
        params=model.n_params(), params_dense=model.n_params_dense(),
        position_params=0 if model.positions is None else int(np.size(model.positions)),
        **causal_sizes(model, dataset),
        errors=[worst([0.0, *e]) for e in found["position_errors"]],
        errors_float64=[worst([0.0, *e]) for e in err_f],
        coordinate_scale=safe_float(exact_scale), hardmax_margin=stats.hardmax_margin,
        hat_clearance=clearance(stats, exact_scale), tolerance=tolerance,
        nonfinite_sequences=nonfinite, data=checked,
        **found)


def _causal_float_passes(model, dataset, xs, xs_f, progress: bool, tau):
    """(the causal enclosure or None, :func:`_causal_enclosure`; the float64 pass's outputs;
    its statistics): the enclosure's values where they are the plain float64 pass's, else
    that pass run as well (inf where a rational parameter has no float64 form). The two
    prepare the model once (:func:`..evaluate.jobs.one_job_per_model`)."""
    with one_job_per_model():
        enclosed = _causal_enclosure(model, dataset, xs, xs_f, progress, tau)
        if enclosed is not None and enclosed[2].floats_plain:
            return enclosed, enclosed[0], enclosed[2]
        stats = PassStats()
        try:
            with np.errstate(all="ignore"):  # overflow shows as inf/nan in the outputs
                outs = forward_causal(model, xs_f, "float", stats=stats, tau=tau,
                                      progress=progress)
        except OverflowError:  # a rational parameter beyond float64: no float64 form
            outs = [np.full(x.shape, math.inf) for x in xs_f]
    return enclosed, outs, stats


def _causal_enclosure(model, dataset, xs, xs_f, progress: bool, tau):
    """For a hardmax model, float64 or rational with float64 parameters (:func:`float_twin`),
    or a float64 softmax model at its own temperature ``tau`` and without a snap line (as
    for set models: a hat model's enclosure loses nearly every row, measured 14 s for
    nothing on the 20-sentence benchmark at width 4), on inputs that are float64 values
    (``xs``: the exact inputs of exact data, else None), its causal enclosure
    (:func:`exactformer.evaluate.enclose`) as (outputs, radii, the pass's statistics); None
    for every other model. Where the statistics say its float values are the plain float64
    pass's (every layer a key lookup), it is verify's float64 pass too."""
    twin = float_twin(model) if model.attention == "hardmax" and model.exact else model
    softmax_off = model.attention == "softmax" and \
        ((tau is not None and tau != model.tau) or snap_start(model) is not None)
    if twin is None or twin.exact or softmax_off or \
            (xs is not None and not floats_exactly(xs, xs_f)):
        return None
    if dataset.exact and not model.exact:  # (the float64 path decides float data only)
        return None
    own = PassStats()
    mids, rads = enclose(twin, xs_f, None, stats=own, progress=progress)
    return mids, rads, own


def _causal_hardmax(model, dataset, enclosed, ys_f, limit: Fraction, progress: bool) -> dict:
    """The hardmax verdict fields. A model is first enclosed where it can be (``enclosed``,
    from :func:`_causal_enclosure`): a float64 model's sequence whose every constrained
    position has a rigorous error bound within the limit is decided by it, a rational
    model's whose every constrained output has radius 0 and equals its target
    (:func:`.float_twin.proved_equal`) is proved by it; the others go to the exact pass,
    which compares with ``==`` (rational parameters) or compares exact squared distances
    with limit² (float64 parameters)."""
    errs: list = [None] * dataset.N
    if enclosed is not None and model.exact:  # radius 0 and equal: proved (float_twin.py)
        for j, (m, r) in enumerate(zip(*enclosed[:2], strict=True)):
            if proved_equal(m, r, dataset.targets[j], dataset.known[j]):
                errs[j] = [0.0] * len(dataset.known[j])
    elif enclosed is not None:
        below = float_below(limit)
        for j, b in enumerate(causal_bounds(enclosed, dataset, ys_f)):
            if (b <= below).all():
                errs[j] = list(b)
    open_ = [j for j in range(dataset.N) if errs[j] is None]
    exact_equal = [True] * dataset.N if model.exact else None
    first = None
    if open_:
        xs, ys = _subset_fractions(dataset, open_)
        known = [dataset.known[j] for j in open_]
        outs = forward_causal(model, xs, "exact", progress=progress)
        for j, e in zip(open_, _position_errors(outs, ys, known), strict=True):
            errs[j] = e
        if model.exact:
            unequal = [[i for i in np.flatnonzero(k) if tuple(o[i]) != tuple(y[i])]
                       for o, y, k in zip(outs, ys, known, strict=True)]
            for j, u in zip(open_, unequal, strict=True):
                exact_equal[j] = not u
            first = next(((open_[j], int(u[0])) for j, u in enumerate(unequal) if u), None)
        else:
            found = _first_exact_over(outs, ys, known, limit)
            first = None if found is None else (open_[found[0]], found[1])
    enclosed = dataset.N - len(open_)
    exact = "exact" if model.exact else "exact-floats"
    how = (exact if not enclosed else "float64 enclosures" + (" (radius 0)" if model.exact else "")
           + ("" if not open_ else f" and {exact}"))
    return dict(arithmetic=how, exact_equal=exact_equal, position_errors=errs,
                first_failure=first)


def _causal_softmax(model, dataset, limit: Fraction, digits: int, tau) -> dict:
    """The ball bound's verdict fields: per position an upper bound on the error, the first
    position shown beyond the limit, those left undecided."""
    b = bound_causal(model, dataset, limit, digits, tau)
    errs, first, undecided = [], None, []
    for j, (k, rows) in enumerate(zip(dataset.known, b.positions, strict=True)):
        e = [0.0] * len(k)
        for i, status, upper in rows:
            e[i] = upper
            if status == "beyond" and first is None:
                first = (j, i)
            elif status == "undecided":
                undecided.append((j, i))
        errs.append(e)
    measured = f"max error {fmt(worst([0.0, *b.measured]))} at the balls' midpoints, {b.bits} bits"
    return dict(arithmetic=f"ball{b.bits}", exact_equal=None, position_errors=errs,
                first_failure=first, undecided_positions=undecided, measured=measured,
                bound_exact=b.exact)


def _position_errors(outs, ys, known) -> list[list[float]]:
    """Per sequence, the Euclidean distance to the target at every position (0 where the
    position is unconstrained), differences taken in the outputs' own arithmetic."""
    out = []
    for o, y, k in zip(outs, ys, known, strict=True):
        if np.asarray(o).dtype == float and np.asarray(y).dtype == float:  # one array operation
            e = np.zeros(len(k))
            with np.errstate(all="ignore"):
                e[k] = np.sqrt(((o[k] - y[k]) ** 2).sum(axis=1))
            out.append(list(e))
            continue
        with np.errstate(all="ignore"):  # inf − inf: a nan error, which fails
            diff = np.asarray(o)[k] - np.asarray(y)[k]
            e = np.zeros(len(k))
            e[k] = [safe_float(sum(v * v for v in row)) ** 0.5 for row in diff]
        out.append(list(e))
    return out


def _first_exact_over(outs, ys, known, limit: Fraction):
    """The first (sequence, position) whose exact squared distance to its target exceeds
    limit² (outputs and targets in exact arithmetic), or None."""
    for j, (o, y, k) in enumerate(zip(outs, ys, known, strict=True)):
        for i in np.flatnonzero(k):
            if sum((a - b) ** 2 for a, b in zip(o[i], y[i], strict=True)) > limit * limit:
                return (j, int(i))
    return None
