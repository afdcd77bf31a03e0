"""``python -m perf table results/run.json [more.json ...]``: fast vs reference per static size, from stored runs.

One row per static corpus size of the ``draft`` benchmarks: µs per drafted token per
implementation (median), speedup, the exact counts and accept rate (from the metadata), and
for the fast path the static open time, file size and resident memory of the lookupdec index
(``static.open.lookupdec-mmap.<size>``) when that size was measured. Markdown, for notes/docs.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from perf._cli import InputError
from perf._common import size_label
from perf.plot import Series, load_series


def _med(s: Series | None, scale: float) -> str:
    return f"{s.stats(scale)[0]:.3g}" if s else "-"


def _meta(s: Series | None, key: str, scale: float = 1.0, fmt: str = "{:.3g}") -> str:
    if s is None:
        return "-"
    st = s.run_stats(key, scale)
    return fmt.format(st[0]) if st else "-"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m perf table", description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="+", type=Path)
    args = p.parse_args(argv)
    try:
        series = load_series(args.files)
    except InputError as e:
        p.error(str(e))
    draft = [s for s in series.values() if s.metadata.get("concern") == "draft"]
    sizes = sorted({int(s.metadata.get("static_tokens", 0)) for s in draft})
    if not sizes:
        print("no draft benchmarks in these files", file=sys.stderr)
        return 1
    replay = sorted({str(s.metadata.get("replay_tokens")) for s in draft})
    print(f"replay tokens: {', '.join(replay)}; corpus: {draft[0].metadata.get('corpus')}")
    print()
    print(
        "| static corpus (tokens) | reference µs/drafted | fast µs/drafted | speedup | n_drafted | n_accept "
        "| accept % | fast open ms (lookupdec mmap) | index file MB | fast RSS after open MB | after 20k lookups MB |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for n in sizes:
        label = size_label(n)
        ref = series.get(f"draft.static={label}@reference")
        fast = series.get(f"draft.static={label}@fast")
        speed = f"{ref.stats()[0] / fast.stats()[0]:.1f}x" if ref and fast else "-"
        counts = fast or ref
        opened = series.get(f"static.open.lookupdec-mmap.{label}@fast")
        print(
            f"| {label} ({n}) | {_med(ref, 1e6)} | {_med(fast, 1e6)} | {speed} "
            f"| {_meta(counts, 'n_drafted', fmt='{:.0f}')} | {_meta(counts, 'n_accept', fmt='{:.0f}')} "
            f"| {_meta(counts, 'accept_pct', fmt='{:.2f}')} | {_med(opened, 1e3)} "
            f"| {_meta(opened, 'file_bytes', 1e-6)} | {_meta(opened, 'rss_open_bytes', 1e-6)} "
            f"| {_meta(opened, 'rss_lookup_bytes', 1e-6)} |"
        )
    mismatch = [
        label
        for n in sizes
        if (label := size_label(n))
        and (r := series.get(f"draft.static={label}@reference"))
        and (f := series.get(f"draft.static={label}@fast"))
        and (r.metadata.get("n_drafted"), r.metadata.get("n_accept"))
        != (f.metadata.get("n_drafted"), f.metadata.get("n_accept"))
    ]
    if mismatch:
        print(f"\nWARNING: reference and fast counts differ at {', '.join(mismatch)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
