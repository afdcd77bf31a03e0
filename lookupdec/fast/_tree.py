"""Tree drafts of the hybrid policy: the votes among candidates' next tokens and the branches."""

from __future__ import annotations

from typing import Final

from librt.vecs import append, vec
from mypy_extensions import i32, i64

from lookupdec.fast._history import SEP
from lookupdec.fast._tables import filled_i32, zeros_i64

VOTE_HASH: Final[i64] = 2654435761
"""Multiplier of the vote tables' hash (Knuth's: a prime near 2^32 / phi)."""


class TreeVotes:
    """The tree's votes among candidates' next tokens: per token its count and first candidate.

    An open-addressing table whose slots are live only with the current stamp, as
    :meth:`HybridState._follow`'s vote (O(candidates) per vote), but a table of its own: the
    tree code shares no scratch with the linear policy's.
    """

    key: vec[i32]
    cnt: vec[i64]
    first: vec[i64]
    live: vec[i64]
    slot: vec[i64]
    mask: i64
    stamp: i64
    n_votes: i64
    n_tokens: i64

    def __init__(self) -> None:
        self.key = vec[i32]()
        self.cnt = vec[i64]()
        self.first = vec[i64]()
        self.live = vec[i64]()
        self.slot = vec[i64]()
        self.mask = -1
        self.stamp = 0
        self.n_votes = 0  # the last tally's tokens (not -1) ...
        self.n_tokens = 0  # ... and distinct tokens

    def tally(self, nx: vec[i32], n: i64) -> None:
        """Count the tokens of ``nx[:n]`` (-1 is no token); how many and how many distinct ones
        are in :attr:`n_votes` and :attr:`n_tokens`."""
        if 2 * n > self.mask + 1:
            size: i64 = 128
            while size < 2 * n:
                size *= 2
            self.key = filled_i32(size, SEP)
            self.cnt = zeros_i64(size)
            self.first = zeros_i64(size)
            self.live = zeros_i64(size)
            self.slot = zeros_i64(size)
            self.mask = size - 1
        self.stamp += 1
        stamp = self.stamp
        key = self.key
        live = self.live
        mask = self.mask
        n_votes: i64 = 0
        n_tokens: i64 = 0
        for i in range(n):
            t = nx[i]
            if t == SEP:
                self.slot[i] = -1
                continue
            n_votes += 1
            g = ((i64(t) * VOTE_HASH) >> 16) & mask  # t < 2^31: no overflow
            while live[g] == stamp and key[g] != t:
                g = (g + 1) & mask
            if live[g] != stamp:
                live[g] = stamp
                key[g] = t
                self.cnt[g] = 1
                self.first[g] = i
                n_tokens += 1
            else:
                self.cnt[g] += 1
            self.slot[i] = g
        self.n_votes = n_votes
        self.n_tokens = n_tokens

    def best(self, nx: vec[i32], n: i64, skip: vec[i32]) -> tuple[i64, i64]:
        """After :meth:`tally` of ``nx[:n]``: the most frequent token not in ``skip`` as (the index of
        its first occurrence, its count), (-1, 0) if none; a tie goes to the one occurring first
        (the newest candidate's), as in :meth:`HybridState._follow`'s vote."""
        best_f: i64 = -1
        best_c: i64 = 0
        for i in range(n):
            g = self.slot[i]
            if g < 0 or self.first[g] != i or self.cnt[g] <= best_c:
                continue
            t = nx[i]
            skipped = False
            for j in range(len(skip)):
                if skip[j] == t:
                    skipped = True
            if not skipped:
                best_c = self.cnt[g]
                best_f = i
        return best_f, best_c


def add_branch(tree: list[vec[i32]], v: vec[i32], branches: i64) -> None:
    """Append ``v`` to ``tree`` unless it is empty, the tree has ``branches`` branches, or ``v``
    and a branch already there are one a prefix of the other (a tree verifier gains nothing from it)."""
    n = i64(len(v))
    if n == 0 or i64(len(tree)) >= branches:
        return
    for b in tree:
        k = i64(len(b))
        if n < k:
            k = n
        j: i64 = 0
        while j < k and b[j] == v[j]:
            j += 1
        if j == k:
            return
    tree.append(v)


def tree_nodes(tree: list[vec[i32]]) -> i64:
    """Distinct nodes of the tree the branches form (shared prefixes counted once): what a tree
    verifier evaluates."""
    total: i64 = 0
    for i in range(len(tree)):
        b = tree[i]
        shared: i64 = 0
        for j in range(i):
            o = tree[j]
            k = i64(len(o))
            if i64(len(b)) < k:
                k = i64(len(b))
            c: i64 = 0
            while c < k and o[c] == b[c]:
                c += 1
            if c > shared:
                shared = c
        total += i64(len(b)) - shared
    return total


def tree_path(
    tree: list[vec[i32]], toks: vec[i32], at: i64, room: i64, tail: vec[i32], base: i64
) -> tuple[vec[i32], i64]:
    """``tail[:base]`` followed by the branch of ``tree`` that agrees longest with the text
    ``toks[at:at + room]`` (the first of them on a tie), and how far branch 0 agrees with it."""
    best: i64 = -1
    pick: i64 = 0
    acc0: i64 = 0
    for bi in range(len(tree)):
        b = tree[bi]
        a: i64 = 0
        while a < i64(len(b)) and a < room and toks[at + a] == b[a]:
            a += 1
        if bi == 0:
            acc0 = a
        if a > best:
            best = a
            pick = bi
    path = vec[i32](capacity=base + 16)
    for j in range(base):
        path = append(path, tail[j])
    if len(tree) > 0:
        b = tree[pick]
        for j in range(len(b)):
            path = append(path, b[j])
    return path, acc0
