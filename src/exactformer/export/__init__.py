"""The export stage: a model as torch modules and weight files (needs the ``torch`` extra).

One pure converter per layout, I/O apart: ``native`` (a model's parameters as the native
file's tensors and config, and back), ``rho_eta`` (the ρ/η module), ``transformer_lens``
(a TransformerBridge config and state dict); ``modules`` holds the ``nn.Module`` classes,
``layouts`` picks a layout by name and reads and writes the safetensors files, ``run`` feeds a
module a list of sequences, ``float32`` is the float32 verdict, ``hub`` the Hub-style folder;
``lens_files`` writes, loads, runs and judges the TransformerLens layout (running it needs
the ``lens`` extra). See docs/architecture.md and docs/numerics.md#the-torch-export.
"""

from ..lens_plan import block_layers, stream_halves
from .float32 import UNIT_ROUNDOFF_32, Float32Verdict, float32_verdict, max_error
from .layouts import LAYOUTS, config_path, convert, export, load_torch, save_torch, to_torch
from .lens_files import (
    LENS_TOLERANCE,
    LensVerdict,
    lens_apply,
    lens_batch,
    lens_verdict,
    load_lens,
    save_lens,
    verdict_table,
)
from .modules import FF_FORMS, NativeTransformer, RhoEtaTransformer, attention_weights
from .native import (
    FORMAT,
    NATIVE_FF_KEYS,
    NATIVE_SA_KEYS,
    ff_profile,
    native_config,
    native_model,
    native_tensors,
    round_model,
)
from .rho_eta import to_rho_eta
from .run import apply, pad_batch
from .transformer_lens import (
    LENS_DTYPES,
    build_bridge,
    hardmax_exponent,
    lens_config,
    lens_state_dict,
    to_lens,
)

__all__ = ["FF_FORMS", "FORMAT", "Float32Verdict", "LAYOUTS", "LENS_DTYPES", "LENS_TOLERANCE",
           "LensVerdict", "NATIVE_FF_KEYS", "NATIVE_SA_KEYS", "NativeTransformer",
           "RhoEtaTransformer", "UNIT_ROUNDOFF_32", "apply", "attention_weights", "block_layers",
           "build_bridge", "config_path", "convert", "export", "ff_profile", "float32_verdict",
           "hardmax_exponent", "lens_apply", "lens_batch", "lens_config", "lens_state_dict",
           "lens_verdict", "load_lens", "load_torch", "max_error", "native_config", "native_model",
           "native_tensors", "pad_batch", "round_model", "save_lens", "save_torch",
           "stream_halves", "to_lens", "to_rho_eta", "to_torch", "verdict_table"]
