"""The ``lookupdec`` command line, shaped like llama.cpp's lookup tools.

=================  ==========================================================
``create``         llama-lookup-create: build a static 2-gram cache from corpora
``stats``          llama-lookup-stats: replay a text, count drafted/accepted tokens
``merge``          llama-lookup-merge: add several caches into one
``inspect``        what a cache file holds (no llama.cpp counterpart)
``demo``           the whole pipeline on token data shipped with the package
=================  ==========================================================

Every error about the input ends the program with one line on stderr,
``lookupdec: error: <file>: <what> [at byte offset N]``, and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from types import ModuleType
from typing import Any, NoReturn, TextIO

import lookupdec
from lookupdec.errors import LookupdecError

EXIT_OK = 0
EXIT_ERROR = 2
"""Exit code of every usage or input error (like argparse's own)."""

STATIC_FORMATS = ("lookupdec", "llama", "fork-v2")
"""Formats ``create`` and ``merge`` can write."""
IMPLEMENTATIONS = ("reference", "fast")

ProgressCallback = Callable[[int, int], None]


# --------------------------------------------------------------------------------------
# errors and helpers


class UsageError(LookupdecError):
    """A problem with the command line or its inputs, reported as one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    """argparse with lookupdec's one-line error format."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"lookupdec: error: {message} (see '{self.prog} --help')\n")
        raise SystemExit(EXIT_ERROR)


def _format_error(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.filename is not None:
        reason = exc.strerror or str(exc)
        if isinstance(exc, FileNotFoundError):
            reason = "no such file"
        return f"{os.fspath(exc.filename)}: {reason}"
    return str(exc)


def _show_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: TextIO | None = None,
    line: str | None = None,
) -> None:
    sys.stderr.write(f"lookupdec: warning: {message}\n")


def _want_progress(args: argparse.Namespace) -> bool:
    return not getattr(args, "quiet", False) and sys.stderr.isatty()


@contextmanager
def progress_bar(enabled: bool, desc: str, unit: str = "tok") -> Iterator[ProgressCallback | None]:
    """A ``progress(done, total)`` callback drawing a tqdm bar on stderr, or None when disabled."""
    if not enabled:
        yield None
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


def _require_file(path: str, what: str) -> None:
    if not os.path.exists(path):
        raise UsageError(f"{path}: no such file ({what})")
    if os.path.isdir(path):
        raise UsageError(f"{path}: is a folder, not a file ({what})")


def load_static(impl: ModuleType, path: str, *, in_memory: bool = False) -> Any:
    """Open a static cache file of any format with ``impl`` (``impl.load_static`` when it has one)."""
    _require_file(path, "static cache, -lcs")
    loader = getattr(impl, "load_static", None)
    if loader is not None:
        return loader(path, in_memory=in_memory)
    return impl.NgramCache.load(path)


def load_dynamic(impl: ModuleType, path: str | None) -> Any:
    """The dynamic cache at ``path``; a missing file (or no path) is an empty cache, as in llama.cpp."""
    if path is None or not os.path.exists(path):
        return impl.NgramCache()
    _require_file(path, "dynamic cache, -lcd")
    return impl.NgramCache.load(path)


def peak_rss_mb() -> float:
    """This process's peak resident set size in MB (``getrusage`` ``ru_maxrss``); 0 where unknown."""
    try:
        import resource
    except ImportError:  # pragma: no cover - Windows
        return 0.0
    rss = float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    return rss / 2**20 if sys.platform == "darwin" else rss / 2**10


def _load_input(args: argparse.Namespace, path: str) -> list[int]:
    from lookupdec.tokens import load_tokens

    arr = load_tokens(path, tokens=args.tokens, tokenizer=args.tokenizer, add_bos=args.add_bos)
    result: list[int] = arr.tolist()
    return result


def _mb(n_bytes: int) -> str:
    return f"{n_bytes / 1e6:.2f} MB"


# --------------------------------------------------------------------------------------
# building and writing static caches


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
    from lookupdec import formats

    writer = getattr(formats, "write_static", None)
    if writer is None:
        raise UsageError(f"writing the {fmt} format is not available in this build of lookupdec")
    writer(cache.items(), path, fmt, vocab_size=vocab_size, vocab_fingerprint=vocab_fingerprint)


def ngram_sizes(keys: Iterable[Sequence[int]]) -> dict[int, int]:
    """How many of ``keys`` (padded 4-slot keys) are of each n-gram size (1..4)."""
    sizes: dict[int, int] = {}
    for key in keys:
        n = _key_size(key)
        sizes[n] = sizes.get(n, 0) + 1
    return sizes


def _key_size(key: Sequence[int]) -> int:
    n = len(key)
    while n > 1 and key[n - 1] == -1:
        n -= 1
    return n


# --------------------------------------------------------------------------------------
# subcommands


def cmd_create(args: argparse.Namespace) -> int:
    """``lookupdec create``: build a static cache (llama-lookup-create)."""
    impl = resolve_impl(args.impl)
    for path in args.corpus:
        _require_file(path, "corpus")
    t0 = time.perf_counter()
    corpora = [_load_input(args, path) for path in args.corpus]
    t_read = time.perf_counter() - t0
    vocab_size, fingerprint = 0, b""
    if args.tokenizer is not None:
        from lookupdec.tokens import vocab_info

        vocab_size, fingerprint = vocab_info(args.tokenizer)
    if args.vocab_size is not None:
        vocab_size = args.vocab_size
    t0 = time.perf_counter()
    with progress_bar(_want_progress(args), "create") as progress:
        cache = build_static_cache(impl, corpora, progress)
    t_build = time.perf_counter() - t0
    t0 = time.perf_counter()
    write_cache(cache, args.output, args.format, vocab_size=vocab_size, vocab_fingerprint=fingerprint)
    t_write = time.perf_counter() - t0
    if not args.quiet:
        n_tokens = sum(len(c) for c in corpora)
        print(
            f"{args.output}: {args.format} static cache, {len(cache):,} 2-grams, {cache.n_entries:,} entries, "
            f"{_mb(os.path.getsize(args.output))}, from {n_tokens:,} tokens in {len(corpora)} "
            f"corpus file{'s' if len(corpora) != 1 else ''} "
            f"(read {t_read:.2f} s, count {t_build:.2f} s, write {t_write:.2f} s; impl {impl.IMPLEMENTATION})"
        )
    return EXIT_OK


def replay_stats(
    impl: ModuleType,
    tokens: Sequence[int],
    *,
    static: str | None = None,
    dynamic: str | None = None,
    n_ctx: int = 4096,
    n_draft: int = 8,
    in_memory: bool = False,
    progress: ProgressCallback | None = None,
    policy: str = "llama",
) -> dict[str, Any]:
    """Load the caches, replay ``tokens`` like llama-lookup-stats, and return the ``stats --json`` fields."""
    from lookupdec.formats import detect_format

    t0 = time.perf_counter()
    nc_static = load_static(impl, static, in_memory=in_memory) if static is not None else None
    nc_dynamic = load_dynamic(impl, dynamic)
    t_load = time.perf_counter() - t0
    result = impl.replay(tokens, n_ctx, n_draft, nc_static, nc_dynamic, progress, policy)
    t_draft = result.t_draft_s
    return {
        "policy": result.policy,
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


def cmd_stats(args: argparse.Namespace) -> int:
    """``lookupdec stats``: replay a text (llama-lookup-stats)."""
    if args.n_ctx < 1:
        raise UsageError(f"-c/--ctx-size must be >= 1, got {args.n_ctx}")
    if args.n_draft < 0:
        raise UsageError(f"--n-draft must be >= 0, got {args.n_draft}")
    impl = resolve_impl(args.impl)
    _require_file(args.replay, "replay text")
    if args.static is not None:
        _require_file(args.static, "static cache, -lcs")
    tokens = _load_input(args, args.replay)
    with progress_bar(_want_progress(args), "replay") as progress:
        stats = replay_stats(
            impl,
            tokens,
            static=args.static,
            dynamic=args.dynamic,
            n_ctx=args.n_ctx,
            n_draft=args.n_draft,
            in_memory=args.load,
            progress=progress,
            policy=args.policy,
        )
    stats["replay"] = args.replay
    if args.json:
        print(json.dumps(stats, sort_keys=False))
        return EXIT_OK
    us = stats["us_per_drafted_token"]
    print(f"n_draft      = {stats['n_draft']}")
    print(f"n_predict    = {stats['n_predict']}")
    print(f"n_drafted    = {stats['n_drafted']}")
    print(f"t_draft_flat = {stats['t_draft_flat_ms']:.2f} ms")
    print(
        f"t_draft      = {stats['t_draft_ms']:.2f} ms, {us:.2f} us per token, "
        f"{stats['tokens_per_second']:.2f} tokens per second"
    )
    print(f"n_accept     = {stats['n_accept']}")
    print(f"accept       = {stats['accept']:.3f}%")
    print(
        f"impl         = {stats['impl']} (compiled: {'yes' if stats['compiled'] else 'no'}), "
        f"peak RSS {stats['peak_rss_mb']:.1f} MB"
    )
    print(
        f"policy       = {stats['policy']}: {stats['n_steps']} steps, {stats['tokens_per_step']:.4f} tokens "
        f"per step, {stats['wasted_per_step']:.3f} wasted drafts per step"
    )
    return EXIT_OK


def cmd_merge(args: argparse.Namespace) -> int:
    """``lookupdec merge``: add caches together (llama-lookup-merge)."""
    impl = resolve_impl(args.impl)
    for path in args.inputs:
        _require_file(path, "cache to merge")
    merged = impl.NgramCache()
    for path in args.inputs:
        merged.merge(impl.NgramCache.load(path))
    write_cache(merged, args.output, args.format)
    if not args.quiet:
        print(
            f"{args.output}: {args.format} cache, {len(merged):,} keys, {merged.n_entries:,} entries, "
            f"{_mb(os.path.getsize(args.output))}, merged from {len(args.inputs)} file"
            f"{'s' if len(args.inputs) != 1 else ''}"
        )
    return EXIT_OK


def _heaviest(path: str, top: int) -> list[dict[str, Any]]:
    """The ``top`` heaviest n-grams of any enumerable cache file, by total count (ties: smaller key)."""
    from lookupdec.reference import NgramCache

    cache = NgramCache.load(path)
    weighted = sorted(((sum(part.values()), key, part) for key, part in cache.items()), key=lambda x: (-x[0], x[1]))
    return [
        {
            "ngram": list(key[: _key_size(key)]),
            "total": total,
            "n_followers": len(part),
            "top_followers": [list(tc) for tc in sorted(part.items(), key=lambda tc: (-tc[1], tc[0]))[:5]],
        }
        for total, key, part in weighted[:top]
    ]


def _kind(sizes: dict[int, int]) -> str:
    if not sizes:
        return "empty"
    if set(sizes) == {2}:
        return "static (2-grams only)"
    return f"dynamic or context (n-grams of sizes {', '.join(map(str, sorted(sizes)))})"


def inspect_cache(path: str, top: int = 10, verify: bool = False) -> dict[str, Any]:
    """What ``lookupdec inspect`` reports about a cache file, as a JSON-ready dict.

    Built on :func:`lookupdec.formats.inspect_file`; ``verify`` runs the full check of the
    format (for the lookupdec index: the checksum and every structural rule; for a legacy
    file: trailing bytes become an error) and raises :class:`CacheFormatError` on failure.
    """
    from lookupdec import formats

    _require_file(path, "cache file")
    raw = formats.inspect_file(path, verify=verify)
    for message in raw.get("warnings") or []:
        warnings.warn(message, stacklevel=2)
    sizes = {int(n): int(c) for n, c in (raw.get("key_sizes") or {}).items() if c}
    n_keys = int(raw["n_keys"])
    n_entries = int(raw["n_entries"])
    info: dict[str, Any] = {
        "file": path,
        "format": raw["format"],
        "file_bytes": int(raw["file_size"]),
        "kind": _kind(sizes),
        "n_keys": n_keys,
        "keys_by_ngram_size": {str(n): sizes[n] for n in sorted(sizes)},
        "n_entries": n_entries,
        "mean_followers": n_entries / n_keys if n_keys else 0.0,
        "total_count": int(raw["total_count"]),
        "verified": bool(raw.get("verified")),
        "details": raw.get("details") or {},
    }
    rows = raw.get("top")
    if rows is None:
        info["heaviest"] = None  # a fork v1 file cannot be enumerated
    elif top <= len(rows) or len(rows) >= n_keys:
        info["heaviest"] = [
            {
                "ngram": [int(t) for t in r["ngram"]],
                "total": int(r["total"]),
                "n_followers": int(r["n_followers"]),
                "top_followers": [[int(t), int(c)] for t, c in r["followers"]],
            }
            for r in rows[:top]
        ]
    else:
        info["heaviest"] = _heaviest(path, top)
    return info


def cmd_inspect(args: argparse.Namespace) -> int:
    """``lookupdec inspect``: describe a cache file."""
    if args.top < 0:
        raise UsageError(f"--top must be >= 0, got {args.top}")
    info = inspect_cache(args.file, top=args.top, verify=args.verify)
    if args.json:
        print(json.dumps(info))
        return EXIT_OK
    rows = [
        ("file", info["file"]),
        ("format", info["format"]),
        ("kind", info["kind"]),
        ("file size", f"{info['file_bytes']:,} bytes ({_mb(info['file_bytes'])})"),
        (
            "keys",
            f"{info['n_keys']:,}  (by n-gram size: "
            + (", ".join(f"{n}: {c:,}" for n, c in info["keys_by_ngram_size"].items()) or "none")
            + ")",
        ),
        ("entries", f"{info['n_entries']:,} (key, follower) pairs, {info['mean_followers']:.2f} per key"),
        ("total count", f"{info['total_count']:,} observations"),
    ]
    for name, value in info["details"].items():
        rows.append((name.replace("_", " "), f"{value:,}" if isinstance(value, int) else str(value)))
    if args.verify:
        rows.append(("verify", "ok (every check of the format passed)"))
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    if info["heaviest"] is None:
        print("\nheaviest n-grams: not available (a fork v1 file has no key table)")
    elif info["heaviest"]:
        print("\nheaviest n-grams (by total count; top followers as token x count):")
        print(f"  {'rank':>4}  {'n-gram':<28} {'total':>11} {'followers':>9}  top followers")
        for rank, h in enumerate(info["heaviest"], 1):
            ngram = " ".join(str(t) for t in h["ngram"])
            tops = ", ".join(f"{t}x{c}" for t, c in h["top_followers"])
            print(f"  {rank:>4}  {ngram:<28} {h['total']:>11,} {h['n_followers']:>9,}  {tops}")
    return EXIT_OK


def cmd_demo(args: argparse.Namespace) -> int:
    """``lookupdec demo``: the pipeline on the shipped data."""
    from lookupdec.demo import run_demo

    impls = [args.impl] if args.impl else None
    if impls:
        resolve_impl(impls[0])
    run_demo(impls=impls, n_ctx=args.n_ctx, n_draft=args.n_draft, progress=_want_progress(args), as_json=args.json)
    return EXIT_OK


# --------------------------------------------------------------------------------------
# the parser


def _version_text() -> str:
    return f"lookupdec {lookupdec.__version__} (compiled: {'yes' if lookupdec.COMPILED else 'no'})"


def _add_input_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("input (token files or text)")
    kind = g.add_mutually_exclusive_group()
    kind.add_argument(
        "--tokens",
        action="store_true",
        help="inputs are token files: raw little-endian int32 ids, or .npy by extension "
        "(the default for names ending in .bin or .npy); used as they are, no BOS added",
    )
    kind.add_argument(
        "--tokenizer",
        metavar="T",
        help="inputs are UTF-8 text, tokenized with this Hugging Face tokenizer.json",
    )
    g.add_argument(
        "--add-bos",
        dest="add_bos",
        action="store_true",
        default=None,
        help="with --tokenizer: always put the BOS token in front. By default the tokenizer's own "
        "post-processor decides, as llama.cpp's add_special=true does (Llama 3 adds one)",
    )
    g.add_argument("--no-add-bos", dest="add_bos", action="store_false", help="with --tokenizer: add no special tokens")


def _add_impl_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--impl",
        choices=IMPLEMENTATIONS,
        help=f"implementation to run (default: {lookupdec.IMPLEMENTATION}, what 'import lookupdec' chose)",
    )


def _add_command(
    sub: Any, name: str, *, summary: str, description: str, examples: str, func: Callable[[argparse.Namespace], int]
) -> argparse.ArgumentParser:
    """Add subcommand ``name`` with its description and an ``examples:`` epilog."""
    p: argparse.ArgumentParser = sub.add_parser(
        name,
        help=summary,
        description=textwrap.fill(description, 79, break_on_hyphens=False),
        epilog="examples:\n" + textwrap.indent(textwrap.dedent(examples).strip("\n"), "  "),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    p.set_defaults(func=func)
    return p


def _add_replay_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "-c", "--ctx-size", dest="n_ctx", type=int, default=4096, metavar="N_CTX", help="chunk length (default 4096)"
    )
    p.add_argument(
        "--n-draft", "--draft", dest="n_draft", type=int, default=8, metavar="N",
        help="most tokens drafted per step (default 8)",
    )  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``lookupdec`` command (all subcommands)."""
    parser = _Parser(
        prog="lookupdec",
        description=textwrap.fill(
            "n-gram (prompt lookup) speculative drafting, compatible with llama.cpp's lookup caches and tools "
            "(llama-lookup-create, -stats, -merge). Same counts as llama.cpp on the same tokens.",
            79,
            break_on_hyphens=False,
        ),
        epilog="examples:\n"
        "  lookupdec demo\n"
        "  lookupdec create enwiki.llama3.bin -o static.lkdc\n"
        "  lookupdec stats --tokens wiki.test.raw.llama3.bin -lcs static.lkdc --json\n"
        "  lookupdec inspect static.lkdc --verify\n\n"
        "run 'lookupdec COMMAND --help' for each command's options.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    parser.add_argument("--version", action="version", version=_version_text())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    p = _add_command(
        sub,
        "create",
        summary="build a static 2-gram cache from corpora (llama-lookup-create)",
        description="Build a static cache: every 2-gram of the corpora with the counts of the tokens that "
        "follow it. Mirrors llama.cpp's llama-lookup-create (-f CORPUS -lcs STATIC). Several corpora are "
        "counted separately (no 2-gram spans two files) and added up, as merging their caches would. "
        "Formats: lookupdec (static index that opens in constant time; the default), llama (llama.cpp's "
        "legacy file, what -lcs of llama-lookup and llama-lookup-stats reads), fork-v2 (the optimized fork's).",
        examples="""
            lookupdec create enwiki_wt.10M.llama3.bin -o enwiki.lkdc
            lookupdec create a.bin b.npy -o static.bin --format llama      # llama.cpp's own format
            lookupdec create corpus.txt --tokenizer tokenizer.json -o static.lkdc
            """,
        func=cmd_create,
    )
    p.add_argument("corpus", nargs="+", metavar="CORPUS", help="token file(s) or text file(s)")
    p.add_argument("-o", "--output", required=True, metavar="STATIC", help="the static cache file to write")
    p.add_argument("--format", choices=STATIC_FORMATS, default="lookupdec", help="file format (default: lookupdec)")
    p.add_argument(
        "--vocab-size", type=int, metavar="N", help="vocabulary size to record (default: from --tokenizer, else 0)"
    )
    _add_input_options(p)
    _add_impl_option(p)
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar and no summary line")

    p = _add_command(
        sub,
        "stats",
        summary="replay a text and count drafted/accepted tokens (llama-lookup-stats)",
        description="Replay a text as llama.cpp's llama-lookup-stats does: cut it into chunks of N_CTX tokens, "
        "generate each chunk token by token with the text as ground truth, draft up to N_DRAFT tokens after "
        "every token from the context, dynamic and static caches, and count the drafted and accepted "
        "tokens. The context cache is merged into the dynamic cache after every chunk (the dynamic file is "
        "never written). Same flags as llama.cpp: -lcs, -lcd, -c; llama.cpp's equivalent is "
        "'llama-lookup-stats -m MODEL -f TEXT -lcs STATIC -lcd DYNAMIC -c 4096 --draft 8'.",
        examples="""
            lookupdec stats wiki.test.raw.llama3.bin
            lookupdec stats --tokens wiki.test.raw.llama3.bin -lcs enwiki.lkdc -c 4096 --n-draft 8
            lookupdec stats wiki.test.raw --tokenizer tokenizer.json -lcs static.bin --json
            lookupdec stats wiki.test.raw.llama3.bin -lcs enwiki.lkdc --policy hybrid --json
            """,
        func=cmd_stats,
    )
    p.add_argument("replay", metavar="REPLAY", help="the text to replay (token file or text)")
    p.add_argument(
        "-lcs", "--lookup-cache-static", dest="static", metavar="STATIC",
        help="static cache file, any format (lookupdec, llama, fork-v1/v2; detected); must exist",
    )  # fmt: skip
    p.add_argument(
        "-lcd", "--lookup-cache-dynamic", dest="dynamic", metavar="DYNAMIC",
        help="dynamic cache file (llama format); a missing file is an empty cache, as in llama.cpp",
    )  # fmt: skip
    _add_replay_options(p)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of llama.cpp's lines")
    p.add_argument(
        "--policy", choices=("llama", "hybrid"), default="llama",
        help="drafting policy: 'llama' is llama.cpp's rule, exactly (default); 'hybrid' continues its drafts "
        "with the longest suffix match over the chunks replayed so far (more tokens per step, more drafted; "
        "see README 'The hybrid policy')",
    )  # fmt: skip
    p.add_argument(
        "--load", action="store_true",
        help="copy the static file into memory instead of memory-mapping it (fastest lookups, slower open)",
    )  # fmt: skip
    _add_input_options(p)
    _add_impl_option(p)
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")

    p = _add_command(
        sub,
        "merge",
        summary="add several caches into one (llama-lookup-merge)",
        description="Add the counts of several cache files into one, like llama.cpp's llama-lookup-merge "
        "(which takes IN... OUT). Inputs may be in any format; the output is llama.cpp's legacy format "
        "unless --format says otherwise (lookupdec and fork-v2 hold static caches only).",
        examples="""
            lookupdec merge dynamic-1.bin dynamic-2.bin -o dynamic.bin
            lookupdec merge part-a.lkdc part-b.lkdc -o static.lkdc --format lookupdec
            """,
        func=cmd_merge,
    )
    p.add_argument("inputs", nargs="+", metavar="IN", help="cache files to add together")
    p.add_argument("-o", "--output", required=True, metavar="OUT", help="the cache file to write")
    p.add_argument("--format", choices=STATIC_FORMATS, default="llama", help="file format (default: llama)")
    _add_impl_option(p)
    p.add_argument("-q", "--quiet", action="store_true", help="no summary line")

    p = _add_command(
        sub,
        "inspect",
        summary="describe a cache file: kind, sizes, counts, heaviest n-grams",
        description="Describe a cache file of any format: its format and kind (static 2-grams, or a "
        "dynamic/context cache of 1..4-grams), file size, key and follower counts, and the heaviest "
        "n-grams. No llama.cpp counterpart. --verify runs the full integrity check (for the lookupdec "
        "format: the checksum and every structural rule, which opening the file skips).",
        examples="""
            lookupdec inspect enwiki.lkdc
            lookupdec inspect dynamic.bin --top 20
            lookupdec inspect static.lkdc --verify --json
            """,
        func=cmd_inspect,
    )
    p.add_argument("file", metavar="FILE", help="cache file (lookupdec, llama, fork-v1 or fork-v2)")
    p.add_argument("--verify", action="store_true", help="full integrity check (strict: trailing bytes are errors)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--top", type=int, default=10, metavar="N", help="how many heaviest n-grams to list (default 10)")

    p = _add_command(
        sub,
        "demo",
        summary="build a static cache and replay a text from data shipped with lookupdec",
        description="The main job on real data shipped with the package (Llama-3 token ids of English "
        "Wikipedia text; see lookupdec/data/README.md): build a static cache from the shipped corpus in a "
        "temporary folder, replay the shipped WikiText test slice with and without it, for each "
        "implementation present, and print acceptance, drafted and accepted tokens, time per drafted "
        "token and static load time. Like running llama-lookup-create, then llama-lookup-stats twice.",
        examples="""
            lookupdec demo
            lookupdec demo --impl reference
            lookupdec demo --json
            """,
        func=cmd_demo,
    )
    _add_impl_option(p)
    _add_replay_options(p)
    p.add_argument("--json", action="store_true", help="print the rows as one JSON object")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``lookupdec`` command with ``argv`` (default: ``sys.argv[1:]``); return the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help, --version, usage errors
        return e.code if isinstance(e.code, int) else (EXIT_OK if e.code is None else EXIT_ERROR)
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_ERROR
    debug = os.environ.get("LOOKUPDEC_DEBUG") == "1"
    old_showwarning = warnings.showwarning
    warnings.showwarning = _show_warning
    try:
        code: int = args.func(args)
        return code
    except BrokenPipeError:  # e.g. 'lookupdec inspect x | head'
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK
    except (LookupdecError, OSError, ValueError) as e:
        if debug:
            raise
        sys.stderr.write(f"lookupdec: error: {_format_error(e)}\n")
        return EXIT_ERROR
    except KeyboardInterrupt:
        sys.stderr.write("lookupdec: interrupted\n")
        return 130
    finally:
        warnings.showwarning = old_showwarning


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
