"""Float data are validated in vectorised passes (docs/problem.md, validation rules); these
tests hold them to a plain per-value, per-token reference pass written out below: the same
dataset, the same warnings and the same first error message on random data with planted faults.
"""

from __future__ import annotations

import math
import warnings
from fractions import Fraction
from unittest import mock

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from exactformer import Dataset, DatasetError
from exactformer.data import DuplicatePairWarning
from exactformer.data import sets as data_module


# ------------------------------------------------------------------------ reference pass
def reference(inputs, targets) -> Dataset:
    """Validation of float data one value and one token at a time, as a dict of row tuples
    per sequence and a frozenset of row tuples per input (the behaviour the vectorised path
    must keep). Inputs and targets are lists of the same length >= 1 whose values are floats
    or ints; returns the merged Dataset, warns and raises like ``Dataset.from_arrays``."""
    xs = [ref_matrix(s, f"input {j}") for j, s in enumerate(inputs)]
    ys = [ref_matrix(s, f"target {j}") for j, s in enumerate(targets)]
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
        for s, name in ((x, f"input {j}"), (y, f"target {j}")):
            seen: dict[tuple, int] = {}
            for i, row in enumerate(s.tolist()):
                if tuple(row) in seen:
                    raise DatasetError(f"{name}: tokens {seen[tuple(row)]} and {i} are equal "
                                       "(tokens within a sequence must be pairwise distinct)")
                seen[tuple(row)] = i
    first: dict[frozenset, int] = {}
    keep = []
    for j, x in enumerate(xs):
        key = frozenset(map(tuple, x.tolist()))
        if key not in first:
            first[key] = j
            keep.append(j)
            continue
        k = first[key]
        if set(map(tuple, ys[j].tolist())) != set(map(tuple, ys[k].tolist())):
            raise DatasetError(f"pairs {k} and {j}: the inputs are equal as sets but their "
                               "targets differ (contradictory data)")
        warnings.warn(f"pairs {k} and {j}: equal inputs and equal targets (as sets); pair {j} "
                      f"was merged into pair {k}", DuplicatePairWarning, stacklevel=2)
    return Dataset(tuple(xs[j] for j in keep), tuple(ys[j] for j in keep))


def ref_matrix(seq, name: str) -> np.ndarray:
    if isinstance(seq, np.ndarray):
        if seq.ndim != 2:
            raise DatasetError(f"{name}: expected a list of tokens (a 2-D array), got shape "
                               f"{seq.shape}")
    elif not isinstance(seq, (list, tuple)):
        raise DatasetError(f"{name}: expected a list of tokens, got {type(seq).__name__}")
    rows = list(seq)
    if not rows:
        raise DatasetError(f"{name}: the sequence is empty (every sequence needs >= 1 token)")
    out = []
    for i, row in enumerate(rows):
        if not isinstance(row, (list, tuple, np.ndarray)) or \
                (isinstance(row, np.ndarray) and row.ndim != 1):
            raise DatasetError(f"{name}, token {i}: expected a list of coordinates")
        if len(row) != len(rows[0]):
            raise DatasetError(f"{name}, token {i}: has {len(row)} coordinates but token 0 has "
                               f"{len(rows[0])} (ragged token dimensions)")
        out.append([ref_value(v, f"{name}, token {i}") for v in row])
    return np.array(out, dtype=float)


def ref_value(v, where: str) -> float:
    try:
        f = float(v)
    except (ValueError, TypeError, OverflowError):
        raise DatasetError(f"{where}: value {v!r} is not a finite number"[:300]) from None
    if not math.isfinite(f):
        raise DatasetError(f"{where}: value {v!r} is not finite (NaN or inf)")
    if f != 0 and abs(f) < 2.0 ** -1022:
        raise DatasetError(f"{where}: value of magnitude about 1e{math.floor(math.log10(abs(f)))}"
                           " is outside the normal float64 range (nonzero magnitudes from "
                           "2^-1022 to below 2^1024); rescale the data")
    return f


def outcome(build, inputs, targets):
    """What ``build`` gives: the dataset's arrays bit for bit (−0.0 kept) or the error
    message, and every warning raised on the way (category and message)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            ds = build(inputs, targets)
            result = [[(a.shape, a.dtype.str, a.tobytes()) for a in seqs]
                      for seqs in (ds.inputs, ds.targets)]
        except DatasetError as e:
            result = str(e)
    return result, [(w.category, str(w.message)) for w in caught]


# ------------------------------------------------------------------------ random data
THIRD = Fraction(1, 3)
VALUES = [0.0, -0.0, 1.0, -1.0, 0.5, 3, -2.75, 2.5e38, 2.0 ** -1022]
FAULTS = [math.nan, math.inf, -math.inf, 5e-324, -1e-310, 10 ** 400, 2 ** 1024, 2 ** 1023, 1e300,
          np.float64(math.nan), np.float32(1e-40), np.longdouble("1e400")]


@st.composite
def planted_data(draw):
    """Lists of inputs and targets over a small pool of tokens (so inputs share tokens and
    are often equal as sets), then 0–3 planted faults, each sequence in a random form."""
    N, d = draw(st.integers(1, 5)), draw(st.sampled_from([2, 2, 3]))
    pool = draw(st.lists(st.lists(st.sampled_from(VALUES), min_size=d, max_size=d),
                         min_size=4, max_size=8))
    xs, ys = [], []
    for j in range(N):
        if j and draw(st.integers(0, 3)) == 0:  # a permuted copy of an earlier pair
            k = draw(st.integers(0, j - 1))
            xs.append(draw(st.permutations(xs[k])))
            ys.append(draw(st.permutations(ys[k])) if draw(st.booleans()) else
                      draw(st.permutations(ys[k]))[1:] or ys[k])
            continue
        order = draw(st.permutations(range(len(pool))))
        n = draw(st.integers(1, 4))
        xs.append([list(pool[i]) for i in order[:n]])
        ys.append([list(pool[i]) for i in order[-draw(st.integers(1, n)):]])
    for _ in range(draw(st.integers(0, 3))):
        plant(draw, draw(st.sampled_from([xs, ys])))
    inputs = [represent(draw, s) for s in xs]
    targets = [represent(draw, s) for s in ys]
    return inputs, targets


def plant(draw, seqs: list) -> None:
    """One fault in one sequence of ``seqs``: a bad value, a ragged token, a repeated token,
    an extra token, a token that is not a vector, or an empty or flat sequence."""
    j = draw(st.integers(0, len(seqs) - 1))
    seq = seqs[j]
    kind = draw(st.sampled_from(["value", "value", "ragged", "repeat", "repeat", "extra",
                                 "scalar", "empty", "flat"]))
    if not isinstance(seq, list) or not seq:
        return
    i = draw(st.integers(0, len(seq) - 1))
    if not isinstance(seq[i], list):
        return
    if kind == "value":
        seq[i] = list(seq[i])  # rows may be shared by permuted copies
        seq[i][draw(st.integers(0, len(seq[i]) - 1))] = draw(st.sampled_from(FAULTS))
    elif kind == "ragged":
        seq[i] = seq[i][:-1] if draw(st.booleans()) else seq[i] + [1.0]
    elif kind == "repeat":  # the same token, possibly with −0.0 for 0.0
        seq.insert(draw(st.integers(0, len(seq))), [-v if v == 0 else v for v in seq[i]])
    elif kind == "extra":
        seq.append([float(i) + 7.5] * len(seq[i]))
    elif kind == "scalar":
        seq[i] = np.array(1.0)  # a 0-d array
    elif kind == "empty":
        seqs[j] = [] if draw(st.booleans()) else np.empty((0, len(seq[i])))
    else:
        seqs[j] = np.array([1.0, 2.0])


def represent(draw, seq):
    """``seq`` as nested lists, tuples, a list of 1-D arrays or a float64/float32 array
    (when NumPy reads it as a matrix); the values are the same up to float32 rounding."""
    form = draw(st.sampled_from(["list", "tuple", "rows", "float64", "float32"]))
    if not isinstance(seq, list) or form == "list":
        return seq
    if form == "tuple":
        return tuple(tuple(r) if isinstance(r, list) else r for r in seq)
    try:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if form == "rows":
                return [np.array(r, dtype=float) for r in seq]
            arr = np.array(seq, dtype=np.float64 if form == "float64" else np.float32)
    except (ValueError, TypeError, OverflowError):
        return seq
    return arr if arr.ndim == 2 else seq


def assert_same_as_reference(inputs, targets) -> None:
    assert outcome(Dataset.from_arrays, inputs, targets) == outcome(reference, inputs, targets)


# ------------------------------------------------------------------------ properties
@settings(max_examples=250, deadline=None)
@given(planted_data(), st.integers(1, 40))
@example(([[[0.0, 1.0]]], [[[0.0, 1.0]]]), 1)  # N = 1, d = 2
@example(([[[0.0, 1.0], [-0.0, 1.0]]], [[[2.0, 2.0]]]), 1)  # −0.0 repeats 0.0
@example(([[[1.0, 2.0], [3.0, 4.0]], [[3.0, 4.0], [1.0, 2.0]], [[3.0, 4.0], [-0.0, 0.0]]],
          [[[1.0, 2.0]], [[1.0, 2.0]], [[0.0, 0.0]]]), 2)  # equal sets, equal targets
@example(([[[1.0, 2.0], [3.0, 4.0]], [[3.0, 4.0], [1.0, 2.0]]],
          [[[1.0, 2.0]], [[3.0, 4.0]]]), 3)  # equal sets, different targets
@example(([[[1.0, 2.0]], [[1.0, math.nan]]], [[[1.0, 2.0]], [[1.0, 2.0, 3.0], [1.0]]]), 1)
def test_vectorised_validation_matches_the_reference(data, batch):
    """Small batches split the vectorised passes wherever they can split."""
    inputs, targets = data
    with mock.patch.object(data_module, "BATCH_VALUES", batch):
        assert_same_as_reference(inputs, targets)


@settings(max_examples=100, deadline=None)
@given(planted_data())
def test_colliding_hashes_only_cost_time(data):
    """Every row hashing alike makes every pair and input a suspect: the per-sequence checks
    then decide alone, and the outcome is still the reference's."""
    def same_hash(arrays):
        return np.zeros(sum(len(a) for a in arrays), dtype=np.uint64)

    with mock.patch.object(data_module, "_row_hashes", same_hash):
        assert_same_as_reference(*data)


def test_many_sequences_with_a_late_repeat_and_a_late_duplicate():
    """N = 3000 over a 40-word vocabulary in R^2 (many batches, many shared tokens): one
    repeated token in the last input, then instead a duplicate of the first pair at the end."""
    rng = np.random.default_rng(7)
    table = rng.standard_normal((40, 2))
    words = {tuple(sorted(rng.choice(40, 5, replace=False).tolist())) for _ in range(4000)}
    xs = [table[list(w)] for w in sorted(words)[:3000]]
    ys = [x[:2] for x in xs]
    assert_same_as_reference(xs, ys)
    repeated = xs[:-1] + [np.vstack([xs[-1], xs[-1][:1]])]
    assert_same_as_reference(repeated, ys)
    assert_same_as_reference(xs + [xs[0][::-1]], ys + [ys[0]])
    assert_same_as_reference(xs + [xs[0][::-1]], ys + [ys[1]])


@pytest.mark.parametrize("inputs, targets", [
    ([[[THIRD, 1], [THIRD + Fraction(1, 10 ** 30), 1]]], [[[0, 1]]]),  # a repeated token
    ([[[THIRD, 1]], [[THIRD + Fraction(1, 10 ** 30), 1]]], [[[0, 1]], [[0, 1]]]),  # merged
    ([[[THIRD, 1]], [[THIRD + Fraction(1, 10 ** 30), 1]]], [[[0, 1]], [[0, 2]]]),  # contradiction
])
def test_float64_rounding_of_exact_data_is_checked_like_float_data(inputs, targets):
    """check_float64 checks the rounded values of exact data by the same rules (a warning
    there is an error too): the message is the reference's on the rounded values."""
    ds = Dataset.from_arrays(inputs, targets)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DuplicatePairWarning)
        try:
            reference(*ds.floats())
        except (DatasetError, DuplicatePairWarning) as e:
            expected = str(e)
    with pytest.raises(DatasetError) as caught:
        ds.check_float64()
    assert str(caught.value) == (f"in float64 arithmetic: {expected}; build with exact "
                                 "rational arithmetic instead")
