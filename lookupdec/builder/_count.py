"""Counting 2-gram followers with numpy: the plain functions every engine calls.

A static cache counts, for every position ``i >= 2`` of a corpus, the follower ``t[i]`` of
the 2-gram ``(t[i-2], t[i-1])``. Each (t0, t1, t2) triple is packed into one int64 whose
signed order is the order of the index file (keys ascending by (t0, t1) as signed int32,
then followers ascending):

- ids are first mapped to *codes* by an :class:`IdCode` (the identity when every id is in
  ``0 .. 2**21 - 1``, as with every real vocabulary; otherwise the rank among the corpus's
  distinct ids, which keeps the signed order), ``bits`` bits each;
- ``u = c0 << 2*bits | c1 << bits | c2``, so ``u >> bits`` is the key code and sorting
  ``u`` sorts by key, then follower.

:func:`count_shard` turns a slice of a corpus into a sorted run of (u, count) split into
buckets (contiguous key ranges); :func:`reduce_bucket` adds up the runs of one bucket and
returns its :class:`Part` of the index. Both are pure functions of their arguments, so
Dask, Spark or a process pool can run them anywhere and the result is the same.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from lookupdec.errors import IdsOutOfRange, TooManyIdsError
from lookupdec.rules import INT32_MAX

I64 = npt.NDArray[np.int64]
I32 = npt.NDArray[np.int32]

MAX_BITS = 21
"""Bits per id code: three codes fill 63 bits, so a packed triple is a non-negative int64."""
GUESS_BITS = MAX_BITS
"""The id width a create assumes before reading any id (every real vocabulary fits; a corpus
with other ids makes the first count fail with :class:`IdsOutOfRange` and the plan scan them)."""

PACK_BLOCK = 1 << 20
"""Triples packed per numpy call: keeps the int64 temporaries of packing small."""


@dataclass(frozen=True)
class IdCode:
    """Maps token ids to order-preserving codes of ``bits`` bits (and back).

    ``table`` is None for the identity (ids ``0 .. 2**bits - 1``), else the sorted distinct
    ids: code = rank in ``table``.
    """

    bits: int
    table: I64 | None = None

    @staticmethod
    def for_ids(lo: int, hi: int, distinct: I64 | None = None) -> IdCode:
        """The code for ids in ``lo .. hi``; needs ``distinct`` (sorted unique ids) unless ``0 <= lo, hi < 2**21``."""
        if lo >= 0 and hi < 2**MAX_BITS:
            return IdCode(max(1, int(hi).bit_length()))
        if distinct is None:
            raise ValueError("ids outside 0 .. 2**21 - 1 need the table of distinct ids")
        if len(distinct) > 2**MAX_BITS:
            raise TooManyIdsError(f"{len(distinct):,} distinct token ids; at most {2**MAX_BITS:,} are supported")
        return IdCode(max(1, (len(distinct) - 1).bit_length()), distinct.astype(np.int64))

    def encode(self, ids: npt.NDArray[Any]) -> I64:
        """Codes of ``ids`` (int64); :class:`IdsOutOfRange` if the identity code does not cover them."""
        if self.table is None:
            # Checked on every block: a plan may assume 2**21 ids without scanning the corpus first.
            if len(ids) and (int(ids.min()) < 0 or int(ids.max()) >> self.bits):
                raise IdsOutOfRange(f"ids outside 0 .. 2**{self.bits} - 1")
            return ids.astype(np.int64)
        return np.searchsorted(self.table, ids).astype(np.int64)

    def decode(self, codes: I64) -> I64:
        """Ids of ``codes`` (int64)."""
        if self.table is None:
            return codes
        result: I64 = self.table[codes]
        return result


def pack_from(read: Callable[[int, int], npt.NDArray[Any]], start: int, stop: int, code: IdCode) -> I64:
    """Packed triples of positions ``max(start, 2) .. stop - 1`` of a corpus read by ``read(a, b)``.

    Reads and encodes the ids block by block, so only the packed array is held whole.
    """
    first = max(start, 2)
    n = max(stop - first, 0)
    u = np.empty(n, dtype=np.int64)
    b = code.bits
    for s in range(0, n, PACK_BLOCK):
        e = min(s + PACK_BLOCK, n)
        c = code.encode(read(first + s - 2, first + e))
        block = u[s:e]
        np.left_shift(c[:-2], 2 * b, out=block)
        block |= c[1:-1] << b
        block |= c[2:]
    return u


def pack_triples(codes: I64, bits: int) -> I64:
    """Packed triples of every position ``i >= 2`` of ``codes`` (length ``len(codes) - 2``)."""
    n = len(codes) - 2
    u = np.empty(max(n, 0), dtype=np.int64)
    for s in range(0, n, PACK_BLOCK):
        e = min(s + PACK_BLOCK, n)
        block = u[s:e]
        np.left_shift(codes[s:e], 2 * bits, out=block)
        block |= codes[s + 1 : e + 1] << bits
        block |= codes[s + 2 : e + 2]
    return u


def unique_counts(u: I64) -> tuple[I64, npt.NDArray[Any]]:
    """Distinct values of the sorted ``u`` and how often each occurs (int32 when that fits)."""
    if len(u) == 0:
        return u, np.zeros(0, dtype=np.int64)
    new = np.empty(len(u), dtype=bool)
    new[0] = True
    np.not_equal(u[1:], u[:-1], out=new[1:])
    first = np.flatnonzero(new)
    del new
    values = u[first]
    # Differences of the first positions, written straight into the (int32 when it fits) result.
    counts = np.empty(len(first), dtype=np.int32 if len(u) <= INT32_MAX else np.int64)
    np.subtract(first[1:], first[:-1], out=counts[:-1], casting="unsafe")
    counts[-1] = len(u) - first[-1]
    return values, counts


def count_run(codes: I64, bits: int) -> tuple[I64, I64]:
    """The sorted run of (packed triple, count) of one slice of codes (its 2 carried tokens included)."""
    return count_packed(pack_triples(codes, bits))


def count_packed(u: I64) -> tuple[I64, I64]:
    """Sort ``u`` in place and count it: the sorted run of (packed triple, count)."""
    u.sort()
    return unique_counts(u)


def split_run(u: I64, splitters: I64) -> list[slice]:
    """Slices of the sorted run ``u`` per bucket; ``splitters`` are the first packed value of buckets 1..."""
    cuts = [0, *np.searchsorted(u, splitters).tolist(), len(u)]
    return [slice(cuts[i], cuts[i + 1]) for i in range(len(cuts) - 1)]


def count_shard(tokens: npt.NDArray[Any], code: IdCode, splitters: I64) -> list[tuple[I64, I64]]:
    """Count one shard: per bucket, the sorted (packed triple, count) arrays.

    ``tokens`` are the shard's ids *preceded by the last two ids of the shard before it* in
    the same corpus (none for a corpus's first shard): only followers inside the shard are
    counted, so no 2-gram is lost or counted twice at a cut.
    """
    u, c = count_run(code.encode(tokens), code.bits)
    return [(u[s].copy(), c[s].copy()) for s in split_run(u, splitters)]


@dataclass
class Part:
    """One bucket of the index: its keys in order, with followers, counts and picks.

    ``starts`` are local (``starts[0] == 0``, ``len(starts) == n_keys + 1``); the writer
    adds the entries of the parts before. ``saturated`` counts the follower counts clipped
    to ``2**31 - 1``.
    """

    keys: I64
    starts: I64
    picks: I32
    tokens: I32
    counts: I32
    total: int
    saturated: int

    @property
    def n_keys(self) -> int:
        """Distinct 2-grams in this part."""
        return len(self.keys)

    @property
    def n_entries(self) -> int:
        """(2-gram, follower) pairs in this part."""
        return len(self.tokens)


def merge_runs(runs: Sequence[tuple[I64, npt.NDArray[Any]]]) -> tuple[I64, npt.NDArray[Any]]:
    """Add sorted (u, count) runs together: one sorted run with distinct u (counts int64 when summed).

    (A stable ``argsort`` merges the presorted runs; storing the counts in spare low bits and
    merging with one in-place ``sort`` is no faster.)
    """
    runs = [r for r in runs if len(r[0])]
    if not runs:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    if len(runs) == 1:
        return runs[0]
    return _merge_by_argsort([r[0] for r in runs], [r[1] for r in runs])


def _merge_by_argsort(us: Sequence[I64], cs: Sequence[npt.NDArray[Any]]) -> tuple[I64, I64]:
    u = np.concatenate(us)
    c = np.concatenate(cs).astype(np.int64, copy=False)
    # A stable sort of concatenated sorted runs is a merge (timsort finds the runs).
    order = np.argsort(u, kind="stable")
    u = u[order]
    c = c[order]
    del order
    new = np.empty(len(u), dtype=bool)
    new[0] = True
    np.not_equal(u[1:], u[:-1], out=new[1:])
    first = np.flatnonzero(new)
    del new
    return u[first], np.add.reduceat(c, first)


def reduce_bucket(runs: Sequence[tuple[I64, I64]], code: IdCode) -> Part:
    """The index part of one bucket from its runs (from any shards, in any order)."""
    u, c = merge_runs(runs)
    return part_from_run(u, c, code)


def parts_from_run(u: I64, c: npt.NDArray[Any], code: IdCode, entries: int = 1 << 20) -> list[Part]:
    """:func:`part_from_run` in slices of about ``entries`` entries cut at key boundaries.

    The same index (the writer joins the parts); the temporaries stay the size of a slice.
    """
    parts = []
    start = 0
    while start < len(u):
        stop = min(start + entries, len(u))
        if stop < len(u):
            stop = int(np.searchsorted(u, ((int(u[stop - 1]) >> code.bits) + 1) << code.bits))
        parts.append(part_from_run(u[start:stop], c[start:stop], code))
        start = stop
    return parts


def part_from_run(u: I64, c: npt.NDArray[Any], code: IdCode) -> Part:
    """The index part of a sorted run of distinct packed triples with their counts."""
    bits = code.bits
    mask = (1 << bits) - 1
    n = len(u)
    kc = u >> bits
    new = np.empty(n, dtype=bool)
    if n:
        new[0] = True
        np.not_equal(kc[1:], kc[:-1], out=new[1:])
    first = np.flatnonzero(new)
    del new
    kc = kc[first]
    t0 = code.decode(kc >> bits)
    t1 = code.decode(kc & mask)
    del kc
    keys = (t0 << 32) | (t1 & 0xFFFFFFFF)
    del t0, t1
    tokens = code.decode(u & mask).astype(np.int32)
    saturated = int(np.count_nonzero(c > INT32_MAX)) if c.dtype != np.int32 else 0
    if saturated:
        c = np.minimum(c, INT32_MAX)
    counts = c.astype(np.int32, copy=False)
    starts = np.append(first, n).astype(np.int64)
    picks = compute_picks(first, c, tokens)
    return Part(keys, starts, picks, tokens, counts, int(c.sum(dtype=np.int64)), saturated)


def compute_picks(first: I64, c: I64, tokens: I32) -> I32:
    """Spec 3.2 per key (runs start at ``first``): the max-count follower, smallest id on ties,
    if the total is >= 2 and it holds >= 50 % (computed exactly in int64), else -1.
    """
    if len(first) == 0:
        return np.zeros(0, dtype=np.int32)
    c = c.astype(np.int64, copy=False)
    # One maximum per key over (count << 32 | 0x7FFFFFFF - token): the largest count, and
    # among equal counts the smallest token (the low word is in 0 .. 2**32 - 1 for any int32).
    v = c << 32
    v |= np.int64(0x7FFFFFFF) - tokens
    best = np.maximum.reduceat(v, first)
    del v
    maxc = best >> 32
    pick = np.int64(0x7FFFFFFF) - (best & 0xFFFFFFFF)
    sums = np.add.reduceat(c, first)
    ok = (sums >= 2) & (100 * maxc >= 50 * sums)
    return np.where(ok, pick, -1).astype(np.int32)
