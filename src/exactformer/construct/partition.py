"""Classes of sequences, refined round by round, with their (class, token) counts kept current.

The separation rounds (docs/hardmax.md#choosing-the-test-token) need, after every round, how
many sequences of each class hold each token. Recounting that from all T memberships would
cost a sort per round. Here a round moves only the memberships of the sequences whose class it
changes (the owners of its tests) and updates the counts of the (class, token) pairs they leave
and join; choosing the next test is one weighted count over the memberships of the sequences
still involved, with no sort. Sequences are never paired up.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .generic import ConstructionError


def _room(a: np.ndarray, n: int) -> np.ndarray:
    """``a`` with at least n entries (doubling, zero-filled): ids are only ever added."""
    if n <= len(a):
        return a
    out = np.zeros(max(n, 2 * len(a)), dtype=a.dtype)
    out[:len(a)] = a
    return out


def _repeated(counts: np.ndarray) -> np.ndarray:
    """The weight of (class, token) pairs with these counts: the count if ≥ 2, else 0."""
    return np.where(counts >= 2, counts, 0)


@dataclass
class _Moves:
    """The memberships of the sequences a refinement moves, and the pairs they leave and join."""

    k: np.ndarray  # membership indices
    owner: np.ndarray  # per membership, the index of its sequence in the moved ones
    old: np.ndarray  # distinct pairs left
    old_first: np.ndarray  # per old pair, one of its moved memberships (index into k)
    old_of: np.ndarray  # per membership, its index into ``old``
    left: np.ndarray  # per old pair, how many memberships leave it
    new_first: np.ndarray  # per new pair, one of its memberships (index into k)
    new_of: np.ndarray  # per membership, the index of the pair it joins (0, 1, … local)
    joined: np.ndarray  # per new pair, its count


class Partition:
    """Sequences in classes (``label``) and, per (class, token) pair, its count ``cnt`` and the
    sum of its holders' ids (the holder itself once one is left).

    A sequence is *involved* while another sequence of its class holds one of its tokens
    (``nrep``: how many); ``size``: the involved sequences of each class; ``weight``: Σ of the
    counts ≥ 2, 0 iff every class is token-disjoint; ``sq[t]``: Σ over the involved pairs
    (C, t) of cnt², so that the split score of t is Σ_C cnt·size(C) − sq[t]. Memberships are
    grouped by sequence: sequence s owns indices start[s] … start[s+1] − 1."""

    def __init__(self, seq_of: np.ndarray, token_of: np.ndarray, n_tokens: int,
                 labels: np.ndarray):
        self.seq, self.tok, self.T = seq_of, token_of, n_tokens
        N = len(labels)
        self.start = np.searchsorted(seq_of, np.arange(N + 1))
        self.label = np.unique(labels, return_inverse=True)[1].reshape(-1).astype(np.int64)
        self.n_classes = int(self.label.max()) + 1 if N else 0
        _, pair, cnt = np.unique(self.label[seq_of] * n_tokens + token_of, return_inverse=True,
                                 return_counts=True)
        self.pair, self.cnt, self.n_pairs = pair.reshape(-1), cnt, len(cnt)
        self.holders = np.bincount(self.pair, weights=seq_of).astype(np.int64)
        self.nrep = np.bincount(seq_of, weights=self.cnt[self.pair] >= 2,
                                minlength=N).astype(np.int64)
        self.size = np.bincount(self.label[self.nrep > 0], minlength=self.n_classes)
        self.weight = int(_repeated(self.cnt).sum())
        act = self.nrep[seq_of] > 0  # memberships of involved sequences
        self.act_seq, self.act_tok = seq_of[act], token_of[act]
        self.sq = np.bincount(self.act_tok, weights=self.cnt[self.pair[act]],
                              minlength=n_tokens).astype(np.int64)
        self.dropped = False  # some sequence stopped being involved since the last compaction

    def copy(self) -> Partition:
        other = object.__new__(Partition)
        other.__dict__.update({k: v.copy() if isinstance(v, np.ndarray) and k not in
                               ("seq", "tok", "start") else v for k, v in self.__dict__.items()})
        return other

    def classes(self) -> np.ndarray:
        """Every sequence's class, numbered from 0 in order of the class ids."""
        return np.unique(self.label, return_inverse=True)[1].reshape(-1)

    def best_test(self) -> int | None:
        """The token splitting most pairs among the involved sequences of each class (see
        :meth:`scores`); ties go to the lowest token id; None when no sequence is involved
        (docs/hardmax.md#choosing-the-test-token)."""
        if self.weight == 0:
            return None
        score = self.scores()
        p = int(np.argmax(score))
        if score[p] <= 0:
            raise ConstructionError("no test token splits an unresolved class (inputs equal as "
                                    "sets)")
        return p

    def scores(self) -> np.ndarray:
        """Per token t, the pairs of involved sequences it splits: Σ_C a·(A − a) for a of the
        A involved sequences of class C holding t, that is Σ over t's involved memberships of
        A minus ``sq[t]``; one pass over the memberships of the involved sequences."""
        if self.dropped:  # an uninvolved sequence stays so: its memberships go for good
            keep = self.nrep[self.act_seq] > 0
            self.act_seq, self.act_tok = self.act_seq[keep], self.act_tok[keep]
            self.dropped = False
        own = self.size[self.label]  # per sequence, the involved count of its class
        return np.bincount(self.act_tok, weights=own[self.act_seq],
                           minlength=self.T).astype(np.int64) - self.sq

    def _memberships(self, seqs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The membership indices of these sequences, one sequence after another, and how many
        each has."""
        lens = self.start[seqs + 1] - self.start[seqs]
        return np.repeat(self.start[seqs] - np.cumsum(lens) + lens, lens) + np.arange(
            lens.sum()), lens

    def _moves(self, seqs: np.ndarray, group: np.ndarray) -> _Moves:
        k, lens = self._memberships(seqs)
        owner = np.repeat(np.arange(len(seqs)), lens)
        _, new_first, new_of, joined = np.unique(np.repeat(group, lens) * self.T + self.tok[k],
                                                 return_index=True, return_inverse=True,
                                                 return_counts=True)
        old, old_first, old_of, left = np.unique(self.pair[k], return_index=True,
                                                 return_inverse=True, return_counts=True)
        return _Moves(k, owner, old, old_first, old_of.reshape(-1), left, new_first,
                      new_of.reshape(-1), joined)

    def weight_after(self, seqs: np.ndarray, group: np.ndarray) -> int:
        """``weight`` once :meth:`split` (seqs, group) is done, without doing it."""
        mv = self._moves(seqs, group)
        before = self.cnt[mv.old]
        return int(self.weight + (_repeated(before - mv.left) - _repeated(before)).sum()
                   + _repeated(mv.joined).sum())

    def split(self, seqs: np.ndarray, group: np.ndarray) -> None:
        """Move sequence seqs[i] (ascending) into new class number group[i]; every group lies
        inside one class. Only the moved sequences' memberships are touched, and those of the
        sequences this leaves uninvolved."""
        mv = self._moves(seqs, group)
        was = self.nrep[seqs] > 0
        before = self.cnt[mv.old]
        after = before - mv.left
        old_tok = self.tok[mv.k[mv.old_first]]
        # a pair held once counts in sq while its holder is involved (before: a moved one)
        np.subtract.at(self.sq, old_tok, np.where(before >= 2, before ** 2,
                                                  was[mv.owner[mv.old_first]]))
        self.cnt[mv.old] = after
        self.holders[mv.old] -= np.bincount(mv.old_of, weights=seqs[mv.owner]).astype(np.int64)
        first = self.n_pairs
        self.n_pairs += len(mv.joined)
        self.cnt = _room(self.cnt, self.n_pairs)
        self.holders = _room(self.holders, self.n_pairs)
        self.cnt[first:self.n_pairs] = mv.joined
        self.holders[first:self.n_pairs] = np.bincount(mv.new_of, weights=seqs[mv.owner]
                                                       ).astype(np.int64)
        self.pair[mv.k] = first + mv.new_of
        self.weight += int((_repeated(after) - _repeated(before)).sum()
                           + _repeated(mv.joined).sum())
        lone = self.holders[mv.old[(before >= 2) & (after == 1)]]
        self._involvement(seqs, group, mv, was, lone)
        # a pair left with one holder adds 1 here; _drop took 1 back for every token of a
        # holder no longer involved
        np.add.at(self.sq, old_tok, after ** 2)
        np.add.at(self.sq, self.tok[mv.k[mv.new_first]],
                  np.where(mv.joined >= 2, mv.joined ** 2,
                           self.nrep[seqs[mv.owner[mv.new_first]]] > 0))

    def _involvement(self, seqs, group, mv: _Moves, was, lone: np.ndarray) -> None:
        """Update ``nrep``, ``size`` and the labels after a split: the moved sequences recount
        their repeated tokens; a sequence left alone on a pair loses one."""
        np.subtract.at(self.size, self.label[seqs[was]], 1)
        holders, times = np.unique(lone, return_counts=True)
        self.nrep[holders] -= times
        self._drop(holders[self.nrep[holders] == 0])
        self.nrep[seqs] = np.bincount(mv.owner, weights=self.cnt[self.pair[mv.k]] >= 2,
                                      minlength=len(seqs)).astype(np.int64)
        self.dropped |= bool((was & (self.nrep[seqs] == 0)).any())
        first = self.n_classes
        self.n_classes += int(group.max()) + 1
        self.size = _room(self.size, self.n_classes)
        self.label[seqs] = first + group
        self.size[first:self.n_classes] = np.bincount(group, weights=self.nrep[seqs] > 0,
                                                      minlength=self.n_classes - first)

    def _drop(self, gone: np.ndarray) -> None:
        """Sequences (not moved) that stopped being involved: every token of theirs is held
        once in their class and leaves ``sq`` and their class's ``size``."""
        if not len(gone):
            return
        self.dropped = True
        np.subtract.at(self.size, self.label[gone], 1)
        np.subtract.at(self.sq, self.tok[self._memberships(gone)[0]], 1)


def refinement(label: np.ndarray, keys: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The split of the classes ``label`` by integer ``keys`` per sequence, as
    (sequences that move, their new group): a sequence with every key 0 stays in its class,
    the others form one group per (class, keys)."""
    moved = np.flatnonzero(np.any(np.stack(keys) != 0, axis=0))
    rows = np.stack([label[moved]] + [key[moved] for key in keys])
    return moved, np.unique(rows, axis=1, return_inverse=True)[1].reshape(-1)
