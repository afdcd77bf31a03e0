"""Shared fixtures: the implementations under test and the test vectors.

Every behavioural test is written once, as a mixin whose ``impl`` attribute is the
implementation module, and instantiated for each implementation (PEP 399 style).
"""

from __future__ import annotations

import json
import os
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

DATA = Path(__file__).parent / "data"
SHARED_DATA = Path(os.environ.get("LOOKUPDEC_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))


def require_compiled() -> bool:
    """True when the run must prove the compiled fast path (CI sets this)."""
    return os.environ.get("LOOKUPDEC_REQUIRE_MYPYC") == "1"


@cache
def vectors(name: str) -> dict[str, Any]:
    with open(DATA / f"{name}.json") as f:
        data: dict[str, Any] = json.load(f)
    return data


def fast_or_skip() -> ModuleType:
    """The fast implementation module; skip (or fail, when compiled code is required) if absent."""
    try:
        from lookupdec import fast
    except ImportError as e:  # pragma: no cover - depends on the install
        if require_compiled():
            raise
        pytest.skip(f"lookupdec.fast is not importable: {e}")
    if not hasattr(fast, "NgramCache"):
        if require_compiled():
            raise AssertionError("lookupdec.fast has no NgramCache")
        pytest.skip("lookupdec.fast is not implemented in this tree")
    return fast
