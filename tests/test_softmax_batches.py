"""Softmax heads of float64 passes evaluated in batches of equal-length sequences
(evaluate/attention._float_softmax): every midpoint and radius is bitwise the one that the
same kernels give each sequence alone, so batching changes no verdict (docs/numerics.md
#softmax-averages-in-the-enclosures)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from exactformer.evaluate import attention
from exactformer.evaluate.arithmetic import Arithmetic, PassStats
from exactformer.evaluate.causal_radius import causal_head_average
from exactformer.evaluate.head_radius import score_error
from exactformer.evaluate.softmax_radius import softmax_box, tail_weight
from exactformer.evaluate.state import RowState


def _state(seed: int, track: bool, merged: bool = True) -> RowState:
    """Sequences of lengths 1 to 5 (several of each), points on a coarse grid plus noise, some
    rows huge (their scores overflow to inf and nan), radii with zeros and an inf, and
    multiplicities 1 to 3 (``merged``; else 1, as in a causal pass)."""
    rng = np.random.default_rng(seed)
    d = int(rng.integers(1, 4))
    lengths = rng.choice([1, 2, 3, 5], size=int(rng.integers(1, 12)))
    inputs = [rng.integers(-4, 5, size=(n, d)) / 4 + rng.normal(0, 1e-3, (n, d))
              for n in lengths]
    for x in inputs:
        if rng.random() < 0.2:
            x[rng.integers(len(x))] = 1e200 * rng.choice([-1.0, 1.0])
    rad = None
    if track:
        rad = [np.where(rng.random(x.shape) < 0.5, 0.0, rng.random(x.shape) * 1e-6)
               for x in inputs]
        if rng.random() < 0.2:
            rad[0][0, 0] = np.inf
    st = RowState(inputs, Arithmetic("float"), rad)
    if merged:
        st.cnt = rng.integers(1, 4, len(st.seq))
    return st


def _per_sequence(st: RowState, A, q, tau, causal=False):
    """The reference: each sequence alone (B = 1), scores as np.outer and X @ X.T; ``causal``:
    row i over the keys l ≤ i, as causal_radius.causal_softmax_box (every row of weight 1)."""
    P, rad, w = st.P, st.rad, st.weights()
    (qa, q_rad), (ka, k_rad) = (attention._dot(st, v, {}) for v in (A.c, A.a))
    C, C_rad = (P, rad) if q is None else attention._dot(st, q, {})
    if q is not None:
        C, C_rad = C[:, None], None if rad is None else C_rad[:, None]
    out, out_rad = np.empty(C.shape), np.empty(C.shape)
    for s, e in st.segments():
        S = np.outer(qa[s:e], ka[s:e])
        if A.alpha != 0:
            S = S + (P[s:e] @ P[s:e].T) * A.alpha
        if causal:
            Sm = np.where(np.tri(e - s, dtype=bool), S, -np.inf)
            Z = (Sm - Sm.max(axis=1)[:, None]) / tau
        else:
            Z = S - S.max(axis=1)[:, None]
            Z = Z / tau if tau != 1 else Z
        out[s:e] = attention.softmax_average(Z, C[s:e], st.ar, w[s:e][None, :])
        if rad is not None:
            E = score_error(P[s:e], rad[s:e], qa[s:e], q_rad[s:e], ka[s:e], k_rad[s:e],
                            A.alpha)
            out[s:e], out_rad[s:e] = softmax_box(out[s:e], S, E, w[s:e], tau, C[s:e],
                                                 C_rad[s:e], causal)
    return out, None if rad is None else out_rad


@pytest.mark.parametrize("seed", range(40))
def test_batched_softmax_heads_are_bitwise_the_per_sequence_ones(seed, monkeypatch):
    """Midpoints and radii of the tracking pass, and the plain pass's averages, with batches
    of a few scores each (so one length spans several batches) and of the default size;
    every fourth seed a causal tracking pass (causal_radius.causal_head_average)."""
    rng = np.random.default_rng(10_000 + seed)
    causal = seed % 4 == 3
    track = bool(seed % 2)
    st = _state(seed, track, merged=not causal)
    d = st.P.shape[1]
    A = SimpleNamespace(c=rng.normal(0, 30, d), a=rng.normal(0, 1, d),
                        alpha=float(rng.choice([0.0, 0.125, -2.0, 1.0])))
    q = None if seed % 3 else rng.normal(0, 1, d)
    tau = float(rng.choice([1.0, 0.5, 3.0]))
    want = _per_sequence(st, A, q, tau, causal)
    average = causal_head_average if causal else attention.head_average
    for batch in (attention.BATCH, 30):
        monkeypatch.setattr(attention, "BATCH", batch)
        got = average(st, A, q, "softmax", tau, PassStats(), {})
        for g, w_ in zip(got, want, strict=True):
            assert (g is None) == (w_ is None)
            if g is not None:
                assert g.shape == w_.shape and g.tobytes() == w_.tobytes()


@pytest.mark.parametrize("causal", [False, True])
def test_tail_weight_and_boxes_of_a_batch_are_those_of_each_sequence(causal):
    """tail_weight and softmax_box on B × n × n scores (inf and nan among them, error bounds
    with zeros and inf) give each sequence's own best keys, certificates, W and boxes."""
    rng = np.random.default_rng(7)
    B, n, k = 6, 4, 2
    S = rng.normal(0, 20, (B, n, n))
    S[0, 1, 2], S[1, 0, 0], S[2, 3, 1] = np.inf, np.nan, -np.inf
    E = np.where(rng.random((B, n, n)) < 0.3, 0.0, rng.random((B, n, n)))
    E[3, 2, 2] = np.inf
    w = rng.integers(1, 4, (B, n)).astype(float)
    C = rng.normal(0, 1, (B, n, k))
    C_rad = np.where(rng.random((B, n, k)) < 0.3, 0.0, rng.random((B, n, k)) * 1e-3)
    C[4, 0, 0] = np.nan
    avg = rng.normal(0, 1, (B, n, k))
    for tau in (1.0, 0.5):
        many = tail_weight(S, E, w, tau, causal), softmax_box(avg, S, E, w, tau, C, C_rad, causal)
        for b in range(B):
            one = tail_weight(S[b], E[b], w[b], tau, causal), \
                softmax_box(avg[b], S[b], E[b], w[b], tau, C[b], C_rad[b], causal)
            for got, want in zip((*many[0], *many[1]), (*one[0], *one[1]), strict=True):
                assert got[b].tobytes() == np.ascontiguousarray(want).tobytes()
