"""Save into a cache file that several processes share, without losing anyone's counts.

A plain ``NgramCache.save`` overwrites the file, as llama.cpp's ``common_ngram_cache_save``
does: two processes that each load, add and save lose one another's additions. Here a process
keeps only what it added since its last save, and :func:`merge_into_file` adds that to what is
on disk *now*, under an exclusive ``fcntl.flock`` on a sidecar ``PATH.lock`` file, then writes
the result atomically (temporary file, rename). The sidecar is never removed: removing it would
let a waiting process lock an unlinked inode while a third creates a new one.

Standard library only: both implementations use it with their own cache class.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any, Protocol, TypeVar


class MergeableCache(Protocol):
    """What :func:`merge_into_file` needs of a cache: add another one, write itself."""

    def merge(self, other: Any, /) -> None:
        """Add every count of ``other``."""

    def save(self, path: str | os.PathLike[str], /) -> None:
        """Write the cache in llama.cpp's legacy format."""


C = TypeVar("C", bound=MergeableCache)


def lock_path(path: str | os.PathLike[str]) -> str:
    """The sidecar lock file of ``path``: ``PATH.lock`` next to it."""
    return os.fspath(path) + ".lock"


@contextlib.contextmanager
def exclusive_lock(path: str | os.PathLike[str]) -> Iterator[None]:
    """Hold an exclusive advisory lock for ``path`` (on ``PATH.lock``) while the block runs.

    The lock is ``flock``'s: it is released when the block ends or the process dies, and it
    only excludes other lookupdec savers (llama.cpp itself takes no lock).
    """
    try:
        import fcntl
    except ImportError as e:  # pragma: no cover - Windows
        raise OSError(f"{os.fspath(path)}: a locked save needs fcntl.flock (POSIX)") from e
    sidecar = lock_path(path)
    try:
        fd = os.open(sidecar, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as e:
        raise OSError(e.errno, f"{sidecar}: cannot open the lock file: {e.strerror}") from e
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the flock


def merge_into_file(
    path: str | os.PathLike[str], added: MergeableCache, load: Callable[[str], C], empty: Callable[[], C]
) -> C:
    """Add ``added`` to the cache stored at ``path`` under the lock; return what was written.

    ``load`` reads a cache file, ``empty`` makes an empty cache (a missing or 0-byte file is an
    empty cache, as llama.cpp reads it). Counts past 2^31-1 saturate in the save, with one
    warning naming the file.
    """
    target = os.fspath(path)
    with exclusive_lock(target):
        on_disk = load(target) if os.path.exists(target) and os.path.getsize(target) > 0 else empty()
        on_disk.merge(added)
        on_disk.save(target)
    return on_disk
