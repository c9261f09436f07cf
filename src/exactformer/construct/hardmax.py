"""The hardmax construction of DESIGN §4: separation, leaders and collapse, interpolation.

L = R + max(1, Σm_j − N) + Σm_j blocks with R ≤ N − 1 separation rounds (R = 0 when no two
sequences share a token), against 2·Σm_j + 2N + 1 in the paper.
"""

from __future__ import annotations

from ..data import Dataset
from ..model import Transformer
from .generic import ConstructionError, Draws
from .interpolation import LeaderOnTarget, interpolate
from .leaders import choose_leaders
from .separation import TokenTable, separate, separated_positions

REDRAWS = 20


def compile_hardmax(dataset: Dataset, exact: bool = True, seed: int = 0,
                    progress: bool = False) -> Transformer:
    inputs, targets = dataset.fractions() if exact else dataset.floats()
    draws = Draws(seed, exact)
    table = TokenTable.build(inputs)
    sep = separate(table, draws, progress)
    m = dataset.target_lengths
    positions = separated_positions(inputs, table, sep, exact)
    for _ in range(REDRAWS):
        lead = choose_leaders(positions, m, draws, progress=progress)
        try:
            interp, h = interpolate(lead.points, targets, draws, progress)
            break
        except LeaderOnTarget:
            continue
    else:
        raise ConstructionError(f"every one of {REDRAWS} leader geometries put a leader on a "
                                "target")
    blocks = sep.blocks + lead.blocks + interp
    R, nl = sep.R, len(lead.blocks)
    meta = {
        "construction": "hardmax",
        "seed": seed,
        "N": dataset.N,
        "sum_m": dataset.total_m,
        "R": R,
        "phases": {"separation": [0, R], "leaders": [R, R + nl],
                   "interpolation": [R + nl, len(blocks)]},
        "tests": [None if t is None else [str(v) for v in table.points[t]] for t in sep.tests],
        "lifts": sep.lifts,
        "leaders": lead.chosen,
        "interpolation_direction": [str(v) for v in h],
    }
    return Transformer(d=dataset.d, attention="hardmax", blocks=blocks, exact=exact, meta=meta)
