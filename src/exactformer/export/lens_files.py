"""The TransformerLens layout's folder, runs and verdict (needs the ``lens`` extra to run).

A folder holds ``config.json`` (``TransformerBridgeConfig`` fields) and ``model.safetensors``
(the bridge's state-dict keys), written by :func:`save_lens` from the pure converter of
:mod:`exactformer.export.transformer_lens`; :func:`load_lens` rebuilds the bridge from the two
files alone. :func:`lens_verdict` runs the bridge's own forward pass on a dataset.
See docs/numerics.md#the-transformerlens-export.
"""

from __future__ import annotations

import json
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from ..circuit.document import CIRCUIT_FILE, circuit_text, wanted
from ..data import CausalDataset, Dataset
from ..distance import smallest
from ..model import Transformer
from ..modelio import atomic_path
from ..tables import format_table
from ..verification.runtime_verdict import RUN_TOLERANCE
from . import lens_helpers
from .float32 import output_error
from .hub import FolderError, read_config, read_tensors, refuse_other_export
from .lens_helpers import pad_batch
from .native import floats
from .transformer_lens import EXP_UNDERFLOW, lens_config, lens_state_dict

CONFIG, WEIGHTS = "config.json", "model.safetensors"
PROOFS = "runtime_proofs.json"  # the float32 proof of the exported computation on the data
HELPERS = "lens_helpers.py"  # a copy of exactformer/export/lens_helpers.py, no exactformer import
LENS_TOLERANCE = RUN_TOLERANCE  # lens_verdict's default tolerance by dtype


def save_lens(model: Transformer, folder: str | Path, dtype: str = "float64",
              n_ctx: int | None = None, data: Dataset | CausalDataset | None = None,
              circuit: bool | None = None, proofs: list | None = None) -> dict:
    """Write ``folder``/config.json, ``folder``/model.safetensors and ``folder``/lens_helpers.py
    (all or none, the folder made if missing); the config returned. The helpers let the
    folder run with TransformerLens alone (docs/export.md#transformerlens-alone). With
    ``data``, also ``folder``/circuit.json, the circuit on them (docs/circuit.md): always
    with ``circuit=True``, never with False, and by default when its trace is small; and
    ``folder``/runtime_proofs.json, the float32 proof on them (``prove_runtime``, or the
    verdicts ``proofs`` already made; docs/numerics.md#proofs-for-reduced-precision-runtimes).
    Files of an earlier export that these weights do not back are removed."""
    from safetensors.torch import save_file

    refuse_other_export(Path(folder), hub=False)
    config = lens_config(model, dtype, n_ctx)
    state = lens_state_dict(model, dtype, n_ctx)
    circuit = circuit_text(model, data) if wanted(model, data, circuit) else None
    if data is not None and proofs is None:
        from ..verification import prove_runtime
        proofs = [prove_runtime(model, data, "float32")]
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    texts = {CONFIG: json.dumps(config, indent=1),
             HELPERS: Path(lens_helpers.__file__).read_text()}
    if circuit is not None:
        texts[CIRCUIT_FILE] = circuit
    if data is not None:
        texts[PROOFS] = json.dumps({v.runtime: v.to_dict() for v in proofs}, indent=1)
    with ExitStack() as stack:
        save_file(state, str(stack.enter_context(atomic_path(folder / WEIGHTS))))
        for name, text in texts.items():
            stack.enter_context(atomic_path(folder / name)).write_text(text)
    for name in (CIRCUIT_FILE, PROOFS):  # an earlier export's would describe other weights
        if name not in texts:
            (folder / name).unlink(missing_ok=True)
    return config


def load_lens(folder: str | Path, device=None):
    """The bridge that :func:`save_lens` wrote, rebuilt from its two files alone; a folder
    that is not one is a FolderError naming the file."""
    folder = Path(folder)
    for name in (CONFIG, WEIGHTS):
        if not (folder / name).is_file():
            raise FolderError(f"{folder}: no {name} (not a transformer-lens export folder)")
    config = read_config(folder / CONFIG, native=False)
    tensors = read_tensors(folder / WEIGHTS)
    try:
        return lens_helpers.boot(config, tensors, device)
    except (KeyError, TypeError, ValueError, AttributeError, RuntimeError) as e:
        raise FolderError(f"{folder / CONFIG}: not a TransformerLens config and weights that "
                          f"load ({e!r})"[:300]) from None


def lens_batch(bridge, inputs, d: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequences (n_j × d) as the bridge's input: a residual stream (B, n, d_model), tokens in
    its first d coordinates and zeros elsewhere, and the attention mask (B, n), 1 at tokens
    (:func:`~exactformer.export.lens_helpers.pad_batch`, the folder's own helper)."""
    p = next(bridge.parameters())
    return pad_batch([floats(seq)[:, :d] for seq in inputs], bridge.cfg.d_model, p.dtype,
                     p.device)


def lens_apply(bridge, inputs, d: int) -> list[np.ndarray]:
    """The bridge's logits (width d) on sequences (n_j × d), as float64 arrays."""
    return lens_run(bridge, inputs, d)[0]


@torch.no_grad()
def lens_run(bridge, inputs, d: int, margin: bool = False, progress: bool = False
             ) -> tuple[list[np.ndarray], float | None]:
    """The bridge's forward pass on sequences (n_j × d): its logits as float64 arrays and,
    with ``margin``, the smallest gap between a query's best and second-best scaled score
    (q·k/attn_scale, from the bridge's own q and k) over every attention layer and real
    query (None where no query has two distinct scores).

    Layer by layer, nothing kept: the gaps are taken in hooks as each layer runs, so memory
    stays that of one layer, not of a cache of all of them. An attention-free bridge (every
    attention weight zero: no query has two distinct scores) runs position by position
    (``lens_helpers.by_position``), linear in the length; should some position's logits not
    be finite there, the full pass decides instead (a non-finite residual would reach the
    later positions through the zero-weight attention)."""
    x, mask = lens_batch(bridge, inputs, d)
    free = lens_helpers.attention_free(bridge)
    gaps: list = []
    passes = -(-mask.numel() // lens_helpers.CHUNK_ROWS) if free else 1
    bar = tqdm(total=bridge.cfg.n_layers * passes, desc="transformer-lens check",
               unit="layer", disable=not progress, leave=False)

    def count(out, hook):
        bar.update()  # a hook that returns nothing leaves the activation as it is

    hooks = [(lambda name: name.endswith(".hook_out") and name.count(".") == 2, count)]
    with bar:
        y = lens_helpers.by_position(bridge, x, fwd_hooks=hooks) if free else None
        if y is None or not torch.isfinite(y[mask.bool()]).all():
            if margin:
                hooks += _gap_hooks(bridge, mask, gaps)
            bar.reset(total=bridge.cfg.n_layers)
            y = bridge.run_with_hooks(x, return_type="logits", fwd_hooks=hooks,
                                      attention_mask=None if mask.all() else mask)
    y = y.double().cpu().numpy()
    found = [g for g in gaps if g is not None]
    return [y[j, : len(seq)] for j, seq in enumerate(inputs)], \
        smallest(found) if found else None


def _gap_hooks(bridge, mask: torch.Tensor, gaps: list) -> list:
    """Hooks that append each attention layer's smallest score gap (:func:`_smallest_gap`)
    to ``gaps`` from its q and k as they are made; nothing of a layer outlives it."""
    n, keep = mask.shape[1], mask.bool()
    allowed = keep[:, None, None, :]
    if bridge.cfg.attention_dir == "causal":
        allowed = allowed & torch.ones(n, n, dtype=torch.bool, device=mask.device).tril()
    query = {}

    def keep_q(q, hook):
        query["q"] = q

    def gap_of(k, hook):
        q = query.pop("q")
        if q.any() and k.any():  # all-zero q or k: every score is 0, no two differ
            gaps.append(_smallest_gap(torch.einsum("bqhe,bkhe->bhqk", q, k)
                                      / bridge.cfg.attn_scale, allowed, keep))

    return [(lambda name: name.endswith("attn.hook_q"), keep_q),
            (lambda name: name.endswith("attn.hook_k"), gap_of)]


def _smallest_gap(scores: torch.Tensor, allowed: torch.Tensor, keep: torch.Tensor
                  ) -> float | None:
    """The smallest best-minus-second score over real queries (B, H, q, k scores): nan where
    a score is nan or overflowed (so no verdict passes it); a query with one key to choose
    from has no gap."""
    S = scores.masked_fill(~allowed, float("-inf"))
    best = S.amax(dim=-1, keepdim=True)
    second = S.masked_fill(S == best, float("-inf")).amax(dim=-1)
    gap = torch.where(torch.isinf(best[..., 0]), torch.nan, best[..., 0] - second)
    gap = gap[keep[:, None, :].expand_as(second)]
    gap = gap[gap != torch.inf]
    return smallest(gap.cpu().numpy()) if gap.numel() else None


@dataclass
class LensVerdict:
    """Does the TransformerLens bridge's own forward pass interpolate the data?

    ``error``: max Hausdorff error / coordinate scale (causal: at constrained positions) of
    the bridge's logits, ``interpolates`` if it is at most ``tolerance``. For hardmax models
    ``score_margin`` is the smallest best-minus-second scaled score, and ``hardmax_exact``
    whether it exceeds ``underflow`` (the exp argument below which the dtype's exp is exactly
    0), i.e. whether every softmax weight off the argmax is exactly 0 on this data."""

    dtype: str
    interpolates: bool
    error: float
    tolerance: float
    score_margin: float | None = None
    underflow: float | None = None

    @property
    def hardmax_exact(self) -> bool | None:
        if self.underflow is None:
            return None
        return self.score_margin is None or self.score_margin >= self.underflow

    def rows(self) -> list[tuple[str, str]]:
        rows = [(f"transformer-lens {self.dtype}", "INTERPOLATES" if self.interpolates
                 else "FAILS"),
                (f"{self.dtype} max error / scale", f"{self.error:.3g}  (tolerance "
                                                    f"{self.tolerance:g})")]
        if self.underflow is not None:
            margin = "n/a" if self.score_margin is None else f"{self.score_margin:.3g}"
            rows.append((f"{self.dtype} smallest scaled score gap",
                         f"{margin}  (hardmax needs >= {self.underflow:g}: "
                         f"{'yes' if self.hardmax_exact else 'NO'})"))
        return rows

    def to_dict(self) -> dict:
        return asdict(self) | {"hardmax_exact": self.hardmax_exact}


def lens_verdict(bridge, dataset: Dataset | CausalDataset, tolerance: float | None = None,
                 progress: bool = False, attention: str | None = None) -> LensVerdict:
    """Run ``bridge`` (say from :func:`load_lens`) on ``dataset`` and judge its outputs
    (``tolerance`` None: :data:`LENS_TOLERANCE` of its dtype); for a hardmax export also
    measure the score margin. Data narrower than the model (its logits, ``d_vocab_out``, are
    the model's D coordinates) are zero-padded, inputs and targets. One forward pass, layer by
    layer (:func:`lens_run`), with a progress bar if asked.

    ``attention``: the exported model's ("hardmax" or "softmax"), where the caller knows it.
    None takes the tag :func:`~.transformer_lens.to_lens` puts on its bridges, and for a
    bridge without one (read from a folder) guesses from the bridge: a hardmax export divides
    its scores by attn_scale = 2^-k < 1. That guess takes a softmax export at τ < 1/2
    (attn_scale 2τ or 4τ, below 1) for a hardmax one and fails it for score gaps that softmax
    never needed (an export of a τ = 1/4 model that reproduced its data to 4e-17 printed
    FAILS), so pass it where known."""
    dataset = dataset.padded(bridge.cfg.d_vocab_out)
    attention = attention or getattr(bridge, "exactformer_attention", None)
    if attention not in (None, "hardmax", "softmax"):
        raise ValueError(f"attention must be 'hardmax', 'softmax' or None, got {attention!r}")
    hardmax = bridge.cfg.attn_scale < 1 if attention is None else attention == "hardmax"
    outputs, margin = lens_run(bridge, dataset.floats()[0], dataset.d, hardmax, progress)
    err = output_error(outputs, dataset)
    dtype = str(next(bridge.parameters()).dtype).removeprefix("torch.")
    tolerance = LENS_TOLERANCE[dtype] if tolerance is None else tolerance
    verdict = LensVerdict(dtype, bool(err <= tolerance), err, tolerance)
    if hardmax:
        verdict.score_margin = margin
        verdict.underflow = EXP_UNDERFLOW[dtype]
        verdict.interpolates = verdict.interpolates and bool(verdict.hardmax_exact)
    return verdict


def verdict_table(verdicts: list[LensVerdict]) -> str:
    return format_table([row for v in verdicts for row in v.rows()])
