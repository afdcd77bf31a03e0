"""lookupdec's own memory-mappable static index (``docs/static-index.md``): read, verify, write."""

from __future__ import annotations

import hashlib
import mmap
import os
import struct
from collections.abc import Iterator, Sequence
from types import TracebackType
from typing import Any, Final

import numpy as np

from lookupdec._atomic import atomic_writer
from lookupdec.errors import CacheFormatError
from lookupdec.formats._tables import I32Array, I64Array, Table, check_runs, pack_keys, run_indices
from lookupdec.formats.detect import NULL, ContentsItem, Key, open_regular
from lookupdec.formats.index_header import (
    _OFF_CHECKSUM,
    _OFF_FLAGS,
    _OFF_RESERVED,
    _OFF_TOTAL_COUNT,
    _align8,
    check_part,
    pack_index_header,
)
from lookupdec.formats.index_header import (
    INDEX_HEADER_SIZE as INDEX_HEADER_SIZE,
)
from lookupdec.formats.index_header import (
    INDEX_VERSION as INDEX_VERSION,
)
from lookupdec.formats.index_header import (
    _IndexHeader as _IndexHeader,
)
from lookupdec.formats.index_header import (
    index_header as index_header,
)
from lookupdec.rules import INT32_MAX, INT32_MIN

_HASH_MULT: Final = 0x9E3779B97F4A7C15
_MASK64: Final = (1 << 64) - 1


def _index_checksum(body: bytes | memoryview) -> bytes:
    return hashlib.blake2b(body, digest_size=8).digest()


def _home_slots(packed: I64Array, n_slots: int) -> I64Array:
    b = n_slots.bit_length() - 1
    h = (packed.view(np.uint64) * np.uint64(_HASH_MULT)) >> np.uint64(64 - b)
    return h.astype(np.int64)


def _compute_picks(starts: I64Array, tokens: I32Array, counts: I32Array) -> I32Array:
    """Spec 3.2 per key, vectorized: exact (not int32-wrapped) sums, smallest id on ties."""
    n = len(starts) - 1
    if n == 0:
        return np.zeros(0, dtype=np.int32)
    c = counts.astype(np.int64)
    st = starts[:-1]
    lens = np.diff(starts)
    maxc = np.maximum.reduceat(c, st)
    sums = np.add.reduceat(c, st)
    seg = np.repeat(np.arange(n), lens)
    idx = np.where(c == maxc[seg], np.arange(len(c)), len(c))
    first = np.minimum.reduceat(idx, st)
    ok = (sums >= 2) & (100 * maxc >= 50 * sums)
    return np.where(ok, tokens[first], -1).astype(np.int32)


def _build_slots(packed: I64Array, n_slots: int) -> I32Array:
    """Linear probing, keys inserted in ordinal order (the doc's canonical layout)."""
    slots = [-1] * n_slots
    mask = n_slots - 1
    for i, h in enumerate(_home_slots(packed, n_slots).tolist()):
        while slots[h] != -1:
            h = (h + 1) & mask
        slots[h] = i
    return np.array(slots, dtype=np.int32)


def index_arrays(
    path: str | os.PathLike[str], data: bytes, h: _IndexHeader
) -> tuple[I32Array, I64Array, I64Array, I32Array, I32Array, I32Array]:
    """The index's six arrays (slots, keys, starts, picks, tokens, counts) as numpy copies."""

    def arr(dtype: str, count: int, offset: int) -> Any:
        return np.frombuffer(data, dtype=dtype, count=count, offset=offset)

    return (
        arr("<i4", h.n_slots, h.slots_offset).astype(np.int32),
        arr("<i8", h.n_keys, h.keys_offset).astype(np.int64),
        arr("<i8", h.n_keys + 1, h.starts_offset).astype(np.int64),
        arr("<i4", h.n_keys, h.picks_offset).astype(np.int32),
        arr("<i4", h.n_entries, h.tokens_offset).astype(np.int32),
        arr("<i4", h.n_entries, h.counts_offset).astype(np.int32),
    )


def check_starts(path: str | os.PathLike[str], h: _IndexHeader, starts: I64Array) -> None:
    """``starts`` runs from 0 to n_entries, strictly increasing (every key has a follower)."""
    if starts[0] != 0:
        raise CacheFormatError(path, f"starts[0] is {int(starts[0])}, must be 0", h.starts_offset)
    if starts[-1] != h.n_entries:
        raise CacheFormatError(
            path,
            f"starts[n_keys] is {int(starts[-1])}, must be n_entries = {h.n_entries}",
            h.starts_offset + 8 * h.n_keys,
        )
    bad = np.flatnonzero(np.diff(starts) <= 0)
    if len(bad):
        k = int(bad[0])
        raise CacheFormatError(
            path,
            f"starts not strictly increasing at key {k} ({int(starts[k])} then {int(starts[k + 1])}): "
            "every key has at least one follower",
            h.starts_offset + 8 * (k + 1),
        )


def verify_index(path: str | os.PathLike[str], data: bytes, h: _IndexHeader, *, checksum: bool = True) -> Table:
    """The doc's ``verify()``: checksum, then every structural rule. Returns the table."""
    if checksum:
        got = _index_checksum(memoryview(data)[INDEX_HEADER_SIZE:])
        if got != h.checksum:
            raise CacheFormatError(
                path, f"checksum mismatch: header has {h.checksum.hex()}, the body hashes to {got.hex()}", _OFF_CHECKSUM
            )
    if h.flags != 0:
        raise CacheFormatError(path, f"flags is {h.flags:#x}, must be 0", _OFF_FLAGS)
    if h.reserved != 0:
        raise CacheFormatError(path, f"reserved is {h.reserved:#x}, must be 0", _OFF_RESERVED)
    for start, end in (
        (h.slots_offset + 4 * h.n_slots, h.keys_offset),
        (h.keys_offset + 8 * h.n_keys, h.starts_offset),
        (h.starts_offset + 8 * (h.n_keys + 1), h.picks_offset),
        (h.picks_offset + 4 * h.n_keys, h.tokens_offset),
        (h.tokens_offset + 4 * h.n_entries, h.counts_offset),
    ):
        if any(data[start:end]):
            raise CacheFormatError(path, "non-zero padding between sections", start)
    slots, keys, starts, picks, tokens, counts = index_arrays(path, data, h)
    check_starts(path, h, starts)
    t0 = keys >> 32
    t1 = ((keys & 0xFFFFFFFF) ^ 0x80000000) - 0x80000000  # low 32 bits as a signed int32
    ascending = (t0[1:] > t0[:-1]) | ((t0[1:] == t0[:-1]) & (t1[1:] > t1[:-1]))
    bad = np.flatnonzero(~ascending)
    if len(bad):
        k = int(bad[0]) + 1
        raise CacheFormatError(path, f"keys not strictly ascending at key {k}", h.keys_offset + 8 * k)
    lens = np.diff(starts)
    check_runs(path, starts[:-1], lens, tokens, counts, h.tokens_offset, 4, h.counts_offset)
    total = int(counts.astype(np.int64).sum())
    if total != h.total_count:
        raise CacheFormatError(path, f"total_count is {h.total_count}, the counts sum to {total}", _OFF_TOTAL_COUNT)
    # Slots: valid ordinals, each exactly once, each reachable from its home slot.
    bad = np.flatnonzero((slots < -1) | (slots >= h.n_keys))
    if len(bad):
        i = int(bad[0])
        raise CacheFormatError(path, f"slot {i} holds {int(slots[i])}, not a key ordinal or -1", h.slots_offset + 4 * i)
    occupied = slots != -1
    pos = np.flatnonzero(occupied)
    ords = slots[pos].astype(np.int64)
    seen = np.zeros(h.n_keys, dtype=np.int64)
    np.add.at(seen, ords, 1)
    bad = np.flatnonzero(seen != 1)
    if len(bad):
        k = int(bad[0])
        raise CacheFormatError(path, f"key {k} is in {int(seen[k])} slots, must be in exactly 1", h.slots_offset)
    if h.n_keys:
        home = _home_slots(keys[ords], h.n_slots)
        dist = (pos - home) & (h.n_slots - 1)
        empty = np.concatenate(([0], np.cumsum(np.tile(~occupied, 2), dtype=np.int64)))
        unreachable = np.flatnonzero(empty[home + dist + 1] - empty[home] > 0)
        if len(unreachable):
            i = int(pos[unreachable[0]])
            raise CacheFormatError(
                path,
                f"slot {i}: key {int(slots[i])} is not reachable by probing from its home slot",
                h.slots_offset + 4 * i,
            )
    want = _compute_picks(starts, tokens, counts)
    bad = np.flatnonzero(want != picks)
    if len(bad):
        k = int(bad[0])
        raise CacheFormatError(
            path, f"picks[{k}] is {int(picks[k])}, spec 3.2 gives {int(want[k])}", h.picks_offset + 4 * k
        )
    return Table(t0.astype(np.int64), t1.astype(np.int64), starts[:-1], lens, tokens, counts)


class LookupdecIndexReader:
    """A lookupdec static index, memory-mapped: header fields, ``part(key)``, ``verify()``.

    Opening checks the header in constant time (docs/static-index.md "On open"); a lookup
    bounds-checks what it reads; :meth:`verify` checks everything. Use as a context manager
    or call :meth:`close`.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        with open_regular(path) as f:
            size = os.fstat(f.fileno()).st_size
            if size < INDEX_HEADER_SIZE:
                raise CacheFormatError(
                    path, f"file of {size} bytes is shorter than the {INDEX_HEADER_SIZE}-byte header", size
                )
            self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            self._h = index_header(path, self._mm, size)
        except BaseException:
            self._mm.close()
            raise
        h = self._h
        self.version: int = h.version
        self.n_keys: int = h.n_keys
        self.n_entries: int = h.n_entries
        self.n_slots: int = h.n_slots
        self.vocab_size: int = h.vocab_size
        self.vocab_fingerprint: bytes = h.vocab_fingerprint
        self.total_count: int = h.total_count
        self.file_size: int = h.file_size
        self.checksum: bytes = h.checksum
        self._shift = 64 - (h.n_slots.bit_length() - 1)
        self._mask = h.n_slots - 1

    def close(self) -> None:
        """Unmap the file."""
        self._mm.close()

    def __enter__(self) -> LookupdecIndexReader:
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def _ordinal(self, t0: int, t1: int) -> int:
        """The key's ordinal, or -1; raises on a corrupt slot table."""
        t0, t1 = int(t0), int(t1)  # numpy scalars would overflow in the arithmetic below
        if not (INT32_MIN <= t0 <= INT32_MAX and INT32_MIN <= t1 <= INT32_MAX):
            return -1
        u = ((t0 & 0xFFFFFFFF) << 32) | (t1 & 0xFFFFFFFF)
        want = u - (1 << 64) if u >> 63 else u
        h = ((u * _HASH_MULT) & _MASK64) >> self._shift
        mm, hd = self._mm, self._h
        for _ in range(self.n_slots):
            o: int = struct.unpack_from("<i", mm, hd.slots_offset + 4 * h)[0]
            if o == -1:
                return -1
            if not 0 <= o < self.n_keys:
                raise CacheFormatError(self.path, f"slot {h} holds {o}, not a key ordinal", hd.slots_offset + 4 * h)
            (k,) = struct.unpack_from("<q", mm, hd.keys_offset + 8 * o)
            if k == want:
                return o
            h = (h + 1) & self._mask
        raise CacheFormatError(self.path, "slot table has no empty slot", hd.slots_offset)

    def _span(self, o: int) -> tuple[int, int]:
        s, e = struct.unpack_from("<qq", self._mm, self._h.starts_offset + 8 * o)
        if not 0 <= s < e <= self.n_entries:
            raise CacheFormatError(
                self.path,
                f"key {o} has followers {s}..{e - 1}, outside 0..{self.n_entries - 1}",
                self._h.starts_offset + 8 * o,
            )
        return s, e

    def part(self, key: Key, /) -> dict[int, int] | None:
        """The followers of a padded key (only 2-grams can be present), or None."""
        if key[2] != NULL or key[3] != NULL:
            return None
        o = self._ordinal(key[0], key[1])
        if o < 0:
            return None
        toks, cnts = self._checked_part(o)
        return dict(zip(toks, cnts, strict=True))

    def _checked_part(self, o: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Tokens and counts of key ordinal ``o`` after the per-lookup checks (``check_part``)."""
        s, e = self._span(o)
        n = e - s
        toks = struct.unpack_from(f"<{n}i", self._mm, self._h.tokens_offset + 4 * s)
        cnts = struct.unpack_from(f"<{n}i", self._mm, self._h.counts_offset + 4 * s)
        (pick,) = struct.unpack_from("<i", self._mm, self._h.picks_offset + 4 * o)
        check_part(self.path, o, toks, cnts, pick, self._h.tokens_offset + 4 * s)
        return toks, cnts

    def get(self, ngram: Sequence[int]) -> dict[int, int]:
        """The followers of a 2-gram (or padded key) as a new dict; empty if absent."""
        k = tuple(ngram) + (NULL,) * (4 - len(ngram))
        if len(k) != 4:
            raise ValueError(f"a key has at most 4 slots, got {len(ngram)}")
        return self.part((k[0], k[1], k[2], k[3])) or {}

    def pick(self, key: Key, /) -> int:
        """The stored static-only draft (spec 3.2) of a padded key, -1 if none or absent."""
        if key[2] != NULL or key[3] != NULL:
            return NULL
        o = self._ordinal(key[0], key[1])
        if o < 0:
            return NULL
        self._checked_part(o)
        (p,) = struct.unpack_from("<i", self._mm, self._h.picks_offset + 4 * o)
        return int(p)

    def verify(self) -> None:
        """Full check (docs/static-index.md "verify()"); raises :class:`CacheFormatError`."""
        # A copy, so that no numpy array keeps the mmap exported (close() would then fail).
        verify_index(self.path, self._mm[:], self._h)

    def contents(self) -> Iterator[ContentsItem]:
        """Every (key, followers), keys ascending, after :meth:`verify`-level checks."""
        return verify_index(self.path, self._mm[:], self._h).iter_contents()

    def __repr__(self) -> str:
        return f"<LookupdecIndexReader {self.path!r} keys={self.n_keys} entries={self.n_entries}>"


def write_index(
    path: str | os.PathLike[str],
    t0: I64Array,
    t1: I64Array,
    starts: I64Array,
    tokens: I32Array,
    counts: I32Array,
    vocab_size: int,
    vocab_fingerprint: bytes,
) -> None:
    """Write a lookupdec index from flattened, checked contents (keys are sorted here)."""
    # Keys ascending by (t0, t1) signed; runs follow their keys.
    order = np.lexsort((t1, t0))
    t0, t1 = t0[order], t1[order]
    lens = np.diff(starts)[order]
    idx = run_indices(starts[:-1][order], lens)
    tokens, counts = tokens[idx], counts[idx]
    starts = np.concatenate(([0], np.cumsum(lens))).astype(np.int64)
    n_keys, n_entries = len(t0), len(tokens)
    n_slots = 2
    while n_slots < 2 * n_keys:
        n_slots *= 2
    packed = pack_keys(t0, t1)
    sections: list[bytes] = []
    pos = INDEX_HEADER_SIZE
    for arr in (
        _build_slots(packed, n_slots),
        packed.astype("<i8"),
        starts.astype("<i8"),
        _compute_picks(starts, tokens, counts).astype("<i4"),
        tokens.astype("<i4"),
        counts.astype("<i4"),
    ):
        pad = _align8(pos) - pos
        if pad:
            sections.append(bytes(pad))
        data = arr.tobytes()
        sections.append(data)
        pos += pad + len(data)
    hasher = hashlib.blake2b(digest_size=8)
    for s in sections:
        hasher.update(s)
    header = pack_index_header(
        n_keys,
        n_entries,
        n_slots,
        vocab_size,
        vocab_fingerprint,
        int(counts.astype(np.int64).sum()),
        pos,
        hasher.digest(),
    )
    with atomic_writer(path) as f:
        f.write(header)
        for s in sections:
            f.write(s)
