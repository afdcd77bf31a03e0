"""Corpus sources read in slices: raw int32 token files, ``.npy`` arrays, arrays in memory."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from lookupdec._rawids import check_raw_size
from lookupdec.builder._count import IdCode
from lookupdec.errors import TokenFileError
from lookupdec.tokens import npy_layout

SCAN_BLOCK = 1 << 24
"""Tokens read per block when scanning a source for its id range."""


@dataclass(frozen=True)
class Source:
    """One corpus: a raw int32 file (``path``, ``offset`` 0), a ``.npy`` file, or an array.

    Picklable as long as it names a file, so a Dask or Spark worker can read its own slice.
    """

    name: str
    length: int
    path: str | None = None
    dtype: str = "<i4"
    offset: int = 0
    array: npt.NDArray[Any] | None = None

    @staticmethod
    def open(corpus: str | os.PathLike[str] | npt.NDArray[Any]) -> Source:
        """A source for a token file (``.bin`` raw int32, ``.npy``) or an in-memory array of ids."""
        if isinstance(corpus, np.ndarray):
            if corpus.ndim != 1 or corpus.dtype.kind not in "iu":
                raise ValueError(f"a corpus array must be one-dimensional integers, got {corpus.dtype} {corpus.shape}")
            return Source("<array>", len(corpus), array=corpus)
        name = os.fspath(corpus)
        if name.lower().endswith(".npy"):
            return _open_npy(name)
        return Source(name, check_raw_size(name) // 4, path=name)

    def read(self, start: int, stop: int) -> npt.NDArray[Any]:
        """Ids ``start .. stop - 1`` (a copy, or a view of the in-memory array)."""
        if self.array is not None:
            return self.array[start:stop]
        assert self.path is not None
        itemsize = np.dtype(self.dtype).itemsize
        data = np.fromfile(self.path, dtype=self.dtype, count=stop - start, offset=self.offset + start * itemsize)
        if len(data) != stop - start:
            raise TokenFileError(self.path, "file changed while it was read (shorter than before)")
        return data

    def id_range(self) -> tuple[int, int]:
        """Smallest and largest id (``(0, -1)`` when empty); checks ids fit in int32."""
        lo, hi = 0, -1
        for s in range(0, self.length, SCAN_BLOCK):
            block = self.read(s, min(s + SCAN_BLOCK, self.length))
            bl, bh = int(block.min()), int(block.max())
            if bl < -(2**31) or bh > 2**31 - 1:
                bad = int(np.flatnonzero((block < -(2**31)) | (block > 2**31 - 1))[0])
                raise TokenFileError(
                    self.name,
                    f"token id {int(block[bad])} (element {s + bad}) is outside the int32 range of a token id",
                    self.offset + (s + bad) * np.dtype(self.dtype).itemsize,
                )
            lo, hi = (bl, bh) if hi < lo else (min(lo, bl), max(hi, bh))
        return lo, hi

    def check_ids(self, vocab_size: int = 0) -> None:
        """TokenFileError at the first negative id, or the first id not below ``vocab_size`` (0: no bound).

        What the command line asks of a corpus (see :func:`lookupdec.tokens.check_token_ids`);
        the functions of this package accept any int32 id. One pass over the source, in blocks.
        """
        itemsize = np.dtype(self.dtype).itemsize
        for s in range(0, self.length, SCAN_BLOCK):
            block = self.read(s, min(s + SCAN_BLOCK, self.length))
            bad = block < 0
            if vocab_size:
                bad |= block >= vocab_size
            hits = np.flatnonzero(bad)
            if hits.size:
                i = int(hits[0])
                value = int(block[i])
                what = "is negative; token ids are >= 0"
                if value >= 0:
                    what = f"is not below the vocabulary size {vocab_size}"
                raw = self.path is not None and not self.name.lower().endswith(".npy")
                raise TokenFileError(
                    self.name, f"token id {value} at position {s + i} {what}", (s + i) * itemsize if raw else None
                )

    def distinct(self) -> npt.NDArray[np.int64]:
        """The sorted distinct ids."""
        seen = np.zeros(0, dtype=np.int64)
        for s in range(0, self.length, SCAN_BLOCK):
            seen = np.union1d(seen, np.unique(self.read(s, min(s + SCAN_BLOCK, self.length)).astype(np.int64)))
        return seen


def _open_npy(name: str) -> Source:
    length, dtype, offset = npy_layout(name)
    return Source(name, length, path=name, dtype=dtype.str, offset=offset)


def id_code(sources: list[Source]) -> IdCode:
    """The id code for every id of ``sources`` (the identity for ids in ``0 .. 2**21 - 1``)."""
    lo, hi = 0, -1
    for src in sources:
        slo, shi = src.id_range()
        if shi >= slo:
            lo, hi = (slo, shi) if hi < lo else (min(lo, slo), max(hi, shi))
    if hi < lo or (lo >= 0 and hi < 2**21):
        return IdCode.for_ids(max(lo, 0), max(hi, 0))
    distinct = np.zeros(0, dtype=np.int64)
    for src in sources:
        distinct = np.union1d(distinct, src.distinct())
    return IdCode.for_ids(lo, hi, distinct)
