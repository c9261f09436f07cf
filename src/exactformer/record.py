"""What a construction did, as typed records: phases and their blocks, tests, leaders, snaps.

Each phase of a construction returns its finished blocks and one of these records; the
construction assembles them into a :class:`Construction`, kept as ``Transformer.record``. The
model file's ``"meta"`` object is written from it (:meth:`Construction.to_meta`) and read back with
every field's type checked (:meth:`Construction.from_meta`), because a file is input like any
other. Verification never needs the record to decide a verdict: it reads the layers (see
docs/verification.md); the record feeds reports and figures. Field meanings: docs/hardmax.md,
docs/softmax.md and, for :class:`CausalConstruction`, docs/causal.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .numbers import parse_exact


class RecordError(ValueError):
    """A ``meta`` object does not describe a construction; the message names the field."""


@dataclass(frozen=True)
class Span:
    """Blocks ``start``..``end`` (end exclusive) form the phase ``name``."""

    name: str
    start: int
    end: int


@dataclass(frozen=True)
class Lift:
    """A separation round that lifted ``token`` (its distinct-token id) from u = ``source`` to
    u = ``height`` with a hat of half-width ``delta``, then added λ·(sequence max) to v.
    ``channel`` c ≥ 1: the token (at u = ``source``) was lifted to ``height`` on the free
    coordinate c + 1 instead, read by its own head (docs/heads.md)."""

    round: int
    token: int
    source: str
    height: str
    delta: str
    multiplier: str
    channel: int = 0


@dataclass(frozen=True)
class SnapWindow:
    """The snap of leader ``slot`` of ``sequence``: breakpoints c1 < c2 ≤ c3 < c4 on the line."""

    sequence: int
    slot: int
    window: tuple[str, str, str, str]


@dataclass
class Construction:
    """The record of one construction (``kind`` "hardmax" or "softmax")."""

    kind: str
    seed: int
    N: int
    sum_m: int
    R: int
    phases: list[Span]
    tests: list[list[str] | None] = field(default_factory=list)  # None: a round without a lift
    lifts: list[Lift] = field(default_factory=list)
    leaders: list[list[int]] = field(default_factory=list)  # token positions, P-leader first
    interpolation_direction: list[str] | None = None
    snap_windows: list[SnapWindow] = field(default_factory=list)
    theta: str | None = None  # softmax: the temperature the geometry was built at
    folded: bool | None = None  # softmax: 1/θ folded into A, τ = 1
    tau_star: float | None = None  # softmax: largest valid temperature found (inf: any)
    keyed: dict | None = None  # keyed models (docs/keyed.md): their code, counts and scores
    data_sha256: str | None = None  # the data built for (SequenceData.sha256); None: unknown

    KEYED_FIELDS = ("coordinates", "weight", "tags", "moves", "tag_layers")

    def phase(self, name: str) -> Span | None:
        return next((p for p in self.phases if p.name == name), None)

    def to_meta(self) -> dict:
        """The JSON ``"meta"`` object (phases as {name: [start, end]}, in order)."""
        meta = {"construction": self.kind, "seed": self.seed, "N": self.N,
                "sum_m": self.sum_m, "R": self.R,
                "phases": {p.name: [p.start, p.end] for p in self.phases},
                "tests": self.tests,
                "lifts": [{"round": x.round, "token": x.token, "from": x.source,
                           "to": x.height, "delta": x.delta, "lambda": x.multiplier,
                           **({"channel": x.channel} if x.channel else {})}
                          for x in self.lifts],
                "leaders": self.leaders}
        if self.interpolation_direction is not None:
            meta["interpolation_direction"] = self.interpolation_direction
        if self.keyed is not None:
            meta["keyed"] = dict(self.keyed)
        if self.kind == "softmax":
            meta.update({"theta": self.theta, "folded": self.folded,
                         "tau_star": _tau_out(self.tau_star),
                         "snap_windows": [{"sequence": w.sequence, "slot": w.slot,
                                           "window": list(w.window)}
                                          for w in self.snap_windows]})
        return _with_hash(meta, self.data_sha256)

    @classmethod
    def from_meta(cls, meta: dict) -> Construction:
        """Parse and type-check a ``"meta"`` object written by :meth:`to_meta`."""
        r = _Reader(meta, "meta")
        kind = r.choice("construction", ("hardmax", "softmax"))
        phases = [Span(name, *_span(v, f"meta.phases.{name}"))
                  for name, v in r.get("phases", dict).items()]
        lifts = [_lift(x, f"meta.lifts[{i}]") for i, x in enumerate(r.get("lifts", list, []))]
        rec = cls(kind=kind, seed=r.integer("seed"), N=r.integer("N"),
                  sum_m=r.integer("sum_m"), R=r.integer("R"), phases=phases,
                  tests=[_opt_strings(t, f"meta.tests[{i}]")
                         for i, t in enumerate(r.get("tests", list, []))],
                  lifts=lifts,
                  leaders=[_ints(v, f"meta.leaders[{j}]")
                           for j, v in enumerate(r.get("leaders", list, []))],
                  interpolation_direction=_opt_strings(r.get("interpolation_direction",
                                                             (list, type(None)), None),
                                                       "meta.interpolation_direction"))
        keyed = r.get("keyed", (dict, type(None)), None)
        if keyed is not None:
            kr = _Reader(keyed, "meta.keyed")
            rec.keyed = {**{f: kr.integer(f) for f in cls.KEYED_FIELDS},
                         "heights": kr.integer("heights") if "heights" in keyed else 1,
                         "caps": kr.integer("caps") if "caps" in keyed else 0,
                         "bent": kr.get("bent", bool, False),
                         "scale": kr.number("scale", positive=True),
                         **_tag_fields(kr, keyed)}
            scores = kr.get("scores", (list, type(None)), None)  # softmax: (β_s, β_c)
            if scores is not None:
                rec.keyed["scores"] = _opt_strings(scores, "meta.keyed.scores")
            if "snaps" in keyed:  # softmax: moves snapped (docs/keyed.md#softmax)
                rec.keyed["snaps"] = kr.get("snaps", bool)
        if kind == "softmax":
            rec.theta = r.number("theta", default=None)
            rec.folded = r.get("folded", (bool, type(None)), None)
            rec.tau_star = _tau_in(r.get("tau_star", (int, float, str, type(None)), None))
            rec.snap_windows = [_window(w, f"meta.snap_windows[{i}]")
                                for i, w in enumerate(r.get("snap_windows", list, []))]
        rec.data_sha256 = _sha256(r.get("data_sha256", (str, type(None)), None))
        return rec


# ------------------------------------------------------------------------------ causal
@dataclass(frozen=True)
class CausalLift:
    """A causal separation round that lifted the point (token, ``position``) first seen in
    ``sequence`` from u = ``source`` to u = ``height``, then added λ·(prefix max) to v.
    ``channel`` c ≥ 1: lifted on the free coordinate c + 1 instead (from its height there),
    read by its own head (docs/causal.md)."""

    round: int
    sequence: int
    position: int
    source: str
    height: str
    multiplier: str
    channel: int = 0


@dataclass
class CausalConstruction:
    """The record of a causal construction (``kind`` "causal-hardmax" or "causal-softmax");
    field meanings: docs/causal.md. ``moves`` counts the hats (hardmax), snaps (softmax) or
    key units (``position_code`` set: docs/causal.md#position-keys)."""

    kind: str
    seed: int
    N: int
    constrained: int
    stored_positions: int
    R: int
    moves: int
    phases: list[Span]
    lifts: list[CausalLift] = field(default_factory=list)
    interpolation_direction: list[str] | None = None
    snap_windows: list[tuple[str, str, str, str]] = field(default_factory=list)
    theta: str | None = None
    folded: bool | None = None
    position_code: dict | None = None  # {"coordinates": q, "weight": w, "scale": c}: keys
    keyed: dict | None = None  # keyed causal models: tags and rounds (docs/causal.md)
    data_sha256: str | None = None  # the data built for (SequenceData.sha256); None: unknown

    KINDS = ("causal-hardmax", "causal-softmax")
    KEYED_FIELDS = ("coordinates", "weight", "tags", "rounds", "tag_layers", "heights")

    def phase(self, name: str) -> Span | None:
        return next((p for p in self.phases if p.name == name), None)

    def to_meta(self) -> dict:
        meta = {"construction": self.kind, "seed": self.seed, "N": self.N,
                "constrained": self.constrained, "stored_positions": self.stored_positions,
                "R": self.R, "moves": self.moves,
                "phases": {p.name: [p.start, p.end] for p in self.phases},
                "lifts": [{"round": x.round, "sequence": x.sequence, "position": x.position,
                           "from": x.source, "to": x.height, "lambda": x.multiplier,
                           **({"channel": x.channel} if x.channel else {})}
                          for x in self.lifts]}
        if self.interpolation_direction is not None:
            meta["interpolation_direction"] = self.interpolation_direction
        if self.position_code is not None:
            meta["position_code"] = dict(self.position_code)
        if self.keyed is not None:
            meta["keyed"] = dict(self.keyed)
        if self.kind == "causal-softmax" and self.position_code is None:
            meta.update({"theta": self.theta, "folded": self.folded,
                         "snap_windows": [list(w) for w in self.snap_windows]})
        return _with_hash(meta, self.data_sha256)

    @classmethod
    def from_meta(cls, meta: dict) -> CausalConstruction:
        r = _Reader(meta, "meta")
        kind = r.choice("construction", cls.KINDS)
        phases = [Span(name, *_span(v, f"meta.phases.{name}"))
                  for name, v in r.get("phases", dict).items()]
        lifts = []
        for i, x in enumerate(r.get("lifts", list, [])):
            lr = _Reader(x, f"meta.lifts[{i}]")
            lifts.append(CausalLift(lr.integer("round"), lr.integer("sequence"),
                                    lr.integer("position"), lr.number("from"),
                                    lr.number("to"), lr.number("lambda"),
                                    lr.get("channel", int, 0)))
        rec = cls(kind=kind, seed=r.integer("seed"), N=r.integer("N"),
                  constrained=r.integer("constrained"),
                  stored_positions=r.integer("stored_positions"), R=r.integer("R"),
                  moves=r.integer("moves"), phases=phases, lifts=lifts,
                  interpolation_direction=_opt_strings(r.get("interpolation_direction",
                                                             (list, type(None)), None),
                                                       "meta.interpolation_direction"))
        code = r.get("position_code", (dict, type(None)), None)
        if code is not None:
            cr = _Reader(code, "meta.position_code")
            rec.position_code = {"coordinates": cr.integer("coordinates"),
                                 "weight": cr.integer("weight"),
                                 "scale": cr.number("scale", positive=True)}
        keyed = r.get("keyed", (dict, type(None)), None)
        if keyed is not None:
            kr = _Reader(keyed, "meta.keyed")
            rec.keyed = {**{f: kr.integer(f) for f in cls.KEYED_FIELDS},
                         **_tag_fields(kr, keyed)}
            if "scores" in keyed:  # softmax: the rounds' score scale β
                rec.keyed["scores"] = _opt_strings(kr.get("scores", list), "meta.keyed.scores")
        if kind == "causal-softmax":
            rec.theta = r.number("theta", default=None)
            rec.folded = r.get("folded", (bool, type(None)), None)
            rec.snap_windows = [_four_strings(w, f"meta.snap_windows[{i}]")
                                for i, w in enumerate(r.get("snap_windows", list, []))]
        rec.data_sha256 = _sha256(r.get("data_sha256", (str, type(None)), None))
        return rec


def record_from_meta(meta: dict) -> Construction | CausalConstruction:
    """The typed record of a ``"meta"`` object, set or causal by its ``"construction"``."""
    if isinstance(meta, dict) and meta.get("construction") in CausalConstruction.KINDS:
        return CausalConstruction.from_meta(meta)
    return Construction.from_meta(meta)


# ------------------------------------------------------------------------------ parsing
class _Reader:
    def __init__(self, obj, where: str):
        if not isinstance(obj, dict):
            raise RecordError(f"{where}: expected an object")
        self.obj, self.where = obj, where

    def get(self, key, types, default=...):
        if key not in self.obj:
            if default is ...:
                raise RecordError(f"{self.where}.{key} is missing")
            return default
        v = self.obj[key]
        if not isinstance(v, types) or (isinstance(v, bool) and bool not in _tuple(types)):
            raise RecordError(f"{self.where}.{key}: unexpected value {v!r}"[:200])
        return v

    def integer(self, key) -> int:
        v = self.get(key, int)
        if v < 0:
            raise RecordError(f"{self.where}.{key}: must be a non-negative integer")
        return v

    def number(self, key, positive: bool = False, default=...) -> str | None:
        """A number string (kept as written), checked by the rules of every number read."""
        v = self.get(key, str if default is ... else (str, type(None)), default)
        return v if v is None else _number(v, f"{self.where}.{key}", positive)

    def choice(self, key, options):
        v = self.get(key, str)
        if v not in options:
            raise RecordError(f"{self.where}.{key}: must be one of {options}, got {v!r}")
        return v


def _tag_fields(kr: _Reader, keyed: dict) -> dict:
    """The tagging's fields of a ``keyed`` object: the smallest tag gap and, in files that
    have it, the float32 margin (docs/keyed.md#tagging)."""
    out = {"cap_margin": kr.number("cap_margin")}
    if "float32_margin" in keyed:
        out["float32_margin"] = kr.number("float32_margin")
    return out


def _tuple(types) -> tuple:
    return types if isinstance(types, tuple) else (types,)


def _span(v, where) -> tuple[int, int]:
    if not (isinstance(v, list) and len(v) == 2 and all(_is_int(x) for x in v)
            and 0 <= v[0] <= v[1]):
        raise RecordError(f"{where}: expected [start, end] with 0 <= start <= end")
    return v[0], v[1]


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _ints(v, where) -> list[int]:
    if not (isinstance(v, list) and all(_is_int(x) and x >= 0 for x in v)):
        raise RecordError(f"{where}: expected a list of non-negative integers")
    return v


def _number(v: str, where: str, positive: bool = False) -> str:
    """``v`` if it is a finite number string (:func:`~exactformer.numbers.parse_exact`), and
    positive if asked: the record's numbers are reported and plotted, so they are input too."""
    try:
        value = parse_exact(v)
    except ValueError as e:
        raise RecordError(f"{where}: {v[:40]!r} is not a number string ({e})"[:300]) from None
    if positive and value <= 0:
        raise RecordError(f"{where}: must be positive, got {v[:40]!r}")
    return v


def _opt_strings(v, where) -> list[str] | None:
    if v is None:
        return None
    if not (isinstance(v, list) and all(isinstance(x, str) for x in v)):
        raise RecordError(f"{where}: expected a list of number strings or null")
    return [_number(x, f"{where}[{i}]") for i, x in enumerate(v)]


def _lift(x, where) -> Lift:
    r = _Reader(x, where)
    return Lift(r.integer("round"), r.integer("token"), r.number("from"), r.number("to"),
                r.number("delta"), r.number("lambda"), r.get("channel", int, 0))


def _window(x, where) -> SnapWindow:
    r = _Reader(x, where)
    w = _four_strings(r.get("window", list), f"{where}.window")
    return SnapWindow(r.integer("sequence"), r.integer("slot"), w)


def _four_strings(w, where) -> tuple[str, str, str, str]:
    if not isinstance(w, list) or len(w) != 4 or not all(isinstance(c, str) for c in w):
        raise RecordError(f"{where}: expected four number strings")
    return tuple(_number(c, f"{where}[{i}]") for i, c in enumerate(w))


def _with_hash(meta: dict, sha: str | None) -> dict:
    """``meta`` with the data's sha256 added when it is known."""
    return meta if sha is None else {**meta, "data_sha256": sha}


def _sha256(v: str | None) -> str | None:
    """A data_sha256 read back: 64 lowercase hex digits, or None."""
    if v is not None and (len(v) != 64 or set(v) - set("0123456789abcdef")):
        raise RecordError(f"meta.data_sha256: expected 64 hex digits, got {v[:80]!r}")
    return v


def _tau_out(t: float | None):
    return None if t is None else ("inf" if math.isinf(t) else t)


def _tau_in(v) -> float | None:
    if v is None:
        return None
    if v == "inf":
        return math.inf
    if isinstance(v, str) or not math.isfinite(v) or v <= 0:
        raise RecordError(f"meta.tau_star: expected a positive number or \"inf\", got {v!r}")
    return float(v)
