"""The model IR: feed-forward and self-attention layers with structured matrices (DESIGN §2).

A block is x ↦ SA(FF(x)). ``None`` for a layer means the identity. Parameters are Fractions
(exact models) or floats (float64 models); the arrays are object or float64 NumPy arrays.

* FF(x) = η·x + W·relu(U·x + b), U ∈ R^{w×d}, b ∈ R^w, W ∈ R^{d×w}.
* SA_i(X) = ρ·x_i + V·Σ_l π_il x_l with scores s_il = α⟨x_i, x_l⟩ + (c·x_i)(a·x_l), i.e.
  A = α·I + a·cᵀ, and V·y = β·y + p·(q·y), i.e. V = β·I + p·qᵀ.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from .numbers import as_number_array


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


@dataclass
class LowRank:
    """The structured matrix M = s·I + u·vᵀ (A: s = α, u = a, v = c; V: s = β, u = p, v = q)."""

    s: object
    u: np.ndarray
    v: np.ndarray

    def dense(self) -> np.ndarray:
        d = self.u.shape[0]
        eye = as_number_array(np.eye(d, dtype=int), self.u.dtype == object)
        return eye * self.s + np.outer(self.u, self.v)


@dataclass
class SA:
    """Self-attention layer SA_i(X) = ρ·x_i + V·Σ_l π_il x_l, scores ⟨A x_i, x_l⟩."""

    rho: object
    A: LowRank
    V: LowRank

    def n_params(self) -> int:
        d = self.A.u.shape[0]
        return 2 * (2 * d + 1) + 1


@dataclass
class Block:
    ff: FF | None = None
    sa: SA | None = None


@dataclass
class Transformer:
    """A stack of FF→SA blocks on tokens in R^d with one attention kind for every SA layer."""

    d: int
    attention: str  # "hardmax" or "softmax"
    blocks: list[Block]
    tau: object = None  # softmax temperature
    exact: bool = True  # parameters are Fractions (True) or floats (False)
    meta: dict = field(default_factory=dict)  # what the construction did, for reports

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
                out += [b.sa.rho, b.sa.A.s, *b.sa.A.u, *b.sa.A.v, b.sa.V.s, *b.sa.V.u, *b.sa.V.v]
        return out

    def to_float(self) -> Transformer:
        """The same model with float64 parameters."""
        def f(a):
            return np.asarray(a, dtype=float) if isinstance(a, np.ndarray) else float(a)

        def lr(m):
            return LowRank(f(m.s), f(m.u), f(m.v))

        blocks = [Block(FF(f(b.ff.eta), f(b.ff.U), f(b.ff.b), f(b.ff.W)) if b.ff else None,
                        SA(f(b.sa.rho), lr(b.sa.A), lr(b.sa.V)) if b.sa else None)
                  for b in self.blocks]
        tau = None if self.tau is None else float(self.tau)
        return replace(self, blocks=blocks, tau=tau, exact=False)
