"""Runtime ranges: does every number a model stores fit the floating-point runtime it claims?

A keyed model claims to be exact to float32's rounding in a plain float32 pass, and a model
of position keys to be exact in float32 and bfloat16 (docs/keyed.md, docs/causal.md). That
claim holds only while every number the pass stores is a *normal* number of the format: a
nonzero parameter below the smallest normal magnitude is subnormal (it loses bits) or 0 (the
layer loses its term), one above the largest is inf, and so is a data coordinate. The
construction works in rationals, where no such limit exists; :func:`range_faults` names each
number that breaks it, and :func:`warn_range_faults` is what ``compile`` and ``export``
report. See docs/numerics.md#runtime-ranges. NumPy and the standard library only.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from .evaluate import dense_forward
from .model import Transformer
from .numbers import decimal_exponent


@dataclass(frozen=True)
class Runtime:
    """A floating-point format's range of normal magnitudes [tiny, huge]."""

    name: str
    tiny: Fraction  # smallest normal magnitude
    huge: Fraction  # largest finite magnitude


RUNTIMES = {
    "float32": Runtime("float32", Fraction(2) ** -126, (2 - Fraction(2) ** -23) * 2 ** 127),
    "bfloat16": Runtime("bfloat16", Fraction(2) ** -126, (2 - Fraction(2) ** -7) * 2 ** 127),
    "float64": Runtime("float64", Fraction(2) ** -1022, (2 - Fraction(2) ** -52) * 2 ** 1023),
}
MAX_FAULTS = 5  # faults named per runtime (the first in block order); the count says the rest


class RuntimeRangeWarning(RuntimeWarning):
    """A number the model stores, or a data coordinate, is outside a runtime's normal range:
    the model's claim for that runtime does not hold (the message names the number)."""


def claimed_runtimes(model: Transformer) -> tuple[str, ...]:
    """The reduced-precision runtimes whose plain pass the model claims to be exact in: keyed
    models float32, position-key models float32 and bfloat16, others none."""
    rec = model.record
    if rec is None:
        return ()
    if getattr(rec, "keyed", None) is not None:
        return ("float32",)
    if getattr(rec, "position_code", None) is not None:
        return ("float32", "bfloat16")
    return ()


def stored_numbers(model: Transformer):
    """(where, array) for every parameter array of the model, in block order: where is
    "block i FF U", "block i SA head h A.alpha", …, "positions", "tau"."""
    for i, blk in enumerate(model.blocks):
        if blk.ff is not None:
            for name in ("eta", "U", "b", "W"):
                yield f"block {i} FF {name}", getattr(blk.ff, name)
        if blk.sa is not None:
            yield f"block {i} SA rho", blk.sa.rho
            for h, head in enumerate(blk.sa.heads):
                at = f"block {i} SA head {h}"
                for part, m in (("A", head.A), ("V", head.V)):
                    for name in ("alpha", "a", "c") if part == "A" else ("beta", "p", "q"):
                        yield f"{at} {part}.{name}", getattr(m, name)
    if model.positions is not None:
        yield "positions", model.positions
    if model.tau is not None:
        yield "tau", model.tau


def range_faults(model: Transformer, runtime: str = "float32", data=None) -> list[str]:
    """Every stored number of ``model`` (and coordinate of ``data``'s inputs and targets)
    that is nonzero and outside ``runtime``'s normal range, as "WHERE = VALUE underflows
    (or overflows) in RUNTIME" strings, then every intermediate of a float64 pass on ``data``
    (FF pre-activations and outputs, scores, states) beyond the runtime's largest number: the
    first :data:`MAX_FAULTS`, then a count of the others."""
    rt = RUNTIMES[runtime]
    found: list[str] = []
    numbers = list(stored_numbers(model))
    if data is not None:
        numbers += [(f"data input {j}", x) for j, x in enumerate(data.inputs)]
        numbers += [(f"data target {j}", y) for j, y in enumerate(data.targets)]
    count = 0
    for where, values in numbers:
        for v in _outside(values, rt):
            count += 1
            if len(found) < MAX_FAULTS:
                side = "underflows (subnormal or 0)" if abs(v) < rt.tiny else "overflows (inf)"
                found.append(f"{where} = {_show(v)} {side} in {runtime}")
    if data is not None:
        for where, top in _peaks(model, data, float(rt.huge)):
            if not top <= rt.huge:  # (nan too)
                count += 1
                if len(found) < MAX_FAULTS:
                    found.append(f"{where} reaches {top:.3g} on the data, which overflows "
                                 f"(inf) in {runtime}")
    if count > len(found):
        found.append(f"and {count - len(found)} more")
    return found


def _peaks(model: Transformer, data, limit: float) -> list[tuple[str, float]]:
    """("block i PART", largest |value|) of every intermediate of a dense float64 pass on
    ``data``'s inputs (:func:`~exactformer.evaluate.dense_forward`), in block order; one at
    most ``limit`` may come as a bound on it that is at most ``limit``."""
    peaks: dict = {}
    dense_forward(model, data.floats()[0], peaks=peaks, peak_limit=limit)
    return [(f"block {i} {part}", top) for (i, part), top in sorted(peaks.items())]


def warn_range_faults(model: Transformer, data=None, stacklevel: int = 2) -> list[str]:
    """Warn (:class:`RuntimeRangeWarning`) for each runtime the model claims whose range a
    stored number or data coordinate leaves; return the messages."""
    messages = []
    for runtime in claimed_runtimes(model):
        faults = range_faults(model, runtime, data)
        if faults:
            messages.append(range_message(runtime, faults))
            warnings.warn(messages[-1], RuntimeRangeWarning, stacklevel=stacklevel + 1)
    return messages


def range_message(runtime: str, faults: list[str]) -> str:
    """One line: the model's ``runtime`` copy is not the model, and why (``faults``)."""
    rt = RUNTIMES[runtime]
    return (f"a {runtime} copy of the model is not guaranteed to reproduce the data: "
            f"{'; '.join(faults)} "
            f"({runtime} holds nonzero magnitudes {float(rt.tiny):.3g} to {float(rt.huge):.3g}; "
            "rescale the data towards magnitude 1, docs/numerics.md#runtime-ranges)")


def _outside(values, rt: Runtime) -> list:
    """The nonzero entries of ``values`` (a scalar or an array of floats or Fractions) whose
    magnitude is below ``rt.tiny`` or above ``rt.huge``, compared exactly."""
    a = np.asarray(values, dtype=object if isinstance(values, Fraction) else None)
    if a.dtype != object:
        with np.errstate(invalid="ignore"):
            m = np.abs(a.astype(float))
            bad = (m != 0) & ((m < float(rt.tiny)) | (m > float(rt.huge)) | ~np.isfinite(m))
        return a[bad].tolist()
    return [v for v in a.flat if v != 0 and not (rt.tiny <= abs(v) <= rt.huge)]


def _show(v) -> str:
    """A short decimal of ``v`` that never builds a huge integer string (2^-153 ≈ 8.8e-47)."""
    if isinstance(v, Fraction):
        f = abs(v)
        exponent = f.numerator.bit_length() - f.denominator.bit_length()
        if -1000 < exponent < 1000:
            return f"{float(v):.3g}"
        return f"{'-' if v < 0 else ''}about 1e{decimal_exponent(v)}"
    return f"{float(v):.3g}"
