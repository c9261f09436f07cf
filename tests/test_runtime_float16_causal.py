"""Keyed causal models with attention, hardmax and softmax, are PROVED FAITHFUL IN float16 by
decoding (docs/numerics.md#decoding-to-a-vocabulary), where bfloat16 leaves them UNDECIDED.
The proofs are checked here by evaluations of the test's own: every value stored in float16
(NumPy's float16 conversion), every dot product accumulated in float32 in one of several
orders (reversed, a random permutation, a pairwise tree), softmax's exp, sum and
division in float32, a causal mask and the positions added; and by the exported torch and
ρ/η modules in float16. Each pass lies in the enclosure's boxes wherever they are finite and
decodes every constrained position to its target."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import exactformer as ef
from exactformer.tools.decode import nearest
from exactformer.verification.formats import get_format
from exactformer.verification.runtime_proof import enclose_runtime

F32 = np.float32
TEXTS = ["the cat sat.", "a dog ran!", "my cat ran."]


def _st(a) -> np.ndarray:
    """float16 store of a float32 (or float64 weight) array, as float32."""
    return np.asarray(np.asarray(a, dtype=np.float64), dtype=F32).astype(np.float16).astype(F32)


def _w(a) -> np.ndarray:
    return np.asarray(np.asarray(a, dtype=float), dtype=float)


class Half:
    """One evaluation: float16 stores, float32 accumulation in ``order``."""

    def __init__(self, order: str, seed: int = 0):
        self.order, self.rng = order, np.random.default_rng(seed)

    def dot(self, A, B, bias=None):
        A, B = _st(A), _st(B)
        terms = [A[:, j, None] * B[None, j, :] for j in range(A.shape[1])]
        if self.order == "rev":
            terms = terms[::-1]
        elif self.order == "perm":
            terms = [terms[i] for i in self.rng.permutation(len(terms))]
        if self.order == "pair":
            while len(terms) > 1:
                terms = [terms[i] + terms[i + 1] if i + 1 < len(terms) else terms[i]
                         for i in range(0, len(terms), 2)]
            acc = terms[0] if terms else np.zeros((A.shape[0], B.shape[1]), dtype=F32)
        else:
            acc = np.zeros((A.shape[0], B.shape[1]), dtype=F32)
            for t in terms:
                acc = acc + t
        out = _st(acc)
        return out if bias is None else _st(out + _st(bias))

    def run(self, model, x) -> np.ndarray:
        n = len(x)
        X = np.zeros((n, model.d))
        X[:, :x.shape[1]] = x
        X = _st(_st(X) + _st(_w(model.positions)[:n]))
        allowed = np.tril(np.ones((n, n), dtype=bool))
        for blk in model.blocks:
            if blk.ff is not None:
                f = blk.ff
                H = np.maximum(self.dot(X, _w(f.U).T, _w(f.b)), F32(0))
                X = _st(_st(_st(float(f.eta)) * X) + self.dot(H, _w(f.W).T))
            if blk.sa is not None and not blk.sa.is_identity():
                out = _st(_st(float(blk.sa.rho)) * X)
                for h in blk.sa.heads:
                    S = _st(self.dot(X, _w(h.A.c)[:, None]) * self.dot(X, _w(h.A.a)[:, None]).T)
                    if float(h.A.alpha) != 0:
                        S = _st(S + _st(_st(float(h.A.alpha)) * self.dot(X, X.T)))
                    S = np.where(allowed, S, -np.inf).astype(F32)
                    if model.attention == "hardmax":
                        hit = (S == S.max(axis=1, keepdims=True)).astype(F32)
                        P = _st(hit / _st(hit.sum(axis=1, keepdims=True)))
                    else:
                        e = np.exp(S - S.max(axis=1, keepdims=True)).astype(F32)
                        P = _st(e / e.sum(axis=1, keepdims=True, dtype=F32))
                    Y = self.dot(P, X)
                    out = _st(out + _st(_st(float(h.V.beta)) * Y))
                    out = _st(out + _st(self.dot(Y, _w(h.V.q)[:, None]) * _st(_w(h.V.p))))
                X = out
        return X.astype(np.float64)


def _exported(model, xs) -> list:
    torch = pytest.importorskip("torch")
    from exactformer import export as et

    return [et.apply(et.to_torch(model, dtype=torch.float16, ff="dense"), xs),
            et.apply(et.to_rho_eta(model, dtype=torch.float16), xs)]


@pytest.mark.parametrize("attention", ["hardmax", "softmax"])
def test_float16_decoding_proofs_of_keyed_causal_models_hold(attention):
    data = ef.CausalDataset.from_text(TEXTS)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        model = ef.compile(data, attention=attention).to_float()
    v = ef.prove_runtime(model, data, "float16")
    assert v.ok and v.criterion == "decoding", v.table()
    xs, ys = data.floats()
    boxes = enclose_runtime(model, xs, get_format("float16"))
    passes = [[Half(order, seed).run(model, np.asarray(x, dtype=float)) for x in xs]
              for order, seed in [("rev", 0), ("pair", 0), ("perm", 1)]]
    passes += _exported(model, xs)
    for outs in passes:
        for out, (m, r), y, k in zip(outs, boxes, ys, data.known, strict=True):
            fin = np.isfinite(r)
            assert (np.abs(out - m) <= r)[fin].all()
            for i in np.flatnonzero(k):
                assert nearest(data.vocabulary, out[i]) == nearest(data.vocabulary, y[i])
