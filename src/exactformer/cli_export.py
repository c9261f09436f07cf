"""The ``export`` command: a model as safetensors for PyTorch or as a TransformerLens folder,
with its verdicts: the numbers' range in the dtype written, the proof of the reduced-precision
copy on ``--data`` and, for TransformerLens, the rebuilt bridge run on the data
(docs/export.md).
"""

from __future__ import annotations

import argparse
import sys

from .circuit.document import wanted
from .cli_parser import UsageError, add_progress, data_for, progress_on, torch_module
from .modelio import load_model
from .runtime import claimed_runtimes, range_faults, range_message
from .verification import prove_runtime


def add_export(sub) -> None:
    """The ``export`` command's options."""
    e = sub.add_parser("export", help="write a model as safetensors for PyTorch, or as a "
                                      "TransformerLens folder")
    e.add_argument("model")
    e.add_argument("-o", "--output", required=True, help="safetensors file to write "
                   "(transformer-lens: the folder for config.json, model.safetensors and "
                   "lens_helpers.py)")
    e.add_argument("--layout", choices=["native", "rho-eta", "transformer-lens"],
                   default="native")
    e.add_argument("--dtype", choices=["float64", "float32", "bfloat16"], default="float64",
                   help="bfloat16: native and rho-eta layouts")
    e.add_argument("--data", help="also prove the copy faithful on this dataset in --dtype "
                   "(and, transformer-lens, run the rebuilt bridge on it); exit 1 if not")
    e.add_argument("--vocabulary", help="with --data, causal text: the vocabulary the proof "
                   "decodes to (JSON list of vectors or object symbol -> vector)")
    e.add_argument("--circuit", action=argparse.BooleanOptionalAction, default=None,
                   help="transformer-lens with --data: write circuit.json (default: when its "
                   "exact trace is short, docs/circuit.md)")
    add_progress(e)
    e.set_defaults(run=export_command)


def export_command(args) -> int:
    if args.vocabulary and not args.data:
        raise UsageError("--vocabulary is for --data (decoding proofs)")
    ef_torch = torch_module("export", "export")
    model = load_model(args.model)
    if args.layout == "transformer-lens":
        return _export_lens(ef_torch, model, args)
    if args.data and args.dtype == "float64":
        raise UsageError("--data (a verdict through the exported model) is for "
                         "--layout transformer-lens or --dtype float32|bfloat16")
    data = data_for(model, args.data, args.vocabulary) if args.data else None
    module = ef_torch.export(model, args.output, layout=args.layout, dtype=args.dtype)
    print(f"exported {model.n_blocks} blocks as {len(module.blocks)} {args.layout} blocks "
          f"({args.dtype}) -> {args.output} + {ef_torch.config_path(args.output)}")
    return max(_range_verdict(model, args.dtype), _runtime_proof_line(model, data, args.dtype))


def _export_lens(ef_torch, model, args) -> int:
    """``export --layout transformer-lens``: the folder, then with ``--data`` the verdict of
    the bridge rebuilt from it (exit 1 if it fails); data of the wrong kind write nothing."""
    if args.dtype == "bfloat16":
        raise UsageError("--layout transformer-lens is written in float64 or float32")
    data = data_for(model, args.data, args.vocabulary) if args.data else None
    if data is not None:
        data.padded(model.d)  # data wider than the model: refused before anything is written
    written = wanted(model, data, args.circuit)
    proof = None if data is None else prove_runtime(model, data, "float32")
    config = ef_torch.save_lens(model, args.output, args.dtype, data=data, circuit=written,
                                proofs=None if proof is None else [proof])
    print(f"exported {model.n_blocks} blocks as {config['n_layers']} TransformerLens blocks "
          f"(d_model {config['d_model']}, d_mlp {config['d_mlp']}, {config['n_heads']} "
          f"head{'s' if config['n_heads'] != 1 else ''}, {args.dtype}) -> {args.output}/"
          f"config.json + model.safetensors + lens_helpers.py"
          + (" + circuit.json" if written else "")
          + (" + runtime_proofs.json" if data is not None else ""))
    if data is not None and not written and args.circuit is None:
        print("note: circuit.json not written: its exact trace of these data is long "
              "(pass --circuit to write it anyway, docs/circuit.md)")
    if not args.data:
        return max(_range_verdict(model, args.dtype), _runtime_proof_line(model, None, args.dtype))
    if progress_on(args):  # booting a deep bridge takes a while before the bar can start
        print("transformer-lens: building the bridge from the folder", file=sys.stderr)
    try:
        bridge = ef_torch.load_lens(args.output)
    except ImportError as e:
        raise UsageError(f"--data needs transformer-lens (pip install 'exactformer[lens]'): "
                         f"{e}") from None
    verdict = ef_torch.lens_verdict(bridge, data, progress=progress_on(args),
                                    attention=model.attention)
    print(ef_torch.verdict_table([verdict]))
    return max(0 if verdict.interpolates else 1, _range_verdict(model, args.dtype, data),
               _runtime_proof_line(model, data, args.dtype, proof))


def _runtime_proof_line(model, data, dtype: str, v=None) -> int:
    """export --data in a reduced precision: the proof that every evaluation of the dense
    computation in ``dtype`` reproduces the data (one line; exit status 1 when not proved,
    with the reason; without data, a model that claims ``dtype`` is told how to prove it).
    ``v``: the verdict, when already made."""
    if dtype == "float64":
        return 0
    if data is None:
        if dtype in claimed_runtimes(model):
            print(f"note: the {dtype} copy is not proved faithful: without data there is "
                  f"nothing to prove it on (--data DATA proves it for any summation order, "
                  f"docs/numerics.md#proofs-for-reduced-precision-runtimes)")
        return 0
    v = v or prove_runtime(model, data, dtype)
    why = f": {v.reason()}" if v.reason() else ""
    judged = " decoding every position" if v.criterion == "decoding" else ""
    on = f"{v.checked} {'positions' if v.criterion == 'decoding' else 'pairs'} of --data"
    print(f"{dtype} copy: {v.verdict}{why} (the dense computation{judged} on the {on}, any "
          "summation order, docs/numerics.md#proofs-for-reduced-precision-runtimes)")
    return 0 if v.ok else 1


def _range_verdict(model, dtype: str, data=None) -> int:
    """Exit status 1, with a FAILS line naming them, when numbers the ``dtype`` copy stores
    (or data coordinates) are outside its range (exactformer.runtime). A reduced-precision
    copy of a model that claims no faithful pass in it (the paper's construction) gets a line
    saying so and how to build one that does."""
    claims = claimed_runtimes(model)
    if dtype != "float64" and dtype not in claims and claims:
        print(f"note: this model claims no faithful {dtype} pass (it claims "
              f"{', '.join(claims)}), so the {dtype} copy may not reproduce the data")
    elif dtype != "float64" and dtype not in claims:
        print(f"note: this model claims no faithful {dtype} pass (the paper's hat construction "
              f"cancels large terms that {dtype} rounds), so the {dtype} copy may not reproduce "
              f"the data; the default keyed construction (exactformer build DATA -o MODEL, "
              f"docs/keyed.md) builds one that does")
    faults = range_faults(model, dtype, data)
    if not faults:
        return 0
    print(f"{dtype} copy FAILS: {range_message(dtype, faults)}")
    return 1
