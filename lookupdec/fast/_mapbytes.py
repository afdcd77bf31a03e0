"""A memory-mapped file seen as a ``bytes`` object, so compiled code reads it natively.

mypyc reads native integers only out of ``bytes`` (``librt.strings.read_i32_le`` compiles to
a bounds check and one load); an ``mmap`` goes through slices, one Python object per read,
which made a mapped static index slower to draft from than one copied into memory
(docs/performance-log.md, "The mapped index"). Here the file is mapped read-only, shared, right
after an anonymous page whose last bytes hold a CPython ``bytes`` object header (reference
count, type, size, hash): the object's data *is* the mapping. Nothing is copied, opening stays
O(1), only the pages drafting touches become resident and they are the page cache's, shared
with every other process mapping the file -- the properties of ``mmap``, at the speed of
``bytes``.

This leans on CPython's object layout, so :func:`supported` checks it at run time on a test
object (type, size, data offset, reference count) and refuses on anything else (PyPy,
free-threaded or debug builds, other platforms than Linux); callers then fall back to
``mmap`` slices. ``LOOKUPDEC_MAPPED_BYTES=0`` turns it off. The object is never freed by
Python: its reference count starts at 2**30, so it cannot reach 0. :meth:`MappedBytes.close`
unmaps only when no reference but the initial count is left; otherwise the mapping stays
until a later :func:`map_bytes`/``close`` finds it unreferenced (a kept reference to unmapped
memory would crash the interpreter, an extra mapping costs only address space).

As with any mapping, a file truncated or rewritten in place while mapped can raise SIGBUS;
lookupdec itself always writes a new file and renames it.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import sys
import sysconfig
import threading
from collections.abc import Callable
from typing import Final

_PAGE: Final = mmap.PAGESIZE
# Files of at least this size are mapped at an address that is a multiple of it, so the
# kernel can map the page cache's 2 MiB folios with one huge-page entry each (FilePmdMapped
# in /proc/self/smaps): fewer TLB misses on random lookups. The folios are 2 MiB where the
# file system has large folios (ext4, XFS on Linux 6.x) and the file was either written in
# 2 MiB blocks (lookupdec._atomic.BlockWriter) or read in through a MADV_HUGEPAGE mapping.
_HUGE: Final = 2 << 20
_MADV_POPULATE_READ: Final = 22  # Linux 5.14+ (asm-generic); the mmap module does not export it
_MAP_FIXED: Final = 0x10  # Linux (asm-generic); the mmap module does not export it
_MAP_FAILED: Final = ctypes.c_void_p(-1).value
_MADV_HUGEPAGE: Final = 14  # Linux; the mmap module exports it only from Python 3.12 on
# The reference count the object is born with: far from 0 and below 2**31 (CPython 3.12+
# reads the low 32 bits as signed to tell immortal objects; 3.14 keeps only 32 bits).
_BASE_REFS: Final = 1 << 30
_HEAD: Final = bytes.__basicsize__ - 1  # offset of ob_sval: the header before the data

try:
    from lookupdec.fast import _mapnative  # C, built with the compiled modules (Linux)

    _NATIVE = True
except ImportError:  # an interpreted install: ctypes maps, and prefetch uses a Python thread
    _NATIVE = False

_pending: list[MappedBytes] = []  # closed, but still referenced when closed: unmapped later
# close() and _sweep() run in whichever thread opens or closes a mapping, and every open sweeps
# _pending: without a lock two threads could both unmap one mapping (or read its reference
# count after the other unmapped it) and crash the interpreter. Reentrant: _sweep calls close.
_lock: Final = threading.RLock()


def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.restype = ctypes.c_int
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.madvise.restype = ctypes.c_int
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    libc.mprotect.restype = ctypes.c_int
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return libc


def _pages(size: int) -> int:
    """``size`` rounded up to whole pages (madvise takes page-aligned ranges)."""
    return (size + _PAGE - 1) // _PAGE * _PAGE


def _header(size: int) -> bytes:
    """The ``_HEAD`` bytes of a ``bytes`` object's header (refcount, type, size, hash) for ``size`` bytes of data."""
    words = (_BASE_REFS, id(bytes), size, -1)  # hash -1: not computed yet
    return b"".join(w.to_bytes(8, sys.byteorder, signed=True) for w in words)


def _write_header(addr: int, size: int) -> None:
    """A ``bytes`` header at ``addr``; the data follows at ``addr + _HEAD``."""
    ctypes.memmove(addr, _header(size), _HEAD)


def _as_object(addr: int) -> bytes:
    """A new reference to the object at ``addr``."""
    obj: bytes = ctypes.cast(ctypes.c_void_p(addr), ctypes.py_object).value
    return obj


def _refs(addr: int) -> int:
    return ctypes.c_ssize_t.from_address(addr).value


def _check_layout() -> bool:
    """Build a fake ``bytes`` over a ctypes buffer and check CPython sees what was written."""
    if sys.implementation.name != "cpython" or not sys.platform.startswith("linux"):
        return False
    if sysconfig.get_config_var("Py_GIL_DISABLED") or hasattr(sys, "gettotalrefcount"):
        return False  # free-threaded or debug build: another object header
    if _HEAD != 32 or ctypes.sizeof(ctypes.c_void_p) != 8:
        return False
    payload = b"lookupdec-mapped-bytes\x00"
    buf = ctypes.create_string_buffer(_HEAD + len(payload) + 1)
    addr = ctypes.addressof(buf)
    _write_header(addr, len(payload) - 1)
    ctypes.memmove(addr + _HEAD, payload, len(payload))
    obj = _as_object(addr)
    try:
        ok = (
            type(obj) is bytes
            and len(obj) == len(payload) - 1
            and obj == payload[:-1]
            and hash(obj) == hash(payload[:-1])
            and _refs(addr) == _BASE_REFS + 1
        )
    finally:
        del obj
    return ok and _refs(addr) == _BASE_REFS


_LIBC: Final = _libc()
_SUPPORTED: Final = _LIBC is not None and _check_layout()


def supported() -> bool:
    """Whether files can be mapped as ``bytes`` here (and ``LOOKUPDEC_MAPPED_BYTES`` is not ``0``)."""
    return _SUPPORTED and os.environ.get("LOOKUPDEC_MAPPED_BYTES", "1") != "0"


class MappedBytes:
    """A read-only shared mapping of a whole file (:func:`map_bytes`), or a read-only private
    copy of it (:func:`copy_bytes`), exposed as :attr:`data` (a ``bytes``)."""

    def __init__(self, base: int, length: int, start: int, size: int, data: bytes | None = None) -> None:
        self._base = base
        self._length = length
        self._start = start  # address of the file's first byte
        self.size = size
        self._obj = start - _HEAD
        self.data: bytes = _as_object(self._obj) if data is None else data
        self._job: object = None  # the native prefetch thread's job (_mapnative.start), until close

    def advise(self, advice: int) -> bool:
        """``madvise`` the file's pages (e.g. ``mmap.MADV_WILLNEED``); False if refused."""
        if _LIBC is None or not self._base:
            return False
        return bool(_LIBC.madvise(self._start, max(self.size, 1), advice) == 0)

    def prefetch(self) -> None:
        """Read the whole file into the page cache and map it, in a background thread; the
        caller does not wait. A static index calls it on its first lookup, a corpus when opened.

        ``MADV_POPULATE_READ`` (Linux 5.14+) reads in every page not cached yet and maps them
        all into this process. A file not cached yet is then read in 2 MiB folios (the
        mapping is ``MADV_HUGEPAGE``, see :func:`map_bytes`) and mapped with huge pages;
        ``MADV_WILLNEED``'s readahead would cache much of it in small folios instead
        (22 of 30 MiB huge-mapped against 30, for a 33 MB index read cold).

        The calls are made by a native thread that never takes the GIL (the C module
        ``_mapnative``, built with the compiled modules): starting it costs one ``clone``, and
        it runs while a compiled replay holds the GIL. It works in 4 MiB chunks, and
        :meth:`close` stops it after the chunk in progress. Without that module (an
        interpreted install) a Python thread makes one ``madvise`` over the whole file; its
        start is waited for (it needs the GIL until ctypes releases it, and a compiled replay
        would hold the GIL throughout). Where the advice is refused (an older kernel) either
        thread falls back to ``MADV_WILLNEED``; ``LOOKUPDEC_POPULATE=0`` makes opening call
        that one instead.
        """
        if _LIBC is None or not self._base or self._job is not None:
            return
        if os.environ.get("LOOKUPDEC_POPULATE", "1") == "0":
            self._readahead()
            return
        if _NATIVE:
            self._job = _mapnative.start(self._start, _pages(self.size))
            if self._job is not None:
                return

        def run() -> None:
            # Nothing between start() and the call that would give the GIL away.
            if not self.populate():
                self._readahead()

        # start() returns once the thread runs, and the thread keeps the GIL until the
        # madvise call releases it (microseconds later, well inside the 5 ms switch interval).
        threading.Thread(target=run, name="lookupdec-prefetch", daemon=True).start()

    def prefetched(self) -> bool | None:
        """Whether the native prefetch thread has stopped; None if none was started (or it was cancelled)."""
        return None if self._job is None or not _NATIVE else bool(_mapnative.finished(self._job))

    def populate(self) -> bool:
        """Map every page of the file into this process now (``MADV_POPULATE_READ``), reading
        those not cached yet; True if done, False if refused (an older kernel, another OS).

        A :meth:`close` meanwhile is ordered after it or ends it early, by the kernel; one
        that comes first makes the call fail (the range is no longer mapped), never crash.
        """
        if _LIBC is None or not self._base:
            return False
        return bool(_LIBC.madvise(self._start, _pages(self.size), _MADV_POPULATE_READ) == 0)

    def _readahead(self) -> None:
        """``MADV_WILLNEED``: start reading the file into the page cache, not waited for."""
        advice = getattr(mmap, "MADV_WILLNEED", None)
        if advice is not None:
            self.advise(advice)

    def close(self) -> bool:
        """Drop :attr:`data`; unmap now if nothing else references it (True), else later (False).

        Safe from several threads at once (one unmaps, the others find it unmapped)."""
        with _lock:
            return self._close()

    def _close(self) -> bool:
        if self._job is not None and _NATIVE:
            _mapnative.cancel(self._job)  # before munmap, which would wait for the whole file
            self._job = None
        if not self._base:
            return True
        self.data = b""
        if _refs(self._obj) != _BASE_REFS:
            if self not in _pending:
                _pending.append(self)
            return False
        if _NATIVE:
            _mapnative.unmap(self._base, self._length)
        else:
            assert _LIBC is not None
            _LIBC.munmap(self._base, self._length)
        self._base = 0
        if self in _pending:
            _pending.remove(self)
        return True


def _sweep() -> None:
    """Unmap the closed mappings that nothing references any more."""
    with _lock:
        for m in list(_pending):
            m.close()


def _reserve(size: int) -> tuple[int, int, int]:
    """Anonymous read-write memory for a ``size``-byte ``bytes``: (base, length, data start).

    One header page, the data, and at least one byte more (zero) for the NUL that ``bytes``
    data always ends with, with room to align the data's start (to 2 MiB from that size up).
    Untouched reserved pages cost address space only.
    """
    assert _LIBC is not None
    align = _HUGE if size >= _HUGE else _PAGE
    length = _PAGE + (size + 1 + _PAGE - 1) // _PAGE * _PAGE + (align - _PAGE)
    rw = mmap.PROT_READ | mmap.PROT_WRITE
    base = _LIBC.mmap(None, length, rw, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
    if base is None or base == _MAP_FAILED:
        e = ctypes.get_errno()
        raise OSError(e, f"mmap of {length} anonymous bytes: {os.strerror(e)}")
    return base, length, (base + _PAGE + align - 1) // align * align


def map_bytes(fd: int, size: int) -> MappedBytes | None:
    """Map the ``size``-byte file open as ``fd`` as a ``bytes``; None when not :func:`supported`.

    Raises ``OSError`` when the kernel refuses the mapping.
    """
    if not supported() or size <= 0:
        return None
    _sweep()
    if _NATIVE:  # the same steps as below, in C: a few system calls and no ctypes call
        base, length, start, data = _mapnative.map_file(fd, size, _header(size))
        return MappedBytes(base, length, start, size, data)
    assert _LIBC is not None
    base, length, start = _reserve(size)  # then the file mapped over the data's pages
    got = _LIBC.mmap(start, size, mmap.PROT_READ, mmap.MAP_SHARED | _MAP_FIXED, fd, 0)
    if got != start:
        e = ctypes.get_errno()
        _LIBC.munmap(base, length)
        raise OSError(e, f"mmap of the file ({size} bytes): {os.strerror(e)}")
    if size >= _HUGE:
        # Pages read in through this mapping come in 2 MiB folios (a hint: refused is fine).
        _LIBC.madvise(start, _pages(size), _MADV_HUGEPAGE)
    _write_header(start - _HEAD, size)
    return MappedBytes(base, length, start, size)


def _filled(size: int, fill: Callable[[memoryview], int]) -> MappedBytes:
    """Reserved memory in huge pages, ``fill``-ed (it returns how many bytes it wrote), then
    made read-only; the ``bytes`` is that many bytes long."""
    assert _LIBC is not None
    base, length, start = _reserve(size)
    try:
        if size >= _HUGE:
            _LIBC.madvise(start, _pages(size), _MADV_HUGEPAGE)  # a hint: refused is fine
        view = memoryview((ctypes.c_char * size).from_address(start)).cast("B")
        try:
            done = fill(view)
        finally:
            view.release()
        _LIBC.mprotect(start, _pages(size), mmap.PROT_READ)
    except BaseException:
        _LIBC.munmap(base, length)
        raise
    _write_header(start - _HEAD, done)
    return MappedBytes(base, length, start, done)


def copy_bytes(fd: int, size: int) -> MappedBytes | None:
    """Read the ``size``-byte file open as ``fd`` into private memory seen as a ``bytes``; None
    when not :func:`supported`. The ``in_memory`` open of an index or a corpus file.

    Unlike the ``bytes`` of ``read()`` (malloc'd, in 4 KiB pages), the memory is asked for in
    transparent huge pages (``MADV_HUGEPAGE``; the kernel's default ``madvise`` mode gives them
    only when asked, and a 2 MiB-aligned start lets each be used): random lookups across a big
    file then miss the TLB far less. The data pages are made read-only once filled, like the
    file's mapping. :attr:`MappedBytes.size` is the number of bytes read: less than ``size`` if
    the file shrank meanwhile (the caller refuses it). ``OSError`` if the kernel refuses the
    memory or the read fails.
    """
    if not supported() or size <= 0:
        return None
    _sweep()

    def read(view: memoryview) -> int:
        done = 0
        while done < size:
            got = os.preadv(fd, [view[done:]], done)
            if got <= 0:
                break
            done += got
        return done

    return _filled(size, read)


def huge_copy(data: bytes) -> MappedBytes | None:
    """``data`` copied into huge pages like :func:`copy_bytes` (None when not :func:`supported`,
    or for data below 2 MiB, which would gain nothing): for a file's bytes built in memory."""
    if not supported() or len(data) < _HUGE:
        return None
    _sweep()

    def copy(view: memoryview) -> int:
        view[:] = data
        return len(data)

    return _filled(len(data), copy)


def read_whole(fd: int, size: int, path: str) -> tuple[bytes, MappedBytes | None]:
    """The ``size``-byte file open as ``fd`` read into memory, for an ``in_memory`` open:
    (its bytes, the :class:`MappedBytes` holding them, to close with the index), in huge pages
    by :func:`copy_bytes` where supported, else ``FileIO.readall`` (None): one buffer of the
    file's size (a buffered reader's ``read()`` after the header would join what it buffered to
    the rest: a second full copy, twice the file in peak RSS, 617 against 313 MB for a 303 MB
    index). ``CacheFormatError`` naming ``path`` if the file changed size meanwhile.
    """
    import io

    from lookupdec.errors import CacheFormatError

    copy = copy_bytes(fd, size)
    if copy is not None:
        data = copy.data
    else:
        with io.FileIO(fd, closefd=False) as raw:
            raw.seek(0)
            data = raw.readall()
    if len(data) != size:
        n = len(data)
        if copy is not None:
            data = b""  # the copy's last reference but the view's: close() unmaps it
            copy.close()
        raise CacheFormatError(path, f"file changed size while being read ({size} -> {n} bytes)")
    return data, copy
