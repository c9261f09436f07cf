"""PyTorch export: the model as an ``nn.Module``, safetensors files and a float32 verdict.

Two layouts, both taking a padded batch ``x`` (B, n, d) and a padding mask (B, n) (True at real
tokens), on any device:

* **native** (:func:`to_torch`): our FF→SA blocks. Its *file* holds the model's own parameters
  under keys that mirror the JSON model format (:func:`native_tensors`, :data:`NATIVE_FF_KEYS`,
  :data:`NATIVE_SA_KEYS`); the module keeps that model as ``module.model`` and saves from it.
  Its *evaluation form* is built from the model when the module is made (and so when a file is
  loaded): attention keeps the structured matrices A = α·I + a·cᵀ and V = β·I + p·qᵀ; an FF
  whose hidden units all read one direction f (every gadget of the construction) is evaluated
  by its *profile* (``ff="profile"``, the default): FF(x) = η·x + φ(f·x) with φ the
  piecewise-linear function given by its breakpoints, its values there (computed exactly, in
  Fractions, from the model's numbers; from a file, from the exact values of its floats) and
  its two end slopes. This is the same function, but a token on a flat part of φ (a hat's
  plateau, the zero outside a window) gets exactly the stored value instead of a sum of large
  ReLU terms that cancel only up to rounding; that is what makes float32 usable. Other FFs, and
  every FF with ``ff="dense"``, are evaluated as η·x + W·relu(U·x + b).
* **rho-eta** (:func:`to_rho_eta`): the research layout "x ← ρ·x + Attn(x); x ← η·x + FF(x)"
  with dense W_q, W_k (h×d, h = d + 1), W_v (d×d) and FF = Linear(d, 4) → ReLU → Linear(4, d).
  Its file is its state dict.

Importing this module needs torch and safetensors; the rest of exactformer does not.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from .causal_data import CausalDataset
from .data import Dataset
from .evaluate import PassStats, direction_scales
from .evaluate import forward as np_forward
from .model import FF, SA, Block, Head, ScoreMatrix, Transformer, ValueMatrix
from .modelio import atomic_path
from .numbers import to_fraction_array
from .report import hausdorff
from .tables import format_table

FORMAT = "exactformer.torch/1"
LAYOUTS = ("native", "rho-eta")
FF_FORMS = ("profile", "dense")
NATIVE_FF_KEYS = ("eta", "U", "b", "W")  # blocks.{i}.ff.{key}: (), (w, d), (w,), (d, w)
NATIVE_SA_KEYS = ("rho", "alpha", "a", "c", "beta", "p", "q")  # blocks.{i}.sa.{key}
UNIT_ROUNDOFF_32 = 2.0 ** -24


# ------------------------------------------------------------------------------ attention
def attention_weights(S: torch.Tensor, mask: torch.Tensor | None, attention: str,
                      tau, causal: bool = False) -> torch.Tensor:
    """Row-stochastic weights from scores S (B, n, n); padded keys get weight 0, and with
    ``causal`` so do keys after the query (scores above the diagonal set to −inf first).

    hardmax averages over each row's argmax set (ties average), as the NumPy evaluator does;
    softmax at temperature τ (None: 1) is ``torch.softmax(S/τ)``.
    """
    if mask is not None:
        S = S.masked_fill(~mask[:, None, :], float("-inf"))
    if causal:
        n = S.shape[-1]
        S = S.masked_fill(torch.ones(n, n, dtype=torch.bool, device=S.device).triu(1),
                          float("-inf"))
    if attention == "hardmax":
        hit = (S == S.amax(dim=-1, keepdim=True)).to(S.dtype)
        return hit / hit.sum(dim=-1, keepdim=True)
    if tau is not None and tau != 1:
        S = S / tau
    return torch.softmax(S, dim=-1)


def _keys(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """x with padded tokens zeroed, so that whatever padding holds cannot reach real tokens."""
    return x if mask is None else x.masked_fill(~mask[..., None], 0)


def _run_blocks(blocks, x: torch.Tensor, mask, attention: str, tau, causal: bool = False,
                positions: torch.Tensor | None = None) -> torch.Tensor:
    """Both layouts' forward pass: ``positions`` row i added to token i first (a causal model's
    stored positions; longer sequences are an error), padding zeroed on the way in and out."""
    if positions is not None:
        if x.shape[-2] > positions.shape[0]:
            raise ValueError(f"sequences of {x.shape[-2]} tokens, but the model stores "
                             f"{positions.shape[0]} positions")
        x = x + positions[: x.shape[-2]].to(x.dtype)
    x = _keys(x, mask)
    for blk in blocks:
        x = blk(x, mask, attention, tau, causal)
    return _keys(x, mask)


# ------------------------------------------------------------------------------ native layers
def _param(*shape, dtype) -> nn.Parameter:
    return nn.Parameter(torch.zeros(shape, dtype=dtype))


class DenseFF(nn.Module):
    """FF(x) = η·x + W·relu(U·x + b), U: w×d, W: d×w."""

    def __init__(self, d: int, width: int, dtype=torch.float64):
        super().__init__()
        self.eta, self.b = _param(dtype=dtype), _param(width, dtype=dtype)
        self.U, self.W = _param(width, d, dtype=dtype), _param(d, width, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.eta * x + torch.relu(x @ self.U.T + self.b) @ self.W.T


class ProfileFF(nn.Module):
    """FF(x) = η·x + φ(f·x) with φ piecewise linear: value ``phi[j]`` at breakpoint ``t[j]``
    (increasing), linear in between, and slopes ``ends[0]`` / ``ends[1]`` beyond the ends."""

    def __init__(self, d: int, breakpoints: int, dtype=torch.float64):
        super().__init__()
        self.eta, self.f = _param(dtype=dtype), _param(d, dtype=dtype)
        self.t, self.phi = _param(breakpoints, dtype=dtype), _param(breakpoints, d, dtype=dtype)
        self.ends = _param(2, d, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = x @ self.f
        inner = (self.phi[1:] - self.phi[:-1]) / (self.t[1:] - self.t[:-1])[:, None]
        slope = torch.cat([self.ends[:1], inner, self.ends[1:]])  # segment j: t[j-1] ≤ s < t[j]
        j = torch.searchsorted(self.t, s.contiguous(), right=True)
        base = (j - 1).clamp(min=0)
        return self.eta * x + (self.phi[base] + slope[j] * (s - self.t[base])[..., None])


class LowRankSA(nn.Module):
    """SA_i(X) = ρ·x_i + Σ_h V_h·Σ_l π^h_il x_l, scores α_h⟨x_i, x_l⟩ + (c_h·x_i)(a_h·x_l),
    V_h = β_h·I + p_h·q_hᵀ. ``heads`` None: one head with scalar α, β and d-vectors; an int H:
    the heads stacked along a first dimension (α, β of shape (H,), a, c, p, q of (H, d))."""

    def __init__(self, d: int, dtype=torch.float64, heads: int | None = None):
        super().__init__()
        lead = () if heads is None else (heads,)
        self.rho = _param(dtype=dtype)
        for name in ("alpha", "beta"):
            setattr(self, name, _param(*lead, dtype=dtype))
        for name in ("a", "c", "p", "q"):
            setattr(self, name, _param(*lead, d, dtype=dtype))

    def forward(self, x, mask, attention: str, tau, causal: bool = False) -> torch.Tensor:
        keys = _keys(x, mask)
        out = self.rho * x
        stacked = self.a.dim() == 2
        for h in range(self.a.shape[0] if stacked else 1):
            alpha, a, c, beta, p, q = (t[h] if stacked else t for t in
                                       (self.alpha, self.a, self.c, self.beta, self.p, self.q))
            S = (x @ c)[..., :, None] * (keys @ a)[..., None, :]
            S = S + alpha * (x @ keys.transpose(-1, -2))
            y = attention_weights(S, mask, attention, tau, causal) @ keys
            out = out + beta * y + (y @ q)[..., None] * p
        return out


class NativeBlock(nn.Module):
    def __init__(self, ff: nn.Module | None, sa: LowRankSA | None):
        super().__init__()
        self.ff, self.sa = ff, sa

    def forward(self, x, mask, attention: str, tau, causal: bool = False) -> torch.Tensor:
        if self.ff is not None:
            x = self.ff(x)
        return x if self.sa is None else self.sa(x, mask, attention, tau, causal)


class NativeTransformer(nn.Module):
    """Our FF→SA blocks, the evaluation form of ``model`` (kept as ``self.model``).

    ``ff="profile"`` evaluates every FF whose hidden units read one direction by its profile
    (:class:`ProfileFF`, breakpoints and values computed exactly from the model's numbers) and
    the others densely; ``ff="dense"`` evaluates every FF as η·x + W·relu(U·x + b). Identity
    layers, and attention layers that change nothing (ρ = 1, V = 0), are skipped. The module's
    parameters are this evaluation form: files are written from ``self.model``
    (:func:`save_torch`), so change the model and build a new module rather than the parameters.
    """

    def __init__(self, model: Transformer, dtype=torch.float64, ff: str = "profile"):
        super().__init__()
        if ff not in FF_FORMS:
            raise ValueError(f"ff must be one of {FF_FORMS}, got {ff!r}")
        self.model, self.dtype, self.ff = model, dtype, ff
        self.d, self.attention = model.d, model.attention
        self.tau = None if model.tau is None else float(model.tau)
        d, layers = model.d, []
        for blk in model.blocks:
            ff_layer = prof = None
            if blk.ff is not None:
                prof = ff_profile(blk.ff) if ff == "profile" else None
                if prof is None:
                    ff_layer = DenseFF(d, blk.ff.width, dtype)
                    _fill(ff_layer, eta=blk.ff.eta, U=blk.ff.U, b=blk.ff.b, W=blk.ff.W)
                else:
                    f, t, phi, ends = prof
                    ff_layer = ProfileFF(d, len(t), dtype)
                    _fill(ff_layer, eta=blk.ff.eta, f=f, t=t, phi=np.array(phi),
                          ends=np.array(ends))
            sa_layer = None
            if not is_identity_sa(blk.sa):
                sa = blk.sa
                sa_layer = LowRankSA(d, dtype, None if len(sa.heads) == 1 else len(sa.heads))
                _fill(sa_layer, rho=sa.rho, **_head_values(sa))
            layers.append(NativeBlock(ff_layer, sa_layer))
        self.blocks = nn.ModuleList(layers)
        self.causal = model.causal
        self.positions = None if model.positions is None else \
            nn.Parameter(torch.as_tensor(_floats(model.positions), dtype=dtype))

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """x: (B, n, d); mask: (B, n) bool, True at real tokens. Padded outputs are zero."""
        return _run_blocks(self.blocks, x, mask, self.attention, self.tau, self.causal,
                           self.positions)

    def config(self) -> dict:
        """What the config file says about the native weights: ``native_config`` plus the FF
        evaluation form that loading rebuilds by default."""
        return {**native_config(self.model), "ff": self.ff}


# ------------------------------------------------------------------------------ ρ/η layout
class RhoEtaAttention(nn.Module):
    """Σ over ``heads`` heads of softmax((x W_qᵀ)(x W_kᵀ)ᵀ/τ)(x W_vᵀ): head t uses rows
    t·h..(t+1)·h of ``to_q``/``to_k`` ((heads·h)×d) and rows t·d..(t+1)·d of ``to_v``
    ((heads·d)×d), each head its own weights π^t (docs/heads.md)."""

    def __init__(self, d: int, h: int, dtype=torch.float64, heads: int = 1):
        super().__init__()
        self.d, self.h, self.heads = d, h, heads
        self.to_q = nn.Linear(d, heads * h, bias=False, dtype=dtype)
        self.to_k = nn.Linear(d, heads * h, bias=False, dtype=dtype)
        self.to_v = nn.Linear(d, heads * d, bias=False, dtype=dtype)

    def forward(self, x, mask, attention: str, tau, causal: bool = False) -> torch.Tensor:
        keys = _keys(x, mask)
        Q, K, V = self.to_q(x), self.to_k(keys), self.to_v(keys)
        out = 0
        for t in range(self.heads):
            qs, vs = slice(t * self.h, (t + 1) * self.h), slice(t * self.d, (t + 1) * self.d)
            S = Q[..., qs] @ K[..., qs].transpose(-1, -2)
            out = out + attention_weights(S, mask, attention, tau, causal) @ V[..., vs]
        return out


class RhoEtaBlock(nn.Module):
    """ρ and η have shape (1,), as in the paper authors' model class, so that a state dict of
    this layout loads into theirs with ``strict=True`` (and theirs into this one)."""

    def __init__(self, d: int, h: int, width: int, dtype=torch.float64, heads: int = 1):
        super().__init__()
        self.rho = nn.Parameter(torch.ones(1, dtype=dtype))  # residual by default
        self.eta = nn.Parameter(torch.ones(1, dtype=dtype))
        self.attn = RhoEtaAttention(d, h, dtype, heads)
        self.ff = nn.Sequential(nn.Linear(d, width, dtype=dtype), nn.ReLU(),
                                nn.Linear(width, d, bias=False, dtype=dtype))

    def forward(self, x, mask, attention: str, tau, causal: bool = False) -> torch.Tensor:
        x = self.rho * x + self.attn(x, mask, attention, tau, causal)
        return self.eta * x + self.ff(x)


class RhoEtaTransformer(nn.Module):
    """Blocks x ← ρ·x + softmax((xW_qᵀ)(xW_kᵀ)ᵀ/τ)(xW_vᵀ); x ← η·x + FF(x) (or hardmax).

    ``causal``: scores above the diagonal are −inf (token i attends to l ≤ i). ``positions``:
    the number of stored position rows (the ``positions`` tensor, added to the input first)."""

    def __init__(self, d: int, n_blocks: int, h: int, attention: str = "softmax", tau=1.0,
                 width: int = 4, dtype=torch.float64, causal: bool = False,
                 positions: int | None = None, heads: int = 1):
        super().__init__()
        self.d, self.h, self.width, self.attention, self.tau = d, h, width, attention, tau
        self.causal, self.heads = causal, heads
        self.blocks = nn.ModuleList(RhoEtaBlock(d, h, width, dtype, heads)
                                    for _ in range(n_blocks))
        self.positions = None if positions is None else _param(positions, d, dtype=dtype)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """x: (B, n, d); mask: (B, n) bool, True at real tokens. Padded outputs are zero."""
        return _run_blocks(self.blocks, x, mask, self.attention, self.tau, self.causal,
                           self.positions)

    def config(self) -> dict:
        return {"layout": "rho-eta", "d": self.d, "n_blocks": len(self.blocks), "h": self.h,
                "width": self.width, "attention": self.attention, "tau": self.tau,
                "causal": self.causal, "heads": self.heads,
                "positions": None if self.positions is None else self.positions.shape[0]}


# ------------------------------------------------------------------------------ export
def _floats(values) -> np.ndarray:
    """Float64 array of exact values (each Fraction rounded once, correctly)."""
    a = np.asarray(values, dtype=object)
    return np.array([float(v) for v in a.flat], dtype=float).reshape(a.shape)


def _fill(module: nn.Module, **values) -> None:
    with torch.no_grad():
        for name, v in values.items():
            p = getattr(module, name)
            p.copy_(torch.as_tensor(_floats(v), dtype=p.dtype))


def is_identity_sa(sa: SA | None) -> bool:
    """No layer, or ρ = 1 and V = 0: the attention changes nothing."""
    return sa is None or sa.is_identity()


def ff_profile(ff: FF):
    """(f, breakpoints, values, (left slope, right slope)) in exact numbers when every hidden
    unit of ``ff`` reads one direction f (U_i = k_i·f), else None."""
    U, b, W = (to_fraction_array(a) for a in (ff.U, ff.b, ff.W))
    found = direction_scales(U)
    if found is None:
        return None
    f, k = found
    t = sorted({-b[i] / k[i] for i in range(len(k)) if k[i] != 0})
    zero = W[:, 0] * 0

    def phi(s):
        return sum((W[:, i] * max(k[i] * s + b[i], 0) for i in range(len(k))), zero)

    left = sum((W[:, i] * k[i] for i in range(len(k)) if k[i] < 0), zero)
    right = sum((W[:, i] * k[i] for i in range(len(k)) if k[i] > 0), zero)
    return f, t, [phi(s) for s in t], (left, right)


def _head_values(sa: SA) -> dict:
    """α, a, c, β, p, q of a one-head layer, or each stacked over the heads."""
    def field(get):
        vals = [get(h) for h in sa.heads]
        return vals[0] if len(vals) == 1 else np.array(vals, dtype=object)

    return {"alpha": field(lambda h: h.A.alpha), "a": field(lambda h: h.A.a),
            "c": field(lambda h: h.A.c), "beta": field(lambda h: h.V.beta),
            "p": field(lambda h: h.V.p), "q": field(lambda h: h.V.q)}


def to_torch(model: Transformer, dtype=torch.float64, device=None,
             ff: str = "profile") -> NativeTransformer:
    """The native-layout module of ``model``, evaluating its FFs by their profiles
    (``ff="profile"``) or densely (``ff="dense"``); see :class:`NativeTransformer`."""
    return NativeTransformer(model, dtype, ff).to(device)


# ------------------------------------------------------------------------------ native files
def native_config(model: Transformer) -> dict:
    """The config of ``model``'s native file: d, attention, τ and per block
    {"ff": null | {"width": w}, "sa": bool | {"heads": H}} (null / false: the identity layer,
    no keys; {"heads": H}: H ≥ 2 heads stacked along a first dimension)."""
    return {"layout": "native", "d": model.d, "attention": model.attention,
            "tau": None if model.tau is None else float(model.tau), "causal": model.causal,
            "positions": None if model.positions is None else len(model.positions),
            "blocks": [{"ff": None if b.ff is None else {"width": b.ff.width},
                        "sa": b.sa is not None if b.sa is None or len(b.sa.heads) == 1
                        else {"heads": len(b.sa.heads)}} for b in model.blocks]}


def native_tensors(model: Transformer, dtype=torch.float64) -> dict[str, torch.Tensor]:
    """The native file's tensors: the model's parameters, each rounded to ``dtype``, under
    ``blocks.{i}.ff.{eta, U, b, W}`` and ``blocks.{i}.sa.{rho, alpha, a, c, beta, p, q}`` (the
    names of the JSON model format, with A's and V's entries flattened into the SA; a layer
    of H ≥ 2 heads stacks them: shapes (H,) and (H, d))."""
    out = {}
    for i, blk in enumerate(model.blocks):
        values = {}
        if blk.ff is not None:
            ff = blk.ff
            values.update(zip((f"ff.{k}" for k in NATIVE_FF_KEYS), (ff.eta, ff.U, ff.b, ff.W),
                              strict=True))
        if blk.sa is not None:
            sa = blk.sa
            values.update({f"sa.{k}": v for k, v in
                           {"rho": sa.rho, **_head_values(sa)}.items()})
        for k, v in values.items():
            out[f"blocks.{i}.{k}"] = torch.as_tensor(_floats(v), dtype=dtype).contiguous()
    if model.positions is not None:
        out["positions"] = torch.as_tensor(_floats(model.positions), dtype=dtype).contiguous()
    return out


def native_model(tensors: dict[str, torch.Tensor], config: dict) -> Transformer:
    """The model held by a native file: float64 parameters (``exact=False``) with the exact
    values of the stored floats. Raises ValueError on missing, extra or misshapen tensors."""
    d, blocks, seen = config["d"], [], set()

    def get(key, shape):
        if key not in tensors:
            raise ValueError(f"native weights: {key} is missing")
        t = tensors[key]
        if tuple(t.shape) != shape:
            raise ValueError(f"native weights: {key} has shape {tuple(t.shape)}, "
                             f"expected {shape}")
        seen.add(key)
        a = t.detach().to(device="cpu", dtype=torch.float64).numpy().copy()
        return float(a) if shape == () else a

    for i, spec in enumerate(config["blocks"]):
        ff = sa = None
        if spec["ff"] is not None:
            w, key = spec["ff"]["width"], f"blocks.{i}.ff."
            ff = FF(get(key + "eta", ()), get(key + "U", (w, d)), get(key + "b", (w,)),
                    get(key + "W", (d, w)))
        if spec["sa"]:
            sa = _native_sa(get, f"blocks.{i}.sa.", d, spec["sa"])
        blocks.append(Block(ff, sa))
    rows = config.get("positions")
    positions = None if rows is None else get("positions", (rows, d))
    extra = sorted(set(tensors) - seen)
    if extra:
        raise ValueError(f"native weights: unexpected tensors {', '.join(extra[:5])}")
    tau = config.get("tau")
    return Transformer(d=d, attention=config["attention"], blocks=blocks,
                       tau=None if tau is None else float(tau), exact=False,
                       causal=bool(config.get("causal", False)), positions=positions)


def _native_sa(get, key: str, d: int, spec) -> SA:
    """The SA layer at ``key``: one head (``spec`` true) or {"heads": H} stacked heads."""
    if spec is True:
        return SA(get(key + "rho", ()),
                  ScoreMatrix(get(key + "alpha", ()), get(key + "a", (d,)), get(key + "c", (d,))),
                  ValueMatrix(get(key + "beta", ()), get(key + "p", (d,)), get(key + "q", (d,))))
    H = spec.get("heads") if isinstance(spec, dict) else None
    if not isinstance(H, int) or isinstance(H, bool) or H < 2:
        raise ValueError(f"native config: {key[:-1]} must be true, false or {{\"heads\": H}} "
                         f"with an integer H ≥ 2, got {spec!r}")
    alpha, a, c = get(key + "alpha", (H,)), get(key + "a", (H, d)), get(key + "c", (H, d))
    beta, p, q = get(key + "beta", (H,)), get(key + "p", (H, d)), get(key + "q", (H, d))
    return SA(get(key + "rho", ()), heads=[
        Head(ScoreMatrix(float(alpha[h]), a[h], c[h]), ValueMatrix(float(beta[h]), p[h], q[h]))
        for h in range(H)])


def round_model(model: Transformer, dtype=torch.float64) -> Transformer:
    """``model`` as a native file of ``dtype`` holds it: each parameter rounded to ``dtype``,
    kept as a float64 (``exact=False``). :func:`export` builds its module from this."""
    rounded = native_model(native_tensors(model, dtype), native_config(model))
    return replace(rounded, record=model.record)


def to_rho_eta(model: Transformer, dtype=torch.float64, device=None) -> RhoEtaTransformer:
    """The ρ/η-layout module of ``model``.

    Our blocks are FF→SA, the layout's are attention→FF, so the layers pair up shifted by one:
    (identity, FF_1), (SA_1, FF_2), …, (SA_L, identity); pairs of two identities are dropped.
    Scores ⟨A x_i, x_l⟩ = α x_i·x_l + (c·x_i)(a·x_l) = (W_q x_i)·(W_k x_l) with
    W_q = [α·I; cᵀ], W_k = [I; aᵀ] (h = d + 1, no square roots); W_v = V. Narrow FFs get zero
    hidden units; an identity FF is η = 1 with zero weights, an identity SA ρ = 1 with W_v = 0.
    Every layer gets the model's most heads H (docs/heads.md): head t's W_q, W_k, W_v are rows
    t·h.., t·h.., t·d.. of ``to_q``, ``to_k``, ``to_v``; a layer's missing heads have W_v = 0.
    """
    d = model.d
    ffs = [b.ff for b in model.blocks] + [None]
    sas = [None] + [None if is_identity_sa(b.sa) else b.sa for b in model.blocks]
    pairs = [(sa, ff) for sa, ff in zip(sas, ffs, strict=True)
             if sa is not None or ff is not None]
    width = max(4, model.max_width())
    tau = None if model.tau is None else float(model.tau)
    H = max(1, model.max_heads())
    module = RhoEtaTransformer(d, len(pairs), d + 1, model.attention, tau, width, dtype,
                               model.causal, None if model.positions is None
                               else len(model.positions), H)
    with torch.no_grad():
        for p in module.parameters():
            p.zero_()
    if model.positions is not None:
        _fill(module, positions=model.positions)
    eye = np.eye(d, dtype=int)
    for blk, (sa, ff) in zip(module.blocks, pairs, strict=True):
        if sa is None:
            _fill(blk, rho=1)
        else:
            _fill(blk, rho=sa.rho)
            pad = [np.zeros((d + 1, d), dtype=int)] * (H - len(sa.heads))
            _fill(blk.attn.to_q, weight=np.vstack(
                [np.vstack([eye * h.A.alpha, h.A.c[None, :]]) for h in sa.heads] + pad))
            _fill(blk.attn.to_k, weight=np.vstack(
                [np.vstack([eye, h.A.a[None, :]]) for h in sa.heads] + pad))
            _fill(blk.attn.to_v, weight=np.vstack(
                [h.V.dense() for h in sa.heads] + [np.zeros((d, d), dtype=int)] *
                (H - len(sa.heads))))
        if ff is None:
            _fill(blk, eta=1)
        else:
            w = ff.width
            _fill(blk, eta=ff.eta)
            _fill(blk.ff[0], weight=np.vstack([ff.U, np.zeros((width - w, d), dtype=int)]),
                  bias=np.concatenate([ff.b, np.zeros(width - w, dtype=int)]))
            _fill(blk.ff[2], weight=np.hstack([ff.W, np.zeros((d, width - w), dtype=int)]))
    return module.to(device)


def convert(model: Transformer, layout: str = "native", dtype=torch.float64, device=None,
            ff: str = "profile"):
    """:func:`to_torch` (``ff`` as there) or :func:`to_rho_eta` by ``layout``."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if layout == "native":
        return to_torch(model, dtype, device, ff)
    return to_rho_eta(model, dtype, device)


# ------------------------------------------------------------------------------ running
def pad_batch(inputs, dtype=torch.float64, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequences (n_j × d each) as a zero-padded (N, max n_j, d) batch and its (N, n) mask."""
    n = max(len(x) for x in inputs)
    d = np.asarray(inputs[0]).shape[1]
    x = torch.zeros(len(inputs), n, d, dtype=dtype, device=device)
    mask = torch.zeros(len(inputs), n, dtype=torch.bool, device=device)
    for j, seq in enumerate(inputs):
        x[j, : len(seq)] = torch.as_tensor(_floats(seq), dtype=dtype)
        mask[j, : len(seq)] = True
    return x, mask


@torch.no_grad()
def apply(module: nn.Module, inputs) -> list[np.ndarray]:
    """Run ``module`` on a list of sequences (n_j × d); the outputs as float64 arrays."""
    p = next(module.parameters())
    x, mask = pad_batch(inputs, p.dtype, p.device)
    y = module(x, mask).double().cpu().numpy()
    return [y[j, : len(seq)] for j, seq in enumerate(inputs)]


# ------------------------------------------------------------------------------ files
def config_path(path: str | Path) -> Path:
    """The JSON config beside a safetensors file: model.safetensors → model.config.json."""
    return Path(path).with_suffix(".config.json")


def _dtype(module: nn.Module) -> torch.dtype:
    p = next(module.parameters(), None)
    return p.dtype if p is not None else getattr(module, "dtype", torch.float64)


def save_torch(module: nn.Module, path: str | Path) -> None:
    """Write the weights (safetensors) and the config beside them; both or neither appear.

    A native module writes its model's parameters (:func:`native_tensors`) in the module's
    dtype, not its evaluation form; a ρ/η module writes its state dict."""
    dtype = _dtype(module)
    config = {"format": FORMAT, "dtype": str(dtype).removeprefix("torch."), **module.config()}
    if isinstance(module, NativeTransformer):
        tensors = native_tensors(module.model, dtype)
    else:
        tensors = {k: v.detach().cpu().contiguous() for k, v in module.state_dict().items()}
    with atomic_path(path) as tmp, atomic_path(config_path(path)) as tmp_config:
        save_file(tensors, str(tmp))
        tmp_config.write_text(json.dumps(config, indent=1))


def load_torch(path: str | Path, device=None, dtype=None, ff: str | None = None) -> nn.Module:
    """The module saved by :func:`save_torch` (or ``exactformer export``).

    A native file is read as a model (:func:`native_model`: the exact values of its floats) and
    the module is built from it, so its profiles are computed exactly from the stored numbers;
    ``ff`` overrides the evaluation form recorded in the config. ``dtype`` (default: the file's)
    is the dtype to evaluate in: a float64 native file loaded with ``dtype=torch.float32`` keeps
    float64 parameters for the profiles and evaluates in float32."""
    config = json.loads(config_path(path).read_text())
    if config.get("format") != FORMAT:
        raise ValueError(f"{config_path(path)}: expected \"format\": \"{FORMAT}\"")
    file_dtype = getattr(torch, config["dtype"])
    tensors = load_file(str(path))
    if config["layout"] == "native":
        model = native_model(tensors, config)
        return to_torch(model, dtype or file_dtype, device, ff or config.get("ff", "profile"))
    module = RhoEtaTransformer(config["d"], config["n_blocks"], config["h"],
                               config["attention"], config["tau"], config["width"], file_dtype,
                               config.get("causal", False), config.get("positions"),
                               config.get("heads", 1))
    module.load_state_dict(_rho_eta_scalars_as_vectors(tensors))
    return module.to(device=device, dtype=dtype)


def _rho_eta_scalars_as_vectors(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A ρ/η state dict with every ``blocks.{i}.rho`` / ``.eta`` of shape (1,): files written
    before ρ and η took that shape hold them with shape (), and still load."""
    def vector(key: str, t: torch.Tensor) -> torch.Tensor:
        scalar = key.rsplit(".", 1)[-1] in ("rho", "eta") and t.dim() == 0
        return t.reshape(1) if scalar else t

    return {k: vector(k, v) for k, v in tensors.items()}


def export(model: Transformer, path: str | Path, layout: str = "native",
           dtype=torch.float64, ff: str = "profile") -> nn.Module:
    """Convert ``model`` and save it at ``path`` (safetensors) plus its config; ``dtype`` is a
    torch dtype or its name ("float64", "float32"). The native module returned is the one that
    loading the file gives: built from the parameters rounded to ``dtype``
    (:func:`round_model`), evaluating its FFs in the form ``ff``."""
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    if layout == "native":
        module = to_torch(round_model(model, dtype), dtype, ff=ff)
    else:
        module = convert(model, layout, dtype)
    save_torch(module, path)
    return module


# ------------------------------------------------------------------------------ float32
@dataclass
class Float32Verdict:
    """Does the model still interpolate when run in float32?

    ``interpolates`` is decided by an actual float32 run of the module (``convert(model,
    layout, torch.float32)``; for the native layout the same as loading a float64 file with
    ``dtype=torch.float32``): the largest Hausdorff distance between a pair's outputs and its
    targets, over the coordinate scale, is at most ``tolerance``. ``error_float32_file`` is the
    error of the module that a float32 *file* gives, whose parameters are rounded to float32
    (for the native layout the profiles are then exact for the rounded parameters, which can be
    much worse; for ρ/η it is ``error``). The margins (from a pass of the NumPy evaluator) say
    how much room the discrete decisions have, in units of the float32 unit roundoff u = 2⁻²⁴.
    """

    layout: str
    interpolates: bool
    error: float  # float32 run: max Hausdorff error / coordinate scale
    error_float64: float  # the same module in float64
    error_float32_file: float  # the module loaded from a float32 file, in float32
    tolerance: float
    hardmax_margin: float | None  # smallest best-minus-second score gap / score scale
    hat_clearance: float | None  # smallest distance of a token to a window / scale
    unit_roundoff: float = UNIT_ROUNDOFF_32

    def rows(self) -> list[tuple[str, str]]:
        def margin(v):
            return "n/a" if v is None else f"{v:.3g}  (= {v / self.unit_roundoff:.3g} u)"
        return [("float32 verdict", "INTERPOLATES" if self.interpolates else "FAILS"),
                ("layout", self.layout),
                ("float32 max error / scale", f"{self.error:.3g}  (tolerance {self.tolerance:g})"),
                ("float64 max error / scale", f"{self.error_float64:.3g}"),
                ("float32 file max error / scale", f"{self.error_float32_file:.3g}"),
                ("smallest hardmax score margin", margin(self.hardmax_margin)),
                ("smallest hat clearance / scale", margin(self.hat_clearance))]

    def table(self) -> str:
        return format_table(self.rows())

    def to_dict(self) -> dict:
        return asdict(self)


def max_error(module: nn.Module, dataset: Dataset | CausalDataset) -> float:
    """Largest Hausdorff distance between a pair's outputs and its targets, over the scale (for
    causal data: the largest distance at a constrained position)."""
    xs, ys = dataset.floats()
    outs = apply(module, xs)
    if isinstance(dataset, CausalDataset):
        return max((float(np.linalg.norm(o[i] - y[i])) for o, y, k in
                    zip(outs, ys, dataset.known, strict=True) for i in np.flatnonzero(k)),
                   default=0.0) / dataset.coordinate_scale()
    return max(hausdorff(o, y) for o, y in zip(outs, ys, strict=True)) / dataset.coordinate_scale()


def float32_verdict(model: Transformer, dataset: Dataset, layout: str = "native",
                    tolerance: float = 1e-3, device=None) -> Float32Verdict:
    """Run ``model`` exported in ``layout`` in float32 and float64 on ``dataset``, and collect
    the evaluator's margins (exact arithmetic for exact hardmax models, else float64)."""
    stats = PassStats()
    exact = model.exact and model.attention == "hardmax"
    inputs = dataset.fractions()[0] if exact else dataset.floats()[0]
    np_forward(model, inputs, "exact" if exact else "float", stats=stats)
    err32 = max_error(convert(model, layout, torch.float32, device), dataset)
    err64 = max_error(convert(model, layout, torch.float64, device), dataset)
    err_file = err32 if layout != "native" else \
        max_error(to_torch(round_model(model, torch.float32), torch.float32, device), dataset)
    return Float32Verdict(layout, bool(err32 <= tolerance), err32, err64, err_file, tolerance,
                          stats.hardmax_margin, stats.hat_clearance)
