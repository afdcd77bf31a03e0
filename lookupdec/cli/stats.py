"""``lookupdec stats``: replay a text and count drafted/accepted tokens (llama-lookup-stats)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from collections.abc import Sequence
from typing import Any, Final

import lookupdec
from lookupdec.cli._common import (
    EXIT_OK,
    add_command,
    add_impl_option,
    add_input_options,
    add_replay_options,
    check_replay_options,
    load_replay,
    want_progress,
)
from lookupdec.cli._pipeline import progress_bar, replay_stats, require_file, resolve_impl
from lookupdec.errors import UsageError
from lookupdec.reference.hybrid import TARGET_WASTE
from lookupdec.rules import check_branches, check_corpus, check_target_waste, check_vocab_fingerprint

_MMAP_THRESHOLD: Final = 128 * 1024  # glibc's initial M_MMAP_THRESHOLD
_M_MMAP_THRESHOLD: Final = -3  # glibc's mallopt parameter number (malloc.h)


def _fixed_mmap_threshold() -> None:
    """Keep glibc's mmap threshold at its initial 128 KiB for this process (the command owns it).

    A replay grows the context cache's arrays by doubling. glibc raises its mmap threshold
    each time a block it mmapped is freed (up to 32 MiB), so the later, larger arrays come
    from the heap, and the blocks left behind by each doubling stay resident and raise the
    peak (``MALLOC_MMAP_THRESHOLD_=131072`` has the same effect). A fixed threshold keeps
    large blocks mmapped: freed at once, grown by ``mremap``. Other C libraries, or no
    ``mallopt``: nothing to do.
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
    check_replay_options(args)
    _fixed_mmap_threshold()
    impl = resolve_impl(args.impl)
    require_file(args.replay, "replay text")
    if args.tokenizer is not None:
        require_file(args.tokenizer, "vocabulary, --tokenizer")  # a fifo would block its read
    if args.static is not None:
        require_file(args.static, "static cache, -lcs")
    check_branches(args.branches, args.policy, flags=True)
    check_corpus(args.corpus, args.policy, flags=True)
    check_target_waste(args.target_waste, args.policy, flags=True)
    if args.corpus is not None:
        require_file(args.corpus, "corpus, --corpus")
    tokens = load_replay(args, args.replay)
    corpus: Sequence[int] | str | None = None
    if args.corpus is not None:
        from lookupdec.formats.corpus import is_corpus_file

        # a corpus file (create --corpus-out) is mapped as it is; anything else is read like REPLAY
        corpus = args.corpus if is_corpus_file(args.corpus) else load_replay(args, args.corpus)
    if args.tokenizer is not None:
        from lookupdec.tokens import vocab_info

        n_vocab, fingerprint = vocab_info(args.tokenizer)
        if args.static is not None:
            _check_static_vocab(args.static, args.tokenizer, n_vocab, fingerprint)
        if args.dynamic is not None and os.path.exists(args.dynamic):
            _check_ids_in_vocab(args.dynamic, args.tokenizer, n_vocab)
    with progress_bar(want_progress(args), "replay") as progress:
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
            target_waste=args.target_waste,
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
    else:
        _print_stats(stats, args.branches)
    return EXIT_OK


def _print_stats(stats: dict[str, Any], branches: int) -> None:
    """The result as llama-lookup-stats prints it, then lookupdec's own lines."""
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
    tree = f", trees of up to {branches} branches (n_drafted: their nodes)" if branches > 1 else ""
    print(
        f"policy       = {stats['policy']}: {stats['n_steps']} steps, {stats['tokens_per_step']:.4f} tokens "
        f"per step, {stats['wasted_per_step']:.3f} wasted drafts per step{tree}"
    )


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
    check_vocab_fingerprint(static, "static index", fp, fingerprint)
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


def add_parser(sub: Any) -> None:
    """Add ``stats`` and its options to the subparsers ``sub``."""
    p = add_command(
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
    add_replay_options(p)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of llama.cpp's lines")
    p.add_argument(
        "--policy", choices=lookupdec.POLICIES, default="llama",
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
        "--target-waste", type=float, default=None, metavar="W",
        help="hybrid only: the rejected drafted tokens per step the policy steers to (default "
        f"{TARGET_WASTE:g}). Lower "
        "drafts less that fails, for engines where a rejected token costs (e.g. W=0.5 on a CPU); 0 turns "
        "the steering off (the threshold stays at its start)",
    )  # fmt: skip
    p.add_argument(
        "--corpus", metavar="CORPUS",
        help="hybrid only: a corpus the suffix match follows too, older than every request: a corpus file "
        "(create --corpus-out; memory-mapped, opened in constant time) or a text read like REPLAY, e.g. the "
        "static index's corpus (then built in memory); what Drafter(policy='hybrid', corpus=...) does",
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
    add_input_options(p)
    add_impl_option(p)
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
