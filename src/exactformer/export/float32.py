"""The float32 verdict: does an exported model still interpolate when torch runs it in float32?"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np
import torch
from torch import nn

from ..data import CausalDataset, Dataset
from ..distance import clearance, hausdorff, relative, worst
from ..evaluate import PassStats
from ..evaluate import forward as np_forward
from ..model import Transformer
from ..runtime import range_faults
from ..tables import format_table
from ..verification.runtime_verdict import DEFAULT_TOLERANCE
from .layouts import convert, to_torch
from .native import round_model
from .run import apply

UNIT_ROUNDOFF_32 = 2.0 ** -24


@dataclass
class Float32Verdict:
    """Does the model still interpolate when run in float32?

    ``interpolates`` is decided by an actual float32 run of the module (``convert(model,
    layout, torch.float32)``; for the native layout the same as loading a float64 file with
    ``dtype=torch.float32``): the largest Hausdorff distance between a pair's outputs and its
    targets, over the coordinate scale, is at most ``tolerance``, and no number of the model
    or the data is outside float32's normal range (``range_faults``,
    docs/numerics.md#runtime-ranges). ``error_float32_file`` is the
    error of the module that a float32 *file* gives, whose parameters are rounded to float32
    (for the native layout the profiles are then exact for the rounded parameters, which can be
    much worse; for ρ/η it is ``error``). The margins (from a pass of the NumPy evaluator) say
    how much room the discrete decisions have, in units of the float32 unit roundoff u = 2⁻²⁴.
    """

    layout: str
    interpolates: bool
    error: float  # float32 run: max Hausdorff error / coordinate scale
    error_float64: float  # the same module in float64
    error_float32_file: float  # the module loaded from a float32 file, in float32
    tolerance: float
    hardmax_margin: float | None  # smallest best-minus-second score gap / score scale
    hat_clearance: float | None  # smallest distance of a token to a window / scale
    unit_roundoff: float = UNIT_ROUNDOFF_32
    # numbers of the model or data outside float32's normal range (exactformer.runtime):
    # any of them fails the verdict, whatever this data's run measured
    range_faults: list[str] = field(default_factory=list)

    def rows(self) -> list[tuple[str, str]]:
        def margin(v):
            return "n/a" if v is None else f"{v:.3g}  (= {v / self.unit_roundoff:.3g} u)"
        return [("float32 verdict", "INTERPOLATES" if self.interpolates else "FAILS"),
                ("layout", self.layout),
                ("float32 max error / scale", f"{self.error:.3g}  (tolerance {self.tolerance:g})"),
                ("float64 max error / scale", f"{self.error_float64:.3g}"),
                ("float32 file max error / scale", f"{self.error_float32_file:.3g}"),
                ("smallest hardmax score margin", margin(self.hardmax_margin)),
                ("smallest hat clearance / scale", margin(self.hat_clearance))] + \
            [("outside float32's range", fault) for fault in self.range_faults]

    def table(self) -> str:
        return format_table(self.rows())

    def to_dict(self) -> dict:
        return asdict(self)


def max_error(module: nn.Module, dataset: Dataset | CausalDataset) -> float:
    """Largest Hausdorff distance between a pair's outputs and its targets, over the scale (for
    causal data: the largest distance at a constrained position). Data narrower than the
    module are zero-padded, inputs and targets (:func:`apply`)."""
    return output_error(apply(module, dataset.floats()[0]), dataset)


def output_error(outs: list[np.ndarray], dataset: Dataset | CausalDataset) -> float:
    """:func:`max_error` of outputs already computed (one float64 array per sequence, n_j × D):
    the targets are zero-padded to the outputs' width D, so extra coordinates count. A nan or
    inf output anywhere gives a nan or inf error (:func:`~exactformer.distance.worst`)."""
    dataset = dataset.padded(outs[0].shape[1])
    ys = dataset.floats()[1]
    if isinstance(dataset, CausalDataset):
        errors = [float(np.linalg.norm(o[i] - y[i])) for o, y, k in
                  zip(outs, ys, dataset.known, strict=True) for i in np.flatnonzero(k)]
        return relative(worst([0.0, *errors]), dataset.coordinate_scale())
    return relative(worst(hausdorff(o, y) for o, y in zip(outs, ys, strict=True)),
                    dataset.coordinate_scale())


def float32_verdict(model: Transformer, dataset: Dataset, layout: str = "native",
                    tolerance: float = DEFAULT_TOLERANCE, device=None) -> Float32Verdict:
    """Run ``model`` exported in ``layout`` in float32 and float64 on ``dataset`` (zero-padded
    to the model's width), and collect the evaluator's margins (exact arithmetic for exact
    hardmax models, else float64). The default tolerance is the runtime proofs' (1e-5 × the
    data's scale), so that a run and a proof of float32 judge by one standard."""
    dataset = dataset.padded(model.d)
    stats = PassStats()
    exact = model.exact and model.attention == "hardmax"
    inputs = dataset.fractions()[0] if exact else dataset.floats()[0]
    np_forward(model, inputs, "exact" if exact else "float", stats=stats)
    err32 = max_error(convert(model, layout, torch.float32, device), dataset)
    err64 = max_error(convert(model, layout, torch.float64, device), dataset)
    err_file = err32 if layout != "native" else \
        max_error(to_torch(round_model(model, torch.float32), torch.float32, device), dataset)
    faults = range_faults(model, "float32", dataset)
    return Float32Verdict(layout, bool(err32 <= tolerance) and not faults, err32, err64,
                          err_file, tolerance, stats.hardmax_margin,
                          clearance(stats, dataset.coordinate_scale()), range_faults=faults)
