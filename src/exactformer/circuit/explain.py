"""One pair's path through a model, phase by phase (``exactformer explain``, ``ef.explain``).

For pair j (or causal position (j, t)): each phase's TL blocks, the units that are nonzero on
the pair's tokens with their values and what they write, the heads whose output is nonzero
with the keys each token attends to, and the tokens' states where the phase ends; for keyed
models also the tags, signatures, leaders and moves those states show (docs/keyed.md). Every
number comes from the checked exact pass of :mod:`.trace`; names are TL hook names
(docs/circuit.md#explain).
"""

from __future__ import annotations

from fractions import Fraction

import mpmath
import numpy as np

from ..data import CausalDataset, Dataset
from ..model import Transformer
from ..numbers import pad_columns
from .document import mlp_hook, pattern_hook, phases, readout
from .trace import Trace, trace


def explain(model: Transformer, data: Dataset | CausalDataset, pair: int | None = None,
            position: tuple[int, int] | None = None, dps: int = 50) -> dict:
    """The path of pair ``pair`` (set data) or of ``position`` = (j, t) (causal data) as a
    JSON-ready dict (docs/circuit.md#explain). Exactly one of the two is given."""
    causal = isinstance(data, CausalDataset)
    j, t = _which(data, causal, pair, position)
    tr = trace(model, data, [j], dps)
    n = len(data.inputs[j]) if t is None else t + 1
    names = coordinate_names(model, data.d)
    out = {"pair": j} if t is None else {"sequence": j, "position": t}
    out |= {"arithmetic": tr.arithmetic, "tokens": [_row(x) for x in data.inputs[j][:n]],
            "readout": readout(model, data.d)}
    out["phases"] = [_phase(tr, p, n, names) for p in phases(model)] or \
        [_phase(tr, {"name": "all", "role": "all", "model_blocks": [0, model.n_blocks],
                     "blocks": None}, n, names)]
    final = tr.states[-1][0][:n]
    targets = pad_columns([data.targets[j]], model.d)[0]
    got = [_row(y[: data.d]) for y in final]
    if causal:
        out |= {"output": got[t], "target": _row(data.targets[j][t])}
        mine, theirs = final[t:t + 1], targets[t:t + 1]
    else:
        out |= {"outputs": got, "targets": [_row(y) for y in data.targets[j]]}
        mine, theirs = final, targets
    out["exact"] = _equal(mine, theirs, causal) if tr.arithmetic == "exact" else None
    out["error"] = _num(_gap(mine, theirs, causal))
    if model.record is not None and model.record.keyed is not None:
        out["keyed"] = _keyed_summary(tr, model, data.d, n)
    return out


def _equal(mine: np.ndarray, theirs: np.ndarray, causal: bool) -> bool:
    """Exact outputs against exact targets (zero-padded): row by row (causal) or as sets."""
    rows = [tuple(Fraction(v) if isinstance(v, float) else v for v in r) for r in theirs]
    if causal:
        return bool((mine == np.asarray(rows, dtype=object)).all())
    return {tuple(r) for r in mine} == set(rows)


def _gap(mine: np.ndarray, theirs: np.ndarray, causal: bool):
    """The largest coordinate difference between outputs and targets (causal: position by
    position; set: Hausdorff in the max norm), in the pass's numbers."""
    def dist(a, b):
        return max(abs(x - (Fraction(y) if isinstance(y, float) else y))
                   for x, y in zip(a, b, strict=True))
    if causal:
        return max(dist(a, b) for a, b in zip(mine, theirs, strict=True))
    return max(max(min(dist(a, b) for b in theirs) for a in mine),
               max(min(dist(a, b) for a in mine) for b in theirs))


def _which(data, causal: bool, pair, position) -> tuple[int, int | None]:
    if (pair is None) == (position is None):
        raise ValueError("explain takes a pair (set data) or a position j,t (causal data)")
    if causal:
        if position is None:
            raise ValueError("causal data: explain takes --position j,t, not --pair")
        j, t = position
        if not (0 <= j < data.N and 0 <= t < len(data.inputs[j])):
            raise ValueError(f"position {j},{t}: no such token (sequences 0..{data.N - 1})")
        return j, t
    if position is not None:
        raise ValueError("set data: explain takes --pair j, not --position")
    if not 0 <= pair < data.N:
        raise ValueError(f"pair {pair}: the data have pairs 0..{data.N - 1}")
    return pair, None


def coordinate_names(model: Transformer, d: int) -> list[str]:
    """Names of the model's D coordinates: x0.. for the data's, then for keyed models one,
    σ1, σ2, mark (docs/keyed.md#coordinates), and c<k> for any other."""
    names = [f"x{c}" if c < d else f"c{c}" for c in range(model.d)]
    if model.record is not None and model.record.keyed is not None:
        for k, name in enumerate(("one", "σ1", "σ2", "mark")):
            if d + k < model.d:
                names[d + k] = name
    return names


def _num(v) -> str:
    """A number as text, exactly: exact ones (Fraction, int, the pass's mpq) as p/q, or as the
    float64 they equal when they are one with a denominator above 2^10 (float data read
    exactly); floats as Python writes them; mpmath ones to 17 digits."""
    if isinstance(v, float):
        return repr(float(v))
    if isinstance(v, (Fraction, int, np.integer)) or type(v).__name__ == "mpq":
        q = Fraction(int(v.numerator), int(v.denominator))
        if q.denominator > 1024 and abs(q) < 2 ** 1000 and Fraction(float(q)) == q:
            return repr(float(q))
        return str(q)
    return mpmath.nstr(v, 17)


def _row(x) -> list[str]:
    return [_num(v) for v in x]


def _sparse(vec, names) -> dict:
    return {names[c]: _num(v) for c, v in enumerate(vec) if v != 0}


def _phase(tr: Trace, p: dict, n: int, names: list[str]) -> dict:
    """One phase: its active units and heads in layer order, and the states at its end."""
    lo, hi = p["model_blocks"]
    steps = []
    for layer in sorted(tr.mlps + tr.attns, key=lambda x: (x.block, hasattr(x, "acts"))):
        if lo <= layer.model_block < hi:
            steps += _mlp_steps(layer, n, names) if hasattr(layer, "acts") else \
                _head_steps(layer, n, names)
    states = tr.states[hi][0][:n]
    return {"name": p["name"], "role": p["role"], "blocks": p["blocks"], "steps": steps,
            "states": [_sparse(x, names) for x in states]}


def _mlp_steps(m, n: int, names) -> list[dict]:
    A = m.acts[0][:n]
    out = []
    for u in range(A.shape[1]):
        values = {str(i): _num(v) for i, v in enumerate(A[:, u]) if v != 0}
        if values:
            step = {"hook": mlp_hook(m.block), "unit": u, "role": m.roles[u],
                    "model_block": m.model_block, "values": values}
            if m.writes is not None and u < m.writes.shape[1]:
                step["writes"] = _sparse(m.writes[:, u], names)
            out.append(step)
    return out


def _head_steps(a, n: int, names) -> list[dict]:
    P, O = a.patterns[0][:, :n, :n], a.outputs[0][:, :n]
    out = []
    for h in range(len(P)):
        if not O[h].any():
            continue
        attends = {str(i): {str(k): _num(w) for k, w in enumerate(P[h, i]) if w != 0}
                   for i in range(n)}
        out.append({"hook": pattern_hook(a.block), "head": h, "model_block": a.model_block,
                    "attends": attends,
                    "output": {str(i): _sparse(O[h, i], names) for i in range(n)
                               if O[h, i].any()}})
    return out


def _keyed_summary(tr: Trace, model: Transformer, d: int, n: int) -> dict:
    """What the keyed phases did to these tokens, read off the states (docs/keyed.md):
    tagged tokens (mark = 1 after the tagging), each token's signature (σ1, σ2) after the
    separation, its leader (the collapse head's key) and the moves that wrote its output."""
    rec = model.record
    out: dict = {}

    def state(span):  # the states where a phase ends (a record is input: cut to the blocks)
        return tr.states[min(span.end, model.n_blocks)][0][:n]

    tag = rec.phase("tagging")
    if tag is not None and d + 3 < model.d:
        out["tagged"] = [i for i, x in enumerate(state(tag)) if x[d + 3] == 1]
    sep = rec.phase("separation")
    if sep is not None:
        out["signatures"] = [[_num(x[d + 1]), _num(x[d + 2])] for x in state(sep)]
    col = rec.phase("collapse")
    heads = [a for a in tr.attns if col is not None and col.start <= a.model_block < col.end]
    if heads:
        P = heads[0].patterns[0][0, :n, :n]
        out["leaders"] = {str(i): [k for k in range(n) if P[i, k] != 0] for i in range(n)}
        out["collapse_head"] = {"hook": pattern_hook(heads[0].block), "head": 0}
    out["moves"] = _moves(tr, rec.phase("interpolation"), d, n)
    return out


def _moves(tr: Trace, phase, d: int, n: int) -> list[dict]:
    """Each unit of the interpolation that writes the data coordinates, is on for some token
    and is no reset (a one-sequence softmax model resets its data there, docs/keyed.md): the
    tokens, and per token what it adds to the data (weight times activation)."""
    out = []
    for m in tr.mlps:
        if phase is None or m.model_block < phase.start or m.writes is None:
            continue
        for u in (u for u in range(m.writes.shape[1]) if m.roles[u] != "reset"):
            on = [i for i in range(n) if m.acts[0][i, u] != 0]
            data = [c for c in range(d) if m.writes[c, u] != 0]
            if on and data:
                out.append({"hook": mlp_hook(m.block), "unit": u, "tokens": on,
                            "writes": {str(i): {f"x{c}": _num(m.writes[c, u] * m.acts[0][i, u])
                                                for c in data} for i in on}})
    return out


def render(doc: dict) -> str:
    """The explanation as text, one line a unit or head (the ``explain`` command's output)."""
    who = f"pair {doc['pair']}" if "pair" in doc else \
        f"sequence {doc['sequence']}, position {doc['position']}"
    lines = [f"{who}: tokens {_tokens(doc['tokens'])}  ({doc['arithmetic']} arithmetic)"]
    for p in doc["phases"]:
        lines.append(f"\n== {p['name']} (TL blocks {p['blocks']}) ==")
        for s in p["steps"]:
            if "unit" in s:
                w = ", ".join(f"{k} {v}" for k, v in s.get("writes", {}).items())
                vals = ", ".join(f"t{i}={v}" for i, v in s["values"].items())
                lines.append(f"  {s['hook']}[{s['unit']}] {s['role']}: {vals}"
                             + (f"  -> writes {w}" if w else ""))
            else:
                att = "; ".join(f"t{i}->{','.join('t' + k for k in ks)}"
                                for i, ks in s["attends"].items())
                lines.append(f"  {s['hook']}[head {s['head']}]: {att}")
    if "keyed" in doc:
        k = doc["keyed"]
        lines.append("\n== keyed summary ==")
        for key in ("tagged", "signatures", "leaders"):
            if key in k:
                lines.append(f"  {key}: {k[key]}")
        for m in k.get("moves", []):
            lines.append(f"  move {m['hook']}[{m['unit']}] on tokens {m['tokens']}: "
                         f"{m['writes']}")
    out = doc.get("outputs") or [doc.get("output")]
    verdict = {True: "EXACT", False: f"NOT EXACT (off by {doc['error']})",
               None: f"off by {doc['error']} ({doc['arithmetic']} arithmetic: no exact "
                     "equality decided)"}[doc["exact"]]
    lines.append(f"\noutput {_tokens(out)}  target "
                 f"{_tokens(doc.get('targets') or [doc.get('target')])}  {verdict}")
    lines.append(f"readout: {doc['readout']['hook']} coordinates "
                 f"{doc['readout']['stream'][0]}..{doc['readout']['stream'][1] - 1}")
    return "\n".join(lines)


def _tokens(rows) -> str:
    return " ".join("(" + ", ".join(r) + ")" for r in rows)
