"""``lookupdec merge`` of two dynamic caches: wall time and peak RSS, next to the fork's figures.

The case: two dynamic caches (1..4-grams), each made by
``NgramCache.update`` over its own slice of a token corpus, merged by the real command (a
subprocess, as a user runs it). The caches are built once per corpus and size (in ``--keep``
or a temporary folder) with the fast path, whose files are byte-identical to the
reference's. ``--tree DIR`` (repeatable) runs the command from other source trees too (with
``PYTHONPATH=DIR``, e.g. a worktree of main), interleaved run by run with this one, and
checks that every tree writes the same bytes. ``--mode cache`` times the cache path behind
the command instead (a process that runs ``NgramCache.load`` of both files, ``merge`` and
``save``: what a Drafter's locked merge-on-save does).

With ``--data DIR`` the ``*.bin`` token files there (raw int32) are concatenated in name order
and cut into the two slices; by default the shared sample is used (``enwiki_wt.10M`` then
``wiki.test.raw``: 2.48M tokens, so at most 1.24M tokens per cache). The fork's figures
(measured earlier on this machine) are for two caches of 4M code tokens (110 MB files): the
fork 5.2 s / 0.79 GB, upstream llama.cpp 26 s.

    python -m perf.merge_scale                                    # the largest size the data allows
    python -m perf.merge_scale --data /path/to/code-tokens --tokens 4000000 --repeat 3
    python -m perf.merge_scale --tree ../main --impl fast --impl reference -o results/merge-scale.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from perf._common import REPLAY_FILE, STATIC_FILE, data_dir
from perf.create_scale import run_measured

FORK = (5.2, 790)
"""The fork on the ``lookupdec merge`` case, measured earlier on this machine: seconds and peak RSS (MB)."""


def corpus_tokens(data: Path | None) -> np.ndarray:
    """Every token of the corpus, in order (int32)."""
    if data is not None:
        files = sorted(data.glob("*.bin"))
        if not files:
            raise SystemExit(f"{data}: no *.bin token files")
    else:
        files = [data_dir() / STATIC_FILE, data_dir() / REPLAY_FILE]
    return np.concatenate([np.fromfile(path, dtype="<i4") for path in files])


BUILD = """
import sys
import numpy as np
from lookupdec import fast
tokens = np.fromfile(sys.argv[1], dtype="<i4").tolist()
cache = fast.NgramCache()
cache.update(tokens, len(tokens))
cache.save(sys.argv[2])
"""


CACHE_PATH = """
import sys
import lookupdec
impl = lookupdec.implementation(sys.argv[1])
merged = impl.NgramCache.load(sys.argv[2])
merged.merge(impl.NgramCache.load(sys.argv[3]))
merged.save(sys.argv[4])
"""


def make_caches(tokens: np.ndarray, n: int, folder: Path) -> list[Path]:
    """Two dynamic cache files, ``update`` over tokens [0, n) and [n, 2n), built once.

    Each is built in a child process: a big parent would be counted in the measured commands'
    peak RSS (Linux charges a forked child the parent's pages until it execs).
    """
    if 2 * n > len(tokens):
        raise SystemExit(f"the corpus has {len(tokens):,} tokens; two caches of {n:,} need {2 * n:,}")
    tag = hashlib.sha256(tokens[: 2 * n].tobytes()).hexdigest()[:12]
    paths = []
    for i in range(2):
        path = folder / f"dynamic-{tag}-{n}-{i}.bin"
        if not path.exists():
            part = folder / f"slice-{tag}-{n}-{i}.bin"
            tokens[i * n : (i + 1) * n].astype("<i4").tofile(part)
            subprocess.run([sys.executable, "-c", BUILD, str(part), str(path)], check=True)
            part.unlink()
        paths.append(path)
    return paths


def main() -> None:
    """Command line: see the module docstring."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, help="tokens per cache (default: 4M, or half the corpus if smaller)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per tree and implementation, interleaved (default 3)")
    ap.add_argument("--data", type=Path, help="folder of token files (*.bin) to cut the slices from")
    ap.add_argument("--keep", type=Path, help="folder to keep the cache files in (default: a temporary one)")
    ap.add_argument("--tree", action="append", default=[], help="another source tree to run lookupdec from")
    ap.add_argument("--impl", action="append", choices=("fast", "reference"), help="implementations (default: fast)")
    ap.add_argument("--mode", choices=("cli", "cache"), default="cli", help="lookupdec merge, or load+merge+save")
    ap.add_argument("-o", "--output", type=Path, help="write the results as JSON")
    args = ap.parse_args()
    tokens = corpus_tokens(args.data)
    n = args.tokens or min(4_000_000, len(tokens) // 2)
    here = str(Path(__file__).resolve().parents[1])
    trees = [here, *(str(Path(t).resolve()) for t in args.tree)]
    impls = args.impl or ["fast"]
    with tempfile.TemporaryDirectory(prefix="lookupdec-merge-") as tmp:
        folder = args.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        inputs = make_caches(tokens, n, folder)
        del tokens  # keep this process small (see make_caches)
        sizes = [p.stat().st_size / 1e6 for p in inputs]
        print(f"two caches of {n:,} tokens: {sizes[0]:.1f} MB + {sizes[1]:.1f} MB")
        cases = [(tree, impl) for impl in impls for tree in trees]
        runs: dict[tuple[str, str], list[tuple[float, int]]] = {c: [] for c in cases}
        digests: dict[tuple[str, str], str] = {}
        for r in range(args.repeat):
            for case in cases if r % 2 == 0 else cases[::-1]:  # ABBA: each case early and late alike
                tree, impl = case
                out = Path(tmp) / "merged.bin"
                env = dict(os.environ, PYTHONPATH=tree)
                if args.mode == "cli":
                    cmd = [sys.executable, "-m", "lookupdec", "merge", *map(str, inputs), "-o", str(out), "-q"]
                    cmd += ["--impl", impl]
                else:
                    cmd = [sys.executable, "-c", CACHE_PATH, impl, *map(str, inputs), str(out)]
                # cwd=tree as well: ``python -m`` and ``-c`` put the working directory first on sys.path.
                runs[case].append(run_measured(cmd, env, cwd=tree))
                digests[case] = hashlib.sha256(out.read_bytes()).hexdigest()
        if len(set(digests.values())) != 1:
            raise SystemExit(f"the trees wrote different files: {digests}")
        print(f"{'tree':<40} {'impl':<10} {'wall s':>8} {'peak RSS MB':>12}   fork: {FORK[0]} s / {FORK[1]} MB")
        rows = []
        for tree, impl in cases:
            wall = statistics.median(w for w, _ in runs[(tree, impl)])
            rss = statistics.median(m for _, m in runs[(tree, impl)]) / 2**20
            print(f"{tree:<40} {impl:<10} {wall:>8.2f} {rss:>12.0f}")
            rows.append({"tree": tree, "impl": impl, "wall_s": wall, "peak_rss_mb": rss, "runs": runs[(tree, impl)]})
        if args.output:
            args.output.parent.mkdir(parents=True, exist_ok=True)
            result = {"mode": args.mode, "tokens_per_cache": n, "input_mb": sizes, "fork": FORK, "rows": rows}
            args.output.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
