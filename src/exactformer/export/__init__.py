"""The export stage: a model as torch modules and weight files (needs the ``torch`` extra).

``modules`` holds the ``nn.Module`` classes of both layouts, ``layouts`` the conversion of a
model into them and their safetensors files, ``float32`` the float32 verdict. See
docs/architecture.md and docs/numerics.md#the-torch-export.
"""

from .float32 import UNIT_ROUNDOFF_32, Float32Verdict, float32_verdict, max_error
from .layouts import (
    FORMAT,
    LAYOUTS,
    apply,
    config_path,
    convert,
    export,
    load_torch,
    native_model,
    native_tensors,
    pad_batch,
    round_model,
    save_torch,
    to_rho_eta,
    to_torch,
)
from .modules import (
    FF_FORMS,
    NATIVE_FF_KEYS,
    NATIVE_SA_KEYS,
    NativeTransformer,
    RhoEtaTransformer,
    attention_weights,
    ff_profile,
    native_config,
)

__all__ = ["FF_FORMS", "FORMAT", "LAYOUTS", "NATIVE_FF_KEYS", "NATIVE_SA_KEYS", "Float32Verdict",
           "NativeTransformer", "RhoEtaTransformer", "apply", "attention_weights", "config_path",
           "convert", "export", "ff_profile", "float32_verdict", "load_torch", "max_error",
           "native_config", "native_model", "native_tensors", "pad_batch", "round_model",
           "save_torch", "to_rho_eta", "to_torch", "UNIT_ROUNDOFF_32"]
