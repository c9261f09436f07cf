"""The data stage: datasets of sequence pairs, their validation and their files.

``sets`` holds set-to-set data (:class:`Dataset`), ``causal`` decoder data with a target or
none at every position (:class:`CausalDataset`), ``builtin`` the generated datasets of the demo,
the tests and the benchmarks. See docs/problem.md for the rules every dataset is checked
against, docs/causal.md#data for causal files.
"""

from .causal import CausalDataset, is_causal_doc, load_dataset
from .sets import Dataset, DatasetError, DuplicatePairWarning

__all__ = ["CausalDataset", "Dataset", "DatasetError", "DuplicatePairWarning", "is_causal_doc",
           "load_dataset"]
