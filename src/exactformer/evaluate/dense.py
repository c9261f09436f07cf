"""A plain dense float64 pass: the reference that checks the fast evaluator independently."""

from __future__ import annotations

import math

import numpy as np

from ..model import Transformer, first_mixing
from ..numbers import pad_columns
from .dense_batch import mixing_run
from .dense_stretch import stretch
from .twins import distinct


def dense_forward(model: Transformer, inputs: list[np.ndarray], tau=None,
                  peaks: dict | None = None, peak_limit: float | None = None
                  ) -> list[np.ndarray]:
    """A plain float64 pass, written apart from :func:`forward` to check it independently:
    every token of every sequence, every layer dense (A and V as d×d matrices, full n×n
    scores, under the causal mask in a causal model), no multisets and no ridge windows.
    Sequences of equal length run as one batch through an attention layer; a stretch of
    blocks without attention acts on each token alone, so it runs once per distinct token
    of all sequences (:func:`_tokenwise`). Overflow is not trapped: it shows as inf or nan
    in the outputs (see docs/verification.md). Inputs narrower than the model are
    zero-padded and the model's positions added, as by :func:`forward`. ``peaks``, a dict,
    receives the largest |value| of each intermediate, keyed (block, part), part one of "FF
    pre-activation", "FF output", "scores", "state" (docs/numerics.md#runtime-ranges); with
    ``peak_limit``, a largest |value| at most the limit may come as a bound on it that is at
    most the limit too (all a range check asks), which spares the rows whose bounds already
    keep a stretch's pre-activations below it.
    """
    params = model.to_float() if model.exact else model
    t = float(tau if tau is not None else (model.tau if model.tau is not None else 1))
    xs = pad_columns([np.asarray(x, dtype=float) for x in inputs], model.d)
    if not xs:
        return []
    if params.positions is not None:
        xs = [x + np.asarray(params.positions[:len(x)], dtype=float) for x in xs]
    blocks, i = params.blocks, 0
    with np.errstate(all="ignore"):
        while i < len(blocks):
            j = first_mixing(blocks, i)
            if j > i:
                xs = _tokenwise(xs, blocks, i, j, peaks, peak_limit)
            k = next((k for k in range(j, len(blocks)) if not blocks[k].mixes()), len(blocks))
            if k > j:
                xs = _batched(xs, blocks, j, k, model, t, peaks)
            i = k
    return xs


def _tokenwise(xs: list[np.ndarray], blocks, i: int, j: int, peaks, limit
               ) -> list[np.ndarray]:
    """Blocks i..j−1, none of which mixes tokens, on every distinct row of all sequences
    (:func:`.twins.distinct`, :func:`.dense_stretch.stretch`), given back to each token."""
    X = np.empty((sum(map(len, xs)), xs[0].shape[1]))  # row-major, as distinct hashes it,
    np.concatenate(xs, out=X)  # in one allocation (fresh memory is slow to touch)
    X += 0.0  # −0 + 0 = 0: equal rows as the pass computes them
    first, inv = distinct(X)
    X = stretch(X[first], blocks, i, j, lambda k: _Peaks(peaks, k, limit))
    return np.split(X[inv], np.cumsum([len(x) for x in xs])[:-1])


ROWS = 1 << 14  # rows of one sequence length that a run of attention blocks takes at once


def _batched(xs: list[np.ndarray], blocks, i: int, j: int, model: Transformer, tau: float,
             peaks) -> list[np.ndarray]:
    """Blocks i..j−1, each of whose attention mixes tokens, on batches of sequences of one
    length, about :data:`ROWS` rows a batch (:func:`.dense_batch.mixing_run`), so that a
    batch's scores and averages stay in the cache; every value is that of the plain pass (a
    batch's shortcuts, chosen on its own rows, may change only the sign of a zero)."""
    out: list = [None] * len(xs)
    for n in sorted({len(x) for x in xs}):
        same = [k for k, x in enumerate(xs) if len(x) == n]
        step = max(1, ROWS // max(n, 1))
        for js in (same[a:a + step] for a in range(0, len(same), step)):
            X = np.concatenate([xs[k] for k in js])
            X = mixing_run(X, n, blocks[i:j], lambda k: _Peaks(peaks, i + k), model.attention,
                           tau, model.causal)
            for k, y in zip(js, np.split(X, len(js)) if n else [X] * len(js), strict=True):
                out[k] = y
    return out


class _Peaks:
    """Records the largest |value| of block ``i``'s parts into ``peaks`` (None: nothing);
    ``limit``: a value at most this may be recorded as a bound on it at most this."""

    def __init__(self, peaks: dict | None, i: int, limit: float | None = None):
        self.peaks, self.i, self.limit = peaks, i, limit

    def __call__(self, part: str, values: np.ndarray) -> np.ndarray:
        if self.peaks is not None and values.size:
            self.note(part, np.abs(values).max())
        return values

    def note(self, part: str, top) -> None:
        """Record ``top``, a largest |value| of the part (nan stays nan)."""
        if self.peaks is not None:
            top, key = float(top), (self.i, part)
            self.peaks[key] = top if math.isnan(top) else max(self.peaks.get(key, 0.0), top)
