"""Validated tables: the common numpy form of a static file's keys and runs (fork and index)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from lookupdec.errors import CacheFormatError
from lookupdec.formats.detect import NULL, ContentsItem
from lookupdec.rules import INT32_MAX, INT32_MIN

I64Array = npt.NDArray[np.int64]
I32Array = npt.NDArray[np.int32]


@dataclass
class Table:
    """2-gram keys with their runs: key ``i`` has entries ``offs[i] .. offs[i] + lens[i] - 1``."""

    t0: I64Array
    t1: I64Array
    offs: I64Array
    lens: I64Array
    tokens: I32Array
    counts: I32Array

    def iter_contents(self) -> Iterator[ContentsItem]:
        toks: list[int] = self.tokens.tolist()
        cnts: list[int] = self.counts.tolist()
        for a, b, o, n in zip(self.t0.tolist(), self.t1.tolist(), self.offs.tolist(), self.lens.tolist(), strict=True):
            yield (a, b, NULL, NULL), list(zip(toks[o : o + n], cnts[o : o + n], strict=True))

    def key_totals(self) -> I64Array:
        """Sum of counts of each key (int64: exact)."""
        if len(self.lens) == 0:
            return np.zeros(0, dtype=np.int64)
        c = self.counts.astype(np.int64)
        # Runs may sit anywhere in the entries array (fork v2), so gather them first.
        idx = run_indices(self.offs, self.lens)
        cum = np.concatenate(([0], np.cumsum(self.lens)[:-1]))
        return np.add.reduceat(c[idx], cum)


def run_indices(offs: I64Array, lens: I64Array) -> I64Array:
    """Entry indices of all runs, concatenated (runs must be non-empty)."""
    total = int(lens.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    cum = np.concatenate(([0], np.cumsum(lens)[:-1]))
    return np.repeat(offs - cum, lens) + np.arange(total, dtype=np.int64)


def check_runs(
    path: str | os.PathLike[str],
    offs: I64Array,
    lens: I64Array,
    tokens: I32Array,
    counts: I32Array,
    entries_offset: int,
    tokens_stride: int,
    counts_offset: int,
) -> None:
    """Every run strictly ascending by token, every count > 0 (fork expansion / index verify).

    Byte offsets: entry ``i``'s token is at ``entries_offset + tokens_stride * i`` and its
    count at ``counts_offset + tokens_stride * i`` (interleaved fork entries or index arrays).
    """
    idx = run_indices(offs, lens)
    if len(idx) == 0:
        return
    c = counts[idx]
    bad = np.flatnonzero(c <= 0)
    if len(bad):
        e = int(idx[bad[0]])
        raise CacheFormatError(
            path,
            f"entry {e} (token {int(tokens[e])}) has count {int(counts[e])}, must be > 0",
            counts_offset + tokens_stride * e,
        )
    t = tokens[idx].astype(np.int64)
    ascending = t[1:] > t[:-1]
    boundary = np.cumsum(lens)[:-1] - 1  # the pair (last of run k, first of run k+1) is not compared
    ascending[boundary] = True
    bad = np.flatnonzero(~ascending)
    if len(bad):
        e = int(idx[bad[0] + 1])
        raise CacheFormatError(
            path,
            f"entry {e}: follower tokens not strictly ascending within a run "
            f"({int(t[bad[0]])} then {int(t[bad[0] + 1])})",
            entries_offset + tokens_stride * e,
        )


def pack_keys(t0: I64Array, t1: I64Array) -> I64Array:
    """``(t0 << 32) | (t1 & 0xFFFFFFFF)`` as int64 bits (the index's packed key)."""
    return ((t0 << 32) | (t1 & 0xFFFFFFFF)).astype(np.int64)


def collect(
    contents: Iterable[tuple[Sequence[int], Iterable[tuple[int, int]] | Mapping[int, int]]],
) -> tuple[I64Array, I64Array, I64Array, I32Array, I32Array]:
    """Check and flatten static contents: (t0, t1, starts, tokens, counts), runs sorted by token."""
    k0: list[int] = []
    k1: list[int] = []
    lens: list[int] = []
    toks: list[int] = []
    cnts: list[int] = []
    for key, followers in contents:
        if len(key) != 4 or key[2] != NULL or key[3] != NULL:
            raise ValueError(f"a static cache holds only 2-gram keys (slots 2 and 3 = -1), got {tuple(key)}")
        pairs = sorted(followers.items() if isinstance(followers, Mapping) else followers)
        if not pairs:
            raise ValueError(f"key {tuple(key)} has no followers")
        k0.append(key[0])
        k1.append(key[1])
        lens.append(len(pairs))
        for t, c in pairs:
            toks.append(t)
            cnts.append(c)

    def int64(values: list[int], what: str) -> I64Array:
        try:
            a = np.array(values, dtype=np.int64)
        except OverflowError:
            raise ValueError(f"a {what} does not fit in int32") from None
        bad = np.flatnonzero((a < INT32_MIN) | (a > INT32_MAX))
        if len(bad):
            raise ValueError(f"{what} {int(a[bad[0]])} does not fit in int32")
        return a

    t0, t1 = int64(k0, "key token"), int64(k1, "key token")
    tokens, counts = int64(toks, "follower token"), int64(cnts, "count")
    bad = np.flatnonzero(counts <= 0)
    if len(bad):
        raise ValueError(f"follower {int(tokens[bad[0]])} has count {int(counts[bad[0]])}, must be > 0")
    starts = np.concatenate(([0], np.cumsum(np.array(lens, dtype=np.int64)))).astype(np.int64)
    if len(tokens) > 1:
        same = tokens[1:] == tokens[:-1]
        same[starts[1:-1] - 1] = False
        bad = np.flatnonzero(same)
        if len(bad):
            k = int(np.searchsorted(starts, bad[0], side="right")) - 1
            raise ValueError(f"key ({k0[k]}, {k1[k]}) lists follower {int(tokens[bad[0]])} twice")
    return t0, t1, starts, tokens.astype(np.int32), counts.astype(np.int32)


def check_unique_keys(t0: I64Array, t1: I64Array) -> None:
    packed = np.sort(pack_keys(t0, t1))
    dup = np.flatnonzero(packed[1:] == packed[:-1])
    if len(dup):
        p = int(packed[dup[0]])
        raise ValueError(f"2-gram ({p >> 32}, {((p & 0xFFFFFFFF) ^ 0x80000000) - 0x80000000}) appears twice")
