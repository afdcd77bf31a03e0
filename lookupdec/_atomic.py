"""Write a file so that a reader never sees a half-written one in place of a good one.

Every file lookupdec writes goes through :func:`atomic_writer`:

- the bytes go to a temporary file in the target's own folder, then ``rename`` puts it in
  place, so the old file stays whole until the new one is complete (also after ``kill -9``);
- where Linux offers ``O_TMPFILE`` the temporary file has no name until it is complete
  (the kernel frees it if the process dies); elsewhere it is a hidden
  ``.NAME.lookupdec-PID-RANDOM.tmp`` file, and the next write to the same path removes
  those whose process is gone;
- an output that is a symbolic link is written through: its target is replaced (in the
  target's folder), the link stays, as llama.cpp's ``std::ofstream`` does;
- an output that exists and is not a regular file (a folder, a device such as
  ``/dev/full`` or ``/dev/null``, a fifo, a socket) is refused: it is never replaced, nor
  written into;
- every error names the user's path, never the temporary file;
- inside :func:`written_together` the files written are put in place together when the block
  ends without an error, and none of them is otherwise: a command that writes two files
  that belong together (``create -o INDEX --corpus-out CORPUS``) never leaves a new one
  beside an old one;
- the bytes reach the file in whole 2 MiB blocks at 2 MiB offsets (:class:`BlockWriter`), so
  a file system with large folios (ext4 and XFS on Linux 6.x) caches the file in 2 MiB
  folios, which a mapping of the file (a static index, a corpus file) then gets as huge
  pages: one TLB entry per 2 MiB instead of 512.
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
import io
import os
import stat
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, BinaryIO, Final, cast

from lookupdec.errors import OutputFileError

if TYPE_CHECKING:
    # typeshed's name for collections.abc.Buffer (3.12+); stubs only, never imported at run
    # time, and unlike typing_extensions' it is the standard library's on every Python.
    from _typeshed import ReadableBuffer as Buffer

_TMP_TAG = ".lookupdec-"

BLOCK: Final = 2 << 20
"""The unit :class:`BlockWriter` writes in: the size of a huge page (x86-64, arm64 with 4 KiB pages)."""


class BlockWriter(io.RawIOBase):
    """A binary file on ``fd`` that writes whole ``BLOCK``-sized, ``BLOCK``-aligned pieces.

    Small writes are gathered in a buffer of one block; a large one fills the buffer to the
    block's end, goes out in whole blocks straight from the caller's buffer (no copy), and
    its tail waits in the buffer. Only the file's last block can be shorter. Why: the page
    cache allocates a folio per write of the written size, up to 2 MiB, where the file system
    allows large folios: written in whole aligned blocks, the file is cached in 2 MiB
    folios, and a 2 MiB-aligned mapping of it is mapped with huge pages. Written through a
    small buffer (``open(..., "wb")``'s 8 KiB), an index is cached in small folios
    (``FilePmdMapped`` 0 in ``/proc/self/smaps``) and drafting from it goes through 4 KiB pages.

    After a :meth:`seek` (a header patched in place) writes go straight to the file.
    """

    def __init__(self, fd: int) -> None:
        super().__init__()
        self._fd = fd
        self._buf = bytearray()
        self._direct = False

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd

    def _write_all(self, data: memoryview) -> None:
        while len(data):
            data = data[os.write(self._fd, data) :]

    def write(self, b: Buffer) -> int:
        """Write all of ``b`` (any bytes-like object); returns its length in bytes."""
        data = memoryview(b).cast("B")
        n = len(data)
        if self._direct:
            self._write_all(data)
            return n
        room = BLOCK - len(self._buf)
        if n < room:
            self._buf += data
            return n
        self._buf += data[:room]
        self._write_out()
        data = data[room:]
        whole = len(data) // BLOCK * BLOCK
        self._write_all(data[:whole])
        self._buf += data[whole:]
        return n

    def _write_out(self) -> None:
        self._write_all(memoryview(self._buf))
        # A new buffer rather than clear(): a bytearray cannot be resized while a view of it is
        # alive, and outside CPython the views just used may not be freed yet.
        self._buf = bytearray()

    def flush(self) -> None:
        """Write what the buffer holds (the file's last, partial block)."""
        if self._buf:
            self._write_out()

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        self.flush()
        self._direct = True
        return os.lseek(self._fd, offset, whence)

    def tell(self) -> int:
        return os.lseek(self._fd, 0, os.SEEK_CUR) + len(self._buf)

    def close(self) -> None:
        """Flush; the descriptor stays open (its owner closes it)."""
        if not self.closed:
            self.flush()
        super().close()


def file_kind(mode: int) -> str:
    """What a file of ``st_mode`` ``mode`` is, for error messages ("a fifo", "a folder", ...)."""
    for test, name in (
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISFIFO, "a fifo"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "a regular file" if stat.S_ISREG(mode) else "not a regular file"


def check_output_path(
    path: str | os.PathLike[str],
    inputs: Iterable[str | os.PathLike[str]] = (),
    outputs: Iterable[str | os.PathLike[str]] = (),
    *,
    what: str = "the output",
    writable: bool = True,
) -> str:
    """The real path an output to ``path`` will replace, after the checks every output gets.

    Symbolic links are followed (the link's target is what gets written). Raises
    :class:`~lookupdec.errors.OutputFileError` naming ``path`` when it is empty, when it exists
    and is not a regular file, when it is the same file as one of ``inputs`` (``create X -o X``
    would destroy the corpus) or of the command's other ``outputs`` (the second written would
    replace the first), or when its folder does not exist or (``writable``) is not writable.
    ``what`` names the output in the folder's errors.
    """
    target = os.fspath(path)
    if not target:  # realpath("") is the current folder: "exists and is a folder" said nothing useful
        raise OutputFileError("''", "an empty output path: give a file name")
    real = os.path.realpath(target)
    for other in outputs:
        if os.path.realpath(other) == real:  # neither need exist yet
            raise OutputFileError(
                target, f"is also the command's other output ({os.fspath(other)}): give the two different names"
            )
    try:
        st = os.stat(real)
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise OutputFileError(
            target, f"exists and is {file_kind(st.st_mode)}; lookupdec writes only regular files (choose another)"
        )
    if st is not None:
        for other in inputs:
            with contextlib.suppress(OSError):
                if os.path.samefile(other, real):  # hard links too, which realpath does not see
                    raise OutputFileError(
                        target, f"is also an input ({os.fspath(other)}); writing it would destroy that input"
                    )
    folder = os.path.dirname(real)
    if not os.path.isdir(folder):
        raise OutputFileError(target, f"{what}'s folder does not exist ({folder})")
    # Before the work, so that a command with two outputs (create -o --corpus-out) does not write
    # the first and then fail on the second (a read-only folder: EROFS or EACCES).
    if writable and not os.access(folder, os.W_OK):
        raise OutputFileError(target, f"{what}'s folder is not writable ({folder})")
    return real


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # e.g. EPERM: it exists, owned by someone else
        return True
    return True


def _clean_stale(folder: str, base: str) -> None:
    """Remove this program's temporary files for ``base`` left by a process that died."""
    prefix = f".{base}{_TMP_TAG}"
    with contextlib.suppress(OSError):
        for name in os.listdir(folder):
            if not (name.startswith(prefix) and name.endswith(".tmp")):
                continue
            pid_text = name[len(prefix) :].split("-", 1)[0]
            if pid_text.isdigit() and not _pid_alive(int(pid_text)):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(folder, name))


def _tmp_name(folder: str, base: str) -> str:
    # os.urandom, what secrets.token_hex reads: importing secrets loads hmac, hashlib and
    # OpenSSL's libcrypto, megabytes of every command's RSS.
    return os.path.join(folder, f".{base}{_TMP_TAG}{os.getpid()}-{os.urandom(4).hex()}.tmp")


def _open_unnamed(folder: str) -> int | None:
    """An unnamed (``O_TMPFILE``) file in ``folder``, or None where the OS or file system has none."""
    flag = getattr(os, "O_TMPFILE", 0)
    if not flag or not os.path.isdir("/proc/self/fd"):
        return None
    try:
        return os.open(folder, flag | os.O_WRONLY, 0o666)
    except OSError as e:
        if e.errno in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL, errno.ENOENT):
            return None  # not supported here: fall back to a named temporary file
        raise


def _link_unnamed(fd: int, name: str) -> None:
    """Give the unnamed file ``fd`` the name ``name`` (``linkat`` through ``/proc/self/fd``)."""
    # os.link without a dir fd calls link(2), which would link the /proc symlink itself
    # (EXDEV); with src_dir_fd it calls linkat(2) with AT_SYMLINK_FOLLOW, which links the file.
    proc = os.open("/proc/self/fd", os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.link(str(fd), name, src_dir_fd=proc, follow_symlinks=True)
    finally:
        os.close(proc)


def _renamed(e: OSError, target: str, tmp_names: tuple[str, ...]) -> OSError:
    """``e`` naming ``target`` instead of our temporary file (or no file at all)."""
    if e.filename is not None and os.fspath(e.filename) not in tmp_names and e.filename != target:
        return e
    new = OSError(e.errno, e.strerror or str(e), target)
    new.__cause__ = None
    return new


# The files atomic_writer has completed inside written_together, waiting to be put in place:
# (named temporary file, real path, the user's path). None outside written_together.
_PENDING: contextvars.ContextVar[list[tuple[str, str, str]] | None] = contextvars.ContextVar(
    "lookupdec_pending_writes", default=None
)


@contextlib.contextmanager
def written_together() -> Iterator[None]:
    """Put every file :func:`atomic_writer` completes in this block in place at its end, or none.

    Each file is written and synced to a named temporary file in its target's folder as
    usual; only the renames wait for the block to end, so the targets change together, after
    all the work (renames in one file system do not run out of space). On any exception,
    ``KeyboardInterrupt`` and the CLI's ``Terminated`` included, the temporary files are
    removed and every target is as it was. A process killed with ``SIGKILL`` in the block
    leaves its hidden temporary files, which the next write to the same path removes.
    """
    pending: list[tuple[str, str, str]] = []
    token = _PENDING.set(pending)
    try:
        yield
    except BaseException:
        _discard(pending)
        raise
    finally:
        _PENDING.reset(token)
    for i, (tmp, real, target) in enumerate(pending):
        try:
            os.replace(tmp, real)
        except OSError as e:
            _discard(pending[i:])
            raise _renamed(e, target, (tmp,)) from None


def _discard(pending: list[tuple[str, str, str]]) -> None:
    for tmp, _, _ in pending:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


@contextlib.contextmanager
def atomic_writer(path: str | os.PathLike[str], inputs: Iterable[str | os.PathLike[str]] = ()) -> Iterator[BinaryIO]:
    """Yield a binary file in the target's folder; on success it replaces ``path`` atomically.

    On any exception nothing is left behind and ``path`` is as it was. Inside
    :func:`written_together` the file is put in place when that block ends. See the module
    docstring for symbolic links, non-regular outputs and temporary files; ``inputs`` are
    files the output must not be (see :func:`check_output_path`).
    """
    target = os.fspath(path)
    real = check_output_path(target, inputs)
    folder, base = os.path.split(real)
    _clean_stale(folder, base)
    try:
        old_mode: int | None = stat.S_IMODE(os.stat(real).st_mode)
    except OSError:
        old_mode = None
    tmp = ""
    fd: int | None = None
    try:
        fd = _open_unnamed(folder)
        unnamed = fd is not None
        if fd is None:
            tmp = _tmp_name(folder, base)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        if old_mode is not None:
            os.fchmod(fd, old_mode)  # keep the permissions of the file being replaced, as writing in place would
        with BlockWriter(fd) as f:
            yield cast(BinaryIO, f)  # BlockWriter has every method of a binary file the writers use
            f.flush()
            os.fsync(fd)
        if unnamed:
            tmp = _tmp_name(folder, base)
            _link_unnamed(fd, tmp)
        pending = _PENDING.get()
        if pending is not None:  # written_together puts it in place with the others
            pending.append((tmp, real, target))
        else:
            os.replace(tmp, real)
        tmp = ""
    except OSError as e:
        raise _renamed(e, target, (tmp, folder, f"/proc/self/fd/{fd}")) from None
    finally:
        if fd is not None:
            os.close(fd)
        if tmp:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
