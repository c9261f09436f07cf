"""Construction against training on next-token memorisation of a text (README, Construction
against training, next-token).

For the first 10^3, 10^4 and 10^5 characters of a text (by default the standard library's
docstrings of benchmarks/bench_book.py; ``--file`` for any UTF-8 text):

1. **construct** the causal model of examples/recite.py (hardmax, float64 parameters, width
   ``--width``), verify it with ``exactformer.verify`` and generate the text back from its first
   character: time to build, time to verify, and whether the recitation is exact;
2. **train** a standard decoder-only transformer on the same text, written here with torch in
   the nanoGPT style: token embedding, learned positions, pre-LayerNorm blocks of causal
   multi-head self-attention and a 4× GELU MLP, a final LayerNorm and a linear head, cross
   entropy on the next character of random windows of ``--context`` characters, Adam, no
   dropout, no weight decay, on the CPU, for a fixed wall-clock budget (``--budget`` seconds
   per run). Two shapes: one with about the constructed model's parameter count (blocks plus
   stored positions; 4 layers, 4 heads, the embedding width fitted), and a standard small one
   (4 layers, 4 heads, 128 wide).

Metrics at checkpoints (the clock stops while they are measured):

* accuracy: the fraction of positions whose greedy (argmax) next character is right, each
  position seeing the last context/2 to context characters (windows with stride context/2);
  measured on a fixed random sample of ``--sample`` windows at the checkpoints and on every
  position at the end when the text has at most 2 × 10^4 characters (else on the sample);
* recited: the longest prefix generated greedily and autoregressively from the first character
  (each step sees the last ``context`` characters); as generation agrees with the text until
  its first mistake, this is the first position whose prediction from exactly that context is
  wrong, found in batches; capped at ``--recite-cap`` characters.

Writes benchmarks/results/construct_vs_train_causal.md (the table, with date, machine, load,
budget and thread count) and construct_vs_train_causal.png (accuracy against wall time, the
construction as one point per text), and each text's results as
construct_vs_train_causal_<characters>.json; ``--merge`` remakes the table and figure from
those files, so that the sizes can run as separate processes.

    python benchmarks/construct_vs_train_causal.py [--budget 300] [--sizes 1000,10000,100000]
    python benchmarks/construct_vs_train_causal.py --budget 5 --sizes 1000 --out /tmp/x  # check
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).parent))
import bench_book  # noqa: E402

import exactformer as ef  # noqa: E402
from exactformer.tools.decode import generate, nearest  # noqa: E402

RESULTS = Path(__file__).parent / "results"
COLUMNS = ["characters", "method", "shape", "parameters", "steps", "time s", "accuracy",
           "recited", "note"]


# ------------------------------------------------------------------------------ the baseline
class Block(nn.Module):
    """Pre-LN transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(),
                                 nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Token embedding + learned positions, pre-LN blocks, final LN, linear head."""

    def __init__(self, vocab: int, context: int, width: int, layers: int, heads: int):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, width), nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(width), nn.Linear(width, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))


def gpt_params(vocab: int, context: int, width: int, layers: int) -> int:
    return (vocab + context) * width + layers * (12 * width * width + 13 * width) \
        + 2 * width + width * vocab + vocab


def matched_width(target: int, vocab: int, context: int, layers: int, heads: int) -> int:
    """The embedding width (a multiple of 4 × heads) whose parameter count is nearest target."""
    step = 4 * heads
    widths = range(step, 4096 + step, step)
    return min(widths, key=lambda w: abs(gpt_params(vocab, context, w, layers) - target))


# ------------------------------------------------------------------------------ metrics
def windows_for(n: int, context: int) -> list[tuple[int, int, int]]:
    """(start, first scored position, end) of windows with stride context/2 covering positions
    0..n-2 (a position predicts the next character): the first window scores all its
    positions, later ones their second half."""
    half = context // 2
    out, start = [(0, 0, min(context, n - 1))], half
    while out[-1][2] < n - 1:
        end = min(start + context, n - 1)
        out.append((start, out[-1][2], end))
        start += half
    return out


@torch.no_grad()
def accuracy(model: GPT, ids: torch.Tensor, context: int, keep: list[int] | None) -> float:
    """Fraction of the positions of the windows (all when keep is None, else windows number
    keep) whose argmax next character is right."""
    model.eval()
    wins = windows_for(len(ids), context)
    wins = wins if keep is None else [wins[k] for k in keep]
    right = total = 0
    for b in range(0, len(wins), 64):
        chunk = wins[b:b + 64]
        width = max(e - s for s, _, e in chunk)
        x = torch.stack([F.pad(ids[s:e], (0, width - (e - s))) for s, _, e in chunk])
        pred = model(x).argmax(-1)
        for (s, first, e), p in zip(chunk, pred, strict=True):
            right += int((p[first - s:e - s] == ids[first + 1:e + 1]).sum())
            total += e - first
    model.train()
    return right / total


@torch.no_grad()
def recited(model: GPT, ids: torch.Tensor, context: int, cap: int) -> int:
    """Characters generated greedily from the first one before the first mistake (the first
    character counts), at most cap."""
    model.eval()
    n = min(len(ids), cap)
    first = min(context, n)
    pred = model(ids[None, :first]).argmax(-1)[0]
    bad = np.flatnonzero((pred[:first - 1] != ids[1:first]).numpy())
    if len(bad):
        model.train()
        return int(bad[0]) + 1
    i = first - 1  # positions i predict ids[i + 1] from ids[i - context + 1 .. i]
    while i + 1 < n:
        batch = range(i, min(i + 64, n - 1))
        x = torch.stack([ids[j - context + 1:j + 1] for j in batch])
        ok = (model(x)[:, -1].argmax(-1) == ids[[j + 1 for j in batch]]).numpy()
        if not ok.all():
            model.train()
            return batch[int(np.flatnonzero(~ok)[0])] + 1
        i = batch[-1] + 1
    model.train()
    return n


def train_run(ids: torch.Tensor, vocab: int, shape: dict, args, sample: list[int]) -> list:
    """Adam on random windows for args.budget seconds of training; a checkpoint (seconds,
    steps, accuracy, recited) at geometrically spaced times."""
    torch.manual_seed(args.seed)
    model = GPT(vocab, args.context, shape["width"], shape["layers"], shape["heads"])
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    n, T = len(ids), min(args.context, len(ids) - 1)
    marks = [args.budget * f for f in (0.02, 0.05, 0.1, 0.2, 0.35, 0.5, 0.7, 0.85, 1.0)]
    points, spent, steps = [], 0.0, 0
    gen = torch.Generator().manual_seed(args.seed)
    while marks:
        t0 = time.perf_counter()
        starts = torch.randint(0, n - T, (args.batch,), generator=gen)
        x = torch.stack([ids[s:s + T] for s in starts.tolist()])
        y = torch.stack([ids[s + 1:s + T + 1] for s in starts.tolist()])
        lr = args.lr * min(1.0, (steps + 1) / 100)
        for g in opt.param_groups:
            g["lr"] = lr
        loss = F.cross_entropy(model(x).reshape(-1, vocab), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        steps += 1
        spent += time.perf_counter() - t0
        if spent >= marks[0]:
            last = spent >= marks[-1]
            full = last and n <= 20_000
            acc = accuracy(model, ids, args.context, None if full else sample)
            points.append({"seconds": spent, "steps": steps, "loss": float(loss.detach()),
                           "accuracy": acc, "full": full,
                           "recited": recited(model, ids, args.context, args.recite_cap)})
            while marks and spent >= marks[0]:
                marks.pop(0)
            print(f"    {spent:7.1f} s, {steps} steps, loss {float(loss.detach()):.3f}, accuracy "
                  f"{acc:.3f}, recited {points[-1]['recited']}", flush=True)
    return points


# ------------------------------------------------------------------------------ construction
def construct(text: str, width: int) -> dict:
    """Build, verify and recite with the constructed causal model."""
    recite = bench_book.recite_module()
    alphabet, vocab = recite.alphabet_vectors([text])
    data = recite.next_character_data([text], alphabet, vocab)
    t0 = time.perf_counter()
    model = ef.compile(data, exact=False, causal=True, width=width)
    t1 = time.perf_counter()
    report = ef.verify(model, data)
    t2 = time.perf_counter()
    out = generate(model, vocab[[alphabet.index(text[0])]], len(text) - 1, vocabulary=vocab)
    back = text[0] + "".join(alphabet[nearest(vocab, r)] for r in np.asarray(out, float))
    t3 = time.perf_counter()
    agree = next((i for i, (a, b) in enumerate(zip(back, text, strict=True)) if a != b),
                 len(text))
    return {"build": t1 - t0, "verify": t2 - t1, "generate": t3 - t2, "ok": report.ok,
            "params": model.n_params() + int(np.size(model.positions)), "L": model.n_blocks,
            "recited": agree, "exact": back == text}


# ------------------------------------------------------------------------------ report
def figure(results: list[dict], path: Path, budget: float) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(results), figsize=(5 * len(results), 4), squeeze=False)
    for ax, res in zip(axes[0], results, strict=True):
        c = res["construct"]
        for name, points in res["train"].items():
            ax.plot([p["seconds"] for p in points], [p["accuracy"] for p in points], "o-",
                    label=f"trained, {name} ({res['shapes'][name]['params'] / 1e6:.2g} M)")
        t = c["build"] + c["verify"]
        ax.plot([t], [1.0 if c["exact"] else 0.0], "k*", markersize=14,
                label=f"constructed + verified ({c['params'] / 1e6:.2g} M)")
        ax.set_xscale("log")
        ax.set_ylim(0, 1.05)
        ax.set_xlabel("wall time, s (training: its own clock)")
        ax.set_ylabel("next-character accuracy")
        ax.set_title(f"{res['chars']:,} characters (budget {budget:g} s)")
        ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def capped(k: int, res: dict) -> str:
    """k, or "≥ k (cap)" when the check stopped at the cap before the end of the text."""
    return f"≥ {k} (cap)" if k == res["cap"] < res["chars"] else str(k)


def rows_of(res: dict) -> list[dict]:
    c = res["construct"]
    rows = [{"characters": res["chars"], "method": "construct + verify", "shape":
             f"L = {c['L']} blocks, width {res['width']}", "parameters": c["params"],
             "steps": "", "time s": f"{c['build']:.1f} + {c['verify']:.1f}",
             "accuracy": "1 (verified)" if c["ok"] and c["exact"] else "NO",
             "recited": f"{c['recited']} (all)" if c["exact"] else str(c["recited"]),
             "note": f"generation {c['generate']:.1f} s"}]
    for name, points in res["train"].items():
        s, last = res["shapes"][name], points[-1]
        best = max(p["recited"] for p in points)
        rows.append({"characters": res["chars"], "method": "train (Adam)", "shape":
                     f"{name}: {s['layers']} × {s['heads']} heads × {s['width']}, context "
                     f"{res['context']}", "parameters": s["params"], "steps": last["steps"],
                     "time s": f"{last['seconds']:.0f}",
                     "accuracy": f"{last['accuracy']:.3f}" + ("" if last["full"] else
                                                              " (sample)"),
                     "recited": capped(last["recited"], res) + (f" (best {capped(best, res)})"
                                                                if best > last["recited"]
                                                                else ""),
                     "note": f"loss {last['loss']:.3f}"})
    return rows


def meta(args, argv, load0: float, t_all: float) -> dict:
    """What the table says about a run."""
    return {"date": datetime.date.today().isoformat(), "machine": platform.machine(),
            "cpus": os.cpu_count(), "torch": torch.__version__,
            "threads": torch.get_num_threads(), "numpy": np.__version__,
            "command": "python benchmarks/construct_vs_train_causal.py "
                       + " ".join(argv if argv is not None else sys.argv[1:]),
            "seconds": time.perf_counter() - t_all, "load": [load0, os.getloadavg()[0]],
            "source": bench_book.source_name(args.file), "budget": args.budget,
            "batch": args.batch, "context": args.context, "lr": args.lr, "seed": args.seed,
            "sample": args.sample}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000,10000,100000")
    ap.add_argument("--file", help="a UTF-8 text instead of the standard library's docstrings")
    ap.add_argument("--budget", type=float, default=300.0, help="training seconds per run")
    ap.add_argument("--width", type=int, default=1024, help="the construction's widest FF")
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--sample", type=int, default=32,
                    help="windows (of context/2 scored positions) sampled at checkpoints")
    ap.add_argument("--recite-cap", type=int, default=2000,
                    help="stop the recitation check of a trained model here")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--merge", action="store_true",
                    help="only the table and figure, from the .json results of earlier runs")
    ap.add_argument("--construct-only", action="store_true",
                    help="measure the construction again and replace it in the .json results "
                         "of earlier runs (their training runs kept), then remake the table")
    args = ap.parse_args(argv)
    if args.construct_only:
        return reconstruct(args)
    if args.merge:
        found = sorted(args.out.glob("construct_vs_train_causal_*.json"),
                       key=lambda f: int(f.stem.rsplit("_", 1)[1]))
        report([json.loads(f.read_text()) for f in found], args.out)
        return 0
    torch.set_num_threads(args.threads)
    load0, t_all = os.getloadavg()[0], time.perf_counter()
    sizes = [int(s) for s in args.sizes.split(",")]
    book = bench_book.book_text(max(sizes), args.file)
    results = []
    for chars in sizes:
        text = book[:chars]
        alphabet = sorted(set(text))
        ids = torch.tensor([alphabet.index(ch) for ch in text])
        print(f"{chars} characters, {len(alphabet)} symbols", flush=True)
        c = construct(text, args.width)
        print(f"  constructed: build {c['build']:.1f} s, verify {c['verify']:.1f} s, "
              f"exact {c['exact']}", flush=True)
        layers, heads = 4, 4
        shapes = {"matched": {"layers": layers, "heads": heads, "width": matched_width(
                      c["params"], len(alphabet), args.context, layers, heads)},
                  "small": {"layers": 4, "heads": 4, "width": 128}}
        if shapes["matched"] == shapes["small"]:
            shapes = {"matched = small": shapes["small"]}
        for s in shapes.values():
            s["params"] = gpt_params(len(alphabet), args.context, s["width"], s["layers"])
        rng = np.random.default_rng(args.seed)
        n_windows = len(windows_for(chars, args.context))
        sample = sorted(rng.choice(n_windows, size=min(args.sample, n_windows),
                                   replace=False).tolist())
        train = {}
        for name, s in shapes.items():
            print(f"  training {name} ({s['params']} parameters)", flush=True)
            train[name] = train_run(ids, len(alphabet), s, args, sample)
        res = {"chars": chars, "construct": c, "train": train, "shapes": shapes,
               "width": args.width, "context": args.context, "cap": args.recite_cap,
               "meta": meta(args, argv, load0, t_all)}
        results.append(res)
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"construct_vs_train_causal_{chars}.json").write_text(json.dumps(res))
    if not args.merge:
        report(results, args.out)
    return 0 if all(r["construct"]["ok"] and r["construct"]["exact"] for r in results) else 1


def reconstruct(args) -> int:
    """``--construct-only``: each size's construction measured again, its training kept."""
    load0, t_all = os.getloadavg()[0], time.perf_counter()
    results = []
    for chars in (int(s) for s in args.sizes.split(",")):
        path = args.out / f"construct_vs_train_causal_{chars}.json"
        res = json.loads(path.read_text())
        text = bench_book.book_text(chars, args.file)[:chars]
        res["construct"] = construct(text, args.width)
        res["construct_meta"] = {"date": datetime.date.today().isoformat(),
                                 "load": [load0, os.getloadavg()[0]],
                                 "seconds": time.perf_counter() - t_all}
        path.write_text(json.dumps(res))
        results.append(res)
        print(f"{chars}: {res['construct']}", flush=True)
    report(results, args.out)
    return 0 if all(r["construct"]["ok"] and r["construct"]["exact"] for r in results) else 1


def report(results: list[dict], out: Path) -> None:
    """The table (construct_vs_train_causal.md) and the figure of these results."""
    from exactformer.tables import markdown_table
    metas = [r["meta"] for r in results]
    m = metas[0]
    runs = "; ".join(f"`{x['command']}` ({x['seconds']:.0f} s, load average {x['load'][0]:.1f} "
                     f"before, {x['load'][1]:.1f} after)" for x in metas)
    rows = [row for r in results for row in rows_of(r)]
    text = "\n\n".join([
        "# Construction against training: next-character memorisation of a text",
        f"Measured {m['date']} on {m['machine']} ({m['cpus']} CPUs, torch {m['torch']} with "
        f"{m['threads']} thread(s) a run, numpy {m['numpy']}). Runs: {runs}. The 2 CPUs were "
        "shared with other processes (other engineers' tests and benchmarks, and these runs "
        "side by side), so every time here is wall clock on a fraction of a CPU, for "
        "construction and training alike.",
        f"Text: {m['source']}, its first `characters` characters. Training budget: "
        f"{m['budget']:g} s of wall time per run (the clock stops at the checkpoints), batch "
        f"{m['batch']} windows of {m['context']} characters, Adam lr {m['lr']:g} after 100 "
        f"warm-up steps, seed {m['seed']}. Shapes: matched, 4 layers × 4 heads with the width "
        "whose parameter count is nearest the construction's; small, 4 × 4 × 128 (where the "
        "two are the same, one run). Accuracy: fraction of positions whose greedy next "
        f"character is right (each seeing the last {m['context'] // 2} to {m['context']} "
        "characters); \"(sample)\": on a fixed sample of "
        f"{m['sample']} windows of {m['context'] // 2} positions. Recited: the longest prefix "
        "generated greedily from the first character. The construction's time is build + "
        "verify (`exactformer.verify`: the exact pass of the stored float64 parameters within "
        "1e-9 × the scale at every position), its accuracy the verified verdict, its "
        "recitation the decoder's generation of the whole text; its parameters count the "
        "blocks and the stored positions.",
        *[f"The constructed models were measured again on {r['construct_meta']['date']} "
          f"(load average {r['construct_meta']['load'][0]:.1f} before, "
          f"{r['construct_meta']['load'][1]:.1f} after), with the construction of that day; "
          "the training runs are those of the run above, whose matched shape was chosen for "
          "the construction of its day." for r in results[:1] if "construct_meta" in r],
        markdown_table(rows, COLUMNS),
        "![accuracy against time](construct_vs_train_causal.png)"]) + "\n"
    print("\n" + text)
    out.mkdir(parents=True, exist_ok=True)
    (out / "construct_vs_train_causal.md").write_text(text)
    figure(results, out / "construct_vs_train_causal.png", m["budget"])


if __name__ == "__main__":
    sys.exit(main())
