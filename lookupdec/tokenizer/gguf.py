"""Read the key-value header of a GGUF file (vocabulary-only or a full model), never its tensors.

``gguf.GGUFReader`` builds a numpy view per array element and maps the tensor table too: ~20 s
for the 128K-token Llama 3 vocabulary on this machine. Tokenization needs only the key-value
section, which this reader walks with ``struct`` (strings) and ``numpy.frombuffer`` (numeric
arrays) over a memory map: ~0.1 s for the same file, and a multi-gigabyte model costs no more
(the tensor data after the header is never touched).

Format (little-endian; https://github.com/ggml-org/ggml/blob/master/docs/gguf.md): magic
``GGUF``, ``uint32`` version (2 or 3; version 1 used 32-bit counts), ``uint64`` tensor count,
``uint64`` key-value count, then the key-value pairs: key (``uint64`` length + UTF-8), ``uint32``
value type, value. A string is ``uint64`` length + bytes; an array is ``uint32`` item type,
``uint64`` count, items.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import struct
from typing import Any

import numpy as np

from lookupdec.errors import TokenFileError
from lookupdec.tokenizer._files import open_regular

_SCALARS: dict[int, tuple[str, int]] = {
    0: ("<B", 1),  # uint8
    1: ("<b", 1),  # int8
    2: ("<H", 2),  # uint16
    3: ("<h", 2),  # int16
    4: ("<I", 4),  # uint32
    5: ("<i", 4),  # int32
    6: ("<f", 4),  # float32
    7: ("<?", 1),  # bool
    10: ("<Q", 8),  # uint64
    11: ("<q", 8),  # int64
    12: ("<d", 8),  # float64
}
_NUMPY: dict[int, str] = {
    0: "<u1",
    1: "<i1",
    2: "<u2",
    3: "<i2",
    4: "<u4",
    5: "<i4",
    6: "<f4",
    7: "?",
    10: "<u8",
    11: "<i8",
    12: "<f8",
}
_STRING = 8
_ARRAY = 9
_MAX_DEPTH = 8
"""Deepest nesting of arrays of arrays read: a 12-byte level each, a small file could otherwise
nest thousands deep (a RecursionError, not a file error). llama.cpp's keys use none."""


class _Cursor:
    """A read position in the mapped file; every read checks the bounds (a cut file is an error, not a crash)."""

    def __init__(self, raw: mmap.mmap, buf: memoryview, name: str) -> None:
        self.raw = raw
        self.buf = buf
        self.pos = 0
        self.name = name

    def need(self, n: int) -> None:
        if n < 0 or self.pos + n > len(self.buf):
            raise TokenFileError(self.name, f"GGUF header is cut short (needs {n} bytes)", self.pos)

    def unpack(self, fmt: str, size: int) -> Any:
        self.need(size)
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return value

    def string(self) -> str:
        n = self.unpack("<Q", 8)
        self.need(n)
        raw = self.raw[self.pos : self.pos + n]
        self.pos += n
        return raw.decode("utf-8", errors="surrogateescape")

    def value(self, vtype: int, depth: int = 0) -> Any:
        """The value of type ``vtype`` at the read position; ``depth`` counts the enclosing arrays."""
        if vtype in _SCALARS:
            fmt, size = _SCALARS[vtype]
            return self.unpack(fmt, size)
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            itype = self.unpack("<I", 4)
            count = self.unpack("<Q", 8)
            if itype in _NUMPY:
                dtype = np.dtype(_NUMPY[itype])
                self.need(count * dtype.itemsize)
                arr = np.frombuffer(self.buf, dtype=dtype, count=count, offset=self.pos).copy()
                self.pos += count * dtype.itemsize
                return arr
            if itype == _STRING:
                return self._strings(count)
            if itype == _ARRAY:
                if depth + 1 >= _MAX_DEPTH:
                    raise TokenFileError(self.name, f"GGUF arrays nested more than {_MAX_DEPTH} deep", self.pos - 12)
                self.need(12 * count)  # each at least its item type and count: bounds a bad count
                return [self.value(_ARRAY, depth + 1) for _ in range(count)]
            raise TokenFileError(self.name, f"unknown GGUF array item type {itype}", self.pos)
        raise TokenFileError(self.name, f"unknown GGUF value type {vtype}", self.pos)

    def skip_strings(self, count: int) -> None:
        """Walk over ``count`` strings without decoding them (a lazily read array)."""
        mm, pos, end = self.raw, self.pos, len(self.buf)
        unpack_from = struct.unpack_from
        for _ in range(count):
            if pos + 8 > end:
                self.pos = pos
                self.need(8)
            pos += 8 + unpack_from("<Q", mm, pos)[0]
        if pos > end:
            self.need(pos - self.pos)
        self.pos = pos

    def _strings(self, count: int) -> list[str]:
        # The hot loop of reading a vocabulary (128K tokens, 280K merges): slicing the mmap
        # object itself gives bytes directly (a memoryview slice would need a bytes() copy).
        # Each string holds at least its 8-byte length: a count the file cannot hold is an error
        # here, before a list of that many is made (2**62 was a MemoryError, 2**31 took 15 GB).
        self.need(8 * count)
        mm, pos, end = self.raw, self.pos, len(self.buf)
        out: list[str] = [""] * count
        unpack_from = struct.unpack_from
        for i in range(count):
            if pos + 8 > end:
                self.pos = pos
                self.need(8)
            (n,) = unpack_from("<Q", mm, pos)
            pos += 8
            if pos + n > end:
                self.pos = pos
                self.need(n)
            raw = mm[pos : pos + n]
            pos += n
            try:
                out[i] = raw.decode("utf-8")
            except UnicodeDecodeError:
                # llama.cpp keeps such bytes as they are; Python needs a lossless stand-in.
                out[i] = raw.decode("utf-8", errors="surrogateescape")
        self.pos = pos
        return out


class LazyStrings:
    """A string array of the header left undecoded until :meth:`load` (e.g. 280K BPE merges)."""

    def __init__(self, path: str, offset: int, count: int) -> None:
        self.path = path
        self.offset = offset
        self.count = count

    def load(self) -> list[str]:
        """Decode the strings (opens the file again)."""
        with open_regular(self.path) as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            buf = memoryview(mm)
            try:
                cur = _Cursor(mm, buf, self.path)
                cur.pos = self.offset
                return cur._strings(self.count)
            finally:
                buf.release()


def read_gguf_kv(path: str | os.PathLike[str], lazy: frozenset[str] = frozenset()) -> dict[str, Any]:
    """The key-value header of the GGUF file ``path`` as a dict (numeric arrays as numpy arrays).

    String arrays under the keys in ``lazy`` are returned as :class:`LazyStrings`. The key
    ``"\0header_digest"`` holds a BLAKE2b digest of the whole header's bytes (a cache key).

    Raises :class:`TokenFileError` naming the file for anything that is not a readable GGUF
    header (bad magic, unsupported version, a cut-short file), :class:`FileNotFoundError` for a
    missing file; a fifo or a device is :class:`TokenFileError` too, before a byte is read.
    """
    name = os.fspath(path)
    with open_regular(name) as f:
        size = os.fstat(f.fileno()).st_size
        if size < 24:
            raise TokenFileError(name, f"not a GGUF file ({size} bytes is too short for a GGUF header)", 0)
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            buf = memoryview(mm)
            try:
                return _parse(mm, buf, name, lazy)
            finally:
                buf.release()


def _parse(mm: mmap.mmap, buf: memoryview, name: str, lazy: frozenset[str]) -> dict[str, Any]:
    if bytes(buf[:4]) != b"GGUF":
        raise TokenFileError(name, f"not a GGUF file (magic {bytes(buf[:4])!r}, expected b'GGUF')", 0)
    cur = _Cursor(mm, buf, name)
    cur.pos = 4
    version = cur.unpack("<I", 4)
    if version == 1:
        raise TokenFileError(name, "GGUF version 1 is not supported (llama.cpp reads versions 2 and 3)", 4)
    if version not in (2, 3):
        raise TokenFileError(
            name, f"unsupported GGUF version {version} (a big-endian file, or newer than this reader)", 4
        )
    cur.unpack("<Q", 8)  # tensor count: the tensors are never read
    n_kv = cur.unpack("<Q", 8)
    kv: dict[str, Any] = {}
    for _ in range(n_kv):
        key = cur.string()
        vtype = cur.unpack("<I", 4)
        if key in lazy and vtype == _ARRAY:
            start = cur.pos
            itype = cur.unpack("<I", 4)
            count = cur.unpack("<Q", 8)
            if itype == _STRING:
                kv[key] = LazyStrings(name, cur.pos, count)
                cur.skip_strings(count)
                continue
            cur.pos = start
        kv[key] = cur.value(vtype)
    kv["\0header_digest"] = hashlib.blake2b(mm[: cur.pos], digest_size=16).hexdigest()
    return kv
