"""``python -m perf profile``: scalene profiles of the replay loop (HTML, JSON and text).

Compiled (mypyc) code fires no profiling hooks, so the fast path is profiled *interpreted*:
the lookupdec sources (``*.py`` only, no extension modules) are copied to
``results/profile/src/`` and put first on ``PYTHONPATH``; Python then imports the ``.py`` files.
The reference is pure Python either way. Outputs per implementation, in ``results/profile/``:
``profile-<impl>.json`` (scalene's JSON), ``profile-<impl>.html`` (self-contained page) and
``profile-<impl>.txt`` (the terminal view, lines with activity only).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from perf._cli import nonnegative_int, positive_int
from perf._common import IMPLS, REPO, RESULTS


def source_copy(dest: Path) -> Path:
    """A copy of the lookupdec package with only its Python sources and data (no compiled modules)."""
    pkg = REPO / "lookupdec"
    target = dest / "lookupdec"
    if target.exists():
        shutil.rmtree(target)
    for path in pkg.rglob("*"):
        if "__pycache__" in path.parts or not path.is_file():
            continue
        if path.suffix in (".so", ".pyd", ".dylib", ".c", ".o") or path.name.endswith(".tmp"):
            continue
        out = target / path.relative_to(pkg)
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, out)
    return dest


def scalene_cmd() -> list[str]:
    exe = shutil.which("scalene", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]))
    return [exe] if exe else [sys.executable, "-m", "scalene"]


def scalene_is_v2(cmd: list[str]) -> bool:
    """scalene >= 2 has ``scalene run`` / ``scalene view``; 1.x took options directly."""
    proc = subprocess.run([*cmd, "--help"], capture_output=True, text=True, check=False)
    return "{run,view}" in proc.stdout


def profile(impl: str, out_dir: Path, target_args: list[str], env: dict[str, str]) -> int:
    cmd = scalene_cmd()
    json_path = out_dir / f"profile-{impl}.json"
    target = [str(REPO / "perf" / "_profile_target.py"), "--impl", impl, *target_args]
    only = ["--profile-all", "--profile-only", "lookupdec"]
    if scalene_is_v2(cmd):
        run = [*cmd, "run", "--cpu-only", "--off", *only, "-o", str(json_path), *target[:1], "---", *target[1:]]
    else:
        run = [*cmd, "--cli", "--json", "--cpu-only", "--off", *only, "--outfile", str(json_path), *target[:1]]
        run += ["---", *target[1:]]
    print("$ " + " ".join(run), flush=True)
    rc = subprocess.run(run, cwd=out_dir, env=env, check=False).returncode
    if rc != 0 or not json_path.exists():
        print(f"scalene failed for {impl} (exit {rc})", file=sys.stderr)
        return rc or 1
    if scalene_is_v2(cmd):
        subprocess.run([*cmd, "view", "--standalone", json_path.name], cwd=out_dir, env=env, check=False)
        html = out_dir / "scalene-profile.html"
        if html.exists():
            html.replace(out_dir / f"profile-{impl}.html")
        text = subprocess.run(
            [*cmd, "view", "--cli", "--reduced", json_path.name],
            cwd=out_dir,
            env={**env, "COLUMNS": "160"},
            capture_output=True,
            text=True,
            check=False,
        ).stdout
        (out_dir / f"profile-{impl}.txt").write_text(re.sub(r"\x1b\[[0-9;]*m", "", text))
    print(f"wrote {out_dir}/profile-{impl}.{{json,html,txt}}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m perf profile", description=__doc__.splitlines()[0])
    p.add_argument("--impl", action="append", choices=IMPLS, help="implementation (repeatable; default: both)")
    p.add_argument("-o", "--output", type=Path, default=RESULTS / "profile", help="output folder")
    p.add_argument(
        "--tokens", type=positive_int, default=4 * 4096 + 1, help="replay this many tokens (default 4 chunks)"
    )
    p.add_argument("--static-tokens", type=nonnegative_int, default=250_000, help="static corpus prefix (0: none)")
    p.add_argument("--synthetic", action="store_true", help="use the seeded synthetic corpus")
    p.add_argument("--data", default=None, help="token files directory (default: ../shared/data)")
    args = p.parse_args(argv)
    out_dir: Path = args.output.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    src_root = source_copy(out_dir / "src")
    env = dict(os.environ)
    # The source copy first (interpreted lookupdec), then the repo (for perf itself).
    env["PYTHONPATH"] = os.pathsep.join([str(src_root), str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    env.pop("LOOKUPDEC_IMPL", None)
    target_args = ["--tokens", str(args.tokens), "--static-tokens", str(args.static_tokens)]
    if args.synthetic:
        target_args.append("--synthetic")
    if args.data:
        target_args += ["--data", args.data]
    rc = 0
    for impl in args.impl or list(IMPLS):
        if impl == "fast" and not (src_root / "lookupdec" / "fast" / "__init__.py").exists():
            print("SKIP fast: lookupdec/fast has no sources in this tree yet", file=sys.stderr)
            continue
        rc = profile(impl, out_dir, target_args, env) or rc
    return rc


if __name__ == "__main__":
    sys.exit(main())
