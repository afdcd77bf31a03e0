"""``python -m perf track --base REV --head REV``: two commits, built and measured interleaved here.

What a pull request's performance check runs (``.github/workflows/perf.yml``) and what a
developer runs before pushing:

1. **Build** each commit into its own virtual environment: ``git archive`` of the commit into a
   temporary source tree, then ``pip install`` of it with ``LOOKUPDEC_REQUIRE_MYPYC=1`` (so both
   sides are really compiled, or the command stops). Environments are kept under ``--envs``,
   keyed by the commit's *tree* hash and the Python version, so a rerun, or two commits with the
   same sources, build once.
2. **Measure** the chosen benchmark scripts of *this* checkout's ``perf/`` (the same harness for
   both sides, copied next to the environments so neither source tree shadows the installed
   package) with each environment's Python, alternating: round 1 runs base then head, round 2
   head then base, and so on (ABBA), so drift in machine load hits both sides alike. pyperf's
   ``--append`` gathers every round's values into ``base.json`` and ``head.json``.
3. **Compare**: ``pyperf compare_to`` and the head-vs-base gate of :mod:`perf.gate` (head may be
   up to :data:`perf.gate.MAX_SLOWDOWN` slower before a *significant* difference fails; that
   constant is the one place the threshold is set), written to ``compare.txt``, ``compare.md``
   (a job summary), ``compare.json`` (for :mod:`perf.history`) and ``plots/head_vs_base.png``.

Exit status: 0 no significant regression, 1 a benchmark regressed beyond the threshold,
2 nothing could be measured (a revision that does not exist, a build that failed, ...).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from perf._cli import nonnegative_float, nonnegative_int
from perf.gate import EXIT_CANNOT_MEASURE, EXIT_FAIL, EXIT_PASS, MAX_SLOWDOWN

REPO: Final = Path(__file__).resolve().parents[1]
SCRIPTS: Final = ("draft", "update", "static", "create", "merge")
DEFAULT_OUT: Final = REPO / "results" / "track"
ENV_MARK: Final = "lookupdec-track-env.json"
"""Written into an environment once it is built and proven compiled: its presence means reusable."""


class TrackError(Exception):
    """Something that makes the comparison impossible (exit status 2), with what to do about it."""


@dataclass(frozen=True)
class Side:
    """One side of the comparison: the revision asked for, its commit, its environment."""

    label: str  # "base" or "head"
    rev: str
    sha: str
    python: Path
    results: Path


def _git(repo: Path, *args: str) -> str:
    try:
        proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=False)
    except OSError as e:  # no git at all (e.g. a bare container)
        raise TrackError(f"cannot run git: {e}") from e
    if proc.returncode != 0:
        raise TrackError(f"git {' '.join(args)} failed in {repo}: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout.strip()


def resolve(repo: Path, rev: str) -> tuple[str, str]:
    """(commit sha, tree sha) of ``rev`` in ``repo``; a clear error when it is not a commit there."""
    try:
        sha = _git(repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    except TrackError:
        raise TrackError(
            f"{rev!r} is not a commit in {repo} (a shallow clone? fetch it, e.g. git fetch --depth=1 origin {rev})"
        ) from None
    return sha, _git(repo, "rev-parse", f"{sha}^{{tree}}")


def _venv_python(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def build_env(repo: Path, sha: str, tree: str, envs: Path, log: Any) -> Path:
    """The Python of a virtual environment holding ``sha`` installed and compiled (built once per tree)."""
    import pyperf

    key = {
        "tree": tree,
        "python": platform.python_version(),
        "executable": sys.executable,
        "pyperf": pyperf.__version__,
    }
    envdir = envs / f"{tree[:12]}-py{sys.version_info.major}{sys.version_info.minor}"
    python = _venv_python(envdir / "venv")
    mark = envdir / ENV_MARK
    if mark.is_file() and python.exists():
        try:
            if json.loads(mark.read_text()) == key:
                log(f"  reusing {envdir} (tree {tree[:12]})")
                return python
        except (OSError, ValueError):
            pass
    shutil.rmtree(envdir, ignore_errors=True)
    src = envdir / "src"
    src.mkdir(parents=True)
    log(f"  exporting {sha[:12]} to {src}")
    archive = subprocess.Popen(["git", "-C", str(repo), "archive", "--format=tar", sha], stdout=subprocess.PIPE)
    untar = subprocess.run(["tar", "-x", "-C", str(src)], stdin=archive.stdout, check=False)
    if archive.wait() != 0 or untar.returncode != 0:
        raise TrackError(f"could not export {sha} from {repo} (git archive | tar -x failed)")
    env = dict(os.environ, LOOKUPDEC_REQUIRE_MYPYC="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    env.pop("LOOKUPDEC_NO_MYPYC", None)
    build_log = envdir / "build.log"
    steps = [
        [sys.executable, "-m", "venv", str(envdir / "venv")],
        # The same pyperf as this process: both sides write files this process reads and compares.
        [str(python), "-m", "pip", "install", str(src), f"pyperf=={pyperf.__version__}"],
        [str(python), "-c", "import sys, lookupdec.fast as f; sys.exit(0 if f.COMPILED else 1)"],
    ]
    t0 = time.perf_counter()
    log(f"  building {sha[:12]} into {envdir / 'venv'} (compiling with mypyc; log: {build_log})")
    with open(build_log, "w") as out:
        for cmd in steps:
            out.write("$ " + " ".join(cmd) + "\n")
            out.flush()
            # cwd: away from any checkout, so `import lookupdec` finds the installed package.
            rc = subprocess.run(cmd, cwd=envdir, env=env, stdout=out, stderr=subprocess.STDOUT, check=False)
            if rc.returncode != 0:
                tail = build_log.read_text(errors="replace").splitlines()[-15:]
                raise TrackError(
                    f"building {sha[:12]} failed at `{' '.join(cmd[:4])} ...` (exit {rc.returncode}); "
                    f"last lines of {build_log}:\n    " + "\n    ".join(tail)
                )
    mark.write_text(json.dumps(key))
    log(f"  built in {time.perf_counter() - t0:.0f} s")
    return python


def copy_harness(dest: Path) -> Path:
    """Copy this checkout's ``perf/`` package (only) to ``dest/perf``; return ``dest``.

    The benchmark scripts run with ``dest`` as working directory, so ``python -m perf.bench_*``
    finds them while ``lookupdec`` comes from each environment's site-packages: the checkout's
    own ``lookupdec/`` (uncompiled .py files) must not be on the path.
    """
    shutil.rmtree(dest / "perf", ignore_errors=True)
    shutil.copytree(REPO / "perf", dest / "perf", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return dest


def bench_command(side: Side, script: str, args: argparse.Namespace, data: str) -> list[str]:
    """The pyperf command line that appends one round of ``script`` to ``side``'s results."""
    from perf.run import FAST_ARGS

    cmd = [str(side.python), "-m", f"perf.bench_{script}", "--impl", "fast", "--workload", args.workload]
    cmd += ["--quiet", "--append", str(side.results), *FAST_ARGS]
    if args.values:
        cmd += ["--values", str(args.values)]  # after FAST_ARGS: the last --values wins
    if data:
        cmd += ["--data", data]
    if args.synthetic:
        cmd.append("--synthetic")
    if args.benchmarks:
        cmd += ["--only", args.benchmarks]
    return cmd


def measure(sides: Sequence[Side], scripts: Sequence[str], args: argparse.Namespace, harness: Path, log: Any) -> None:
    """Run every script ``args.rounds`` times per side, alternating which side goes first."""
    from perf._common import data_dir

    data = args.data or str(data_dir())
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)  # the harness comes from the working directory, lookupdec from the venv
    t0 = time.perf_counter()
    for r in range(args.rounds):
        for script in scripts:
            order = sides if r % 2 == 0 else list(reversed(sides))
            for side in order:
                log(f"  round {r + 1}/{args.rounds} bench_{script} {side.label} ({time.perf_counter() - t0:.0f} s)")
                cmd = bench_command(side, script, args, data)
                rc = subprocess.run(cmd, cwd=harness, env=env, check=False).returncode
                if rc != 0:
                    raise TrackError(f"bench_{script} on {side.label} ({side.sha[:12]}) exited with {rc}: {cmd}")


def pyperf_table(base: Path, head: Path, fmt: str) -> str:
    """``pyperf compare_to --table`` of the two files (``fmt``: rest or md), as text."""
    cmd = [sys.executable, "-m", "pyperf", "compare_to", str(base), str(head), "--table", "--table-format", fmt]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    return proc.stdout if proc.returncode == 0 else f"(pyperf compare_to failed: {proc.stderr.strip()})\n"


def write_outputs(
    sides: Sequence[Side], out: Path, tolerance: float | None, runner: str = ""
) -> tuple[int, dict[str, Any]]:
    """Compare, print, and write compare.txt / .md / .json and the plot; return (exit status, record)."""
    from perf import gate
    from perf.compare import compare_suites, load_suite

    base, head = sides
    gate_args = ["--base", str(base.results), "--head", str(head.results)]
    if tolerance is not None:
        gate_args += ["--tolerance", str(tolerance)]
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = gate.main(gate_args)
    gate_text = buf.getvalue()
    limit, limit_from = gate.max_slowdown(tolerance)
    rows = compare_suites(load_suite(base.results), load_suite(head.results))
    record: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": {"system": platform.system(), "arch": platform.machine(), "python": platform.python_version()},
        "runner": runner or f"{platform.system()}-{platform.machine()}".lower(),
        "base": {"rev": base.rev, "sha": base.sha},
        "head": {"rev": head.rev, "sha": head.sha},
        "tolerance": limit,
        "tolerance_from": limit_from,
        "passed": rc == EXIT_PASS,
        "benchmarks": [
            {
                "name": row.name,
                "base_median": row.a_median,
                "head_median": row.b_median,
                "ratio": row.ratio,
                "significant": row.significant,
                "regression": gate.is_regression(row, limit),
            }
            for row in rows
        ],
    }
    table = pyperf_table(base.results, head.results, "rest")
    text = f"$ python -m pyperf compare_to base.json head.json --table\n{table}\n{gate_text}"
    print(text)
    (out / "compare.txt").write_text(text)
    (out / "compare.json").write_text(json.dumps(record, indent=2) + "\n")
    (out / "compare.md").write_text(markdown(record, pyperf_table(base.results, head.results, "md")))
    plot(record, out / "plots" / "head_vs_base.png")
    return rc, record


def markdown(record: dict[str, Any], pyperf_md: str) -> str:
    """The job summary: verdict, revisions, threshold, pyperf's table and the gate's verdicts."""
    verdict = "passed" if record["passed"] else "FAILED"
    m = record["machine"]
    lines = [
        f"## perf track: {verdict}",
        "",
        f"base `{record['base']['sha'][:12]}` ({record['base']['rev']}) vs head `{record['head']['sha'][:12]}` "
        f"({record['head']['rev']}), measured interleaved on {m['system']} {m['arch']}, Python {m['python']}.",
        f"A benchmark fails when head is slower by more than {100 * record['tolerance']:g}% "
        f"(from {record['tolerance_from']}) and the difference is significant.",
        "",
        "| benchmark | head/base time | significant | verdict |",
        "|---|---:|---|---|",
    ]
    for b in record["benchmarks"]:
        sig = {True: "yes", False: "no", None: "n/a"}[b["significant"]]
        lines.append(f"| {b['name']} | {b['ratio']:.3f}x | {sig} | {'**SLOWER**' if b['regression'] else 'ok'} |")
    lines += ["", "<details><summary>pyperf compare_to</summary>", "", pyperf_md, "</details>", ""]
    return "\n".join(lines)


def plot(record: dict[str, Any], path: Path) -> None:
    """A bar per benchmark: head/base time, the threshold line; skipped without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"(no plot: matplotlib is not installed; pip install '.[perf]' for {path})")
        return
    benches = record["benchmarks"]
    if not benches:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(8, 0.35 * len(benches) + 1.5))
    names = [b["name"] for b in benches]
    ratios = [b["ratio"] for b in benches]
    colors = ["tab:red" if b["regression"] else "tab:blue" for b in benches]
    ax.barh(names, ratios, color=colors)
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.axvline(1 + record["tolerance"], color="tab:red", linestyle="--", linewidth=0.8, label="threshold")
    ax.invert_yaxis()
    ax.set_xlabel("head / base time (> 1: head is slower)")
    ax.set_title(f"{record['head']['sha'][:10]} vs {record['base']['sha'][:10]} ({record['runner']})")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def build_parser() -> argparse.ArgumentParser:
    """The ``python -m perf track`` command line."""
    p = argparse.ArgumentParser(
        prog="python -m perf track",
        description=(
            "Build the base and head commits into two compiled virtualenvs, run the chosen pyperf "
            "benchmarks on both alternately (ABBA rounds), write base.json, head.json and the comparison "
            "(compare.txt/.md/.json, plots/) to OUTPUT. Exit 0: no significant regression; 1: a benchmark "
            f"is significantly slower than base by more than the threshold ({100 * MAX_SLOWDOWN:g}%, "
            "MAX_SLOWDOWN in perf/gate.py); 2: cannot measure (unknown revision, failed build)."
        ),
        epilog=(
            "example: python -m perf track --base origin/main --head HEAD --bench draft "
            "--benchmarks draft.static=none  (the first run per commit builds it: a minute or two)"
        ),
    )
    p.add_argument("--base", required=True, help="the revision to compare against (any git revision)")
    p.add_argument("--head", default="HEAD", help="the revision under test (default: HEAD)")
    p.add_argument("--repo", type=Path, default=REPO, help="git repository holding both (default: this checkout)")
    p.add_argument("--bench", default=",".join(SCRIPTS), help=f"benchmark scripts (default: {','.join(SCRIPTS)})")
    p.add_argument("--benchmarks", default="", help="comma-separated benchmark name prefixes, e.g. draft,update")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds per side (default 3)")
    p.add_argument("--values", type=nonnegative_int, default=0, help="pyperf values per round (default 3)")
    p.add_argument("--workload", choices=("fast", "full"), default="fast", help="input sizes (default: fast)")
    p.add_argument("-o", "--output", type=Path, default=DEFAULT_OUT, help="directory for the results")
    p.add_argument("--envs", type=Path, default=None, help="where built environments are kept (default: OUTPUT/envs)")
    p.add_argument(
        "--tolerance", type=nonnegative_float, default=None, help=f"allowed slowdown (default {MAX_SLOWDOWN:g})"
    )
    p.add_argument("--data", default=None, help="token files directory (default: ../shared/data)")
    p.add_argument("--synthetic", action="store_true", help="use the seeded synthetic corpus")
    p.add_argument("--runner", default="", help="name of this machine in compare.json (default: system-arch)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``python -m perf track``; return the exit status."""
    p = build_parser()
    args = p.parse_args(argv)
    scripts = [s.strip() for s in args.bench.split(",") if s.strip()]
    unknown = sorted(set(scripts) - set(SCRIPTS))
    if unknown:
        p.error(f"unknown benchmark script(s) {', '.join(unknown)}; choose from {', '.join(SCRIPTS)}")
    if args.rounds < 1:
        p.error("--rounds must be at least 1")

    def log(msg: str) -> None:
        print(msg, flush=True)

    out: Path = args.output.resolve()
    envs: Path = (args.envs or out / "envs").resolve()
    repo: Path = args.repo.resolve()
    try:
        out.mkdir(parents=True, exist_ok=True)
        sides = []
        for label, rev in (("base", args.base), ("head", args.head)):
            sha, tree = resolve(repo, rev)
            log(f"{label}: {rev} = {sha[:12]}")
            python = build_env(repo, sha, tree, envs, log)
            results = out / f"{label}.json"
            results.unlink(missing_ok=True)  # pyperf --append would add to an older run
            sides.append(Side(label, rev, sha, python, results))
        harness = copy_harness(out / "harness")
        log(f"measuring {','.join(scripts)}: {args.rounds} interleaved rounds per side, harness {harness / 'perf'}")
        measure(sides, scripts, args, harness, log)
        for s in sides:
            if not s.results.is_file():
                raise TrackError(f"no benchmark ran for {s.label}: {s.results} was not written")
    except TrackError as e:
        print(f"perf track: error: {e}", file=sys.stderr)
        return EXIT_CANNOT_MEASURE
    rc, _ = write_outputs(sides, out, args.tolerance, args.runner)
    log(f"wrote {out}/base.json, head.json, compare.txt, compare.md, compare.json, plots/")
    return rc if rc in (EXIT_PASS, EXIT_FAIL) else EXIT_CANNOT_MEASURE


if __name__ == "__main__":
    sys.exit(main())
