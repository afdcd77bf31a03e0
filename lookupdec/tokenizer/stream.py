"""Tokenize a large text file in bounded memory on every core, with the ids of one whole-file encode.

The file is cut into byte ranges of about ``chunk_bytes``, only at points where
:meth:`Tokenizer.is_cut` proves that no token can span the cut (the parent process looks only
at the bytes around candidate newlines). Each range is read, decoded and encoded by a worker
process (forked after the vocabulary is loaded, so it is loaded once) and the ids come back in
file order; at most ``2 * workers`` ranges are in flight, so memory stays bounded whatever the
file size, and the parent does almost no work besides writing. BOS goes before the first chunk and EOS after
the last, as for one ``llama_tokenize`` call on the whole text.

Processes, not threads: tiktoken releases the GIL, but on this 2-core machine threads in one
process did not speed it up, separate processes did (``shared/spec/tokenization.md``); the SPM
and ``tokenizers`` paths hold the GIL in Python code anyway.
"""

from __future__ import annotations

import mmap
import multiprocessing
import os
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from typing import BinaryIO

import numpy as np
import numpy.typing as npt

from lookupdec._signals import worker_signals
from lookupdec.errors import TokenFileError
from lookupdec.tokenizer import Tokenizer
from lookupdec.tokenizer._files import open_regular, regular_size

DEFAULT_CHUNK_BYTES = 4 << 20
"""Bytes per chunk (a cut is searched in the second half of each window)."""

_TOK: Tokenizer | None = None  # the worker processes' tokenizer (inherited through fork)


def _special_margin(tok: Tokenizer) -> int:
    """Bytes around a cut that :meth:`Tokenizer.is_cut` may look at (special texts holding a newline)."""
    longest = max((len(t.encode("utf-8", errors="surrogateescape")) for t in tok._nl_specials), default=0)
    return longest + 8


def is_cut_at(data: bytes | mmap.mmap, i: int, tok: Tokenizer) -> bool:
    """:meth:`Tokenizer.is_cut` at byte offset ``i`` of UTF-8 ``data``, decoding only a window around it.

    The window reaches further than anything ``is_cut`` looks at (the characters at
    ``i - 2 .. i + 1`` and special texts holding a newline), so a character cut at its edges
    (decoded as U+FFFD) cannot change the answer.
    """
    if i < 2 or i + 1 >= len(data) or data[i - 1] != 0x0A:
        return False
    m = _special_margin(tok)
    lo, hi = max(0, i - m), min(len(data), i + m)
    left = bytes(data[lo:i]).decode("utf-8", errors="replace")
    right = bytes(data[i:hi]).decode("utf-8", errors="replace")
    return tok.is_cut(left + right, len(left))


def chunk_ranges(path: str, tok: Tokenizer, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> Iterator[tuple[int, int]]:
    """Yield ``(start, end)`` byte ranges covering the file ``path``, cut only where :meth:`Tokenizer.is_cut` holds.

    A range is about ``chunk_bytes`` long: the last cut in its second half, else the first cut
    after it (a long line), else the rest of the file. Only the bytes near candidate newlines
    are looked at; the text is never decoded here (the workers decode their own range).
    """
    if chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be >= 1, got {chunk_bytes}")
    with open_regular(path) as f:  # a fifo or a device is refused (it blocked, or read forever)
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            yield 0, 0
            return
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            yield from _cuts(mm, size, tok, chunk_bytes)


def _cuts(mm: mmap.mmap, size: int, tok: Tokenizer, chunk_bytes: int) -> Iterator[tuple[int, int]]:
    """The ranges of :func:`chunk_ranges` over the mapped file ``mm`` of ``size`` bytes."""
    pos = 0
    while size - pos > chunk_bytes:
        cut = -1
        nl = mm.rfind(b"\n", pos + chunk_bytes // 2, pos + chunk_bytes)
        while nl >= 0 and cut < 0:
            if is_cut_at(mm, nl + 1, tok):
                cut = nl + 1
            else:
                nl = mm.rfind(b"\n", pos + chunk_bytes // 2, nl)
        if cut < 0:
            nl = mm.find(b"\n", pos + chunk_bytes)
            while nl >= 0 and cut < 0:
                if is_cut_at(mm, nl + 1, tok):
                    cut = nl + 1
                else:
                    nl = mm.find(b"\n", nl + 1)
        if cut < 0:
            break
        yield pos, cut
        pos = cut
    yield pos, size


def read_range(path: str, start: int, end: int) -> str:
    """The text of bytes ``[start, end)`` of ``path``; invalid UTF-8 is :class:`TokenFileError` with its file offset."""
    with open_regular(path) as f:
        f.seek(start)
        raw = f.read(end - start)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TokenFileError(path, f"text is not valid UTF-8 ({e.reason})", start + e.start) from None


def _encode_range(path: str, start: int, end: int, parse_special: bool) -> npt.NDArray[np.int32]:
    tok = _TOK
    assert tok is not None, "worker started without a tokenizer"
    return tok._encode(read_range(path, start, end), False, False, parse_special, start == 0)


def _init_worker(path: str | None) -> None:
    global _TOK
    worker_signals()  # Ctrl-C is the parent's to handle: no traceback from every worker
    if path is not None:  # a spawned (not forked) worker loads the vocabulary itself
        from lookupdec.tokenizer import load_tokenizer

        _TOK = load_tokenizer(path)


def iter_file_ids(
    path: str | os.PathLike[str],
    tok: Tokenizer,
    *,
    add_special: bool = True,
    parse_special: bool = True,
    workers: int | None = None,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    progress: Callable[[int, int], None] | None = None,
) -> Iterator[npt.NDArray[np.int32]]:
    """Yield the ids of the text file ``path`` in file order, in parts; together they equal ``tok.encode(text)``.

    ``workers`` processes encode the chunks (default: every CPU; 1 encodes in this process).
    ``progress(bytes_done, total_bytes)`` is called as chunks complete.
    """
    global _TOK
    name = os.fspath(path)
    total = regular_size(name)  # a fifo (read_range blocked) or a device (read as empty) is an error
    n_workers = workers if workers is not None else (os.cpu_count() or 1)
    if n_workers < 1:
        raise ValueError(f"workers must be >= 1, got {n_workers}")
    if chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be >= 1, got {chunk_bytes}")
    if add_special and tok.add_bos:
        assert tok.bos_id is not None
        yield np.array([tok.bos_id], dtype=np.int32)
    ranges = chunk_ranges(name, tok, chunk_bytes)
    if n_workers == 1:
        for start, end in ranges:
            yield tok._encode(read_range(name, start, end), False, False, parse_special, start == 0)
            if progress is not None:
                progress(end, total)
    else:
        _TOK = tok
        # Fork: the workers inherit the loaded vocabulary. Elsewhere they load it again.
        methods = multiprocessing.get_all_start_methods()
        ctx = multiprocessing.get_context("fork" if "fork" in methods else None)
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # tokenizers' own threads and fork do not mix
        init_path = None if ctx.get_start_method() == "fork" else tok.path
        inflight: deque[tuple[Future[npt.NDArray[np.int32]], int]] = deque()
        pool = ProcessPoolExecutor(n_workers, mp_context=ctx, initializer=_init_worker, initargs=(init_path,))
        try:
            for start, end in ranges:
                inflight.append((pool.submit(_encode_range, name, start, end, parse_special), end))
                while len(inflight) >= 2 * n_workers:
                    fut, d = inflight.popleft()
                    yield fut.result()
                    if progress is not None:
                        progress(d, total)
            while inflight:
                fut, d = inflight.popleft()
                yield fut.result()
                if progress is not None:
                    progress(d, total)
        finally:
            # Stopped early (an error, Ctrl-C, the reader gone): drop the chunks not started;
            # the workers ignore Ctrl-C, so each finishes only the chunk it holds.
            pool.shutdown(wait=True, cancel_futures=True)
            _TOK = None
    if add_special and tok.add_eos:
        assert tok.eos_id is not None
        yield np.array([tok.eos_id], dtype=np.int32)


def tokenize_file(path: str | os.PathLike[str], tok: Tokenizer, **kwargs: object) -> npt.NDArray[np.int32]:
    """All ids of the text file ``path`` as one array (see :func:`iter_file_ids` for the options)."""
    parts = list(iter_file_ids(path, tok, **kwargs))  # type: ignore[arg-type]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)


def write_ids(parts: Iterator[npt.NDArray[np.int32]], f: BinaryIO) -> int:
    """Write ``parts`` as raw little-endian int32 to ``f``; return the number of ids."""
    n = 0
    for arr in parts:
        f.write(arr.astype("<i4", copy=False).tobytes())
        n += int(arr.size)
    return n
