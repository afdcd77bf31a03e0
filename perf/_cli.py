"""What the ``python -m perf`` commands share to refuse bad arguments and files with one clear line.

argparse ``type=`` functions for numbers (argparse turns their :class:`argparse.ArgumentTypeError`
into ``usage ... error: argument --rounds: ...`` and exit code 2), :class:`InputError` for a file
given on the command line that cannot be read as what it should be (each command's ``main``
turns it into ``parser.error``), and the pyperf results loader that raises it. Only the standard
library is imported at module level: ``--help`` must work without the optional dependencies.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

MATPLOTLIB_MISSING = "needs matplotlib: pip install 'lookupdec[perf]'"
"""The message when a plot is asked for and matplotlib (the optional ``perf`` extra) is missing."""


class InputError(Exception):
    """A file named on the command line is missing, unreadable or not what it should be."""


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None


def positive_int(text: str) -> int:
    """argparse ``type=``: a whole number >= 1 (a count where 0 makes no sense)."""
    n = _int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {n}")
    return n


def nonnegative_int(text: str) -> int:
    """argparse ``type=``: a whole number >= 0 (a count where 0 means none, or the default)."""
    n = _int(text)
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, got {n}")
    return n


def _finite(text: str, least: float, strict: bool) -> float:
    """``text`` as a finite number above ``least`` (``strict``) or at least it, else ArgumentTypeError."""
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(x) or x < least or (strict and x == least):
        raise argparse.ArgumentTypeError(f"must be a finite number {'>' if strict else '>='} {least:g}, got {text!r}")
    return x


def positive_float(text: str) -> float:
    """argparse ``type=``: a finite number > 0 (``float`` alone takes ``nan`` and ``inf``)."""
    return _finite(text, 0.0, strict=True)


def nonnegative_float(text: str) -> float:
    """argparse ``type=``: a finite number >= 0."""
    return _finite(text, 0.0, strict=False)


def positive_ints(text: str) -> list[int]:
    """argparse ``type=``: comma-separated whole numbers, each >= 1 (empty items are skipped)."""
    out = [positive_int(x) for x in text.split(",") if x.strip()]
    if not out:
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers >= 1, got {text!r}")
    return out


def read_json(path: str | Path) -> Any:
    """The JSON document in ``path``; :class:`InputError` naming the file when it cannot be."""
    try:
        return json.loads(Path(path).read_text())
    except OSError as e:
        raise InputError(f"{path}: {e.strerror or e}") from None
    except ValueError as e:  # JSONDecodeError, and UnicodeDecodeError for a binary file
        raise InputError(f"{path}: not a JSON file ({e})") from None


def load_pyperf_suite(path: str | Path) -> Any:
    """A pyperf BenchmarkSuite from a results file; :class:`InputError` naming the file when it is not one."""
    import pyperf

    try:
        return pyperf.BenchmarkSuite.load(str(path))
    except OSError as e:
        raise InputError(f"{path}: {e.strerror or e}") from None
    # pyperf reads the JSON and indexes into it without checking its shape: any of these means
    # the file is JSON (or not) of another kind, not a bug of ours.
    except (ValueError, KeyError, TypeError, AttributeError, IndexError) as e:
        raise InputError(f"{path}: not a pyperf results file ({type(e).__name__}: {e})") from None


def corpus_sizes(text: str) -> list[str]:
    """argparse ``type=`` for ``--sizes``: comma-separated ``perf.create_scale`` sizes, each of > 0 tokens."""
    from perf.create_scale import n_tokens  # numpy: not for every command's --help

    sizes = [x.strip() for x in text.split(",") if x.strip()]
    if not sizes:
        raise argparse.ArgumentTypeError(f"expected comma-separated sizes, got {text!r}")
    for size in sizes:
        try:
            n = n_tokens(size)
        except (ValueError, OverflowError):  # not a number, or nan / inf
            n = 0
        if n < 1:
            raise argparse.ArgumentTypeError(f"{size!r}: expected NM (N million tokens) or N (MB of text), N > 0")
    return sizes
