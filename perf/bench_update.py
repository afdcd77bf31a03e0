"""Context-cache update: the per-token ``update(out, nnew=1, 1, 4)`` of the replay loop, and a
bulk ``update(tokens, nnew=len(tokens), 1, 4)`` (seeding a cache with a prompt).

Values are seconds per token (inner loops = tokens per pass).

    python -m perf.bench_update --impl reference --workload fast -o update.json
"""

from __future__ import annotations

import functools
import time

from perf._common import N_CTX, Bench, Prepared, make_bench


def prepare_incremental(b: Bench) -> Prepared:
    impl = b.impl
    chunk = b.src.replay(N_CTX)

    def time_func(loops: int) -> float:
        total = 0.0
        for _ in range(loops):
            cache = impl.NgramCache()
            out = [chunk[0]]
            t0 = time.perf_counter()
            for token in chunk[1:]:
                out.append(token)
                cache.update(out, 1, 1, 4)
            total += time.perf_counter() - t0
        return total

    return time_func, {}


def prepare_bulk(b: Bench) -> Prepared:
    impl = b.impl
    chunk = b.src.replay(N_CTX)

    def time_func(loops: int) -> float:
        total = 0.0
        for _ in range(loops):
            cache = impl.NgramCache()
            t0 = time.perf_counter()
            cache.update(chunk, len(chunk), 1, 4)
            total += time.perf_counter() - t0
        return total

    return time_func, {}


def main() -> None:
    b = make_bench(__doc__ or "", "perf.bench_update")
    md = {"concern": "update", "n_tokens": N_CTX, "value_is": "seconds per token"}
    b.add("update.context", functools.partial(prepare_incremental, b), inner_loops=N_CTX - 1, metadata=md)
    b.add("update.bulk", functools.partial(prepare_bulk, b), inner_loops=N_CTX, metadata=md)


if __name__ == "__main__":
    main()
