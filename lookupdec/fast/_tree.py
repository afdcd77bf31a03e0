"""Tree drafts of the hybrid policy: the branches (their votes are the linear draft's, see ``_hybrid``)."""

from __future__ import annotations

from typing import Final

from librt.vecs import append, vec
from mypy_extensions import i32, i64

VOTE_HASH: Final[i64] = 2654435761
"""Multiplier of the vote tables' hash (Knuth's: a prime near 2^32 / phi)."""


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
