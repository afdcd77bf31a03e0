"""Sharded create on a Dask cluster (``pip install 'lookupdec[dask]'``).

The cluster runs the same two plain functions as a local create: one
:func:`~lookupdec.builder.count_shard` per shard (each shard reads its own slice of a corpus
file, with the two ids before it as carry), then one
:func:`~lookupdec.builder.reduce_bucket` per bucket (a contiguous key range). This process
collects the parts in key order, spills them to a temporary folder, and writes the index
with :func:`~lookupdec.builder.write_index`: the same bytes as a local create.

Corpus files must be readable at the same path on every worker (a shared filesystem);
corpora given as arrays are sent with their shards. A worker that dies mid-job has its
tasks recomputed by Dask; if the job fails anyway, :class:`~lookupdec.errors.BuildError` is raised and no
output is written (the index is written atomically, at the end).
"""

from __future__ import annotations

import os
import tempfile
import threading
from collections.abc import Sequence
from operator import itemgetter
from typing import Any

from lookupdec.builder._count import I64, IdCode, Part, count_shard, reduce_bucket
from lookupdec.builder._create import Corpus, Progress, Shard, default_memory, make_plan
from lookupdec.builder._sources import Source
from lookupdec.builder._write import AnyPart, IndexSummary, StoredPart, write_index
from lookupdec.errors import BuildError, LookupdecError

CONNECT_TIMEOUT = 30.0
"""Seconds to reach the scheduler (Dask's own timeout)."""
HANDSHAKE_GRACE = 5.0
"""Seconds more for the scheduler to answer, once reached."""


def _client(scheduler: Any) -> tuple[Any, bool]:
    try:
        from distributed import Client
    except ImportError:
        raise BuildError("--dask needs the dask extra: pip install 'lookupdec[dask]'") from None
    if isinstance(scheduler, Client):
        return scheduler, False
    # Through Any: distributed is untyped, and may be absent when mypy runs.
    make: Any = Client
    box: dict[str, Any] = {}

    def connect() -> None:
        try:
            box["client"] = make(scheduler, timeout=f"{CONNECT_TIMEOUT:g}s")
        except BaseException as e:  # handed to the caller's thread below
            box["error"] = e

    # Client's own timeout covers reaching the address, not a service that accepts the
    # connection and never answers Dask's handshake (an HTTP server, say): there it waits
    # forever. Its thread is a daemon, so one left waiting does not keep the program alive.
    thread = threading.Thread(target=connect, name="lookupdec-dask-connect", daemon=True)
    thread.start()
    thread.join(CONNECT_TIMEOUT + HANDSHAKE_GRACE)
    if thread.is_alive():
        raise BuildError(
            f"no Dask scheduler answered at {scheduler} within {CONNECT_TIMEOUT + HANDSHAKE_GRACE:g} s "
            "(something accepted the connection: is it a Dask scheduler's address and port?)"
        )
    error = box.get("error")
    if isinstance(error, OSError):
        raise BuildError(f"cannot reach the Dask scheduler at {scheduler}: {error}") from None
    if error is not None:
        raise error
    return box["client"], True


def shard_task(source: Source, shard: Shard, code: IdCode, splitters: I64) -> list[tuple[I64, I64]]:
    """Count one shard on a worker (reads the shard's slice of ``source``): per-bucket runs."""
    return count_shard(source.read(max(shard.start - 2, 0), shard.stop), code, splitters)


def bucket_task(code: IdCode, *runs: tuple[I64, I64]) -> Part:
    """Reduce one bucket on a worker from its runs of every shard."""
    return reduce_bucket(runs, code)


def _shard_source(src: Source, shard: Shard) -> tuple[Source, Shard]:
    """What to ship for ``shard``: a file source as is, an array source cut to the shard."""
    if src.array is None:
        return src, shard
    lo = max(shard.start - 2, 0)
    piece = src.array[lo : shard.stop].copy()
    return Source(src.name, len(piece), array=piece), Shard(shard.source, shard.start - lo, shard.stop - lo)


def create_index_dask(
    corpora: Sequence[Corpus],
    output: str | os.PathLike[str],
    *,
    scheduler: Any,
    memory: int | None = None,
    vocab_size: int = 0,
    vocab_fingerprint: bytes = b"",
    progress: Progress | None = None,
    tmpdir: str | os.PathLike[str] | None = None,
) -> IndexSummary:
    """:func:`~lookupdec.builder.create_index` with the counting on a Dask cluster.

    ``scheduler`` is an address (``tcp://host:8786``) or a ``distributed.Client``;
    ``memory`` is the budget of one worker task (default :func:`default_memory`): shards
    and buckets are cut so that each task stays within it.
    """
    client, own = _client(scheduler)
    try:
        import distributed

        as_completed: Any = distributed.as_completed

        sources = [Source.open(c) for c in corpora]
        plan = make_plan(sources, default_memory() if memory is None else memory, 1, force_spill=True)
        code, splitters = plan.code, plan.splitters
        n_buckets = len(splitters) + 1
        shard_futures = []
        for shard in plan.shards:
            src, local = _shard_source(sources[shard.source], shard)
            shard_futures.append(client.submit(shard_task, src, local, code, splitters, pure=False))
        bucket_futures = []
        for b in range(n_buckets):
            pieces = [client.submit(itemgetter(b), f, pure=False) for f in shard_futures]
            bucket_futures.append(client.submit(bucket_task, code, *pieces, pure=False))
        del shard_futures
        with tempfile.TemporaryDirectory(prefix="lookupdec-dask-", dir=tmpdir) as folder:
            index = {f.key: b for b, f in enumerate(bucket_futures)}
            parts: dict[int, AnyPart] = {}
            try:
                for future in as_completed(bucket_futures):
                    b = index[future.key]
                    parts[b] = StoredPart.save(future.result(), os.path.join(folder, f"p{b}"))
                    future.release()
                    if progress is not None:
                        progress(len(parts), n_buckets)
            except LookupdecError:
                raise
            except Exception as e:  # KilledWorker, CommClosedError, a worker's MemoryError, ...
                raise BuildError(f"the Dask job failed ({type(e).__name__}: {e}); {output} was not written") from e
            return write_index(
                output,
                [parts[b] for b in range(n_buckets)],
                vocab_size=vocab_size,
                vocab_fingerprint=vocab_fingerprint,
                memory=default_memory() if memory is None else memory,
                tmpdir=tmpdir,
            )
    finally:
        if own:
            client.close()
