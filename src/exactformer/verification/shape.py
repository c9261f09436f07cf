"""What a report says about the model's size: block bounds, widths, parameter counts.

These fields describe the model and the data, not the verdict (docs/verification.md#the-report,
docs/heads.md for the bounds).
"""

from __future__ import annotations

import math

from ..conditioning import conditioning
from ..construct.hardmax import hats_per_layer
from ..data import Dataset
from ..model import Transformer


def hats_of(model: Transformer) -> int:
    """k: the hats the model's widest FF layer holds (width/4, at least 1; a width that is
    not a multiple of 4 is rounded down)."""
    return hats_per_layer(max(4, model.max_width() // 4 * 4))


def paper_bound(attention: str, N: int, sum_m: int) -> int:
    """Block count of Alcalde–Fantuzzi–Zuazua: 2Σm+2N+1 (hardmax), 2Σm+3N (softmax)."""
    return 2 * sum_m + 2 * N + 1 if attention == "hardmax" else 2 * sum_m + 3 * N


def design_bound(model: Transformer, N: int, sum_m: int, k: int | None = None) -> int | None:
    """The construction's block count with k = width/4 hats per layer (default: the model's):
    R + (1 + ⌈(M − 1)/k⌉ leader layers, 1 when M = Σm − N = 0) + ⌈Σm/k⌉, plus the softmax
    projection; see docs/heads.md. A keyed model: the blocks of its phases (tagging,
    separation, collapse, interpolation; docs/keyed.md#size)."""
    if model.record is None:
        return None
    if getattr(model.record, "keyed", None) is not None:  # causal records have none
        return sum(p.end - p.start for p in model.record.phases)
    k = hats_of(model) if k is None else k
    R, moves = model.record.R, sum_m - N
    extra = 1 if model.attention == "softmax" else 0
    leaders = 1 + -(-(moves - 1) // k) if moves > 0 else 1
    return R + leaders + extra + -(-sum_m // k)


def width_bounds(model: Transformer, N: int, sum_m: int) -> tuple[int | None, int | None]:
    """The width-4 bound L₄ (this build's R) and the target R + ⌈(L₄ − R)/k⌉."""
    L4 = design_bound(model, N, sum_m, k=1)
    if L4 is None or model.record.keyed is not None:  # no hats: the bound does not apply
        return None, None
    R = model.record.R
    return L4, R + -(-(L4 - R) // hats_of(model))


def model_fields(model: Transformer, dataset: Dataset) -> dict:
    """The report's fields that describe the model and the data, not the verdict."""
    L4, L4k = width_bounds(model, dataset.N, dataset.total_m)
    cond = conditioning(model)
    return dict(
        attention=model.attention, N=dataset.N, **dimensions(dataset), sum_m=dataset.total_m,
        total_tokens=dataset.total_n, blocks=model.n_blocks,
        blocks_paper=paper_bound(model.attention, dataset.N, dataset.total_m),
        blocks_design=design_bound(model, dataset.N, dataset.total_m),
        max_width=model.max_width(), max_heads=model.max_heads(), blocks_width4=L4,
        blocks_width_target=L4k, structured=structured(model), params=model.n_params(),
        params_dense=model.n_params_dense(), max_abs_param=cond.max_abs,
        param_l2=math.sqrt(cond.norm_sq), param_norm_sq=cond.norm_sq,
        max_unit_slope=cond.max_slope)


def causal_sizes(model: Transformer, dataset) -> dict:
    """The dimensions and conditioning fields of a causal report
    (docs/numerics.md#conditioning)."""
    cond = conditioning(model)
    return dict(**dimensions(dataset), max_abs_param=cond.max_abs, param_norm_sq=cond.norm_sq,
                max_unit_slope=cond.max_slope)


def dimensions(dataset) -> dict:
    """``d``, the data's own dimension, and ``d_model``, the model's width where the data were
    zero-padded to it (``Dataset.padded``), else None."""
    if dataset.padded_from is None:
        return dict(d=dataset.d, d_model=None)
    return dict(d=dataset.padded_from, d_model=dataset.d)


def structured(model: Transformer) -> bool:
    """Every head's A and V is s·I + u·vᵀ with d-vectors (FF widths are reported apart)."""
    d = model.d
    return all(v.shape == (d,) for b in model.blocks if b.sa is not None for h in b.sa.heads
               for v in (h.A.a, h.A.c, h.V.p, h.V.q))
