"""The model IR: feed-forward and self-attention layers with structured matrices.

A block is x ↦ SA(FF(x)). ``None`` for a layer means the identity. Parameters are Fractions
(exact models) or floats (float64 models); the arrays are object or float64 NumPy arrays.

* FF(x) = η·x + W·relu(U·x + b), U ∈ R^{w×d}, b ∈ R^w, W ∈ R^{d×w}.
* SA_i(X) = ρ·x_i + V·Σ_l π_il x_l with scores s_il = α⟨x_i, x_l⟩ + (c·x_i)(a·x_l), i.e.
  A = α·I + a·cᵀ, and V·y = β·y + p·(q·y), i.e. V = β·I + p·qᵀ.

See docs/architecture.md.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from .numbers import as_number_array
from .record import CausalConstruction, Construction


@dataclass
class FF:
    """Feed-forward layer FF(x) = η·x + W·relu(U·x + b)."""

    eta: object
    U: np.ndarray
    b: np.ndarray
    W: np.ndarray

    @property
    def width(self) -> int:
        return self.U.shape[0]

    def n_params(self) -> int:
        w, d = self.U.shape
        return w * (2 * d + 1) + 1

    def converted(self, scalar, array) -> FF:
        return FF(scalar(self.eta), array(self.U), array(self.b), array(self.W))


@dataclass
class ScoreMatrix:
    """The attention matrix A = α·I + a·cᵀ: s_il = ⟨A x_i, x_l⟩ = α⟨x_i, x_l⟩ + (c·x_i)(a·x_l)."""

    alpha: object
    a: np.ndarray
    c: np.ndarray

    def dense(self) -> np.ndarray:
        return _dense(self.alpha, self.a, self.c)

    def converted(self, scalar, array) -> ScoreMatrix:
        return ScoreMatrix(scalar(self.alpha), array(self.a), array(self.c))


@dataclass
class ValueMatrix:
    """The value matrix V = β·I + p·qᵀ: V·y = β·y + p·(q·y)."""

    beta: object
    p: np.ndarray
    q: np.ndarray

    def dense(self) -> np.ndarray:
        return _dense(self.beta, self.p, self.q)

    def is_zero(self) -> bool:
        return self.beta == 0 and (all(v == 0 for v in self.p) or all(v == 0 for v in self.q))

    def converted(self, scalar, array) -> ValueMatrix:
        return ValueMatrix(scalar(self.beta), array(self.p), array(self.q))


def _dense(s, u, v) -> np.ndarray:
    d = u.shape[0]
    eye = as_number_array(np.eye(d, dtype=int), u.dtype == object)
    return eye * s + np.outer(u, v)


@dataclass
class SA:
    """Self-attention layer SA_i(X) = ρ·x_i + V·Σ_l π_il x_l, scores ⟨A x_i, x_l⟩."""

    rho: object
    A: ScoreMatrix
    V: ValueMatrix

    def n_params(self) -> int:
        d = self.A.a.shape[0]
        return 2 * (2 * d + 1) + 1

    def is_identity(self) -> bool:
        """ρ = 1 and V = 0: the layer changes nothing, whatever the scores."""
        return self.rho == 1 and self.V.is_zero()

    def converted(self, scalar, array) -> SA:
        return SA(scalar(self.rho), self.A.converted(scalar, array),
                  self.V.converted(scalar, array))


@dataclass
class Block:
    ff: FF | None = None
    sa: SA | None = None

    def converted(self, scalar, array) -> Block:
        """The same block with every scalar and array parameter mapped (a change of arithmetic)."""
        return Block(None if self.ff is None else self.ff.converted(scalar, array),
                     None if self.sa is None else self.sa.converted(scalar, array))


@dataclass
class Transformer:
    """A stack of FF→SA blocks on tokens in R^d with one attention kind for every SA layer."""

    d: int
    attention: str  # "hardmax" or "softmax"
    blocks: list[Block]
    tau: object = None  # softmax temperature
    exact: bool = True  # parameters are Fractions (True) or floats (False)
    causal: bool = False  # token i attends to tokens l ≤ i only
    positions: np.ndarray | None = None  # row i is added to the token at position i first
    record: Construction | CausalConstruction | None = None  # None: not constructed

    @property
    def meta(self) -> dict:
        """The model file's ``"meta"`` object, written from the construction record."""
        return {} if self.record is None else self.record.to_meta()

    @property
    def n_blocks(self) -> int:
        return len(self.blocks)

    def max_width(self) -> int:
        return max((b.ff.width for b in self.blocks if b.ff is not None), default=0)

    def n_params(self) -> int:
        """Structured parameter count: w(2d+1)+1 per FF, 2(2d+1)+1 per SA, 0 per identity."""
        return sum((b.ff.n_params() if b.ff else 0) + (b.sa.n_params() if b.sa else 0)
                   for b in self.blocks)

    def n_params_dense(self) -> int:
        """Count in a standard dense layout: the same FF, and A, V as full d×d matrices plus ρ."""
        d = self.d
        return sum((b.ff.n_params() if b.ff else 0) + (2 * d * d + 1 if b.sa else 0)
                   for b in self.blocks)

    def parameters(self) -> list:
        """Every parameter value, in a fixed order (identity layers contribute none)."""
        out: list = []
        for b in self.blocks:
            if b.ff:
                out += [b.ff.eta, *b.ff.U.flat, *b.ff.b.flat, *b.ff.W.flat]
            if b.sa:
                out += [b.sa.rho, b.sa.A.alpha, *b.sa.A.a, *b.sa.A.c, b.sa.V.beta, *b.sa.V.p,
                        *b.sa.V.q]
        return out

    def to_float(self) -> Transformer:
        """The same model with float64 parameters."""
        def array(a):
            return np.asarray(a, dtype=float)

        blocks = [b.converted(float, array) for b in self.blocks]
        tau = None if self.tau is None else float(self.tau)
        positions = None if self.positions is None else array(self.positions)
        return replace(self, blocks=blocks, tau=tau, positions=positions, exact=False)
