"""Running an exported module on a list of sequences: a padded batch and its mask."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from ..numbers import pad_columns
from . import lens_helpers
from .native import floats


def pad_batch(inputs, dtype=torch.float64, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequences (n_j × d each) as a zero-padded (N, max n_j, d) batch and its (N, n) bool
    mask (the TransformerLens folder's helper, with a bool mask)."""
    d = np.asarray(inputs[0]).shape[1]
    x, mask = lens_helpers.pad_batch([floats(seq) for seq in inputs], d, dtype, device)
    return x, mask.bool()


@torch.no_grad()
def apply(module: nn.Module, inputs) -> list[np.ndarray]:
    """Run ``module`` (width D = ``module.d``) on a list of sequences (n_j × d, d ≤ D, tokens
    zero-padded to R^D: docs/architecture.md#data-narrower-than-the-model); the outputs
    (n_j × D) as float64 arrays."""
    p = next(module.parameters())
    x, mask = pad_batch(pad_columns(inputs, module.d), p.dtype, p.device)
    y = module(x, mask).double().cpu().numpy()
    return [y[j, : len(seq)] for j, seq in enumerate(inputs)]
