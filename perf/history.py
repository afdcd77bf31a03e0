"""``python -m perf history add|plot``: the per-runner history of main's results, and its plot.

perf.yml, on every push to main, runs ``python -m perf track`` (the previous main commit vs the
new one, on that runner) and then records the head's medians here:

- ``python -m perf history add HISTORY.jsonl results/track/compare.json`` appends one JSON line
  (date, runner, commit, and per benchmark the head's median and its ratio to the previous
  commit measured in the same run);
- ``python -m perf history plot HISTORY.jsonl -o DIR`` draws every benchmark's median over the
  recorded commits, relative to its first record (``DIR/history.png``), and writes the last
  records as a markdown table (``DIR/history.md``).

One file per runner (perf.yml keeps them on the ``perf-results`` branch, ``history/RUNNER.jsonl``):
numbers from different machines are never mixed. Absolute times on shared cloud runners drift;
the interleaved head/base ratio of each record is the trustworthy number, the medians show trends.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from perf._cli import positive_int


class HistoryError(Exception):
    """A history or comparison file that cannot be used, with the file and what is wrong."""


def _load_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise HistoryError(f"{path}: cannot read a perf track comparison: {e}") from e
    if not isinstance(data, dict) or "head" not in data or "benchmarks" not in data:
        raise HistoryError(f"{path}: not a perf track compare.json (no 'head' / 'benchmarks')")
    return data


def record_from(compare: dict[str, Any]) -> dict[str, Any]:
    """The history line for one ``perf track`` comparison."""
    return {
        "date": compare["date"],
        "runner": compare["runner"],
        "sha": compare["head"]["sha"],
        "base_sha": compare["base"]["sha"],
        "passed": compare["passed"],
        "benchmarks": {b["name"]: {"median": b["head_median"], "ratio": b["ratio"]} for b in compare["benchmarks"]},
    }


def load(path: Path) -> list[dict[str, Any]]:
    """Every record of a history file (none when it does not exist yet)."""
    if not path.exists():
        return []
    records = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except ValueError as e:
            raise HistoryError(f"{path}:{n}: not a JSON line: {e}") from e
    return records


def add(history: Path, compare: Path) -> dict[str, Any]:
    """Append ``compare``'s record to ``history`` (a commit already recorded is replaced)."""
    record = record_from(_load_json(compare))
    records = [r for r in load(history) if r.get("sha") != record["sha"]]
    records.append(record)
    history.parent.mkdir(parents=True, exist_ok=True)
    tmp = history.with_suffix(history.suffix + ".tmp")
    tmp.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in records))
    tmp.replace(history)  # atomic: an interrupted run keeps the old history
    return record


def plot(history: Path, out: Path, last: int = 20) -> list[Path]:
    """Write ``out/history.png`` (if matplotlib is there) and ``out/history.md``; return the paths."""
    records = load(history)
    if not records:
        raise HistoryError(f"{history}: no records to plot")
    out.mkdir(parents=True, exist_ok=True)
    names = sorted({name for r in records for name in r["benchmarks"]})
    written = []
    md = [
        f"# {history.stem}: the last {min(last, len(records))} of {len(records)} main commits",
        "",
        "| date | commit | " + " | ".join(names) + " |",
        "|---|---|" + "---:|" * len(names),
    ]
    for r in records[-last:]:
        cells = []
        for name in names:
            b = r["benchmarks"].get(name)
            cells.append(f"{b['median']:.3g} s ({b['ratio']:.2f}x)" if b else "")
        md.append(f"| {r['date'][:10]} | `{r['sha'][:10]}` | " + " | ".join(cells) + " |")
    md += ["", "Each cell: head median (head/base time ratio vs the previous commit, measured interleaved)."]
    (out / "history.md").write_text("\n".join(md) + "\n")
    written.append(out / "history.md")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(no plot: matplotlib is not installed; pip install '.[perf]')")
        return written
    fig, ax = plt.subplots(figsize=(10, 5))
    for name in names:
        xs, ys = [], []
        first = None
        for i, r in enumerate(records):
            b = r["benchmarks"].get(name)
            if b is None or b["median"] <= 0:
                continue
            first = first or b["median"]
            xs.append(i)
            ys.append(b["median"] / first)
        ax.plot(xs, ys, marker="o", markersize=3, label=name)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(records)), [r["sha"][:7] for r in records], rotation=90, fontsize=7)
    ax.set_ylabel("median time relative to the first record")
    ax.set_title(f"lookupdec benchmarks on main, runner {records[-1]['runner']}")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout()
    fig.savefig(out / "history.png", dpi=100)
    plt.close(fig)
    written.append(out / "history.png")
    return written


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``python -m perf history``; return the exit status."""
    p = argparse.ArgumentParser(prog="python -m perf history", description=__doc__.splitlines()[0].split(": ", 1)[1])
    sub = p.add_subparsers(dest="command", required=True)
    a = sub.add_parser("add", help="append a perf track compare.json to a history file")
    a.add_argument("history", type=Path, help="the runner's history file (JSON lines; created if missing)")
    a.add_argument("compare", type=Path, help="compare.json written by python -m perf track")
    pl = sub.add_parser("plot", help="plot a history file")
    pl.add_argument("history", type=Path)
    pl.add_argument("-o", "--output", type=Path, required=True, help="directory for history.png and history.md")
    pl.add_argument("--last", type=positive_int, default=20, help="records in the markdown table (default 20)")
    args = p.parse_args(argv)
    try:
        if args.command == "add":
            r = add(args.history, args.compare)
            print(f"{args.history}: recorded {r['sha'][:12]} ({len(r['benchmarks'])} benchmarks, runner {r['runner']})")
        else:
            for path in plot(args.history, args.output, args.last):
                print(f"wrote {path}")
    except HistoryError as e:
        print(f"perf history: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
