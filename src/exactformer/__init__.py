"""exactformer: compile a finite sequence-to-sequence dataset into an exact transformer."""

from .api import compile
from .data import Dataset, DatasetError
from .evaluate import forward, predict
from .model import Transformer
from .modelio import load_model, save_model

__all__ = ["Dataset", "DatasetError", "Transformer", "compile", "forward", "load_model",
           "predict", "save_model", "verify"]
__version__ = "0.1.0"


def __getattr__(name):  # verify pulls in the report code only when asked for
    if name == "verify":
        from .verify import verify
        return verify
    raise AttributeError(name)
