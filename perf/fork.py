"""``python -m perf fork``: lookupdec side by side with the C++ anchor (the fork's ngram-cache).

For each corpus size, in interleaved rounds of fresh processes (the order of the sizes, of the
operations and of the two sides rotated every round, so that the machine's load hits both
alike), four operations:

- ``create``: ``ngram-anchor create CORPUS -o X.v2`` (the fork's llama-lookup-create, static
  file v2) against ``lookupdec create CORPUS -o X.lkdc`` (lookupdec's index): wall time and
  peak RSS of the process tree;
- ``open``: the anchor's static load (the whole v2 file read into memory, the constmap viewed
  in place and its checksum checked: ``ngram-anchor open --repeat N``) against lookupdec's
  mapped open of its index, in-process (``load_static(fast, index)``, what ``perf.bench_static``
  times as ``static.open.lookupdec-mmap``): the median of ``--open-repeat`` opens in ms, each
  side after one untimed open in the same process;
- ``draft``: the llama-lookup-stats replay with that static cache, ``ngram-anchor stats -lcs
  X.v2`` against ``lookupdec stats -lcs X.lkdc`` (mapped): µs per drafted token (their own
  ``t_draft`` / ``n_drafted``) and peak RSS; the drafted and accepted counts must be equal;
- ``merge``: two dynamic caches (1..4-grams of two ``--merge-tokens`` slices of the corpus,
  written once by ``ngram-anchor update``, whose files hold the same contents as lookupdec's),
  ``ngram-anchor merge`` against ``lookupdec merge``: wall time and peak RSS. The caches do not
  depend on the corpus size, so merge runs once per round (row ``merge``).

Every command runs under ``ngram-anchor measure``, a small process that forks it, samples the
resident memory of its process tree every 20 ms and takes ``ru_maxrss`` from ``wait4``: both
sides are measured the same way, and neither starts from this Python process's peak (Linux
carries a parent's ``ru_maxrss`` into a child).

Corpora are ``perf.create_scale``'s (the shared sample repeated with shifted ids; sizes ``NM`` =
N million tokens, ``N`` = N MB of text), made once in ``--work``. The replay is the shared
``wiki.test.raw.llama3.bin``. The table shows medians of each side and the median over rounds
of the per-round ratio lookupdec / fork, next to the goals (``GOALS``). ``--warmup`` rounds
(default 1) run first and are not counted: they bring the files into the page cache, which the
machine's other jobs may have emptied (a mapped replay then reads its index from the disk).

    python -m perf fork --quick                                   # 1M tokens, 2 rounds, < 1 min
    python -m perf fork --sizes 4M,25,100,541 --rounds 5 --work /tmp/fork-work --json results/fork.json
    python -m perf fork --sizes 25 --only draft,open --rounds 7
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import numpy as np

from perf import anchors
from perf._cli import corpus_sizes, nonnegative_int, positive_int
from perf._common import REPLAY_FILE, data_dir
from perf.create_scale import make_corpus

OPERATIONS: Final = ("create", "open", "draft", "merge")
GOALS: Final = {
    ("open", "ms"): ("abs", 0.2),
    ("draft", "us"): ("ratio", 0.8),
    ("draft", "rss"): ("ratio", 1.2),
    ("create", "s"): ("ratio", 1.0),
    ("create", "rss"): ("ratio", 1.0),
    ("merge", "s"): ("ratio", 1.0),
    ("merge", "rss"): ("ratio", 1.0),
}
"""The goals: lookupdec / fork ratio at most this, or (open) lookupdec's ms at most this."""

SIDES: Final = (("fork", "lookupdec"), ("lookupdec", "fork"))

OPEN_LOOKUPDEC: Final = """
import json, sys, time
from lookupdec import fast
from lookupdec.cli._pipeline import load_static
path, repeat = sys.argv[1], int(sys.argv[2])
ms = []
for _ in range(repeat):
    t0 = time.perf_counter()
    obj = load_static(fast, path)
    ms.append(1e3 * (time.perf_counter() - t0))
    close = getattr(obj, "close", None)
    if callable(close):
        close()
print(json.dumps({"load_ms": ms, "load_ms_median": sorted(ms)[len(ms) // 2], "compiled": fast.COMPILED}))
"""


class Runner:
    """Runs commands under ``ngram-anchor measure`` and collects their results."""

    def __init__(self, anchor: Path, work: Path, here: str) -> None:
        self.anchor = anchor
        self.work = work
        self.env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")])))

    def measure(self, argv: Sequence[str]) -> tuple[dict[str, Any], str]:
        """The ``measure`` record (wall_s, peak_rss_bytes, ...) and the command's stdout."""
        result = self.work / "measure.json"
        done = subprocess.run(
            [str(self.anchor), "measure", "-o", str(result), "--", *argv],
            env=self.env, cwd=tempfile.gettempdir(), capture_output=True, text=True,
        )  # fmt: skip
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} failed (exit {done.returncode}):\n{done.stderr.strip()}")
        record: dict[str, Any] = json.loads(result.read_text())
        return record, done.stdout

    def lookupdec(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "lookupdec", *args]


def prepare(sizes: list[str], work: Path, replay_tokens: int, merge_tokens: int, anchor: Path) -> dict[str, Path]:
    """Corpora, the replay prefix and the two dynamic caches, made once in ``work``."""
    files: dict[str, Path] = {}
    for size in sizes:
        files[f"corpus-{size}"] = make_corpus(size, None, work)
    replay = np.fromfile(data_dir() / REPLAY_FILE, dtype="<i4")
    if replay_tokens:
        replay = replay[:replay_tokens]
    files["replay"] = work / f"replay-{len(replay)}.bin"
    if not files["replay"].exists():
        replay.tofile(files["replay"])
    biggest = max(sizes, key=lambda s: files[f"corpus-{s}"].stat().st_size)
    tokens = np.fromfile(files[f"corpus-{biggest}"], dtype="<i4", count=2 * merge_tokens)
    if len(tokens) < 2 * merge_tokens:
        raise SystemExit(f"--merge-tokens {merge_tokens:,}: the largest corpus has only {len(tokens):,} tokens")
    for i in range(2):
        dyn = work / f"dynamic-{merge_tokens}-{i}.bin"
        if not dyn.exists():
            part = work / f"slice-{merge_tokens}-{i}.bin"
            tokens[i * merge_tokens : (i + 1) * merge_tokens].tofile(part)
            subprocess.run([str(anchor), "update", str(part), "-o", str(dyn)], check=True)
            part.unlink()
        files[f"dynamic{i}"] = dyn
    return files


def run_op(r: Runner, op: str, size: str, side: str, files: dict[str, Path], open_repeat: int) -> dict[str, Any]:
    """One measurement of one side; a row for the results."""
    work = r.work
    v2, index = work / f"static-{size}.v2", work / f"static-{size}.lkdc"
    row: dict[str, Any] = {"op": op, "size": size, "side": side}
    if op == "create":
        corpus = str(files[f"corpus-{size}"])
        if side == "fork":
            m, _ = r.measure([str(r.anchor), "create", corpus, "-o", str(v2), "-q"])
        else:
            m, _ = r.measure(r.lookupdec("create", "--tokens", corpus, "-o", str(index), "-q"))
        row.update(s=m["wall_s"], rss=m["peak_rss_bytes"], file_bytes=(v2 if side == "fork" else index).stat().st_size)
    elif op == "open":
        # One more open than timed: the first (lazy imports, first touch of the file) is dropped.
        n = str(open_repeat + 1)
        if side == "fork":
            _, out = r.measure([str(r.anchor), "open", str(v2), "--repeat", n, "--json"])
        else:
            _, out = r.measure([sys.executable, "-c", OPEN_LOOKUPDEC, str(index), n])
        timed = json.loads(out)["load_ms"][1:]
        row.update(ms=statistics.median(timed), all_ms=timed)
    elif op == "draft":
        replay = str(files["replay"])
        if side == "fork":
            m, out = r.measure([str(r.anchor), "stats", replay, "-lcs", str(v2), "--json"])
        else:
            m, out = r.measure(r.lookupdec("stats", "--tokens", replay, "-lcs", str(index), "--json", "-q"))
        d = json.loads(out)
        row.update(
            us=d["us_per_drafted_token"], rss=m["peak_rss_bytes"], n_drafted=d["n_drafted"], n_accept=d["n_accept"],
            load_ms=d["t_load_ms"], s=m["wall_s"],
        )  # fmt: skip
    elif op == "merge":
        out_file = str(work / f"merged-{side}.bin")
        inputs = [str(files["dynamic0"]), str(files["dynamic1"])]
        if side == "fork":
            m, _ = r.measure([str(r.anchor), "merge", *inputs, "-o", out_file, "-q"])
        else:
            m, _ = r.measure(r.lookupdec("merge", *inputs, "-o", out_file, "-q"))
        row.update(s=m["wall_s"], rss=m["peak_rss_bytes"])
    return row


def ensure_static(r: Runner, size: str, files: dict[str, Path]) -> None:
    """Both static files of ``size`` exist (made by an unmeasured create when ``create`` is not run)."""
    corpus = str(files[f"corpus-{size}"])
    v2, index = r.work / f"static-{size}.v2", r.work / f"static-{size}.lkdc"
    if not v2.exists():
        subprocess.run([str(r.anchor), "create", corpus, "-o", str(v2), "-q"], check=True)
    if not index.exists():
        subprocess.run(r.lookupdec("create", "--tokens", corpus, "-o", str(index), "-q"), env=r.env, check=True)


def rounds_plan(sizes: list[str], ops: list[str], rounds: int) -> list[list[tuple[str, str, tuple[str, str]]]]:
    """Per round, the (op, size, side order) list: the sizes and the operations rotated, and for
    every (op, size) the side that goes first alternating from one round to the next."""
    per_size = [op for op in ops if op != "merge"]
    pairs = [(op, size) for size in sizes for op in per_size]
    first = {pair: i % 2 for i, pair in enumerate([*pairs, ("merge", "-")])}
    plan = []
    for k in range(rounds):
        steps: list[tuple[str, str, tuple[str, str]]] = []
        for i, size in enumerate(sizes[k % len(sizes) :] + sizes[: k % len(sizes)]):
            shift = (k + i) % len(per_size) if per_size else 0
            for op in per_size[shift:] + per_size[:shift]:
                steps.append((op, size, SIDES[(first[op, size] + k) % 2]))
        if "merge" in ops:
            steps.insert(k % (len(steps) + 1), ("merge", "-", SIDES[(first["merge", "-"] + k) % 2]))
        plan.append(steps)
    return plan


def summarize(rows: list[dict[str, Any]], sizes: list[str], ops: list[str]) -> list[dict[str, Any]]:
    """Per (op, size, metric): medians of each side, the median per-round ratio, the goal."""
    out = []
    metrics = {"create": ("s", "rss"), "open": ("ms",), "draft": ("us", "rss"), "merge": ("s", "rss")}
    for op in ops:
        for size in ["-"] if op == "merge" else sizes:
            sel = [x for x in rows if x["op"] == op and x["size"] == size]
            by_round: dict[int, dict[str, dict[str, Any]]] = {}
            for x in sel:
                by_round.setdefault(x["round"], {})[x["side"]] = x
            pairs = [v for v in by_round.values() if "fork" in v and "lookupdec" in v]
            if not pairs:
                continue
            for metric in metrics[op]:
                fork = statistics.median(p["fork"][metric] for p in pairs)
                ours = statistics.median(p["lookupdec"][metric] for p in pairs)
                ratio = statistics.median(
                    p["lookupdec"][metric] / p["fork"][metric] for p in pairs if p["fork"][metric]
                )
                goal = GOALS.get((op, metric))
                met = None
                if goal is not None:
                    met = (ours <= goal[1]) if goal[0] == "abs" else (ratio <= goal[1])
                rec: dict[str, Any] = {"op": op, "size": size, "metric": metric, "fork": fork, "lookupdec": ours,
                                       "ratio": ratio, "rounds": len(pairs), "goal": goal, "met": met}  # fmt: skip
                if op == "draft":
                    rec["counts_equal"] = all(
                        (p["fork"]["n_drafted"], p["fork"]["n_accept"])
                        == (p["lookupdec"]["n_drafted"], p["lookupdec"]["n_accept"])
                        for p in pairs
                    )
                    rec["n_drafted"] = pairs[0]["fork"]["n_drafted"]
                out.append(rec)
    return out


LABELS: Final = {"s": "wall s", "rss": "peak RSS MB", "ms": "open ms", "us": "µs/drafted"}


def fmt_value(metric: str, v: float) -> str:
    if metric == "rss":
        return f"{v / 2**20:.0f}"
    if metric in ("ms", "us"):
        return f"{v:.3f}"
    return f"{v:.2f}"


def table(summary: list[dict[str, Any]]) -> str:
    """The summary as aligned text."""
    lines = [f"{'op':<7}{'size':>6}  {'metric':<13}{'fork':>10}{'lookupdec':>11}{'ratio':>8}  goal (lookupdec/fork)"]
    for s in summary:
        goal = s["goal"]
        g = "" if goal is None else (f"lookupdec <= {goal[1]} ms" if goal[0] == "abs" else f"ratio <= {goal[1]}")
        if goal is not None:
            g += "  met" if s["met"] else "  NOT met"
        if s["op"] == "draft" and s["metric"] == "us":
            g += "" if s["counts_equal"] else "  COUNTS DIFFER"
        metric = LABELS[s["metric"]]
        lines.append(
            f"{s['op']:<7}{s['size']:>6}  {metric:<13}{fmt_value(s['metric'], s['fork']):>10}"
            f"{fmt_value(s['metric'], s['lookupdec']):>11}{s['ratio']:>8.3f}  {g}"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: see the module docstring."""
    ap = argparse.ArgumentParser(prog="python -m perf fork", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument(
        "--sizes",
        type=corpus_sizes,
        default="4M,25,100,541",
        help="corpus sizes: NM = N million tokens, N = N MB of text",
    )
    ap.add_argument("--rounds", type=positive_int, default=3, help="interleaved rounds (default 3)")
    ap.add_argument("--warmup", type=nonnegative_int, default=1, help="uncounted first rounds (default 1)")
    ap.add_argument("--only", default=",".join(OPERATIONS), help=f"operations to run (default {','.join(OPERATIONS)})")
    ap.add_argument("--work", type=Path, help="folder keeping corpora and caches between runs (default: temporary)")
    ap.add_argument(
        "--replay-tokens", type=nonnegative_int, default=0, help="replay only this prefix (default: all 289,076)"
    )
    ap.add_argument(
        "--merge-tokens", type=positive_int, default=1_000_000, help="tokens per dynamic cache (default 1M)"
    )
    ap.add_argument(
        "--open-repeat", type=positive_int, default=5, help="opens per open measurement (median; default 5)"
    )
    ap.add_argument("--quick", action="store_true", help="small: 1M tokens, 2 rounds, 40k replay, 100k-token merges")
    ap.add_argument("--json", type=Path, help="write rows and summary as JSON here")
    args = ap.parse_args(argv)
    if args.quick:
        args.sizes, args.rounds = ["1M"], 2
        args.replay_tokens, args.merge_tokens = args.replay_tokens or 40_000, min(args.merge_tokens, 100_000)
    sizes = args.sizes  # a list: argparse's corpus_sizes also splits the default
    ops = [op for op in args.only.split(",") if op]
    bad = [op for op in ops if op not in OPERATIONS]
    if bad:
        ap.error(f"--only: unknown operation(s) {','.join(bad)} (choose from {','.join(OPERATIONS)})")
    try:
        anchor = anchors.build(quiet=True)
    except anchors.AnchorBuildError as e:
        print(f"perf fork: {e}", file=sys.stderr)
        return 1
    here = str(Path(__file__).resolve().parent.parent)
    with tempfile.TemporaryDirectory(prefix="perf-fork-") as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        files = prepare(sizes, work, args.replay_tokens, args.merge_tokens if "merge" in ops else 0, anchor)
        r = Runner(anchor, work, here)
        if {"open", "draft"} & set(ops):  # a round may reach them before its create
            for size in sizes:
                ensure_static(r, size, files)
        rows: list[dict[str, Any]] = []
        # Warm-up rounds first, not counted: a file not in the page cache (the machine's other jobs
        # evict it) made a first mapped replay 5-33x slower, read from the disk as it drafted.
        for k, steps in enumerate(rounds_plan(sizes, ops, args.warmup + args.rounds), start=-args.warmup):
            for op, size, sides in steps:
                for side in sides:
                    row = run_op(r, op, size, side, files, args.open_repeat)
                    row["round"] = k
                    if k >= 0:
                        rows.append(row)
                    print(f"{'round ' + str(k) if k >= 0 else 'warm-up':<8} {op:<6} {size:>5} {side:<9} "
                          + " ".join(f"{m}={row[m]:.4g}" for m in ("s", "ms", "us", "rss") if m in row),
                          file=sys.stderr, flush=True)  # fmt: skip
        summary = summarize(rows, sizes, ops)
    print(table(summary))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        meta = {"sizes": sizes, "rounds": args.rounds, "warmup": args.warmup, "replay_tokens": args.replay_tokens,
                "merge_tokens": args.merge_tokens, "open_repeat": args.open_repeat, "anchor": str(anchor)}  # fmt: skip
        args.json.write_text(json.dumps({"meta": meta, "rows": rows, "summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
