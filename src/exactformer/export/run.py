"""Running an exported module on a list of sequences: a padded batch and its mask."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from . import lens_helpers
from .native import floats


def pad_batch(inputs, dtype=torch.float64, device=None, width: int | None = None
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequences (n_j × d each) as a zero-padded (N, max n_j, width) batch and its (N, n)
    bool mask (the TransformerLens folder's helper, with a bool mask). ``width``: a module's
    ``d`` (default the data's d); a keyed model is wider than its data and reads them
    zero-padded."""
    width = np.asarray(inputs[0]).shape[1] if width is None else width
    x, mask = lens_helpers.pad_batch([floats(seq) for seq in inputs], width, dtype, device)
    return x, mask.bool()


@torch.no_grad()
def apply(module: nn.Module, inputs) -> list[np.ndarray]:
    """Run ``module`` (width D = ``module.d``) on a list of sequences (n_j × d, d ≤ D, tokens
    zero-padded to R^D: docs/architecture.md#data-narrower-than-the-model); the outputs
    (n_j × D) as float64 arrays."""
    p = next(module.parameters())
    x, mask = pad_batch(inputs, p.dtype, p.device, width=module.d)
    y = module(x, mask).double().cpu().numpy()
    return [y[j, : len(seq)] for j, seq in enumerate(inputs)]
