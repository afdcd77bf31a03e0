"""Run the test suite against the *installed* lookupdec (a wheel), from outside the source tree.

Usage: ``python .ci/test_installed.py PROJECT_DIR [pytest args...]``

Used by ``.ci/wheel-check`` (here) and by cibuildwheel's ``test-command`` (wheels.yml, every
platform, so this is Python rather than shell). It copies ``tests/``, ``perf/`` (test_perf_gate
imports it; it is not part of the wheel), ``README.md`` and ``docs/hybrid.md``
(tests/test_readme.py runs their examples), ``setup.py`` (tests/test_fast_compiled.py reads
its ``HOT_MODULES``) and ``pyproject.toml`` (pytest's configuration: the ``slow`` marker and
the default ``-m 'not slow'``) into a temporary directory and runs pytest
there, so ``import lookupdec`` can only find the installed package, never the checkout's
uncompiled ``.py`` files. Before the tests it checks that:

- ``lookupdec`` is imported from site-packages, not from PROJECT_DIR;
- with ``LOOKUPDEC_REQUIRE_MYPYC=1``: ``lookupdec --version`` says ``compiled: yes``.

The real-data tests read ``$LOOKUPDEC_DATA`` and skip when it is not set (the copied tests
are not next to ``../shared/data``): the editable run of the suite covers them, and on this
2-core machine they would double the wheel check's time.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


def main(argv: list[str]) -> int:
    """Copy the tests out, check the installed package, run pytest; return pytest's exit status."""
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    project = Path(argv[0]).resolve()
    pytest_args = argv[1:]
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    with tempfile.TemporaryDirectory(prefix="lookupdec-wheel-test-") as tmp:
        work = Path(tmp)
        ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "results", ".hypothesis")
        shutil.copytree(project / "tests", work / "tests", ignore=ignore)
        shutil.copytree(project / "perf", work / "perf", ignore=ignore)
        (work / "docs").mkdir()
        for name in ("pyproject.toml", "setup.py", "README.md", "docs/hybrid.md"):
            shutil.copy2(project / name, work / name)
        where = subprocess.run(
            [sys.executable, "-c", "import lookupdec, sys; sys.stdout.write(lookupdec.__file__)"],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        if where.returncode != 0:
            print(f"test_installed: lookupdec is not importable: {where.stderr.strip()}", file=sys.stderr)
            return 2
        location = Path(where.stdout).resolve()
        print(f"test_installed: lookupdec from {location.parent}")
        if location.is_relative_to(project):
            print(f"test_installed: lookupdec comes from the source tree {project}, not an install", file=sys.stderr)
            return 2
        # The console script the wheel installed (next to this Python), as a user would run it.
        script = Path(sys.executable).parent / ("lookupdec.exe" if os.name == "nt" else "lookupdec")
        command = [str(script)] if script.exists() else [sys.executable, "-m", "lookupdec"]
        version = subprocess.run([*command, "--version"], cwd=work, env=env, capture_output=True, text=True)
        print(f"test_installed: {version.stdout.strip()}")
        if version.returncode != 0:
            print(f"test_installed: lookupdec --version failed: {version.stderr.strip()}", file=sys.stderr)
            return 2
        if env.get("LOOKUPDEC_REQUIRE_MYPYC") == "1" and "compiled: yes" not in version.stdout:
            print(
                "test_installed: the installed lookupdec is not compiled [LOOKUPDEC_REQUIRE_MYPYC=1]", file=sys.stderr
            )
            return 2
        cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *pytest_args]
        print(f"test_installed: $ {' '.join(cmd)}  (in {work})", flush=True)
        return subprocess.run(cmd, cwd=work, env=env, check=False).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
