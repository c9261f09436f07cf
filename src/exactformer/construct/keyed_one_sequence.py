"""Keyed softmax models of one sequence: no attention layer at all (docs/keyed.md#one-sequence).

With one sequence a token's target is a function of the token alone, so the collapse, which
tells every token its sequence and its leader tag, has nothing to do. Every tag but one
becomes a state of its own: its clip writes the tag's code, the data are reset once no tag
reads them any more, one unit writes the left-out tag's target (the *anchor*) into every
token, and one unit per remaining tag, reading its code, adds target − anchor at its token
alone and clears the code. Every untagged token, the left-out tag's among them, ends at the
anchor. No value is ever blurred, so each move's argument is an exact integer, as in the
hardmax model, and a move is one unit, not a snapped pair.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..model import Block
from ..numbers import num, zeros
from .keyed import Built, Prepared, phases, relaid
from .keyed_moves import move_argument, target_slots
from .keyed_units import chunks, ff_layer, on_code, with_tail


def build(prep: Prepared, targets: list[np.ndarray], width: int, exact: bool,
          floor=None) -> Built:
    """The model of one sequence's ``prep``: its tagging without the costliest tag (a window
    before a cap), the data reset (to 0, or with ``floor`` to it in one unit a coordinate of
    both signs, :func:`.keyed_units.zero_units`), the anchor and one move per tag."""
    slot_of = target_slots(prep.table, prep.p, targets)
    left = max(prep.p.tags, key=lambda tag: tag.side == 0)
    anchor = targets[0][slot_of[(0, left.token)]]
    kept = [tag for tag in prep.p.tags if tag is not left]
    p = replace(prep.p, tags=kept, leader_tags=[tag.token for tag in kept])
    prep = relaid(replace(prep, p=p), 0, width, exact, floor)
    lay = prep.lay
    lift = anchor - (zeros(lay.d, exact) if floor is None else floor)
    start = zeros(lay.D, exact)
    start[:lay.d], start[lay.one] = lift, num(-1, exact)
    units = [(zeros(lay.D, exact), num(1, exact), start)] + \
        [_move(prep, tag.token, targets[0][slot_of[(0, tag.token)]] - anchor, exact)
         for tag in kept]
    layers = with_tail(chunks(prep.pending, width), units, width)
    blocks = prep.tag_layers + [Block(ff_layer(layer, exact), None) for layer in layers]
    keyed = {**prep.keyed, "tags": len(kept), "moves": len(kept),
             "caps": sum(tag.side != 0 for tag in kept), "tag_layers": len(prep.tag_layers),
             "scores": [], "snaps": False}
    return Built(blocks, lay.D, phases(prep, 0, 0, len(blocks)), 0, keyed)


def _move(prep: Prepared, t: int, move, exact: bool) -> tuple:
    """Tag t's unit on its hardmax move argument (``move_argument``: exactly 1 at its token,
    ≤ −1 at any other tag's and at every untagged token, whose code is 0): ``move`` on the
    data, and its code and mark cleared. Not ``keyed_moves._move_unit``, which also clears
    ``one`` (the anchor clears it here, at every token) and the signature (0 here)."""
    lay = prep.lay
    g = prep.orders[t][0][0][1]
    u, bias, _ = move_argument(prep, t, g, 0, exact)
    out = on_code(lay, prep.word[t], -prep.scales.C, exact)
    out[:lay.d] = move
    out[lay.mark] = num(-1, exact)
    return u, bias, out
