"""The one entry point ``compile``: dataset in, constructed transformer out."""

from __future__ import annotations

import warnings

from .construct.causal import compile_causal
from .construct.hardmax import check_heads, compile_hardmax, hats_per_layer
from .construct.softmax import compile_keyed_softmax, compile_softmax
from .construct.tagging import NotKeyable
from .data import CausalDataset, Dataset
from .runtime import warn_range_faults

CONSTRUCTIONS = ("keyed", "paper")


def compile(dataset: Dataset | CausalDataset, attention: str = "hardmax", exact: bool = True,
            seed: int = 0, tau=None, progress: bool = False, causal: bool = False,
            width: int = 4, heads: int = 1, n_layers: int | None = None,
            keys: bool | None = None, construction: str | None = None):
    """Construct a transformer that interpolates ``dataset`` exactly.

    construction: "keyed" (the default: docs/keyed.md, causal data docs/causal.md), exact in
    rational arithmetic and to rounding in a plain float32 pass, its block count independent
    of the input lengths; or "paper", the theorem's hat construction (docs/hardmax.md,
    docs/softmax.md), exact in rational arithmetic but not in float32. ``keys`` is the older
    spelling: True for "keyed", False for "paper".
    attention: "hardmax" or "softmax". exact: rational parameters (True) or float64 ones for
    large data (False). seed: all generic choices derive from it.
    tau: softmax temperature (default 1; a keyed model folds 1/τ into its score matrices, so
    any τ > 0 gives the same model up to that factor). progress: show progress bars on long
    phases.
    causal: a decoder model with a target at every position (docs/causal.md); a
    :class:`CausalDataset` implies it. width: the widest FF layer, a multiple of 4:
    width/4 hats (or snaps, or separation tests) share a layer, for about 4/width as many
    blocks (docs/heads.md; causal models: docs/causal.md#width-and-heads). heads: attention
    heads a separation round may use (at most d − 1 are used); in a keyed model, the heads of a
    separation layer (at most ``width``): consecutive rounds share it, a head each, or two
    with bent signatures (docs/keyed.md#heads).
    n_layers: at most this many blocks; the width (and, if ``heads`` is left at 1, the heads)
    are then chosen (:func:`fit_layers`) and ``width`` must be left at 4.
    Causal data that position keys serve get position keys in either construction. Where the
    keyed construction does not apply and none was asked for (tokens whose squared norms
    overflow float64, or closer than float64 resolves), the paper's is built, with a warning.

    The model records the data's sha256 (``dataset.sha256()``), by which ``verify`` tells
    whether it is given the data it was built for (docs/verification.md#the-data-checked).
    """
    args = (dataset, attention, exact, seed, tau, progress, causal, width, heads, n_layers)
    if keys is None and construction is None:
        try:
            model = _compile(*args, True)
        except NotKeyable as e:
            warnings.warn(f"the default (keyed) construction does not apply to these data "
                          f"({e}): built with the paper's construction, exact in rational "
                          "arithmetic but not faithful in float32 (docs/keyed.md)",
                          RuntimeWarning, stacklevel=2)
            model = _compile(*args, False)
    else:
        model = _compile(*args, _keyed(keys, construction))
    if model.record is not None:
        model.record.data_sha256 = dataset.sha256()
    warn_range_faults(model, dataset, stacklevel=2)  # docs/numerics.md#runtime-ranges
    return model


def _compile(dataset, attention, exact, seed, tau, progress, causal, width, heads, n_layers,
             keys: bool):
    """:func:`compile` of the construction chosen (``keys``: the keyed one), without the
    data's hash (which ``fit_layers`` would recompute for every width it tries)."""
    if n_layers is not None:
        if width != 4:
            raise ValueError("give n_layers or width, not both: n_layers chooses the width")
        return fit_layers(lambda w, h: _compile(dataset, attention, exact, seed, tau, progress,
                                                causal, w, min(h, w) if keys else h, None,
                                                keys), dataset, n_layers, heads)
    if keys:
        check_keyed_heads(heads, width)
    if causal or isinstance(dataset, CausalDataset):
        if not isinstance(dataset, CausalDataset):
            raise TypeError("causal=True expects an exactformer.CausalDataset (see "
                            "CausalDataset.from_arrays)")
        if not exact and dataset.exact:
            dataset.check_float64()
        return compile_causal(dataset, attention=attention, exact=exact, seed=seed, tau=tau,
                              progress=progress, width=width, heads=heads,
                              keys=keys and dataset.constrained > 0)  # none: 0 blocks
    if not isinstance(dataset, Dataset):
        raise TypeError("compile expects an exactformer.Dataset (see Dataset.from_arrays)")
    if not exact and dataset.exact:
        dataset.check_float64()
    if attention == "hardmax":
        if tau is not None:
            raise ValueError("tau applies to softmax attention only")
        return compile_hardmax(dataset, exact=exact, seed=seed, progress=progress, width=width,
                               heads=heads, keys=keys)
    if attention == "softmax":
        hats_per_layer(width)
        check_heads(heads)
        if keys:
            return compile_keyed_softmax(dataset, exact=exact, seed=seed, tau=tau,
                                         progress=progress, width=width, heads=heads)
        return compile_softmax(dataset, exact=exact, seed=seed, tau=tau, progress=progress,
                               width=width, heads=heads)
    raise ValueError(f"attention must be 'hardmax' or 'softmax', got {attention!r}")


def check_keyed_heads(heads: int, width: int) -> None:
    """A keyed separation layer holds at most ``width`` rounds, a head each
    (docs/keyed.md#heads): more heads than that are refused, not silently unused."""
    check_heads(heads)
    hats_per_layer(width)
    if heads > width:
        raise ValueError(f"heads = {heads} is more than width = {width}: a keyed separation "
                         "layer holds at most width rounds, a head each (docs/keyed.md#heads)")


def _keyed(keys: bool | None, construction: str | None) -> bool:
    """Whether the construction asked for is the keyed one (the default)."""
    if construction is not None and construction not in CONSTRUCTIONS:
        raise ValueError(f"construction must be one of {CONSTRUCTIONS}, got {construction!r}")
    if keys is not None and not isinstance(keys, bool):
        raise ValueError(f"keys must be True or False, got {keys!r}")
    if keys is not None and construction is not None and keys != (construction == "keyed"):
        raise ValueError(f"keys={keys} contradicts construction={construction!r}: give one")
    return keys if keys is not None else construction != "paper"


def fit_layers(build, dataset: Dataset | CausalDataset, n_layers: int, heads: int = 1):
    """The narrowest model of ``build(width, heads)`` with at most ``n_layers`` blocks.

    Block counts fall as the width 4k grows (k hats, snaps or tests per layer, docs/heads.md)
    until k covers the largest phase, k_max = every target or input token; at k_max the
    construction takes its fewest blocks. The smallest k that fits is found by bisection
    (every model tried at k_max first). ``heads`` = 1 also tries d − 1 heads, which shorten the
    separation, when one head cannot fit. Raises ValueError naming the fewest blocks possible.
    """
    if isinstance(n_layers, bool) or not isinstance(n_layers, int) or n_layers < 1:
        raise ValueError(f"n_layers must be a positive integer, got {n_layers!r}")
    k_max = max(1, sum(len(x) for x in dataset.inputs))
    options = [heads] if heads != 1 or dataset.d < 3 else [1, dataset.d - 1]
    fewest = None
    for h in options:
        best = build(4 * k_max, h)
        fewest = best.n_blocks if fewest is None else min(fewest, best.n_blocks)
        if best.n_blocks > n_layers:
            continue
        lo, hi = 1, k_max
        while lo < hi:  # the smallest k (so far) whose model fits: hi
            mid = (lo + hi) // 2
            model = build(4 * mid, h)
            if model.n_blocks <= n_layers:
                hi, best = mid, model
            else:
                lo = mid + 1
        return best
    raise ValueError(f"n_layers = {n_layers} is too few for this data: the construction needs "
                     f"at least {fewest} blocks (widest layers, "
                     f"{' or '.join(map(str, options))} head{'s' if options != [1] else ''})")
