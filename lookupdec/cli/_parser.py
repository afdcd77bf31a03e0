"""The argument parser of the ``lookupdec`` command: the top level, and each subcommand's own."""

from __future__ import annotations

import argparse
import sys
import textwrap
from typing import NoReturn

import lookupdec
from lookupdec.cli import create, demo, inspect, merge, stats, tokenize
from lookupdec.cli._common import EXIT_ERROR

SUBCOMMANDS = (create, stats, merge, inspect, tokenize, demo)
"""The subcommand modules, in the order ``lookupdec --help`` lists them; each has ``add_parser(sub)``."""


class _Parser(argparse.ArgumentParser):
    """argparse with lookupdec's one-line error format."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"lookupdec: error: {message} (see '{self.prog} --help')\n")
        raise SystemExit(EXIT_ERROR)


def _version_text() -> str:
    return f"lookupdec {lookupdec.__version__} (compiled: {'yes' if lookupdec.COMPILED else 'no'})"


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
    for command in SUBCOMMANDS:
        command.add_parser(sub)
    return parser
