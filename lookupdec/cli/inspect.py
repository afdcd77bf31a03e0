"""``lookupdec inspect``: describe a cache file (kind, sizes, counts, heaviest n-grams) or a corpus file."""

from __future__ import annotations

import argparse
import json
import warnings
from typing import Any

from lookupdec.cli._common import EXIT_OK, add_command, mb
from lookupdec.cli._pipeline import require_file
from lookupdec.errors import UsageError


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
    from lookupdec.formats.corpus import is_corpus_file

    require_file(path, "cache file")
    if is_corpus_file(path):
        return inspect_corpus(path, verify=verify)
    raw = formats.inspect_file(path, verify=verify, top=top)
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
    else:
        info["heaviest"] = [
            {
                "ngram": [int(t) for t in r["ngram"]],
                "total": int(r["total"]),
                "n_followers": int(r["n_followers"]),
                "top_followers": [[int(t), int(c)] for t, c in r["followers"]],
            }
            for r in rows
        ]
    return info


CORPUS_KIND = "corpus file (the hybrid policy's corpus: stats --corpus, Drafter(corpus=...))"


def inspect_corpus(path: str, verify: bool = False) -> dict[str, Any]:
    """What ``lookupdec inspect`` reports about a corpus file (``create --corpus-out``), as a dict.

    Its header, checked in constant time; ``verify`` also runs the full check (the checksum,
    and every section equal to what the ids give) and raises :class:`CacheFormatError` on failure.
    """
    from lookupdec.formats.corpus import read_corpus_header

    h = read_corpus_header(path)
    if verify:
        # The compiled CorpusIndex holds the only full check (the reference reads the ids alone).
        from lookupdec.fast import CorpusIndex

        with CorpusIndex.open(path) as corpus:
            corpus.verify()
    return {
        "file": path,
        "format": "corpus",
        "file_bytes": h.file_size,
        "kind": CORPUS_KIND,
        "version": h.version,
        "n_tokens": h.n_tokens,
        "n_bigrams": h.n_bigrams,
        "vocab_size": h.vocab_size,
        "vocab_fingerprint": h.vocab_fingerprint.hex(),
        "verified": verify,
    }


def _corpus_rows(info: dict[str, Any]) -> list[tuple[str, str]]:
    vocab = f"{info['vocab_size']:,} ids" if info["vocab_size"] else "not recorded (made without --tokenizer)"
    fingerprint = info["vocab_fingerprint"]
    return [
        ("file", info["file"]),
        ("format", f"corpus, version {info['version']}"),
        ("kind", info["kind"]),
        ("file size", f"{info['file_bytes']:,} bytes ({mb(info['file_bytes'])})"),
        ("tokens", f"{info['n_tokens']:,} (ids, -1 between documents)"),
        ("bigrams", f"{info['n_bigrams']:,} distinct"),
        ("vocabulary", vocab),
        ("fingerprint", fingerprint if fingerprint.strip("0") else "not recorded"),
    ]


def cmd_inspect(args: argparse.Namespace) -> int:
    """``lookupdec inspect``: describe a cache file or a corpus file."""
    if args.top < 0:
        raise UsageError(f"--top must be >= 0, got {args.top}")
    info = inspect_cache(args.file, top=args.top, verify=args.verify)
    if args.json:
        print(json.dumps(info))
        return EXIT_OK
    if info["format"] == "corpus":
        rows = _corpus_rows(info)
        if args.verify:
            rows.append(("verify", "ok (the checksum, and every section equal to what the ids give)"))
        _print_rows(rows)
        return EXIT_OK
    rows = [
        ("file", info["file"]),
        ("format", info["format"]),
        ("kind", info["kind"]),
        ("file size", f"{info['file_bytes']:,} bytes ({mb(info['file_bytes'])})"),
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
    _print_rows(rows)
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


def _print_rows(rows: list[tuple[str, str]]) -> None:
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")


def add_parser(sub: Any) -> None:
    """Add ``inspect`` and its options to the subparsers ``sub``."""
    p = add_command(
        sub,
        "inspect",
        summary="describe a cache file: kind, sizes, counts, heaviest n-grams",
        description="Describe a cache file of any format: its format and kind (static 2-grams, or a "
        "dynamic/context cache of 1..4-grams), file size, key and follower counts, and the heaviest "
        "n-grams. No llama.cpp counterpart. --verify runs the full integrity check (for the lookupdec "
        "format: the checksum and every structural rule, which opening the file skips). A corpus file "
        "(create --corpus-out) is described too: its tokens, bigrams and recorded vocabulary.",
        examples="""
            lookupdec inspect enwiki.lkdc
            lookupdec inspect dynamic.bin --top 20
            lookupdec inspect static.lkdc --verify --json
            lookupdec inspect enwiki.lkcorpus
            """,
        func=cmd_inspect,
    )
    p.add_argument("file", metavar="FILE", help="cache file (lookupdec, llama, fork-v1 or fork-v2) or corpus file")
    p.add_argument("--verify", action="store_true", help="full integrity check (strict: trailing bytes are errors)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--top", type=int, default=10, metavar="N", help="how many heaviest n-grams to list (default 10)")
