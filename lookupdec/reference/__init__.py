"""lookupdec's reference implementation: readable, spec-faithful pure Python; the oracle.

Same public API as :mod:`lookupdec.fast`. Names follow llama.cpp's ``common/ngram-cache.h``:
``NgramCache.update`` / ``merge`` / ``save`` / ``load`` and :func:`draft`.
"""

from __future__ import annotations

from lookupdec.reference.cache import (
    NGRAM_MAX,
    NGRAM_MIN,
    NGRAM_STATIC,
    TOKEN_NULL,
    NgramCache,
    build_static,
)
from lookupdec.reference.draft import draft
from lookupdec.reference.drafter import Drafter
from lookupdec.reference.files import load_static
from lookupdec.reference.history import SuffixHistory
from lookupdec.reference.hybrid import HybridState
from lookupdec.reference.replay import replay
from lookupdec.result import ReplayResult
from lookupdec.rules import POLICIES

IMPLEMENTATION = "reference"
"""The name of this implementation."""
COMPILED = False
"""The reference is never compiled."""

__all__ = [
    "COMPILED",
    "IMPLEMENTATION",
    "NGRAM_MAX",
    "NGRAM_MIN",
    "NGRAM_STATIC",
    "POLICIES",
    "TOKEN_NULL",
    "Drafter",
    "HybridState",
    "NgramCache",
    "ReplayResult",
    "SuffixHistory",
    "build_static",
    "draft",
    "load_static",
    "replay",
]
