"""The torch modules of an exported model: the native FF→SA blocks and the ρ/η research layout.

Both take a padded batch ``x`` (B, n, d) and a padding mask (B, n) (True at real tokens), on any
device. What the two layouts hold and why the native one evaluates FFs by their profile is
written in docs/numerics.md#the-torch-export; the numbers they are built from come from
:mod:`exactformer.export.native`, their files are :mod:`exactformer.export.files`.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from ..lens_plan import is_identity_sa
from ..model import Transformer
from .hub import read_pretrained, write_pretrained
from .native import FF_FORMS, ff_profile, floats, head_values, native_config


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
            if alpha.item() != 0:  # an α = 0 head has no ⟨x_i, x_l⟩ term: 0·inf would be nan
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
                    fill(ff_layer, eta=blk.ff.eta, U=blk.ff.U, b=blk.ff.b, W=blk.ff.W)
                else:
                    f, t, phi, ends = prof
                    ff_layer = ProfileFF(d, len(t), dtype)
                    fill(ff_layer, eta=blk.ff.eta, f=f, t=t, phi=np.array(phi),
                          ends=np.array(ends))
            sa_layer = None
            if not is_identity_sa(blk.sa):
                sa = blk.sa
                sa_layer = LowRankSA(d, dtype, None if len(sa.heads) == 1 else len(sa.heads))
                fill(sa_layer, rho=sa.rho, **head_values(sa))
            layers.append(NativeBlock(ff_layer, sa_layer))
        self.blocks = nn.ModuleList(layers)
        self.causal = model.causal
        self.positions = None if model.positions is None else \
            nn.Parameter(torch.as_tensor(floats(model.positions), dtype=dtype))

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """x: (B, n, d); mask: (B, n) bool, True at real tokens. Padded outputs are zero."""
        return _run_blocks(self.blocks, x, mask, self.attention, self.tau, self.causal,
                           self.positions)

    def config(self) -> dict:
        """What the config file says about the native weights: ``native_config`` plus the FF
        evaluation form that loading rebuilds by default."""
        return {**native_config(self.model), "ff": self.ff}

    def save_pretrained(self, folder, data=None, report=None) -> None:
        """Write a Hub-style folder: config.json, model.safetensors and a model card README.md
        describing ``data`` and showing ``report`` if given (:mod:`exactformer.export.hub`)."""
        write_pretrained(self, folder, data, report)

    @classmethod
    def from_pretrained(cls, folder, device=None, dtype=None, ff: str | None = None):
        """The module :meth:`save_pretrained` wrote, with identical outputs (``dtype`` or
        ``ff`` given: rebuilt from the stored parameters in that form instead)."""
        return read_pretrained(cls, folder, device, dtype, ff)


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


# ------------------------------------------------------------------------------ filling
def fill(module: nn.Module, **values) -> None:
    with torch.no_grad():
        for name, v in values.items():
            p = getattr(module, name)
            p.copy_(torch.as_tensor(floats(v), dtype=p.dtype))
