"""The circuit of a model on its data: per pair (set data) or per constrained position
(causal data) the TransformerLens units and heads it uses, with their roles, and the readout.

A unit is *used* by pair j when its activation is nonzero on some token of sequence j (for a
causal position (j, t): on some token s ≤ t), and a head when its output V_h·(average) is
nonzero there, both in the exact evaluation of :mod:`.trace`. So zero-ablating any set of
units and heads leaves every pair that uses none of them exactly as it was; the circuit says
nothing about how much a used unit matters. Names are the TL layout's hook names
(:mod:`exactformer.lens_plan`); the document's schema is docs/circuit.md.
"""

from __future__ import annotations

import numpy as np

from ..data import CausalDataset, Dataset
from ..lens_plan import layer_blocks, part_units, plan, stream_halves, turns
from ..model import Transformer
from .trace import ROLE_OF_PHASE, Trace, trace

FORMAT = "exactformer.circuit/1"


def mlp_hook(block: int) -> str:
    return f"blocks.{block}.mlp.hook_post"


def pattern_hook(block: int) -> str:
    return f"blocks.{block}.attn.hook_pattern"


def lens_shape(model: Transformer) -> dict:
    """The TL layout's n_layers, d_model, d_mlp and n_heads (as ``lens_config`` sets them)."""
    layers = plan(model)
    return {"n_layers": len(layers), "d_model": model.d * (2 if turns(model) else 1),
            "d_mlp": max(1, max((part_units(p, model.d) for x in layers for p in x.mlp),
                                default=0)),
            "n_heads": max(1, model.max_heads())}


def readout(model: Transformer, d: int) -> dict:
    """Where the output is: the last block's residual stream, ``stream`` coordinates (the
    half that holds the tokens), which the unembedding copies to logits 0..d−1; logits
    d..D−1 are the model's own coordinates, exactly 0 on its data."""
    shape = lens_shape(model)
    start = stream_halves(model)[-1] * model.d
    return {"hook": f"blocks.{shape['n_layers'] - 1}.hook_resid_post",
            "stream": [start, start + d], "logits": [0, d], "zero_logits": [d, model.d]}


def used(tr: Trace, causal: bool) -> list[tuple[dict, dict]]:
    """For each traced sequence: (units, heads), each a map hook → boolean array (n_j, units)
    or (n_j, heads), row t true where the unit or head is nonzero on some token ≤ t (causal)
    or on any token (set: every row the same)."""
    out = []
    for k in range(len(tr.sequences)):
        units = {mlp_hook(m.block): _spread(m.acts[k] != 0, causal) for m in tr.mlps}
        heads = {pattern_hook(a.block): _spread((a.outputs[k] != 0).any(axis=2).T, causal)
                 for a in tr.attns}
        out.append((units, heads))
    return out


def _spread(nz: np.ndarray, causal: bool) -> np.ndarray:
    nz = np.asarray(nz, dtype=bool)
    if causal:
        return np.logical_or.accumulate(nz, axis=0) if len(nz) else nz
    return np.broadcast_to(nz.any(axis=0), nz.shape)


def _listed(flags: dict, row: int) -> dict:
    """hook → the indices set in ``row`` (hooks with none left out)."""
    out = {}
    for hook, f in flags.items():
        idx = np.flatnonzero(f[row]).tolist() if len(f) else []
        if idx:
            out[hook] = idx
    return out


def circuit(model: Transformer, data: Dataset | CausalDataset, dps: int = 50) -> dict:
    """The ``circuit.json`` document of ``model`` on ``data`` (docs/circuit.md)."""
    causal = isinstance(data, CausalDataset)
    tr = trace(model, data, dps=dps)
    flags = used(tr, causal)
    doc = {"format": FORMAT, "arithmetic": "exact" if tr.arithmetic == "exact" else f"mp{dps}",
           "model": _model_fields(model, data), "readout": readout(model, data.d),
           "phases": phases(model), "units": _units(tr), "heads": _heads(tr)}
    entries = []
    for j, (units, heads) in enumerate(flags):
        rows = np.flatnonzero(data.known[j]).tolist() if causal else [0]
        for t in rows:
            where = {"sequence": j, "position": t} if causal else {"pair": j}
            entries.append(where | {"units": _listed(units, t), "heads": _listed(heads, t)})
    doc["positions" if causal else "pairs"] = entries
    doc["unused"] = _unused(model, entries)
    doc["patch"] = patch_point(model)
    return doc


def patch_point(model: Transformer) -> dict | None:
    """Where one pair's activations replace another's wholesale: the last attention layer,
    when it is not residual (ρ = 0, the collapse). Its turn units erase the token half and its
    heads write the other, and every later layer reads one token, so patching every head's
    ``hook_z`` there from pair j's run into pair k's (of the same length) makes k's outputs
    j's, token by token. None where the last attention keeps ρ·x."""
    layers = plan(model)
    last = max((i for i, x in enumerate(layers) if x.attn is not None), default=None)
    if last is None or layers[last].attn.rho != 0:
        return None
    heads = list(range(len(layers[last].attn.heads)))
    return {"hook": f"blocks.{last}.attn.hook_z", "heads": heads,
            "predicts": "the receiving pair's outputs become the giving pair's, token by token"}


def _model_fields(model: Transformer, data) -> dict:
    rec = model.record
    construction = None if rec is None else ("keyed" if rec.keyed is not None else "paper")
    if rec is not None and getattr(rec, "position_code", None) is not None:
        construction = "position-keys"
    return {"construction": construction, "kind": None if rec is None else rec.kind,
            "attention": model.attention, "causal": model.causal, "blocks": model.n_blocks,
            "d": data.d, "D": model.d, "data_sha256": data.sha256(), **lens_shape(model)}


def phases(model: Transformer) -> list[dict]:
    """The record's phases with our block ranges (cut to the model's blocks) and the TL
    blocks that hold them."""
    where = layer_blocks(model)
    out = []
    for span in (model.record.phases if model.record is not None else []):
        lo, hi = min(span.start, model.n_blocks), min(span.end, model.n_blocks)  # a record
        tl = [i for b in range(lo, hi) for i in where[b] if i is not None]  # is input too
        out.append({"name": span.name, "role": ROLE_OF_PHASE.get(span.name, span.name),
                    "model_blocks": [lo, hi],
                    "blocks": [min(tl), max(tl) + 1] if tl else None})
    return out


def _units(tr: Trace) -> dict:
    return {mlp_hook(m.block): {"model_block": m.model_block, "phase": m.phase,
                                "roles": m.roles} for m in tr.mlps}


def _heads(tr: Trace) -> dict:
    return {pattern_hook(a.block): {"model_block": a.model_block, "phase": a.phase,
                                    "heads": len(a.patterns[0]) if a.patterns else 0}
            for a in tr.attns}


def _unused(model: Transformer, entries: list[dict]) -> dict:
    """Every TL unit (padding units included) and head that no entry uses."""
    shape = lens_shape(model)
    units, heads = {}, {}
    for i in range(shape["n_layers"]):
        seen = {u for e in entries for u in e["units"].get(mlp_hook(i), [])}
        free = [u for u in range(shape["d_mlp"]) if u not in seen]
        if free:
            units[mlp_hook(i)] = free
        seen = {h for e in entries for h in e["heads"].get(pattern_hook(i), [])}
        free = [h for h in range(shape["n_heads"]) if h not in seen]
        if free:
            heads[pattern_hook(i)] = free
    return {"units": units, "heads": heads}


CIRCUIT_FILE = "circuit.json"
AUTO_WORK = 10 ** 7  # about 30 s of exact trace on the development machine (docs/circuit.md)


def circuit_text(model: Transformer, data: Dataset | CausalDataset) -> str:
    """``circuit.json``'s text, as the exporters write it beside the weights."""
    import json

    return json.dumps(circuit(model, data), separators=(",", ":"))


def trace_work(model: Transformer, data: Dataset | CausalDataset) -> int:
    """About how many exact multiply-adds the circuit's trace takes: every FF unit on every
    token (D each) and every head's scores and average (n_j² per sequence, D each). The CLI
    writes circuit.json unasked only up to :data:`AUTO_WORK` (docs/circuit.md)."""
    tokens = sum(len(x) for x in data.inputs)
    pairs = sum(len(x) ** 2 for x in data.inputs)
    work = 0
    for layer in plan(model):
        work += sum(part_units(p, model.d) for p in layer.mlp) * tokens * model.d
        if layer.attn is not None:
            work += len(layer.attn.heads) * pairs * model.d
    return work


def wanted(model: Transformer, data, asked: bool | None) -> bool:
    """Whether an exporter writes circuit.json: as ``asked``, or when None (the default)
    whenever there are data and their trace is at most :data:`AUTO_WORK`."""
    if data is None:
        return False
    return trace_work(model, data) <= AUTO_WORK if asked is None else asked
