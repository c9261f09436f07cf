"""Decoding proofs: every runtime output of a text position decodes to its target.

Given the output boxes of :mod:`.runtime_proof` at the constrained positions of causal data
with a vocabulary, decide rigorously that every point y of a box has the target's vector t
as its strictly nearest vocabulary vector, and that the project's decoder
(``tools.decode.nearest``, squared distances summed in float64) picks it: for every other
entry v, |y − v|² − |y − t|² = 2·y·(t − v) + |v|² − |t|² exceeds the float64 errors of both
distances over the whole box. The least of that form over the box is computed in float64 with
a bound on its own rounding; no tie is proved. docs/numerics.md#decoding-to-a-vocabulary.
NumPy only.
"""

from __future__ import annotations

import numpy as np

from ..evaluate.enclosure import rounding, up
from ..evaluate.twins import distinct
from ..tools.decode import nearest_rows

CHUNK = 1 << 20  # positions × entries × coordinates per block of the vectorised bound


def target_indices(vocab: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Per target row (k × D, zero-padded past the vocabulary's d), the index of the equal
    vocabulary vector, −1 where none is equal."""
    d = vocab.shape[1]
    rows = {tuple(v): k for k, v in reversed(list(enumerate(vocab.tolist())))}
    padding = (targets[:, d:] != 0).any(axis=1)
    return np.array([-1 if pad else rows.get(tuple(t), -1)
                     for t, pad in zip(targets[:, :d].tolist(), padding, strict=True)],
                    dtype=int)


def decoding_margins(vocab: np.ndarray, Ym: np.ndarray, Yr: np.ndarray,
                     index: np.ndarray) -> np.ndarray:
    """Per output box Ym ± Yr (k × D) with target vocabulary index ``index`` (−1: none), the
    least over the other entries v of (min of the form − its error bounds) / (2·|t − v|):
    where positive, how far every point of the box stays inside the target's decoding region
    (less the rounding); the box is proved to decode to its target exactly there. −inf where
    there is no target or an entry equals it, nan where the box is nan. Equal boxes with
    one target (a text's positions repeat them) are bounded once."""
    first, inv = distinct(np.column_stack([Ym, Yr, index]))
    return _distinct_margins(vocab, Ym[first], Yr[first], index[first])[inv]


def _distinct_margins(vocab, Ym, Yr, index) -> np.ndarray:
    """:func:`decoding_margins` of each box, in blocks of :data:`CHUNK` numbers."""
    out = np.full(len(Ym), -np.inf)
    with np.errstate(all="ignore"):
        rest = up(((np.abs(Ym[:, vocab.shape[1]:]) + Yr[:, vocab.shape[1]:]) ** 2)
                  .sum(axis=1), Ym.shape[1] + 2)  # the coordinates beyond the vocabulary's
        step = max(1, CHUNK // max(1, vocab.size))
        for a in range(0, len(Ym), step):
            s = slice(a, a + step)
            out[s] = _margins(vocab, Ym[s], Yr[s], index[s], rest[s], Ym.shape[1])
    return out


def _margins(vocab, Ym, Yr, index, rest, D: int) -> np.ndarray:
    """:func:`decoding_margins` of one block of boxes (``rest``: an upper bound on
    Σ_{j ≥ d} y_j² over each box)."""
    d = vocab.shape[1]
    m, r = Ym[:, None, :d], Yr[:, None, :d]
    t = vocab[np.maximum(index, 0)][:, None, :]
    w = t - vocab[None]  # t − v, rounded
    aw = np.abs(w)
    form = (2 * (m * w - r * aw) + (vocab[None] ** 2 - t ** 2)).sum(axis=2)
    size = (2 * (np.abs(m) + r) * aw + vocab[None] ** 2 + t ** 2).sum(axis=2)
    err = rounding(size, 4 * d + 2)  # the form's own float64 rounding (w's included)
    far = ((np.abs(m - vocab[None]) + r) ** 2).sum(axis=2)  # |y − v|² over the box, at most
    near = ((np.abs(m - t) + r) ** 2).sum(axis=2)
    dist = up(far + rest[:, None], d + 2) + up(near + rest[:, None], d + 2)
    slack = up(err + rounding(dist, D + 1), 2)  # + both distances' rounding in the decoder
    margin = (form - slack) / (2 * np.sqrt((aw ** 2).sum(axis=2)))  # > 0: form > slack
    margin[np.arange(len(Ym)), np.maximum(index, 0)] = np.inf  # t itself
    margin[index < 0] = -np.inf
    return margin.min(axis=1)


def decoded_wrong(vocab: np.ndarray, outputs: np.ndarray, index: np.ndarray) -> int:
    """How many of ``outputs`` (k × D) the project's decoder does not decode to their targets
    (a witness that decoding fails)."""
    return int((nearest_rows(vocab, outputs) != index).sum())
