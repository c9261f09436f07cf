"""Causal (decoder) datasets: a target, or no constraint, at every position of every input.

A causal dataset holds N input sequences X_j (n_j×d, tokens may repeat) and, for every position
i, a target y_ji ∈ R^d or null (no constraint). The model's output at position i may depend on
the ordered prefix x_j1..x_ji only, so two positions whose ordered prefixes are equal must have
the same target unless one is null; that and the shapes are checked here, each broken rule named
with its (sequence, position), 0-based. Files: see docs/causal.md.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction
from pathlib import Path

import numpy as np

from ..distance import data_scale
from ..numbers import fmt_array, to_float, to_fraction
from .numbers_rule import read_json, sequences
from .sets import (
    Dataset,
    DatasetError,
    SequenceData,
    all_floats_row,
    as_matrix,
    read_npz,
    split_rows,
)
from .text import check_vocabulary, next_characters, text_embedding


@dataclass(frozen=True, repr=False)
class CausalDataset(SequenceData):
    """``inputs[j]`` is n_j×d; ``targets[j]`` is n_j×d with row i meaningful only where
    ``known[j][i]`` (a bool array of length n_j) is True; the other rows are zeros."""

    inputs: tuple[np.ndarray, ...]
    targets: tuple[np.ndarray, ...]
    known: tuple[np.ndarray, ...]
    # the data's own d when zero-padded to a wider model (``padded``), else None
    padded_from: int | None = field(default=None, compare=False, repr=False)
    # V×d float64 vectors the outputs decode to (text data, :meth:`with_vocabulary`), or None
    vocabulary: np.ndarray | None = field(default=None, compare=False, repr=False)

    @property
    def lengths(self) -> list[int]:
        return [x.shape[0] for x in self.inputs]

    @property
    def constrained(self) -> int:
        """Number of positions with a target."""
        return int(sum(k.sum() for k in self.known))

    def _counted(self) -> str:
        return f"{self.constrained} constrained"

    def coordinate_scale(self) -> float:
        """The data's scale over inputs and constrained targets
        (:func:`exactformer.distance.data_scale`), as a float."""
        xs, ys = self.floats()
        return float(data_scale(xs, [y[k] for y, k in zip(ys, self.known, strict=True)]))

    def check_float64(self) -> None:
        """Raise DatasetError if rounding to float64 makes the data contradictory."""
        xs, ys = self.floats()
        try:
            CausalDataset._validated(xs, ys, list(self.known))
        except DatasetError as e:
            raise DatasetError(f"in float64 arithmetic: {e}; build with exact rational "
                               "arithmetic instead") from None

    # ----------------------------------------------------------------------------- builders
    @classmethod
    def from_arrays(cls, inputs: Sequence, targets: Sequence) -> CausalDataset:
        """Inputs as for :class:`Dataset`; ``targets[j]`` is a list of n_j entries, each a
        token or None (no constraint)."""
        _check_sequences(inputs, "inputs", "input sequence", "a list of tokens")
        _check_sequences(targets, "targets", "target list", "a list (a token or null per "
                                                             "position)")
        if len(inputs) != len(targets):
            raise DatasetError(f"{len(inputs)} input sequences but {len(targets)} target lists")
        if len(inputs) == 0:
            raise DatasetError("the dataset is empty: at least one sequence is needed")
        rows = [row for s in inputs for row in s]
        rows += [t for ts in targets if isinstance(ts, (list, tuple, np.ndarray))
                 for t in ts if t is not None]
        exact = not all(all_floats_row(r) for r in rows)
        xs = [as_matrix(s, f"sequence {j}", exact) for j, s in enumerate(inputs)]
        ys, known = [], []
        for j, (x, ts) in enumerate(zip(xs, targets, strict=True)):
            y, k = _target_rows(ts, j, x.shape[0], x.shape[1], exact)
            ys.append(y)
            known.append(k)
        return cls._validated(xs, ys, known)

    @classmethod
    def from_text(cls, text: str | list[str], embedding: dict | None = None, d: int = 8,
                  seed: int = 0) -> CausalDataset:
        """The next-character data of a text (or of several): every character is its vector
        under ``embedding`` (symbol → vector; default ``text_embedding(text, d, seed)``, the
        same vectors for the same text), and every position's target is the next character's
        vector, none at the last (docs/causal.md#text)."""
        if embedding is None:
            embedding = text_embedding(text, d, seed)
        data = cls.from_arrays(*next_characters(text, embedding))
        return data.with_vocabulary(list(embedding.values()))

    def with_vocabulary(self, vectors) -> CausalDataset:
        """These data with the vocabulary their outputs decode to, by the nearest vector
        (``tools.decode.nearest``; proofs: docs/numerics.md#decoding-to-a-vocabulary): V
        distinct float64 vectors of the data's own d holding every constrained target, or
        a DatasetError saying which rule fails (:func:`.text.check_vocabulary`)."""
        d = self.padded_from or self.d
        targets = [y[k][:, :d] for y, k in zip(self.targets, self.known, strict=True)]
        return replace(self, vocabulary=check_vocabulary(vectors, d, targets))

    @classmethod
    def from_dict(cls, doc, where: str = "data") -> CausalDataset:
        """The dataset of a parsed JSON document (``read_json``: numbers by the rule of
        docs/problem.md#numbers); ``where`` names it in errors."""
        if not isinstance(doc, dict) or "inputs" not in doc or "targets" not in doc:
            raise DatasetError(f"{where}: expected an object with keys 'inputs' and 'targets'")
        if doc.get("causal", True) is not True:
            raise DatasetError(f"{where}: \"causal\" must be true in a causal dataset")
        return cls.from_arrays(sequences(doc, "inputs", where), sequences(doc, "targets", where))

    @classmethod
    def from_npz(cls, path: str | Path) -> CausalDataset:
        """``inputs`` (T×d), ``input_lengths`` (N), ``targets`` (T×d, row t is the target of
        input token t) and ``target_mask`` (T, bool: False = no constraint, row ignored)."""
        with np.load(path, allow_pickle=False) as z:
            missing = {"inputs", "input_lengths", "targets", "target_mask"} - set(z.files)
            if missing:
                raise DatasetError(f"{path}: missing arrays {sorted(missing)} (causal npz)")
            if "causal" in z.files and not npz_flag(z["causal"], path):
                raise DatasetError(f"{path}: \"causal\" is false; not a causal dataset")
            xs = split_rows(z["inputs"], z["input_lengths"], "inputs", "input_lengths")
            flat, mask = z["targets"], np.asarray(z["target_mask"]).astype(bool)
        if flat.shape[0] != sum(len(x) for x in xs) or mask.shape != (flat.shape[0],):
            raise DatasetError(f"{path}: targets and target_mask need one row per input token "
                               f"({sum(len(x) for x in xs)})")
        cuts = np.cumsum([len(x) for x in xs])[:-1]
        ys = [[row if k else None for row, k in zip(y, m, strict=True)]
              for y, m in zip(np.split(flat, cuts), np.split(mask, cuts), strict=True)]
        return cls.from_arrays(xs, ys)

    @classmethod
    def load(cls, path: str | Path) -> CausalDataset:
        """Read a causal ``.json`` or ``.npz`` file (see docs/causal.md)."""
        return load_dataset(path, causal=True)

    def to_json_dict(self) -> dict:
        """The JSON form, read back as identical values: ``"number": "rational"`` and "p/q"
        strings for exact data, ``"number": "float64"`` and bare floats for float data."""
        def rows(a: np.ndarray) -> list:  # float rows as they are (json writes each float's
            return fmt_array(a) if a.dtype == object else a.tolist()  # shortest repr)
        return {"causal": True, "number": "rational" if self.exact else "float64",
                "inputs": [rows(x) for x in self.inputs],
                "targets": [[r if k else None for r, k in zip(rows(y), kn.tolist(), strict=True)]
                            for y, kn in zip(self.targets, self.known, strict=True)]}

    # ----------------------------------------------------------------------------- validation
    @classmethod
    def _validated(cls, xs, ys, known) -> CausalDataset:
        d = xs[0].shape[1]
        for j, (x, y) in enumerate(zip(xs, ys, strict=True)):
            if x.shape[1] != d or y.shape[1] != d:
                bad = x.shape[1] if x.shape[1] != d else y.shape[1]
                raise DatasetError(f"sequence {j}: tokens or targets have dimension {bad}, but "
                                   f"sequence 0 has d = {d} (one dimension for all)")
        if d < 2:
            raise DatasetError(f"d = {d}: the construction needs token dimension d >= 2")
        _check_consistent(xs, ys, known)
        return cls(tuple(xs), tuple(ys), tuple(np.asarray(k, dtype=bool) for k in known))


def _check_sequences(seqs, field: str, item: str, want: str) -> None:
    """``seqs`` is a list of lists (the shape of "inputs" and "targets"), or a DatasetError
    names the field or the first entry that is not."""
    lists = (list, tuple, np.ndarray)
    if not isinstance(seqs, lists):
        raise DatasetError(f"\"{field}\" must be a list of sequences, got {_kind(seqs)}")
    for j, s in enumerate(seqs):
        if not isinstance(s, lists):
            raise DatasetError(f"{item} {j} must be {want}, got {_kind(s)}")


def _kind(v) -> str:
    """What a JSON value is, for a message."""
    if v is None or isinstance(v, bool):
        return json.dumps(v)
    if isinstance(v, (int, float, Fraction, np.number)):
        return "a number"
    return "a string" if isinstance(v, str) else "an object" if isinstance(v, dict) else \
        type(v).__name__


def _target_rows(ts, j: int, n: int, d: int, exact: bool) -> tuple[np.ndarray, np.ndarray]:
    """One sequence's targets as an n×d array (zeros at nulls) and its mask."""
    if not isinstance(ts, (list, tuple, np.ndarray)):
        raise DatasetError(f"sequence {j}: targets must be a list (a token or null per "
                           f"position), got {type(ts).__name__}")
    if len(ts) != n:
        raise DatasetError(f"sequence {j}: {len(ts)} targets for {n} input tokens (causal data "
                           "need one target or null per position)")
    out = np.empty((n, d), dtype=object) if exact else np.zeros((n, d))
    if exact:
        out.fill(Fraction(0))
    known = np.zeros(n, dtype=bool)
    for i, t in enumerate(ts):
        if t is None:
            continue
        if not isinstance(t, (list, tuple, np.ndarray)) or len(t) != d:
            raise DatasetError(f"sequence {j}, position {i}: the target must be null or a token "
                               f"of {d} coordinates")
        for k, v in enumerate(t):
            try:
                f = to_fraction(v) if exact else to_float(v)
            except (ValueError, TypeError, ZeroDivisionError, OverflowError):
                raise DatasetError(f"sequence {j}, position {i}: target value {v!r} is not a "
                                   "finite number") from None
            if not exact and not math.isfinite(f):
                raise DatasetError(f"sequence {j}, position {i}: target value {v!r} is not "
                                   "finite (NaN or inf)")
            out[i, k] = f
        known[i] = True
    return out, known


def _prefix_ids(xs) -> list[np.ndarray]:
    """A trie over ordered prefixes: node ids, one per position."""
    nodes: dict[tuple, int] = {}
    out = []
    for x in xs:
        ids = np.empty(len(x), dtype=np.int64)
        parent = -1
        for i, row in enumerate(x):
            key = (parent, tuple(row.tolist()))
            parent = nodes.setdefault(key, len(nodes))
            ids[i] = parent
        out.append(ids)
    return out


def _check_consistent(xs, ys, known) -> None:
    """Equal ordered prefixes must have equal targets where both are constrained."""
    first: dict[int, tuple[int, int, tuple]] = {}
    for j, ids in enumerate(_prefix_ids(xs)):
        for i, node in enumerate(ids.tolist()):
            if not known[j][i]:
                continue
            t = tuple(ys[j][i].tolist())
            seen = first.setdefault(node, (j, i, t))
            if seen[2] != t:
                raise DatasetError(
                    f"(sequence {seen[0]}, position {seen[1]}) and (sequence {j}, position "
                    f"{i}): equal ordered prefixes but different targets (contradictory data)")


def npz_flag(a: np.ndarray, path) -> bool:
    """The ``causal`` array of an npz dataset: one boolean (``np.savez(..., causal=True)``)."""
    if a.dtype != bool or a.size != 1:
        raise DatasetError(f"{path}: the \"causal\" array must hold one boolean, got "
                           f"{a.dtype} of shape {a.shape}")
    return bool(a.reshape(()))


def is_causal_doc(doc) -> bool:
    return isinstance(doc, dict) and doc.get("causal") is True


def load_dataset(path: str | Path, causal: bool = False) -> Dataset | CausalDataset:
    """Read a dataset file: causal when it says ``"causal": true`` (JSON, or a true ``causal``
    array in npz) or when ``causal`` is asked for, else a set-to-set :class:`Dataset`.
    Every error names the file."""
    path = Path(path)
    try:
        return _load_dataset(path, causal)
    except DatasetError as e:
        if str(e).startswith(f"{path}:"):
            raise
        raise DatasetError(f"{path}: {e}") from None


def _load_dataset(path: Path, causal: bool) -> Dataset | CausalDataset:
    suffix = path.suffix.lower()
    if suffix == ".npz":
        arrays = read_npz(path)
        marked = "causal" in arrays and npz_flag(arrays["causal"], path)
        return CausalDataset.from_npz(path) if marked or causal else Dataset.from_npz(path)
    if suffix != ".json":
        raise DatasetError(f"{path}: unknown dataset format (expected .json or .npz)")
    doc = read_json(path)
    if is_causal_doc(doc) or causal:
        return CausalDataset.from_dict(doc, str(path))
    if not isinstance(doc, dict) or "inputs" not in doc or "targets" not in doc:
        raise DatasetError(f"{path}: expected an object with keys 'inputs' and 'targets'")
    if "causal" in doc and doc["causal"] is not False:
        raise DatasetError(f"{path}: \"causal\" must be true or false")
    return Dataset.from_doc(doc, path)
