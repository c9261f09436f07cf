"""The keyed set models' separation tests: which tokens the rounds test (docs/keyed.md#separation).

Every two holders of a common leader tag must end with different signatures, so with different
outcomes in some round. The tests are chosen greedily on the pairs not told apart yet, which
are counted in classes of holders and never listed: a tag of h holders has h(h − 1)/2 pairs,
quadratic in the sharing, while its classes cost one entry per holder.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

TABLE = 1 << 24  # the longest lookup table (int64 entries) a trial builds


def plan_tests(tags: list[int], owners: list[np.ndarray], seqs: list[np.ndarray],
               per_round: int) -> list[list[int]]:
    """Separation rounds of up to ``per_round`` tests at heights 1, 2, …: a sequence's outcome
    in a round is the height of the highest test it holds (0 if none). Every two holders of a
    common leader tag (``tags``; ``owners``: per token the sequences holding it; ``seqs``:
    per sequence its tokens) must end with different outcomes in some round. Each test is
    greedily the token in the most symmetric differences of such pairs not told apart yet (a
    pair counted once per leader tag it shares; a leader tag wins a tie: it needs no tag of
    its own); a further test joins a round only if the round then tells more pairs apart (a
    higher test held by both sequences of a pair undoes its split). The first test of a
    round tells at least one pair apart, so the rounds end."""
    classes = _Classes.of(tags, owners, seqs)
    bonus = np.zeros(len(owners), dtype=np.int64)
    bonus[tags] = 1
    rounds = []
    while classes.within > 0:
        together = classes.within
        rounds.append(_round(classes, bonus, per_round))
        if classes.within >= together:  # distinct holders differ in a token: a miscount
            raise RuntimeError("separation: a round told no pair apart")
        classes.end_round()
    return rounds


def _round(classes: _Classes, bonus: np.ndarray, per_round: int) -> list[int]:
    """One round's tests, chosen greedily (:func:`plan_tests`); ``classes`` ends refined by
    the round's outcomes."""
    tests: list[int] = []
    while len(tests) < per_round:
        pick = classes.score * 2 + bonus
        pick[tests] = -1
        t = int(np.argmax(pick))
        if t in tests or classes.score[t] <= 0:
            break
        trial = classes.trial(t)
        if tests and trial.within >= classes.within:
            break  # the round would tell no more pairs apart
        classes.label[trial.members] = trial.label
        classes.score, classes.within = trial.score, trial.within
        tests.append(t)
    return tests


@dataclass
class _Trial:
    """The classes after one more test: the members whose class changes and their new
    classes, the new scores and the pairs still together."""

    members: np.ndarray
    label: np.ndarray
    score: np.ndarray
    within: int


@dataclass
class _Classes:
    """The pairs :func:`plan_tests` must tell apart, in classes. A *member* is a (leader tag,
    holder) pair; two members share a class while they belong to one tag and their holders
    have had the same outcome in every round so far, this one included. So the pairs not told
    apart yet are Σ |R|(|R| − 1)/2 over the classes R (``within``), and a token x lies in the
    symmetric difference of Σ_R (|R|·c_R(x) − c_R(x)²) of them (``score``), c_R(x) the
    members of R whose holder holds x: sums over memberships, not over pairs."""

    owners: list  # per token, the sequences holding it
    by_seq: dict  # holder → its members
    ptr: np.ndarray  # member k's holder's tokens: tokens[ptr[k]:ptr[k + 1]]
    tokens: np.ndarray
    base: np.ndarray  # each member's class when this round began
    label: np.ndarray  # each member's class now
    score: np.ndarray
    within: int

    @classmethod
    def of(cls, tags: list[int], owners: list[np.ndarray], seqs: list[np.ndarray]) -> _Classes:
        """The classes before the first round: one per leader tag of two holders or more."""
        holders = [h for h in (np.unique(owners[t]) for t in tags) if len(h) > 1]
        seq = np.concatenate(holders).tolist() if holders else []
        sets = [np.unique(seqs[j]) for j in seq]
        by_seq: dict = {}
        for k, j in enumerate(seq):
            by_seq.setdefault(j, []).append(k)
        label = np.repeat(np.arange(len(holders)), [len(h) for h in holders])
        ptr = np.cumsum([0] + [len(s) for s in sets]).astype(np.int64)
        tokens = np.concatenate(sets).astype(np.int64) if sets else np.zeros(0, np.int64)
        T = len(owners)
        keys, c = np.unique(np.repeat(label, np.diff(ptr)) * T + tokens, return_counts=True)
        size = np.bincount(label)
        score = np.bincount(keys % T, weights=size[keys // T] * c - c * c, minlength=T)
        return cls(owners, by_seq, ptr, tokens, label.copy(), label,
                   np.rint(score).astype(np.int64), int((size * (size - 1) // 2).sum()))

    def trial(self, t: int) -> _Trial:
        """The classes after test t joins this round above its other tests: the holders of t
        take its outcome, so each class R they are in loses them (H_R), and those that began
        the round in one class b join in one new class N_b. Per token x, with h = h_R(x) and
        s = c_R(x) − h, the score changes by Σ_R (h² + 2hs − |R|·h − |H_R|·s) + Σ_b
        (|N_b|·h_b(x) − h_b(x)²): sums over the members of the classes it touches."""
        hit = np.array([k for j in self.owners[t].tolist() for k in self.by_seq.get(j, ())],
                       dtype=np.int64)
        hit = hit[self.label[hit] >= 0]
        touched = np.unique(self.label[hit])
        rest = np.isin(self.label, touched)
        rest[hit] = False
        rest = np.flatnonzero(rest)
        R_hit, R_rest = (np.searchsorted(touched, self.label[m]) for m in (hit, rest))
        H = np.bincount(R_hit, minlength=len(touched))
        size = H + np.bincount(R_rest, minlength=len(touched))
        _, b = np.unique(self.base[hit], return_inverse=True)
        N = np.bincount(b)
        T = len(self.score)
        tok, counts = self._items(hit)
        hkeys, h = np.unique(np.repeat(R_hit, counts) * T + tok, return_counts=True)
        bkeys, hb = np.unique(np.repeat(b, counts) * T + tok, return_counts=True)
        tok_rest, counts = self._items(rest)
        R_rest = np.repeat(R_rest, counts)
        h_at = _lookup(hkeys, h, R_rest * T + tok_rest, len(touched) * T)
        delta = (np.bincount(hkeys % T, weights=h * h - size[hkeys // T] * h, minlength=T)
                 + np.bincount(tok_rest, weights=2 * h_at - H[R_rest], minlength=T)
                 + np.bincount(bkeys % T, weights=N[bkeys // T] * hb - hb * hb, minlength=T))
        S = size - H
        within = self.within + int((S * (S - 1) // 2).sum() + (N * (N - 1) // 2).sum()
                                   - (size * (size - 1) // 2).sum())
        return _Trial(hit, int(self.label.max()) + 1 + b,
                      self.score + np.rint(delta).astype(np.int64), within)

    def end_round(self) -> None:
        """The round's classes become the next round's; a member alone in its class has no
        pair left to tell apart, and leaves (label −1)."""
        alone = np.bincount(self.label[self.label >= 0])[self.label] == 1
        self.label[alone & (self.label >= 0)] = -1
        self.base = self.label.copy()

    def _items(self, members: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Every token each of ``members``' holder holds, member by member, and how many
        each holds."""
        counts = self.ptr[members + 1] - self.ptr[members]
        first = np.repeat(self.ptr[members] - np.cumsum(counts) + counts, counts)
        return self.tokens[first + np.arange(int(counts.sum()))], counts


def _lookup(keys: np.ndarray, values: np.ndarray, queries: np.ndarray, bound: int
            ) -> np.ndarray:
    """The value of each query among the sorted distinct ``keys`` (0 where absent), all in
    [0, ``bound``): through a table where the range is small, else a sorted search."""
    if bound <= TABLE:
        table = np.zeros(bound, dtype=np.int64)
        table[keys] = values
        return table[queries]
    at = np.minimum(np.searchsorted(keys, queries), len(keys) - 1)
    return np.where(keys[at] == queries, values[at], 0)
