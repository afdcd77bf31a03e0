"""Merge: adding a chunk's context cache into the dynamic cache (after every replay chunk).

The dynamic cache is built like the replay builds it (the context caches of the chunks before,
merged one by one); each timed call merges the next chunk's context cache into it again, so
counts grow but the key set stays that of the replay. Seconds per merge call.

    python -m perf.bench_merge --impl reference --workload fast -o merge.json
"""

from __future__ import annotations

import functools
import time
from typing import Any

from perf._common import N_CTX, Bench, Prepared, make_bench, size_label


def sizes(b: Bench) -> list[int]:
    """Dynamic-cache sizes in tokens (whole chunks, leaving one chunk of the replay text for the context)."""
    wanted = [16 * N_CTX, 64 * N_CTX] if b.full else [4 * N_CTX]
    most = (b.src.replay_total // N_CTX - 1) * N_CTX
    return sorted({min(n, most) for n in wanted})


def chunk_cache(impl: Any, tokens: list[int]) -> Any:
    cache = impl.NgramCache()
    cache.update(tokens, len(tokens), 1, 4)
    return cache


def prepare(b: Bench, n: int) -> Prepared:
    impl = b.impl
    tokens = b.src.replay(n + N_CTX)
    dynamic = impl.NgramCache()
    for i in range(0, n, N_CTX):
        dynamic.merge(chunk_cache(impl, tokens[i : i + N_CTX]))
    if len(tokens) < n + N_CTX:
        raise SystemExit(f"merge: the replay text has {len(tokens)} tokens, {n + N_CTX} are needed")
    context = chunk_cache(impl, tokens[n : n + N_CTX])

    def time_func(loops: int) -> float:
        t0 = time.perf_counter()
        for _ in range(loops):
            dynamic.merge(context)
        return time.perf_counter() - t0

    return time_func, {"dynamic_keys": len(dynamic), "context_keys": len(context)}


def main() -> None:
    b = make_bench(__doc__ or "", "perf.bench_merge")
    for n in sizes(b):
        b.add(
            f"merge.dynamic={size_label(n)}",
            functools.partial(prepare, b, n),
            metadata={"concern": "merge", "dynamic_tokens": n, "n_ctx": N_CTX, "value_is": "seconds per merge"},
        )


if __name__ == "__main__":
    main()
