"""The JSON model formats ``exactformer.model/1`` and ``/2`` (README) and atomic writes.

Every number is a string that ``fractions.Fraction`` parses exactly. Float64 models write each
float's shortest round-trip repr and record ``"number": "float64"`` so that loading restores the
same floats; rational models write "p/q" strings. ``"ff": null`` / ``"sa": null`` are identities.
"""

from __future__ import annotations

import json
import os
import tempfile
from contextlib import contextmanager
from fractions import Fraction
from pathlib import Path

import numpy as np

from .model import FF, SA, Block, ScoreMatrix, Transformer, ValueMatrix
from .numbers import fmt
from .record import CausalConstruction, Construction, RecordError, record_from_meta

FORMAT = "exactformer.model/1"
FORMAT_2 = "exactformer.model/2"  # adds "causal" and "positions" (docs/causal.md)


class ModelFormatError(ValueError):
    """A model file does not follow ``exactformer.model/1``; the message says where."""


@contextmanager
def atomic_path(path: str | Path):
    """Yield a temporary path beside ``path``; move it into place only if the body succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes owner-only files; use normal permissions
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_text_atomic(path: str | Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def model_to_dict(model: Transformer) -> dict:
    def vec(a):
        return [fmt(v) for v in a]

    def mat(a):
        return [vec(row) for row in a]

    blocks = []
    for b in model.blocks:
        ff = None if b.ff is None else {"eta": fmt(b.ff.eta), "U": mat(b.ff.U), "b": vec(b.ff.b),
                                        "W": mat(b.ff.W)}
        sa = None if b.sa is None else {
            "rho": fmt(b.sa.rho),
            "A": {"alpha": fmt(b.sa.A.alpha), "a": vec(b.sa.A.a), "c": vec(b.sa.A.c)},
            "V": {"beta": fmt(b.sa.V.beta), "p": vec(b.sa.V.p), "q": vec(b.sa.V.q)}}
        blocks.append({"ff": ff, "sa": sa})
    v2 = model.causal or model.positions is not None
    doc = {"format": FORMAT_2 if v2 else FORMAT, "d": model.d, "attention": model.attention,
           "number": "rational" if model.exact else "float64"}
    if model.attention == "softmax":
        doc["tau"] = fmt(model.tau)
    if model.causal:
        doc["causal"] = True
    if model.positions is not None:
        doc["positions"] = mat(model.positions)
    doc["blocks"] = blocks
    doc["meta"] = model.meta
    return doc


def save_model(model: Transformer, path: str | Path) -> None:
    """Write the model as JSON; nothing is left at ``path`` if writing fails."""
    write_text_atomic(path, json.dumps(model_to_dict(model), separators=(",", ":")))


def load_model(path: str | Path) -> Transformer:
    try:
        doc = json.loads(Path(path).read_text())
    except json.JSONDecodeError as e:
        raise ModelFormatError(f"{path}: not valid JSON ({e})") from None
    return model_from_dict(doc)


def model_from_dict(doc: dict) -> Transformer:
    if not isinstance(doc, dict) or doc.get("format") not in (FORMAT, FORMAT_2):
        raise ModelFormatError(f"expected \"format\": \"{FORMAT}\" or \"{FORMAT_2}\"")
    d = doc.get("d")
    if not isinstance(d, int) or d < 1:
        raise ModelFormatError("\"d\" must be a positive integer")
    attention = doc.get("attention")
    if attention not in ("hardmax", "softmax"):
        raise ModelFormatError("\"attention\" must be \"hardmax\" or \"softmax\"")
    exact = doc.get("number", "rational") != "float64"

    def num(s, where):
        try:
            if not isinstance(s, str):
                raise ValueError
            f = Fraction(s)
        except (ValueError, ZeroDivisionError):
            raise ModelFormatError(f"{where}: {s!r} is not an exact number string") from None
        if exact:
            return f
        try:  # float() keeps the sign of "-0.0", which Fraction cannot carry
            return float(s)
        except ValueError:
            return float(f)

    def obj(x, where, nullable=False):
        if x is None and nullable:
            return None
        if not isinstance(x, dict):
            raise ModelFormatError(f"{where}: expected an object, got {x!r}"[:200])
        return x

    def vec(a, n, where):
        if not isinstance(a, list) or len(a) != n:
            raise ModelFormatError(f"{where}: expected a list of {n} numbers")
        out = np.empty(n, dtype=object if exact else float)
        out[:] = [num(v, where) for v in a]
        return out

    def mat(a, rows, cols, where):
        if not isinstance(a, list) or (rows is not None and len(a) != rows):
            raise ModelFormatError(f"{where}: expected {rows} rows")
        out = np.empty((len(a), cols), dtype=object if exact else float)
        for i, row in enumerate(a):
            out[i] = vec(row, cols, f"{where}[{i}]")
        return out

    raw_blocks = doc.get("blocks")
    if not isinstance(raw_blocks, list):
        raise ModelFormatError("\"blocks\" must be a list of blocks")
    blocks = []
    for i, b in enumerate(raw_blocks):
        where = f"blocks[{i}]"
        b = obj(b, where)
        ff = sa = None
        f = obj(b.get("ff"), f"{where}.ff", nullable=True)
        if f is not None:
            U = mat(f.get("U"), None, d, f"{where}.ff.U")
            w = U.shape[0]
            ff = FF(num(f.get("eta"), f"{where}.ff.eta"), U, vec(f.get("b"), w, f"{where}.ff.b"),
                    mat(f.get("W"), d, w, f"{where}.ff.W"))
        s = obj(b.get("sa"), f"{where}.sa", nullable=True)
        if s is not None:
            A, V = obj(s.get("A"), f"{where}.sa.A"), obj(s.get("V"), f"{where}.sa.V")
            sa = SA(num(s.get("rho"), f"{where}.sa.rho"),
                    ScoreMatrix(num(A.get("alpha"), f"{where}.sa.A.alpha"),
                            vec(A.get("a"), d, f"{where}.sa.A.a"),
                            vec(A.get("c"), d, f"{where}.sa.A.c")),
                    ValueMatrix(num(V.get("beta"), f"{where}.sa.V.beta"),
                            vec(V.get("p"), d, f"{where}.sa.V.p"),
                            vec(V.get("q"), d, f"{where}.sa.V.q")))
        blocks.append(Block(ff, sa))
    tau = None
    if attention == "softmax":
        tau = num(doc.get("tau"), "tau")
        if tau <= 0:
            raise ModelFormatError("\"tau\" must be positive")
    causal, positions = _causal_fields(doc, lambda a, where: mat(a, None, d, where))
    return Transformer(d=d, attention=attention, blocks=blocks, tau=tau, exact=exact,
                       causal=causal, positions=positions,
                       record=_record(doc.get("meta", {}), len(blocks)))


def _record(meta, n_blocks: int) -> Construction | CausalConstruction | None:
    """The construction record in ``"meta"`` (None when it records no construction)."""
    if not isinstance(meta, dict):
        raise ModelFormatError("\"meta\" must be an object")
    if "construction" not in meta:
        return None
    try:
        record = record_from_meta(meta)
    except RecordError as e:
        raise ModelFormatError(str(e)) from None
    for p in record.phases:
        if p.end > n_blocks:
            raise ModelFormatError(f"meta.phases.{p.name}: ends at block {p.end}, but the "
                                   f"model has {n_blocks} blocks")
    return record


def _causal_fields(doc: dict, matrix) -> tuple[bool, np.ndarray | None]:
    """``"causal"`` (a boolean) and ``"positions"`` (rows of d numbers): /2 fields only."""
    present = [k for k in ("causal", "positions") if k in doc]
    if present and doc["format"] == FORMAT:
        raise ModelFormatError(f"\"{present[0]}\" is not part of {FORMAT}; a file that uses it "
                               f"says \"format\": \"{FORMAT_2}\"")
    causal = doc.get("causal", False)
    if not isinstance(causal, bool):
        raise ModelFormatError("\"causal\" must be true or false")
    raw = doc.get("positions")
    if raw is None:
        return causal, None
    if not isinstance(raw, list) or not raw:
        raise ModelFormatError("\"positions\" must be a non-empty list of rows of d numbers")
    return causal, matrix(raw, "positions")
