"""Types of the C module ``_prefetch.c``: populate a mapped range from a native thread."""

def start(addr: int, length: int, /) -> object | None:
    """Start populating the page-aligned mapped range; the job, or None if no thread could start."""

def cancel(job: object, /) -> None:
    """Stop after the chunk in progress and let go of ``job`` (once, before unmapping)."""

def finished(job: object, /) -> bool:
    """Whether the thread of ``job`` (not yet cancelled) has stopped."""
