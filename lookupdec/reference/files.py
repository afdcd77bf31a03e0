"""Cache files for the reference implementation: llama.cpp's legacy format (spec 7).

A legacy file is a sequence of records, with no header and no record count::

    key: 4 x int32 (unused slots -1) | ntokens: int32 > 0 | ntokens x (token: int32, count: int32 > 0)

all little-endian. Record and follower order are not canonical (hash-map order upstream);
lookupdec writes keys and followers ascending, which llama.cpp reads like any other order.
"""

from __future__ import annotations

import array
import os
import struct
import sys
import warnings

from lookupdec._atomic import atomic_writer
from lookupdec.errors import CacheFormatError
from lookupdec.formats import detect_format
from lookupdec.reference.cache import NgramCache
from lookupdec.reference.draft import PartSource

_KEY = struct.Struct("<4i")
_I32 = struct.Struct("<i")
_PAIR = struct.Struct("<ii")


def _read_bytes(path: str | os.PathLike[str]) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def parse_legacy(data: bytes, path: str | os.PathLike[str], *, strict: bool = False) -> NgramCache:
    """Decode the bytes of a legacy cache file; ``path`` is only used in error messages.

    Where llama.cpp aborts (a record cut after its key, ``ntokens <= 0``, ``count <= 0``)
    this raises :class:`CacheFormatError` with the byte offset. Fewer than 16 trailing
    bytes are ignored with a warning, as llama.cpp silently does, unless ``strict`` (the
    fork's behaviour), which raises. Like llama.cpp, the first record of a repeated key
    and the first count of a repeated follower win.
    """
    cache = NgramCache()
    store = cache._map  # the reference builds its own dicts directly
    size = len(data)
    offset = 0
    while size - offset >= _KEY.size:
        key = _KEY.unpack_from(data, offset)
        offset += _KEY.size
        if size - offset < _I32.size:
            raise CacheFormatError(path, "record cut short: the follower count (ntokens) is missing", offset)
        (ntokens,) = _I32.unpack_from(data, offset)
        if ntokens <= 0:
            raise CacheFormatError(path, f"record has ntokens = {ntokens}, must be > 0", offset)
        offset += _I32.size
        if size - offset < ntokens * _PAIR.size:
            raise CacheFormatError(
                path,
                f"record cut short: ntokens = {ntokens} needs {ntokens * _PAIR.size} bytes, {size - offset} left",
                offset,
            )
        part: dict[int, int] = {}
        for _ in range(ntokens):
            token, count = _PAIR.unpack_from(data, offset)
            if count <= 0:
                raise CacheFormatError(path, f"follower {token} has count {count}, must be > 0", offset + 4)
            part.setdefault(token, count)  # a repeated follower: the first count wins
            offset += _PAIR.size
        if key not in store:  # a repeated key: the first record wins (map emplace)
            store[key] = part
    if offset != size:
        message = f"{size - offset} trailing bytes, too few for a record"
        if strict:
            raise CacheFormatError(path, message, offset)
        warnings.warn(f"{os.fspath(path)}: {message} at byte offset {offset}; ignored as llama.cpp does", stacklevel=2)
    return cache


def encode_legacy(cache: NgramCache) -> bytes:
    """The legacy-format bytes of ``cache``, keys and followers ascending."""
    # One flat int32 array, packed at once: a struct call per pair made large caches slow.
    words = array.array("i")
    for key, followers in cache.contents():
        words.extend(key)
        words.append(len(followers))
        for pair in followers:
            words.extend(pair)
    if sys.byteorder != "little":
        words.byteswap()
    return words.tobytes()


def save_legacy(cache: NgramCache, path: str | os.PathLike[str]) -> None:
    """Write ``cache`` to ``path`` in the legacy format, atomically."""
    data = encode_legacy(cache)
    with atomic_writer(path) as f:
        f.write(data)


def load_cache(path: str | os.PathLike[str], *, strict: bool = False) -> NgramCache:
    """Read a cache file of any supported format into a :class:`NgramCache`."""
    fmt = detect_format(path)
    if fmt == "llama":
        return parse_legacy(_read_bytes(path), path, strict=strict)
    from lookupdec.formats import read_as_contents

    return NgramCache.from_contents(read_as_contents(path))


def load_static(path: str | os.PathLike[str], *, in_memory: bool = False, strict: bool = False) -> PartSource:
    """Open a static cache of any format for drafting.

    The reference always reads the whole file into dicts (``in_memory`` is accepted for
    API parity with :mod:`lookupdec.fast` and has no effect), except fork v1 files, which
    hold no key table and can only be looked up through their constmap.
    """
    del in_memory  # the reference has only one way to hold a cache
    if detect_format(path) == "fork-v1":
        from lookupdec.formats import ForkStatic

        return ForkStatic(path)
    return load_cache(path, strict=strict)
