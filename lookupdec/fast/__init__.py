"""lookupdec's fast path: the same API as :mod:`lookupdec.reference`, compiled with mypyc.

``pip install`` compiles the hot modules (``setup.py``'s ``HOT_MODULES``: the caches, drafting
and replay, the static index, legacy files, the corpus, the hybrid policy, the request
bookkeeping) to C extension modules, and on Linux builds the small C module
``_mapnative`` (an index mapped as ``bytes``, and the thread that maps its pages in).
Without a C compiler they run as plain Python, with identical results but slowly;
:data:`COMPILED` says which. Beyond the reference's names this module adds
:class:`StaticIndex`, :func:`load_static` and :func:`merge_legacy_files` (``lookupdec merge``
of legacy files, streaming).
"""

from __future__ import annotations

from types import ModuleType

from lookupdec.fast import (
    _cache,
    _corpus,
    _draft,
    _history,
    _hybrid,
    _index,
    _index_write,
    _legacy,
    _merge,
    _replay,
    _request,
    _source,
    _tables,
    _tree,
)
from lookupdec.fast._cache import NgramCache, build_static
from lookupdec.fast._corpus import CorpusIndex
from lookupdec.fast._draft import draft
from lookupdec.fast._history import SuffixHistory
from lookupdec.fast._hybrid import HybridState
from lookupdec.fast._index import StaticIndex, load_static
from lookupdec.fast._legacy import merge_files as merge_legacy_files
from lookupdec.fast._replay import replay
from lookupdec.fast._tables import NGRAM_MAX, NGRAM_MIN, NGRAM_STATIC, TOKEN_NULL
from lookupdec.fast.drafter import Drafter
from lookupdec.result import ReplayResult
from lookupdec.rules import POLICIES

IMPLEMENTATION = "fast"
"""The name of this implementation."""


def _is_extension(path: str | None) -> bool:
    return path is not None and path.endswith((".so", ".pyd"))


HOT_MODULES: tuple[ModuleType, ...] = (
    _tables,
    _source,
    _cache,
    _merge,
    _draft,
    _replay,
    _history,
    _tree,
    _hybrid,
    _corpus,
    _index,
    _index_write,
    _legacy,
    _request,
)
"""The modules ``setup.py`` compiles (its ``HOT_MODULES``), in the order they build on each other."""

COMPILED: bool = all(_is_extension(m.__file__) for m in HOT_MODULES)
"""True when the hot modules are mypyc-compiled extension modules (like black's check)."""

__all__ = [
    "COMPILED",
    "IMPLEMENTATION",
    "NGRAM_MAX",
    "NGRAM_MIN",
    "NGRAM_STATIC",
    "POLICIES",
    "TOKEN_NULL",
    "CorpusIndex",
    "Drafter",
    "HybridState",
    "NgramCache",
    "ReplayResult",
    "StaticIndex",
    "SuffixHistory",
    "build_static",
    "draft",
    "load_static",
    "merge_legacy_files",
    "replay",
]
