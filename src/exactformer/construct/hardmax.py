"""The hardmax construction: separation, leaders and collapse, interpolation.

L = R + max(1, Σm_j − N) + Σm_j blocks with R ≤ N − 1 separation rounds (R = 0 when no two
sequences share a token), against 2·Σm_j + 2N + 1 in Alcalde, Fantuzzi and Zuazua (arXiv
2502.02270). See docs/hardmax.md.
"""

from __future__ import annotations

from ..data import Dataset
from ..model import Transformer
from ..record import Construction, Span
from .generic import ConstructionError, Draws
from .interpolation import LeaderOnTarget, interpolate
from .leaders import choose_leaders
from .separation import TokenTable, separate, separated_positions

REDRAWS = 20  # leader geometries tried before giving up (a coincidence has probability 0)


def compile_hardmax(dataset: Dataset, exact: bool = True, seed: int = 0,
                    progress: bool = False) -> Transformer:
    """Construct the hardmax transformer; rational parameters if ``exact``, else float64."""
    inputs, targets = dataset.fractions() if exact else dataset.floats()
    draws = Draws(seed, exact)
    table = TokenTable.build(inputs)
    sep = separate(table, draws, progress=progress)
    positions = separated_positions(inputs, table, sep, exact)
    for _ in range(REDRAWS):
        lead = choose_leaders(positions, dataset.target_lengths, draws, progress=progress)
        try:
            interp, h = interpolate(lead.points, targets, draws, progress)
            break
        except LeaderOnTarget:
            continue
    else:
        raise ConstructionError(f"every one of {REDRAWS} leader geometries put a leader on a "
                                "target")
    R, nl = sep.R, len(lead.blocks)
    blocks = sep.blocks + lead.blocks + interp
    record = Construction(
        kind="hardmax", seed=seed, N=dataset.N, sum_m=dataset.total_m, R=R,
        phases=[Span("separation", 0, R), Span("leaders", R, R + nl),
                Span("interpolation", R + nl, len(blocks))],
        tests=[None if t is None else [str(v) for v in table.points[t]] for t in sep.tests],
        lifts=sep.lifts, leaders=lead.chosen, interpolation_direction=[str(v) for v in h])
    return Transformer(d=dataset.d, attention="hardmax", blocks=blocks, exact=exact,
                       record=record)
