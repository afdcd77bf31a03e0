"""Create: building a static cache (all 2-grams, llama-lookup-create) from a corpus prefix.

The value is seconds per MB of corpus text (the token prefix's share of the text file; 4 bytes
per token for the synthetic corpus); metadata ``peak_rss_added_bytes`` is the peak resident
memory the build added.

    python -m perf.bench_create --impl reference --workload fast -o create.json
"""

from __future__ import annotations

import functools
import time

from perf._common import Bench, Prepared, make_bench, peak_rss_bytes, rss_bytes, size_label


def sizes(b: Bench) -> list[int]:
    if b.full:
        return [250_000, 1_000_000, b.src.static_total]
    return [100_000]


def prepare(b: Bench, n: int) -> Prepared:
    impl = b.impl
    tokens = b.src.static(n)
    mb = b.src.text_mb(len(tokens))
    rss0 = rss_bytes()
    peak0 = peak_rss_bytes()
    cache = impl.build_static(tokens)
    peak_added = max(peak_rss_bytes() - max(peak0, rss0), 0)
    keys = len(cache)
    del cache

    def time_func(loops: int) -> float:
        total = 0.0
        for _ in range(loops):
            t0 = time.perf_counter()
            c = impl.build_static(tokens)
            total += time.perf_counter() - t0
            del c
        return total / mb

    return time_func, {"peak_rss_added_bytes": peak_added, "n_keys": keys}


def main() -> None:
    b = make_bench(__doc__ or "", "perf.bench_create")
    for n in sizes(b):
        n = min(n, b.src.static_total)
        b.add(
            f"create.{size_label(n)}",
            functools.partial(prepare, b, n),
            metadata={
                "concern": "create",
                "static_tokens": n,
                "static_mb": round(b.src.text_mb(n), 3),
                "value_is": "seconds per MB of corpus text",
            },
        )


if __name__ == "__main__":
    main()
