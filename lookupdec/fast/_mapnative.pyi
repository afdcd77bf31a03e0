"""Types of the C module ``_mapnative.c``: the native half of ``_mapbytes``."""

def map_file(fd: int, size: int, head: bytes, /) -> tuple[int, int, int, bytes]:
    """Map the ``size``-byte file open as ``fd`` read-only behind ``head`` (a ``bytes`` header):
    (reservation base, its length, the data's address, the object)."""

def unmap(base: int, length: int, /) -> None:
    """Unmap a :func:`map_file` reservation."""

def start(addr: int, length: int, /) -> object | None:
    """Start populating the page-aligned mapped range; the job, or None if no thread could start."""

def cancel(job: object, /) -> None:
    """Stop after the chunk in progress and let go of ``job`` (once, before unmapping)."""

def finished(job: object, /) -> bool:
    """Whether the thread of ``job`` (not yet cancelled) has stopped."""
