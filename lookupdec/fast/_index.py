"""The compiled static index: lookupdec's static index file (docs/static-index.md), read in place.

Opening costs O(1): the 96-byte header is checked and the file is memory-mapped (or, with
``in_memory=True``, read into one ``bytes``, in huge pages where they are available). Lookups
read the flat little-endian arrays with ``librt.strings.read_i32_le``/``read_i64_le``. On a
``bytes`` object mypyc compiles each to ``CPyBytes_ReadI32LE``/``ReadI64LE``, static inline C
helpers of its ``lib-rt`` that gcc inlines: a bounds check against the object's size, then one
4- or 8-byte load (a ``memcpy``), no Python objects; the caller then tests the error sentinel
(-113, with a ``PyErr_Occurred()`` call only when a value equals it). Both modes read one
``bytes`` (``_direct``): the mapping is exposed as a ``bytes`` whose data is the mapped file
(``lookupdec.fast._mapbytes``, CPython on Linux). Where that is not available an ``mmap`` is
used, which is not a ``bytes``: each lookup then slices the few bytes it needs (a slot, a key,
two starts, a pick, then the followers' tokens and counts) into small ``bytes`` objects and
reads those, through a memo of recent parts (slower drafting).

Every offset read from the file is checked before it is used, so a corrupt file raises
:class:`~lookupdec.errors.CacheFormatError` instead of reading out of bounds.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Final

from librt.strings import read_i32_le, read_i64_le
from librt.vecs import append, vec
from mypy_extensions import i32, i64

from lookupdec.errors import CacheFormatError
from lookupdec.fast._mapbytes import MappedBytes, map_bytes, read_whole

# Imported here, not in StaticIndex.open: on first use they would cost a process's first open
# many times a steady open (the header's dataclass is built then).
from lookupdec.formats.detect import format_of, open_regular_fd, refuse_corpus_file, refuse_empty_static
from lookupdec.formats.index_header import INDEX_HEADER_SIZE, index_header

if TYPE_CHECKING:
    from lookupdec.formats import ForkStatic
from lookupdec.fast import _index_write
from lookupdec.fast._cache import PAD_WORD, Key, NgramCache, key_words
from lookupdec.fast._source import ABSENT, STATIC_MIN_PERCENT, STATIC_MIN_SAMPLE, StaticSource
from lookupdec.fast._tables import (
    INT32_MAX,
    INT32_MIN,
    M32,
    NULL32,
    filled_i64,
    low32,
    pack,
    static_slot,
)

# The mmap-mode memo: 2**MEMO_BITS entries holding at most MEMO_BUDGET bytes of sliced parts
# (so its memory stays bounded whatever the file size; a part that does not fit is re-sliced).
MEMO_BITS: Final[i64] = 16
MEMO_BUDGET: Final[i64] = 32 << 20
# The direct-mode memo (file read as one bytes): 2**DMEMO_BITS entries of 4 words, 1 MiB. A hit
# costs one cache line instead of the random lines of the file (slot, then key, start, pick and
# checked bit) that _lookup reads, most often cache and TLB misses too. Bigger memos hit more
# often but fall out of the CPU caches themselves: 2**15 drafted fastest at every index size
# tried (docs/performance-log.md).
DMEMO_BITS: Final[i64] = 15
# The memo starts at 2**DMEMO_START_BITS entries (32 KiB) and takes its full size, keeping what
# it holds, after DMEMO_GROW_AT misses (a quarter full: few collisions yet): zeroing the full
# 1 MiB on the first lookup was most of the first draft after an open (page faults on fresh
# memory; docs/performance-log.md).
DMEMO_START_BITS: Final[i64] = 10
DMEMO_GROW_AT: Final[i64] = 1 << (DMEMO_START_BITS - 2)
# The bitmap of checked parts (a bit per key, 32 per i64 word) is allocated in pages of
# 2**CHECK_PAGE_BITS keys (1,024 words, 8 KiB), each on the first lookup in it: one bitmap of
# n_keys / 4 bytes, zeroed on the first lookup, made the first draft after opening cost time in
# proportion to the index (page faults on the fresh memory).
CHECK_PAGE_BITS: Final[i64] = 15
CHECK_PAGE_MASK: Final[i64] = (1 << (CHECK_PAGE_BITS - 5)) - 1
SEARCH_AHEAD_MIN: Final[i64] = 32
"""Followers' binary search reads the next round's two probes ahead while more than this many are left."""


class StaticIndex(StaticSource):
    """A read-only static cache in lookupdec's static index format (docs/static-index.md).

    Open a file with :meth:`open` (memory-mapped, O(1)) or build one in memory with
    :meth:`from_cache` / :meth:`from_contents`. Usable wherever a static cache is: as
    ``nc_static`` of ``draft`` and ``replay``, and through :meth:`part` like a cache.
    """

    path: str
    in_memory: bool
    n_keys: i64
    n_entries: i64
    n_slots: i64
    vocab_size: int
    vocab_fingerprint: bytes
    total_count: int
    _file_size: i64
    _checksum: bytes
    _bits: i64
    _buf: bytes
    _mm: mmap.mmap | None
    _view: MappedBytes | None
    _direct: bool
    _o_slots: i64
    _o_keys: i64
    _o_starts: i64
    _o_picks: i64
    _o_tokens: i64
    _o_counts: i64
    _bt: bytes
    _bc: bytes
    _ct: i64
    _cc: i64
    _cn: i64
    _cpick: i32
    _memo_ok: list[bool]
    _memo_key: vec[i64]
    _memo_n: vec[i64]
    _memo_pick: vec[i32]
    _memo_bt: list[bytes]
    _memo_bc: list[bytes]
    _memo_bytes: i64
    _checked: list[vec[i64]]
    _dmemo: vec[i64]
    _dbits: i64
    _closed: bool
    _dmiss: i64
    _ls: i64
    _le: i64
    _lp: i32
    _lbits: i64
    _touched: i32

    def __init__(
        self,
        path: str,
        header: bytes,
        real_size: int,
        buf: bytes,
        mm: mmap.mmap | None,
        view: MappedBytes | None = None,
        copied: bool = False,
    ) -> None:
        """Use :meth:`open`, :meth:`from_cache` or :meth:`from_contents` instead."""
        self.path = path
        # ``view`` holds ``buf``'s memory: the file's mapping, or its copy when ``copied``
        self.in_memory = copied or (mm is None and view is None)
        # True when ``buf`` holds the whole file (copied, or the mapping seen as bytes).
        self._direct = mm is None
        self._closed = False
        self._buf = buf
        self._mm = mm
        self._view = view
        self._bt = buf
        self._bc = buf
        self._ct = 0
        self._cc = 0
        self._cn = 0
        self._cpick = NULL32
        # The mmap memo is allocated on first use, so that opening stays O(1).
        self._memo_ok = []
        self._memo_bytes = 0
        self._memo_key = vec[i64]()
        self._memo_n = vec[i64]()
        self._memo_pick = vec[i32]()
        self._memo_bt = []
        self._memo_bc = []
        self._parse_header(header, real_size)

    def _parse_header(self, header: bytes, real_size: int) -> None:
        # The same constant-time checks as the reference's reader: one function for both
        # (stdlib only, so importing it costs nothing), so that they open the same files.
        path = self.path
        h = index_header(path, header, real_size)
        n_keys: i64 = h.n_keys
        n_entries: i64 = h.n_entries
        n_slots: i64 = h.n_slots
        self.n_keys = n_keys
        self.n_entries = n_entries
        self.n_slots = n_slots
        self._bits = h.n_slots.bit_length() - 1
        # u64 header fields that nothing bounds: Python ints (an i64 attribute would
        # overflow on a value >= 2**63, which the format allows and verify() accepts).
        self.vocab_size = h.vocab_size
        self.vocab_fingerprint = bytes(h.vocab_fingerprint)
        self.total_count = h.total_count
        self._file_size = h.file_size
        self._checksum = bytes(h.checksum)
        self._o_slots = h.slots_offset
        self._o_keys = h.keys_offset
        self._o_starts = h.starts_offset
        self._o_picks = h.picks_offset
        self._o_tokens = h.tokens_offset
        self._o_counts = h.counts_offset
        # One empty page per 2**CHECK_PAGE_BITS keys (an empty vec reads as all unchecked).
        self._checked = [vec[i64]()] * ((n_keys >> CHECK_PAGE_BITS) + 1)
        self._dmemo = vec[i64]()  # allocated on the first lookup (_first_lookup): opening stays O(1)
        self._dbits = DMEMO_START_BITS
        self._dmiss = 0
        self._ls = 0
        self._le = 0
        self._lp = NULL32
        self._lbits = 0
        self._touched = 0

    @classmethod
    def open(cls, path: str | os.PathLike[str], *, in_memory: bool = False) -> StaticIndex:
        """Open a static index file: memory-mapped (default) or read into memory (``in_memory``)."""
        p = os.fspath(path)
        fd, size = open_regular_fd(p)
        try:
            return open_index_file(fd, p, size, os.pread(fd, INDEX_HEADER_SIZE, 0), in_memory)
        finally:
            os.close(fd)

    @classmethod
    def from_bytes(cls, data: bytes, path: str = "<memory>") -> StaticIndex:
        """A static index over the bytes of an index file (``path`` names it in errors)."""
        return StaticIndex(path, data[:INDEX_HEADER_SIZE], len(data), data, None)

    @classmethod
    def from_cache(cls, cache: NgramCache) -> StaticIndex:
        """Build an index in memory from a static cache (2-gram keys only)."""
        return StaticIndex.from_bytes(_index_write.index_bytes_from_cache(cache))

    @classmethod
    def from_contents(cls, contents: Iterable[tuple[Sequence[int], Iterable[tuple[int, int]]]]) -> StaticIndex:
        """Build an index in memory from (key, [(token, count), ...]) pairs of 2-gram keys."""
        return StaticIndex.from_bytes(_index_write.index_bytes_from_contents(contents))

    # --- raw reads ---------------------------------------------------------------------

    def _slice(self, off: i64, n: i64) -> bytes:
        mm = self._mm
        if mm is None:
            raise ValueError(f"{self.path}: static index is closed")
        return mm[off : off + n]

    def _rd32(self, off: i64) -> i32:
        """The i32 at byte ``off`` (inside the file: callers check the index)."""
        if self._direct:
            return read_i32_le(self._buf, off)
        return read_i32_le(self._slice(off, 4), 0)

    def _rd64(self, off: i64) -> i64:
        """The i64 at byte ``off``."""
        if self._direct:
            return read_i64_le(self._buf, off)
        return read_i64_le(self._slice(off, 8), 0)

    def _corrupt(self, message: str, off: i64) -> CacheFormatError:
        """The error for a corrupt file found while reading at ``off``."""
        return CacheFormatError(self.path, message + " (run verify() for a full check)", int(off))

    def _slot_error(self, h: i64, o: i64, off: i64) -> CacheFormatError:
        """The error for slot ``h`` (at ``off``) holding ``o``, neither -1 nor a key ordinal."""
        if o < 0:
            return self._corrupt(f"slot {h} holds {o}", off)
        return self._corrupt(f"slot {h} holds ordinal {o}, there are {self.n_keys} keys", off)

    def _span_error(self, o: i64, s: i64, e: i64, off: i64) -> CacheFormatError:
        """The error for key ordinal ``o`` whose starts (at ``off``) give entries ``s..e-1``, out of range."""
        return self._corrupt(f"key {o} has followers {s}..{e - 1}, outside 0..{self.n_entries - 1}", off)

    def _find(self, a: i32, b: i32) -> i64:
        """Ordinal of the 2-gram (a, b), -1 if absent.

        In direct mode, once a slot gives an ordinal, its key, start, end, pick and checked
        bits are five independent loads from five places of the file and the bitmap (most
        often five cache and TLB misses in a big index): read back to back before the key is
        compared, the CPU waits for them at once instead of one after another. The values
        of the ordinal returned are left, unchecked, in ``_ls``, ``_le``, ``_lp`` and
        ``_lbits`` for :meth:`_lookup`.
        """
        n_keys = self.n_keys
        if n_keys == 0:
            return -1
        k = pack(a, b)
        mask = self.n_slots - 1
        h = static_slot(a, b, self._bits)
        o_slots = self._o_slots
        o_keys = self._o_keys
        o_starts = self._o_starts
        o_picks = self._o_picks
        mem = self._direct
        buf = self._buf
        checked = self._checked
        # At most n_slots probes: a corrupt table with no empty slot cannot loop forever.
        for _i in range(self.n_slots):  # ``_i``, not ``_``: see _tables.filled_i32
            off = o_slots + 4 * h
            o = i64(read_i32_le(buf, off) if mem else self._rd32(off))
            if o < 0:
                if o != -1:
                    raise self._slot_error(h, o, off)
                return -1
            if o >= n_keys:
                raise self._slot_error(h, o, off)
            koff = o_keys + 8 * o
            if mem:
                key = read_i64_le(buf, koff)
                self._ls = read_i64_le(buf, o_starts + 8 * o)
                self._le = read_i64_le(buf, o_starts + 8 * o + 8)
                self._lp = read_i32_le(buf, o_picks + 4 * o)
                page = checked[o >> CHECK_PAGE_BITS]
                self._lbits = page[(o >> 5) & CHECK_PAGE_MASK] if len(page) > 0 else 0
            else:
                key = self._rd64(koff)
            if key == k:
                return o
            h = (h + 1) & mask
        raise self._corrupt("slot table has no empty slot", o_slots)

    def _span(self, o: i64) -> tuple[i64, i64]:
        """(start, end) entry indices of key ordinal ``o``, checked."""
        off = self._o_starts + 8 * o
        if self._direct:
            s = read_i64_le(self._buf, off)
            e = read_i64_le(self._buf, off + 8)
        else:
            both = self._slice(off, 16)
            s = read_i64_le(both, 0)
            e = read_i64_le(both, 8)
        if s < 0 or s >= e or e > self.n_entries:
            raise self._span_error(o, s, e, off)
        if not self._is_checked(o):
            self._check_part(o, s, e)
        return s, e

    def _is_checked(self, o: i64) -> bool:
        """Whether the part of key ordinal ``o`` passed :meth:`_check_part` already (a bit per key)."""
        # 32 bits per i64 word, not 64: interpreted (the pure-Python wheel, LOOKUPDEC_NO_MYPYC)
        # ``i64(1) << 63`` is the Python int 2**63, which a vec[i64] refuses (OverflowError);
        # compiled it would wrap to the sign bit. Same shifts and masks either way.
        page = self._checked[o >> CHECK_PAGE_BITS]
        return len(page) > 0 and (page[(o >> 5) & CHECK_PAGE_MASK] >> (o & 31)) & 1 != 0

    def _check_part(self, o: i64, s: i64, e: i64) -> None:
        """The per-lookup checks of ``lookupdec.formats.index_header.check_part``, compiled.

        Run once per key (then remembered): followers strictly ascending, counts >= 1, the
        stored pick equal to spec 3.2 of the part. Costs one pass over a part the first time
        it is looked up, so a corrupt part is an error, the same one the reference raises.
        One tight loop over bytes (no vec, no per-entry slice): it runs over every part a
        replay touches.
        """
        if self._direct:
            bt = self._buf
            bc = self._buf
            ot = self._o_tokens + 4 * s
            oc = self._o_counts + 4 * s
        else:
            bt = self._slice(self._o_tokens + 4 * s, 4 * (e - s))
            bc = self._slice(self._o_counts + 4 * s, 4 * (e - s))
            ot = 0
            oc = 0
        where = self._o_tokens + 4 * s
        best = NULL32
        mx: i64 = 0
        total: i64 = 0
        prev = NULL32
        for j in range(e - s):
            t = read_i32_le(bt, ot + 4 * j)
            c = i64(read_i32_le(bc, oc + 4 * j))
            if c < 1:
                raise self._corrupt(f"key {o}: follower {t} has count {c}, must be >= 1", where)
            if j > 0 and t <= prev:
                raise self._corrupt(f"key {o}: followers not strictly ascending", where)
            prev = t
            if c > mx:  # tokens ascend, so the first maximum is the smallest id (spec 3.2's tie rule)
                best = t
                mx = c
            total += c
        want = best if total >= STATIC_MIN_SAMPLE and 100 * mx >= STATIC_MIN_PERCENT * total else NULL32
        pick = self._rd32(self._o_picks + 4 * o)
        if pick != want:
            raise self._corrupt(f"key {o}: stored pick {pick}, spec 3.2 gives {want}", where)
        p = o >> CHECK_PAGE_BITS
        page = self._checked[p]
        if len(page) == 0:  # the page's first checked key: allocated now (see CHECK_PAGE_BITS)
            page = filled_i64(CHECK_PAGE_MASK + 1, 0)
        w = (o >> 5) & CHECK_PAGE_MASK
        page[w] = page[w] | (i64(1) << (o & 31))  # 32 bits a word: see _is_checked
        self._checked[p] = page  # vecs are values: store the page back

    # --- the static-source interface -------------------------------------------------

    def _st_begin(self, a: i32, b: i32) -> bool:
        """Select the part of the 2-gram (a, b); True when it has followers."""
        if not self._direct:
            return self._st_begin_mmap(a, b)
        # The memo: entry j holds (key, tag, start, n), tag 0 for an empty entry, 1 for an
        # absent key, else 2 + the pick's 32 bits. An entry is written only after the key's
        # part passed _check_part, so a hit needs no check and reads nothing from the file.
        dm = self._dmemo
        if len(dm) == 0:
            dm = self._first_lookup()
        k = pack(a, b)
        j = static_slot(a, b, self._dbits) << 2
        v = dm[j + 1]
        if v != 0 and dm[j] == k:
            if v == 1:
                self._cn = 0
                return False
            self._cpick = low32(v - 2)
            self._set_part(dm[j + 2], dm[j + 3])
            return True
        o = self._lookup(a, b)
        self._dmiss += 1
        if self._dmiss == DMEMO_GROW_AT:
            dm = self._grow_memo()
            j = static_slot(a, b, DMEMO_BITS) << 2
        if o < 0:
            dm[j] = k
            dm[j + 1] = 1
            self._cn = 0
            return False
        s = self._ls
        n = self._le - s
        pick = self._lp
        dm[j] = k  # only now: a part that failed its check raised in _lookup and is not remembered
        dm[j + 1] = (i64(pick) & M32) + 2
        dm[j + 2] = s
        dm[j + 3] = n
        self._cpick = pick
        self._set_part(s, n)
        return True

    def _first_lookup(self) -> vec[i64]:
        """The work left from opening to the first lookup, so that opening costs O(1) and little:
        the memo, at its start size, and the thread that maps the file's pages in
        (:meth:`MappedBytes.prefetch`: starting a thread cost more than the rest of an open)."""
        view = self._view
        if view is not None and not self.in_memory:
            view.prefetch()
        dm = filled_i64(i64(4) << DMEMO_START_BITS, 0)
        self._dmemo = dm
        return dm

    def _grow_memo(self) -> vec[i64]:
        """The memo at its full size, holding the entries of the small one (see DMEMO_START_BITS)."""
        old = self._dmemo
        dm = filled_i64(i64(4) << DMEMO_BITS, 0)
        for i in range(i64(len(old)) >> 2):
            j = 4 * i
            if old[j + 1] != 0:
                k = old[j]
                n = static_slot(i32(k >> 32), low32(k), DMEMO_BITS) << 2
                dm[n] = k
                dm[n + 1] = old[j + 1]
                dm[n + 2] = old[j + 2]
                dm[n + 3] = old[j + 3]
        self._dmemo = dm
        self._dbits = DMEMO_BITS
        return dm

    def _lookup(self, a: i32, b: i32) -> i64:
        """:meth:`_find` then the checks of :meth:`_span` in direct mode, from the values _find read.

        Sets ``_ls``, ``_le`` (the checked span) and ``_lp`` (the stored pick) when found.
        """
        o = self._find(a, b)
        if o < 0:
            return -1
        s = self._ls
        e = self._le
        if s < 0 or s >= e or e > self.n_entries:
            raise self._span_error(o, s, e, self._o_starts + 8 * o)
        if (self._lbits >> (o & 31)) & 1 == 0:
            self._check_part(o, s, e)
        return o

    def _set_part(self, s: i64, n: i64) -> None:
        """Select the ``n`` entries from ``s`` as the current part (direct mode)."""
        self._cn = n
        self._ct = self._o_tokens + 4 * s
        self._cc = self._o_counts + 4 * s

    def _alloc_memo(self) -> None:
        """Allocate the mmap-mode memo (empty entries)."""
        memo: i64 = 1 << MEMO_BITS
        self._memo_ok = [False] * memo
        self._memo_bt = [b""] * memo
        self._memo_bc = [b""] * memo
        key = vec[i64](capacity=memo)
        n = vec[i64](capacity=memo)
        pick = vec[i32](capacity=memo)
        for _i in range(memo):  # ``_i``, not ``_``: see _tables.filled_i32
            key = append(key, 0)
            n = append(n, 0)
            pick = append(pick, NULL32)
        self._memo_key = key
        self._memo_n = n
        self._memo_pick = pick

    def _st_begin_mmap(self, a: i32, b: i32) -> bool:
        """st_begin in mmap mode, through a direct-mapped memo of recent 2-grams.

        Every mmap read is a slice (an allocation), about 6 per lookup; drafting asks for
        the same common 2-grams again and again, so remembering the sliced parts pays.
        """
        if len(self._memo_ok) == 0:
            self._alloc_memo()
        k = pack(a, b)
        m = static_slot(a, b, MEMO_BITS)
        if self._memo_ok[m] and self._memo_key[m] == k:
            self._cn = self._memo_n[m]
            self._cpick = self._memo_pick[m]
            self._bt = self._memo_bt[m]
            self._bc = self._memo_bc[m]
            return self._cn > 0
        o = self._find(a, b)
        if o < 0:
            n: i64 = 0
            pick = NULL32
            bt = b""
            bc = b""
        else:
            s, e = self._span(o)
            n = e - s
            pick = self._rd32(self._o_picks + 4 * o)
            bt = self._slice(self._o_tokens + 4 * s, 4 * n)
            bc = self._slice(self._o_counts + 4 * s, 4 * n)
        self._cn = n
        self._cpick = pick
        self._bt = bt
        self._bc = bc
        self._ct = 0
        self._cc = 0
        # An if statement: the conditional expression (i64 | literal) was boxed (see _cache's _find).
        old: i64 = 0
        if self._memo_ok[m]:
            old = i64(len(self._memo_bt[m]) + len(self._memo_bc[m]))
        if self._memo_bytes - old + 8 * n <= MEMO_BUDGET:
            self._memo_bytes += 8 * n - old
            self._memo_ok[m] = True
            self._memo_key[m] = k
            self._memo_n[m] = n
            self._memo_pick[m] = pick
            self._memo_bt[m] = bt
            self._memo_bc[m] = bc
        return n > 0

    def _st_count(self, tok: i32) -> i64:
        """Count of ``tok`` in the selected part (binary search), ABSENT if not there."""
        n = self._cn
        if n == 0:
            return ABSENT
        bt = self._bt
        ct = self._ct
        lo: i64 = 0
        # Halve a fixed number of times for a given length, choosing ``lo`` with a select
        # instead of leaving the loop on a match. mypyc writes the select as an if/else on
        # native ints; gcc -O3 turns it into a cmovge here (build/__native_lookupdec.c and the
        # .so's disassembly), but that is the C compiler's choice. The loop still branches on
        # read_i32_le's bounds check and error sentinel (both predictable: never taken).
        # While the range spans several cache lines (16 tokens each), each probe is a miss
        # the next one waits for (the select makes them dependent): the two tokens the next
        # round may probe are read first, in no branch or select, so their misses overlap
        # this round's and the next probe finds its line in the cache. The reads are kept
        # alive in ``_touched`` (else the C compiler drops them).
        touched: i32 = 0
        while n > SEARCH_AHEAD_MIN:
            half = n >> 1
            h2 = (n - half) >> 1
            touched ^= read_i32_le(bt, ct + 4 * (lo + h2)) ^ read_i32_le(bt, ct + 4 * (lo + half + h2))
            lo = lo + half if read_i32_le(bt, ct + 4 * (lo + half)) <= tok else lo
            n -= half
        # The range left spans at most 3 lines of tokens and 3 of counts (in another array): the
        # ends of both are read at once, so the last rounds and the count find them in flight.
        cc = self._cc
        bc = self._bc
        touched ^= read_i32_le(bt, ct + 4 * lo) ^ read_i32_le(bt, ct + 4 * (lo + n - 1))
        touched ^= read_i32_le(bc, cc + 4 * lo) ^ read_i32_le(bc, cc + 4 * (lo + n - 1))
        self._touched = touched
        while n > 1:
            half = n >> 1
            lo = lo + half if read_i32_le(bt, ct + 4 * (lo + half)) <= tok else lo
            n -= half
        if read_i32_le(bt, ct + 4 * lo) == tok:
            return i64(read_i32_le(bc, cc + 4 * lo))
        return ABSENT

    def _st_pick(self) -> i32:
        """The precomputed static-only draft of the selected part."""
        if self._cn == 0:
            return NULL32
        return self._cpick

    # --- reading like a cache ----------------------------------------------------------

    def _followers(self, o: i64) -> list[tuple[int, int]]:
        """(token, count) pairs of key ordinal ``o``, ascending by token."""
        s, e = self._span(o)
        out: list[tuple[int, int]] = []
        for j in range(s, e):
            out.append((int(self._rd32(self._o_tokens + 4 * j)), int(self._rd32(self._o_counts + 4 * j))))
        return out

    def _key_of(self, o: i64) -> Key:
        """The 4-slot key of ordinal ``o``."""
        w = self._rd64(self._o_keys + 8 * o)
        return (int(w >> 32), int(low32(w)), -1, -1)

    def _ordinal(self, key: Sequence[object]) -> i64:
        """Ordinal of a 4-slot key (a padded 2-gram), -1 if absent."""
        ok, w0, w1 = key_words(key)
        if not ok or w1 != PAD_WORD:
            return -1
        return self._find(i32(w0 >> 32), low32(w0))

    def part(self, key: Key) -> dict[int, int] | None:
        """The followers of a padded key as a new dict, or None (the reference's ``part``)."""
        o = self._ordinal(key)
        return dict(self._followers(o)) if o >= 0 else None

    def get(self, key: Sequence[int]) -> dict[int, int]:
        """The followers of a 2-gram (2 tokens or a padded key) as a new dict; empty if absent."""
        k = list(key)
        if len(k) == 2:
            k += [-1, -1]
        o = self._ordinal(k)
        return dict(self._followers(o)) if o >= 0 else {}

    def pick(self, a: int, b: int) -> int:
        """The static-only draft after the 2-gram (a, b) (spec 3.2), -1 if none. O(1)."""
        if not (INT32_MIN <= a <= INT32_MAX and INT32_MIN <= b <= INT32_MAX):
            return -1
        o = self._find(i32(a), i32(b))
        if o < 0:
            return -1
        self._span(o)  # the per-lookup checks, as for a draft
        return int(self._rd32(self._o_picks + 4 * o))

    def keys(self) -> Iterator[Key]:
        """Every key, ascending."""
        return iter([self._key_of(o) for o in range(self.n_keys)])

    def items(self) -> Iterator[tuple[Key, dict[int, int]]]:
        """(key, part) pairs, keys ascending."""
        return iter([(self._key_of(o), dict(self._followers(o))) for o in range(self.n_keys)])

    def contents(self) -> list[tuple[Key, list[tuple[int, int]]]]:
        """The canonical form: keys ascending, each with its (token, count) pairs ascending."""
        return [(self._key_of(o), self._followers(o)) for o in range(self.n_keys)]

    def to_cache(self) -> NgramCache:
        """An ordinary (mutable) NgramCache with the same contents."""
        return NgramCache.from_contents(self.contents())

    def to_bytes(self) -> bytes:
        """The whole index file as bytes."""
        if self._closed:  # its bytes are gone: never an empty file saved over a good one
            raise ValueError(f"{self.path}: static index is closed")
        if self.in_memory:
            return self._buf
        if self._direct:
            return memoryview(self._buf).tobytes()  # a copy: the mapping goes away on close()
        return self._slice(0, self._file_size)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the index file to ``path`` (atomically)."""
        from lookupdec._atomic import atomic_writer

        data = self.to_bytes()  # first: a closed index raises before the target is touched
        with atomic_writer(path) as f:
            f.write(data)

    def __len__(self) -> int:
        """Number of keys."""
        return int(self.n_keys)

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, tuple):
            return False
        return self._ordinal(key) >= 0

    def __repr__(self) -> str:
        mode = "in-memory" if self.in_memory else "mmap"
        return f"<fast.StaticIndex {self.path!r} {mode} keys={self.n_keys} entries={self.n_entries}>"

    def verify(self) -> None:
        """The full check of docs/static-index.md (checksum, every rule); CacheFormatError if broken.

        The one verifier of the format, ``lookupdec.formats.index.verify_index`` (numpy), so
        that both implementations and ``lookupdec inspect --verify`` accept the same files.
        """
        from lookupdec.formats.index import verify_index

        if self._closed:
            raise ValueError(f"{self.path}: static index is closed")
        data = self._buf if self._direct else self.to_bytes()  # the mapping itself: no copy
        verify_index(self.path, data, index_header(self.path, data, len(data)))

    def close(self) -> None:
        """Release the memory map (in-memory indexes just drop their buffer); using it then raises ValueError."""
        self._closed = True
        mm = self._mm
        self._mm = None
        self._bt = b""
        self._bc = b""
        self._cn = 0
        self._memo_ok = []
        self._memo_bt = []
        self._memo_bc = []
        self._memo_bytes = 0
        self._dmemo = vec[i64]()
        if mm is not None:
            mm.close()
        if self._direct:  # in memory or the mapping seen as bytes
            # Closed like an mmap: reads go to _slice, which raises "static index is closed"
            # (an in-memory index that only dropped its bytes drafted as an empty one, or failed
            # with an IndexError once its lookup memo had grown).
            self._buf = b""
            self._direct = False
        view = self._view
        self._view = None
        if view is not None:
            view.close()  # unmaps once nothing references the mapping's bytes (_mapbytes)

    def __enter__(self) -> StaticIndex:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_index_file(fd: int, p: str, size: int, header: bytes, in_memory: bool) -> StaticIndex:
    """:meth:`StaticIndex.open` of the index file open as ``fd`` (``size`` bytes, its first
    bytes ``header``): the file is opened once by whoever detected its format."""
    if in_memory:
        data, copy = read_whole(fd, size, p)
        try:
            return StaticIndex(p, header, size, data, None, copy, copied=True)
        except BaseException:
            if copy is not None:
                data = b""  # the copy's last reference but the view's: close() unmaps it
                copy.close()
            raise
    if len(header) < INDEX_HEADER_SIZE:
        return StaticIndex(p, header, size, b"", None)  # raises: too short
    view = map_bytes(fd, size)
    if view is not None:
        try:
            ix = StaticIndex(p, header, size, view.data, None, view)
        except BaseException:
            view.close()
            raise
        return ix  # the first lookup starts the prefetch (_first_lookup)
    mm = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
    try:
        return StaticIndex(p, header, size, b"", mm)
    except BaseException:
        mm.close()
        raise


def load_static(
    path: str | os.PathLike[str], *, in_memory: bool = False, strict: bool = False, verify: bool = False
) -> StaticIndex | NgramCache | ForkStatic:
    """Open a static cache file of any supported format for use as ``nc_static``.

    A lookupdec index is opened in O(1) as a :class:`StaticIndex` (memory-mapped, or read
    into memory with ``in_memory=True``); a legacy llama.cpp file or a fork v1/v2 file is
    decoded and indexed in memory (``in_memory`` is then irrelevant). A legacy file that
    also holds 3- or 4-gram keys (a dynamic cache passed as static) cannot be an index; it
    is returned as the :class:`NgramCache` it decodes to, which drafts identically.
    ``strict`` applies to legacy files (see ``NgramCache.load``). A fork v1 file has no
    key table, so it stays a ``lookupdec.formats.ForkStatic`` (looked up via its constmap,
    through Python calls), as in the reference. ``verify`` runs the full check of a
    lookupdec index (:meth:`StaticIndex.verify`) and reads a legacy file strictly; the other
    formats are checked in full anyway when decoded. A 0-byte file is an error (a static
    cache is never empty: most likely a failed write).
    """
    # ForkStatic and read_as_contents only where used: their modules import numpy (megabytes of
    # a replay's peak RSS), which opening a lookupdec index or a legacy file does without.

    # One open for the format, the size and the header: a lookupdec index is opened on it.
    p = os.fspath(path)
    fd, size = open_regular_fd(p)
    try:
        if size == 0:
            refuse_empty_static(p)
        header = os.pread(fd, INDEX_HEADER_SIZE, 0)
        refuse_corpus_file(p, header)
        fmt = format_of(header)
        if fmt == "lookupdec":
            ix = open_index_file(fd, p, size, header, in_memory)
            if verify:
                ix.verify()
            return ix
    finally:
        os.close(fd)
    if fmt == "fork-v1":
        from lookupdec.formats import ForkStatic

        return ForkStatic(path)
    if fmt == "llama":
        cache = NgramCache.load(path, strict=strict or verify)
        for kid in range(cache._n_keys_native()):
            if cache._k1[kid] != PAD_WORD:
                return cache
        return StaticIndex.from_cache(cache)
    from lookupdec.formats import read_as_contents

    return StaticIndex.from_contents(read_as_contents(path))
