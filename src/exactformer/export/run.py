"""Running an exported module on a list of sequences: a padded batch and its mask."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from ..numbers import pad_columns
from .native import floats


def pad_batch(inputs, dtype=torch.float64, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequences (n_j × d each) as a zero-padded (N, max n_j, d) batch and its (N, n) mask."""
    n = max(len(x) for x in inputs)
    d = np.asarray(inputs[0]).shape[1]
    x = torch.zeros(len(inputs), n, d, dtype=dtype, device=device)
    mask = torch.zeros(len(inputs), n, dtype=torch.bool, device=device)
    for j, seq in enumerate(inputs):
        x[j, : len(seq)] = torch.as_tensor(floats(seq), dtype=dtype)
        mask[j, : len(seq)] = True
    return x, mask


@torch.no_grad()
def apply(module: nn.Module, inputs) -> list[np.ndarray]:
    """Run ``module`` (width D = ``module.d``) on a list of sequences (n_j × d, d ≤ D, tokens
    zero-padded to R^D: docs/architecture.md#data-narrower-than-the-model); the outputs
    (n_j × D) as float64 arrays."""
    p = next(module.parameters())
    x, mask = pad_batch(pad_columns(inputs, module.d), p.dtype, p.device)
    y = module(x, mask).double().cpu().numpy()
    return [y[j, : len(seq)] for j, seq in enumerate(inputs)]
