"""Write a file so that a reader never sees a half-written one in place of a good one."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from typing import BinaryIO


@contextlib.contextmanager
def atomic_writer(path: str | os.PathLike[str]) -> Iterator[BinaryIO]:
    """Yield a binary file in the target's folder; on success rename it over ``path``.

    On any exception the temporary file is removed and ``path`` is left as it was.
    """
    target = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(target))
    fd, tmp = tempfile.mkstemp(prefix=".lookupdec-", suffix=".tmp", dir=folder)
    # mkstemp creates the file 0600; give it the mode a plain open() would (0666 less umask).
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
