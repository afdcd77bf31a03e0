"""The lookupdec index's header and per-lookup checks, shared by every reader (stdlib only).

Both implementations open an index through :func:`index_header` (the constant-time checks of
docs/static-index.md "On open"), so a file one of them opens the other opens too, and check
each part they look up with the same rules (:func:`check_part` here, its compiled twin in
``lookupdec.fast._index``): a corrupt file gives the same error in both, never a draft from
one and an error from the other. Nothing here checksums: opening stays O(1); ``verify()``
(in :mod:`lookupdec.formats.index`) is the one full check.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from lookupdec.errors import CacheFormatError
from lookupdec.formats.detect import MAGIC_LOOKUPDEC
from lookupdec.rules import INT32_MAX

INDEX_VERSION: Final = 1
"""The version of the lookupdec static index this module reads and writes."""
INDEX_HEADER_SIZE: Final = 96
_INDEX_HEADER: Final = struct.Struct("<8sIIIIQQQQ8sQQ8sQ")
_OFF_CHECKSUM: Final = 80
_OFF_TOTAL_COUNT: Final = 64
_OFF_FLAGS: Final = 20
_OFF_RESERVED: Final = 88

assert _INDEX_HEADER.size == INDEX_HEADER_SIZE


def _align8(n: int) -> int:
    return (n + 7) & ~7


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


def index_header(path: str | os.PathLike[str], head: Any, real_size: int) -> _IndexHeader:
    """Parse and check the header in constant time (the doc's "on open" checks).

    ``head`` holds at least the first 96 bytes when ``real_size >= 96`` (bytes or an mmap).
    Header fields are unsigned 64-bit; any value is handled (a value >= 2**63 is an error
    with the file named where it cannot be right, never an overflow). ``vocab_size``,
    ``total_count``, ``flags`` and ``reserved`` are not checked here (see ``verify``).
    """
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
    if h.n_keys > INT32_MAX:
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


def read_index_vocab(path: str | os.PathLike[str]) -> tuple[int, bytes] | None:
    """``(vocab_size, fingerprint)`` from a lookupdec index's header, or None for a file of another format.

    Reads the first bytes only, unchecked beyond the magic: the opener checks the rest.
    """
    with open(path, "rb") as file:
        head = file.read(INDEX_HEADER_SIZE)
    if len(head) < INDEX_HEADER_SIZE or head[:8] != MAGIC_LOOKUPDEC:
        return None
    fields = _INDEX_HEADER.unpack(head)
    return int(fields[8]), bytes(fields[9])


def pack_index_header(
    n_keys: int,
    n_entries: int,
    n_slots: int,
    vocab_size: int,
    vocab_fingerprint: bytes,
    total_count: int,
    file_size: int,
    checksum: bytes,
) -> bytes:
    """The 96-byte header of a lookupdec index (version :data:`INDEX_VERSION`, 2-grams, no flags):
    what every writer puts before the body it describes."""
    return _INDEX_HEADER.pack(
        MAGIC_LOOKUPDEC, INDEX_VERSION, INDEX_HEADER_SIZE, 2, 0, n_keys, n_entries, n_slots, vocab_size,
        vocab_fingerprint, total_count, file_size, checksum, 0,
    )  # fmt: skip


def spec_pick(tokens: Sequence[int], counts: Sequence[int]) -> int:
    """Spec 3.2 on one part (tokens ascending): the max-count follower, smallest id on ties, or -1."""
    best, mx, total = -1, 0, 0
    for t, c in zip(tokens, counts, strict=True):
        if c > mx:
            best, mx = t, c
        total += c
    return best if total >= 2 and 100 * mx >= 50 * total else -1


def check_part(
    path: str | os.PathLike[str], ordinal: int, tokens: Sequence[int], counts: Sequence[int], pick: int, offset: int
) -> None:
    """The per-lookup check of one part: tokens strictly ascending, counts >= 1, the stored pick right.

    Every reader runs it on a part the first time it reads it (the compiled reader has its
    own copy of these rules, ``StaticIndex._check_part``); ``offset`` is where the part's
    tokens start, for the error.
    """
    prev = None
    for t, c in zip(tokens, counts, strict=True):
        if c < 1:
            raise CacheFormatError(
                path, f"key {ordinal}: follower {t} has count {c}, must be >= 1 (run verify for a full check)", offset
            )
        if prev is not None and t <= prev:
            raise CacheFormatError(
                path, f"key {ordinal}: followers not strictly ascending (run verify for a full check)", offset
            )
        prev = t
    want = spec_pick(tokens, counts)
    if pick != want:
        raise CacheFormatError(
            path, f"key {ordinal}: stored pick {pick}, spec 3.2 gives {want} (run verify for a full check)", offset
        )
