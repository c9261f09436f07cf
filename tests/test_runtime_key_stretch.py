"""Stretches of key layers in the runtime proofs (verification/runtime_keys.py,
docs/numerics.md#stretches-of-key-layers): a stretch enclosed at once holds every float32 and
TF32 evaluation of its layers, in the test's own summation orders, at points of every row's
box, whatever the rows (exact keys, keys at other scales, keys with a radius, rows that are no
key, keys held by units of two layers, moves that send a key to a later layer's key)."""

from __future__ import annotations

from itertools import product

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from test_runtime_proof import Pass

from exactformer.model import FF, Block, Transformer
from exactformer.verification import runtime_keys, runtime_proof
from exactformer.verification.formats import get_format


def key_model(rng, clears: bool):
    """Two to six residual key layers on Q = the first q of D coordinates (one κ, one bias
    −κ·(w − ½): the own unit at κ/2), each unit writing small multiples of ¼ elsewhere and,
    on Q, clearing its key (``clears``) or sending it to another code, which a later layer
    may hold; codes repeat across layers."""
    q, extra = int(rng.integers(2, 4)), int(rng.integers(1, 3))
    w = int(rng.integers(1, q + 1))
    codes = [np.array(c, dtype=float) for c in product((-1, 0, 1), repeat=q)
             if np.count_nonzero(c) == w]
    kappa = 2.0 ** int(rng.integers(-2, 3))
    bias = -kappa * (w - 0.5)
    blocks = []
    for _ in range(int(rng.integers(2, 7))):
        pick = rng.choice(len(codes), size=min(len(codes), int(rng.integers(2, 5))),
                          replace=False)
        U = np.zeros((len(pick), q + extra))
        W = np.zeros((q + extra, len(pick)))
        for u, k in enumerate(pick):
            U[u, :q] = kappa * codes[k]
            W[q:, u] = rng.integers(-8, 9, size=extra) / 4
            goal = np.zeros(q) if clears else codes[int(rng.integers(len(codes)))]
            W[:q, u] = (goal - codes[k]) / (kappa / 2)
        blocks.append(Block(FF(1.0, U, np.full(len(pick), bias), W), None))
    model = Transformer(d=q + extra, attention="hardmax", blocks=blocks, exact=False)
    return model, q, codes


def key_rows(rng, T: int, q: int, D: int, codes):
    """Rows keyed g·τ (g = 1 mostly, also ½ and 2), rows that are no key or 0 on Q, a few
    with a radius on Q or elsewhere; every midpoint a float32."""
    X = np.zeros((T, D))
    X[:, q:] = rng.integers(-16, 17, size=(T, D - q)) / 8
    R = np.zeros((T, D))
    for i in range(T):
        kind = rng.integers(6)
        if kind <= 2:
            X[i, :q] = codes[int(rng.integers(len(codes)))]
        elif kind == 3:
            X[i, :q] = codes[int(rng.integers(len(codes)))] * rng.choice([0.5, 2.0])
        elif kind == 4:
            X[i, :q] = rng.integers(-4, 5, size=q) / 4
        if rng.random() < 0.15:
            R[i, int(rng.integers(D))] = 2.0 ** -10
    return X, R


def inside_points(rng, Xm, Xr, k: int) -> list[np.ndarray]:
    """The midpoints, the two far corners (every float32 here: midpoints multiples of 1/8,
    radii 2^-10) and ``k`` random float32 points of the boxes (per row; a coordinate of
    radius 0 at its midpoint)."""
    out = [Xm, Xm + Xr, Xm - Xr]
    for _ in range(k):
        P = (Xm + Xr * rng.uniform(-1, 1, size=Xm.shape)).astype(np.float32).astype(float)
        out.append(np.where(np.abs(P - Xm) <= Xr, P, Xm))
    return out


def enclose(model, fmt, Xm, Xr):
    """The model's layers as one stretch on the boxes, and as layer after layer."""
    layers, _ = runtime_proof.prepare(model, fmt)
    (s,) = runtime_keys.stretches(layers, fmt).values()
    assert (s.start, s.end) == (0, len(model.blocks))
    whole = runtime_keys.apply_stretch(Xm, Xr, s, fmt, runtime_proof.ff_box)
    Ym, Yr = Xm, Xr
    for ff, _ in layers:
        Ym, Yr = runtime_proof.ff_box(Ym, Yr, ff, fmt)
    return whole, (Ym, Yr)


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1), clears=st.booleans(),
       runtime=st.sampled_from(["float32", "tf32"]))
def test_a_stretch_holds_every_pass_of_its_layers(seed, clears, runtime):
    rng = np.random.default_rng(seed)
    model, q, codes = key_model(rng, clears)
    Xm, Xr = key_rows(rng, 24, q, model.d, codes)
    (Ym, Yr), (Lm, Lr) = enclose(model, get_format(runtime), Xm, Xr)
    passes = [Pass("seq"), Pass("rev"), Pass("perm", seed=seed % 97), Pass(fma=True),
              Pass("pairwise"), Pass("columns", seed=1)]
    for p in passes:
        p.tf32 = runtime == "tf32"
    for X in inside_points(rng, Xm, Xr, 3):
        for p in passes:
            out = p.run(model, X)
            assert (np.abs(out - Ym) <= Yr).all(), (p.order, p.fma)
            assert (np.abs(out - Lm) <= Lr).all()


def test_a_clean_stretch_is_enclosed_in_one_layer_of_units():
    """Exact keys of weight w, each held by one unit of one layer, each move clearing its key:
    every row is decided by the lemma, the rows that move go through one enclosure of the
    units side by side and no row through the layers one by one; the boxes are points, the
    layer-by-layer ones."""
    rng = np.random.default_rng(7)
    q, w, kappa = 4, 2, 2.0
    codes = [np.array(c, dtype=float) for c in product((-1, 0, 1), repeat=q)
             if np.count_nonzero(c) == w]
    blocks = []
    for layer in range(len(codes) // 4):
        U, W = np.zeros((4, q + 2)), np.zeros((q + 2, 4))
        for u in range(4):
            U[u, :q] = kappa * codes[4 * layer + u]
            W[:q, u] = -codes[4 * layer + u] / (kappa / 2)
            W[q:, u] = rng.integers(-8, 9, size=2) / 4
        blocks.append(Block(FF(1.0, U, np.full(4, -kappa * (w - 0.5)), W), None))
    model = Transformer(d=q + 2, attention="hardmax", blocks=blocks, exact=False)
    Xm = np.zeros((len(codes) + 3, q + 2))
    Xm[:len(codes), :q] = codes
    Xr = np.zeros_like(Xm)
    calls = []

    def counted(*args):
        calls.append(len(args[0]))
        return runtime_proof.ff_box(*args)

    layers, _ = runtime_proof.prepare(model, get_format("float32"))
    (s,) = runtime_keys.stretches(layers, get_format("float32")).values()
    Ym, Yr = runtime_keys.apply_stretch(Xm, Xr, s, get_format("float32"), counted)
    assert calls == [4 * len(blocks)]
    (_, (Lm, Lr)) = enclose(model, get_format("float32"), Xm, Xr)
    assert not Yr.any() and np.array_equal(Ym, Lm) and not Lr.any()
    assert not Ym[:len(codes), :q].any()


def test_a_row_that_overflows_in_a_stretch_leaves_its_sequence_unknown():
    """A move that takes one row past float32's range in the stretch's first layer: the
    layouts' zero attention before the next FF multiplies that row's inf by 0, nan in every
    row of the sequence, so no row may keep a finite box. The stretch hands the layers back
    to the layer-by-layer pass, which says so."""
    U = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    W0 = np.array([[-2.0, 0.0], [0.0, -2.0], [3e38, 1.0]])  # (each clears its key)
    W1 = np.array([[0.0, 0.0], [0.0, 0.0], [1.0, 1.0]])
    blocks = [Block(FF(1.0, U, np.full(2, -0.5), W0), None),
              Block(FF(1.0, -U, np.full(2, -0.5), W1), None)]
    model = Transformer(d=3, attention="hardmax", blocks=blocks, exact=False)
    fmt = get_format("float32")
    layers, _ = runtime_proof.prepare(model, fmt)
    assert list(runtime_keys.stretches(layers, fmt)) == [0]
    X = np.array([[1.0, 0.0, 2.5e38], [0.0, 1.0, 1.0], [0.0, 0.0, 1.0]])
    (mid, rad), = runtime_proof.enclose_runtime(model, [X], fmt)
    assert np.isinf(rad).all()
    (mid, rad), = runtime_proof.enclose_runtime(model, [X[1:]], fmt)  # without it: finite
    assert np.isfinite(rad).all() and mid[0, 2] == 1.5 and mid[1, 2] == 1.0
