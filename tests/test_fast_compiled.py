"""The fast path must really be compiled when the build says it is (LOOKUPDEC_REQUIRE_MYPYC=1).

A silent fallback to the interpreted modules would still pass every behavioural test, only
30-100x slower; CI sets LOOKUPDEC_REQUIRE_MYPYC=1 so that this test catches it.
"""

from __future__ import annotations

import importlib
import os
import sys

import pytest

from tests.conftest import require_compiled

HOT_MODULES = (
    "lookupdec.fast._core",
    "lookupdec.fast._index",
    "lookupdec.fast._hybrid",
    "lookupdec.fast._legacy",
    "lookupdec.fast._request",
    "lookupdec.fast._corpus",
    "lookupdec.adapters._vllm_rows",
    "lookupdec.builder._probe",
    "lookupdec.tokenizer._pretok",
)
EXTENSION_SUFFIXES = (".so", ".pyd")

pytestmark = pytest.mark.skipif(
    not require_compiled(), reason="LOOKUPDEC_REQUIRE_MYPYC is not 1: the fast path may run interpreted"
)


@pytest.mark.parametrize("name", HOT_MODULES)
def test_hot_module_is_an_extension(name: str) -> None:
    module = importlib.import_module(name)
    assert module.__file__ is not None
    assert module.__file__.endswith(EXTENSION_SUFFIXES), f"{name} is not compiled: {module.__file__}"


@pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the prefetch thread's C module is built on Linux only"
)
def test_prefetch_thread_is_native() -> None:
    """The C module that populates mappings without the GIL is built and used (not the Python thread)."""
    from lookupdec.fast import _mapbytes, _prefetch

    assert _prefetch.__file__ is not None and _prefetch.__file__.endswith(EXTENSION_SUFFIXES)
    assert _mapbytes._NATIVE_PREFETCH


def test_fast_reports_compiled() -> None:
    import lookupdec
    import lookupdec.fast

    assert lookupdec.fast.COMPILED is True
    assert lookupdec.fast.IMPLEMENTATION == "fast"
    if os.environ.get("LOOKUPDEC_IMPL", "") in ("", "fast"):
        assert lookupdec.IMPLEMENTATION == "fast"


def test_native_classes_are_compiled() -> None:
    """A mypyc native class has no instance __dict__ (an interpreted one has)."""
    import lookupdec.fast

    assert not hasattr(lookupdec.fast.NgramCache(), "__dict__")
