"""The implementation pairs the mixins run against (PEP 399)."""

from __future__ import annotations

from types import ModuleType

from tests.conftest import fast_or_skip

import lookupdec.reference


class ReferenceImpl:
    """Mixin target: the pure-Python reference."""

    @property
    def impl(self) -> ModuleType:
        return lookupdec.reference


class FastImpl:
    """Mixin target: the fast path (compiled when installed with mypyc)."""

    @property
    def impl(self) -> ModuleType:
        return fast_or_skip()
