"""Command line: build a model from data, verify it, run it, and the commands around them.

The commands: build, verify, run, explain, info, generate, text, demo, export, train, plot,
zoo.

Errors go to stderr as one line with exit status 2, and no command leaves a partial output
file. ``verify`` exits 0 only if every pair interpolates (exactly, for exact hardmax models),
else 1. Long commands take ``--progress/--no-progress`` (default: bars only when stderr is a
terminal).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import warnings
from contextlib import nullcontext
from fractions import Fraction

import numpy as np

from .api import compile
from .cli_circuit import add_explain, plot_explain
from .cli_export import add_export
from .cli_parser import (
    SuggestingParser,
    UsageError,
    add_progress,
    data_for,
    exact_tau,
    int_at_least,
    nonnegative_float,
    pair_or_position,
    positive_float,
    positive_int,
    progress_on,
    torch_module,
)
from .construct.generic import ConstructionError
from .data import CausalDataset, Dataset, DatasetError, builtin, load_dataset
from .data.text import read_vocabulary
from .modelio import ModelFormatError, atomic_path, load_model, save_model, write_text_atomic
from .numbers import as_number_array, fmt, parse_exact
from .summary import model_summary
from .tables import format_table
from .verification import prove_runtime, verify
from .verification.formats import FORMATS

# ------------------------------------------------------------------------------ commands

def _compiled(args, data):
    """The model that ``build`` and ``plot`` construct from their shared options."""
    return compile(data, attention=args.attention, exact=not args.float, seed=args.seed,
                   tau=args.tau, progress=progress_on(args), width=args.width, heads=args.heads,
                   n_layers=args.layers, construction=_construction(args))


def _construction(args) -> str | None:
    """--construction, or --keys (its older spelling of "keyed"); None: the default."""
    if args.keys and args.construction == "paper":
        raise UsageError("--keys asks for the keyed construction, --construction paper for "
                         "the paper's: give one")
    return "keyed" if args.keys else args.construction


def _build(args) -> int:
    data = load_dataset(args.data, causal=args.causal)
    t0 = time.perf_counter()
    model = _compiled(args, data)
    save_model(model, args.output)
    kind = f"{'causal ' if model.causal else ''}{model.attention}"
    heads = model.max_heads()  # 0: position keys alone tell the positions apart, no attention
    print(f"built {kind} model: {model.n_blocks} blocks, width {model.max_width()}, "
          f"{f'{heads} head' + ('s' if heads != 1 else '') if heads else 'no attention layer'}"
          f", {model.n_params()} parameters, {time.perf_counter() - t0:.2f} s -> {args.output}")
    return 0


def _verify(args) -> int:
    model = load_model(args.model)
    if args.vocabulary and not args.runtime:
        raise UsageError("--vocabulary is for --runtime (decoding proofs)")
    data = data_for(model, args.data, args.vocabulary)
    if args.runtime:
        return _verify_runtimes(args, model, data)
    report = verify(model, data, tolerance=args.tolerance or 1e-9, progress=progress_on(args))
    print(report.table())
    if args.json:
        write_text_atomic(args.json, json.dumps(report.to_dict(), indent=1, default=str))
    return 0 if report.ok else 1


def _verify_runtimes(args, model, data) -> int:
    """verify --runtime: the proof for each runtime named (docs/numerics.md#proofs-for-
    reduced-precision-runtimes), one table each; exit 0 only if every one is proved."""
    kw = {"exp_ulps": args.exp_ulps} | ({"tolerance": args.tolerance} if args.tolerance else {})
    verdicts = [prove_runtime(model, data, runtime, **kw) for runtime in args.runtime]
    print("\n\n".join(v.table() for v in verdicts))
    if args.json:
        write_text_atomic(args.json, json.dumps(
            {"runtimes": [v.to_dict() for v in verdicts]}, indent=1, default=str))
    return 0 if all(v.ok for v in verdicts) else 1


def _info(args) -> int:
    print(format_table(model_summary(load_model(args.model))))
    return 0


def _generate(args) -> int:
    from .tools.decode import generate as run_generation
    from .tools.decode import nearest
    model = load_model(args.model)
    symbols, vocab = read_vocabulary(args.vocabulary) if args.vocabulary else (None, None)
    prompt = _read_prompt(args.prompt, symbols, vocab)
    steps = args.steps
    if steps is None:  # prompt and generated tokens fill the stored positions
        steps = 1 if model.positions is None else max(1, len(model.positions) - len(prompt))
    tokens = run_generation(model, prompt, steps, vocabulary=vocab)
    if symbols is not None:
        out = [symbols[nearest(vocab, t)] for t in tokens]
        print("".join(out) if all(len(s) == 1 for s in symbols) else json.dumps(out))
    else:
        print(json.dumps([[fmt(v) for v in t] for t in tokens]))
    return 0


def _vectors(rows: list, where: list[str]):
    """Rows of numbers (exact, or floats from a vocabulary) of one length as an exact array; a
    UsageError names the first row (``where``) that is not a list of numbers or is ragged."""
    for row, at in zip(rows, where, strict=True):
        if not row or not all(isinstance(v, (Fraction, float)) for v in row):
            shown = json.dumps(row, default=str)
            raise UsageError(f"{at} must be a non-empty list of numbers, got {shown}"[:200])
        if len(row) != len(rows[0]):
            raise UsageError(f"{at} has {len(row)} coordinates, the first has {len(rows[0])}")
    return as_number_array(np.array(rows, dtype=object), True)


def _read_prompt(text: str, symbols, vocab):
    """A JSON list of vectors or of symbols, or plain text (one symbol per character)."""
    try:
        items = json.loads(text, parse_float=parse_exact, parse_int=parse_exact)
    except (RecursionError, ValueError):  # not JSON: plain text
        items = None
    if not isinstance(items, list):
        items = list(text)
    rows = []
    for k, item in enumerate(items):
        if isinstance(item, list):
            rows.append(item)
        elif isinstance(item, str) and symbols is not None and item in symbols:
            rows.append(list(vocab[symbols.index(item)]))
        else:
            raise UsageError(f"prompt item {k} ({item!r}) is neither a vector nor a symbol of "
                             "the vocabulary"[:200])
    if not rows:
        raise UsageError("the prompt is empty")
    return _vectors(rows, [f"--prompt: item {k}" for k in range(len(rows))])


def _run(args) -> int:
    """``run``: the model's outputs for every sequence of the data (docs/running.md),
    printed and with ``--json`` written as a file; causal outputs with a vocabulary
    are also shown as its nearest symbols."""
    from .evaluate import run as run_model
    from .tools.decode import nearest
    model = load_model(args.model)
    data = data_for(model, args.data)
    symbols, vocab = read_vocabulary(args.vocabulary) if args.vocabulary else (None, None)
    outs = run_model(model, data, args.arithmetic, progress=progress_on(args))
    kind = "sequence" if model.causal else "pair"
    doc = {"model": str(args.model), "data": str(args.data), "causal": model.causal,
           "number": _number_kind(outs), "outputs": [_json_rows(o) for o in outs]}
    if vocab is not None:
        doc["nearest"] = [[symbols[k] if symbols else k for k in
                           (nearest(vocab, row) for row in o)] for o in outs]
    if args.json:  # before printing, so that a reader who stops early still gets the file
        write_text_atomic(args.json, json.dumps(doc, indent=1))
    for j in range(len(outs)):
        shown = json.dumps(doc["outputs"][j])
        if "nearest" in doc:
            near = doc["nearest"][j]
            text = "".join(near) if all(isinstance(c, str) and len(c) == 1 for c in near) \
                else None
            shown = json.dumps(text) if text is not None else json.dumps(near)
        print(f"{kind} {j}: {shown}")
    return 0


def _number_kind(outs: list[np.ndarray]) -> str:
    """How ``run --json`` writes the outputs: "float64", "rational" or (``--arithmetic mp``)
    "mpmath"."""
    if all(o.dtype != object for o in outs):
        return "float64"
    return "rational" if all(isinstance(v, Fraction) for o in outs for v in o.flat) else \
        "mpmath"


def _json_rows(a: np.ndarray) -> list:
    """Outputs for JSON under docs/problem.md#numbers: exact values as "p/q" strings, floats
    as bare numbers (inf and nan, which JSON lacks, as the strings "inf" and "nan"), mpmath
    values as their decimal strings."""
    if a.dtype == object:
        return [[fmt(v) if isinstance(v, Fraction) else str(v) for v in row] for row in a]
    return [[v if math.isfinite(v) else repr(v) for v in row] for row in a.tolist()]


def _text(args) -> int:
    """``text``: a text file as causal next-character data and the vocabulary file it needs
    (docs/causal.md#text); both files appear or neither."""
    from .data.text import read_text, text_embedding, vocabulary_json
    text = read_text(args.text, args.chars)
    embedding = text_embedding(text, args.dim, args.seed)
    data = CausalDataset.from_text(text, embedding)
    with atomic_path(args.output) as out, atomic_path(args.vocabulary) as voc:
        out.write_text(json.dumps(data.to_json_dict(), separators=(",", ":")))
        voc.write_text(vocabulary_json(embedding))
    print(f"{len(text)} characters, {len(embedding)} distinct, vectors in R^{args.dim} -> "
          f"{args.output} (causal data) + {args.vocabulary} (vocabulary)")
    return 0


def _train(args) -> int:
    ef_torch, ef_train = torch_module("export", "train"), torch_module("tools.train", "train")
    data = Dataset.load(args.data)
    if args.start:
        model = load_model(args.start)
        try:  # a model wider than the data trains on them zero-padded
            data = data.padded(model.d)
        except ValueError as e:
            raise UsageError(f"--from {args.start}: {e}") from None
        start = ef_torch.to_rho_eta(model)
        if not any(p.requires_grad for p in start.parameters()):
            raise UsageError(f"--from {args.start}: the model has no parameters to train (its "
                             "blocks export to identity layers)")
    else:
        start = ef_train.random_rho_eta(data.d, args.blocks, args.h, tau=args.tau,
                                        seed=args.seed)
    reference = args.reference or args.start
    if reference:
        reference = ef_torch.to_rho_eta(load_model(reference))
        ef_train.check_same_architecture(start, reference)
    result = ef_train.train(start, data, eps=args.eps, epochs=args.epochs, lr=args.lr,
                            time_budget=args.budget, progress=progress_on(args))
    ef_torch.save_torch(result.module, args.output)
    print(f"trained {len(start.blocks)} ρ/η blocks: {result.steps} steps ({result.stop}), "
          f"{result.seconds:.1f} s; loss {result.final_loss:.4g}, max Hausdorff error "
          f"{result.final_max_error:.3g} -> {args.output}")
    if reference:
        print(ef_train.tikhonov_diagnostic(result, reference, data).table())
    return 0


def _demo(args) -> int:
    data = builtin.demo()
    print(f"demo data: N = {data.N} sequences in R^{data.d}, {data.total_n} input tokens drawn "
          f"from a pool of 7 (heavy sharing), Σm = {data.total_m} target tokens\n")
    t0 = time.perf_counter()
    model = compile(data, attention=args.attention, seed=args.seed)
    t1 = time.perf_counter()
    report = verify(model, data)
    t2 = time.perf_counter()
    print(report.table())
    print(f"\nbuild {t1 - t0:.2f} s, verify {t2 - t1:.2f} s")
    if args.output:
        save_model(model, args.output)
        print(f"model written to {args.output}")
    return 0 if report.ok else 1


def _plot(args) -> int:
    try:
        from .tools import plot
    except ImportError as e:
        raise UsageError(f"plot needs matplotlib (pip install 'exactformer[plot]'): {e}") \
            from None
    data = load_dataset(args.data, causal=args.causal)
    model = _compiled(args, data)
    if args.explain is not None:
        return plot_explain(model, data, args)
    # both files appear or neither: each is written to a temporary path, moved at the end
    with atomic_path(args.output) as png, \
            (atomic_path(args.gif) if args.gif else nullcontext()) as gif:
        fig = plot.plot_phases(model, data, png, animate=gif or False)
    kind = f"{'causal ' if model.causal else ''}{model.attention}"
    print(f"{len(plot.panels(fig))} panels ({kind}, {model.n_blocks} blocks) -> {args.output}"
          + (f", animation -> {args.gif}" if args.gif else ""))
    return 0


def _width_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--width", type=int, default=4, help="widest FF layer, a multiple of 4: "
                   "width/4 hats per layer, fewer blocks (docs/heads.md)")
    p.add_argument("--layers", type=positive_int, default=None, help="at most this many "
                   "blocks: the width (and heads, if --heads is 1) are chosen to fit")
    p.add_argument("--heads", type=int, default=1, help="attention heads a separation round "
                   "may use (at most d - 1); with --keys, separation rounds sharing an "
                   "attention layer, a head each (docs/keyed.md#heads)")


def parser() -> argparse.ArgumentParser:
    p = SuggestingParser(prog="exactformer", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)

    b = sub.add_parser("build", help="construct a model that interpolates a dataset")
    _construction_options(b, "model file to write (.json; .npz for float64 models)")
    b.set_defaults(run=_build)

    v = sub.add_parser("verify", help="check that a model interpolates a dataset")
    v.add_argument("model")
    v.add_argument("data")
    v.add_argument("--tolerance", type=positive_float, default=None,
                   help="relative Hausdorff tolerance for non-exact verdicts (default 1e-9; "
                        "with --runtime 1e-5)")
    v.add_argument("--runtime", action="append", choices=list(FORMATS),
                   help="instead, prove the exported dense computation faithful in this "
                        "runtime in any summation order (repeatable)")
    v.add_argument("--exp-ulps", type=positive_float, default=2.0,
                   help="with --runtime: exp's error bound in float32 ulps (softmax)")
    v.add_argument("--vocabulary", help="with --runtime, causal text: JSON list of vectors or "
                   "object symbol -> vector; prove that every position decodes to its target")
    v.add_argument("--json", help="also write the report as JSON here")
    add_progress(v)
    v.set_defaults(run=_verify)

    g = sub.add_parser("generate", help="feed a causal model's output back as its next input")
    g.add_argument("model")
    g.add_argument("--prompt", required=True,
                   help="text (one vocabulary symbol per character) or a JSON list of vectors "
                        "or symbols")
    g.add_argument("--steps", type=int, default=None,
                   help="tokens to generate (default: until prompt and output fill the "
                        "model's stored positions)")
    g.add_argument("--vocabulary", help="JSON list of vectors, or object symbol -> vector; "
                   "each output is replaced by the nearest one")
    g.set_defaults(run=_generate)

    i = sub.add_parser("info", help="summarise a model file")
    i.add_argument("model")
    i.set_defaults(run=_info)

    add_export(sub)
    _add_train(sub)
    _add_run(sub)
    add_explain(sub)
    _add_text(sub)

    dm = sub.add_parser("demo", help="build and verify a model for built-in data")
    dm.add_argument("--attention", choices=["hardmax", "softmax"], default="hardmax")
    dm.add_argument("--seed", type=int, default=0)
    dm.add_argument("-o", "--output", help="also save the model here")
    dm.set_defaults(run=_demo)

    pl = sub.add_parser("plot", help="figure of the token positions after each phase")
    _construction_options(pl, "figure to write (PNG)")
    pl.add_argument("--gif", help="also write an animation through the blocks here")
    pl.add_argument("--explain", type=pair_or_position, metavar="J[,T]", help="instead, "
                    "the circuit of pair J (causal: position J,T) over the TransformerLens "
                    "blocks (docs/circuit.md#the-figure)")
    pl.set_defaults(run=_plot)
    return p


def _add_train(sub) -> None:
    """The ``train`` command's options (a random start, or a warm start ``--from`` a model)."""
    t = sub.add_parser("train", help="Tikhonov-regularised Adam training of the ρ/η layout, "
                                     "with the global-minimum diagnostic")
    t.add_argument("data", help="dataset (.json or .npz)")
    t.add_argument("-o", "--output", required=True, help="safetensors file to write")
    t.add_argument("--from", dest="start", help="warm start from this model (JSON)")
    t.add_argument("--reference", help="exact interpolant θ* (model JSON) for the diagnostic; "
                   "default: the --from model")
    t.add_argument("--eps", type=nonnegative_float, default=1e-3, help="penalty weight ε")
    t.add_argument("--epochs", type=int_at_least(0), default=2000,
                   help="Adam steps (0: evaluate the start only)")
    t.add_argument("--lr", type=positive_float, default=1e-2)
    t.add_argument("--budget", type=positive_float, default=None,
                   help="stop after this many seconds")
    t.add_argument("--blocks", type=positive_int, default=1,
                   help="random start: number of blocks")
    t.add_argument("--h", type=positive_int, default=1, help="random start: attention rank")
    t.add_argument("--tau", type=positive_float, default=1.0, help="random start: temperature")
    t.add_argument("--seed", type=int, default=0, help="random start: seed")
    add_progress(t)
    t.set_defaults(run=_train)


def _add_run(sub) -> None:
    """The ``run`` command's options."""
    r = sub.add_parser("run", help="print a model's outputs for every sequence of a dataset")
    r.add_argument("model")
    r.add_argument("data", help="dataset (.json or .npz); its targets are not used")
    r.add_argument("--json", help="also write the outputs as JSON here")
    r.add_argument("--vocabulary", help="JSON list of vectors, or object symbol -> vector: "
                   "each output is also shown as the nearest one (text for causal text)")
    r.add_argument("--arithmetic", choices=["exact", "float", "mp"], default=None,
                   help="default: exact for rational hardmax models (floats back for float "
                   "data), else float")
    add_progress(r)
    r.set_defaults(run=_run)


def _add_text(sub) -> None:
    """The ``text`` command's options."""
    t = sub.add_parser("text", help="write a text file as causal next-character data and its "
                                    "vocabulary")
    t.add_argument("text", help="UTF-8 text file")
    t.add_argument("-o", "--output", required=True, help="causal dataset to write (.json)")
    t.add_argument("--vocabulary", required=True,
                   help="vocabulary to write (.json, object character -> vector)")
    t.add_argument("--dim", type=int_at_least(2), default=8, help="token dimension d")
    t.add_argument("--seed", type=int, default=0, help="seed of the character vectors")
    t.add_argument("--chars", type=int_at_least(2), default=None,
                   help="only the first this many characters")
    t.set_defaults(run=_text)


def _construction_options(p: argparse.ArgumentParser, output: str) -> None:
    """The options of every command that constructs a model (build, plot)."""
    p.add_argument("data", help="dataset (.json or .npz)")
    p.add_argument("-o", "--output", required=True, help=output)
    p.add_argument("--attention", choices=["hardmax", "softmax"], default="hardmax")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--float", action="store_true", help="float64 parameters (large data)")
    p.add_argument("--tau", type=exact_tau, default=None,
                   help="softmax temperature, an exact positive number (default 1)")
    p.add_argument("--causal", action="store_true", help="causal data: a target or null per "
                   "position (implied by a dataset marked \"causal\": true)")
    p.add_argument("--construction", choices=["keyed", "paper"], default=None,
                   help="keyed (the default, where it applies): exact, and to rounding in a "
                   "plain float32 pass (docs/keyed.md); paper: the theorem's hat "
                   "construction, exact in rational arithmetic only (docs/hardmax.md)")
    p.add_argument("--keys", action="store_true", help="the older spelling of --construction "
                   "keyed")
    _width_options(p)
    add_progress(p)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    shown = warnings.formatwarning
    warnings.formatwarning = lambda message, category, *_, **__: \
        _warning_line(args.command, message, category)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("default")
            status = args.run(args)
            sys.stdout.flush()  # a closed pipe shows here, not at exit
            return status
    except BrokenPipeError:
        return _reader_gone()
    except (DatasetError, ModelFormatError, ConstructionError, UsageError, ValueError,
            OSError) as e:
        return _fail(args.command, str(e))
    except OverflowError as e:
        return _fail(args.command, f"a number left the float64 range ({e}): the data span too "
                     "many orders of magnitude for the float64 computations beside the exact ones")
    finally:  # a warning is one line naming the command, not a source line of ours
        warnings.formatwarning = shown


def _reader_gone() -> int:
    """The reader of stdout stopped early (``exactformer run … | head``): end quietly, as
    Unix tools do, with the status of a process ended by SIGPIPE (128 + 13); stdout goes to
    the null device so that the interpreter's last flush finds nothing to complain of."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 141


def _warning_line(command: str, message, category) -> str:
    """A warning as one line on stderr naming the command (and the warning's kind where it is
    one of ours), instead of Python's file, line number and source line."""
    kind = "warning" if category is UserWarning else category.__name__
    return f"exactformer {command}: {kind}: {' '.join(str(message).splitlines())}\n"


def _fail(command: str, message: str) -> int:
    """Print the error as one line on stderr; exit status 2."""
    print(f"exactformer {command}: error: {' '.join(message.splitlines())}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
