"""The Hub-style folder of a native module: ``config.json``, ``model.safetensors``, ``README.md``.

:func:`write_pretrained` and :func:`read_pretrained` are what ``NativeTransformer.
save_pretrained`` / ``from_pretrained`` do, in the layout of Hugging Face's
``PyTorchModelHubMixin`` (config + safetensors weights + model card), offline and without
``huggingface_hub``: the folder can be uploaded as it is (``huggingface_hub.upload_folder``).

``model.safetensors`` holds the native file's tensors (:func:`~exactformer.export.native.
native_tensors`: the model's parameters in the module's dtype) and, under ``eval.``, the
module's evaluation form (its state dict), so that the module read back gives the same outputs
bit for bit; an exact model is also saved as ``model.json`` (the JSON model file) so that
``exactformer verify`` can re-prove it. See docs/numerics.md#the-hub-folder.
"""

from __future__ import annotations

import json
from contextlib import ExitStack
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from ..data import CausalDataset
from ..model import Transformer
from ..modelio import atomic_path, model_to_dict
from ..numbers import wider_than_model
from .native import FORMAT, native_model, native_tensors

CONFIG, WEIGHTS, CARD, MODEL = "config.json", "model.safetensors", "README.md", "model.json"
EVAL = "eval."  # prefix of the evaluation form's tensors


def write_pretrained(module, folder: str | Path, data=None, report=None) -> None:
    """Write ``module``'s folder (the files appear together, or none of them changes); the card
    describes ``data`` and shows ``report`` (say ``exactformer.verify(module.model, data)``)
    when given."""
    folder = Path(folder)
    dtype = next(module.parameters()).dtype
    config = {"format": FORMAT, "dtype": str(dtype).removeprefix("torch."), **module.config()}
    tensors = native_tensors(module.model, dtype)
    tensors |= {EVAL + k: v.detach().cpu().contiguous() for k, v in module.state_dict().items()}
    texts = {CONFIG: json.dumps(config, indent=1), CARD: model_card(module.model, data, report)}
    if module.model.exact:
        texts[MODEL] = json.dumps(model_to_dict(module.model), separators=(",", ":"))
    folder.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        tmp = stack.enter_context(atomic_path(folder / WEIGHTS))
        save_file(tensors, str(tmp))
        for name, text in texts.items():
            stack.enter_context(atomic_path(folder / name)).write_text(text)


def read_pretrained(cls, folder: str | Path, device=None, dtype=None, ff: str | None = None):
    """The module of class ``cls`` saved in ``folder``. Without ``dtype`` or ``ff`` it is the
    saved module's evaluation form itself (identical outputs); with either, the module is
    rebuilt from the stored parameters as ``load_torch`` does."""
    folder = Path(folder)
    for name in (CONFIG, WEIGHTS):
        if not (folder / name).is_file():
            raise ValueError(f"{folder}: no {name} (not a folder written by save_pretrained)")
    config = json.loads((folder / CONFIG).read_text())
    if config.get("format") != FORMAT or config.get("layout") != "native":
        raise ValueError(f"{folder / CONFIG}: expected \"format\": \"{FORMAT}\" and "
                         f"\"layout\": \"native\"")
    tensors = load_file(str(folder / WEIGHTS))
    evaluation = {k.removeprefix(EVAL): v for k, v in tensors.items() if k.startswith(EVAL)}
    model = native_model({k: v for k, v in tensors.items() if not k.startswith(EVAL)}, config)
    file_dtype = getattr(torch, config["dtype"])
    module = cls(model, dtype or file_dtype, ff or config.get("ff", "profile"))
    if dtype is None and ff is None:
        module.load_state_dict(evaluation, strict=True)
    return module.to(device)


def model_card(model: Transformer, data=None, report=None) -> str:
    """The folder's README.md: what the model was compiled from, its shape, and its verdict."""
    kind = f"{'causal ' if model.causal else ''}{model.attention}"
    lines = ["---", "library_name: exactformer", "tags: [exactformer, exact-interpolation]",
             "---", "", f"# An exact {kind} transformer compiled by exactformer", "",
             "Weights constructed (not trained) so that the model maps every input sequence of "
             "its dataset to its target; see the exactformer documentation "
             "(docs/README.md).", "", "## Model", "",
             "| field | value |", "|---|---|",
             f"| attention | {model.attention}"
             f"{'' if model.tau is None else f' (τ = {model.tau})'} |",
             f"| blocks L | {model.n_blocks} |", f"| parameters P | {model.n_params()} |",
             f"| d | {model.d} |", f"| widest FF layer | {model.max_width()} |",
             f"| heads | {model.max_heads()} |",
             f"| parameters stored as | {'rationals (model.json)' if model.exact else 'float64'}"
             " and floats (model.safetensors) |", ""]
    lines += _data_lines(model, data) + _verdict_lines(report)
    lines += ["## Loading", "", "```python",
              "from exactformer.export import NativeTransformer",
              "module = NativeTransformer.from_pretrained(FOLDER)",
              "y = module(x, mask)  # x: (B, n, d), mask: (B, n) True at real tokens", "```", ""]
    return "\n".join(lines)


def _data_lines(model: Transformer, data) -> list[str]:
    meta = model.meta
    if data is None:
        known = ", ".join(f"{k} = {meta[k]}" for k in ("N", "sum_m", "constrained")
                          if k in meta)
        return ["## Data", "", f"Not recorded with the model{f' ({known})' if known else ''}.",
                ""]
    lengths = [len(x) for x in data.inputs]
    if data.d > model.d:
        raise ValueError(wider_than_model(data.d, model.d))
    d = data.padded_from or data.d
    dim = str(d) if d == model.d else f"{d} (data in R^{d}, zero-padded to d_model = {model.d})"
    rows = [f"| sequences N | {data.N} |", f"| token dimension d | {dim} |",
            f"| input lengths | {min(lengths)} to {max(lengths)} |"]
    if isinstance(data, CausalDataset):
        rows.append(f"| constrained positions | {data.constrained} |")
    else:
        rows.append(f"| target tokens Σm | {data.total_m} |")
    return ["## Data", "", "| field | value |", "|---|---|", *rows,
            f"| sha256 of the data's JSON form | `{data.sha256()}` |", ""]


def _verdict_lines(report) -> list[str]:
    rerun = ["To re-run the verification with the data file DATA:", "", "```",
             "exactformer verify FOLDER/model.json DATA", "```", "",
             "(exact models; a float64 model: `exactformer.verify(NativeTransformer."
             "from_pretrained(FOLDER).model, data)`).", ""]
    if report is None:
        return ["## Verification", "", "Not run when the folder was written.", "", *rerun]
    return ["## Verification", "", "```", report.table(), "```", "", *rerun]
