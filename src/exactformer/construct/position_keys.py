"""Position keys: causal models that look their targets up by position, one ReLU per move.

When every position index has at most one constrained point (a single text, or texts that
agree wherever they are constrained), no separation is needed and each constrained position i
can be moved by a **key unit** instead of a hat. The model gets q coordinates of its own
(d_model = d + q; the data are read zero-padded, docs/causal.md#position-keys): position i
stores c·σ_i there, σ_i a distinct vector of {−1, 0, 1}^q with exactly w nonzero entries and
c a power of two near the data's scale. The unit of position i is

    relu(σ_i·z_key − c·(w − 1/2))·(target − token, −c·σ_i)/(c/2),

whose pre-activation is c/2 at position i and at most −c/2 at every other key (σ_i·σ_l ≤
w − 1 for distinct vectors of weight w) and at −c·(w − 1/2) on a point with no key (a placed
target, an unconstrained position). So each unit fires for its own position alone and writes
its target with the key coordinates set to 0; every other token passes the layer **bit for
bit** in any floating-point format (the pre-activations are small integers times powers of
two, and an inactive ReLU adds exactly 0). Width w units move w positions per layer.
"""

from __future__ import annotations

import math
from fractions import Fraction
from itertools import combinations

import numpy as np

from ..model import Block
from ..numbers import num, safe_floats, zeros
from .gadgets import balanced_ff
from .generic import ConstructionError


def keyed_positions(xs, ys, known) -> list[tuple[np.ndarray, np.ndarray] | None] | None:
    """Per position index, the (token, target) of its constrained contexts, or None where no
    sequence constrains it; None overall when some position has two different constrained
    (token, target) pairs, which a lookup by position cannot serve."""
    n = max(len(x) for x in xs)
    found: list = [None] * n
    for x, y, k in zip(xs, ys, known, strict=True):
        for i in np.flatnonzero(k).tolist():
            pair = (x[i], y[i])
            if found[i] is None:
                found[i] = pair
            elif not (np.array_equal(found[i][0], x[i]) and np.array_equal(found[i][1], y[i])):
                return None
    return found


def code_size(n: int) -> tuple[int, int]:
    """(q, w): the fewest coordinates q, and then the smallest weight w, such that
    {−1, 0, 1}^q holds at least n vectors with exactly w nonzero entries (C(q, w)·2^w)."""
    q = 1
    while True:
        for w in range(1, q + 1):
            if math.comb(q, w) << w >= n:
                return q, w
        q += 1


def code_words(n: int, q: int, w: int) -> np.ndarray:
    """The first n vectors of {−1, 0, 1}^q of weight w (supports in lexicographic order, then
    sign patterns), as an n×q int8 array."""
    signs = 1 - 2 * ((np.arange(1 << w)[:, None] >> np.arange(w)[None, :]) & 1)
    out = np.zeros((n, q), dtype=np.int8)
    k = 0
    for support in combinations(range(q), w):
        take = min(len(signs), n - k)
        out[k:k + take, list(support)] = signs[:take]
        k += take
        if k == n:
            break
    return out


def key_scale(tokens: np.ndarray, exact: bool):
    """c: the largest power of two at most the data's largest |coordinate| (1 for zero data),
    so that keys and tokens have comparable sizes."""
    top = float(np.abs(safe_floats(tokens)).max(initial=0.0))  # inf beyond float64
    k = math.frexp(top)[1] - 1 if 0 < top < math.inf else 0
    return num(Fraction(2) ** k, exact)


def build_keys(found: list, d: int, width: int, exact: bool
               ) -> tuple[np.ndarray, list[Block], tuple[int, int, object]]:
    """The positions (n × (d + q)) and the FF-only blocks of a keyed model, ``width`` key units
    to a layer, in position order; also (q, w, c) for the record."""
    keyed = [i for i, p in enumerate(found) if p is not None]
    if not keyed:
        raise ConstructionError("no position has a target: nothing to build")
    q, w = code_size(len(keyed))
    dtype = object if exact else float
    X = np.array([found[i][0] for i in keyed], dtype=dtype)
    Y = np.array([found[i][1] for i in keyed], dtype=dtype)
    c = key_scale(np.concatenate([X, Y]), exact)
    keys = code_words(len(keyed), q, w).astype(np.int64)
    if exact:
        keys = np.vectorize(Fraction, otypes=[object])(keys)
    else:
        keys = keys.astype(float)
    P = zeros((len(found), d + q), exact)
    P[keyed, d:] = keys * c
    U = np.concatenate([zeros((len(keyed), d), exact), keys], axis=1)
    bias = -c * (w - Fraction(1, 2)) if exact else -c * (w - 0.5)
    W = np.concatenate([(Y - X) / (c / 2), keys * -2], axis=1)
    one = num(1, exact)
    blocks = [Block(balanced_ff(U[s:s + width], np.full(len(U[s:s + width]), bias, dtype=dtype),
                                W[s:s + width].T.copy(), one, exact), None)
              for s in range(0, len(keyed), width)]
    return P, blocks, (q, w, c)
