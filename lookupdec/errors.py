"""Exceptions raised by lookupdec.

Every error about a file names the file and, where it makes sense, the byte offset
at which the problem was found, so that a user can look at the bytes themselves.
"""

from __future__ import annotations

import os
from typing import Any


class LookupdecError(Exception):
    """Base class of every error lookupdec raises on purpose."""


class FileFormatError(LookupdecError, ValueError):
    """A file exists but its contents are not what its format requires.

    ``path`` is the file, ``offset`` the byte offset of the problem (``None`` when
    the problem is not at one place, e.g. a wrong total size).
    """

    def __init__(self, path: str | os.PathLike[str], message: str, offset: int | None = None) -> None:
        self.path = os.fspath(path)
        self.offset = offset
        self.reason = message
        where = f" at byte offset {offset}" if offset is not None else ""
        super().__init__(f"{self.path}: {message}{where}")

    def __reduce__(self) -> tuple[Any, ...]:
        # Rebuilt from its own arguments: pickled back from a worker process, the default
        # (the formatted message alone) failed to construct it, and the pool broke instead.
        return (type(self), (self.path, self.reason, self.offset))


class CacheFormatError(FileFormatError):
    """An n-gram cache file (legacy, fork or lookupdec format) is malformed."""


class OutputFileError(LookupdecError, ValueError):
    """An output path lookupdec will not write: not a regular file, or one of the inputs."""

    def __init__(self, path: str | os.PathLike[str], message: str) -> None:
        self.path = os.fspath(path)
        self.reason = message
        super().__init__(f"{self.path}: {message}")

    def __reduce__(self) -> tuple[Any, ...]:
        # as FileFormatError's: picklable across worker processes
        return (type(self), (self.path, self.reason))


class TokenFileError(FileFormatError):
    """A token file is malformed (size not a multiple of 4, ids outside int32, ...)."""


class TokenRangeError(LookupdecError, ValueError):
    """A token id given through the API does not fit in a signed 32-bit integer."""


class RequestClosedError(LookupdecError, RuntimeError):
    """A :class:`~lookupdec.Drafter` request was used after it ended."""


class VocabularyError(LookupdecError, ValueError):
    """Token ids or a static index do not belong to the vocabulary the Drafter was given."""


class UsageError(LookupdecError):
    """A problem with the command line or its inputs, reported as one line, exit code 2."""


class BuildError(LookupdecError):
    """A distributed build failed (the cluster, not the input); nothing was written."""


class IdsOutOfRange(LookupdecError, ValueError):
    """An id does not fit the identity code in use: the plan must scan the corpus for its ids."""


class TooManyIdsError(LookupdecError, ValueError):
    """The corpus has more than ``2**21`` distinct token ids: triples do not fit in an int64."""


class CountSaturationWarning(UserWarning):
    """Counts above 2^31-1 were written as 2^31-1: no cache format can store more."""


def warn_saturated(path: str | os.PathLike[str], n_saturated: int, stacklevel: int = 2) -> None:
    """Warn once that ``n_saturated`` counts written to ``path`` were capped at 2^31-1 (if any).

    The policy of both implementations, in every save: a count no format can hold is written
    as the largest one it can, so a shared cache file can always be saved.
    """
    if n_saturated:
        import warnings

        warnings.warn(
            f"{os.fspath(path)}: {n_saturated} count(s) above 2^31-1 saturated at 2147483647",
            CountSaturationWarning,
            stacklevel=stacklevel + 1,
        )
