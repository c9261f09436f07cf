"""The model formats ``exactformer.model/1`` and ``/2`` (README), as JSON or, for float64
models, as an .npz companion; and atomic writes.

JSON: every number is a string that ``fractions.Fraction`` parses exactly. Float64 models write
each float's shortest round-trip repr and record ``"number": "float64"`` so that loading restores
the same floats; rational models write "p/q" strings. ``"ff": null`` / ``"sa": null`` are
identities. NPZ (float64 only): the same header as a JSON string and the parameters of all
blocks concatenated into a few float64 arrays (see ``NPZ_KEYS`` and the README).
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import signal
import stat
import tempfile
import threading
import zipfile
from contextlib import contextmanager
from itertools import chain
from pathlib import Path

import numpy as np

from .model import FF, SA, Block, Head, ScoreMatrix, Transformer, ValueMatrix
from .numbers import NumberError, fmt, fmt_array, normal_positive, parse_exact, parse_float
from .record import CausalConstruction, Construction, RecordError, record_from_meta

FORMAT = "exactformer.model/1"
FORMAT_2 = "exactformer.model/2"  # adds "causal", "positions" and "heads" (docs/heads.md)


TORCH_FORMAT = "exactformer.torch/1"  # a Hub folder's config.json format (export/native.py)


class ModelFormatError(ValueError):
    """A model file does not follow ``exactformer.model/1``; the message says where."""


# ------------------------------------------------------------------------------ atomic writes
@contextmanager
def _sigterm_raises_exit():
    """While the body runs in the main thread, SIGTERM raises SystemExit(143) instead of
    killing the process, so that ``finally`` clauses (removing temporary files) run. A handler
    the program installed itself is left alone."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL):
        yield
        return

    def exit_now(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, exit_now)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


@contextmanager
def atomic_path(path: str | Path):
    """Yield a temporary path beside ``path`` (same suffix); move it into place only if the
    body succeeds. Nothing is left behind on an exception or on SIGTERM. Outputs are regular
    files: an existing directory, device, FIFO or socket at ``path`` is refused before anything
    is written (the rename would replace it with a file)."""
    path = Path(path)
    _check_regular(path)
    umask = os.umask(0)
    os.umask(umask)
    with _sigterm_raises_exit():
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.",
                                       suffix=f".tmp{path.suffix}")
        except OSError as e:  # name the file asked for, not the temporary one
            why = "a parent is not a directory" if e.errno == errno.EEXIST else e.strerror
            raise type(e)(e.errno, f"cannot write {path} ({why})") from None
        os.close(fd)
        try:
            yield Path(tmp)
            os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes owner-only files; use normal ones
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)


def _check_regular(path: Path) -> None:
    """Raise OSError unless ``path`` is missing or a regular file (links followed)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:  # missing, or unreachable: creating it reports the real reason
        return
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(f"{path}: is a directory, not a file to write")
    if not stat.S_ISREG(mode):
        kind = "FIFO" if stat.S_ISFIFO(mode) else "socket" if stat.S_ISSOCK(mode) \
            else "device"
        raise OSError(f"{path}: is a {kind}, not a regular file (outputs are written to "
                      "regular files only)")


def write_text_atomic(path: str | Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def _is_npz(path) -> bool:
    return Path(path).suffix.lower() == ".npz"


# ------------------------------------------------------------------------------ saving
def _header(model: Transformer) -> dict:
    """Every top-level field except ``"blocks"``, in file order."""
    v2 = model.causal or model.positions is not None or model.max_heads() > 1
    doc = {"format": FORMAT_2 if v2 else FORMAT, "d": model.d, "attention": model.attention,
           "number": "rational" if model.exact else "float64"}
    if model.attention == "softmax":
        doc["tau"] = fmt(model.tau)
    if model.causal:
        doc["causal"] = True
    if model.positions is not None:
        doc["positions"] = fmt_array(model.positions)
    doc["meta"] = model.meta
    return doc


def _block_dict(b: Block) -> dict:
    ff = None if b.ff is None else {"eta": fmt(b.ff.eta), "U": fmt_array(b.ff.U),
                                    "b": fmt_array(b.ff.b), "W": fmt_array(b.ff.W)}
    sa = None
    if b.sa is not None:  # one head as "A"/"V", several as "heads" (docs/heads.md)
        heads = [{"A": {"alpha": fmt(h.A.alpha), "a": fmt_array(h.A.a), "c": fmt_array(h.A.c)},
                  "V": {"beta": fmt(h.V.beta), "p": fmt_array(h.V.p), "q": fmt_array(h.V.q)}}
                 for h in b.sa.heads]
        sa = {"rho": fmt(b.sa.rho), **(heads[0] if len(heads) == 1 else {"heads": heads})}
    return {"ff": ff, "sa": sa}


def model_to_dict(model: Transformer) -> dict:
    header = _header(model)
    meta = header.pop("meta")
    return {**header, "blocks": [_block_dict(b) for b in model.blocks], "meta": meta}


def save_model(model: Transformer, path: str | Path) -> None:
    """Write the model as JSON, or as .npz when ``path`` ends in .npz (float64 models only);
    nothing is left at ``path`` if writing fails. An FF layer without units is refused (the
    formats hold none: write ``ff=None``), and so is a path inside a Hub folder, whose card,
    config, weights and model.json describe the model save_pretrained put there: writing
    another model.json under its card left "PROVED EXACT" beside a file that is not it."""
    _refuse_hub_folder(Path(path))
    empty = next((i for i, b in enumerate(model.blocks) if b.ff is not None and b.ff.width == 0),
                 None)
    if empty is not None:
        raise ModelFormatError(f"{path}: blocks[{empty}].ff: an FF layer needs at least one "
                               "unit (use ff=None for a block without one)")
    if _is_npz(path):
        _save_npz(model, path)
        return
    write_text_atomic(path, json.dumps(model_to_dict(model), separators=(",", ":")))


def model_sha256(model: Transformer) -> str:
    """SHA-256 of what a model computes: its header (d, attention, number kind, τ, causal,
    positions) and every parameter, by bits for float64 and by exact value for rational
    parameters; the record (meta) is left out. What a report names its model by, so that a
    Hub card shows a verdict only beside the model it was made on."""
    h = hashlib.sha256()
    h.update(repr((model.d, model.attention, model.exact, model.causal,
                   None if model.tau is None else str(model.tau))).encode())
    if model.positions is not None:
        _digest(h, model.positions)
    for b in model.blocks:
        h.update(b"|ff")
        if b.ff is not None:
            for a in (b.ff.eta, b.ff.U, b.ff.b, b.ff.W):
                _digest(h, a)
        h.update(b"|sa")
        if b.sa is not None:
            _digest(h, b.sa.rho)
            for head in b.sa.heads:
                for a in (head.A.alpha, head.A.a, head.A.c, head.V.beta, head.V.p, head.V.q):
                    _digest(h, a)
    return h.hexdigest()


def _digest(h, value) -> None:
    """Feed one scalar or array to ``h``: shape, then float64 bytes or exact values."""
    a = np.asarray(value)
    h.update(repr(a.shape).encode())
    if a.dtype == object:
        h.update(",".join(map(str, a.flat)).encode())
    else:
        h.update(np.ascontiguousarray(a, dtype=np.float64).tobytes())


def _refuse_hub_folder(path: Path) -> None:
    """ModelFormatError when ``path``'s folder is a Hub folder (its config.json names
    :data:`TORCH_FORMAT`)."""
    try:
        doc = json.loads((path.parent / "config.json").read_text())
    except (OSError, ValueError, RecursionError):
        return
    if isinstance(doc, dict) and doc.get("format") == TORCH_FORMAT:
        raise ModelFormatError(f"{path}: {path.parent} is a Hub folder (save_pretrained), whose "
                               "card and weights describe the model saved there: write this "
                               "model elsewhere, or save_pretrained it into a folder of its own")


# ------------------------------------------------------------------------------ loading
def load_model(path: str | Path) -> Transformer:
    """Read a model saved by :func:`save_model` (.npz by its suffix, JSON otherwise); every
    error names the file."""
    try:
        return _load_model(path)
    except ModelFormatError as e:
        if str(e).startswith(f"{path}:"):
            raise
        raise ModelFormatError(f"{path}: {e}") from None


def _load_model(path: str | Path) -> Transformer:
    if _is_npz(path):
        return _load_npz(path)
    try:
        doc = json.loads(Path(path).read_text())
    except RecursionError:
        raise ModelFormatError(f"{path}: not valid JSON (nested too deeply)") from None
    except ValueError as e:  # JSONDecodeError, or an integer too long for Python's int
        raise ModelFormatError(f"{path}: not valid JSON ({e})"[:300]) from None
    return model_from_dict(doc)


class _Numbers:
    """Reads number strings as Fractions (rational models) or floats (float64 models: the
    float nearest to each string, arrays parsed in bulk)."""

    def __init__(self, exact: bool):
        self.exact = exact

    def scalar(self, s, where: str):
        if not isinstance(s, str):
            raise ModelFormatError(f"{where}: {s!r} is not an exact number string"[:200])
        if not self.exact:
            try:  # float() keeps the sign of "-0.0", which Fraction cannot carry
                v = parse_float(s)
                if math.isfinite(v):
                    return v
            except ValueError:
                pass  # a NumberError too: parse_exact below names it
        try:
            f = parse_exact(s)
        except ValueError as e:
            raise ModelFormatError(f"{where}: {s!r} is not an exact number string ({e})"
                                   [:300]) from None
        if self.exact:
            return f
        try:
            return float(f)
        except OverflowError:
            raise ModelFormatError(f"{where}: {s[:40]!r} is beyond the float64 range") from None

    def array(self, a, shape: tuple[int | None, ...], where: str) -> np.ndarray:
        """A list (shape (n,)) or list of lists (shape (rows, cols)) of number strings; a
        None in ``shape`` is any length."""
        if len(shape) == 1:
            if not isinstance(a, list) or len(a) != shape[0]:
                raise ModelFormatError(f"{where}: expected a list of {shape[0]} numbers")
            return self._parsed(a, (shape[0],), [(where, a)])
        if not isinstance(a, list) or (shape[0] is not None and len(a) != shape[0]):
            raise ModelFormatError(f"{where}: expected {shape[0]} rows")
        rows = [(f"{where}[{i}]", row) for i, row in enumerate(a)]
        for at, row in rows:
            if not isinstance(row, list) or len(row) != shape[1]:
                raise ModelFormatError(f"{at}: expected a list of {shape[1]} numbers")
        return self._parsed(list(chain.from_iterable(a)), (len(a), shape[1]), rows)

    def _parsed(self, flat: list, shape: tuple, rows: list[tuple[str, list]]) -> np.ndarray:
        """``flat`` as an array of ``shape``: one bulk conversion for float64 models, else
        (or when that fails) one number at a time, naming the row of a bad one."""
        if not self.exact and set(map(type, flat)) <= {str} and all(map(str.isascii, flat)):
            try:
                out = np.array(flat, dtype=float).reshape(shape)
                if np.isfinite(out).all():
                    return out
            except ValueError:
                pass  # e.g. "1/3", or a bad string: read one by one below
        out = np.empty(len(flat), dtype=object if self.exact else float)
        out[:] = [self.scalar(v, at) for at, row in rows for v in row]
        return out.reshape(shape)


def _object(x, where: str, nullable: bool = False):
    if x is None and nullable:
        return None
    if not isinstance(x, dict):
        raise ModelFormatError(f"{where}: expected an object, got {x!r}"[:200])
    return x


def _read_header(doc) -> dict:
    """The keyword arguments of Transformer other than ``blocks`` and ``record``, checked."""
    if not isinstance(doc, dict) or doc.get("format") not in (FORMAT, FORMAT_2):
        raise ModelFormatError(f"expected \"format\": \"{FORMAT}\" or \"{FORMAT_2}\"")
    d = doc.get("d")
    if type(d) is not int or d < 1:
        raise ModelFormatError(f"\"d\" must be a positive integer, got {d!r}"[:200])
    attention = doc.get("attention")
    if attention not in ("hardmax", "softmax"):
        raise ModelFormatError("\"attention\" must be \"hardmax\" or \"softmax\"")
    number = doc.get("number", "rational")
    if number not in ("rational", "float64"):
        raise ModelFormatError(f"\"number\" must be \"rational\" or \"float64\", got "
                               f"{number!r}"[:200])
    exact = number == "rational"
    numbers = _Numbers(exact)
    tau = None
    if attention == "softmax":
        try:
            tau = normal_positive(numbers.scalar(doc.get("tau"), "tau"), "\"tau\"")
        except NumberError as e:
            raise ModelFormatError(str(e)) from None
    causal, positions = _causal_fields(doc, lambda a, where: numbers.array(a, (None, d), where))
    return {"d": d, "attention": attention, "exact": exact, "tau": tau, "causal": causal,
            "positions": positions}


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


def _read_block(b, d: int, numbers: _Numbers, where: str, fmt_name: str) -> Block:
    b = _object(b, where)
    ff = sa = None
    f = _object(b.get("ff"), f"{where}.ff", nullable=True)
    if f is not None:
        U = numbers.array(f.get("U"), (None, d), f"{where}.ff.U")
        w = U.shape[0]
        if w == 0:
            raise ModelFormatError(f"{where}.ff.U: an FF layer needs at least one unit (write "
                                   "\"ff\": null for a block without one)")
        ff = FF(numbers.scalar(f.get("eta"), f"{where}.ff.eta"), U,
                numbers.array(f.get("b"), (w,), f"{where}.ff.b"),
                numbers.array(f.get("W"), (d, w), f"{where}.ff.W"))
    s = _object(b.get("sa"), f"{where}.sa", nullable=True)
    if s is not None:
        heads = []
        for hw, h in _raw_heads(s, fmt_name, f"{where}.sa"):
            A, V = _object(h.get("A"), f"{hw}.A"), _object(h.get("V"), f"{hw}.V")
            heads.append(Head(ScoreMatrix(numbers.scalar(A.get("alpha"), f"{hw}.A.alpha"),
                                          numbers.array(A.get("a"), (d,), f"{hw}.A.a"),
                                          numbers.array(A.get("c"), (d,), f"{hw}.A.c")),
                              ValueMatrix(numbers.scalar(V.get("beta"), f"{hw}.V.beta"),
                                          numbers.array(V.get("p"), (d,), f"{hw}.V.p"),
                                          numbers.array(V.get("q"), (d,), f"{hw}.V.q"))))
        sa = SA(numbers.scalar(s.get("rho"), f"{where}.sa.rho"), heads=heads)
    return Block(ff, sa)


def _raw_heads(s: dict, fmt_name: str, where: str) -> list[tuple[str, dict]]:
    """The heads of an ``"sa"`` object with where each is: ``"heads"`` (a non-empty list, /2
    only, without ``"A"``/``"V"`` beside it) or the one head ``"A"``, ``"V"``."""
    if "heads" not in s:
        return [(where, s)]
    if fmt_name == FORMAT:
        raise ModelFormatError(f"{where}.heads: \"heads\" is not part of {FORMAT}; a file that "
                               f"uses it says \"format\": \"{FORMAT_2}\"")
    if "A" in s or "V" in s:
        raise ModelFormatError(f"{where}: \"heads\" and a single \"A\"/\"V\" together")
    raw = s["heads"]
    if not isinstance(raw, list) or not raw:
        raise ModelFormatError(f"{where}.heads: expected a non-empty list of heads")
    return [(f"{where}.heads[{i}]", _object(h, f"{where}.heads[{i}]")) for i, h in enumerate(raw)]


def model_from_dict(doc: dict) -> Transformer:
    header = _read_header(doc)
    raw_blocks = doc.get("blocks")
    if not isinstance(raw_blocks, list):
        raise ModelFormatError("\"blocks\" must be a list of blocks")
    numbers = _Numbers(header["exact"])
    blocks = [_read_block(b, header["d"], numbers, f"blocks[{i}]", doc["format"])
              for i, b in enumerate(raw_blocks)]
    return Transformer(blocks=blocks, record=_record(doc.get("meta", {}), len(blocks), header["d"]),
                       **header)


# ------------------------------------------------------------------------------ meta
def _record(meta, n_blocks: int, d: int) -> Construction | CausalConstruction | None:
    """The construction record in ``"meta"`` (None when it records no construction), its
    phases within the model's blocks and its keyed counts within its shape."""
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
    _check_keyed_counts(record.keyed or {}, n_blocks, d)
    return record


# keyed counts of coordinates (at most d, the stream's width) and of layers (at most L)
KEYED_WIDTHS, KEYED_LAYERS = ("coordinates", "weight", "heights"), ("tag_layers", "rounds")


def _check_keyed_counts(keyed: dict, n_blocks: int, d: int) -> None:
    for names, limit, what in ((KEYED_WIDTHS, d, f"the model's width d = {d}"),
                               (KEYED_LAYERS, n_blocks, f"the model's {n_blocks} blocks")):
        for name in names:
            if keyed.get(name, 0) > limit:
                raise ModelFormatError(f"meta.keyed.{name}: {keyed[name]} is more than {what}")


# ------------------------------------------------------------------------------ .npz
# key → (shape in terms of L blocks, F feed-forward layers, K hidden units, S attentions, d)
NPZ_KEYS = {
    "header": "() string: the JSON header, every field of the JSON format but \"blocks\"",
    "ff_width": "(L,) int64: the width of block i's FF, -1 for an identity FF",
    "has_sa": "(L,) bool: block i has an attention layer",
    "ff_eta": "(F,)", "ff_U": "(K, d)", "ff_b": "(K,)", "ff_W": "(d, K)",
    "sa_rho": "(S,)", "sa_alpha": "(S,)", "sa_a": "(S, d)", "sa_c": "(S, d)",
    "sa_beta": "(S,)", "sa_p": "(S, d)", "sa_q": "(S, d)",
}


def _stack(arrays: list, shape: tuple, axis: int = 0) -> np.ndarray:
    return np.concatenate([np.asarray(a, dtype=float) for a in arrays], axis=axis) if arrays \
        else np.zeros(shape)


def _npz_arrays(model: Transformer) -> dict[str, np.ndarray]:
    d = model.d
    ffs = [b.ff for b in model.blocks if b.ff is not None]
    sas = [b.sa for b in model.blocks if b.sa is not None]
    return {
        "header": np.array(json.dumps(_header(model), separators=(",", ":"))),
        "ff_width": np.array([-1 if b.ff is None else b.ff.width for b in model.blocks],
                             dtype=np.int64),
        "has_sa": np.array([b.sa is not None for b in model.blocks], dtype=bool),
        "ff_eta": np.array([f.eta for f in ffs], dtype=float),
        "ff_U": _stack([f.U for f in ffs], (0, d)),
        "ff_b": _stack([f.b for f in ffs], (0,)),
        "ff_W": _stack([f.W for f in ffs], (d, 0), axis=1),
        "sa_rho": np.array([s.rho for s in sas], dtype=float),
        "sa_alpha": np.array([s.A.alpha for s in sas], dtype=float),
        "sa_a": _stack([s.A.a[None] for s in sas], (0, d)),
        "sa_c": _stack([s.A.c[None] for s in sas], (0, d)),
        "sa_beta": np.array([s.V.beta for s in sas], dtype=float),
        "sa_p": _stack([s.V.p[None] for s in sas], (0, d)),
        "sa_q": _stack([s.V.q[None] for s in sas], (0, d)),
    }


def _save_npz(model: Transformer, path) -> None:
    if model.exact:
        raise ValueError(f"{path}: .npz holds float64 models only; save a rational model as "
                         ".json (or convert it with model.to_float())")
    if model.max_heads() > 1:
        raise ValueError(f"{path}: .npz holds one attention head per layer; save a model with "
                         f"{model.max_heads()} heads as .json (docs/heads.md)")
    arrays = _npz_arrays(model)
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        np.savez(f, **arrays)


def _read_npz_arrays(path) -> dict[str, np.ndarray]:
    try:
        z = np.load(path, allow_pickle=False)
        if not isinstance(z, np.lib.npyio.NpzFile):
            raise ModelFormatError(f"{path}: holds a single .npy array, not an .npz model")
        with z:
            missing = set(NPZ_KEYS) - set(z.files)
            if missing:
                raise ModelFormatError(f"{path}: missing arrays {sorted(missing)}")
            return {k: z[k] for k in NPZ_KEYS}
    except (EOFError, ValueError, zipfile.BadZipFile) as e:
        if isinstance(e, ModelFormatError):
            raise
        raise ModelFormatError(f"{path}: not a readable .npz model ({type(e).__name__}: "
                               f"{e})"[:300]) from None


def _check_npz_shapes(z: dict, d: int) -> None:
    widths, has_sa = z["ff_width"], z["has_sa"]
    if widths.dtype.kind not in "iu" or widths.ndim != 1:
        raise ModelFormatError("\"ff_width\" must be L integers (-1 or >= 1)")
    listed = widths.tolist()  # Python ints: a uint64 sum could wrap around to a small width
    if any(w < -1 or w == 0 for w in listed):
        raise ModelFormatError("\"ff_width\" must be L integers, -1 (no FF) or >= 1 (an FF "
                               "layer needs at least one unit)")
    if has_sa.dtype != bool or has_sa.shape != widths.shape:
        raise ModelFormatError(f"\"has_sa\" must be {len(widths)} booleans (one per block)")
    F, K, S = sum(w >= 0 for w in listed), sum(w for w in listed if w > 0), int(has_sa.sum())
    expect = {"ff_eta": (F,), "ff_U": (K, d), "ff_b": (K,), "ff_W": (d, K), "sa_rho": (S,),
              "sa_alpha": (S,), "sa_a": (S, d), "sa_c": (S, d), "sa_beta": (S,),
              "sa_p": (S, d), "sa_q": (S, d)}
    for key, shape in expect.items():
        a = z[key]
        if a.dtype != np.float64 or a.shape != shape:
            raise ModelFormatError(f"\"{key}\" must be a float64 array of shape {shape}, got "
                                   f"{a.dtype} {a.shape}")
        if not np.isfinite(a).all():
            raise ModelFormatError(f"\"{key}\" holds a value that is not finite")


def _load_npz(path) -> Transformer:
    z = _read_npz_arrays(path)
    if z["header"].dtype.kind != "U" or z["header"].shape != ():
        raise ModelFormatError(f"{path}: \"header\" must be one string")
    try:
        doc = json.loads(str(z["header"]))
    except RecursionError:
        raise ModelFormatError(f"{path}: the header is nested too deeply") from None
    except ValueError as e:
        raise ModelFormatError(f"{path}: the header is not valid JSON ({e})"[:300]) from None
    header = _read_header(doc)
    if header["exact"]:
        raise ModelFormatError(f"{path}: an .npz model must have \"number\": \"float64\"")
    d = header["d"]
    _check_npz_shapes(z, d)
    blocks, f, k, s = [], 0, 0, 0
    for w, has_sa in zip(z["ff_width"].tolist(), z["has_sa"].tolist(), strict=True):
        ff = sa = None
        if w >= 0:
            ff = FF(float(z["ff_eta"][f]), z["ff_U"][k:k + w].copy(), z["ff_b"][k:k + w].copy(),
                    z["ff_W"][:, k:k + w].copy())
            f, k = f + 1, k + w
        if has_sa:
            sa = SA(float(z["sa_rho"][s]),
                    ScoreMatrix(float(z["sa_alpha"][s]), z["sa_a"][s].copy(), z["sa_c"][s].copy()),
                    ValueMatrix(float(z["sa_beta"][s]), z["sa_p"][s].copy(), z["sa_q"][s].copy()))
            s += 1
        blocks.append(Block(ff, sa))
    return Transformer(blocks=blocks, record=_record(doc.get("meta", {}), len(blocks), header["d"]),
                       **header)
