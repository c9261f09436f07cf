"""circuit.json through TransformerLens alone: an exported folder loaded by its own helper, the
units it names zero-ablated with forward hooks (docs/circuit.md). Float64, exactly: keyed
hardmax models turn every unused unit off with an exact 0 in float too."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformer_lens")

import exactformer as ef  # noqa: E402
from exactformer import export as et  # noqa: E402
from exactformer.data import builtin  # noqa: E402
from exactformer.distance import hausdorff  # noqa: E402


def helper(folder):
    """The folder's own lens_helpers.py, imported from the file (no exactformer)."""
    spec = importlib.util.spec_from_file_location(f"lens_helpers_{id(folder)}",
                                                  folder / "lens_helpers.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(h, bridge, inputs, units=None, heads=None, dtype=torch.float64):
    """Logits per sequence with units (hook → indices) and heads zero-ablated by hooks."""
    x, mask = h.pad_batch(inputs, bridge.cfg.d_model, dtype=dtype)

    def zero(idx, head):
        def hook(act, hook):
            if head:
                act[:, idx] = 0
            else:
                act[..., idx] = 0
            return act
        return hook

    hooks = [(k, zero(v, False)) for k, v in (units or {}).items()] + \
        [(k, zero(v, True)) for k, v in (heads or {}).items()]
    with torch.no_grad():
        y = bridge.run_with_hooks(x, return_type="logits", attention_mask=mask,
                                  fwd_hooks=hooks)
    return h.read_outputs(y, mask)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    data = builtin.demo()
    model = ef.compile(data)
    folder = tmp_path_factory.mktemp("tl")
    et.save_lens(model, folder, data=data)
    h = helper(folder)
    return data, model, h, h.load_bridge(folder), json.loads((folder / "circuit.json").read_text())


def test_circuit_hooks_exist_and_activations_are_zero_exactly_where_it_says(exported):
    data, model, h, bridge, doc = exported
    inputs = [x.astype(float) for x in data.inputs]
    x, mask = h.pad_batch(inputs, bridge.cfg.d_model)
    with torch.no_grad():
        _, cache = bridge.run_with_cache(x, attention_mask=mask)
    for e in doc["pairs"]:
        j, n = e["pair"], len(inputs[e["pair"]])
        for hook in doc["units"]:
            act = cache[hook][j, :n]
            named = set(e["units"].get(hook, []))
            assert {u for u in range(act.shape[1]) if act[:, u].any()} == named, hook
    assert set(doc["heads"]) <= set(cache.keys())
    assert doc["readout"]["hook"] in cache.keys()


def test_zero_ablation_through_transformer_lens(exported):
    data, model, h, bridge, doc = exported
    inputs = [x.astype(float) for x in data.inputs]
    base = run(h, bridge, inputs)
    for out, y in zip(base, data.targets, strict=True):  # the readout holds the targets
        lo, hi = doc["readout"]["logits"]
        got = {tuple(r[lo:hi].tolist()) for r in out}
        assert got == {tuple(float(v) for v in r) for r in y}
        assert not out[:, hi:].any()
    unused = run(h, bridge, inputs, doc["unused"]["units"], doc["unused"]["heads"])
    assert all(torch.equal(a, b) for a, b in zip(unused, base, strict=True))
    for e in doc["pairs"]:
        j = e["pair"]
        after = run(h, bridge, inputs, e["units"], e["heads"])
        assert not torch.equal(after[j], base[j]), f"pair {j}"
        for f in doc["pairs"]:
            disjoint = all(not set(v) & set(f["units"].get(k, [])) for k, v in e["units"].items())
            disjoint &= all(not set(v) & set(f["heads"].get(k, [])) for k, v in e["heads"].items())
            if disjoint:
                assert torch.equal(after[f["pair"]], base[f["pair"]])


def test_float32_ablations_of_a_model_proved_faithful_in_float32(tmp_path):
    """The same ablations in a float32 folder, for a model proved faithful in float32
    (every float32 evaluation of the dense computation, docs/numerics.md): unused units
    change nothing, and the units only pair j uses move pair j and leave every other pair bit
    for bit: they are exact zeros there in float32 too."""
    data = builtin.shared_pool(12, 3, 6, 4, 2, seed=3)
    model = ef.compile(data)
    assert ef.prove_runtime(model, data, "float32").ok
    et.save_lens(model, tmp_path, "float32", data=data)
    doc = json.loads((tmp_path / "circuit.json").read_text())
    h = helper(tmp_path)
    bridge = h.load_bridge(tmp_path)
    inputs = [x.astype(np.float32) for x in data.floats()[0]]
    base = run(h, bridge, inputs, dtype=torch.float32)
    lo, hi = doc["readout"]["logits"]
    scale = data.coordinate_scale()
    for out, y in zip(base, data.targets, strict=True):  # within the proved tolerance
        assert hausdorff(out[:, lo:hi].double().numpy(), y) <= 1e-5 * scale
    unused = run(h, bridge, inputs, doc["unused"]["units"], doc["unused"]["heads"],
                 dtype=torch.float32)
    assert all(torch.equal(a, b) for a, b in zip(unused, base, strict=True))
    owned = 0
    for e in doc["pairs"]:  # the units only pair j uses: j's output moves, no other does
        others = [f for f in doc["pairs"] if f["pair"] != e["pair"]]
        own = {k: [u for u in v if not any(u in f["units"].get(k, []) for f in others)]
               for k, v in e["units"].items()}
        own = {k: v for k, v in own.items() if v}
        if not own:
            continue
        owned += 1
        after = run(h, bridge, inputs, own, dtype=torch.float32)
        assert not torch.equal(after[e["pair"]], base[e["pair"]]), e["pair"]
        assert all(torch.equal(after[f["pair"]], base[f["pair"]]) for f in others)
    assert owned >= len(doc["pairs"]) // 2


def test_small_zoo_loads_with_transformer_lens_alone(tmp_path):
    from exactformer.export.zoo import build_zoo
    index = build_zoo(tmp_path, small=True)
    names = [m["name"] for m in index["models"]]
    assert all(f"`{n}`" in (tmp_path / "README.md").read_text() for n in names)
    assert {"set", "causal"} <= {m["kind"] for m in index["models"]}
    assert {"hardmax", "softmax"} <= {m["attention"] for m in index["models"]}
    for name in names:
        for f in ("config.json", "model.safetensors", "README.md", "circuit.json", "data.json",
                  "proof.json", "float32.json", "transformer_lens/circuit.json"):
            assert (tmp_path / name / f).is_file(), f"{name}/{f}"
    # a copy whose circuit.json calls a used unit unused: the check must fail on it
    shutil.copytree(tmp_path / "demo-keyed", tmp_path / "tampered")
    path = tmp_path / "tampered" / "circuit.json"
    doc = json.loads(path.read_text())
    hook, units = next((k, v) for k, v in doc["pairs"][0]["units"].items()
                       if doc["units"][k]["phase"] == "interpolation")
    doc["unused"]["units"][hook] = sorted(set(doc["unused"]["units"].get(hook, [])) | set(units))
    path.write_text(json.dumps(doc))
    # the shipped check, in a fresh interpreter that cannot import exactformer
    code = ("import sys; sys.modules['exactformer'] = None; "
            f"sys.argv = ['check.py', {str(tmp_path)!r}, 'demo-keyed', 'two-texts', 'tampered']; "
            f"exec(open({str(tmp_path / 'check.py')!r}).read())")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    lines = dict(line.split(": ", 1) for line in res.stdout.splitlines() if ": " in line)
    assert res.returncode == 1, res.stdout + res.stderr
    assert lines["demo-keyed"].startswith("OK") and "bit for bit" in lines["demo-keyed"]
    assert lines["two-texts"].startswith("OK")
    assert lines["tampered"].startswith("FAILS")


def test_patching_the_collapse_head_hands_one_pair_the_others_outputs(exported):
    """After the collapse (ρ = 0, the last attention of a keyed model) every layer reads one
    token: patching pair j's collapse-head activations (hook_z) into pair k's run makes k's
    outputs j's, token by token, bit for bit."""
    data, model, h, bridge, doc = exported
    inputs = [x.astype(float) for x in data.inputs]
    (collapse,) = [p for p in doc["phases"] if p["name"] == "collapse"]
    (hook,) = [k for k, v in doc["heads"].items() if v["phase"] == "collapse"]
    assert max(int(k.split(".")[1]) for k in doc["heads"]) == int(hook.split(".")[1])
    z_hook = hook.replace("hook_pattern", "hook_z")
    assert doc["patch"]["hook"] == z_hook and doc["patch"]["heads"] == [0]
    lengths = [len(x) for x in inputs]
    j, k = next((a, b) for a in range(len(inputs)) for b in range(len(inputs))
                if a != b and lengths[a] == lengths[b])
    x, mask = h.pad_batch(inputs, bridge.cfg.d_model)
    with torch.no_grad():
        base, cache = bridge.run_with_cache(x, attention_mask=mask)

    def patch(z, hook):
        z[k] = cache[z_hook][j]
        return z

    with torch.no_grad():
        y = bridge.run_with_hooks(x, attention_mask=mask, fwd_hooks=[(z_hook, patch)])
    n = lengths[j]
    assert torch.equal(y[k, :n], base[j, :n])
    assert not torch.equal(y[k, :n], base[k, :n])
    assert all(torch.equal(y[i], base[i]) for i in range(len(inputs)) if i != k)
    assert collapse["blocks"][0] <= int(hook.split(".")[1]) < collapse["blocks"][1]


def test_explain_names_hooks_that_exist_in_the_exported_model(exported):
    data, model, h, bridge, doc = exported
    path = ef.explain(model, data, pair=5)
    hooks = {s["hook"] for p in path["phases"] for s in p["steps"]}
    hooks |= {m["hook"] for m in path["keyed"]["moves"]} | {path["readout"]["hook"]}
    assert hooks and hooks <= set(bridge.hook_dict)
    for p in path["phases"]:
        for s in p["steps"]:
            if "unit" in s:  # a unit's index is within its hook's width
                assert s["unit"] < bridge.cfg.d_mlp
            else:
                assert s["head"] < bridge.cfg.n_heads


def test_export_writes_the_circuit_when_short_or_asked_and_never_a_stale_one(tmp_path, capsys,
                                                                             monkeypatch):
    from exactformer import cli
    from exactformer.circuit import document as circuit_module
    data = builtin.shared_pool(3, 2, 5, 3, 2, seed=4)
    (tmp_path / "d.json").write_text(json.dumps(data.to_json_dict()))
    ef.save_model(ef.compile(data), tmp_path / "m.json")
    out = tmp_path / "tl"
    args = ["export", str(tmp_path / "m.json"), "-o", str(out), "--layout", "transformer-lens",
            "--data", str(tmp_path / "d.json")]
    assert cli.main(args) == 0 and (out / "circuit.json").is_file()
    monkeypatch.setattr(circuit_module, "AUTO_WORK", 0)  # every trace is now "long"
    assert cli.main(args) == 0
    assert not (out / "circuit.json").exists()  # the earlier one is gone with its weights
    assert "circuit.json not written" in capsys.readouterr().out
    assert cli.main(args + ["--circuit"]) == 0 and (out / "circuit.json").is_file()
    assert cli.main(args + ["--no-circuit"]) == 0 and not (out / "circuit.json").exists()
