"""The arithmetics a pass computes in: exact (rational), float64 and mpmath (any precision).

The exact pass computes with gmpy2's ``mpq`` (GMP rationals, several times faster than
``fractions.Fraction`` in the hot loops); its inputs and outputs are ``Fraction``s, converted at
entry and exit, so users only ever see Fractions (docs/numerics.md). :class:`PassStats` holds the
margins a pass records, whatever its arithmetic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from fractions import Fraction

import mpmath
import numpy as np
from gmpy2 import mpq

from ..distance import smallest
from ..numbers import to_fraction

ARITHMETICS = ("exact", "float", "mp")


class Arithmetic:
    """The numbers of a pass, as one context per arithmetic (the algorithms of a pass are
    written once, against these methods): ``Arithmetic("exact")`` (gmpy2 mpq inside a pass,
    Fraction outside), ``Arithmetic("float")`` (float64) or ``Arithmetic("mp", dps)``
    (mpmath at ``dps`` digits). Like ``pathlib.Path``, the base class hands out the context of
    the kind asked for."""

    kind = ""
    is_object = True  # values are Python objects in object arrays (exact, mp)

    def __new__(cls, kind: str = "float", dps: int = 50):
        if cls is Arithmetic:
            if kind not in _CONTEXTS:
                raise ValueError(f"arithmetic must be one of {ARITHMETICS}, got {kind!r}")
            cls = _CONTEXTS[kind]
        return super().__new__(cls)

    def __init__(self, kind: str | None = None, dps: int = 50):
        self.dps = dps

    def __repr__(self) -> str:
        return f"Arithmetic({self.kind!r}, {self.dps})"

    def scalar(self, v):
        """One number in this arithmetic."""
        raise NotImplementedError

    def array(self, a) -> np.ndarray:
        """An array of numbers in this arithmetic (an object array unless float64)."""
        a = np.asarray(a)
        out = np.empty(a.shape, dtype=object)
        out.flat[:] = list(map(self.scalar, a.ravel().tolist()))
        return out

    def public(self, a: np.ndarray) -> np.ndarray:
        """``a`` as users see it (the exact pass's mpq values become Fractions)."""
        return a

    def exp(self, a: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def convert(self, layer):
        """A layer (block, FF, SA or ridge part) in this arithmetic. Passes convert each layer
        when they apply it, and a ridge part only when some row is inside its window: an
        exact pass over a few sequences of a float64 model with 10^5 hat layers converts the
        few that reach its rows, not the millions of parameters of the others."""
        return layer.converted(self.scalar, self.array)

    def numbers(self, model):
        """The model whose numbers a pass reads (converted layer by layer where used)."""
        return model


class FloatArithmetic(Arithmetic):
    kind, is_object = "float", False

    def scalar(self, v):
        return float(v)

    def array(self, a) -> np.ndarray:
        return np.asarray(a).astype(float)

    def exp(self, a: np.ndarray) -> np.ndarray:
        return np.exp(a)

    def convert(self, layer):
        return layer

    def numbers(self, model):
        return model.to_float() if model.exact else model


class ExactArithmetic(Arithmetic):
    kind = "exact"

    def scalar(self, v):
        if isinstance(v, mpq):
            return v
        if isinstance(v, np.integer):
            v = int(v)
        if isinstance(v, (int, Fraction)) or (isinstance(v, float) and math.isfinite(v)):
            return mpq(v)  # exact, also for a float
        return mpq(to_fraction(v))

    def array(self, a) -> np.ndarray:
        a = np.asarray(a)
        if not (a.dtype.kind in "iu" or (a.dtype.kind == "f" and bool(np.isfinite(a).all()))):
            return super().array(a)
        # one mpq per distinct value (counts, pixel values), shared: mpq is immutable, and
        # mpq(float) is exact
        distinct, inverse = np.unique(a, return_inverse=True)
        table = np.empty(len(distinct), dtype=object)
        table[:] = list(map(mpq, distinct.tolist()))  # Python scalars convert faster
        out = np.empty(a.shape, dtype=object)
        out[...] = table[inverse.reshape(a.shape)]
        return out

    def public(self, a: np.ndarray) -> np.ndarray:
        out = np.empty(a.shape, dtype=object)
        out.flat[:] = [Fraction(int(v.numerator), int(v.denominator))
                       for v in a.ravel().tolist()]
        return out

    def exp(self, a: np.ndarray) -> np.ndarray:
        raise ValueError("softmax attention cannot be evaluated in exact rational arithmetic; "
                         "use arithmetic='mp' (high precision) or 'float'")


class MpArithmetic(Arithmetic):
    kind = "mp"

    def scalar(self, v):
        if isinstance(v, np.integer):
            v = int(v)
        if isinstance(v, Fraction):
            return mpmath.mpf(v.numerator) / v.denominator
        return mpmath.mpf(v)

    def exp(self, a: np.ndarray) -> np.ndarray:
        return np.frompyfunc(mpmath.exp, 1, 1)(a)


_CONTEXTS = {"exact": ExactArithmetic, "float": FloatArithmetic, "mp": MpArithmetic}
EXACT = Arithmetic("exact")
FLOAT = Arithmetic("float")


def relu(z: np.ndarray) -> np.ndarray:
    return np.where((z > 0).astype(bool), z, 0 * z)


def float_image(a: np.ndarray) -> np.ndarray | None:
    """float64 values of ``a``; None for an object array with a value beyond float range.
    Each exact value has a single image and the conversion is monotone (rounding or
    truncation), so floats can pre-sort and pre-group exact values."""
    try:
        return a.astype(float)
    except OverflowError:
        return None


def max_abs(x: np.ndarray) -> float:
    """The largest |coordinate| of ``x`` as a float (inf beyond float range)."""
    f = float_image(x)
    return float(np.abs(f).max(initial=0.0)) if f is not None else math.inf


def stable_argsort(t: np.ndarray) -> np.ndarray:
    """``np.argsort(t, kind="stable")`` for exact or mpmath values, sorting by the values' float
    images first and comparing exactly only within runs of equal floats."""
    tf = float_image(t) if t.dtype == object else t
    if tf is None or t.dtype != object:
        return np.argsort(t, kind="stable")
    order = np.argsort(tf, kind="stable")
    sf = tf[order]
    starts = np.flatnonzero(np.concatenate([[True], sf[1:] != sf[:-1], [True]]))
    for s, e in zip(starts[:-1].tolist(), starts[1:].tolist(), strict=True):
        if e - s > 1:
            order[s:e] = sorted(order[s:e].tolist(), key=t.__getitem__)
    return order


@dataclass
class PassStats:
    """Margins seen during a pass (None where the model has no such layer)."""

    hardmax_margin: float | None = None  # smallest best-minus-second score gap / score scale
    hardmax_ties: int = 0  # queries whose best score is shared by two distinct points
    # smallest distance of an untouched token to a window (in the tokens' units: reports divide
    # it by the data's scale, distance.data_scale)
    hat_clearance: float | None = None
    # (enclose) the tracking pass computed the plain float pass's values: see passes.enclose
    floats_plain: bool = False
    enabled: bool = field(default=True, repr=False, compare=False)  # False: record nothing

    def note_min(self, name: str, v) -> None:
        """Keep the smaller margin; a nan margin stays nan (:func:`~exactformer.distance.
        smallest`), so a pass that met one never reports a clean margin."""
        cur = getattr(self, name)
        setattr(self, name, float(v) if cur is None else smallest([cur, v]))

    def merge(self, other: PassStats) -> None:
        """Fold in the statistics of a pass over other sequences (a chunk of a parallel pass):
        counts add up, margins take the smaller value, so the result equals one serial pass."""
        for f in fields(self):
            if f.name == "enabled":
                continue
            v = getattr(other, f.name)
            if isinstance(v, bool):
                setattr(self, f.name, getattr(self, f.name) and v)
            elif isinstance(v, int):
                setattr(self, f.name, getattr(self, f.name) + v)
            elif v is not None:
                self.note_min(f.name, v)
