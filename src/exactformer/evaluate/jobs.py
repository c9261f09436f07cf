"""A model prepared for a pass (:class:`Job`), and the process pool that splits a pass.

Sequences never interact, so an exact or mpmath pass over many tokens is split into contiguous
chunks of sequences run in forked worker processes; outputs, snapshots and statistics equal a
serial pass (docs/verification.md). Workers die with their parent.
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import multiprocessing
import os
import signal
import sys
from dataclasses import dataclass

import mpmath
import numpy as np
from tqdm import tqdm

from ..model import Transformer, first_mixing
from . import runs, window_pairs
from .arithmetic import Arithmetic, PassStats
from .boxes import BOX_LAYERS, stretch_weight
from .causal import apply_causal_sa
from .gate_runs import gate_runs
from .gates import gate_layers
from .keys import KeyRun, key_layers
from .layers import apply_ff, apply_sa, ff_rows
from .staged import staged_runs
from .state import CausalState, RowState
from .windows import paused_gc, ridges_of


@dataclass
class Job:
    """A model ready to run in one arithmetic: converted blocks, their ridge windows, τ, and
    whether its attention is causal (rows in input order, never merged)."""

    ar: Arithmetic
    attention: str
    blocks: list
    ridges: list
    tau: object
    runs: dict  # first block -> runs.Run (float64 passes; docs/numerics.md)
    causal: bool
    keys: list  # per block: its FF as a key layer (evaluate/keys.py), or None
    key_runs: dict  # first block -> (end, keys.KeyRun) over blocks of key layers alone
    gates: list  # per block: its FF as a gated layer (evaluate/gates.py), or None
    gate_runs: dict  # first block -> gate_runs.GateRun (float64 passes)
    pairs: dict  # block -> window_pairs.Pair whose window it holds (float64 passes)
    weights: list  # per block: its stretch's boxes.stretch_weight (float64 passes), or None
    staged: dict  # first block -> staged.StagedRun (float64 tracking passes)

    @classmethod
    def of(cls, model: Transformer, ar: Arithmetic, tau, causal: bool | None = None) -> Job:
        """``causal`` None: as the model says. Within :func:`one_job_per_model`, the Job made
        before for the same model, arithmetic, τ and mode."""
        causal = model.causal if causal is None else causal
        made = _MADE.get()
        key = (id(model), ar.kind, ar.dps, tau, causal)
        if made is not None and key in made:
            return made[key][1]
        job = cls._prepare(model, ar, tau, causal)
        if made is not None:
            made[key] = (model, job)  # (holding the model keeps its id from being reused)
        return job

    @classmethod
    def _prepare(cls, model: Transformer, ar: Arithmetic, tau, causal: bool) -> Job:
        params = ar.numbers(model)
        blocks = params.blocks  # converted to the pass's arithmetic where used (Arithmetic.convert)
        with paused_gc():
            keys, ridges = layer_forms(model, [c.ff for c in blocks], ar)
            plan = {} if ar.is_object else runs.plan_runs(blocks, ridges)
            gates = gate_layers([b.ff if k is None and r is None else None
                                 for b, k, r in zip(model.blocks, keys, ridges, strict=True)])
        tau = ar.scalar(tau if tau is not None else (model.tau if model.tau is not None else 1))
        pairs = {} if ar.is_object else _pairs(blocks, keys, ridges, gates)
        weights = [None] * len(blocks) if ar.is_object else _stretch_weights(blocks)
        grs = {} if ar.is_object else gate_runs(blocks, gates)
        return cls(ar, model.attention, blocks, ridges, tau, plan,
                   causal, keys, _key_runs(blocks, keys, ar),
                   gates, grs, pairs, weights,
                   {} if ar.is_object else staged_runs(
                       blocks, _plain(keys, ridges, _in_runs(gates, grs), pairs), weights,
                       [g is not None for g in gates]))

    def run(self, xs: list[np.ndarray], snapshots, stats: PassStats,
            progress: bool) -> tuple[list, dict]:
        """The pass over ``xs``."""
        st = self.state(xs)
        snaps = self.walk(st, snapshots, stats, progress)
        return st.outputs(), snaps

    def state(self, xs: list[np.ndarray], rad: list | None = None) -> RowState:
        """The rows of a pass over ``xs`` (with radii ``rad`` in a tracking pass)."""
        return (CausalState if self.causal else RowState)(xs, self.ar, rad)

    def walk(self, st: RowState, snapshots, stats: PassStats, progress: bool,
             start: int = 0, stop: int | None = None) -> dict:
        """Blocks ``start`` to ``stop`` (default: every block) on the state ``st``; returns
        the snapshots asked for. Up to the first attention layer (its block's FF included)
        rows are pooled across sequences (:meth:`RowState.pool`,
        :func:`~exactformer.model.first_mixing`)."""
        mixes = first_mixing(self.blocks)
        pooled = start < mixes
        st.pool() if pooled else st.compact()
        snaps = {}
        if snapshots and 0 in snapshots:
            snaps[0] = st.outputs()
        stop = len(self.blocks) if stop is None else stop
        attend = apply_causal_sa if self.causal else apply_sa
        bar = tqdm(total=stop - start, desc=f"forward ({self.ar.kind})", unit="block",
                   disable=not progress, leave=False, delay=1)
        i, closing = start, {}  # window–flip pairs whose flip is at block i
        while i < stop:
            kr = None if closing else self.key_runs.get(i)
            if kr is not None and kr[0] <= stop and \
                    not any(i < k <= kr[0] for k in snapshots or ()):  # (as runs below)
                kr[1].apply(st, ff_rows)
                bar.update(kr[0] - i)
                i = kr[0]
                continue
            run = None if closing else self.runs.get(i)
            if run is not None and run.end <= stop and \
                    not any(run.start < k <= run.end for k in snapshots or ()) \
                    and runs.apply_run(st, run, stats):
                bar.update(run.end - i)
                i = run.end
                continue
            gr = None if closing else self.gate_runs.get(i)
            if gr is not None and st.rad is not None and gr.end <= stop and \
                    not any(i < k <= gr.end for k in snapshots or ()):
                gr.apply(st)
                bar.update(gr.end - i)
                i = gr.end
                continue
            sr = None if closing or st.rad is None else self.staged.get(i)
            if sr is not None and sr.end <= stop and \
                    not any(i < k <= sr.end for k in snapshots or ()) and sr.apply(st):
                bar.update(sr.end - i)
                i = sr.end
                continue
            blk = self.blocks[i]
            opening = [] if st.rad is None or i + 1 >= stop or (pooled and i + 1 >= mixes) \
                or (snapshots and i + 1 in snapshots) or len(st.P) < window_pairs.PAIR_ROWS \
                else self.pairs.get(i, [])
            if opening or closing:
                closing = window_pairs.apply(st, blk.ff, opening, closing)
            elif blk.ff is not None:
                apply_ff(st, blk.ff, self.ridges[i], stats, self.keys[i], self.gates[i],
                         self.weights[i])
            if blk.sa is not None and not blk.sa.is_identity():
                if pooled:  # the first attention, after its block's FF (a data reset there
                    st.unpool()  # makes a sequence's rows equal: they merge as it unpools)
                    pooled = False
                attend(st, st.ar.convert(blk.sa), self.attention, self.tau, stats)
            i += 1
            bar.update(1)
            if snapshots and i in snapshots:
                snaps[i] = st.outputs()
        bar.close()
        if pooled:  # a later walk from here may reach attention
            st.unpool()
        return snaps


_MADE: contextvars.ContextVar[dict | None] = contextvars.ContextVar("jobs_made", default=None)


@contextlib.contextmanager
def one_job_per_model():
    """Within the block, :meth:`Job.of` prepares a model once per arithmetic, τ and mode:
    verify's passes over one model (its enclosure and its float64 pass) share the layer
    forms, gates and runs, which cost about as much as one pass. Only within: a model may
    be changed between two verifies."""
    token = _MADE.set({})
    try:
        yield
    finally:
        _MADE.reset(token)


def _pairs(blocks: list, keys: list, ridges: list, gates: list) -> dict:
    """window_pairs.window_pairs over the blocks that a pass applies one by one (no key
    layer, ridge window or gate: none of them is part of a run)."""
    plain = _plain(keys, ridges, gates, {})
    alone = [b.sa is None or b.sa.is_identity() for b in blocks]
    return {L: ps for L, ps in window_pairs.window_pairs([b.ff for b in blocks], alone).items()
            if plain[L] and plain[L + 1]}


def _in_runs(gates: list, grs: dict) -> list:
    """The gated layers that are part of a gate run (the others None): a gated layer alone
    (a softmax model's snap, whose raised codes are no keys) may be part of a staged run."""
    inside = {i for run in grs.values() for i in range(run.start, run.end)}
    return [g if i in inside else None for i, g in enumerate(gates)]


def _plain(keys: list, ridges: list, gates: list, pairs: dict) -> list[bool]:
    """Per block, whether no fast path takes its FF: no key layer, ridge window or gate, and
    no window–flip pair that opens or closes there."""
    paired = set(pairs) | {L + 1 for L in pairs}
    return [k is None and r is None and g is None and i not in paired
            for i, (k, r, g) in enumerate(zip(keys, ridges, gates, strict=True))]


def _stretch_weights(blocks: list) -> list:
    """Per block, the weight of its stretch's FFs (:func:`.boxes.stretch_weight`), or None
    where fewer than :data:`.boxes.BOX_LAYERS` blocks of the stretch are left (new boxes would
    not pay): a stretch runs from a block after one whose attention mixes tokens to the next
    such block, whose FF comes before its attention."""
    out: list = []
    while len(out) < len(blocks):
        start, end = len(out), min(first_mixing(blocks, len(out)) + 1, len(blocks))
        weight = stretch_weight(b.ff for b in blocks[start:end])
        out += [weight if end - i >= BOX_LAYERS else None for i in range(start, end)]
    return out


def layer_forms(model: Transformer, ffs: list, ar: Arithmetic) -> tuple[list, list]:
    """Per block of ``model``: its FF as a key layer (evaluate/keys.py) or None, and for the
    other FFs their ridge windows (evaluate/windows.py); ``ffs``: the blocks' FFs in the
    pass's arithmetic. What a pass and the decoder both prepare."""
    keys = key_layers([b.ff for b in model.blocks])
    ridges = ridges_of([None if k is not None else b.ff for b, k in
                        zip(model.blocks, keys, strict=True)], ffs, ar)
    return keys, ridges


def _key_runs(blocks: list, keys: list, ar: Arithmetic) -> dict:
    """first block -> (end, KeyRun) for every maximal stretch of blocks whose FF is a key
    layer (all on one Q and weight) and whose attention is absent or the identity; the
    layers in the pass's arithmetic."""
    out, i = {}, 0
    while i < len(blocks):
        j = i
        while j < len(blocks) and keys[j] is not None and KeyRun.fits(keys[i], keys[j]) \
                and (blocks[j].sa is None or blocks[j].sa.is_identity()):
            j += 1
        if j > i:
            out[i] = (j, KeyRun([ar.convert(b.ff) for b in blocks[i:j]], keys[i:j]))
        i = max(j, i + 1)
    return out


PARALLEL_MIN_WORK = 10**6  # tokens × blocks below which a pool costs more than it saves


def default_workers() -> int:
    """The CPUs this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def chunk_bounds(xs: list[np.ndarray], n_blocks: int, ar: Arithmetic,
                  workers: int | None) -> list[tuple[int, int]]:
    """Contiguous ranges of sequences with about equal token counts, one per worker; a single
    range when the pass should stay serial (float, little work, one worker, or inside a
    daemonic process, which may not start children)."""
    workers = default_workers() if workers is None else workers
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    lengths = np.array([len(x) for x in xs])
    k = min(workers, len(xs))
    if (not ar.is_object or k < 2 or int(lengths.sum()) * n_blocks < PARALLEL_MIN_WORK
            or multiprocessing.current_process().daemon):
        return [(0, len(xs))]
    cuts = np.searchsorted(np.cumsum(lengths), lengths.sum() * np.arange(1, k) / k)
    edges = sorted({0, len(xs), *(int(c) + 1 for c in cuts)})
    return list(zip(edges[:-1], edges[1:], strict=True))


_WORKER: dict = {}  # the job and inputs of a pool worker, set once by its initializer
PR_SET_PDEATHSIG = 1  # prctl option (Linux): the signal a process gets when its parent dies


def _init_worker(parent: int, job: Job, xs: list[np.ndarray], snapshots) -> None:
    _die_with_parent(parent)
    _WORKER.update(job=job, xs=xs, snapshots=snapshots)


def _die_with_parent(parent: int) -> None:
    """Make this worker end with the process that started it, however that one ends: SIGTERM
    back to its default (a forked worker inherits the CLI's handler, which would run the
    parent's cleanup here), and on Linux SIGKILL from the kernel once the parent is gone. A
    parent that died before this line ran is caught by comparing parent ids."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(1)


def _run_chunk(bounds: tuple[int, int]) -> tuple[list, dict, PassStats]:
    w, (s, e), stats = _WORKER, bounds, PassStats()
    with mpmath.workdps(w["job"].ar.dps):
        outs, snaps = w["job"].run(w["xs"][s:e], w["snapshots"], stats, False)
    return outs, snaps, stats


def run_parallel(job: Job, xs, bounds, snapshots, stats: PassStats,
                 progress: bool) -> tuple[list, dict]:
    """Run the chunks in a process pool and join their results in sequence order. On Linux
    the workers are forked, so they inherit the prepared job instead of unpickling it. Leaving
    the pool terminates its workers, also on an exception (SIGTERM in the CLI raises
    SystemExit), and each worker dies with this process (:func:`_die_with_parent`)."""
    ctx = multiprocessing.get_context("fork" if sys.platform.startswith("linux") else None)
    outs: list = []
    snaps: dict = {}
    with ctx.Pool(len(bounds), initializer=_init_worker,
                  initargs=(os.getpid(), job, xs, snapshots)) as pool:
        results = tqdm(pool.imap(_run_chunk, bounds), total=len(bounds), unit="chunk",
                       desc=f"forward ({job.ar.kind}, {len(bounds)} processes)",
                       disable=not progress, leave=False, delay=1)
        for chunk_outs, chunk_snaps, chunk_stats in results:
            outs += chunk_outs
            for i, v in chunk_snaps.items():
                snaps.setdefault(i, []).extend(v)
            stats.merge(chunk_stats)
    return outs, snaps
