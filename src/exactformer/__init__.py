"""exactformer: compile a finite sequence-to-sequence dataset into an exact transformer.

The package is laid out by stage (docs/README.md#the-package): ``data`` → ``construct`` →
``model`` → ``evaluate`` → ``verification`` → ``export``, with ``tools`` around them.
"""

from .api import compile
from .circuit.explain import explain
from .data import CausalDataset, Dataset, DatasetError
from .evaluate import forward, predict, run
from .model import Transformer
from .modelio import load_model, save_model
from .verification import prove_runtime, verify

__all__ = ["CausalDataset", "Dataset", "DatasetError", "Transformer", "compile", "explain",
           "forward", "load_model", "predict", "prove_runtime", "run", "save_model", "verify"]
__version__ = "0.1.0"
