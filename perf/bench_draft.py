"""Drafting: µs per drafted token over llama-lookup-stats' replay loop (spec 8.2).

One benchmark per static corpus size (``none`` = no static cache). The value pyperf stores is
``t_draft / n_drafted`` of one replay (seconds per drafted token; drafting plus context-cache
updates, as llama.cpp times it), so runs use ``--loops 1``. The worker replays once before
measuring (the warm-up), which also gives ``n_drafted`` / ``n_accept`` for the metadata.

    python -m perf.bench_draft --impl reference --workload fast -o draft.json
"""

from __future__ import annotations

import functools
from typing import Any

from perf._common import N_CTX, N_DRAFT, Bench, Prepared, make_bench, rss_bytes, size_label
from perf._static import open_static, static_file


def sizes(b: Bench) -> list[int]:
    if b.full:
        return [0, 250_000, 500_000, 1_000_000, b.src.static_total]
    return [0, 250_000, 1_000_000]


def replay_tokens(b: Bench) -> int:
    return b.src.replay_total if b.full else 3 * N_CTX + 1  # fast: three chunks


def prepare(b: Bench, n_static: int) -> Prepared:
    impl = b.impl
    tokens = b.src.replay(replay_tokens(b))
    md: dict[str, Any] = {}
    static: Any = None
    if n_static:
        rss0 = rss_bytes()
        static = open_static(impl, static_file(b.src, n_static, "lookupdec"), "lookupdec-mmap")
        md["static_source"] = "load_static(lookupdec format, memory-mapped)"
        md["static_rss_bytes"] = rss_bytes() - rss0
    warm = impl.replay(tokens, N_CTX, N_DRAFT, static)
    md.update(
        n_drafted=warm.n_drafted,
        n_accept=warm.n_accept,
        accept_pct=round(warm.accept, 4),
        n_tokens=len(tokens),
    )

    def time_func(loops: int) -> float:
        total = 0.0
        for _ in range(loops):
            r = impl.replay(tokens, N_CTX, N_DRAFT, static)
            total += r.t_draft_s / r.n_drafted
        return total

    return time_func, md


def main() -> None:
    b = make_bench(__doc__ or "", "perf.bench_draft", loops=1, warmups=0)
    for n in sizes(b):
        n = min(n, b.src.static_total)
        name = f"draft.static={size_label(n)}"
        b.add(
            name,
            functools.partial(prepare, b, n),
            metadata={
                "concern": "draft",
                "static_tokens": n,
                "static_mb": round(b.src.text_mb(n), 3),
                "replay_tokens": replay_tokens(b),
                "n_ctx": N_CTX,
                "n_draft": N_DRAFT,
                "value_is": "seconds per drafted token",
            },
        )


if __name__ == "__main__":
    main()
