"""Drafting policies side by side: tokens per verification step, waste and cost per step.

Replays with llama-lookup-stats' loop (n_ctx 4096, n_draft 8) under each policy, on two sets:

- ``wikitext``: the WikiText-103 test split with the static index of ``enwiki_wt.10M`` (the
  set the hybrid policy's parameters were chosen on);
- ``heldout``: the second half of ``enwiki_wt.10M`` replayed with a static index built from
  the first half only (no overlap), to check that parameters chosen on WikiText carry over;

and, on request, ``code``: held-out Python (the new releases' files of ``perf grounded``'s code
pairs, 8 packages from pinned sdists, built in ``--work``) with the ``enwiki_wt.10M`` static
index and corpus, the case where the corpus is of another kind than the text.

Counts are deterministic; times are noisy (shared machine), so every replay is repeated
``--repeats`` times with the policies interleaved, and the median µs per step is reported
(``t_draft / n_steps``: drafting, the context-cache updates and the hybrid history, as
llama.cpp times ``t_draft``).

    python -m perf policy                 # both sets, markdown table on stdout
    python -m perf policy --sets wikitext --repeats 5 --json results/policy.json
    python -m perf policy --corpus-history   # adds "hybrid+corpus": the static corpus preloaded in the history
    python -m perf policy --sets wikitext --corpus-history --trees ../old,. --rounds 4   # two checkouts side by side
    python -m perf policy --sets wikitext --branches 2,3   # adds "hybrid/b2", "hybrid/b3": tree drafts
    python -m perf policy --sets code --corpus-history --work /work/grounded   # held-out Python

``--corpus-history`` gives the hybrid policy the static index's corpus: a ``SuffixHistory``
holding it (``add_corpus(ids)``: the corpus file's structure built in memory, the same drafts as
the file ``create --corpus-out`` writes) before the replay, ``replay(..., policy="hybrid",
history=...)``; its build time is not timed.

``--branches N,...`` adds the hybrid policy's tree drafts of up to N branches (``replay(...,
branches=N)``: a step accepts the longest prefix any branch shares with the text, *drafted*
counts the trees' distinct nodes), interleaved with the other variants; with
``--corpus-history`` also ``hybrid+corpus/bN``.

``--trees A,B,...`` compares checkouts (each built in place: ``setup.py build_ext --inplace``)
side by side: every round runs this script once per tree in a fresh process (this checkout's
``perf/`` with the tree's ``lookupdec``), the order alternating from round to round (ABBA), and
the table gives per tree the median over rounds of each process's median. The counts must be
the same in every tree (the command fails otherwise): a speed change that changes drafts is
reported, not hidden. ``--drafts-may-differ`` is for a change that means to change the drafts
(the cost of a new rule): each tree's own tokens per step are printed, and the command fails only
where one tree's counts change from round to round.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from perf import grounded_data
from perf._cli import positive_int
from perf._common import N_CTX, N_DRAFT, REPLAY_FILE, STATIC_FILE, data_dir

SETS = ("wikitext", "heldout")
"""The default ``--sets`` (of this script and ``perf.peers``)."""
CODE_SET = "code"
"""Also on request: held-out Python (:func:`perf.grounded_data.code_tokens`, built in ``--work``)
with the ``enwiki_wt.10M`` static index and corpus, as ``wikitext`` has them."""
ALL_SETS = (*SETS, CODE_SET)
DEFAULT_WORK = Path("results/grounded")
"""Where the ``code`` set's sdists and tokenized pairs are kept (``perf grounded``'s ``--work``)."""


def read_tokens(path: Path) -> list[int]:
    """A raw little-endian int32 token file as a list."""
    if not path.is_file():
        raise FileNotFoundError(f"{path}: token file not found (set LOOKUPDEC_DATA)")
    return list(np.fromfile(path, dtype="<i4").tolist())


def load_set(name: str, d: Path, work: Path = DEFAULT_WORK) -> tuple[list[int], list[int]]:
    """``(replayed tokens, static corpus)`` of a set (see the module's docstring), from the data
    folder ``d``; ``work``: where the ``code`` set is built (may raise ``GroundedDataError``)."""
    corpus = read_tokens(d / STATIC_FILE)
    if name == "wikitext":
        return read_tokens(d / REPLAY_FILE), corpus
    if name == "heldout":
        half = len(corpus) // 2
        return corpus[half:], corpus[:half]
    if name == CODE_SET:
        return grounded_data.code_tokens(work), corpus
    raise ValueError(f"unknown set {name!r} (known: {', '.join(ALL_SETS)})")


def static_index(fast: Any, corpus: list[int], path: Path) -> Any:
    """The corpus's static index file (lookupdec format), memory-mapped as ``stats -lcs`` does."""
    if not path.exists():
        fast.StaticIndex.from_cache(fast.build_static(corpus)).save(path)
    return fast.load_static(str(path))


def corpus_history(fast: Any, corpus: list[int]) -> Any:
    """A fresh hybrid history holding ``corpus`` (built in memory, as a corpus file would hold it)."""
    history = fast.SuffixHistory()
    history.add_corpus(corpus)
    return history


def run_set(
    fast: Any,
    name: str,
    replay: list[int],
    static: Any,
    repeats: int,
    corpus: list[int] | None = None,
    branches: Sequence[int] = (),
) -> list[dict[str, Any]]:
    hybrids = ["hybrid", "hybrid+corpus"] if corpus is not None else ["hybrid"]
    variants = ["llama", *hybrids, *(f"{h}/b{b}" for h in hybrids for b in branches)]
    times: dict[str, list[float]] = {p: [] for p in variants}
    last: dict[str, Any] = {}
    for _ in range(repeats):
        for variant in variants:  # interleaved: every variant sees the same machine load
            policy, _, b = variant.partition("/b")
            tree = (int(b),) if b else ()  # the call without branches where there are none (old trees too)
            if policy == "hybrid+corpus":
                history = corpus_history(fast, corpus or [])
                r = fast.replay(replay, N_CTX, N_DRAFT, static, None, None, "hybrid", history, *tree)
            elif policy == "hybrid":
                r = fast.replay(replay, N_CTX, N_DRAFT, static, None, None, policy, None, *tree)
            else:
                r = fast.replay(replay, N_CTX, N_DRAFT, static, None, None, variant)
            times[variant].append(1e6 * r.t_draft_s / r.n_steps)
            last[variant] = r
    rows = []
    for policy in variants:
        r = last[policy]
        rows.append(
            {
                "set": name,
                "policy": policy,
                "n_tokens": len(replay),
                "n_steps": r.n_steps,
                "n_accept": r.n_accept,
                "n_drafted": r.n_drafted,
                "tokens_per_step": r.tokens_per_step,
                "wasted_per_step": r.wasted_per_step,
                "us_per_step_median": statistics.median(times[policy]),
                "us_per_step_all": times[policy],
            }
        )
    base = rows[0]["tokens_per_step"]
    for row in rows:
        row["vs_llama_pct"] = 100.0 * (row["tokens_per_step"] / base - 1.0)
    return rows


COUNTS = ("n_steps", "n_accept", "n_drafted")


def compare_trees(
    trees: Sequence[str], rounds: int, argv: Sequence[str], cache: Path, drafts_may_differ: bool = False
) -> int:
    """Run this script per tree, interleaved; print per tree and variant the median µs per step
    (and its tokens per step; ``drafts_may_differ``: see :func:`summarize`)."""
    harness = Path(tempfile.mkdtemp(prefix="lookupdec-policy-harness-"))
    shutil.copytree(Path(__file__).resolve().parent, harness / "perf", ignore=shutil.ignore_patterns("__pycache__"))
    results: dict[str, list[list[dict[str, Any]]]] = {t: [] for t in trees}
    data = data_dir()
    for r in range(rounds):
        for tree in trees if r % 2 == 0 else list(reversed(trees)):
            out = harness / "rows.json"
            # the data directory as this checkout sees it (the harness copy lives elsewhere)
            env = {
                **os.environ,
                "PYTHONPATH": f"{harness}{os.pathsep}{Path(tree).resolve()}",
                "LOOKUPDEC_DATA": str(data),
            }
            cmd = [sys.executable, "-m", "perf.bench_policy", *argv, "--cache-dir", str(cache), "--json", str(out)]
            print(f"round {r + 1}/{rounds}: {tree}", file=sys.stderr)
            done = subprocess.run(cmd, env=env, cwd=harness, stdout=subprocess.DEVNULL, check=False)
            if done.returncode != 0:
                print(f"perf policy: {tree} exited with {done.returncode}", file=sys.stderr)
                return 2
            results[tree].append(json.loads(out.read_text()))
    try:
        lines = summarize(trees, results, drafts_may_differ)
    except ValueError as e:
        print(f"perf policy: {e}", file=sys.stderr)
        return 1
    print("\n".join(lines))
    return 0


def summarize(
    trees: Sequence[str], results: dict[str, list[list[dict[str, Any]]]], drafts_may_differ: bool = False
) -> list[str]:
    """The markdown table of :func:`compare_trees` from each tree's rounds of rows; ValueError when
    a tree's counts differ from the first tree's (in any round), or with ``drafts_may_differ``
    only when they differ between rounds of one tree (replays are deterministic)."""
    first = results[trees[0]][0]
    lines = [
        "| tree | set | policy | tokens/step | µs/step (median of rounds) | per round |",
        "|---|---|---|---|---|---|",
    ]
    for tree in trees:
        for i, row in enumerate(first):
            mine = [run[i] for run in results[tree]]
            ref = mine[0] if drafts_may_differ else row
            against = f"{tree}'s first round" if drafts_may_differ else trees[0]
            if any(tuple(m[k] for k in COUNTS) != tuple(ref[k] for k in COUNTS) for m in mine):
                raise ValueError(f"{tree} {row['set']} {row['policy']}: counts differ from {against}")
            per = [m["us_per_step_median"] for m in mine]
            lines.append(
                f"| {tree} | {row['set']} | {row['policy']} | {mine[0]['tokens_per_step']:.4f} | "
                f"{statistics.median(per):.2f} | {', '.join(f'{v:.2f}' for v in per)} |"
            )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m perf policy", description=__doc__.split("\n\n")[0])
    p.add_argument("--sets", default=",".join(SETS), help="comma-separated: " + ", ".join(ALL_SETS))
    p.add_argument(
        "--work",
        metavar="DIR",
        type=Path,
        default=DEFAULT_WORK,
        help=f"where the code set's sdists and pairs are kept (default: {DEFAULT_WORK}; downloads 6 MB once)",
    )
    p.add_argument("--repeats", type=positive_int, default=3, help="replays per policy (interleaved); median time")
    p.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    p.add_argument("--cache-dir", metavar="DIR", help="where the static index files are kept (default: a temp dir)")
    p.add_argument(
        "--corpus-history", action="store_true", help="also replay with the static corpus preloaded in the history"
    )
    p.add_argument(
        "--branches", metavar="N,...", default="", help="also the hybrid policy's tree drafts of up to N branches"
    )
    p.add_argument("--trees", metavar="A,B", help="compare built checkouts side by side (see above)")
    p.add_argument(
        "--rounds", type=positive_int, default=4, help="with --trees: processes per tree, interleaved (default 4)"
    )
    p.add_argument(
        "--drafts-may-differ",
        action="store_true",
        help="with --trees: the trees' drafts may differ (a change to the policy); each tree's own counts are "
        "printed, and only a tree whose counts change from round to round fails",
    )
    args = p.parse_args(argv)
    sets = [x for x in args.sets.split(",") if x]
    for name in sets:
        if name not in ALL_SETS:
            p.error(f"unknown set {name!r} (known: {', '.join(ALL_SETS)})")
    # checked before --trees hands them on to each tree's process, and before any index is built
    try:
        branches = [int(b) for b in args.branches.split(",") if b]
    except ValueError:
        p.error(f"--branches: expected comma-separated whole numbers, got {args.branches!r}")
    if any(b < 2 for b in branches):
        p.error(f"--branches {args.branches}: tree drafts have at least 2 branches (1 is the hybrid policy's row)")
    if args.trees:
        trees = args.trees.split(",")
        cache = Path(args.cache_dir) if args.cache_dir else Path(tempfile.mkdtemp(prefix="lookupdec-policy-"))
        inner = ["--sets", args.sets, "--repeats", str(args.repeats), "--work", str(args.work.resolve())]
        if args.corpus_history:
            inner.append("--corpus-history")
        if args.branches:
            inner += ["--branches", args.branches]
        return compare_trees(trees, args.rounds, inner, cache, args.drafts_may_differ)

    from lookupdec import fast

    if not fast.COMPILED:
        print(
            "perf policy: the fast path is not compiled (pip install -e .); times would mean nothing", file=sys.stderr
        )
        return 2
    d = data_dir()
    if not (d / REPLAY_FILE).exists():
        print(f"perf policy: {d / REPLAY_FILE} not found (set LOOKUPDEC_DATA)", file=sys.stderr)
        return 2
    cache = Path(args.cache_dir) if args.cache_dir else Path(tempfile.mkdtemp(prefix="lookupdec-policy-"))
    cache.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    for name in sets:
        try:
            replay, corpus = load_set(name, d, args.work)
        except grounded_data.GroundedDataError as e:
            print(f"perf policy: the code set: {e}", file=sys.stderr)
            return 2
        # heldout's static corpus is the first half of enwiki_wt.10M, the others' all of it
        index = "enwiki_wt.10M.first-half.lkdc" if name == "heldout" else "enwiki_wt.10M.lkdc"
        static = static_index(fast, corpus, cache / index)
        extra = corpus if args.corpus_history else None
        rows += run_set(fast, name, replay, static, args.repeats, extra, branches)
    print("| set | policy | tokens/step | vs llama | accepted | drafted | wasted/step | µs/step (median) |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['set']} | {r['policy']} | {r['tokens_per_step']:.4f} | {r['vs_llama_pct']:+.1f} % | "
            f"{r['n_accept']:,} | {r['n_drafted']:,} | {r['wasted_per_step']:.3f} | {r['us_per_step_median']:.2f} |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
