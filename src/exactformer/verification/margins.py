"""Softmax snap margins: how far the tokens on the projection line sit inside the flat parts
of their snaps, against the float64 deviation there (docs/verification.md#softmax-margins).
A measurement for the report only; the verdict is the bound of ``bound``.
"""

from __future__ import annotations

import numpy as np

from ..distance import smallest, worst
from ..model import Transformer
from ..numbers import to_fraction


def snap_start(model: Transformer) -> int | None:
    """Block index after which tokens sit on the snap line, read from the layers: the last FF
    with η = 0 (the projection onto the line) when every later layer is a residual FF reading
    one direction with a multiple of four units (snaps). None for any other model."""
    last = None
    for i, b in enumerate(model.blocks):
        if b.ff is not None and b.ff.eta == 0:
            last = i
    if last is None or model.attention != "softmax" or last + 1 >= model.n_blocks:
        return None
    snaps = model.blocks[last + 1:]
    if all(b.sa is None and b.ff is not None and b.ff.width % 4 == 0 and b.ff.eta == 1
           and units_read_one_direction(b.ff) for b in snaps):
        return last + 1
    return None


def units_read_one_direction(ff) -> bool:
    """Every unit of the FF layer reads the same row of U (a width-0 layer reads none)."""
    return all(np.array_equal(ff.U[i], ff.U[0]) for i in range(ff.width))


def _flat_pieces(model: Transformer, s0: int) -> list[tuple[float, float]]:
    """[c2, c3] of every snap, from its breakpoints c_i = −b_i (units read f' with scale 1);
    the snaps of one layer have disjoint windows, so sorted breakpoints come in fours."""
    out = []
    for b in model.blocks[s0:]:
        c = sorted(-to_fraction(v) for v in b.ff.b)
        out += [(float(c[i + 1]), float(c[i + 2])) for i in range(0, len(c), 4)]
    return sorted(out)


def snap_margins(model: Transformer, s0: int, line_mp, line_f, scale: float) -> dict:
    """Distance of every token on the snap line to the edges of the flat part of the window
    containing it (negative: in no flat part), in high precision, against the float64
    deviation of the same positions. ``s0``: the first snap block."""
    reader = model.blocks[s0].ff.U[0]  # every snap reads the same direction f'
    flats = _flat_pieces(model, s0)
    ts_mp = np.concatenate([np.array(o, dtype=float) for o in line_mp]) @ \
        np.array(reader, dtype=float)
    ts_f = np.concatenate(line_f) @ np.array(reader, dtype=float)
    margins = []
    for t in ts_mp:
        inside = [min(t - a, b - t) for a, b in flats if a <= t <= b]
        margins.append(inside[0] if inside else -min(min(abs(t - a), abs(t - b))
                                                     for a, b in flats))
    dev = worst(np.abs(ts_f - ts_mp))
    m = smallest(margins)
    return {"snap margin / scale": f"{m / scale:.3g}",
            "float64 deviation on the snap line / scale": f"{dev / scale:.3g}",
            "float64 certified by margins": "yes" if m > 8 * dev else "no"}
