"""The Hub-style folder of a native module: ``config.json``, ``model.safetensors``, ``README.md``.

:func:`write_pretrained` and :func:`read_pretrained` are what ``NativeTransformer.
save_pretrained`` / ``from_pretrained`` do, in the layout of Hugging Face's
``PyTorchModelHubMixin`` (config + safetensors weights + model card), offline and without
``huggingface_hub``: the folder can be uploaded as it is (``huggingface_hub.upload_folder``).

``model.safetensors`` holds the native file's tensors (:func:`~exactformer.export.native.
native_tensors`: the model's parameters in float64, exactly a float64 model's) and, under
``eval.``, the module's evaluation form (its state dict), so that the module read back gives the
same outputs bit for bit; an exact model is also saved as ``model.json`` (the JSON model file)
so that ``exactformer verify`` can re-prove it. Reading checks the folder as a whole: the
config's every value, the parameters against ``model.json``, and every tensor the module runs
against the module rebuilt from the stored model; any fault is one :class:`FolderError`
naming the folder, the file and the field. See docs/numerics.md#the-hub-folder.
"""

from __future__ import annotations

import hashlib
import json
from contextlib import ExitStack
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from ..data import CausalDataset, Dataset
from ..model import Transformer
from ..modelio import ModelFormatError, atomic_path, load_model, model_to_dict
from ..numbers import wider_than_model
from .native import FORMAT, check_native_config, native_config, native_model, native_tensors

CONFIG, WEIGHTS, CARD, MODEL = "config.json", "model.safetensors", "README.md", "model.json"
EVAL = "eval."  # prefix of the evaluation form's tensors


def data_hash(data: Dataset | CausalDataset) -> str:
    """sha256 of the dataset's JSON form (sorted keys, no spaces): names the data exactly."""
    text = json.dumps(data.to_json_dict(), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def write_pretrained(module, folder: str | Path, data=None, report=None) -> None:
    """Write ``module``'s folder (the files appear together, or none of them changes); the card
    describes ``data`` and shows ``report`` (say ``exactformer.verify(module.model, data)``)
    when given."""
    folder = Path(folder)
    dtype = next(module.parameters()).dtype
    config = {"format": FORMAT, "dtype": str(dtype).removeprefix("torch."), **module.config()}
    tensors = native_tensors(module.model, torch.float64)  # the stored model, read back
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


class FolderError(ValueError):
    """A folder (or a safetensors file and its config) that cannot be loaded as written: not
    one the package wrote, or altered since. The message names the file and the field."""


def read_pretrained(cls, folder: str | Path, device=None, dtype=None, ff: str | None = None):
    """The module of class ``cls`` saved in ``folder``: rebuilt from the stored model
    (``model.json`` if present, else the float64 parameters), after checking that every tensor
    of the saved evaluation form equals the rebuilt one, so the module runs exactly the model
    that ``exactformer verify`` checks. Without ``dtype`` or ``ff`` its outputs are the saved
    module's; with either, it is built in that dtype or FF form instead."""
    folder = Path(folder)
    for name in (CONFIG, WEIGHTS):
        if not (folder / name).is_file():
            raise FolderError(f"{folder}: no {name} (not a folder written by save_pretrained)")
    config = read_config(folder / CONFIG)
    tensors = read_tensors(folder / WEIGHTS)
    model = _stored_model(folder, config, {k: v for k, v in tensors.items()
                                           if not k.startswith(EVAL)})
    form = config.get("ff", "profile")
    saved = cls(model, getattr(torch, config["dtype"]), form)
    _check_equal(folder / WEIGHTS, {k: v for k, v in tensors.items() if k.startswith(EVAL)},
                 {EVAL + k: v for k, v in saved.state_dict().items()}, "the module rebuilt "
                 f"from {MODEL if (folder / MODEL).is_file() else 'the stored parameters'}")
    module = saved if dtype is None and ff is None else \
        cls(model, dtype or getattr(torch, config["dtype"]), ff or form)
    return module.to(device)


def read_config(path: Path, native: bool = True):
    """The JSON config at ``path``, checked by :func:`check_native_config` if ``native``."""
    try:
        config = json.loads(Path(path).read_text())
    except RecursionError:
        raise FolderError(f"{path}: not valid JSON (nested too deeply)") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        raise FolderError(f"{path}: not valid JSON ({e})"[:300]) from None
    if native:
        try:
            check_native_config(config, str(path))
        except ValueError as e:
            raise FolderError(str(e)) from None
    elif not isinstance(config, dict):
        raise FolderError(f"{path}: expected a JSON object")
    return config


def read_tensors(path: Path) -> dict[str, torch.Tensor]:
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, RuntimeError, ValueError) as e:
        raise FolderError(f"{path}: not a readable safetensors file ({e})"[:300]) from None


def _stored_model(folder: Path, config: dict, native: dict) -> Transformer:
    """``model.json`` when the folder has one (its parameters checked against the native
    tensors), else the float64 model of the native tensors; the config must describe it."""
    for key, t in native.items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise FolderError(f"{folder / WEIGHTS}: tensor {key} holds a nan or an inf")
    try:
        model = native_model(native, config)
    except ValueError as e:  # names the tensor
        raise FolderError(f"{folder / WEIGHTS}: {e}") from None
    if (folder / MODEL).is_file():
        try:
            model = load_model(folder / MODEL)
        except ModelFormatError as e:
            raise FolderError(str(e)) from None
        dtype = next(iter(native.values())).dtype if native else torch.float64
        _check_equal(folder / WEIGHTS, native, native_tensors(model, dtype),
                     f"{MODEL}'s parameters")
    for key, value in native_config(model).items():
        if config.get(key) != value:
            raise FolderError(f"{folder / CONFIG}: \"{key}\" is {config.get(key)!r}, but the "
                              f"stored model has {value!r}"[:300])
    return model


def _check_equal(path: Path, found: dict, expected: dict, source: str) -> None:
    """FolderError naming the first tensor of ``found`` that is missing, extra, or not
    bit for bit the one of ``expected`` (what ``source`` implies)."""
    for key in sorted(set(found) | set(expected)):
        if key not in found or key not in expected:
            where = "missing" if key not in found else "not part of the model"
            raise FolderError(f"{path}: tensor {key} is {where} ({source})")
        a, b = found[key], expected[key]
        if a.dtype != b.dtype or a.shape != b.shape or not torch.equal(a, b):
            raise FolderError(f"{path}: tensor {key} differs from {source}: the folder was "
                              "altered after save_pretrained wrote it")


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
            f"| sha256 of the data's JSON form | `{data_hash(data)}` |", ""]


def _verdict_lines(report) -> list[str]:
    rerun = ["To re-run the verification with the data file DATA:", "", "```",
             "exactformer verify FOLDER/model.json DATA", "```", "",
             "(exact models; a float64 model: `exactformer.verify(NativeTransformer."
             "from_pretrained(FOLDER).model, data)`).", ""]
    if report is None:
        return ["## Verification", "", "Not run when the folder was written.", "", *rerun]
    return ["## Verification", "", "```", report.table(), "```", "", *rerun]
