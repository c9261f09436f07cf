"""``exactformer zoo``: a documented set of compiled models, each a Hub folder with its proof,
its float32 verdict, its TransformerLens export and its circuit (docs/circuit.md#the-zoo).

Every model is built from a built-in family or a recited text, verified, exported twice
(the Hub folder of :mod:`.hub` and, in ``transformer_lens/``, the folder of
:mod:`.lens_files`) and described in ``index.json``; ``check.py`` (:mod:`.lens_check`) loads
any of them with TransformerLens and torch alone and checks targets and ablations.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..api import compile as build
from ..circuit.document import lens_shape
from ..data import CausalDataset, Dataset, builtin
from ..modelio import atomic_path
from ..verification import verify
from ..verification.runtime_verdict import DEFAULT_TOLERANCE
from . import lens_check
from .float32 import float32_verdict
from .layouts import to_torch
from .lens_files import LENS_TOLERANCE, lens_verdict, save_lens
from .transformer_lens import to_lens

FORMAT = "exactformer.zoo/1"
RECITED = "It is a truth universally acknowledged."
DISAGREE = ["cat sat.", "dog sit."]  # the same token at one position, two next ones


@dataclass(frozen=True)
class Entry:
    """One zoo model: its name, what it shows, its data and how it is built."""

    name: str
    about: str
    data: object  # a callable giving the Dataset or CausalDataset
    family: str
    options: dict = field(default_factory=dict)
    small: bool = True


ENTRIES = [
    Entry("demo-keyed", "set data with heavy sharing, the default keyed hardmax model",
          builtin.demo, "builtin.demo()"),
    Entry("demo-paper", "the same data, the paper's hat construction (exact in rationals only)",
          builtin.demo, "builtin.demo()", {"construction": "paper"}, small=False),
    Entry("pool-softmax", "keyed softmax model, exact in real arithmetic",
          lambda: builtin.shared_pool(6, 2, 5, 3, 2, seed=1),
          "builtin.shared_pool(6, 2, 5, 3, 2, seed=1)", {"attention": "softmax"}),
    Entry("nested-wide-heads", "a wide model (width 16) whose separation uses 4 heads",
          lambda: builtin.nested(6, 3, seed=2), "builtin.nested(6, 3, seed=2)",
          {"width": 16, "heads": 4}),
    Entry("recite", "causal: a recited sentence (position keys, no attention)",
          lambda: CausalDataset.from_text(RECITED, d=4), f"CausalDataset.from_text({RECITED!r}, "
          "d=4)"),
    Entry("two-texts", "causal: two texts whose 5th tokens agree, their next ones not (keyed)",
          lambda: CausalDataset.from_text(DISAGREE, d=4),
          f"CausalDataset.from_text({DISAGREE!r}, d=4)"),
    Entry("vocabulary", "set data over a vocabulary, the keyed hardmax model",
          lambda: builtin.vocabulary(20, 12, 6, 2, 4, seed=3),
          "builtin.vocabulary(20, 12, 6, 2, 4, seed=3)", small=False),
    Entry("uniform-softmax", "uniform random set data, keyed softmax",
          lambda: builtin.uniform(8, 4, 2, 3, seed=4), "builtin.uniform(8, 4, 2, 3, seed=4)",
          {"attention": "softmax"}, small=False),
    Entry("nested-paper-softmax", "the paper's softmax construction",
          lambda: builtin.nested(5, 2, seed=5), "builtin.nested(5, 2, seed=5)",
          {"attention": "softmax", "construction": "paper"}, small=False),
]


def entries(small: bool) -> list[Entry]:
    return [e for e in ENTRIES if e.small or not small]


def build_zoo(folder: str | Path, small: bool = False, progress=None) -> dict:
    """Write every model's folder, ``check.py`` and ``index.json`` (last, so a zoo with an
    index is a finished one); the index returned."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    models = []
    for e in entries(small):
        if progress is not None:
            progress(e.name)
        models.append(write_model(e, folder / e.name))
    with atomic_path(folder / "check.py") as tmp:
        tmp.write_text(Path(lens_check.__file__).read_text())
    index = {"format": FORMAT, "small": small, "check": "python check.py .",
             "models": models}
    with atomic_path(folder / "README.md") as tmp:
        tmp.write_text(zoo_readme(index))
    with atomic_path(folder / "index.json") as tmp:
        tmp.write_text(json.dumps(index, indent=1))
    return index


def zoo_readme(index: dict) -> str:
    """The zoo's README: what each model shows, its shape and verdicts, and how to check it."""
    rows = [f"| `{m['name']}` | {m['about']} | `{m['data']}` | {m['kind']}, {m['attention']}, "
            f"{m['construction']}, width {m['width']}, {m['heads']} head(s) | {m['blocks']} "
            f"({m['transformer_lens']['n_layers']} TL blocks) | {m['verify']} | "
            f"{', '.join(k for k, v in m['float32'].items() if v) or 'none'} | "
            f"{m.get('runtime_proofs', {}).get('float32', 'not run')} |"
            for m in index["models"]]
    return "\n".join([
        "# exactformer zoo", "",
        "Compiled transformers whose mechanism is known: each folder is a Hub folder",
        "(config.json, model.safetensors, the card README.md) with circuit.json (per pair the",
        "TransformerLens units and heads it uses), data.json, proof.json (the verify report),",
        "float32.json and transformer_lens/ (the TransformerLens folder). `python check.py .`",
        "loads every model with TransformerLens and torch alone and checks its targets and",
        "the ablations circuit.json predicts. The schema: exactformer's docs/circuit.md.", "",
        "The float32 columns say different things: one float32 run of each export within "
        f"{LENS_TOLERANCE['float32']:g} × the data's scale (float32.json), and the proof, for",
        "every float32 evaluation of the dense computation, within "
        f"{DEFAULT_TOLERANCE:g} × the scale (config.json's",
        "runtime_proofs): a model can pass the run and fail the proof (the paper's hats).", "",
        "| model | shows | data | kind | blocks | verify | float32 run within "
        f"{LENS_TOLERANCE['float32']:g} × scale (measured) | float32 proof |",
        "|---|---|---|---|---|---|---|---|", *rows, ""])


def write_model(e: Entry, folder: Path) -> dict:
    """One model's folder: the Hub files with circuit.json (always, however long its trace),
    data.json, proof.json, float32.json and transformer_lens/; its index entry returned."""
    data = e.data()
    model = build(data, **e.options)
    report = verify(model, data)
    to_torch(model).save_pretrained(folder, data=data, report=report)
    proofs = json.loads((folder / "config.json").read_text()).get("runtime_proofs", {})
    save_lens(model, folder / "transformer_lens", data=data, circuit=True)
    verdicts = {"transformer_lens": lens_verdict(to_lens(model, "float32"), data,
                                                 attention=model.attention).to_dict()}
    if isinstance(data, Dataset):
        verdicts["native"] = float32_verdict(model, data).to_dict()
    texts = {"circuit.json": (folder / "transformer_lens" / "circuit.json").read_text(),
             "data.json": json.dumps(data.to_json_dict()),
             "proof.json": json.dumps(report.to_dict(), indent=1, default=str),
             "float32.json": json.dumps(verdicts, indent=1, default=str)}
    for name, text in texts.items():
        with atomic_path(folder / name) as tmp:
            tmp.write_text(text)
    return {"name": e.name, "about": e.about, "data": e.family,
            "kind": "causal" if isinstance(data, CausalDataset) else "set",
            "attention": model.attention,
            "construction": e.options.get("construction", "keyed"),
            "width": e.options.get("width", 4), "heads": e.options.get("heads", 1),
            "blocks": model.n_blocks, "transformer_lens": lens_shape(model),
            "verify": report.verdict(),
            "float32": {k: bool(v["interpolates"]) for k, v in verdicts.items()},
            "runtime_proofs": proofs,  # the Hub folder's proofs (a run passing is not one)
            "dtype": str(torch.float64).removeprefix("torch.")}
