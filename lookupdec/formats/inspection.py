"""``inspect_file``: a description of any cache file, for ``lookupdec inspect``."""

from __future__ import annotations

import array
import mmap
import os
import sys
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from lookupdec.formats._tables import Table
from lookupdec.formats.corpus import read_corpus_header
from lookupdec.formats.detect import MAGIC_CORPUS, NULL, Key, detect_format, open_regular, read_all
from lookupdec.formats.fork import ForkStatic
from lookupdec.formats.index import check_starts, index_arrays, index_header, verify_index
from lookupdec.formats.legacy import decode_legacy


def _key_size(key: Sequence[int]) -> int:
    n = 4
    while n > 1 and key[n - 1] == NULL:
        n -= 1
    return n


def _top_from_table(table: Table, top: int) -> list[dict[str, Any]]:
    totals = table.key_totals()
    if len(totals) == 0:
        return []
    # Heaviest first; among equal totals the smaller key, so the answer is deterministic.
    order = np.lexsort((table.t1, table.t0, -totals))[:top]
    out = []
    for i in order.tolist():
        o, n = int(table.offs[i]), int(table.lens[i])
        followers = sorted(
            zip(table.tokens[o : o + n].tolist(), table.counts[o : o + n].tolist(), strict=True),
            key=lambda p: (-p[1], p[0]),
        )
        key = (int(table.t0[i]), int(table.t1[i]), NULL, NULL)
        out.append(_top_row(key, int(totals[i]), followers))
    return out


def _top_row(key: Key, total: int, followers_by_weight: list[tuple[int, int]]) -> dict[str, Any]:
    return {
        "key": key,
        "ngram": key[: _key_size(key)],
        "total": total,
        "n_followers": len(followers_by_weight),
        "followers": followers_by_weight[:5],
    }


def inspect_file(path: str | os.PathLike[str], *, verify: bool = False, top: int = 10) -> dict[str, Any]:
    """A description of any cache file, for ``lookupdec inspect``.

    Keys: ``path``, ``format``, ``file_size``, ``n_keys``, ``n_entries``, ``total_count``,
    ``key_sizes`` ({1..4: number of keys}), ``top`` (up to ``top`` heaviest n-grams by total
    count, each ``{"key", "ngram", "total", "n_followers", "followers"}`` with the 5 heaviest
    followers), ``verified`` (True when a full check ran and passed), ``warnings`` and
    ``details`` (format-specific header fields). A fork v1 file cannot be enumerated, so
    its ``top`` is None. ``verify=True`` runs every check the format allows (for a
    lookupdec index, the checksum too) and raises :class:`CacheFormatError` on failure;
    without it a lookupdec index is checked only as far as needed to describe it.
    """
    fmt = detect_format(path)
    out: dict[str, Any] = {"path": os.fspath(path), "format": fmt, "file_size": os.path.getsize(path)}
    caught: list[str] = []
    if fmt == "llama":
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            cache = decode_legacy(read_all(path), path, strict=verify)
        caught = [str(x.message) for x in w]
        sizes = dict.fromkeys(range(1, 5), 0)
        weights: list[tuple[int, Key, dict[int, int]]] = []
        for key, part in cache.items():
            sizes[_key_size(key)] += 1
            weights.append((sum(part.values()), key, part))
        weights.sort(key=lambda x: (-x[0], x[1]))
        out.update(
            n_keys=len(cache),
            n_entries=sum(len(part) for part in cache.values()),
            total_count=sum(x[0] for x in weights),
            key_sizes=sizes,
            top=[_top_row(k, t, sorted(p.items(), key=lambda q: (-q[1], q[0]))) for t, k, p in weights[:top]],
            verified=verify,
            details={},
        )
    elif fmt == "lookupdec":
        data = read_all(path)
        h = index_header(path, data, len(data))
        if verify:
            table = verify_index(path, data, h)
        else:
            _slots, keys, starts, _picks, tokens, counts = index_arrays(path, data, h)
            check_starts(path, h, starts)
            t1 = ((keys & 0xFFFFFFFF) ^ 0x80000000) - 0x80000000
            table = Table(keys >> 32, t1, starts[:-1], np.diff(starts), tokens, counts)
        out.update(
            n_keys=h.n_keys,
            n_entries=h.n_entries,
            total_count=int(table.counts.astype(np.int64).sum()),
            key_sizes={1: 0, 2: h.n_keys, 3: 0, 4: 0},
            top=_top_from_table(table, top),
            verified=verify,
            details={
                "version": h.version,
                "n_slots": h.n_slots,
                "vocab_size": h.vocab_size,
                "vocab_fingerprint": h.vocab_fingerprint.hex(),
                "header_total_count": h.total_count,
                "checksum": h.checksum.hex(),
            },
        )
    else:
        fs = ForkStatic(path)
        details: dict[str, Any] = {
            "map_size": fs.map_size,
            "map_magic": fs.map_magic.decode("ascii"),
            "map_hash": fs.map_hash,
        }
        rows: list[dict[str, Any]] | None = None
        if fmt == "fork-v2":
            rows = _top_from_table(fs._table(), top)
        else:
            caught.append("a fork v1 file has no key table: its n-grams cannot be listed")
        out.update(
            n_keys=fs.n_keys,
            n_entries=fs.n_entries,
            total_count=fs.total_count(),
            key_sizes={1: 0, 2: fs.n_keys, 3: 0, 4: 0},
            top=rows,
            verified=fmt == "fork-v2",  # building a v2 table checks everything the format allows
            details=details,
        )
    out["warnings"] = caught
    return out


def _legacy_max_token(data: bytes) -> int:
    """The largest id in a legacy file's keys and followers (-1 if none), vectorized.

    Records have variable length, so only their starts are found in Python (one step per
    record, reading one int); the ids are then gathered with numpy. A record cut short ends
    the walk: the loader reports the error with its offset.
    """
    n_words = len(data) // 4
    words = np.frombuffer(data, dtype="<i4", count=n_words)
    # Walked through a memoryview (no copy; an index gives a Python int, several times cheaper
    # than a numpy scalar). A list of the words would cost ~36 bytes per word.
    counts_at: Sequence[int]
    if sys.byteorder == "little":
        counts_at = memoryview(data)[: 4 * n_words].cast("i")
    else:
        counts_at = array.array("i", data[: 4 * n_words])
        counts_at.byteswap()
    starts: list[int] = []
    i = 0
    while i + 5 <= n_words:
        k = counts_at[i + 4]
        if k <= 0 or i + 5 + 2 * k > n_words:
            break
        starts.append(i)
        i += 5 + 2 * k
    if not starts:
        return -1
    s = np.asarray(starts, dtype=np.int64)
    top = int(words[s[:, None] + np.arange(4)].max())
    k_arr = words[s + 4].astype(np.int64)
    first = np.repeat(s + 5, k_arr)
    within = np.arange(len(first), dtype=np.int64) - np.repeat(np.cumsum(k_arr) - k_arr, k_arr)
    return max(top, int(words[first + 2 * within].max()))


def max_token_id(path: str | os.PathLike[str]) -> int:
    """The largest token id a cache file of any format holds, in its keys and followers, or a corpus
    file in its ids (-1 if none; the corpus's -1 between documents count as ids).

    Used to refuse a cache made with another (larger) vocabulary when the vocabulary is known:
    an id at or past ``n_vocab`` would draft a token the model does not have. A fork v1 file
    has no key table: only its followers are read.
    """
    with open_regular(path) as f:
        corpus = f.read(8) == MAGIC_CORPUS
    if corpus:  # the hybrid policy's corpus file: its ids, after the header
        ch = read_corpus_header(path)
        with open_regular(path) as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            ids = np.frombuffer(mapped, dtype="<i4", count=ch.n_tokens, offset=ch.ids_offset)
            top = int(ids.max()) if len(ids) else -1
            del ids  # a view into the mapping: it cannot close while it lives
            return top
    fmt = detect_format(path)
    if fmt == "lookupdec":
        # Mapped, not read: an index can be gigabytes, and only its keys and followers are read
        # (pages of the page cache, shared, not a private copy).
        with open_regular(path) as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            h = index_header(path, mapped, len(mapped))
            keys = np.frombuffer(mapped, dtype="<i8", count=h.n_keys, offset=h.keys_offset)
            tokens = np.frombuffer(mapped, dtype="<i4", count=h.n_entries, offset=h.tokens_offset)
            top = -1
            if len(keys):
                low = (keys & 0xFFFFFFFF).astype(np.uint32).view(np.int32)  # the second token, signed
                top = int(max((keys >> 32).max(), low.max(), tokens.max() if len(tokens) else -1))
            del keys, tokens  # views into the mapping: it cannot close while they live
            return top
    data = read_all(path)
    if fmt == "llama":
        return _legacy_max_token(data)
    fork = ForkStatic(path)
    followers, _ = fork._entries()
    top = int(followers.max()) if len(followers) else -1
    if fmt == "fork-v2":
        table = fork._table()
        if len(table.t0):
            top = max(top, int(table.t0.max()), int(table.t1.max()))
    return top
