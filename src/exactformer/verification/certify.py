"""Proofs that a model reproduces its data exactly (see docs/proofs.md).

``prove(model, dataset)`` evaluates a softmax model on the data in rigorous ball arithmetic
(python-flint's ``arb``) and in exact rationals (``fmpq``), and succeeds only when every output
token is shown to *be* an exact rational point and the output set of every pair equals its
target set under ``==``. Every step either encloses the true real value or computes it exactly,
so a proof cannot be wrong; it may fail to be found (then ``reason`` says where), and precision
is raised from 64 bits up to ``max_bits`` while some ReLU sign stays undecided.

The evaluation itself (tokens as exact points, points on exact lines, or balls) is
``balls.Run``; this module judges its outputs. Hardmax models are proved by the exact rational
forward pass. Nothing is read from ``model.meta``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from flint import fmpq_mat

from ..data import Dataset
from ..evaluate import forward
from ..model import Transformer
from .balls import Exact, Layers, Line, Run, as_fmpq, column

FLOAT64_NOTE = (" (float64 parameters: their rounding, of a snap or of a move's target, "
                "leaves the outputs slightly off the targets in real arithmetic)")

START_BITS = 64


@dataclass
class Proof:
    """The outcome of ``prove``.

    ``proved``: every pair's output set equals its target set, shown exactly. ``bits``: the ball
    precision of the attempt reported (None for the exact hardmax pass). ``refuted``: an output
    was computed exactly and is not exactly a target (or a target is missed): the model is not
    exact on the data (whether it is within a tolerance is for ``verify`` to say), pair
    ``refuted_pair``. ``pairs``: per pair, whether its output set was proved equal to its
    target set.
    """

    proved: bool
    bits: int | None
    reason: str
    refuted: bool = False
    pairs: list[bool] = field(default_factory=list)
    seconds: float = 0.0
    refuted_pair: int | None = None


def prove(model: Transformer, dataset: Dataset, max_bits: int = 1024) -> Proof:
    """Prove that ``model`` maps every input of ``dataset`` to its target set exactly.

    Softmax models: ball arithmetic from 64 bits, doubled up to ``max_bits`` while some ReLU
    sign is undecided. Hardmax models: the exact rational forward pass. Data narrower than the
    model are zero-padded, inputs and targets (docs/verification.md). See docs/proofs.md.
    """
    if max_bits < START_BITS:
        raise ValueError(f"max_bits must be at least {START_BITS}, got {max_bits}")
    dataset = dataset.padded(model.d)  # d < D: zero-padded; d > D: an error naming both
    if model.attention not in ("hardmax", "softmax"):
        raise ValueError(f"attention must be 'hardmax' or 'softmax', got {model.attention!r}")
    t0 = time.perf_counter()
    proof = _prove(model, dataset, max_bits)
    proof.seconds = time.perf_counter() - t0
    return proof


def _prove(model: Transformer, dataset: Dataset, max_bits: int) -> Proof:
    if model.causal or model.positions is not None:
        return Proof(False, None, "causal models and positional rows are not covered by the "
                                  "proof", pairs=[False] * dataset.N)
    xs, ys = dataset.fractions()
    targets = [[column(map(as_fmpq, row)) for row in y] for y in ys]
    if model.attention == "hardmax":
        outs = forward(model, xs, "exact")
        exact = [[Exact(column(map(as_fmpq, r))) for r in o] for o in outs]
        return judge(exact, targets, None, None)
    layers = Layers(model)
    bits = START_BITS
    while True:
        run = Run(layers, bits)
        proof = judge(run.outputs(xs), targets, bits, run.first_doubt)
        if proof.proved or proof.refuted or run.first_doubt is None or bits * 2 > max_bits:
            if not proof.proved and not model.exact:
                proof.reason += FLOAT64_NOTE
            return proof
        bits *= 2


# ------------------------------------------------------------------------------ the verdict
def judge(outputs: list[list], targets: list[list], bits: int | None,
          doubt: str | None) -> Proof:
    """Compare every pair's output tokens with its target set: exact points with ``==`` on
    rationals, as sets. A pair with a token that is not an exact point is not proved; a pair
    whose exact outputs differ from its targets refutes the model."""
    pairs, failure, refutation, refuted_pair = [], None, None, None
    for j, (toks, want) in enumerate(zip(outputs, targets, strict=True)):
        loose = [i for i, t in enumerate(toks) if not isinstance(t, Exact)]
        if loose:
            pairs.append(False)
            failure = failure or _loose_reason(j, loose[0], toks[loose[0]], doubt)
            continue
        wrong = _mismatch(j, [t.o for t in toks], want)
        pairs.append(wrong is None)
        if wrong is not None and refutation is None:
            refutation, refuted_pair = wrong, j
    how = "exact rational forward pass" if bits is None else \
        f"{bits}-bit balls, exact rationals from each token's last flat piece on"
    if refutation is not None:
        return Proof(False, bits, refutation, refuted=True, pairs=pairs,
                     refuted_pair=refuted_pair)
    if failure is not None:
        return Proof(False, bits, failure, pairs=pairs)
    return Proof(True, bits, f"every output token of the {len(pairs)} pairs is exactly a "
                             f"target and every target is reached ({how})", pairs=pairs)


def _mismatch(j: int, got: list, want: list) -> str | None:
    """Why the exact outputs ``got`` differ from the target set ``want`` as sets, or None."""
    for i, o in enumerate(got):
        if not any(o == y for y in want):
            return (f"pair {j}, position {i}: the output is exactly {_show(o)}, which is not "
                    "exactly a target")
    for y in want:
        if not any(o == y for o in got):
            return f"pair {j}: the target {_show(y)} is not exactly an output"
    return None


def _loose_reason(j: int, i: int, tok, doubt: str | None) -> str:
    if isinstance(tok, Line):
        what = (f"lies on a line o + s·e with s in {tok.s.str(5, radius=False)}…, and no later "
                "layer is flat along that line")
    else:
        what = "is only enclosed in a ball, not shown to be a single exact point"
    why = f"; {doubt}" if doubt else "; every ReLU sign was decided, so more precision won't help"
    return f"pair {j}, position {i}: the output {what}{why}"


def _show(o: fmpq_mat) -> str:
    """A point for a message: exact if short, else to 17 significant digits."""
    exact = ", ".join(str(v) for v in o.entries())
    if len(exact) <= 80:
        return f"({exact})"
    return "≈(" + ", ".join(f"{float(v):.17g}" for v in o.entries()) + ")"
