"""Static caches: open time and lookup time per format, and the memory opening adds.

Modes (see ``perf/_static.py``): ``lookupdec-mmap`` (``load_static(path)``, memory-mapped),
``lookupdec-loaded`` (``load_static(path, in_memory=True)``), ``llama`` (llama.cpp's legacy
file), ``fork-v2`` (the fork's constmap file). A mode the implementation cannot open yet is
skipped with a message. Files are written once into ``results/cache/static/``.

- ``static.open.<mode>.<size>``: seconds per open (the object is closed after each, untimed);
  metadata ``file_bytes``, ``rss_open_bytes`` (resident memory added by opening) and
  ``rss_lookup_bytes`` (after a pass of lookups).
- ``static.lookup.<mode>.<size>``: seconds per ``part(key)`` over 2-gram keys of the replay
  text (hits and misses).

    python -m perf.bench_static --impl reference --workload fast -o static.json
"""

from __future__ import annotations

import functools
import time
from typing import Any

from perf._common import Bench, Prepared, make_bench, rss_bytes, size_label, static_keys
from perf._static import MODE_FORMAT, MODES, close_static, open_static, static_file

N_KEYS = 20_000


def sizes(b: Bench) -> list[int]:
    if b.full:
        return [250_000, 500_000, 1_000_000, b.src.static_total]
    return [50_000, 250_000]


def prepare_open(b: Bench, mode: str, n: int) -> Prepared:
    impl = b.impl
    path = static_file(b.src, n, MODE_FORMAT[mode])
    keys = static_keys(b.src.replay(200_000), N_KEYS)
    rss0 = rss_bytes()
    obj = open_static(impl, path, mode)
    rss1 = rss_bytes()
    hits = sum(1 for k in keys if obj.part(k))
    rss2 = rss_bytes()
    close_static(obj)
    del obj
    md: dict[str, Any] = {
        "file_bytes": path.stat().st_size,
        "rss_open_bytes": rss1 - rss0,
        "rss_lookup_bytes": rss2 - rss0,
        "lookup_hit_pct": round(100 * hits / len(keys), 2),
    }

    def time_func(loops: int) -> float:
        total = 0.0
        for _ in range(loops):
            t0 = time.perf_counter()
            o = open_static(impl, path, mode)
            total += time.perf_counter() - t0
            close_static(o)
        return total

    return time_func, md


def prepare_lookup(b: Bench, mode: str, n: int) -> Prepared:
    impl = b.impl
    path = static_file(b.src, n, MODE_FORMAT[mode])
    keys = static_keys(b.src.replay(200_000), N_KEYS)
    obj = open_static(impl, path, mode)
    part = obj.part

    def time_func(loops: int) -> float:
        t0 = time.perf_counter()
        for _ in range(loops):
            for k in keys:
                part(k)
        return time.perf_counter() - t0

    return time_func, {"file_bytes": path.stat().st_size, "n_keys": len(keys)}


def main() -> None:
    b = make_bench(__doc__ or "", "perf.bench_static")
    for mode in MODES:
        why = None
        if mode == "lookupdec-loaded" and b.impl.IMPLEMENTATION == "reference":
            why = "the reference holds every static cache in dicts: in_memory=True is the same as lookupdec-mmap"
        for n in sizes(b):
            n = min(n, b.src.static_total)
            md = {
                "format": MODE_FORMAT[mode],
                "mode": mode,
                "static_tokens": n,
                "static_mb": round(b.src.text_mb(n), 3),
            }
            for what, prep, inner in (("open", prepare_open, None), ("lookup", prepare_lookup, N_KEYS)):
                name = f"static.{what}.{mode}.{size_label(n)}"
                if why:
                    b.skip(name, why)
                    continue
                b.add(
                    name,
                    functools.partial(prep, b, mode, n),
                    inner_loops=inner,
                    metadata={**md, "concern": f"static-{what}", "value_is": f"seconds per {what}"},
                )


if __name__ == "__main__":
    main()
