"""Proofs that a model reproduces its data exactly (see docs/proofs.md).

``prove(model, dataset)`` evaluates a softmax model on the data in rigorous ball arithmetic
(python-flint's ``arb``) and in exact rationals (``fmpq``), and succeeds only when every output
token is shown to *be* an exact rational point and the output set of every pair equals its
target set under ``==``. Every step either encloses the true real value or computes it exactly,
so a proof cannot be wrong; it may fail to be found (then ``reason`` says where), and precision
is raised from 64 bits up to ``max_bits`` while some ReLU sign stays undecided.

A token is carried in the tightest of three forms (see docs/proofs.md, "Method"):

* ``_Exact``: the token is exactly a rational point o;
* ``_Line``: the token is o + s·e on an exact line (o, e rational, a ``_Frame``), s a ball;
* ``_Ball``: a ball vector that contains the token.

FF layers act by pieces: when every unit's sign is certain the layer is the exact affine map of
that activation pattern. Softmax rows are a dominant token plus weighted differences. Hardmax
models are proved by the exact rational forward pass. Nothing is read from ``model.meta``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
from flint import arb, arb_mat, ctx, fmpq, fmpq_mat

from ..data import Dataset
from ..evaluate import forward
from ..model import FF, SA, Head, Transformer
from ..numbers import to_fraction

START_BITS = 64


@dataclass
class Proof:
    """The outcome of ``prove``.

    ``proved``: every pair's output set equals its target set, shown exactly. ``bits``: the ball
    precision of the attempt reported (None for the exact hardmax pass). ``refuted``: an output
    was computed exactly and is not a target (or a target is missed): the model is wrong on the
    data. ``pairs``: per pair, whether its output set was proved equal to its target set.
    """

    proved: bool
    bits: int | None
    reason: str
    refuted: bool = False
    pairs: list[bool] = field(default_factory=list)
    seconds: float = 0.0


def prove(model: Transformer, dataset: Dataset, max_bits: int = 1024) -> Proof:
    """Prove that ``model`` maps every input of ``dataset`` to its target set exactly.

    Softmax models: ball arithmetic from 64 bits, doubled up to ``max_bits`` while some ReLU
    sign is undecided. Hardmax models: the exact rational forward pass. See docs/proofs.md.
    """
    if max_bits < START_BITS:
        raise ValueError(f"max_bits must be at least {START_BITS}, got {max_bits}")
    if dataset.d != model.d:
        raise ValueError(f"the dataset has dimension d = {dataset.d}, the model d = {model.d}")
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
    targets = [[_col(map(_q, row)) for row in y] for y in ys]
    if model.attention == "hardmax":
        outs = forward(model, xs, "exact")
        return _judge([[_Exact(_col(map(_q, r))) for r in o] for o in outs], targets, None, None)
    layers = _Layers(model)
    bits = START_BITS
    while True:
        run = _Run(layers, bits)
        proof = _judge(run.outputs(xs), targets, bits, run.first_doubt)
        if proof.proved or proof.refuted or run.first_doubt is None or bits * 2 > max_bits:
            if not proof.proved and not model.exact:
                proof.reason += (" (float64 parameters: rounded snaps are not exactly flat, so "
                                 "in real arithmetic the outputs miss the targets slightly)")
            return proof
        bits *= 2


# ------------------------------------------------------------------------------ exact values
def _q(v) -> fmpq:
    """The exact value of a parameter or coordinate (Fraction, int or float) as fmpq."""
    f = to_fraction(v)
    return fmpq(f.numerator, f.denominator)


def _col(values) -> fmpq_mat:
    values = list(values)
    return fmpq_mat(len(values), 1, values)


def _mat(a: np.ndarray) -> fmpq_mat:
    return fmpq_mat(a.shape[0], a.shape[1], [_q(v) for v in a.flat])


def _identity(d: int) -> fmpq_mat:
    return fmpq_mat(d, d, [1 if i == j else 0 for i in range(d) for j in range(d)])


def _is_zero(m: fmpq_mat) -> bool:
    return m == fmpq_mat(m.nrows(), m.ncols())


# ------------------------------------------------------------------------------ tokens
class _Exact:
    """A token that is exactly the rational point ``o`` (d×1). Instances are shared between
    tokens and sequences; ``images`` caches the point's image under each FF layer and
    ``reads`` its reading f·o of each direction."""

    __slots__ = ("o", "images", "reads")

    def __init__(self, o: fmpq_mat):
        self.o = o
        self.images: dict[int, _Exact] = {}
        self.reads: dict[int, fmpq] = {}


class _Frame:
    """The exact line {o + s·e : s real}, shared by every token on it; caches the exact
    readings (f·o, f·e) of each direction and the image of each activation pattern."""

    __slots__ = ("o", "e", "reads", "images")

    def __init__(self, o: fmpq_mat, e: fmpq_mat):
        self.o, self.e = o, e
        self.reads: dict[int, tuple] = {}
        self.images: dict[tuple, _Frame | _Exact] = {}


def _frame_or_point(o: fmpq_mat, e: fmpq_mat) -> _Frame | _Exact:
    return _Exact(o) if _is_zero(e) else _Frame(o, e)


class _Line:
    """A token o + s·e on an exact line (``frame``) with s in the ball ``s``."""

    __slots__ = ("frame", "s", "reads")

    def __init__(self, frame: _Frame, s: arb):
        self.frame, self.s = frame, s
        self.reads: dict[int, arb | fmpq] = {}


class _Ball:
    """A token enclosed in the ball vector ``v`` (d×1)."""

    __slots__ = ("v", "reads")

    def __init__(self, v: arb_mat):
        self.v = v
        self.reads: dict[int, arb] = {}


def _ball(tok) -> arb_mat:
    """Any token as a ball column vector (at the current precision)."""
    if isinstance(tok, _Ball):
        return tok.v
    if isinstance(tok, _Exact):
        return arb_mat(tok.o)
    return arb_mat(tok.frame.o) + arb_mat(tok.frame.e) * tok.s


def _read(tok, f: fmpq_mat):
    """The token's reading f·x (``f`` a 1×d direction): exact for an exact point and for a
    line orthogonal to f, else a ball. Cached on the token (a token object is never moved)."""
    hit = tok.reads.get(id(f))
    if hit is not None:
        return hit
    if isinstance(tok, _Exact):
        r = (f * tok.o)[0, 0]
    elif isinstance(tok, _Ball):
        r = (arb_mat(f) * tok.v)[0, 0]
    else:
        fr = tok.frame
        if id(f) not in fr.reads:
            fr.reads[id(f)] = ((f * fr.o)[0, 0], (f * fr.e)[0, 0])
        fo, fe = fr.reads[id(f)]
        r = fo if fe == 0 else arb(fo) + arb(fe) * tok.s
    tok.reads[id(f)] = r
    return r


def _affine(tok, M: fmpq_mat, v: fmpq_mat):
    """The exact affine map x ↦ M·x + v applied to a token, keeping its form."""
    if isinstance(tok, _Ball):
        return _Ball(arb_mat(M) * tok.v + arb_mat(v))
    if isinstance(tok, _Exact):
        return _Exact(M * tok.o + v)
    img = _frame_or_point(M * tok.frame.o + v, M * tok.frame.e)
    return img if isinstance(img, _Exact) else _Line(img, tok.s)


# ------------------------------------------------------------------------------ layers
@dataclass
class _Piece:
    """FF on one activation pattern S: x ↦ M·x + v, M = η·I + Σ_{i∈S} W_i U_iᵀ, v = Σ W_i b_i.

    ``kind``: "still" (M = I, v = 0: nothing moves), "identity" (M = I), "zero" (M = 0: every
    input goes to ``point``), "rank1" (M = e·gᵀ: every input goes onto ``frame``, the line
    v + s·e, at s = g·x) or "general"."""

    M: fmpq_mat
    v: fmpq_mat
    kind: str
    point: _Exact | None = None
    frame: _Frame | None = None
    g: fmpq_mat | None = None


def _piece(M: fmpq_mat, v: fmpq_mat) -> _Piece:
    d = M.nrows()
    if M == _identity(d):
        return _Piece(M, v, "still" if _is_zero(v) else "identity")
    nz = [(i, j) for i in range(d) for j in range(d) if M[i, j] != 0]
    if not nz:
        return _Piece(M, v, "zero", point=_Exact(v))
    i0, j0 = nz[0]
    e = fmpq_mat(d, 1, [M[i, j0] for i in range(d)])
    g = fmpq_mat(1, d, [M[i0, j] / M[i0, j0] for j in range(d)])
    if e * g == M:
        return _Piece(M, v, "rank1", frame=_Frame(v, e), g=g)
    return _Piece(M, v, "general")


class _Directions:
    """One shared object per distinct row of U over all layers, so that a token computes its
    reading f·x once for every layer that reads f (the construction's hats and snaps)."""

    def __init__(self):
        self.rows: list[fmpq_mat] = []

    def canonical(self, row: fmpq_mat) -> fmpq_mat | None:
        """The shared object equal to ``row``; None for a zero row."""
        if _is_zero(row):
            return None
        same = next((r for r in self.rows if r == row), None)
        if same is None:
            self.rows.append(row)
        return row if same is None else same


class _FFq:
    """An FF layer in exact rationals. Unit i reads f_i·x + b_i for a shared direction f_i.
    When every unit reads one direction f, a reading below (above) all switch points −b_i
    gives the pattern ``below`` (``above``) at one comparison. Pieces and exact images are
    independent of the ball precision and kept across precision escalations."""

    def __init__(self, ff: FF, directions: _Directions):
        self.eta = _q(ff.eta)
        self.U, self.W = _mat(ff.U), _mat(ff.W)
        self.b = _col(map(_q, ff.b))
        self.w, self.d = self.U.nrows(), self.U.ncols()
        self.bias = self.b.entries()
        self.reads = [directions.canonical(fmpq_mat(1, self.d, [self.U[i, j] for j in
                                                                range(self.d)]))
                      for i in range(self.w)]
        dirs = {id(f): f for f in self.reads if f is not None}
        self.single = next(iter(dirs.values())) if len(dirs) == 1 else None
        if self.single is not None:
            switch = [-bi for f, bi in zip(self.reads, self.bias, strict=True) if f is not None]
            self.lo, self.hi = min(switch), max(switch)
            self.lo_ball, self.hi_ball = arb(self.lo).lower(), arb(self.hi).upper()
            self.below = tuple(f is None and bi > 0 for f, bi in zip(self.reads, self.bias,
                                                                     strict=True))
            self.above = tuple(f is not None or bi > 0 for f, bi in zip(self.reads, self.bias,
                                                                        strict=True))
        self._pieces: dict[tuple, _Piece] = {}

    def pattern(self, tok) -> tuple | None:
        """The token's activation pattern (units with f_i·x + b_i > 0), None if a sign is
        undecided. Exact tokens always get one."""
        if self.single is not None:
            t = _read(tok, self.single)
            if t < self.lo if isinstance(t, fmpq) else t.upper() < self.lo_ball:
                return self.below
            if t > self.hi if isinstance(t, fmpq) else t.lower() > self.hi_ball:
                return self.above
        S = tuple(bi > 0 if f is None else _sign(_read(tok, f) + bi)
                  for f, bi in zip(self.reads, self.bias, strict=True))
        return None if None in S else S

    def piece(self, S: tuple) -> _Piece:
        if S not in self._pieces:
            mask = fmpq_mat(self.w, self.w, [1 if i == j and S[i] else 0
                                             for i in range(self.w) for j in range(self.w)])
            WS = self.W * mask
            M = WS * self.U + _identity(self.d) * self.eta
            self._pieces[S] = _piece(M, WS * self.b)
        return self._pieces[S]

    def exact(self, k: int, pt: _Exact) -> _Exact:
        """The image of an exact point (this layer is block ``k``), cached on the point."""
        if k not in pt.images:
            p = self.piece(self.pattern(pt))
            pt.images[k] = pt if p.kind == "still" else _Exact(p.M * pt.o + p.v)
        return pt.images[k]

    def line_image(self, k: int, fr: _Frame, S: tuple) -> _Frame | _Exact:
        """The image of the line ``fr`` on the pattern S, cached on the frame."""
        if (k, S) not in fr.images:
            p = self.piece(S)
            fr.images[k, S] = _frame_or_point(p.M * fr.o + p.v, p.M * fr.e)
        return fr.images[k, S]


class _HeadQ:
    """One head in exact rationals: A = α·I + a·cᵀ, V = β·I + p·qᵀ."""

    def __init__(self, head: Head):
        self.alpha, self.beta = _q(head.A.alpha), _q(head.V.beta)
        self.a, self.c = _col(map(_q, head.A.a)), _col(map(_q, head.A.c))
        self.p, self.q = _col(map(_q, head.V.p)), _col(map(_q, head.V.q))
        self.v_zero = head.V.is_zero()


class _SAq:
    """A self-attention layer in exact rationals: ρ and its heads (docs/heads.md)."""

    def __init__(self, sa: SA, tau):
        d = len(sa.heads[0].A.a)
        self.rho = _q(sa.rho)
        self.heads = [_HeadQ(h) for h in sa.heads if not h.V.is_zero()]
        self.tau = _q(tau)
        self.identity = sa.is_identity()
        self.v_zero = not self.heads
        self.rho_I = _identity(d) * self.rho
        # one distinct point x in the sequence: every head averages x alone, so
        # x ↦ ρx + Σ_h V_h x, an exact linear map
        self.alone = self.rho_I
        for h in self.heads:
            self.alone = self.alone + _identity(d) * h.beta + h.p * h.q.transpose()
        self.zero = fmpq_mat(d, 1)


class _Layers:
    """Every block of a softmax model in exact rationals (read from the parameters only)."""

    def __init__(self, model: Transformer):
        tau = model.tau if model.tau is not None else 1
        if _q(tau) <= 0:
            raise ValueError(f"the model's temperature tau must be positive, got {tau}")
        directions = _Directions()
        self.blocks = [(None if b.ff is None else _FFq(b.ff, directions),
                        None if b.sa is None else _SAq(b.sa, tau)) for b in model.blocks]


# ------------------------------------------------------------------------------ the pass
@dataclass
class _Seq:
    """One sequence: distinct tokens with multiplicities, and the token of each position."""

    toks: list
    counts: list[int]
    owner: list[int]

    def merge(self) -> None:
        """Keep equal exact points once (with the summed count): a token's image depends
        only on the token and on its sequence's multiset, so equal points stay equal."""
        toks, counts, remap, points = [], [], [], []
        for t, c in zip(self.toks, self.counts, strict=True):
            same = next((i for i in points if toks[i] is t or toks[i].o == t.o), None) \
                if isinstance(t, _Exact) else None
            if same is not None:
                counts[same] += c
                remap.append(same)
                continue
            if isinstance(t, _Exact):
                points.append(len(toks))
            remap.append(len(toks))
            toks.append(t)
            counts.append(c)
        self.toks, self.counts = toks, counts
        self.owner = [remap[i] for i in self.owner]


class _Run:
    """One evaluation of the model on the data with balls of ``bits`` bits of precision."""

    def __init__(self, layers: _Layers, bits: int):
        self.layers, self.bits = layers, bits
        self.first_doubt: str | None = None  # the first undecided ReLU sign, if any
        self._arb: dict[int, tuple] = {}

    def outputs(self, xs: list[np.ndarray]) -> list[list]:
        """Per pair, the token (in one of the three forms) at every output position."""
        saved_prec = ctx.prec
        ctx.prec = self.bits
        try:
            seqs = []
            for x in xs:
                seq = _Seq([_Exact(_col(map(_q, r))) for r in x], [1] * len(x),
                           list(range(len(x))))
                seq.merge()
                seqs.append(seq)
            for k, (ff, sa) in enumerate(self.layers.blocks):
                for j, seq in enumerate(seqs):
                    old = seq.toks
                    if ff is not None:
                        seq.toks = [self._ff(k, ff, t, j) for t in old]
                    if sa is not None and not sa.identity:
                        seq.toks = self._sa(sa, seq)
                    if any(t is not u for t, u in zip(seq.toks, old, strict=True)):
                        seq.merge()
            return [[seq.toks[i] for i in seq.owner] for seq in seqs]
        finally:
            ctx.prec = saved_prec

    def arb(self, m: fmpq_mat) -> arb_mat:
        """``m`` as balls at this run's precision (cached; the exact matrix is kept alive)."""
        hit = self._arb.get(id(m))
        if hit is None:
            hit = self._arb[id(m)] = (m, arb_mat(m))
        return hit[1]

    # -------------------------------------------------------------------------- FF
    def _ff(self, k: int, ff: _FFq, tok, j: int):
        """FF on one token: the exact piece of its activation pattern when every sign is
        certain, else the rigorous ReLU hull (the token is then only enclosed)."""
        if isinstance(tok, _Exact):
            return ff.exact(k, tok)
        S = ff.pattern(tok)
        if S is not None:
            p = ff.piece(S)
            if p.kind == "still":
                return tok
            if isinstance(tok, _Line):
                img = ff.line_image(k, tok.frame, S)
                return img if isinstance(img, _Exact) else _Line(img, tok.s)
            return self._ball_piece(p, tok.v)
        if self.first_doubt is None:
            self.first_doubt = (f"a ReLU sign in block {k} (0-based) is undecided for pair {j} "
                                f"at {self.bits} bits")
        v = _ball(tok)
        z = self.arb(ff.U) * v + self.arb(ff.b)
        r = arb_mat(ff.w, 1, [_relu_hull(z[i, 0]) for i in range(ff.w)])
        return _Ball(v * arb(ff.eta) + self.arb(ff.W) * r)

    def _ball_piece(self, p: _Piece, v: arb_mat):
        if p.kind == "zero":
            return p.point
        if p.kind == "rank1":
            return _Line(p.frame, (self.arb(p.g) * v)[0, 0])
        if p.kind == "identity":
            return _Ball(v + self.arb(p.v))
        return _Ball(self.arb(p.M) * v + self.arb(p.v))

    # -------------------------------------------------------------------------- SA
    def _sa(self, sa: _SAq, seq: _Seq) -> list:
        if sa.v_zero:
            return [_affine(t, sa.rho_I, sa.zero) for t in seq.toks]
        if len(seq.toks) == 1:
            return [_affine(seq.toks[0], sa.alone, sa.zero)]
        return self._attend(sa, seq)

    def _attend(self, sa: _SAq, seq: _Seq) -> list:
        """ρ·x_i plus, per head, V applied to the head's softmax averages (:meth:`_average`)."""
        n, d = len(seq.toks), sa.rho_I.nrows()
        cols = [_ball(t) for t in seq.toks]
        X = arb_mat(n, d, [c[i, 0] for c in cols for i in range(d)])
        out = X * arb(sa.rho)
        for h in sa.heads:
            Y = self._average(h, X, seq, arb(sa.tau))
            out = out + Y * arb(h.beta) + (Y * self.arb(h.q)) * self.arb(h.p).transpose()
        return [_Ball(arb_mat(d, 1, [out[i, t] for t in range(d)])) for i in range(n)]

    def _average(self, h: _HeadQ, X: arb_mat, seq: _Seq, tau: arb) -> arb_mat:
        """One head's softmax averages in balls: each row is its dominant token plus the
        weighted differences to the others (weights from scores shifted by the dominant score's
        midpoint), so a saturated row stays as tight as its dominant token."""
        n, d = X.nrows(), X.ncols()
        S = (X * self.arb(h.c)) * (X * self.arb(h.a)).transpose()
        if h.alpha != 0:
            S = S + (X * X.transpose()) * arb(h.alpha)
        refs, weights = [], []
        for i in range(n):
            mids = [float(S[i, l].mid()) for l in range(n)]
            ref = max(range(n), key=mids.__getitem__)
            m = S[i, ref].mid()
            E = [((S[i, l] - m) / tau).exp() * seq.counts[l] for l in range(n)]
            D = sum(E[1:], E[0])
            refs.append(ref)
            weights.append([arb(0) if l == ref else E[l] / D for l in range(n)])
        rows = [None] * n
        for ref in set(refs):
            diff = arb_mat(n, d, [arb(0) if l == ref else X[l, t] - X[ref, t]
                                  for l in range(n) for t in range(d)])
            mine = [i for i in range(n) if refs[i] == ref]
            Y = arb_mat(len(mine), n, [w for i in mine for w in weights[i]]) * diff
            for r, i in enumerate(mine):
                rows[i] = [X[ref, t] + Y[r, t] for t in range(d)]
        return arb_mat(n, d, [v for row in rows for v in row])


def _sign(z: arb | fmpq) -> bool | None:
    """True if certainly > 0, False if certainly ≤ 0 (the unit is off), None if undecided
    (exact values are always decided)."""
    if isinstance(z, fmpq):
        return z > 0
    if z.lower() > 0:
        return True
    if z.upper() <= 0:
        return False
    return None


def _relu_hull(z: arb) -> arb:
    """A ball containing relu(z) for every z in the ball."""
    s = _sign(z)
    if s is not None:
        return z if s else arb(0)
    return arb(0).union(z.upper())


# ------------------------------------------------------------------------------ the verdict
def _judge(outputs: list[list], targets: list[list], bits: int | None,
           doubt: str | None) -> Proof:
    """Compare every pair's output tokens with its target set: exact points with ``==`` on
    rationals, as sets. A pair with a token that is not an exact point is not proved; a pair
    whose exact outputs differ from its targets refutes the model."""
    pairs, failure, refutation = [], None, None
    for j, (toks, want) in enumerate(zip(outputs, targets, strict=True)):
        loose = [i for i, t in enumerate(toks) if not isinstance(t, _Exact)]
        if loose:
            pairs.append(False)
            failure = failure or _loose_reason(j, loose[0], toks[loose[0]], doubt)
            continue
        wrong = _mismatch(j, [t.o for t in toks], want)
        pairs.append(wrong is None)
        refutation = refutation or wrong
    how = "exact rational forward pass" if bits is None else \
        f"{bits}-bit balls, exact rationals from each token's last flat piece on"
    if refutation is not None:
        return Proof(False, bits, refutation, refuted=True, pairs=pairs)
    if failure is not None:
        return Proof(False, bits, failure, pairs=pairs)
    return Proof(True, bits, f"every output token of the {len(pairs)} pairs is exactly a "
                             f"target and every target is reached ({how})", pairs=pairs)


def _mismatch(j: int, got: list, want: list) -> str | None:
    """Why the exact outputs ``got`` differ from the target set ``want`` as sets, or None."""
    for i, o in enumerate(got):
        if not any(o == y for y in want):
            return (f"pair {j}, position {i}: the output is exactly {_show(o)}, which is not "
                    "a target: the model is wrong on this pair")
    for y in want:
        if not any(o == y for o in got):
            return f"pair {j}: the target {_show(y)} is not an output: the model is wrong on it"
    return None


def _loose_reason(j: int, i: int, tok, doubt: str | None) -> str:
    if isinstance(tok, _Line):
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
