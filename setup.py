"""Build script: compiles lookupdec's hot modules with mypyc (everything else is in pyproject.toml).

Only the modules listed in ``HOT_MODULES`` are compiled. If mypyc or a C compiler is not
available the package still installs, running those modules as plain Python (identical
results, reference-like speed), with a warning; set ``LOOKUPDEC_REQUIRE_MYPYC=1`` to make
that an error instead (CI does, so a silent fallback cannot pass the benchmarks).
Set ``LOOKUPDEC_NO_MYPYC=1`` to skip compilation on purpose.
"""

from __future__ import annotations

import glob
import os
import sys
import warnings
from typing import Any

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HOT_MODULES = [
    "lookupdec/fast/_tables.py",
    "lookupdec/fast/_source.py",
    "lookupdec/fast/_cache.py",
    "lookupdec/fast/_merge.py",
    "lookupdec/fast/_draft.py",
    "lookupdec/fast/_replay.py",
    "lookupdec/fast/_history.py",
    "lookupdec/fast/_tree.py",
    "lookupdec/fast/_hybrid.py",
    "lookupdec/fast/_index.py",
    "lookupdec/fast/_index_write.py",
    "lookupdec/fast/_legacy.py",
    "lookupdec/fast/_corpus.py",
    "lookupdec/fast/_request.py",
    "lookupdec/adapters/_vllm_rows.py",
    "lookupdec/builder/_probe.py",
    "lookupdec/tokenizer/_pretok.py",
]
# Plain C, built with the mypyc modules (and skipped with them): the native half of _mapbytes
# (lookupdec/fast/_mapnative.c: a file mapped behind a bytes header, and the thread that maps its
# pages in without the GIL). Without it _mapbytes uses ctypes and a Python thread.
# Linux only: the mapping it serves (_mapbytes) is Linux only.
C_MODULES = {"lookupdec.fast._mapnative": "lookupdec/fast/_mapnative.c"} if sys.platform.startswith("linux") else {}
REQUIRE = os.environ.get("LOOKUPDEC_REQUIRE_MYPYC") == "1"
SKIP = os.environ.get("LOOKUPDEC_NO_MYPYC") == "1"


def _remove_stale_builds() -> None:
    """Delete compiled hot modules left by an earlier in-place build.

    An extension module wins over the .py file next to it, so after a failed rebuild an old
    ``_cache.*.so`` would silently run instead of the edited source.
    """
    root = os.path.dirname(os.path.abspath(__file__))
    patterns = [os.path.join(root, "lookupdec__mypyc.*")]
    for module in HOT_MODULES + list(C_MODULES.values()):
        patterns.append(os.path.join(root, os.path.splitext(module)[0] + ".*.so"))
        patterns.append(os.path.join(root, os.path.splitext(module)[0] + ".*.pyd"))
    for pattern in patterns:
        for path in glob.glob(pattern) + glob.glob(os.path.join(root, "build", "lib*", os.path.relpath(pattern, root))):
            os.remove(path)


def _fallback(reason: str) -> None:
    """Warn (or, when compiled code is required, fail) that the fast path stays interpreted."""
    message = f"lookupdec: building without mypyc ({reason}); lookupdec.fast will run interpreted and slowly"
    if REQUIRE:
        raise SystemExit(message + " [LOOKUPDEC_REQUIRE_MYPYC=1]")
    _remove_stale_builds()
    warnings.warn(message, stacklevel=2)
    print("WARNING: " + message, file=sys.stderr)


def _ext_modules() -> list[Any]:
    if SKIP and not REQUIRE:
        return []
    try:
        from mypyc.build import mypycify
    except ImportError as e:
        _fallback(f"mypyc is not importable: {e}")
        return []
    try:
        # group_name gives the shared library a stable name (lookupdec__mypyc) instead of a hash.
        exts = list(mypycify(HOT_MODULES, opt_level="3", debug_level="0", group_name="lookupdec"))
        if sys.platform.startswith("linux"):
            # mypyc's C functions are exported from the shared library, and with -fPIC gcc
            # assumes an exported function can be replaced at load time, so it inlined none of
            # the small native helpers (pack, wrap32, key_hash, key_probe: each a call through
            # the PLT, seen in objdump). This flag lets it inline them; a replay runs about 10 %
            # fewer instructions (callgrind). clang and Mach-O/PE linkers behave so already.
            for ext in exts:
                ext.extra_compile_args.append("-fno-semantic-interposition")
        exts += [Extension(name, [src], extra_compile_args=["-O2", "-pthread"]) for name, src in C_MODULES.items()]
        return exts
    # mypyc reports a type error with SystemExit, not an exception subclass: catch both.
    except (Exception, SystemExit) as e:  # a mypy type error or a code generation failure
        _fallback(f"mypyc failed: {type(e).__name__}: {str(e)[:500]}")
        return []


class OptionalBuildExt(build_ext):
    """build_ext that falls back to the interpreted modules when the C build fails.

    mypyc makes one shared library plus one small shim extension per module; the shims
    import the shared library, so a partial build would leave unimportable modules.
    Any failure therefore removes every extension built so far before falling back.
    """

    def run(self) -> None:
        """Build every extension; on failure remove them all and fall back (or fail if required)."""
        try:
            super().run()
        except Exception as e:  # CCompilerError, DistutilsExecError, DistutilsPlatformError, ...
            self._remove_outputs()
            _fallback(f"the C build failed: {type(e).__name__}: {str(e)[:200]}")

    def _remove_outputs(self) -> None:
        for ext in self.extensions:
            for path in {
                self.get_ext_fullpath(ext.name),
                os.path.join(self.build_lib, self.get_ext_filename(ext.name)),
            }:
                if os.path.exists(path):
                    os.remove(path)


setup(ext_modules=_ext_modules(), cmdclass={"build_ext": OptionalBuildExt})
