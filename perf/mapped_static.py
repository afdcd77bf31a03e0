"""Drafting from the static index mapped vs loaded, measured side by side.

Two measurements, both interleaved so that the machine's load hits every mode alike:

- ``in-process``: one process opens the index every way the fast path can (mapped as bytes,
  mapped through mmap slices with ``LOOKUPDEC_MAPPED_BYTES=0``, loaded) and replays each
  4096-token chunk of the replay text with every mode back to back (the order rotated per
  chunk), ``--passes`` times; CPU µs per drafted token (``time.process_time``, less noisy
  than wall time) and ``t_draft`` µs per drafted token per mode. With ``--in-process-rounds R``
  it runs in a fresh process per (round, index, tree) instead, every ``--tree`` too (its own
  copy of this function), alternating: CPU µs per drafted token per mode and mapped / none.
- ``stats``: fresh processes of ``lookupdec stats --json``, for this tree
  and every ``--tree DIR`` (run with ``PYTHONPATH=DIR``), mapped, ``--load`` and without a
  static cache, ``--rounds`` rounds alternating; medians and minimums of
  ``us_per_drafted_token`` (wall time), of the process's CPU time per drafted token (start,
  reading the files and the replay: steadier than wall time on a busy machine), and peak RSS.

The index is built with ``lookupdec create`` from the static corpus (``enwiki_wt.10M``), or
given with ``--index FILE`` (repeatable), or one is built per corpus size with ``--sizes``
(``perf.create_scale``'s corpora: the shared sample repeated with shifted ids, so the replay's
lookups hit the same 2-grams at every size while the file, and the random reads across it,
grow), kept in ``--work DIR``. Per round every tree replays once without a static cache, then
mapped and ``--load`` with every index (their order rotated per round); the summary puts the
fork's figures (measured earlier on this machine) next to each size (its replay was held-out code, so compare
ratios to the no-static run, not the µs).

    python -m perf.mapped_static --tree ../main --rounds 7 --passes 4
    python -m perf.mapped_static --sizes 4M,25,100,541,764 --work /tmp/corpora --tree ../main --passes 0
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Final

import numpy as np

from perf._common import REPLAY_FILE, STATIC_FILE, data_dir

MODES = ("none", "slices", "mapped", "loaded")


def in_process(index: str, replay: Path, passes: int) -> dict[str, dict[str, float]]:
    """CPU and t_draft µs per drafted token per mode, every chunk replayed by every mode in turn."""
    from lookupdec import fast

    tokens = np.fromfile(replay, dtype="<i4").tolist()
    static: dict[str, object] = {}
    for mode in MODES:
        os.environ["LOOKUPDEC_MAPPED_BYTES"] = "0" if mode == "slices" else "1"
        static[mode] = None if mode == "none" else fast.StaticIndex.open(index, in_memory=mode == "loaded")
    os.environ.pop("LOOKUPDEC_MAPPED_BYTES")
    n_ctx = 4096
    totals = {m: [0.0, 0.0, 0] for m in MODES}
    for p in range(passes):
        for c in range(len(tokens) // n_ctx - 1):
            k = (c + p) % len(MODES)
            for mode in MODES[k:] + MODES[:k]:
                seg = tokens[c * n_ctx : (c + 1) * n_ctx + 1]
                c0 = time.process_time()
                r = fast.replay(seg, n_ctx, 8, static[mode])
                totals[mode][0] += time.process_time() - c0
                totals[mode][1] += r.t_draft_s
                totals[mode][2] += r.n_drafted
    return {
        m: {"cpu_us_per_drafted": 1e6 * cpu / n, "us_per_drafted": 1e6 * t, "n_drafted": n}
        for m, (cpu, t, n) in ((m, (v[0], v[1] / v[2], int(v[2]))) for m, v in totals.items())
    }


FORK_US: Final = {"none": 0.95, "4M": 1.54, "25": 1.25, "100": 1.64, "541": 1.94}
"""The fork's µs per drafted token, measured earlier here (held-out code replay, under load; none and per size)."""


def stats_runs(indexes: list[str], replay: Path, trees: list[str], rounds: int) -> list[dict[str, object]]:
    """Fresh ``lookupdec stats`` processes: per round, every tree without a static cache, then
    mapped and ``--load`` for every index, the order of the indexes rotated per round."""
    rows = []
    for r in range(rounds):
        k = r % len(indexes)
        for tree in trees:
            runs: list[tuple[str, str, list[str]]] = [("", "none", [])]
            for index in indexes[k:] + indexes[:k]:
                runs += [(index, "mapped", ["-lcs", index]), (index, "loaded", ["-lcs", index, "--load"])]
            for index, mode, extra in runs:
                argv = [sys.executable, "-m", "lookupdec", "stats", "--tokens", str(replay), "--json", "-q", *extra]
                env = dict(os.environ, PYTHONPATH=tree)
                # cwd outside every tree: ``-m`` puts the working directory first on sys.path.
                c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
                out = subprocess.run(argv, env=env, cwd=tempfile.gettempdir(), capture_output=True, text=True)
                c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
                out.check_returncode()
                d = json.loads(out.stdout)
                # The child's whole CPU time (start, reading the files, replay): unlike the wall
                # time of t_draft it does not count the time other processes had the cores.
                cpu = c1.ru_utime + c1.ru_stime - c0.ru_utime - c0.ru_stime
                rows.append(
                    {"tree": tree, "index": index, "mode": mode, "us": d["us_per_drafted_token"],
                     "cpu_us": 1e6 * cpu / d["n_drafted"], "rss_mb": d["peak_rss_mb"],
                     "n_drafted": d["n_drafted"], "n_accept": d["n_accept"]}
                )  # fmt: skip
    return rows


def in_process_runs(
    indexes: list[str], labels: dict[str, str], replay: Path, trees: list[str], rounds: int, passes: int
) -> list[dict[str, object]]:
    """:func:`in_process` of each tree (its own ``perf.mapped_static``, run with ``PYTHONPATH=tree``)
    in a fresh process per (round, index, tree), the trees alternating and the indexes rotated."""
    rows: list[dict[str, object]] = []
    for r in range(rounds):
        order = indexes[r % len(indexes) :] + indexes[: r % len(indexes)]
        for i, index in enumerate(order):
            for tree in trees if (r + i) % 2 == 0 else trees[::-1]:
                code = (
                    "import json, pathlib; from perf.mapped_static import in_process; "
                    f"print(json.dumps(in_process({index!r}, pathlib.Path({str(replay)!r}), {passes})))"
                )
                env = dict(os.environ, PYTHONPATH=tree)
                out = subprocess.run(
                    [sys.executable, "-c", code], env=env, cwd=tempfile.gettempdir(), capture_output=True, text=True
                )
                out.check_returncode()
                d = json.loads(out.stdout)
                row: dict[str, object] = {"tree": tree, "index": labels[index]}
                row.update({m: d[m]["cpu_us_per_drafted"] for m in d})
                rows.append(row)
    return rows


def in_process_summary(rows: list[dict[str, object]], trees: list[str], labels: list[str]) -> list[str]:
    """Per (index, tree): median CPU µs per drafted token of every mode, and of mapped / none."""
    lines = []
    for label in labels:
        for tree in trees:
            sel = [r for r in rows if r["tree"] == tree and r["index"] == label]
            modes = " ".join(f"{m} {statistics.median(float(str(r[m])) for r in sel):.3f}" for m in MODES)
            ratio = statistics.median(float(str(r["mapped"])) / float(str(r["none"])) for r in sel)
            lines.append(f"in-process {label:>6s} {tree} cpu µs/drafted {modes}, mapped/none {ratio:.3f}")
    return lines


def build_indexes(sizes: list[str], work: Path, here: str) -> list[str]:
    """An index per corpus size (``perf.create_scale`` sizes) in ``work``, made once and kept."""
    from perf.create_scale import make_corpus

    out = []
    for size in sizes:
        index = work / f"static-{size}.lkdc"
        if not index.exists():
            corpus = make_corpus(size, None, work)
            argv = [sys.executable, "-m", "lookupdec", "create", "--tokens", str(corpus), "-o", str(index), "-q"]
            done = subprocess.run(argv, env=dict(os.environ, PYTHONPATH=here), check=False)
            if done.returncode:  # lookupdec create printed why (a full disk, ...): no traceback here
                raise SystemExit(f"{index}: lookupdec create failed (exit code {done.returncode}); see its error above")
        out.append(str(index))
    return out


def summary(rows: list[dict[str, object]], trees: list[str], labels: dict[str, str]) -> list[str]:
    """One line per (tree, index, mode): median and minimum µs per drafted token, peak RSS."""
    lines = []
    for tree in trees:
        for index, label in [("", "none"), *labels.items()]:
            for mode in ("none",) if not index else ("mapped", "loaded"):
                sel = [r for r in rows if r["tree"] == tree and r["index"] == index and r["mode"] == mode]
                us = [float(str(r["us"])) for r in sel]
                cpu = [float(str(r["cpu_us"])) for r in sel]
                rss = statistics.median(float(str(r["rss_mb"])) for r in sel)
                fork = FORK_US.get(label)
                ref = f"  (fork {fork})" if fork else ""
                lines.append(
                    f"stats {tree} {label:>6s} {mode:6s} median {statistics.median(us):.3f} min {min(us):.3f}"
                    f" µs/drafted, process CPU median {statistics.median(cpu):.3f} min {min(cpu):.3f}"
                    f" µs/drafted, peak RSS {rss:.0f} MB, drafted {sel[0]['n_drafted']}{ref}"
                )
    return lines


def in_process_result(result: dict[str, object]) -> dict[str, dict[str, dict[str, float]]]:
    got = result["in_process"]
    assert isinstance(got, dict)
    return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", help="folder with the replay and static token files (default: shared data)")
    ap.add_argument("--tree", action="append", default=[], help="another source tree to run (repeatable)")
    ap.add_argument("--rounds", type=int, default=5, help="rounds of fresh stats processes (default 5)")
    ap.add_argument("--passes", type=int, default=3, help="passes over the chunks in-process (default 3; 0: none)")
    ap.add_argument(
        "--in-process-rounds", type=int, default=0,
        help="run the in-process part in fresh processes of every tree, this many rounds (default 0: here only)",
    )  # fmt: skip
    ap.add_argument("--index", action="append", default=[], help="use this index file (repeatable)")
    ap.add_argument("--sizes", help="build an index per corpus size (perf.create_scale's, e.g. 4M,25,100,541,764)")
    ap.add_argument("--work", help="folder keeping the --sizes corpora and indexes (default: a temporary one)")
    ap.add_argument("-o", "--output", help="write the results as JSON here")
    args = ap.parse_args()
    d = Path(args.data) if args.data else data_dir()
    replay, corpus = d / REPLAY_FILE, d / STATIC_FILE
    here = str(Path(__file__).resolve().parent.parent)
    trees = [here, *args.tree]
    with tempfile.TemporaryDirectory() as tmp:
        indexes: list[str] = list(args.index)
        labels = {ix: Path(ix).stem for ix in indexes}
        if args.sizes:
            sizes = args.sizes.split(",")
            built = build_indexes(sizes, Path(args.work or tmp), here)
            indexes += built
            labels.update(zip(built, sizes, strict=True))
        if not indexes:
            index = os.path.join(tmp, "static.lkdc")
            subprocess.run(
                [sys.executable, "-m", "lookupdec", "create", "--tokens", str(corpus), "-o", index, "-q"],
                env=dict(os.environ, PYTHONPATH=here), check=True,
            )  # fmt: skip
            indexes, labels = [index], {index: "10M"}
        # The stats processes first: a child's ru_maxrss starts from its parent's peak (Linux
        # keeps the larger across fork and exec), so the parent must not have replayed yet.
        rows = stats_runs(indexes, replay, trees, args.rounds)
        result: dict[str, object] = {"stats": rows, "labels": labels}
        if args.in_process_rounds > 0:
            ab = in_process_runs(indexes, labels, replay, trees, args.in_process_rounds, max(args.passes, 1))
            result["in_process_runs"] = ab
            print("\n".join(in_process_summary(ab, trees, [labels[ix] for ix in indexes])))
        elif args.passes > 0:
            result["in_process"] = {labels[ix]: in_process(ix, replay, args.passes) for ix in indexes}
            for label, modes in in_process_result(result).items():
                for mode, r in modes.items():
                    cpu, wall = r["cpu_us_per_drafted"], r["us_per_drafted"]
                    print(f"in-process {label:>6s} {mode:7s} cpu {cpu:.3f}  t_draft {wall:.3f} µs/drafted")
    print("\n".join(summary(rows, trees, labels)))
    if args.output:
        Path(args.output).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
