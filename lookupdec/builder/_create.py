"""``create`` in bounded memory on every core: count shards, spill buckets, reduce, write.

1. **Plan.** The corpora are cut into shards of ``shard_tokens`` ids; each shard carries the
   last two ids of the shard before it (same corpus). The packed-triple space is cut into
   buckets (contiguous key ranges, from quantiles of a sample of the corpus) so that each
   bucket can be reduced within a worker's share of the memory budget.
2. **Count** (in parallel): each shard is packed, sorted and counted
   (:func:`~lookupdec.builder._count.count_shard`); its sorted run is cut at the bucket
   boundaries and spilled, one file per shard.
3. **Reduce** (in parallel): each bucket's runs are merged and turned into its part of the
   index (:func:`~lookupdec.builder._count.reduce_bucket`), spilled, one file per bucket.
4. **Write**: the slot table, then each section streamed part by part
   (:func:`~lookupdec.builder._write.write_index`).

When the whole corpus fits in the budget, steps 2-3 run in this process with nothing
spilled. The result depends only on the corpora: byte-identical for any budget and
worker count.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from lookupdec._signals import worker_signals
from lookupdec.builder._count import (
    GUESS_BITS,
    I64,
    IdCode,
    Part,
    count_packed,
    count_shard,
    merge_runs,
    pack_from,
    parts_from_run,
    reduce_bucket,
)
from lookupdec.builder._sources import Source, id_code
from lookupdec.builder._write import AnyPart, IndexSummary, MemoryPart, StoredPart, spill_folder, write_index
from lookupdec.errors import IdsOutOfRange

Progress = Callable[[int, int], None]
Corpus = str | os.PathLike[str] | npt.NDArray[Any]

BYTES_PER_TOKEN = 48
"""Peak bytes per corpus token while counting a slice in memory (ids, packed triples, counts)."""
BYTES_PER_ENTRY = 72
"""Peak bytes per run entry while reducing a bucket (merge order, sums, the part's arrays)."""
SAMPLE_WINDOWS = 4096
SAMPLE_WINDOW = 64
MIN_SHARD = 1 << 12
SLOW_PIECES = 1 << 17
"""Spill pieces (shards times buckets) above which a create warns that its budget makes it slow."""
FAST_PIECES = 1 << 15
"""Spill pieces the budget a slow create's warning suggests would give."""


def parse_memory(text: str) -> int:
    """Bytes of a size such as ``512M``, ``2G``, ``1.5g``, ``800K`` or ``1000000`` (powers of 1024)."""
    s = text.strip().upper().removesuffix("B")
    scale = 1
    if s and s[-1] in "KMGT":
        scale = 1024 ** ("KMGT".index(s[-1]) + 1)
        s = s[:-1]
    try:
        value = float(s)
    except ValueError:
        raise ValueError(f"not a memory size: {text!r} (examples: 512M, 2G, 1.5G)") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"memory size must be positive, got {text!r}")
    return int(value * scale)


def default_memory() -> int:
    """Default budget: a quarter of the machine's physical memory, at most 2 GiB, at least 256 MiB.

    2 GiB keeps corpora up to about 40M tokens in memory (no spill, fastest) and bigger ones
    below the C++ fork's own peak memory.
    """
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - platforms without sysconf
        ram = 4 << 30
    return max(256 << 20, min(ram // 4, 2 << 30))


def default_workers() -> int:
    """Every core this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - macOS, Windows
        return os.cpu_count() or 1


@dataclass(frozen=True)
class Shard:
    """Ids ``start .. stop - 1`` of source ``source``, read from ``max(start - 2, 0)`` (the carry)."""

    source: int
    start: int
    stop: int

    def read(self, sources: Sequence[Source]) -> npt.NDArray[Any]:
        """The shard's ids with the two carried ids in front (none at a corpus's start)."""
        return sources[self.source].read(max(self.start - 2, 0), self.stop)


@dataclass(frozen=True)
class Plan:
    """How a create runs: shards, bucket boundaries (packed values), and whether it spills."""

    sources: list[Source]
    code: IdCode
    shards: list[Shard]
    splitters: I64
    spill: bool

    @property
    def n_tokens(self) -> int:
        """Ids in every corpus together."""
        return sum(s.length for s in self.sources)


def make_plan(
    sources: list[Source], memory: int, workers: int, *, force_spill: bool = False, code: IdCode | None = None
) -> Plan:
    """Shards and buckets for ``sources`` within ``memory`` bytes shared by ``workers`` processes.

    Nothing spills when everything fits in ``memory`` (unless ``force_spill``, for a cluster).
    ``code`` defaults to the one :func:`~lookupdec.builder._sources.id_code` finds by reading
    every id once; :func:`create_index` passes ``IdCode(GUESS_BITS)`` instead and falls back to
    the scan only if a count meets an id outside ``0 .. 2**21 - 1``.
    """
    code = code or id_code(sources)
    n = sum(s.length for s in sources)
    if n * BYTES_PER_TOKEN <= memory and not force_spill:
        shards = [Shard(i, 0, s.length) for i, s in enumerate(sources) if s.length > 2]
        return Plan(sources, code, shards, np.zeros(0, dtype=np.int64), False)
    per_worker = memory // max(workers, 1)
    shard_tokens = max(MIN_SHARD, per_worker // BYTES_PER_TOKEN)
    shards = [
        Shard(i, start, min(start + shard_tokens, s.length))
        for i, s in enumerate(sources)
        for start in range(0, s.length, shard_tokens)
        if min(start + shard_tokens, s.length) > 2
    ]
    n_buckets = max(workers, math.ceil(n * BYTES_PER_ENTRY / max(per_worker, 1)))
    if len(shards) * n_buckets > SLOW_PIECES:
        # Every shard spills a piece per bucket and every bucket reads one back per shard: the
        # pieces grow as (tokens / budget) squared, and tiny ones make the run crawl.
        fast_enough = workers * n * math.sqrt(BYTES_PER_TOKEN * BYTES_PER_ENTRY / FAST_PIECES)
        warnings.warn(
            f"a memory budget of {memory / 2**20:.3g} MiB for {n:,} tokens cuts them into "
            f"{len(shards):,} shards x {n_buckets:,} buckets of spill pieces, which is slow; "
            f"{math.ceil(fast_enough / 2**20):,} MiB or more (--memory) is faster and gives the same file",
            stacklevel=2,
        )
    return Plan(sources, code, shards, sample_splitters(sources, code, n_buckets), True)


def sample_splitters(sources: Sequence[Source], code: IdCode, n_buckets: int) -> I64:
    """Bucket boundaries: quantiles of the keys of windows spread evenly over the corpora."""
    n = sum(s.length for s in sources)
    keys: list[I64] = []
    for src in sources:
        k = max(1, SAMPLE_WINDOWS * src.length // max(n, 1))
        for start in np.linspace(0, max(src.length - SAMPLE_WINDOW, 0), k).astype(np.int64).tolist():
            c = code.encode(src.read(start, min(start + SAMPLE_WINDOW, src.length)))
            if len(c) >= 2:
                keys.append((c[:-1] << code.bits) | c[1:])
    if not keys or n_buckets <= 1:
        return np.zeros(0, dtype=np.int64)
    sample = np.sort(np.concatenate(keys))
    cuts = np.unique(sample[(np.arange(1, n_buckets) * len(sample)) // n_buckets])
    # A bucket starts at the first triple of its first key: a key never straddles two buckets.
    result: I64 = cuts[cuts > sample[0]] << code.bits
    return result


# --------------------------------------------------------------------------------------
# steps run by the workers (module-level so that a process pool can call them)

_STATE: dict[str, Any] = {}


def _count_task(args: tuple[int, Shard, str]) -> tuple[int, list[tuple[int, int]]]:
    """Count one shard and spill its buckets to ``<dir>/s<i>``: returns per-bucket lengths."""
    i, shard, folder = args
    plan: Plan = _STATE["plan"]
    runs = count_shard(shard.read(plan.sources), plan.code, plan.splitters)
    lengths = []
    with open(os.path.join(folder, f"s{i}"), "wb") as f:
        for u, c in runs:
            f.write(u.astype("<i8").tobytes())
            f.write(c.astype("<i8").tobytes())
            lengths.append((len(u), len(c)))
    return shard.stop - shard.start, lengths


def _reduce_task(args: tuple[int, str, list[list[tuple[int, int]]]]) -> StoredPart:
    """Reduce bucket ``b`` from every shard's spill file; spill its part to ``<dir>/p<b>``."""
    b, folder, lengths = args
    plan: Plan = _STATE["plan"]
    runs = []
    for i, shard_lengths in enumerate(lengths):
        offset = 16 * sum(n for n, _ in shard_lengths[:b])
        n = shard_lengths[b][0]
        if n == 0:
            continue
        path = os.path.join(folder, f"s{i}")
        u = np.fromfile(path, dtype="<i8", count=n, offset=offset)
        c = np.fromfile(path, dtype="<i8", count=n, offset=offset + 8 * n)
        runs.append((u, c))
    part = reduce_bucket(runs, plan.code)
    return StoredPart.save(part, os.path.join(folder, f"p{b}"))


def _imap(fn: Callable[[Any], Any], tasks: Sequence[Any], workers: int, plan: Plan) -> Iterator[Any]:
    """``fn`` over ``tasks`` in order: in this process, or a forked pool sharing ``plan``."""
    _STATE["plan"] = plan
    if workers <= 1 or len(tasks) <= 1:
        yield from map(fn, tasks)
        return
    methods = multiprocessing.get_all_start_methods()
    # fork shares the plan (and in-memory corpora) without pickling them.
    ctx = multiprocessing.get_context("fork" if "fork" in methods else None)
    with ctx.Pool(min(workers, len(tasks)), initializer=_set_state, initargs=(plan,)) as pool:
        yield from pool.imap(fn, tasks)


def _set_state(plan: Plan) -> None:
    worker_signals()  # Ctrl-C is the parent's to handle: no traceback from every worker
    _STATE["plan"] = plan


# --------------------------------------------------------------------------------------


def count_in_memory(plan: Plan, progress: Progress | None = None) -> list[Part]:
    """Steps 2-3 in this process, nothing spilled: the index parts in key order."""
    runs = []
    done = 0
    for shard in plan.shards:
        runs.append(count_packed(pack_from(plan.sources[shard.source].read, shard.start, shard.stop, plan.code)))
        done += shard.stop - shard.start
        if progress is not None:
            progress(done, plan.n_tokens)
    u, c = merge_runs(runs)
    del runs
    return parts_from_run(u, c, plan.code)


def count_spilled(plan: Plan, folder: str, workers: int, progress: Progress | None = None) -> list[AnyPart]:
    """Steps 2-3 with spills to ``folder``, ``workers`` processes: the index parts in key order."""
    n_buckets = len(plan.splitters) + 1
    t0 = time.perf_counter()
    lengths: list[list[tuple[int, int]]] = []
    done = 0
    total = 2 * plan.n_tokens
    for n_done, shard_lengths in _imap(_count_task, [(i, s, folder) for i, s in enumerate(plan.shards)], workers, plan):
        lengths.append(shard_lengths)
        done += n_done
        if progress is not None:
            progress(done, total)
    _trace("count shards", t0)
    parts: list[AnyPart] = []
    for b, part in enumerate(_imap(_reduce_task, [(b, folder, lengths) for b in range(n_buckets)], workers, plan)):
        parts.append(part)
        if progress is not None:
            progress(plan.n_tokens + plan.n_tokens * (b + 1) // n_buckets, total)
    return parts


def create_index(
    corpora: Sequence[Corpus],
    output: str | os.PathLike[str],
    *,
    memory: int | None = None,
    workers: int | None = None,
    vocab_size: int = 0,
    vocab_fingerprint: bytes = b"",
    progress: Progress | None = None,
    tmpdir: str | os.PathLike[str] | None = None,
) -> IndexSummary:
    """Build the lookupdec static index of ``corpora`` into ``output``, within ``memory`` bytes.

    ``corpora`` are raw int32 token files, ``.npy`` files or integer arrays; each is counted
    on its own (no 2-gram spans two corpora). The file is byte-identical to the one
    ``lookupdec.formats.write_static`` writes for the same counts, whatever ``memory``
    (default :func:`default_memory`) and ``workers`` (default: every core). Spills go to
    a temporary folder under ``tmpdir`` (default: the system's), removed at the end.
    Counts above ``2**31 - 1`` are clipped; the summary says how many.
    """
    kw: dict[str, Any] = {"vocab_size": vocab_size, "vocab_fingerprint": vocab_fingerprint, "progress": progress}
    memory = default_memory() if memory is None else memory
    workers = default_workers() if workers is None else max(1, workers)
    sources = [Source.open(c) for c in corpora]
    try:
        # Guess the ids' width: count without reading the whole corpus for its ids first.
        return _create(
            make_plan(sources, memory, workers, code=IdCode(GUESS_BITS)), output, memory, workers, tmpdir, **kw
        )
    except IdsOutOfRange:
        return _create(make_plan(sources, memory, workers), output, memory, workers, tmpdir, **kw)


def _trace(what: str, t0: float) -> float:
    """With ``LOOKUPDEC_BUILD_TRACE=1``, one stderr line per step: its wall time."""
    now = time.perf_counter()
    if os.environ.get("LOOKUPDEC_BUILD_TRACE") == "1":
        print(f"lookupdec.builder: {what} {now - t0:.2f} s", file=sys.stderr, flush=True)
    return now


def _create(
    plan: Plan,
    output: str | os.PathLike[str],
    memory: int,
    workers: int,
    tmpdir: str | os.PathLike[str] | None,
    *,
    vocab_size: int,
    vocab_fingerprint: bytes,
    progress: Progress | None,
) -> IndexSummary:
    t0 = time.perf_counter()
    if not plan.spill:
        parts: list[AnyPart] = [MemoryPart(p) for p in count_in_memory(plan, progress)]
        t0 = _trace("count in memory", t0)
        summary = write_index(output, parts, vocab_size=vocab_size, vocab_fingerprint=vocab_fingerprint, memory=memory)
        _trace("write", t0)
        return summary
    with spill_folder("lookupdec-create-", tmpdir) as folder:
        stored = count_spilled(plan, folder, workers, progress)
        t0 = _trace(f"count and reduce, {len(plan.shards)} shards, {len(stored)} buckets", t0)
        summary = write_index(
            output, stored, vocab_size=vocab_size, vocab_fingerprint=vocab_fingerprint, memory=memory, tmpdir=tmpdir
        )
        _trace("write", t0)
        return summary
