"""PyTorch export: a model as an ``nn.Module`` of either layout, and its safetensors files.

Two layouts, both taking a padded batch ``x`` (B, n, d) and a padding mask (B, n) (True at real
tokens), on any device:

* **native** (:func:`to_torch`): our FF→SA blocks. Its *file* holds the model's own parameters
  under keys that mirror the JSON model format (:func:`native_tensors`, :data:`NATIVE_FF_KEYS`,
  :data:`NATIVE_SA_KEYS`); the module keeps that model as ``module.model`` and saves from it.
  Its *evaluation form* is built from the model when the module is made (and so when a file is
  loaded): attention keeps the structured matrices A = α·I + a·cᵀ and V = β·I + p·qᵀ; an FF
  whose hidden units all read one direction f (every gadget of the construction) is evaluated
  by its *profile* (``ff="profile"``, the default): FF(x) = η·x + φ(f·x) with φ the
  piecewise-linear function given by its breakpoints, its values there (computed exactly, in
  Fractions, from the model's numbers; from a file, from the exact values of its floats) and
  its two end slopes. This is the same function, but a token on a flat part of φ (a hat's
  plateau, the zero outside a window) gets exactly the stored value instead of a sum of large
  ReLU terms that cancel only up to rounding; that is what makes float32 usable. Other FFs, and
  every FF with ``ff="dense"``, are evaluated as η·x + W·relu(U·x + b).
* **rho-eta** (:func:`to_rho_eta`): the research layout "x ← ρ·x + Attn(x); x ← η·x + FF(x)"
  with dense W_q, W_k (h×d, h = d + 1), W_v (d×d) and FF = Linear(d, 4) → ReLU → Linear(4, d).
  Its file is its state dict.

Importing this module needs torch and safetensors; the rest of exactformer does not.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from ..model import FF, SA, Block, Head, ScoreMatrix, Transformer, ValueMatrix
from ..modelio import atomic_path
from .modules import (
    NATIVE_FF_KEYS,
    NativeTransformer,
    RhoEtaTransformer,
    fill,
    floats,
    head_values,
    is_identity_sa,
    native_config,
)

FORMAT = "exactformer.torch/1"
LAYOUTS = ("native", "rho-eta")


def to_torch(model: Transformer, dtype=torch.float64, device=None,
             ff: str = "profile") -> NativeTransformer:
    """The native-layout module of ``model``, evaluating its FFs by their profiles
    (``ff="profile"``) or densely (``ff="dense"``); see :class:`NativeTransformer`."""
    return NativeTransformer(model, dtype, ff).to(device)




def native_tensors(model: Transformer, dtype=torch.float64) -> dict[str, torch.Tensor]:
    """The native file's tensors: the model's parameters, each rounded to ``dtype``, under
    ``blocks.{i}.ff.{eta, U, b, W}`` and ``blocks.{i}.sa.{rho, alpha, a, c, beta, p, q}`` (the
    names of the JSON model format, with A's and V's entries flattened into the SA; a layer
    of H ≥ 2 heads stacks them: shapes (H,) and (H, d))."""
    out = {}
    for i, blk in enumerate(model.blocks):
        values = {}
        if blk.ff is not None:
            ff = blk.ff
            values.update(zip((f"ff.{k}" for k in NATIVE_FF_KEYS), (ff.eta, ff.U, ff.b, ff.W),
                              strict=True))
        if blk.sa is not None:
            sa = blk.sa
            values.update({f"sa.{k}": v for k, v in
                           {"rho": sa.rho, **head_values(sa)}.items()})
        for k, v in values.items():
            out[f"blocks.{i}.{k}"] = torch.as_tensor(floats(v), dtype=dtype).contiguous()
    if model.positions is not None:
        out["positions"] = torch.as_tensor(floats(model.positions), dtype=dtype).contiguous()
    return out


def native_model(tensors: dict[str, torch.Tensor], config: dict) -> Transformer:
    """The model held by a native file: float64 parameters (``exact=False``) with the exact
    values of the stored floats. Raises ValueError on missing, extra or misshapen tensors."""
    d, blocks, seen = config["d"], [], set()

    def get(key, shape):
        if key not in tensors:
            raise ValueError(f"native weights: {key} is missing")
        t = tensors[key]
        if tuple(t.shape) != shape:
            raise ValueError(f"native weights: {key} has shape {tuple(t.shape)}, "
                             f"expected {shape}")
        seen.add(key)
        a = t.detach().to(device="cpu", dtype=torch.float64).numpy().copy()
        return float(a) if shape == () else a

    for i, spec in enumerate(config["blocks"]):
        ff = sa = None
        if spec["ff"] is not None:
            w, key = spec["ff"]["width"], f"blocks.{i}.ff."
            ff = FF(get(key + "eta", ()), get(key + "U", (w, d)), get(key + "b", (w,)),
                    get(key + "W", (d, w)))
        if spec["sa"]:
            sa = _native_sa(get, f"blocks.{i}.sa.", d, spec["sa"])
        blocks.append(Block(ff, sa))
    rows = config.get("positions")
    positions = None if rows is None else get("positions", (rows, d))
    extra = sorted(set(tensors) - seen)
    if extra:
        raise ValueError(f"native weights: unexpected tensors {', '.join(extra[:5])}")
    tau = config.get("tau")
    return Transformer(d=d, attention=config["attention"], blocks=blocks,
                       tau=None if tau is None else float(tau), exact=False,
                       causal=bool(config.get("causal", False)), positions=positions)


def _native_sa(get, key: str, d: int, spec) -> SA:
    """The SA layer at ``key``: one head (``spec`` true) or {"heads": H} stacked heads."""
    if spec is True:
        return SA(get(key + "rho", ()),
                  ScoreMatrix(get(key + "alpha", ()), get(key + "a", (d,)), get(key + "c", (d,))),
                  ValueMatrix(get(key + "beta", ()), get(key + "p", (d,)), get(key + "q", (d,))))
    H = spec.get("heads") if isinstance(spec, dict) else None
    if not isinstance(H, int) or isinstance(H, bool) or H < 2:
        raise ValueError(f"native config: {key[:-1]} must be true, false or {{\"heads\": H}} "
                         f"with an integer H ≥ 2, got {spec!r}")
    alpha, a, c = get(key + "alpha", (H,)), get(key + "a", (H, d)), get(key + "c", (H, d))
    beta, p, q = get(key + "beta", (H,)), get(key + "p", (H, d)), get(key + "q", (H, d))
    return SA(get(key + "rho", ()), heads=[
        Head(ScoreMatrix(float(alpha[h]), a[h], c[h]), ValueMatrix(float(beta[h]), p[h], q[h]))
        for h in range(H)])


def round_model(model: Transformer, dtype=torch.float64) -> Transformer:
    """``model`` as a native file of ``dtype`` holds it: each parameter rounded to ``dtype``,
    kept as a float64 (``exact=False``). :func:`export` builds its module from this."""
    rounded = native_model(native_tensors(model, dtype), native_config(model))
    return replace(rounded, record=model.record)


def to_rho_eta(model: Transformer, dtype=torch.float64, device=None) -> RhoEtaTransformer:
    """The ρ/η-layout module of ``model``.

    Our blocks are FF→SA, the layout's are attention→FF, so the layers pair up shifted by one:
    (identity, FF_1), (SA_1, FF_2), …, (SA_L, identity); pairs of two identities are dropped.
    Scores ⟨A x_i, x_l⟩ = α x_i·x_l + (c·x_i)(a·x_l) = (W_q x_i)·(W_k x_l) with
    W_q = [α·I; cᵀ], W_k = [I; aᵀ] (h = d + 1, no square roots); W_v = V. Narrow FFs get zero
    hidden units; an identity FF is η = 1 with zero weights, an identity SA ρ = 1 with W_v = 0.
    Every layer gets the model's most heads H (docs/heads.md): head t's W_q, W_k, W_v are rows
    t·h.., t·h.., t·d.. of ``to_q``, ``to_k``, ``to_v``; a layer's missing heads have W_v = 0.
    """
    d = model.d
    ffs = [b.ff for b in model.blocks] + [None]
    sas = [None] + [None if is_identity_sa(b.sa) else b.sa for b in model.blocks]
    pairs = [(sa, ff) for sa, ff in zip(sas, ffs, strict=True)
             if sa is not None or ff is not None]
    width = max(4, model.max_width())
    tau = None if model.tau is None else float(model.tau)
    H = max(1, model.max_heads())
    module = RhoEtaTransformer(d, len(pairs), d + 1, model.attention, tau, width, dtype,
                               model.causal, None if model.positions is None
                               else len(model.positions), H)
    with torch.no_grad():
        for p in module.parameters():
            p.zero_()
    if model.positions is not None:
        fill(module, positions=model.positions)
    eye = np.eye(d, dtype=int)
    for blk, (sa, ff) in zip(module.blocks, pairs, strict=True):
        if sa is None:
            fill(blk, rho=1)
        else:
            fill(blk, rho=sa.rho)
            pad = [np.zeros((d + 1, d), dtype=int)] * (H - len(sa.heads))
            fill(blk.attn.to_q, weight=np.vstack(
                [np.vstack([eye * h.A.alpha, h.A.c[None, :]]) for h in sa.heads] + pad))
            fill(blk.attn.to_k, weight=np.vstack(
                [np.vstack([eye, h.A.a[None, :]]) for h in sa.heads] + pad))
            fill(blk.attn.to_v, weight=np.vstack(
                [h.V.dense() for h in sa.heads] + [np.zeros((d, d), dtype=int)] *
                (H - len(sa.heads))))
        if ff is None:
            fill(blk, eta=1)
        else:
            w = ff.width
            fill(blk, eta=ff.eta)
            fill(blk.ff[0], weight=np.vstack([ff.U, np.zeros((width - w, d), dtype=int)]),
                  bias=np.concatenate([ff.b, np.zeros(width - w, dtype=int)]))
            fill(blk.ff[2], weight=np.hstack([ff.W, np.zeros((d, width - w), dtype=int)]))
    return module.to(device)


def convert(model: Transformer, layout: str = "native", dtype=torch.float64, device=None,
            ff: str = "profile"):
    """:func:`to_torch` (``ff`` as there) or :func:`to_rho_eta` by ``layout``."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if layout == "native":
        return to_torch(model, dtype, device, ff)
    return to_rho_eta(model, dtype, device)


# ------------------------------------------------------------------------------ running
def pad_batch(inputs, dtype=torch.float64, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequences (n_j × d each) as a zero-padded (N, max n_j, d) batch and its (N, n) mask."""
    n = max(len(x) for x in inputs)
    d = np.asarray(inputs[0]).shape[1]
    x = torch.zeros(len(inputs), n, d, dtype=dtype, device=device)
    mask = torch.zeros(len(inputs), n, dtype=torch.bool, device=device)
    for j, seq in enumerate(inputs):
        x[j, : len(seq)] = torch.as_tensor(floats(seq), dtype=dtype)
        mask[j, : len(seq)] = True
    return x, mask


@torch.no_grad()
def apply(module: nn.Module, inputs) -> list[np.ndarray]:
    """Run ``module`` on a list of sequences (n_j × d); the outputs as float64 arrays."""
    p = next(module.parameters())
    x, mask = pad_batch(inputs, p.dtype, p.device)
    y = module(x, mask).double().cpu().numpy()
    return [y[j, : len(seq)] for j, seq in enumerate(inputs)]


# ------------------------------------------------------------------------------ files
def config_path(path: str | Path) -> Path:
    """The JSON config beside a safetensors file: model.safetensors → model.config.json."""
    return Path(path).with_suffix(".config.json")


def _dtype(module: nn.Module) -> torch.dtype:
    p = next(module.parameters(), None)
    return p.dtype if p is not None else getattr(module, "dtype", torch.float64)


def save_torch(module: nn.Module, path: str | Path) -> None:
    """Write the weights (safetensors) and the config beside them; both or neither appear.

    A native module writes its model's parameters (:func:`native_tensors`) in the module's
    dtype, not its evaluation form; a ρ/η module writes its state dict."""
    dtype = _dtype(module)
    config = {"format": FORMAT, "dtype": str(dtype).removeprefix("torch."), **module.config()}
    if isinstance(module, NativeTransformer):
        tensors = native_tensors(module.model, dtype)
    else:
        tensors = {k: v.detach().cpu().contiguous() for k, v in module.state_dict().items()}
    with atomic_path(path) as tmp, atomic_path(config_path(path)) as tmp_config:
        save_file(tensors, str(tmp))
        tmp_config.write_text(json.dumps(config, indent=1))


def load_torch(path: str | Path, device=None, dtype=None, ff: str | None = None) -> nn.Module:
    """The module saved by :func:`save_torch` (or ``exactformer export``).

    A native file is read as a model (:func:`native_model`: the exact values of its floats) and
    the module is built from it, so its profiles are computed exactly from the stored numbers;
    ``ff`` overrides the evaluation form recorded in the config. ``dtype`` (default: the file's)
    is the dtype to evaluate in: a float64 native file loaded with ``dtype=torch.float32`` keeps
    float64 parameters for the profiles and evaluates in float32."""
    config = json.loads(config_path(path).read_text())
    if config.get("format") != FORMAT:
        raise ValueError(f"{config_path(path)}: expected \"format\": \"{FORMAT}\"")
    file_dtype = getattr(torch, config["dtype"])
    tensors = load_file(str(path))
    if config["layout"] == "native":
        model = native_model(tensors, config)
        return to_torch(model, dtype or file_dtype, device, ff or config.get("ff", "profile"))
    module = RhoEtaTransformer(config["d"], config["n_blocks"], config["h"],
                               config["attention"], config["tau"], config["width"], file_dtype,
                               config.get("causal", False), config.get("positions"),
                               config.get("heads", 1))
    module.load_state_dict(_rho_eta_scalars_as_vectors(tensors))
    return module.to(device=device, dtype=dtype)


def _rho_eta_scalars_as_vectors(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A ρ/η state dict with every ``blocks.{i}.rho`` / ``.eta`` of shape (1,): files written
    before ρ and η took that shape hold them with shape (), and still load."""
    def vector(key: str, t: torch.Tensor) -> torch.Tensor:
        scalar = key.rsplit(".", 1)[-1] in ("rho", "eta") and t.dim() == 0
        return t.reshape(1) if scalar else t

    return {k: vector(k, v) for k, v in tensors.items()}


def export(model: Transformer, path: str | Path, layout: str = "native",
           dtype=torch.float64, ff: str = "profile") -> nn.Module:
    """Convert ``model`` and save it at ``path`` (safetensors) plus its config; ``dtype`` is a
    torch dtype or its name ("float64", "float32"). The native module returned is the one that
    loading the file gives: built from the parameters rounded to ``dtype``
    (:func:`round_model`), evaluating its FFs in the form ``ff``."""
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    if layout == "native":
        module = to_torch(round_model(model, dtype), dtype, ff=ff)
    else:
        module = convert(model, layout, dtype)
    save_torch(module, path)
    return module
