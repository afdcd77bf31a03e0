"""The hybrid policy's corpus, compiled: a corpus file (docs/formats.md) read in place.

Compiled by mypyc with :mod:`lookupdec.fast._hybrid` (see ``setup.py``). A
:class:`CorpusIndex` is the corpus part of a ``SuffixHistory``: the corpus's token ids, its
indexed positions grouped by bigram (a contiguous run per bigram, newest first, each entry
holding the position and the token before its bigram, so that most comparisons never leave
the run), an open-addressing slot table over the bigrams, per token its occurrences
(newest first, a run per token), and each bigram's run again in trigram order (by the token
before, then newest first: a trigram's occurrences are a range found by binary search).
:meth:`CorpusIndex.open` maps a file in O(1) (the mapping seen as one ``bytes``,
:mod:`lookupdec.fast._mapbytes`, which compiled code reads natively with
``librt.strings.read_i32_le``); :meth:`CorpusIndex.from_tokens` builds the same bytes in
memory (what ``add_corpus(ids)`` uses), :meth:`CorpusIndex.save` writes them.

Every offset and position read from the file is checked before it is used, so a corrupt
file raises :class:`~lookupdec.errors.CacheFormatError` naming it, never reads out of bounds.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Final

from librt.strings import BytesWriter, read_i32_le, read_i64_le, write_i32_le, write_i64_le
from librt.vecs import append, vec
from mypy_extensions import i32, i64

from lookupdec.errors import CacheFormatError
from lookupdec.fast._cache import to_vec
from lookupdec.fast._mapbytes import MappedBytes, huge_copy, map_bytes, read_whole
from lookupdec.fast._tables import NULL32, filled_i32, low32, pack, static_slot, word_probe, word_slots

# Imported here, not where used: on first use they would cost a process's first open.
from lookupdec.formats.corpus import CORPUS_HEADER, READABLE_VERSIONS, corpus_header, min_slots
from lookupdec.formats.detect import MAGIC_CORPUS, open_regular

SEP: Final[i32] = -1
"""The document separator in the ids (the history's request separator): never matched."""
HEADER_SIZE: Final[i64] = 96
SLOT_SIZE: Final[i64] = 16
ENTRY_SIZE: Final[i64] = 8
UNIGRAM_SIZE: Final[i64] = 8
OLDER_THAN_ALL: Final[i64] = 1 << 40
"""A bound above every position (a constant: mypyc emits ``i64(1) << 40`` in a function as a C
``1 << 40`` on int, which overflows)."""


def checksum8(body: bytes | memoryview) -> bytes:
    """The file's checksum of ``body``: BLAKE2b, 8 bytes.

    hashlib is imported here, not with the module: it loads OpenSSL (megabytes of resident
    memory), and every ``lookupdec stats`` imports this module without ever writing or
    verifying a corpus file.
    """
    import hashlib

    return hashlib.blake2b(body, digest_size=8).digest()


def slot_bits(n_slots: i64) -> i64:
    """log2 of a power of two."""
    bits: i64 = 0
    while (i64(1) << bits) < n_slots:
        bits += 1
    return bits


class _Keys:
    """An open-addressing set of packed keys numbered in first-insertion order (building only)."""

    keys: vec[i64]
    slots: vec[i32]
    mask: i64

    def __init__(self) -> None:
        self.keys = vec[i64]()
        self.slots = filled_i32(1024, NULL32)
        self.mask = 1023

    def intern(self, w: i64) -> i64:
        """The ordinal of ``w``, numbered now if new."""
        s = word_probe(self.slots, self.keys, self.mask, w)
        if s >= 0:
            return s
        kid = i64(len(self.keys))
        self.slots[-1 - s] = i32(kid)
        self.keys = append(self.keys, w)
        if 2 * (kid + 1) > self.mask + 1:
            self.mask = 2 * (self.mask + 1) - 1
            self.slots = word_slots(self.keys, self.mask + 1)
        return kid


def corpus_bytes(ids: vec[i32], vocab_size: int = 0, vocab_fingerprint: bytes = bytes(8), version: int = 3) -> bytes:
    """The corpus file of ``ids`` (-1 between documents): header, ids, slots, entries, unigrams,
    after, trigrams (``version`` 2: without the trigram section, for tests and ``verify``).

    Bigrams are numbered in the order of their first indexed position; a position ``i`` is
    indexed when ``ids[i-2]``, ``ids[i-1]``, ``ids[i]`` are tokens (not -1). Bigram ``k``'s
    run holds its positions newest first; the slot table places the bigrams in that order,
    each at the first free slot from its home ``static_slot`` (linear probing); unigram
    records are ascending by token, each with the first index of its token's run in the after
    section (its positions newest first); the trigram section holds each run's entries again,
    by token before ascending, then newest first. So the bytes depend on the ids only.
    """
    if version not in READABLE_VERSIONS:
        raise ValueError(f"corpus file version {version} cannot be written (only 2 or 3)")
    # checked here, not by the header's struct.pack: its error names neither argument
    if not 0 <= vocab_size <= 1 << 31:
        raise ValueError(f"vocab_size must be in 0..2^31 (0: not recorded), got {vocab_size}")
    if len(vocab_fingerprint) != 8:
        raise ValueError(f"vocab_fingerprint must be 8 bytes (all zero: not recorded), got {len(vocab_fingerprint)}")

    n = i64(len(ids))
    for j in range(n):
        if ids[j] < SEP:
            raise ValueError(f"corpus token {ids[j]} at {j} is negative (only -1, between documents)")
    bigrams = _Keys()
    kids = filled_i32(n, NULL32)
    counts = vec[i32]()
    for i in range(2, n):
        a = ids[i - 2]
        b = ids[i - 1]
        if a != SEP and b != SEP and ids[i] != SEP:
            kid = bigrams.intern(pack(a, b))
            if kid == i64(len(counts)):
                counts = append(counts, 0)
            counts[kid] += 1
            kids[i] = i32(kid)
    n_bigrams = i64(len(counts))
    starts = vec[i32](capacity=n_bigrams + 1)
    total: i64 = 0
    for k in range(n_bigrams):
        starts = append(starts, i32(total))
        total += i64(counts[k])
    starts = append(starts, i32(total))
    fill = vec[i32](capacity=n_bigrams)
    for k in range(n_bigrams):
        fill = append(fill, starts[k])
    run = filled_i32(total, 0)
    i = n - 1
    while i >= 2:  # newest first within each run
        kid = i64(kids[i])
        if kid >= 0:
            run[i64(fill[kid])] = i32(i)
            fill[kid] += 1
        i -= 1
    n_slots = i64(min_slots(int(n_bigrams)))
    bits = slot_bits(n_slots)
    mask = n_slots - 1
    where = filled_i32(n_slots, NULL32)
    for k in range(n_bigrams):
        w = bigrams.keys[k]
        h = static_slot(i32(w >> 32), low32(w), bits)
        while where[h] >= 0:
            h = (h + 1) & mask
        where[h] = i32(k)
    # the one-token fallback: per token t, the positions i with ids[i-1] == t (and ids[i] a
    # token), newest first, one run per token in ascending token order (a counting sort)
    unis = _Keys()
    ucount = vec[i32]()
    for i in range(1, n):
        a = ids[i - 1]
        if a != SEP and ids[i] != SEP:
            u = unis.intern(pack(a, a))
            if u == i64(len(ucount)):
                ucount = append(ucount, 0)
            ucount[u] += 1
    n_uni = i64(len(ucount))
    order = sorted([(int(low32(unis.keys[u])), int(u)) for u in range(n_uni)])
    ustart = filled_i32(n_uni, 0)
    n_after: i64 = 0
    for _t, uo in order:
        u = i64(uo)
        ustart[u] = i32(n_after)
        n_after += i64(ucount[u])
    ufill = filled_i32(n_uni, 0)
    for u in range(n_uni):
        ufill[u] = ustart[u]
    after = filled_i32(n_after, 0)
    i = n - 1
    while i >= 1:  # newest first within each run
        a = ids[i - 1]
        if a != SEP and ids[i] != SEP:
            u = unis.intern(pack(a, a))
            after[i64(ufill[u])] = i32(i)
            ufill[u] += 1
        i -= 1
    tri = vec[i32]()
    if version >= 3:
        tri = trigram_order(ids, run, kids, starts, unis, order)
    w8 = BytesWriter()
    for j in range(n):
        write_i32_le(w8, ids[j])
    if n % 2 == 1:
        write_i32_le(w8, 0)  # pads the ids to a multiple of 8 bytes
    for h in range(n_slots):
        k = i64(where[h])
        if k < 0:
            write_i64_le(w8, 0)
            write_i64_le(w8, 0)
        else:
            write_i64_le(w8, bigrams.keys[k])
            write_i32_le(w8, starts[k])
            write_i32_le(w8, counts[k])
    write_entries(w8, ids, run)
    for t, uo in order:
        write_i32_le(w8, i32(t))
        write_i32_le(w8, ustart[i64(uo)])
    for g in range(n_after):
        write_i32_le(w8, after[g])
    if n_after % 2 == 1:
        write_i32_le(w8, 0)  # pads the after section to a multiple of 8 bytes
    write_entries(w8, ids, tri)
    body = w8.getvalue()
    header = CORPUS_HEADER.pack(
        MAGIC_CORPUS, version, HEADER_SIZE, 0, n_after, n, n_bigrams, n_slots, total, n_uni,
        vocab_size, vocab_fingerprint, HEADER_SIZE + len(body), checksum8(body),
    )  # fmt: skip
    return header + body


def write_entries(w8: BytesWriter, ids: vec[i32], positions: vec[i32]) -> None:
    """Write an entry per position ``p``: ``p`` and ``ids[p-3]`` (-1 when ``p < 3``)."""
    for g in range(len(positions)):
        p = i64(positions[g])
        write_i32_le(w8, i32(p))
        pre = SEP  # an if statement: a conditional expression on native ints is boxed
        if p >= 3:
            pre = ids[p - 3]
        write_i32_le(w8, pre)


def trigram_order(
    ids: vec[i32], run: vec[i32], kids: vec[i32], starts: vec[i32], unis: _Keys, order: list[tuple[int, int]]
) -> vec[i32]:
    """The trigram section's positions: each bigram's run (``run``, bigram ``k``'s from
    ``starts[k]``, newest first; ``kids[p]`` is position ``p``'s bigram) ordered by the token
    before (``ids[p-3]``, -1 first) ascending, then newest first.

    Two stable counting passes, O(n): the entries in run order by the rank of their token before
    (-1 is rank 0; a token ``t`` its place in ``order``, the ascending tokens of ``unis``, plus 1:
    a token before an indexed position is followed by a token, so it has a unigram record), then
    each into its run, which keeps them by token before and, within one, newest first.
    """
    total = i64(len(run))
    n_uni = i64(len(order))
    urank = filled_i32(n_uni, 0)
    for r in range(n_uni):
        urank[i64(order[r][1])] = i32(r + 1)
    rank = filled_i32(total, 0)
    bucket = filled_i32(n_uni + 2, 0)
    for g in range(total):
        p = i64(run[g])
        rk: i64 = 0
        if p >= 3:
            t = ids[p - 3]
            if t != SEP:
                rk = i64(urank[unis.intern(pack(t, t))])
        rank[g] = i32(rk)
        bucket[rk + 1] += 1
    for r in range(n_uni + 1):
        bucket[r + 1] += bucket[r]
    by_rank = filled_i32(total, 0)
    for g in range(total):
        rk = i64(rank[g])
        by_rank[i64(bucket[rk])] = run[g]
        bucket[rk] += 1
    fill = filled_i32(i64(len(starts)), 0)
    for k in range(len(starts)):
        fill[k] = starts[k]
    tri = filled_i32(total, 0)
    for j in range(total):
        p = i64(by_rank[j])
        k = i64(kids[p])
        tri[i64(fill[k])] = i32(p)
        fill[k] += 1
    return tri


class CorpusIndex:
    """A corpus for the hybrid policy's suffix match, read in place (docs/formats.md, "The corpus file").

    Open a file with :meth:`open` (memory-mapped, O(1): the mapping is shared with every
    process that maps the file and only the pages a match touches become resident) or build
    one in memory with :meth:`from_tokens`; give it to ``SuffixHistory.add_corpus`` (or
    ``Drafter(policy="hybrid", corpus=...)``).
    """

    path: str
    in_memory: bool
    n_tokens: i64
    n_bigrams: i64
    n_slots: i64
    n_entries: i64
    n_unigrams: i64
    n_after: i64
    version: int
    vocab_size: int
    vocab_fingerprint: bytes
    _buf: bytes
    _view: MappedBytes | None
    _closed: bool
    _bits: i64
    _o_slots: i64
    _o_entries: i64
    _o_unigrams: i64
    _o_after: i64
    _o_trigrams: i64

    def __init__(self, path: str, data: bytes, view: MappedBytes | None = None, copied: bool = False) -> None:
        """Use :meth:`open`, :meth:`from_tokens` or :meth:`from_bytes` instead."""
        h = corpus_header(path, data, len(data))
        self.path = path
        self.in_memory = copied or view is None  # ``view`` holds ``data``: the mapping, or the copy when ``copied``
        self._buf = data
        self._view = view
        self._closed = False
        self.n_tokens = h.n_tokens
        self.n_bigrams = h.n_bigrams
        self.n_slots = h.n_slots
        self.n_entries = h.n_entries
        self.n_unigrams = h.n_unigrams
        self.n_after = h.n_after
        self.version = h.version
        self.vocab_size = h.vocab_size
        self.vocab_fingerprint = bytes(h.vocab_fingerprint)
        self._bits = slot_bits(h.n_slots)
        self._o_slots = h.slots_offset
        self._o_entries = h.entries_offset
        self._o_unigrams = h.unigrams_offset
        self._o_after = h.after_offset
        self._o_trigrams = h.trigrams_offset if h.has_trigrams else -1

    @classmethod
    def open(cls, path: str | os.PathLike[str], *, in_memory: bool = False) -> CorpusIndex:
        """Open a corpus file: memory-mapped (default; read into memory where mapping as ``bytes``
        is not supported) or read into memory (``in_memory``). Checks the header only: O(1)."""
        p = os.fspath(path)
        with open_regular(p) as f:
            size = os.fstat(f.fileno()).st_size
            if in_memory:
                data, copy = read_whole(f.fileno(), size, p)
                try:
                    return CorpusIndex(p, data, copy, copied=True)
                except BaseException:
                    if copy is not None:
                        data = b""  # the copy's last reference but the view's: close() unmaps it
                        copy.close()
                    raise
            view = None if size < HEADER_SIZE else map_bytes(f.fileno(), size)
            if view is None:
                data = f.read()
                if len(data) != size:
                    raise CacheFormatError(p, f"file changed size while being read ({size} -> {len(data)} bytes)")
                return CorpusIndex(p, data)
        try:
            ix = CorpusIndex(p, view.data, view)
        except BaseException:
            view.close()
            raise
        view.prefetch()  # readahead, not waited for
        return ix

    @classmethod
    def from_bytes(cls, data: bytes, path: str = "<memory>") -> CorpusIndex:
        """A corpus over the bytes of a corpus file (``path`` names it in errors)."""
        return CorpusIndex(path, data)

    @classmethod
    def from_tokens(
        cls, tokens: Sequence[int], vocab_size: int = 0, vocab_fingerprint: bytes = bytes(8)
    ) -> CorpusIndex:
        """Build a corpus in memory from token ids (-1 between documents).

        Moved into huge pages (``_mapbytes.huge_copy``) where they are available: the matches'
        random reads miss the TLB less, as with ``open(in_memory=True)``. The copy does not
        raise the peak: building already held the data twice (the writer and its value).
        """
        data = corpus_bytes(to_vec(tokens), vocab_size, vocab_fingerprint)
        copy = huge_copy(data)
        if copy is None:
            return CorpusIndex("<memory>", data)
        data = b""  # freed before the index is made: the copy holds it
        try:
            return CorpusIndex("<memory>", copy.data, copy, copied=True)
        except BaseException:
            copy.close()
            raise

    def _check_open(self) -> None:
        """ValueError once closed: its bytes are gone, and a closed corpus must neither save as an
        empty file over a good one nor draft as an empty corpus without saying so."""
        if self._closed:
            raise ValueError(f"{self.path}: corpus file is closed")

    def to_bytes(self) -> bytes:
        """The whole corpus file as bytes (a copy when mapped: the mapping goes away on close())."""
        self._check_open()
        if self.in_memory:
            return self._buf
        return memoryview(self._buf).tobytes()

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the corpus file to ``path`` (atomically)."""
        from lookupdec._atomic import atomic_writer

        self._check_open()
        with atomic_writer(path) as f:
            f.write(self._buf)

    def tokens(self) -> list[int]:
        """The corpus's ids (-1 between documents)."""
        self._check_open()
        return [int(self._tok(i)) for i in range(self.n_tokens)]

    def __len__(self) -> int:
        """Number of ids (separators included)."""
        return int(self.n_tokens)

    def __repr__(self) -> str:
        mode = "in-memory" if self.in_memory else "mmap"
        return (
            f"<fast.CorpusIndex {self.path!r} {mode} version={self.version} "
            f"tokens={self.n_tokens} bigrams={self.n_bigrams}>"
        )

    def verify(self) -> None:
        """The full check: checksum, and every section equal to what the ids give; O(n_tokens)."""
        self._check_open()
        body = memoryview(self._buf)[HEADER_SIZE:]
        checksum = CORPUS_HEADER.unpack_from(self._buf, 0)[-1]
        if checksum8(body) != checksum:
            raise CacheFormatError(self.path, "checksum mismatch: the file is corrupt", 88)
        ids = vec[i32](capacity=self.n_tokens)
        for i in range(self.n_tokens):
            ids = append(ids, read_i32_le(self._buf, HEADER_SIZE + 4 * i))
        try:
            want = corpus_bytes(ids, self.vocab_size, self.vocab_fingerprint, self.version)
        except ValueError as e:
            raise CacheFormatError(self.path, str(e)) from None
        if want[HEADER_SIZE:] != body:
            raise CacheFormatError(
                self.path, "slots, entries, unigrams, after or trigram section differ from what the ids give"
            )
        # The header's counts too (n_bigrams is not needed to find anything, so no read checks it)
        if want[:HEADER_SIZE] != bytes(memoryview(self._buf)[:HEADER_SIZE]):
            raise CacheFormatError(self.path, "header fields differ from what the ids give (n_bigrams, totals)", 0)

    def close(self) -> None:
        """Release the mapping (an in-memory corpus drops its buffer); using it then raises ValueError."""
        self._closed = True
        self._buf = b""
        self.n_tokens = 0
        self.n_bigrams = 0
        self.n_entries = 0
        self.n_unigrams = 0
        self.n_after = 0
        view = self._view
        self._view = None
        if view is not None:
            view.close()  # unmaps once nothing references the mapping's bytes (_mapbytes)

    def __enter__(self) -> CorpusIndex:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- reads for SuffixHistory._collect -------------------------------------------------

    def _corrupt(self, message: str, off: i64) -> CacheFormatError:
        return CacheFormatError(self.path, message + " (run verify() for a full check)", int(off))

    def _tok(self, i: i64) -> i32:
        """Id ``i`` (-1 outside the corpus)."""
        if i < 0 or i >= self.n_tokens:
            return SEP
        t = read_i32_le(self._buf, HEADER_SIZE + 4 * i)
        if t < SEP:
            raise self._corrupt(f"token id {t} < -1", HEADER_SIZE + 4 * i)
        return t

    def _find(self, a: i32, b: i32) -> i64:
        """Byte offset of the slot of bigram (a, b), -1 if it has no indexed position."""
        if self._closed:  # every suffix match of the corpus starts here or in _after_run
            self._check_open()
        if self.n_bigrams == 0:
            return -1
        w = pack(a, b)
        mask = self.n_slots - 1
        h = static_slot(a, b, self._bits)
        buf = self._buf
        o = self._o_slots
        for _probe in range(self.n_slots):  # bounded: a corrupt table without a free slot ends too
            off = o + SLOT_SIZE * h
            if read_i32_le(buf, off + 12) == 0:
                return -1
            if read_i64_le(buf, off) == w:
                return off
            h = (h + 1) & mask
        return -1

    def _run(self, off: i64) -> tuple[i64, i64]:
        """(first entry, number of entries) of the slot at ``off``, checked."""
        start = i64(read_i32_le(self._buf, off + 8))
        count = i64(read_i32_le(self._buf, off + 12))
        if start < 0 or count < 0 or start + count > self.n_entries:
            raise self._corrupt(f"run of {count} entries at {start} outside the {self.n_entries} entries", off)
        return start, count

    def _bad_entry(self, g: i64) -> CacheFormatError:
        return self._corrupt(f"entry {g}: position outside 2..n_tokens - 1", self._o_entries + ENTRY_SIZE * g)

    def _bad_deep(self, g: i64) -> CacheFormatError:
        """The error for entry ``g`` of a trigram search (of the trigram section; version 2: of the entries)."""
        if self._o_trigrams < 0:
            return self._bad_entry(g)
        return self._corrupt(f"trigram entry {g}: position outside 3..n_tokens - 1", self._o_trigrams + ENTRY_SIZE * g)

    def _trigram_first(self, start: i64, count: i64, taken: i64, t3: i32) -> i64:
        """The first index in the trigram section of the trigram ``(t3, a, b)``'s occurrences older
        than the first ``taken`` entries of the bigram ``(a, b)``'s run (``start``, ``count``, as
        :meth:`_run` checked them; ``0 <= taken < count``): they follow it up to the first entry
        whose token before is not ``t3`` or the run's end, newest first. A version 3 file only.

        The run's entries are newest (largest position) first, so those after the first ``taken``
        are the ones older than the last taken; the trigram run is ordered by (token before
        ascending, position descending), and a binary search finds the first entry not before
        ``(t3, that position)``. Every index read stays inside the run, whatever the file holds.
        """
        buf = self._buf
        bound = OLDER_THAN_ALL  # taken == 0: every position is older (even a corrupt one, then refused)
        if taken > 0:
            bound = i64(read_i32_le(buf, self._o_entries + ENTRY_SIZE * (start + taken - 1)))
        o = self._o_trigrams
        lo = start
        hi = start + count
        while lo < hi:
            mid = (lo + hi) // 2
            e = o + ENTRY_SIZE * mid
            pre = read_i32_le(buf, e + 4)
            if pre < t3 or (pre == t3 and i64(read_i32_le(buf, e)) >= bound):
                lo = mid + 1
            else:
                hi = mid
        return lo

    def _after_run(self, t: i32) -> tuple[i64, i64]:
        """(first index, number) of the after section's run of token ``t``: the positions ``i``
        with ``ids[i-1] == t`` and ``ids[i]`` a token, newest first; (0, 0) if none."""
        if self._closed:
            self._check_open()
        lo: i64 = 0
        hi = self.n_unigrams
        buf = self._buf
        o = self._o_unigrams
        while lo < hi:
            mid = (lo + hi) // 2
            if read_i32_le(buf, o + UNIGRAM_SIZE * mid) < t:
                lo = mid + 1
            else:
                hi = mid
        if lo >= self.n_unigrams or read_i32_le(buf, o + UNIGRAM_SIZE * lo) != t:
            return 0, 0
        start = i64(read_i32_le(buf, o + UNIGRAM_SIZE * lo + 4))
        end = self.n_after
        if lo + 1 < self.n_unigrams:
            end = i64(read_i32_le(buf, o + UNIGRAM_SIZE * (lo + 1) + 4))
        if start < 0 or end <= start or end > self.n_after:
            raise self._corrupt(
                f"unigram {t}: run {start}..{end} is empty or outside the {self.n_after} positions",
                o + UNIGRAM_SIZE * lo + 4,
            )
        return start, end - start

    def _after_pos(self, g: i64) -> i64:
        """Position ``g`` of the after section, checked."""
        off = self._o_after + 4 * g
        p = i64(read_i32_le(self._buf, off))
        if p < 1 or p >= self.n_tokens:
            raise self._corrupt(f"after position {g}: {p} outside 1..n_tokens - 1", off)
        return p
