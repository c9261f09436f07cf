"""Rigorous ball evaluation of a model on its data (python-flint ``arb`` and ``fmpq``).

Every step either encloses the true real value or computes it exactly, so whatever is read
from the outputs is a bound, never a measurement; ``certify`` uses it to prove softmax models
exact, ``bound`` to bound their errors (docs/verification.md, docs/proofs.md "Method").

A token is carried in the tightest of three forms:

* ``Exact``: the token is exactly a rational point o;
* ``Line``: the token is o + s·e on an exact line (o, e rational, a ``Frame``), s a ball;
* ``Ball``: a ball vector that contains the token.

FF layers act by pieces: when every unit's sign is certain the layer is the exact affine map of
that activation pattern, so a snap that is flat on the data sends its tokens to exact points
instead of widening their balls. Softmax rows are a dominant token plus weighted differences;
no weight is ever dropped. Causal models attend to the prefix only; stored positions are added
to the inputs exactly first. Nothing is read from ``model.meta``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import numpy as np
from flint import arb, arb_mat, ctx, fmpq, fmpq_mat, fmpz

from ..evaluate.jacobians import flag_patterns
from ..model import FF, SA, Head, Transformer
from ..numbers import to_fraction
from .ball_screen import MIN_TOKENS, LayerScreen, token_boxes


# ------------------------------------------------------------------------------ exact values
def as_fmpq(v) -> fmpq:
    """The exact value of a parameter or coordinate (Fraction, int or float) as fmpq."""
    f = to_fraction(v)
    return fmpq(f.numerator, f.denominator)


def column(values) -> fmpq_mat:
    values = list(values)
    return fmpq_mat(len(values), 1, values)


def _mat(a: np.ndarray) -> fmpq_mat:
    return fmpq_mat(a.shape[0], a.shape[1], [as_fmpq(v) for v in a.flat])


@cache
def _identity(d: int) -> fmpq_mat:
    return fmpq_mat(d, d, [1 if i == j else 0 for i in range(d) for j in range(d)])


def _is_zero(m: fmpq_mat) -> bool:
    return m == fmpq_mat(m.nrows(), m.ncols())


# ------------------------------------------------------------------------------ tokens
class Exact:
    """A token that is exactly the rational point ``o`` (d×1). Instances are shared between
    tokens and sequences; ``images`` caches the point's image under each FF layer and
    ``reads`` its reading f·o of each direction."""

    __slots__ = ("o", "images", "reads")

    def __init__(self, o: fmpq_mat):
        self.o = o
        self.images: dict[int, Exact] = {}
        self.reads: dict[int, fmpq] = {}


class Frame:
    """The exact line {o + s·e : s real}, shared by every token on it; caches the exact
    readings (f·o, f·e) of each direction and the image of each activation pattern."""

    __slots__ = ("o", "e", "reads", "images")

    def __init__(self, o: fmpq_mat, e: fmpq_mat):
        self.o, self.e = o, e
        self.reads: dict[int, tuple] = {}
        self.images: dict[tuple, Frame | Exact] = {}


def _frame_or_point(o: fmpq_mat, e: fmpq_mat) -> Frame | Exact:
    return Exact(o) if _is_zero(e) else Frame(o, e)


class Line:
    """A token o + s·e on an exact line (``frame``) with s in the ball ``s``."""

    __slots__ = ("frame", "s", "reads", "box")

    def __init__(self, frame: Frame, s: arb):
        self.frame, self.s = frame, s
        self.reads: dict[int, arb | fmpq] = {}
        self.box: tuple | None = None  # the screen's float64 box, once read


class Ball:
    """A token o + v: the ball vector ``v`` (d×1) plus an exact rational part ``o`` (d×1, or
    None for 0). FF layers add their exact offsets to o, so a coordinate no ball reaches
    stays exact, even where its value is no binary number."""

    __slots__ = ("v", "o", "reads", "box")

    def __init__(self, v: arb_mat, o: fmpq_mat | None = None):
        self.v, self.o = v, o
        self.reads: dict[int, arb] = {}
        self.box: tuple | None = None  # the screen's float64 box, once read


def _ball_or_point(v: arb_mat, o: fmpq_mat | None):
    """o + v, as the exact point it is when every entry of v is an exact finite number."""
    entries = [v[i, 0] for i in range(v.nrows())]
    if not all(x.is_exact() and x.is_finite() for x in entries):
        return Ball(v, o)
    point = column(_exact_value(x) for x in entries)
    return Exact(point if o is None else point + o)


def _exact_value(x: arb) -> fmpq:
    """The value of an exact arb (a binary number m·2^e) as fmpq."""
    m, e = x.man_exp()
    return fmpq(m) * fmpq(2) ** int(e) if e >= 0 else fmpq(m, fmpz(2) ** int(-e))


def as_ball(tok) -> arb_mat:
    """Any token as a ball column vector (at the current precision)."""
    if isinstance(tok, Ball):
        return tok.v if tok.o is None else tok.v + arb_mat(tok.o)
    if isinstance(tok, Exact):
        return arb_mat(tok.o)
    return arb_mat(tok.frame.o) + arb_mat(tok.frame.e) * tok.s


def _read(tok, f: fmpq_mat):
    """The token's reading f·x (``f`` a 1×d direction): exact for an exact point and for a
    line orthogonal to f, else a ball. Cached on the token (a token object is never moved)."""
    hit = tok.reads.get(id(f))
    if hit is not None:
        return hit
    if isinstance(tok, Exact):
        r = (f * tok.o)[0, 0]
    elif isinstance(tok, Ball):
        r = (arb_mat(f) * tok.v)[0, 0]
        if tok.o is not None:
            r = r + (f * tok.o)[0, 0]
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
    if isinstance(tok, Ball):
        return Ball(arb_mat(M) * tok.v, v if tok.o is None else M * tok.o + v)
    if isinstance(tok, Exact):
        return Exact(M * tok.o + v)
    img = _frame_or_point(M * tok.frame.o + v, M * tok.frame.e)
    return img if isinstance(img, Exact) else Line(img, tok.s)


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
    point: Exact | None = None
    frame: Frame | None = None
    g: fmpq_mat | None = None


def _piece(M: fmpq_mat, v: fmpq_mat) -> _Piece:
    d = M.nrows()
    if M == _identity(d):
        return _Piece(M, v, "still" if _is_zero(v) else "identity")
    first = next((k for k, x in enumerate(M.entries()) if x != 0), None)
    if first is None:
        return _Piece(M, v, "zero", point=Exact(v))
    i0, j0 = divmod(first, d)
    e = fmpq_mat(d, 1, [M[i, j0] for i in range(d)])
    g = fmpq_mat(1, d, [M[i0, j] / M[i0, j0] for j in range(d)])
    if e * g == M:
        return _Piece(M, v, "rank1", frame=Frame(v, e), g=g)
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
        self.eta = as_fmpq(ff.eta)
        self.U, self.W = _mat(ff.U), _mat(ff.W)
        self.b = column(map(as_fmpq, ff.b))
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
        self._screen: LayerScreen | None = None

    @property
    def screen(self) -> LayerScreen:
        """The layer's float64 screen (:mod:`.ball_screen`), built on first use."""
        if self._screen is None:
            rows = [[self.U[i, j] for j in range(self.d)] for i in range(self.w)]
            self._screen = LayerScreen(rows, self.bias, self.reads)
        return self._screen

    def screened_pattern(self, signs: np.ndarray) -> tuple:
        """The activation pattern with these signs (the screen's, 0/1) on the screen's
        units."""
        S = list(self.screen.pattern)
        for i, on in zip(self.screen.rows, signs.tolist(), strict=True):
            S[i] = bool(on)
        return tuple(S)

    def stays(self, S: tuple) -> bool:
        """Whether the pattern S leaves a token where it is."""
        return self.piece(S).kind == "still"

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
        """The exact affine map of the activation pattern S (cached)."""
        if S not in self._pieces:
            on = [i for i in range(self.w) if S[i]]
            WS = fmpq_mat(self.d, len(on), [self.W[r, i] for r in range(self.d) for i in on])
            US = fmpq_mat(len(on), self.d, [self.U[i, c] for i in on for c in range(self.d)])
            bS = fmpq_mat(len(on), 1, [self.bias[i] for i in on])
            self._pieces[S] = _piece(WS * US + _identity(self.d) * self.eta, WS * bS)
        return self._pieces[S]

    def exact(self, k: int, pt: Exact) -> Exact:
        """The image of an exact point (this layer is block ``k``), cached on the point."""
        if k not in pt.images:
            p = self.piece(self.pattern(pt))
            pt.images[k] = pt if p.kind == "still" else Exact(p.M * pt.o + p.v)
        return pt.images[k]

    def line_image(self, k: int, fr: Frame, S: tuple) -> Frame | Exact:
        """The image of the line ``fr`` on the pattern S, cached on the frame."""
        if (k, S) not in fr.images:
            p = self.piece(S)
            fr.images[k, S] = _frame_or_point(p.M * fr.o + p.v, p.M * fr.e)
        return fr.images[k, S]


class _HeadQ:
    """One head in exact rationals: A = α·I + a·cᵀ, V = β·I + p·qᵀ."""

    def __init__(self, head: Head):
        self.alpha, self.beta = as_fmpq(head.A.alpha), as_fmpq(head.V.beta)
        self.a, self.c = column(map(as_fmpq, head.A.a)), column(map(as_fmpq, head.A.c))
        self.p, self.q = column(map(as_fmpq, head.V.p)), column(map(as_fmpq, head.V.q))
        self.v_zero = head.V.is_zero()


class _SAq:
    """A self-attention layer in exact rationals: ρ and its heads (docs/heads.md)."""

    def __init__(self, sa: SA, tau):
        d = len(sa.heads[0].A.a)
        self.rho = as_fmpq(sa.rho)
        self.heads = [_HeadQ(h) for h in sa.heads if not h.V.is_zero()]
        self.tau = as_fmpq(tau)
        self.identity = sa.is_identity()
        self.v_zero = not self.heads
        self.rho_I = _identity(d) * self.rho
        # one distinct point x in the sequence: every head averages x alone, so
        # x ↦ ρx + Σ_h V_h x, an exact linear map
        self.alone = self.rho_I
        for h in self.heads:
            self.alone = self.alone + _identity(d) * h.beta + h.p * h.q.transpose()
        self.zero = fmpq_mat(d, 1)


class Layers:
    """Every block of a softmax model in exact rationals (read from the parameters only), its
    stored positions and whether it is causal. ``tau``: another temperature than the model's."""

    def __init__(self, model: Transformer, tau=None):
        if model.attention != "softmax":
            raise ValueError("the ball pass evaluates softmax attention only")
        tau = tau if tau is not None else model.tau if model.tau is not None else 1
        if as_fmpq(tau) <= 0:
            raise ValueError(f"the model's temperature tau must be positive, got {tau}")
        self.causal = model.causal
        self.positions = None if model.positions is None else \
            [[as_fmpq(v) for v in row] for row in np.asarray(model.positions)]
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
    boxes: tuple | None = None  # the screen's (m, R, boxed) of ``toks``, once read

    def merge(self) -> None:
        """Keep equal exact points once (with the summed count): a token's image depends
        only on the token and on its sequence's multiset, so equal points stay equal. Not in
        a causal pass, where equal points see different prefixes."""
        toks, counts, remap, points = [], [], [], []
        for t, c in zip(self.toks, self.counts, strict=True):
            same = next((i for i in points if toks[i] is t or toks[i].o == t.o), None) \
                if isinstance(t, Exact) else None
            if same is not None:
                counts[same] += c
                remap.append(same)
                continue
            if isinstance(t, Exact):
                points.append(len(toks))
            remap.append(len(toks))
            toks.append(t)
            counts.append(c)
        self.toks, self.counts = toks, counts
        self.owner = [remap[i] for i in self.owner]


class Run:
    """One evaluation of the model on the data with balls of ``bits`` bits of precision."""

    def __init__(self, layers: Layers, bits: int):
        self.layers, self.bits = layers, bits
        self.first_doubt: str | None = None  # the first undecided ReLU sign, if any
        self._arb: dict[int, tuple] = {}

    def outputs(self, xs: list[np.ndarray], start: int = 0) -> list[list]:
        """Per pair, the token (in one of the three forms) at every output position. ``xs``:
        the exact rows entering block ``start`` (the inputs, before the positions, when 0)."""
        saved_prec = ctx.prec
        ctx.prec = self.bits
        try:
            seqs = [self._start(j, x, start == 0) for j, x in enumerate(xs)]
            for k, (ff, sa) in enumerate(self.layers.blocks[start:], start):
                screen = _screened(ff, seqs) if ff is not None else None
                for j, seq in enumerate(seqs):
                    old = seq.toks
                    if ff is not None:
                        seq.toks = self._ff_seq(k, ff, j, old, None if screen is None
                                                else (screen[0][j], *screen[1:]))
                    if sa is not None and not sa.identity:
                        seq.toks = self._sa(sa, seq)
                    if seq.toks is not old and \
                            any(t is not u for t, u in zip(seq.toks, old, strict=True)):
                        seq.boxes = None
                        if not self.layers.causal:
                            seq.merge()
            return [[seq.toks[i] for i in seq.owner] for seq in seqs]
        finally:
            ctx.prec = saved_prec

    def _start(self, j: int, x, positions: bool) -> _Seq:
        """Sequence j's rows as exact points, with its stored positions added when
        ``positions`` (the rows are the inputs)."""
        rows = [[as_fmpq(v) for v in r] for r in x]
        pos = self.layers.positions
        if pos is not None and positions:
            if len(rows) > len(pos):
                raise ValueError(f"sequence {j} has {len(rows)} tokens but the model stores "
                                 f"{len(pos)} positions")
            rows = [[a + b for a, b in zip(r, p, strict=True)]
                    for r, p in zip(rows, pos[: len(rows)], strict=True)]
        seq = _Seq([Exact(column(r)) for r in rows], [1] * len(rows), list(range(len(rows))))
        if not self.layers.causal:
            seq.merge()
        return seq

    def arb(self, m: fmpq_mat) -> arb_mat:
        """``m`` as balls at this run's precision (cached; the exact matrix is kept alive)."""
        hit = self._arb.get(id(m))
        if hit is None:
            hit = self._arb[id(m)] = (m, arb_mat(m))
        return hit[1]

    # -------------------------------------------------------------------------- FF
    def _ff_seq(self, k: int, ff: _FFq, j: int, toks: list, screen: tuple | None) -> list:
        """FF on a sequence's tokens. ``screen``: (per token the index of its screened
        pattern, −1 for none; the patterns; whether each leaves a token still, with False
        last): such tokens stay as they are or take their pattern's piece. The list itself
        comes back when no token moves."""
        if screen is None:
            return [self._ff(k, ff, t, j) for t in toks]
        codes, patterns, stays = screen
        codes = codes.tolist()
        if all(stays[c] for c in codes):
            return toks
        return [t if stays[c] else self._ff(k, ff, t, j, None if c < 0 else patterns[c])
                for t, c in zip(toks, codes, strict=True)]

    def _ff(self, k: int, ff: _FFq, tok, j: int, S: tuple | None = None):
        """FF on one token: the exact piece of its activation pattern (``S`` when the screen
        has decided it) when every sign is certain, else the rigorous ReLU hull (the token
        is then only enclosed)."""
        if isinstance(tok, Exact):
            return ff.exact(k, tok)
        S = ff.pattern(tok) if S is None else S
        if S is not None:
            p = ff.piece(S)
            if p.kind == "still":
                return tok
            if isinstance(tok, Line):
                img = ff.line_image(k, tok.frame, S)
                return img if isinstance(img, Exact) else Line(img, tok.s)
            return self._ball_piece(p, tok)
        if self.first_doubt is None:
            self.first_doubt = (f"a ReLU sign in block {k} (0-based) is undecided for pair {j} "
                                f"at {self.bits} bits")
        v = as_ball(tok)
        z = self.arb(ff.U) * v + self.arb(ff.b)
        r = arb_mat(ff.w, 1, [_relu_hull(z[i, 0]) for i in range(ff.w)])
        return Ball(v * arb(ff.eta) + self.arb(ff.W) * r)

    def _ball_piece(self, p: _Piece, tok: Ball):
        """The exact piece x ↦ M·x + v on o + ball: M·o + v stays exact, M acts on the ball."""
        if p.kind == "zero":
            return p.point
        if p.kind == "rank1":
            s = (self.arb(p.g) * tok.v)[0, 0]
            return Line(p.frame, s if tok.o is None else s + (p.g * tok.o)[0, 0])
        if p.kind == "identity":
            return _ball_or_point(tok.v, p.v if tok.o is None else tok.o + p.v)
        return _ball_or_point(self.arb(p.M) * tok.v, p.v if tok.o is None else p.M * tok.o + p.v)

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
        cols = [as_ball(t) for t in seq.toks]
        X = arb_mat(n, d, [c[i, 0] for c in cols for i in range(d)])
        out = X * arb(sa.rho)
        for h in sa.heads:
            values = X * arb(h.beta) + (X * self.arb(h.q)) * self.arb(h.p).transpose()
            out = out + self._average(h, X, values, seq, arb(sa.tau))
        return [Ball(arb_mat(d, 1, [out[i, t] for t in range(d)])) for i in range(n)]

    def _average(self, h: _HeadQ, X: arb_mat, values: arb_mat, seq: _Seq, tau: arb
                 ) -> arb_mat:
        """One head's softmax averages of the rows of ``values`` (V·x_l, formed before the
        average: an entry V makes exactly ≥ 0 on every row keeps a lower bound ≥ 0), in balls:
        each row is its dominant token's value plus the weighted differences to the others
        (weights from scores shifted by the dominant score's midpoint), so a saturated row
        stays as tight as its dominant token. A causal row i weighs the keys l ≤ i only."""
        n, d = X.nrows(), X.ncols()
        S = (X * self.arb(h.c)) * (X * self.arb(h.a)).transpose()
        if h.alpha != 0:
            S = S + (X * X.transpose()) * arb(h.alpha)
        refs, weights = [], []
        for i in range(n):
            keys = range(i + 1) if self.layers.causal else range(n)
            mids = [S[i, l].mid() for l in keys]  # exact midpoints: no float64 range limit
            ref = max(keys, key=mids.__getitem__)
            m = S[i, ref].mid()
            E = {l: ((S[i, l] - m) / tau).exp() * seq.counts[l] for l in keys}
            D = sum(E.values(), arb(0))
            refs.append(ref)
            weights.append([arb(0) if l == ref or l not in E else E[l] / D for l in range(n)])
        rows = [None] * n
        V = values  # the rows averaged: V·x_l
        for ref in set(refs):
            diff = arb_mat(n, d, [arb(0) if l == ref else V[l, t] - V[ref, t]
                                  for l in range(n) for t in range(d)])
            mine = [i for i in range(n) if refs[i] == ref]
            Y = arb_mat(len(mine), n, [w for i in mine for w in weights[i]]) * diff
            for r, i in enumerate(mine):
                rows[i] = [V[ref, t] + Y[r, t] for t in range(d)]
        return arb_mat(n, d, [v for row in rows for v in row])


def _screened(ff: _FFq, seqs: list[_Seq]) -> tuple | None:
    """The float64 screen (:mod:`.ball_screen`) of one FF layer over all sequences at once:
    (per sequence, each token's index among the patterns, −1 where it has none; the
    activation patterns the screen decided; per pattern whether it leaves a token still, and
    False last, for −1). Ball and line tokens get a pattern where the screen decides every
    sign on their box; exact points and the rest take the layer's own sign tests. None where
    the layer has no screen or too few such tokens."""
    if not seqs or not ff.screen.usable:
        return None
    boxes = [_seq_boxes(seq, ff.d) for seq in seqs]
    boxed = np.concatenate([b[2] for b in boxes])
    if boxed.sum() < MIN_TOKENS:
        return None
    signs = ff.screen.signs(np.concatenate([b[0] for b in boxes])[boxed],
                            np.concatenate([b[1] for b in boxes])[boxed])
    decided = (signs >= 0).all(axis=1)
    rows, which = flag_patterns(signs[decided])
    patterns = [ff.screened_pattern(r) for r in rows]
    codes = np.full(boxed.shape, -1)
    codes[np.flatnonzero(boxed)[decided]] = which
    ends = np.cumsum([len(seq.toks) for seq in seqs]).tolist()
    return ([codes[a:b] for a, b in zip([0, *ends[:-1]], ends, strict=True)], patterns,
            [ff.stays(S) for S in patterns] + [False])


def _seq_boxes(seq: _Seq, d: int) -> tuple:
    """(m, R, boxed) of a sequence's tokens, stacked (cached until they change): boxed marks
    the ball and line tokens with a float64 box (exact points take their cached images).
    Each token's box is read once (``box``; False where it has none)."""
    if seq.boxes is None:
        new = [t for t in seq.toks if not isinstance(t, Exact) and t.box is None]
        if new:
            m, R, ok = token_boxes([as_ball(t) for t in new], d)
            for t, mt, Rt, okt in zip(new, m, R, ok.tolist(), strict=True):
                t.box = (mt, Rt) if okt else False
        got = [None if isinstance(t, Exact) else t.box for t in seq.toks]
        zero = np.zeros(d)
        seq.boxes = (np.array([b[0] if b else zero for b in got]).reshape(len(got), d),
                     np.array([b[1] if b else zero for b in got]).reshape(len(got), d),
                     np.array([bool(b) for b in got], dtype=bool))
    return seq.boxes


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
