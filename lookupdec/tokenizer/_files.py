"""Open the tokenizer's input files (vocabularies, text) only when they are regular files.

A fifo blocks ``open`` (and every read) until a writer comes, and a device such as
``/dev/zero`` reads without end: ``load_tokenizer`` on one hung, or read until MemoryError.
The wording is the rest of the project's (:func:`lookupdec.formats.detect.open_regular_fd`),
with :class:`~lookupdec.errors.TokenFileError` (:func:`lookupdec._rawids.refuse_irregular`) instead of a cache file's.
"""

from __future__ import annotations

import os
from typing import BinaryIO

from lookupdec._rawids import refuse_irregular


def open_regular(path: str | os.PathLike[str]) -> BinaryIO:
    """Open ``path`` for binary reading; :class:`TokenFileError` naming it unless it is a regular file.

    Opened non-blocking (a fifo does not block ``open`` then) and checked with ``fstat`` on the
    open descriptor, so a rename between the check and the read changes nothing.
    :class:`FileNotFoundError` and :class:`PermissionError` come from ``os.open``, naming the file.
    """
    name = os.fspath(path)
    fd = os.open(name, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        refuse_irregular(name, os.fstat(fd).st_mode)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def regular_size(path: str | os.PathLike[str]) -> int:
    """The size of ``path`` in bytes; :class:`TokenFileError` naming it unless it is a regular file."""
    name = os.fspath(path)
    st = os.stat(name)
    refuse_irregular(name, st.st_mode)
    return st.st_size
