"""Static cache files for the benchmarks: written once per (corpus, size, format), then reused.

Files live in ``results/cache/static/``; their contents always come from the reference's
``build_static`` (the implementations agree on contents), and they are written with
``lookupdec.formats.write_static``. They are opened as the CLI opens them
(``lookupdec.cli._pipeline.load_static``: the reference gets non-legacy formats as contents).
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

from perf._common import CACHE, Corpus

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

    h = hashlib.sha256()
    for src in sorted(Path(lookupdec.formats.__file__).parent.glob("*.py")):
        h.update(src.name.encode() + b"\0" + src.read_bytes())
    return f"{lookupdec.__version__}-{h.hexdigest()[:10]}"


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
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        from lookupdec.formats import write_static

        write_static(_contents(src, n_tokens), tmp, format=fmt)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    return path


def open_static(impl: ModuleType, path: Path, mode: str) -> Any:
    """Open a static file the way ``mode`` says, with ``impl``."""
    try:
        from lookupdec.cli._pipeline import load_static
    except ImportError:  # a commit from before the cli package (perf track measures old commits too)
        from lookupdec._pipeline import load_static  # type: ignore[import-not-found,no-redef]

    return load_static(impl, str(path), in_memory=(mode == "lookupdec-loaded"))


def close_static(obj: Any) -> None:
    """Release an opened static cache (unmap it) if it can be closed."""
    close = getattr(obj, "close", None)
    if callable(close):
        close()
