"""Dataset construction, loaders and every validation rule of docs/problem.md."""

from __future__ import annotations

import json
import re
import warnings
from fractions import Fraction

import numpy as np
import pytest
from conftest import datasets
from hypothesis import given, settings
from hypothesis import strategies as st

from exactformer import Dataset, DatasetError
from exactformer.data import DuplicatePairWarning
from exactformer.numbers import MAX_EXPONENT, NumberError, parse_exact

GOOD_X = [[[0, 1], [2, 3], [4, 1]], [[2, 3], [5, 5]]]
GOOD_Y = [[[1, 1], [0, 0]], [[7, 7]]]


def raises_naming(*parts):
    """pytest.raises(DatasetError) whose message contains every part (regex-escaped)."""
    return pytest.raises(DatasetError, match=".*".join(re.escape(p) for p in parts))


def write_json(tmp_path, doc, name="data.json"):
    p = tmp_path / name
    p.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return p


def write_npz(tmp_path, name="data.npz", **arrays):
    p = tmp_path / name
    np.savez(p, **arrays)
    return p


def npz_arrays(inputs, targets):
    return dict(inputs=np.concatenate([np.asarray(x, float) for x in inputs]),
                input_lengths=np.array([len(x) for x in inputs]),
                targets=np.concatenate([np.asarray(y, float) for y in targets]),
                target_lengths=np.array([len(y) for y in targets]))


# ------------------------------------------------------------------------------ good data
def test_from_arrays_shapes_and_properties():
    ds = Dataset.from_arrays(GOOD_X, GOOD_Y)
    assert ds.N == 2 and ds.d == 2
    assert ds.input_lengths == [3, 2] and ds.target_lengths == [2, 1]
    assert ds.total_n == 5 and ds.total_m == 3
    assert not ds.exact  # plain numbers are kept as float64
    assert ds.inputs[0].dtype == np.float64
    np.testing.assert_array_equal(ds.inputs[0], np.array(GOOD_X[0], float))
    xs, ys = ds.fractions()
    assert xs[1][1, 0] == Fraction(5) and isinstance(ys[0][0, 0], Fraction)


def test_numpy_arrays_are_accepted():
    xs = np.arange(24, dtype=float).reshape(3, 4, 2)
    ys = np.arange(12, dtype=float).reshape(3, 2, 2) / 7
    ds = Dataset.from_arrays(list(xs), list(ys))
    assert ds.N == 3 and ds.d == 2 and ds.input_lengths == [4, 4, 4]
    np.testing.assert_array_equal(ds.targets[2], ys[2])


def test_strings_and_fractions_are_read_exactly():
    ds = Dataset.from_arrays([[["3/7", "-0.125"], [Fraction(1, 3), 2]]], [[["1e-3", " 5 "]]])
    assert ds.exact
    x, y = ds.inputs[0], ds.targets[0]
    assert x[0, 0] == Fraction(3, 7) and x[0, 1] == Fraction(-1, 8)
    assert x[1, 0] == Fraction(1, 3) and x[1, 1] == 2
    assert y[0, 0] == Fraction(1, 1000) and y[0, 1] == 5
    assert all(isinstance(v, Fraction) for v in x.flat)


def test_floats_mixed_with_exact_values_keep_their_binary_value():
    ds = Dataset.from_arrays([[[0.1, "1/10"]]], [[[0, 0]]])
    x = ds.inputs[0]
    assert x[0, 0] == Fraction(0.1) and x[0, 1] == Fraction(1, 10)
    assert x[0, 0] != x[0, 1]


def test_json_numbers_are_float64_and_strings_exact(tmp_path):
    """The one reading rule (docs/problem.md#numbers): a bare JSON number is the float64
    Python's json gives it, a string is exact; with any string the data are exact and the
    bare numbers keep their binary values, as in from_arrays."""
    text = ('{"inputs": [[[0.1, "3/7"], [-0.125, 12345678901234567890123]], [[1e-3, "2"]]],'
            ' "targets": [[["-0.125", 2.5]], [[0, "-7/3"]]]}')
    ds = Dataset.from_json(write_json(tmp_path, text))
    assert ds.exact
    x0, x1 = ds.inputs
    assert x0[0, 0] == Fraction(0.1) != Fraction(1, 10)  # the float 0.1, not the decimal
    assert x0[0, 1] == Fraction(3, 7)
    assert x0[1, 0] == Fraction(-1, 8)
    assert x0[1, 1] == 12345678901234567890123
    assert x1[0, 0] == Fraction(1e-3)
    assert ds.targets[0][0, 0] == Fraction(-1, 8) and ds.targets[0][0, 1] == Fraction(5, 2)
    assert ds.targets[1][0, 1] == Fraction(-7, 3)
    assert all(isinstance(v, Fraction) for a in ds.inputs + ds.targets for v in a.flat)


def test_number_rational_reads_bare_decimals_exactly(tmp_path):
    text = '{"number": "rational", "inputs": [[[0.1, 1e-3]]], "targets": [[[0.631, 2]]]}'
    ds = Dataset.from_json(write_json(tmp_path, text))
    assert ds.exact
    assert ds.inputs[0][0, 0] == Fraction(1, 10) and ds.inputs[0][0, 1] == Fraction(1, 1000)
    assert ds.targets[0][0, 0] == Fraction(631, 1000)


def test_number_kind_is_checked(tmp_path):
    with raises_naming('"number" must be "rational" or "float64"', "'decimal'"):
        Dataset.from_json(write_json(tmp_path, {"number": "decimal", "inputs": GOOD_X,
                                                "targets": GOOD_Y}))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.floats(-1e6, 1e6, allow_nan=False, allow_subnormal=False),
                         min_size=2, max_size=2, unique=True),
                min_size=1, max_size=4, unique_by=tuple))
def test_a_json_file_and_from_arrays_give_the_same_dataset(tmp_path_factory, tokens):
    """The same numbers give one dataset, whether they come through JSON or arrays."""
    path = tmp_path_factory.mktemp("rule") / "d.json"
    xs, ys = [tokens], [tokens[:1]]
    path.write_text(json.dumps({"inputs": xs, "targets": ys}))
    from_file, from_arrays = Dataset.from_json(path), Dataset.from_arrays(xs, ys)
    assert not from_file.exact and not from_arrays.exact
    for a, b in zip(from_file.inputs + from_file.targets,
                    from_arrays.inputs + from_arrays.targets, strict=True):
        assert a.tobytes() == b.tobytes()


def test_ints_beyond_float64_keep_their_value():
    """An int that float64 cannot hold makes the data exact instead of being rounded."""
    big = 2 ** 53 + 1
    ds = Dataset.from_arrays([[[big, 0]]], [[[big, 0]]])
    assert ds.exact and ds.inputs[0][0, 0] == big


def test_load_dispatches_on_suffix_and_json_round_trip(tmp_path):
    ds = Dataset.from_arrays([[["1/3", 0], ["2/3", 1]], [["1/3", 0]]], [[["5/2", 1]], [[0, 0]]])
    p = write_json(tmp_path, ds.to_json_dict())
    back = Dataset.load(p)
    assert back.N == 2
    for a, b in zip(ds.inputs + ds.targets, back.inputs + back.targets, strict=True):
        assert a.shape == b.shape and all(u == v for u, v in zip(a.flat, b.flat, strict=True))
    with raises_naming("unknown dataset format"):
        Dataset.load(write_json(tmp_path, ds.to_json_dict(), name="data.txt"))


def test_npz_loading(tmp_path):
    xs = [[[0.5, 1.0], [2.0, 3.0], [4.0, 1.0]], [[2.0, 3.0], [5.0, 5.25]]]
    ys = [[[1.0, 1.0], [0.0, 0.0]], [[7.0, 7.0]]]
    ds = Dataset.load(write_npz(tmp_path, **npz_arrays(xs, ys)))
    assert ds.N == 2 and ds.d == 2 and ds.input_lengths == [3, 2] and ds.target_lengths == [2, 1]
    for a, b in zip(ds.inputs + ds.targets, xs + ys, strict=True):
        np.testing.assert_array_equal(a, np.array(b))



@pytest.mark.parametrize("change", [
    dict(input_lengths=np.array([3, 1])),
    dict(input_lengths=np.array([6, -1])),
    dict(target_lengths=np.array([2, 2])),
    dict(input_lengths=np.array([[3, 2]])),
])
def test_npz_length_errors(tmp_path, change):
    arrays = npz_arrays(GOOD_X, GOOD_Y)
    arrays.update(change)
    with raises_naming("lengths", "must be N non-negative lengths summing to"):
        Dataset.from_npz(write_npz(tmp_path, **arrays))


@pytest.mark.parametrize("change, parts", [
    (dict(input_lengths=np.array([3, 1])), ["input_lengths", "sum"]),
    (dict(input_lengths=np.array([6, -1])), ["input_lengths", "non-negative"]),
    (dict(target_lengths=np.array([2, 2])), ["target_lengths", "sum"]),
])
def test_npz_length_errors_name_the_array(tmp_path, change, parts):
    arrays = npz_arrays(GOOD_X, GOOD_Y)
    arrays.update(change)
    with raises_naming(*parts):
        Dataset.from_npz(write_npz(tmp_path, **arrays))


def test_npz_tokens_must_be_a_matrix(tmp_path):
    arrays = npz_arrays(GOOD_X, GOOD_Y)
    arrays["inputs"] = np.zeros(5)
    with raises_naming("inputs", "T×d"):
        Dataset.from_npz(write_npz(tmp_path, **arrays))


def test_npz_zero_length_sequence(tmp_path):
    xs = [[[0.0, 1.0]], [[1.0, 1.0]], [[2.0, 2.0]]]
    arrays = npz_arrays(xs, xs)
    arrays["input_lengths"] = np.array([2, 0, 1])
    with raises_naming("input 1", "empty"):
        Dataset.from_npz(write_npz(tmp_path, **arrays))


def test_npz_missing_arrays(tmp_path):
    arrays = npz_arrays(GOOD_X, GOOD_Y)
    del arrays["target_lengths"]
    with raises_naming("missing arrays", "target_lengths"):
        Dataset.from_npz(write_npz(tmp_path, **arrays))


def test_npz_mismatched_number_of_sequences(tmp_path):
    arrays = npz_arrays(GOOD_X, GOOD_Y)
    arrays["targets"] = np.array([[1.0, 1.0], [0.0, 0.0], [7.0, 7.0]])
    arrays["target_lengths"] = np.array([1, 1, 1])
    with raises_naming("2 input sequences but 3 target sequences"):
        Dataset.from_npz(write_npz(tmp_path, **arrays))


# ------------------------------------------------------------------------------ rules
def test_mismatched_number_of_sequences():
    with raises_naming("3 input sequences but 2 target sequences"):
        Dataset.from_arrays(GOOD_X + [[[9, 9]]], GOOD_Y)


def test_mismatched_number_of_sequences_in_json(tmp_path):
    p = write_json(tmp_path, {"inputs": GOOD_X, "targets": GOOD_Y[:1]})
    with raises_naming("2 input sequences but 1 target sequences"):
        Dataset.from_json(p)


def test_empty_dataset():
    with raises_naming("empty"):
        Dataset.from_arrays([], [])


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf"), np.nan])
def test_non_finite_floats(bad):
    xs = [[[0.0, 1.0], [2.0, bad]], [[3.0, 3.0]]]
    with raises_naming("input 0, token 1", "finite"):
        Dataset.from_arrays(xs, [[[1.0, 1.0]], [[2.0, 2.0]]])


def test_non_finite_in_a_target():
    ys = [[[1.0, 1.0]], [[0.0, 0.0], [float("inf"), 1.0]]]
    with raises_naming("target 1, token 1", "finite"):
        Dataset.from_arrays([[[0.0, 1.0]], [[2.0, 2.0], [3.0, 3.0]]], ys)


def test_non_finite_in_numpy_array():
    x = np.zeros((3, 2))
    x[2, 0] = np.nan
    x[1, 1] = 1.0
    x[2, 1] = 2.0
    with raises_naming("input 0, token 2", "finite"):
        Dataset.from_arrays([x], [x[:1]])


@pytest.mark.parametrize("bad", ["nan", "inf", "-inf", "Infinity", "NaN"])
def test_non_finite_json_strings(tmp_path, bad):
    doc = {"inputs": [[[0, 1]], [[1, 1], [2, bad]]], "targets": [[[0, 0]], [[5, 5]]]}
    with raises_naming("input 1, token 1", "finite"):
        Dataset.from_json(write_json(tmp_path, doc))


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_json_literals(tmp_path, literal):
    text = '{"inputs": [[[0, 1]], [[1, 1]]], "targets": [[[0, 0]], [[5, LIT]]]}'
    text = text.replace("LIT", literal)
    with raises_naming("target 1, token 0", "finite"):
        Dataset.from_json(write_json(tmp_path, text))


@pytest.mark.parametrize("bad", ["abc", "1/0", True, None, "", [1]])
def test_values_that_are_not_numbers(bad):
    with raises_naming("input 0, token 0", "not a finite number"):
        Dataset.from_arrays([[[bad, 1]]], [[[0, 0]]])


def test_token_that_is_not_a_list():
    with raises_naming("input 0, token 1", "list of coordinates"):
        Dataset.from_arrays([[[0, 1], 5]], [[[0, 0]]])


def test_ragged_token_dimensions_in_an_input():
    xs = [[[0, 1]], [[0, 1], [1, 1], [2, 3, 4]]]
    with raises_naming("input 1, token 2", "ragged"):
        Dataset.from_arrays(xs, [[[0, 0]], [[1, 1]]])


def test_ragged_token_dimensions_in_a_target():
    ys = [[[0, 0], [1, 1, 1]]]
    with raises_naming("target 0, token 1", "ragged"):
        Dataset.from_arrays([[[0, 1], [1, 1]]], ys)


def test_mismatched_dimension_between_inputs():
    xs = [[[0, 1, 2]], [[0, 1, 2]], [[0, 1]]]
    with raises_naming("input 2", "dimension 2", "d = 3"):
        Dataset.from_arrays(xs, [[[0, 0, 0]]] * 3)


def test_mismatched_dimension_between_input_and_target():
    with raises_naming("target 1", "dimension 3", "d = 2"):
        Dataset.from_arrays([[[0, 1]], [[1, 1]]], [[[0, 0]], [[0, 0, 0]]])


@pytest.mark.parametrize("d", [0, 1])
def test_dimension_below_two(d):
    xs = [[[i] * d for i in range(2)]] if d else [[[]]]
    ys = [[[0] * d]]
    with raises_naming(f"d = {d}", "d >= 2"):
        Dataset.from_arrays(xs, ys)


def test_empty_input_sequence():
    with raises_naming("input 1", "empty"):
        Dataset.from_arrays([[[0, 1]], []], [[[0, 0]], [[1, 1]]])


def test_empty_target_sequence():
    with raises_naming("target 0", "empty"):
        Dataset.from_arrays([[[0, 1]], [[1, 1]]], [[], [[1, 1]]])


def test_target_longer_than_input():
    xs = [[[0, 1], [1, 1], [2, 2]], [[0, 1], [1, 1]]]
    ys = [[[0, 0]], [[1, 1], [2, 2], [3, 3]]]
    with raises_naming("pair 1", "m = 3", "n = 2", "m_j <= n_j"):
        Dataset.from_arrays(xs, ys)


def test_repeated_token_in_an_input():
    xs = [[[0, 1]], [[1, 2], [3, 4], [1, 2]]]
    with raises_naming("input 1", "tokens 0 and 2", "pairwise distinct"):
        Dataset.from_arrays(xs, [[[0, 0]], [[1, 1]]])


@pytest.mark.parametrize("a, b", [("1/2", 0.5), (Fraction(1, 2), "0.5"), (0.0, -0.0),
                                  ("2", 2), ("6/4", "1.5")])
def test_repeated_token_in_different_spellings(a, b):
    with raises_naming("input 0", "tokens 0 and 1", "pairwise distinct"):
        Dataset.from_arrays([[[a, 1], [b, 1]]], [[[0, 0]]])


def test_repeated_token_in_a_target():
    ys = [[[0, 0], [5, 5], [0, 0]]]
    with raises_naming("target 0", "tokens 0 and 2", "pairwise distinct"):
        Dataset.from_arrays([[[0, 1], [1, 1], [2, 2]]], ys)


def test_contradictory_permuted_inputs():
    xs = [[[0, 1], [2, 3], [4, 5]], [[9, 9]], [[4, 5], [0, 1], [2, 3]]]
    ys = [[[1, 1]], [[0, 0]], [[1, 2]]]
    with raises_naming("pairs 0 and 2", "equal as sets", "contradictory"):
        Dataset.from_arrays(xs, ys)


def test_contradictory_when_one_target_set_is_a_subset():
    xs = [[[0, 1], [2, 3]], [[2, 3], [0, 1]]]
    ys = [[[1, 1], [2, 2]], [[2, 2]]]
    with raises_naming("pairs 0 and 1", "contradictory"):
        Dataset.from_arrays(xs, ys)


def test_contradictory_across_spellings():
    xs = [[["1/2", 1], [2, 3]], [[2, 3], [0.5, 1]]]
    ys = [[[1, 1]], [[1, "1/3"]]]
    with raises_naming("pairs 0 and 1", "contradictory"):
        Dataset.from_arrays(xs, ys)


def test_equal_pairs_are_merged_with_a_warning():
    xs = [[[0, 1], [2, 3], [4, 5]], [[9, 9]], [[4, 5], [0, 1], [2, 3]], [[9, 9]]]
    ys = [[[1, 1], [2, 2]], [[0, 0]], [[2, 2], [1, 1]], [[0, 0]]]
    with pytest.warns(DuplicatePairWarning) as record:
        ds = Dataset.from_arrays(xs, ys)
    messages = [str(w.message) for w in record]
    assert any("pairs 0 and 2" in m for m in messages)
    assert any("pairs 1 and 3" in m for m in messages)
    assert ds.N == 2
    np.testing.assert_array_equal(ds.inputs[0], np.array(xs[0], float))
    np.testing.assert_array_equal(ds.inputs[1], np.array(xs[1], float))
    np.testing.assert_array_equal(ds.targets[0], np.array(ys[0], float))


def test_distinct_data_give_no_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Dataset.from_arrays(GOOD_X, GOOD_Y)


def test_merge_then_contradiction_is_still_an_error():
    xs = [[[0, 1]], [[0, 1]], [[0, 1]]]
    ys = [[[1, 1]], [[1, 1]], [[2, 2]]]
    with pytest.warns(DuplicatePairWarning), raises_naming("pairs 0 and 2", "contradictory"):
        Dataset.from_arrays(xs, ys)


def test_shared_tokens_across_sequences_are_allowed():
    xs = [[[0, 1], [2, 3]], [[2, 3], [4, 5]], [[0, 1], [4, 5]], [[2, 3]]]
    ys = [[[0, 0]], [[0, 0]], [[0, 0]], [[0, 0]]]
    assert Dataset.from_arrays(xs, ys).N == 4


# ------------------------------------------------------------------------------ JSON files
def test_json_rules_name_the_pair(tmp_path):
    doc = {"inputs": [[["1/2", 1]], [["1/3", "x"]]], "targets": [[[0, 0]], [[0, 0]]]}
    with raises_naming("input 1, token 0", "not a finite number"):
        Dataset.from_json(write_json(tmp_path, doc))
    doc = {"inputs": [[["1/2", 1], ["2/4", "1"]]], "targets": [[[0, 0]]]}
    with raises_naming("input 0", "tokens 0 and 1", "pairwise distinct"):
        Dataset.from_json(write_json(tmp_path, doc))


def test_json_structure_errors(tmp_path):
    with raises_naming("not valid JSON"):
        Dataset.from_json(write_json(tmp_path, '{"inputs": [[[0, 1]]'))
    with raises_naming("'inputs' and 'targets'"):
        Dataset.from_json(write_json(tmp_path, {"inputs": GOOD_X}))
    with raises_naming("'inputs' and 'targets'"):
        Dataset.from_json(write_json(tmp_path, [GOOD_X, GOOD_Y]))


def test_json_sequence_that_is_a_number(tmp_path):
    with raises_naming("input 0", "list of tokens"):
        Dataset.from_json(write_json(tmp_path, {"inputs": [5], "targets": [[[0, 0]]]}))


def test_sequence_that_is_a_number():
    with raises_naming("input 1", "list of tokens"):
        Dataset.from_arrays([[[0, 1]], 7], [[[0, 0]], [[1, 1]]])


def test_sequence_that_is_not_a_matrix():
    with raises_naming("input 0", "2-D"):
        Dataset.from_arrays([np.zeros(3)], [[[0, 0]]])


# ------------------------------------------------------------------------------ JSON round trip
def assert_same_values(a: Dataset, b: Dataset) -> None:
    """Same exactness, shapes and values; floats bit for bit (-0.0 included)."""
    assert a.exact == b.exact and a.N == b.N
    for x, y in zip(a.inputs + a.targets, b.inputs + b.targets, strict=True):
        assert x.shape == y.shape and x.dtype == y.dtype
        if a.exact:
            assert all(type(u) is Fraction and u == v for u, v in zip(x.flat, y.flat,
                                                                       strict=True))
        else:
            assert (x.view(np.int64) == y.view(np.int64)).all()


normal_floats = st.one_of(
    st.sampled_from([0.1, 1 / 3, -0.0, 0.0, 2.2250738585072014e-308, 1.7976931348623157e308]),
    st.floats(allow_nan=False, allow_infinity=False, allow_subnormal=False))


@st.composite
def float_datasets(draw):
    d = draw(st.integers(2, 3))
    token = st.tuples(*[normal_floats] * d)
    seqs = draw(st.lists(st.lists(token, min_size=1, max_size=3, unique=True), min_size=1,
                         max_size=4, unique_by=frozenset))
    targets = [draw(st.lists(token, min_size=1, max_size=len(x), unique=True)) for x in seqs]
    return Dataset.from_arrays([[list(t) for t in x] for x in seqs],
                               [[list(t) for t in y] for y in targets])


@settings(max_examples=40, deadline=None)
@given(ds=st.one_of(datasets(), float_datasets()))
def test_every_dataset_survives_json(tmp_path_factory, ds):
    doc = ds.to_json_dict()
    assert doc["number"] == ("rational" if ds.exact else "float64")
    back = Dataset.from_json(write_json(tmp_path_factory.mktemp("rt"), doc))
    assert_same_values(ds, back)


def test_float_json_is_not_read_as_decimals(tmp_path):
    ds = Dataset.from_arrays([[[0.1, 0.2]]], [[[0.3, 1e-300]]])
    doc = ds.to_json_dict()
    assert doc["inputs"] == [[["0.1", "0.2"]]]
    back = Dataset.from_json(write_json(tmp_path, doc))
    assert back.inputs[0].tolist() == [[0.1, 0.2]] and not back.exact
    # without the marker the same strings are the decimals 1/10, 1/5: other values
    del doc["number"]
    exact = Dataset.from_json(write_json(tmp_path, doc))
    assert exact.inputs[0].tolist() == [[Fraction(1, 10), Fraction(1, 5)]]


def test_float64_json_errors_name_the_token(tmp_path):
    doc = {"number": "float64", "inputs": [[["0", "1"], ["x", "2"]]], "targets": [[["0", "0"]]]}
    with raises_naming("input 0, token 1", "float64 number"):
        Dataset.from_json(write_json(tmp_path, doc))
    doc["inputs"] = [[["0", "1"], ["inf", "2"]]]
    with raises_naming("input 0, token 1", "not finite"):
        Dataset.from_json(write_json(tmp_path, doc))
    doc["number"] = "decimal"
    with raises_naming('"number"', "float64"):
        Dataset.from_json(write_json(tmp_path, doc))


# ------------------------------------------------------------------------------ numbers
@pytest.mark.parametrize("text, value", [
    ("3/7", Fraction(3, 7)), (" -0.125 ", Fraction(-1, 8)), ("2.5e-3", Fraction(1, 400)),
    (f"1e{MAX_EXPONENT}", Fraction(10) ** MAX_EXPONENT), ("1E-0_3", Fraction(1, 1000)),
])
def test_parse_exact(text, value):
    assert parse_exact(text) == value


@pytest.mark.parametrize("text, kind, words", [
    (f"1e{MAX_EXPONENT + 1}", NumberError, "exponent"),
    ("1e-999999999", NumberError, "exponent"),
    ("1e" + "9" * 5000, NumberError, "exponent"),
    ("1/0", NumberError, "zero denominator"),
    ("nan", ValueError, "nan"), ("1/-2", ValueError, "1/-2"),
])
def test_parse_exact_refuses(text, kind, words):
    with pytest.raises(kind, match=re.escape(words)):
        parse_exact(text)


# ------------------------------------------------------------------------------ range, shape
@pytest.mark.parametrize("value", [Fraction(2) ** 1024, -Fraction(10) ** 400, "1e-320",
                                   5e-324, Fraction(1, 2 ** 1023)])
def test_values_outside_the_normal_float64_range(value):
    with raises_naming("target 0, token 0", "normal float64 range"):
        Dataset.from_arrays([[[0, 1]]], [[[value, 0]]])


@pytest.mark.parametrize("value", [Fraction(2) ** -1022, 2.2250738585072014e-308,
                                   1.7976931348623157e308, Fraction(2) ** 1024 - 1])
def test_values_at_the_ends_of_the_range(value):
    assert Dataset.from_arrays([[[0, 1]]], [[[value, 0]]]).targets[0][0, 0] == value


@pytest.mark.parametrize("bad", [5, None, "abc", {"a": 1}])
def test_sequences_that_are_not_a_list(bad):
    with raises_naming("inputs", "list of sequences"):
        Dataset.from_arrays(bad, [[[0, 0]]])
    with raises_naming("targets", "list of sequences"):
        Dataset.from_arrays([[[0, 0]]], bad)


@pytest.mark.parametrize("literal", ["1e-400", "-2.5e-999", "1e400"])
def test_a_bare_number_float64_cannot_hold_is_refused_not_rounded(tmp_path, literal):
    """A nonzero bare number that would read as 0 or inf is refused by the range rule, named
    by place, instead of becoming a different value."""
    text = f'{{"inputs": [[[1, 2], [{literal}, 3]]], "targets": [[[1, 2]]]}}'
    with raises_naming("input 0, token 1", "float64 range"):
        Dataset.from_json(write_json(tmp_path, text))


def test_causal_json_round_trip_keeps_floats_bit_for_bit(tmp_path):
    from exactformer import CausalDataset
    data = CausalDataset.from_arrays([[[0.1, 0.2], [0.3, 1 / 3]]], [[[0.3, 1 / 3], None]])
    back = CausalDataset.load(write_json(tmp_path, data.to_json_dict()))
    assert not back.exact
    assert back.inputs[0].tobytes() == data.inputs[0].tobytes()
    assert back.targets[0].tobytes() == data.targets[0].tobytes()
