"""Rules shared by both implementations and the tools: the int32 range, n-gram sizes, the policies, their options.

Standard library only (the reference imports it). Each rule and its error message is defined
here once; the implementations, the :class:`~lookupdec.Drafter` and the command line call these.
"""

from __future__ import annotations

from typing import Final

from lookupdec.errors import VocabularyError

INT32_MIN: Final = -(2**31)
"""The smallest int32: llama.cpp's token ids, counts and scores are int32."""
INT32_MAX: Final = 2**31 - 1
"""The largest int32 (the largest count a cache file holds)."""

NGRAM_MIN: Final = 1
"""Smallest n-gram size drafting uses."""
NGRAM_MAX: Final = 4
"""Largest n-gram size drafting uses (and the number of slots in a key)."""
NGRAM_STATIC: Final = 2
"""The n-gram size of a static cache."""
TOKEN_NULL: Final = -1
"""Padding for unused key slots, and "no token" (llama.cpp's ``LLAMA_TOKEN_NULL``)."""

POLICIES: Final = ("llama", "hybrid")
"""The drafting policies: llama.cpp's rule (the default, exact) and the hybrid policy."""


def check_policy(policy: str) -> None:
    """Raise ValueError unless ``policy`` is one of :data:`POLICIES`."""
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}: choose one of {', '.join(map(repr, POLICIES))}")


MAX_DRAFT = 1 << 16
"""The most tokens a proposal may hold (``n_draft``, ``propose(k)``): no engine verifies more in one
step, and drafting takes time (and, compiled, room) that grows with what may be drafted."""


def check_draft_length(n: int, name: str) -> None:
    """Raise ValueError unless ``0 <= n <= MAX_DRAFT`` (``name``: ``k`` or ``n_draft``)."""
    if n < 0:
        raise ValueError(f"{name} must be >= 0, got {n}")
    if n > MAX_DRAFT:
        raise ValueError(
            f"{name} must be <= {MAX_DRAFT} (a draft longer than any engine verifies in one step), got {n}"
        )


def check_branches(branches: int, policy: str, *, flags: bool = False) -> None:
    """Raise ValueError unless ``branches`` >= 1, and 1 unless ``policy`` is ``"hybrid"`` (the
    only policy with tree drafts). ``flags``: the message names command-line flags."""
    if branches < 1:
        raise ValueError(f"{_option('branches', None, flags)} must be >= 1, got {branches}")
    if branches > 1 and policy != "hybrid":
        raise ValueError(
            f"tree drafts ({_option('branches', branches, flags)}) need {_option('policy', 'hybrid', flags)}, "
            f"not {policy!r}"
        )


def check_corpus(corpus: object, policy: str, *, flags: bool = False) -> None:
    """Raise ValueError if a ``corpus`` (not None) comes with a ``policy`` other than ``"hybrid"``:
    only the hybrid policy's suffix match reads a corpus. ``flags``: the message names command-line flags."""
    if corpus is not None and policy != "hybrid":
        raise ValueError(
            f"{_option('corpus', None, flags)} is matched by the hybrid policy: "
            f"give it with {_option('policy', 'hybrid', flags)}"
        )


MAX_TARGET_WASTE = 64.0
"""The largest ``target_waste`` (rejected drafted tokens per step) the hybrid policy takes."""


def check_target_waste(target_waste: float | None, policy: str, *, flags: bool = False) -> None:
    """Raise ValueError unless ``target_waste`` is None, or in [0, :data:`MAX_TARGET_WASTE`] with
    ``policy`` ``"hybrid"`` (it steers only the hybrid policy's drafts). ``flags``: the message
    names command-line flags."""
    if target_waste is None:
        return
    name = "--target-waste" if flags else "target_waste"
    if not 0.0 <= target_waste <= MAX_TARGET_WASTE:
        raise ValueError(f"{name} must be in [0, {MAX_TARGET_WASTE:g}] tokens per step, got {target_waste}")
    if policy != "hybrid":
        raise ValueError(f"{name} steers the hybrid policy's drafts: give it with {_option('policy', 'hybrid', flags)}")


def check_threshold(value: object) -> float:
    """The hybrid policy's threshold ``value`` as a float, or TypeError/ValueError unless it is a
    number in [0, 1] (nan passed every comparison and stayed: the policy then drafted to the limit)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"threshold must be a number in [0, 1], not {type(value).__name__}")
    t = float(value)
    if not 0.0 <= t <= 1.0:
        raise ValueError(f"threshold must be in [0, 1], got {value}")
    return t


MIN_HISTORY_TOKENS: Final = 16
"""The smallest bound on the hybrid policy's history (``history_tokens``; a ``SuffixHistory``'s ``max_tokens``)."""
MAX_HISTORY_TOKENS: Final = 1 << 62
"""The largest: any bound a machine can hold, and it fits the compiled history's int64 counts."""


def check_history_tokens(history_tokens: int | None, policy: str) -> None:
    """Raise ValueError unless ``history_tokens`` is None, or at least :data:`MIN_HISTORY_TOKENS` with
    ``policy`` ``"hybrid"`` (it bounds only the hybrid policy's history)."""
    if history_tokens is None:
        return
    if policy != "hybrid":
        raise ValueError("history_tokens bounds the hybrid policy's history: give it with policy='hybrid'")
    if history_tokens < MIN_HISTORY_TOKENS:
        raise ValueError(f"history_tokens must be >= {MIN_HISTORY_TOKENS}, got {history_tokens}")
    if history_tokens > MAX_HISTORY_TOKENS:  # past an i64, the compiled history said "int too large"
        raise ValueError(f"history_tokens must be <= 2^62, got {history_tokens}")


def _option(name: str, value: object, flags: bool) -> str:
    """Option ``name`` (given ``value``, unless None) as a keyword argument, or with ``flags`` as a flag."""
    if flags:
        return f"--{name}" if value is None else f"--{name} {value}"
    return name if value is None else f"{name}={value!r}"


def check_vocab_fingerprint(where: str, what: str, found: bytes, expected: bytes) -> None:
    """VocabularyError when both 8-byte vocabulary fingerprints are known (not all zero) and differ:
    the ``what`` (e.g. "static index") at ``where`` was built for another vocabulary, so its ids
    would mean other tokens."""
    unknown = bytes(8)
    if found != unknown and expected != unknown and found != expected:
        raise VocabularyError(
            f"{where}: the {what} was built for another vocabulary "
            f"(fingerprint {found.hex()}, the tokenizer's is {expected.hex()})"
        )
