"""``lookupdec create``: build a static 2-gram cache from corpora (llama-lookup-create).

The lookupdec format is counted by :mod:`lookupdec.builder` (bounded memory, every core, or a
Dask cluster); llama.cpp's and the fork's formats by an implementation's ``NgramCache``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from lookupdec._atomic import check_output_path, written_together
from lookupdec.cli._common import (
    EXIT_OK,
    STATIC_FORMATS,
    add_budget_options,
    add_command,
    add_impl_option,
    add_input_options,
    budget,
    load_input,
    load_input_array,
    load_replay,
    mb,
    refuse_lookup_file,
    want_progress,
    warn_unused_memory,
)
from lookupdec.cli._pipeline import (
    build_static_cache,
    peak_rss_mb,
    progress_bar,
    require_file,
    resolve_impl,
    write_cache,
    write_corpus_file,
)
from lookupdec.errors import UsageError, warn_saturated

Report = Callable[[], str]
"""A line of ``create``'s summary, made once its files are in place."""


def cmd_create(args: argparse.Namespace) -> int:
    """``lookupdec create``: build a static cache (llama-lookup-create)."""
    impl = resolve_impl(args.impl)  # checked first for every format, though only llama and fork-v2 use it
    budget(args)  # checked for every format too; only the lookupdec format's builder uses it
    warn_unused_memory(args, args.format == "lookupdec")
    for path in args.corpus:
        require_file(path, "corpus")
        refuse_lookup_file(path)  # every reader below (the builder's own too) takes ids or text
    inputs = list(args.corpus)
    if args.tokenizer is not None:
        require_file(args.tokenizer, "vocabulary, --tokenizer")  # a fifo would block its read
        inputs.append(args.tokenizer)
    check_output_path(args.output, inputs)  # before the work: not a device, not an input
    if args.corpus_out is not None:
        check_output_path(args.corpus_out, inputs, outputs=[args.output])
    vocab_size, fingerprint = 0, b""
    if args.tokenizer is not None:
        from lookupdec.tokens import vocab_info

        vocab_size, fingerprint = vocab_info(args.tokenizer)
    if args.vocab_size is not None:
        if not 1 <= args.vocab_size <= 1 << 31:  # recorded in a header, and bounds the ids
            raise UsageError(f"--vocab-size must be in 1..2^31, got {args.vocab_size}")
        vocab_size = args.vocab_size
    # -o and --corpus-out are put in place together at the end, or neither is (a full disk while
    # the corpus file is written must not leave a new index beside the old corpus file).
    with written_together():
        reports = [_create_static(args, impl, vocab_size, fingerprint)]
        if args.corpus_out is not None:
            reports.append(_write_corpus_out(args, vocab_size, fingerprint))
    if not args.quiet:
        for report in reports:  # after the files are in place: the reports read their sizes
            print(report())
    return EXIT_OK


def _create_static(args: argparse.Namespace, impl: Any, vocab_size: int, fingerprint: bytes) -> Report:
    """The static cache of ``create`` (-o) in the format asked for."""
    if args.format == "lookupdec":
        return _create_index(args, vocab_size, fingerprint)
    if args.dask is not None:
        raise UsageError("--dask builds the lookupdec format only; convert with 'lookupdec merge --format ...'")
    t0 = time.perf_counter()
    corpora = [load_input(args, path) for path in args.corpus]
    t_read = time.perf_counter() - t0
    _check_below_vocab(args.corpus, corpora, vocab_size)
    t0 = time.perf_counter()
    with progress_bar(want_progress(args), "create") as progress:
        cache = build_static_cache(impl, corpora, progress)
    t_build = time.perf_counter() - t0
    t0 = time.perf_counter()
    write_cache(cache, args.output, args.format, vocab_size=vocab_size, vocab_fingerprint=fingerprint)
    t_write = time.perf_counter() - t0
    n_tokens, n_corpora = sum(len(c) for c in corpora), len(corpora)
    n_keys, n_entries = len(cache), cache.n_entries
    return lambda: (
        f"{args.output}: {args.format} static cache, {n_keys:,} 2-grams, {n_entries:,} entries, "
        f"{mb(os.path.getsize(args.output))}, from {n_tokens:,} tokens in {n_corpora} "
        f"corpus file{'s' if n_corpora != 1 else ''} "
        f"(read {t_read:.2f} s, count {t_build:.2f} s, write {t_write:.2f} s; impl {impl.IMPLEMENTATION})"
    )


def _check_below_vocab(paths: Sequence[str], parts: Sequence[Sequence[int]], vocab_size: int) -> None:
    """UsageError naming the first of ``paths`` whose ids reach ``vocab_size`` (0: no vocabulary, no check)."""
    if not vocab_size:
        return
    for path, part in zip(paths, parts, strict=True):
        top = max(part, default=-1)
        if top >= vocab_size:
            raise UsageError(f"{path}: token id {top} is not below the vocabulary size {vocab_size}")


def _create_index(args: argparse.Namespace, vocab_size: int, fingerprint: bytes) -> Report:
    """``create --format lookupdec``: bounded memory, every core, or a Dask cluster (lookupdec.builder)."""
    memory, workers = budget(args)
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
        return [load_input_array(args, path) for path in args.corpus]
    from lookupdec.builder._write import spill_folder  # a full disk there is named as the builder's are

    tmp = stack.enter_context(spill_folder("lookupdec-create-"))
    files: list[Any] = []
    for i, path in enumerate(args.corpus):  # each checked by cmd_create (require_file)
        out = os.path.join(tmp, f"corpus-{i:04d}.i32")
        with (
            progress_bar(want_progress(args), f"tokenize {os.path.basename(path)}", unit="B") as progress,
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
) -> Report:
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
    with progress_bar(want_progress(args), "create") as progress:
        summary = run(
            corpora, args.output, memory=memory, vocab_size=vocab_size, vocab_fingerprint=fingerprint,
            progress=progress, **extra,
        )  # fmt: skip
    warn_saturated(args.output, summary.saturated)
    n_files, seconds, rss = len(args.corpus), time.perf_counter() - t0, peak_rss_mb()
    return lambda: (
        f"{args.output}: lookupdec static cache, {summary.n_keys:,} 2-grams, {summary.n_entries:,} entries, "
        f"{mb(summary.file_size)}, from {n_files} corpus file{'s' if n_files != 1 else ''} "
        f"in {seconds:.2f} s (peak RSS {rss:.0f} MB)"
    )


def _write_corpus_out(args: argparse.Namespace, vocab_size: int, fingerprint: bytes) -> Report:
    """``create --corpus-out``: the hybrid policy's corpus file of the same corpora (one document each)."""
    t0 = time.perf_counter()
    parts = [load_replay(args, path) for path in args.corpus]
    _check_below_vocab(args.corpus, parts, vocab_size)
    try:
        corpus = write_corpus_file(parts, args.corpus_out, vocab_size, fingerprint)
    except ValueError as e:  # a negative id
        raise UsageError(f"--corpus-out: {e}") from None
    seconds = time.perf_counter() - t0
    return lambda: (
        f"{args.corpus_out}: lookupdec corpus file, {corpus.n_tokens:,} ids, {corpus.n_bigrams:,} bigrams, "
        f"{mb(os.path.getsize(args.corpus_out))}, in {seconds:.2f} s"
    )


def add_parser(sub: Any) -> None:
    """Add ``create`` and its options to the subparsers ``sub``."""
    p = add_command(
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
    add_input_options(p)
    add_impl_option(p)
    add_budget_options(p)
    p.add_argument(
        "--dask", metavar="ADDRESS",
        help="count on the Dask cluster at ADDRESS (needs 'pip install lookupdec[dask]'; workers must read the "
        "corpus files at the same paths); same bytes as a local create",
    )  # fmt: skip
    p.add_argument(
        "--corpus-out", metavar="CORPUS_FILE",
        help="also write the hybrid policy's corpus file of the same corpora (their ids and a suffix structure "
        "over them; never written by default): give it to 'stats --policy hybrid --corpus' or "
        "Drafter(policy='hybrid', corpus=PATH), which memory-map it in constant time",
    )  # fmt: skip
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar and no summary line")
