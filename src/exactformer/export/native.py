"""The native layout as data: a model's parameters as the native file's tensors and config,
and back (pure functions, no modules and no files).

The file holds the model's own parameters under keys that mirror the JSON model format
(:func:`native_tensors`, :data:`NATIVE_FF_KEYS`, :data:`NATIVE_SA_KEYS`) and a config
(:func:`native_config`); :func:`native_model` reads them back as a float64 model. The helpers
that the modules' evaluation form is built from (:func:`ff_profile`, :func:`head_values`) live
here too. See docs/numerics.md#the-torch-export.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import torch

from ..evaluate import direction_scales
from ..model import FF, SA, Block, Head, ScoreMatrix, Transformer, ValueMatrix
from ..modelio import TORCH_FORMAT
from ..numbers import normal_positive, to_fraction_array

FORMAT = TORCH_FORMAT
FF_FORMS = ("profile", "dense")  # how a native module evaluates an FF (modules.NativeTransformer)
NATIVE_DTYPES = ("float64", "float32", "bfloat16", "float16")
NATIVE_FF_KEYS = ("eta", "U", "b", "W")  # blocks.{i}.ff.{key}: (), (w, d), (w,), (d, w)
NATIVE_SA_KEYS = ("rho", "alpha", "a", "c", "beta", "p", "q")  # blocks.{i}.sa.{key}


def floats(values) -> np.ndarray:
    """Float64 array of exact values (each Fraction rounded once, correctly)."""
    a = np.asarray(values, dtype=object)
    return np.array([float(v) for v in a.flat], dtype=float).reshape(a.shape)


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


def head_values(sa: SA) -> dict:
    """α, a, c, β, p, q of a one-head layer, or each stacked over the heads."""
    def field(get):
        vals = [get(h) for h in sa.heads]
        return vals[0] if len(vals) == 1 else np.array(vals, dtype=object)

    return {"alpha": field(lambda h: h.A.alpha), "a": field(lambda h: h.A.a),
            "c": field(lambda h: h.A.c), "beta": field(lambda h: h.V.beta),
            "p": field(lambda h: h.V.p), "q": field(lambda h: h.V.q)}


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


def check_native_config(config, where: str) -> None:
    """ValueError naming ``where`` and the field unless ``config`` is a native file's config
    (:func:`native_config` plus "format", "dtype" and "ff") whose every value follows the
    rules of the JSON model format: a positive integer d, attention hardmax or softmax, a
    softmax τ positive in the normal float64 range, blocks of positive widths and heads."""
    def need(ok: bool, field: str, rule: str, got=None) -> None:
        if not ok:
            if got is None and isinstance(config, dict):
                got = config.get(field)
            raise ValueError(f"{where}: \"{field}\" must be {rule}, got {got!r}"[:300])

    need(isinstance(config, dict), "config", "a JSON object")
    need(config.get("format") == FORMAT and config.get("layout") == "native", "format",
         f"\"{FORMAT}\" with \"layout\": \"native\" (a native module's config)")
    need(config.get("dtype") in NATIVE_DTYPES, "dtype", f"one of {NATIVE_DTYPES}")
    need(config.get("ff", "profile") in FF_FORMS, "ff", f"one of {FF_FORMS}")
    need(_count(config.get("d")), "d", "a positive integer")
    attention = config.get("attention")
    need(attention in ("hardmax", "softmax"), "attention", "\"hardmax\" or \"softmax\"")
    tau = config.get("tau")
    if attention == "hardmax":
        need(tau is None, "tau", "null for hardmax attention")
    else:
        need(_number(tau) and math.isfinite(tau) and tau > 0, "tau", "a positive number")
        try:
            normal_positive(tau, "tau")
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
    need(isinstance(config.get("causal", False), bool), "causal", "true or false")
    need(config.get("positions") is None or _count(config["positions"]), "positions",
         "null or a positive integer")
    blocks = config.get("blocks")
    need(isinstance(blocks, list), "blocks", "a list of blocks")
    for i, b in enumerate(blocks):
        ff, sa = (b.get("ff"), b.get("sa")) if isinstance(b, dict) else (0, 0)
        need(ff is None or isinstance(ff, dict) and _count(ff.get("width")), f"blocks[{i}].ff",
             "null or {\"width\": W} with a positive integer W", b)
        need(isinstance(sa, bool) or isinstance(sa, dict) and _count(sa.get("heads"))
             and sa["heads"] >= 2, f"blocks[{i}].sa", "true, false or {\"heads\": H}, H >= 2", b)


def _count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


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
                           {"rho": sa.rho, **head_values(sa)}.items()})
        for k, v in values.items():
            out[f"blocks.{i}.{k}"] = torch.as_tensor(floats(v), dtype=dtype).contiguous()
    if model.positions is not None:
        out["positions"] = torch.as_tensor(floats(model.positions), dtype=dtype).contiguous()
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
