"""The one entry point ``compile``: dataset in, constructed transformer out."""

from __future__ import annotations

from .construct.causal import compile_causal
from .construct.hardmax import check_heads, compile_hardmax, hats_per_layer
from .construct.softmax import compile_softmax
from .data import CausalDataset, Dataset


def compile(dataset: Dataset | CausalDataset, attention: str = "hardmax", exact: bool = True,
            seed: int = 0, tau=None, progress: bool = False, causal: bool = False,
            width: int = 4, heads: int = 1):
    """Construct a transformer that interpolates ``dataset`` exactly.

    attention: "hardmax" (docs/hardmax.md) or "softmax" (docs/softmax.md). exact: rational
    parameters (True) or float64 ones for large data (False). seed: all generic choices derive
    from it.
    tau: softmax temperature (default 1). progress: show progress bars on long phases.
    causal: a decoder model with a target at every position (docs/causal.md); a
    :class:`CausalDataset` implies it. width: the widest FF layer, a multiple of 4:
    width/4 hats (or snaps, or separation tests) share a layer, for about 4/width as many
    blocks (docs/heads.md; causal models: docs/causal.md#width-and-heads). heads: attention
    heads a separation round may use (at most d − 1 are used).
    """
    if causal or isinstance(dataset, CausalDataset):
        if not isinstance(dataset, CausalDataset):
            raise TypeError("causal=True expects an exactformer.CausalDataset (see "
                            "CausalDataset.from_arrays)")
        if not exact and dataset.exact:
            dataset.check_float64()
        return compile_causal(dataset, attention=attention, exact=exact, seed=seed, tau=tau,
                              progress=progress, width=width, heads=heads)
    if not isinstance(dataset, Dataset):
        raise TypeError("compile expects an exactformer.Dataset (see Dataset.from_arrays)")
    if not exact and dataset.exact:
        dataset.check_float64()
    if attention == "hardmax":
        if tau is not None:
            raise ValueError("tau applies to softmax attention only")
        return compile_hardmax(dataset, exact=exact, seed=seed, progress=progress, width=width,
                               heads=heads)
    if attention == "softmax":
        hats_per_layer(width)
        check_heads(heads)
        return compile_softmax(dataset, exact=exact, seed=seed, tau=tau, progress=progress,
                               width=width, heads=heads)
    raise ValueError(f"attention must be 'hardmax' or 'softmax', got {attention!r}")
