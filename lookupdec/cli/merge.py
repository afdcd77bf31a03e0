"""``lookupdec merge``: add several caches into one (llama-lookup-merge)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from typing import Any

from lookupdec._atomic import check_output_path
from lookupdec.cli._common import (
    EXIT_OK,
    STATIC_FORMATS,
    add_budget_options,
    add_command,
    add_impl_option,
    budget,
    mb,
    warn_unused_memory,
)
from lookupdec.cli._pipeline import load_cache, require_file, resolve_impl, saturate_counts, write_cache
from lookupdec.errors import warn_saturated


def cmd_merge(args: argparse.Namespace) -> int:
    """``lookupdec merge``: add caches together (llama-lookup-merge)."""
    impl = resolve_impl(args.impl)
    for path in args.inputs:
        require_file(path, "cache to merge")
    check_output_path(args.output, args.inputs)  # before the work: not a device, not an input
    budget(args)  # checked whichever path runs; only the streamed merge of lookupdec indexes uses it
    streamed = args.format == "lookupdec" and _all_of_format(args.inputs, "lookupdec")
    warn_unused_memory(args, streamed)
    if streamed:
        return _merge_indexes(args)
    stream = getattr(impl, "merge_legacy_files", None)
    if args.format == "llama" and stream is not None and _all_of_format(args.inputs, "llama"):
        # The fast path merges legacy files streaming, without building a cache: the same bytes.
        n_keys, n_entries = stream(args.inputs, args.output)
        _print_merged(args, n_keys, n_entries, os.path.getsize(args.output))
        return EXIT_OK
    merged = impl.NgramCache()
    for path in args.inputs:
        merged.merge(load_cache(impl, path))
    merged = saturate_counts(impl, merged, args.output)
    write_cache(merged, args.output, args.format)
    _print_merged(args, len(merged), merged.n_entries, os.path.getsize(args.output))
    return EXIT_OK


def _print_merged(args: argparse.Namespace, n_keys: int, n_entries: int, file_size: int) -> None:
    """The summary line of ``lookupdec merge`` (unless ``-q``)."""
    if not args.quiet:
        n = len(args.inputs)
        print(
            f"{args.output}: {args.format} cache, {n_keys:,} keys, {n_entries:,} entries, "
            f"{mb(file_size)}, merged from {n} file{'s' if n != 1 else ''}"
        )


def _all_of_format(paths: Sequence[str], fmt: str) -> bool:
    """Whether every file of ``paths`` is in format ``fmt`` (as detected)."""
    from lookupdec.formats import detect_format

    return all(detect_format(path) == fmt for path in paths)


def _merge_indexes(args: argparse.Namespace) -> int:
    """``merge --format lookupdec`` of lookupdec indexes: streamed in bounded memory (lookupdec.builder)."""
    from lookupdec.builder import merge_indexes

    memory, _ = budget(args)
    summary = merge_indexes(args.inputs, args.output, memory=memory)
    warn_saturated(args.output, summary.saturated)
    _print_merged(args, summary.n_keys, summary.n_entries, summary.file_size)
    return EXIT_OK


def add_parser(sub: Any) -> None:
    """Add ``merge`` and its options to the subparsers ``sub``."""
    p = add_command(
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
    add_budget_options(p, workers=False)
    add_impl_option(p)
    p.add_argument("-q", "--quiet", action="store_true", help="no summary line")
