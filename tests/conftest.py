"""Shared fixtures: the implementations under test and the test vectors.

Every behavioural test is written once, as a mixin whose ``impl`` attribute is the
implementation module, and instantiated for each implementation (PEP 399 style).
"""

from __future__ import annotations

import contextlib
import getpass
import importlib
import json
import os
import shutil
import tempfile
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import lookupdec

DATA = Path(__file__).parent / "data"
SHARED_DATA = Path(os.environ.get("LOOKUPDEC_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
# The demo data the package ships, where the package under test is (the checkout in an editable
# install, site-packages when .ci/test_installed.py runs the suite against a wheel).
DEMO_DATA = Path(lookupdec.__file__).resolve().parent / "data"


def require_compiled() -> bool:
    """True when the run must prove the compiled fast path (CI sets this)."""
    return os.environ.get("LOOKUPDEC_REQUIRE_MYPYC") == "1"


def torch_with_transformers() -> Any:
    """The torch module, with transformers importable too; the test is skipped where either is missing.

    Where ``.ci/run`` installs them (``LOOKUPDEC_REQUIRE_TRANSFORMERS=1``), a missing or broken
    import is a failure, not a skip. Typed Any, as importorskip gives: the tests pass plain
    tensors where the stubs want LongTensor.
    """
    if os.environ.get("LOOKUPDEC_REQUIRE_TRANSFORMERS") == "1":
        module: Any = importlib.import_module("torch")
        importlib.import_module("transformers")
        return module
    module = pytest.importorskip("torch", reason="torch is not installed (pip install torch==2.13.0)")
    pytest.importorskip("transformers", reason="transformers is not installed (pip install 'lookupdec[transformers]')")
    return module


@cache
def vectors(name: str) -> dict[str, Any]:
    with open(DATA / f"{name}.json") as f:
        data: dict[str, Any] = json.load(f)
    return data


def fast_impl() -> ModuleType:
    """The fast implementation module (always importable: interpreted when not compiled)."""
    from lookupdec import fast

    return fast


# Caches that libraries under test write to the temporary directory by default (torch's
# inductor: /tmp/torchinductor_<user>) go to one folder per test process, removed at its end.
_SCRATCH = tempfile.mkdtemp(prefix="lookupdec-tests-")
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(_SCRATCH, "torchinductor"))


def pytest_unconfigure(config: pytest.Config) -> None:
    """Remove this process's scratch folder (see ``_SCRATCH``), and in the main process pytest's
    per-user folder, which it empties (``tmp_path_retention_policy``) but keeps."""
    shutil.rmtree(_SCRATCH, ignore_errors=True)
    if not hasattr(config, "workerinput"):  # not an xdist worker
        with contextlib.suppress(OSError, KeyError):
            os.rmdir(os.path.join(tempfile.gettempdir(), f"pytest-of-{getpass.getuser()}"))  # only if empty
