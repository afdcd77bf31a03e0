"""The adaptive draft length on a fake clock: ``perf speedup``'s teacher-forced run without a model.

``python -m perf speedup`` measures real forward passes, which takes minutes to hours and is as
noisy as the machine. Its acceptance is teacher-forced (the model's token is the real text's),
so what the adapters' :class:`lookupdec.adapters.DraftLength` decides depends only on the
texts and on the verify cost curve, ``T(n)`` for ``n`` tokens verified. This replays the same
windows (``perf.speedup.teacher_forced_workloads``: WikiText, code, edits) through
``HistoryFollower`` and ``DraftLength`` themselves (with ``--grounded-work``, the ``code``
windows come from the pinned releases' ``.py`` files instead of this repository's code, which
moves with every commit), in the same order (rounds x texts x windows,
one controller per drafter kept across its generations, as perf speedup and the engines' adapters
keep it), on a clock that advances ``T(len(draft) + 1)`` per step. The decisions are the
controller's; the timing is exact (whole microseconds), so runs repeat and differences are the
controller's alone.

Reported per drafter: the speedup over plain greedy (``T(1)`` per token), per text and as the
geometric mean over the texts, and the tokens per step. ``--baseline REV`` also runs
``DraftLength`` as it is in git revision ``REV`` (its file ``lookupdec/adapters/__init__.py``),
as ``DRAFTER@REV``: the change to the controller, side by side.

A curve is milliseconds for 1..k+1 tokens (docs/speedup.md prints each run's). Small differences
(a few percent) between controllers can flip with the path: what a controller learned on the
windows before decides what it drafts on the next. So compare over several orders (``--orders``),
curves and numbers of windows. ``--burst N,FACTOR`` slows the first N windows FACTOR times, as
another job's load does on a shared machine: what the controller measured then must not keep
it from drafting after.

    python -m perf.length_replay --curve 89.2,119.8,167.9,205.7,264.8 --grounded-work /work/grounded
    python -m perf.length_replay --curve 100,157,214,271,328,385,442,499,556 --prompts 8 --baseline HEAD~1
    python -m perf length-replay ...                                          # the same, via python -m perf
"""

from __future__ import annotations

import argparse
import math
import random
import subprocess
import sys
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from perf._cli import positive_int

REPO: Final = Path(__file__).resolve().parent.parent
DRAFTERS: Final = ("llama", "hybrid")


@dataclass
class Totals:
    """One drafter's replay of one text: plain greedy's time, its own time, tokens, steps."""

    plain: float = 0.0
    seconds: float = 0.0
    tokens: int = 0
    steps: int = 0


class FakeClock:
    """``time.perf_counter`` for the adapters: the replay advances it by the curve."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


def draft_length_at(rev: str) -> type:
    """``DraftLength`` as git revision ``rev`` has it, as a subclass of today's (the adapters take it)."""
    from lookupdec.adapters import DraftLength

    path = "lookupdec/adapters/__init__.py"
    try:
        src = subprocess.run(
            ["git", "-C", str(REPO), "show", f"{rev}:{path}"], check=True, capture_output=True, text=True
        ).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        detail = e.stderr.strip() if isinstance(e, subprocess.CalledProcessError) else str(e)
        raise SystemExit(f"perf length_replay: cannot read {path} at {rev!r} from {REPO}: {detail}") from e
    module = types.ModuleType(f"lookupdec_adapters_at_{rev}")
    exec(compile(src, f"{rev}:{path}", "exec"), module.__dict__)
    old = module.__dict__["DraftLength"]
    # Its methods with its own module's globals; a subclass, so HistoryFollower's isinstance holds.
    body = {k: v for k, v in vars(old).items() if k not in ("__dict__", "__weakref__")}
    return type(f"DraftLength@{rev}", (DraftLength,), body)


def window_order(workloads: Sequence[Any], rounds: int, seed: int) -> list[tuple[str, list[int], list[int]]]:
    """The windows as (text, prompt, truth), in perf speedup's order (``seed`` 0: rounds x texts x
    windows) or, for another seed, each round's windows shuffled (texts mixed, as a server's
    requests come)."""
    one = [(w.name, p, t) for w in workloads for p, t in zip(w.prompts, w.truth, strict=True)]
    out: list[tuple[str, list[int], list[int]]] = []
    rng = random.Random(seed)
    for _ in range(rounds):
        out += rng.sample(one, len(one)) if seed else one
    return out


Controller = Callable[[int], Any]
"""Makes a drafter variant's controller from ``k``: a ``DraftLength`` class, or :func:`fixed_length`."""


def fixed_length(k: int) -> None:
    """No controller: the variant always drafts up to ``k`` (``--fixed``, ``NAME/fixed``)."""
    return None


def replay(
    curve_ms: Sequence[float],
    k: int,
    workloads: Sequence[Any],
    variants: dict[str, tuple[str, Controller]],
    rounds: int = 2,
    seed: int = 0,
    burst: tuple[int, int] = (0, 1),
) -> dict[tuple[str, str], Totals]:
    """Replay every variant (name -> (policy, :data:`Controller`)) over the windows; totals per (name, text).

    ``seed``: the windows' order (:func:`window_order`). ``burst`` = (n, factor): the first n
    windows run ``factor`` times slower, as under another job's load on a shared machine (plain
    greedy's time too)."""
    import lookupdec
    import lookupdec.adapters as adapters
    from lookupdec.adapters import HistoryFollower

    if len(curve_ms) < k + 1:
        raise ValueError(f"the curve has {len(curve_ms)} costs; k = {k} needs {k + 1} (1..k+1 tokens)")
    # The clock counts whole microseconds: sums of whole numbers are exact in floating point, so
    # a step's measured cost does not depend on how far the clock has run (DraftLength only
    # compares costs with each other: the unit does not matter).
    curve = [float(round(ms * 1000)) for ms in curve_ms]
    clock = FakeClock()
    # The adapters time their steps with their module's `time.perf_counter`: the fake clock's.
    namespace = vars(adapters)
    real_time = namespace["time"]
    namespace["time"] = clock
    try:
        controllers = {name: cls(k) for name, (_, cls) in variants.items()}
        out: dict[tuple[str, str], Totals] = {}
        for i, (text, prompt, truth) in enumerate(window_order(workloads, rounds, seed)):
            slow = burst[1] if i < burst[0] else 1
            for name, (policy, _) in variants.items():
                follower = HistoryFollower(lookupdec.Drafter(n_draft=k, policy=policy), adaptive=controllers[name])
                history = list(prompt)
                t = out.setdefault((name, text), Totals())
                start, pos = clock.now, 0
                while pos < len(truth):
                    draft = follower.propose(history, k)
                    clock.now += curve[len(draft)] * slow
                    t.steps += 1
                    n = 0
                    while n < len(draft) and pos + n < len(truth) and draft[n] == truth[pos + n]:
                        n += 1
                    step = truth[pos : pos + n + 1]  # the accepted tokens and the model's own
                    history += step
                    pos += len(step)
                follower.end(history)
                t.seconds += clock.now - start
                t.plain += pos * curve[0] * slow
                t.tokens += pos
        return out
    finally:
        namespace["time"] = real_time


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m perf.length_replay",
        description="The adaptive draft length (DraftLength) on a fake clock, over perf speedup's teacher-forced "
        "windows: speedup over plain greedy and tokens per step, per drafter and text.",
    )
    p.add_argument("--curve", required=True, help="verify cost, ms for 1..k+1 tokens, comma-separated")
    p.add_argument("--k", type=positive_int, default=None, help="the longest draft (default: the curve's length - 1)")
    p.add_argument("--drafters", default=",".join(DRAFTERS), help="comma-separated from llama, hybrid")
    p.add_argument("--texts", default="wikitext,code,edits", help="comma-separated from wikitext, code, edits")
    p.add_argument("--prompts", type=positive_int, default=3, help="windows per text (default: 3, perf speedup's)")
    p.add_argument("--context", type=positive_int, default=512, help="prompt tokens of a window (default: 512)")
    p.add_argument("--new-tokens", type=positive_int, default=64, help="tokens generated per window (default: 64)")
    p.add_argument("--rounds", type=positive_int, default=2, help="rounds over the windows (default: 2)")
    p.add_argument(
        "--grounded-work", type=Path,
        help="perf grounded-data's folder: the edits from all its pairs, the code from its releases' .py files "
        "(default: the shipped edit sample, and this repository's code, which moves with every commit)",
    )  # fmt: skip
    p.add_argument("--baseline", metavar="REV", help="also replay DraftLength as git revision REV has it")
    p.add_argument(
        "--fixed", action="store_true",
        help="also replay each drafter always drafting up to k (NAME/fixed): what the length choice costs "
        "or saves on this curve",
    )  # fmt: skip
    p.add_argument(
        "--orders", type=positive_int, default=1,
        help="replay N orders of the windows: perf speedup's, then N - 1 seeded shuffles (texts mixed); "
        "report means over them (default: 1)",
    )  # fmt: skip
    p.add_argument(
        "--burst", default="0,1", metavar="N,FACTOR",
        help="the first N windows of each order run FACTOR (a whole number) times slower, as under another "
        "job's load (default: none)",
    )  # fmt: skip
    args = p.parse_args(argv)
    try:
        n_burst, factor = (int(x) for x in args.burst.split(","))
    except ValueError:
        p.error(f"--burst: expected N,FACTOR as two whole numbers, got {args.burst!r}")
    if n_burst < 0 or factor < 1:
        p.error("--burst: N must be >= 0 and FACTOR >= 1")
    try:
        curve = [float(x) for x in args.curve.split(",")]
    except ValueError:
        p.error(f"--curve: expected milliseconds separated by commas, got {args.curve!r}")
    # not `min(curve) <= 0` alone: nan compares false with everything, and inf breaks the clock
    if len(curve) < 2 or not all(math.isfinite(c) and c > 0 for c in curve):
        p.error(f"--curve: give at least 2 positive costs (1 and 2 tokens), each finite, got {args.curve!r}")
    k = args.k if args.k is not None else len(curve) - 1
    if not 1 <= k <= len(curve) - 1:
        p.error(f"--k {k}: the curve gives costs for k up to {len(curve) - 1}")
    drafters = args.drafters.split(",")
    if bad := [d for d in drafters if d not in DRAFTERS]:
        p.error(f"--drafters: unknown {', '.join(bad)} (choose from {', '.join(DRAFTERS)})")

    from lookupdec.adapters import DraftLength
    from perf.grounded_data import GroundedDataError
    from perf.speedup import teacher_forced_workloads

    variants: dict[str, tuple[str, Controller]] = {}
    old = draft_length_at(args.baseline) if args.baseline else None
    for d in drafters:
        variants[d] = (d, DraftLength)
        if old is not None:
            variants[f"{d}@{args.baseline}"] = (d, old)
        if args.fixed:
            variants[f"{d}/fixed"] = (d, fixed_length)
    try:
        workloads = teacher_forced_workloads(
            args.prompts, args.context, args.new_tokens, args.texts.split(","), args.grounded_work
        )
    except ValueError as e:
        p.error(str(e))
    except OSError as e:  # the token files of ../shared/data, or --grounded-work's
        hint = "" if args.grounded_work else " (the shared data folder: set LOOKUPDEC_DATA)"
        p.error(f"{e.filename or e}: {e.strerror or e}{hint}")
    except GroundedDataError as e:
        p.error(f"--grounded-work {args.grounded_work}: {e}" if args.grounded_work else str(e))
    # a text shorter than a window gives empty windows: nothing generated, no speedup to divide
    if short := [w.name for w in workloads if not w.truth or any(len(t) < args.new_tokens for t in w.truth)]:
        p.error(f"--context {args.context} + --new-tokens {args.new_tokens}: longer than the {', '.join(short)} text")
    runs = [replay(curve, k, workloads, variants, args.rounds, seed, (n_burst, factor)) for seed in range(args.orders)]
    texts = [w.name for w in workloads]
    slower = f", the first {n_burst} windows {factor}x slower" if n_burst else ""
    print(f"verify curve, ms for 1..{k + 1} tokens: {' '.join(f'{c:g}' for c in curve[: k + 1])}; k = {k}; "
          f"{args.prompts} windows of {args.new_tokens} tokens per text, {args.rounds} rounds, "
          f"{args.orders} order(s){slower}")  # fmt: skip
    print(f"{'drafter':<20} {'geomean':>8}  " + "  ".join(f"{t + ' (x / tok/step)':>26}" for t in texts))
    for name in variants:
        # per text: the geometric mean of the orders' speedups, and the mean tokens per step
        speedups = [geomean([r[(name, t)].plain / r[(name, t)].seconds for r in runs]) for t in texts]
        per_step = [sum(r[(name, t)].tokens / r[(name, t)].steps for r in runs) / len(runs) for t in texts]
        cells = [f"{x:.3f}x / {n:.2f}" for x, n in zip(speedups, per_step, strict=True)]
        print(f"{name:<20} {geomean(speedups):>7.3f}x  " + "  ".join(f"{c:>26}" for c in cells))
    return 0


def geomean(xs: Sequence[float]) -> float:
    """The geometric mean of positive numbers."""
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


if __name__ == "__main__":
    sys.exit(main())
