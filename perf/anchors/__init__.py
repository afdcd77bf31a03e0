"""``python -m perf anchors ...``: build and run the C++ anchor (the fork's ngram-cache, replicated).

The anchor is C++17 source in this folder (``ngram_anchor.cpp``, ``ngram_cache.hpp``,
``constmap.hpp``; see ``README.md`` here), compiled with ``g++ -O2`` into
``results/anchors/ngram-anchor`` (gitignored). Nothing is downloaded: it needs only a C++17
compiler and the standard library.

    python -m perf anchors build [--force] [--cxx g++]   # compile (only when the sources changed)
    python -m perf anchors path                          # print the binary's path (builds if needed)
    python -m perf anchors stats REPLAY.bin -lcs STATIC.v2 --json   # run the binary (builds if needed)
    python -m perf anchors create CORPUS.bin -o STATIC.v2
    python -m perf anchors merge A B -o OUT
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Final

SOURCE_DIR: Final = Path(__file__).resolve().parent
SOURCES: Final = ("ngram_anchor.cpp", "ngram_cache.hpp", "constmap.hpp")
REPO: Final = SOURCE_DIR.parents[1]
BUILD_DIR: Final = REPO / "results" / "anchors"
BINARY_NAME: Final = "ngram-anchor"
CXXFLAGS: Final = ("-O2", "-std=c++17", "-pthread", "-Wall", "-Wextra")
COMMANDS: Final = ("create", "stats", "merge", "update", "open", "measure")
"""The binary's own subcommands, passed through by ``python -m perf anchors``."""


class AnchorBuildError(RuntimeError):
    """The anchor cannot be built here (no compiler, or the compiler failed)."""


def find_compiler(cxx: str | None = None) -> str | None:
    """The C++ compiler to use: ``cxx``, else ``$CXX``, else ``g++`` on PATH; None if absent."""
    name = cxx or os.environ.get("CXX") or "g++"
    return shutil.which(name)


def source_digest() -> str:
    """SHA-256 of the sources and flags: the binary is rebuilt when it changes."""
    h = hashlib.sha256(" ".join(CXXFLAGS).encode())
    for name in SOURCES:
        h.update(name.encode())
        h.update((SOURCE_DIR / name).read_bytes())
    return h.hexdigest()


def binary_path(build_dir: Path = BUILD_DIR) -> Path:
    """Where ``build`` puts the binary (it may not exist yet)."""
    return build_dir / BINARY_NAME


def build(force: bool = False, cxx: str | None = None, build_dir: Path = BUILD_DIR, quiet: bool = False) -> Path:
    """Compile the anchor unless an up-to-date binary exists; its path.

    Raises :class:`AnchorBuildError` when no compiler is found or compiling fails.
    """
    out = binary_path(build_dir)
    stamp = build_dir / f"{BINARY_NAME}.sha256"
    digest = source_digest()
    if not force and out.exists() and stamp.exists() and stamp.read_text().strip() == digest:
        return out
    build_dir.mkdir(parents=True, exist_ok=True)
    # One build at a time (the test suite's workers may all ask at once): the others wait,
    # then find the binary up to date.
    with open(build_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not force and out.exists() and stamp.exists() and stamp.read_text().strip() == digest:
            return out
        return _compile(out, stamp, digest, cxx, quiet)


def _compile(out: Path, stamp: Path, digest: str, cxx: str | None, quiet: bool) -> Path:
    compiler = find_compiler(cxx)
    if compiler is None:
        raise AnchorBuildError(
            f"no C++ compiler found ({cxx or os.environ.get('CXX') or 'g++'} is not on PATH): install g++ "
            "(Debian/Ubuntu: apt-get install g++) or set CXX"
        )
    tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")
    cmd = [compiler, *CXXFLAGS, "-o", str(tmp), str(SOURCE_DIR / "ngram_anchor.cpp")]
    if not quiet:
        print(" ".join(cmd), file=sys.stderr)
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise AnchorBuildError(f"{' '.join(cmd)} failed (exit {done.returncode}):\n{done.stderr.strip()}")
    os.replace(tmp, out)
    stamp.write_text(digest + "\n")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: see the module docstring."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if args else 2
    what, rest = args[0], args[1:]
    try:
        if what == "build":
            force = "--force" in rest
            cxx = rest[rest.index("--cxx") + 1] if "--cxx" in rest and rest.index("--cxx") + 1 < len(rest) else None
            path = build(force=force, cxx=cxx)
            print(path)
            return 0
        if what == "path":
            print(build(quiet=True))
            return 0
        if what in COMMANDS:
            return subprocess.run([str(build(quiet=True)), what, *rest]).returncode
    except AnchorBuildError as e:
        print(f"perf anchors: {e}", file=sys.stderr)
        return 1
    print(f"perf anchors: unknown command {what!r} (build, path, {', '.join(COMMANDS)})", file=sys.stderr)
    return 2
