"""``python -m perf COMMAND ...``: run, compare, gate, profile, plot (see perf/README.md)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

COMMANDS = {
    "run": ("perf.run", "run the benchmark suite and store the results"),
    "compare": ("perf.compare", "compare stored results (ratio table with significance)"),
    "gate": ("perf.gate", "the CI performance gate"),
    "profile": ("perf.profile", "profile the replay loop with scalene"),
    "plot": ("perf.plot", "plot stored results as PNG"),
    "table": ("perf.table", "fast vs reference per static size (markdown), from stored results"),
    "track": ("perf.track", "build two commits and compare them, interleaved (what perf.yml runs)"),
    "history": ("perf.history", "keep and plot per-runner results of main (perf.yml on main)"),
    "policy": ("perf.bench_policy", "drafting policies: tokens per step, waste and µs per step"),
    "open": ("perf.open_index", "open a static index, and the first drafts after it, at every size"),
    "speedup": ("perf.speedup", "generation speed with real forward passes: tokens/s with and without drafting"),
    "batch-replay": (
        "perf.batch_replay",
        "several requests open at once, offline: real outputs drafted through R rows",
    ),
    "vllm-speedup": ("perf.vllm_speedup", "generation speed in vLLM's engine: lookupdec's and vLLM's n-gram drafts"),
    "length-replay": ("perf.length_replay", "the adaptive draft length on a fake clock, a given verify curve"),
    "batch-invariance": ("perf.batch_invariance", "llama.cpp: does a verified draft give one-token decoding's argmax?"),
    "anchors": ("perf.anchors", "build and run the C++ anchor (the fork's ngram-cache, replicated; perf/anchors/)"),
    "fork": ("perf.fork", "lookupdec against the C++ anchor: create, open, draft, merge in interleaved rounds"),
    "grounded": ("perf.grounded", "input-grounded drafting: lookupdec and its peers on real prompt -> output pairs"),
    "grounded-data": ("perf.grounded_data", "build the input-grounded pairs: files of two releases of real packages"),
}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        print("usage: python -m perf {" + ",".join(COMMANDS) + "} ...\n")
        for name, (_, what) in COMMANDS.items():
            print(f"  {name:<13} {what}")
        if argv and argv[0] not in ("-h", "--help"):
            print(f"\nunknown command {argv[0]!r}", file=sys.stderr)
            return 2
        return 0
    module = importlib.import_module(COMMANDS[argv[0]][0])
    rc: int = module.main(argv[1:])
    return rc


if __name__ == "__main__":
    sys.exit(main())
