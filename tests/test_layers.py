"""Shapes users choose: compile(data, n_layers=K) and build --layers K (README), and info's
n_layers × d_model × d_mlp × n_heads."""

from __future__ import annotations

import json
import re

import pytest
from conftest import assert_interpolates_exactly
from hypothesis import given, settings
from hypothesis import strategies as st

import exactformer as ef
from exactformer import cli
from exactformer.data import CausalDataset, builtin
from exactformer.summary import model_summary


def fewest(dataset, **kw) -> int:
    """The fewest blocks the construction allows, read from the refusal of n_layers = 1."""
    with pytest.raises(ValueError, match="too few") as e:
        ef.compile(dataset, n_layers=1, **kw)
    return int(re.search(r"at least (\d+) blocks", str(e.value)).group(1))


@settings(max_examples=5, deadline=None)
@given(seed=st.integers(0, 10 ** 6), N=st.integers(2, 6), d=st.integers(2, 4),
       attention=st.sampled_from(["hardmax", "softmax"]), slack=st.integers(0, 20),
       construction=st.sampled_from(["keyed", "paper"]))
def test_n_layers_gives_at_most_k_blocks_or_names_the_fewest(seed, N, d, attention, slack,
                                                             construction):
    data = builtin.shared_pool(N=N, d=d, pool=N + 2, n_max=4, m_max=3, seed=seed)
    kw = {"attention": attention, "construction": construction}
    low = fewest(data, **kw)
    with pytest.raises(ValueError, match=f"at least {low} blocks"):
        ef.compile(data, n_layers=low - 1, **kw) if low > 1 else \
            ef.compile(data, n_layers=0, **kw)
    model = ef.compile(data, n_layers=low + slack, **kw)
    assert model.n_blocks <= low + slack
    if attention == "hardmax":
        assert_interpolates_exactly(model, data)
    # the width chosen is the narrowest that fits: one hat fewer per layer does not (a hat
    # model's widest layer is the width asked for; a keyed model's may be narrower)
    narrower = model.max_width() - 4
    if construction == "paper" and narrower >= 4 and model.max_heads() <= 1:
        tighter = ef.compile(data, width=narrower, **kw)
        assert tighter.n_blocks > low + slack or tighter.max_width() < narrower


def test_the_default_shape_is_kept_when_it_fits():
    data = builtin.demo()
    plain = ef.compile(data)
    chosen = ef.compile(data, n_layers=plain.n_blocks + 100)
    assert (chosen.n_blocks, chosen.max_width(), chosen.max_heads()) == \
        (plain.n_blocks, plain.max_width(), plain.max_heads())


def test_causal_models_fit_too():
    data = CausalDataset.from_arrays(
        [[[1, 0], [0, 1], [1, 1]], [[0, 1], [0, 1], [1, 0]], [[1, 1], [1, 0], [0, 1]]],
        [[[2, 0], [0, 2], [1, 2]], [[0, 3], [3, 3], None], [[1, 0], [2, 1], [0, 0]]])
    low = fewest(data)
    assert ef.compile(data, n_layers=low).n_blocks <= low


def test_n_layers_and_width_are_not_both_given():
    with pytest.raises(ValueError, match="not both"):
        ef.compile(builtin.demo(), n_layers=10, width=8)


def test_cli_build_layers_and_info_shape(tmp_path, capsys):
    data = builtin.demo()
    (tmp_path / "d.json").write_text(json.dumps(data.to_json_dict()))
    out = tmp_path / "m.json"
    assert cli.main(["build", str(tmp_path / "d.json"), "-o", str(out), "--layers", "12"]) == 0
    model = ef.load_model(out)
    assert model.n_blocks <= 12
    capsys.readouterr()
    assert cli.main(["info", str(out)]) == 0
    shape = f"{model.n_blocks} × {model.d} × {model.max_width()} × {model.max_heads()}"
    assert re.search(r"n_layers × d_model × d_mlp × n_heads +" + shape, capsys.readouterr().out)
    assert cli.main(["build", str(tmp_path / "d.json"), "-o", str(tmp_path / "x.json"),
                     "--layers", "2"]) == 2
    err = capsys.readouterr().err
    assert "too few" in err and "at least" in err and not (tmp_path / "x.json").exists()


@pytest.mark.parametrize("make", [
    lambda: ef.compile(builtin.demo()),
    lambda: ef.compile(builtin.demo(), construction="paper", attention="softmax"),
    lambda: ef.compile(CausalDataset.from_text("a short text, recited")),
])
def test_info_prints_the_shape_of_the_transformer_lens_export(make):
    """The row is the exported config's own shape: a model without attention gets the one
    head TransformerLens needs, a non-residual one the doubled stream."""
    pytest.importorskip("torch")
    from exactformer.export.transformer_lens import lens_config
    model = make()
    cfg = lens_config(model)
    rows = dict(model_summary(model))
    want = " × ".join(str(cfg[k]) for k in ("n_layers", "d_model", "d_mlp", "n_heads"))
    assert rows["TransformerLens export, the same"] == want
