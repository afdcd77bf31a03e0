"""What every benchmark script shares: inputs, the implementation under test, metadata, the runner.

Inputs come from ``../shared/data`` next to the repository (or ``$LOOKUPDEC_DATA``) when the
token files are there, and otherwise from a seeded synthetic token source generated in-process,
so the suite runs anywhere. Every script takes ``--impl reference|fast`` (passed on to pyperf's
worker processes) and refuses to measure an uncompiled fast path unless ``--allow-interpreted``.
"""

from __future__ import annotations

import argparse
import functools
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Final

import numpy as np
import pyperf

REPO: Final = Path(__file__).resolve().parents[1]
RESULTS: Final = REPO / "results"
CACHE: Final = RESULTS / "cache"

REPLAY_FILE: Final = "wiki.test.raw.llama3.bin"
STATIC_FILE: Final = "enwiki_wt.10M.llama3.bin"
STATIC_TEXT_FILE: Final = "enwiki_wt.10M.txt"
IMPLS: Final = ("reference", "fast")
WORKLOADS: Final = ("fast", "full")

N_CTX: Final = 4096
N_DRAFT: Final = 8

TimeFunc = Callable[[int], float]
"""pyperf's time function: ``f(loops)`` returns the seconds the ``loops`` iterations took."""
Prepared = tuple[TimeFunc, dict[str, Any]]
"""A prepared benchmark: its time function and the metadata measured while preparing it."""


class ImplUnavailable(Exception):
    """The implementation asked for cannot be measured (missing, incomplete or not compiled)."""


# --- inputs ------------------------------------------------------------------------------


def data_dir() -> Path:
    """``$LOOKUPDEC_DATA``, else ``../shared/data`` relative to the repository."""
    env = os.environ.get("LOOKUPDEC_DATA")
    return Path(env) if env else REPO.parent / "shared" / "data"


def real_data_available(directory: Path) -> bool:
    return (directory / REPLAY_FILE).is_file() and (directory / STATIC_FILE).is_file()


def _read_tokens(path: Path, count: int) -> list[int]:
    tokens: list[int] = np.fromfile(path, dtype="<i4", count=count).tolist()
    return tokens


@functools.cache
def _synthetic(seed: int, n: int, vocab: int = 32_000) -> tuple[int, ...]:
    """A Zipf-ish Markov token stream with repeated passages, reproducible from ``seed``.

    Each token follows its predecessor through a small per-token table of likely successors
    (Zipf-weighted), sometimes jumps to a Zipf-random token, and now and then a passage of
    earlier text is repeated: enough structure for n-gram drafting to find and miss drafts
    at rates in the range real text gives.
    """
    rng = np.random.default_rng(seed)
    n_succ = 8
    # Successor tables share one hidden source (seed 541), so different seeds are different
    # "texts" of the same "language" and a static corpus helps a replay.
    table = np.random.default_rng(541).zipf(1.3, size=(vocab, n_succ)) % vocab
    choice = rng.zipf(1.6, size=n) - 1
    uniform = rng.random(n)
    jumps = rng.zipf(1.2, size=n) % vocab
    copy_len = rng.geometric(1 / 24, size=n)
    copy_from = rng.random(n)
    out = np.empty(n, dtype=np.int64)
    prev = 1
    i = 0
    while i < n:
        u = uniform[i]
        if u < 0.02 and i > 64:  # repeat an earlier passage
            start = int(copy_from[i] * (i - 32))
            length = min(int(copy_len[i]), n - i, i - start)
            out[i : i + length] = out[start : start + length]
            i += length
            prev = int(out[i - 1])
            continue
        tok = int(table[prev, choice[i]]) if u < 0.85 and choice[i] < n_succ else int(jumps[i])
        out[i] = tok
        prev = tok
        i += 1
    return tuple(out.tolist())


@dataclass(frozen=True)
class Corpus:
    """Where the tokens come from: a replay text and a static corpus (both prefixes on demand)."""

    name: str
    directory: Path | None  # None: synthetic
    replay_total: int
    static_total: int
    text_bytes_per_token: float  # bytes of text per static-corpus token, for "per MB of corpus"

    @property
    def real(self) -> bool:
        return self.directory is not None

    def replay(self, n: int | None = None) -> list[int]:
        n = self.replay_total if n is None else min(n, self.replay_total)
        if self.directory is None:
            return list(_synthetic(1, self.replay_total)[:n])
        return _read_tokens(self.directory / REPLAY_FILE, n)

    def static(self, n: int | None = None) -> list[int]:
        n = self.static_total if n is None else min(n, self.static_total)
        if self.directory is None:
            return list(_synthetic(2, n))
        return _read_tokens(self.directory / STATIC_FILE, n)

    def text_mb(self, n_tokens: int) -> float:
        return n_tokens * self.text_bytes_per_token / 1e6


SYNTHETIC_REPLAY: Final = 300_000
SYNTHETIC_STATIC: Final = 2_200_000


def corpus(directory: str | None, synthetic: bool) -> Corpus:
    """The real corpus in ``directory`` (default: :func:`data_dir`), or the synthetic one."""
    d = Path(directory) if directory else data_dir()
    if not synthetic and real_data_available(d):
        replay_total = (d / REPLAY_FILE).stat().st_size // 4
        static_total = (d / STATIC_FILE).stat().st_size // 4
        text = d / STATIC_TEXT_FILE
        bpt = text.stat().st_size / static_total if text.is_file() else 4.0
        return Corpus("wikitext-test+enwiki_wt.10M (llama3)", d, replay_total, static_total, bpt)
    return Corpus("synthetic-markov(seed=1,2)", None, SYNTHETIC_REPLAY, SYNTHETIC_STATIC, 4.0)


def size_label(n: int) -> str:
    """``250k``, ``1M``, ``2.19M`` (the label of a static corpus of ``n`` tokens; 0 is ``none``)."""
    if n == 0:
        return "none"
    if n >= 1_000_000:
        return f"{n / 1e6:.3g}M"
    return f"{n / 1e3:.3g}k"


# --- the implementation under test ---------------------------------------------------------


def load_impl(name: str, allow_interpreted: bool = False) -> ModuleType:
    """The implementation module ``name``; raise :class:`ImplUnavailable` when it cannot be measured."""
    import lookupdec

    try:
        mod = lookupdec.implementation(name)
    except ImportError as e:
        raise ImplUnavailable(f"lookupdec.{name} is not importable: {e}") from e
    if name == "fast" and not mod.COMPILED and not allow_interpreted:
        raise ImplUnavailable(
            "lookupdec.fast is NOT compiled (its mypyc extension modules are not installed), so its "
            "numbers would be meaningless; build it (pip install -e .) or pass --allow-interpreted"
        )
    return mod


def git_revision() -> str:
    """The checked-out commit (with ``-dirty`` when the tree has changes), or ``unknown``."""
    try:
        rev = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no", "--", "lookupdec"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return rev + ("-dirty" if dirty else "")


def base_metadata(mod: ModuleType, src: Corpus, workload: str) -> dict[str, Any]:
    """What every benchmark records: implementation, compiled or not, version, revision, corpus."""
    import lookupdec

    return {
        "implementation": str(mod.IMPLEMENTATION),
        "compiled": "yes" if mod.COMPILED else "no",
        "lookupdec_version": lookupdec.__version__,
        "git_revision": git_revision(),
        "corpus": src.name,
        "corpus_real": "yes" if src.real else "no",
        "workload": workload,
    }


# --- runner --------------------------------------------------------------------------------


@dataclass
class Bench:
    """A benchmark script's runner, arguments, implementation and inputs."""

    runner: pyperf.Runner
    args: argparse.Namespace
    impl: ModuleType
    src: Corpus
    metadata: dict[str, Any]
    registered: int = 0
    """How many benchmarks this script has handed to the runner so far (pyperf's worker task index)."""

    @property
    def full(self) -> bool:
        return bool(self.args.workload == "full")

    def will_run(self) -> bool:
        """True in the one worker process that will run the next benchmark registered.

        Inputs are prepared only there: pyperf calls every ``bench_time_func`` in every
        process, and runs only one of them per worker.
        """
        args = self.args
        if not (args.worker or getattr(args, "in_process", False)):
            return False
        # pyperf numbers the benchmarks of a script in registration order and runs task
        # ``--worker-task`` in each worker; counting our own registrations gives that index.
        return args.worker_task is None or args.worker_task == self.registered

    def add(
        self,
        name: str,
        prepare: Callable[[], Prepared],
        *,
        inner_loops: int | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        """Register ``name@impl``; ``prepare`` runs only in the worker that measures it."""
        if self.args.only and not any(name.startswith(p) for p in self.args.only.split(",")):
            return
        md = dict(self.metadata)
        md.update(metadata or {})
        func: TimeFunc = _not_prepared
        if self.will_run():
            try:
                func, measured = prepare()
            except ImplUnavailable as e:
                # The parent already skipped it (see skip()); a worker cannot, so it fails loudly.
                raise SystemExit(f"{name}: {e}") from e
            md.update(measured)
        if inner_loops is not None and inner_loops > 1:
            self.runner.bench_time_func(f"{name}@{self.args.impl}", func, inner_loops=inner_loops, metadata=md)
        else:
            self.runner.bench_time_func(f"{name}@{self.args.impl}", func, metadata=md)
        self.registered += 1

    def skip(self, name: str, why: str) -> None:
        """Say (in the parent process only) that a benchmark is skipped, and why."""
        if not self.args.worker:
            print(f"SKIP {name}@{self.args.impl}: {why}", file=sys.stderr, flush=True)


def _not_prepared(loops: int) -> float:
    raise RuntimeError("benchmark inputs were not prepared in this process")


def make_bench(description: str, module: str, *, loops: int = 0, warmups: int | None = None) -> Bench:
    """A pyperf Runner with lookupdec's options, the implementation and the inputs; exits on errors."""

    def add_cmdline_args(cmd: list[str], args: argparse.Namespace) -> None:
        cmd.extend(["--impl", args.impl, "--workload", args.workload, "--data", args.data])
        if args.allow_interpreted:
            cmd.append("--allow-interpreted")
        if args.synthetic:
            cmd.append("--synthetic")
        if args.only:
            cmd.extend(["--only", args.only])

    kwargs: dict[str, Any] = {"add_cmdline_args": add_cmdline_args, "program_args": ("-m", module), "loops": loops}
    if warmups is not None:
        kwargs["warmups"] = warmups
    runner = pyperf.Runner(**kwargs)
    runner.argparser.description = description
    p = runner.argparser
    p.add_argument("--impl", choices=IMPLS, default="reference", help="implementation to measure")
    p.add_argument("--workload", choices=WORKLOADS, default="full", help="input sizes: fast (CI) or full")
    p.add_argument("--data", default=str(data_dir()), help="token files directory (default: ../shared/data)")
    p.add_argument("--synthetic", action="store_true", help="use the seeded synthetic corpus even if data exists")
    p.add_argument("--allow-interpreted", action="store_true", help="measure the fast path even if not compiled")
    p.add_argument("--only", default="", help="comma-separated name prefixes of the benchmarks to run")
    args = runner.parse_args()
    try:
        impl = load_impl(args.impl, args.allow_interpreted)
    except ImplUnavailable as e:
        print(f"ERROR: {e}", file=sys.stderr)
        raise SystemExit(2) from e
    src = corpus(args.data, args.synthetic)
    return Bench(runner, args, impl, src, base_metadata(impl, src, args.workload))


# --- helpers for measurements ----------------------------------------------------------------


def rss_bytes() -> int:
    """The resident set size of this process now (0 where unknown)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        pass
    try:
        import importlib

        psutil = importlib.import_module("psutil")  # optional, untyped; used where /proc is missing
        return int(psutil.Process().memory_info().rss)
    except Exception:
        return 0


def peak_rss_bytes() -> int:
    """The peak resident set size of this process so far (0 where unknown)."""
    try:
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    except (ImportError, OSError):
        return 0
    return int(peak) * (1 if sys.platform == "darwin" else 1024)


def static_keys(tokens: Sequence[int], n: int) -> list[tuple[int, int, int, int]]:
    """``n`` padded 2-gram keys taken from ``tokens`` at a fixed stride (hits and misses)."""
    step = max((len(tokens) - 2) // max(n, 1), 1)
    return [(tokens[i], tokens[i + 1], -1, -1) for i in range(0, step * n, step) if i + 1 < len(tokens)]
