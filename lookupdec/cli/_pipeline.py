"""The steps the subcommands share: choose an implementation, build, write, load, replay.

Loading goes through :mod:`lookupdec.formats` for what an implementation does not read
itself: the pure-Python reference reads only llama.cpp's legacy format, so other formats
reach it as canonical contents (``NgramCache.from_contents``), and a fork v1 file (no key
table) is opened as a ``formats.ForkStatic`` that either implementation drafts with.
"""

from __future__ import annotations

import os
import stat
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from types import ModuleType
from typing import Any

import lookupdec
from lookupdec.errors import UsageError, warn_saturated
from lookupdec.rules import INT32_MAX, check_corpus

ProgressCallback = Callable[[int, int], None]
"""``progress(done, total)``, called as work advances."""


@contextmanager
def progress_bar(enabled: bool, desc: str, unit: str = "tok") -> Iterator[ProgressCallback]:
    """A ``progress(done, total)`` callback drawing a tqdm bar on stderr, or a silent one when disabled.

    Never None: a compiled loop (the fast replay) runs no Python signal handler until it hands
    control back to the interpreter, so without a bar a Ctrl-C or ``kill`` waited for the whole
    replay (60 s for enwiki_wt.10M with the hybrid policy). Called once per chunk, an interpreted
    callback is where they run.
    """
    if not enabled:
        yield _silent
        return
    from tqdm import tqdm

    bar: Any = None

    def update(done: int, total: int) -> None:
        nonlocal bar
        if bar is None:
            bar = tqdm(total=total, desc=desc, unit=unit, unit_scale=True, file=sys.stderr, leave=False)
        bar.update(done - bar.n)

    try:
        yield update
    finally:
        if bar is not None:
            bar.close()


def _silent(done: int, total: int) -> None:
    """The progress callback without a bar: signal handlers run on entering it (see progress_bar)."""


def resolve_impl(name: str | None) -> ModuleType:
    """The implementation module to use: ``name``, or the one ``import lookupdec`` chose."""
    chosen = name or lookupdec.IMPLEMENTATION
    try:
        module = lookupdec.implementation(chosen)
    except ImportError as e:
        raise UsageError(f"the {chosen} implementation is not available here ({e})") from None
    if not hasattr(module, "replay"):
        raise UsageError(f"the {chosen} implementation is not available in this install")
    return module


def available_implementations() -> list[str]:
    """The implementations importable here, reference first."""
    names = ["reference"]
    try:
        resolve_impl("fast")
    except UsageError:
        pass
    else:
        names.append("fast")
    return names


def require_file(path: str, what: str) -> None:
    """UsageError unless ``path`` is an existing regular file (``what`` says which input it is).

    Checked with ``stat`` before anything opens it: opening a fifo would block forever, and a
    device (``/dev/null``, ``/dev/zero``) is not a file lookupdec can read as a cache or text.
    """
    from lookupdec._atomic import file_kind

    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise UsageError(f"{path}: no such file ({what})") from None
    if not stat.S_ISREG(mode):
        raise UsageError(f"{path}: is {file_kind(mode)}, not a regular file ({what})")


def load_cache(impl: ModuleType, path: str) -> Any:
    """A cache file of any enumerable format as ``impl``'s NgramCache (a fork v1 file raises)."""
    from lookupdec.formats import detect_format, read_as_contents

    if detect_format(path) == "llama":
        return impl.NgramCache.load(path)
    return impl.NgramCache.from_contents(read_as_contents(path))


def load_static(impl: ModuleType, path: str, *, in_memory: bool = False, verify: bool = False) -> Any:
    """Open a static cache file of any format for drafting with ``impl``.

    A lookupdec index opens in O(1) in both implementations, with the same header checks
    and the same per-lookup checks (the fast path's ``StaticIndex``, the reference's
    :class:`~lookupdec.formats.LookupdecIndexReader`), so a corrupt index gives the same
    error, or the same drafts, in both. The fast path opens every other format itself; the
    reference reads legacy files and gets fork v2 files as contents; a fork v1 file has no
    key table and stays a :class:`~lookupdec.formats.ForkStatic` for both. ``verify`` runs
    the format's full check first (for a lookupdec index: checksum and every rule).
    A 0-byte file is an error (a static cache is never empty: most likely a failed write).
    """
    # ForkStatic and LookupdecIndexReader only where used: their modules import numpy, which
    # the fast path's own index reader does without (it would weigh on a replay's peak RSS).
    from lookupdec.formats.detect import detect_format, refuse_empty_static

    require_file(path, "static cache, -lcs")
    if impl.IMPLEMENTATION != "reference":
        # It detects the format, refuses an empty file and opens an index on one open.
        return impl.load_static(path, in_memory=in_memory, verify=verify)
    refuse_empty_static(path)
    fmt = detect_format(path)
    if fmt == "fork-v1":
        from lookupdec.formats import ForkStatic

        return ForkStatic(path)
    if fmt == "lookupdec":
        from lookupdec.formats import LookupdecIndexReader

        reader = LookupdecIndexReader(path)
        if verify:
            reader.verify()
        return reader
    if fmt != "llama":
        return load_cache(impl, path)
    return impl.load_static(path, in_memory=in_memory, verify=verify)


def load_dynamic(impl: ModuleType, path: str | None) -> Any:
    """The dynamic cache at ``path``; a missing file (or no path) is an empty cache, as in llama.cpp."""
    if path is None or not os.path.exists(path):
        return impl.NgramCache()
    require_file(path, "dynamic cache, -lcd")
    return load_cache(impl, path)


def peak_rss_mb() -> float:
    """This process's peak resident set size in MB (``getrusage`` ``ru_maxrss``); 0 where unknown."""
    try:
        import resource
    except ImportError:  # pragma: no cover - Windows
        return 0.0
    rss = float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    return rss / 2**20 if sys.platform == "darwin" else rss / 2**10


def build_static_cache(
    impl: ModuleType, corpora: Sequence[Sequence[int]], progress: ProgressCallback | None = None
) -> Any:
    """The static cache of several corpora: each one's 2-grams counted separately, then added up.

    The same as ``build_static`` of each corpus merged together (no 2-gram spans two
    corpora), done in windows so that a progress bar can follow it.
    """
    cache = impl.NgramCache()
    ngram = int(impl.NGRAM_STATIC)
    total = sum(len(c) for c in corpora)
    done = 0
    step = 1 << 16
    for tokens in corpora:
        for start in range(0, len(tokens), step):
            end = min(start + step, len(tokens))
            window = tokens[max(start - ngram, 0) : end]
            cache.update(window, end - start, ngram, ngram)
            done += end - start
            if progress is not None:
                progress(done, total)
    return cache


def write_cache(cache: Any, path: str, fmt: str, vocab_size: int = 0, vocab_fingerprint: bytes = b"") -> None:
    """Write ``cache`` to ``path`` in ``fmt`` (``llama``, ``lookupdec`` or ``fork-v2``), atomically.

    ``llama`` holds any cache; the other two hold static caches (2-grams) only. The keys go
    to the writer in the cache's insertion order (first occurrence in the corpus), which is
    the order the fork's own create writes; the lookupdec index sorts them itself.
    """
    if fmt == "llama":
        cache.save(path)
        return
    sizes = ngram_sizes(cache.keys())
    if sizes and set(sizes) != {2}:
        raise UsageError(
            f"{path}: only a static cache (2-grams only) can be written as {fmt}; this cache has n-grams "
            f"of sizes {', '.join(map(str, sorted(sizes)))}; use --format llama"
        )
    from lookupdec.formats import write_static

    write_static(cache.items(), path, fmt, vocab_size=vocab_size, vocab_fingerprint=vocab_fingerprint)


def saturate_counts(impl: ModuleType, cache: Any, path: str) -> Any:
    """``cache``, or a copy with every count above 2^31-1 set to 2^31-1, and one warning naming ``path``.

    Merged counts can pass what any cache format holds (int32). The policy, the same for
    both implementations: saturate, warn once, write the file (``lookupdec merge`` exits 0).
    """
    if cache.total_count <= INT32_MAX:
        return cache  # no count can pass the sum of all counts (the fast path sums natively)
    n_over = sum(1 for _, part in cache.items() for c in part.values() if c > INT32_MAX)
    if not n_over:
        return cache
    warn_saturated(path, n_over, stacklevel=2)
    return impl.NgramCache.from_contents(
        (key, [(t, min(c, INT32_MAX)) for t, c in sorted(part.items())]) for key, part in cache.items()
    )


def ngram_sizes(keys: Iterable[Sequence[int]]) -> dict[int, int]:
    """How many of ``keys`` (padded 4-slot keys) are of each n-gram size (1..4)."""
    sizes: dict[int, int] = {}
    for key in keys:
        n = key_size(key)
        sizes[n] = sizes.get(n, 0) + 1
    return sizes


def key_size(key: Sequence[int]) -> int:
    """The n-gram size of a padded 4-slot key (trailing -1 slots are padding)."""
    n = len(key)
    while n > 1 and key[n - 1] == -1:
        n -= 1
    return n


def write_corpus_file(
    parts: Sequence[Sequence[int]], path: str, vocab_size: int = 0, vocab_fingerprint: bytes = b""
) -> Any:
    """Write the hybrid policy's corpus file of ``parts`` (one document each, -1 between them) to
    ``path`` (atomically) and return it opened (a ``lookupdec.fast.CorpusIndex``, in memory).

    Built by the fast path whatever the implementation in use (the file is the same for both;
    the reference reads its ids). Its size, the build's time and peak memory are in
    docs/performance.md ("The corpus file").
    """
    from array import array

    from lookupdec.fast import CorpusIndex

    ids = array("i")
    for k, part in enumerate(parts):
        if k:
            ids.append(-1)
        if isinstance(part, array) and part.typecode == "i":
            ids.extend(part)
        else:
            ids.extend(int(t) for t in part)
    corpus = CorpusIndex.from_tokens(ids, vocab_size, vocab_fingerprint or bytes(8))
    corpus.save(path)
    return corpus


def replay_stats(
    impl: ModuleType,
    tokens: Sequence[int],
    *,
    static: str | None = None,
    dynamic: str | None = None,
    n_ctx: int = 4096,
    n_draft: int = 8,
    in_memory: bool = False,
    verify: bool = False,
    progress: ProgressCallback | None = None,
    policy: str = "llama",
    corpus: Sequence[int] | str | None = None,
    branches: int = 1,
    target_waste: float | None = None,
) -> dict[str, Any]:
    """Load the caches, replay ``tokens`` like llama-lookup-stats, and return the ``stats --json`` fields.

    ``corpus`` (hybrid only): the path of a corpus file (memory-mapped; with ``in_memory``
    read into memory like the static file, by the fast path) or token ids (built in memory) the
    hybrid policy's history holds first (what ``Drafter(policy="hybrid", corpus=...)`` does; not
    timed in ``t_draft``: ``t_corpus_ms``). ``branches`` > 1 (hybrid only): tree drafts,
    ``n_drafted`` then counting the trees' distinct nodes (see ``replay``). ``target_waste``
    (hybrid only): the rejected drafted tokens per step the policy steers to (None: its default).
    """
    from lookupdec.formats import detect_format

    check_corpus(corpus, policy)
    t0 = time.perf_counter()
    nc_static = load_static(impl, static, in_memory=in_memory, verify=verify) if static is not None else None
    nc_dynamic = load_dynamic(impl, dynamic)
    t_load = time.perf_counter() - t0
    history = None
    t0 = time.perf_counter()
    if corpus is not None:
        history = impl.SuffixHistory()
        opener = getattr(impl, "CorpusIndex", None)  # the reference reads a corpus file's ids
        if in_memory and opener is not None and isinstance(corpus, (str, os.PathLike)):
            history.add_corpus(opener.open(corpus, in_memory=True))
        else:
            history.add_corpus(corpus)  # a path: mapped in O(1); ids: built in memory
    t_corpus = time.perf_counter() - t0
    corpus_tokens = history.corpus_tokens() if history is not None else None
    # Only the arguments given are passed: implementations without tree drafts or a waste
    # target (e.g. perf's peers) replay too.
    extra: dict[str, Any] = {}
    if branches > 1:
        extra["branches"] = branches
    if target_waste is not None:
        extra["target_waste"] = target_waste
    result = impl.replay(tokens, n_ctx, n_draft, nc_static, nc_dynamic, progress, policy, history, **extra)
    t_draft = result.t_draft_s
    return {
        "policy": result.policy,
        "branches": branches,
        "target_waste": target_waste,
        "n_tokens": result.n_tokens,
        "n_ctx": result.n_ctx,
        "n_draft": result.n_draft,
        "n_predict": result.n_predict,
        "n_drafted": result.n_drafted,
        "n_accept": result.n_accept,
        "accept": result.accept,
        "n_steps": result.n_steps,
        "tokens_per_step": result.tokens_per_step,
        "wasted_per_step": result.wasted_per_step,
        "us_per_step": 1e6 * t_draft / result.n_steps if result.n_steps else 0.0,
        "t_draft_ms": 1e3 * t_draft,
        "t_load_ms": 1e3 * t_load,
        "corpus_tokens": corpus_tokens,
        "t_corpus_ms": 1e3 * t_corpus if corpus is not None else None,
        "t_draft_flat_ms": 1e3 * t_load,
        "us_per_drafted_token": result.us_per_drafted_token,
        "tokens_per_second": result.n_drafted / t_draft if t_draft > 0 else 0.0,
        "impl": impl.IMPLEMENTATION,
        "compiled": bool(impl.COMPILED),
        "static": static,
        "static_format": detect_format(static) if static is not None else None,
        "static_in_memory": bool(in_memory) if static is not None else None,
        "dynamic": dynamic,
        "dynamic_found": dynamic is not None and os.path.exists(dynamic),
        "peak_rss_mb": peak_rss_mb(),
        "version": lookupdec.__version__,
    }
