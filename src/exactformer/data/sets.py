"""Datasets of ragged sequence pairs, their loaders and the validation rules of docs/problem.md.

A dataset holds N pairs (X_j, Y_j) with X_j of shape n_j×d and Y_j of shape m_j×d. Values are kept
exactly as given: float64 arrays when every value is a float, otherwise object arrays of
``fractions.Fraction`` (JSON strings such as "3/7" are read exactly). Every rule broken is
reported with the index of the pair (0-based) and of the token.
"""

from __future__ import annotations

import hashlib
import json
import math
import warnings
import zipfile
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from ..distance import data_scale
from ..numbers import (
    LARGEST,
    SMALLEST,
    NumberError,
    fmt_array,
    is_exact_array,
    mix64,
    pad_columns,
    to_float,
    to_fraction,
    to_fraction_array,
)
from .errors import DatasetError, DuplicatePairWarning
from .numbers_rule import read_json, sequences

# Nonzero coordinates must have a magnitude in [SMALLEST, LARGEST) (numbers.py): the
# construction and its checks measure scales and gaps in float64 (README, datasets).
SMALLEST_FLOAT = float(SMALLEST)


class SequenceData:
    """What set and causal datasets share: ``inputs`` and ``targets``, tuples of arrays."""

    inputs: tuple[np.ndarray, ...]
    targets: tuple[np.ndarray, ...]
    padded_from: int | None

    @property
    def N(self) -> int:
        return len(self.inputs)

    @property
    def d(self) -> int:
        return self.inputs[0].shape[1]

    @property
    def exact(self) -> bool:
        """True when the values are Fractions (read from strings); float data are exact floats."""
        return is_exact_array(self.inputs[0])

    @property
    def total_n(self) -> int:
        return sum(x.shape[0] for x in self.inputs)

    def __repr__(self) -> str:
        """A short form: N, d, the lengths and the kind of numbers, never the arrays."""
        lengths = [x.shape[0] for x in self.inputs]
        return (f"{type(self).__name__}(N={self.N}, d={self.d}, lengths "
                f"{min(lengths)}..{max(lengths)}, {self._counted()}, "
                f"{'exact' if self.exact else 'float64'})")

    def sha256(self) -> str:
        """The SHA-256 (hex) that names these data exactly, values and kind: of a JSON header
        ``{"causal", "d", "lengths" (per sequence [n_j, m_j]), "number"}`` (sorted keys, no
        spaces), then the values, inputs then targets: float64 data as their little-endian
        float64 bytes, exact data as the JSON list of their "p/q" strings; causal data then add
        their mask of constrained positions, a byte each. Float data and the same values as
        Fractions differ (docs/verification.md#the-data-checked)."""
        known = getattr(self, "known", None)  # causal data only
        header = {"causal": known is not None, "d": self.d, "number":
                  "rational" if self.exact else "float64",
                  "lengths": [[len(x), len(y)] for x, y in zip(self.inputs, self.targets,
                                                               strict=True)]}
        h = hashlib.sha256(json.dumps(header, sort_keys=True, separators=(",", ":")).encode())
        arrays = (*self.inputs, *self.targets)
        if self.exact:
            h.update(json.dumps([fmt_array(a) for a in arrays], separators=(",", ":")).encode())
        else:
            for a in arrays:
                h.update(np.ascontiguousarray(a, dtype="<f8").tobytes())
        for k in known or ():
            h.update(np.asarray(k, dtype=np.uint8).tobytes())
        return h.hexdigest()

    def padded(self, D: int):
        """These data as a model of width D = d_model reads them: every input token and target
        y as (y, 0, …, 0) ∈ R^D (docs/architecture.md#data-narrower-than-the-model). The same
        object when D = d; d > D is a ValueError naming both. Zero columns keep every rule of
        docs/problem.md, so the padded data are valid exactly when these are; their
        ``padded_from`` is the data's own d."""
        if D == self.d:
            return self
        return replace(self, inputs=tuple(pad_columns(self.inputs, D)),
                       targets=tuple(pad_columns(self.targets, D)),
                       padded_from=self.padded_from or self.d)

    def fractions(self) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Inputs and targets as object arrays of Fractions (exact for float data too)."""
        return ([to_fraction_array(x) for x in self.inputs],
                [to_fraction_array(y) for y in self.targets])

    def floats(self) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Inputs and targets as float64 arrays."""
        return ([np.asarray(x, dtype=float) for x in self.inputs],
                [np.asarray(y, dtype=float) for y in self.targets])


@dataclass(frozen=True, repr=False)
class Dataset(SequenceData):
    """N validated pairs. ``inputs[j]`` is n_j×d, ``targets[j]`` is m_j×d (float64 or Fraction)."""

    inputs: tuple[np.ndarray, ...]
    targets: tuple[np.ndarray, ...]
    # the data's own d when these are zero-padded to a wider model (:meth:`padded`), else None
    padded_from: int | None = field(default=None, compare=False, repr=False)

    @property
    def input_lengths(self) -> list[int]:
        return [x.shape[0] for x in self.inputs]

    @property
    def target_lengths(self) -> list[int]:
        return [y.shape[0] for y in self.targets]

    @property
    def total_m(self) -> int:
        return sum(self.target_lengths)

    def _counted(self) -> str:
        return f"Σm={self.total_m}"

    def check_float64(self) -> None:
        """Raise DatasetError if rounding to float64 breaks a rule (distinct tokens or inputs
        that become equal), so float64 constructions fail with a clear message."""
        xs, ys = self.floats()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error", DuplicatePairWarning)
                Dataset._validated(xs, ys)
        except (DatasetError, DuplicatePairWarning) as e:
            raise DatasetError(f"in float64 arithmetic: {e}; build with exact rational "
                               "arithmetic instead") from None

    def coordinate_scale(self) -> float:
        """The data's scale (:func:`exactformer.distance.data_scale`, the largest |coordinate|
        of inputs and targets), as a float: what every tolerance and margin is relative to."""
        return float(data_scale(*self.floats()))

    # ----------------------------------------------------------------------------- builders
    @classmethod
    def from_arrays(cls, inputs: Sequence, targets: Sequence) -> Dataset:
        """Build and validate from nested lists or arrays (numbers, Fractions or exact strings)."""
        for kind, seqs in (("inputs", inputs), ("targets", targets)):
            if not isinstance(seqs, (list, tuple, np.ndarray)):
                raise DatasetError(f"{kind}: expected a list of sequences, got "
                                   f"{type(seqs).__name__}")
        if len(inputs) != len(targets):
            raise DatasetError(f"{len(inputs)} input sequences but {len(targets)} target sequences")
        if len(inputs) == 0:
            raise DatasetError("the dataset is empty: at least one pair is needed")
        exact = not all(_all_floats(s) for s in list(inputs) + list(targets))
        if not exact:
            xs, ys = _float_matrices(inputs, targets)
            return cls._validated(xs, ys)
        xs = [as_matrix(s, f"input {j}", exact) for j, s in enumerate(inputs)]
        ys = [as_matrix(s, f"target {j}", exact) for j, s in enumerate(targets)]
        return cls._validated(xs, ys)

    @classmethod
    def from_json(cls, path: str | Path) -> Dataset:
        """Read ``{"inputs": [[[..], ..], ..], "targets": [...]}``, numbers by the rule of
        docs/problem.md#numbers (bare numbers float64, strings exact, unless ``"number"``
        says otherwise)."""
        return cls.from_doc(read_json(path), path)

    @classmethod
    def from_doc(cls, doc, path: str | Path) -> Dataset:
        """The dataset of a parsed JSON document (``read_json``); ``path`` names it in errors."""
        if not isinstance(doc, dict) or "inputs" not in doc or "targets" not in doc:
            raise DatasetError(f"{path}: expected an object with keys 'inputs' and 'targets'")
        try:
            data = cls.from_arrays(sequences(doc, "inputs", path),
                                   sequences(doc, "targets", path))
        except DatasetError as e:
            if _causal_shaped(doc):
                raise DatasetError(f"{e}; {CAUSAL_HINT}") from None
            raise
        if _next_tokens(data):
            warnings.warn(f"{path}: every target is its input shifted by one token; "
                          f"{CAUSAL_HINT}", UserWarning, stacklevel=2)
        return data

    @classmethod
    def from_npz(cls, path: str | Path) -> Dataset:
        """Read ``inputs`` (T×d), ``input_lengths`` (N), ``targets`` (M×d), ``target_lengths``."""
        arrays = read_npz(path, ("inputs", "input_lengths", "targets", "target_lengths"))
        xs = split_rows(arrays["inputs"], arrays["input_lengths"], "inputs", "input_lengths")
        ys = split_rows(arrays["targets"], arrays["target_lengths"], "targets", "target_lengths")
        return cls.from_arrays(xs, ys)

    @classmethod
    def load(cls, path: str | Path) -> Dataset:
        """Read a ``.json`` or ``.npz`` dataset."""
        suffix = Path(path).suffix.lower()
        if suffix == ".npz":
            return cls.from_npz(path)
        if suffix == ".json":
            return cls.from_json(path)
        raise DatasetError(f"{path}: unknown dataset format (expected .json or .npz)")

    def to_json_dict(self) -> dict:
        """The JSON form, read back by ``from_json`` as identical values: "p/q" strings for
        Fraction data; for float data ``"number": "float64"`` and each float's shortest
        round-trip repr (a bare "0.1" would read back as 1/10, not as the float 0.1)."""
        return {"number": "rational" if self.exact else "float64",
                "inputs": [fmt_array(x) for x in self.inputs],
                "targets": [fmt_array(y) for y in self.targets]}

    # ----------------------------------------------------------------------------- validation
    @classmethod
    def _validated(cls, xs: list[np.ndarray], ys: list[np.ndarray]) -> Dataset:
        """Check the rules of docs/problem.md on matrices, in a fixed order: dimensions, then
        pair by pair m_j <= n_j and distinct tokens, then equal inputs. Float data run the
        per-pair checks on the suspects of ``_float_suspects`` alone: the same first offence
        and message as checking every pair."""
        d = xs[0].shape[1]
        for kind, seqs in (("input", xs), ("target", ys)):
            for j, s in enumerate(seqs):
                if s.shape[1] != d:
                    raise DatasetError(
                        f"{kind} {j}: tokens have dimension {s.shape[1]}, but input 0 has d = {d} "
                        "(all tokens must share one dimension)")
        if d < 2:
            raise DatasetError(f"d = {d}: the construction needs token dimension d >= 2")
        if is_exact_array(xs[0]):
            pairs = equal_sets = range(len(xs))
        else:
            pairs, equal_sets = _float_suspects(xs, ys)
        for j in pairs:
            x, y = xs[j], ys[j]
            if y.shape[0] > x.shape[0]:
                raise DatasetError(
                    f"pair {j}: the target has m = {y.shape[0]} tokens, more than the input's "
                    f"n = {x.shape[0]} (the rule is m_j <= n_j)")
            _check_distinct(x, f"input {j}")
            _check_distinct(y, f"target {j}")
        return cls(*_merge_equal_inputs(xs, ys, equal_sets))


CAUSAL_HINT = ("these look like causal data (a target or null per position): read them with "
               "--causal (Python: load_dataset(path, causal=True) or CausalDataset.load)")


def _causal_shaped(doc: dict) -> bool:
    """Whether a document has the shape of causal data: a target list as long as every input
    sequence (one target or null per position), some sequence longer than one token."""
    xs, ys = doc["inputs"], doc["targets"]
    if not (isinstance(xs, list) and isinstance(ys, list) and len(xs) == len(ys) and xs):
        return False
    same = all(isinstance(x, list) and isinstance(y, list) and len(x) == len(y)
               for x, y in zip(xs, ys, strict=True))
    return same and any(len(x) > 1 for x in xs)


def _next_tokens(data: Dataset) -> bool:
    """Whether every target (as long as its input) is the input shifted by one token, the
    mark of next-token data read as set data."""
    if not any(len(x) > 1 for x in data.inputs):
        return False
    return all(len(x) == len(y) and np.array_equal(x[1:], y[:-1])
               for x, y in zip(data.inputs, data.targets, strict=True))


def _all_floats(seq) -> bool:
    if isinstance(seq, np.ndarray):
        return all_floats_row(seq)
    return isinstance(seq, (list, tuple)) and all(all_floats_row(row) for row in seq)


def all_floats_row(row) -> bool:
    """Whether a token holds plain numbers only, each an int or float that float64 holds as it
    is: an int that float64 would round (2^53 + 1) makes the data exact instead."""
    if isinstance(row, np.ndarray):
        if row.dtype.kind in "iu":
            return row.size == 0 or int(np.abs(row).max()) <= _EXACT_INTS or \
                all(_float_holds(int(v)) for v in row.flat)
        return row.dtype.kind in "fb"
    if not isinstance(row, (list, tuple)):
        return False
    types = set(map(type, row))
    if types <= _PLAIN_NUMBERS:  # the common case, without a call per value
        return int not in types or all(_float_holds(v) for v in row if type(v) is int)
    return all(isinstance(v, (float, np.floating)) or
               (isinstance(v, (int, np.integer)) and not isinstance(v, bool)
                and _float_holds(int(v))) for v in row)


def _float_holds(v: int) -> bool:
    """Whether float64 holds the int v exactly; True also where it overflows, so that the
    float path refuses it by name (outside the float64 range)."""
    if abs(v) <= _EXACT_INTS:
        return True
    try:
        return float(v) == v
    except OverflowError:
        return True


_EXACT_INTS = 2 ** 53  # every int of at most this magnitude is a float64
_PLAIN_NUMBERS = frozenset({float, int})


def as_matrix(seq, name: str, exact: bool) -> np.ndarray:
    """One sequence as an n×d array; names the token on ragged rows or bad values."""
    if isinstance(seq, np.ndarray):
        if seq.ndim != 2:
            raise DatasetError(f"{name}: expected a list of tokens (a 2-D array), got shape "
                               f"{seq.shape}")
        rows = list(seq)
    elif isinstance(seq, (list, tuple)):
        rows = list(seq)
    else:
        raise DatasetError(f"{name}: expected a list of tokens, got {type(seq).__name__}")
    if not rows:
        raise DatasetError(f"{name}: the sequence is empty (every sequence needs >= 1 token)")
    width = None
    out = []
    for i, row in enumerate(rows):
        if not isinstance(row, (list, tuple, np.ndarray)) or \
                (isinstance(row, np.ndarray) and row.ndim != 1):
            raise DatasetError(f"{name}, token {i}: expected a list of coordinates")
        if width is None:
            width = len(row)
        elif len(row) != width:
            raise DatasetError(f"{name}, token {i}: has {len(row)} coordinates but token 0 has "
                               f"{width} (ragged token dimensions)")
        out.append([_value(v, exact, f"{name}, token {i}") for v in row])
    arr = np.empty((len(out), width), dtype=object) if exact else np.array(out, dtype=float)
    if exact:
        arr[...] = out
    return arr


def _value(v, exact: bool, where: str):
    """One coordinate as a Fraction (exact) or a float, finite and in the normal float64
    range (see SMALLEST, LARGEST)."""
    try:
        f = to_fraction(v) if exact else to_float(v)
    except NumberError as e:
        raise DatasetError(f"{where}: value is not a finite number: {e}") from None
    except (ValueError, TypeError, ZeroDivisionError, OverflowError):
        raise DatasetError(f"{where}: value {v!r} is not a finite number"[:300]) from None
    if not exact and not math.isfinite(f):
        raise DatasetError(f"{where}: value {v!r} is not finite (NaN or inf)")
    if f != 0 and not (SMALLEST <= abs(f) < LARGEST if exact else abs(f) >= SMALLEST_FLOAT):
        size = math.log10(abs(f.numerator)) - math.log10(f.denominator) if exact else \
            math.log10(abs(f))
        raise DatasetError(f"{where}: value of magnitude about 1e{math.floor(size)} is outside "
                           "the normal float64 range (nonzero magnitudes from 2^-1022 to "
                           "below 2^1024); rescale the data")
    return f


def read_npz(path, names: tuple[str, ...] | None = None) -> dict[str, np.ndarray]:
    """The named arrays (default: all) of an .npz file; an unreadable or incomplete archive
    is a DatasetError naming the file."""
    try:
        z = np.load(path, allow_pickle=False)
        if not isinstance(z, np.lib.npyio.NpzFile):
            raise DatasetError(f"{path}: holds a single .npy array, not an .npz archive of "
                               "named arrays")
        with z:
            missing = set(names or ()) - set(z.files)
            if missing:
                raise DatasetError(f"{path}: missing arrays {sorted(missing)}")
            return {name: z[name] for name in (z.files if names is None else names)}
    except (EOFError, ValueError, OSError, zipfile.BadZipFile, zlib.error) as e:
        if isinstance(e, (DatasetError, FileNotFoundError, PermissionError)):
            raise
        raise DatasetError(f"{path}: not a readable .npz archive ({type(e).__name__}: {e})"
                           [:300]) from None


def _check_distinct(seq: np.ndarray, name: str) -> None:
    seen: dict[tuple, int] = {}
    for i, row in enumerate(seq):
        key = tuple(row.tolist())
        if key in seen:
            raise DatasetError(f"{name}: tokens {seen[key]} and {i} are equal (tokens within a "
                               "sequence must be pairwise distinct)")
        seen[key] = i


def _token_set(seq: np.ndarray) -> frozenset:
    return frozenset(tuple(row.tolist()) for row in seq)


def _merge_equal_inputs(xs, ys, among):
    """Drop each input of ``among`` (ascending) that equals an earlier one of ``among`` as a
    set, with a DuplicatePairWarning, or raise when their targets differ as sets. ``among``
    must hold every input that equals another (all of them, or the float suspects)."""
    first: dict[frozenset, int] = {}
    dropped = set()
    for j in among:
        key = _token_set(xs[j])
        if key in first:
            k = first[key]
            if _token_set(ys[j]) != _token_set(ys[k]):
                raise DatasetError(
                    f"pairs {k} and {j}: the inputs are equal as sets but their targets differ "
                    "(contradictory data)")
            warnings.warn(f"pairs {k} and {j}: equal inputs and equal targets (as sets); "
                          f"pair {j} was merged into pair {k}", DuplicatePairWarning,
                          stacklevel=4)
            dropped.add(j)
            continue
        first[key] = j
    keep = [j for j in range(len(xs)) if j not in dropped]
    return tuple(xs[j] for j in keep), tuple(ys[j] for j in keep)


# ----------------------------------------------------------------------------- float data
# Float data are checked as arrays: vectorised passes find a superset of the sequences that
# may break a rule ("suspects"), and the per-sequence checks above run on those alone, in the
# order of a full pass, so the first offence and its message are those of a full pass (see
# docs/problem.md, validation rules).
BATCH_VALUES = 1 << 18  # values per vectorised batch: small temporaries (2 MiB each)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _float_matrices(inputs, targets) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Inputs and targets of float data as float64 matrices (copies), with the structure and
    value rules of ``as_matrix`` and its messages, the first offence in the order inputs then
    targets, token by token."""
    seqs = list(inputs) + list(targets)
    N = len(inputs)

    def name(k: int) -> str:
        return f"input {k}" if k < N else f"target {k - N}"

    with np.errstate(over="ignore", invalid="ignore"):  # _check_values reports inf and NaN
        out = [_float_matrix(seq) for seq in seqs]
    for k in [k for k, arr in enumerate(out) if arr is None]:
        try:
            out[k] = as_matrix(seqs[k], name(k), False)
        except DatasetError:
            _check_values(seqs, out[:k], name)  # a bad value of an earlier sequence comes first
            raise
    _check_values(seqs, out, name)
    return out[:N], out[N:]


def _float_matrix(seq) -> np.ndarray | None:
    """``seq`` as an n×d float64 copy, or None for anything but a non-empty matrix that NumPy
    reads at once (ragged rows, ints beyond float64, rows that are not vectors): those go
    through ``as_matrix``, which names the offence. Values are checked later."""
    try:
        arr = np.array(seq, dtype=float)
    except (ValueError, TypeError, OverflowError):
        return None
    return arr if arr.ndim == 2 and arr.shape[0] > 0 else None


def _check_values(seqs: list, arrays: list[np.ndarray], name) -> None:
    """Raise ``as_matrix``'s error for the first of ``arrays`` (the float64 images of
    ``seqs``) with a value that is not finite or not in the normal float64 range."""
    sizes = [a.size for a in arrays]
    for lo, hi in _batches(sizes):
        flat = np.concatenate([a.ravel() for a in arrays[lo:hi]])
        with np.errstate(invalid="ignore"):
            bad = ~np.isfinite(flat) | ((np.abs(flat) < SMALLEST_FLOAT) & (flat != 0))
        if bad.any():
            ends = np.cumsum(sizes[lo:hi])
            for k in np.unique(np.searchsorted(ends, np.flatnonzero(bad), side="right")):
                as_matrix(seqs[lo + k], name(lo + k), False)


def _batches(sizes: list[int]) -> list[tuple[int, int]]:
    """Consecutive index ranges [lo, hi) of about BATCH_VALUES values each (at least one)."""
    out, lo, total = [], 0, 0
    for k, size in enumerate(sizes):
        total += size
        if total >= BATCH_VALUES:
            out.append((lo, k + 1))
            lo, total = k + 1, 0
    if lo < len(sizes):
        out.append((lo, len(sizes)))
    return out


def _row_hashes(arrays: list[np.ndarray]) -> np.ndarray:
    """A 64-bit hash of every row of the float64 matrices ``arrays`` (one width), equal for
    equal rows: adding 0.0 turns −0.0 into 0.0, so the bits compare like the numbers."""
    d = arrays[0].shape[1]
    offsets = mix64(np.arange(1, d + 1, dtype=np.uint64) * _GOLDEN)
    out = np.empty(sum(a.shape[0] for a in arrays), dtype=np.uint64)
    start = 0
    for lo, hi in _batches([a.size for a in arrays]):
        bits = (np.concatenate(arrays[lo:hi]) + 0.0).view(np.uint64)
        bits += offsets
        rows = mix64(mix64(bits).sum(axis=1, dtype=np.uint64))
        out[start:start + len(rows)] = rows
        start += len(rows)
    return out


def _float_suspects(xs: list[np.ndarray], ys: list[np.ndarray]
                    ) -> tuple[list[int], list[int]]:
    """For float data (no NaN): the pairs that may break m_j <= n_j or repeat a
    token (rows with equal hashes in one sequence), and the inputs that may equal another as
    sets (equal sums of their row hashes). Both are supersets: equal rows hash equally."""
    nx = np.array([x.shape[0] for x in xs])
    ny = np.array([y.shape[0] for y in ys])
    hx = _row_hashes(xs)
    pairs = (ny > nx) | _repeated_hash(hx, nx) | _repeated_hash(_row_hashes(ys), ny)
    sums = np.add.reduceat(hx, np.concatenate([[0], np.cumsum(nx)[:-1]]))
    order = np.argsort(sums, kind="stable")
    same = sums[order[1:]] == sums[order[:-1]]
    shared = np.zeros(len(xs), dtype=bool)
    shared[order[1:][same]] = shared[order[:-1][same]] = True
    return np.flatnonzero(pairs).tolist(), np.flatnonzero(shared).tolist()


def _repeated_hash(h: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Per sequence (rows ``lengths[j]`` at a time): whether two of its rows may share a hash.
    The sequence number fills the high bits of a sort key and the hash the rest, so a shared
    key means one sequence; with fewer hash bits left a few more sequences are suspects."""
    top = max(len(lengths) - 1, 1).bit_length()
    seq = np.repeat(np.arange(len(lengths), dtype=np.uint64), lengths)
    key = (seq << np.uint64(64 - top)) | (h >> np.uint64(top))
    key.sort()
    same = key[1:] == key[:-1]
    out = np.zeros(len(lengths), dtype=bool)
    out[(key[1:][same] >> np.uint64(64 - top)).astype(np.intp)] = True
    return out


def split_rows(flat: np.ndarray, lengths: np.ndarray, name: str, lengths_name: str
           ) -> list[np.ndarray]:
    if flat.ndim != 2:
        raise DatasetError(f"{name}: expected a T×d array, got shape {flat.shape}")
    if lengths.dtype.kind not in "iu":
        raise DatasetError(f"{lengths_name}: expected integer lengths, got dtype {lengths.dtype}")
    lengths = lengths.astype(int)
    if lengths.ndim != 1 or (lengths < 0).any() or lengths.sum() != flat.shape[0]:
        raise DatasetError(f"{lengths_name}: must be N non-negative lengths summing to "
                           f"{flat.shape[0]} (the rows of {name}; got sum {int(lengths.sum())})")
    cuts = np.cumsum(lengths)[:-1]
    return list(np.split(flat, cuts))
