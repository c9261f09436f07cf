"""The ResNet baseline interpolates exactly, its size follows its formula, its check can fail."""

import warnings
from fractions import Fraction

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from exactformer import Dataset, DatasetError
from exactformer.data import builtin
from exactformer.tools.resnet import build_resnet, flatten, resnet_param_count, verify_resnet


@st.composite
def small_datasets(draw):
    """Pairs over a pool of integer tokens with no zero coordinate (no padding ambiguity);
    targets come from the same pool, so targets that are other inputs (and cycles) occur."""
    d = draw(st.integers(2, 3))
    pool = draw(st.lists(st.tuples(*[st.integers(1, 3)] * d), min_size=2, max_size=6,
                         unique=True))
    N = draw(st.integers(1, 5))
    xs, ys = [], []
    for _ in range(N):
        x = draw(st.lists(st.sampled_from(pool), min_size=1, max_size=4, unique=True))
        y = draw(st.lists(st.sampled_from(pool), min_size=1, max_size=len(x), unique=True))
        xs.append([list(t) for t in x])
        ys.append([list(t) for t in y])
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return Dataset.from_arrays(xs, ys)
    except DatasetError:
        assume(False)


# An input that waits on a 2-cycle without being on it (pair 0 → input 3 ⇄ input 1): breaking
# the cycle at the first unfinished input instead of on the cycle looped forever.
TAIL_INTO_CYCLE = Dataset.from_arrays(
    [[[2, 1], [1, 1]], [[1, 1]], [[1, 1], [2, 3], [2, 1]], [[2, 3]]],
    [[[2, 3]], [[2, 3]], [[1, 1], [2, 1], [2, 3]], [[1, 1]]])


def wait_for_cycles(data) -> int:
    """Cycles of "input x's target is input x′" among the inputs that move: each needs exactly
    one step aside, however many other inputs wait on it."""
    X, Y = flatten(data)
    target = {tuple(x): tuple(y) for x, y in zip(X.tolist(), Y.tolist(), strict=True) if x != y}
    cycles, seen = 0, set()
    for start in target:
        path, node = [], start
        for _ in range(len(target)):
            if node not in target or node in seen:
                break
            seen.add(node)
            path.append(node)
            node = target[node]
        cycles += node in path
    return cycles


def expected_params(net, data) -> int:
    X, Y = flatten(data)
    moving = {tuple(x) for x, y in zip(X.tolist(), Y.tolist(), strict=True) if x != y}
    assert net.meta["moved"] == len(moving)
    assert net.meta["cycles"] == wait_for_cycles(data)
    return resnet_param_count(len(moving) + net.meta["cycles"], X.shape[1])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(small_datasets(), st.integers(0, 3))
@example(TAIL_INTO_CYCLE, 3)
def test_interpolates_exactly_on_random_data(data, seed):
    net = build_resnet(data, seed=seed)
    report = verify_resnet(net, data)
    assert report.ok and report.max_width <= 4
    assert report.max_error_float64 < 1e-9
    assert net.n_params() == expected_params(net, data)


def test_float_data_and_count_grows_with_n():
    for n in (5, 20):
        data = builtin.uniform(N=4, n=n, m=2, d=2, seed=1)
        net = build_resnet(data)
        assert verify_resnet(net, data).ok
        assert net.n_blocks == 4 and net.meta["cycles"] == 0
        assert net.n_params() == resnet_param_count(4, n * 2) == 4 * 4 * (2 * 2 * n + 1)


def test_swapped_targets_need_one_extra_block():
    data = Dataset.from_arrays([[[1, 2]], [[3, 4]], [[5, 6]]], [[[3, 4]], [[1, 2]], [[9, 9]]])
    net = build_resnet(data)
    assert verify_resnet(net, data).ok
    assert net.meta["cycles"] == 1 and net.n_blocks == 4


def test_input_waiting_on_a_cycle_it_is_not_on():
    net = build_resnet(TAIL_INTO_CYCLE, seed=3)
    assert verify_resnet(net, TAIL_INTO_CYCLE).ok
    # inputs 0, 1, 2 and 3 move once each; the cycle 1 ⇄ 3 costs one step aside, pair 0 none
    assert net.meta["cycles"] == 1 and net.meta["moved"] == 4 and net.n_blocks == 5


def test_input_equal_to_target_costs_nothing():
    data = Dataset.from_arrays([[[1, 2], [3, 4]], [[5, 6]]], [[[1, 2], [3, 4]], [[0, 1]]])
    net = build_resnet(data)
    assert verify_resnet(net, data).ok and net.n_blocks == 1


def test_verification_catches_a_perturbed_model():
    data = builtin.demo()
    net = build_resnet(data)
    assert verify_resnet(net, data).ok
    net.blocks[0].W[0, 0] += Fraction(1, 7)
    report = verify_resnet(net, data)
    assert not report.ok and report.max_error_float64 > 1e-3


def test_trailing_zero_token_ambiguity_is_an_error():
    data = Dataset.from_arrays([[[1, 2]], [[1, 2], [0, 0]]], [[[5, 5]], [[6, 6]]])
    with pytest.raises(ValueError, match="cannot tell them apart"):
        build_resnet(data)
