"""Writing a lookupdec static index (docs/static-index.md) from its parts, streaming.

The parts (contiguous key ranges, in key order) may be in memory or spilled to files; the
writer holds one section of one part at a time, plus the slot table (4 bytes per slot,
at most 16 bytes per distinct 2-gram), which the canonical layout needs whole because
linear probing inserts every key in ordinal order.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import queue
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np

from lookupdec._atomic import atomic_writer
from lookupdec.builder import _probe
from lookupdec.builder._count import I64, Part
from lookupdec.formats import INDEX_HEADER_SIZE
from lookupdec.formats.index_header import pack_index_header

HASH_MULT = np.uint64(0x9E3779B97F4A7C15)
SLOT_PIECE = 1 << 20
"""Slots converted to bytes per call (bounds the copy)."""
SECTIONS = (("keys", "<i8", 0), ("starts", "<i8", 1), ("picks", "<i4", 0), ("tokens", "<i4", 0), ("counts", "<i4", 0))
"""Each section of a part: name, dtype, extra elements (starts has n_keys + 1)."""


@contextlib.contextmanager
def spill_folder(prefix: str, tmpdir: str | os.PathLike[str] | None = None) -> Iterator[str]:
    """A temporary folder under ``tmpdir`` (default: ``$TMPDIR``) for spills, removed at the end.

    A write there that fails without naming a file (a full disk: numpy's and a file object's
    ``write`` raise ``OSError`` with no filename) is raised again naming the folder's parent,
    with what chooses another, instead of a bare "[Errno 28] No space left on device".
    """
    with tempfile.TemporaryDirectory(prefix=prefix, dir=tmpdir) as folder:
        try:
            yield folder
        except OSError as e:
            # Only the errors of a full disk or quota: one with no filename may also come from
            # reading an input, which is not this folder's fault.
            full = e.errno in (errno.ENOSPC, errno.EDQUOT)
            if not full or (e.filename is not None and not os.fspath(e.filename).startswith(folder + os.sep)):
                raise
            parent = os.path.dirname(folder)
            reason = f"{e.strerror or e} in lookupdec's temporary folder ({os.path.basename(folder)})"
            hint = "set TMPDIR (tmpdir= in Python) to a folder with more room, or raise --memory to spill less"
            raise OSError(e.errno, f"{reason}: {hint}", parent) from None


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


def home_slots(parts: Sequence[AnyPart], n_slots: int) -> Iterator[I64]:
    """The home slot of every key (docs/static-index.md "Hash"), part by part in ordinal order."""
    bits = n_slots.bit_length() - 1
    for p in parts:
        keys = p.section("keys")
        homes = (keys.view(np.uint64) * HASH_MULT) >> np.uint64(64 - bits)
        yield homes.astype(np.int64)


def fill_slots(home_chunks: Iterable[I64], n_slots: int) -> Any:
    """The slot table in memory: keys inserted in ordinal order by linear probing from their home."""
    slots = _probe.empty_slots(n_slots)
    ordinal = 0
    for homes in home_chunks:
        _probe.insert_keys(slots, homes.astype("<i8").tobytes(), ordinal)
        ordinal += len(homes)
    return slots


MIN_RANGE = 1 << 16
"""Smallest slot range of a ranged slot table (tiny budgets still make few files)."""


def slot_ranges(n_slots: int, memory: int | None) -> int:
    """How many ranges the slot table is filled in: 1 when it fits ``memory`` / 2, else a power of two.

    A range holds its slots (4 bytes each) and, while it is filled, the homes and ordinals of
    its keys twice (32 bytes per key, at most half a key per slot): 20 bytes per slot.
    """
    ranges = 1
    if memory is None:
        return ranges
    while (n_slots // ranges) * 20 > memory // 2 and n_slots // ranges > MIN_RANGE:
        ranges *= 2
    return ranges


def fill_slots_ranged(home_chunks: Iterable[I64], n_slots: int, n_ranges: int, folder: str) -> str:
    """The slot table, filled range by range within bounded memory: the path of its file (i32 LE).

    ``home_chunks`` give the home slot of every key in ordinal order. The keys are first
    spilled per range as (home, ordinal); then each range is filled in ordinal order, the keys
    that run past its end carried into the next range (merged by ordinal with that range's
    own keys), exactly as one table filled key by key. Keys that run past the last slot wrap
    to slot 0: ranges 0, 1, ... are filled again with them until a range's carry no longer
    changes.
    """
    size = n_slots // n_ranges
    shift = size.bit_length() - 1
    paths = [os.path.join(folder, f"slots-{r}") for r in range(n_ranges)]
    files = [open(p, "wb") for p in paths]  # noqa: SIM115 - closed below
    try:
        ordinal = 0
        for homes in home_chunks:
            ords = np.arange(ordinal, ordinal + len(homes), dtype=np.int64)
            ordinal += len(homes)
            rng = homes >> shift
            order = np.argsort(rng, kind="stable")
            cuts = np.searchsorted(rng[order], np.arange(n_ranges + 1))
            pairs = np.stack((homes[order], ords[order]), axis=1).astype("<i8")
            for r in np.flatnonzero(np.diff(cuts)).tolist():
                files[r].write(pairs[cuts[r] : cuts[r + 1]].tobytes())
    finally:
        for f in files:
            f.close()
    table = os.path.join(folder, "slots")
    with open(table, "wb") as t:
        t.truncate(4 * n_slots)  # every range is written below

    def fill(r: int, carry: bytes) -> bytes:
        pairs = np.fromfile(paths[r], dtype="<i8").reshape(-1, 2)
        if carry:
            carried = np.frombuffer(carry, dtype="<i8")
            ords = np.concatenate((carried, pairs[:, 1]))
            homes = np.concatenate((np.full(len(carried), r * size, dtype=np.int64), pairs[:, 0]))
            order = np.argsort(ords, kind="stable")
            pairs = np.stack((homes[order], ords[order]), axis=1).astype("<i8")
            del ords, homes, order
        # The compiled probe reads bytes: convert one column at a time, then drop the pairs.
        homes_b = pairs[:, 0].tobytes()
        ords_b = pairs[:, 1].tobytes()
        del pairs
        slots = _probe.empty_slots(size)
        out = _probe.insert_range(slots, r * size, homes_b, ords_b)
        del homes_b, ords_b
        with open(table, "r+b") as t:
            t.seek(4 * r * size)
            for s in range(0, size, SLOT_PIECE):
                t.write(_probe.slots_bytes(slots, s, min(s + SLOT_PIECE, size)))
        return out

    carry_in = [b""] * n_ranges
    carry_out = [b""] * n_ranges
    for r in range(n_ranges):
        carry_out[r] = fill(r, carry_in[r])
        if r + 1 < n_ranges:
            carry_in[r + 1] = carry_out[r]
    r, carry = 0, carry_out[-1]
    while carry != carry_in[r]:
        carry_in[r] = carry
        new = fill(r, carry)
        if new == carry_out[r]:
            break
        carry_out[r] = new
        r, carry = (r + 1) % n_ranges, new
    for p in paths:
        os.unlink(p)
    return table


class _Sink:
    """Writes and hashes the body in two background threads, so both overlap with the numpy work.

    hashlib and file writes release the GIL on large buffers; queues of a few blocks keep
    the memory in flight bounded. :meth:`digest` waits for both threads.
    """

    DEPTH = 2

    def __init__(self, f: BinaryIO) -> None:
        self.hasher = hashlib.blake2b(digest_size=8)
        self.queues: list[queue.Queue[bytes | memoryview | None]] = [queue.Queue(self.DEPTH), queue.Queue(self.DEPTH)]
        self.errors: list[BaseException] = []
        self.threads = [
            threading.Thread(target=self._run, args=(self.queues[0], f.write), daemon=True),
            threading.Thread(target=self._run, args=(self.queues[1], self.hasher.update), daemon=True),
        ]
        for t in self.threads:
            t.start()

    def _run(self, q: queue.Queue[bytes | memoryview | None], consume: Callable[[bytes | memoryview], object]) -> None:
        while (data := q.get()) is not None:
            if not self.errors:
                try:
                    consume(data)
                except BaseException as e:  # re-raised by the main thread in _join
                    self.errors.append(e)

    def put(self, data: bytes | memoryview, hash: bool = True) -> None:
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
    path: str | os.PathLike[str],
    parts: Sequence[AnyPart],
    *,
    vocab_size: int = 0,
    vocab_fingerprint: bytes = b"",
    memory: int | None = None,
    tmpdir: str | os.PathLike[str] | None = None,
) -> IndexSummary:
    """Write the index of ``parts`` (key ranges in ascending order) to ``path``, atomically.

    The slot table is built in memory, or, when it does not fit half of ``memory`` bytes,
    range by range through a temporary folder under ``tmpdir`` (:func:`fill_slots_ranged`).
    """
    if vocab_fingerprint and len(vocab_fingerprint) != 8:
        raise ValueError(f"vocab_fingerprint must be 8 bytes (or empty), got {len(vocab_fingerprint)}")
    n_slots = n_slots_for(sum(p.n_keys for p in parts))
    n_ranges = slot_ranges(n_slots, memory)
    with spill_folder("lookupdec-slots-", tmpdir) as folder:
        if n_ranges == 1:
            pieces: Iterator[bytes] = _pieces_in_memory(parts, n_slots)
        else:
            table = fill_slots_ranged(home_slots(parts, n_slots), n_slots, n_ranges, folder)
            pieces = _read_pieces(table, 4 * SLOT_PIECE)
        return _write(path, parts, pieces, n_slots, vocab_size, vocab_fingerprint or bytes(8))


def _pieces_in_memory(parts: Sequence[AnyPart], n_slots: int) -> Iterator[bytes]:
    slots = fill_slots(home_slots(parts, n_slots), n_slots)
    for s in range(0, n_slots, SLOT_PIECE):
        yield _probe.slots_bytes(slots, s, min(s + SLOT_PIECE, n_slots))


def _raw(arr: Any, dtype: str) -> memoryview:
    """The bytes of ``arr`` as ``dtype``, without a copy when it already is (the usual case)."""
    # An ndarray is a buffer; numpy's stubs do not say so.
    return memoryview(np.ascontiguousarray(arr, dtype=dtype)).cast("B")  # type: ignore[arg-type]


def _read_pieces(path: str, size: int) -> Iterator[bytes]:
    with open(path, "rb") as f:
        while piece := f.read(size):
            yield piece


def _write(
    path: str | os.PathLike[str],
    parts: Sequence[AnyPart],
    slot_pieces: Iterator[bytes],
    n_slots: int,
    vocab_size: int,
    vocab_fingerprint: bytes,
) -> IndexSummary:
    n_keys = sum(p.n_keys for p in parts)
    n_entries = sum(p.n_entries for p in parts)
    total = sum(p.total for p in parts)
    pos = INDEX_HEADER_SIZE
    with atomic_writer(path) as f, _Sink(f) as sink:

        def put(data: bytes | memoryview) -> None:
            nonlocal pos
            sink.put(data)
            pos += len(data)

        def pad() -> None:
            if pos % 8:
                put(bytes(8 - pos % 8))

        sink.put(bytes(INDEX_HEADER_SIZE), hash=False)
        for piece in slot_pieces:
            put(piece)
        pad()
        for p in parts:
            put(_raw(p.section("keys"), "<i8"))
        base = 0
        for p in parts:
            put(_raw(p.section("starts")[:-1] + base, "<i8"))
            base += p.n_entries
        put(np.array([base], dtype="<i8").tobytes())
        for name in ("picks", "tokens", "counts"):
            if name != "picks":
                pad()
            for p in parts:
                put(_raw(p.section(name), "<i4"))
        header = pack_index_header(n_keys, n_entries, n_slots, vocab_size, vocab_fingerprint, total, pos, sink.digest())
        f.seek(0)
        f.write(header)
    return IndexSummary(n_keys, n_entries, total, pos, sum(p.saturated for p in parts))
