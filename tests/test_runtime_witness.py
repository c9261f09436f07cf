"""The runtime proofs' witness search runs only on the sequences holding a pair (a position)
not proved (``runtime_verdict._open_sequences``): each sequence is evaluated on its own, and a
proved one is within the tolerance in every evaluation, so the verdict is the one a witness
pass over all of them gives (the passes take the sequences in batches and stop at the first
that misses). Checked against such a full pass, judged here
(docs/numerics.md#proofs-for-reduced-precision-runtimes)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from conftest import hausdorff

import exactformer as ef
from exactformer.data import builtin
from exactformer.data.text import text_embedding
from exactformer.verification.formats import get_format
from exactformer.verification.runtime_verdict import (
    ORDERS,
    _open_sequences,
    _scale,
    witness_pass,
)


def _nearest(vocab, v) -> int:
    """The vocabulary entry nearest v (the entries zero-padded to v's width)."""
    vocab = np.asarray(vocab, dtype=float)
    padded = np.pad(vocab, ((0, 0), (0, len(v) - vocab.shape[1])))
    return int(np.argmin(((padded - v) ** 2).sum(axis=1)))


def full_pass_miss(model, data, runtime: str, tol: float):
    """(order, error over the scale or wrong decodes) of the first witness order whose pass
    over every sequence misses, or None (the data padded to the model's width, as proved)."""
    data = data.padded(model.d)
    xs, ys = data.floats()
    for order in ORDERS:
        outs = witness_pass(model, xs, get_format(runtime), order)
        if isinstance(data, ef.CausalDataset):
            wrong = sum(_nearest(data.vocabulary, o[i]) != _nearest(data.vocabulary, y[i])
                        for o, y, k in zip(outs, ys, data.known, strict=True)
                        for i in np.flatnonzero(k))
            if wrong:
                return order, wrong
        else:
            err = max(hausdorff(o, y) for o, y in zip(outs, ys, strict=True)) / \
                float(_scale(data))
            if err > tol:
                return order, err
    return None


def _cases():
    xs, ys = builtin.demo().floats()
    third = ef.Dataset.from_arrays([x / 3 for x in xs], [y / 3 for y in ys])
    out = [(third, att, rt) for att in ("hardmax", "softmax") for rt in ("bfloat16", "float16")]
    rng = np.random.default_rng(1)
    for seed in (0, 2, 4):
        emb = {c: v + 0.3 * rng.standard_normal(3)
               for c, v in text_embedding("abcdefg", 3, seed=seed).items()}
        text = ef.CausalDataset.from_text(["abcabd", "bcadde", "cabfgb"], emb)
        out += [(text, "hardmax", "bfloat16"), (text, "softmax", "bfloat16")]
    return out


@pytest.mark.parametrize("data, attention, runtime", _cases())
def test_the_verdict_is_the_full_pass_verdict(data, attention, runtime):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        model = ef.compile(data, attention=attention, exact=False)
    v = ef.prove_runtime(model, data, runtime)
    miss = full_pass_miss(model, data, runtime, v.tolerance)
    assert (v.verdict == "FAILED") == (miss is not None), (v.table(), miss)
    if miss is not None:  # the first batch that misses, of those the full pass misses in
        assert miss[0] in v.witness
        if v.criterion == "decoding":
            wrong = int(v.witness.split("decodes ")[1].split(" of ")[0])
            assert 0 < wrong <= miss[1]
        else:
            assert v.tolerance < v.witness_error <= miss[1] * (1 + 1e-12)


def test_open_sequences_map_positions_to_their_sequences():
    """Causal data: the positions not proved, in data order, belong to these sequences."""
    data = ef.CausalDataset.from_text(["abca", "bc", "cabb"],
                                      text_embedding("abc", 2, seed=0))
    counts = [int(np.sum(k)) for k in data.known]
    held = np.ones(sum(counts), dtype=bool)
    held[counts[0] + counts[1] - 1] = False  # the last position of the second text
    assert _open_sequences(held, data) == [1]
    held[0] = False
    assert _open_sequences(held, data) == [0, 1]
    sets = builtin.demo()
    assert _open_sequences(np.array([True, False] * (sets.N // 2) + [True] * (sets.N % 2)),
                           sets) == list(range(1, 2 * (sets.N // 2), 2))
