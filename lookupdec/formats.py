"""Cache file formats: detection by magic, and readers shared by both implementations.

Formats:
- ``llama``: llama.cpp's legacy record stream (no header; spec 7);
- ``fork-v1`` / ``fork-v2``: the optimized fork's constmap static files (spec 11.1, 11.2);
- ``lookupdec``: lookupdec's own static index (docs/static-index.md).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from lookupdec.errors import CacheFormatError

FORMATS = ("lookupdec", "llama", "fork-v1", "fork-v2")
MAGIC_FORK_V1 = b"ggngcmap"
MAGIC_FORK_V2 = b"ggngcmp2"
MAGIC_LOOKUPDEC = b"LKDCIDX\x00"


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


def read_as_contents(path: str | os.PathLike[str]) -> Iterator[tuple[tuple[int, int, int, int], list[tuple[int, int]]]]:
    """Every (key, followers) of a non-legacy cache file."""
    fmt = detect_format(path)
    raise CacheFormatError(path, f"reading the {fmt} format is not implemented yet")
