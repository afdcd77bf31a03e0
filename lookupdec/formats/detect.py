"""Format names, magics, the canonical-contents types and :func:`detect_format` (stdlib only).

The bottom of the :mod:`lookupdec.formats` package: every other module of it, and the
reference implementation, may import this one without pulling in numpy or fastconstmap.
"""

from __future__ import annotations

import os
import stat
from typing import BinaryIO, Final

from lookupdec._atomic import file_kind
from lookupdec.errors import CacheFormatError

FORMATS = ("lookupdec", "llama", "fork-v1", "fork-v2")
"""Every format name :func:`detect_format` returns and :func:`write_static` accepts."""
MAGIC_FORK_V1 = b"ggngcmap"
MAGIC_FORK_V2 = b"ggngcmp2"
MAGIC_LOOKUPDEC = b"LKDCIDX\x00"
MAGIC_CORPUS: Final = b"LKDCCRP\x00"
"""The first 8 bytes of the hybrid policy's corpus file (``lookupdec.formats.corpus``): not a cache."""

Key = tuple[int, int, int, int]
"""A padded 4-slot n-gram key (unused slots -1)."""
Followers = list[tuple[int, int]]
"""(token, count) pairs of one key."""
ContentsItem = tuple[Key, Followers]
"""One key with its followers, as :func:`read_as_contents` yields them."""

NULL: Final = -1
"""Padding of unused key slots (llama.cpp's ``LLAMA_TOKEN_NULL``)."""


def open_regular(path: str | os.PathLike[str]) -> BinaryIO:
    """Open a cache file for reading; :class:`CacheFormatError` unless it is a regular file.

    A fifo would block ``open`` (and every read) forever and a device reads as anything, so
    the file is opened non-blocking and checked with ``fstat`` (no race with a rename)
    before a byte is read. FileNotFoundError names the file as a cache file.
    """
    fd, _ = open_regular_fd(path)
    return os.fdopen(fd, "rb")


def open_regular_fd(path: str | os.PathLike[str]) -> tuple[int, int]:
    """:func:`open_regular` as a raw descriptor, and the file's size: ``(fd, size)``; close ``fd``.

    For the openers that read only a header (``os.pread``) and map the rest: no file object.
    """
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise FileNotFoundError(2, "no such cache file", os.fspath(path)) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise CacheFormatError(
                path, f"is {file_kind(st.st_mode)}, not a regular file: a cache must be a regular file"
            )
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd, st.st_size


_CACHE_KINDS: Final = {MAGIC_LOOKUPDEC: "a lookupdec static index", MAGIC_FORK_V1: "a fork v1 static cache",
                       MAGIC_FORK_V2: "a fork v2 static cache"}  # fmt: skip
_MAGIC_KINDS: Final = {**_CACHE_KINDS, MAGIC_CORPUS: "a lookupdec corpus file"}


def detect_format(path: str | os.PathLike[str]) -> str:
    """The format of a cache file, from its first 8 bytes (legacy files have no magic).

    Raises :class:`CacheFormatError` when ``path`` is not a regular file (see :func:`open_regular`).
    """
    with open_regular(path) as f:
        head = f.read(8)
    refuse_corpus_file(path, head)
    return format_of(head)


def refuse_corpus_file(path: str | os.PathLike[str], head: bytes) -> None:
    """:class:`CacheFormatError` if ``head`` (a file's first bytes) is a corpus file's or a GGUF's magic.

    Also when the whole file (``head`` shorter than 8 bytes) is the start of a magic: a cut copy.

    ``create --corpus-out`` writes the corpus file beside the static index, and the two are
    easily swapped; read as llama.cpp's format (which has no magic) a corpus file would fail
    deep inside with an error about a record, not about the file given.
    """
    if head[:4] == b"GGUF":  # a model or vocabulary: read as llama.cpp's format, a "follower count 0"
        raise CacheFormatError(path, "a GGUF file (a model or vocabulary: --tokenizer), not an n-gram cache")
    if head[:8] == MAGIC_CORPUS:
        raise CacheFormatError(
            path,
            "a lookupdec corpus file (create --corpus-out), not an n-gram cache: it is the hybrid policy's "
            "corpus (stats --corpus, Drafter(corpus=...)); the static index is the file create wrote with -o",
        )
    if 4 <= len(head) < 8:
        # Shorter than a magic, the file is a llama.cpp cache of trailing bytes only (llama.cpp
        # reads it as empty); starting like one of the magics, it is a cut copy of that file.
        kinds = [kind for magic, kind in _MAGIC_KINDS.items() if magic.startswith(head)]
        if kinds:
            what = " or of ".join(kinds)
            raise CacheFormatError(path, f"{len(head)} bytes that begin the magic of {what}: a cut file")


def cache_kind(head: bytes) -> str | None:
    """What a file starting with ``head`` is when its magic is a cache format's (None: no magic).

    For the places that take other files (a corpus, a token file) and should name a cache
    given to them by mistake; llama.cpp's format has no magic and is not recognized.
    """
    return _CACHE_KINDS.get(head[:8])


def format_of(head: bytes) -> str:
    """The format of a cache file from its first bytes (at least 8 where it has them)."""
    magic = head[:8]
    if magic == MAGIC_FORK_V1:
        return "fork-v1"
    if magic == MAGIC_FORK_V2:
        return "fork-v2"
    if magic == MAGIC_LOOKUPDEC:
        return "lookupdec"
    return "llama"


def read_all(path: str | os.PathLike[str]) -> bytes:
    """The whole file as bytes; a regular file only (see :func:`open_regular`)."""
    with open_regular(path) as f:
        return f.read()


def refuse_empty_static(path: str | os.PathLike[str]) -> None:
    """:class:`CacheFormatError` if ``path`` is a 0-byte file: never a valid static cache.

    An empty legacy file decodes to an empty cache, which llama.cpp accepts; as a *dynamic*
    cache that is right (a new, empty one), but a 0-byte *static* cache is almost always a
    write that failed, and drafting without it would silently report poor numbers.
    """
    if os.path.getsize(path) == 0:
        raise CacheFormatError(
            path, "empty file (0 bytes) given as a static cache; a static cache is never empty (a failed write?)"
        )
