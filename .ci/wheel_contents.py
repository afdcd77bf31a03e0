"""Check what built distributions hold: the compiled modules in, nothing from the source tree that is not the package.

Usage: ``python .ci/wheel_contents.py [--pure] DIST...`` (wheels ``*.whl``, sdists ``*.tar.gz``).

- a compiled wheel holds an extension module for each of setup.py's ``HOT_MODULES``, the shared
  library ``lookupdec__mypyc`` they load and, on Linux, the C module ``lookupdec.fast._mapnative``;
  a ``--pure`` wheel holds no extension module at all;
- a wheel holds only ``lookupdec/``, ``lookupdec__mypyc.*`` and its ``.dist-info``: no tests, perf
  harness, build backend, generated C, object files or build directories;
- both hold every file of the package in this checkout, a wheel all but its C sources
  (``git ls-files lookupdec``: every module and subpackage, e.g. ``lookupdec/formats/``,
  ``lookupdec/tokenizer/``, ``lookupdec/cli/``, and the package data), so a module
  missed by the packaging config fails here, not at import;
- an sdist holds what building needs (``setup.py``, ``pyproject.toml``, the build backend, the
  sources of the compiled modules) and no build output (``*.so``, ``build/``, ``dist/``, venvs).

Prints each file's size and entry count; exits 1 naming every problem.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

EXT = re.compile(r"\.(so|pyd)$")
WHEEL_ALLOWED = re.compile(r"^(lookupdec/|lookupdec__mypyc\.[^/]+\.(so|pyd)$|lookupdec-[^/]+\.dist-info/)")
# Top-level folders only: build tools write their output there, never inside the package.
WHEEL_FORBIDDEN = re.compile(r"(\.c|\.o|\.h)$|^(build|tests|perf|build_backend|\.ci)/|\.egg-info/")
SDIST_REQUIRED = ("setup.py", "pyproject.toml", "build_backend/lookupdec_build.py", "lookupdec/fast/_cache.py")
SDIST_FORBIDDEN = re.compile(r"\.(so|pyd|o)$|^(build|dist|\.venv|results|\.git)/|(^|/)__pycache__/")
REPO = Path(__file__).resolve().parents[1]


def package_files() -> list[str]:
    """The package's files in this checkout (tracked by git): what every distribution must hold."""
    out = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "lookupdec"], capture_output=True, text=True, check=True
    ).stdout
    files = out.split()
    if "lookupdec/__init__.py" not in files:  # not a checkout of this project: nothing to compare with
        raise SystemExit(f"wheel_contents: {REPO} is not a git checkout of lookupdec")
    return files


def check_wheel(path: Path, pure: bool) -> list[str]:
    """Problems with the wheel at ``path``."""
    names = zipfile.ZipFile(path).namelist()
    problems = [f"{n}: not part of the package" for n in names if not WHEEL_ALLOWED.match(n)]
    problems += [f"{n}: a source-tree or build file" for n in names if WHEEL_FORBIDDEN.search(n)]
    # C sources (lookupdec/fast/_mapnative.c) are compiled into the wheel, not shipped in it.
    problems += [f"missing {f}" for f in package_files() if f not in names and not WHEEL_FORBIDDEN.search(f)]
    ext = [n for n in names if EXT.search(n)]
    if pure:
        problems += [f"{n}: an extension module in the pure-Python wheel" for n in ext]
    else:
        # A Linux wheel also holds the C module built from setup.py's C_MODULES.
        c_modules = ("lookupdec/fast/_mapnative.",) if "linux" in path.name else ()
        for stem in (*(m.removesuffix(".py") + "." for m in hot_modules()), "lookupdec__mypyc.", *c_modules):
            if not any(n.startswith(stem) for n in ext):
                problems.append(f"no compiled {stem}* extension module")
    print(f"{path.name}: {path.stat().st_size / 1024:.0f} KiB, {len(names)} entries; extension modules:")
    for n in ext:
        print(f"    {n} ({zipfile.ZipFile(path).getinfo(n).file_size / 1024:.0f} KiB)")
    if not ext:
        print("    (none)")
    return problems


def hot_modules() -> list[str]:
    """setup.py's ``HOT_MODULES`` (read, not imported: importing setup.py would run setup())."""
    tree = ast.parse((REPO / "setup.py").read_text(encoding="utf-8"))
    for node in tree.body:
        names = [t.id for t in getattr(node, "targets", []) if isinstance(t, ast.Name)]
        if isinstance(node, ast.Assign) and "HOT_MODULES" in names:
            value = ast.literal_eval(node.value)
            assert isinstance(value, list)
            return [str(m) for m in value]
    raise SystemExit("wheel_contents: setup.py has no HOT_MODULES list")


def check_sdist(path: Path) -> list[str]:
    """Problems with the sdist at ``path``."""
    with tarfile.open(path) as tar:
        names = [n.split("/", 1)[1] for n in tar.getnames() if "/" in n]
    problems = [f"missing {r}" for r in (*SDIST_REQUIRED, *package_files()) if r not in names]
    problems += [f"{n}: build output in the sdist" for n in names if SDIST_FORBIDDEN.search(n)]
    print(f"{path.name}: {path.stat().st_size / 1024:.0f} KiB, {len(names)} entries")
    return problems


def main(argv: list[str]) -> int:
    """Check every distribution named; return 1 if any has a problem."""
    pure = "--pure" in argv
    paths = [Path(a) for a in argv if a != "--pure"]
    if not paths:
        print(__doc__)
        return 2
    problems = []
    for path in paths:
        found = check_wheel(path, pure) if path.suffix == ".whl" else check_sdist(path)
        problems += [f"{path.name}: {p}" for p in found]
    for p in problems:
        print(f"wheel_contents: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
