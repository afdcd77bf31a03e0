"""llama.cpp's legacy cache format (spec 7): a pure-Python (stdlib only) reader and writer.

A legacy file is a sequence of records, with no header and no record count::

    key: 4 x int32 (unused slots -1) | ntokens: int32 > 0 | ntokens x (token: int32, count: int32 > 0)

all little-endian. Record and follower order are not canonical (hash-map order upstream);
lookupdec writes keys and followers ascending, which llama.cpp reads like any other order.

This module knows bytes and dicts, never a cache class: each implementation builds its own
cache from what :func:`decode_legacy` returns. It imports only the standard library (and the
stdlib-only :mod:`lookupdec.formats.detect`), so the reference may use it.
"""

from __future__ import annotations

import array
import os
import struct
import sys
import warnings
from collections.abc import Iterable, Sequence

from lookupdec._atomic import atomic_writer
from lookupdec.errors import CacheFormatError, warn_saturated
from lookupdec.formats.detect import Key
from lookupdec.rules import INT32_MAX

_KEY = struct.Struct("<4i")
_I32 = struct.Struct("<i")
_PAIR = struct.Struct("<ii")


def decode_legacy(data: bytes, path: str | os.PathLike[str], *, strict: bool = False) -> dict[Key, dict[int, int]]:
    """Decode the bytes of a legacy cache file into ``{key: {token: count}}`` in file order.

    ``path`` is only used in error messages. Where llama.cpp aborts (a record cut after its
    key, ``ntokens <= 0``, ``count <= 0``) this raises :class:`CacheFormatError` with the
    byte offset. Fewer than 16 trailing bytes are ignored with a warning, as llama.cpp
    silently does, unless ``strict`` (the fork's behaviour), which raises. Like llama.cpp,
    the first record of a repeated key and the first count of a repeated follower win.
    """
    store: dict[Key, dict[int, int]] = {}
    size = len(data)
    offset = 0
    while size - offset >= _KEY.size:
        key: Key = _KEY.unpack_from(data, offset)
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
        warnings.warn(f"{os.fspath(path)}: {message} at byte offset {offset}; ignored as llama.cpp does", stacklevel=3)
    return store


def encode_legacy(contents: Iterable[tuple[Sequence[int], Sequence[tuple[int, int]]]]) -> bytes:
    """The legacy-format bytes of ``contents`` ((key, [(token, count), ...]) in the order given).

    Pass canonical contents (keys and followers ascending) to get lookupdec's canonical file.
    Counts above 2^31-1 are written as 2^31-1 (see :func:`encode_legacy_saturating`).
    """
    return encode_legacy_saturating(contents)[0]


def encode_legacy_saturating(
    contents: Iterable[tuple[Sequence[int], Sequence[tuple[int, int]]]],
) -> tuple[bytes, int]:
    """The legacy-format bytes of ``contents`` and how many counts were capped at 2^31-1.

    Merged counts can pass what the format holds (int32); every writer saturates them, so a
    shared dynamic cache can always be saved.
    """
    # One flat int32 array, packed at once: a struct call per pair made large caches slow.
    words = array.array("i")
    n_saturated = 0
    for key, followers in contents:
        words.extend(key)
        words.append(len(followers))
        for token, count in followers:
            if count > INT32_MAX:
                count = INT32_MAX
                n_saturated += 1
            words.append(token)
            words.append(count)
    if sys.byteorder != "little":
        words.byteswap()
    return words.tobytes(), n_saturated


def write_legacy(
    contents: Iterable[tuple[Sequence[int], Sequence[tuple[int, int]]]], path: str | os.PathLike[str]
) -> None:
    """Write ``contents`` to ``path`` in the legacy format, atomically; counts past 2^31-1 saturate
    with one :class:`~lookupdec.errors.CountSaturationWarning` naming ``path``."""
    data, n_saturated = encode_legacy_saturating(contents)
    with atomic_writer(path) as f:
        f.write(data)
    # warn -> warn_saturated -> write_legacy -> NgramCache.save -> the user's call
    warn_saturated(path, n_saturated, stacklevel=3)
