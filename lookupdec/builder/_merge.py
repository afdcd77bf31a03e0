"""``merge`` of lookupdec static indexes, streaming: each input is a sorted run already.

An index lists its keys ascending by (t0, t1) and each key's followers ascending, which is
the order of packed triples, so an input read in slices of keys gives sorted runs that go
through the same buckets, reduce and writer as a create. Only the inputs' keys, starts,
tokens and counts are read (in slices); slots and picks are rebuilt. Each input is
checked as it is read (checksum, keys ascending, starts increasing, followers ascending,
counts >= 1) and nothing is written unless all of it is valid.
"""

from __future__ import annotations

import hashlib
import itertools
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from lookupdec.builder._count import I64, IdCode, merge_runs, part_from_run, split_run
from lookupdec.builder._create import BYTES_PER_ENTRY, Progress, default_memory, default_workers
from lookupdec.builder._write import AnyPart, IndexSummary, MemoryPart, spill_folder, write_index
from lookupdec.errors import CacheFormatError
from lookupdec.formats import INDEX_HEADER_SIZE, LookupdecIndexReader
from lookupdec.formats.index_header import index_header

CHECK_BLOCK = 1 << 24
"""Bytes hashed per read while checking an input's checksum."""


@dataclass(frozen=True)
class IndexInput:
    """Section offsets of one lookupdec index file (docs/static-index.md layout)."""

    path: str
    n_keys: int
    n_entries: int
    keys_at: int
    starts_at: int
    tokens_at: int
    counts_at: int

    @staticmethod
    def open(path: str) -> IndexInput:
        """Check the header (constant time) and locate the sections."""
        with LookupdecIndexReader(path):  # a regular file whose header passes every constant-time check
            pass
        with open(path, "rb") as f:  # the sections' offsets, from the format's one description of the layout
            h = index_header(path, f.read(INDEX_HEADER_SIZE), os.fstat(f.fileno()).st_size)
        return IndexInput(path, h.n_keys, h.n_entries, h.keys_offset, h.starts_offset, h.tokens_offset, h.counts_offset)

    def read(self, section: str, start: int, stop: int) -> Any:
        """Elements ``start .. stop - 1`` of ``keys``, ``starts``, ``tokens`` or ``counts``."""
        dtype = "<i8" if section in ("keys", "starts") else "<i4"
        at = getattr(self, f"{section}_at")
        size = np.dtype(dtype).itemsize
        return np.fromfile(self.path, dtype=dtype, count=stop - start, offset=at + size * start)

    def check_checksum(self) -> None:
        """Recompute the body's checksum (streamed) and compare it with the header's."""
        hasher = hashlib.blake2b(digest_size=8)
        with open(self.path, "rb") as f:
            header = f.read(96)
            while block := f.read(CHECK_BLOCK):
                hasher.update(block)
        if hasher.digest() != header[80:88]:
            raise CacheFormatError(self.path, "checksum mismatch: the file is corrupt", 80)

    def key_slices(self, keys_per_slice: int) -> list[tuple[int, int]]:
        """Key ranges of at most ``keys_per_slice`` keys covering the index."""
        step = max(1, keys_per_slice)
        return [(s, min(s + step, self.n_keys)) for s in range(0, self.n_keys, step)]

    def triples(self, start: int, stop: int) -> tuple[Any, Any, Any, Any]:
        """(t0, t1, tokens, counts) per entry of keys ``start .. stop - 1``, checked."""
        keys = self.read("keys", start, stop)
        starts = self.read("starts", start, stop + 1)
        lo, hi = int(starts[0]), int(starts[-1])
        if (start == 0 and lo != 0) or (stop == self.n_keys and hi != self.n_entries):
            raise CacheFormatError(self.path, "starts do not run from 0 to n_entries", self.starts_at)
        lens = np.diff(starts)
        if len(lens) and (int(lens.min()) <= 0 or hi > self.n_entries):
            raise CacheFormatError(self.path, "starts are not strictly increasing within n_entries", self.starts_at)
        order = keys ^ np.int64(0x80000000)
        if start > 0:
            order = np.concatenate((self.read("keys", start - 1, start) ^ np.int64(0x80000000), order))
        if len(order) > 1 and bool(np.any(order[1:] <= order[:-1])):
            raise CacheFormatError(self.path, "keys are not strictly ascending", self.keys_at)
        tokens = self.read("tokens", lo, hi)
        counts = self.read("counts", lo, hi)
        if len(counts) and int(counts.min()) < 1:
            raise CacheFormatError(self.path, "a follower count is < 1", self.counts_at)
        up = tokens[1:] > tokens[:-1]
        up[starts[1:-1] - lo - 1] = True
        if not bool(np.all(up)):
            raise CacheFormatError(self.path, "followers of a key are not strictly ascending", self.tokens_at)
        t0 = np.repeat(keys >> 32, lens)
        t1 = np.repeat(((keys & 0xFFFFFFFF) ^ 0x80000000) - 0x80000000, lens)
        return t0, t1, tokens.astype(np.int64), counts.astype(np.int64)


def _id_code(inputs: Sequence[IndexInput], keys_per_slice: int) -> IdCode:
    lo, hi = 0, -1
    for ix in inputs:
        for s, e in ix.key_slices(keys_per_slice):
            t0, t1, tok, _ = ix.triples(s, e)
            for a in (t0, t1, tok):
                if len(a):
                    lo, hi = (int(a.min()), int(a.max())) if hi < lo else (min(lo, int(a.min())), max(hi, int(a.max())))
    if hi < lo or (lo >= 0 and hi < 2**21):
        return IdCode.for_ids(max(lo, 0), max(hi, 0))
    distinct = np.zeros(0, dtype=np.int64)
    for ix in inputs:
        for s, e in ix.key_slices(keys_per_slice):
            t0, t1, tok, _ = ix.triples(s, e)
            distinct = np.union1d(distinct, np.unique(np.concatenate((t0, t1, tok))))
    return IdCode.for_ids(lo, hi, distinct)


def _packed(code: IdCode, t0: Any, t1: Any, tok: Any) -> I64:
    b = code.bits
    result: I64 = (code.encode(t0) << (2 * b)) | (code.encode(t1) << b) | code.encode(tok)
    return result


def merge_indexes(
    inputs: Sequence[str | os.PathLike[str]],
    output: str | os.PathLike[str],
    *,
    memory: int | None = None,
    workers: int | None = None,
    vocab_size: int = 0,
    vocab_fingerprint: bytes = b"",
    progress: Progress | None = None,
    tmpdir: str | os.PathLike[str] | None = None,
) -> IndexSummary:
    """Add lookupdec static indexes together into ``output``, within ``memory`` bytes.

    The same file as ``lookupdec merge`` through an in-memory cache (and as one
    :func:`~lookupdec.builder.create_index` of all their corpora), byte for byte. Counts
    above ``2**31 - 1`` are clipped; the summary says how many. ``workers`` is accepted
    for symmetry with :func:`~lookupdec.builder.create_index`; the merge runs in this
    process (it is bound by reading, not by sorting).
    """
    memory = default_memory() if memory is None else memory
    del workers  # see the docstring
    _ = default_workers
    ixs = [IndexInput.open(os.fspath(p)) for p in inputs]
    for ix in ixs:
        ix.check_checksum()
    total_entries = sum(ix.n_entries for ix in ixs)
    # Entries per slice such that a slice's arrays (about BYTES_PER_ENTRY each) fit the budget.
    entries_per_slice = max(1 << 12, memory // BYTES_PER_ENTRY)
    keys_per_slice = entries_per_slice  # keys <= entries, so a slice of keys never holds more
    code = _id_code(ixs, keys_per_slice)
    if total_entries <= entries_per_slice:
        runs = []
        for ix in ixs:
            t0, t1, tok, cnt = ix.triples(0, ix.n_keys)
            runs.append((_packed(code, t0, t1, tok), cnt))
        u, c = merge_runs(runs)
        del runs
        parts: list[AnyPart] = [MemoryPart(part_from_run(u, c, code))]
        return write_index(output, parts, vocab_size=vocab_size, vocab_fingerprint=vocab_fingerprint, memory=memory)
    return _merge_spilled(
        ixs, output, code, keys_per_slice, entries_per_slice, vocab_size, vocab_fingerprint, memory, tmpdir
    )


def _merge_spilled(
    ixs: Sequence[IndexInput],
    output: str | os.PathLike[str],
    code: IdCode,
    keys_per_slice: int,
    entries_per_slice: int,
    vocab_size: int,
    vocab_fingerprint: bytes,
    memory: int,
    tmpdir: str | os.PathLike[str] | None,
) -> IndexSummary:
    from lookupdec.builder._write import StoredPart

    total_entries = sum(ix.n_entries for ix in ixs)
    n_buckets = -(-total_entries // entries_per_slice)
    sample = []
    for ix in ixs:
        for k in np.linspace(0, max(ix.n_keys - 1, 0), min(ix.n_keys, 4096)).astype(np.int64).tolist():
            key = ix.read("keys", k, k + 1)
            t0, t1 = key >> 32, ((key & 0xFFFFFFFF) ^ 0x80000000) - 0x80000000
            sample.append(int((code.encode(t0)[0] << code.bits) | code.encode(t1)[0]))
    keys_sorted = np.sort(np.array(sample, dtype=np.int64))
    cuts = np.unique(keys_sorted[(np.arange(1, n_buckets) * len(keys_sorted)) // n_buckets])
    splitters: I64 = cuts[cuts > keys_sorted[0]] << code.bits if len(keys_sorted) else np.zeros(0, np.int64)
    with spill_folder("lookupdec-merge-", tmpdir) as folder:
        n_b = len(splitters) + 1
        files = [open(os.path.join(folder, f"b{b}"), "wb") for b in range(n_b)]  # noqa: SIM115 - closed below
        run_lengths: list[list[int]] = [[] for _ in range(n_b)]
        try:
            for ix in ixs:
                for s, e in ix.key_slices(keys_per_slice):
                    t0, t1, tok, cnt = ix.triples(s, e)
                    u = _packed(code, t0, t1, tok)
                    for b, sl in enumerate(split_run(u, splitters)):
                        if sl.stop > sl.start:
                            files[b].write(np.stack((u[sl], cnt[sl])).T.astype("<i8").tobytes())
                            run_lengths[b].append(sl.stop - sl.start)
        finally:
            for f in files:
                f.close()
        parts: list[AnyPart] = []
        for b in range(n_b):
            path = os.path.join(folder, f"b{b}")
            rows = np.fromfile(path, dtype="<i8").reshape(-1, 2)
            os.unlink(path)
            cuts = np.cumsum([0, *run_lengths[b]]).tolist()
            runs = [(rows[a:z, 0].copy(), rows[a:z, 1].copy()) for a, z in itertools.pairwise(cuts)]
            del rows
            u, c = merge_runs(runs)
            del runs
            parts.append(StoredPart.save(part_from_run(u, c, code), os.path.join(folder, f"p{b}")))
        return write_index(
            output, parts, vocab_size=vocab_size, vocab_fingerprint=vocab_fingerprint, memory=memory, tmpdir=tmpdir
        )
