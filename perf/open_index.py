"""Opening a static index, and the first drafts after it, at every index size, side by side with other trees.

    python -m perf open --sizes 4M,25,100,541,764 --work DIR [--tree ../base] [--rounds 5]
    python -m perf open --index A.lkdc --index B.lkdc [--tree ../base]

The promise of the index format is constant-time open at any size. Each round starts, for every
tree (this checkout and every ``--tree DIR``, run with ``PYTHONPATH=DIR``) and every index, a
fresh process (the order rotated per round) that:

1. imports ``lookupdec.fast`` and opens the index once (``first_open_us``: a process's first
   open, what ``lookupdec stats`` and a server's first request pay);
2. drafts once right away (``first_draft_us``: ``draft`` of 8 tokens after the first 512 tokens
   of the replay text, its context cache built before the open) and then replays the first
   4096-token chunk (``chunk_us_per_drafted``: µs per drafted token while the prefetch may still
   be running; ``to_chunk_end_ms``: from the open to the end of that chunk, what a user waits for
   in all);
3. closes it and opens and closes it ``--opens`` more times (``open_us``: the median, a steady
   open with the imports done; ``close_us`` likewise).

The file is in the page cache (every round reads it). The summary prints medians over rounds per
(tree, index) and the median per-round ratio of this tree to the first ``--tree``. Indexes of
``--sizes`` are ``perf.create_scale``'s corpora (the shared sample repeated with shifted ids)
made once with ``lookupdec create`` into ``--work`` (kept, like ``perf.mapped_static``'s).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from perf._cli import corpus_sizes, positive_int
from perf._common import data_dir
from perf.mapped_static import build_indexes

ROOT = Path(__file__).resolve().parents[1]

# The measuring child: run with the tree under test first on sys.path.
CHILD = r"""
import json, statistics, sys, time
from array import array
from lookupdec import fast

index, replay, opens = sys.argv[1], sys.argv[2], int(sys.argv[3])
# array, not numpy: the child measures lookupdec's fast path, which imports no numpy
tokens = array("i", open(replay, "rb").read(4097 * 4)).tolist()
ctx = fast.NgramCache()
ctx.update(tokens[:512], 512)
t0 = time.perf_counter()
ix = fast.StaticIndex.open(index)
t1 = time.perf_counter()
out = [tokens[511]]
fast.draft(tokens[:512], out, 8, 1, 4, ctx, fast.NgramCache(), ix)
t2 = time.perf_counter()
r = fast.replay(tokens, 4096, 8, ix)
t3 = time.perf_counter()
ix.close()
o, c = [], []
for _ in range(opens):
    a = time.perf_counter()
    ix = fast.StaticIndex.open(index)
    b = time.perf_counter()
    ix.close()
    o.append(b - a)
    c.append(time.perf_counter() - b)
print(json.dumps({
    "first_open_us": 1e6 * (t1 - t0),
    "first_draft_us": 1e6 * (t2 - t1),
    "n_first_draft": len(out) - 1,
    "chunk_us_per_drafted": 1e6 * r.t_draft_s / max(r.n_drafted, 1),
    "to_chunk_end_ms": 1e3 * (t3 - t0),
    "open_us": 1e6 * statistics.median(o),
    "close_us": 1e6 * statistics.median(c),
    "compiled": fast.COMPILED,
}))
"""

METRICS = ("first_open_us", "open_us", "close_us", "first_draft_us", "chunk_us_per_drafted", "to_chunk_end_ms")


def run_child(tree: str, index: str, replay: Path, opens: int) -> dict[str, float]:
    """One fresh process of :data:`CHILD` with ``tree`` first on the path; its JSON line."""
    env = dict(os.environ, PYTHONPATH=tree)
    out = subprocess.run(
        [sys.executable, "-c", CHILD, index, str(replay), str(opens)],
        env=env,
        cwd=tree,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    result: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    if not result["compiled"]:
        raise SystemExit(f"lookupdec.fast is not compiled in {tree}: build it there (pip install -e .)")
    return result


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments, run the rounds, print the table (and write ``--json``)."""
    ap = argparse.ArgumentParser(prog="python -m perf open", description=__doc__.split("\n\n")[0])
    ap.add_argument("--index", action="append", default=[], help="an index file (repeatable)")
    ap.add_argument("--sizes", type=corpus_sizes, help="corpus sizes to build indexes for, e.g. 4M,25,100,541,764")
    ap.add_argument("--work", type=Path, default=ROOT / "results" / "corpora", help="where --sizes' files are kept")
    ap.add_argument("--tree", action="append", default=[], help="another checkout to compare (built in place)")
    ap.add_argument("--rounds", type=positive_int, default=5)
    ap.add_argument("--opens", type=positive_int, default=50, help="steady opens per process (default 50)")
    ap.add_argument("--data", type=Path, help="the shared data folder (default: ../shared/data)")
    ap.add_argument("--json", type=Path, help="write every round's results here")
    args = ap.parse_args(argv)
    replay = (args.data or data_dir()) / "wiki.test.raw.llama3.bin"
    # the arguments are checked before any index is built: that can take minutes
    if missing := [ix for ix in args.index if not Path(ix).is_file()]:
        ap.error(f"--index {missing[0]}: no such file")
    if bad_trees := [t for t in args.tree if not Path(t).is_dir()]:
        ap.error(f"--tree {bad_trees[0]}: no such folder")
    if not args.index and not args.sizes:
        ap.error("nothing to open: give --index FILE or --sizes")
    if not replay.is_file():
        ap.error(f"{replay}: the replay text is missing (give --data)")
    indexes = list(args.index)
    if args.sizes:
        try:
            args.work.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            ap.error(f"--work {args.work}: {e.strerror or e}")
        indexes += build_indexes(args.sizes, args.work, str(ROOT))
    trees = [str(ROOT)] + [str(Path(t).resolve()) for t in args.tree]
    jobs = [(t, ix) for ix in indexes for t in trees]
    rows: list[dict[str, object]] = []
    for r in range(args.rounds):
        k = r % len(jobs)
        for tree, index in jobs[k:] + jobs[:k]:
            try:
                res = run_child(tree, index, replay, args.opens)
            except subprocess.CalledProcessError as e:
                # a file that is no index (or of another format version): the child's own last line says why
                why = (e.stderr or "").strip().splitlines()[-1:] or [f"exit code {e.returncode}"]
                ap.error(f"{index}: cannot be opened (tree {tree}): {why[0]}")
            rows.append({"round": r, "tree": tree, "index": index, **res})
            print(
                f"round {r} {Path(index).name:<22} {Path(tree).name:<12} open {res['open_us']:7.1f} us  "
                f"first open {res['first_open_us']:7.1f} us  first draft {res['first_draft_us']:7.1f} us",
                file=sys.stderr,
            )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    print(f"\n{'index':<22} {'MB':>7} {'tree':<12} " + " ".join(f"{m:>21}" for m in METRICS))
    for index in indexes:
        mb = os.path.getsize(index) / 1e6
        for tree in trees:
            sel = [x for x in rows if x["tree"] == tree and x["index"] == index]
            med = [statistics.median(float(str(x[m])) for x in sel) for m in METRICS]
            print(f"{Path(index).name:<22} {mb:7.1f} {Path(tree).name:<12} " + " ".join(f"{v:21.2f}" for v in med))
        if len(trees) > 1:
            ratios = []
            for m in METRICS:
                per_round = []
                for r in range(args.rounds):
                    a = [x for x in rows if x["round"] == r and x["index"] == index]
                    here = next(float(str(x[m])) for x in a if x["tree"] == trees[0])
                    base = next(float(str(x[m])) for x in a if x["tree"] == trees[1])
                    per_round.append(here / base)
                ratios.append(statistics.median(per_round))
            print(f"{'':<22} {'':>7} {'ratio':<12} " + " ".join(f"{v:21.2f}" for v in ratios))
    return 0


if __name__ == "__main__":
    sys.exit(main())
