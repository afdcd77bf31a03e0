"""What the subcommands share: exit codes, reading inputs, option groups and their checks."""

from __future__ import annotations

import argparse
import os
import sys
import textwrap
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import lookupdec
from lookupdec.errors import UsageError
from lookupdec.rules import INT32_MAX

EXIT_OK = 0
EXIT_ERROR = 2
"""Exit code of every usage or input error (like argparse's own)."""

STATIC_FORMATS = ("lookupdec", "llama", "fork-v2")
"""Formats ``create`` and ``merge`` can write."""
IMPLEMENTATIONS = ("reference", "fast")

Command = Callable[[argparse.Namespace], int]
"""A subcommand: parsed arguments in, exit code out."""


# --------------------------------------------------------------------------------------
# inputs


def want_progress(args: argparse.Namespace) -> bool:
    """Whether to draw progress bars: not ``-q``, and stderr is a terminal."""
    return not getattr(args, "quiet", False) and sys.stderr.isatty()


def refuse_lookup_file(path: str) -> None:
    """UsageError when ``path``, given as text or token ids, is a static cache or a corpus file.

    ``create`` writes both beside the texts it reads; read as token ids, such a file fails with
    an error about a negative id somewhere inside (its header), or worse, reads as ids. Only
    files with a magic are recognized (llama.cpp's own format has none).
    """
    from lookupdec.formats.detect import MAGIC_CORPUS, cache_kind

    if not os.path.isfile(path):  # a fifo would block open(): the reader that follows says what it is
        return
    try:
        with open(path, "rb") as f:
            head = f.read(8)
    except OSError:
        return  # unreadable: the reader that follows says why
    kind = cache_kind(head)
    if kind is not None:
        raise UsageError(f"{path}: {kind} (an n-gram cache, as -lcs takes), not text or token ids")
    if head == MAGIC_CORPUS:
        raise UsageError(f"{path}: a lookupdec corpus file (the hybrid policy's --corpus), not text or token ids")


def load_input_array(args: argparse.Namespace, path: str) -> Any:
    """The ids of ``path`` as ``--tokens``/``--tokenizer``/``--add-bos`` say, as a numpy array."""
    from lookupdec.tokens import load_tokens

    refuse_lookup_file(path)
    return load_tokens(path, tokens=args.tokens, tokenizer=args.tokenizer, add_bos=args.add_bos)


def load_input(args: argparse.Namespace, path: str) -> list[int]:
    """The ids of ``path`` as a list, checked to be int32 (raw token files by their reader)."""
    from lookupdec.tokens import check_token_ids

    arr = load_input_array(args, path)
    check_token_ids(path, arr, raw=args.tokenizer is None and not path.lower().endswith(".npy"))
    result: list[int] = arr.tolist()
    return result


def load_replay(args: argparse.Namespace, path: str) -> Sequence[int]:
    """The ids to replay: a raw token file as an ``array('i')`` (no numpy, 4 bytes an id), else as ``load_input``."""
    from lookupdec._rawids import TOKEN_SUFFIXES, read_raw_ids

    lower = path.lower()
    raw = args.tokens or lower.endswith(TOKEN_SUFFIXES)
    if raw and args.tokenizer is None and not args.add_bos and not lower.endswith(".npy"):
        refuse_lookup_file(path)
        return read_raw_ids(path)
    return load_input(args, path)  # text, .npy, or a combination of flags it reports as an error


def mb(n_bytes: int) -> str:
    """``n_bytes`` in megabytes, as the summary lines print sizes."""
    return f"{n_bytes / 1e6:.2f} MB"


# --------------------------------------------------------------------------------------
# option checks


MIN_MEMORY = 1 << 20
"""The least ``--memory`` budget: 1 MiB."""


def budget(args: argparse.Namespace) -> tuple[int | None, int | None]:
    """``--memory`` in bytes and ``--workers``, checked (None: the defaults of lookupdec.builder)."""
    from lookupdec.builder import parse_memory

    memory = None
    if args.memory is not None:
        try:
            memory = parse_memory(args.memory)
        except ValueError as e:
            raise UsageError(f"--memory: {e}") from None
        if memory < MIN_MEMORY:
            # Below this the builder's spill pieces are so small that reading them back crawls
            # (64K: over a minute for 1M tokens, against 1.7 s at 1M).
            raise UsageError(
                f"--memory {args.memory} is below 1M, the least budget create and merge take "
                "(the process itself needs about 50 MB more)"
            )
    check_workers(args.workers)
    return memory, args.workers


def warn_unused_memory(args: argparse.Namespace, used: bool) -> None:
    """Warn that ``--memory`` was given to a run that builds in memory (not the lookupdec format)."""
    if args.memory is not None and not used:
        warnings.warn(
            f"--memory is the budget of the lookupdec format's builder (--format lookupdec); this "
            f"{args.command} to --format {args.format} does not use it",
            stacklevel=2,
        )


def check_workers(workers: int | None) -> None:
    """UsageError unless ``--workers`` is absent or at least 1."""
    if workers is not None and workers < 1:
        raise UsageError(f"--workers must be >= 1, got {workers}")


def check_replay_options(args: argparse.Namespace) -> None:
    """-c and --n-draft within llama.cpp's ranges (int32), as one clear line."""
    if not 1 <= args.n_ctx <= INT32_MAX:
        raise UsageError(f"-c/--ctx-size must be between 1 and {INT32_MAX} (llama.cpp's int), got {args.n_ctx}")
    if not 0 <= args.n_draft <= INT32_MAX:
        raise UsageError(f"--n-draft must be between 0 and {INT32_MAX} (llama.cpp's int), got {args.n_draft}")


# --------------------------------------------------------------------------------------
# option groups


def add_command(sub: Any, name: str, *, summary: str, description: str, examples: str, func: Command) -> Any:
    """Add subcommand ``name`` with its description and an ``examples:`` epilog; return its parser."""
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


def add_input_options(p: argparse.ArgumentParser) -> None:
    """``--tokens`` / ``--tokenizer`` and ``--add-bos`` / ``--no-add-bos``: how inputs become ids."""
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


def add_budget_options(p: argparse.ArgumentParser, workers: bool = True) -> None:
    """``--memory`` and (unless ``workers`` is false) ``--workers``, read by :func:`budget`."""
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


def add_impl_option(p: argparse.ArgumentParser) -> None:
    """``--impl``: which implementation runs the command."""
    p.add_argument(
        "--impl",
        choices=IMPLEMENTATIONS,
        help=f"implementation to run (default: {lookupdec.IMPLEMENTATION}, what 'import lookupdec' chose)",
    )


def add_replay_options(p: argparse.ArgumentParser) -> None:
    """``-c`` and ``--n-draft``, checked by :func:`check_replay_options`."""
    p.add_argument(
        "-c", "--ctx-size", dest="n_ctx", type=int, default=4096, metavar="N_CTX", help="chunk length (default 4096)"
    )
    p.add_argument(
        "--n-draft", "--draft", dest="n_draft", type=int, default=8, metavar="N",
        help="most tokens drafted per step (default 8)",
    )  # fmt: skip
