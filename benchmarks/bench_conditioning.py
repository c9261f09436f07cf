"""Conditioning of constructed models: parameter norms, unit slopes and plain dense errors.

For each dataset, attention kind and width the model is built and measured: L, P, max|θ|,
‖θ‖₂² over the square of the data's coordinate scale, the largest unit slope |u|·|w|
(`exactformer.conditioning`), and the max Hausdorff error over the scale of a plain dense pass
(the native torch module with ``ff="dense"``: every FF as η·x + W·relu(U·x + b), no profile
form) in float64, float32 and bfloat16. Causal rows measure the largest distance at a
constrained position instead. See docs/numerics.md#conditioning. Writes
benchmarks/results/conditioning.md (or the file given by --out).

    python benchmarks/bench_conditioning.py            # every family, keyed and hats
    python benchmarks/bench_conditioning.py --quick    # small sizes (about a minute)
    python benchmarks/bench_conditioning.py --only recite --out /tmp/recite.md  # some rows
    python benchmarks/bench_conditioning.py --keys --out /tmp/keyed.md  # keyed models only
"""

from __future__ import annotations

import argparse
import datetime
import multiprocessing
import platform
import queue
import re
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

import exactformer as ef
from exactformer.conditioning import conditioning
from exactformer.data import builtin
from exactformer.export import apply, max_error, to_torch
from exactformer.modelio import write_text_atomic
from exactformer.tables import markdown_table
from exactformer.tools.decode import nearest

ROOT = Path(__file__).parents[1]
RESULTS = ROOT / "benchmarks" / "results"
COLUMNS = ["data", "attention", "width", "L", "P", "max|θ|", "‖θ‖²/s²", "max |u|·|w|",
           "float64", "float32", "bfloat16", "bfloat16 decodes", "build s"]
DTYPES = (torch.float64, torch.float32, torch.bfloat16)


def tikhonov_data(N: int = 10, n: int = 100, d: int = 16, seed: int = 0) -> ef.Dataset:
    """The Tikhonov experiment's data (benchmarks/tikhonov_experiment.py, same seeds)."""
    from exactformer.tools import train as tr
    rng = np.random.default_rng(seed)
    inputs = list(rng.random((N, n, d)))
    return tr.dataset_from_model(tr.mean_ff_generator(d, seed=seed + 1), inputs)


def example(name: str):
    sys.path.insert(0, str(ROOT / "examples"))
    return __import__(name)


def digits(n_images: int) -> ef.Dataset:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_heads import digits_like
    return digits_like(n_images)


def keywords(N: int) -> ef.Dataset:
    mod = example("text_keywords")
    table, _ = mod.vocabulary_table(200)
    return mod.sentences(table, N)


def recite(chars: int, generic: bool = False) -> ef.CausalDataset:
    """The passage's first ``chars`` characters as next-character data: the example's small
    integer vectors, or (``generic``) those vectors plus Gaussian noise of size 0.3, so that
    no difference target − token is exact in float32."""
    mod = example("recite")
    texts = [mod.PASSAGE[:chars]]
    alphabet, vocab = mod.alphabet_vectors(texts)
    if generic:
        vocab = vocab + 0.3 * np.random.default_rng(0).standard_normal(vocab.shape)
    return mod.next_character_data(texts, alphabet, vocab)


def sentences(n: int, chars: int, generic: bool = False) -> ef.CausalDataset:
    """The passage's first ``n`` sentences, each cut to ``chars`` characters after a marker
    character of its own (as the example's shared openings have), as next-character data:
    the texts share characters at a position with different continuations, so separation is
    needed. ``generic``: the character vectors plus Gaussian noise of size 0.3."""
    mod = example("recite")
    parts = [t.strip() for t in re.split(r"(?<=[.;!?])\s+", mod.PASSAGE) if t.strip()][:n]
    texts = [chr(0x2460 + k) + t[:chars] for k, t in enumerate(parts)]
    alphabet, vocab = mod.alphabet_vectors(texts)
    if generic:
        vocab = vocab + 0.3 * np.random.default_rng(0).standard_normal(vocab.shape)
    return mod.next_character_data(texts, alphabet, vocab)


def datasets(quick: bool) -> list[tuple[str, object, bool]]:
    """(label, data, exact) per family: rational builds where they take seconds."""
    if quick:
        return [("demo", builtin.demo(), True),
                ("shared_pool(30, 4, 12, 6, 3)", builtin.shared_pool(30, 4, 12, 6, 3), True),
                ("nested(12, 3)", builtin.nested(12, 3), True),
                ("vocabulary(60, 40, 8, 3, 8)", builtin.vocabulary(60, 40, 8, 3, 8), True),
                ("recite 200 chars", recite(200), False),
                ("6 sentences × 30 chars (causal, texts disagree)", sentences(6, 30), True)]
    return [("demo", builtin.demo(), True),
            ("shared_pool(100, 4, 20, 8, 3)", builtin.shared_pool(100, 4, 20, 8, 3), True),
            ("nested(30, 3)", builtin.nested(30, 3), True),
            ("vocabulary(60, 40, 8, 3, 8)", builtin.vocabulary(60, 40, 8, 3, 8), True),
            ("Tikhonov (10 × 100 in [0,1]^16)", tikhonov_data(), False),
            ("heavy sharing N = 1000", builtin.vocabulary(1000, 4000, 50, 3, 16, seed=1000),
             False),
            ("digits (500 images)", digits(500), False),
            ("text keywords (200)", keywords(200), False),
            ("recite 2000 chars (causal)", recite(2000), False),
            ("recite 2000 chars, generic float vectors (causal)", recite(2000, True), False),
            ("20 sentences × 60 chars (causal, texts disagree)", sentences(20, 60), False),
            ("20 sentences × 60 chars, generic float vectors (causal, texts disagree)",
             sentences(20, 60, True), False)]


def heads_of(width: int) -> int:
    """The heads a row's model may use: width/4 above width 4 (docs/heads.md)."""
    return width // 4 if width > 4 else 1


def data_label(label: str, exact: bool) -> str:
    """The data column: the family, and whether its model has float64 parameters."""
    return label + ("" if exact else " (float64 build)")


def width_label(width: int, data) -> str:
    """The width column: the width, and the heads of a set model that may use several."""
    heads = heads_of(width)
    return f"{width}" + ("" if isinstance(data, ef.CausalDataset) or heads == 1 else
                         f", {heads} heads")


def construction(model) -> str:
    """The attention column's suffix: ", keyed" (docs/keyed.md, causal too), ", position
    keys" (docs/causal.md#position-keys, what causal data one text serves get either way) or
    "" for the hat construction."""
    rec = model.record
    if getattr(rec, "keyed", None) is not None:
        return ", keyed"
    return ", position keys" if getattr(rec, "position_code", None) is not None else ""


def measure(label: str, data, exact: bool, attention: str, width: int, keys: bool,
            partial=None) -> dict:
    """The row of the model that ``keys`` chooses (the keyed or the paper's construction);
    ``partial`` is not called (the row is one step)."""
    t0 = time.perf_counter()
    model = ef.compile(data, attention=attention, exact=exact, width=width,
                       heads=heads_of(width), keys=keys)
    return model_row(label, data, exact, attention, width, model, time.perf_counter() - t0)


def model_row(label: str, data, exact: bool, attention: str, width: int, model,
              seconds: float) -> dict:
    """The measured columns of ``model``, built at ``width`` in ``seconds``."""
    causal = isinstance(data, ef.CausalDataset)
    heads = heads_of(width)
    stats = conditioning(model)
    scale = float(data.coordinate_scale()) or 1.0
    modules = [to_torch(model, dt, ff="dense") for dt in DTYPES]
    errors = [max_error(m, data) for m in modules]
    return {"data": data_label(label, exact),
            "attention": attention + construction(model),
            "width": width_label(width, data) + ("" if causal or model.max_heads() in (0, heads)
                                                 else f" ({model.max_heads()} used)"),
            "L": model.n_blocks, "P": model.n_params(), "max|θ|": f"{stats.max_abs:.2g}",
            "‖θ‖²/s²": f"{stats.norm_sq / scale ** 2:.2g}",
            "max |u|·|w|": f"{stats.max_slope:.2g}",
            **{name: f"{e:.1e}" for name, e in zip(("float64", "float32", "bfloat16"), errors,
                                                     strict=True)},
            "bfloat16 decodes": decoded(modules[-1], data) if causal else "",
            "build s": f"{seconds:.1f}"}


def decoded(module, data: ef.CausalDataset) -> str:
    """How many constrained positions of a dense pass (inputs the true tokens) have their
    target as the nearest of the data's distinct target vectors."""
    outs = apply(module, data.floats()[0])
    vocab = np.unique(np.concatenate([y[k] for y, k in zip(data.floats()[1], data.known,
                                                           strict=True)]), axis=0)
    right = total = 0
    for o, y, k in zip(outs, data.floats()[1], data.known, strict=True):
        for i in np.flatnonzero(k):
            right += np.array_equal(vocab[nearest(vocab, o[i])], y[i])
            total += 1
    return f"{right}/{total}"


GOAL = {"float32": 1e-5, "float64": 1e-12}  # the largest error over the scale


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes")
    ap.add_argument("--widths", default="4,64", help="FF widths, comma-separated")
    ap.add_argument("--attention", default="hardmax,softmax")
    ap.add_argument("--only", default="", help="only the data whose label contains this")
    which = ap.add_mutually_exclusive_group()
    which.add_argument("--keys", action="store_true", help="keyed models only (docs/keyed.md, "
                       "docs/causal.md#keyed-causal-models); default: keyed and hat models")
    which.add_argument("--hats", action="store_true", help="hat models only")
    ap.add_argument("--row-timeout", type=float, default=900,
                    help="seconds a row may take before it is reported unfinished")
    ap.add_argument("--out", default=str(RESULTS / "conditioning.md"))
    ap.add_argument("--title", default="Conditioning of constructed models")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    keyed = [True] if args.keys else [False] if args.hats else [True, False]
    rows = []
    sets = [s for s in datasets(args.quick) if args.only in s[0]]
    for attention in args.attention.split(","):  # every hardmax row first: they are quick
        for label, data, exact in sets:
            for width in (int(w) for w in args.widths.split(",")):
                for keys in keyed:
                    row = run_row(label, data, exact, attention, width, keys,
                                  args.row_timeout)
                    if row is None:
                        continue
                    rows.append(row)
                    print(" | ".join(str(row[c]) for c in COLUMNS), flush=True)
                    write(args, rows)  # after every row: a stopped run keeps its rows
                    if row["attention"].endswith("position keys"):
                        break  # the same model with or without keys
    print(goal_summary(rows))
    print(f"written to {args.out}")
    return 0


def run_row(label: str, data, exact: bool, attention: str, width: int, keys,
            timeout: float, row=measure) -> dict | None:
    """``row`` (:func:`measure`) in a child process of its own; a row that says so when it
    takes more than ``timeout`` seconds (with what ``row`` reported of itself by then, through
    its ``partial`` callback), None (and a line) when the construction refuses the data."""
    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    child = ctx.Process(target=_measure_into,
                        args=(results, row, label, data, exact, attention, width, keys))
    child.start()
    known, end = {}, time.monotonic() + timeout
    try:
        while True:
            kind, value = results.get(timeout=max(end - time.monotonic(), 0.01))
            if kind != "partial":
                break
            known = value
    except queue.Empty:
        child.kill()
        child.join()
        note = f"did not finish in {timeout:.0f} s"
        return {c: "" for c in COLUMNS} | {
            "data": data_label(label, exact),
            "attention": attention + (", keyed" if keys in (True, "keyed") else ""),
            "width": width_label(width, data)} | known | \
            ({"float64": f"dense passes {note}"} if known else {"build s": note})
    child.join()
    if kind == "skipped":
        print(f"{label}, {attention}, width {width}: skipped ({value})", flush=True)
        return None
    return value


def _measure_into(results, row, *args) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            results.put(("row", row(*args, partial=lambda r: results.put(("partial", r)))))
        except (ValueError, ef.DatasetError, RuntimeError) as exc:
            results.put(("skipped", str(exc)))


def goal_summary(rows: list[dict]) -> str:
    """Per construction, the largest float32 and float64 errors of the finished rows and how
    many rows meet the goal (:data:`GOAL`), computed from the rows themselves."""
    lines = []
    for name, mine in (("keyed", lambda r: r["attention"].endswith("keyed")),
                       ("position-key", lambda r: r["attention"].endswith("position keys")),
                       ("hat", lambda r: "," not in r["attention"])):
        done = [r for r in rows if mine(r) and r["float32"]]
        if not done:
            continue
        worst = {k: max(float(r[k]) for r in done) for k in GOAL}
        meet = sum(all(float(r[k]) <= v for k, v in GOAL.items()) for r in done)
        left = sum(1 for r in rows if mine(r) and not r["float32"])
        lines.append(f"* {name} models: {meet} of {len(done)} finished rows meet the goal "
                     f"(float32 ≤ 1e-5 and float64 ≤ 1e-12 × scale); largest float32 error "
                     f"{worst['float32']:.2g}, float64 {worst['float64']:.2g}"
                     + (f"; {left} rows did not finish" if left else ""))
    return "\n".join(lines)


def write(args, rows: list[dict]) -> None:
    head = (f"Measured {datetime.date.today()} on {platform.machine()}, torch "
            f"{torch.__version__}, one thread. Errors: max Hausdorff distance over the data's "
            "coordinate scale s of a plain dense pass (native module, ff=\"dense\"); causal "
            "rows: largest distance at a constrained position over s. ‖θ‖² counts every "
            "parameter (positions of causal models included).")
    text = "\n\n".join([f"# {args.title}", head, goal_summary(rows),
                         markdown_table(rows, COLUMNS)]) + "\n"
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(args.out, text)


if __name__ == "__main__":
    sys.exit(main())
