"""PyTorch export: a model as an ``nn.Module`` of either layout (by name), and their files.

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

The numbers of the native file are :mod:`exactformer.export.native`, the ρ/η conversion
:mod:`exactformer.export.rho_eta`, running a module on sequences :mod:`exactformer.export.run`.
Importing this module needs torch and safetensors; the rest of exactformer does not.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from ..model import Transformer
from ..modelio import atomic_path
from ..numbers import normal_positive
from .hub import CONFIG, WEIGHTS, FolderError, read_config, read_tensors
from .modules import NativeTransformer, RhoEtaTransformer
from .native import FORMAT, native_model, native_tensors, round_model
from .rho_eta import to_rho_eta

LAYOUTS = ("native", "rho-eta")


def to_torch(model: Transformer, dtype=torch.float64, device=None,
             ff: str = "profile") -> NativeTransformer:
    """The native-layout module of ``model``, evaluating its FFs by their profiles
    (``ff="profile"``) or densely (``ff="dense"``); see :class:`NativeTransformer`."""
    return NativeTransformer(model, dtype, ff).to(device)




def convert(model: Transformer, layout: str = "native", dtype=torch.float64, device=None,
            ff: str = "profile"):
    """:func:`to_torch` (``ff`` as there) or :func:`to_rho_eta` by ``layout``."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if layout == "native":
        return to_torch(model, dtype, device, ff)
    return to_rho_eta(model, dtype, device)


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
    path = Path(path)
    if path.name == WEIGHTS and (path.parent / CONFIG).is_file():
        # a Hub or TransformerLens folder's weights: its card, model.json or
        # runtime_proofs.json would go on describing the weights replaced here
        raise FolderError(f"{path} is the weights file of an export folder ({path.parent / CONFIG}"
                          "), whose other files describe those weights: write elsewhere")
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
    where = config_path(path)
    config = read_config(where, native=False)
    if config.get("format") != FORMAT:
        raise FolderError(f"{where}: expected \"format\": \"{FORMAT}\"")
    if config.get("layout") == "native":
        config = read_config(where)
        tensors = read_tensors(path)
        try:
            model = native_model(tensors, config)
        except ValueError as e:
            raise FolderError(f"{path}: {e}") from None
        file_dtype = getattr(torch, config["dtype"])
        return to_torch(model, dtype or file_dtype, device, ff or config.get("ff", "profile"))
    tensors = read_tensors(path)
    try:  # the ρ/η module checks its own config's types and its tensors' names and shapes
        if config["attention"] == "softmax":
            normal_positive(config["tau"], "\"tau\"")
        module = RhoEtaTransformer(config["d"], config["n_blocks"], config["h"],
                                   config["attention"], config["tau"], config["width"],
                                   getattr(torch, config["dtype"]), config.get("causal", False),
                                   config.get("positions"), config.get("heads", 1))
        module.load_state_dict(_rho_eta_scalars_as_vectors(tensors))
    except (KeyError, TypeError, ValueError, AttributeError, RuntimeError) as e:
        raise FolderError(f"{where}: not a ρ/η config and weights that load ({e!r})"[:300]) \
            from None
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
