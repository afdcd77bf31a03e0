"""Merge: a chunk's context cache into the dynamic cache, and dynamic cache files.

``merge.dynamic=<size>``: the dynamic cache is built like the replay builds it (the context
caches of the chunks before, merged one by one); each timed call merges the next chunk's
context cache into it again, so counts grow but the key set stays that of the replay.
Seconds per merge call.

``merge.files=<n>`` and friends: two dynamic cache files, each made by ``NgramCache.update``
(1..4-grams) over its own ``n``-token slice of the static corpus (written once into
``results/cache/merge/``). ``merge.files`` is the whole of ``lookupdec merge A B -o OUT``
(``lookupdec.cli.main``: for the fast path a streaming merge of the files); ``merge.cache``
is the cache path behind it, ``NgramCache.load`` of both, ``merge``, ``save`` (what a
Drafter's locked merge-on-save runs); ``merge.load`` loads one file, ``merge.save`` saves
the merged cache. Seconds per call. Peak memory of the command: ``python -m perf.merge_scale``.

    python -m perf.bench_merge --impl reference --workload fast -o merge.json
    python -m perf.bench_merge --impl fast --only merge.files,merge.cache -o merge-files.json
"""

from __future__ import annotations

import functools
import hashlib
import time
from pathlib import Path
from typing import Any

from perf._common import CACHE, N_CTX, Bench, Prepared, make_bench, size_label


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


def file_sizes(b: Bench) -> list[int]:
    """Tokens per dynamic cache file (two slices of the static corpus)."""
    wanted = [250_000, 1_000_000] if b.full else [100_000]
    return sorted({min(n, b.src.static_total // 2) for n in wanted})


def cache_files(b: Bench, n: int) -> list[Path]:
    """Two dynamic cache files: ``update`` over static-corpus tokens [0, n) and [n, 2n) (made once)."""
    tokens = b.src.static(2 * n)
    tag = hashlib.sha256(repr(tokens[:1000]).encode() + b.src.name.encode()).hexdigest()[:10]
    paths = [CACHE / "merge" / f"dynamic-{tag}-{n}-{i}.bin" for i in range(2)]
    for i, path in enumerate(paths):
        if not path.exists():  # both implementations write the same bytes: build with this one
            path.parent.mkdir(parents=True, exist_ok=True)
            part = tokens[i * n : (i + 1) * n]
            cache = b.impl.NgramCache()
            cache.update(part, len(part))
            cache.save(path)
    return paths


def prepare_files(b: Bench, n: int, what: str) -> Prepared:
    from lookupdec import cli

    impl = b.impl
    a, c = cache_files(b, n)
    out = CACHE / "merge" / f"out-{impl.IMPLEMENTATION}-{n}.bin"
    argv = ["merge", str(a), str(c), "-o", str(out), "-q", "--impl", impl.IMPLEMENTATION]
    merged = impl.NgramCache.load(a)
    merged.merge(impl.NgramCache.load(c))

    def once() -> None:
        if what == "files":
            if cli.main(argv) != 0:
                raise SystemExit(f"lookupdec {' '.join(argv)} failed")
        elif what == "cache":
            m = impl.NgramCache.load(a)
            m.merge(impl.NgramCache.load(c))
            m.save(out)
        elif what == "load":
            impl.NgramCache.load(a)
        else:
            merged.save(out)

    def time_func(loops: int) -> float:
        t0 = time.perf_counter()
        for _ in range(loops):
            once()
        return time.perf_counter() - t0

    input_mb = (a.stat().st_size + c.stat().st_size) / 1e6
    return time_func, {"input_mb": input_mb, "merged_keys": len(merged), "merged_entries": merged.n_entries}


def main() -> None:
    b = make_bench(__doc__ or "", "perf.bench_merge")
    for n in sizes(b):
        b.add(
            f"merge.dynamic={size_label(n)}",
            functools.partial(prepare, b, n),
            metadata={"concern": "merge", "dynamic_tokens": n, "n_ctx": N_CTX, "value_is": "seconds per merge"},
        )
    for n in file_sizes(b):
        for what in ("files", "cache", "load", "save"):
            name = f"merge.{what}={size_label(n)}"
            if b.impl.IMPLEMENTATION == "reference" and n > 250_000:
                b.skip(name, "the reference takes minutes per call at this size")
                continue
            b.add(
                name,
                functools.partial(prepare_files, b, n, what),
                metadata={"concern": "merge", "cache_tokens": n, "value_is": "seconds per call"},
            )


if __name__ == "__main__":
    main()
