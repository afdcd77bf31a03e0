"""The implementation pairs the mixins run against (PEP 399)."""

from __future__ import annotations

from types import ModuleType

import lookupdec.reference
from tests.conftest import fast_impl


class ImplTests:
    """Base of every test mixin: ``self.impl`` is the implementation module under test."""

    @property
    def impl(self) -> ModuleType:
        raise NotImplementedError("combine the mixin with ReferenceImpl or FastImpl")


class ReferenceImpl(ImplTests):
    """Mixin target: the pure-Python reference."""

    @property
    def impl(self) -> ModuleType:
        return lookupdec.reference


class FastImpl(ImplTests):
    """Mixin target: the fast path (compiled when installed with mypyc)."""

    @property
    def impl(self) -> ModuleType:
        return fast_impl()
