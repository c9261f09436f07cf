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

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from .. import __version__
from ..circuit.document import CIRCUIT_FILE, circuit_text, wanted
from ..conditioning import conditioning
from ..data import CausalDataset
from ..model import Transformer
from ..modelio import ModelFormatError, atomic_path, load_model, model_sha256, model_to_dict
from ..numbers import wider_than_model
from ..summary import LICENCE, PAPER, decides, model_summary
from ..verification.runtime_verdict import RUN_TOLERANCE
from .native import FORMAT, check_native_config, native_config, native_model, native_tensors

CONFIG, WEIGHTS, CARD, MODEL = "config.json", "model.safetensors", "README.md", "model.json"
EVAL = "eval."  # prefix of the evaluation form's tensors


def write_pretrained(module, folder: str | Path, data=None, report=None) -> None:
    """Write ``module``'s folder (the files appear together, or none of them changes); the card
    describes ``data`` and shows ``report`` (say ``exactformer.verify(module.model, data)``)
    when given."""
    folder = Path(folder)
    refuse_other_export(folder, hub=True)
    _check_report_data(data, report)
    _check_report_model(module.model, report)
    dtype = next(module.parameters()).dtype
    config = {"format": FORMAT, "dtype": str(dtype).removeprefix("torch."), **module.config()}
    tensors = native_tensors(module.model, torch.float64)  # the stored model, read back
    proofs = runtime_proofs(module.model, data)
    if proofs:
        config["runtime_proofs"] = {v.runtime: v.verdict for v in proofs}
        config["runtime_proof_criterion"] = proofs[0].criterion  # distance or decoding
        config[PROVED_FOR] = {"weights_sha256": weights_sha256(tensors),
                              "data_sha256": data.sha256()}
    tensors |= {EVAL + k: v.detach().cpu().contiguous() for k, v in module.state_dict().items()}
    texts = {CONFIG: json.dumps(config, indent=1),
             CARD: model_card(module.model, data, report, proofs, module)}
    if wanted(module.model, data, None):  # the circuit, by TL hooks (docs/circuit.md)
        texts[CIRCUIT_FILE] = circuit_text(module.model, data)
    if module.model.exact:
        texts[MODEL] = json.dumps(model_to_dict(module.model), separators=(",", ":"))
    folder.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        tmp = stack.enter_context(atomic_path(folder / WEIGHTS))
        save_file(tensors, str(tmp))
        for name, text in texts.items():
            stack.enter_context(atomic_path(folder / name)).write_text(text)
    if CIRCUIT_FILE not in texts:  # an earlier folder's circuit would describe other weights
        (folder / CIRCUIT_FILE).unlink(missing_ok=True)


def refuse_other_export(folder: Path, hub: bool) -> None:
    """FolderError when ``folder`` holds the other kind of export (a Hub folder, whose card and
    model.json a TransformerLens export would leave beside its own weights, or a TransformerLens
    folder, whose runtime_proofs.json a Hub folder would leave): exporting the paper's demo
    model to TransformerLens into the keyed model's Hub folder left a card saying "PROVED
    FAITHFUL IN float32" beside weights that miss the data by 1.9e-4 × scale in float32."""
    try:
        doc = json.loads((folder / CONFIG).read_text())
    except (OSError, ValueError):
        doc = None
    is_hub = isinstance(doc, dict) and doc.get("format") == FORMAT
    is_lens = (folder / "lens_helpers.py").is_file() or \
        (isinstance(doc, dict) and not is_hub and "n_layers" in doc)
    if (is_lens if hub else is_hub):
        other = "a TransformerLens export" if hub else "a Hub folder (save_pretrained)"
        raise FolderError(f"{folder} holds {other}, whose files describe other weights: write "
                          "this export to another folder")


def _check_report_data(data, report) -> None:
    """ValueError unless ``report`` was made on ``data`` (when both are given): the card shows
    the report's verdict under ``data``'s sha256, so a PROVED EXACT on the demo data written
    with other data (which the model misses by 3.3e8 × their scale) claimed them proved."""
    if data is None or report is None:
        return
    checked = getattr(report, "data", {}).get("sha256")
    if checked != data.sha256():
        raise ValueError(f"the report was made on data with sha256 {str(checked)[:12]}…, not "
                         f"on the data given (sha256 {data.sha256()[:12]}…): verify the model "
                         "on these data for their card")


def _check_report_model(model: Transformer, report) -> None:
    """ValueError when ``report`` describes another model: the model sha256 it records
    (``report.data``, :func:`.modelio.model_sha256`) is not ``model``'s, or, for a report that
    records none, its size and conditioning numbers (blocks, largest |θ|, ‖θ‖², largest unit
    slope) differ. The demo model's report written beside the same model with one bias edited
    (which misses pair 6 by 64) gave that model's card PROVED EXACT; two weights swapped keep
    every one of those numbers."""
    if report is None:
        return
    recorded = getattr(report, "data", {}).get("model_sha256")
    if recorded is not None:
        if recorded != model_sha256(model):
            raise ValueError("the report was made on another model (its model sha256 differs "
                             "from this module's): verify this module's model for its card")
        return
    cond = conditioning(model)
    mine = (model.n_blocks, cond.max_abs, cond.norm_sq, cond.max_slope)
    theirs = (getattr(report, "blocks", model.n_blocks), report.max_abs_param,
              report.param_norm_sq, report.max_unit_slope)
    if mine != theirs:
        raise ValueError("the report was made on another model (its blocks, largest |θ|, ‖θ‖² "
                         f"or largest unit slope {theirs} differ from this module's {mine}): "
                         "verify this module's model for its card")


PROVED_FOR = "runtime_proofs_for"  # config field: the weights and data the proofs were made on


def weights_sha256(native: dict) -> str:
    """SHA-256 of the stored model's tensors (name, dtype, shape and bytes, by name): what a
    folder's recorded runtime proofs were made for."""
    h = hashlib.sha256()
    for key in sorted(native):
        t = native[key].detach().cpu().contiguous()
        h.update(f"{key}:{t.dtype}:{tuple(t.shape)};".encode())
        h.update(t.numpy().tobytes())
    return h.hexdigest()


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
    native = {k: v for k, v in tensors.items() if not k.startswith(EVAL)}
    model = _stored_model(folder, config, native)
    form = config.get("ff", "profile")
    saved = cls(model, getattr(torch, config["dtype"]), form)
    _check_equal(folder / WEIGHTS, {k: v for k, v in tensors.items() if k.startswith(EVAL)},
                 {EVAL + k: v for k, v in saved.state_dict().items()}, "the module rebuilt "
                 f"from {MODEL if (folder / MODEL).is_file() else 'the stored parameters'}")
    _check_proved_for(folder, config, native)
    module = saved if dtype is None and ff is None else \
        cls(model, dtype or getattr(torch, config["dtype"]), ff or form)
    return module.to(device)


def _check_proved_for(folder: Path, config: dict, native: dict) -> None:
    """FolderError unless the config's recorded runtime proofs (if any) were made for the
    weights the folder stores: a verdict kept beside other weights would claim for them what
    was proved of the first."""
    if "runtime_proofs" not in config:
        return
    made = config.get(PROVED_FOR)
    found = weights_sha256(native)
    if not isinstance(made, dict) or made.get("weights_sha256") != found:
        raise FolderError(f"{folder / CONFIG}: \"runtime_proofs\" were not recorded for the "
                          f"weights of {WEIGHTS} (sha256 {found[:12]}…; \"{PROVED_FOR}\" "
                          "names others or none): the folder was altered after "
                          "save_pretrained wrote it")


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


def model_card(model: Transformer, data=None, report=None, proofs=None, module=None) -> str:
    """The folder's README.md, a card one can publish: what the model is (the rows of
    ``exactformer info``), what was proved of it and in which arithmetic, its float32
    verdict, with ``module`` (the one the folder stores) what it gives on the data as saved,
    the warning that outputs off the data are arbitrary, how the data's sha256 is
    computed, how to run it (from this folder, ``.``), the licence and the paper to cite. Every
    needed explanation is in the card itself: it links nowhere."""
    kind = f"{'causal ' if model.causal else ''}{model.attention}"
    lines = ["---", "library_name: exactformer", f"license: {LICENCE.lower()}",
             "tags: [exactformer, exact-interpolation]", "---", "",
             f"# An exact {kind} transformer compiled by exactformer {__version__}", "",
             "Weights constructed, not trained, "
             f"{'so that the model maps' if _proved(report) else 'aiming to map'} every input "
             "sequence of its dataset to its target, following the construction of "
             f"{PAPER}. The numbers below were produced by exactformer {__version__} when "
             "this folder was written.", "", *_unproved(report),
             "**Outside its data the model means nothing.** "
             f"{'It reproduces its dataset and nothing else: ' if _proved(report) else ''}"
             f"{'o' if _proved(report) else 'O'}n any input that is not one of its input "
             "sequences (a causal model: a prefix of one) its output is arbitrary. Nothing was "
             "fitted, and nothing generalises.", "", "## Model", "",
             *_markdown(model_summary(model)), ""]
    lines += _data_lines(model, data) + _verdict_lines(model, report)
    saved = None if module is None else _saved_run(module, data)
    lines += _float32_lines(model, data) + _saved_lines(saved) + _runtime_lines(proofs)
    lines += _usage_lines(model, data, saved)
    lines += ["## Licence and citation", "",
              f"exactformer, which wrote these weights, is {LICENCE}-licensed, and this card "
              "declares the same licence for them; the weights are a function of the data, so "
              "if the data carry other terms, change the `license` line at the top. The "
              "construction is that of:", "", "```bibtex", "@article{alcalde2025exact,",
              "  title   = {Exact Sequence Interpolation with Transformers},",
              "  author  = {Alcalde, Albert and Fantuzzi, Giovanni and Zuazua, Enrique},",
              "  journal = {arXiv preprint arXiv:2502.02270},", "  year    = {2025}", "}",
              "```", ""]
    return "\n".join(lines)


def _proved(report) -> bool:
    """Whether the card may say that the model reproduces its dataset: only with a report that
    verify passed (a model edited after it was built, verified FAILED, was still said to)."""
    return report is not None and bool(report.ok)


def _unproved(report) -> list[str]:
    """The card's warning, under its first paragraph, when verify did not pass the model."""
    if _proved(report):
        return []
    why = "was not run" if report is None else f"says **{report.verdict()}**"
    return [f"**Not proved to reproduce its dataset:** `verify` {why} (see What was proved "
            "below).", ""]


def _markdown(rows: list[tuple[str, str]]) -> list[str]:
    """(label, value) rows as a Markdown table ('|' in a value escaped)."""
    return ["| field | value |", "|---|---|",
            *(f"| {k} | {str(v).replace('|', chr(92) + '|')} |" for k, v in rows)]


def _data_lines(model: Transformer, data) -> list[str]:
    meta = model.meta
    how = ["The sha256 names the data exactly, values and kind. It is the SHA-256 of a JSON "
           "header (`causal`, `d`, `lengths` [n_j, m_j] per sequence, `number`: float64 or "
           "rational; sorted keys, no spaces) followed by the values, inputs then targets: "
           "float64 data as their little-endian float64 bytes, exact data as the JSON list of "
           "their \"p/q\" strings; causal data then add their mask of constrained positions, "
           "a byte each. `exactformer.data.load_dataset(path).sha256()` computes it, and "
           "`exactformer verify` compares it with the one the model records and says when it "
           "is given a subset or other data.", ""]
    if data is None:
        known = ", ".join(f"{k} = {meta[k]}" for k in ("N", "sum_m", "constrained")
                          if k in meta)
        return ["## Data", "", f"Not written with the model{f' ({known})' if known else ''}; "
                "the model's row *data sha256* above names them.", "", *how]
    lengths = [len(x) for x in data.inputs]
    if data.d > model.d:
        raise ValueError(wider_than_model(data.d, model.d))
    d = data.padded_from or data.d
    dim = str(d) if d == model.d else f"{d} (data in R^{d}, zero-padded to d_model = {model.d})"
    rows = [("sequences N", data.N), ("token dimension d", dim),
            ("input lengths", f"{min(lengths)} to {max(lengths)}"),
            ("constrained positions", data.constrained) if isinstance(data, CausalDataset)
            else ("target tokens Σm", data.total_m),
            ("numbers", "exact rationals" if data.exact else "float64"),
            ("sha256 of the data's JSON form", f"`{data.sha256()}`")]
    return ["## Data", "", *_markdown(rows), "", *how]


def _verdict_lines(model: Transformer, report) -> list[str]:
    rerun = ["To re-run it, with the data file (the one whose sha256 is above) in this "
             "folder as `data.json`:", "", "```",
             "exactformer verify model.json data.json" if model.exact else
             "python -c \"import exactformer as ef; from exactformer.export import "
             "NativeTransformer as T; print(ef.verify(T.from_pretrained('.').model, "
             "ef.data.load_dataset('data.json')).table())\"", "```", ""]
    meaning = ["PROVED EXACT: every output equals its target, shown in exact rational "
               "arithmetic or by a rigorous bound of 0; OK: every output is within the "
               "tolerance of its target by a rigorous bound (float64 parameters, or softmax); "
               "UNDECIDED: no failure shown, but no bound tight enough; FAILED: some output "
               "shown to be off.", ""]
    if report is None:
        return ["## What was proved", "", "Nothing yet: `verify` was not run when the folder "
                f"was written. For this model it decides by {decides(model)}.", "",
                *meaning, *rerun]
    return ["## What was proved", "",
            f"**{report.verdict()}** (`verify`, {report.arithmetic} arithmetic).", "",
            *meaning, "```", report.table(), "```", "", *rerun]


def _float32_lines(model: Transformer, data) -> list[str]:
    """The float32 verdict on the data (a float32 run of the module), when they are known."""
    from .float32 import float32_verdict  # here: float32 imports modules, which imports hub
    head = ["## In float32", ""]
    if data is None:
        return [*head, "Not measured (no data written with the model).", ""]
    verdict = float32_verdict(model, data)
    word = "still interpolates" if verdict.interpolates else "does NOT interpolate"
    return [*head, f"Run in float32 (torch, native layout), the model {word} its data within "
            f"{verdict.tolerance:g} × the data's scale: largest error {verdict.error:.3g} × "
            "scale. This is a measurement of one float32 run, not a proof.", "",
            "```", verdict.table(), "```", ""]


def _saved_run(module, data) -> dict:
    """What the stored module (``from_pretrained(".")``: its dtype and FF form) gives on
    ``data``: its largest error over the data's scale (nan for a nan output) and whether that
    is within the tolerance of its dtype (RUN_TOLERANCE: bfloat16 and float16 as float32);
    without data only the dtype and form. The card's float32 verdict runs the model's profile
    form in float32, which a folder stored in bfloat16, or with ``ff="dense"``, does not run:
    a folder that misses its data as stored must say so rather than show only that verdict."""
    from .float32 import max_error  # here: float32 imports modules, which imports hub
    dtype = str(next(module.parameters()).dtype).removeprefix("torch.")
    out = {"dtype": dtype, "ff": module.ff}
    if data is not None:
        out["tolerance"] = RUN_TOLERANCE["float64" if dtype == "float64" else "float32"]
        out["error"] = max_error(module, data)
        out["ok"] = bool(out["error"] <= out["tolerance"])
    return out


def _saved_lines(saved) -> list[str]:
    """The card's section on the stored module run on the data (:func:`_saved_run`)."""
    if saved is None or "error" not in saved:
        return []
    word = "reproduces" if saved["ok"] else "does NOT reproduce"
    return ["## As saved", "",
            f"The module this folder stores (`from_pretrained(\".\")`: {saved['dtype']}, FFs in "
            f"{saved['ff']} form), run on the data, {word} them within {saved['tolerance']:g} × "
            f"the data's scale: largest error {saved['error']:.3g} × scale. This is a "
            "measurement of one run, not a proof."
            + ("" if saved["ok"] else " `from_pretrained(\".\", dtype=torch.float64)` runs "
               "the stored model in float64 instead."), ""]


PROVED_RUNTIMES = ("float32", "bfloat16")  # the runtimes a folder written with data is proved in


def runtime_proofs(model: Transformer, data) -> list:
    """The verdicts of ``prove_runtime`` on ``data`` for :data:`PROVED_RUNTIMES` (none
    without data): what the folder's config (``runtime_proofs``) and card record."""
    if data is None:
        return []
    from ..verification import prove_runtime
    return [prove_runtime(model, data, runtime) for runtime in PROVED_RUNTIMES]


def _runtime_lines(proofs) -> list[str]:
    """The card's section on the runtime proofs (docs/numerics.md#proofs-for-reduced-
    precision-runtimes), with the reason where a runtime is not proved."""
    if not proofs:
        return []
    rows = [(v.runtime, f"{v.verdict}: {v.reason()}" if v.reason() else v.verdict)
            for v in proofs]
    return ["## Proved runtimes", "",
            "Whether every evaluation of the model's dense computation (FFs as "
            "η·x + W·relu(U·x + b), as `ff=\"dense\"`, the ρ/η and the TransformerLens "
            "layouts run it) in that runtime (subnormal numbers kept, not flushed to zero), "
            "in any summation order, with or without FMA, on each sequence alone or in a "
            "batch of sequences of one length (TransformerLens's padded rows are not "
            f"covered), {_criterion(proofs[0])}: a proof "
            "by rigorous interval bounds, not a measurement. A module loaded with "
            "`ff=\"dense\"` runs exactly this computation; the default profile form evaluates "
            "gadget layers otherwise.", "",
            *_markdown(rows), ""]


def _criterion(v) -> str:
    """What the runtime proofs prove of the data: decoding (text data with a vocabulary,
    docs/numerics.md#decoding-to-a-vocabulary) or distance within the tolerance."""
    if v.criterion == "decoding":
        return ("decodes every constrained position to its target (its nearest vocabulary "
                "vector, as `exactformer run --vocabulary` decodes)")
    return f"reproduces the data within {v.tolerance:g} × the data's scale"


def _usage_lines(model: Transformer, data, saved: dict | None = None) -> list[str]:
    """A snippet that runs as written in this folder (``.``): the module on one sequence
    of its data, embedded when short enough, else on a sequence the reader supplies. Its
    comment says what the outputs are only where the stored module (``saved``,
    :func:`_saved_run`) was measured to reproduce the data, or is float64."""
    x = None
    if data is not None:
        first = np.asarray(data.floats()[0][0])
        x = first[:8] if model.causal else first if len(first) <= 16 else None
    line = ("x = np.array(" + json.dumps(x.tolist()) + ")  # input sequence 0 of the data"
            + (" (its first tokens)" if model.causal else "")) if x is not None else \
        f"x = np.array(...)  # one input sequence of the data: n × {model.d} (or narrower)"
    out = ("the outputs at each position: the model's next-token predictions" if model.causal
           else "the outputs: their distinct rows are the target set")
    if saved is not None and not saved.get("ok", saved["dtype"] == "float64"):
        out = (f"the outputs; in {saved['dtype']} they miss the targets (see As saved)"
               if "ok" in saved else f"the outputs in {saved['dtype']}, not measured on the "
               "data: they may miss the targets")
    return ["## Running it", "", "In this folder (`pip install 'exactformer[torch]'`):", "",
            "```python", "import numpy as np",
            "from exactformer.export import NativeTransformer, apply", "",
            "module = NativeTransformer.from_pretrained(\".\")", line,
            f"print(apply(module, [x])[0])  # {out}", "```", "",
            "`module(x, mask)` takes a (B, n, d) float tensor and a (B, n) mask, True at real "
            "tokens.", ""]
