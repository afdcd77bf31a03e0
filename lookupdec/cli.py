"""The ``lookupdec`` command line, shaped like llama.cpp's lookup tools.

=================  ==========================================================
``create``         llama-lookup-create: build a static 2-gram cache from corpora
``stats``          llama-lookup-stats: replay a text, count drafted/accepted tokens
``merge``          llama-lookup-merge: add several caches into one
``inspect``        what a cache file holds (no llama.cpp counterpart)
``tokenize``       a text file to token ids with a model's GGUF vocabulary (llama_tokenize)
``demo``           the whole pipeline on token data shipped with the package
=================  ==========================================================

Every error about the input ends the program with one line on stderr,
``lookupdec: error: <file>: <what> [at byte offset N]``, and exit code 2.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
import textwrap
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any, Final, NoReturn, TextIO

import lookupdec
from lookupdec._atomic import check_output_path
from lookupdec._pipeline import (
    build_static_cache,
    load_cache,
    peak_rss_mb,
    progress_bar,
    replay_stats,
    require_file,
    resolve_impl,
    saturate_counts,
    write_cache,
    write_corpus_file,
)
from lookupdec.errors import LookupdecError, UsageError, warn_saturated

INT32_MAX = 2**31 - 1
EXIT_OK = 0
EXIT_ERROR = 2
"""Exit code of every usage or input error (like argparse's own)."""

STATIC_FORMATS = ("lookupdec", "llama", "fork-v2")
"""Formats ``create`` and ``merge`` can write."""
IMPLEMENTATIONS = ("reference", "fast")

# --------------------------------------------------------------------------------------
# errors and helpers


class _Parser(argparse.ArgumentParser):
    """argparse with lookupdec's one-line error format."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"lookupdec: error: {message} (see '{self.prog} --help')\n")
        raise SystemExit(EXIT_ERROR)


def _format_error(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.filename is not None:
        reason = exc.strerror or str(exc)
        if isinstance(exc, FileNotFoundError):
            reason = "no such file"
        return f"{os.fspath(exc.filename)}: {reason}"
    return str(exc)


def _show_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: TextIO | None = None,
    line: str | None = None,
) -> None:
    sys.stderr.write(f"lookupdec: warning: {message}\n")


def _want_progress(args: argparse.Namespace) -> bool:
    return not getattr(args, "quiet", False) and sys.stderr.isatty()


def _load_input(args: argparse.Namespace, path: str) -> list[int]:
    from lookupdec.tokens import check_token_ids, load_tokens

    arr = load_tokens(path, tokens=args.tokens, tokenizer=args.tokenizer, add_bos=args.add_bos)
    check_token_ids(path, arr, raw=args.tokenizer is None and not path.lower().endswith(".npy"))
    result: list[int] = arr.tolist()
    return result


def _load_replay(args: argparse.Namespace, path: str) -> Sequence[int]:
    """The ids to replay: a raw token file as an ``array('i')`` (no numpy, 4 bytes an id), else as ``_load_input``."""
    from lookupdec._rawids import TOKEN_SUFFIXES, read_raw_ids

    lower = path.lower()
    raw = args.tokens or lower.endswith(TOKEN_SUFFIXES)
    if raw and args.tokenizer is None and not args.add_bos and not lower.endswith(".npy"):
        return read_raw_ids(path)
    return _load_input(args, path)  # text, .npy, or a combination of flags it reports as an error


def _mb(n_bytes: int) -> str:
    return f"{n_bytes / 1e6:.2f} MB"


# --------------------------------------------------------------------------------------
# building and writing static caches


# --------------------------------------------------------------------------------------
# subcommands


def _budget(args: argparse.Namespace) -> tuple[int | None, int | None]:
    """``--memory`` in bytes and ``--workers``, checked (None: the defaults of lookupdec.builder)."""
    from lookupdec.builder import parse_memory

    memory = None
    if args.memory is not None:
        try:
            memory = parse_memory(args.memory)
        except ValueError as e:
            raise UsageError(f"--memory: {e}") from None
    if args.workers is not None and args.workers < 1:
        raise UsageError(f"--workers must be >= 1, got {args.workers}")
    return memory, args.workers


def _create_index(args: argparse.Namespace, vocab_size: int, fingerprint: bytes) -> int:
    """``create --format lookupdec``: bounded memory, every core, or a Dask cluster (lookupdec.builder)."""
    memory, workers = _budget(args)
    t0 = time.perf_counter()
    corpora: list[Any] = list(args.corpus)
    with contextlib.ExitStack() as stack:
        if args.tokenizer is not None:
            corpora = _tokenized_corpora(args, stack, workers)
        return _count_index(args, corpora, memory, workers, vocab_size, fingerprint, t0)


def _tokenized_corpora(args: argparse.Namespace, stack: contextlib.ExitStack, workers: int | None) -> list[Any]:
    """The text corpora of ``create --tokenizer`` as token files in a temporary folder, or arrays.

    With a vocabulary lookupdec tokenizes exactly, each text is streamed (bounded memory, every
    core) into a raw int32 file that counting then reads like any token file: a corpus far larger
    than memory can be given as text. A cluster (``--dask``) cannot read this machine's
    temporary folder, so there the ids are held in memory and shipped; so are the ids of a
    tokenizer.json tokenized by Hugging Face's own rules (that library encodes a text whole).
    """
    from lookupdec.tokens import exact_tokenizer, tokenize_to_file

    tok = exact_tokenizer(args.tokenizer)
    if tok is None or args.dask is not None:
        return [_load_input_array(args, path) for path in args.corpus]
    import tempfile  # here: 1.3 MB of RSS (shutil, random) that no other command needs

    tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="lookupdec-create-"))
    files: list[Any] = []
    for i, path in enumerate(args.corpus):  # each checked by cmd_create (require_file)
        out = os.path.join(tmp, f"corpus-{i:04d}.i32")
        with (
            progress_bar(_want_progress(args), f"tokenize {os.path.basename(path)}", unit="B") as progress,
            open(out, "wb") as f,
        ):
            tokenize_to_file(path, tok, f, add_bos=args.add_bos, workers=workers, progress=progress)
        files.append(out)
    return files


def _count_index(
    args: argparse.Namespace,
    corpora: list[Any],
    memory: int | None,
    workers: int | None,
    vocab_size: int,
    fingerprint: bytes,
    t0: float,
) -> int:
    """Count ``corpora`` (token files or arrays, one per ``args.corpus``) into the lookupdec index."""
    from lookupdec import builder

    if args.tokenizer is None:
        from lookupdec.tokens import TOKEN_SUFFIXES

        if args.add_bos:
            raise UsageError("--add-bos applies to text tokenized with --tokenizer; token files are used as they are")

        for path in args.corpus:
            if not args.tokens and not path.lower().endswith(TOKEN_SUFFIXES):
                raise UsageError(
                    f"{path}: is this a token file or text? Give --tokens (raw int32 or .npy) or "
                    "--tokenizer PATH/tokenizer.json"
                )
    for path, corpus in zip(args.corpus, corpora, strict=True):  # what the command line asks of a corpus
        dataclasses.replace(builder.Source.open(corpus), name=path).check_ids(vocab_size)
    if args.dask is not None:
        from lookupdec.builder.dask import create_index_dask

        run: Any = create_index_dask
        extra: dict[str, Any] = {"scheduler": args.dask}
    else:
        run, extra = builder.create_index, {"workers": workers}
    with progress_bar(_want_progress(args), "create") as progress:
        summary = run(
            corpora, args.output, memory=memory, vocab_size=vocab_size, vocab_fingerprint=fingerprint,
            progress=progress, **extra,
        )  # fmt: skip
    warn_saturated(args.output, summary.saturated)
    if not args.quiet:
        n_files = len(args.corpus)
        print(
            f"{args.output}: lookupdec static cache, {summary.n_keys:,} 2-grams, {summary.n_entries:,} entries, "
            f"{_mb(summary.file_size)}, from {n_files} corpus file{'s' if n_files != 1 else ''} "
            f"in {time.perf_counter() - t0:.2f} s (peak RSS {peak_rss_mb():.0f} MB)"
        )
    return EXIT_OK


def _load_input_array(args: argparse.Namespace, path: str) -> Any:
    from lookupdec.tokens import load_tokens

    return load_tokens(path, tokens=args.tokens, tokenizer=args.tokenizer, add_bos=args.add_bos)


def _write_corpus_out(args: argparse.Namespace, vocab_size: int, fingerprint: bytes) -> None:
    """``create --corpus-out``: the hybrid policy's corpus file of the same corpora (one document each)."""
    t0 = time.perf_counter()
    parts = [_load_replay(args, path) for path in args.corpus]
    if vocab_size:
        for path, part in zip(args.corpus, parts, strict=True):
            top = max(part, default=-1)
            if top >= vocab_size:
                raise UsageError(f"{path}: token id {top} is not below the vocabulary size {vocab_size}")
    try:
        corpus = write_corpus_file(parts, args.corpus_out, vocab_size, fingerprint)
    except ValueError as e:  # a negative id
        raise UsageError(f"--corpus-out: {e}") from None
    if not args.quiet:
        print(
            f"{args.corpus_out}: lookupdec corpus file, {corpus.n_tokens:,} ids, {corpus.n_bigrams:,} bigrams, "
            f"{_mb(os.path.getsize(args.corpus_out))}, in {time.perf_counter() - t0:.2f} s"
        )


def cmd_create(args: argparse.Namespace) -> int:
    """``lookupdec create``: build a static cache (llama-lookup-create)."""
    impl = resolve_impl(args.impl)  # checked first for every format, though only llama and fork-v2 use it
    for path in args.corpus:
        require_file(path, "corpus")
    check_output_path(args.output, args.corpus)  # before the work: not a device, not a corpus
    if args.corpus_out is not None:
        check_output_path(args.corpus_out, [*args.corpus, args.output])
    vocab_size, fingerprint = 0, b""
    if args.tokenizer is not None:
        from lookupdec.tokens import vocab_info

        vocab_size, fingerprint = vocab_info(args.tokenizer)
    if args.vocab_size is not None:
        vocab_size = args.vocab_size
    code = _create_static(args, impl, vocab_size, fingerprint)
    if args.corpus_out is not None:
        _write_corpus_out(args, vocab_size, fingerprint)
    return code


def _create_static(args: argparse.Namespace, impl: Any, vocab_size: int, fingerprint: bytes) -> int:
    """The static cache of ``create`` (-o) in the format asked for."""
    if args.format == "lookupdec":
        return _create_index(args, vocab_size, fingerprint)
    if args.dask is not None:
        raise UsageError("--dask builds the lookupdec format only; convert with 'lookupdec merge --format ...'")
    t0 = time.perf_counter()
    corpora = [_load_input(args, path) for path in args.corpus]
    t_read = time.perf_counter() - t0
    if vocab_size:
        for path, tokens in zip(args.corpus, corpora, strict=True):
            top = max(tokens, default=-1)
            if top >= vocab_size:
                raise UsageError(f"{path}: token id {top} is not below the vocabulary size {vocab_size}")
    t0 = time.perf_counter()
    with progress_bar(_want_progress(args), "create") as progress:
        cache = build_static_cache(impl, corpora, progress)
    t_build = time.perf_counter() - t0
    t0 = time.perf_counter()
    write_cache(cache, args.output, args.format, vocab_size=vocab_size, vocab_fingerprint=fingerprint)
    t_write = time.perf_counter() - t0
    if not args.quiet:
        n_tokens = sum(len(c) for c in corpora)
        print(
            f"{args.output}: {args.format} static cache, {len(cache):,} 2-grams, {cache.n_entries:,} entries, "
            f"{_mb(os.path.getsize(args.output))}, from {n_tokens:,} tokens in {len(corpora)} "
            f"corpus file{'s' if len(corpora) != 1 else ''} "
            f"(read {t_read:.2f} s, count {t_build:.2f} s, write {t_write:.2f} s; impl {impl.IMPLEMENTATION})"
        )
    return EXIT_OK


def _check_replay_options(args: argparse.Namespace) -> None:
    """-c and --n-draft within llama.cpp's ranges (int32), as one clear line."""
    if not 1 <= args.n_ctx <= INT32_MAX:
        raise UsageError(f"-c/--ctx-size must be between 1 and {INT32_MAX} (llama.cpp's int), got {args.n_ctx}")
    if not 0 <= args.n_draft <= INT32_MAX:
        raise UsageError(f"--n-draft must be between 0 and {INT32_MAX} (llama.cpp's int), got {args.n_draft}")


_MMAP_THRESHOLD: Final = 128 * 1024  # glibc's initial M_MMAP_THRESHOLD
_M_MMAP_THRESHOLD: Final = -3  # glibc's mallopt parameter number (malloc.h)


def _fixed_mmap_threshold() -> None:
    """Keep glibc's mmap threshold at its initial 128 KiB for this process (the command owns it).

    A replay grows the context cache's arrays by doubling. glibc raises its mmap threshold
    each time a block it mmapped is freed (up to 32 MiB), so the later, larger arrays come
    from the heap, and the blocks left behind by each doubling stay resident: about 15 MB
    of the WikiText replay's peak (99 -> 84 MB, ``MALLOC_MMAP_THRESHOLD_=131072`` has the
    same effect). A fixed threshold keeps large blocks mmapped: freed at once, grown by
    ``mremap``. Other C libraries, or no ``mallopt``: nothing to do.
    """
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)


def cmd_stats(args: argparse.Namespace) -> int:
    """``lookupdec stats``: replay a text (llama-lookup-stats)."""
    _check_replay_options(args)
    _fixed_mmap_threshold()
    impl = resolve_impl(args.impl)
    require_file(args.replay, "replay text")
    if args.static is not None:
        require_file(args.static, "static cache, -lcs")
    if args.branches < 1:
        raise UsageError(f"--branches must be >= 1, got {args.branches}")
    if args.branches > 1 and args.policy != "hybrid":
        raise UsageError(
            f"--branches {args.branches}: tree drafts are the hybrid policy's (llama.cpp's rule drafts one branch): "
            "give it with --policy hybrid"
        )
    if args.corpus is not None:
        if args.policy != "hybrid":
            raise UsageError("--corpus is matched by the hybrid policy: give it with --policy hybrid")
        require_file(args.corpus, "corpus, --corpus")
    tokens = _load_replay(args, args.replay)
    corpus: Sequence[int] | str | None = None
    if args.corpus is not None:
        from lookupdec.formats.corpus import is_corpus_file

        # a corpus file (create --corpus-out) is mapped as it is; anything else is read like REPLAY
        corpus = args.corpus if is_corpus_file(args.corpus) else _load_replay(args, args.corpus)
    if args.tokenizer is not None:
        from lookupdec.tokens import vocab_info

        n_vocab, fingerprint = vocab_info(args.tokenizer)
        if args.static is not None:
            _check_static_vocab(args.static, args.tokenizer, n_vocab, fingerprint)
        if args.dynamic is not None and os.path.exists(args.dynamic):
            _check_ids_in_vocab(args.dynamic, args.tokenizer, n_vocab)
    with progress_bar(_want_progress(args), "replay") as progress:
        stats = replay_stats(
            impl,
            tokens,
            static=args.static,
            dynamic=args.dynamic,
            n_ctx=args.n_ctx,
            n_draft=args.n_draft,
            in_memory=args.load,
            verify=args.verify,
            progress=progress,
            policy=args.policy,
            corpus=corpus,
            branches=args.branches,
        )
    stats["replay"] = args.replay
    stats["corpus"] = args.corpus
    if len(tokens) <= args.n_ctx:
        # llama-lookup-stats replays chunks while start + n_ctx < n_tokens: none here. Keep
        # its counts (all zero), but say why, since exit 0 with zeros looks like a result.
        warnings.warn(
            f"{args.replay}: {len(tokens):,} tokens, not more than -c {args.n_ctx:,}: nothing is replayed "
            "(llama.cpp does the same); give a smaller -c",
            stacklevel=1,
        )
    if args.json:
        print(json.dumps(stats, sort_keys=False))
        return EXIT_OK
    us = stats["us_per_drafted_token"]
    print(f"n_draft      = {stats['n_draft']}")
    print(f"n_predict    = {stats['n_predict']}")
    print(f"n_drafted    = {stats['n_drafted']}")
    print(f"t_draft_flat = {stats['t_draft_flat_ms']:.2f} ms")
    print(
        f"t_draft      = {stats['t_draft_ms']:.2f} ms, {us:.2f} us per token, "
        f"{stats['tokens_per_second']:.2f} tokens per second"
    )
    print(f"n_accept     = {stats['n_accept']}")
    print(f"accept       = {stats['accept']:.3f}%")
    print(
        f"impl         = {stats['impl']} (compiled: {'yes' if stats['compiled'] else 'no'}), "
        f"peak RSS {stats['peak_rss_mb']:.1f} MB"
    )
    tree = f", trees of up to {args.branches} branches (n_drafted: their nodes)" if args.branches > 1 else ""
    print(
        f"policy       = {stats['policy']}: {stats['n_steps']} steps, {stats['tokens_per_step']:.4f} tokens "
        f"per step, {stats['wasted_per_step']:.3f} wasted drafts per step{tree}"
    )
    return EXIT_OK


def _check_static_vocab(static: str, tokenizer: str, n_vocab: int, fingerprint: bytes) -> None:
    """Refuse a lookupdec static index built with another vocabulary than ``tokenizer``'s.

    Done here, on the header fields, rather than in the format readers: other files (legacy,
    fork) record no vocabulary and are used as they are.
    """
    from lookupdec import formats

    if formats.detect_format(static) != "lookupdec":
        _check_ids_in_vocab(static, tokenizer, n_vocab)
        return
    with formats.LookupdecIndexReader(static) as reader:
        size, fp = int(reader.vocab_size), bytes(reader.vocab_fingerprint)
    if not size:  # an index that records no vocabulary: read its ids
        _check_ids_in_vocab(static, tokenizer, n_vocab)
    if fp != bytes(8) and fp != fingerprint:
        raise UsageError(
            f"{static}: static index was built with another vocabulary (fingerprint {fp.hex()}) than "
            f"{tokenizer} ({fingerprint.hex()}); its token ids would mean other tokens"
        )
    if size and size != n_vocab:
        raise UsageError(
            f"{static}: static index was built for a vocabulary of {size:,} ids, {tokenizer} has {n_vocab:,}"
        )


def _check_ids_in_vocab(path: str, tokenizer: str, n_vocab: int) -> None:
    """Refuse a cache file holding a token id at or past ``tokenizer``'s vocabulary size.

    Such an id names a token the model does not have: the cache was made with another
    vocabulary, and drafting from it would silently draft worse.
    """
    from lookupdec import formats

    top = formats.max_token_id(path)
    if top >= n_vocab:
        raise UsageError(
            f"{path}: holds token id {top:,}, not below the vocabulary size of {tokenizer} ({n_vocab:,}); "
            "was it made with another vocabulary?"
        )


def cmd_merge(args: argparse.Namespace) -> int:
    """``lookupdec merge``: add caches together (llama-lookup-merge)."""
    impl = resolve_impl(args.impl)
    for path in args.inputs:
        require_file(path, "cache to merge")
    check_output_path(args.output, args.inputs)  # before the work: not a device, not an input
    if args.format == "lookupdec" and _all_indexes(args.inputs):
        return _merge_indexes(args)
    stream = getattr(impl, "merge_legacy_files", None)
    if args.format == "llama" and stream is not None and _all_legacy(args.inputs):
        # The fast path merges legacy files streaming, without building a cache: the same bytes.
        n_keys, n_entries = stream(args.inputs, args.output)
        _print_merged(args, n_keys, n_entries)
        return EXIT_OK
    merged = impl.NgramCache()
    for path in args.inputs:
        merged.merge(load_cache(impl, path))
    merged = saturate_counts(impl, merged, args.output)
    write_cache(merged, args.output, args.format)
    _print_merged(args, len(merged), merged.n_entries)
    return EXIT_OK


def _print_merged(args: argparse.Namespace, n_keys: int, n_entries: int) -> None:
    """The summary line of ``lookupdec merge`` (unless ``-q``)."""
    if not args.quiet:
        print(
            f"{args.output}: {args.format} cache, {n_keys:,} keys, {n_entries:,} entries, "
            f"{_mb(os.path.getsize(args.output))}, merged from {len(args.inputs)} file"
            f"{'s' if len(args.inputs) != 1 else ''}"
        )


def _all_legacy(paths: Sequence[str]) -> bool:
    from lookupdec.formats import detect_format

    return all(detect_format(path) == "llama" for path in paths)


def _all_indexes(paths: Sequence[str]) -> bool:
    from lookupdec.formats import detect_format

    return all(detect_format(path) == "lookupdec" for path in paths)


def _merge_indexes(args: argparse.Namespace) -> int:
    """``merge --format lookupdec`` of lookupdec indexes: streamed in bounded memory (lookupdec.builder)."""
    from lookupdec.builder import merge_indexes

    memory, _ = _budget(args)
    summary = merge_indexes(args.inputs, args.output, memory=memory)
    warn_saturated(args.output, summary.saturated)
    if not args.quiet:
        n = len(args.inputs)
        print(
            f"{args.output}: lookupdec cache, {summary.n_keys:,} keys, {summary.n_entries:,} entries, "
            f"{_mb(summary.file_size)}, merged from {n} file{'s' if n != 1 else ''}"
        )
    return EXIT_OK


def _kind(sizes: dict[int, int]) -> str:
    if not sizes:
        return "empty"
    if set(sizes) == {2}:
        return "static (2-grams only)"
    return f"dynamic or context (n-grams of sizes {', '.join(map(str, sorted(sizes)))})"


def inspect_cache(path: str, top: int = 10, verify: bool = False) -> dict[str, Any]:
    """What ``lookupdec inspect`` reports about a cache file, as a JSON-ready dict.

    Built on :func:`lookupdec.formats.inspect_file`; ``verify`` runs the full check of the
    format (for the lookupdec index: the checksum and every structural rule; for a legacy
    file: trailing bytes become an error) and raises :class:`CacheFormatError` on failure.
    """
    from lookupdec import formats

    require_file(path, "cache file")
    raw = formats.inspect_file(path, verify=verify, top=top)
    for message in raw.get("warnings") or []:
        warnings.warn(message, stacklevel=2)
    sizes = {int(n): int(c) for n, c in (raw.get("key_sizes") or {}).items() if c}
    n_keys = int(raw["n_keys"])
    n_entries = int(raw["n_entries"])
    info: dict[str, Any] = {
        "file": path,
        "format": raw["format"],
        "file_bytes": int(raw["file_size"]),
        "kind": _kind(sizes),
        "n_keys": n_keys,
        "keys_by_ngram_size": {str(n): sizes[n] for n in sorted(sizes)},
        "n_entries": n_entries,
        "mean_followers": n_entries / n_keys if n_keys else 0.0,
        "total_count": int(raw["total_count"]),
        "verified": bool(raw.get("verified")),
        "details": raw.get("details") or {},
    }
    rows = raw.get("top")
    if rows is None:
        info["heaviest"] = None  # a fork v1 file cannot be enumerated
    else:
        info["heaviest"] = [
            {
                "ngram": [int(t) for t in r["ngram"]],
                "total": int(r["total"]),
                "n_followers": int(r["n_followers"]),
                "top_followers": [[int(t), int(c)] for t, c in r["followers"]],
            }
            for r in rows
        ]
    return info


def cmd_inspect(args: argparse.Namespace) -> int:
    """``lookupdec inspect``: describe a cache file."""
    if args.top < 0:
        raise UsageError(f"--top must be >= 0, got {args.top}")
    info = inspect_cache(args.file, top=args.top, verify=args.verify)
    if args.json:
        print(json.dumps(info))
        return EXIT_OK
    rows = [
        ("file", info["file"]),
        ("format", info["format"]),
        ("kind", info["kind"]),
        ("file size", f"{info['file_bytes']:,} bytes ({_mb(info['file_bytes'])})"),
        (
            "keys",
            f"{info['n_keys']:,}  (by n-gram size: "
            + (", ".join(f"{n}: {c:,}" for n, c in info["keys_by_ngram_size"].items()) or "none")
            + ")",
        ),
        ("entries", f"{info['n_entries']:,} (key, follower) pairs, {info['mean_followers']:.2f} per key"),
        ("total count", f"{info['total_count']:,} observations"),
    ]
    for name, value in info["details"].items():
        rows.append((name.replace("_", " "), f"{value:,}" if isinstance(value, int) else str(value)))
    if args.verify:
        rows.append(("verify", "ok (every check of the format passed)"))
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    if info["heaviest"] is None:
        print("\nheaviest n-grams: not available (a fork v1 file has no key table)")
    elif info["heaviest"]:
        print("\nheaviest n-grams (by total count; top followers as token x count):")
        print(f"  {'rank':>4}  {'n-gram':<28} {'total':>11} {'followers':>9}  top followers")
        for rank, h in enumerate(info["heaviest"], 1):
            ngram = " ".join(str(t) for t in h["ngram"])
            tops = ", ".join(f"{t}x{c}" for t, c in h["top_followers"])
            print(f"  {rank:>4}  {ngram:<28} {h['total']:>11,} {h['n_followers']:>9,}  {tops}")
    return EXIT_OK


def cmd_tokenize(args: argparse.Namespace) -> int:
    """``lookupdec tokenize``: a text file to raw int32 ids with a model's vocabulary (llama.cpp's ids)."""
    from lookupdec._atomic import atomic_writer
    from lookupdec.tokenizer.stream import iter_file_ids, write_ids
    from lookupdec.tokens import exact_tokenizer

    require_file(args.text, "text file")
    require_file(args.tokenizer, "vocabulary, --tokenizer")
    if args.workers is not None and args.workers < 1:
        raise UsageError(f"--workers must be >= 1, got {args.workers}")
    t0 = time.perf_counter()
    tok = exact_tokenizer(args.tokenizer)
    if tok is None:
        raise UsageError(f"{args.tokenizer}: not a vocabulary lookupdec tokenizes exactly (give a .gguf)")
    t_load = time.perf_counter() - t0
    t0 = time.perf_counter()
    with progress_bar(_want_progress(args), "tokenize") as progress, atomic_writer(args.output) as f:
        parts = iter_file_ids(
            args.text,
            tok,
            add_special=args.add_special,
            parse_special=args.parse_special,
            workers=args.workers,
            progress=progress,
        )
        n = write_ids(parts, f)
    t_encode = time.perf_counter() - t0
    if not args.quiet:
        size = os.path.getsize(args.text)
        print(
            f"{args.output}: {n:,} tokens from {_mb(size)} of text in {t_encode:.2f} s "
            f"({size / 1e6 / max(t_encode, 1e-9):.1f} MB/s; vocabulary {tok.n_vocab:,} ids, engine {tok.engine}, "
            f"loaded in {t_load:.2f} s)"
        )
    return EXIT_OK


def cmd_demo(args: argparse.Namespace) -> int:
    """``lookupdec demo``: the pipeline on the shipped data."""
    from lookupdec.demo import run_demo

    _check_replay_options(args)
    impls = [args.impl] if args.impl else None
    if impls:
        resolve_impl(impls[0])
    run_demo(impls=impls, n_ctx=args.n_ctx, n_draft=args.n_draft, progress=_want_progress(args), as_json=args.json)
    return EXIT_OK


# --------------------------------------------------------------------------------------
# the parser


def _version_text() -> str:
    return f"lookupdec {lookupdec.__version__} (compiled: {'yes' if lookupdec.COMPILED else 'no'})"


def _add_input_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("input (token files or text)")
    kind = g.add_mutually_exclusive_group()
    kind.add_argument(
        "--tokens",
        action="store_true",
        help="inputs are token files: raw little-endian int32 ids, or .npy by extension "
        "(the default for names ending in .bin or .npy); used as they are, no BOS added",
    )
    kind.add_argument(
        "--tokenizer",
        metavar="T",
        help="inputs are UTF-8 text, tokenized with this vocabulary: a llama.cpp .gguf (llama.cpp's ids) "
        "or a Hugging Face tokenizer.json",
    )
    g.add_argument(
        "--add-bos",
        dest="add_bos",
        action="store_true",
        default=None,
        help="with --tokenizer: always put the BOS token in front. By default the tokenizer's own "
        "post-processor decides, as llama.cpp's add_special=true does (Llama 3 adds one)",
    )
    g.add_argument("--no-add-bos", dest="add_bos", action="store_false", help="with --tokenizer: add no special tokens")


def _add_budget_options(p: argparse.ArgumentParser, workers: bool = True) -> None:
    p.add_argument(
        "--memory", metavar="SIZE",
        help="memory budget for the lookupdec format, e.g. 512M, 2G (K/M/G; default: a quarter of RAM, at "
        "most 2G); above it sorted runs spill to a temporary folder ($TMPDIR); the file is the same",
    )  # fmt: skip
    if workers:
        p.add_argument(
            "--workers", type=int, metavar="N",
            help="processes counting in parallel (default: every core); the file is the same for any N",
        )  # fmt: skip
    else:
        p.set_defaults(workers=None)


def _add_impl_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--impl",
        choices=IMPLEMENTATIONS,
        help=f"implementation to run (default: {lookupdec.IMPLEMENTATION}, what 'import lookupdec' chose)",
    )


def _add_command(
    sub: Any, name: str, *, summary: str, description: str, examples: str, func: Callable[[argparse.Namespace], int]
) -> argparse.ArgumentParser:
    """Add subcommand ``name`` with its description and an ``examples:`` epilog."""
    p: argparse.ArgumentParser = sub.add_parser(
        name,
        help=summary,
        description=textwrap.fill(description, 79, break_on_hyphens=False),
        epilog="examples:\n" + textwrap.indent(textwrap.dedent(examples).strip("\n"), "  "),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    p.set_defaults(func=func)
    return p


def _add_replay_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "-c", "--ctx-size", dest="n_ctx", type=int, default=4096, metavar="N_CTX", help="chunk length (default 4096)"
    )
    p.add_argument(
        "--n-draft", "--draft", dest="n_draft", type=int, default=8, metavar="N",
        help="most tokens drafted per step (default 8)",
    )  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``lookupdec`` command (all subcommands)."""
    parser = _Parser(
        prog="lookupdec",
        description=textwrap.fill(
            "n-gram (prompt lookup) speculative drafting, compatible with llama.cpp's lookup caches and tools "
            "(llama-lookup-create, -stats, -merge). Same counts as llama.cpp on the same tokens.",
            79,
            break_on_hyphens=False,
        ),
        epilog="examples:\n"
        "  lookupdec demo\n"
        "  lookupdec create enwiki.llama3.bin -o static.lkdc\n"
        "  lookupdec stats --tokens wiki.test.raw.llama3.bin -lcs static.lkdc --json\n"
        "  lookupdec inspect static.lkdc --verify\n\n"
        "run 'lookupdec COMMAND --help' for each command's options.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    parser.add_argument("--version", action="version", version=_version_text())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    p = _add_command(
        sub,
        "create",
        summary="build a static 2-gram cache from corpora (llama-lookup-create)",
        description="Build a static cache: every 2-gram of the corpora with the counts of the tokens that "
        "follow it. Mirrors llama.cpp's llama-lookup-create (-f CORPUS -lcs STATIC). Several corpora are "
        "counted separately (no 2-gram spans two files) and added up, as merging their caches would. "
        "Formats: lookupdec (static index that opens in constant time; the default), llama (llama.cpp's "
        "legacy file, what -lcs of llama-lookup and llama-lookup-stats reads), fork-v2 (the optimized fork's).",
        examples="""
            lookupdec create enwiki_wt.10M.llama3.bin -o enwiki.lkdc
            lookupdec create a.bin b.npy -o static.bin --format llama      # llama.cpp's own format
            lookupdec create corpus.txt --tokenizer tokenizer.json -o static.lkdc
            lookupdec create big-*.bin -o big.lkdc --memory 2G --workers 8    # bounded memory
            lookupdec create big-*.bin -o big.lkdc --dask tcp://scheduler:8786 # on a Dask cluster
            lookupdec create enwiki_wt.10M.llama3.bin -o enwiki.lkdc --corpus-out enwiki.lkcorpus  # + hybrid corpus
            """,
        func=cmd_create,
    )
    p.add_argument("corpus", nargs="+", metavar="CORPUS", help="token file(s) or text file(s)")
    p.add_argument("-o", "--output", required=True, metavar="STATIC", help="the static cache file to write")
    p.add_argument("--format", choices=STATIC_FORMATS, default="lookupdec", help="file format (default: lookupdec)")
    p.add_argument(
        "--vocab-size", type=int, metavar="N", help="vocabulary size to record (default: from --tokenizer, else 0)"
    )
    _add_input_options(p)
    _add_impl_option(p)
    _add_budget_options(p)
    p.add_argument(
        "--dask", metavar="ADDRESS",
        help="count on the Dask cluster at ADDRESS (needs 'pip install lookupdec[dask]'; workers must read the "
        "corpus files at the same paths); same bytes as a local create",
    )  # fmt: skip
    p.add_argument(
        "--corpus-out", metavar="CORPUS_FILE",
        help="also write the hybrid policy's corpus file of the same corpora (their ids and a suffix structure "
        "over them, about 32 bytes per token; never written by default): give it to 'stats --policy hybrid "
        "--corpus' or Drafter(policy='hybrid', corpus=PATH), which memory-map it in constant time",
    )  # fmt: skip
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar and no summary line")

    p = _add_command(
        sub,
        "stats",
        summary="replay a text and count drafted/accepted tokens (llama-lookup-stats)",
        description="Replay a text as llama.cpp's llama-lookup-stats does: cut it into chunks of N_CTX tokens, "
        "generate each chunk token by token with the text as ground truth, draft up to N_DRAFT tokens after "
        "every token from the context, dynamic and static caches, and count the drafted and accepted "
        "tokens. The context cache is merged into the dynamic cache after every chunk (the dynamic file is "
        "never written). Same flags as llama.cpp: -lcs, -lcd, -c; llama.cpp's equivalent is "
        "'llama-lookup-stats -m MODEL -f TEXT -lcs STATIC -lcd DYNAMIC -c 4096 --draft 8'.",
        examples="""
            lookupdec stats wiki.test.raw.llama3.bin
            lookupdec stats --tokens wiki.test.raw.llama3.bin -lcs enwiki.lkdc -c 4096 --n-draft 8
            lookupdec stats wiki.test.raw --tokenizer tokenizer.json -lcs static.bin --json
            lookupdec stats wiki.test.raw.llama3.bin -lcs enwiki.lkdc --policy hybrid --json
            lookupdec stats wiki.test.raw.llama3.bin -lcs enwiki.lkdc --policy hybrid --corpus enwiki.lkcorpus
            lookupdec stats wiki.test.raw.llama3.bin -lcs enwiki.lkdc --policy hybrid --branches 3  # tree drafts
            """,
        func=cmd_stats,
    )
    p.add_argument("replay", metavar="REPLAY", help="the text to replay (token file or text)")
    p.add_argument(
        "-lcs", "--lookup-cache-static", dest="static", metavar="STATIC",
        help="static cache file, any format (lookupdec, llama, fork-v1/v2; detected); must exist",
    )  # fmt: skip
    p.add_argument(
        "-lcd", "--lookup-cache-dynamic", dest="dynamic", metavar="DYNAMIC",
        help="dynamic cache file (llama format); a missing file is an empty cache, as in llama.cpp",
    )  # fmt: skip
    _add_replay_options(p)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of llama.cpp's lines")
    p.add_argument(
        "--policy", choices=("llama", "hybrid"), default="llama",
        help="drafting policy: 'llama' is llama.cpp's rule, exactly (default); 'hybrid' continues its drafts "
        "with the longest suffix match over the chunks replayed so far (more tokens per step, more drafted; "
        "see README 'The hybrid policy')",
    )  # fmt: skip
    p.add_argument(
        "--branches", type=int, default=1, metavar="N",
        help="hybrid only: draft a tree of up to N branches per step, for engines that verify trees "
        "(default 1: one draft, as a linear verifier takes). Branch 0 is the linear draft; the others are "
        "alternatives (llama.cpp's own draft where the policy cut or replaced it, the suffix match's "
        "runner-up continuations, the suffix-only draft). A step accepts the longest prefix any branch "
        "shares with the text; n_drafted counts the tree's distinct nodes (shared prefixes once). "
        "The policy learns from branch 0 alone, so its drafts are the linear policy's",
    )  # fmt: skip
    p.add_argument(
        "--corpus", metavar="CORPUS",
        help="hybrid only: a corpus the suffix match follows too, older than every request: a corpus file "
        "(create --corpus-out; memory-mapped, opened in constant time) or a text read like REPLAY, e.g. the "
        "static index's corpus (then built in memory: the process peaks about 46 bytes per corpus token "
        "higher); what Drafter(policy='hybrid', corpus=...) does",
    )  # fmt: skip
    p.add_argument(
        "--load", action="store_true",
        help="copy the static file (and a --corpus file) into memory instead of memory-mapping it (slower "
        "open, no SIGBUS risk; on Linux in transparent huge pages; lookups about as fast as mapped). "
        "Without it a lookupdec index is memory-mapped: a program that truncates or rewrites the file in "
        "place while stats runs can make it die with SIGBUS (lookupdec itself always writes a new file and "
        "renames it, never in place)",
    )  # fmt: skip
    p.add_argument(
        "--verify", action="store_true",
        help="fully check the static cache before replaying (for a lookupdec index: checksum and every rule; "
        "opening it otherwise checks only the header, and each part when it is first looked up)",
    )  # fmt: skip
    _add_input_options(p)
    _add_impl_option(p)
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")

    p = _add_command(
        sub,
        "merge",
        summary="add several caches into one (llama-lookup-merge)",
        description="Add the counts of several cache files into one, like llama.cpp's llama-lookup-merge "
        "(which takes IN... OUT). Inputs may be in any format; the output is llama.cpp's legacy format "
        "unless --format says otherwise (lookupdec and fork-v2 hold static caches only).",
        examples="""
            lookupdec merge dynamic-1.bin dynamic-2.bin -o dynamic.bin
            lookupdec merge part-a.lkdc part-b.lkdc -o static.lkdc --format lookupdec
            """,
        func=cmd_merge,
    )
    p.add_argument("inputs", nargs="+", metavar="IN", help="cache files to add together")
    p.add_argument("-o", "--output", required=True, metavar="OUT", help="the cache file to write")
    p.add_argument("--format", choices=STATIC_FORMATS, default="llama", help="file format (default: llama)")
    _add_budget_options(p, workers=False)
    _add_impl_option(p)
    p.add_argument("-q", "--quiet", action="store_true", help="no summary line")

    p = _add_command(
        sub,
        "inspect",
        summary="describe a cache file: kind, sizes, counts, heaviest n-grams",
        description="Describe a cache file of any format: its format and kind (static 2-grams, or a "
        "dynamic/context cache of 1..4-grams), file size, key and follower counts, and the heaviest "
        "n-grams. No llama.cpp counterpart. --verify runs the full integrity check (for the lookupdec "
        "format: the checksum and every structural rule, which opening the file skips).",
        examples="""
            lookupdec inspect enwiki.lkdc
            lookupdec inspect dynamic.bin --top 20
            lookupdec inspect static.lkdc --verify --json
            """,
        func=cmd_inspect,
    )
    p.add_argument("file", metavar="FILE", help="cache file (lookupdec, llama, fork-v1 or fork-v2)")
    p.add_argument("--verify", action="store_true", help="full integrity check (strict: trailing bytes are errors)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--top", type=int, default=10, metavar="N", help="how many heaviest n-grams to list (default 10)")

    p = _add_command(
        sub,
        "tokenize",
        summary="tokenize a text file with a model's vocabulary, as llama.cpp does (GGUF)",
        description="Tokenize a UTF-8 text file as one text with a model's own vocabulary and write the ids as "
        "raw little-endian int32 (the token file format create and stats read). The ids are llama.cpp's "
        "(llama_tokenize with add_special and parse_special on, as llama-lookup-create and -stats use): "
        "BOS when the vocabulary asks for it, special-token text such as <|begin_of_text|> read as the "
        "special token. VOCAB is a .gguf file (vocabulary-only or a full model; only its header is read) "
        "or a byte-level BPE tokenizer.json of a type llama.cpp knows. Large files are streamed in bounded "
        "memory and encoded on every core; the ids equal those of encoding the whole file at once.",
        examples="""
            lookupdec tokenize wiki.test.raw --tokenizer ggml-vocab-llama-bpe.gguf -o wiki.test.llama3.bin
            lookupdec tokenize corpus.txt --tokenizer Meta-Llama-3-8B.Q4_K_M.gguf -o corpus.bin --workers 4
            lookupdec tokenize prompt.txt --tokenizer qwen2.gguf -o p.bin --no-add-special --no-parse-special
            """,
        func=cmd_tokenize,
    )
    p.add_argument("text", metavar="TEXT_FILE", help="UTF-8 text, tokenized as one text (one BOS)")
    p.add_argument("--tokenizer", required=True, metavar="VOCAB", help="the model's .gguf (or a tokenizer.json)")
    p.add_argument("-o", "--output", required=True, metavar="OUT", help="the token file to write (raw int32)")
    p.add_argument(
        "--no-add-special", dest="add_special", action="store_false",
        help="add no BOS/EOS (llama.cpp's add_special=false); by default the vocabulary's add_bos/add_eos decide",
    )  # fmt: skip
    p.add_argument(
        "--no-parse-special", dest="parse_special", action="store_false",
        help="keep control-token text such as <|begin_of_text|> as plain text (parse_special=false)",
    )  # fmt: skip
    p.add_argument("--workers", type=int, metavar="N", help="processes encoding in parallel (default: every CPU)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar and no summary line")

    p = _add_command(
        sub,
        "demo",
        summary="build a static cache and replay a text from data shipped with lookupdec",
        description="The main job on real data shipped with the package (Llama-3 token ids of English "
        "Wikipedia text; see lookupdec/data/README.md): build a static cache from the shipped corpus in a "
        "temporary folder, replay the shipped WikiText test slice with and without it, for each "
        "implementation present, and print acceptance, drafted and accepted tokens, time per drafted "
        "token and static load time. Like running llama-lookup-create, then llama-lookup-stats twice.",
        examples="""
            lookupdec demo
            lookupdec demo --impl reference
            lookupdec demo --json
            """,
        func=cmd_demo,
    )
    _add_impl_option(p)
    _add_replay_options(p)
    p.add_argument("--json", action="store_true", help="print the rows as one JSON object")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``lookupdec`` command with ``argv`` (default: ``sys.argv[1:]``); return the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help, --version, usage errors
        return e.code if isinstance(e.code, int) else (EXIT_OK if e.code is None else EXIT_ERROR)
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_ERROR
    debug = os.environ.get("LOOKUPDEC_DEBUG") == "1"
    old_showwarning = warnings.showwarning
    warnings.showwarning = _show_warning
    try:
        code: int = args.func(args)
        return code
    except BrokenPipeError:  # e.g. 'lookupdec inspect x | head'
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK
    except (LookupdecError, OSError, ValueError) as e:
        if debug:
            raise
        sys.stderr.write(f"lookupdec: error: {_format_error(e)}\n")
        return EXIT_ERROR
    except KeyboardInterrupt:
        sys.stderr.write("lookupdec: interrupted\n")
        return 130
    finally:
        warnings.showwarning = old_showwarning


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
