"""The CI performance gate.

Two checks, both meant to hold on noisy shared machines:

1. **Speed ratio** (``python -m perf gate [--fast]``): in one process, on the same tokens, the
   fast path and the reference replay the same chunks of text, *interleaved* (rounds in
   ABBA order, so drift in machine load hits both sides alike); the median wall time of each
   gives the ratio reference / fast. The gate fails when that ratio falls below
   :data:`MIN_SPEEDUP` for any workload, or when the two disagree on ``n_drafted`` /
   ``n_accept``. The workload is the *end* of a replay: the dynamic cache is first filled
   with the chunks before (untimed), so the per-token cost is the one a long replay has.
2. **Head vs base** (``python -m perf gate --base base.json --head head.json``): for every
   benchmark in both stored results, fails when head is slower than base by more than
   :data:`MAX_SLOWDOWN` *and* the difference is statistically significant.

Exit status: 0 pass, 1 the gate failed, 2 nothing could be measured (e.g. the fast path is
not compiled and ``--allow-interpreted`` was not given, or it does not exist and
``--allow-missing`` was not given).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Final

from perf._cli import InputError, nonnegative_float, nonnegative_int, positive_float

MIN_SPEEDUP: Final = 15.0
"""THE threshold: the fast path must replay at least this many times faster than the reference.

The project's target is >= 30x on the full replay. On the gate's fast workload the compiled
path measured 29-38x (medians; single rounds 18-57x) on the noisy shared 2-core machine, so 15x
leaves room for noise and still catches a fast path that lost its edge (an interpreted or
accidentally de-optimized build is ~1-3x). Override per run with ``$LOOKUPDEC_GATE_MIN_SPEEDUP``
or ``--min-speedup``.
"""
MAX_SLOWDOWN: Final = 0.10
"""Head-vs-base tolerance: head may be up to 10% slower than base before a significant
difference fails the gate. Override with ``$LOOKUPDEC_GATE_MAX_SLOWDOWN`` or ``--tolerance``."""

ENV_MIN_SPEEDUP: Final = "LOOKUPDEC_GATE_MIN_SPEEDUP"
ENV_MAX_SLOWDOWN: Final = "LOOKUPDEC_GATE_MAX_SLOWDOWN"

EXIT_PASS: Final = 0
EXIT_FAIL: Final = 1
EXIT_CANNOT_MEASURE: Final = 2


def min_speedup(override: float | None = None) -> tuple[float, str]:
    """The speed-ratio threshold in force and where it comes from."""
    if override is not None:
        return override, "--min-speedup"
    env = os.environ.get(ENV_MIN_SPEEDUP)
    if env:
        return float(env), f"${ENV_MIN_SPEEDUP}"
    return MIN_SPEEDUP, "perf/gate.py MIN_SPEEDUP"


def max_slowdown(override: float | None = None) -> tuple[float, str]:
    """The head-vs-base tolerance in force and where it comes from."""
    if override is not None:
        return override, "--tolerance"
    env = os.environ.get(ENV_MAX_SLOWDOWN)
    if env:
        return float(env), f"${ENV_MAX_SLOWDOWN}"
    return MAX_SLOWDOWN, "perf/gate.py MAX_SLOWDOWN"


# --- workloads -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    """Replay ``chunks`` chunks of ``n_ctx`` after ``warm_chunks`` chunks fed to the dynamic cache."""

    n_ctx: int
    warm_chunks: int
    chunks: int
    static_tokens: int  # 0: no static cache

    def label(self) -> str:
        from perf._common import size_label

        static = f"static {size_label(self.static_tokens)}" if self.static_tokens else "no static"
        return f"{self.chunks}x{self.n_ctx} after {self.warm_chunks} chunks, {static}"


FAST_WORKLOADS: Final = (Workload(4096, 24, 2, 0), Workload(4096, 24, 2, 250_000))
FULL_WORKLOADS: Final = (Workload(4096, 56, 8, 0), Workload(4096, 56, 8, 1_000_000))


@dataclass
class Side:
    """One implementation as the gate runs it."""

    label: str
    impl: ModuleType
    static: dict[int, Any]
    dynamic: dict[int, Any]
    seconds: dict[int, list[float]]
    counts: dict[int, tuple[int, int]]


def _seed_dynamic(impl: ModuleType, tokens: Sequence[int], w: Workload) -> Any:
    """The dynamic cache a replay holds after its first ``warm_chunks`` chunks."""
    dynamic = impl.NgramCache()
    for c in range(w.warm_chunks):
        chunk = tokens[c * w.n_ctx : (c + 1) * w.n_ctx]
        context = impl.NgramCache()
        context.update(chunk, len(chunk), 1, 4)
        dynamic.merge(context)
    return dynamic


def _copy_cache(impl: ModuleType, cache: Any) -> Any:
    fresh = impl.NgramCache()
    fresh.merge(cache)
    return fresh


def _open_static(impl: ModuleType, src: Any, n: int) -> Any:
    from perf._static import open_static, static_file

    if n == 0:
        return None
    return open_static(impl, static_file(src, n, "lookupdec"), "lookupdec-mmap")


def slowed(impl: ModuleType, factor: float) -> ModuleType:
    """``impl`` with ``replay`` made ``factor`` times slower in wall time (a test hook).

    The injected delay is a sleep proportional to the real replay's duration, so the gate's
    measured ratio moves by about ``factor`` whatever the machine's speed.
    """
    wrapper = ModuleType(f"{impl.__name__}_slowed_{factor:g}x")
    wrapper.__dict__.update({k: v for k, v in vars(impl).items() if not k.startswith("__")})
    original: Callable[..., Any] = impl.replay

    def replay(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        result = original(*args, **kwargs)
        time.sleep((time.perf_counter() - t0) * (factor - 1))
        return result

    wrapper.replay = replay  # type: ignore[attr-defined]
    return wrapper


def measure(
    reference: ModuleType,
    candidate: ModuleType,
    workloads: Sequence[Workload],
    rounds: int,
    src: Any,
    log: Callable[[str], None],
) -> tuple[Side, Side, list[tuple[Workload, list[int]]]]:
    """Time both implementations on every workload, interleaved; return both sides."""
    sides = [
        Side("reference", reference, {}, {}, {}, {}),
        Side("fast", candidate, {}, {}, {}, {}),
    ]
    plans: list[tuple[Workload, list[int]]] = []
    for wi, w in enumerate(workloads):
        need = (w.warm_chunks + w.chunks) * w.n_ctx + 1
        tokens = src.replay(need)
        if len(tokens) < need:
            raise SystemExit(f"the replay text has {len(tokens)} tokens, the gate workload needs {need}")
        replay_tokens = tokens[w.warm_chunks * w.n_ctx :]
        for s in sides:
            s.static[wi] = _open_static(s.impl, src, w.static_tokens)
            s.dynamic[wi] = _seed_dynamic(s.impl, tokens, w)
            s.seconds[wi] = []
        plans.append((w, replay_tokens))
    log(f"measuring {len(workloads)} workload(s), {rounds} interleaved rounds each")
    for r in range(rounds):
        for wi, (w, replay_tokens) in enumerate(plans):
            order = sides if r % 2 == 0 else sides[::-1]  # ABBA: alternate who goes first
            for s in order:
                dynamic = _copy_cache(s.impl, s.dynamic[wi])  # replay grows it: copy, untimed
                t0 = time.perf_counter()
                res = s.impl.replay(replay_tokens, w.n_ctx, 8, s.static[wi], dynamic)
                s.seconds[wi].append(time.perf_counter() - t0)
                s.counts[wi] = (res.n_drafted, res.n_accept)
    return sides[0], sides[1], plans


def run_ratio_gate(args: argparse.Namespace) -> int:
    from perf._common import ImplUnavailable, corpus, load_impl

    threshold, threshold_from = min_speedup(args.min_speedup)
    out: Callable[[str], None] = print
    try:
        reference = load_impl("reference")
        candidate = load_impl(args.candidate, allow_interpreted=True)
    except ImplUnavailable as e:
        out(f"GATE CANNOT MEASURE: {e}")
        if args.allow_missing:
            out("GATE SKIPPED (--allow-missing): there is no fast path to gate yet")
            return EXIT_PASS
        return EXIT_CANNOT_MEASURE
    compiled = bool(candidate.COMPILED)
    if not compiled:
        out(
            f"WARNING: lookupdec.{args.candidate} is NOT compiled: its mypyc extension modules are not "
            "installed (pip install -e . with a C compiler), so this gate would measure interpreted code."
        )
        if not args.allow_interpreted:
            out("GATE FAILED: refusing to gate an interpreted fast path (pass --allow-interpreted to measure it)")
            return EXIT_CANNOT_MEASURE
    if args.inject_slowdown:
        which, _, factor = args.inject_slowdown.partition(":")
        if which == "fast":
            candidate = slowed(candidate, float(factor))
        elif which == "reference":
            reference = slowed(reference, float(factor))
        else:
            raise SystemExit(f"--inject-slowdown takes fast:FACTOR or reference:FACTOR, not {args.inject_slowdown!r}")
        out(f"TEST HOOK: {which} side slowed down {float(factor):g}x")
    src = corpus(args.data, args.synthetic)
    if args.n_ctx or args.chunks or args.warm_chunks is not None or args.static_tokens is not None:
        base = (FULL_WORKLOADS if args.full else FAST_WORKLOADS)[0]
        n_ctx = args.n_ctx or base.n_ctx
        warm = args.warm_chunks if args.warm_chunks is not None else base.warm_chunks
        chunks = args.chunks or base.chunks
        statics = [0] if args.static_tokens is None else sorted({0, args.static_tokens})
        workloads: Sequence[Workload] = [Workload(n_ctx, warm, chunks, s) for s in statics]
    else:
        workloads = FULL_WORKLOADS if args.full else FAST_WORKLOADS
    rounds = args.rounds or (7 if args.full else 5)
    out(
        f"perf gate: lookupdec.{args.candidate} (compiled: {'yes' if compiled else 'no'}) vs lookupdec.reference; "
        f"corpus {src.name}; wall time of replay(), {rounds} interleaved rounds, medians"
    )
    t_start = time.perf_counter()
    ref, fast, plans = measure(reference, candidate, workloads, rounds, src, lambda m: out(f"  {m}"))
    failures: list[str] = []
    header = f"{'workload':<44} {'reference':>12} {'fast':>12} {'speedup':>9} {'min-max':>15}  threshold"
    out(header)
    out("-" * len(header))
    speedups: list[float] = []
    for wi, (w, _) in enumerate(plans):
        n_drafted = ref.counts[wi][0] or 1
        r_med = statistics.median(ref.seconds[wi])
        f_med = statistics.median(fast.seconds[wi])
        ratio = r_med / f_med if f_med > 0 else math.inf
        lo = min(ref.seconds[wi]) / max(fast.seconds[wi])
        hi = max(ref.seconds[wi]) / min(fast.seconds[wi])
        speedups.append(ratio)
        ok = ratio >= threshold
        out(
            f"{w.label():<44} {1e6 * r_med / n_drafted:>9.2f} us {1e6 * f_med / n_drafted:>9.2f} us "
            f"{ratio:>8.2f}x {f'{lo:.3g}-{hi:.3g}x':>15}  >= {threshold:g}x {'ok' if ok else 'FAIL'}"
        )
        if not ok:
            failures.append(f"{w.label()}: speedup {ratio:.2f}x < {threshold:g}x")
        if ref.counts[wi] != fast.counts[wi]:
            failures.append(
                f"{w.label()}: results differ: n_drafted/n_accept reference {ref.counts[wi]}, fast {fast.counts[wi]}"
            )
    out(f"(µs per drafted token = median replay wall time / n_drafted; took {time.perf_counter() - t_start:.1f} s)")
    worst = min(speedups)
    if args.report_only:
        out(
            f"GATE REPORT ONLY: measured speedup {worst:.2f}x (threshold {threshold:g}x from {threshold_from}: "
            "not enforced)"
        )
        for f in failures:
            out(f"  would fail: {f}")
        return EXIT_PASS
    if failures:
        out(f"GATE FAILED: measured speedup {worst:.2f}x, threshold {threshold:g}x (from {threshold_from})")
        for f in failures:
            out(f"  - {f}")
        return EXIT_FAIL
    out(f"GATE PASSED: measured speedup {worst:.2f}x >= threshold {threshold:g}x (from {threshold_from})")
    return EXIT_PASS


# --- head vs base ------------------------------------------------------------------------------


def is_regression(row: Any, tolerance: float) -> bool:
    """True when ``row`` (a :class:`perf.compare.Row`, A = base) is slower beyond ``tolerance``, significantly."""
    return bool(row.ratio > 1 + tolerance and row.significant is True)


def run_head_vs_base(args: argparse.Namespace) -> int:
    from perf.compare import compare_suites, load_suite

    tolerance, tolerance_from = max_slowdown(args.tolerance)
    base = load_suite(args.base)
    head = load_suite(args.head)
    rows = compare_suites(base, head)
    if not rows:
        print(f"GATE CANNOT MEASURE: {args.base} and {args.head} have no benchmark in common")
        return EXIT_CANNOT_MEASURE
    print(f"perf gate: head {args.head} vs base {args.base}; tolerance {100 * tolerance:g}% (from {tolerance_from})")
    header = f"{'benchmark':<48} {'base':>11} {'head':>11} {'head/base':>10}  significant  verdict"
    print(header)
    print("-" * len(header))
    failures: list[str] = []
    for row in rows:
        slower = row.ratio > 1 + tolerance
        bad = is_regression(row, tolerance)
        verdict = "SLOWER" if bad else ("slower (noise)" if slower else "ok")
        print(
            f"{row.name:<48} {row.a_text:>11} {row.b_text:>11} {row.ratio:>9.3f}x  "
            f"{row.significant_text:<11}  {verdict}"
        )
        if bad:
            failures.append(f"{row.name}: {row.ratio:.3f}x of base (significant, t={row.t_score:.1f})")
    if failures:
        print(
            f"GATE FAILED: {len(failures)} benchmark(s) significantly slower than base "
            f"by more than {100 * tolerance:g}%"
        )
        for f in failures:
            print(f"  - {f}")
        return EXIT_FAIL
    print(f"GATE PASSED: no significant slowdown beyond {100 * tolerance:g}% in {len(rows)} benchmark(s)")
    return EXIT_PASS


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    p = parser or argparse.ArgumentParser(prog="python -m perf gate", description=__doc__.splitlines()[0])
    p.add_argument("--fast", action="store_true", help="the quick CI workload (the default)")
    p.add_argument("--full", action="store_true", help="longer workloads (more chunks, a bigger static corpus)")
    p.add_argument("--min-speedup", type=positive_float, default=None, help=f"threshold (default {MIN_SPEEDUP:g}x)")
    p.add_argument("--allow-interpreted", action="store_true", help="measure an uncompiled fast path anyway")
    p.add_argument("--allow-missing", action="store_true", help="pass (skipped) when there is no fast path at all")
    p.add_argument("--report-only", action="store_true", help="print the measurements, never fail on speed")
    p.add_argument("--rounds", type=nonnegative_int, default=0, help="interleaved rounds (default 5, --full 7)")
    p.add_argument("--n-ctx", type=nonnegative_int, default=0, help="chunk length (default 4096)")
    p.add_argument("--chunks", type=nonnegative_int, default=0, help="chunks replayed per round")
    p.add_argument("--warm-chunks", type=nonnegative_int, default=None, help="chunks fed to the dynamic cache first")
    p.add_argument(
        "--static-tokens", type=nonnegative_int, default=None, help="static corpus prefix (0: no static workload)"
    )
    p.add_argument("--data", default=None, help="token files directory (default: ../shared/data)")
    p.add_argument("--synthetic", action="store_true", help="use the seeded synthetic corpus")
    p.add_argument("--base", type=Path, help="head-vs-base mode: the base's stored results (pyperf JSON)")
    p.add_argument("--head", type=Path, help="head-vs-base mode: the head's stored results")
    p.add_argument(
        "--tolerance", type=nonnegative_float, default=None, help=f"allowed slowdown (default {MAX_SLOWDOWN})"
    )
    # Test hooks (used by tests/test_perf_gate.py to prove the gate goes red):
    p.add_argument("--candidate", default="fast", choices=("fast", "reference"), help=argparse.SUPPRESS)
    p.add_argument("--inject-slowdown", default="", metavar="SIDE:FACTOR", help=argparse.SUPPRESS)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``python -m perf gate``; return the exit status."""
    p = build_parser()
    args = p.parse_args(argv)
    if (args.base is None) != (args.head is None):
        print("--base and --head go together", file=sys.stderr)
        return EXIT_CANNOT_MEASURE
    if args.base is not None:
        try:
            return run_head_vs_base(args)
        except InputError as e:
            p.error(str(e))
    return run_ratio_gate(args)


if __name__ == "__main__":
    sys.exit(main())
