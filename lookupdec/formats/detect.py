"""Format names, magics, the canonical-contents types and :func:`detect_format` (stdlib only).

The bottom of the :mod:`lookupdec.formats` package: every other module of it, and the
reference implementation, may import this one without pulling in numpy or fastconstmap.
"""

from __future__ import annotations

import os
from typing import Final

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

INT32_MIN: Final = -(2**31)
INT32_MAX: Final = 2**31 - 1
NULL: Final = -1
"""Padding of unused key slots (llama.cpp's ``LLAMA_TOKEN_NULL``)."""


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


def read_all(path: str | os.PathLike[str]) -> bytes:
    """The whole file as bytes; FileNotFoundError names it as a cache file."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise FileNotFoundError(f"{os.fspath(path)}: no such cache file") from None
