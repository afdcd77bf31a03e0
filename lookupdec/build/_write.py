"""Writing a lookupdec static index (docs/static-index.md) from its parts, streaming.

The parts (contiguous key ranges, in key order) may be in memory or spilled to files; the
writer holds one section of one part at a time, plus the slot table (4 bytes per slot,
at most 16 bytes per distinct 2-gram), which the canonical layout needs whole because
linear probing inserts every key in ordinal order.
"""

from __future__ import annotations

import hashlib
import os
import queue
import struct
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np

from lookupdec._atomic import atomic_writer
from lookupdec.build import _probe
from lookupdec.build._count import Part
from lookupdec.formats import INDEX_HEADER_SIZE, INDEX_VERSION, MAGIC_LOOKUPDEC

# The header of docs/static-index.md: magic, version, header_size, ngram_size, flags, n_keys,
# n_entries, n_slots, vocab_size, vocab_fingerprint, total_count, file_size, checksum, reserved.
HEADER = struct.Struct("<8sIIIIQQQQ8sQQ8sQ")
HASH_MULT = np.uint64(0x9E3779B97F4A7C15)
SLOT_PIECE = 1 << 20
"""Slots converted to bytes per call (bounds the copy)."""
SECTIONS = (("keys", "<i8", 0), ("starts", "<i8", 1), ("picks", "<i4", 0), ("tokens", "<i4", 0), ("counts", "<i4", 0))
"""Each section of a part: name, dtype, extra elements (starts has n_keys + 1)."""


@dataclass
class StoredPart:
    """A :class:`Part` spilled to one file: its sections one after another."""

    path: str
    n_keys: int
    n_entries: int
    total: int
    saturated: int

    @staticmethod
    def save(part: Part, path: str) -> StoredPart:
        """Write ``part`` to ``path`` and return the handle that reads it back."""
        with open(path, "wb") as f:
            for name, dtype, _ in SECTIONS:
                f.write(np.ascontiguousarray(getattr(part, name), dtype=dtype).tobytes())
        return StoredPart(path, part.n_keys, part.n_entries, part.total, part.saturated)

    def section(self, name: str) -> Any:
        """One section as a numpy array, read from the file."""
        offset = 0
        for sec, dtype, extra in SECTIONS:
            count = (self.n_entries if sec in ("tokens", "counts") else self.n_keys) + extra
            if sec == name:
                return np.fromfile(self.path, dtype=dtype, count=count, offset=offset)
            offset += count * np.dtype(dtype).itemsize
        raise KeyError(name)


class MemoryPart:
    """A :class:`Part` kept in memory, with the same interface as :class:`StoredPart`."""

    def __init__(self, part: Part) -> None:
        self.part = part
        self.n_keys = part.n_keys
        self.n_entries = part.n_entries
        self.total = part.total
        self.saturated = part.saturated

    def section(self, name: str) -> Any:
        """One section as a numpy array."""
        return getattr(self.part, name)


AnyPart = StoredPart | MemoryPart


@dataclass(frozen=True)
class IndexSummary:
    """What was written: sizes of the index and the follower counts clipped to ``2**31 - 1``."""

    n_keys: int
    n_entries: int
    total_count: int
    file_size: int
    saturated: int


def n_slots_for(n_keys: int) -> int:
    """The canonical slot count: the smallest power of two ``>= max(2, 2 * n_keys)``."""
    n = 2
    while n < 2 * n_keys:
        n *= 2
    return n


def fill_slots(parts: Sequence[AnyPart], n_slots: int) -> Any:
    """The slot table: keys inserted in ordinal order by linear probing from their home slot."""
    bits = n_slots.bit_length() - 1
    slots = _probe.empty_slots(n_slots)
    ordinal = 0
    for p in parts:
        keys = p.section("keys")
        homes = (keys.view(np.uint64) * HASH_MULT) >> np.uint64(64 - bits)
        _probe.insert_keys(slots, homes.astype("<i8").tobytes(), ordinal)
        ordinal += len(keys)
    return slots


class _Sink:
    """Writes and hashes the body in two background threads, so both overlap with the numpy work.

    hashlib and file writes release the GIL on large buffers; queues of a few blocks keep
    the memory in flight bounded. :meth:`digest` waits for both threads.
    """

    DEPTH = 4

    def __init__(self, f: BinaryIO) -> None:
        self.hasher = hashlib.blake2b(digest_size=8)
        self.queues: list[queue.Queue[bytes | None]] = [queue.Queue(self.DEPTH), queue.Queue(self.DEPTH)]
        self.errors: list[BaseException] = []
        self.threads = [
            threading.Thread(target=self._run, args=(self.queues[0], f.write), daemon=True),
            threading.Thread(target=self._run, args=(self.queues[1], self.hasher.update), daemon=True),
        ]
        for t in self.threads:
            t.start()

    def _run(self, q: queue.Queue[bytes | None], consume: Callable[[bytes], object]) -> None:
        while (data := q.get()) is not None:
            if not self.errors:
                try:
                    consume(data)
                except BaseException as e:  # re-raised by the main thread in _join
                    self.errors.append(e)

    def put(self, data: bytes, hash: bool = True) -> None:
        """Write ``data`` next (and hash it, unless ``hash`` is false)."""
        if self.errors:
            raise self.errors[0]
        self.queues[0].put(data)
        if hash:
            self.queues[1].put(data)

    def _join(self) -> None:
        for q, t in zip(self.queues, self.threads, strict=True):
            if t.is_alive():
                q.put(None)
                t.join()
        if self.errors:
            raise self.errors[0]

    def digest(self) -> bytes:
        """The checksum of everything put with ``hash``, once it is all written."""
        self._join()
        return self.hasher.digest()

    def __enter__(self) -> _Sink:
        return self

    def __exit__(self, *exc: object) -> None:
        self._join()


def write_index(
    path: str | os.PathLike[str], parts: Sequence[AnyPart], *, vocab_size: int = 0, vocab_fingerprint: bytes = b""
) -> IndexSummary:
    """Write the index of ``parts`` (key ranges in ascending order) to ``path``, atomically."""
    if vocab_fingerprint and len(vocab_fingerprint) != 8:
        raise ValueError(f"vocab_fingerprint must be 8 bytes (or empty), got {len(vocab_fingerprint)}")
    n_keys = sum(p.n_keys for p in parts)
    n_entries = sum(p.n_entries for p in parts)
    total = sum(p.total for p in parts)
    n_slots = n_slots_for(n_keys)
    slots = fill_slots(parts, n_slots)
    pos = INDEX_HEADER_SIZE
    with atomic_writer(path) as f, _Sink(f) as sink:

        def put(data: bytes) -> None:
            nonlocal pos
            sink.put(data)
            pos += len(data)

        def pad() -> None:
            if pos % 8:
                put(bytes(8 - pos % 8))

        sink.put(bytes(INDEX_HEADER_SIZE), hash=False)
        for s in range(0, n_slots, SLOT_PIECE):
            put(_probe.slots_bytes(slots, s, min(s + SLOT_PIECE, n_slots)))
        del slots
        pad()
        for p in parts:
            put(p.section("keys").astype("<i8").tobytes())
        base = 0
        for p in parts:
            put((p.section("starts")[:-1] + base).astype("<i8").tobytes())
            base += p.n_entries
        put(np.array([base], dtype="<i8").tobytes())
        for name in ("picks", "tokens", "counts"):
            if name != "picks":
                pad()
            for p in parts:
                put(p.section(name).astype("<i4").tobytes())
        header = HEADER.pack(
            MAGIC_LOOKUPDEC, INDEX_VERSION, INDEX_HEADER_SIZE, 2, 0, n_keys, n_entries, n_slots, vocab_size,
            vocab_fingerprint or bytes(8), total, pos, sink.digest(), 0,
        )  # fmt: skip
        f.seek(0)
        f.write(header)
    return IndexSummary(n_keys, n_entries, total, pos, sum(p.saturated for p in parts))
