"""The model IR: feed-forward and self-attention layers with structured matrices.

A block is x ↦ SA(FF(x)). ``None`` for a layer means the identity. Parameters are Fractions
(exact models) or floats (float64 models); the arrays are object or float64 NumPy arrays.

* FF(x) = η·x + W·relu(U·x + b), U ∈ R^{w×d}, b ∈ R^w, W ∈ R^{d×w}.
* SA_i(X) = ρ·x_i + Σ_h V_h·Σ_l π^h_il x_l over heads h, each with its own scores
  s^h_il = α⟨x_i, x_l⟩ + (c·x_i)(a·x_l), i.e. A_h = α·I + a·cᵀ, its own argmax or softmax π^h,
  and V_h·y = β·y + p·(q·y), i.e. V_h = β·I + p·qᵀ (docs/heads.md).

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
class Head:
    """One attention head: scores ⟨A x_i, x_l⟩ and the value map V of its average."""

    A: ScoreMatrix
    V: ValueMatrix

    def converted(self, scalar, array) -> Head:
        return Head(self.A.converted(scalar, array), self.V.converted(scalar, array))


@dataclass(init=False)
class SA:
    """Self-attention layer SA_i(X) = ρ·x_i + Σ_h V_h·Σ_l π^h_il x_l.

    ``SA(rho, A, V)`` builds a one-head layer and ``SA(rho, heads=[...])`` any number; ``.A``
    and ``.V`` read the head of a one-head layer (docs/heads.md).
    """

    rho: object
    heads: list[Head]

    def __init__(self, rho, A: ScoreMatrix | None = None, V: ValueMatrix | None = None, *,
                 heads: list[Head] | None = None):
        if (heads is None) == (A is None or V is None):
            raise ValueError("SA takes either A and V (one head) or heads=[...], not both")
        self.rho = rho
        self.heads = [Head(A, V)] if heads is None else list(heads)
        if not self.heads:
            raise ValueError("an SA layer needs at least one head")

    def _only(self) -> Head:
        if len(self.heads) != 1:
            raise ValueError(f"this SA layer has {len(self.heads)} heads; read sa.heads")
        return self.heads[0]

    @property
    def A(self) -> ScoreMatrix:
        return self._only().A

    @property
    def V(self) -> ValueMatrix:
        return self._only().V

    def n_params(self) -> int:
        """2(2d+1) per head (α, a, c, β, p, q) and ρ."""
        d = self.heads[0].A.a.shape[0]
        return 2 * (2 * d + 1) * len(self.heads) + 1

    def is_identity(self) -> bool:
        """ρ = 1 and every V = 0: the layer changes nothing, whatever the scores."""
        return self.rho == 1 and all(h.V.is_zero() for h in self.heads)

    def converted(self, scalar, array) -> SA:
        return SA(scalar(self.rho), heads=[h.converted(scalar, array) for h in self.heads])


def side_by_side(ffs: list[FF]) -> tuple[FF, np.ndarray]:
    """Residual FF layers as one layer holding every layer's units side by side (η = 1), and
    each unit's layer among ``ffs``: what a run of them is enclosed through
    (evaluate/gate_runs.py, evaluate/staged.py)."""
    ff = FF(1.0, np.vstack([f.U for f in ffs]), np.concatenate([f.b for f in ffs]),
            np.hstack([f.W for f in ffs]))
    return ff, np.repeat(np.arange(len(ffs)), [len(f.b) for f in ffs])


def first_mixing(blocks: list, start: int = 0) -> int:
    """The first of ``blocks`` at or after ``start`` whose attention mixes tokens
    (:meth:`Block.mixes`), len(blocks) if none: the blocks before it act on each token alone
    (docs/numerics.md#pooled-rows)."""
    return next((i for i in range(start, len(blocks)) if blocks[i].mixes()), len(blocks))


@dataclass
class Block:
    ff: FF | None = None
    sa: SA | None = None

    def mixes(self) -> bool:
        """Whether the block's attention mixes tokens (neither absent nor the identity); a
        stretch of blocks that do not acts on each token alone (docs/numerics.md#pooled-rows)."""
        return self.sa is not None and not self.sa.is_identity()

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

    def max_heads(self) -> int:
        """The most heads of any SA layer (0 without attention)."""
        return max((len(b.sa.heads) for b in self.blocks if b.sa is not None), default=0)

    def n_params(self) -> int:
        """Structured parameter count: w(2d+1)+1 per FF, 2(2d+1)·H+1 per SA with H heads, 0 per
        identity."""
        return sum((b.ff.n_params() if b.ff else 0) + (b.sa.n_params() if b.sa else 0)
                   for b in self.blocks)

    def n_params_dense(self) -> int:
        """Count in a standard dense layout: the same FF, and per head A, V as full d×d matrices,
        plus ρ."""
        d = self.d
        return sum((b.ff.n_params() if b.ff else 0) +
                   (2 * d * d * len(b.sa.heads) + 1 if b.sa else 0) for b in self.blocks)

    def parameter_arrays(self) -> list[np.ndarray]:
        """Every parameter value as the blocks' flat arrays, in a fixed order (identity layers
        contribute none): what :meth:`parameters` lists one by one."""
        out: list = []
        for b in self.blocks:
            if b.ff:
                out += [np.asarray([b.ff.eta]), b.ff.U.ravel(), b.ff.b.ravel(), b.ff.W.ravel()]
            if b.sa:
                out.append(np.asarray([b.sa.rho]))
                for h in b.sa.heads:
                    out += [np.asarray([h.A.alpha]), h.A.a, h.A.c, np.asarray([h.V.beta]),
                            h.V.p, h.V.q]
        return out

    def parameters(self) -> list:
        """Every parameter value, in a fixed order (identity layers contribute none)."""
        return [v for a in self.parameter_arrays() for v in a]

    def to_float(self) -> Transformer:
        """The same model with float64 parameters."""
        def array(a):
            return np.asarray(a, dtype=float)

        blocks = [b.converted(float, array) for b in self.blocks]
        tau = None if self.tau is None else float(self.tau)
        positions = None if self.positions is None else array(self.positions)
        return replace(self, blocks=blocks, tau=tau, positions=positions, exact=False)
