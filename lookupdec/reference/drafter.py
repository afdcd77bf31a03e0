"""The reference implementation's :class:`Drafter`: the shared request lifecycle over its caches."""

from __future__ import annotations

from lookupdec import _lifecycle
from lookupdec.reference.cache import NGRAM_MAX, NGRAM_MIN, NgramCache
from lookupdec.reference.draft import draft
from lookupdec.reference.files import load_static


class Drafter(_lifecycle.Drafter):
    """A request-level drafter over the reference's caches (see :class:`lookupdec._lifecycle.Drafter`)."""

    primitives = _lifecycle.Primitives(
        "reference", NgramCache, NgramCache.load, draft, load_static, NGRAM_MIN, NGRAM_MAX
    )


__all__ = ["Drafter"]
