"""The interpretability commands: ``explain`` (one pair's path, phase by phase), ``zoo`` (a
documented set of models with their circuits) and ``plot --explain`` (docs/circuit.md).
"""

from __future__ import annotations

import json
import sys

from .cli_parser import (
    UsageError,
    add_progress,
    data_for,
    int_at_least,
    position,
    progress_on,
    torch_module,
)
from .modelio import load_model, write_text_atomic
from .tables import format_table


def add_explain(sub) -> None:
    """The ``explain`` and ``zoo`` commands' options."""
    x = sub.add_parser("explain", help="one pair's path through a model, phase by phase, "
                                       "with TransformerLens hook names")
    x.add_argument("model")
    x.add_argument("data", help="the dataset the model was built for")
    which = x.add_mutually_exclusive_group(required=True)
    which.add_argument("--pair", type=int_at_least(0), help="set data: the pair j")
    which.add_argument("--position", type=position, help="causal data: sequence j, "
                       "position t, as j,t")
    x.add_argument("--json", help="also write the explanation as JSON here")
    x.set_defaults(run=explain_command)
    z = sub.add_parser("zoo", help="build a documented set of models with their circuits, "
                                   "for TransformerLens")
    z.add_argument("-o", "--output", required=True, help="folder to write")
    z.add_argument("--small", action="store_true", help="only the small models (seconds)")
    add_progress(z)
    z.set_defaults(run=zoo_command)


def explain_command(args) -> int:
    """``explain``: one pair's (or causal position's) path, phase by phase, with TL hook names
    (docs/circuit.md#explain); ``--json`` also writes it."""
    from .circuit.explain import explain, render
    model = load_model(args.model)
    data = data_for(model, args.data)
    doc = explain(model, data, pair=args.pair, position=args.position)
    print(render(doc))
    if args.json:
        write_text_atomic(args.json, json.dumps(doc, indent=1))
    return 0


def zoo_command(args) -> int:
    """``zoo``: build the documented models, each a Hub folder with its circuit
    (docs/circuit.md#the-zoo)."""
    zoo = torch_module("export.zoo", "zoo")
    index = zoo.build_zoo(args.output, small=args.small,
                          progress=lambda name: print(f"building {name}", file=sys.stderr)
                          if progress_on(args) else None)
    print(format_table([(m["name"], f"{m['kind']} {m['attention']} {m['construction']}, "
                         f"{m['blocks']} blocks: {m['verify']}") for m in index["models"]]))
    print(f"{len(index['models'])} models -> {args.output}/ (check: python "
          f"{args.output}/check.py {args.output})")
    return 0


def plot_explain(model, data, args) -> int:
    """``plot --explain j`` (causal: j,t): one pair's circuit over the TL blocks."""
    from .tools.circuit_plot import plot_circuit
    if args.gif:
        raise UsageError("--gif steps through the phases; --explain draws one figure")
    j, t = args.explain
    if model.causal != (t is not None):
        raise UsageError("--explain takes j for set data and j,t for causal data")
    plot_circuit(model, data, args.output, pair=j if t is None else None,
                 position=None if t is None else (j, t))
    print(f"circuit of {'pair ' + str(j) if t is None else f'position {j},{t}'} over "
          f"{model.n_blocks} blocks -> {args.output}")
    return 0
