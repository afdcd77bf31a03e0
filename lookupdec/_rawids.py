"""Raw token files (little-endian int32 ids) read with the standard library only.

``lookupdec stats`` replays a token file: reading it through numpy and ``tolist()`` would add
numpy's import and a Python int per id to the replay's peak RSS. An ``array('i')`` holds the
ids in 4 bytes each, and the fast path copies it into a ``vec[i32]`` with one ``memcpy``.
:mod:`lookupdec.tokens` (numpy) reads every other kind of input and uses the same checks.
"""

from __future__ import annotations

import os
import stat
import sys
from array import array

from lookupdec._atomic import file_kind
from lookupdec.errors import TokenFileError

TOKEN_SUFFIXES = (".bin", ".npy")
"""File name endings that are read as token files when neither ``--tokens`` nor ``--tokenizer`` is given."""


def refuse_irregular(path: str, mode: int) -> None:
    """TokenFileError naming ``path`` unless ``mode`` (its ``st_mode``) is a regular file's."""
    if not stat.S_ISREG(mode):
        raise TokenFileError(path, f"is {file_kind(mode)}, not a regular file")


def require_regular(path: str) -> None:
    """TokenFileError when ``path`` exists and is not a regular file (a missing one is left to the reader).

    A fifo blocked the read for ever, ``/dev/zero`` read until memory ran out, and ``/dev/null``
    read as an empty file, silently: the command line refused them, the Python API did not.
    """
    try:
        st = os.stat(path)
    except OSError:
        return
    refuse_irregular(path, st.st_mode)


def check_raw_size(name: str) -> int:
    """The size of the raw token file ``name``; TokenFileError if it is not a whole number of ids."""
    size = os.path.getsize(name)
    if size % 4:
        raise TokenFileError(
            name,
            f"size {size} bytes is not a multiple of 4 (a raw token file holds little-endian int32 ids); "
            f"the last id is incomplete",
            size - size % 4,
        )
    return size


def read_raw_ids(path: str | os.PathLike[str]) -> array[int]:
    """A raw token file as an ``array('i')`` of its ids (int32), checked like ``tokens.read_tokens``
    and ``tokens.check_token_ids(..., raw=True)``: a size not a multiple of 4 or a negative id
    raises :class:`TokenFileError` naming the file and the byte offset."""
    name = os.fspath(path)
    check_raw_size(name)
    ids = array("i")
    if ids.itemsize != 4:  # 'i' is a C int: 4 bytes on every platform CPython supports
        raise RuntimeError(f"array('i') holds {ids.itemsize}-byte items here, not int32")
    with open(name, "rb") as f:
        ids.frombytes(f.read())
    if sys.byteorder == "big":
        ids.byteswap()
    if ids and min(ids) < 0:
        i = next(j for j, t in enumerate(ids) if t < 0)
        raise TokenFileError(name, f"token id {ids[i]} at position {i} is negative; token ids are >= 0", 4 * i)
    return ids
