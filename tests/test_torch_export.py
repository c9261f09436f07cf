"""PyTorch export (README): native and ρ/η layouts, safetensors files, padding, float32 verdict.

References: the NumPy evaluator in mpmath arithmetic (50 digits, the model's true outputs) and in
float64; the targets themselves. "Relative" means relative to the dataset's coordinate scale.
"""

from __future__ import annotations

import inspect
import json
import re
import sys
from dataclasses import replace
from fractions import Fraction
from functools import cache

import numpy as np
import pytest
from conftest import paper

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

import exactformer as ef  # noqa: E402
from exactformer import cli  # noqa: E402
from exactformer import export as et  # noqa: E402
from exactformer.data import builtin  # noqa: E402
from exactformer.distance import hausdorff  # noqa: E402
from exactformer.export import modules as etm  # noqa: E402
from exactformer.export.float32 import output_error  # noqa: E402
from exactformer.model import FF, SA, Block, ScoreMatrix, ValueMatrix  # noqa: E402

DATASETS = {
    "demo": builtin.demo,
    "pool": lambda: builtin.shared_pool(N=10, d=4, pool=8, n_max=5, m_max=3, seed=1),
    "nested": lambda: builtin.nested(N=10, d=3, seed=2),
}
LAYOUTS = ("native", "rho-eta")


ATTENTIONS = ("hardmax", "softmax")


@cache
def case(name: str, attention: str = "hardmax"):
    data = DATASETS[name]()
    return data, paper(data, attention=attention, seed=0)


def max_diff(outs, refs, scale) -> float:
    return max(float(np.abs(np.asarray(o, float) - np.asarray(r, float)).max())
               for o, r in zip(outs, refs, strict=True)) / scale


def target_error(outs, data) -> float:
    """Largest Hausdorff distance of the outputs from the targets zero-padded to the outputs'
    width (a keyed model is wider than its data), over the scale; nan stays nan."""
    _, ys = data.padded(outs[0].shape[1]).floats()
    return float(np.max([hausdorff(o, y) for o, y in zip(outs, ys, strict=True)])) / \
        data.coordinate_scale()


def check_matches_evaluator(model, data) -> None:
    """Torch float64 = the evaluator's float64 pass and its 50-digit pass, to 1e-12."""
    xs, _ = data.floats()
    scale = data.coordinate_scale()
    out = et.apply(et.to_torch(model), xs)
    assert max_diff(out, ef.forward(model, xs, "float"), scale) <= 1e-12
    assert max_diff(out, ef.forward(model, xs, "mp"), scale) <= 1e-12


# ------------------------------------------------------------------------------ native
@pytest.mark.parametrize("attention", ATTENTIONS)
@pytest.mark.parametrize("name", DATASETS)
def test_native_float64_matches_evaluator_and_targets(name, attention):
    data, model = case(name, attention)
    check_matches_evaluator(model, data)
    assert target_error(et.apply(et.to_torch(model), data.floats()[0]), data) <= 1e-12


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 10 ** 6), N=st.integers(1, 8), d=st.integers(2, 5))
def test_native_matches_evaluator_on_random_data(seed, N, d):
    data = builtin.shared_pool(N=N, d=d, pool=N + 3, n_max=4, seed=seed)
    model = paper(data, seed=seed)
    check_matches_evaluator(model, data)
    assert target_error(et.apply(et.to_torch(model), data.floats()[0]), data) <= 1e-12


@pytest.mark.parametrize("name", ["pool", "nested"])
def test_softmax_attention_matches_evaluator(name):
    """A softmax model made by hand (the hardmax weights at τ = 1/64): only the two forward
    passes are compared, so it need not interpolate."""
    data, model = case(name)
    soft = replace(model, attention="softmax", tau=Fraction(1, 64))
    xs, _ = data.floats()
    scale = data.coordinate_scale()
    out, mp = et.apply(et.to_torch(soft), xs), ef.forward(soft, xs, "mp")
    assert max_diff(out, mp, scale) <= 1e-12
    # blurred tokens sit on hat slopes, where the evaluator's float64 ReLU sums round worse
    # (6e-11 on "nested"): compare with it up to its own distance from the 50-digit pass
    fl = ef.forward(soft, xs, "float")
    assert max_diff(out, fl, scale) <= 1e-12 + max_diff(fl, mp, scale)
    rho_eta = et.apply(et.to_rho_eta(soft), xs)
    assert max_diff(rho_eta, ef.forward(soft, xs, "mp"), data.coordinate_scale()) <= 1e-9


def random_ridge_ffs(d: int, count: int, seed: int):
    """FFs whose units read one direction with slopes of both signs and zero (a constant unit)."""
    rng = np.random.default_rng(seed)
    for _ in range(count):
        f = rng.integers(-3, 4, d)
        f[0] = 5
        k = [Fraction(int(v), 2) for v in rng.integers(-4, 5, 4)]
        k[0] = Fraction(1)
        U = np.array([[ki * int(fj) for fj in f] for ki in k], dtype=object)
        b = np.array([Fraction(int(v), 3) for v in rng.integers(-9, 10, 4)], dtype=object)
        W = np.array([[Fraction(int(v), 4) for v in row] for row in rng.integers(-8, 9, (d, 4))],
                     dtype=object)
        yield FF(Fraction(int(rng.integers(0, 2))), U, b, W)


def test_profile_form_is_the_same_function():
    """FFs stored as profiles agree with their dense ReLU form everywhere, not only on data:
    random one-direction FFs and every FF of a constructed model, at points up to ±30."""
    _, model = case("pool")
    d = model.d
    ffs = [b.ff for b in model.blocks if b.ff is not None] + list(random_ridge_ffs(d, 20, 0))
    x = torch.as_tensor(np.random.default_rng(1).normal(size=(256, d)) * 10)
    native = et.to_torch(replace(model, blocks=[Block(ff, None) for ff in ffs]))
    for ff, layer in zip(ffs, native.blocks, strict=True):
        assert isinstance(layer.ff, etm.ProfileFF)
        dense = etm.DenseFF(d, ff.width)
        etm.fill(dense, eta=ff.eta, U=ff.U, b=ff.b, W=ff.W)
        with torch.no_grad():
            a, b = layer.ff(x), dense(x)
        terms = (x.abs() @ dense.U.abs().T + dense.b.abs()) @ dense.W.abs().T + x.abs()
        assert ((a - b).abs() <= 1e-13 * terms).all()


def test_ff_reading_several_directions_stays_dense():
    ff = next(random_ridge_ffs(3, 1, 2))
    ff.U[1, 1] += 1
    assert et.ff_profile(ff) is None


# ------------------------------------------------------------------------------ ρ/η layout
RHO_ETA_KEYS = {"rho", "eta", "attn.to_q.weight", "attn.to_k.weight", "attn.to_v.weight",
                "ff.0.weight", "ff.0.bias", "ff.2.weight"}


@pytest.mark.parametrize("attention", ATTENTIONS)
@pytest.mark.parametrize("name", DATASETS)
def test_rho_eta_layout_reproduces_targets(name, attention):
    data, model = case(name, attention)
    d = model.d
    sd = et.to_rho_eta(model).state_dict()
    n = len({k.split(".")[1] for k in sd})
    assert set(sd) == {f"blocks.{i}.{k}" for i in range(n) for k in RHO_ETA_KEYS}
    shapes = {"rho": (1,), "eta": (1,), "attn.to_q.weight": (d + 1, d),
              "attn.to_k.weight": (d + 1, d), "attn.to_v.weight": (d, d),
              "ff.0.weight": (4, d), "ff.0.bias": (4,), "ff.2.weight": (d, 4)}
    for k, v in sd.items():
        assert tuple(v.shape) == shapes[re.sub(r"^blocks\.\d+\.", "", k)]
    # the shipped class, built from scratch, loads the weights and reproduces the targets
    tau = None if model.tau is None else float(model.tau)
    fresh = et.RhoEtaTransformer(d, n, d + 1, attention=model.attention, tau=tau)
    fresh.load_state_dict(sd)
    assert target_error(et.apply(fresh, data.floats()[0]), data) <= 1e-9


class PaperStyleTF(torch.nn.Module):
    """A model class with the parameter names and shapes of the paper authors' public one
    (blocks.{i}.rho / .eta of shape (1,), attn.to_q / to_k / to_v without bias, FF
    Linear(d, 4) → ReLU → Linear(4, d) without bias, softmax scores over τ), written here: our
    ρ/η state dict must load into it with strict=True and give our outputs."""

    class Block(torch.nn.Module):
        def __init__(self, d: int, h: int, tau: float):
            super().__init__()
            nn = torch.nn
            self.tau = tau
            self.rho, self.eta = nn.Parameter(torch.zeros(1)), nn.Parameter(torch.zeros(1))
            self.attn = nn.Module()
            self.attn.to_q = nn.Linear(d, h, bias=False)
            self.attn.to_k = nn.Linear(d, h, bias=False)
            self.attn.to_v = nn.Linear(d, d, bias=False)
            self.ff = nn.Sequential(nn.Linear(d, 4), nn.ReLU(), nn.Linear(4, d, bias=False))

        def forward(self, x):
            a = self.attn
            weights = torch.softmax(a.to_q(x) @ a.to_k(x).transpose(-2, -1) / self.tau, dim=-1)
            x = self.rho * x + weights @ a.to_v(x)
            return self.eta * x + self.ff(x)

    def __init__(self, d: int, h: int, tau: float, depth: int):
        super().__init__()
        self.blocks = torch.nn.Sequential(*[self.Block(d, h, tau) for _ in range(depth)])

    def forward(self, x):
        return self.blocks(x)


@pytest.mark.parametrize("name", ["demo", "nested"])
def test_rho_eta_state_dict_loads_into_the_paper_class_layout(name):
    data, model = case(name, "softmax")
    ours = et.to_rho_eta(model)
    tau = 1.0 if model.tau is None else float(model.tau)
    theirs = PaperStyleTF(model.d, model.d + 1, tau, len(ours.blocks)).double()
    theirs.load_state_dict(ours.state_dict(), strict=True)
    xs, _ = data.floats()
    with torch.no_grad():
        outs = [theirs(torch.as_tensor(x, dtype=torch.float64)[None])[0].numpy() for x in xs]
    assert max_diff(outs, et.apply(ours, xs), data.coordinate_scale()) <= 1e-12
    assert target_error(outs, data) <= 1e-9
    # and back: their state dict loads into ours with strict=True
    back = et.RhoEtaTransformer(model.d, len(ours.blocks), model.d + 1, "softmax", ours.tau)
    back.load_state_dict(theirs.state_dict(), strict=True)
    # the same float64 function; a padded batch may run its products in other BLAS kernels
    assert max_diff(et.apply(back, xs), outs, data.coordinate_scale()) <= 1e-12


def test_rho_eta_file_with_scalar_rho_eta_still_loads(tmp_path):
    """Files written when ρ and η had shape () load, with the same outputs."""
    data, model = case("demo", "softmax")
    path = tmp_path / "model.safetensors"
    module = et.export(model, path, layout="rho-eta")
    tensors = load_file(str(path))
    old = {k: v.reshape(()) if k.endswith((".rho", ".eta")) else v for k, v in tensors.items()}
    assert sum(v.dim() == 0 for v in old.values()) == 2 * len(module.blocks)
    save_file(old, str(path))
    again = et.load_torch(path)
    assert all(tuple(b.rho.shape) == tuple(b.eta.shape) == (1,) for b in again.blocks)
    xs, _ = data.floats()
    assert max_diff(et.apply(again, xs), et.apply(module, xs), data.coordinate_scale()) == 0


def test_rho_eta_shift_puts_identity_layers_at_the_ends():
    """Cut after the collapse, the model ends in an SA: (identity, FF_1), …, (SA_L, identity)."""
    _, model = case("demo")
    cut = replace(model, blocks=model.blocks[: model.meta["phases"]["leaders"][1]])
    blocks = et.to_rho_eta(cut).blocks
    assert len(blocks) == cut.n_blocks + 1
    first, last = blocks[0], blocks[-1]
    assert first.rho.item() == 1 and not first.attn.to_v.weight.any()
    assert first.eta.item() == float(cut.blocks[0].ff.eta)
    assert last.rho.item() == float(cut.blocks[-1].sa.rho)
    assert torch.equal(last.attn.to_v.weight, torch.eye(cut.d, dtype=torch.float64))
    assert last.eta.item() == 1 and not any(p.any() for p in last.ff.parameters())


# ------------------------------------------------------------------------------ padding
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("tau", [None, 1])
@settings(max_examples=8, deadline=None)
@given(data_st=st.data())
def test_padding_does_not_change_results(layout, tau, data_st):
    """Sequences padded with junk to any length, in any order, beside longer sequences; for
    the hardmax model and for its weights with softmax attention at τ = 1."""
    data, model = case("pool")
    if tau is not None:
        model = replace(model, attention="softmax", tau=tau)
    module = et.convert(model, layout)
    xs, _ = data.floats()
    ref = et.apply(module, xs)
    pick = data_st.draw(st.lists(st.sampled_from(range(data.N)), min_size=1, max_size=6))
    filler = data_st.draw(st.integers(1, 12))
    seqs = [xs[j] for j in pick] + [np.random.default_rng(filler).normal(size=(filler, 4))]
    n = max(len(s) for s in seqs) + data_st.draw(st.integers(0, 5))
    x = torch.as_tensor(np.random.default_rng(n).normal(size=(len(seqs), n, 4)) * 1e3)
    mask = torch.zeros(len(seqs), n, dtype=torch.bool)
    for i, s in enumerate(seqs):
        x[i, : len(s)] = torch.as_tensor(s)
        mask[i, : len(s)] = True
    with torch.no_grad():
        y = module(x, mask)
    assert not y[~mask].any()
    scale = data.coordinate_scale()
    # The native hardmax layout computes the same numbers whatever the batch. Softmax in the
    # dense ρ/η layout does not: the BLAS kernel a product runs in depends on the batch's
    # shape, and its last-bit differences are amplified by the hats' slopes (about 1e4 here;
    # docs/numerics.md#conditioning), so there the bound is the layout's float64 accuracy.
    bound = 1e-14 if layout == "native" or tau is None else 1e-9
    for i, j in enumerate(pick):
        assert np.abs(y[i, : len(xs[j])].numpy() - ref[j]).max() <= bound * scale


# ------------------------------------------------------------------------------ files
# the native file's keys, as the README documents them (JSON model format names)
NATIVE_FF = {"eta": lambda ff: ff.eta, "U": lambda ff: ff.U, "b": lambda ff: ff.b,
             "W": lambda ff: ff.W}
NATIVE_SA = {"rho": lambda sa: sa.rho, "alpha": lambda sa: sa.A.alpha, "a": lambda sa: sa.A.a,
             "c": lambda sa: sa.A.c, "beta": lambda sa: sa.V.beta, "p": lambda sa: sa.V.p,
             "q": lambda sa: sa.V.q}


def with_identity_layers(model):
    """``model`` with a block of two identities, a block with an FF only and one with an SA
    that changes nothing but is not null (ρ = 1, V = 0: it must stay in the file)."""
    d, first = model.d, model.blocks[0]
    zero = np.array([Fraction(0)] * d, dtype=object)
    idle = SA(Fraction(1), ScoreMatrix(Fraction(2), zero + 1, zero),
              ValueMatrix(Fraction(0), zero, zero))
    return replace(model, blocks=[Block(None, None), Block(first.ff, None), Block(None, idle),
                                  *model.blocks])


def expected_native_tensors(model) -> dict:
    """Every parameter of the model as float64, under the documented keys; null layers none."""
    out = {}
    for i, blk in enumerate(model.blocks):
        for part, layer, keys in (("ff", blk.ff, NATIVE_FF), ("sa", blk.sa, NATIVE_SA)):
            if layer is not None:
                for k, get in keys.items():
                    v = np.asarray(get(layer), dtype=object)
                    out[f"blocks.{i}.{part}.{k}"] = torch.tensor(
                        [float(x) for x in v.flat], dtype=torch.float64).reshape(v.shape)
    return out


@pytest.mark.parametrize("attention", ATTENTIONS)
def test_native_file_holds_the_model_parameters(tmp_path, attention):
    """Keys blocks.{i}.ff.{eta, U, b, W} and blocks.{i}.sa.{rho, alpha, a, c, beta, p, q}, the
    model's numbers as float64, nothing for identity layers; the config marks null layers."""
    assert set(et.NATIVE_FF_KEYS) == set(NATIVE_FF) and set(et.NATIVE_SA_KEYS) == set(NATIVE_SA)
    _, model = case("pool", attention)
    model = with_identity_layers(model)
    path = tmp_path / "m.safetensors"
    et.export(model, path)
    tensors = load_file(str(path))
    expected = expected_native_tensors(model)
    assert set(tensors) == set(expected)
    assert not any(k.startswith(("blocks.0.", "blocks.1.sa", "blocks.2.ff")) for k in tensors)
    assert {"blocks.2.sa.rho", "blocks.2.sa.q"} <= set(tensors)
    for k, v in tensors.items():
        assert v.dtype == torch.float64 and torch.equal(v, expected[k]), k
    d = model.d
    for i, blk in enumerate(model.blocks):
        if blk.ff is not None:
            w = blk.ff.width
            assert [tuple(tensors[f"blocks.{i}.ff.{k}"].shape) for k in NATIVE_FF] == \
                [(), (w, d), (w,), (d, w)]
    config = json.loads((tmp_path / "m.config.json").read_text())
    assert config["layout"] == "native" and config["dtype"] == "float64"
    assert config["ff"] == "profile" and config["attention"] == attention
    assert config["blocks"] == [{"ff": None if b.ff is None else {"width": b.ff.width},
                                 "sa": b.sa is not None} for b in model.blocks]
    # float32 files hold each parameter rounded to float32
    et.export(model, path, dtype="float32")
    for k, v in load_file(str(path)).items():
        assert v.dtype == torch.float32 and torch.equal(v, expected[k].float()), k


@pytest.mark.parametrize("ff", et.FF_FORMS)
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_safetensors_round_trip(tmp_path, layout, dtype, ff):
    """Loading gives a module whose outputs equal the exported module's; saving it again writes
    the same tensors and config."""
    if layout == "rho-eta" and ff == "dense":
        pytest.skip("the ρ/η layout has one FF form")
    data, model = case("nested")
    path, again_path = tmp_path / "model.safetensors", tmp_path / "again.safetensors"
    module = et.export(model, path, layout=layout, dtype=dtype, ff=ff)
    config = json.loads((tmp_path / "model.config.json").read_text())
    assert config["format"] == et.FORMAT and config["layout"] == layout
    again = et.load_torch(path)
    assert type(again) is type(module)
    assert next(again.parameters()).dtype == getattr(torch, dtype)
    sd, sd2 = module.state_dict(), again.state_dict()
    assert sd.keys() == sd2.keys() and all(torch.equal(sd[k], sd2[k]) for k in sd)
    xs, _ = data.floats()
    x, mask = et.pad_batch(xs, getattr(torch, dtype))
    with torch.no_grad():
        assert torch.equal(module(x, mask), again(x, mask))
    et.save_torch(again, again_path)
    t1, t2 = load_file(str(path)), load_file(str(again_path))
    assert t1.keys() == t2.keys()
    assert all(t1[k].dtype == t2[k].dtype and torch.equal(t1[k], t2[k]) for k in t1)
    assert json.loads((tmp_path / "again.config.json").read_text()) == config
    if layout == "native":
        assert all(isinstance(b.ff, etm.ProfileFF if ff == "profile" else etm.DenseFF)
                   for b in again.blocks)
        assert again.model.parameters() == et.round_model(model, getattr(torch, dtype)).parameters()


def test_native_evaluation_forms():
    """ff="profile" (default) and ff="dense" evaluate the same model; the profile form is the
    one that keeps float32 on the targets."""
    data, model = case("pool")
    profile, dense = et.to_torch(model), et.to_torch(model, ff="dense")
    assert all(isinstance(b.ff, etm.ProfileFF) for b in profile.blocks)
    assert all(isinstance(b.ff, etm.DenseFF) for b in dense.blocks)
    assert profile.model is model and dense.model is model
    xs, _ = data.floats()
    assert max_diff(et.apply(dense, xs), et.apply(profile, xs), data.coordinate_scale()) <= 1e-10
    # float32 (u = 2⁻²⁴ ≈ 6e-8): the profile form stays within a few dozen u of the targets,
    # the dense form's cancelling ReLU sums lose orders of magnitude more
    err_profile = et.max_error(et.to_torch(model, torch.float32), data)
    err_dense = et.max_error(et.to_torch(model, torch.float32, ff="dense"), data)
    assert err_profile <= 64 * et.UNIT_ROUNDOFF_32 and 10 * err_profile < err_dense
    with pytest.raises(ValueError, match="ff must be"):
        et.to_torch(model, ff="relu")


def test_load_float64_file_in_float32(tmp_path):
    """A float64 native file evaluated in float32 is as good as the exact model in float32."""
    data, model = case("nested")
    et.export(model, tmp_path / "m.safetensors")
    module = et.load_torch(tmp_path / "m.safetensors", dtype=torch.float32)
    assert next(module.parameters()).dtype == torch.float32
    err = et.max_error(module, data)
    assert err <= 2 * et.max_error(et.to_torch(model, torch.float32), data) + 1e-7
    assert err <= 1e-3


def test_native_file_errors(tmp_path):
    _, model = case("demo")
    tensors, config = et.native_tensors(model), et.native_config(model)
    assert et.native_model(tensors, config).parameters() == \
        [float(v) for v in model.parameters()]
    for bad, match in [({k: v for k, v in tensors.items() if k != "blocks.0.ff.U"}, "missing"),
                       ({**tensors, "blocks.0.ff.b": torch.zeros(
                           len(tensors["blocks.0.ff.b"]) + 1, dtype=torch.float64)}, "shape"),
                       ({**tensors, "blocks.0.ff.t": torch.zeros(1)}, "unexpected")]:
        with pytest.raises(ValueError, match=match):
            et.native_model(bad, config)


def test_cli_export(tmp_path, capsys):
    data, model = case("demo")
    ef.save_model(model, tmp_path / "m.json")
    out = tmp_path / "sub" / "m.safetensors"
    assert cli.main(["export", str(tmp_path / "m.json"), "-o", str(out), "--layout",
                     "rho-eta", "--dtype", "float32"]) == 0
    module = et.load_torch(out)
    assert next(module.parameters()).dtype == torch.float32
    assert isinstance(module, et.RhoEtaTransformer)
    assert "rho-eta" in capsys.readouterr().out
    native = tmp_path / "native.safetensors"
    assert cli.main(["export", str(tmp_path / "m.json"), "-o", str(native)]) == 0
    tensors, expected = load_file(str(native)), expected_native_tensors(model)
    assert tensors.keys() == expected.keys()
    assert all(torch.equal(tensors[k], expected[k]) for k in tensors)


def test_failed_export_leaves_nothing(tmp_path, monkeypatch):
    _, model = case("demo")

    def broken(tensors, filename):
        raise OSError("disk full")

    monkeypatch.setattr(et.layouts, "save_file", broken)
    with pytest.raises(OSError):
        et.export(model, tmp_path / "m.safetensors")
    assert list(tmp_path.iterdir()) == []


def test_cli_export_without_torch(tmp_path, monkeypatch, capsys):
    _, model = case("demo")
    ef.save_model(model, tmp_path / "m.json")
    monkeypatch.setitem(sys.modules, "exactformer.export", None)
    monkeypatch.delattr(ef, "torch", raising=False)
    assert cli.main(["export", str(tmp_path / "m.json"), "-o", str(tmp_path / "m.st")]) == 2
    assert "PyTorch" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.json"]


# ------------------------------------------------------------------------------ float32
@pytest.mark.parametrize("attention", ATTENTIONS)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", DATASETS)
def test_float32_verdict_matches_a_float32_run(name, layout, attention):
    data, model = case(name, attention)
    verdict = et.float32_verdict(model, data, layout=layout)
    module = et.convert(model, layout, torch.float32)
    x, mask = et.pad_batch(data.floats()[0], torch.float32)
    with torch.no_grad():
        y = module(x, mask).double().numpy()
    _, ys = data.floats()
    err = max(hausdorff(y[j, : len(x_j)], ys[j]) for j, x_j in enumerate(data.inputs))
    err /= data.coordinate_scale()
    assert verdict.error == pytest.approx(err, rel=1e-12)
    # one standard for a float32 run and a float32 proof: the runtime proofs' tolerance
    assert verdict.tolerance == inspect.signature(ef.prove_runtime).parameters["tolerance"] \
        .default == et.LENS_TOLERANCE["float32"]
    assert verdict.interpolates == (err <= verdict.tolerance)
    assert verdict.hat_clearance > 0
    assert (verdict.hardmax_margin > 0) if attention == "hardmax" else \
        verdict.hardmax_margin is None
    if layout == "native":  # the profile form keeps float32 on the targets here
        assert verdict.interpolates
    assert "float32 verdict" in verdict.table()


def test_float32_file_error_is_that_of_a_float32_file(tmp_path):
    """``error_float32_file``: the module loaded from a float32 export, run in float32."""
    data, model = case("pool")
    path = tmp_path / "m.safetensors"
    for layout in LAYOUTS:
        verdict = et.float32_verdict(model, data, layout=layout)
        et.export(model, path, layout=layout, dtype="float32")
        assert verdict.error_float32_file == et.max_error(et.load_torch(path), data)
        if layout == "rho-eta":
            assert verdict.error_float32_file == verdict.error


# ------------------------------------------------------------------------------ attention
@pytest.mark.parametrize("tau", [None, 1, 0.25])
def test_softmax_weights_and_masking(tau):
    """softmax: exp(S/τ) normalised over the real keys, padded keys exactly 0; hardmax averages
    the argmax set of the real keys."""
    g = torch.Generator().manual_seed(0)
    S = torch.randn(3, 5, 5, dtype=torch.float64, generator=g) * 10
    S[2, :, 1] = S[2, :, 0] = 100  # a tie at the top
    S[1, :, 4] = 1e3  # a large score on a padded key
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0]], dtype=torch.bool)
    keep = mask[:, None, :].expand_as(S)
    P = et.attention_weights(S, mask, "softmax", tau)
    real = S.masked_fill(~keep, -1e300)
    E = torch.exp((real - real.amax(-1, keepdim=True)) / (tau or 1)) * keep
    assert torch.allclose(P, E / E.sum(-1, keepdim=True), rtol=1e-13, atol=0)
    assert not P[~keep].any()
    H = et.attention_weights(S, mask, "hardmax", tau)
    assert not H[~keep].any()
    assert (H[2, :, :2] == 0.5).all() and not H[2, :, 2:].any()
    assert torch.equal(H.sum(-1), torch.ones(3, 5, dtype=torch.float64))


# ------------------------------------------------------------------------------ CUDA
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("layout", LAYOUTS)
def test_cuda_matches_cpu(layout):
    data, model = case("pool")
    xs, _ = data.floats()
    cpu = et.apply(et.convert(model, layout), xs)
    gpu = et.apply(et.convert(model, layout, device="cuda"), xs)
    assert max_diff(gpu, cpu, data.coordinate_scale()) <= 1e-12


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("layout", LAYOUTS)
def test_cuda_load_matches_cpu(tmp_path, layout):
    data, model = case("pool")
    path = tmp_path / "m.safetensors"
    module = et.export(model, path, layout=layout)
    gpu = et.load_torch(path, device="cuda")
    assert next(gpu.parameters()).is_cuda
    xs, _ = data.floats()
    assert max_diff(et.apply(gpu, xs), et.apply(module, xs), data.coordinate_scale()) <= 1e-12


# ------------------------------------------------------------------------------ nan in verdicts
def _overflowing_identity() -> tuple[ef.Transformer, ef.Dataset]:
    """A float64 model that is the identity in exact and float64 arithmetic, and whose float32
    run gives nan on the pair whose first coordinate is 1: two units of 10^30·x₀ written with
    weights ±10^10 sum to 10^40 − 10^40, which is inf − inf in float32. Pair 0 (x₀ = 0) is
    exact in every dtype."""
    big, w = 1e30, 1e10
    ff = FF(1.0, np.array([[big, 0.0], [big, 0.0]]), np.zeros(2), np.array([[w, -w], [0, 0]]))
    model = ef.Transformer(d=2, attention="hardmax", blocks=[Block(ff, None)], exact=False)
    pairs = [np.array([[0.0, 1.0]]), np.array([[1.0, 0.0]])]
    return model, ef.Dataset.from_arrays(pairs, pairs)


@settings(max_examples=20, deadline=None)
@given(order=st.permutations(range(4)), bad=st.sampled_from([np.nan, np.inf, -np.inf]))
def test_an_error_reduced_over_pairs_keeps_a_nan_or_inf_wherever_it_is(order, bad):
    """output_error (behind the float32 and TransformerLens verdicts) is nan or inf when any
    pair's output is, in any order of the pairs: Python's max skips a nan after a number."""
    tokens = [np.array([[float(j), 1.0]]) for j in range(4)]
    data = ef.Dataset.from_arrays([tokens[j] for j in order], [tokens[j] for j in order])
    outs = [tokens[j].copy() for j in order]
    outs[order.index(3)][0, 0] = bad
    assert not np.isfinite(output_error(outs, data))
    assert output_error([tokens[j] for j in order], data) == 0


def test_float32_verdict_fails_on_a_nan_after_a_finite_pair():
    model, data = _overflowing_identity()  # ρ/η: a dense FF (the native profile is exact)
    outs = et.apply(et.convert(model, "rho-eta", torch.float32), data.floats()[0])
    assert np.array_equal(outs[0], data.floats()[1][0]) and np.isnan(outs[1]).any()  # premise
    verdict = et.float32_verdict(model, data, layout="rho-eta")
    assert not verdict.interpolates and np.isnan(verdict.error)
    assert verdict.error_float64 == 0


def test_a_nan_margin_is_never_replaced_by_a_smaller_number():
    from exactformer.evaluate import PassStats
    for values in ([0.5, np.nan, 0.25], [np.nan, 0.5], [0.5, np.nan]):
        stats = PassStats()
        for v in values:
            stats.note_min("hardmax_margin", v)
        assert np.isnan(stats.hardmax_margin)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("fault", ["config-json", "config-format", "config-dtype", "weights",
                                   "tau"])
def test_a_broken_file_pair_is_one_error_naming_the_file(tmp_path, layout, fault):
    """load_torch checks the config (by the native rules for the native layout) and the
    weights before building: one FolderError naming the file, never a KeyError or the like."""
    from exactformer.export.hub import FolderError
    path = tmp_path / "m.safetensors"
    et.export(ef.compile(builtin.demo(), attention="softmax"), path, layout=layout)
    config_file = et.config_path(path)
    config = json.loads(config_file.read_text())
    if fault == "config-json":
        config_file.write_text("{")
    elif fault == "weights":
        path.write_bytes(b"not safetensors")
    else:
        key, value = {"config-format": ("format", None), "config-dtype": ("dtype", "float8"),
                      "tau": ("tau", -1.0)}[fault]
        config_file.write_text(json.dumps({**config, key: value}))
    with pytest.raises(FolderError) as e:
        et.load_torch(path)
    assert str(path) in str(e.value) or str(config_file) in str(e.value)
