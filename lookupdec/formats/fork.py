"""The optimized fork's static files, v1 and v2 (spec 11.1-11.3).

A (token, count) entries array plus a fastconstmap ``VerifiedConstMap`` from the 2-gram to
its span; v2 adds a key table, so only v2 can be enumerated. Reading and writing need numpy
and fastconstmap (the constmap's hashing is fastconstmap's own).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator, Sequence
from typing import Any, Final

import fastconstmap
import numpy as np

from lookupdec._atomic import atomic_writer
from lookupdec.errors import CacheFormatError
from lookupdec.formats._tables import I32Array, I64Array, Table, check_runs, pack_keys
from lookupdec.formats.detect import MAGIC_FORK_V1, MAGIC_FORK_V2, NULL, ContentsItem, Key, read_all

_FORK_V1_HEADER: Final = struct.Struct("<8sQQ")  # magic, n_entries, map_size
_FORK_V2_HEADER: Final = struct.Struct("<8sQQQ")  # magic, n_entries, map_size, n_keys
_MAP_HEADER: Final = struct.Struct("<8sQIIII")  # magic, seed, segment_length, segment_count, data_len, n_keys
_MAP_MAGICS: Final = (b"VMAP0001", b"VCMP0002")  # fastconstmap 0.10 (xxh64) and <= 0.9 (xxh3)
_PAIR: Final = struct.Struct("<ii")
_KEY_ROW: Final = np.dtype([("t0", "<i4"), ("t1", "<i4"), ("span", "<u8")])  # v2 key table row
_SPAN_BITS: Final = 24  # span = offset << 24 | length
_SPAN_MAX_LENGTH: Final = (1 << _SPAN_BITS) - 1
_SPAN_MAX_OFFSET: Final = (1 << (64 - _SPAN_BITS)) - 1


class ForkStatic:
    """A fork static file (v1 or v2) opened for drafting: ``part(key)`` via its constmap.

    Loads like the fork does: the whole file is read into one buffer, sizes are checked to
    add up exactly and the constmap is viewed in place (fastconstmap checks its own
    checksum). Spans are bounds-checked on every lookup; the key table of a v2 file is read
    and fully validated only by :meth:`contents`.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        data = read_all(path)
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
        if key[2] != NULL or key[3] != NULL:
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
        k = tuple(ngram) + (NULL,) * (4 - len(ngram))
        if len(k) != 4:
            raise ValueError(f"a key has at most 4 slots, got {len(ngram)}")
        return self.part((k[0], k[1], k[2], k[3])) or {}

    # --- enumeration (v2 only) -----------------------------------------------------------

    def _entries(self) -> tuple[I32Array, I32Array]:
        pairs = np.frombuffer(self._data, dtype="<i4", count=2 * self.n_entries, offset=self._entries_offset)
        pairs = pairs.reshape(self.n_entries, 2)
        return pairs[:, 0].astype(np.int32), pairs[:, 1].astype(np.int32)

    def _table(self) -> Table:
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
        # Not something the fork checks, but no writer makes overlapping runs (two keys
        # sharing followers), and expanding them would cost memory without bound: each
        # span, in offset order, must end at or before the next one starts.
        by_start = np.argsort(offs, kind="stable")
        ends = offs[by_start] + lens[by_start]
        overlap = np.flatnonzero(ends[:-1] > offs[by_start][1:])
        if len(overlap):
            i, j = int(by_start[overlap[0]]), int(by_start[overlap[0] + 1])
            raise CacheFormatError(
                self.path,
                f"key table rows {i} and {j}: spans overlap (entries {int(offs[i])}..{int(ends[overlap[0]]) - 1} "
                f"and {int(offs[j])}..{int(offs[j] + lens[j]) - 1})",
                self._table_offset + 16 * j + 8,
            )
        packed = pack_keys(t0, t1)
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
        check_runs(self.path, offs, lens, tokens, counts, self._entries_offset, 8, self._entries_offset + 4)
        return Table(t0, t1, offs, lens, tokens, counts)

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


def write_fork(
    path: str | os.PathLike[str],
    fmt: str,
    t0: I64Array,
    t1: I64Array,
    starts: I64Array,
    tokens: I32Array,
    counts: I32Array,
) -> None:
    """Write a fork v1/v2 file (``fmt``) from flattened, checked contents (see ``collect``)."""
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
