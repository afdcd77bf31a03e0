"""The reference implementation's :class:`Drafter`: the shared request lifecycle over its caches."""

from __future__ import annotations

from lookupdec import _lifecycle
from lookupdec.reference.cache import NgramCache
from lookupdec.reference.draft import draft
from lookupdec.reference.files import load_static
from lookupdec.reference.history import SuffixHistory
from lookupdec.reference.hybrid import TARGET_WASTE, HybridState


def new_hybrid(max_tokens: int | None, target_waste: float | None = None) -> HybridState:
    """A fresh hybrid-policy state over a history of at most ``max_tokens`` tokens, steered to
    ``target_waste`` rejected tokens per step (None: the defaults)."""
    history = SuffixHistory() if max_tokens is None else SuffixHistory(max_tokens)
    return HybridState(history, target_waste=TARGET_WASTE if target_waste is None else target_waste)


class Drafter(_lifecycle.Drafter):
    """A request-level drafter over the reference's caches (see :class:`lookupdec._lifecycle.Drafter`)."""

    primitives = _lifecycle.Primitives("reference", NgramCache, draft, load_static, new_hybrid)


__all__ = ["Drafter"]
