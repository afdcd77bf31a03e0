"""The whole ``lookupdec tokenize`` process against tiktoken's single-thread ``encode_ordinary``, interleaved.

    python -m perf.tokenize_process [--text english|code] [--mb 60] [--repeat 3] [--workers N] [--keep DIR]

The speed goal: the whole ``lookupdec tokenize`` process (start, GGUF header, vocabulary,
every worker, writing the ids) on 2 cores at least 2x the single-thread throughput of tiktoken's
``encode_ordinary`` with the Llama 3 ranks on the same text, memory under
1 GB. ``--text english``: shared/data's English (``enwiki_wt.10M.txt``, then ``wiki.test.raw``)
repeated to ``--mb`` MB (repeats help any piece cache: the code text has none); ``--text code``:
C, the ``*.h`` files under /usr/include concatenated in sorted path order, no file twice
(:func:`perf.bench_tokenize.code`). The per-core column is the ratio over the number of workers.

Each round runs, in alternating order, (a) ``lookupdec tokenize TEXT --tokenizer
ggml-vocab-llama-bpe.gguf -o OUT -q`` as a child process, timed from spawn to exit, its peak
RSS from ``wait4`` (the workers are its children: their peak is reported by ``/usr/bin/time``
too, not here), and (b) a child that reads the text, loads tiktoken's Llama 3 encoding and times
the ``encode_ordinary`` call alone (the baseline gets no charge for its process start or its
vocabulary load). Medians and the per-round ratio are printed; the ids of (a) are checked
against (b)'s once.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
VOCAB = SHARED / "vocab" / "ggml-vocab-llama-bpe.gguf"

# The baseline child: tiktoken with the ranks lookupdec's tokenizer builds from the GGUF (the
# same vocabulary), the encode call timed alone; it writes the ids for the one-time check.
BASELINE = """
import sys, time
import numpy as np
from lookupdec.tokenizer import load_tokenizer
enc = load_tokenizer(sys.argv[1])._bpe._tiktoken
text = open(sys.argv[2], encoding="utf-8").read()
t0, c0 = time.perf_counter(), time.process_time()
ids = enc.encode_ordinary(text)
print(time.perf_counter() - t0, time.process_time() - c0)
np.asarray(ids, dtype="<i4").tofile(sys.argv[3])
"""


def make_text(path: Path, mb: float, kind: str = "english") -> int:
    """Write text of about ``mb`` MB to ``path`` (English: shared data repeated; code: C headers); its size in bytes."""
    if kind == "code":
        from perf.bench_tokenize import code

        data = code(int(mb * 1e6)).encode("utf-8")
        path.write_bytes(data)
        return len(data)
    parts = [(SHARED / "enwiki_wt.10M.txt").read_bytes(), (SHARED / "wiki.test.raw").read_bytes()]
    out = bytearray()
    i = 0
    while len(out) < mb * 1e6:
        out += parts[i % 2] if i % 4 == 3 else parts[0]
        i += 1
    path.write_bytes(bytes(out))
    return len(out)


def run_ours(text: Path, out: Path, workers: int | None) -> tuple[float, float, int]:
    """Wall seconds, CPU seconds (user + sys, its workers included) and peak RSS (KB) of one ``lookupdec tokenize``."""
    cmd = [sys.executable, "-m", "lookupdec", "tokenize", str(text), "--tokenizer", str(VOCAB), "-o", str(out), "-q"]
    if workers is not None:
        cmd += ["--workers", str(workers)]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"tokenize_process: lookupdec tokenize exited {proc.returncode}")
    # wait4's usage counts the children the process waited for: the pool's workers.
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss


def run_baseline(text: Path, out: Path) -> tuple[float, float]:
    """Wall and CPU seconds of tiktoken's ``encode_ordinary`` call alone, in its own process."""
    done = subprocess.run(
        [sys.executable, "-c", BASELINE, str(VOCAB), str(text), str(out)], check=True, capture_output=True, text=True
    )
    wall, cpu = done.stdout.split()
    return float(wall), float(cpu)


def main(argv: list[str] | None = None) -> int:
    """Run the interleaved rounds and print the table; exit 0."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--mb", type=float, default=60.0, help="at least this many MB of English text, in whole files (default 60)"
    )
    ap.add_argument("--text", choices=("english", "code"), default="english", help="which text (default english)")
    ap.add_argument("--repeat", type=int, default=3, help="rounds (default 3)")
    ap.add_argument("--workers", type=int, default=None, help="passed to lookupdec tokenize (default: its own)")
    ap.add_argument("--keep", type=Path, default=None, help="folder for the text and ids (default: a temporary one)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="lookupdec-tok-") as tmp:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        text = work / f"{args.text}.txt"
        size = make_text(text, args.mb, args.text) if not text.exists() else text.stat().st_size
        workers = args.workers or os.cpu_count() or 1
        mb = size / 1e6
        ours_ids, their_ids = work / "ours.i32", work / "tiktoken.i32"
        print(f"text: {text} ({mb:.1f} MB); {workers} workers; load average {os.getloadavg()[0]:.2f}")
        print(
            f"{'round':>5} {'lookupdec s':>12} {'MB/s':>7} {'CPU s':>6} {'peak MB':>8} "
            f"{'tiktoken s':>11} {'MB/s':>7} {'CPU s':>6} {'ratio':>6}"
        )
        ratios, ours_s, theirs_s, cpu_ratios = [], [], [], []
        for r in range(args.repeat):
            # Alternate which goes first, so neither always runs on a warmer page cache.
            if r % 2 == 0:
                wall, cpu, rss = run_ours(text, ours_ids, args.workers)
                base, base_cpu = run_baseline(text, their_ids)
            else:
                base, base_cpu = run_baseline(text, their_ids)
                wall, cpu, rss = run_ours(text, ours_ids, args.workers)
            ours_s.append(wall)
            theirs_s.append(base)
            ratios.append(base / wall)
            cpu_ratios.append(base_cpu / cpu)
            row = f"{r + 1:>5} {wall:12.2f} {mb / wall:7.2f} {cpu:6.2f} {rss / 1024:8.0f} {base:11.2f} {mb / base:7.2f}"
            print(f"{row} {base_cpu:6.2f} {base / wall:6.2f}")
        ours_bytes, their_bytes = ours_ids.read_bytes(), their_ids.read_bytes()
        # lookupdec adds the vocabulary's BOS (one int32) before the ids, as llama.cpp does.
        same = ours_bytes[4:] == their_bytes
        print(
            f"median: lookupdec {statistics.median(ours_s):.2f} s, tiktoken {statistics.median(theirs_s):.2f} s, "
            f"ratio {statistics.median(ratios):.2f}x on {workers} workers (goal >= 2x on 2), "
            f"{statistics.median(ratios) / workers:.2f}x per worker; ids equal after BOS: {'yes' if same else 'NO'}"
        )
        print(
            f"CPU: tiktoken's encode call / the whole lookupdec process (start, load, workers, writing), "
            f"median {statistics.median(cpu_ratios):.2f}x (what a process gets per CPU second, whatever else runs)"
        )
        print(f"load average at the end {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
