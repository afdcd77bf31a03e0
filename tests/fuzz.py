"""A seeded mutation fuzzer over every cache reader and entry point, both implementations.

Seeds are small valid files (under 1 KB) of each format: ``llama`` (a static cache, 2-grams),
``dynamic`` (legacy, 1..4-grams), ``fork-v1``, ``fork-v2``, ``lookupdec`` and ``corpus`` (the
hybrid policy's corpus file, given to ``stats --policy hybrid --corpus``). Each mutant
(1-3 byte-level mutations: bit flips, random bytes, interesting int32 / u64 values at aligned
offsets, truncation, extension, swapped words, zeroed ranges) goes through every entry point:
``inspect``, ``inspect --verify``, ``stats -lcs`` (reference, fast mapped, fast ``--load``),
``stats -lcd`` and ``merge`` (reference and fast), in process through ``lookupdec.cli.main``; a
corpus file goes through ``stats --corpus`` of each implementation (one run each: the reference
reads only the ids, the fast path the structure, so a mutant may draft differently in them).

Each run is classified: ``error`` (one ``lookupdec: error:`` line, exit 2), ``ok`` (a single
entry point that succeeded), ``same`` (both implementations gave the same counts / bytes),
``different`` (one refused and the other did not, or their results differ), ``traceback``
(an exception escaped ``main`` or the error was not one clean line), ``memory`` (more than
``MEMORY_LIMIT`` bytes allocated, measured with tracemalloc), ``crash`` (the worker process
died) and ``hang`` (the worker did not finish in time). Workers run in subprocesses so that
a crash or a hang is observed, not suffered.

    python -m tests.fuzz --n 2000 --seed 1          # the long run (figures in docs/fuzzing.md)
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import struct
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

FORMATS = ("llama", "dynamic", "fork-v1", "fork-v2", "lookupdec", "corpus")
CLASSES = ("error", "ok", "same", "different", "traceback", "memory", "crash", "hang")
BAD = ("different", "traceback", "memory", "crash", "hang")
MEMORY_LIMIT = 8 << 20
"""A mutant of a file under 1 KB may make one entry point allocate at most this much."""

CORPUS = [1, 2, 3, 1, 2, 4, 1, 2, 3, 5, 6, 1, 2, 3, 7, 7, 1, 2, 9, -5, 2**31 - 1, 1, 2, 3, 4, 5, 6, 1, 2]
REPLAY = [t for t in CORPUS if t >= 0] * 3
CORPUS_REPLAY = REPLAY * 2
"""The replay of the corpus format: long enough that the bigram (1, 2) has more occurrences in the
requests' history than the 32 candidates ``stats`` compares, so the trigram search reaches the
corpus (the trigram section; ``tests/test_fuzz.py`` checks that it reads it)."""
INT32S = (0, 1, -1, 2, 7, 2**31 - 1, -(2**31), 2**16, 255)
U64S = (0, 1, 2**31, 2**32, 2**63 - 1, 2**63, 2**64 - 1, 96, 112)


def make_seed(fmt: str, path: Path) -> None:
    """Write the valid seed file of ``fmt`` to ``path``."""
    import lookupdec.reference as ref
    from lookupdec import formats

    if fmt == "corpus":
        from lookupdec import fast

        ids = [t for t in CORPUS if t >= 0][:24]
        fast.CorpusIndex.from_tokens([*ids[:10], -1, *ids[10:]]).save(path)
        return
    if fmt == "dynamic":
        cache = ref.NgramCache()
        cache.update(CORPUS[:12], 12, 1, 4)  # kept under 1 KB, like every seed
        cache.save(path)
        return
    formats.write_static(ref.build_static(CORPUS[:22]).items(), path, fmt)


def mutate(data: bytes, rng: random.Random) -> bytes:
    """``data`` with 1-3 random byte-level mutations."""
    b = bytearray(data)
    for _ in range(rng.randint(1, 3)):
        op = rng.randrange(8)
        n = len(b)
        if op == 0 and n:
            b[rng.randrange(n)] ^= 1 << rng.randrange(8)
        elif op == 1 and n:
            b[rng.randrange(n)] = rng.randrange(256)
        elif op == 2 and n >= 4:
            struct.pack_into("<i", b, 4 * rng.randrange(n // 4), rng.choice(INT32S))
        elif op == 3 and n >= 8:
            struct.pack_into("<Q", b, 8 * rng.randrange(min(n, 96) // 8), rng.choice(U64S))
        elif op == 4:
            del b[rng.randrange(n + 1) :]
        elif op == 5:
            b += bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
        elif op == 6 and n >= 8:
            i, j = 4 * rng.randrange(n // 4), 4 * rng.randrange(n // 4)
            b[i : i + 4], b[j : j + 4] = b[j : j + 4], b[i : i + 4]
        elif n:
            i = rng.randrange(n)
            b[i : i + rng.randint(1, 16)] = bytes(len(b[i : i + 16]))
    return bytes(b)


def run_cli(argv: list[str]) -> tuple[str, Any, int]:
    """(kind, value, peak bytes) of ``lookupdec argv`` run in process: ok / error / traceback."""
    from lookupdec import cli

    out, err = io.StringIO(), io.StringIO()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli.main(argv)
    except BaseException as e:  # what must never happen: an exception escaping main
        return "traceback", f"{type(e).__name__}: {e}", 0
    peak = tracemalloc.get_traced_memory()[1] - base
    errors = [line for line in err.getvalue().splitlines() if not line.startswith("lookupdec: warning: ")]
    if code == 0 and not errors:
        return "ok", out.getvalue(), peak
    if code == 2 and len(errors) == 1 and errors[0].startswith("lookupdec: error: "):
        return "error", errors[0], peak
    return "traceback", f"exit {code}: {err.getvalue()[-300:]}", peak


def _counts(stdout: str) -> str:
    """The replay's counts from ``stats --json`` output (timings and paths dropped)."""
    d = json.loads(stdout)
    return json.dumps([d["n_drafted"], d["n_accept"], d["n_predict"]])


def n_entries(fmt: str) -> int:
    """How many entry points a mutant of ``fmt`` goes through (see :func:`entries`)."""
    return 2 if fmt == "corpus" else 5


def entries(
    path: str, replay: str, work: str, fmt: str = "lookupdec"
) -> Iterator[tuple[str, list[tuple[list[str], Callable[[str], str]]]]]:
    """(entry name, runs to compare) for one mutant file; one run: (argv, how to read its result)."""
    same: Callable[[str], str] = lambda s: ""  # noqa: E731  (a single run: only its kind matters)
    stats = ["stats", replay, "-c", "16", "--n-draft", "4", "--json", "--quiet"]
    if fmt == "corpus":
        for impl in ("reference", "fast"):
            yield f"stats --corpus ({impl})", [([*stats, "--policy", "hybrid", "--corpus", path, "--impl", impl], same)]
        return

    def merged(out: str) -> Callable[[str], str]:
        return lambda _stdout: Path(out).read_bytes().hex()

    yield "inspect", [(["inspect", path, "--json"], same)]
    yield "inspect --verify", [(["inspect", path, "--json", "--verify"], same)]
    yield (
        "stats -lcs",
        [
            ([*stats, "-lcs", path, "--impl", "reference"], _counts),
            ([*stats, "-lcs", path, "--impl", "fast"], _counts),
            ([*stats, "-lcs", path, "--impl", "fast", "--load"], _counts),
        ],
    )
    yield "stats -lcd", [([*stats, "-lcd", path, "--impl", impl], _counts) for impl in ("reference", "fast")]
    outs = [os.path.join(work, f"merged-{impl}.bin") for impl in ("reference", "fast")]
    yield (
        "merge",
        [
            (["merge", path, "-o", out, "--impl", impl, "-q"], merged(out))
            for impl, out in zip(("reference", "fast"), outs, strict=True)
        ],
    )


def classify(runs: list[tuple[str, Any, int]]) -> tuple[str, str]:
    """The class of one entry point's runs (one per implementation or mode) and a detail."""
    for kind, value, peak in runs:
        if kind == "traceback":
            return "traceback", str(value)
        if peak > MEMORY_LIMIT:
            return "memory", f"{peak} bytes"
    kinds = {kind for kind, _, _ in runs}
    if len(runs) == 1:
        return runs[0][0], str(runs[0][1])[:200]
    if kinds == {"error"}:
        return "error", str(runs[0][1])[:200]
    if kinds == {"ok"} and len({value for _, value, _ in runs}) == 1:
        return "same", ""
    return "different", " | ".join(f"{k}: {str(v)[:120]}" for k, v, _ in runs)


def worker(fmt: str, seed: int, n: int) -> None:
    """Fuzz ``fmt`` with ``n`` mutants; one JSON line per mutant on stdout (``start`` first)."""
    rng = random.Random(f"{seed}-{fmt}")
    with tempfile.TemporaryDirectory(prefix="lookupdec-fuzz-") as work:
        seed_path = Path(work) / "seed"
        make_seed(fmt, seed_path)
        original = seed_path.read_bytes()
        replay = os.path.join(work, "replay.bin")
        import numpy as np

        np.asarray(CORPUS_REPLAY if fmt == "corpus" else REPLAY, dtype="<i4").tofile(replay)
        path = os.path.join(work, "mutant")
        Path(path).write_bytes(original)
        tracemalloc.start()
        for _, runs in entries(path, replay, work, fmt):  # warm up: lazy imports are not the file's doing
            for argv, _reader in runs:
                run_cli(argv)
        for i in range(n):
            data = mutate(original, rng)
            Path(path).write_bytes(data)
            print(json.dumps({"start": i, "size": len(data)}), flush=True)
            for name, runs in entries(path, replay, work, fmt):
                results = []
                for argv, reader in runs:
                    kind, value, peak = run_cli(argv)
                    if kind == "ok":
                        value = reader(value)
                    results.append((kind, value, peak))
                cls, detail = classify(results)
                line = {"mutant": i, "entry": name, "class": cls}
                if cls in BAD:
                    line["detail"] = detail
                    line["data"] = data.hex()
                print(json.dumps(line), flush=True)


def _run_worker(fmt: str, n: int, seed: int, limit: float) -> tuple[str, int | None]:
    """One format's worker subprocess: its stdout, and its exit code (None when it timed out)."""
    cmd = [sys.executable, "-m", "tests.fuzz", "--worker", fmt, "--n", str(n), "--seed", str(seed)]
    root = str(Path(__file__).resolve().parent.parent)
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=limit, cwd=root)
        return done.stdout, done.returncode
    except subprocess.TimeoutExpired as e:
        raw = e.stdout or b""
        return raw.decode() if isinstance(raw, bytes) else raw, None


def fuzz(n: int, seed: int, formats: tuple[str, ...] = FORMATS, timeout: float | None = None) -> dict[str, Any]:
    """Run a worker per format, as many at once as there are cores; the classification counts and every bad run."""
    counts: dict[str, Counter[str]] = {}
    bad: list[dict[str, Any]] = []
    limit = timeout if timeout is not None else 60 + 2.0 * n
    # The workers are independent processes (each format has its own seeded mutants), so they
    # share the cores; each one's time limit still holds for it alone.
    with ThreadPoolExecutor(max_workers=max(1, min(len(formats), os.cpu_count() or 1))) as pool:
        outputs = list(pool.map(lambda fmt: _run_worker(fmt, n, seed, limit), formats))
    for fmt, (stdout, code) in zip(formats, outputs, strict=True):
        c: Counter[str] = Counter()
        last_start = None
        for line in stdout.splitlines():
            rec = json.loads(line)
            if "start" in rec:
                last_start = rec["start"]
                continue
            c[rec["class"]] += 1
            if rec["class"] in BAD:
                bad.append({"format": fmt, **rec})
        if code is None:
            c["hang"] += 1
            bad.append({"format": fmt, "mutant": last_start, "class": "hang"})
        elif code != 0:
            c["crash"] += 1
            bad.append({"format": fmt, "mutant": last_start, "class": "crash", "exit": code})
        counts[fmt] = c
    return {"counts": {f: dict(c) for f, c in counts.items()}, "bad": bad}


def main(argv: list[str] | None = None) -> int:
    """``python -m tests.fuzz``: the long run (``--n`` mutants per format) and its table."""
    p = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=int(os.environ.get("LOOKUPDEC_FUZZ_N", "1000")), help="mutants per format")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--format", action="append", choices=FORMATS, help="only these formats (repeatable)")
    p.add_argument("--worker", choices=FORMATS, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(args.worker, args.seed, args.n)
        return 0
    t0 = time.perf_counter()
    report = fuzz(args.n, args.seed, tuple(args.format or FORMATS))
    print(f"{args.n} mutants per format, seed {args.seed}, {time.perf_counter() - t0:.0f} s")
    print(f"| format | runs | {' | '.join(CLASSES)} |")
    print("|---|---:|" + "---:|" * len(CLASSES))
    for fmt, c in report["counts"].items():
        print(f"| {fmt} | {sum(c.values())} | " + " | ".join(str(c.get(k, 0)) for k in CLASSES) + " |")
    for b in report["bad"][:20]:
        print(json.dumps(b)[:400])
    return 1 if report["bad"] else 0


if __name__ == "__main__":
    sys.exit(main())
