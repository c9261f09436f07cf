"""The evaluation stage: forward passes of a model in exact, float64 or mpmath arithmetic.

The interface is :func:`forward` (set or causal data), :func:`forward_causal`, :func:`enclose`
(float64 with rigorous radii) and :func:`predict`; :func:`dense_forward` is the plain float64
reference pass. The modules, in the order a pass uses them: ``arithmetic`` (the three
arithmetics and the pass statistics), ``windows`` (which FF layers are ridge windows),
``keys`` (which are key layers, applied by lookup), ``gates`` (which are gated layers,
applied to the rows that hold their keys), ``jobs``
(a model prepared for a pass, and the process pool), ``state``, ``rows`` and ``compaction``
(the rows a pass carries), ``layers`` and ``attention`` (applying one layer), ``rank_one``,
``runs``, ``gate_runs`` and ``staged`` (the kernels that keep large constructed models near
linear), ``enclosure`` (the rounding bounds of a tracking pass), ``causal`` (the decoder
pass), ``dense`` (the reference).
See docs/numerics.md.
"""

from .arithmetic import ARITHMETICS, Arithmetic, PassStats, relu
from .causal import CausalScan, causal_row, with_positions
from .dense import dense_forward
from .jobs import layer_forms
from .keys import KeyLayer, KeyRun, key_layers
from .passes import distinct_rows, enclose, forward, forward_causal, predict, run
from .windows import Ridge, direction_scales, ridge_groups, ridge_window, ridges_in, ridges_of

__all__ = ["ARITHMETICS", "Arithmetic", "CausalScan", "KeyLayer", "KeyRun", "PassStats",
           "Ridge", "causal_row", "dense_forward", "direction_scales", "distinct_rows",
           "enclose", "forward", "key_layers", "layer_forms",
           "forward_causal", "predict", "relu", "run", "ridge_groups", "ridge_window",
           "ridges_in", "ridges_of", "with_positions"]
