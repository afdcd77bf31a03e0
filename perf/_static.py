"""Static cache files for the benchmarks: written once per (corpus, size, format), then reused.

Files live in ``results/cache/static/``; their contents always come from the reference's
``build_static`` (the implementations agree on contents), and they are written with
``lookupdec.formats.write_static`` (the legacy ``llama`` format falls back to the reference's
``NgramCache.save`` while ``write_static`` does not exist yet).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import re
from pathlib import Path
from types import ModuleType
from typing import Any, Final

from perf._common import CACHE, Corpus, ImplUnavailable

MODES: Final = ("lookupdec-mmap", "lookupdec-loaded", "llama", "fork-v2")
"""How a static cache is opened: lookupdec's index memory-mapped or copied into memory, llama.cpp's
legacy record stream, the fork's constmap v2 file."""
MODE_FORMAT: Final = {
    "lookupdec-mmap": "lookupdec",
    "lookupdec-loaded": "lookupdec",
    "llama": "llama",
    "fork-v2": "fork-v2",
}


def _formats_tag() -> str:
    """Changes whenever the format writers change, so stale cached files are not reused."""
    import lookupdec
    import lookupdec.formats

    src = Path(lookupdec.formats.__file__)
    digest = hashlib.sha256(src.read_bytes()).hexdigest()[:10] if src.suffix == ".py" else "bin"
    return f"{lookupdec.__version__}-{digest}"


def can_write(fmt: str) -> str | None:
    """None when a file of ``fmt`` can be written now, else the reason it cannot."""
    import lookupdec.formats

    if hasattr(lookupdec.formats, "write_static"):
        return None
    if fmt == "llama":
        return None
    return f"lookupdec.formats.write_static does not exist yet (needed for the {fmt} format)"


def can_open(impl: ModuleType, mode: str) -> str | None:
    """None when ``impl`` can open a ``mode`` static file now, else the reason it cannot."""
    why = can_write(MODE_FORMAT[mode])
    if why:
        return why
    if hasattr(impl, "load_static"):
        return None
    if mode == "llama":
        return None  # NgramCache.load reads the legacy format
    return f"lookupdec.{impl.IMPLEMENTATION} has no load_static yet (needed for {mode})"


@functools.cache
def _contents(src: Corpus, n_tokens: int) -> list[Any]:
    from lookupdec import reference

    contents: list[Any] = reference.build_static(src.static(n_tokens)).contents()
    return contents


def static_file(src: Corpus, n_tokens: int, fmt: str) -> Path:
    """The cached static file of the first ``n_tokens`` of the static corpus in ``fmt``."""
    slug = re.sub(r"[^A-Za-z0-9]+", "_", src.name).strip("_")
    path = CACHE / "static" / f"{slug}-{n_tokens}-{_formats_tag()}.{fmt}"
    if path.is_file():
        return path
    why = can_write(fmt)
    if why:
        raise ImplUnavailable(why)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        import lookupdec.formats

        write_static = getattr(lookupdec.formats, "write_static", None)
        if write_static is not None:
            write_static(_contents(src, n_tokens), tmp, format=fmt)
        else:  # llama only (see can_write)
            from lookupdec import reference

            reference.NgramCache.from_contents(_contents(src, n_tokens)).save(tmp)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    return path


def open_static(impl: ModuleType, path: Path, mode: str) -> Any:
    """Open a static file the way ``mode`` says, with ``impl``."""
    load_static = getattr(impl, "load_static", None)
    if load_static is not None:
        return load_static(path, in_memory=(mode == "lookupdec-loaded"))
    if mode == "llama":
        return impl.NgramCache.load(path)
    raise ImplUnavailable(f"lookupdec.{impl.IMPLEMENTATION} has no load_static yet")


def close_static(obj: Any) -> None:
    """Release an opened static cache (unmap it) if it can be closed."""
    close = getattr(obj, "close", None)
    if callable(close):
        close()
