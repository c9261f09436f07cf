"""The TransformerLens export (README, docs/numerics.md#the-transformerlens-export).

References: the targets (float64 TL forward within 1e-9 of the coordinate scale), the exact
evaluator for hand-made non-residual layers, and TransformerLens's own loading path
(``TransformerBridgeConfig(**config)`` → ``boot_native`` → ``load_state_dict(strict=True)``).
"""

from __future__ import annotations

import json
import re
from fractions import Fraction

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformer_lens")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from transformer_lens.config import TransformerBridgeConfig  # noqa: E402
from transformer_lens.model_bridge import TransformerBridge  # noqa: E402

import exactformer as ef  # noqa: E402
from exactformer import cli  # noqa: E402
from exactformer import export as et  # noqa: E402
from exactformer.data import CausalDataset, builtin  # noqa: E402
from exactformer.export import lens_helpers  # noqa: E402
from exactformer.model import FF, SA, Block, Head, ScoreMatrix, Transformer, ValueMatrix  # noqa: E402

SHAPES = [(4, 1), (8, 2), (12, 3)]  # (width, heads): narrow, wide and multi-head


def set_data(draw) -> ef.Dataset:
    kind = draw(st.sampled_from(["pool", "uniform", "nested"]))
    seed, N, d = draw(st.integers(0, 10 ** 6)), draw(st.integers(1, 7)), draw(st.integers(2, 4))
    if kind == "pool":
        return builtin.shared_pool(N=N, d=d, pool=N + 2, n_max=4, m_max=2, seed=seed)
    if kind == "uniform":
        return builtin.uniform(N=N, n=3, m=2, d=d, seed=seed)
    return builtin.nested(N=max(N, 2), d=d, seed=seed)


def causal_data(draw) -> CausalDataset:
    """Sequences over a small pool with a target (or null) per position, equal prefixes
    given equal targets."""
    d = draw(st.integers(2, 3))
    coord = st.integers(-3, 3)
    pool = draw(st.lists(st.tuples(*[coord] * d), min_size=2, max_size=4, unique=True))
    seqs = draw(st.lists(st.lists(st.integers(0, len(pool) - 1), min_size=1, max_size=5),
                         min_size=1, max_size=8))
    by_prefix: dict[tuple, object] = {}
    ys = [[by_prefix.setdefault(tuple(s[: i + 1]),
                                None if draw(st.booleans()) and i else
                                list(draw(st.sampled_from(pool)))) for i in range(len(s))]
          for s in seqs]
    return CausalDataset.from_arrays([[list(pool[t]) for t in s] for s in seqs], ys)


@settings(max_examples=10, deadline=None)
@given(st.data(), st.sampled_from(["hardmax", "softmax"]), st.sampled_from(SHAPES))
def test_set_models_reproduce_their_targets_through_transformer_lens(data, attention, shape):
    dataset = set_data(data.draw)
    model = ef.compile(dataset, attention=attention, width=shape[0], heads=shape[1])
    verdict = et.lens_verdict(et.to_lens(model), dataset)
    assert verdict.error <= 1e-9 and verdict.interpolates
    if attention == "hardmax":
        assert verdict.hardmax_exact


@settings(max_examples=10, deadline=None)
@given(st.data(), st.sampled_from(["hardmax", "softmax"]), st.sampled_from(SHAPES[:2]))
def test_causal_models_reproduce_their_targets_through_transformer_lens(data, attention, shape):
    dataset = causal_data(data.draw)
    model = ef.compile(dataset, attention=attention, width=shape[0], heads=shape[1])
    bridge = et.to_lens(model)
    assert bridge.cfg.attention_dir == "causal"
    assert bridge.cfg.n_ctx == len(model.positions)
    verdict = et.lens_verdict(bridge, dataset)
    assert verdict.error <= 1e-9 and verdict.interpolates
    assert verdict.hardmax_exact is (True if attention == "hardmax" else None)


def boot_from_files(folder):
    """What a user without exactformer does with the folder."""
    config = json.loads((folder / "config.json").read_text())
    bridge = TransformerBridge.boot_native(TransformerBridgeConfig(**config),
                                           dtype=getattr(torch, config["dtype"]))
    bridge.load_state_dict(load_file(str(folder / "model.safetensors")), strict=True)
    return bridge


@pytest.mark.parametrize("dtype", et.LENS_DTYPES)
def test_the_folder_rebuilds_with_transformer_lens_alone(tmp_path, dtype):
    data = builtin.demo()
    model = ef.compile(data, width=8, heads=2)
    config = et.save_lens(model, tmp_path, dtype)
    assert json.loads((tmp_path / "config.json").read_text()) == config
    bridge = boot_from_files(tmp_path)
    assert next(bridge.parameters()).dtype == getattr(torch, dtype)
    assert set(load_file(str(tmp_path / "model.safetensors"))) == set(bridge.state_dict())
    xs = data.floats()[0]
    same = et.lens_apply(et.to_lens(model, dtype), xs, data.d)
    assert all(np.array_equal(a, b) for a, b in
               zip(et.lens_apply(bridge, xs, data.d), same, strict=True))


def test_the_folders_own_loader_is_strict_loading(tmp_path):
    """lens_helpers.load_strictly puts every tensor where load_state_dict(strict=True) does,
    and refuses a state with a name missing, an extra name or a shape that differs."""
    model = ef.compile(builtin.demo(), attention="softmax", width=8, heads=2)
    et.save_lens(model, tmp_path, "float64")
    reference = boot_from_files(tmp_path).state_dict()
    state = load_file(str(tmp_path / "model.safetensors"))
    ours = et.to_lens(model, "float64").state_dict()
    assert ours.keys() == reference.keys()
    assert all(torch.equal(ours[k], reference[k]) for k in reference)
    config = json.loads((tmp_path / "config.json").read_text())
    name = next(k for k in state if k.endswith("mlp.in.weight"))
    bad = [{k: v for k, v in state.items() if k != name},
           {**state, "blocks.0.extra": state[name]},
           {**state, name: state[name][:1]}]  # would broadcast
    for broken in bad:
        with pytest.raises(ValueError, match="state does not fit|shape"):
            lens_helpers.boot(config, broken)


def test_input_is_the_residual_stream_and_padding_is_masked():
    data = builtin.shared_pool(N=6, d=3, pool=7, n_max=5, m_max=2, seed=4)
    model = ef.compile(data, attention="softmax")
    bridge = et.to_lens(model)
    xs = data.floats()[0]
    assert {len(x) for x in xs} != {len(xs[0])}  # the batch is padded
    batched = et.lens_apply(bridge, xs, data.d)
    x, mask = et.lens_batch(bridge, xs[:1], data.d)
    assert x.shape == (1, len(xs[0]), bridge.cfg.d_model) and bool(mask.all())
    with torch.no_grad():
        alone = bridge(x, return_type="logits")
    assert alone.shape[-1] == model.d > data.d  # a keyed model: its own coordinates
    assert np.allclose(alone[0].double().numpy(), batched[0], rtol=0, atol=1e-12)


def test_hardmax_patterns_are_exactly_zero_or_one_over_the_tie_count():
    data = builtin.demo()
    model = ef.compile(data, width=8, heads=2)
    bridge = et.to_lens(model)
    x, mask = et.lens_batch(bridge, data.floats()[0], data.d)
    _, cache = bridge.run_with_cache(x, attention_mask=mask)
    for i in range(bridge.cfg.n_layers):
        pattern = cache[f"blocks.{i}.attn.hook_pattern"][mask.bool()[:, None, :, None]
                                                         .expand(-1, bridge.cfg.n_heads, -1,
                                                                 x.shape[1])]
        rows = pattern.reshape(-1, x.shape[1])
        count = (rows > 0).sum(dim=-1, keepdim=True)
        assert torch.all((rows == 0) | (rows == 1 / count.double()))


def rational_layer(rng, d: int) -> tuple[FF, SA]:
    """A non-residual FF (η = 0) and a non-residual two-head SA (ρ = 1/2) of small rationals."""
    def r(*shape):
        return np.array([Fraction(int(v), 4) for v in rng.integers(-4, 5, size=shape).flat],
                        dtype=object).reshape(shape)
    ff = FF(Fraction(0), r(3, d), r(3), r(d, 3))
    heads = [Head(ScoreMatrix(Fraction(1, 2), r(d), r(d)),
                           ValueMatrix(Fraction(1), r(d), r(d))) for _ in range(2)]
    return ff, SA(Fraction(1, 2), heads=heads)


@pytest.mark.parametrize("attention", ["hardmax", "softmax"])
def test_non_residual_layers_take_turns_in_a_stream_of_width_2d(attention):
    rng = np.random.default_rng(5)
    d = 3
    blocks = [Block(*rational_layer(rng, d)) for _ in range(3)]
    model = Transformer(d=d, attention=attention, blocks=blocks,
                        tau=Fraction(1, 2) if attention == "softmax" else None)
    config = et.lens_config(model)
    assert config["d_model"] == 2 * d and config["n_heads"] == 2
    xs = [np.array([[Fraction(int(v), 2) for v in row] for row in rng.integers(-3, 4, (n, d))],
                   dtype=object) for n in (2, 4, 3)]
    ref = ef.forward(model, xs, "exact" if attention == "hardmax" else "mp")
    out = et.lens_apply(et.to_lens(model), xs, d)
    scale = max(1.0, max(float(np.abs(np.asarray(r, float)).max()) for r in ref))
    assert max(float(np.abs(o - np.asarray(r, float)).max())
               for o, r in zip(out, ref, strict=True)) <= 1e-12 * scale


def test_a_score_scale_outside_the_dtype_is_refused():
    head = SA(Fraction(1), ScoreMatrix(Fraction(10) ** 200, np.array([0, 0], dtype=object),
                                       np.array([0, 0], dtype=object)),
              ValueMatrix(Fraction(1), np.array([0, 0], dtype=object),
                          np.array([0, 0], dtype=object)))
    model = Transformer(d=2, attention="hardmax", blocks=[Block(None, head)])
    assert et.hardmax_exponent(model, "float64") < 0
    with pytest.raises(ValueError, match="cannot be scaled to softmax in float32"):
        et.lens_config(model, "float32")


def test_cli_exports_a_folder_and_judges_it(tmp_path, capsys):
    data = builtin.shared_pool(N=5, d=3, pool=6, n_max=4, m_max=2, seed=2)
    (tmp_path / "d.json").write_text(json.dumps(data.to_json_dict()))
    ef.save_model(ef.compile(data, attention="softmax", width=8), tmp_path / "m.json")
    out = tmp_path / "tl"
    assert cli.main(["export", str(tmp_path / "m.json"), "-o", str(out), "--layout",
                     "transformer-lens", "--data", str(tmp_path / "d.json")]) == 0
    assert re.search(r"transformer-lens float64 +INTERPOLATES", capsys.readouterr().out)
    assert sorted(p.name for p in out.iterdir()) == ["circuit.json", "config.json",
                                                      "lens_helpers.py", "model.safetensors",
                                                      "runtime_proofs.json"]
    proofs = json.loads((out / "runtime_proofs.json").read_text())
    assert proofs["float32"]["verdict"] == ef.prove_runtime(ef.load_model(tmp_path / "m.json"),
                                                            data, "float32").verdict
    assert cli.main(["export", str(tmp_path / "m.json"), "-o", str(out), "--layout",
                     "transformer-lens"]) == 0  # no data: no proof of other weights stays
    assert not (out / "runtime_proofs.json").exists() and not (out / "circuit.json").exists()
    assert cli.main(["export", str(tmp_path / "m.json"), "-o", str(tmp_path / "x"),
                     "--data", str(tmp_path / "d.json")]) == 2
    assert "--layout transformer-lens" in capsys.readouterr().err


def cached_margin(bridge, xs, d) -> float | None:
    """The smallest best-minus-second scaled score, from a cache of every layer (small
    models only): each real query's scores over the keys it may see, sorted."""
    x, mask = et.lens_batch(bridge, xs, d)
    with torch.no_grad():
        _, cache = bridge.run_with_cache(x, attention_mask=mask)
    gaps = []
    for i in range(bridge.cfg.n_layers):
        q, k = cache[f"blocks.{i}.attn.hook_q"], cache[f"blocks.{i}.attn.hook_k"]
        for b, seq in enumerate(xs):
            for h in range(bridge.cfg.n_heads):
                for t in range(len(seq)):
                    seen = t + 1 if bridge.cfg.attention_dir == "causal" else len(seq)
                    s = sorted(set((k[b, :seen, h] @ q[b, t, h] / bridge.cfg.attn_scale)
                                   .tolist()), reverse=True)
                    if len(s) > 1:
                        gaps.append(s[0] - s[1])
    return min(gaps) if gaps else None


@pytest.mark.parametrize("causal", [False, True])
def test_the_check_takes_its_margins_layer_by_layer_without_a_cache(monkeypatch, causal):
    # causal: the same token at the same position continues differently, so the model
    # needs attention (separation), not position keys alone
    data = (CausalDataset.from_arrays([[[1, 0], [1, 1]], [[0, 1], [1, 1]]],
                                      [[None, [2, 0]], [None, [0, 2]]])
            if causal else builtin.demo())
    bridge = et.to_lens(ef.compile(data, width=8, heads=2))
    xs = data.padded(bridge.cfg.d_vocab_out).floats()[0]
    expected = cached_margin(bridge, xs, bridge.cfg.d_vocab_out)
    assert expected is not None

    def no_cache(*args, **kwargs):
        raise AssertionError("the check must not cache every layer")

    monkeypatch.setattr(bridge, "run_with_cache", no_cache)
    verdict = et.lens_verdict(bridge, data)
    assert verdict.interpolates
    assert verdict.score_margin == pytest.approx(expected, rel=1e-12)


def test_cli_export_check_shows_a_progress_bar(tmp_path, capsys):
    data = builtin.demo()
    (tmp_path / "d.json").write_text(json.dumps(data.to_json_dict()))
    ef.save_model(ef.compile(data), tmp_path / "m.json")
    for flag, shown in (("--progress", True), ("--no-progress", False)):
        assert cli.main(["export", str(tmp_path / "m.json"), "-o", str(tmp_path / flag),
                         "--layout", "transformer-lens", "--data", str(tmp_path / "d.json"),
                         flag]) == 0
        assert ("transformer-lens check" in capsys.readouterr().err) is shown


RECIPE = '''
import json, sys
sys.modules["exactformer"] = None  # exactformer cannot be imported here
folder = sys.argv[1]
sys.path.insert(0, folder)
import torch
from lens_helpers import generate, load_bridge, pad_batch, read_outputs

job = json.load(open(folder + "/job.json"))
bridge = load_bridge(folder)
out = {"attention_free": None}
if "inputs" in job:
    x, mask = pad_batch(job["inputs"], bridge.cfg.d_model)
    with torch.no_grad():
        logits, cache = bridge.run_with_cache(x, attention_mask=mask)
    out["outputs"] = [y.tolist() for y in read_outputs(logits, mask)]
else:
    from lens_helpers import attention_free
    vocab = job["vocab"]
    out["attention_free"] = attention_free(bridge)
    out["generated"] = [generate(bridge, [vocab[first]], steps, vocab)
                        for first, steps in job["prompts"]]
json.dump(out, open(folder + "/out.json", "w"))
'''


def run_recipe(folder, job: dict) -> dict:
    """The recipe of docs/export.md in a fresh interpreter where exactformer is not
    importable: the folder's helper file, TransformerLens and torch only."""
    import subprocess
    import sys

    (folder / "job.json").write_text(json.dumps(job))
    (folder / "recipe.py").write_text(RECIPE)
    subprocess.run([sys.executable, str(folder / "recipe.py"), str(folder)], check=True,
                   env={"PATH": "/usr/bin:/bin"}, capture_output=True)
    return json.loads((folder / "out.json").read_text())


def test_the_helper_file_imports_no_exactformer(tmp_path):
    import ast

    et.save_lens(ef.compile(builtin.demo()), tmp_path)
    tree = ast.parse((tmp_path / "lens_helpers.py").read_text())
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert names and not [n for n in names if n.split(".")[0] in ("exactformer", "")]


def test_the_recipe_reproduces_a_set_models_targets_with_transformer_lens_alone(tmp_path):
    data = builtin.shared_pool(N=5, d=3, pool=6, n_max=4, m_max=2, seed=2)
    et.save_lens(ef.compile(data, keys=True), tmp_path)  # keyed: d_model > d
    assert json.loads((tmp_path / "config.json").read_text())["d_model"] > data.d
    xs, ys = data.floats()
    out = run_recipe(tmp_path, {"inputs": [x.tolist() for x in xs]})["outputs"]
    scale = max(float(np.abs(np.concatenate(xs + ys)).max()), 1.0)
    for x, y, o in zip(xs, ys, out, strict=True):
        o = np.asarray(o)[:, : data.d]
        assert len(o) == len(x)
        dist = np.linalg.norm(o[:, None, :] - y[None, :, :], axis=-1)  # outputs × targets
        assert max(dist.min(axis=1).max(), dist.min(axis=0).max()) <= 1e-9 * scale


@pytest.mark.parametrize("texts", [["It is a truth universally acknowledged, that a single "
                                    "man in possession of a good fortune, must be in want."],
                                   ["1abcab", "2abcba", "3abcbb"]])
def test_a_causal_text_model_generates_its_text_with_transformer_lens_alone(tmp_path, texts):
    alphabet = sorted(set("".join(texts)))
    rng = np.random.default_rng(0)
    vocab = rng.permutation(np.arange(-60, 60))[: 2 * len(alphabet)].reshape(-1, 2)
    code = {c: vocab[k].tolist() for k, c in enumerate(alphabet)}
    data = CausalDataset.from_arrays([[code[c] for c in t] for t in texts],
                                     [[code[c] for c in t[1:]] + [None] for t in texts])
    et.save_lens(ef.compile(data, exact=False), tmp_path)
    out = run_recipe(tmp_path, {"vocab": vocab.tolist(), "prompts": [
        [alphabet.index(t[0]), len(t) - 1] for t in texts]})
    assert out["attention_free"] is (len(texts) == 1)  # position keys, or separation
    assert [t[0] + "".join(alphabet[i] for i in g) for t, g in
            zip(texts, out["generated"], strict=True)] == texts


@pytest.mark.parametrize("fault", ["{", "[]", "no-d_model", "weights"])
def test_a_broken_lens_folder_is_one_error_naming_the_file(tmp_path, fault):
    from exactformer.export.hub import FolderError
    et.save_lens(ef.compile(builtin.demo()), tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    if fault == "weights":
        (tmp_path / "model.safetensors").write_bytes(b"garbage")
    elif fault == "no-d_model":
        (tmp_path / "config.json").write_text(json.dumps({k: v for k, v in config.items()
                                                          if k != "d_model"}))
    else:
        (tmp_path / "config.json").write_text(fault)
    with pytest.raises(FolderError, match=str(tmp_path)):
        et.load_lens(tmp_path)


def test_a_softmax_export_below_tau_one_half_is_not_judged_as_hardmax(tmp_path, capsys):
    """A softmax model at τ = 1/4 exports with attn_scale 2τ = 1/2 < 1, which the verdict
    read as a hardmax export: it demanded score gaps of 746 that softmax never needs and
    printed FAILS (exit 1) for a folder that reproduces its data to 4e-17. The check here is
    TransformerLens's own loading path and the test's own error."""
    data = builtin.shared_pool(6, 2, 5, 3, 2, seed=1)
    model = ef.compile(data, attention="softmax", tau=Fraction(1, 4))
    ef.save_model(model, tmp_path / "m.json")
    (tmp_path / "d.json").write_text(json.dumps(data.to_json_dict()))
    code = cli.main(["export", str(tmp_path / "m.json"), "-o", str(tmp_path / "tl"),
                     "--layout", "transformer-lens", "--data", str(tmp_path / "d.json")])
    out = capsys.readouterr().out
    config = json.loads((tmp_path / "tl" / "config.json").read_text())
    assert config["attn_scale"] < 1  # the premise: the scale alone looks like hardmax's
    bridge = TransformerBridge.boot_native(TransformerBridgeConfig(**config),
                                           dtype=torch.float64)
    bridge.load_state_dict(load_file(str(tmp_path / "tl" / "model.safetensors")), strict=True)
    worst = 0.0
    for x, y in zip(data.floats()[0], data.floats()[1], strict=True):
        xs = torch.zeros(1, len(x), config["d_model"], dtype=torch.float64)
        xs[0, :, : data.d] = torch.as_tensor(x)
        with torch.no_grad():
            o = bridge(xs, return_type="logits")[0].numpy()
        D = np.linalg.norm(o[:, None, : data.d] - y[None], axis=-1)
        worst = float(np.max([worst, D.min(axis=1).max(), D.min(axis=0).max()]))
    assert worst <= 1e-9 * data.coordinate_scale()
    assert code == 0 and "INTERPOLATES" in out and "FAILS" not in out
    assert "hardmax needs" not in out
    verdict = et.lens_verdict(et.to_lens(model, "float64"), data)  # docs/export.md's call
    assert verdict.interpolates and verdict.score_margin is None
