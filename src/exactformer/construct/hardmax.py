"""The hardmax construction: separation, leaders and collapse, interpolation.

L = R + max(1, Σm_j − N) + Σm_j blocks with R ≤ N − 1 separation rounds (R = 0 when no two
sequences share a token), against 2·Σm_j + 2N + 1 in Alcalde, Fantuzzi and Zuazua (arXiv
2502.02270). FF layers of width 4k hold k hats: about R_k + ⌈(L − R)/k⌉ blocks, R_k ≤ R
separation rounds with up to k tests each. See docs/hardmax.md and docs/heads.md.
"""

from __future__ import annotations

from ..data import Dataset
from ..model import Transformer
from ..record import Construction, Span
from . import keyed
from .generic import ConstructionError, Draws
from .interpolation import LeaderOnTarget, interpolate
from .leaders import choose_leaders
from .separation import TokenTable, separate, separated_positions

REDRAWS = 20  # leader geometries tried before giving up (a coincidence has probability 0)


def hats_per_layer(width: int) -> int:
    """k = width/4: the hats (of 4 ReLUs) one FF layer holds (docs/heads.md)."""
    if isinstance(width, bool) or not isinstance(width, int) or width < 4 or width % 4:
        raise ValueError(f"width must be a positive multiple of 4, got {width!r}")
    return width // 4


def check_heads(heads: int) -> None:
    if isinstance(heads, bool) or not isinstance(heads, int) or heads < 1:
        raise ValueError(f"heads must be a positive integer, got {heads!r}")


def compile_hardmax(dataset: Dataset, exact: bool = True, seed: int = 0,
                    progress: bool = False, width: int = 4, heads: int = 1,
                    keys: bool = False) -> Transformer:
    """Construct the hardmax transformer; rational parameters if ``exact``, else float64.
    ``width`` (a multiple of 4) is the widest FF layer: width/4 hats share a layer; ``heads``
    (at most d − 1 used) lets a separation round read tests on free coordinates. ``keys``:
    the keyed model of docs/keyed.md instead of hats, up to ``heads`` separation rounds to an
    attention layer (docs/keyed.md#heads)."""
    k = hats_per_layer(width)
    inputs, targets = dataset.fractions() if exact else dataset.floats()
    check_heads(heads)
    if keys:
        return compile_keyed(dataset, inputs, targets, exact, seed, progress, width, heads)
    draws = Draws(seed, exact)
    table = TokenTable.build(inputs)
    sep = separate(table, draws, progress=progress, per_round=k, heads=heads)
    positions = separated_positions(inputs, table, sep, exact)
    for _ in range(REDRAWS):
        lead = choose_leaders(positions, dataset.target_lengths, draws, progress=progress,
                              per_layer=k)
        try:
            interp, h = interpolate(lead.points, targets, draws, progress, per_layer=k)
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
        tests=[None if t is None else [str(v) for v in table.points[t]] for t in sep.tested()],
        lifts=sep.lifts, leaders=lead.chosen, interpolation_direction=[str(v) for v in h])
    return Transformer(d=dataset.d, attention="hardmax", blocks=blocks, exact=exact,
                       record=record)


def compile_keyed(dataset: Dataset, inputs, targets, exact: bool, seed: int, progress: bool,
                  width: int, heads: int) -> Transformer:
    """The keyed hardmax model (docs/keyed.md), wider than the data by its own coordinates;
    NotKeyable where no window isolates a token or no multipliers separate the holders of a
    tag."""
    built = keyed.build(inputs, targets, dataset.target_lengths, exact, width, heads, seed,
                        progress)
    return keyed.model_of(built, dataset.N, dataset.total_m, seed, exact, "hardmax")
