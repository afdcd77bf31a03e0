"""``inspect_file``: a description of any cache file, for ``lookupdec inspect``."""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from lookupdec.formats._tables import Table
from lookupdec.formats.detect import NULL, Key, detect_format, read_all
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
