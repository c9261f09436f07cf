"""exactformer: compile a finite sequence-to-sequence dataset into an exact transformer."""

from .api import compile
from .causal_data import CausalDataset
from .data import Dataset, DatasetError
from .evaluate import forward, predict
from .model import Transformer
from .modelio import load_model, save_model
from .report import verify

__all__ = ["CausalDataset", "Dataset", "DatasetError", "Transformer", "compile", "forward",
           "load_model", "predict", "save_model", "verify"]
__version__ = "0.1.0"
