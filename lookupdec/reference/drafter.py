"""The reference implementation's :class:`Drafter`: the shared request lifecycle over its caches."""

from __future__ import annotations

from lookupdec import _lifecycle
from lookupdec.reference.cache import NgramCache
from lookupdec.reference.draft import draft
from lookupdec.reference.files import load_static
from lookupdec.reference.history import SuffixHistory
from lookupdec.reference.hybrid import HybridState


def new_hybrid(max_tokens: int | None) -> HybridState:
    """A fresh hybrid-policy state over a history of at most ``max_tokens`` tokens (None: the default)."""
    return HybridState(SuffixHistory() if max_tokens is None else SuffixHistory(max_tokens))


class Drafter(_lifecycle.Drafter):
    """A request-level drafter over the reference's caches (see :class:`lookupdec._lifecycle.Drafter`)."""

    primitives = _lifecycle.Primitives("reference", NgramCache, draft, load_static, new_hybrid)


__all__ = ["Drafter"]
