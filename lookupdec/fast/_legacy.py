"""llama.cpp's legacy cache files (spec 7) at native speed: decode, encode and a streaming merge.

Compiled by mypyc (``HOT_MODULES`` in ``setup.py``); it also runs unchanged as plain Python.
Everything works on ``bytes`` read through ``read_i32_le`` and on ``librt.vecs.vec`` arrays,
so no Python object is made per key or follower: reading a 70 MB file into tuples and dicts,
and sorting 4M keys as tuples to write one, took seconds and GBs.

This module knows the arrays of a fast ``NgramCache`` (see ``lookupdec.fast._cache``'s module
docstring) but not the class: ``_cache`` imports this module, so this one must not import it.

- :func:`decode` turns a file into those arrays (same checks and errors as the reference).
- :func:`encode` writes a cache's arrays in lookupdec's canonical order (keys ascending,
  followers ascending), in pieces, through a sink.
- :func:`merge_files` is ``lookupdec merge`` of legacy files: it writes the bytes that loading
  every file, merging them and saving would write, without building a cache (a k-way merge of
  the files' records in key order).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Sequence
from typing import Final

from librt.strings import BytesWriter, read_i32_le, write_i32_le
from librt.vecs import append, vec
from mypy_extensions import i32, i64

from lookupdec.errors import CacheFormatError, warn_saturated
from lookupdec.fast._tables import INT32_MAX, INT32_MIN, M32, NULL32, TWO32, filled_i32, pack

# Flipping bit 31 of a packed key word makes its signed i64 order the signed order of its two
# int32 halves, i.e. the order of the key slots as tuples (the low half is stored as raw bits).
LOW_SIGN: Final[i64] = 0x80000000
# Up to this many items an insertion sort beats the heapsort in sort_i64.
SMALL_SORT: Final[i64] = 24
# Up to this many keys a comparison sort is used: each radix pass clears 65536 counters.
SMALL_KEYS: Final[i64] = 4096
# Output is buffered natively and handed to the sink in pieces of about this size.
FLUSH_BYTES: Final[i64] = 1 << 22


def key_at(data: bytes, off: i64) -> tuple[i64, i64]:
    """The packed words of the 4-slot key stored at byte ``off``."""
    return (
        pack(read_i32_le(data, off), read_i32_le(data, off + 4)),
        pack(read_i32_le(data, off + 8), read_i32_le(data, off + 12)),
    )


# --- sorting --------------------------------------------------------------------------------


def key_order(k0: vec[i64], k1: vec[i64]) -> vec[i32]:
    """The permutation that sorts packed keys as their slot tuples sort, stable (equal keys keep order).

    A cache loaded from a lookupdec-written file holds its keys ascending, and a merge appends
    new keys after them (the merge-on-save of a shared file): when at least half the keys are
    an ascending prefix, only the rest is sorted (unless it is ascending too) and the two runs
    are merged.
    """
    n = i64(len(k0))
    m: i64 = 1 if n > 0 else 0
    while m < n and key_less(k0[m - 1], k1[m - 1], k0[m], k1[m]):
        m += 1
    if m == n:
        ident = vec[i32](capacity=n)
        for r in range(n):
            ident = append(ident, i32(r))
        return ident
    if 2 * m < n:
        return radix_order(k0, k1)
    # The rest is often ascending too: a sorted merge of a loaded file appends the other
    # loaded file's new keys in that file's (ascending) order. Then two runs merge as they are.
    j0 = m + 1
    while j0 < n and key_less(k0[j0 - 1], k1[j0 - 1], k0[j0], k1[j0]):
        j0 += 1
    if j0 == n:
        rest = vec[i32](capacity=n - m)
        for r in range(n - m):
            rest = append(rest, i32(r))
    else:
        rest = radix_order(k0[m:], k1[m:])
    out = vec[i32](capacity=n)
    i: i64 = 0
    j: i64 = 0
    nr = n - m
    while i < m or j < nr:
        if j >= nr:
            out = append(out, i32(i))
            i += 1
            continue
        t = m + i64(rest[j])
        if i < m and not key_less(k0[t], k1[t], k0[i], k1[i]):  # on a tie the earlier (prefix) key first
            out = append(out, i32(i))
            i += 1
        else:
            out = append(out, i32(t))
            j += 1
    return out


def key_less(a0: i64, a1: i64, b0: i64, b1: i64) -> bool:
    """Whether packed key (a0, a1) sorts before (b0, b1) as slot tuples."""
    x = a0 ^ LOW_SIGN
    y = b0 ^ LOW_SIGN
    return x < y or (x == y and (a1 ^ LOW_SIGN) < (b1 ^ LOW_SIGN))


def radix_order(k0: vec[i64], k1: vec[i64]) -> vec[i32]:
    """:func:`key_order` of keys in any order: an LSD radix sort on 16-bit digits, stable.

    No Python object per key; digits equal for every key (the padding of short n-grams, the
    high half of small token ids) cost one counting pass. Few keys go through a comparison sort.
    """
    n = i64(len(k0))
    if n <= SMALL_KEYS:
        order = [(k0[i] ^ LOW_SIGN, k1[i] ^ LOW_SIGN, i) for i in range(n)]
        order.sort()  # (w0, w1, position): stable by construction
        small = vec[i32](capacity=n)
        for item in order:
            small = append(small, i32(item[2]))
        return small
    perm = vec[i32](capacity=n)
    for r in range(n):
        perm = append(perm, i32(r))
    tmp = filled_i32(n, 0)
    counts = vec[i64](capacity=65536)
    for _d0 in range(65536):  # named, not ``_``: mypyc boxes ``_`` (see filled_i32)
        counts = append(counts, 0)
    # The digit arithmetic is written out in the loops, with i64 counters: a call to
    # radix_digit per key and pass (not inlined across the shared library) was half the time.
    p: i64 = 0
    while p < 8:
        words = k1 if p < 4 else k0
        hs = (16 * (p % 4)) & 32  # which int32 half
        ls = (16 * (p % 4)) & 16  # which 16 bits of it
        p += 1
        d: i64 = 0
        while d < 65536:
            counts[d] = 0
            d += 1
        i: i64 = 0
        while i < n:
            counts[((((words[i] >> hs) & M32) ^ LOW_SIGN) >> ls) & 0xFFFF] += 1
            i += 1
        if counts[radix_digit(words[0], hs | ls)] == n:
            continue  # every key has this digit: the pass would move nothing
        total: i64 = 0
        d = 0
        while d < 65536:
            c = counts[d]
            counts[d] = total
            total += c
            d += 1
        i = 0
        while i < n:
            j = perm[i]
            dj = ((((words[i64(j)] >> hs) & M32) ^ LOW_SIGN) >> ls) & 0xFFFF
            tmp[counts[dj]] = j
            counts[dj] += 1
            i += 1
        perm, tmp = tmp, perm
    return perm


def radix_digit(w: i64, shift: i64) -> i64:
    """16-bit digit at ``shift`` (0, 16, 32, 48) of ``w``, each int32 half biased to unsigned order."""
    half = ((w >> (shift & 32)) & M32) ^ LOW_SIGN
    return (half >> (shift & 16)) & 0xFFFF


def sort_i64(v: vec[i64], n: i64) -> None:
    """Sort ``v[:n]`` ascending in place (insertion sort when short, heapsort otherwise)."""
    if n <= SMALL_SORT:
        for i in range(1, n):
            x = v[i]
            j = i - 1
            while j >= 0 and v[j] > x:
                v[j + 1] = v[j]
                j -= 1
            v[j + 1] = x
        return
    for start in range(n // 2 - 1, -1, -1):
        sift_down(v, start, n)
    for end in range(n - 1, 0, -1):
        x = v[0]
        v[0] = v[end]
        v[end] = x
        sift_down(v, 0, end)


def sift_down(v: vec[i64], root: i64, n: i64) -> None:
    """Restore the max-heap property of ``v[:n]`` below ``root``."""
    while True:
        child = 2 * root + 1
        if child >= n:
            return
        if child + 1 < n and v[child + 1] > v[child]:
            child += 1
        if v[root] >= v[child]:
            return
        x = v[root]
        v[root] = v[child]
        v[child] = x
        root = child


def put_i64(v: vec[i64], m: i64, x: i64) -> vec[i64]:
    """``v`` with ``v[m] = x``, grown by one when ``m == len(v)`` (scratch vecs reused across keys)."""
    if m < len(v):
        v[m] = x
        return v
    return append(v, x)


def tok_node(tok: i32, node: i64) -> i64:
    """One sortable word: a follower token (signed, high half) and a position below 2^32 (low half)."""
    return i64(tok) * TWO32 + node


# --- reading --------------------------------------------------------------------------------


class Scan:
    """Where a legacy file's records start, and whether their keys are already strictly ascending."""

    offs: vec[i64]
    keys_sorted: bool
    end: i64
    """Offset of the bytes after the last record (the file size when nothing trails)."""

    def __init__(self, offs: vec[i64], keys_sorted: bool, end: i64) -> None:
        self.offs = offs
        self.keys_sorted = keys_sorted
        self.end = end


def scan(data: bytes, path: str | os.PathLike[str]) -> Scan:
    """Check every record as the reference's ``decode_legacy`` does (same errors, same offsets).

    Trailing bytes too few for a record are not checked here: see :func:`trailing`.
    """
    offs = vec[i64]()
    size = i64(len(data))
    off: i64 = 0
    keys_sorted = True
    p0: i64 = 0
    p1: i64 = 0
    while size - off >= 16:
        start = off
        w0, w1 = key_at(data, off)
        o0 = w0 ^ LOW_SIGN
        o1 = w1 ^ LOW_SIGN
        if len(offs) > 0 and not (o0 > p0 or (o0 == p0 and o1 > p1)):
            keys_sorted = False
        p0 = o0
        p1 = o1
        off += 16
        if size - off < 4:
            raise CacheFormatError(path, "record cut short: the follower count (ntokens) is missing", int(off))
        ntokens = i64(read_i32_le(data, off))
        if ntokens <= 0:
            raise CacheFormatError(path, f"record has ntokens = {ntokens}, must be > 0", int(off))
        off += 4
        if size - off < ntokens * 8:
            raise CacheFormatError(
                path,
                f"record cut short: ntokens = {ntokens} needs {ntokens * 8} bytes, {size - off} left",
                int(off),
            )
        for _j in range(ntokens):  # named, not ``_``: mypyc boxes ``_`` (see filled_i32)
            cnt = i64(read_i32_le(data, off + 4))
            if cnt <= 0:
                tok = read_i32_le(data, off)
                raise CacheFormatError(path, f"follower {tok} has count {cnt}, must be > 0", int(off + 4))
            off += 8
        offs = append(offs, start)
    return Scan(offs, keys_sorted, off)


def trailing(data: bytes, sc: Scan, path: str | os.PathLike[str], strict: bool, stacklevel: int) -> None:
    """The reference's rule for bytes after the last record: an error if ``strict``, else a warning."""
    size = i64(len(data))
    if sc.end == size:
        return
    message = f"{size - sc.end} trailing bytes, too few for a record"
    if strict:
        raise CacheFormatError(path, message, int(sc.end))
    warnings.warn(
        f"{os.fspath(path)}: {message} at byte offset {sc.end}; ignored as llama.cpp does", stacklevel=stacklevel
    )


def first_records(data: bytes, offs: vec[i64]) -> vec[i64]:
    """Record offsets in key order, only the first record of a repeated key (llama.cpp's emplace)."""
    n = i64(len(offs))
    k0 = vec[i64](capacity=n)
    k1 = vec[i64](capacity=n)
    for i in range(n):
        w0, w1 = key_at(data, offs[i])
        k0 = append(k0, w0)
        k1 = append(k1, w1)
    perm = key_order(k0, k1)  # stable: of equal keys the first record comes first
    out = vec[i64](capacity=n)
    for i in range(n):
        j = i64(perm[i])
        if i > 0:
            q = i64(perm[i - 1])
            if k0[j] == k0[q] and k1[j] == k1[q]:
                continue
        out = append(out, offs[j])
    return out


def kept_in_file_order(data: bytes, offs: vec[i64]) -> vec[i64]:
    """``offs`` without the later records of a repeated key, in file order."""
    firsts = first_records(data, offs)
    # Both lists are ascending by offset once the first records are put back in file order.
    kept = vec[i64](capacity=len(firsts))
    for i in range(len(firsts)):
        kept = append(kept, firsts[i])
    sort_i64(kept, i64(len(kept)))
    return kept


class Decoded:
    """A legacy file as the arrays of a fast ``NgramCache``, in file order (first occurrences).

    Each key's followers are consecutive nodes ``head[kid] .. tail[kid]``, linked in that order.
    Counts, sums and maxima are int32 slots; a value past 2^31-1 is in the side array ``wcnt``,
    ``wsum`` or ``wmax`` and its slot is ``-1 - index`` there (``_cache.get_count``).
    """

    k0: vec[i64]
    k1: vec[i64]
    head: vec[i32]
    tail: vec[i32]
    ksum: vec[i32]
    kmax: vec[i32]
    best: vec[i32]
    ntok: vec[i32]
    ncnt: vec[i32]
    nnext: vec[i32]
    nkey: vec[i32]
    wcnt: vec[i64]
    wsum: vec[i64]
    wmax: vec[i64]

    def __init__(
        self,
        keys: tuple[vec[i64], vec[i64], vec[i32], vec[i32], vec[i32], vec[i32], vec[i32]],
        nodes: tuple[vec[i32], vec[i32], vec[i32], vec[i32]],
        wide: tuple[vec[i64], vec[i64], vec[i64]],
    ) -> None:
        self.k0, self.k1, self.head, self.tail, self.ksum, self.kmax, self.best = keys
        self.ntok, self.ncnt, self.nnext, self.nkey = nodes
        self.wcnt, self.wsum, self.wmax = wide


def decode(data: bytes, path: str | os.PathLike[str], strict: bool, stacklevel: int) -> Decoded:
    """Decode a legacy file exactly as the reference's ``decode_legacy`` (same errors and warning).

    ``stacklevel`` is that of the trailing-bytes warning as if the caller issued it.
    The first record of a repeated key and the first count of a repeated follower win; keys
    and followers keep the order of their first occurrence.
    """
    sc = scan(data, path)
    trailing(data, sc, path, strict, stacklevel + 2)  # as if warned in decode's caller
    offs = sc.offs if sc.keys_sorted else kept_in_file_order(data, sc.offs)
    n = i64(len(offs))
    n_nodes: i64 = 0
    for r in range(n):
        n_nodes += i64(read_i32_le(data, offs[r] + 16))
    # Local vecs, appended in one pass: a method call and attribute reads per follower cost
    # more than the decoding itself.
    k0 = vec[i64](capacity=n)
    k1 = vec[i64](capacity=n)
    head = vec[i32](capacity=n)
    tail = vec[i32](capacity=n)
    ksum = vec[i32](capacity=n)
    kmax = vec[i32](capacity=n)
    wsum = vec[i64]()  # sums past int32 (a file's counts are int32, their sum may not be)
    best = vec[i32](capacity=n)
    ntok = vec[i32](capacity=n_nodes)
    ncnt = vec[i32](capacity=n_nodes)
    nnext = vec[i32](capacity=n_nodes)
    nkey = vec[i32](capacity=n_nodes)
    scratch = vec[i64]()
    drop = vec[i64]()
    kid: i64 = 0
    while kid < n:
        off = offs[kid]
        w0, w1 = key_at(data, off)
        k0 = append(k0, w0)
        k1 = append(k1, w1)
        nt = i64(read_i32_le(data, off + 16))
        base = off + 20
        ascending = True
        prev: i64 = INT32_MIN - 1
        j: i64 = 0
        while j < nt:
            tok = i64(read_i32_le(data, base + 8 * j))
            if tok <= prev:
                ascending = False
                break
            prev = tok
            j += 1
        if not ascending:
            # Repeated followers: sorted (token, position) words put each token's copies side
            # by side, the first position first; every later copy is dropped.
            for j2 in range(nt):
                scratch = put_i64(scratch, j2, tok_node(read_i32_le(data, base + 8 * j2), j2))
                drop = put_i64(drop, j2, 0)
            sort_i64(scratch, nt)
            for j2 in range(1, nt):
                if scratch[j2] >> 32 == scratch[j2 - 1] >> 32:
                    drop[scratch[j2] & M32] = 1
        first = i64(len(ntok))
        total: i64 = 0
        mx: i64 = 0
        bt: i32 = NULL32
        j = 0
        while j < nt:
            if ascending or drop[j] == 0:
                p = base + 8 * j
                t = read_i32_le(data, p)
                c32 = read_i32_le(data, p + 4)  # > 0: scan checked it
                c = i64(c32)
                ntok = append(ntok, t)
                ncnt = append(ncnt, c32)
                nnext = append(nnext, i32(len(ntok)))  # the next node; the last is fixed below
                nkey = append(nkey, i32(kid))
                total += c
                # The max count and its smallest holder, as _cache's _after_bump keeps them.
                if c > mx or (c == mx and t < bt):
                    mx = c
                    bt = t
            j += 1
        last = i64(len(ntok)) - 1
        nnext[last] = NULL32
        head = append(head, i32(first))
        tail = append(tail, i32(last))
        if total <= INT32_MAX:
            ksum = append(ksum, i32(total))
        else:  # stored as _cache.set_count stores it: -1 - its index in the side array
            ksum = append(ksum, i32(-1 - i64(len(wsum))))
            wsum = append(wsum, total)
        kmax = append(kmax, i32(mx))
        best = append(best, bt)
        kid += 1
    return Decoded((k0, k1, head, tail, ksum, kmax, best), (ntok, ncnt, nnext, nkey), (vec[i64](), wsum, vec[i64]()))


# --- writing --------------------------------------------------------------------------------


def encode(
    k0: vec[i64],
    k1: vec[i64],
    head: vec[i32],
    ntok: vec[i32],
    ncnt: vec[i32],
    nnext: vec[i32],
    sink: Callable[[bytes], object],
) -> i64:
    """Write a cache's arrays in the legacy format to ``sink`` (pieces of ~4 MB); the number of saturated counts.

    Keys ascending as slot tuples, each key's followers ascending by token (the reference's
    ``contents()`` order); counts above 2^31-1 are written as 2^31-1. ``ncnt`` holds a cache's
    int32 count slots: a negative slot is a count in the cache's side array, always past
    2^31-1 (see ``_cache.get_count``), so it saturates without being read.
    """
    order = key_order(k0, k1)
    scratch = vec[i64]()
    w = BytesWriter()
    n_sat: i64 = 0
    for i in range(len(order)):
        kid = i64(order[i])
        w0 = k0[kid]
        w1 = k1[kid]
        write_i32_le(w, i32(w0 >> 32))
        write_i32_le(w, i32(((w0 & M32) ^ LOW_SIGN) - LOW_SIGN))  # the low half back to a signed int32
        write_i32_le(w, i32(w1 >> 32))
        write_i32_le(w, i32(((w1 & M32) ^ LOW_SIGN) - LOW_SIGN))
        m: i64 = 0
        ascending = True
        prev: i64 = INT32_MIN - 1
        node = i64(head[kid])
        while node >= 0:
            tok = ntok[node]
            if i64(tok) <= prev:
                ascending = False
            prev = i64(tok)
            scratch = put_i64(scratch, m, tok_node(tok, node))
            m += 1
            node = i64(nnext[node])
        if not ascending:
            sort_i64(scratch, m)
        write_i32_le(w, i32(m))
        for j in range(m):
            c = ncnt[scratch[j] & M32]
            if c < 0:  # merged counts can pass what the format holds: saturate
                c = i32(INT32_MAX)
                n_sat += 1
            write_i32_le(w, i32(scratch[j] >> 32))
            write_i32_le(w, c)
        if len(w) >= FLUSH_BYTES:
            sink(w.getvalue())
            w = BytesWriter()
    if len(w) > 0:
        sink(w.getvalue())
    return n_sat


# --- the streaming merge --------------------------------------------------------------------


def merge_data(
    datas: list[bytes], paths: list[str], strict: bool, sink: Callable[[bytes], object]
) -> tuple[int, int, int]:
    """Merge legacy files: the bytes loading each, merging them into one cache and saving would write.

    Each file's records are checked (as the reference reads them) and, unless already in key
    order, put in key order with the later records of a repeated key dropped; then the files
    are merged key by key (k-way). A key in one file with followers ascending is copied; other
    keys' followers are gathered, sorted and summed. Output goes to ``sink`` in pieces of
    about 4 MB. Returns (keys, entries, saturated counts).
    """
    nf = i64(len(datas))
    all_offs = vec[i64]()
    lo = vec[i64]()
    hi = vec[i64]()
    for f in range(nf):
        data = datas[f]
        sc = scan(data, paths[f])
        trailing(data, sc, paths[f], strict, 4)  # the caller of merge_files
        offs = sc.offs if sc.keys_sorted else first_records(data, sc.offs)
        lo = append(lo, i64(len(all_offs)))
        for r in range(len(offs)):
            all_offs = append(all_offs, offs[r])
        hi = append(hi, i64(len(all_offs)))
    pos = vec[i64](capacity=nf)
    cur0 = vec[i64](capacity=nf)
    cur1 = vec[i64](capacity=nf)
    for f in range(nf):
        pos = append(pos, lo[f])
        cur0 = append(cur0, 0)
        cur1 = append(cur1, 0)
        if lo[f] < hi[f]:
            load_key(datas[f], all_offs[lo[f]], cur0, cur1, f)
    gkey = vec[i64]()
    gcnt = vec[i64]()
    gfile = vec[i64]()
    members = vec[i64]()
    w = BytesWriter()
    n_keys: i64 = 0
    n_entries: i64 = 0
    n_sat: i64 = 0
    while True:
        # The smallest current key and the files holding it.
        nm: i64 = 0
        b0: i64 = 0
        b1: i64 = 0
        for f in range(nf):
            if pos[f] >= hi[f]:
                continue
            c0 = cur0[f]
            c1 = cur1[f]
            if nm == 0 or c0 < b0 or (c0 == b0 and c1 < b1):
                nm = 0
                b0 = c0
                b1 = c1
            elif c0 != b0 or c1 != b1:
                continue
            members = put_i64(members, nm, f)
            nm += 1
        if nm == 0:
            break
        n_keys += 1
        f0 = members[0]
        data0 = datas[f0]
        off0 = all_offs[pos[f0]]
        for j in range(4):
            write_i32_le(w, read_i32_le(data0, off0 + 4 * j))
        copied = False
        if nm == 1:
            nt = i64(read_i32_le(data0, off0 + 16))
            ascending = True
            prev: i64 = INT32_MIN - 1
            for j in range(nt):
                tok = i64(read_i32_le(data0, off0 + 20 + 8 * j))
                if tok <= prev:
                    ascending = False
                    break
                prev = tok
            if ascending:
                # One file, followers ascending and unique, counts int32: copy the record.
                write_i32_le(w, i32(nt))
                for j in range(2 * nt):
                    write_i32_le(w, read_i32_le(data0, off0 + 20 + 4 * j))
                n_entries += nt
                copied = True
        if not copied:
            # Gather (token, position) words: sorted, they put each token's counts side by side
            # in gather order (file by file), so a file's first count of a repeated follower wins.
            m: i64 = 0
            for k in range(nm):
                f = members[k]
                data = datas[f]
                off = all_offs[pos[f]]
                nt = i64(read_i32_le(data, off + 16))
                for j in range(nt):
                    p = off + 20 + 8 * j
                    gkey = put_i64(gkey, m, tok_node(read_i32_le(data, p), m))
                    gcnt = put_i64(gcnt, m, i64(read_i32_le(data, p + 4)))
                    gfile = put_i64(gfile, m, f)
                    m += 1
            sort_i64(gkey, m)
            n_out: i64 = 1
            for i in range(1, m):
                if gkey[i] >> 32 != gkey[i - 1] >> 32:
                    n_out += 1
            write_i32_le(w, i32(n_out))
            n_entries += n_out
            i2: i64 = 0
            while i2 < m:
                tok2 = gkey[i2] >> 32
                first = gkey[i2] & M32
                total = gcnt[first]
                last_file = gfile[first]
                i2 += 1
                while i2 < m and gkey[i2] >> 32 == tok2:
                    g = gkey[i2] & M32
                    if gfile[g] != last_file:
                        total += gcnt[g]
                        last_file = gfile[g]
                    i2 += 1
                if total > INT32_MAX:  # saturate, as every save does
                    total = INT32_MAX
                    n_sat += 1
                write_i32_le(w, i32(tok2))
                write_i32_le(w, i32(total))
        for k in range(nm):
            f = members[k]
            pos[f] += 1
            if pos[f] < hi[f]:
                load_key(datas[f], all_offs[pos[f]], cur0, cur1, f)
        if len(w) >= FLUSH_BYTES:
            sink(w.getvalue())
            w = BytesWriter()
    if len(w) > 0:
        sink(w.getvalue())
    return int(n_keys), int(n_entries), int(n_sat)


def load_key(data: bytes, off: i64, cur0: vec[i64], cur1: vec[i64], f: i64) -> None:
    """Set file ``f``'s current key to the record at ``off``, as words that sort like the slot tuples."""
    w0, w1 = key_at(data, off)
    cur0[f] = w0 ^ LOW_SIGN
    cur1[f] = w1 ^ LOW_SIGN


def merge_files(
    paths: Sequence[str | os.PathLike[str]], output: str | os.PathLike[str], *, strict: bool = False
) -> tuple[int, int]:
    """``lookupdec merge`` of legacy files into a legacy file, streaming (no cache is built).

    Writes exactly the bytes of loading each file, merging them into one ``NgramCache`` and
    saving it (keys and followers ascending; counts past 2^31-1 saturate with one
    :class:`~lookupdec.errors.CountSaturationWarning` naming ``output``), atomically. Errors
    in an input name that input. Returns (keys, entries) of the output. Every input must be a
    legacy file.
    """
    from lookupdec._atomic import atomic_writer
    from lookupdec.formats.detect import read_all

    names = [os.fspath(p) for p in paths]
    datas = [read_all(p) for p in names]
    with atomic_writer(output, names) as f:
        n_keys, n_entries, n_sat = merge_data(datas, names, strict, f.write)
    # Compiled, this function has no Python frame: the caller is one level up.
    warn_saturated(output, n_sat, stacklevel=1)
    return n_keys, n_entries
