"""Any format as canonical contents, and canonical contents into any format."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping, Sequence

import numpy as np

from lookupdec.formats._tables import Table, check_unique_keys, collect
from lookupdec.formats.detect import FORMATS, ContentsItem, detect_format, read_all
from lookupdec.formats.fork import ForkStatic, write_fork
from lookupdec.formats.index import index_header, verify_index, write_index
from lookupdec.formats.legacy import decode_legacy, write_legacy


def read_as_contents(path: str | os.PathLike[str]) -> Iterator[ContentsItem]:
    """Every (key, followers) of a cache file, validated first (the whole file is checked).

    ``fork-v2``: from its key table, in file order; ``lookupdec``: keys ascending, after a
    full :meth:`LookupdecIndexReader.verify`; ``llama``: the legacy reader's canonical
    contents. A ``fork-v1`` file has no key table and raises :class:`CacheFormatError`.
    """
    fmt = detect_format(path)
    if fmt == "llama":
        store = decode_legacy(read_all(path), path)
        return iter([(key, sorted(store[key].items())) for key in sorted(store)])
    if fmt == "lookupdec":
        data = read_all(path)
        h = index_header(path, data, len(data))
        return verify_index(path, data, h).iter_contents()
    return ForkStatic(path).contents()


def write_static(
    contents: Iterable[tuple[Sequence[int], Iterable[tuple[int, int]] | Mapping[int, int]]],
    path: str | os.PathLike[str],
    format: str = "lookupdec",
    *,
    vocab_size: int = 0,
    vocab_fingerprint: bytes = b"",
) -> None:
    """Write a static cache (2-gram keys only) to ``path`` in ``format``, atomically.

    ``contents`` yields (key, followers) with followers as (token, count) pairs or a
    ``{token: count}`` mapping; keys must be padded 2-grams ``(t0, t1, -1, -1)``, unique,
    with at least one follower, tokens int32, counts 1..2**31-1, no follower listed twice.
    Anything else raises ``ValueError`` (before the target is touched).

    - ``lookupdec``: docs/static-index.md, keys sorted, with ``vocab_size`` and
      ``vocab_fingerprint`` (8 bytes, or empty for unknown) in the header and a checksum;
    - ``llama``: the legacy format via :func:`lookupdec.formats.legacy.write_legacy`, keys and followers ascending;
    - ``fork-v2`` / ``fork-v1``: spec 11.2 / 11.1, keys in the order given (the fork writes
      first-insertion order: pass ``cache.items()`` of a cache built from the corpus to
      reproduce its files byte for byte), each run sorted by token.

    The vocabulary arguments are ignored by the formats that have no place for them.
    """
    if format not in FORMATS:
        raise ValueError(f"unknown format {format!r}: choose one of {', '.join(FORMATS)}")
    if vocab_fingerprint and len(vocab_fingerprint) != 8:
        raise ValueError(f"vocab_fingerprint must be 8 bytes (or empty), got {len(vocab_fingerprint)}")
    if not 0 <= vocab_size < 2**64:
        raise ValueError(f"vocab_size must fit in u64, got {vocab_size}")
    t0, t1, starts, tokens, counts = collect(contents)
    check_unique_keys(t0, t1)
    if format == "llama":
        table = Table(t0, t1, starts[:-1], np.diff(starts), tokens, counts)
        write_legacy(sorted(table.iter_contents()), path)
    elif format == "lookupdec":
        write_index(path, t0, t1, starts, tokens, counts, vocab_size, vocab_fingerprint or bytes(8))
    else:
        write_fork(path, format, t0, t1, starts, tokens, counts)
