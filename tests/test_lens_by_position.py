"""An attention-free TransformerLens export run position by position (docs/export.md).

``export --data`` and ``lens_helpers.generate`` run a bridge whose attention weights are all
zero (position keys) as length-1 sequences, one per position, instead of one quadratic pass.
References: the bridge's own full forward pass on the padded batch, and the targets.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformer_lens")

import exactformer as ef  # noqa: E402
from exactformer import export as et  # noqa: E402
from exactformer.data import CausalDataset  # noqa: E402
from exactformer.export import lens_helpers  # noqa: E402
from exactformer.export.lens_files import lens_run  # noqa: E402


def texts_data(seed: int, n_texts: int) -> CausalDataset:
    """Random texts over a small alphabet in R^2 (next character as target); one text needs
    position keys only, several with a shared second character need attention."""
    rng = np.random.default_rng(seed)
    alphabet = rng.permutation(np.arange(-40, 40))[:12].reshape(6, 2)
    lengths = rng.integers(2, 9, n_texts)
    texts = [[k] + [1] + list(rng.integers(0, 6, n - 2)) for k, n in enumerate(lengths)]
    return CausalDataset.from_arrays([[alphabet[c].tolist() for c in t] for t in texts],
                                     [[alphabet[c].tolist() for c in t[1:]] + [None]
                                      for t in texts])


def full_pass(bridge, data):
    x, mask = et.lens_batch(bridge, data.floats()[0], data.d)
    with torch.no_grad():
        return bridge(x, return_type="logits", attention_mask=mask), mask


def record_lengths(monkeypatch, bridge) -> list[int]:
    """The sequence length of every forward pass the bridge runs from now on."""
    seen: list[int] = []
    run = bridge.run_with_hooks

    def recording(x, *args, **kwargs):
        seen.append(x.shape[1])
        return run(x, *args, **kwargs)

    monkeypatch.setattr(bridge, "run_with_hooks", recording)
    return seen


@pytest.mark.parametrize("seed", range(3))
def test_position_by_position_equals_the_full_pass(monkeypatch, seed):
    data = texts_data(seed, 1)
    bridge = et.to_lens(ef.compile(data, exact=False))
    assert lens_helpers.attention_free(bridge)
    full, mask = full_pass(bridge, data)
    x, _ = et.lens_batch(bridge, data.floats()[0], data.d)
    monkeypatch.setattr(lens_helpers, "CHUNK_ROWS", 3)  # several passes, a ragged last one
    seen = record_lengths(monkeypatch, bridge)
    rows = lens_helpers.by_position(bridge, x)
    assert seen and set(seen) == {1}
    assert torch.equal(rows[mask.bool()], full[mask.bool()])


def test_the_check_of_an_attention_free_model_runs_no_full_pass(monkeypatch):
    data = texts_data(7, 1)
    bridge = et.to_lens(ef.compile(data))
    seen = record_lengths(monkeypatch, bridge)
    verdict = et.lens_verdict(bridge, data)
    assert set(seen) == {1}
    assert verdict.interpolates and verdict.error == 0
    assert verdict.score_margin is None  # no two distinct scores, as in the full pass


def test_a_model_with_attention_is_checked_in_one_full_pass(monkeypatch):
    data = texts_data(3, 3)  # texts that agree on position 1 and continue differently
    bridge = et.to_lens(ef.compile(data))
    assert not lens_helpers.attention_free(bridge)
    seen = record_lengths(monkeypatch, bridge)
    verdict = et.lens_verdict(bridge, data)
    assert seen == [max(len(s) for s in data.inputs)]
    assert verdict.interpolates and verdict.score_margin is not None


def test_a_non_finite_position_falls_back_to_the_full_pass(monkeypatch):
    data = texts_data(5, 1)
    bridge = et.to_lens(ef.compile(data, exact=False))
    inputs = [s.copy() for s in data.floats()[0]]
    inputs[0][0, 0] = np.inf  # a non-finite residual at position 0 reaches every later one
    seen = record_lengths(monkeypatch, bridge)
    outputs, _ = lens_run(bridge, inputs, data.d)
    assert seen[-1] == len(inputs[0]) and 1 in seen  # by position first, then the full pass
    assert not np.isfinite(outputs[0][-1]).all()  # the full pass's NaN, not a finite row


def test_a_single_zero_weight_is_not_attention_free():
    bridge = et.to_lens(ef.compile(texts_data(1, 1)))
    assert lens_helpers.attention_free(bridge)
    with torch.no_grad():
        bridge.blocks[0].attn.k.bias[0] = 1.0  # scores still 0 here (q = 0), but not free
    assert not lens_helpers.attention_free(bridge)


def test_by_position_gives_back_the_thread_count(monkeypatch):
    bridge = et.to_lens(ef.compile(texts_data(2, 1)))
    x, _ = et.lens_batch(bridge, texts_data(2, 1).floats()[0], 2)
    threads = torch.get_num_threads()
    seen = []
    run = bridge.run_with_hooks
    monkeypatch.setattr(bridge, "run_with_hooks",
                        lambda *a, **k: seen.append(torch.get_num_threads()) or run(*a, **k))
    lens_helpers.by_position(bridge, x)
    assert seen and set(seen) == {1} and torch.get_num_threads() == threads
