"""Drafting from the static index mapped vs loaded (issue 10 item 4), measured side by side.

Two measurements, both interleaved so that the machine's load hits every mode alike:

- ``in-process``: one process opens the index every way the fast path can (mapped as bytes,
  mapped through mmap slices with ``LOOKUPDEC_MAPPED_BYTES=0``, loaded) and replays each
  4096-token chunk of the replay text with every mode back to back (the order rotated per
  chunk), ``--passes`` times; CPU µs per drafted token (``time.process_time``, less noisy
  than wall time) and ``t_draft`` µs per drafted token per mode.
- ``stats``: fresh processes of ``lookupdec stats --json`` (the issue's command), for this tree
  and every ``--tree DIR`` (run with ``PYTHONPATH=DIR``), mapped, ``--load`` and without a
  static cache, ``--rounds`` rounds alternating; medians and minimums of
  ``us_per_drafted_token``, and peak RSS.

The index is built with ``lookupdec create`` from the static corpus (``enwiki_wt.10M``).

    python -m perf.mapped_static --tree ../main --rounds 7 --passes 4
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

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


def stats_runs(index: str, replay: Path, trees: list[str], rounds: int) -> list[dict[str, object]]:
    """Fresh ``lookupdec stats`` processes, trees x (none, mapped, --load) alternating."""
    rows = []
    for _ in range(rounds):
        for tree in trees:
            for mode, extra in (("none", []), ("mapped", ["-lcs", index]), ("loaded", ["-lcs", index, "--load"])):
                argv = [sys.executable, "-m", "lookupdec", "stats", "--tokens", str(replay), "--json", "-q", *extra]
                env = dict(os.environ, PYTHONPATH=tree)
                # cwd outside every tree: ``-m`` puts the working directory first on sys.path.
                out = subprocess.run(argv, env=env, cwd=tempfile.gettempdir(), capture_output=True, text=True)
                out.check_returncode()
                d = json.loads(out.stdout)
                rows.append(
                    {"tree": tree, "mode": mode, "us": d["us_per_drafted_token"], "rss_mb": d["peak_rss_mb"],
                     "n_drafted": d["n_drafted"], "n_accept": d["n_accept"]}
                )  # fmt: skip
    return rows


def in_process_result(result: dict[str, object]) -> dict[str, dict[str, float]]:
    got = result["in_process"]
    assert isinstance(got, dict)
    return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", help="folder with the replay and static token files (default: shared data)")
    ap.add_argument("--tree", action="append", default=[], help="another source tree to run (repeatable)")
    ap.add_argument("--rounds", type=int, default=5, help="rounds of fresh stats processes (default 5)")
    ap.add_argument("--passes", type=int, default=3, help="passes over the chunks in-process (default 3)")
    ap.add_argument("--index", help="use this index file instead of creating one")
    ap.add_argument("-o", "--output", help="write the results as JSON here")
    args = ap.parse_args()
    d = Path(args.data) if args.data else data_dir()
    replay, corpus = d / REPLAY_FILE, d / STATIC_FILE
    here = str(Path(__file__).resolve().parent.parent)
    with tempfile.TemporaryDirectory() as tmp:
        index = args.index or os.path.join(tmp, "static.lkdc")
        if not args.index:
            subprocess.run(
                [sys.executable, "-m", "lookupdec", "create", "--tokens", str(corpus), "-o", index, "-q"],
                env=dict(os.environ, PYTHONPATH=here), check=True,
            )  # fmt: skip
        # The stats processes first: a child's ru_maxrss starts from its parent's peak (Linux
        # keeps the larger across fork and exec), so the parent must not have replayed yet.
        rows = stats_runs(index, replay, [here, *args.tree], args.rounds)
        result: dict[str, object] = {"stats": rows, "in_process": in_process(index, replay, args.passes)}
        for mode, r in in_process_result(result).items():
            cpu, wall = r["cpu_us_per_drafted"], r["us_per_drafted"]
            print(f"in-process {mode:7s} cpu {cpu:.3f}  t_draft {wall:.3f} µs/drafted")
    for tree in [here, *args.tree]:
        for mode in ("none", "mapped", "loaded"):
            sel = [r for r in rows if r["tree"] == tree and r["mode"] == mode]
            us = [float(str(r["us"])) for r in sel]
            rss = statistics.median(float(str(r["rss_mb"])) for r in sel)
            med = statistics.median(us)
            print(f"stats {tree} {mode:7s} median {med:.3f} min {min(us):.3f} µs/drafted, peak RSS {rss:.0f} MB")
    if args.output:
        Path(args.output).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
