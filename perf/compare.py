"""Compare stored results: ``python -m perf compare A.json B.json`` and ``--impls run.json``.

- two files: runs ``python -m pyperf compare_to A B --table`` (pyperf's own view), then prints
  lookupdec's table: per benchmark the medians, B/A (time ratio, > 1 means B is slower), A/B
  (speedup) and whether the difference is significant (pyperf's two-sample t-test, 95%);
- ``--impls FILE``: within one run, pairs ``X@reference`` with ``X@fast`` and prints the speedup
  of the fast path per benchmark.
"""

from __future__ import annotations

import argparse
import math
import statistics
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from perf._cli import InputError, load_pyperf_suite


def load_suite(path: str | Path) -> Any:
    """A pyperf BenchmarkSuite from a stored JSON file (a single Benchmark file is wrapped).

    Raises :class:`perf._cli.InputError` naming the file when it is missing or not pyperf's.
    """
    return load_pyperf_suite(path)


def _fmt(bench: Any, value: float) -> str:
    return str(bench.format_value(value))


def significance(a: Sequence[float], b: Sequence[float]) -> tuple[bool | None, float]:
    """(significant?, t score) by a two-sample Student t-test at 95% (pooled variance, as pyperf's).

    (None, nan) when it cannot tell: fewer than 2 values on a side, or no variance at all.
    """
    if len(a) < 2 or len(b) < 2:
        return None, math.nan
    n_a, n_b = len(a), len(b)
    df = n_a + n_b - 2
    pooled = ((n_a - 1) * statistics.variance(a) + (n_b - 1) * statistics.variance(b)) / df
    if pooled == 0:
        return None, math.nan
    t = (statistics.fmean(a) - statistics.fmean(b)) / math.sqrt(pooled * (1 / n_a + 1 / n_b))
    return abs(t) >= _t_critical_95(df), t


# Two-sided 95% critical values of Student's t (standard tables), by degrees of freedom.
_T95: Final = {
    1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
    11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093,
    20: 2.086, 21: 2.080, 22: 2.074, 23: 2.069, 24: 2.064, 25: 2.060, 26: 2.056, 27: 2.052, 28: 2.048,
    29: 2.045, 30: 2.042, 40: 2.021, 60: 2.000, 120: 1.980,
}  # fmt: skip


def _t_critical_95(df: int) -> float:
    """The critical value for ``df`` degrees of freedom: the table's, at the nearest df not above (conservative)."""
    below = [d for d in _T95 if d <= df]
    return _T95[max(below)] if df <= 120 else 1.960


@dataclass(frozen=True)
class Row:
    """One benchmark's comparison."""

    name: str
    a_median: float
    b_median: float
    a_text: str
    b_text: str
    significant: bool | None
    t_score: float

    @property
    def ratio(self) -> float:
        """B / A: time ratio (> 1: B is slower)."""
        return self.b_median / self.a_median if self.a_median else math.inf

    @property
    def significant_text(self) -> str:
        return {True: "yes", False: "no", None: "n/a"}[self.significant]


def _row(name: str, a: Any, b: Any) -> Row:
    av, bv = a.get_values(), b.get_values()
    am, bm = statistics.median(av), statistics.median(bv)
    sig, t = significance(av, bv)
    return Row(name, am, bm, _fmt(a, am), _fmt(b, bm), sig, t)


def compare_suites(a: Any, b: Any) -> list[Row]:
    """Rows for every benchmark name present in both suites, in A's order."""
    b_by_name = {bench.get_name(): bench for bench in b.get_benchmarks()}
    return [
        _row(bench.get_name(), bench, b_by_name[bench.get_name()])
        for bench in a.get_benchmarks()
        if bench.get_name() in b_by_name
    ]


def impl_pairs(suite: Any, base: str = "reference", other: str = "fast") -> list[Row]:
    """Rows pairing ``X@base`` (A) with ``X@other`` (B) within one suite."""
    by_name = {bench.get_name(): bench for bench in suite.get_benchmarks()}
    rows = []
    for name, bench in by_name.items():
        stem, _, impl = name.rpartition("@")
        if impl == base and f"{stem}@{other}" in by_name:
            rows.append(_row(stem, bench, by_name[f"{stem}@{other}"]))
    return rows


def print_rows(rows: Sequence[Row], a_label: str, b_label: str) -> None:
    header = f"{'benchmark':<44} {a_label:>12} {b_label:>12} {'B/A time':>9} {'A/B speed':>10}  significant"
    print(header)
    print("-" * len(header))
    for r in rows:
        speed = r.a_median / r.b_median if r.b_median else math.inf
        print(f"{r.name:<44} {r.a_text:>12} {r.b_text:>12} {r.ratio:>8.3f}x {speed:>9.2f}x  {r.significant_text}")
    if rows:
        geo = math.exp(statistics.fmean(math.log(r.a_median / r.b_median) for r in rows if r.a_median and r.b_median))
        print(f"geometric mean speed A/B: {geo:.3f}x over {len(rows)} benchmark(s)")


def summary(suite: Any) -> None:
    """Median and min-max of every benchmark in a suite, then the fast/reference pairs."""
    header = f"{'benchmark':<52} {'median':>12} {'min':>12} {'max':>12} {'values':>6}"
    print(header)
    print("-" * len(header))
    for bench in suite.get_benchmarks():
        v = bench.get_values()
        print(
            f"{bench.get_name():<52} {_fmt(bench, statistics.median(v)):>12} {_fmt(bench, min(v)):>12} "
            f"{_fmt(bench, max(v)):>12} {len(v):>6}"
        )
    rows = impl_pairs(suite)
    if rows:
        print()
        print("fast path vs reference in this run (A = reference, B = fast):")
        print_rows(rows, "reference", "fast")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m perf compare", description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="+", type=Path, help="A.json B.json, or one file with --impls")
    p.add_argument("--impls", action="store_true", help="compare X@reference with X@fast within one file")
    p.add_argument("--no-pyperf", action="store_true", help="skip pyperf compare_to's own table")
    args = p.parse_args(argv)
    try:
        # every file is read before anything is printed: a bad one ends with one line, no half table
        suites = [load_suite(f) for f in args.files]
    except InputError as e:
        p.error(str(e))
    if args.impls:
        for f, suite in zip(args.files, suites, strict=True):
            rows = impl_pairs(suite)
            print(f"{f}: A = reference, B = fast")
            if not rows:
                print("  no benchmark ran with both implementations")
            print_rows(rows, "reference", "fast")
        return 0
    if len(args.files) != 2:
        p.error("give two result files (A B), or one with --impls")
    a_path, b_path = args.files
    if not args.no_pyperf:
        cmd = [sys.executable, "-m", "pyperf", "compare_to", str(a_path), str(b_path), "--table"]
        print("$ " + " ".join(cmd[1:]))
        subprocess.run(cmd, check=False)
        print()
    rows = compare_suites(*suites)
    print(f"A = {a_path}, B = {b_path}")
    if not rows:
        print("no benchmark in common")
        return 1
    print_rows(rows, "A", "B")
    return 0


if __name__ == "__main__":
    sys.exit(main())
