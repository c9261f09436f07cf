"""Datasets of ragged sequence pairs, their loaders and the validation of DESIGN §1.

A dataset holds N pairs (X_j, Y_j) with X_j of shape n_j×d and Y_j of shape m_j×d. Values are kept
exactly as given: float64 arrays when every value is a float, otherwise object arrays of
``fractions.Fraction`` (JSON strings such as "3/7" are read exactly). Every rule broken is
reported with the index of the pair (0-based) and of the token.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import numpy as np

from .numbers import is_exact_array, to_fraction, to_fraction_array


class DatasetError(ValueError):
    """A dataset breaks one of the rules of DESIGN §1; the message names the pair and the rule."""


class DuplicatePairWarning(UserWarning):
    """Two inputs are equal as sets and so are their targets: the pairs were merged."""


@dataclass(frozen=True)
class Dataset:
    """N validated pairs. ``inputs[j]`` is n_j×d, ``targets[j]`` is m_j×d (float64 or Fraction)."""

    inputs: tuple[np.ndarray, ...]
    targets: tuple[np.ndarray, ...]

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
    def input_lengths(self) -> list[int]:
        return [x.shape[0] for x in self.inputs]

    @property
    def target_lengths(self) -> list[int]:
        return [y.shape[0] for y in self.targets]

    @property
    def total_m(self) -> int:
        return sum(self.target_lengths)

    @property
    def total_n(self) -> int:
        return sum(self.input_lengths)

    def fractions(self) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Inputs and targets as object arrays of Fractions (exact for float data too)."""
        return ([to_fraction_array(x) for x in self.inputs],
                [to_fraction_array(y) for y in self.targets])

    def floats(self) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Inputs and targets as float64 arrays."""
        return ([np.asarray(x, dtype=float) for x in self.inputs],
                [np.asarray(y, dtype=float) for y in self.targets])

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
        """Largest absolute coordinate over inputs and targets (at least 1)."""
        xs, ys = self.floats()
        return max(1.0, max(float(np.abs(a).max()) for a in xs + ys))

    # ----------------------------------------------------------------------------- builders
    @classmethod
    def from_arrays(cls, inputs: Sequence, targets: Sequence) -> Dataset:
        """Build and validate from nested lists or arrays (numbers, Fractions or exact strings)."""
        if len(inputs) != len(targets):
            raise DatasetError(f"{len(inputs)} input sequences but {len(targets)} target sequences")
        if len(inputs) == 0:
            raise DatasetError("the dataset is empty: at least one pair is needed")
        exact = not all(_all_floats(s) for s in list(inputs) + list(targets))
        xs = [_as_matrix(s, f"input {j}", exact) for j, s in enumerate(inputs)]
        ys = [_as_matrix(s, f"target {j}", exact) for j, s in enumerate(targets)]
        return cls._validated(xs, ys)

    @classmethod
    def from_json(cls, path: str | Path) -> Dataset:
        """Read ``{"inputs": [[[..], ..], ..], "targets": [...]}``; numbers are read exactly."""
        text = Path(path).read_text()
        try:
            doc = json.loads(text, parse_float=Fraction, parse_int=Fraction)
        except json.JSONDecodeError as e:
            raise DatasetError(f"{path}: not valid JSON ({e})") from None
        if not isinstance(doc, dict) or "inputs" not in doc or "targets" not in doc:
            raise DatasetError(f"{path}: expected an object with keys 'inputs' and 'targets'")
        return cls.from_arrays(doc["inputs"], doc["targets"])

    @classmethod
    def from_npz(cls, path: str | Path) -> Dataset:
        """Read ``inputs`` (T×d), ``input_lengths`` (N), ``targets`` (M×d), ``target_lengths``."""
        with np.load(path, allow_pickle=False) as z:
            missing = {"inputs", "input_lengths", "targets", "target_lengths"} - set(z.files)
            if missing:
                raise DatasetError(f"{path}: missing arrays {sorted(missing)}")
            xs = _split(z["inputs"], z["input_lengths"], "inputs", "input_lengths")
            ys = _split(z["targets"], z["target_lengths"], "targets", "target_lengths")
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
        """The JSON form: exact strings for Fraction data, JSON numbers for float data."""
        def enc(a):
            return [[str(v) if isinstance(v, Fraction) else float(v) for v in row] for row in a]
        return {"inputs": [enc(x) for x in self.inputs], "targets": [enc(y) for y in self.targets]}

    # ----------------------------------------------------------------------------- validation
    @classmethod
    def _validated(cls, xs: list[np.ndarray], ys: list[np.ndarray]) -> Dataset:
        d = xs[0].shape[1]
        for kind, seqs in (("input", xs), ("target", ys)):
            for j, s in enumerate(seqs):
                if s.shape[1] != d:
                    raise DatasetError(
                        f"{kind} {j}: tokens have dimension {s.shape[1]}, but input 0 has d = {d} "
                        "(all tokens must share one dimension)")
        if d < 2:
            raise DatasetError(f"d = {d}: the construction needs token dimension d >= 2")
        for j, (x, y) in enumerate(zip(xs, ys, strict=True)):
            if y.shape[0] > x.shape[0]:
                raise DatasetError(
                    f"pair {j}: the target has m = {y.shape[0]} tokens, more than the input's "
                    f"n = {x.shape[0]} (the rule is m_j <= n_j)")
            _check_distinct(x, f"input {j}")
            _check_distinct(y, f"target {j}")
        return cls(*_merge_equal_inputs(xs, ys))


def _all_floats(seq) -> bool:
    if isinstance(seq, np.ndarray):
        return seq.dtype.kind in "fiub"
    return isinstance(seq, (list, tuple)) and all(_all_floats_row(row) for row in seq)


def _all_floats_row(row) -> bool:
    if isinstance(row, np.ndarray):
        return row.dtype.kind in "fiub"
    if not isinstance(row, (list, tuple)):
        return False
    return all(isinstance(v, (float, int, np.floating, np.integer)) and not isinstance(v, bool)
               for v in row)


def _as_matrix(seq, name: str, exact: bool) -> np.ndarray:
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
        vals = []
        for v in row:
            try:
                f = to_fraction(v) if exact else float(v)
            except (ValueError, TypeError, ZeroDivisionError, OverflowError):
                raise DatasetError(f"{name}, token {i}: value {v!r} is not a finite number") \
                    from None
            if not exact and not math.isfinite(f):
                raise DatasetError(f"{name}, token {i}: value {v!r} is not finite (NaN or inf)")
            vals.append(f)
        out.append(vals)
    arr = np.empty((len(out), width), dtype=object) if exact else np.array(out, dtype=float)
    if exact:
        arr[...] = out
    return arr


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


def _merge_equal_inputs(xs, ys):
    first: dict[frozenset, int] = {}
    keep = []
    for j, x in enumerate(xs):
        key = _token_set(x)
        if key in first:
            k = first[key]
            if _token_set(ys[j]) != _token_set(ys[k]):
                raise DatasetError(
                    f"pairs {k} and {j}: the inputs are equal as sets but their targets differ "
                    "(contradictory data)")
            warnings.warn(f"pairs {k} and {j}: equal inputs and equal targets (as sets); "
                          f"pair {j} was merged into pair {k}", DuplicatePairWarning,
                          stacklevel=4)
            continue
        first[key] = j
        keep.append(j)
    return tuple(xs[j] for j in keep), tuple(ys[j] for j in keep)


def _split(flat: np.ndarray, lengths: np.ndarray, name: str, lengths_name: str
           ) -> list[np.ndarray]:
    if flat.ndim != 2:
        raise DatasetError(f"{name}: expected a T×d array, got shape {flat.shape}")
    lengths = np.asarray(lengths).astype(int)
    if lengths.ndim != 1 or (lengths < 0).any() or lengths.sum() != flat.shape[0]:
        raise DatasetError(f"{lengths_name}: must be N non-negative lengths summing to "
                           f"{flat.shape[0]} (the rows of {name}; got sum {int(lengths.sum())})")
    cuts = np.cumsum(lengths)[:-1]
    return list(np.split(flat, cuts))
