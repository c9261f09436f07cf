"""Tikhonov-regularised training of the ρ/η layout, and the global-minimum diagnostic.

See docs/baselines.md.

The trained architecture is :class:`exactformer.export.RhoEtaTransformer`: blocks
x ← ρ·x + Attn(x); x ← η·x + FF(x) with attention rank h, temperature τ and FF width 4. Training
minimises the regularised objective

    J_ε(θ) = Loss(θ) + ε‖θ‖²,

* **Loss(θ)** is the mean over the N pairs of the *squared* Hausdorff distance between the set
  of output tokens and the set of target tokens,
  d_H(O, Y)² = max( max_i min_k |o_i − y_k|², max_k min_i |o_i − y_k|² )
  (squared Euclidean distances, so no square root whose gradient blows up at 0). Sequences are
  ragged: padding is masked out of both the min and the max, so it never counts.
* **‖θ‖²** is the sum of the squares of *every* trainable parameter of the module
  (``module.parameters()``): for each block ρ and η, all entries of W_q, W_k (h×d) and W_v
  (d×d), the FF's first-layer weight (4×d) and bias (4) and second-layer weight (d×4). Nothing
  is left out, so ρ = η = 1 (a plain residual block) costs 2 per block.

**The diagnostic.** If θ* is any point of the same architecture, every global minimiser θ_ε of
J_ε satisfies J_ε(θ_ε) ≤ J_ε(θ*) = Loss(θ*) + ε‖θ*‖². For an exact interpolant Loss(θ*) = 0, so
Loss(θ_ε) ≤ J_ε(θ_ε) ≤ ε‖θ*‖²: at a global minimum the training loss is O(ε).
:func:`tikhonov_diagnostic` takes θ* (the constructed model exported by
:func:`exactformer.export.to_rho_eta`, or the model that generated the targets), computes the
bound B = J_ε(θ*) (its Loss(θ*) term is reported and is 0 up to rounding for an interpolant)
and tests, at the run's final parameters θ_T,

* ``objective_above_bound``: J_ε(θ_T) > B. This is the verdict: it *proves* θ_T is not a
  global minimiser of the regularised problem;
* ``loss_above_bound``: Loss(θ_T) > B, the form stated in the paper (Loss(θ_ε) ≤ ε‖θ*‖²). It
  implies the first (J_ε ≥ Loss) but flags fewer runs.

Neither test can prove that a run *is* at a global minimum.

Importing this module needs torch; the rest of exactformer does not.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from ..data import Dataset
from ..distance import smallest
from ..export import RhoEtaTransformer, apply, pad_batch
from ..tables import format_table


# ------------------------------------------------------------------------------ the loss
def hausdorff_sq(out: torch.Tensor, mask: torch.Tensor, targets: torch.Tensor,
                 target_mask: torch.Tensor) -> torch.Tensor:
    """Squared Hausdorff distance per pair between output and target token sets, shape (B,).

    out: (B, n, d) with mask (B, n); targets: (B, m, d) with target_mask (B, m); masks are True
    at real tokens and every pair has at least one real token of each kind. Distances are the
    coordinate differences squared and summed (not |o|² + |y|² − 2⟨o, y⟩), so an output equal
    to a target contributes exactly 0. Memory is B·n·m·d.
    """
    D = ((out[:, :, None, :] - targets[:, None, :, :]) ** 2).sum(-1)  # (B, n, m)
    to_target = D.masked_fill(~target_mask[:, None, :], math.inf).amin(dim=2)  # (B, n)
    to_output = D.masked_fill(~mask[:, :, None], math.inf).amin(dim=1)  # (B, m)
    return torch.maximum(to_target.masked_fill(~mask, 0).amax(dim=1),
                         to_output.masked_fill(~target_mask, 0).amax(dim=1))


@dataclass(frozen=True)
class Batch:
    """A dataset as padded tensors: inputs x (N, n, d) with mask, targets y (N, m, d) with mask."""

    x: torch.Tensor
    mask: torch.Tensor
    y: torch.Tensor
    y_mask: torch.Tensor

    @classmethod
    def from_dataset(cls, data: Dataset, dtype=torch.float64, device=None) -> Batch:
        xs, ys = data.floats()
        return cls(*pad_batch(xs, dtype, device), *pad_batch(ys, dtype, device))


def pair_losses(module: nn.Module, batch: Batch) -> torch.Tensor:
    """d_H(outputs_j, Y_j)² for every pair j, shape (N,)."""
    return hausdorff_sq(module(batch.x, batch.mask), batch.mask, batch.y, batch.y_mask)


def norm_sq(module: nn.Module) -> torch.Tensor:
    """‖θ‖²: the sum of squares of every trainable parameter (see the module docstring)."""
    return sum(p.pow(2).sum() for p in module.parameters() if p.requires_grad)


def _as_batch(module: nn.Module, data: Dataset | Batch) -> Batch:
    """``data`` as tensors on the module's device, zero-padded to its width ``module.d`` where
    it has one (docs/architecture.md#data-narrower-than-the-model)."""
    if isinstance(data, Batch):
        return data
    p = next(module.parameters(), None)
    if p is None:  # an identity model exports to a module without any parameter
        raise ValueError("the module has no parameters (nothing to train or to place data on)")
    return Batch.from_dataset(data.padded(getattr(module, "d", data.d)), p.dtype, p.device)


def loss(module: nn.Module, data: Dataset | Batch) -> torch.Tensor:
    """Loss(θ): the mean over pairs of the squared Hausdorff distance (differentiable)."""
    return pair_losses(module, _as_batch(module, data)).mean()


def objective(module: nn.Module, data: Dataset | Batch, eps: float) -> torch.Tensor:
    """J_ε(θ) = Loss(θ) + ε‖θ‖²."""
    return loss(module, data) + eps * norm_sq(module)


# ------------------------------------------------------------------------------ models
def random_rho_eta(d: int, n_blocks: int = 1, h: int = 1, attention: str = "softmax",
                   tau: float = 1.0, width: int = 4, seed: int = 0,
                   dtype=torch.float64) -> RhoEtaTransformer:
    """A ρ/η model with a reproducible random start: ρ = η = 1 (residual blocks) and every
    weight and bias uniform in ±1/√(fan-in) (PyTorch's nn.Linear range), drawn from a
    generator seeded with ``seed``, so the values do not depend on the global torch RNG."""
    module = RhoEtaTransformer(d, n_blocks, h, attention, tau, width, dtype)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for blk in module.blocks:
            blk.rho.fill_(1)
            blk.eta.fill_(1)
        for layer in module.modules():
            if isinstance(layer, nn.Linear):
                bound = 1 / math.sqrt(layer.in_features)
                for p in layer.parameters():
                    p.copy_((torch.rand(p.shape, generator=gen, dtype=dtype) * 2 - 1) * bound)
    return module


def mean_ff_generator(d: int, h: int = 1, tau: float = 1.0, width: int = 4, seed: int = 0,
                      dtype=torch.float64) -> RhoEtaTransformer:
    """The one-block generating model of the paper's experiment, in the ρ/η layout.

    W_q = W_k = 0, so every attention weight is 1/n and, with W_v = I and ρ = 0, every token
    becomes its sequence's mean; then η = 1 and a random width-``width`` FF whose weights and
    biases are standard normal (seeded NumPy generator). Every token of a sequence ends at the
    same point, so the output set has one token (m = 1; :func:`dataset_from_model` keeps
    whatever distinct float outputs there are).
    """
    rng = np.random.default_rng(seed)
    module = RhoEtaTransformer(d, 1, h, "softmax", tau, width, dtype)
    blk = module.blocks[0]
    with torch.no_grad():
        for p in module.parameters():
            p.zero_()
        blk.eta.fill_(1)
        blk.attn.to_v.weight.copy_(torch.eye(d, dtype=dtype))
        for p in (blk.ff[0].weight, blk.ff[0].bias, blk.ff[2].weight):
            p.copy_(torch.as_tensor(rng.standard_normal(tuple(p.shape)), dtype=dtype))
    return module


@torch.no_grad()
def dataset_from_model(module: nn.Module, inputs) -> Dataset:
    """The dataset that ``module`` interpolates exactly: each input (n_j × d) paired with the
    set of its distinct output tokens, so Loss(module) = 0 with no rounding at all."""
    ys = [np.unique(y, axis=0) for y in apply(module, inputs)]
    return Dataset.from_arrays([np.asarray(x, dtype=float) for x in inputs], ys)


# ------------------------------------------------------------------------------ training
@dataclass
class TrainResult:
    """What a run did. The histories hold one value per evaluated iterate θ_0 … θ_T (so one
    more than ``steps``); the last entry is the final parameters, which ``module`` holds."""

    module: nn.Module
    eps: float
    loss: list[float]  # Loss(θ_t)
    norm_sq: list[float]  # ‖θ_t‖²
    max_error: list[float]  # max over pairs of the Hausdorff distance d_H (not squared)
    steps: int
    seconds: float
    stop: str  # "epochs", "target error", "time budget" or "not finite"

    @property
    def objective(self) -> list[float]:
        """J_ε(θ_t) = Loss(θ_t) + ε‖θ_t‖²."""
        return [lo + self.eps * n for lo, n in zip(self.loss, self.norm_sq, strict=True)]

    @property
    def final_loss(self) -> float:
        return self.loss[-1]

    @property
    def final_objective(self) -> float:
        return self.objective[-1]

    @property
    def final_max_error(self) -> float:
        return self.max_error[-1]

    @property
    def min_loss(self) -> float:
        """The smallest training loss seen over the run (the paper's "minimal training loss")."""
        return smallest(self.loss)


def train(module: nn.Module, data: Dataset | Batch, eps: float = 0.0, epochs: int = 1000,
          lr: float = 1e-2, lr_final: float = 1e-4, target_error: float | None = None,
          time_budget: float | None = None, progress: bool = True) -> TrainResult:
    """Minimise J_ε(θ) = Loss(θ) + ε‖θ‖² by full-batch Adam, starting from ``module``.

    ``module`` is the start (a warm start from ``to_rho_eta(model)`` or :func:`random_rho_eta`);
    it is copied, never changed. One epoch is one Adam step on the whole dataset; the learning
    rate follows a cosine from ``lr`` down to ``lr_final`` over ``epochs``. The run stops early
    when the largest Hausdorff distance of a pair drops below ``target_error`` (absolute, not
    squared) or after ``time_budget`` seconds of wall time, and when the objective is not
    finite. Full-batch Adam is deterministic, so the run is reproducible given its start.
    """
    module = copy.deepcopy(module)
    params = [p for p in module.parameters() if p.requires_grad]
    if not params:
        raise ValueError("the start module has no trainable parameters")
    batch = _as_batch(module, data)
    opt = torch.optim.Adam(params, lr=lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(epochs, 1),
                                                       eta_min=lr_final)
    losses, norms, errors = [], [], []
    stop, t0 = "epochs", time.perf_counter()
    bar = tqdm(total=epochs, desc=f"train ε={eps:g}", disable=not progress, leave=False)
    for step in range(epochs + 1):
        per_pair = pair_losses(module, batch)
        data_loss, penalty = per_pair.mean(), norm_sq(module)
        losses.append(data_loss.item())
        norms.append(penalty.item())
        errors.append(math.sqrt(per_pair.max().item()))
        if not math.isfinite(losses[-1] + eps * norms[-1]):
            stop = "not finite"
        elif target_error is not None and errors[-1] < target_error:
            stop = "target error"
        elif time_budget is not None and time.perf_counter() - t0 > time_budget:
            stop = "time budget"
        if stop != "epochs" or step == epochs:
            break
        opt.zero_grad(set_to_none=True)
        (data_loss + eps * penalty).backward()
        opt.step()
        sched.step()
        bar.update()
        if step % 50 == 0:
            bar.set_postfix(loss=f"{losses[-1]:.3g}", err=f"{errors[-1]:.3g}")
    bar.close()
    return TrainResult(module, eps, losses, norms, errors, len(losses) - 1,
                       time.perf_counter() - t0, stop)


# ------------------------------------------------------------------------------ diagnostic
@dataclass
class TikhonovDiagnostic:
    """Is the run provably *not* at a global minimum of J_ε? (see the module docstring)."""

    eps: float
    reference_loss: float  # Loss(θ*): 0 for an exact interpolant, up to rounding
    reference_norm_sq: float  # ‖θ*‖²
    final_loss: float  # Loss(θ_T)
    final_norm_sq: float  # ‖θ_T‖²

    @property
    def bound(self) -> float:
        """B = J_ε(θ*) = Loss(θ*) + ε‖θ*‖² ≥ J_ε(θ_ε) for every global minimiser θ_ε."""
        return self.reference_loss + self.eps * self.reference_norm_sq

    @property
    def final_objective(self) -> float:
        return self.final_loss + self.eps * self.final_norm_sq

    @property
    def objective_above_bound(self) -> bool:
        """J_ε(θ_T) > B: θ_T is not a global minimiser (the verdict)."""
        return self.final_objective > self.bound

    @property
    def loss_above_bound(self) -> bool:
        """Loss(θ_T) > B, the paper's form; implies ``objective_above_bound``."""
        return self.final_loss > self.bound

    @property
    def not_global_minimum(self) -> bool:
        return self.objective_above_bound

    def rows(self) -> list[tuple[str, str]]:
        def above(flag: bool) -> str:
            return "above B" if flag else "not above B"

        verdict = ("NOT at a global minimum of the regularised problem"
                   if self.not_global_minimum else "consistent with a global minimum (not proved)")
        return [("verdict", verdict),
                ("ε", f"{self.eps:g}"),
                ("‖θ*‖² / Loss(θ*)", f"{self.reference_norm_sq:.6g} / {self.reference_loss:.3g}"),
                ("bound B = Loss(θ*) + ε‖θ*‖²", f"{self.bound:.6g}"),
                ("final Loss(θ_T)", f"{self.final_loss:.6g}  ({above(self.loss_above_bound)})"),
                ("final J_ε(θ_T)",
                 f"{self.final_objective:.6g}  ({above(self.objective_above_bound)})")]

    def table(self) -> str:
        return format_table(self.rows())


def _signature(module: nn.Module) -> tuple:
    shapes = tuple((k, tuple(v.shape)) for k, v in module.state_dict().items())
    config = module.config() if hasattr(module, "config") else None
    return shapes, config


def check_same_architecture(module: nn.Module, reference: nn.Module) -> None:
    """Raise ValueError unless both have the same parameter shapes and config (attention, τ)."""
    if _signature(module) != _signature(reference):
        raise ValueError("the reference θ* must have the same architecture as the trained "
                         f"model: {_signature(reference)} vs {_signature(module)}")


@torch.no_grad()
def tikhonov_diagnostic(run: TrainResult | nn.Module, reference: nn.Module,
                        data: Dataset | Batch, eps: float | None = None) -> TikhonovDiagnostic:
    """Compare the final point of a run with the bound J_ε(θ*) of a known point θ*.

    ``run`` is a :class:`TrainResult` (its ε is used) or a module (then ``eps`` is required);
    ``reference`` is θ*, a module of the same architecture (same parameter shapes, attention,
    τ), e.g. ``to_rho_eta(model)`` for a constructed model or the generating model of the data.
    Every quantity is evaluated afresh in the modules' dtype.
    """
    module = run.module if isinstance(run, TrainResult) else run
    if eps is None:
        if not isinstance(run, TrainResult):
            raise ValueError("eps is required when run is a module")
        eps = run.eps
    check_same_architecture(module, reference)
    batch = _as_batch(module, data)
    return TikhonovDiagnostic(eps, loss(reference, batch).item(), norm_sq(reference).item(),
                              loss(module, batch).item(), norm_sq(module).item())
