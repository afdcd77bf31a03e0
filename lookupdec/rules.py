"""Rules shared by both implementations and the tools: the int32 range, n-gram sizes, the policies, their options.

Standard library only (the reference imports it). Each rule and its error message is defined
here once; the implementations, the :class:`~lookupdec.Drafter` and the command line call these.
"""

from __future__ import annotations

from typing import Final

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


def check_branches(branches: int, policy: str) -> None:
    """Raise ValueError unless ``branches`` >= 1, and 1 unless ``policy`` is ``"hybrid"`` (the
    only policy with tree drafts)."""
    if branches < 1:
        raise ValueError(f"branches must be >= 1, got {branches}")
    if branches > 1 and policy != "hybrid":
        raise ValueError(f"tree drafts (branches={branches}) need policy='hybrid', not {policy!r}")
