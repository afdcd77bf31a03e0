"""Cache file formats: detection, readers, writers and inspection, shared by both implementations.

Formats:

- ``llama``: llama.cpp's legacy record stream (no header; spec 7), encoded and decoded by
  :mod:`lookupdec.reference.files`;
- ``fork-v1`` / ``fork-v2``: the optimized fork's static files, a (token, count) entries array
  plus a fastconstmap ``VerifiedConstMap`` from the 2-gram to its span (spec 11.1-11.3);
- ``lookupdec``: lookupdec's own memory-mappable static index (``docs/static-index.md``).

Everything here is pure Python plus numpy and fastconstmap. Every malformed file raises
:class:`~lookupdec.errors.CacheFormatError` naming the file and, where there is one, the byte
offset; bad arguments to a writer raise ``ValueError``.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import struct
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final

import fastconstmap
import numpy as np
import numpy.typing as npt

from lookupdec._atomic import atomic_writer
from lookupdec.errors import CacheFormatError

FORMATS = ("lookupdec", "llama", "fork-v1", "fork-v2")
"""Every format name :func:`detect_format` returns and :func:`write_static` accepts."""
MAGIC_FORK_V1 = b"ggngcmap"
MAGIC_FORK_V2 = b"ggngcmp2"
MAGIC_LOOKUPDEC = b"LKDCIDX\x00"

Key = tuple[int, int, int, int]
"""A padded 4-slot n-gram key (unused slots -1)."""
Followers = list[tuple[int, int]]
"""(token, count) pairs of one key."""
ContentsItem = tuple[Key, Followers]
"""One key with its followers, as :func:`read_as_contents` yields them."""

_INT32_MIN: Final = -(2**31)
_INT32_MAX: Final = 2**31 - 1
_NULL: Final = -1

I64Array = npt.NDArray[np.int64]
I32Array = npt.NDArray[np.int32]

# --- fork static files (spec 11) ----------------------------------------------------------

_FORK_V1_HEADER: Final = struct.Struct("<8sQQ")  # magic, n_entries, map_size
_FORK_V2_HEADER: Final = struct.Struct("<8sQQQ")  # magic, n_entries, map_size, n_keys
_MAP_HEADER: Final = struct.Struct("<8sQIIII")  # magic, seed, segment_length, segment_count, data_len, n_keys
_MAP_MAGICS: Final = (b"VMAP0001", b"VCMP0002")  # fastconstmap 0.10 (xxh64) and <= 0.9 (xxh3)
_PAIR: Final = struct.Struct("<ii")
_KEY_ROW: Final = np.dtype([("t0", "<i4"), ("t1", "<i4"), ("span", "<u8")])  # v2 key table row
_SPAN_BITS: Final = 24  # span = offset << 24 | length
_SPAN_MAX_LENGTH: Final = (1 << _SPAN_BITS) - 1
_SPAN_MAX_OFFSET: Final = (1 << (64 - _SPAN_BITS)) - 1

# --- lookupdec static index (docs/static-index.md) ----------------------------------------

INDEX_VERSION: Final = 1
"""The version of the lookupdec static index this module reads and writes."""
INDEX_HEADER_SIZE: Final = 96
_INDEX_HEADER: Final = struct.Struct("<8sIIIIQQQQ8sQQ8sQ")
_HASH_MULT: Final = 0x9E3779B97F4A7C15
_MASK64: Final = (1 << 64) - 1
_OFF_CHECKSUM: Final = 80
_OFF_TOTAL_COUNT: Final = 64
_OFF_FLAGS: Final = 20
_OFF_RESERVED: Final = 88

assert _INDEX_HEADER.size == INDEX_HEADER_SIZE


def detect_format(path: str | os.PathLike[str]) -> str:
    """The format of a cache file, from its first 8 bytes (legacy files have no magic)."""
    try:
        with open(path, "rb") as f:
            head = f.read(8)
    except FileNotFoundError:
        raise FileNotFoundError(f"{os.fspath(path)}: no such cache file") from None
    if head == MAGIC_FORK_V1:
        return "fork-v1"
    if head == MAGIC_FORK_V2:
        return "fork-v2"
    if head == MAGIC_LOOKUPDEC:
        return "lookupdec"
    return "llama"


def _read_all(path: str | os.PathLike[str]) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise FileNotFoundError(f"{os.fspath(path)}: no such cache file") from None


def _align8(n: int) -> int:
    return (n + 7) & ~7


# ==========================================================================================
# Validated tables: the common in-memory form of a static file's keys and runs
# ==========================================================================================


@dataclass
class _Table:
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
            yield (a, b, _NULL, _NULL), list(zip(toks[o : o + n], cnts[o : o + n], strict=True))

    def key_totals(self) -> I64Array:
        """Sum of counts of each key (int64: exact)."""
        if len(self.lens) == 0:
            return np.zeros(0, dtype=np.int64)
        c = self.counts.astype(np.int64)
        # Runs may sit anywhere in the entries array (fork v2), so gather them first.
        idx = _run_indices(self.offs, self.lens)
        cum = np.concatenate(([0], np.cumsum(self.lens)[:-1]))
        return np.add.reduceat(c[idx], cum)


def _run_indices(offs: I64Array, lens: I64Array) -> I64Array:
    """Entry indices of all runs, concatenated (runs must be non-empty)."""
    total = int(lens.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    cum = np.concatenate(([0], np.cumsum(lens)[:-1]))
    return np.repeat(offs - cum, lens) + np.arange(total, dtype=np.int64)


def _check_runs(
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
    idx = _run_indices(offs, lens)
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


def _pack_keys(t0: I64Array, t1: I64Array) -> I64Array:
    """``(t0 << 32) | (t1 & 0xFFFFFFFF)`` as int64 bits (the index's packed key)."""
    return ((t0 << 32) | (t1 & 0xFFFFFFFF)).astype(np.int64)


# ==========================================================================================
# Fork static files (v1, v2)
# ==========================================================================================


class ForkStatic:
    """A fork static file (v1 or v2) opened for drafting: ``part(key)`` via its constmap.

    Loads like the fork does: the whole file is read into one buffer, sizes are checked to
    add up exactly and the constmap is viewed in place (fastconstmap checks its own
    checksum). Spans are bounds-checked on every lookup; the key table of a v2 file is read
    and fully validated only by :meth:`contents`.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        data = _read_all(path)
        self._data = data
        size = len(data)
        magic = data[:8]
        if magic == MAGIC_FORK_V1:
            self.format = "fork-v1"
            header = _FORK_V1_HEADER
        elif magic == MAGIC_FORK_V2:
            self.format = "fork-v2"
            header = _FORK_V2_HEADER
        else:
            raise CacheFormatError(path, f"not a fork static file (magic {magic!r})", 0)
        if size < header.size:
            raise CacheFormatError(path, f"file of {size} bytes is shorter than the {header.size}-byte header", size)
        fields = header.unpack_from(data, 0)
        n_entries: int = fields[1]
        map_size: int = fields[2]
        n_keys_table: int = fields[3] if self.format == "fork-v2" else 0
        self._entries_offset = header.size
        self._map_offset = header.size + 8 * n_entries
        self._table_offset = self._map_offset + map_size
        expected = self._table_offset + 16 * n_keys_table
        if expected != size:
            what = f"n_entries = {n_entries}, map_size = {map_size}"
            if self.format == "fork-v2":
                what += f", n_keys = {n_keys_table}"
            raise CacheFormatError(path, f"sizes do not add up: {what} need {expected} bytes, the file has {size}")
        self.n_entries = n_entries
        self.map_size = map_size
        info = _check_map_header(path, data, self._map_offset, map_size)
        self.map_magic: bytes = info[0]
        self.n_keys: int = info[5]
        if self.format == "fork-v2" and n_keys_table != self.n_keys:
            raise CacheFormatError(
                path,
                f"key table has {n_keys_table} keys but the constmap holds {self.n_keys}",
                _FORK_V2_HEADER.size - 8,
            )
        view = memoryview(data)[self._map_offset : self._map_offset + map_size]
        try:
            self._map = fastconstmap.VerifiedConstMap.from_buffer(view)
        except ValueError as e:
            raise CacheFormatError(path, f"constmap section: {e}", self._map_offset) from None
        self.map_hash: str = self._map.hash

    # --- drafting -------------------------------------------------------------------------

    def part(self, key: Key, /) -> dict[int, int] | None:
        """The followers of a padded key (only 2-grams can be present), or None."""
        if key[2] != _NULL or key[3] != _NULL:
            return None
        try:
            packed = _PAIR.pack(key[0], key[1])
        except struct.error:  # a token outside int32 cannot be in the file
            return None
        span = self._map.get(packed)
        if span is None:
            return None
        return self._run(key, span)

    def _run(self, key: Sequence[int], span: int) -> dict[int, int]:
        offset, length = span >> _SPAN_BITS, span & _SPAN_MAX_LENGTH
        if length == 0 or offset + length > self.n_entries:
            raise CacheFormatError(
                self.path,
                f"span of 2-gram ({key[0]}, {key[1]}) is entries {offset}..{offset + length - 1}, "
                f"outside the {self.n_entries} entries",
                self._map_offset,
            )
        start = self._entries_offset + 8 * offset
        return dict(_PAIR.iter_unpack(self._data[start : start + 8 * length]))

    def get(self, ngram: Sequence[int]) -> dict[int, int]:
        """The followers of a 2-gram (or padded key) as a new dict; empty if absent."""
        k = tuple(ngram) + (_NULL,) * (4 - len(ngram))
        if len(k) != 4:
            raise ValueError(f"a key has at most 4 slots, got {len(ngram)}")
        return self.part((k[0], k[1], k[2], k[3])) or {}

    # --- enumeration (v2 only) -----------------------------------------------------------

    def _entries(self) -> tuple[I32Array, I32Array]:
        pairs = np.frombuffer(self._data, dtype="<i4", count=2 * self.n_entries, offset=self._entries_offset)
        pairs = pairs.reshape(self.n_entries, 2)
        return pairs[:, 0].astype(np.int32), pairs[:, 1].astype(np.int32)

    def _table(self) -> _Table:
        if self.format != "fork-v2":
            raise CacheFormatError(
                self.path,
                "a fork static v1 file has no key table, so it cannot be expanded into a cache "
                "(the fork refuses too); it can only be used for drafting (ForkStatic.part)",
            )
        rows = np.frombuffer(self._data, dtype=_KEY_ROW, count=self.n_keys, offset=self._table_offset)
        t0 = rows["t0"].astype(np.int64)
        t1 = rows["t1"].astype(np.int64)
        spans = rows["span"].astype(np.uint64)
        offs = (spans >> np.uint64(_SPAN_BITS)).astype(np.int64)
        lens = (spans & np.uint64(_SPAN_MAX_LENGTH)).astype(np.int64)
        # offs < 2**40, lens < 2**24: the sum cannot overflow int64.
        bad = np.flatnonzero((lens == 0) | (offs + lens > self.n_entries))
        if len(bad):
            i = int(bad[0])
            raise CacheFormatError(
                self.path,
                f"key table row {i} (2-gram ({int(t0[i])}, {int(t1[i])})): span of {int(lens[i])} entries at "
                f"{int(offs[i])} is empty or outside the {self.n_entries} entries",
                self._table_offset + 16 * i + 8,
            )
        if int(lens.sum()) > self.n_entries:
            # Not something the fork checks, but no writer makes overlapping runs and
            # expanding them would cost memory without bound.
            raise CacheFormatError(self.path, "key table spans overlap (they cover more entries than the file holds)")
        packed = _pack_keys(t0, t1)
        order = np.argsort(packed, kind="stable")
        dup = np.flatnonzero(packed[order][1:] == packed[order][:-1])
        if len(dup):
            i = int(order[dup[0] + 1])
            raise CacheFormatError(
                self.path,
                f"key table row {i}: 2-gram ({int(t0[i])}, {int(t1[i])}) appears twice",
                self._table_offset + 16 * i,
            )
        if self.n_keys:
            rows4 = np.frombuffer(self._data, dtype="<i4", count=4 * self.n_keys, offset=self._table_offset)
            raw = np.ascontiguousarray(rows4.reshape(-1, 4)[:, :2]).tobytes()
            out = bytearray(8 * self.n_keys)
            self._map.get_many_into((raw[i : i + 8] for i in range(0, len(raw), 8)), out)
            found = np.frombuffer(out, dtype="<u8")
            bad = np.flatnonzero(found != spans)
            if len(bad):
                i = int(bad[0])
                raise CacheFormatError(
                    self.path,
                    f"key table row {i} (2-gram ({int(t0[i])}, {int(t1[i])})) disagrees with the constmap",
                    self._table_offset + 16 * i,
                )
        tokens, counts = self._entries()
        _check_runs(self.path, offs, lens, tokens, counts, self._entries_offset, 8, self._entries_offset + 4)
        return _Table(t0, t1, offs, lens, tokens, counts)

    def contents(self) -> Iterator[ContentsItem]:
        """Every (key, followers) of a v2 file, in key-table order, after full validation.

        Raises :class:`CacheFormatError` for a v1 file (no key table) or any inconsistency:
        spans outside the entries, runs not strictly ascending, counts <= 0, duplicate
        keys, a key table that disagrees with the constmap.
        """
        return self._table().iter_contents()

    def total_count(self) -> int:
        """Sum of the counts of all entries (also possible for v1)."""
        _, counts = self._entries()
        return int(counts.astype(np.int64).sum())

    def __repr__(self) -> str:
        return f"<ForkStatic {self.format} {self.path!r} keys={self.n_keys} entries={self.n_entries}>"


def _check_map_header(path: str | os.PathLike[str], data: bytes, offset: int, size: int) -> tuple[Any, ...]:
    """The constmap's dimensions must agree with its section size (spec 11.2 and 11.3)."""
    if size < _MAP_HEADER.size:
        raise CacheFormatError(path, f"constmap section of {size} bytes is shorter than its header", offset)
    fields = _MAP_HEADER.unpack_from(data, offset)
    magic, _seed, seg_len, seg_count, data_len, _n = fields
    if magic not in _MAP_MAGICS:
        raise CacheFormatError(path, f"constmap section has magic {magic!r}, expected one of {_MAP_MAGICS}", offset)
    # fastconstmap writes an empty map with all dimensions 0.
    empty = seg_len == 0 and seg_count == 0 and data_len == 0
    if not empty and (seg_len & (seg_len - 1) != 0 or seg_len == 0):
        raise CacheFormatError(path, f"constmap segment_length {seg_len} is not a power of two", offset + 16)
    if (seg_count + 2) * seg_len != data_len:
        raise CacheFormatError(
            path, f"constmap dimensions inconsistent: ({seg_count} + 2) * {seg_len} != data_len {data_len}", offset + 16
        )
    need = _MAP_HEADER.size + 16 * data_len + 8
    if need != size:
        raise CacheFormatError(
            path, f"constmap with data_len {data_len} needs {need} bytes, map_size is {size}", offset
        )
    return fields


# ==========================================================================================
# The lookupdec static index
# ==========================================================================================


@dataclass(frozen=True)
class _IndexHeader:
    version: int
    header_size: int
    ngram_size: int
    flags: int
    n_keys: int
    n_entries: int
    n_slots: int
    vocab_size: int
    vocab_fingerprint: bytes
    total_count: int
    file_size: int
    checksum: bytes
    reserved: int

    @property
    def slots_offset(self) -> int:
        return INDEX_HEADER_SIZE

    @property
    def keys_offset(self) -> int:
        return _align8(self.slots_offset + 4 * self.n_slots)

    @property
    def starts_offset(self) -> int:
        return _align8(self.keys_offset + 8 * self.n_keys)

    @property
    def picks_offset(self) -> int:
        return _align8(self.starts_offset + 8 * (self.n_keys + 1))

    @property
    def tokens_offset(self) -> int:
        return _align8(self.picks_offset + 4 * self.n_keys)

    @property
    def counts_offset(self) -> int:
        return _align8(self.tokens_offset + 4 * self.n_entries)

    @property
    def end(self) -> int:
        return self.counts_offset + 4 * self.n_entries


def _index_header(path: str | os.PathLike[str], head: bytes | mmap.mmap, real_size: int) -> _IndexHeader:
    """Parse and check the header in constant time (the doc's "on open" checks)."""
    if real_size < INDEX_HEADER_SIZE:
        raise CacheFormatError(
            path, f"file of {real_size} bytes is shorter than the {INDEX_HEADER_SIZE}-byte header", real_size
        )
    f = _INDEX_HEADER.unpack_from(head, 0)
    if f[0] != MAGIC_LOOKUPDEC:
        raise CacheFormatError(path, f"not a lookupdec static index (magic {f[0]!r})", 0)
    h = _IndexHeader(*f[1:])
    if h.version != INDEX_VERSION:
        raise CacheFormatError(path, f"static index version {h.version} is not supported (only {INDEX_VERSION})", 8)
    if h.header_size != INDEX_HEADER_SIZE:
        raise CacheFormatError(path, f"header_size is {h.header_size}, expected {INDEX_HEADER_SIZE}", 12)
    if h.ngram_size != 2:
        raise CacheFormatError(path, f"ngram_size is {h.ngram_size}, only 2 is supported", 16)
    if h.n_keys > h.n_entries:
        raise CacheFormatError(path, f"n_keys {h.n_keys} > n_entries {h.n_entries}: every key has a follower", 24)
    if h.n_keys > _INT32_MAX:
        raise CacheFormatError(path, f"n_keys {h.n_keys} does not fit the int32 slots", 24)
    if h.n_slots < max(2, 2 * h.n_keys) or h.n_slots & (h.n_slots - 1):
        raise CacheFormatError(
            path, f"n_slots {h.n_slots} is not a power of two >= max(2, 2 * n_keys = {2 * h.n_keys})", 40
        )
    if h.file_size != real_size:
        raise CacheFormatError(path, f"header says file_size {h.file_size}, the file has {real_size} bytes", 72)
    if h.end != real_size:
        raise CacheFormatError(
            path,
            f"n_keys = {h.n_keys}, n_entries = {h.n_entries}, n_slots = {h.n_slots} need {h.end} bytes, "
            f"the file has {real_size}",
        )
    return h


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


def _index_arrays(
    path: str | os.PathLike[str], data: bytes, h: _IndexHeader
) -> tuple[I32Array, I64Array, I64Array, I32Array, I32Array, I32Array]:
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


def _check_starts(path: str | os.PathLike[str], h: _IndexHeader, starts: I64Array) -> None:
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


def _verify_index(path: str | os.PathLike[str], data: bytes, h: _IndexHeader, *, checksum: bool = True) -> _Table:
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
    slots, keys, starts, picks, tokens, counts = _index_arrays(path, data, h)
    _check_starts(path, h, starts)
    t0 = keys >> 32
    t1 = ((keys & 0xFFFFFFFF) ^ 0x80000000) - 0x80000000  # low 32 bits as a signed int32
    ascending = (t0[1:] > t0[:-1]) | ((t0[1:] == t0[:-1]) & (t1[1:] > t1[:-1]))
    bad = np.flatnonzero(~ascending)
    if len(bad):
        k = int(bad[0]) + 1
        raise CacheFormatError(path, f"keys not strictly ascending at key {k}", h.keys_offset + 8 * k)
    lens = np.diff(starts)
    _check_runs(path, starts[:-1], lens, tokens, counts, h.tokens_offset, 4, h.counts_offset)
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
    return _Table(t0.astype(np.int64), t1.astype(np.int64), starts[:-1], lens, tokens, counts)


class LookupdecIndexReader:
    """A lookupdec static index, memory-mapped: header fields, ``part(key)``, ``verify()``.

    Opening checks the header in constant time (docs/static-index.md "On open"); a lookup
    bounds-checks what it reads; :meth:`verify` checks everything. Use as a context manager
    or call :meth:`close`.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size < INDEX_HEADER_SIZE:
                    raise CacheFormatError(
                        path, f"file of {size} bytes is shorter than the {INDEX_HEADER_SIZE}-byte header", size
                    )
                self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except FileNotFoundError:
            raise FileNotFoundError(f"{self.path}: no such cache file") from None
        try:
            self._h = _index_header(path, self._mm, size)
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
        if not (_INT32_MIN <= t0 <= _INT32_MAX and _INT32_MIN <= t1 <= _INT32_MAX):
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
        if key[2] != _NULL or key[3] != _NULL:
            return None
        o = self._ordinal(key[0], key[1])
        if o < 0:
            return None
        s, e = self._span(o)
        n = e - s
        toks = struct.unpack_from(f"<{n}i", self._mm, self._h.tokens_offset + 4 * s)
        cnts = struct.unpack_from(f"<{n}i", self._mm, self._h.counts_offset + 4 * s)
        return dict(zip(toks, cnts, strict=True))

    def get(self, ngram: Sequence[int]) -> dict[int, int]:
        """The followers of a 2-gram (or padded key) as a new dict; empty if absent."""
        k = tuple(ngram) + (_NULL,) * (4 - len(ngram))
        if len(k) != 4:
            raise ValueError(f"a key has at most 4 slots, got {len(ngram)}")
        return self.part((k[0], k[1], k[2], k[3])) or {}

    def pick(self, key: Key, /) -> int:
        """The stored static-only draft (spec 3.2) of a padded key, -1 if none or absent."""
        if key[2] != _NULL or key[3] != _NULL:
            return _NULL
        o = self._ordinal(key[0], key[1])
        if o < 0:
            return _NULL
        (p,) = struct.unpack_from("<i", self._mm, self._h.picks_offset + 4 * o)
        return int(p)

    def verify(self) -> None:
        """Full check (docs/static-index.md "verify()"); raises :class:`CacheFormatError`."""
        # A copy, so that no numpy array keeps the mmap exported (close() would then fail).
        _verify_index(self.path, self._mm[:], self._h)

    def contents(self) -> Iterator[ContentsItem]:
        """Every (key, followers), keys ascending, after :meth:`verify`-level checks."""
        return _verify_index(self.path, self._mm[:], self._h).iter_contents()

    def __repr__(self) -> str:
        return f"<LookupdecIndexReader {self.path!r} keys={self.n_keys} entries={self.n_entries}>"


# ==========================================================================================
# Reading and writing any format
# ==========================================================================================


def read_as_contents(path: str | os.PathLike[str]) -> Iterator[ContentsItem]:
    """Every (key, followers) of a cache file, validated first (the whole file is checked).

    ``fork-v2``: from its key table, in file order; ``lookupdec``: keys ascending, after a
    full :meth:`LookupdecIndexReader.verify`; ``llama``: the legacy reader's canonical
    contents. A ``fork-v1`` file has no key table and raises :class:`CacheFormatError`.
    """
    fmt = detect_format(path)
    if fmt == "llama":
        from lookupdec.reference.files import parse_legacy

        return iter(parse_legacy(_read_all(path), path).contents())
    if fmt == "lookupdec":
        data = _read_all(path)
        h = _index_header(path, data, len(data))
        return _verify_index(path, data, h).iter_contents()
    return ForkStatic(path).contents()


def _collect(
    contents: Iterable[tuple[Sequence[int], Iterable[tuple[int, int]] | Mapping[int, int]]],
) -> tuple[I64Array, I64Array, I64Array, I32Array, I32Array]:
    """Check and flatten static contents: (t0, t1, starts, tokens, counts), runs sorted by token."""
    k0: list[int] = []
    k1: list[int] = []
    lens: list[int] = []
    toks: list[int] = []
    cnts: list[int] = []
    for key, followers in contents:
        if len(key) != 4 or key[2] != _NULL or key[3] != _NULL:
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
        bad = np.flatnonzero((a < _INT32_MIN) | (a > _INT32_MAX))
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


def _check_unique_keys(t0: I64Array, t1: I64Array) -> None:
    packed = np.sort(_pack_keys(t0, t1))
    dup = np.flatnonzero(packed[1:] == packed[:-1])
    if len(dup):
        p = int(packed[dup[0]])
        raise ValueError(f"2-gram ({p >> 32}, {((p & 0xFFFFFFFF) ^ 0x80000000) - 0x80000000}) appears twice")


def write_static(
    contents: Iterable[tuple[Sequence[int], Iterable[tuple[int, int]] | Mapping[int, int]]],
    path: str | os.PathLike[str],
    format: str = "lookupdec",
    *,
    vocab_size: int = 0,
    vocab_fingerprint: bytes = b"",
) -> None:
    """Write a static cache (2-gram keys only) to ``path`` in ``format``, atomically.

    ``contents`` yields (key, followers) with followers as (token, count) pairs or a
    ``{token: count}`` mapping; keys must be padded 2-grams ``(t0, t1, -1, -1)``, unique,
    with at least one follower, tokens int32, counts 1..2**31-1, no follower listed twice.
    Anything else raises ``ValueError`` (before the target is touched).

    - ``lookupdec``: docs/static-index.md, keys sorted, with ``vocab_size`` and
      ``vocab_fingerprint`` (8 bytes, or empty for unknown) in the header and a checksum;
    - ``llama``: the legacy format via :func:`lookupdec.reference.files.save_legacy`;
    - ``fork-v2`` / ``fork-v1``: spec 11.2 / 11.1, keys in the order given (the fork writes
      first-insertion order: pass ``cache.items()`` of a cache built from the corpus to
      reproduce its files byte for byte), each run sorted by token.

    The vocabulary arguments are ignored by the formats that have no place for them.
    """
    if format not in FORMATS:
        raise ValueError(f"unknown format {format!r}: choose one of {', '.join(FORMATS)}")
    if vocab_fingerprint and len(vocab_fingerprint) != 8:
        raise ValueError(f"vocab_fingerprint must be 8 bytes (or empty), got {len(vocab_fingerprint)}")
    if not 0 <= vocab_size < 2**64:
        raise ValueError(f"vocab_size must fit in u64, got {vocab_size}")
    t0, t1, starts, tokens, counts = _collect(contents)
    _check_unique_keys(t0, t1)
    if format == "llama":
        from lookupdec.reference.cache import NgramCache
        from lookupdec.reference.files import save_legacy

        table = _Table(t0, t1, starts[:-1], np.diff(starts), tokens, counts)
        save_legacy(NgramCache.from_contents(table.iter_contents()), path)
    elif format == "lookupdec":
        _write_index(path, t0, t1, starts, tokens, counts, vocab_size, vocab_fingerprint or bytes(8))
    else:
        _write_fork(path, format, t0, t1, starts, tokens, counts)


def _write_fork(
    path: str | os.PathLike[str],
    fmt: str,
    t0: I64Array,
    t1: I64Array,
    starts: I64Array,
    tokens: I32Array,
    counts: I32Array,
) -> None:
    lens = np.diff(starts)
    offs = starts[:-1]
    if len(lens) and int(lens.max()) > _SPAN_MAX_LENGTH:
        k = int(np.argmax(lens))
        raise ValueError(
            f"2-gram ({int(t0[k])}, {int(t1[k])}) has {int(lens[k])} followers, the fork allows {_SPAN_MAX_LENGTH}"
        )
    if len(offs) and int(offs[-1]) > _SPAN_MAX_OFFSET:
        raise ValueError(f"{int(starts[-1])} entries are too many for the fork's 40-bit span offsets")
    spans = (offs.astype(np.uint64) << np.uint64(_SPAN_BITS)) | lens.astype(np.uint64)
    pairs = np.empty((len(tokens), 2), dtype="<i4")
    pairs[:, 0] = tokens
    pairs[:, 1] = counts
    keys = np.empty((len(t0), 2), dtype="<i4")
    keys[:, 0] = t0
    keys[:, 1] = t1
    raw = keys.tobytes()
    cmap = fastconstmap.VerifiedConstMap(
        dict(zip((raw[i : i + 8] for i in range(0, len(raw), 8)), spans.tolist(), strict=True))
    )
    map_bytes = cmap.to_bytes()
    n_entries = len(tokens)
    with atomic_writer(path) as f:
        if fmt == "fork-v1":
            f.write(_FORK_V1_HEADER.pack(MAGIC_FORK_V1, n_entries, len(map_bytes)))
        else:
            f.write(_FORK_V2_HEADER.pack(MAGIC_FORK_V2, n_entries, len(map_bytes), len(t0)))
        f.write(pairs.tobytes())
        f.write(map_bytes)
        if fmt == "fork-v2":
            table = np.empty(len(t0), dtype=_KEY_ROW)
            table["t0"] = t0
            table["t1"] = t1
            table["span"] = spans
            f.write(table.tobytes())


def _write_index(
    path: str | os.PathLike[str],
    t0: I64Array,
    t1: I64Array,
    starts: I64Array,
    tokens: I32Array,
    counts: I32Array,
    vocab_size: int,
    vocab_fingerprint: bytes,
) -> None:
    # Keys ascending by (t0, t1) signed; runs follow their keys.
    order = np.lexsort((t1, t0))
    t0, t1 = t0[order], t1[order]
    lens = np.diff(starts)[order]
    idx = _run_indices(starts[:-1][order], lens)
    tokens, counts = tokens[idx], counts[idx]
    starts = np.concatenate(([0], np.cumsum(lens))).astype(np.int64)
    n_keys, n_entries = len(t0), len(tokens)
    n_slots = 2
    while n_slots < 2 * n_keys:
        n_slots *= 2
    packed = _pack_keys(t0, t1)
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
    header = _INDEX_HEADER.pack(
        MAGIC_LOOKUPDEC,
        INDEX_VERSION,
        INDEX_HEADER_SIZE,
        2,
        0,
        n_keys,
        n_entries,
        n_slots,
        vocab_size,
        vocab_fingerprint,
        int(counts.astype(np.int64).sum()),
        pos,
        hasher.digest(),
        0,
    )
    with atomic_writer(path) as f:
        f.write(header)
        for s in sections:
            f.write(s)


# ==========================================================================================
# Inspection
# ==========================================================================================

_TOP = 10


def _key_size(key: Sequence[int]) -> int:
    n = 4
    while n > 1 and key[n - 1] == _NULL:
        n -= 1
    return n


def _top_from_table(table: _Table) -> list[dict[str, Any]]:
    totals = table.key_totals()
    if len(totals) == 0:
        return []
    # Heaviest first; among equal totals the smaller key, so the answer is deterministic.
    order = np.lexsort((table.t1, table.t0, -totals))[:_TOP]
    out = []
    for i in order.tolist():
        o, n = int(table.offs[i]), int(table.lens[i])
        followers = sorted(
            zip(table.tokens[o : o + n].tolist(), table.counts[o : o + n].tolist(), strict=True),
            key=lambda p: (-p[1], p[0]),
        )
        key = (int(table.t0[i]), int(table.t1[i]), _NULL, _NULL)
        out.append(_top_row(key, int(totals[i]), followers))
    return out


def _top_row(key: Key, total: int, followers_by_weight: list[tuple[int, int]]) -> dict[str, Any]:
    return {
        "key": key,
        "ngram": key[: _key_size(key)],
        "total": total,
        "n_followers": len(followers_by_weight),
        "followers": followers_by_weight[:5],
    }


def inspect_file(path: str | os.PathLike[str], *, verify: bool = False) -> dict[str, Any]:
    """A description of any cache file, for ``lookupdec inspect``.

    Keys: ``path``, ``format``, ``file_size``, ``n_keys``, ``n_entries``, ``total_count``,
    ``key_sizes`` ({1..4: number of keys}), ``top`` (up to 10 heaviest n-grams by total
    count, each ``{"key", "ngram", "total", "n_followers", "followers"}`` with the 5 heaviest
    followers), ``verified`` (True when a full check ran and passed), ``warnings`` and
    ``details`` (format-specific header fields). A fork v1 file cannot be enumerated, so
    its ``top`` is None. ``verify=True`` runs every check the format allows (for a
    lookupdec index, the checksum too) and raises :class:`CacheFormatError` on failure;
    without it a lookupdec index is checked only as far as needed to describe it.
    """
    fmt = detect_format(path)
    out: dict[str, Any] = {"path": os.fspath(path), "format": fmt, "file_size": os.path.getsize(path)}
    caught: list[str] = []
    if fmt == "llama":
        from lookupdec.reference.files import parse_legacy

        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            cache = parse_legacy(_read_all(path), path, strict=verify)
        caught = [str(x.message) for x in w]
        sizes = dict.fromkeys(range(1, 5), 0)
        weights: list[tuple[int, Key, dict[int, int]]] = []
        for key, part in cache.items():
            sizes[_key_size(key)] += 1
            weights.append((sum(part.values()), key, part))
        weights.sort(key=lambda x: (-x[0], x[1]))
        out.update(
            n_keys=len(cache),
            n_entries=cache.n_entries,
            total_count=sum(x[0] for x in weights),
            key_sizes=sizes,
            top=[_top_row(k, t, sorted(p.items(), key=lambda q: (-q[1], q[0]))) for t, k, p in weights[:_TOP]],
            verified=verify,
            details={},
        )
    elif fmt == "lookupdec":
        data = _read_all(path)
        h = _index_header(path, data, len(data))
        if verify:
            table = _verify_index(path, data, h)
        else:
            _slots, keys, starts, _picks, tokens, counts = _index_arrays(path, data, h)
            _check_starts(path, h, starts)
            t1 = ((keys & 0xFFFFFFFF) ^ 0x80000000) - 0x80000000
            table = _Table(keys >> 32, t1, starts[:-1], np.diff(starts), tokens, counts)
        out.update(
            n_keys=h.n_keys,
            n_entries=h.n_entries,
            total_count=int(table.counts.astype(np.int64).sum()),
            key_sizes={1: 0, 2: h.n_keys, 3: 0, 4: 0},
            top=_top_from_table(table),
            verified=verify,
            details={
                "version": h.version,
                "n_slots": h.n_slots,
                "vocab_size": h.vocab_size,
                "vocab_fingerprint": h.vocab_fingerprint.hex(),
                "header_total_count": h.total_count,
                "checksum": h.checksum.hex(),
            },
        )
    else:
        fs = ForkStatic(path)
        details: dict[str, Any] = {
            "map_size": fs.map_size,
            "map_magic": fs.map_magic.decode("ascii"),
            "map_hash": fs.map_hash,
        }
        top: list[dict[str, Any]] | None = None
        if fmt == "fork-v2":
            top = _top_from_table(fs._table())
        else:
            caught.append("a fork v1 file has no key table: its n-grams cannot be listed")
        out.update(
            n_keys=fs.n_keys,
            n_entries=fs.n_entries,
            total_count=fs.total_count(),
            key_sizes={1: 0, 2: fs.n_keys, 3: 0, 4: 0},
            top=top,
            verified=fmt == "fork-v2",  # building a v2 table checks everything the format allows
            details=details,
        )
    out["warnings"] = caught
    return out


__all__ = [
    "FORMATS",
    "INDEX_HEADER_SIZE",
    "INDEX_VERSION",
    "MAGIC_FORK_V1",
    "MAGIC_FORK_V2",
    "MAGIC_LOOKUPDEC",
    "ContentsItem",
    "Followers",
    "ForkStatic",
    "Key",
    "LookupdecIndexReader",
    "detect_format",
    "inspect_file",
    "read_as_contents",
    "write_static",
]
