"""Tokenize a large text file in bounded memory on every core, with the ids of one whole-file encode.

The file is decoded incrementally and cut into chunks of about ``chunk_chars`` characters, only
at points where :meth:`Tokenizer.is_cut` proves that no token can span the cut. Chunks are
encoded by a pool of worker processes (forked after the vocabulary is loaded, so it is loaded
once) and the ids are handed back in file order; at most ``2 * workers`` chunks are in flight,
so memory stays bounded whatever the file size. BOS goes before the first chunk and EOS after
the last, as for one ``llama_tokenize`` call on the whole text.

Processes, not threads: tiktoken releases the GIL, but on this 2-core machine threads in one
process did not speed it up, separate processes did (``shared/spec/tokenization.md``); the SPM
and ``tokenizers`` paths hold the GIL in Python code anyway.
"""

from __future__ import annotations

import codecs
import multiprocessing
import os
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from typing import BinaryIO

import numpy as np
import numpy.typing as npt

from lookupdec.errors import TokenFileError
from lookupdec.tokenizer import Tokenizer

DEFAULT_CHUNK_CHARS = 4 << 20
"""Characters per chunk (a cut is searched in the second half of each window)."""

_READ_BYTES = 1 << 20
_TOK: Tokenizer | None = None  # the worker processes' tokenizer (inherited through fork)


def iter_text_chunks(path: str, tok: Tokenizer, chunk_chars: int = DEFAULT_CHUNK_CHARS) -> Iterator[tuple[str, int]]:
    """Yield ``(chunk, bytes_read_so_far)``: the UTF-8 text of ``path`` in consecutive parts cut at safe points.

    A part may be longer than ``chunk_chars`` when no safe cut is found (a text without
    newlines is one part). Invalid UTF-8 raises :class:`TokenFileError` with its byte offset.
    """
    decoder = codecs.getincrementaldecoder("utf-8")()
    carry = ""
    consumed = 0
    # A special text holding a newline could reach this far past a cut: keep that margin
    # before the end of the buffer so that is_cut sees all of it.
    margin = max((len(t) for t in tok._nl_specials), default=0) + 2
    with open(path, "rb") as f:
        while True:
            raw = f.read(_READ_BYTES)
            pending = len(decoder.getstate()[0])
            try:
                text = decoder.decode(raw, final=not raw)
            except UnicodeDecodeError as e:
                raise TokenFileError(
                    path, f"text is not valid UTF-8 ({e.reason})", consumed - pending + e.start
                ) from None
            consumed += len(raw)
            buf = carry + text if carry else text
            if not raw:
                yield buf, consumed
                return
            while len(buf) >= chunk_chars:
                end = len(buf) - margin
                cut = tok.find_cut(buf, chunk_chars // 2, min(chunk_chars, end))
                if cut <= 0:
                    cut = tok.find_next_cut(buf, chunk_chars, end)  # a long line: the first cut after it
                if cut <= 0:
                    break  # no safe cut yet: read on
                yield buf[:cut], consumed
                buf = buf[cut:]
            carry = buf


def _encode_chunk(text: str, first: bool, parse_special: bool) -> npt.NDArray[np.int32]:
    tok = _TOK
    assert tok is not None, "worker started without a tokenizer"
    return tok._encode(text, False, False, parse_special, first)


def _init_worker(path: str | None) -> None:
    global _TOK
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
    chunk_chars: int = DEFAULT_CHUNK_CHARS,
    progress: Callable[[int, int], None] | None = None,
) -> Iterator[npt.NDArray[np.int32]]:
    """Yield the ids of the text file ``path`` in file order, in parts; together they equal ``tok.encode(text)``.

    ``workers`` processes encode the chunks (default: every CPU; 1 encodes in this process).
    ``progress(bytes_done, total_bytes)`` is called as chunks complete.
    """
    global _TOK
    name = os.fspath(path)
    total = os.path.getsize(name)
    n_workers = workers if workers is not None else (os.cpu_count() or 1)
    if n_workers < 1:
        raise ValueError(f"workers must be >= 1, got {n_workers}")
    if add_special and tok.add_bos:
        assert tok.bos_id is not None
        yield np.array([tok.bos_id], dtype=np.int32)
    chunks = iter_text_chunks(name, tok, chunk_chars)
    if n_workers == 1:
        for k, (chunk, done) in enumerate(chunks):
            yield tok._encode(chunk, False, False, parse_special, k == 0)
            if progress is not None:
                progress(done, total)
    else:
        _TOK = tok
        # Fork: the workers inherit the loaded vocabulary. Elsewhere they load it again.
        methods = multiprocessing.get_all_start_methods()
        ctx = multiprocessing.get_context("fork" if "fork" in methods else None)
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # tokenizers' own threads and fork do not mix
        init_path = None if ctx.get_start_method() == "fork" else tok.path
        inflight: deque[tuple[Future[npt.NDArray[np.int32]], int]] = deque()
        try:
            with ProcessPoolExecutor(
                n_workers, mp_context=ctx, initializer=_init_worker, initargs=(init_path,)
            ) as pool:
                for k, (chunk, done) in enumerate(chunks):
                    inflight.append((pool.submit(_encode_chunk, chunk, k == 0, parse_special), done))
                    del chunk
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
            for fut, _ in inflight:
                fut.cancel()
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
