"""Autoregressive generation with a causal model, one token at a time (docs/causal.md).

Under a causal mask the states of earlier tokens never change when a token is appended, so a
:class:`Decoder` keeps, per attention layer and head, what the new token needs of the prefix
(its keys, or for a rank-one hardmax head only the running extremes of :class:`CausalScan`) and
computes the new token alone. Runs of attention-free ridge FFs that read one direction (every
hat and snap of the construction; a wide layer is cut into its windows) are searched with
vectorised window bounds, so a token pays for the few windows it enters, not for every block.
"""

from __future__ import annotations

from dataclasses import dataclass

import mpmath
import numpy as np

from ..evaluate import (
    Arithmetic,
    CausalScan,
    KeyLayer,
    KeyRun,
    PassStats,
    causal_row,
    layer_forms,
    relu,
)
from ..model import FF, SA, Transformer
from ..numbers import pad_columns


class _Windows:
    """Closed float intervals [lo_f[w], hi_f[w]], searched by a point in about log(windows)
    time: the windows are put in classes by width (within a factor of 16), so the windows of a
    class that can hold t have lo in [t − the class's largest width, t]. Each window's lo is
    replaced by its rank among all lo (lo ≥ x exactly when the rank is at least the number of
    lo below x), and the windows are sorted by (class, rank), so every class's slice is found
    by one vectorised bisection for all classes at once. A token pays for the windows near it,
    not for every window."""

    def __init__(self, lo_f: np.ndarray, hi_f: np.ndarray):
        self.lo_f, self.hi_f = lo_f, hi_f
        width = hi_f - lo_f
        finite = np.isfinite(width)
        exponent = np.where(finite, np.frexp(np.where(finite, width, 1))[1] // 4,
                            np.iinfo(int).max)
        classes, cls = np.unique(exponent, return_inverse=True)
        self.sorted_lo = np.sort(lo_f)
        rank = np.searchsorted(self.sorted_lo, lo_f, "left")
        self.order = np.lexsort((rank, cls))
        self.span = len(lo_f) + 1
        self.keys = cls[self.order] * self.span + rank[self.order]
        self.base = np.arange(len(classes)) * self.span
        self.width = np.array([width[cls == c].max() for c in range(len(classes))]) \
            * (1 + 1e-9)

    def holding(self, t: float, k: int) -> np.ndarray:
        """The windows w ≥ k with lo_f[w] ≤ t ≤ hi_f[w], in increasing order."""
        if not np.isfinite(t):  # overflowed: only unbounded windows can hold it
            return k + np.flatnonzero((self.lo_f[k:] <= t) & (t <= self.hi_f[k:]))
        below = np.searchsorted(self.sorted_lo, t - self.width - 4 * np.spacing(abs(t)), "left")
        upto = np.searchsorted(self.sorted_lo, t, "right")
        a = np.searchsorted(self.keys, self.base + below, "left")
        b = np.searchsorted(self.keys, self.base + upto, "left")
        found = [self.order[i:j] for i, j in zip(a.tolist(), b.tolist(), strict=True) if i < j]
        if not found:
            return np.empty(0, dtype=int)
        cand = np.concatenate(found) if len(found) > 1 else found[0]
        cand = cand[(cand >= k) & (self.hi_f[cand] >= t)]
        cand.sort()
        return cand


@dataclass
class _Run:
    """Consecutive attention-free FF layers cut into ridge windows that read one direction f:
    window w adds zero unless lo[w] < f·x < hi[w]; ``layer[w]`` numbers its layer in the run and
    ``after[w]`` is the first window of the next layer (a wide layer of k hats is k windows).
    ``lookup`` finds the windows whose (widened) float bounds hold a given f·x."""

    f: np.ndarray
    ffs: list[FF]
    lo: list
    hi: list
    lookup: _Windows
    layer: list[int]
    after: list[int]


class _Attention:
    """One causal attention layer (any number of heads) with its cache of the prefix: per
    rank-one hardmax head only the running extremes of :class:`CausalScan`, else the keys."""

    def __init__(self, sa: SA, attention: str, tau, ar: Arithmetic):
        self.sa, self.attention, self.tau, self.ar = sa, attention, tau, ar
        self.scans = [CausalScan() if attention == "hardmax" and h.A.alpha == 0 else None
                      for h in sa.heads]
        self.X: list = []

    def push(self, x: np.ndarray, stats: PassStats) -> np.ndarray:
        """ρ·x plus every head's V applied to the head's average over the prefix."""
        sa = self.sa
        if any(scan is None for scan in self.scans):
            self.X.append(x)
        out = x * sa.rho
        for head, scan in zip(sa.heads, self.scans, strict=True):
            A, V = head.A, head.V
            if scan is not None:
                y = scan.push(x @ A.c, x @ A.a, x, stats)
            else:
                X = np.array(self.X, dtype=x.dtype)
                n = len(X)
                y = causal_row(X, X @ A.c, X @ A.a, A.alpha, n - 1, np.arange(n),
                               self.attention, self.tau, stats,
                               self.ar if self.ar.is_object else None)
            out = out + y * V.beta + V.p * (y @ V.q)
        return out


class Decoder:
    """A causal model fed one token at a time: :meth:`push` returns the output at the new
    position, equal to what :func:`exactformer.evaluate.forward_causal` gives there."""

    def __init__(self, model: Transformer, arithmetic: str | None = None, dps: int = 50):
        if not model.causal:
            raise ValueError("generation needs a causal model (\"causal\": true)")
        if arithmetic is None:
            arithmetic = "exact" if model.exact and model.attention == "hardmax" else "float"
        self.ar = Arithmetic(arithmetic, dps)
        self.dps, self.width = dps, model.d
        with mpmath.workdps(dps):  # parameters converted at the pass's precision
            params = self.ar.numbers(model)
            self.positions = None if model.positions is None else self.ar.array(model.positions)
            tau = self.ar.scalar(model.tau if model.tau is not None else 1)
            self.layers: list = []
            blocks = [self.ar.convert(b) for b in params.blocks]
            keys, windows = layer_forms(model, [b.ff for b in blocks], self.ar)
            for blk, ridges, key in zip(blocks, windows, keys, strict=True):
                if key is not None:
                    self._add_key(blk.ff, key)
                elif blk.ff is not None:
                    self._add_ff(blk.ff, ridges, alone=blk.sa is None or blk.sa.is_identity())
                if blk.sa is not None and not blk.sa.is_identity():
                    self.layers.append(_Attention(blk.sa, model.attention, tau, self.ar))
            self.layers = [self._close(x) for x in self.layers]
        self.t = 0
        self.stats = PassStats()

    def _add_ff(self, ff: FF, ridges, alone: bool) -> None:
        """A dense FF, or its ridge windows (all on one direction, evaluate.ridge_groups) as
        one more layer of the current run (a new run when the direction changes or attention
        came in between)."""
        last = self.layers[-1] if self.layers else None
        if ridges is None:
            self.layers.append(ff)
        elif alone and isinstance(last, list) and np.array_equal(last[0][0][0].f, ridges[0][0].f):
            last.append(ridges)
        else:
            self.layers.append([ridges])

    def _add_key(self, ff: FF, key: KeyLayer) -> None:
        """A key layer joins the key run before it (evaluate.KeyRun), or starts one."""
        last = self.layers[-1] if self.layers else None
        if isinstance(last, tuple) and KeyRun.fits(last[1][0], key):
            last[0].append(ff)
            last[1].append(key)
        else:
            self.layers.append(([ff], [key]))

    def _close(self, layer):
        """A list of layers of (ridge, ff) windows becomes a :class:`_Run` with widened float
        bounds."""
        if isinstance(layer, tuple):
            return KeyRun(*layer)
        if not isinstance(layer, list):
            return layer
        flat = [(r, ff, n) for n, windows in enumerate(layer) for r, ff in windows]
        starts = np.cumsum([0] + [len(w) for w in layer])
        lo = [r.lo for r, _, _ in flat]
        hi = [r.hi for r, _, _ in flat]
        lo_f, hi_f = np.array([float(v) for v in lo]), np.array([float(v) for v in hi])
        if self.ar.is_object:
            lo_f = lo_f - 1e-9 * (np.abs(lo_f) + 1)
            hi_f = hi_f + 1e-9 * (np.abs(hi_f) + 1)
        return _Run(flat[0][0].f, [ff for _, ff, _ in flat], lo, hi, _Windows(lo_f, hi_f),
                    [n for _, _, n in flat], [int(starts[n + 1]) for _, _, n in flat])

    def push(self, x) -> np.ndarray:
        """Append token x (d ≤ D numbers, zero-padded to the model's width D) at the next
        position; the model's output there (D numbers)."""
        with mpmath.workdps(self.dps):
            z = self.ar.array(pad_columns([np.asarray(x)[None]], self.width)[0][0])
            if self.positions is not None:
                if self.t >= len(self.positions):
                    raise ValueError(f"position {self.t} is beyond the model's "
                                     f"{len(self.positions)} stored positions")
                z = z + self.positions[self.t]
            self.t += 1
            for layer in self.layers:
                if isinstance(layer, _Run):
                    z = self._run(layer, z)
                elif isinstance(layer, FF):
                    z = _dense(layer, z)
                elif isinstance(layer, KeyRun):
                    z = layer.push(z, self.ar, _dense)
                else:
                    z = layer.push(z, self.stats)
            return self.ar.public(z)  # Fractions, not the exact pass's mpq

    def _run(self, run: _Run, z: np.ndarray) -> np.ndarray:
        """Apply, layer by layer, the windows whose open interval contains f·z: the first layer
        with such a window adds the changes of all its windows that hold z (each computed from
        the layer's input, as :func:`exactformer.evaluate.forward_causal` does), then the
        search goes on from the next layer."""
        k = 0  # the windows before k belong to layers already applied or passed
        while k < len(run.ffs):
            t = z @ run.f
            cand = run.lookup.holding(float(t), k)
            hits = [c for c in cand.tolist() if run.lo[c] < t < run.hi[c]]
            if not hits:
                return z
            hits = [c for c in hits if run.layer[c] == run.layer[hits[0]]]
            new = z
            for c in hits:
                ff = run.ffs[c]
                new = new + relu(ff.U @ z + ff.b) @ ff.W.T
            z, k = new, run.after[hits[0]]
        return z


def _dense(ff: FF, z: np.ndarray) -> np.ndarray:
    return z * ff.eta + relu(ff.U @ z + ff.b) @ ff.W.T


def nearest(vocabulary: np.ndarray, y: np.ndarray) -> int:
    """Index of the vocabulary row closest to y (Euclidean; the first on ties). A y wider
    than the rows (a model's output in its own width) is compared with the rows zero-padded,
    as the model reads them (docs/architecture.md#data-narrower-than-the-model)."""
    return int(nearest_rows(vocabulary, np.asarray(y)[None])[0])


def nearest_rows(vocabulary: np.ndarray, Y: np.ndarray) -> np.ndarray:
    """:func:`nearest` for every row of Y (k × D) at once, by the same sums: the squared
    distance summed coordinate by coordinate, in the same order for every row, float and exact
    alike (the rule decoding proofs cover, docs/numerics.md#decoding-to-a-vocabulary)."""
    (vocabulary,) = pad_columns([vocabulary], np.shape(Y)[-1])
    dist = None
    for j in range(vocabulary.shape[1]):
        diff = vocabulary[None, :, j] - Y[:, j, None]
        dist = diff * diff if dist is None else dist + diff * diff
    if dist.dtype != object:
        return np.argmin(dist, axis=1)
    return np.array([min(range(dist.shape[1]), key=row.__getitem__) for row in dist], dtype=int)


def generate(model: Transformer, prompt, steps: int, vocabulary=None,
             arithmetic: str | None = None) -> np.ndarray:
    """``steps`` tokens after ``prompt`` (n×d, n ≥ 1): the output at the last position is fed
    back as the next input, replaced first by the nearest row of ``vocabulary`` (V×d) when one
    is given. Returns the generated tokens in the decoder's arithmetic (exact for rational
    hardmax models unless ``arithmetic`` says otherwise): steps×D outputs of the model, or with
    a vocabulary its rows themselves (steps×its own d). A prompt or vocabulary narrower than the
    model's D = ``model.d`` is zero-padded (docs/causal.md#generation); wider, an error."""
    prompt = np.asarray(prompt, dtype=object if _has_fractions(prompt) else None)
    if prompt.ndim != 2 or len(prompt) == 0:
        raise ValueError(f"the prompt must be n×d with n >= 1, got shape {prompt.shape}")
    if steps < 0:
        raise ValueError(f"steps must be >= 0, got {steps}")
    dec = Decoder(model, arithmetic)
    own = vocab = None
    if vocabulary is not None:
        raw = np.asarray(vocabulary)
        if raw.ndim != 2 or not len(raw):
            raise ValueError(f"the vocabulary must be V×d with V >= 1, got shape {raw.shape}")
        own, vocab = dec.ar.array(raw), dec.ar.array(pad_columns([raw], model.d)[0])
    out = None
    for x in prompt:
        out = dec.push(x)
    tokens = []
    for s in range(steps):
        k = None if vocab is None else nearest(vocab, out)
        tokens.append(out if k is None else own[k])
        if s + 1 < steps:
            out = dec.push(out if k is None else vocab[k])
    width = model.d if own is None else own.shape[1]
    return dec.ar.public(np.array(tokens, dtype=out.dtype).reshape(steps, width))


def _has_fractions(a) -> bool:
    return not isinstance(a, np.ndarray) and any(not isinstance(v, (int, float))
                                                 for row in a for v in row)
