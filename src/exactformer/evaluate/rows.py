"""What a pass's rows offer the code that works on them: the :class:`Rows` protocol.

The layer runs (:mod:`.runs`) and the rank-one heads (:mod:`.rank_one`) read and change a pass's
rows through these members only; :class:`.state.RowState` implements them. ``Segments`` tells
which rows belong to which sequence.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np


@dataclass
class Segments:
    """Rows contiguous by sequence: each row's segment number and each segment's first row."""

    seg: np.ndarray
    starts: np.ndarray

    @property
    def n(self) -> int:
        return len(self.starts)

    def subset(self, segs: np.ndarray) -> tuple[np.ndarray, Segments]:
        """The rows of the segments ``segs`` (increasing), and their segments renumbered."""
        ends = np.append(self.starts[1:], len(self.seg))
        lengths = ends[segs] - self.starts[segs]
        first = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        rows = np.arange(lengths.sum()) + np.repeat(self.starts[segs] - first, lengths)
        return rows, Segments(np.repeat(np.arange(len(segs)), lengths), first)


class Rows(Protocol):
    """A pass's rows as :mod:`.runs` and :mod:`.rank_one` see them.

    ``P`` holds the points (rows contiguous by sequence), ``rad`` their radii in a tracking
    float64 pass (else None). Every change of a row's point or radius gets a new epoch
    (``epoch``, stamped into ``row_epoch``); every attention write of a column too
    (``col_epoch``): results computed from rows and columns whose stamps did not move since can
    be reused.
    """

    P: np.ndarray
    rad: np.ndarray | None
    epoch: int
    row_epoch: np.ndarray
    col_epoch: np.ndarray

    def projection(self, f: np.ndarray):
        """The rows' values f·x in a sorted index (:class:`.state.SortedProjection`)."""

    def reach(self, f) -> float:
        """A bound on |f·x − f·m| over every row m and every exact point x in its box."""

    def moved(self, rows: np.ndarray, cols: np.ndarray | None = None) -> None:
        """Rows changed by an FF (in ``cols`` alone, unless None): sorted indices and radii
        bookkeeping follow them."""

    def grew(self, rows: np.ndarray) -> None:
        """Rows whose value or radius changed."""

    def segment_index(self) -> Segments:
        """Each row's segment number and every segment's first row."""

    def weights(self) -> np.ndarray:
        """The rows' multiplicities in the pass's arithmetic."""
