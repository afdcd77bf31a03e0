"""Create at scale: wall time, peak RSS (the whole process tree) and MB/s of ``lookupdec create``.

Runs the real command (a subprocess, as a user would) on corpora of growing size, interleaving
the sizes and repeats so that the machine's load hits them alike, and prints medians next to
the C++ fork's figures (measured earlier on this machine, on a Linux C corpus; the fork is not
part of this project). Peak RSS is the largest sum of the resident memory of ``lookupdec`` and its worker
processes, sampled from /proc every 20 ms), or the exact peak of the largest single process
(``ru_maxrss``, what ``/usr/bin/time`` reports) when that is larger.

Corpora are token files. With ``--data DIR``, the ``*.bin`` token files there (raw int32)
are concatenated in name order and cut to each size; by default the shared sample
(``enwiki_wt.10M.llama3.bin``, 2.19M tokens) is repeated, each copy with its ids shifted by
``7919 * copy`` modulo 128,000 and every other copy reversed, so that each copy adds new
2-grams (more than real text of that size would: a harder case than the fork's corpus).
Sizes are MB of text, converted at the sample's 4.556 bytes of text per token.

    python -m perf.create_scale                       # 4M tokens, 25 MB, 100 MB
    python -m perf.create_scale --sizes 4M,25,100,541,764 --repeat 3 -o results/create-scale.json
    python -m perf.create_scale --data /big/corpus --sizes 100,2000 -- --memory 2G
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from perf._common import data_dir

TEXT_BYTES_PER_TOKEN = 9_997_780 / 2_194_448
"""The shared sample's MB of text per token (enwiki_wt.10M.txt / its token file)."""
FORK = {"4M": (1.4, 133), "25": (3.8, 235), "100": (8.8, 686), "541": (101, 2150), "764": (71, 2800)}
"""The fork's ``create``, measured earlier on this machine: seconds and peak RSS (MB), per corpus size."""


def n_tokens(size: str) -> int:
    """Tokens of a size label: ``4M`` (tokens) or a number of MB of text."""
    if size.upper().endswith("M") and size[:-1].isdigit():
        return int(size[:-1]) * 1_000_000
    return int(float(size) * 1e6 / TEXT_BYTES_PER_TOKEN)


def make_corpus(size: str, data: Path | None, folder: Path) -> Path:
    """A token file of ``size`` in ``folder`` (made once)."""
    n = n_tokens(size)
    out = folder / f"corpus-{size}.bin"
    if out.exists() and out.stat().st_size == 4 * n:
        return out
    with open(out, "wb") as f:
        done = 0
        if data is not None:
            for path in sorted(data.glob("*.bin")):
                if done >= n:
                    break
                part = np.fromfile(path, dtype="<i4")[: n - done]
                part.tofile(f)
                done += len(part)
            if done < n:
                raise SystemExit(f"{data}: the token files hold {done:,} tokens, {size} needs {n:,}")
        else:
            base = np.fromfile(data_dir() / "enwiki_wt.10M.llama3.bin", dtype="<i4").astype(np.int64)
            copy = 0
            while done < n:
                v = base[::-1] if copy % 2 else base
                part = ((v + 7919 * copy) % 128_000).astype("<i4")[: n - done]
                part.tofile(f)
                done += len(part)
                copy += 1
    return out


def tree_rss(pid: int) -> int:
    """Resident bytes of ``pid`` and all its descendants (Linux /proc; ``children`` lists)."""
    total, todo = 0, [pid]
    page = os.sysconf("SC_PAGE_SIZE")
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/statm") as f:
                total += int(f.read().split()[1]) * page
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except OSError:  # the process ended between two reads
            continue
    return total


def run_create(corpus: Path, output: Path, extra: list[str]) -> tuple[float, int]:
    """Wall seconds and peak tree RSS (bytes) of one ``lookupdec create``."""
    return run_measured([sys.executable, "-m", "lookupdec", "create", str(corpus), "-o", str(output), "-q", *extra])


def run_measured(cmd: list[str], env: dict[str, str] | None = None, cwd: str | None = None) -> tuple[float, int]:
    """Wall seconds and peak tree RSS (bytes) of running ``cmd``; exits if it fails."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, cwd=cwd)
    peak = 0
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, tree_rss(proc.pid))
            stop.wait(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    # wait4 gives the largest peak of any single process of the tree (ru_maxrss, exact); the
    # samples give the sum over processes (but can miss a short peak): report the larger.
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = rc = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t0
    stop.set()
    sampler.join()
    peak = max(peak, usage.ru_maxrss * 1024)
    if rc != 0:
        raise SystemExit(f"{' '.join(cmd)} failed with exit code {rc}")
    return wall, peak


def main() -> None:
    """Command line: see the module docstring."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="4M,25,100", help="comma-separated: NM = N million tokens, N = N MB of text")
    ap.add_argument("--repeat", type=int, default=3, help="runs per size, interleaved (default 3)")
    ap.add_argument("--data", type=Path, help="folder of token files (*.bin) to cut the corpora from")
    ap.add_argument("--keep", type=Path, help="folder to keep the corpora in (default: a temporary one)")
    ap.add_argument("-o", "--output", type=Path, help="write the results as JSON")
    ap.add_argument("create_args", nargs="*", help="after --: extra arguments for lookupdec create")
    args = ap.parse_args()
    sizes = args.sizes.split(",")
    with tempfile.TemporaryDirectory(prefix="lookupdec-scale-") as tmp:
        folder = args.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        corpora = {s: make_corpus(s, args.data, folder) for s in sizes}
        runs: dict[str, list[tuple[float, int]]] = {s: [] for s in sizes}
        for _ in range(args.repeat):
            for s in sizes:
                runs[s].append(run_create(corpora[s], Path(tmp) / "out.lkdc", args.create_args))
        rows = []
        print(f"{'corpus':>8} {'tokens':>12} {'wall s':>8} {'peak RSS MB':>12} {'MB/s':>7}   fork s / MB")
        for s in sizes:
            wall = statistics.median(w for w, _ in runs[s])
            rss = statistics.median(r for _, r in runs[s]) / 2**20
            mb = n_tokens(s) * TEXT_BYTES_PER_TOKEN / 1e6
            fork = FORK.get(s)
            label = s if s.endswith("M") else f"{s} MB"
            fork_text = f"{fork[0]} / {fork[1]}" if fork else "-"
            print(f"{label:>8} {n_tokens(s):>12,} {wall:>8.2f} {rss:>12.0f} {mb / wall:>7.1f}   {fork_text}")
            rows.append({"size": s, "tokens": n_tokens(s), "text_mb": mb, "wall_s": wall, "peak_rss_mb": rss,
                         "runs": runs[s], "fork": fork})  # fmt: skip
        if args.output:
            args.output.parent.mkdir(parents=True, exist_ok=True)
            args.output.write_text(json.dumps({"create_args": args.create_args, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
