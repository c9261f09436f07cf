"""Regularised training and the Tikhonov diagnostic (docs/baselines.md, exactformer.tools.train)."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

import exactformer as ef  # noqa: E402
from exactformer.data import builtin  # noqa: E402
from exactformer.export import to_rho_eta  # noqa: E402
from exactformer.tools import train as tr  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """One torch thread: the tensors are tiny, and a second thread only contends on a busy
    machine (several times slower)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def small_generated(d=4, N=4, n=6, seed=0):
    """(generator, dataset it interpolates exactly)."""
    gen = tr.mean_ff_generator(d, seed=seed)
    inputs = list(np.random.default_rng(seed).random((N, n, d)))
    return gen, tr.dataset_from_model(gen, inputs)


def ragged(values, lengths, width=None):
    """A zero-padded batch and its mask from sequences of the given lengths cut from values."""
    width = width or max(lengths)
    x = torch.full((len(lengths), width, values.shape[-1]), 1e6, dtype=torch.float64)
    mask = torch.zeros(len(lengths), width, dtype=torch.bool)
    for j, n in enumerate(lengths):
        x[j, :n] = values[j, :n]
        mask[j, :n] = True
    return x, mask


# ------------------------------------------------------------------------------ the loss
def test_loss_is_exactly_zero_on_equal_sets_whatever_the_padding():
    rng = np.random.default_rng(1)
    targets = torch.as_tensor(rng.random((3, 3, 2)))
    y, y_mask = ragged(targets, [3, 1, 2])
    # outputs: the targets permuted and repeated, padding filled with 1e6 (must not count)
    picks = [[2, 0, 1, 1, 0], [0, 0, 0], [1, 0, 1, 1]]
    out, mask = ragged(torch.stack([targets[j, p + [p[0]] * (5 - len(p))]
                                    for j, p in enumerate(picks)]), [len(p) for p in picks])
    assert torch.equal(tr.hausdorff_sq(out, mask, y, y_mask), torch.zeros(3, dtype=torch.float64))


def test_loss_is_exactly_zero_for_the_generating_model():
    gen, data = small_generated()
    assert all(len(y) == 1 for y in data.targets)
    assert tr.loss(gen, data).item() == 0.0


def test_loss_is_positive_otherwise():
    rng = np.random.default_rng(2)
    y = torch.as_tensor(rng.random((1, 2, 3)))
    y_mask = torch.ones(1, 2, dtype=torch.bool)
    mask = torch.ones(1, 3, dtype=torch.bool)

    def h2(out):
        return tr.hausdorff_sq(out[None], mask, y, y_mask).item()

    assert h2(torch.stack([y[0, 0], y[0, 1], y[0, 1]])) == 0
    moved = torch.stack([y[0, 0], y[0, 1], y[0, 1] + torch.tensor([0.0, 0.0, 1e-3])])
    assert h2(moved) == pytest.approx(1e-6)  # an output away from every target
    assert h2(torch.stack([y[0, 0]] * 3)) == pytest.approx(((y[0, 0] - y[0, 1]) ** 2).sum())
    gen, data = small_generated()
    with torch.no_grad():
        gen.blocks[0].rho.fill_(1e-3)  # tokens no longer collapse onto the target
    assert tr.loss(gen, data).item() > 0


def test_hausdorff_gradient_matches_finite_differences():
    rng = np.random.default_rng(3)
    out, mask = ragged(torch.as_tensor(rng.random((2, 5, 3))), [5, 3])
    y, y_mask = ragged(torch.as_tensor(rng.random((2, 3, 3))), [2, 3])
    out, y = out.masked_fill(~mask[..., None], 0), y.masked_fill(~y_mask[..., None], 0)
    out.requires_grad_()
    y.requires_grad_()
    assert torch.autograd.gradcheck(lambda o, t: tr.hausdorff_sq(o, mask, t, y_mask), (out, y))


def test_objective_gradient_in_the_parameters_matches_finite_differences():
    gen, data = small_generated(d=3, N=3, n=4)
    module = tr.random_rho_eta(3, n_blocks=2, h=2, seed=5)
    batch = tr.Batch.from_dataset(data)
    names = [k for k, _ in module.named_parameters()]
    values = tuple(p.detach().clone().requires_grad_() for p in module.parameters())

    def objective(*params):
        out = torch.func.functional_call(module, dict(zip(names, params, strict=True)),
                                         (batch.x, batch.mask))
        loss = tr.hausdorff_sq(out, batch.mask, batch.y, batch.y_mask).mean()
        return loss + 0.1 * sum((p ** 2).sum() for p in params)

    assert torch.autograd.gradcheck(objective, values)


# ------------------------------------------------------------------------------ the penalty
def test_penalty_sums_the_squares_of_every_parameter_rho_and_eta_included():
    d, blocks, h, width = 3, 2, 2, 4
    module = tr.random_rho_eta(d, n_blocks=blocks, h=h, seed=0)
    with torch.no_grad():
        for p in module.parameters():
            p.fill_(1)
    assert all(b.rho.shape == b.eta.shape == (1,) for b in module.blocks)  # one number each
    per_block = 2 + 2 * h * d + d * d + width * d + width + d * width  # ρ, η, W_q, W_k, W_v, FF
    assert tr.norm_sq(module).item() == blocks * per_block
    with torch.no_grad():
        module.blocks[1].rho.fill_(3)
        module.blocks[0].eta.fill_(0)
    assert tr.norm_sq(module).item() == blocks * per_block + 8 - 1
    keys = {k.split(".", 2)[2] for k in module.state_dict()}
    assert keys == {"rho", "eta", "attn.to_q.weight", "attn.to_k.weight", "attn.to_v.weight",
                    "ff.0.weight", "ff.0.bias", "ff.2.weight"}
    _, data = small_generated(d=3)
    assert tr.objective(module, data, 0.5).item() == pytest.approx(
        tr.loss(module, data).item() + 0.5 * tr.norm_sq(module).item())


@pytest.mark.parametrize("attention", ["hardmax", "softmax"])
def test_constructed_interpolant_of_generated_data_costs_at_most_100_generators(attention):
    """The Tikhonov family (benchmarks/tikhonov_experiment.py: 10 sequences of 100 points in
    [0,1]^16, one target each from a random ρ/η generator): the default model's ‖θ*‖² in the
    ρ/η layout is at most 100 × ‖θ_gen‖² on four draws, so ε‖θ*‖² bounds J_ε within two
    orders of the generator's bound (docs/keyed.md)."""
    for seed in range(4):
        rng = np.random.default_rng(seed)
        gen = tr.mean_ff_generator(16, seed=seed + 1)
        data = tr.dataset_from_model(gen, list(rng.random((10, 100, 16))))
        model = ef.compile(data, attention=attention, exact=False)
        ratio = tr.norm_sq(to_rho_eta(model)).item() / tr.norm_sq(gen).item()
        assert ratio <= 100, (seed, ratio)


def test_random_start_is_seeded_and_residual():
    a, b = tr.random_rho_eta(4, 2, seed=7), tr.random_rho_eta(4, 2, seed=7)
    c = tr.random_rho_eta(4, 2, seed=8)
    for (k, pa), pb, pc in zip(a.state_dict().items(), b.state_dict().values(),
                               c.state_dict().values(), strict=True):
        assert torch.equal(pa, pb)
        if k.endswith(("rho", "eta")):
            assert pa.item() == 1
        else:
            assert not torch.equal(pa, pc)


# ------------------------------------------------------------------------------ training
def test_short_training_run_lowers_the_loss_and_is_reproducible():
    _, data = small_generated()
    start = tr.random_rho_eta(data.d, n_blocks=1, seed=1)
    before = {k: v.clone() for k, v in start.state_dict().items()}
    runs = [tr.train(start, data, eps=1e-3, epochs=60, lr=3e-2, progress=False)
            for _ in range(2)]
    r = runs[0]
    assert r.steps == 60 and r.stop == "epochs"
    assert len(r.loss) == len(r.norm_sq) == len(r.max_error) == 61
    assert r.final_loss < 0.5 * r.loss[0]
    assert r.min_loss <= r.final_loss
    assert r.final_loss == pytest.approx(tr.loss(r.module, data).item(), rel=1e-12)
    assert r.final_max_error == pytest.approx(
        math.sqrt(tr.pair_losses(r.module, tr.Batch.from_dataset(data)).max().item()))
    assert runs[1].loss == r.loss
    assert all(torch.equal(v, before[k]) for k, v in start.state_dict().items())


def test_training_stops_at_the_target_error_and_the_time_budget():
    gen, data = small_generated()
    hit = tr.train(gen, data, epochs=50, target_error=1e-9, progress=False)
    assert (hit.steps, hit.stop, hit.final_max_error) == (0, "target error", 0.0)
    start = tr.random_rho_eta(data.d, seed=0)
    late = tr.train(start, data, epochs=10_000, time_budget=0.0, progress=False)
    assert (late.steps, late.stop) == (0, "time budget")


def test_warm_start_from_a_constructed_model():
    data = builtin.shared_pool(N=4, d=3, pool=5, n_max=3, m_max=2, seed=1)
    module = to_rho_eta(ef.compile(data, attention="softmax", exact=False))
    r = tr.train(module, data, eps=1e-6, epochs=0, progress=False)
    assert r.final_max_error < 1e-9 * data.coordinate_scale()
    diag = tr.tikhonov_diagnostic(r, module, data)
    assert diag.final_objective == diag.bound and not diag.not_global_minimum


# ------------------------------------------------------------------------------ diagnostic
def test_diagnostic_flags_a_deliberately_bad_run():
    gen, data = small_generated()
    eps = 1e-3
    bad = tr.train(tr.random_rho_eta(data.d, seed=0), data, eps=eps, epochs=0, progress=False)
    diag = tr.tikhonov_diagnostic(bad, gen, data)
    assert diag.reference_loss == 0.0
    assert diag.bound == pytest.approx(eps * tr.norm_sq(gen).item())
    assert diag.loss_above_bound and diag.objective_above_bound and diag.not_global_minimum
    assert "NOT at a global minimum" in diag.table()


def test_diagnostic_does_not_flag_the_interpolant_itself():
    gen, data = small_generated()
    diag = tr.tikhonov_diagnostic(gen, gen, data, eps=1e-2)
    assert diag.final_objective == diag.bound
    assert not diag.not_global_minimum and not diag.loss_above_bound
    with pytest.raises(ValueError, match="eps is required"):
        tr.tikhonov_diagnostic(gen, gen, data)


def test_diagnostic_separates_the_two_inequalities():
    """A run whose loss is below the bound but whose objective is above it is flagged by the
    objective test only."""
    gen, data = small_generated()
    with torch.no_grad():
        big = tr.mean_ff_generator(data.d, seed=0)
        big.blocks[0].attn.to_q.weight.fill_(0)
        big.blocks[0].attn.to_k.weight.fill_(0)
        big.blocks[0].rho.fill_(0)
    heavy = tr.random_rho_eta(data.d, seed=0)
    heavy.load_state_dict(big.state_dict())
    with torch.no_grad():
        heavy.blocks[0].attn.to_k.weight.fill_(0)
        heavy.blocks[0].attn.to_q.weight.fill_(10.0)  # scores stay 0: same outputs, larger ‖θ‖²
    diag = tr.tikhonov_diagnostic(heavy, gen, data, eps=1e-2)
    assert diag.final_loss == 0.0
    assert diag.objective_above_bound and not diag.loss_above_bound


def test_diagnostic_requires_the_same_architecture():
    gen, data = small_generated()
    with pytest.raises(ValueError, match="same architecture"):
        tr.tikhonov_diagnostic(tr.random_rho_eta(data.d, n_blocks=2), gen, data, eps=0.1)


# ------------------------------------------------------------------------------ command line
def test_cli_train_warm_start_writes_the_module_and_prints_the_diagnostic(tmp_path, capsys):
    from exactformer import cli
    from exactformer.export import load_torch

    data = builtin.shared_pool(N=3, d=3, pool=4, n_max=3, m_max=2, seed=1)
    data_path, model_path = tmp_path / "data.json", tmp_path / "model.json"
    data_path.write_text(json.dumps(data.to_json_dict()))
    model = ef.compile(data, attention="softmax", exact=False)
    ef.save_model(replace(model, record=None), model_path)  # training reads only the weights
    out = tmp_path / "trained.safetensors"
    assert cli.main(["train", str(data_path), "-o", str(out), "--from", str(model_path),
                     "--epochs", "0", "--eps", "1e-6"]) == 0
    text = capsys.readouterr().out
    assert "0 steps (epochs)" in text and "bound B" in text and "consistent" in text
    assert load_torch(out).config()["layout"] == "rho-eta"
    assert cli.main(["train", str(data_path), "-o", str(tmp_path / "bad.safetensors"),
                     "--reference", str(model_path), "--epochs", "1"]) == 2
    assert "same architecture" in capsys.readouterr().err
    assert not (tmp_path / "bad.safetensors").exists()
