"""Verification report: does the model interpolate the dataset, and how robustly.

Hardmax models with rational parameters are *proved* in exact arithmetic: each output token set
is compared with ``==`` to the target set. A float64 pass is always run too, for the float error
and the margins that say whether lower precision would still work.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from fractions import Fraction

import mpmath
import numpy as np

from ..data import CausalDataset, Dataset
from ..distance import as_set, clearance, data_scale, hausdorff_sq, hausdorff_stack, per_pair, worst
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
from ..model import Transformer
from ..numbers import safe_float, safe_floats, to_fraction, to_fraction_array
from ..record import CausalConstruction
from ..tables import format_table


def paper_bound(attention: str, N: int, sum_m: int) -> int:
    """Block count of Alcalde–Fantuzzi–Zuazua: 2Σm+2N+1 (hardmax), 2Σm+3N (softmax)."""
    return 2 * sum_m + 2 * N + 1 if attention == "hardmax" else 2 * sum_m + 3 * N


@dataclass
class Report:
    """What ``verify`` found; see docs/verification.md for what each verdict means."""

    attention: str
    arithmetic: str  # how interpolation was decided: "exact" (set ==), "exact-floats" (exact
    # evaluation of a float64 model against the tolerance) or "mp<digits>"
    N: int
    d: int
    sum_m: int
    total_tokens: int
    blocks: int
    blocks_paper: int
    blocks_design: int | None
    max_width: int
    max_heads: int
    blocks_width4: int | None  # the width-4 design bound with this build's R
    blocks_width_target: int | None  # R + ⌈(blocks_width4 − R)/k⌉ for k = width/4
    structured: bool
    params: int
    params_dense: int
    max_abs_param: float
    param_l2: float
    exact_equal: list[bool] | None  # rational hardmax: output set == target set, per pair
    hausdorff_float64: list[float]  # the fast evaluator in float64 (nan/inf when non-finite)
    max_hausdorff_float64: float
    relative_error_float64: float
    coordinate_scale: float  # the data's own largest |coordinate|
    hardmax_margin: float | None
    hardmax_ties: int
    hat_clearance: float | None
    tolerance: float
    extra: dict = field(default_factory=dict)
    within_tolerance: list[bool] | None = None  # the deciding evaluation, per pair
    nonfinite_pairs: list[int] = field(default_factory=list)  # float64 models: inf/nan outputs
    proved: bool = False  # interpolation proved (exact ==, or certify's ball arithmetic)
    proof: str = ""  # how it was proved, or why not

    @property
    def ok(self) -> bool:
        """Every pair interpolates (exactly, or within ``tolerance`` × scale in the deciding
        evaluation) and no float64 output of a float64 model is inf or nan."""
        if self.nonfinite_pairs:
            return False
        if self.exact_equal is not None:
            return all(self.exact_equal)
        return self.within_tolerance is not None and all(self.within_tolerance)

    def to_dict(self) -> dict:
        out = asdict(self)
        out["ok"] = self.ok
        return out

    def verdict(self) -> str:
        """PROVED EXACT, OK (within tolerance, not proved) or FAILED."""
        if not self.ok:
            return "FAILED"
        return "PROVED EXACT" if self.proved else "OK"

    def rows(self) -> list[tuple[str, str]]:
        """(label, value) lines for a readable table."""
        rows = [
            ("verdict", self.verdict()),
            ("interpolation", self._interpolation()),
            ("proof", self.proof),
            ("attention", self.attention),
            ("pairs N / dimension d", f"{self.N} / {self.d}"),
            ("input tokens / target tokens Σm", f"{self.total_tokens} / {self.sum_m}"),
            ("blocks L", f"{self.blocks}  (design bound {self.blocks_design}, paper "
                         f"{self.blocks_paper})"),
            ("max FF width / heads", f"{self.max_width} / {self.max_heads}"),
            ("width-4 bound L₄ / R + ⌈(L₄ − R)/k⌉", f"{self.blocks_width4} / "
                                                     f"{self.blocks_width_target}"),
            ("structured A, V", "yes" if self.structured else "NO"),
            ("parameters (structured / dense)", f"{self.params} / {self.params_dense}"),
            ("max |θ| / ‖θ‖₂", f"{_g(self.max_abs_param)} / {_g(self.param_l2)}"),
            ("float64 max Hausdorff error", f"{_g(self.max_hausdorff_float64)} "
                                            f"(relative {_g(self.relative_error_float64)})"),
            ("smallest hardmax score margin", _g(self.hardmax_margin)),
            ("smallest hat clearance / scale", _g(self.hat_clearance)),
        ]
        if self.nonfinite_pairs:
            rows.insert(2, ("non-finite float64 outputs", f"pairs {self.nonfinite_pairs[:10]}"))
        hidden = ("hausdorff_mp", "hausdorff_exact")
        rows += [(k, str(v)) for k, v in self.extra.items() if k not in hidden]
        return rows

    def _interpolation(self) -> str:
        limit = f"(limit {_g(self.tolerance)} × scale {_g(self.coordinate_scale)})"
        if self.exact_equal is not None:
            return (f"{sum(self.exact_equal)}/{self.N} pairs equal as sets "
                    f"(exact rational arithmetic)")
        if "hausdorff_exact" in self.extra:
            return (f"max Hausdorff error ≤ {_g(worst(self.extra['hausdorff_exact']))} in exact "
                    f"arithmetic on the stored floats {limit}")
        return (f"max Hausdorff error {_g(worst(self.extra['hausdorff_mp']))} at "
                f"{self.arithmetic[2:]} digits {limit}")

    def table(self) -> str:
        return format_table(self.rows())


def _g(v) -> str:
    return "n/a" if v is None else f"{v:.3g}"


def design_bound(model: Transformer, N: int, sum_m: int, k: int | None = None) -> int | None:
    """The construction's block count with k = width/4 hats per layer (default: the model's):
    R + (1 + ⌈(M − 1)/k⌉ leader layers, 1 when M = Σm − N = 0) + ⌈Σm/k⌉, plus the softmax
    projection; see docs/heads.md."""
    if model.record is None:
        return None
    k = hats_per_layer(model) if k is None else k
    R, moves = model.record.R, sum_m - N
    extra = 1 if model.attention == "softmax" else 0
    leaders = 1 + -(-(moves - 1) // k) if moves > 0 else 1
    return R + leaders + extra + -(-sum_m // k)


def hats_per_layer(model: Transformer) -> int:
    """k = max FF width / 4 (at least 1): the hats the widest layer holds."""
    return max(1, model.max_width() // 4)


def _width_bounds(model: Transformer, N: int, sum_m: int) -> tuple[int | None, int | None]:
    """The width-4 bound L₄ (this build's R) and the target R + ⌈(L₄ − R)/k⌉."""
    L4 = design_bound(model, N, sum_m, k=1)
    if L4 is None:
        return None, None
    R = model.record.R
    return L4, R + -(-(L4 - R) // hats_per_layer(model))


def verify(model: Transformer, dataset: Dataset, tolerance: float = 1e-9,
           progress: bool = False, digits: int = 50, tau=None,
           workers: int | None = None) -> Report:
    """Check every pair (see docs/verification.md).

    * hardmax, rational parameters: proved in exact arithmetic (set equality with ``==``);
    * hardmax, float64 parameters: judged by the exact value of the stored floats against
      ``tolerance`` × the data's coordinate scale — settled by float64 enclosures where their
      bound is within it, else by an exact pass compared exactly. A second, independent
      float64 implementation (torch, else a dense NumPy pass) is reported beside it;
    * softmax: mpmath at ``digits`` and at twice as many digits (more while they disagree);
      the error plus the disagreement must be below 10^-(digits−10) × scale (rational
      parameters) or ``tolerance`` × scale (float64). Proved when ``exactformer.certify``
      proves it. Snap margins are measured on the projection line;
    * float64 models whose float64 outputs are inf or nan fail.

    ``tau`` evaluates a softmax model at another temperature than the one it was built for.
    ``workers``: processes for the exact and mp passes (see :func:`forward`).
    A causal model (or a :class:`CausalDataset`) is checked position by position instead:
    :func:`verify_causal`.
    """
    if model.causal or isinstance(dataset, CausalDataset):
        return verify_causal(model, dataset, tolerance, progress, digits, tau)
    if model.d != dataset.d:
        raise ValueError(f"the model is for d = {model.d} but the data have d = {dataset.d}")
    xs_f, ys_f = dataset.floats() if not dataset.exact else \
        [[safe_floats(a) for a in part] for part in dataset.fractions()]
    scale = data_scale(*((xs_f, ys_f) if not dataset.exact else dataset.fractions()))
    stats = PassStats()
    snap = _snap_start(model)
    outs_f, snaps_f, enclosed = _first_pass(model, dataset, xs_f, stats, progress, tau, snap,
                                            safe_float(Fraction(tolerance) * scale))
    hd = per_pair(hausdorff_stack, outs_f, ys_f)
    extra: dict = {}
    if model.attention == "softmax" and model.exact:
        tolerance = 10.0 ** -(digits - 10)  # rational snaps are flat on the data
    limit = Fraction(tolerance) * scale
    if model.attention == "hardmax":
        exact_equal, within = _decide_hardmax(model, dataset, limit, extra, progress, workers,
                                              enclosed)
        arithmetic = "exact" if model.exact else "exact-floats"  # set ==, or exact tolerance
        proved = exact_equal is not None and all(exact_equal)
        proof = "exact rational arithmetic (==)" if proved else "not proved"
    else:
        exact_equal = None
        within, arithmetic, proved, proof = _softmax_verdict(
            model, dataset, limit, digits, tau, (snap, snaps_f), extra, progress, workers,
            scale)
    nonfinite: list[int] = []
    if not model.exact:  # the model's own arithmetic: inf or nan there is a failure
        nonfinite = [j for j, o in enumerate(outs_f) if not np.isfinite(o).all()]
        nonfinite = sorted(set(nonfinite) | set(_independent(model, xs_f, ys_f, tau, extra)))
    if model.attention == "softmax":
        used = model.tau if tau is None else tau
        extra["temperature τ (τ* of the geometry)"] = (f"{float(used):.6g} "
                                                      f"({_tau_star(model)})")
    scale_f = safe_float(scale)
    report = Report(
        **_shape(model, dataset), arithmetic=arithmetic, exact_equal=exact_equal,
        hausdorff_float64=hd,
        max_hausdorff_float64=worst(hd), relative_error_float64=_relative(worst(hd), scale_f),
        coordinate_scale=scale_f, hardmax_margin=stats.hardmax_margin,
        hardmax_ties=stats.hardmax_ties, hat_clearance=clearance(stats, scale_f),
        tolerance=tolerance, extra=extra, within_tolerance=within, nonfinite_pairs=nonfinite,
        proved=proved, proof=proof)
    report.proved = report.proved and report.ok  # a proof never outranks a failed check
    return report


def _softmax_verdict(model, dataset, limit, digits, tau, snapped, extra, progress, workers,
                     scale):
    """(within per pair, arithmetic, proved, proof) of a softmax model; the snap margins go
    into ``extra`` (``snapped``: the first snap block and the float pass's snapshots)."""
    snap, snaps_f = snapped
    at = {snap} if snap is not None else set()
    within, used, snaps = _decide_softmax(model, *dataset.fractions(), limit, digits, tau, at,
                                          extra, progress, workers)
    if snap is not None and snap in snaps_f:
        extra.update(_snap_margins(model, snap, snaps[snap], snaps_f[snap],
                                   safe_float(scale) or 1.0))
    proved, proof = _prove_softmax(model, dataset, tau)
    return within, f"mp{used}", proved, proof


def _shape(model: Transformer, dataset: Dataset) -> dict:
    """The report's fields that describe the model and the data, not the verdict."""
    L4, L4k = _width_bounds(model, dataset.N, dataset.total_m)
    largest, l2 = _parameter_sizes(model)
    return dict(
        attention=model.attention, N=dataset.N, d=dataset.d, sum_m=dataset.total_m,
        total_tokens=dataset.total_n, blocks=model.n_blocks,
        blocks_paper=paper_bound(model.attention, dataset.N, dataset.total_m),
        blocks_design=design_bound(model, dataset.N, dataset.total_m),
        max_width=model.max_width(), max_heads=model.max_heads(), blocks_width4=L4,
        blocks_width_target=L4k, structured=_structured(model), params=model.n_params(),
        params_dense=model.n_params_dense(), max_abs_param=largest, param_l2=l2)


def _parameter_sizes(model: Transformer) -> tuple[float, float]:
    """The largest |parameter| and the parameters' Euclidean norm, in float64 (one array
    operation over the blocks' arrays: a large model has millions of parameters)."""
    arrays = model.parameter_arrays()
    if not all(a.dtype == float for a in arrays):  # (a float64 model's need no conversion)
        arrays = [safe_floats(np.asarray(a)) for a in arrays]
    theta = np.concatenate([*arrays, np.zeros(1)])
    with np.errstate(over="ignore"):
        return float(np.abs(theta).max()), float(np.sqrt((theta ** 2).sum()))


def _relative(err: float, scale: float) -> float:
    if scale > 0:
        return err / scale
    return 0.0 if err == 0 else math.inf


def _float_pass(model, xs_f, stats, progress, tau, at):
    """The fast evaluator in float64: outputs and snapshots. A rational model with a parameter
    beyond float64's range has no float64 form: its outputs are reported as inf."""
    try:
        with np.errstate(all="ignore"):  # overflow shows as inf/nan in the outputs
            return forward(model, xs_f, "float", stats=stats, progress=progress, tau=tau,
                           snapshots=at)
    except OverflowError:
        return [np.full(x.shape, math.inf) for x in xs_f], {}


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
    cap = safe_float(limit)  # a float ≤ limit
    if math.isfinite(cap) and Fraction(cap) > limit:
        cap = float(np.nextafter(cap, 0.0))
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
    enclosure's per-pair bounds or None). A float64 hardmax model without stored positions
    gets the enclosure pass (docs/numerics.md#enclosures), any other the plain float pass."""
    if model.attention == "hardmax" and not model.exact and model.positions is None:
        outs, bounds = _float_and_enclosure(model, dataset, stats, progress, limit)
        return outs, {}, bounds
    at = {snap} if snap is not None else set()
    return (*_float_pass(model, xs_f, stats, progress, tau, at), None)


def _float_and_enclosure(model, dataset, stats, progress: bool, limit: float
                         ) -> tuple[list, list[float]]:
    """The enclosure pass's float64 outputs (recording ``stats``) and, per pair, its upper
    bound on the exact Hausdorff distance (nan when unknown). Rows whose radius passes
    ``limit`` are given up on at once (their pairs go to the exact pass)."""
    if dataset.exact:
        xs, ys = dataset.fractions()
        xs_f, ys_f = [safe_floats(x) for x in xs], [safe_floats(y) for y in ys]
        xs_r = [enclosure.float_radius(x, f) for x, f in zip(xs, xs_f, strict=True)]
        ys_r = [enclosure.float_radius(y, f) for y, f in zip(ys, ys_f, strict=True)]
    else:
        xs_f, ys_f = dataset.floats()
        xs_r, ys_r = None, [np.zeros_like(y) for y in ys_f]  # float data are exact
    outs, rads = enclose(model, xs_f, xs_r, stats, progress, give_up=limit)
    return outs, per_pair(enclosure.hausdorff_upper, outs, rads, ys_f, ys_r)


def _subset_fractions(dataset, rows: list[int]) -> tuple[list, list]:
    """The pairs ``rows`` as object arrays of Fractions (exact for float data too)."""
    return ([to_fraction_array(dataset.inputs[j]) for j in rows],
            [to_fraction_array(dataset.targets[j]) for j in rows])


MAX_DIGITS_FACTOR = 16  # the softmax precision check stops at 16 × the requested digits


def _decide_softmax(model, xs, ys, limit: Fraction, digits: int, tau, at, extra: dict,
                    progress: bool, workers):
    """mpmath passes at ``digits`` and 2·``digits`` digits, doubling while the two disagree by
    more than limit/64 (up to 16 × ``digits``). A pair is within tolerance when its error at
    the higher precision plus the disagreement is at most ``limit``. Returns (within per pair,
    digits used, snapshots of the last pass)."""
    lo = forward(model, xs, "mp", dps=digits, progress=progress, tau=tau, workers=workers)
    dps = 2 * digits
    while True:
        hi, snaps = forward(model, xs, "mp", dps=dps, progress=progress, tau=tau, snapshots=at,
                            workers=workers)
        with mpmath.workdps(dps):
            lim = mpmath.mpf(limit.numerator) / limit.denominator
            drift = max(max(abs(u - v) for u, v in zip(a.flat, b.flat, strict=True))
                        for a, b in zip(lo, hi, strict=True))
            if drift <= lim / 64 or dps >= MAX_DIGITS_FACTOR * digits:
                ar = Arithmetic("mp", dps)
                sq = [hausdorff_sq(distinct_rows(o), ar.array(y))
                      for o, y in zip(hi, ys, strict=True)]
                within = [mpmath.sqrt(v) + drift <= lim for v in sq]
                extra["hausdorff_mp"] = [float(mpmath.sqrt(v)) for v in sq]
                extra["precision check"] = (f"{dps // 2} and {dps} digits agree to "
                                            f"{float(drift):.3g}")
                return within, dps, snaps
        lo, dps = hi, 2 * dps


def _prove_softmax(model, dataset, tau) -> tuple[bool, str]:
    """Ask ``exactformer.certify`` (ball arithmetic) for a proof; not proved without it."""
    if tau is not None and tau != model.tau:
        return False, "not proved (evaluated at another temperature)"
    try:
        from .certify import prove
    except ImportError:
        return False, "not proved (exactformer.certify is not available)"
    try:
        proof = prove(model, dataset)
    except ArithmeticError as e:  # e.g. a value beyond float64 while describing a mismatch
        return False, f"not proved (certify stopped: {type(e).__name__}: {e})"
    if proof.proved:
        return True, f"ball arithmetic at {proof.bits} bits"
    return False, f"not proved: {proof.reason}"


INDEPENDENT_BUDGET = 2e9  # dense float64 operations the independent check may spend


def _independent(model, xs, ys, tau, extra: dict) -> list[int]:
    """The float64 error of a second implementation (the torch module when torch is
    installed, else :func:`dense_forward`), recorded in ``extra``; returns the pairs whose
    outputs are not finite there. ``xs``, ``ys``: the data in float64."""
    cost = model.n_blocks * model.d * sum(len(x) ** 2 for x in xs)
    if cost > INDEPENDENT_BUDGET:
        extra["independent float64 check"] = f"skipped ({cost:.2g} dense operations)"
        return []
    m = model if tau is None else replace(model, tau=tau)
    try:
        from ..export import apply, to_torch
        module = to_torch(m, ff="dense")
    except ImportError:
        module = None
    if module is not None and any(True for _ in module.parameters()):
        outs, name = apply(module, xs), "torch"
    else:  # no torch, or no parameters at all (nothing for torch to run)
        outs, name = dense_forward(m, xs), "NumPy dense"
    hd = per_pair(hausdorff_stack, [np.asarray(o, dtype=float) for o in outs], ys)
    extra[f"float64 max Hausdorff error ({name})"] = _g(worst(hd))
    return [j for j, o in enumerate(outs) if not np.isfinite(o).all()]


def _tau_star(model: Transformer) -> str:
    rec = model.record
    return "n/a" if rec is None or rec.tau_star is None else f"{rec.tau_star:.6g}"


def _snap_start(model: Transformer) -> int | None:
    """Block index after which tokens sit on the snap line, read from the layers: the last FF
    with η = 0 (the projection onto the line) when every later layer is a residual FF reading
    one direction with a multiple of four units (snaps). None for any other model."""
    last = None
    for i, b in enumerate(model.blocks):
        if b.ff is not None and b.ff.eta == 0:
            last = i
    if last is None or model.attention != "softmax" or last + 1 >= model.n_blocks:
        return None
    snaps = model.blocks[last + 1:]
    if all(b.sa is None and b.ff is not None and b.ff.width % 4 == 0 and b.ff.eta == 1
           and _one_direction(b.ff) for b in snaps):
        return last + 1
    return None


def _one_direction(ff) -> bool:
    return all(np.array_equal(ff.U[i], ff.U[0]) for i in range(ff.width))


def _flat_pieces(model: Transformer, s0: int) -> list[tuple[float, float]]:
    """[c2, c3] of every snap, from its breakpoints c_i = −b_i (units read f' with scale 1);
    the snaps of one layer have disjoint windows, so sorted breakpoints come in fours."""
    out = []
    for b in model.blocks[s0:]:
        c = sorted(-to_fraction(v) for v in b.ff.b)
        out += [(float(c[i + 1]), float(c[i + 2])) for i in range(0, len(c), 4)]
    return sorted(out)


def _snap_margins(model: Transformer, s0: int, line_mp, line_f, scale: float) -> dict:
    """Distance of every token on the snap line to the edges of the flat part of the window
    containing it (negative: in no flat part), in high precision, against the float64
    deviation of the same positions. ``s0``: the first snap block."""
    reader = model.blocks[s0].ff.U[0]  # every snap reads the same direction f'
    flats = _flat_pieces(model, s0)
    ts_mp = np.concatenate([np.array(o, dtype=float) for o in line_mp]) @ \
        np.array(reader, dtype=float)
    ts_f = np.concatenate(line_f) @ np.array(reader, dtype=float)
    margins = []
    for t in ts_mp:
        inside = [min(t - a, b - t) for a, b in flats if a <= t <= b]
        margins.append(inside[0] if inside else -min(min(abs(t - a), abs(t - b))
                                                     for a, b in flats))
    dev = float(np.abs(ts_f - ts_mp).max())
    m = float(min(margins))
    return {"snap margin / scale": f"{m / scale:.3g}",
            "float64 deviation on the snap line / scale": f"{dev / scale:.3g}",
            "float64 certified by margins": "yes" if m > 8 * dev else "no"}


def _structured(model: Transformer) -> bool:
    """Every head's A and V is s·I + u·vᵀ with d-vectors (FF widths are reported apart)."""
    d = model.d
    return all(v.shape == (d,) for b in model.blocks if b.sa is not None for h in b.sa.heads
               for v in (h.A.a, h.A.c, h.V.p, h.V.q))


# ------------------------------------------------------------------------------ causal
@dataclass
class CausalReport:
    """Position-by-position verdict for a causal model (docs/causal.md): ``exact_equal[j]`` says
    whether every constrained output of sequence j equals its target (``==`` on Fractions,
    rational hardmax), ``errors[j]`` its largest distance to a target in the arithmetic that
    decides (float64, or mpmath for softmax), ``first_failure`` the first (sequence, position)
    that fails."""

    attention: str
    arithmetic: str
    N: int
    d: int
    tokens: int
    constrained: int
    blocks: int
    blocks_design: int | None
    R: int | None
    max_width: int
    params: int
    params_dense: int
    position_params: int  # the stored positions (rows × d), not counted in params
    max_abs_param: float
    exact_equal: list[bool] | None
    errors: list[float]  # per sequence: the largest error in the deciding arithmetic
    errors_float64: list[float]
    position_errors: list[list[float]]  # per sequence and position (0 where unconstrained)
    first_failure: tuple[int, int] | None
    coordinate_scale: float
    hardmax_margin: float | None
    hat_clearance: float | None
    tolerance: float

    @property
    def ok(self) -> bool:
        return self.first_failure is None

    @property
    def proved(self) -> bool:
        """Every constrained position equal to its target under ``==`` (rational hardmax)."""
        return self.ok and self.exact_equal is not None and all(self.exact_equal)

    def to_dict(self) -> dict:
        out = asdict(self)
        out["ok"], out["proved"] = self.ok, self.proved
        return out

    def rows(self) -> list[tuple[str, str]]:
        def g(v):
            return "n/a" if v is None else f"{v:.3g}"
        if self.exact_equal is not None:
            how = (f"{sum(self.exact_equal)}/{self.N} sequences equal at every constrained "
                   "position (exact rational arithmetic)")
        else:
            how = (f"max error {g(worst([0.0, *self.errors]))} in {self.arithmetic} "
                   f"(limit {g(self.tolerance)} × scale)")
        fail = "none" if self.first_failure is None else \
            f"sequence {self.first_failure[0]}, position {self.first_failure[1]}"
        return [
            ("verdict", "PROVED EXACT" if self.proved else "OK" if self.ok else "FAILED"),
            ("interpolation", how),
            ("first failing position", fail),
            ("attention", f"{self.attention}, causal"),
            ("sequences N / dimension d", f"{self.N} / {self.d}"),
            ("tokens / constrained positions", f"{self.tokens} / {self.constrained}"),
            ("blocks L", f"{self.blocks}  (design R_c + ⌈moves/k⌉ = {self.blocks_design}, "
                         f"R_c = {self.R})"),
            ("max FF width", str(self.max_width)),
            ("parameters (structured / dense)", f"{self.params} / {self.params_dense}  "
             f"(+ {self.position_params} in stored positions)"),
            ("max |θ|", g(self.max_abs_param)),
            ("float64 max error", g(worst([0.0, *self.errors_float64]))),
            ("smallest hardmax score margin", g(self.hardmax_margin)),
            ("smallest hat clearance / scale", g(self.hat_clearance)),
        ]

    def table(self) -> str:
        return format_table(self.rows())


def verify_causal(model: Transformer, dataset: CausalDataset, tolerance: float = 1e-9,
                  progress: bool = False, digits: int = 50, tau=None) -> CausalReport:
    """Check a causal model position by position, in order (not as sets).

    Hardmax: an exact pass (floats read as their exact binary values); rational models compare
    every constrained output with ``==`` to its target, float64 ones compare the exact squared
    distance with (``tolerance`` × scale)², exactly. Softmax: a pass at ``digits`` digits whose
    largest error must be below 10^-(digits−10) × scale (rational parameters) or ``tolerance`` ×
    scale. The scale is the data's own largest |coordinate| (docs/verification.md).
    """
    if not model.causal or not isinstance(dataset, CausalDataset):
        raise ValueError("a causal model is verified on a causal dataset (and only there)")
    if model.d != dataset.d:
        raise ValueError(f"the model is for d = {model.d} but the data have d = {dataset.d}")
    stats = PassStats()
    xs, ys = dataset.fractions()
    exact_scale = data_scale(xs, [y[k] for y, k in zip(ys, dataset.known, strict=True)])
    scale = float(exact_scale)
    xs_f, ys_f = dataset.floats()
    outs_f = forward_causal(model, xs_f, "float", stats=stats, tau=tau, progress=progress)
    err_f = _position_errors(outs_f, ys_f, dataset.known)
    exact_equal, errs = None, err_f
    if model.attention == "hardmax":
        outs = forward_causal(model, xs, "exact", progress=progress)
        errs = _position_errors(outs, ys, dataset.known)
        if model.exact:
            unequal = [[i for i in np.flatnonzero(k) if tuple(o[i]) != tuple(y[i])]
                       for o, y, k in zip(outs, ys, dataset.known, strict=True)]
            exact_equal = [not u for u in unequal]
            first = next(((j, int(u[0])) for j, u in enumerate(unequal) if u), None)
        else:
            first = _first_exact_over(outs, ys, dataset.known, Fraction(tolerance) * exact_scale)
        arithmetic = "exact" if model.exact else "exact-floats"
    else:
        xs, ys = dataset.fractions()
        outs = forward_causal(model, xs, "mp", dps=digits, tau=tau, progress=progress)
        if model.exact:
            tolerance = 10.0 ** -(digits - 10)
        ar = Arithmetic("mp", digits)
        with mpmath.workdps(digits):
            errs = _position_errors(outs, [ar.array(y) for y in ys], dataset.known)
        first = _first_over(errs, dataset.known, tolerance * scale)
        arithmetic = f"mp{digits}"
    rec = model.record if isinstance(model.record, CausalConstruction) else None
    R = None if rec is None else rec.R
    return CausalReport(
        attention=model.attention, arithmetic=arithmetic, N=dataset.N, d=dataset.d,
        tokens=dataset.total_n, constrained=dataset.constrained, blocks=model.n_blocks,
        blocks_design=None if rec is None else rec.R + -(-rec.moves // hats_per_layer(model)) +
        (1 if model.attention == "softmax" and rec.moves else 0), R=R, max_width=model.max_width(),
        params=model.n_params(), params_dense=model.n_params_dense(),
        position_params=0 if model.positions is None else int(np.size(model.positions)),
        max_abs_param=_parameter_sizes(model)[0], exact_equal=exact_equal,
        errors=[worst([0.0, *e]) for e in errs],
        errors_float64=[worst([0.0, *e]) for e in err_f], position_errors=errs,
        first_failure=first,
        coordinate_scale=scale, hardmax_margin=stats.hardmax_margin,
        hat_clearance=clearance(stats, scale), tolerance=tolerance)


def _position_errors(outs, ys, known) -> list[list[float]]:
    """Per sequence, the Euclidean distance to the target at every position (0 where the
    position is unconstrained), differences taken in the outputs' own arithmetic."""
    out = []
    for o, y, k in zip(outs, ys, known, strict=True):
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


def _first_over(errs, known, limit: float):
    """The first (sequence, position) whose error exceeds ``limit``, or None."""
    for j, (e, k) in enumerate(zip(errs, known, strict=True)):
        for i in np.flatnonzero(k):
            if not e[i] <= limit:
                return (j, int(i))
    return None
