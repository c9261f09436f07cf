"""The reports ``verify`` returns: what was decided, by which path, and the model's sizes.

``Report`` (set data) and ``CausalReport`` (causal data) share the verdict words, the table and
the JSON form; the rows of each table are listed in one place, its ``rows`` method. What each
field means: docs/verification.md#the-report.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from ..distance import worst
from ..tables import format_table
from .data_check import data_row

VERDICTS = ("PROVED EXACT", "OK", "UNDECIDED", "FAILED")


def fmt(v) -> str:
    """A number for a report table (3 significant digits; n/a for None)."""
    return "n/a" if v is None else f"{v:.3g}"


def padded(d_model: int | None) -> str:
    """What a report adds to the data's d where they were zero-padded to the model's width."""
    return "" if d_model is None else f"  (zero-padded to d_model = {d_model})"


class _Verdict:
    """The verdict word, the table and the JSON form, from ``ok``, ``proved``, ``undecided``
    and ``rows()`` of the report class."""

    def verdict(self) -> str:
        """PROVED EXACT, OK (within tolerance by a bound, not proved), UNDECIDED (no failure
        shown, but no bound tight enough at the largest precision tried) or FAILED."""
        if self.ok:
            return "PROVED EXACT" if self.proved else "OK"
        return "UNDECIDED" if self.undecided else "FAILED"

    def to_dict(self) -> dict:
        out = asdict(self)
        if out["d_model"] is None:  # data as wide as the model: the form of every older report
            del out["d_model"]
        if not out.get("position_keys", True):  # (a causal report of a hat model, as before)
            del out["position_keys"]
        out["ok"], out["proved"], out["verdict"] = self.ok, self.proved, self.verdict()
        return out

    def table(self) -> str:
        return format_table(self.rows())


@dataclass
class Report(_Verdict):
    """What ``verify`` found on set data; see docs/verification.md for each verdict."""

    attention: str
    arithmetic: str  # how interpolation was decided: "exact" (set ==), "exact-floats" (exact
    # evaluation of a float64 model against the tolerance), "ball<bits>" (softmax: rigorous
    # ball arithmetic at that precision) or "enclosures" (float64 softmax: the float64
    # enclosures' bounds)
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
    param_norm_sq: float  # ‖θ‖₂² (docs/numerics.md#conditioning)
    max_unit_slope: float  # the largest |u|·|w| of an FF unit
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
    undecided_pairs: list[int] = field(default_factory=list)  # softmax: bound not tight enough
    proved: bool = False  # interpolation proved (exact ==, or certify's ball arithmetic)
    proof: str = ""  # how it was proved, or why not
    d_model: int | None = None  # the model's width, where the data (d < d_model) were padded
    data: dict = field(default_factory=dict)  # the data given vs. built for (data_check)

    @property
    def ok(self) -> bool:
        """Every pair interpolates (exactly, or within ``tolerance`` × scale by a rigorous
        bound) and no float64 output of a float64 model is inf or nan."""
        if self.nonfinite_pairs:
            return False
        if self.exact_equal is not None:
            return all(self.exact_equal)
        return self.within_tolerance is not None and all(self.within_tolerance)

    @property
    def undecided(self) -> bool:
        """No pair shown to fail, some pair neither shown within nor beyond the limit."""
        if self.ok or self.nonfinite_pairs or not self.undecided_pairs:
            return False
        return all(w or j in self.undecided_pairs for j, w in enumerate(self.within_tolerance))

    def rows(self) -> list[tuple[str, str]]:
        """(label, value) lines for a readable table."""
        rows = [
            ("verdict", self.verdict()),
            ("interpolation", self._interpolation()),
            ("proof", self.proof),
            ("data", data_row(self.data)),
            ("attention", self.attention),
            ("pairs N / dimension d", f"{self.N} / {self.d}{padded(self.d_model)}"),
            ("input tokens / target tokens Σm", f"{self.total_tokens} / {self.sum_m}"),
            ("blocks L", f"{self.blocks}  (design bound {self.blocks_design}, paper "
                         f"{self.blocks_paper})"),
            ("max FF width / heads", f"{self.max_width} / {self.max_heads}"),
            ("width-4 bound L₄ / R + ⌈(L₄ − R)/k⌉",
             "n/a (no hats)" if self.blocks_width4 is None else
             f"{self.blocks_width4} / {self.blocks_width_target}"),
            ("structured A, V", "yes" if self.structured else "NO"),
            ("parameters (structured / dense)", f"{self.params} / {self.params_dense}"),
            ("max |θ| / ‖θ‖₂²", f"{fmt(self.max_abs_param)} / {fmt(self.param_norm_sq)}"),
            ("largest unit slope |u|·|w|", fmt(self.max_unit_slope)),
            ("float64 max Hausdorff error", f"{fmt(self.max_hausdorff_float64)} "
                                            f"(relative {fmt(self.relative_error_float64)})"),
            ("smallest hardmax score margin", fmt(self.hardmax_margin)),
            ("smallest hat clearance / scale", fmt(self.hat_clearance)),
        ]
        if self.failing_pairs():
            rows.insert(1, ("failing pairs", self._failing()))
        if self.nonfinite_pairs:
            rows.insert(2, ("non-finite float64 outputs", f"pairs {self.nonfinite_pairs[:10]}"))
        if self.undecided_pairs:
            rows.insert(2, ("undecided pairs", f"{self.undecided_pairs[:10]}"))
        hidden = ("hausdorff_mp", "hausdorff_exact", "hausdorff_bound", "mp digits")
        rows += [(k, str(v)) for k, v in self.extra.items() if k not in hidden]
        return rows

    def failing_pairs(self) -> list[int]:
        """The pairs shown to fail: unequal sets (rational hardmax), beyond the limit by the
        deciding evaluation, or with an inf or nan float64 output; not the undecided ones."""
        if self.exact_equal is not None:
            bad = {j for j, e in enumerate(self.exact_equal) if not e}
        elif self.within_tolerance is None:
            bad = set()
        else:
            bad = {j for j, w in enumerate(self.within_tolerance)
                   if not w and j not in self.undecided_pairs}
        return sorted(bad | set(self.nonfinite_pairs))

    def _failing(self, shown: int = 5) -> str:
        bad = self.failing_pairs()
        named = ", ".join(f"pair {j} (float64 Hausdorff error {fmt(self.hausdorff_float64[j])})"
                          for j in bad[:shown])
        more = f" and {len(bad) - shown} more" if len(bad) > shown else ""
        return f"{len(bad)}/{self.N}: {named}{more}"

    def _interpolation(self) -> str:
        limit = f"(limit {fmt(self.tolerance)} × scale {fmt(self.coordinate_scale)})"
        if self.exact_equal is not None:
            return (f"{sum(self.exact_equal)}/{self.N} pairs equal as sets "
                    f"(exact rational arithmetic)")
        if "hausdorff_exact" in self.extra:
            return (f"max Hausdorff error ≤ {fmt(worst(self.extra['hausdorff_exact']))} in exact "
                    f"arithmetic on the stored floats {limit}")
        if self.arithmetic == "enclosures":
            return (f"max Hausdorff error ≤ {fmt(worst(self.extra['hausdorff_bound']))} by "
                    f"float64 enclosures of the stored floats {limit}")
        measured = (f" (measured {fmt(worst(self.extra['hausdorff_mp']))} at "
                    f"{self.extra['mp digits']} digits)" if "hausdorff_mp" in self.extra else "")
        return (f"max Hausdorff error ≤ {fmt(worst(self.extra['hausdorff_bound']))} in ball "
                f"arithmetic at {self.arithmetic[4:]} bits{measured} {limit}")


@dataclass
class CausalReport(_Verdict):
    """Position-by-position verdict for a causal model (docs/causal.md): ``exact_equal[j]`` says
    whether every constrained output of sequence j equals its target (``==`` on Fractions,
    rational hardmax), ``errors[j]`` its largest distance to a target in the arithmetic that
    decides (exact for hardmax; for softmax a rigorous upper bound from the float64
    enclosures or ball arithmetic),
    ``first_failure`` the first (sequence, position) shown to fail, ``undecided_positions``
    those neither shown within nor beyond the limit."""

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
    param_norm_sq: float  # ‖θ‖₂², stored positions included
    max_unit_slope: float  # the largest |u|·|w| of an FF unit
    exact_equal: list[bool] | None
    errors: list[float]  # per sequence: the largest error in the deciding arithmetic
    errors_float64: list[float]
    position_errors: list[list[float]]  # per sequence and position (0 where unconstrained)
    first_failure: tuple[int, int] | None
    coordinate_scale: float
    hardmax_margin: float | None
    hat_clearance: float | None
    tolerance: float
    undecided_positions: list[tuple[int, int]] = field(default_factory=list)
    nonfinite_sequences: list[int] = field(default_factory=list)  # float64 models: inf/nan
    measured: str = ""  # softmax: the measured (midpoint) error and the precision reached
    bound_exact: bool = False  # softmax: every constrained output shown to equal its target
    d_model: int | None = None  # the model's width, where the data (d < d_model) were padded
    position_keys: bool = False  # built from position keys (docs/causal.md#position-keys)
    keyed: bool = False  # a keyed causal model (docs/causal.md#keyed-causal-models)
    data: dict = field(default_factory=dict)  # the data given vs. built for (data_check)

    @property
    def ok(self) -> bool:
        return (self.first_failure is None and not self.undecided_positions
                and not self.nonfinite_sequences)

    @property
    def undecided(self) -> bool:
        return bool(self.undecided_positions) and self.first_failure is None and \
            not self.nonfinite_sequences

    @property
    def proved(self) -> bool:
        """Every constrained position equal to its target: under ``==`` (rational hardmax) or
        by an error bound of exactly 0 (softmax)."""
        exact = self.exact_equal is not None and all(self.exact_equal)
        return self.ok and (exact or self.bound_exact)

    def rows(self) -> list[tuple[str, str]]:
        if self.exact_equal is not None:
            how = (f"{sum(self.exact_equal)}/{self.N} sequences equal at every constrained "
                   "position (exact rational arithmetic)")
        else:
            bound = self.attention == "softmax" or "enclosures" in self.arithmetic
            how = (f"max error {'≤ ' if bound else ''}"
                   f"{fmt(worst([0.0, *self.errors]))} in {self.arithmetic} "
                   f"(limit {fmt(self.tolerance)} × scale)")
        fail = "none" if self.first_failure is None else \
            f"sequence {self.first_failure[0]}, position {self.first_failure[1]}"
        rows = [
            ("verdict", self.verdict()),
            ("interpolation", how),
            ("first failing position", fail),
            ("data", data_row(self.data)),
            ("attention", f"{self.attention}, causal"),
            ("sequences N / dimension d", f"{self.N} / {self.d}{padded(self.d_model)}"),
            ("tokens / constrained positions", f"{self.tokens} / {self.constrained}"),
            ("blocks L", f"{self.blocks}  (design ⌈moves/width⌉ = {self.blocks_design}, "
                         "position keys)" if self.position_keys else
             f"{self.blocks}  (design tagging + separation + moves = {self.blocks_design}, "
             f"keyed, R_c = {self.R})" if self.keyed else
             f"{self.blocks}  (design R_c + ⌈moves/k⌉ = {self.blocks_design}, R_c = {self.R})"),
            ("max FF width", str(self.max_width)),
            ("parameters (structured / dense)", f"{self.params} / {self.params_dense}  "
             f"(+ {self.position_params} in stored positions)"),
            ("max |θ| / ‖θ‖₂²", f"{fmt(self.max_abs_param)} / {fmt(self.param_norm_sq)}"),
            ("largest unit slope |u|·|w|", fmt(self.max_unit_slope)),
            ("float64 max error", fmt(worst([0.0, *self.errors_float64]))),
            ("smallest hardmax score margin", fmt(self.hardmax_margin)),
            ("smallest hat clearance / scale", fmt(self.hat_clearance)),
        ]
        if self.measured:
            rows.insert(2, ("measured", self.measured))
        if self.undecided_positions:
            rows.insert(3, ("undecided positions", str(self.undecided_positions[:10])))
        if self.nonfinite_sequences:
            rows.insert(3, ("non-finite float64 outputs",
                            f"sequences {self.nonfinite_sequences[:10]}"))
        return rows
