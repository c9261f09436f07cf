"""verify end to end on hand-made models, judged by evaluators written here: softmax in
mpmath at 2000 bits with every weight kept (set and causal data, equal-length sequences whose
float64 heads run in batches, cut to a few scores each so one length spans several batches;
rows merged by a ReLU collapse, huge and tiny tokens, τ from 10^-3 to 10, stored positions),
and gated layers (evaluate/gates.py) in Fractions, hardmax and softmax, rational and float64,
biases at and around the keys' thresholds. Targets are the model's own float64 (or exact)
outputs, so an enclosure that is too small, a batch that leaks into another sequence or a
gate that skips a unit that is on shows as an OK or PROVED EXACT that the evaluators refute.
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from fractions import Fraction

import mpmath
import numpy as np
import pytest

import exactformer as ef
from exactformer.evaluate import attention
from exactformer.model import FF, SA, Block, Head, ScoreMatrix, Transformer, ValueMatrix


def _num(v):
    f = v if isinstance(v, Fraction) else Fraction(float(v))
    return mpmath.mpf(f.numerator) / f.denominator


def _dot(u, v):
    return mpmath.fsum(a * b for a, b in zip(u, v, strict=True))


def reference(model: Transformer, x, exact: bool = False) -> list:
    """Every token through every layer: Fractions when ``exact`` (hardmax), else mpmath;
    softmax weights e^((s − max)/τ) of every key, hardmax the mean over the exact argmax set;
    causal rows over their prefix; positions added first."""
    num = Fraction if exact else _num
    zero = Fraction(0) if exact else mpmath.mpf(0)
    X = [[num(v) for v in row] for row in np.asarray(x, dtype=object)]
    if model.positions is not None:
        X = [[u + num(v) for u, v in zip(r, p, strict=True)]
             for r, p in zip(X, model.positions, strict=False)]
    tau = num(model.tau) if model.tau is not None else 1
    for blk in model.blocks:
        if blk.ff is not None:
            ff = blk.ff
            U = [[num(v) for v in r] for r in np.asarray(ff.U, dtype=object)]
            W = [[num(v) for v in r] for r in np.asarray(ff.W, dtype=object)]
            b, eta = [num(v) for v in ff.b], num(ff.eta)
            out = []
            for t in X:
                h = [max(zero, sum((a * c for a, c in zip(u, t, strict=True)), zero) + bk)
                     for u, bk in zip(U, b, strict=True)]
                out.append([eta * t[k] + sum((W[k][i] * h[i] for i in range(len(h))), zero)
                            for k in range(len(t))])
            X = out
        if blk.sa is not None:
            X = _attend(blk.sa, X, tau, model, num, zero)
    return X


def _attend(sa, X, tau, model, num, zero):
    out = [[num(sa.rho) * v for v in t] for t in X]
    for h in sa.heads:
        al, a, c = num(h.A.alpha), [num(v) for v in h.A.a], [num(v) for v in h.A.c]
        be, p, q = num(h.V.beta), [num(v) for v in h.V.p], [num(v) for v in h.V.q]
        ka = [sum((u * t for u, t in zip(a, x, strict=True)), zero) for x in X]
        qa = [sum((u * t for u, t in zip(c, x, strict=True)), zero) for x in X]
        for i, xi in enumerate(X):
            keys = range(i + 1) if model.causal else range(len(X))
            s = [qa[i] * ka[l] + al * sum((u * t for u, t in zip(xi, X[l], strict=True)), zero)
                 for l in keys]
            top = max(s)
            if model.attention == "hardmax":
                wts = [1 if v == top else 0 for v in s]
            else:
                wts = [mpmath.exp((v - top) / tau) for v in s]
            tot = sum(wts)
            avg = [sum((wt * X[l][k] for wt, l in zip(wts, keys, strict=True)), zero) / tot
                   for k in range(len(xi))]
            qy = sum((u * t for u, t in zip(q, avg, strict=True)), zero)
            for k in range(len(avg)):
                out[i][k] += be * avg[k] + p[k] * qy
    return out


def _sq(u, v):
    return sum(((a - b) ** 2 for a, b in zip(u, v, strict=True)), 0 * u[0])


def hausdorff_sq(O, Y):
    exact = isinstance(O[0][0], Fraction)
    Y = [[(v if isinstance(v, Fraction) else Fraction(float(v))) if exact else _num(v)
          for v in y] for y in Y]
    return max(max(min(_sq(o, y) for y in Y) for o in O),
               max(min(_sq(o, y) for o in O) for y in Y))


def _rnd(rng, shape, scale=1.0):
    v = rng.normal(0, 1, shape) * scale
    return np.round(v * 4) / 4 if rng.random() < 0.3 else v


def softmax_model(rng, d: int) -> Transformer:
    """1-2 blocks: an FF (η ∈ {1, 0, ½, −1}, or the collapse relu(x + b) that merges rows),
    then 1-2 softmax heads of sharpness up to 10^3 (α ∈ {0, ⅛, 1, −2, 3}, V = β·I or p·qᵀ)."""
    blocks = []
    for _ in range(int(rng.integers(1, 3))):
        ff = None
        if rng.random() < 0.6:
            w = int(rng.integers(1, 4))
            ff = FF(float(rng.choice([1.0, 0.0, 0.5, -1.0])), _rnd(rng, (w, d)), _rnd(rng, w),
                    _rnd(rng, (d, w)))
            if rng.random() < 0.3:
                ff = FF(0.0, np.eye(d), _rnd(rng, d, 0.5), np.eye(d))
        heads = []
        for _ in range(int(rng.integers(1, 3))):
            A = ScoreMatrix(float(rng.choice([0.0, 0.0, 1.0, -2.0, 0.125, 3.0])), _rnd(rng, d),
                            _rnd(rng, d, float(rng.choice([1, 10, 100, 1000]))))
            V = ValueMatrix(float(rng.choice([1.0, 0.5])), np.zeros(d), np.zeros(d)) \
                if rng.random() < 0.5 else \
                ValueMatrix(float(rng.choice([1.0, 0.0])), _rnd(rng, d), _rnd(rng, d))
            heads.append(Head(A, V))
        blocks.append(Block(ff, SA(float(rng.choice([0.0, 1.0, 0.5])), heads=heads)))
    return Transformer(d, "softmax", blocks, tau=float(rng.choice([1.0, 0.5, 3.0, 1e-3, 10.0])),
                       exact=False)


def _inputs(rng, d: int, n: int, N: int) -> list:
    """N sequences of n distinct tokens (mostly; some of other lengths), no two equal as
    sets; now and then a huge token or a tiny scale."""
    vocab = np.unique(_rnd(rng, (8, d)), axis=0)
    r = rng.random()
    if r < 0.15:
        vocab[rng.integers(len(vocab))] *= float(rng.choice([1e100, 1e150]))
    elif r < 0.3:
        vocab = vocab * float(rng.choice([1e-300, 1e-160, 1e150]))
    xs, seen = [], set()
    for _ in range(N):
        m = min(len(vocab), n if rng.random() < 0.8 else int(rng.integers(1, 5)))
        x = vocab[rng.choice(len(vocab), size=m, replace=False)]
        key = frozenset(map(tuple, x.tolist()))
        if key not in seen:
            seen.add(key)
            xs.append(x)
    return xs


def _limit(report, tol) -> Fraction:
    return Fraction(tol) * Fraction(report.to_dict()["coordinate_scale"])


def _check(report, worst_sq, tol) -> None:
    """An OK must hold against the reference, a proof exactly (mpmath: to 10^-600)."""
    if report.proved:
        assert worst_sq <= (mpmath.mpf(10) ** -600 * _num(report.to_dict()["coordinate_scale"])
                            ) ** 2 if isinstance(worst_sq, mpmath.mpf) else worst_sq == 0
    if report.ok:
        lim = _limit(report, tol)
        assert worst_sq <= (lim * lim if isinstance(worst_sq, Fraction) else
                            _num(lim) ** 2 * (1 + mpmath.mpf(10) ** -6))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seed", [1, 2, *range(4, 14)])
def test_softmax_verdicts_hold_against_mpmath(seed, causal, monkeypatch):
    monkeypatch.setattr(attention, "BATCH", 20)
    rng = np.random.default_rng(700 + seed)
    d = int(rng.integers(2, 5))
    model = softmax_model(rng, d)
    xs = _inputs(rng, d, int(rng.integers(1, 5)), int(rng.integers(2, 7)))
    if causal:
        model = replace(model, causal=True, positions=_rnd(rng, (8, d)) if seed % 2 else None)
    tol = float(rng.choice([1e-9, 1e-4, 1e-14]))
    with np.errstate(all="ignore"):
        ys = ef.forward(model, xs)
    if not all(np.isfinite(y).all() for y in ys):
        return
    with mpmath.workprec(2000):
        true = [reference(model, x) for x in xs]
        if causal:
            targets = [[list(r) if k % 3 else None for k, r in enumerate(y)] for y in ys]
            try:
                data = ef.CausalDataset.from_arrays(xs, targets)
            except ef.DatasetError:  # (a sequence with no constrained position, say)
                return
            report = ef.verify(model, data, tolerance=tol)
            worst = max([mpmath.mpf(0), *(_sq(o, [_num(v) for v in t])
                                          for tr, tg in zip(true, targets, strict=True)
                                          for o, t in zip(tr, tg, strict=True)
                                          if t is not None)])
        else:
            ys = [np.unique(y, axis=0) for y in ys]
            report = ef.verify(model, ef.Dataset.from_arrays(xs, ys), tolerance=tol)
            worst = max(hausdorff_sq(t, y) for t, y in zip(true, ys, strict=True))
        _check(report, worst, tol)


WORDS = [np.array(t) for t in itertools.product([-1, 0, 1], repeat=3)]


def gated_model(rng, exact: bool, attention_kind: str) -> Transformer:
    """d = 6: a key on coordinates 0-2 (weight-2 words, κ per unit, some of them different),
    a rest on 3-4, coordinate 5 written; biases at the threshold −κ·g·(w − 1) − r, one
    rounding off it either way, or 2^-40 off; a rank-one head mixing the rows."""
    num = Fraction if exact else float
    g0 = float(rng.choice([1.0, 2.0, 0.5]))
    words = [t for t in WORDS if np.count_nonzero(t) == 2]
    blocks = []
    for _ in range(int(rng.integers(1, 3))):
        h = int(rng.integers(1, 3))
        U, b, W = (np.full(s, num(0), dtype=object) for s in ((h, 6), (h,), (6, h)))
        for k, i in enumerate(rng.choice(len(words), size=h, replace=False).tolist()):
            kappa = num(float(rng.choice([1, 2, 0.5, 3, 0.1, 7])))
            U[k, :3] = [kappa * int(v) for v in words[i]]
            U[k, 3:5] = [num(float(v)) for v in np.round(rng.normal(0, 1, 2) * 4) / 8]
            off = float(rng.choice([0.0, 0.25, -0.25, 1.0]))
            step = float(rng.choice([0.0, 2.0 ** -40, -(2.0 ** -40), 2.0 ** -52, 2.0 ** -60]))
            b[k] = -kappa * num(g0) - num(off) + num(step)
            W[5, k] = num(float(rng.choice([1.0, -1.0, 0.5])))
        ff = FF(num(1), *(a if exact else a.astype(float) for a in (U, b, W)))
        a, c, p = np.zeros(6), np.zeros(6), np.zeros(6)
        a[int(rng.integers(3, 6))], c[int(rng.integers(0, 6))] = 1.0, 1.0
        p[int(rng.integers(0, 6))] = float(rng.choice([0.5, 1e-3]))
        blk = Block(ff, SA(1.0, ScoreMatrix(0.0, a, c), ValueMatrix(0.0, p, np.eye(6)[5])))
        if exact:
            blk.sa = blk.sa.converted(Fraction, lambda v: np.array(
                [Fraction(float(t)) for t in v], dtype=object))
        blocks.append(blk)
    tau = (Fraction(1) if exact else 1.0) if attention_kind == "softmax" else None
    return Transformer(6, attention_kind, blocks, tau=tau, exact=exact)


@pytest.mark.parametrize("seed", range(16))
def test_gated_verdicts_hold_against_fractions(seed):
    rng = np.random.default_rng(900 + seed)
    exact = seed % 2 == 0
    kind = "softmax" if seed % 4 == 3 else "hardmax"
    model = gated_model(rng, exact, kind)
    xs = []
    for _ in range(int(rng.integers(2, 5))):
        rows = set()
        while len(rows) < 8:
            word = WORDS[int(rng.integers(len(WORDS)))] * float(rng.choice([1.0, 2.0, 0.5]))
            rows.add((*word.tolist(), *(np.round(rng.normal(0, 1, 2) * 4) / 4).tolist(), 0.0))
        xs.append(np.array(sorted(rows)))
    ys = ef.forward(model, xs, arithmetic="exact" if exact else "float")
    ys = [np.array(list(dict.fromkeys(map(tuple, np.asarray(y).tolist()))),
                   dtype=np.asarray(y).dtype) for y in ys]
    report = ef.verify(model, ef.Dataset.from_arrays(xs, ys))
    with mpmath.workprec(2000):
        worst = max(hausdorff_sq(reference(model, x, exact=kind == "hardmax"), y)
                    for x, y in zip(xs, ys, strict=True))
    _check(report, worst, 1e-9)
