"""The reduced-precision runtimes a model can be proved faithful in, and their rounding.

A runtime stores every tensor in a format (float32, bfloat16 or float16) and accumulates every
dot product in float32; TF32 stores float32 but rounds (or truncates) the inputs of every
matrix product to 11 significant bits. This module holds the formats' constants, the one
rounding function of the proofs and their witnesses (:func:`round_to`), and the error factors
of the error model written down in docs/numerics.md#proofs-for-reduced-precision-runtimes.
NumPy only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..evaluate.grid import lowbit


@dataclass(frozen=True)
class Format:
    """A runtime: stored values have ``bits`` significant bits and normal magnitudes from
    2^emin to ``huge``; ``matmul_bits``, if set, the bits the inputs of a matrix product are
    cut to (TF32). Accumulation is always float32 (:data:`ACC`)."""

    name: str
    bits: int
    emin: int
    huge: float
    matmul_bits: int | None = None

    @property
    def u(self) -> float:
        """Unit roundoff of a store: |fl(x) − x| ≤ u·|x| for normal results."""
        return 2.0 ** -self.bits

    @property
    def largest_product_input(self) -> float:
        """The largest magnitude a matrix product's input keeps: ``huge``, or with TF32's cut
        the largest number of ``matmul_bits`` bits below 2^128 (a larger float32 rounds up to
        inf)."""
        if self.matmul_bits is None:
            return self.huge
        return (2 - 2.0 ** (1 - self.matmul_bits)) * 2.0 ** 127

    @property
    def tiny(self) -> float:
        """Absolute error one operation may add below the normal range: the smallest normal
        magnitude, which covers rounding a result to subnormals or flushing it to zero (a
        stored subnormal input is assumed kept: docs/numerics.md#proofs-for-reduced-precision-
        runtimes)."""
        return 2.0 ** self.emin


F32_MAX = float(np.finfo(np.float32).max)
ACC = Format("float32", 24, -126, F32_MAX)
FORMATS = {
    "float32": ACC,
    "tf32": Format("tf32", 24, -126, F32_MAX, matmul_bits=11),
    "bfloat16": Format("bfloat16", 8, -126, float((2 - 2.0 ** -7) * 2.0 ** 127)),
    "float16": Format("float16", 11, -14, 65504.0),
}
DEFAULT_EXP_ULPS = 2.0  # exp's error bound, in float32 ulps (CUDA's expf and glibc's stay within)


def get_format(name: str) -> Format:
    """The runtime called ``name``, or a ValueError listing the ones there are."""
    if name not in FORMATS:
        raise ValueError(f"runtime must be one of {', '.join(FORMATS)}, got {name!r}")
    return FORMATS[name]


def round_to(x, bits: int, emin: int) -> np.ndarray:
    """``x`` (float64) rounded to nearest-even with ``bits`` significant bits and normal
    exponents from ``emin`` (subnormals below, spaced 2^(emin − bits + 1)); no overflow
    handling (the callers compare with the format's largest number)."""
    x = np.asarray(x, dtype=np.float64)
    _, e = np.frexp(x)
    q = np.maximum(e, emin + 1) - bits  # x = m·2^e with ½ ≤ |m| < 1: the last bit is 2^(e−bits)
    with np.errstate(over="ignore", invalid="ignore"):
        return np.ldexp(np.rint(np.ldexp(x, -q)), q)


def stored(x, fmt: Format) -> np.ndarray:
    """``x`` rounded to ``fmt``'s stored values (inf beyond its largest magnitude)."""
    y = round_to(x, fmt.bits, fmt.emin)
    with np.errstate(invalid="ignore"):
        return np.where(np.abs(y) > fmt.huge, np.copysign(np.inf, y), y)


def conversions(x, fmt: Format) -> tuple[np.ndarray, np.ndarray]:
    """The stored value of a float64 ``x`` as a midpoint and radius covering both ways a
    converter may take: rounding once, or first to float32 and then to ``fmt`` (double
    rounding can differ by one unit in the last place)."""
    x = np.asarray(x, dtype=np.float64)
    once, twice = stored(x, fmt), stored(stored(x, ACC), fmt)
    with np.errstate(invalid="ignore"):
        mid = np.where(once == twice, once, (once + twice) / 2)
        rad = np.where(once == twice, 0.0, np.abs(once - twice) / 2)
    return mid, rad


def fits(x, bits: int) -> np.ndarray:
    """Whether each x has at most ``bits`` significant bits (0 does; non-finite does not)."""
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        return (x == 0) | (np.isfinite(x) & (np.abs(x) < lowbit(x) * 2.0 ** bits))


def theta(n_acc: int, n_store: int, fmt: Format) -> float:
    """(1 + u_acc)^n_acc · (1 + u_fmt)^n_store − 1, rounded up: the relative error of a result
    every term of which passes through at most n_acc float32 roundings and n_store roundings
    to ``fmt`` (Higham's γ, both kinds at once). A format that stores float32 (float32, TF32)
    stores the float32 accumulator's value as it is: its stores round nothing."""
    stores = 0 if fmt.bits == ACC.bits else n_store
    t = math.expm1(n_acc * math.log1p(ACC.u) + stores * math.log1p(fmt.u))
    return t * (1 + 2.0 ** -40) + 2.0 ** -1000


def thetas(n_acc: np.ndarray, n_store: int, fmt: Format) -> np.ndarray:
    """:func:`theta` for each entry of an array of (integral) float32 rounding counts."""
    return per_count(n_acc, lambda n: theta(n, n_store, fmt))


def per_count(counts: np.ndarray, f) -> np.ndarray:
    """f(c) for each entry c of an array of integral counts, computed once per distinct c."""
    distinct, at = np.unique(counts, return_inverse=True)
    return np.array([f(int(c)) for c in distinct])[at].reshape(np.shape(counts))


def matmul_input_error(fmt: Format) -> float:
    """Relative change of a product w·x when both inputs are cut to ``fmt.matmul_bits``
    (rounded or truncated: each moves by less than 2^(1 − bits) relatively); 0 without."""
    if fmt.matmul_bits is None:
        return 0.0
    t = 2.0 ** (1 - fmt.matmul_bits)
    return (2 * t + t * t) * (1 + 2.0 ** -40)


def chained_cut_error(fmt: Format, cuts: int, theta_: float = 0.0) -> float:
    """(1 + θ)·(1 + t)^cuts − 1, rounded up, t = 2^(1 − bits): the relative error of a term
    whose factors pass through ``cuts`` TF32 cuts in a chain (a cut value multiplied and cut
    again) and float32 roundings worth θ; 0 cuts without TF32. Two cuts are
    :func:`matmul_input_error`'s 2t + t²."""
    t = 0.0 if fmt.matmul_bits is None else 2.0 ** (1 - fmt.matmul_bits)
    grow = math.expm1(cuts * math.log1p(t) + math.log1p(theta_))
    return grow * (1 + 2.0 ** -40) + 2.0 ** -1000


def alpha_cuts(alpha: float, alpha_r: float) -> int:
    """TF32 cuts on the path of a score's term α·x_ij·x_lj. The torch module cuts x_i and x_l
    (α·(x·xᵀ) scales a product); the ρ/η and TransformerLens layouts compute q_j = α·x_ij as
    a product (W_q = [α·I; cᵀ]) and cut it again in q·k: cut(cut(α)·cut(x_ij))·cut(x_lj),
    four cuts, of which only the two of x survive where α is a power of two (α·cut(x_ij) then
    keeps 11 bits). docs/numerics.md#proofs-for-reduced-precision-runtimes."""
    return 2 if alpha_r == 0 and (alpha == 0 or lowbit(alpha) == abs(alpha)) else 4
