"""Building static indexes from corpora of any size: bounded memory, every core, or a cluster.

:func:`create_index` counts every 2-gram of token corpora into a lookupdec static index
(docs/static-index.md) within a memory budget, spilling sorted runs to a temporary folder,
on a pool of processes; the file is byte-identical for any budget and worker count.
:func:`merge_indexes` adds lookupdec indexes together the same way. The steps are plain
functions (:func:`count_shard`, :func:`reduce_bucket`, :func:`write_index`) so that Dask
(:mod:`lookupdec.builder.dask`, extra ``lookupdec[dask]``), Spark or Ray can run them.
"""

from __future__ import annotations

from lookupdec.builder._count import IdCode, Part, count_shard, reduce_bucket
from lookupdec.builder._create import (
    Plan,
    Shard,
    create_index,
    default_memory,
    default_workers,
    make_plan,
    parse_memory,
)
from lookupdec.builder._merge import merge_indexes
from lookupdec.builder._sources import Source
from lookupdec.builder._write import IndexSummary, MemoryPart, StoredPart, write_index

__all__ = [
    "IdCode",
    "IndexSummary",
    "MemoryPart",
    "Part",
    "Plan",
    "Shard",
    "Source",
    "StoredPart",
    "count_shard",
    "create_index",
    "default_memory",
    "default_workers",
    "make_plan",
    "merge_indexes",
    "parse_memory",
    "reduce_bucket",
    "write_index",
]
