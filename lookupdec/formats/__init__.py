"""Cache file formats: detection, readers, writers and inspection, shared by both implementations.

One module per format, each knowing bytes and canonical contents (keys and their
(token, count) followers), never a cache class: every implementation builds its own cache
from contents (``NgramCache.from_contents``).

- :mod:`~lookupdec.formats.detect`: format names, magics, :func:`detect_format` (stdlib only);
- :mod:`~lookupdec.formats.legacy`: llama.cpp's record stream (spec 7; stdlib only, so the
  reference reads and writes it through this module);
- :mod:`~lookupdec.formats.fork`: the fork's static files v1/v2 (spec 11; numpy + fastconstmap);
- :mod:`~lookupdec.formats.index`: lookupdec's static index (``docs/static-index.md``; numpy);
- :mod:`~lookupdec.formats.contents`: :func:`read_as_contents` and :func:`write_static` for any format;
- :mod:`~lookupdec.formats.inspection`: :func:`inspect_file`.

Every malformed file raises :class:`~lookupdec.errors.CacheFormatError` naming the file
and, where there is one, the byte offset; bad arguments to a writer raise ``ValueError``.

The names below are loaded on first use (PEP 562), so that importing the stdlib-only
modules (``detect``, ``legacy``) never pulls in numpy or fastconstmap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lookupdec.formats.contents import read_as_contents, write_static
    from lookupdec.formats.detect import (
        FORMATS,
        MAGIC_FORK_V1,
        MAGIC_FORK_V2,
        MAGIC_LOOKUPDEC,
        ContentsItem,
        Followers,
        Key,
        detect_format,
    )
    from lookupdec.formats.fork import ForkStatic
    from lookupdec.formats.index import INDEX_HEADER_SIZE, INDEX_VERSION, LookupdecIndexReader
    from lookupdec.formats.inspection import inspect_file, max_token_id

_HOME = {
    "FORMATS": "detect",
    "MAGIC_CORPUS": "detect",
    "MAGIC_FORK_V1": "detect",
    "MAGIC_FORK_V2": "detect",
    "MAGIC_LOOKUPDEC": "detect",
    "ContentsItem": "detect",
    "Followers": "detect",
    "Key": "detect",
    "detect_format": "detect",
    "ForkStatic": "fork",
    "INDEX_HEADER_SIZE": "index",
    "INDEX_VERSION": "index",
    "LookupdecIndexReader": "index",
    "read_as_contents": "contents",
    "write_static": "contents",
    "inspect_file": "inspection",
    "max_token_id": "inspection",
}


def __getattr__(name: str) -> Any:
    """Load a public name from the module that defines it (PEP 562)."""
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOME])


__all__ = [
    "FORMATS",
    "INDEX_HEADER_SIZE",
    "INDEX_VERSION",
    "MAGIC_CORPUS",
    "MAGIC_FORK_V1",
    "MAGIC_FORK_V2",
    "MAGIC_LOOKUPDEC",
    "ContentsItem",
    "Followers",
    "ForkStatic",
    "Key",
    "LookupdecIndexReader",
    "detect_format",
    "inspect_file",
    "max_token_id",
    "read_as_contents",
    "write_static",
]
