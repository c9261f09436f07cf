"""The Hub-style folder of the native module (docs/numerics.md#the-hub-folder): what it holds,
that reading it back gives identical outputs, and its model card."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import exactformer as ef  # noqa: E402
from exactformer import export as et  # noqa: E402
from exactformer.data import CausalDataset, builtin  # noqa: E402


def outputs(module, data):
    return et.apply(module, data.floats()[0])


@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 10 ** 6), N=st.integers(1, 6), d=st.integers(2, 4),
       attention=st.sampled_from(["hardmax", "softmax"]),
       dtype=st.sampled_from([torch.float64, torch.float32]),
       ff=st.sampled_from(et.FF_FORMS))
def test_from_pretrained_gives_identical_outputs(tmp_path_factory, seed, N, d, attention,
                                                 dtype, ff):
    data = builtin.shared_pool(N=N, d=d, pool=N + 2, n_max=4, m_max=2, seed=seed)
    module = et.to_torch(ef.compile(data, attention=attention, seed=seed), dtype, ff=ff)
    folder = tmp_path_factory.mktemp("hub")
    module.save_pretrained(folder)
    back = et.NativeTransformer.from_pretrained(folder)
    assert back.ff == ff and next(back.parameters()).dtype == dtype
    for a, b in zip(outputs(module, data), outputs(back, data), strict=True):
        assert np.array_equal(a, b)


def test_the_folder_holds_config_weights_card_and_the_exact_model(tmp_path):
    data = builtin.demo()
    model = ef.compile(data, width=8)
    report = ef.verify(model, data)
    et.to_torch(model).save_pretrained(tmp_path, data=data, report=report)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["README.md", "config.json", "model.json", "model.safetensors"]
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["layout"] == "native" and config["d"] == data.d
    card = (tmp_path / "README.md").read_text()
    assert data.sha256() in card and f"| sequences N | {data.N} |" in card
    assert f"| blocks L | {model.n_blocks} |" in card and "PROVED EXACT" in card
    again = ef.verify(ef.load_model(tmp_path / "model.json"), data)
    assert again.proved  # the exact model re-proves from the folder alone


def test_data_hash_names_the_data():
    a, b = builtin.demo(), builtin.shared_pool(N=3, d=2, pool=4, n_max=3, m_max=2, seed=0)
    assert a.sha256() == builtin.demo().sha256() != b.sha256()


def test_causal_folder_and_card(tmp_path):
    data = CausalDataset.from_arrays([[[1, 0], [0, 1]], [[0, 1], [1, 1]]],
                                     [[[2, 2], None], [[1, 0], [3, 0]]])
    module = et.to_torch(ef.compile(data))
    module.save_pretrained(tmp_path, data=data)
    back = et.NativeTransformer.from_pretrained(tmp_path)
    assert back.causal and torch.equal(back.positions, module.positions)
    assert "| constrained positions | 3 |" in (tmp_path / "README.md").read_text()
    assert all(np.array_equal(a, b) for a, b in
               zip(outputs(module, data), outputs(back, data), strict=True))


def test_from_pretrained_refuses_a_folder_it_did_not_write(tmp_path):
    with pytest.raises(ValueError, match="config.json"):
        et.NativeTransformer.from_pretrained(tmp_path)
    et.save_lens(ef.compile(builtin.demo()), tmp_path)  # a transformer-lens folder
    with pytest.raises(ValueError, match="layout"):
        et.NativeTransformer.from_pretrained(tmp_path)
