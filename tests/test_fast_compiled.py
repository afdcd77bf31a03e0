"""The fast path must really be compiled when the build says it is (LOOKUPDEC_REQUIRE_MYPYC=1).

A silent fallback to the interpreted modules would still pass every behavioural test, only
30-100x slower; CI sets LOOKUPDEC_REQUIRE_MYPYC=1 so that this test catches it.
"""

from __future__ import annotations

import ast
import importlib
import os
import sys
from pathlib import Path

import pytest

from tests.conftest import require_compiled


def _setup_hot_modules() -> tuple[str, ...]:
    """setup.py's HOT_MODULES (what the build compiles) as module names: the one list of them."""
    tree = ast.parse((Path(__file__).parents[1] / "setup.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "HOT_MODULES":
            paths: list[str] = ast.literal_eval(node.value)
            return tuple(p.removesuffix(".py").replace("/", ".") for p in paths)
    raise AssertionError("setup.py has no HOT_MODULES list")


HOT_MODULES = _setup_hot_modules()
EXTENSION_SUFFIXES = (".so", ".pyd")

pytestmark = pytest.mark.skipif(
    not require_compiled(), reason="LOOKUPDEC_REQUIRE_MYPYC is not 1: the fast path may run interpreted"
)


@pytest.mark.parametrize("name", HOT_MODULES)
def test_hot_module_is_an_extension(name: str) -> None:
    module = importlib.import_module(name)
    assert module.__file__ is not None
    assert module.__file__.endswith(EXTENSION_SUFFIXES), f"{name} is not compiled: {module.__file__}"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the mapping's C module is built on Linux only")
def test_mapping_is_native() -> None:
    """The C module that maps files and populates them without the GIL is built and used
    (not ctypes and a Python thread)."""
    from lookupdec.fast import _mapbytes, _mapnative

    assert _mapnative.__file__ is not None and _mapnative.__file__.endswith(EXTENSION_SUFFIXES)
    assert _mapbytes._NATIVE


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


def test_compiled_flag_covers_every_fast_hot_module() -> None:
    """``lookupdec.fast.COMPILED`` checks every module of fast/ that setup.py compiles."""
    import lookupdec.fast

    checked = {m.__name__ for m in lookupdec.fast.HOT_MODULES}
    assert checked == {name for name in HOT_MODULES if name.startswith("lookupdec.fast.")}
