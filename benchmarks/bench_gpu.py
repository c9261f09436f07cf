"""Throughput of an exported model: tokens per second, eager vs CUDA graphs vs torch.compile,
against the memory-bandwidth floor.

The model is constructed (hardmax, float64 parameters) for random data with N = 400 sequences of
8 tokens in d = 64 and 3 targets each: 2000 blocks. The batch tiles those sequences to 10^5
tokens. Every layer must at least read and write the whole batch once, so the floor is
(layers × 2 × batch bytes) / (measured copy bandwidth). Modes:

* eager: the module as is, one kernel launch per operation;
* graph: the eager forward captured once in a CUDA graph and replayed (CUDA only);
* compile: each block's forward through torch.compile (one compiled graph per block shape);
* compile+graph: the compiled forward captured in a CUDA graph (CUDA only).

``--causal``: the causal case instead, the recite model of benchmarks/bench_book.py (the first
10^4 characters of the standard library's docstrings as vectors in R^8, width 1024: L = 40
blocks, stored positions, the causal mask), the text tiled to 10 sequences of 10^4 tokens; the
error is the largest distance to the target at a position, over the scale, and "next
character right" the fraction of positions whose output's nearest character is the next one.

``--small`` is a tiny configuration that runs in a minute on a CPU, to check the script.

    python benchmarks/bench_gpu.py [--small] [--causal] [--dtype float32] [--modes eager,...]
                                   [--out benchmarks/results/bench_gpu.md]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch._dynamo

import exactformer as ef
from exactformer import export as et
from exactformer.data import builtin
from exactformer.distance import hausdorff

FULL = {"N": 400, "n": 8, "m": 3, "d": 64, "tokens": 100_000}
SMALL = {"N": 6, "n": 4, "m": 2, "d": 8, "tokens": 2_000}
CAUSAL_FULL = {"chars": 10_000, "width": 1024, "tokens": 100_000}
CAUSAL_SMALL = {"chars": 300, "width": 64, "tokens": 2_000}
MODES = ("eager", "graph", "compile", "compile+graph")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device, reps: int) -> float:
    """Median seconds of ``reps`` calls after one warm-up call."""
    fn()
    times = []
    for _ in range(reps):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def copy_bandwidth(device, dtype) -> float:
    """Bytes per second moved by a large device-to-device copy (read + write)."""
    n = (256 if device.type == "cuda" else 32) * 2 ** 20 // torch.finfo(dtype).bits * 8
    src = torch.ones(n, dtype=dtype, device=device)
    dst = torch.empty_like(src)
    return 2 * src.numel() * src.element_size() / timed(lambda: dst.copy_(src), device, 10)


def n_layers(module) -> int:
    """Layers that move the batch: non-identity FF and SA (native), two per block (ρ/η)."""
    if isinstance(module, et.RhoEtaTransformer):
        return 2 * len(module.blocks)
    return sum((b.ff is not None) + (b.sa is not None) for b in module.blocks)


def compiled_forward(module):
    """The module's forward with every block run through torch.compile."""
    torch._dynamo.config.recompile_limit = 64  # one graph per block shape (FF kind, SA or not)
    step = torch.compile(type(module.blocks[0]).forward)

    def run(x, mask):
        if module.positions is not None:
            x = x + module.positions[: x.shape[-2]]
        x = x.masked_fill(~mask[..., None], 0)
        for blk in module.blocks:
            x = step(blk, x, mask, module.attention, module.tau, module.causal)
        return x.masked_fill(~mask[..., None], 0)

    return run


def graphed(fn, x, mask):
    """``fn(x, mask)`` captured in a CUDA graph; calling the result replays it."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn(x, mask)  # warm-up outside the capture (allocations, compiled kernels)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn(x, mask)

    def replay():
        graph.replay()
        return out

    return replay


def set_case(small: bool):
    """Random set data (FULL or SMALL), its float64 hardmax model, the batch (the sequences
    tiled to about cfg["tokens"] tokens) and its error: the largest Hausdorff distance of a
    pair's outputs to its targets, over the scale."""
    cfg = SMALL if small else FULL
    data = builtin.uniform(cfg["N"], cfg["n"], cfg["m"], cfg["d"], seed=0)
    model = ef.compile(data, exact=False, seed=0)
    reps = math.ceil(cfg["tokens"] / (cfg["N"] * cfg["n"]))
    _, ys = data.floats()

    def error(out: torch.Tensor) -> str:
        err = max(hausdorff(out[j].double().cpu().numpy(), ys[j]) for j in range(data.N))
        return f"{err / data.coordinate_scale():.2g}"

    return model, np.tile(np.stack(data.floats()[0]), (reps, 1, 1)), error


def causal_case(small: bool):
    """benchmarks/bench_book.py's text (the recite model's data), its float64 causal model, the
    batch (the one sequence tiled to about cfg["tokens"] tokens) and its error: the largest
    distance to the target at a constrained position (over the scale), and the fraction of
    positions whose nearest character is the next one, over the whole batch."""
    sys.path.insert(0, str(Path(__file__).parent))
    import bench_book

    cfg = CAUSAL_SMALL if small else CAUSAL_FULL
    recite = bench_book.recite_module()
    text = bench_book.book_text(cfg["chars"])
    alphabet, vocab = recite.alphabet_vectors([text])
    data = recite.next_character_data([text], alphabet, vocab)
    model = ef.compile(data, exact=False, causal=True, width=cfg["width"])
    reps = math.ceil(cfg["tokens"] / cfg["chars"])
    (x,), (y,) = data.floats()
    known = data.known[0]
    want = ((vocab[:, None, :] - y[None]) ** 2).sum(-1).argmin(0)

    def error(out: torch.Tensor) -> str:
        out = out.double().cpu().numpy()
        err = max(float(np.linalg.norm(o[known] - y[known], axis=1).max()) for o in out)
        near = np.stack([((vocab[:, None, :] - o[None]) ** 2).sum(-1).argmin(0) for o in out])
        right = float((near[:, known] == want[known]).mean())
        return f"{err / data.coordinate_scale():.2g}; next character right {right:.4f}"

    return model, np.tile(x, (reps, 1, 1)), error


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--small", action="store_true", help="tiny configuration (CPU smoke test)")
    p.add_argument("--causal", action="store_true", help="the causal recite model instead")
    p.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--out", help="default benchmarks/results/bench_gpu[_causal].md")
    args = p.parse_args()
    args.out = args.out or f"benchmarks/results/bench_gpu{'_causal' if args.causal else ''}.md"
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    modes = [m for m in args.modes.split(",") if device.type == "cuda" or "graph" not in m]

    t0 = time.perf_counter()
    model, batch, error = (causal_case if args.causal else set_case)(args.small)
    t_build = time.perf_counter() - t0
    x = torch.as_tensor(batch, dtype=dtype, device=device)
    mask = torch.ones(x.shape[:2], dtype=torch.bool, device=device)
    tokens = mask.numel()
    bandwidth = copy_bandwidth(device, dtype)

    rows = []
    for layout in et.LAYOUTS:
        module = et.convert(model, layout, dtype, device)
        layer_bytes = 2 * x.numel() * x.element_size()
        param_bytes = sum(q.numel() * q.element_size() for q in module.parameters())
        floor = (n_layers(module) * layer_bytes + param_bytes) / bandwidth
        with torch.no_grad():
            reference = module(x, mask)
            err = error(reference)
            for mode in modes:
                fn = compiled_forward(module) if mode.startswith("compile") else module
                t_setup = time.perf_counter()
                run = graphed(fn, x, mask) if mode.endswith("graph") else (lambda f=fn: f(x, mask))
                diff = float((run() - reference).abs().max())
                t_setup = time.perf_counter() - t_setup
                sec = timed(run, device, args.reps)
                rows.append((layout, mode, sec * 1e3, tokens / sec, tokens / floor,
                             100 * floor / sec, diff, err, t_setup))
        del module

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    case = "causal recite model, " if args.causal else ""
    head = [f"# bench_gpu: {name}, torch {torch.__version__}, {args.dtype}",
            "",
            f"model: {case}{model.n_blocks} blocks, d = {model.d} (built in {t_build:.1f} s); "
            f"batch: "
            f"{x.shape[0]} sequences × {x.shape[1]} tokens = {tokens} tokens; "
            f"copy bandwidth {bandwidth / 1e9:.1f} GB/s",
            "",
            "| layout | mode | ms / forward | tokens/s | floor tokens/s | % of floor "
            "| max abs Δ vs eager | float error / scale | setup s |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    lines = [f"| {r[0]} | {r[1]} | {r[2]:.2f} | {r[3]:.3g} | {r[4]:.3g} | {r[5]:.1f} | "
             f"{r[6]:.2g} | {r[7]} | {r[8]:.1f} |" for r in rows]
    text = "\n".join(head + lines) + "\n"
    print(text)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(f"written to {out}")


if __name__ == "__main__":
    main()
