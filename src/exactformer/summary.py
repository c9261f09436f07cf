"""What a model is, in one list of rows: ``exactformer info`` prints it as a table and the model
card of a Hub folder (``export.hub``) as a Markdown table, so the two always agree."""

from __future__ import annotations

from .lens_plan import lens_shape
from .model import Transformer
from .runtime import range_faults

LICENCE = "MIT"  # exactformer's licence, as pyproject.toml declares it
PAPER = ("Alcalde, Fantuzzi, Zuazua, \"Exact Sequence Interpolation with Transformers\", "
         "arXiv:2502.02270")
RECORDED = ("construction", "seed", "N", "sum_m", "constrained", "R", "moves", "phases")


def model_summary(model: Transformer) -> list[tuple[str, str]]:
    """(label, value) rows: the model's kind and shape, its construction record and the data
    it was built for (their sha256), and what ``verify`` can decide for a model of its kind."""
    rows = [("attention", model.attention), ("d", model.d),
            ("parameters", "rational" if model.exact else "float64"),
            ("blocks", model.n_blocks), ("max FF width", model.max_width()),
            ("n_layers × d_model × d_mlp × n_heads",
             f"{model.n_blocks} × {model.d} × {model.max_width()} × {model.max_heads()}"),
            ("TransformerLens export, the same", " × ".join(map(str, lens_shape(model)))),
            ("max attention heads", model.max_heads()),
            ("parameters (structured / dense)", f"{model.n_params()} / {model.n_params_dense()}")]
    if model.tau is not None:
        rows.append(("tau", model.tau))
    if model.causal or model.positions is not None:
        rows.append(("causal", "yes" if model.causal else "no"))
        rows.append(("stored positions", 0 if model.positions is None else len(model.positions)))
    meta = model.meta
    rows += [(key, meta[key]) for key in RECORDED if key in meta]
    if "data_sha256" in meta:
        rows.append(("data sha256", meta["data_sha256"]))
    rows.append(("verify decides", decides(model)))
    return [(label, str(value)) for label, value in rows]


def decides(model: Transformer) -> str:
    """What ``verify`` can establish for a model of this kind (docs/verification.md)."""
    if model.attention == "hardmax":
        how = ("exact equality with the targets in rational arithmetic (PROVED EXACT)"
               if model.exact else "the exact value of the stored floats against a tolerance")
    else:
        how = ("a rigorous ball-arithmetic bound, PROVED EXACT where it closes" if model.exact
               else "a rigorous ball-arithmetic bound against a tolerance")
    keyed = model.record is not None and getattr(model.record, "keyed", None) is not None
    if not keyed:
        return how
    # the keyed claim holds only while the stored numbers are normal float32 numbers: data
    # at 1e30 give A.alpha = 2.4e-63, 0 in float32, and a float32 pass misses by 1.3 × scale
    faults = range_faults(model, "float32")
    if faults:
        return how + "; keyed, but NOT exact in float32: " + "; ".join(faults)
    return how + "; keyed: exact to float32 rounding in a plain float32 pass"
