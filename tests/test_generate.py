"""The built-in data families refuse impossible requests instead of drawing forever."""

import numpy as np
import pytest

from exactformer.data import builtin


@pytest.mark.parametrize("make, match", [
    # 3 tokens give only 6 distinct sequences of 1 or 2 tokens
    (lambda: builtin.shared_pool(N=10, d=2, pool=3, n_max=2), "only 6 distinct of the 10"),
    # 5 words give only 5 distinct sets of 4
    (lambda: builtin.vocabulary(N=20, vocab=5, n=4, m=2, d=2), "only 5 distinct of the 20"),
    # a pool of 200 distinct tokens does not fit in {-6..6}^2 (169 points)
    (lambda: builtin.shared_pool(N=2, d=2, pool=200, n_max=2), "there are only 169"),
])
def test_impossible_requests_raise(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_possible_requests_draw_distinct_sequences():
    data = builtin.vocabulary(N=5, vocab=5, n=4, m=2, d=2, seed=0)  # all 5 sets of 4
    assert len({frozenset(map(tuple, x.tolist())) for x in data.inputs}) == 5
    pool = builtin.shared_pool(N=6, d=2, pool=3, n_max=2, seed=0)  # all 6 sequences
    assert pool.N == 6
    assert np.all([len(x) <= 2 for x in pool.inputs])
