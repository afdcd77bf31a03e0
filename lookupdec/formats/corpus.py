"""The hybrid policy's corpus file: header, O(1) checks and reading the ids (stdlib only).

A corpus file (docs/formats.md, "The corpus file") holds a corpus's token ids together with
the suffix structure the hybrid policy matches in: the corpus's indexed positions grouped by
bigram, newest first, each with the token before its bigram, behind an open-addressing slot
table, per token, its occurrences newest first (the one-token fallback), and (version 3) each
bigram's run again in trigram order (the deep search's per-trigram runs). The fast path maps it
and reads it in place (``lookupdec.fast._corpus``); the reference reads the ids
(:func:`read_corpus_ids`) into its own readable model. Both open it through
:func:`corpus_header`, so a file one of them opens the other opens too.
"""

from __future__ import annotations

import os
import struct
import sys
from array import array
from dataclasses import dataclass
from typing import Any, Final

from lookupdec.errors import CacheFormatError
from lookupdec.formats.detect import MAGIC_CORPUS, cache_kind, open_regular
from lookupdec.rules import INT32_MAX

CORPUS_VERSION: Final = 3
"""The version of the corpus file lookupdec writes (3: the trigram section; 2: per-token runs of
occurrences; version 1 held each token's newest occurrence only)."""
READABLE_VERSIONS: Final = (2, 3)
"""The versions this module reads: a version 2 file (no trigram section) is read as it is, the
fast path's trigram search then scanning the bigram's run (slower, the same drafts)."""
CORPUS_HEADER_SIZE: Final = 96
CORPUS_HEADER: Final = struct.Struct("<8sIIIIQQQQQQ8sQ8s")
SLOT_SIZE: Final = 16
"""A slot: the bigram (i64, first token in the high half), its run's first entry and length (i32 each)."""
ENTRY_SIZE: Final = 8
"""An entry: a position (i32) and the token three places before it (i32, -1 before the start);
the trigram section's entries are the same records in another order."""
UNIGRAM_SIZE: Final = 8
"""A unigram record: a token (i32) and the first index of its run in the after section (i32)."""

assert CORPUS_HEADER.size == CORPUS_HEADER_SIZE


def align8(n: int) -> int:
    """``n`` rounded up to a multiple of 8."""
    return (n + 7) & ~7


def min_slots(n_bigrams: int) -> int:
    """The slot count a writer uses: the smallest power of two >= 2 with a load of at most 3/4."""
    n = 2
    while 3 * n < 4 * n_bigrams:
        n *= 2
    return n


@dataclass(frozen=True)
class CorpusHeader:
    """The header fields of a corpus file and the section offsets they imply."""

    version: int
    header_size: int
    flags: int
    n_after: int
    n_tokens: int
    n_bigrams: int
    n_slots: int
    n_entries: int
    n_unigrams: int
    vocab_size: int
    vocab_fingerprint: bytes
    file_size: int
    checksum: bytes

    @property
    def ids_offset(self) -> int:
        """Byte offset of the ids."""
        return CORPUS_HEADER_SIZE

    @property
    def slots_offset(self) -> int:
        """Byte offset of the slot table."""
        return align8(self.ids_offset + 4 * self.n_tokens)

    @property
    def entries_offset(self) -> int:
        """Byte offset of the entries."""
        return self.slots_offset + SLOT_SIZE * self.n_slots

    @property
    def unigrams_offset(self) -> int:
        """Byte offset of the unigram records."""
        return self.entries_offset + ENTRY_SIZE * self.n_entries

    @property
    def after_offset(self) -> int:
        """Byte offset of the after section (the positions of the unigrams' runs)."""
        return self.unigrams_offset + UNIGRAM_SIZE * self.n_unigrams

    @property
    def trigrams_offset(self) -> int:
        """Byte offset of the trigram section (version 3; in version 2 the file ends there)."""
        return align8(self.after_offset + 4 * self.n_after)

    @property
    def has_trigrams(self) -> bool:
        """Whether the file has the trigram section (version 3 and later)."""
        return self.version >= 3

    @property
    def end(self) -> int:
        """The file size the fields imply."""
        if self.has_trigrams:
            return self.trigrams_offset + ENTRY_SIZE * self.n_entries
        return self.trigrams_offset


def is_corpus_file(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` starts with the corpus file's magic (any other file: False)."""
    try:
        with open_regular(path) as f:
            return f.read(8) == MAGIC_CORPUS
    except (OSError, CacheFormatError):
        return False


def corpus_header(path: str | os.PathLike[str], head: Any, real_size: int) -> CorpusHeader:
    """Parse and check the header in constant time: magic, version, sizes that add up.

    ``head`` holds at least the first 96 bytes when ``real_size >= 96``. Every field is
    bounded before it is used, so any bytes give a :class:`CacheFormatError` naming the file,
    never an overflow. The sections' contents are checked as they are read (and in full by
    ``verify``).
    """
    if real_size < CORPUS_HEADER_SIZE:
        raise CacheFormatError(
            path, f"file of {real_size} bytes is shorter than the {CORPUS_HEADER_SIZE}-byte corpus header", real_size
        )
    f = CORPUS_HEADER.unpack_from(head, 0)
    if f[0] != MAGIC_CORPUS:
        kind = cache_kind(f[0])
        if kind is not None:  # the static index create wrote beside the corpus file, most likely
            raise CacheFormatError(
                path, f"{kind} (an n-gram cache: -lcs, Drafter(static=...)), not a corpus file (create --corpus-out)", 0
            )
        raise CacheFormatError(path, f"not a lookupdec corpus file (magic {f[0]!r})", 0)
    h = CorpusHeader(*f[1:])
    if h.version not in READABLE_VERSIONS:
        hint = ": rebuild it with lookupdec create --corpus-out" if h.version < CORPUS_VERSION else ""
        readable = " and ".join(map(str, READABLE_VERSIONS))
        raise CacheFormatError(path, f"corpus file version {h.version} is not supported (only {readable}){hint}", 8)
    if h.header_size != CORPUS_HEADER_SIZE:
        raise CacheFormatError(path, f"header_size is {h.header_size}, expected {CORPUS_HEADER_SIZE}", 12)
    if h.flags != 0:
        raise CacheFormatError(path, f"flags {h.flags} must be 0", 16)
    if h.n_tokens > INT32_MAX:
        raise CacheFormatError(path, f"n_tokens {h.n_tokens} does not fit the int32 positions", 24)
    if h.n_entries > max(h.n_tokens - 2, 0):
        raise CacheFormatError(path, f"n_entries {h.n_entries} > n_tokens - 2 = {h.n_tokens - 2}", 48)
    if h.n_bigrams > h.n_entries or (h.n_bigrams == 0) != (h.n_entries == 0):
        raise CacheFormatError(
            path, f"n_bigrams {h.n_bigrams} and n_entries {h.n_entries}: every bigram has an entry", 32
        )
    if h.n_slots < 2 or h.n_slots & (h.n_slots - 1) or 3 * h.n_slots < 4 * h.n_bigrams or h.n_slots > 1 << 32:
        raise CacheFormatError(
            path, f"n_slots {h.n_slots} is not a power of two >= 2 holding n_bigrams {h.n_bigrams} at load <= 3/4", 40
        )
    if h.n_after > max(h.n_tokens - 1, 0):
        raise CacheFormatError(path, f"n_after {h.n_after} > n_tokens - 1 = {h.n_tokens - 1}", 20)
    if h.n_unigrams > h.n_after or (h.n_unigrams == 0) != (h.n_after == 0):
        raise CacheFormatError(
            path, f"n_unigrams {h.n_unigrams} and n_after {h.n_after}: every unigram has a position", 56
        )
    if h.file_size != real_size:
        raise CacheFormatError(path, f"header says file_size {h.file_size}, the file has {real_size} bytes", 80)
    if h.end != real_size:
        raise CacheFormatError(
            path,
            f"n_tokens = {h.n_tokens}, n_slots = {h.n_slots}, n_entries = {h.n_entries}, "
            f"n_unigrams = {h.n_unigrams}, n_after = {h.n_after} need {h.end} bytes "
            f"in version {h.version}, the file has {real_size}",
        )
    return h


def read_corpus_header(path: str | os.PathLike[str]) -> CorpusHeader:
    """The checked header of the corpus file at ``path`` (reads 96 bytes)."""
    with open_regular(path) as f:
        size = os.fstat(f.fileno()).st_size
        return corpus_header(path, f.read(CORPUS_HEADER_SIZE), size)


def read_corpus_ids(path: str | os.PathLike[str]) -> list[int]:
    """The token ids of a corpus file (-1 between documents), header checked; O(n_tokens)."""
    with open_regular(path) as f:
        size = os.fstat(f.fileno()).st_size
        h = corpus_header(path, f.read(CORPUS_HEADER_SIZE), size)
        ids = array("i")
        data = f.read(4 * h.n_tokens)
        if len(data) != 4 * h.n_tokens:
            raise CacheFormatError(path, "file changed size while being read")
        ids.frombytes(data)
    if sys.byteorder != "little":
        ids.byteswap()
    out = ids.tolist()
    for i, t in enumerate(out):
        if t < -1:
            raise CacheFormatError(path, f"token id {t} < -1 (the document separator)", CORPUS_HEADER_SIZE + 4 * i)
    return out
