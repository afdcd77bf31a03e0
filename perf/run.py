"""``python -m perf run``: run the benchmark scripts for each implementation and store one suite.

Each script (``perf/bench_*.py``) runs as its own pyperf program (a manager process spawning
worker processes); their outputs are merged into one pyperf BenchmarkSuite JSON file whose
benchmark names end in ``@reference`` or ``@fast``. Options pyperf understands
(``--processes``, ``--values``, ``--rigorous``, ``--affinity`` ...) are passed through to every
script after the defaults of the mode, so they win.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Final

import pyperf

from perf._common import IMPLS, REPO, ImplUnavailable, corpus, load_impl

SCRIPTS: Final = ("draft", "update", "static", "create", "merge")

FAST_ARGS: Final = ["--processes", "1", "--values", "3", "--min-time", "0.02"]
"""CI mode: one worker process per benchmark, three values (min-max bars still have a spread)."""
FULL_ARGS: Final = {
    "draft": ["--processes", "3", "--values", "1"],  # each value is a whole replay; + 1 warm-up replay
    "static": ["--processes", "3", "--values", "3"],  # 32 benchmarks, opens of up to ~1 s each
    "default": ["--processes", "6", "--values", "3"],
}


def available_impls(wanted: Sequence[str] | None, allow_interpreted: bool) -> list[str]:
    """The implementations to run: the ones asked for (all must work), else every one that works."""
    if wanted:
        for name in wanted:
            load_impl(name, allow_interpreted)  # raises ImplUnavailable
        return list(dict.fromkeys(wanted))
    names = []
    for name in IMPLS:
        try:
            load_impl(name, allow_interpreted)
        except ImplUnavailable as e:
            print(f"SKIP implementation {name}: {e}", file=sys.stderr)
            continue
        names.append(name)
    return names


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m perf run", description=__doc__.splitlines()[0])
    p.add_argument("-o", "--output", type=Path, default=REPO / "results" / "run.json", help="suite JSON to write")
    p.add_argument("--fast", action="store_true", help="CI mode: small inputs, few values (~2 minutes)")
    p.add_argument("--impl", action="append", choices=IMPLS, help="implementation (repeatable; default: all)")
    p.add_argument("--bench", default=",".join(SCRIPTS), help=f"scripts to run (default: {','.join(SCRIPTS)})")
    p.add_argument("--only", default="", help="comma-separated benchmark name prefixes, e.g. draft,static.open")
    p.add_argument("--allow-interpreted", action="store_true", help="measure the fast path even if not compiled")
    p.add_argument("--synthetic", action="store_true", help="use the seeded synthetic corpus")
    p.add_argument("--data", default=None, help="token files directory (default: ../shared/data)")
    args, pyperf_args = p.parse_known_args(argv)
    try:
        impls = available_impls(args.impl, args.allow_interpreted)
    except ImplUnavailable as e:
        print(f"ERROR: {e}", file=sys.stderr)
        return 2
    scripts = [s.strip() for s in args.bench.split(",") if s.strip()]
    unknown = sorted(set(scripts) - set(SCRIPTS))
    if unknown:
        p.error(f"unknown benchmark script(s) {', '.join(unknown)}; choose from {', '.join(SCRIPTS)}")
    src = corpus(args.data, args.synthetic)
    data = str(src.directory) if src.directory else (args.data or "")
    print(f"perf run: {'fast' if args.fast else 'full'} mode, implementations {', '.join(impls)}, corpus {src.name}")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    failures: list[str] = []
    benchmarks = []
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="lookupdec-perf-") as tmp:
        for impl in impls:
            for script in scripts:
                out = Path(tmp) / f"{script}-{impl}.json"
                mode_args = FAST_ARGS if args.fast else FULL_ARGS.get(script, FULL_ARGS["default"])
                cmd = [
                    sys.executable,
                    "-m",
                    f"perf.bench_{script}",
                    "--impl",
                    impl,
                    "--workload",
                    "fast" if args.fast else "full",
                    "--quiet",
                    "-o",
                    str(out),
                    *mode_args,
                    *pyperf_args,
                ]
                if data:
                    cmd += ["--data", data]
                if args.synthetic:
                    cmd.append("--synthetic")
                if args.allow_interpreted:
                    cmd.append("--allow-interpreted")
                if args.only:
                    cmd += ["--only", args.only]
                print(f"--- bench_{script} --impl {impl} ({time.perf_counter() - t0:.0f} s)", flush=True)
                rc = subprocess.run(cmd, cwd=REPO, env=env, check=False).returncode
                if rc != 0:
                    failures.append(f"bench_{script} --impl {impl} exited with {rc}")
                    continue
                if out.exists():
                    benchmarks.extend(pyperf.BenchmarkSuite.load(str(out)).get_benchmarks())
    if not benchmarks:
        print("no benchmark ran", file=sys.stderr)
        return 1
    suite = pyperf.BenchmarkSuite(benchmarks)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    suite.dump(str(args.output), replace=True)
    print(f"\nwrote {len(benchmarks)} benchmark(s) to {args.output} in {time.perf_counter() - t0:.0f} s\n")
    from perf.compare import summary

    summary(suite)
    for f in failures:
        print(f"FAILED: {f}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
