"""Verification report: does the model interpolate the dataset, and how robustly.

Hardmax models with rational parameters are *proved* in exact arithmetic: each output token set
is compared with ``==`` to the target set. A float64 pass is always run too, for the float error
and the margins that say whether lower precision would still work.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import mpmath
import numpy as np

from .causal_data import CausalDataset
from .data import Dataset
from .evaluate import Arithmetic, PassStats, distinct_rows, forward, forward_causal
from .model import Transformer
from .numbers import to_fraction
from .record import CausalConstruction
from .tables import format_table


def hausdorff(a: np.ndarray, b: np.ndarray) -> float:
    """Hausdorff distance between two finite point sets (rows), returned as a float.

    Differences are taken in the arrays' own arithmetic (object arrays of mpmath numbers keep
    their precision), so errors far below float64 resolution are measured, not rounded away.
    """
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype == object or b.dtype == object:
        diff = a.astype(object)[:, None, :] - b.astype(object)[None, :, :]
        D = np.array([[float(sum(v * v for v in cell)) for cell in row] for row in diff])
        D = np.sqrt(D)
    else:
        D = np.sqrt(((a[:, None, :] - b[None, :, :]) ** 2).sum(-1))
    return float(max(D.min(axis=1).max(), D.min(axis=0).max()))


def as_set(a: np.ndarray) -> set:
    return {tuple(r.tolist()) for r in a}


def paper_bound(attention: str, N: int, sum_m: int) -> int:
    """Block count of Alcalde–Fantuzzi–Zuazua: 2Σm+2N+1 (hardmax), 2Σm+3N (softmax)."""
    return 2 * sum_m + 2 * N + 1 if attention == "hardmax" else 2 * sum_m + 3 * N


@dataclass
class Report:
    attention: str
    arithmetic: str  # how interpolation was decided: "exact", "float" or "mp<digits>"
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
    exact_equal: list[bool] | None
    hausdorff_float64: list[float]
    max_hausdorff_float64: float
    relative_error_float64: float
    coordinate_scale: float
    hardmax_margin: float | None
    hardmax_ties: int
    hat_clearance: float | None
    tolerance: float
    extra: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """Every pair interpolates: exactly (exact arithmetic) or within ``tolerance``."""
        if self.exact_equal is not None:
            return all(self.exact_equal)
        errs = self.extra.get("hausdorff_mp", self.hausdorff_float64)
        return max(errs) <= self.tolerance * self.coordinate_scale

    def to_dict(self) -> dict:
        out = asdict(self)
        out["ok"] = self.ok
        return out

    def rows(self) -> list[tuple[str, str]]:
        """(label, value) lines for a readable table."""
        def g(v):
            return "n/a" if v is None else f"{v:.3g}"
        if self.exact_equal is not None:
            verdict = (f"{sum(self.exact_equal)}/{self.N} pairs equal as sets "
                       f"(exact rational arithmetic)")
        elif "hausdorff_mp" in self.extra:
            verdict = (f"max Hausdorff error {g(max(self.extra['hausdorff_mp']))} at "
                       f"{self.arithmetic[2:]} digits (limit {g(self.tolerance)} × scale)")
        else:
            verdict = (f"max Hausdorff error {g(max(self.hausdorff_float64))} in float64 "
                       f"(limit {g(self.tolerance)} × scale)")
        rows = [
            ("verdict", ("EXACT" if self.exact_equal is not None else "OK") if self.ok
             else "FAILED"),
            ("interpolation", verdict),
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
            ("max |θ| / ‖θ‖₂", f"{g(self.max_abs_param)} / {g(self.param_l2)}"),
            ("float64 max Hausdorff error", f"{g(self.max_hausdorff_float64)} "
                                            f"(relative {g(self.relative_error_float64)})"),
            ("smallest hardmax score margin", g(self.hardmax_margin)),
            ("smallest hat clearance / scale", g(self.hat_clearance)),
        ]
        rows += [(k, str(v)) for k, v in self.extra.items() if k != "hausdorff_mp"]
        return rows

    def table(self) -> str:
        return format_table(self.rows())


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
    """Check every pair.

    * hardmax, rational parameters: proved in exact arithmetic (set equality);
    * softmax: evaluated with mpmath at ``digits`` significant digits; interpolation holds when
      the max Hausdorff error is below 10^-(digits−10) × coordinate scale (rational parameters)
      or ``tolerance`` × scale (float64 parameters, whose rounded snaps are flat only to
      rounding). Snap margins are measured on the projection line, in that precision and in
      float64;
    * float64 models: max Hausdorff error ≤ ``tolerance`` × coordinate scale.

    ``tau`` evaluates a softmax model at another temperature than the one it was built for.
    ``workers``: processes for the exact and mp passes (see :func:`forward`).
    A causal model (or a :class:`CausalDataset`) is checked position by position instead:
    :func:`verify_causal`.
    """
    if model.causal or isinstance(dataset, CausalDataset):
        return verify_causal(model, dataset, tolerance, progress, digits, tau)
    if model.d != dataset.d:
        raise ValueError(f"the model is for d = {model.d} but the data have d = {dataset.d}")
    xs_f, ys_f = dataset.floats()
    stats = PassStats()
    snap = _snap_start(model)
    at = {snap} if snap is not None else set()
    scale = dataset.coordinate_scale()
    outs_f, snaps_f = forward(model, xs_f, "float", stats=stats, progress=progress, tau=tau,
                              snapshots=at)
    hd = [hausdorff(distinct_rows(o), y) for o, y in zip(outs_f, ys_f, strict=True)]
    exact_equal = None
    arithmetic = "float64"
    extra: dict = {}
    if model.exact and model.attention == "hardmax":
        xs, ys = dataset.fractions()
        outs = forward(model, xs, "exact", progress=progress, workers=workers)
        exact_equal = [as_set(o) == as_set(y) for o, y in zip(outs, ys, strict=True)]
        arithmetic = "exact"
    elif model.attention == "softmax":
        xs, ys = dataset.fractions()
        outs, snaps = forward(model, xs, "mp", dps=digits, progress=progress, tau=tau,
                              snapshots=at, workers=workers)
        arithmetic = f"mp{digits}"
        if model.exact:  # rational snaps are flat on the data: exact up to the precision
            tolerance = 10.0 ** -(digits - 10)
        ar = Arithmetic("mp", digits)
        with mpmath.workdps(digits):  # targets and differences at the pass's precision
            extra["hausdorff_mp"] = [hausdorff(distinct_rows(o), ar.array(y))
                                     for o, y in zip(outs, ys, strict=True)]
        if snap is not None:
            extra.update(_snap_margins(model, snap, snaps[snap], snaps_f[snap], scale))
    theta = np.array([float(v) for v in model.parameters()] or [0.0])  # identities: none
    L4, L4k = _width_bounds(model, dataset.N, dataset.total_m)
    if model.attention == "softmax":
        used = model.tau if tau is None else tau
        extra["temperature τ (τ* of the geometry)"] = (f"{float(used):.6g} "
                                                      f"({_tau_star(model)})")
    return Report(
        attention=model.attention, arithmetic=arithmetic, N=dataset.N, d=dataset.d,
        sum_m=dataset.total_m, total_tokens=dataset.total_n, blocks=model.n_blocks,
        blocks_paper=paper_bound(model.attention, dataset.N, dataset.total_m),
        blocks_design=design_bound(model, dataset.N, dataset.total_m),
        max_width=model.max_width(), max_heads=model.max_heads(),
        blocks_width4=L4, blocks_width_target=L4k, structured=_structured(model),
        params=model.n_params(),
        params_dense=model.n_params_dense(), max_abs_param=float(np.abs(theta).max()),
        param_l2=float(np.sqrt((theta ** 2).sum())), exact_equal=exact_equal,
        hausdorff_float64=hd, max_hausdorff_float64=max(hd),
        relative_error_float64=max(hd) / scale, coordinate_scale=scale,
        hardmax_margin=stats.hardmax_margin, hardmax_ties=stats.hardmax_ties,
        hat_clearance=stats.ridge_clearance, tolerance=tolerance, extra=extra)


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

    def to_dict(self) -> dict:
        out = asdict(self)
        out["ok"] = self.ok
        return out

    def rows(self) -> list[tuple[str, str]]:
        def g(v):
            return "n/a" if v is None else f"{v:.3g}"
        if self.exact_equal is not None:
            how = (f"{sum(self.exact_equal)}/{self.N} sequences equal at every constrained "
                   "position (exact rational arithmetic)")
        else:
            how = (f"max error {g(max(self.errors, default=0.0))} in {self.arithmetic} "
                   f"(limit {g(self.tolerance)} × scale)")
        fail = "none" if self.first_failure is None else \
            f"sequence {self.first_failure[0]}, position {self.first_failure[1]}"
        return [
            ("verdict", ("EXACT" if self.exact_equal is not None else "OK") if self.ok
             else "FAILED"),
            ("interpolation", how),
            ("first failing position", fail),
            ("attention", f"{self.attention}, causal"),
            ("sequences N / dimension d", f"{self.N} / {self.d}"),
            ("tokens / constrained positions", f"{self.tokens} / {self.constrained}"),
            ("blocks L", f"{self.blocks}  (design R_c + moves = {self.blocks_design}, "
                         f"R_c = {self.R})"),
            ("max FF width", str(self.max_width)),
            ("parameters (structured / dense)", f"{self.params} / {self.params_dense}  "
             f"(+ {self.position_params} in stored positions)"),
            ("max |θ|", g(self.max_abs_param)),
            ("float64 max error", g(max(self.errors_float64, default=0.0))),
            ("smallest hardmax score margin", g(self.hardmax_margin)),
            ("smallest hat clearance / scale", g(self.hat_clearance)),
        ]

    def table(self) -> str:
        return format_table(self.rows())


def verify_causal(model: Transformer, dataset: CausalDataset, tolerance: float = 1e-9,
                  progress: bool = False, digits: int = 50, tau=None) -> CausalReport:
    """Check a causal model position by position, in order (not as sets).

    Rational hardmax: every constrained output is compared with ``==`` to its target. Softmax:
    a pass at ``digits`` digits whose largest error must be below 10^-(digits−10) × scale
    (rational parameters) or ``tolerance`` × scale. Float64 hardmax: ``tolerance`` × scale.
    """
    if not model.causal or not isinstance(dataset, CausalDataset):
        raise ValueError("a causal model is verified on a causal dataset (and only there)")
    if model.d != dataset.d:
        raise ValueError(f"the model is for d = {model.d} but the data have d = {dataset.d}")
    stats = PassStats()
    scale = dataset.coordinate_scale()
    xs_f, ys_f = dataset.floats()
    outs_f = forward_causal(model, xs_f, "float", stats=stats, tau=tau, progress=progress)
    err_f = _position_errors(outs_f, ys_f, dataset.known)
    exact_equal, errs, arithmetic = None, err_f, "float64"
    first = _first_over(err_f, dataset.known, tolerance * scale)
    if model.attention == "hardmax" and model.exact:
        xs, ys = dataset.fractions()
        outs = forward_causal(model, xs, "exact", progress=progress)
        unequal = [[i for i in np.flatnonzero(k) if tuple(o[i]) != tuple(y[i])]
                   for o, y, k in zip(outs, ys, dataset.known, strict=True)]
        exact_equal = [not u for u in unequal]
        first = next(((j, int(u[0])) for j, u in enumerate(unequal) if u), None)
        arithmetic = "exact"
    elif model.attention == "softmax":
        xs, ys = dataset.fractions()
        outs = forward_causal(model, xs, "mp", dps=digits, tau=tau, progress=progress)
        if model.exact:
            tolerance = 10.0 ** -(digits - 10)
        ar = Arithmetic("mp", digits)
        with mpmath.workdps(digits):
            errs = _position_errors(outs, [ar.array(y) for y in ys], dataset.known)
        first = _first_over(errs, dataset.known, tolerance * scale)
        arithmetic = f"mp{digits}"
    theta = np.array([float(v) for v in model.parameters()] or [0.0])
    rec = model.record if isinstance(model.record, CausalConstruction) else None
    R = None if rec is None else rec.R
    return CausalReport(
        attention=model.attention, arithmetic=arithmetic, N=dataset.N, d=dataset.d,
        tokens=dataset.total_n, constrained=dataset.constrained, blocks=model.n_blocks,
        blocks_design=None if rec is None else rec.R + rec.moves +
        (1 if model.attention == "softmax" else 0), R=R, max_width=model.max_width(),
        params=model.n_params(), params_dense=model.n_params_dense(),
        position_params=0 if model.positions is None else int(np.size(model.positions)),
        max_abs_param=float(np.abs(theta).max()), exact_equal=exact_equal,
        errors=[max(e, default=0.0) for e in errs],
        errors_float64=[max(e, default=0.0) for e in err_f], position_errors=errs,
        first_failure=first,
        coordinate_scale=scale, hardmax_margin=stats.hardmax_margin,
        hat_clearance=stats.ridge_clearance, tolerance=tolerance)


def _position_errors(outs, ys, known) -> list[list[float]]:
    """Per sequence, the Euclidean distance to the target at every position (0 where the
    position is unconstrained), differences taken in the outputs' own arithmetic."""
    out = []
    for o, y, k in zip(outs, ys, known, strict=True):
        diff = np.asarray(o)[k] - np.asarray(y)[k]
        e = np.zeros(len(k))
        e[k] = [float(sum(v * v for v in row)) ** 0.5 for row in diff]
        out.append(list(e))
    return out


def _first_over(errs, known, limit: float):
    """The first (sequence, position) whose error exceeds ``limit``, or None."""
    for j, (e, k) in enumerate(zip(errs, known, strict=True)):
        for i in np.flatnonzero(k):
            if not e[i] <= limit:
                return (j, int(i))
    return None
