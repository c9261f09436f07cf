"""Causal mode, the paper's hat construction (the default's rows: bench_default.py): blocks L
against R_c + moves + 2, parameters P against d and the constrained positions, and the recite
example (docs/causal.md).

(a) Random causal data: sequences over a small token pool (so tokens repeat), each one fresh,
an extension of an earlier one's prefix or a permutation of an earlier one; the target of a
position is drawn once per ordered prefix from the pool and a few extra tokens, null with
probability 0.2. For d in 4, 8, 16 and 100 to 4 000 constrained positions the hardmax model is
built (float64, and rational at d = 4), verified, and its size checked: "moves" is counted
from the model itself — the distinct states after the separation blocks, at constrained
positions, that are not already on their target — and L must be at most R_c + moves + 2.
P / (d · constrained) stays near a constant when P is linear in both.

(b) examples/recite.py: the passage at 2 000 characters (its full length is 2 114) and the
three texts that share an opening, float64 and rational: build, verify, and whether every text
is generated back exactly from its first character.

Prints the tables and writes them, with the date, machine and load average, to
benchmarks/results/causal.md.

    python benchmarks/bench_causal.py            # the full tables (a few minutes on 2 cores)
    python benchmarks/bench_causal.py --quick    # small sizes only (seconds)
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import os
import platform
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

import exactformer as ef
from exactformer.evaluate import forward_causal
from exactformer.tables import markdown_table

RESULTS = Path(__file__).parent / "results"
EXAMPLES = Path(__file__).parents[1] / "examples"
NULL_RATE = 0.2
POOL = 6  # input tokens; targets also use EXTRA_TARGETS more
EXTRA_TARGETS = 3

RANDOM_COLUMNS = ["d", "params", "N", "contexts", "constrained", "moves", "R_c", "L",
                  "R_c + moves + 2", "L ≤ bound", "P", "P / (d · constrained)", "build s",
                  "verify s", "verdict"]
RECITE_COLUMNS = ["case", "params", "texts", "characters", "alphabet", "R_c", "moves", "L",
                  "L ≤ bound", "P", "P positions", "build s", "verify s", "generation s",
                  "verdict", "generated exactly"]


def random_causal(N: int, n: int, d: int, seed: int = 0) -> ef.CausalDataset:
    """N sequences of n tokens over POOL integer tokens in R^d: fresh, extending an earlier
    sequence's prefix, or permuting an earlier sequence; targets by ordered prefix, some null."""
    rng = np.random.default_rng(seed)
    while True:
        tokens = rng.integers(-4, 5, size=(POOL + EXTRA_TARGETS, d))
        if len({tuple(r) for r in tokens.tolist()}) == len(tokens):
            break
    seqs: list[list[int]] = []
    for _ in range(N):
        kind = int(rng.integers(3)) if seqs else 0
        base = seqs[int(rng.integers(len(seqs)))] if seqs else []
        if kind == 0:
            seqs.append(rng.integers(POOL, size=n).tolist())
        elif kind == 1:
            cut = int(rng.integers(1, n))
            seqs.append(base[:cut] + rng.integers(POOL, size=n - cut).tolist())
        else:
            seqs.append(rng.permutation(base).tolist())
    by_prefix: dict[tuple, int] = {}
    ys = []
    for s in seqs:
        ys.append([None if rng.random() < NULL_RATE else
                   tokens[by_prefix.setdefault(tuple(s[:i + 1]), int(rng.integers(len(tokens))))]
                   for i in range(len(s))])
    return ef.CausalDataset.from_arrays([tokens[s] for s in seqs], ys)


def moving_states(model: ef.Transformer, data: ef.CausalDataset) -> int:
    """Distinct states after the separation blocks, at constrained positions, that are not on
    their target: what the interpolation must move, counted from the model and data alone (in
    the model's own arithmetic, as the construction computed them)."""
    R = model.record.R
    xs, ys = data.fractions() if model.exact else data.floats()
    states = forward_causal(replace(model, blocks=model.blocks[:R]), xs,
                            "exact" if model.exact else "float")
    return len({tuple(s[i].tolist()) for s, y, k in zip(states, ys, data.known, strict=True)
                for i in np.flatnonzero(k) if tuple(s[i].tolist()) != tuple(y[i].tolist())})


def measure(data: ef.CausalDataset, exact: bool) -> dict:
    """Build and verify the hardmax model; its size, the bound and the verdict."""
    t0 = time.perf_counter()
    model = ef.compile(data, exact=exact, causal=True, construction="paper")
    t1 = time.perf_counter()
    report = ef.verify(model, data)
    t2 = time.perf_counter()
    moves, R = moving_states(model, data), model.record.R
    return {"model": model, "params": "rational" if exact else "float64", "R_c": R,
            "moves": moves, "L": model.n_blocks, "R_c + moves + 2": R + moves + 2,
            "L ≤ bound": "yes" if model.n_blocks <= R + moves + 2 else "NO",
            "P": model.n_params(), "build s": f"{t1 - t0:.2f}", "verify s": f"{t2 - t1:.2f}",
            "verdict": "EXACT" if report.proved else ("OK" if report.ok else "FAILED")}


def random_row(N: int, n: int, d: int, exact: bool) -> dict:
    data = random_causal(N, n, d, seed=N * 100 + d)
    row = measure(data, exact)
    return {**row, "d": d, "N": N, "contexts": data.total_n, "constrained": data.constrained,
            "P / (d · constrained)": f"{row['P'] / (d * data.constrained):.2f}"}


def recite_module():
    """examples/recite.py, imported from its file."""
    spec = importlib.util.spec_from_file_location("recite", EXAMPLES / "recite.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def recite_row(recite, case: str, texts: list[str], exact: bool) -> dict:
    """examples/recite.py's data for the texts, built, verified and generated back."""
    alphabet, vocab = recite.alphabet_vectors(texts)
    data = recite.next_character_data(texts, alphabet, vocab)
    row = measure(data, exact)
    t0 = time.perf_counter()
    back = [recite.recite(row["model"], t, alphabet, vocab) for t in texts]
    t1 = time.perf_counter()
    return {**row, "case": case, "texts": len(texts), "characters": data.total_n,
            "alphabet": len(alphabet), "P positions": int(np.size(row["model"].positions)),
            "generation s": f"{t1 - t0:.2f}",
            "generated exactly": "yes" if back == texts else "NO"}


def random_cases(quick: bool):
    """(N, n, d, exact): about 100 to 4 000 constrained positions (n = 20, 20 % nulls)."""
    sizes, dims = ((4, 10), (4, 8)) if quick else ((6, 25, 63, 250), (4, 8, 16))
    for d in dims:
        for N in sizes:
            yield N, 20, d, False
    for N in (sizes[:1] if quick else (6, 63)):
        yield N, 20, 4, True


def slopes(rows: list[dict]) -> str:
    """Fitted exponents of P against the constrained positions (per d) and against d (at the
    largest size), float64 rows."""
    rows = [r for r in rows if r["params"] == "float64"]
    parts = []
    for d in sorted({r["d"] for r in rows}):
        mine = [r for r in rows if r["d"] == d]
        k = np.polyfit(np.log([r["constrained"] for r in mine]), np.log([r["P"] for r in mine]),
                       1)[0]
        parts.append(f"P ∝ constrained^k with k = {k:.2f} at d = {d}")
    big = [r for r in rows if r["N"] == max(r["N"] for r in rows)]
    k = np.polyfit(np.log([r["d"] for r in big]), np.log([r["P"] for r in big]), 1)[0]
    parts.append(f"P ∝ d^k with k = {k:.2f} at N = {big[0]['N']}")
    return "Fitted exponents (float64 rows): " + "; ".join(parts) + "."


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes only")
    ap.add_argument("--out", default=str(RESULTS / "causal.md"))
    args = ap.parse_args(argv)
    load0 = os.getloadavg()[0]
    rows = []
    for N, n, d, exact in random_cases(args.quick):
        rows.append(random_row(N, n, d, exact))
        print(" | ".join(f"{c} {rows[-1][c]}" for c in RANDOM_COLUMNS), flush=True)
    recite = recite_module()
    chars, shared = 2000, recite.SHARED
    if args.quick:  # the shared opening is 22 characters long
        chars, shared = 60, [t[:30] for t in shared]
    recites = []
    for exact in (False, True):
        recites.append(recite_row(recite, f"passage, {chars} characters",
                                  [recite.PASSAGE[:chars]], exact))
        recites.append(recite_row(recite, "shared openings", shared, exact))
        for r in recites[-2:]:
            print(" | ".join(f"{c} {r[c]}" for c in RECITE_COLUMNS), flush=True)
    load1 = os.getloadavg()[0]
    text = "\n\n".join([
        "# Causal mode: size, time and the recite example",
        f"Measured {datetime.date.today()} on {platform.machine()} ({os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}, numpy {np.__version__}); "
        f"`python benchmarks/bench_causal.py{' --quick' if args.quick else ''}`. Load average "
        f"{load0:.1f} before and {load1:.1f} after: other processes shared the CPUs, so the "
        "times (wall clock) are only indicative. Hardmax throughout.",
        "## Random causal data (n = 20 tokens per sequence over a pool of 6, 20 % nulls)",
        markdown_table(rows, RANDOM_COLUMNS), slopes(rows),
        "moves: distinct states after the separation blocks, at constrained positions, not "
        "already on their target (counted from the model and the data). Verdict EXACT: every "
        "constrained output `==` its target (rational); OK: the exact pass of the stored "
        "float64 parameters is within 1e-9 × the coordinate scale.",
        "## The recite example (examples/recite.py, d = 8)", markdown_table(recites,
                                                                             RECITE_COLUMNS),
        "P positions: the stored positional rows (n_max × d), not counted in P. Generation "
        "feeds every output, snapped to the nearest character vector, back in; generated "
        "exactly: every text comes back character for character from its first one."]) + "\n"
    print("\n" + text)
    if not args.quick or args.out != str(RESULTS / "causal.md"):
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)
    every = rows + recites
    return 0 if all(r["verdict"] in ("EXACT", "OK") and r["L ≤ bound"] == "yes"
                    for r in every) and all(r["generated exactly"] == "yes"
                                            for r in recites) else 1


if __name__ == "__main__":
    sys.exit(main())
