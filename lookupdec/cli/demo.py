"""``lookupdec demo``: build a static cache and replay a text, from token data shipped with lookupdec.

The data (``lookupdec/data/``, see its README): a 367,182-token prefix of English Wikipedia
text in WikiText layout as the static corpus, and the first 67,716 tokens of the WikiText
test split as the replay text, both Llama-3 token ids.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TextIO

from lookupdec.cli import _pipeline as steps
from lookupdec.cli._common import (
    EXIT_OK,
    add_command,
    add_impl_option,
    add_replay_options,
    check_replay_options,
    want_progress,
)

CORPUS_FILE = "enwiki_wt.demo.llama3.bin"
"""Shipped static corpus: the first 367,182 tokens of ``enwiki_wt.10M.llama3.bin``."""
REPLAY_FILE = "wiki.test.demo.llama3.bin"
"""Shipped replay text: the first 67,716 tokens of ``wiki.test.raw.llama3.bin``."""


@dataclass(frozen=True)
class DemoRow:
    """One replay of the demo: an implementation, with or without the static cache."""

    impl: str
    compiled: bool
    static: bool
    n_drafted: int
    n_accept: int
    accept: float
    us_per_drafted_token: float
    t_draft_ms: float
    t_load_ms: float


@contextmanager
def data_file(name: str) -> Iterator[Path]:
    """A real file system path to a file shipped in ``lookupdec/data`` (works from a zip too)."""
    from importlib import resources  # here, not at the top: it imports tempfile, which other commands do without

    with resources.as_file(resources.files("lookupdec") / "data" / name) as path:
        yield Path(path)


def _impl_label(impl: str, compiled: bool) -> str:
    if impl == "fast":
        return f"fast ({'compiled' if compiled else 'interpreted'})"
    return impl


def run_demo(
    impls: Sequence[str] | None = None,
    n_ctx: int = 4096,
    n_draft: int = 8,
    progress: bool = False,
    as_json: bool = False,
    out: TextIO | None = None,
) -> list[DemoRow]:
    """Run the demo for ``impls`` (default: every implementation present) and print the table to ``out``."""
    import tempfile  # here, not at the top: other commands do without it

    from lookupdec.tokens import read_tokens

    stream = out if out is not None else sys.stdout
    names = list(impls) if impls else steps.available_implementations()
    mu = "µs" if (getattr(stream, "encoding", None) or "").lower().replace("-", "") == "utf8" else "us"

    def say(text: str = "") -> None:
        if not as_json:
            print(text, file=stream, flush=True)

    with data_file(CORPUS_FILE) as corpus_path, data_file(REPLAY_FILE) as replay_path:
        corpus = read_tokens(corpus_path).tolist()
        replay_tokens = read_tokens(replay_path).tolist()
    from lookupdec import __version__

    say(f"lookupdec {__version__} demo: n-gram (prompt lookup) drafting on shipped Llama-3 token data")
    say(f"  static corpus  {CORPUS_FILE}  {len(corpus):>9,} tokens  English Wikipedia, WikiText layout")
    say(f"  replay text    {REPLAY_FILE}  {len(replay_tokens):>9,} tokens  WikiText test split, first articles")
    say(f"  settings       n_ctx {n_ctx}, n_draft {n_draft} (as llama-lookup-stats -c {n_ctx} --draft {n_draft})")

    rows: list[DemoRow] = []
    build: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="lookupdec-demo-") as tmp:
        fmt = "lookupdec"
        static_path = os.path.join(tmp, "static.lkdc")
        candidates = [steps.resolve_impl(name) for name in names]
        builder = next((m for m in candidates if m.COMPILED), candidates[0])  # the compiled one counts fastest
        t0 = time.perf_counter()
        with steps.progress_bar(progress, "create") as bar:
            cache = steps.build_static_cache(builder, [corpus], bar)
        steps.write_cache(cache, static_path, fmt)
        t_create = time.perf_counter() - t0
        build = {
            "format": fmt,
            "n_keys": len(cache),
            "n_entries": cache.n_entries,
            "file_bytes": os.path.getsize(static_path),
            "create_s": t_create,
            "impl": builder.IMPLEMENTATION,
        }
        del cache
        say(
            f"  static cache   {build['n_keys']:,} 2-grams, {build['n_entries']:,} entries, {fmt} format, "
            f"{build['file_bytes'] / 1e6:.2f} MB, created in {t_create:.2f} s ({build['impl']})"
        )
        say()
        for name in names:
            impl = steps.resolve_impl(name)
            for use_static in (False, True):
                label = f"{_impl_label(name, bool(impl.COMPILED))}, {'static' if use_static else 'no static'}"
                with steps.progress_bar(progress, label) as bar:
                    stats = steps.replay_stats(
                        impl,
                        replay_tokens,
                        static=static_path if use_static else None,
                        n_ctx=n_ctx,
                        n_draft=n_draft,
                        progress=bar,
                    )
                rows.append(
                    DemoRow(
                        impl=name,
                        compiled=bool(impl.COMPILED),
                        static=use_static,
                        n_drafted=stats["n_drafted"],
                        n_accept=stats["n_accept"],
                        accept=stats["accept"],
                        us_per_drafted_token=stats["us_per_drafted_token"],
                        t_draft_ms=stats["t_draft_ms"],
                        t_load_ms=stats["t_load_ms"],
                    )
                )
    agree = all(
        (r.n_drafted, r.n_accept) == (q.n_drafted, q.n_accept) for r in rows for q in rows if r.static == q.static
    )
    if as_json:
        doc = {
            "corpus_tokens": len(corpus),
            "replay_tokens": len(replay_tokens),
            "n_ctx": n_ctx,
            "n_draft": n_draft,
            "static_cache": build,
            "rows": [asdict(r) for r in rows],
            "implementations_agree": agree,
        }
        print(json.dumps(doc), file=stream)
        return rows
    header = (
        f"{'implementation':<22} {'static':<8} {'accept %':>8} {'drafted':>9} {'accepted':>9} "
        f"{mu + '/drafted':>12} {'load ms':>9}"
    )
    say(header)
    say("-" * len(header))
    for r in rows:
        load = f"{r.t_load_ms:9.1f}" if r.static else f"{'-':>9}"
        say(
            f"{_impl_label(r.impl, r.compiled):<22} {'corpus' if r.static else 'none':<8} {r.accept:8.2f} "
            f"{r.n_drafted:>9,} {r.n_accept:>9,} {r.us_per_drafted_token:>12.2f} {load}"
        )
    say()
    say(f"{mu}/drafted = time of the draft calls and context-cache updates per drafted token (llama.cpp t_draft).")
    if len(names) > 1:
        say(f"implementations agree on every drafted and accepted count: {'yes' if agree else 'NO'}")
    fastest = {r.impl: r.us_per_drafted_token for r in rows if r.static}
    if "fast" in fastest and "reference" in fastest and fastest["fast"] > 0:
        say(f"fast path speed-up per drafted token (with static): {fastest['reference'] / fastest['fast']:.1f}x")
    return rows


def cmd_demo(args: argparse.Namespace) -> int:
    """``lookupdec demo``: the pipeline on the shipped data."""
    check_replay_options(args)
    impls = [args.impl] if args.impl else None
    if impls:
        steps.resolve_impl(impls[0])
    run_demo(impls=impls, n_ctx=args.n_ctx, n_draft=args.n_draft, progress=want_progress(args), as_json=args.json)
    return EXIT_OK


def add_parser(sub: Any) -> None:
    """Add ``demo`` and its options to the subparsers ``sub``."""
    p = add_command(
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
    add_impl_option(p)
    add_replay_options(p)
    p.add_argument("--json", action="store_true", help="print the rows as one JSON object")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
