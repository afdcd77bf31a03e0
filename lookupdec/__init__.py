"""lookupdec: exact, fast n-gram ("prompt lookup") speculative drafting, llama.cpp-compatible.

``import lookupdec`` gives the compiled fast path (:mod:`lookupdec.fast`) when its mypyc
extension modules are installed, and the pure-Python reference (:mod:`lookupdec.reference`)
otherwise; :data:`IMPLEMENTATION` and :data:`COMPILED` say which. Set the environment
variable ``LOOKUPDEC_IMPL=reference`` (or ``fast``) to choose explicitly.
"""

from __future__ import annotations

import os
from types import ModuleType

from lookupdec._version import __version__


def _choose() -> ModuleType:
    wanted = os.environ.get("LOOKUPDEC_IMPL", "")
    if wanted not in ("", "reference", "fast"):
        raise ImportError(f"LOOKUPDEC_IMPL must be 'reference' or 'fast', not {wanted!r}")
    if wanted != "reference":
        try:
            from lookupdec import fast
        except ImportError:
            if wanted == "fast":
                raise
        else:
            if getattr(fast, "COMPILED", False) or wanted == "fast":
                return fast
    from lookupdec import reference

    return reference


_impl = _choose()

IMPLEMENTATION: str = _impl.IMPLEMENTATION
"""``"fast"`` or ``"reference"``: the implementation this package's names come from."""
COMPILED: bool = _impl.COMPILED
"""True when the fast path's mypyc extension modules are what runs."""

NgramCache = _impl.NgramCache
Drafter = _impl.Drafter
draft = _impl.draft
replay = _impl.replay
build_static = _impl.build_static
load_static = _impl.load_static
NGRAM_MIN: int = _impl.NGRAM_MIN
NGRAM_MAX: int = _impl.NGRAM_MAX
NGRAM_STATIC: int = _impl.NGRAM_STATIC
TOKEN_NULL: int = _impl.TOKEN_NULL
HybridState = _impl.HybridState
SuffixHistory = _impl.SuffixHistory
POLICIES: tuple[str, ...] = _impl.POLICIES

from lookupdec.result import ReplayResult  # noqa: E402  (after the implementation is chosen)


def implementation(name: str) -> ModuleType:
    """The implementation module called ``name`` (``"reference"`` or ``"fast"``)."""
    if name == "reference":
        from lookupdec import reference

        return reference
    if name == "fast":
        from lookupdec import fast

        return fast
    raise ValueError(f"unknown implementation {name!r}: choose 'reference' or 'fast'")


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
    "__version__",
    "build_static",
    "draft",
    "implementation",
    "load_static",
    "replay",
]
