"""Window–flip pairs in the runtime proofs (verification/runtime_windows.py,
docs/numerics.md#window-flip-pairs-in-the-proofs): a far row holds the window's units off and
gets its slot cleared at the flip. The boxes must hold every evaluation of the two layers in
the test's own orders: float32 (test_runtime_proof's Pass) and, written here, bfloat16 and
float16 storage with float32 accumulation, on rows placed just inside and just outside the
window's reach (ω·|u·x + b| within a few ulps of 1) and slots that are not 0."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_runtime_proof import Pass

from exactformer.model import FF, Block, Transformer
from exactformer.verification import runtime_proof, runtime_windows
from exactformer.verification.formats import get_format

torch = pytest.importorskip("torch")

REACH = [-1e-3, -2.0 ** -10, -2.0 ** -20, 0.0, 2.0 ** -20, 2.0 ** -12, 2.0 ** -9, 1e-3, 0.5, 3.0]


def window_model(rng, d: int, generic: bool):
    """Columns: d token coordinates, two slots d and d + 1, one column a third unit writes.
    Block 0: two windows ω·relu(u·x + b) + ω·relu(−u·x − b), one on each slot, with a unit
    reading x between them; block 1: the two flips slot − relu(slot) + relu(1 − slot), in
    another order, with a unit reading x. Returns the model and (u, b, ω, slot) per window."""
    D = d + 3
    windows = []
    for k in (d, d + 1):
        u = rng.standard_normal(d) if generic else rng.integers(-4, 5, d) / 4.0
        u[0] = 1.5 if not u.any() else u[0]
        b = float(rng.standard_normal()) if generic else float(rng.integers(-8, 9)) / 8
        omega = float(rng.choice([1.0, 4.0, 0.75, 2.5])) * (1 + generic * rng.random())
        windows.append((u, b, omega, k))
    third = np.r_[rng.standard_normal(d), 0, 0, 0]
    U0, b0, W0 = [], [], np.zeros((D, 5))
    for n, (u, b, omega, k) in enumerate(windows):
        U0 += [np.r_[u, 0, 0, 0], -np.r_[u, 0, 0, 0]]
        b0 += [b, -b]
        W0[k, [3 * n, 3 * n + 1]] = omega
        if n == 0:
            U0.append(third)
            b0.append(-0.5)
    W0[d + 2, 2] = 0.5
    e = np.eye(D)
    U1 = np.stack([e[d], -e[d], third, -e[d + 1], e[d + 1]])
    W1 = np.stack([-e[d], e[d], 0.25 * e[d + 2], e[d + 1], -e[d + 1]], axis=1)
    blocks = [Block(FF(1.0, np.stack(U0), np.array(b0), W0), None),
              Block(FF(1.0, U1, np.array([0.0, 1.0, 0.25, 1.0, 0.0]), W1), None)]
    return Transformer(d=D, attention="hardmax", blocks=blocks, exact=False), windows


def rows_at_reach(rng, windows, d: int) -> np.ndarray:
    """Per window, rows whose ω·|u·x + b| is 1 + ε for each ε of REACH (either sign), with a
    slot of 0, of a small positive value or of −1/4; and a few random rows."""
    out = []
    for u, b, omega, k in windows:
        for eps in REACH:
            for sign in (1.0, -1.0):
                x0 = rng.standard_normal(d)
                z = sign * (1 + eps) / omega
                row = np.zeros(d + 3)
                row[:d] = x0 + (z - (u @ x0 + b)) * u / (u @ u)
                row[k] = rng.choice([0.0, 0.0, 2.0 ** -rng.integers(1, 30), -0.25])
                out.append(row)
    out += [np.r_[rng.standard_normal(d) * 3, 0.0, 0.0, 0.0] for _ in range(6)]
    return np.array(out).astype(np.float32).astype(np.float64)


def far_of(monkeypatch) -> list:
    """The far rows each opened pair gets, as the rows themselves."""
    seen, real = [], runtime_windows.far_rows

    def spy(Xm, *args):
        fars = real(Xm, *args)
        seen.extend(Xm[far] for far in fars)
        return fars

    monkeypatch.setattr(runtime_windows, "far_rows", spy)
    return seen


def round_to(x, runtime: str) -> np.ndarray:
    """x (float64 or float32) rounded to nearest in the runtime's storage format."""
    t = torch.tensor(np.asarray(x, dtype=np.float32))
    dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}[runtime]
    return t.to(dtype).to(torch.float32).numpy().astype(np.float32)


def low_precision_pass(model, X, runtime: str, rng) -> np.ndarray:
    """The dense layers with every stored value (inputs, weights, pre-activations, the FF's
    sum and the residual sum) in the format and every dot product summed in float32 in a
    random order, the bias a term among the others."""
    H = round_to(X, runtime)
    for blk in model.blocks:
        ff = blk.ff
        U, b, W = (round_to(a, runtime) for a in (ff.U, ff.b, ff.W))
        Z = np.empty((len(H), len(b)), dtype=np.float32)
        for i in range(len(H)):
            for j in range(len(b)):
                terms = [*(H[i] * U[j]), b[j]]
                Z[i, j] = _sum32([terms[t] for t in rng.permutation(len(terms))])
        A = np.maximum(round_to(Z, runtime), np.float32(0))
        out = np.empty_like(H)
        for i in range(len(H)):
            for c in range(H.shape[1]):
                terms = list(A[i] * W[c])
                h = round_to(_sum32([terms[t] for t in rng.permutation(len(terms))]), runtime)
                out[i, c] = round_to(np.float32(H[i, c] + h), runtime)
        H = out
    return H.astype(np.float64)


def _sum32(terms) -> np.float32:
    acc = np.float32(0)
    for t in terms:
        acc = np.float32(acc + np.float32(t))
    return acc


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1), d=st.integers(2, 5), generic=st.booleans(),
       runtime=st.sampled_from(["float32", "bfloat16", "float16"]))
def test_a_pair_holds_every_evaluation_of_its_two_layers(seed, d, generic, runtime):
    rng = np.random.default_rng(seed)
    model, windows = window_model(rng, d, generic)
    X = rows_at_reach(rng, windows, d)
    fmt = get_format(runtime)
    with pytest.MonkeyPatch.context() as mp:
        far = far_of(mp)
        (mid, rad), = runtime_proof.enclose_runtime(model, [X], fmt)
    assert len(far) == 2  # both pairs were taken
    if runtime == "float32":
        passes = [Pass("seq"), Pass("rev"), Pass("perm", seed=seed % 89), Pass(fma=True),
                  Pass("columns", seed=3)]
        outs = [p.run(model, X) for p in passes]
    else:
        outs = [low_precision_pass(model, X, runtime, np.random.default_rng(s))
                for s in range(3)]
    for out in outs:
        assert (np.abs(out - mid) <= rad).all()


def test_rows_well_outside_the_window_are_far_and_their_slot_proved_zero(monkeypatch):
    """In float32, a row with ω·|u·x + b| ≥ 1.5 and slot 0 is far: its slot leaves the flip
    as an exact 0 (radius 0) without either layer's pair units enclosed at it."""
    rng = np.random.default_rng(7)
    model, windows = window_model(rng, 3, generic=True)
    X = rows_at_reach(rng, windows, 3)
    far = far_of(monkeypatch)
    (mid, rad), = runtime_proof.enclose_runtime(model, [X], get_format("float32"))
    for (u, b, omega, k), rows in zip(windows, far, strict=True):
        clear = np.flatnonzero((np.abs(X[:, :3] @ u + b) * omega >= 1.5) & (X[:, k] == 0))
        assert len(clear) >= 4
        assert {tuple(x) for x in X[clear]} <= {tuple(x) for x in rows}
        assert (mid[clear, k] == 0).all() and (rad[clear, k] == 0).all()


def test_tf32_takes_no_pair():
    """TF32 cuts the flip's input to 11 bits: v − relu(v) need not be 0."""
    model, _ = window_model(np.random.default_rng(1), 3, generic=True)
    layers, _ = runtime_proof.prepare(model, get_format("tf32"))
    assert runtime_windows.runtime_pairs(layers, get_format("tf32"), set()) == {}
    layers, _ = runtime_proof.prepare(model, get_format("float32"))
    assert list(runtime_windows.runtime_pairs(layers, get_format("float32"), set())) == [0]
