"""lookupdec's build backend: setuptools, plus mypy only when the build will compile.

The pattern of charset-normalizer's in-tree backend: ``pyproject.toml`` names this module
(``build-backend = "lookupdec_build"``, ``backend-path = ["build_backend"]``), everything is
delegated to ``setuptools.build_meta``, and the hooks that list build requirements add mypy
(whose mypyc compiles the modules of ``setup.py``'s ``HOT_MODULES``) unless
``LOOKUPDEC_NO_MYPYC=1`` asks for the pure-Python build. So the fallback wheel
(``LOOKUPDEC_NO_MYPYC=1 python -m build --wheel``) and the sdist build without mypy;
``LOOKUPDEC_REQUIRE_MYPYC=1`` wins over ``LOOKUPDEC_NO_MYPYC`` as in ``setup.py``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F403  (setuptools' backend in full, but for the hooks below)

MYPYC_REQUIRES = [
    # Pinned: the compiled code is the C this mypy generates; another mypyc version generates
    # different C (and may expect a newer librt API), which is only trusted once tested.
    "mypy==2.4.1",
    # mypyc type-checks the compiled modules and everything they import, which reaches
    # lookupdec.formats (numpy arrays, fastconstmap): without them the types degrade and
    # strict checking fails the build. Same ranges as the runtime dependencies.
    "numpy>=1.24",
    "fastconstmap>=0.10.0,<0.11",
]


def _compiling() -> bool:
    if os.environ.get("LOOKUPDEC_REQUIRE_MYPYC") == "1":
        return True
    return os.environ.get("LOOKUPDEC_NO_MYPYC") != "1"


@contextlib.contextmanager
def _without_compiling() -> Iterator[None]:
    """Run setup.py (in this process, as setuptools does) with compilation switched off.

    For the hooks that only list requirements or pack sources: setup.py decides at import
    whether to compile, and with ``LOOKUPDEC_REQUIRE_MYPYC=1`` it stops when mypy is not
    installed yet, which it is not before these hooks have asked for it.
    """
    saved = {k: os.environ.get(k) for k in ("LOOKUPDEC_REQUIRE_MYPYC", "LOOKUPDEC_NO_MYPYC")}
    os.environ.pop("LOOKUPDEC_REQUIRE_MYPYC", None)
    os.environ["LOOKUPDEC_NO_MYPYC"] = "1"
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def get_requires_for_build_wheel(config_settings: dict[str, object] | None = None) -> list[str]:
    """setuptools' requirements, plus mypy when the wheel will be compiled."""
    extra = MYPYC_REQUIRES if _compiling() else []
    with _without_compiling():
        return [*_setuptools.get_requires_for_build_wheel(config_settings), *extra]


def get_requires_for_build_editable(config_settings: dict[str, object] | None = None) -> list[str]:
    """As for a wheel: ``pip install -e .`` compiles in place."""
    extra = MYPYC_REQUIRES if _compiling() else []
    with _without_compiling():
        return [*_setuptools.get_requires_for_build_editable(config_settings), *extra]


def get_requires_for_build_sdist(config_settings: dict[str, object] | None = None) -> list[str]:
    """An sdist holds sources only: never mypy."""
    with _without_compiling():
        return list(_setuptools.get_requires_for_build_sdist(config_settings))


def build_sdist(sdist_directory: str, config_settings: dict[str, object] | None = None) -> str:
    """The sdist, packed without compiling anything."""
    with _without_compiling():
        return str(_setuptools.build_sdist(sdist_directory, config_settings))
