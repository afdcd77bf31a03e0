"""The fast path's :class:`Drafter`: the shared request lifecycle over the compiled caches.

Plain Python (not compiled): with ``policy="llama"`` the Drafter's requests are the compiled
:class:`lookupdec.fast._request.Request` (the per-step bookkeeping in native code); with
``policy="hybrid"`` they are the shared lifecycle's, calling the compiled ``HybridState``.
"""

from __future__ import annotations

from lookupdec import _lifecycle
from lookupdec.fast._cache import NgramCache
from lookupdec.fast._draft import draft
from lookupdec.fast._history import SuffixHistory
from lookupdec.fast._hybrid import TARGET_WASTE, HybridState
from lookupdec.fast._index import load_static
from lookupdec.fast._request import Tally, new_request


def new_hybrid(max_tokens: int | None, target_waste: float | None = None) -> HybridState:
    """A fresh hybrid-policy state over a history of at most ``max_tokens`` tokens, steered to
    ``target_waste`` rejected tokens per step (None: the defaults)."""
    history = SuffixHistory() if max_tokens is None else SuffixHistory(max_tokens)
    return HybridState(history, target_waste=TARGET_WASTE if target_waste is None else target_waste)


class Drafter(_lifecycle.Drafter):
    """A request-level drafter over the fast path's caches (see :class:`lookupdec._lifecycle.Drafter`)."""

    primitives = _lifecycle.Primitives("fast", NgramCache, draft, load_static, new_hybrid, Tally, new_request)


__all__ = ["Drafter"]
