"""The circuit of a compiled model: which TransformerLens units and heads each pair uses, and
why (docs/circuit.md). :mod:`.trace` is the checked layer-by-layer pass, :mod:`.document` the
``circuit.json`` document, :mod:`.explain` one pair's path phase by phase."""

from .document import FORMAT, circuit, lens_shape, mlp_hook, pattern_hook, readout
from .trace import Trace, TraceMismatch, trace

__all__ = ["FORMAT", "Trace", "TraceMismatch", "circuit", "lens_shape", "mlp_hook",
           "pattern_hook", "readout", "trace"]
