"""Cache files for the reference implementation: llama.cpp's legacy format (spec 7).

The bytes are read and written by :mod:`lookupdec.formats.legacy`, a pure-Python (stdlib
only) codec; this module turns them into a reference :class:`NgramCache` and back. The
reference reads only that format: the fork's files and the lookupdec index need numpy and
fastconstmap, so for them the layer above converts canonical contents, e.g.
``NgramCache.from_contents(lookupdec.formats.read_as_contents(path))``, or opens a fork v1
file with ``lookupdec.formats.ForkStatic(path)`` (any object with ``part(key)`` drafts).
"""

from __future__ import annotations

import os

from lookupdec.errors import CacheFormatError
from lookupdec.formats.detect import detect_format, refuse_empty_static
from lookupdec.formats.legacy import decode_legacy
from lookupdec.reference.cache import NgramCache
from lookupdec.reference.draft import PartSource


def parse_legacy(data: bytes, path: str | os.PathLike[str], *, strict: bool = False) -> NgramCache:
    """Decode the bytes of a legacy cache file; ``path`` is only used in error messages.

    Where llama.cpp aborts (a record cut after its key, ``ntokens <= 0``, ``count <= 0``)
    this raises :class:`CacheFormatError` with the byte offset. Fewer than 16 trailing
    bytes are ignored with a warning, as llama.cpp silently does, unless ``strict`` (the
    fork's behaviour), which raises. Like llama.cpp, the first record of a repeated key
    and the first count of a repeated follower win.
    """
    cache = NgramCache()
    cache._map = decode_legacy(data, path, strict=strict)  # the reference's own dicts, as decoded
    return cache


def load_static(
    path: str | os.PathLike[str], *, in_memory: bool = False, strict: bool = False, verify: bool = False
) -> PartSource:
    """Open a legacy static cache for drafting (the whole file is read into dicts).

    ``in_memory`` is accepted for API parity with :mod:`lookupdec.fast` and has no effect.
    Other formats raise :class:`CacheFormatError` saying how to convert them: a fork v1
    file (no key table) is opened with ``lookupdec.formats.ForkStatic(path)``, the others
    through ``NgramCache.from_contents(lookupdec.formats.read_as_contents(path))``.
    ``verify`` reads strictly (trailing bytes are an error; the whole file is decoded
    anyway). A 0-byte file is an error: a static cache is never empty (a failed write?).
    """
    del in_memory  # the reference has only one way to hold a cache
    if detect_format(path) == "fork-v1":
        raise CacheFormatError(
            path,
            "a fork-v1 file: the pure-Python reference reads only llama.cpp's legacy format; "
            "open it with lookupdec.formats.ForkStatic(path)",
        )
    refuse_empty_static(path)
    return NgramCache.load(path, strict=strict or verify)
