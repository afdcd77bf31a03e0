"""The ``lookupdec`` command line, shaped like llama.cpp's lookup tools: one module a subcommand.

=================  ==========================================================
``create``         llama-lookup-create: build a static 2-gram cache from corpora
``stats``          llama-lookup-stats: replay a text, count drafted/accepted tokens
``merge``          llama-lookup-merge: add several caches into one
``inspect``        what a cache file holds (no llama.cpp counterpart)
``tokenize``       a text file to token ids with a model's GGUF vocabulary (llama_tokenize)
``demo``           the whole pipeline on token data shipped with the package
=================  ==========================================================

Each module holds its command's options (``add_parser``) and its run (``cmd_*``);
``_parser`` puts them together, ``_common`` holds what they share, and ``_pipeline`` the
steps they take (choose an implementation, build, write, load, replay).

Every error about the input ends the program with one line on stderr,
``lookupdec: error: <file>: <what> [at byte offset N]``, and exit code 2.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import warnings
from collections.abc import Sequence
from typing import TextIO

from lookupdec._signals import Terminated, terminate_raises
from lookupdec.cli._common import EXIT_ERROR, EXIT_OK
from lookupdec.cli._parser import build_parser
from lookupdec.cli.inspect import inspect_cache
from lookupdec.errors import LookupdecError

__all__ = ["build_parser", "inspect_cache", "main"]


CLEAN_UP_ON_KILL = frozenset({"create", "merge", "tokenize", "demo"})
"""Subcommands that write temporary folders (spills, tokenized corpora, the demo's files)."""


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
    # Commands with temporary folders turn kill (SIGTERM) into an exception, so those folders
    # go as on Ctrl-C; the others keep SIGTERM's default, which ends a process at once even
    # inside a long compiled call (a Python handler waits for the interpreter's next step).
    cleans_up = args.command in CLEAN_UP_ON_KILL
    try:
        with terminate_raises() if cleans_up else contextlib.nullcontext():
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
    except Terminated:
        sys.stderr.write("lookupdec: terminated\n")
        return 128 + signal.SIGTERM
    except KeyboardInterrupt:
        sys.stderr.write("lookupdec: interrupted\n")
        return 130
    finally:
        warnings.showwarning = old_showwarning
