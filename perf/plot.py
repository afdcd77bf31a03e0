"""``python -m perf plot results/run.json [more.json ...] -o results/plots/``: PNG figures.

Figures (each point = median over the values of all runs, error bars = min..max):

- ``draft_us_vs_static.png``: µs per drafted token against static corpus size (tokens), per
  implementation, with the C++ anchors of ``perf/anchors.csv`` (upstream and fork, English);
  "no static cache" is the left panel;
- ``static_open_vs_file_size.png``: static open time against file size, per implementation and
  format, with the C++ load-time anchors;
- ``memory_vs_size.png``: resident memory added by opening a static cache against file size
  (for the memory-mapped index also after 20,000 lookups), with the C++ anchors;
- ``create_per_mb.png``: create time per MB of corpus text against corpus size.

Several result files are merged (e.g. a reference run and a fast run); a benchmark present
in more than one file takes all their values.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perf._cli import MATPLOTLIB_MISSING, InputError, load_pyperf_suite
from perf._common import REPO

ANCHORS = REPO / "perf" / "anchors.csv"
IMPL_COLORS = {"reference": "tab:blue", "fast": "tab:red"}
MODE_MARKERS = {"lookupdec-mmap": "o", "lookupdec-loaded": "s", "llama": "^", "fork-v2": "D", "": "o"}
MEM_FLOOR = 0.01
"""MB: memory deltas of 0 (a memory-mapped open) are drawn at this floor of the log axis."""
ANCHOR_STYLE = {"upstream C++": ("tab:gray", "--", "x"), "fork C++": ("black", ":", "+")}


@dataclass
class Series:
    """Values of one benchmark (all files merged) with its metadata."""

    name: str
    metadata: dict[str, Any]
    values: list[float] = field(default_factory=list)
    run_metadata: list[dict[str, Any]] = field(default_factory=list)

    @property
    def impl(self) -> str:
        return str(self.metadata.get("implementation", self.name.rpartition("@")[2]))

    def stats(self, scale: float = 1.0) -> tuple[float, float, float]:
        """(median, min, max) of the values times ``scale``."""
        v = [x * scale for x in self.values]
        return statistics.median(v), min(v), max(v)

    def run_stats(self, key: str, scale: float = 1.0) -> tuple[float, float, float] | None:
        """(median, min, max) of a per-run metadata value across runs, or None."""
        v = [float(m[key]) * scale for m in self.run_metadata if key in m]
        if not v:
            return None
        return statistics.median(v), min(v), max(v)


class MatplotlibMissing(Exception):
    """A plot was asked for and matplotlib (the optional ``perf`` extra) is not installed."""


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend, imported on first use.

    Not at module level: ``perf table`` needs only :func:`load_series`, and ``--help`` must work
    without the optional extra. Raises :class:`MatplotlibMissing` when it is not installed.
    """
    try:
        import matplotlib
    except ModuleNotFoundError:
        raise MatplotlibMissing(MATPLOTLIB_MISSING) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def load_series(paths: Iterable[Path]) -> dict[str, Series]:
    """Every benchmark of the pyperf results files, merged by name.

    Raises :class:`perf._cli.InputError` naming a file that is missing or not pyperf's.
    """
    out: dict[str, Series] = {}
    for path in paths:
        for bench in load_pyperf_suite(path).get_benchmarks():
            name = bench.get_name()
            s = out.setdefault(name, Series(name, dict(bench.get_metadata())))
            s.values.extend(bench.get_values())
            s.run_metadata.extend(dict(run.get_metadata()) for run in bench.get_runs() if run.values)
    return out


def load_anchors(path: Path = ANCHORS) -> list[dict[str, str]]:
    if not path.exists():
        return []
    with open(path, newline="") as f:
        lines = [line for line in f if not line.startswith("#")]
    rows = list(csv.DictReader(lines))
    # One value per (source, corpus, size, metric): spec section 15's rows win over the other sources.
    best: dict[tuple[str, str, str, str], dict[str, str]] = {}
    for r in rows:
        key = (r["source"], r["corpus"], r["static_tokens"], r["metric"])
        if key not in best or r["origin"] == "spec 15":
            best[key] = r
    return list(best.values())


def anchor_points(anchors: list[dict[str, str]], source: str, metric: str, corpus: str = "english") -> list[Any]:
    pts = [r for r in anchors if r["source"] == source and r["metric"] == metric and r["corpus"] == corpus]
    return sorted(pts, key=lambda r: int(r["static_tokens"]))


def _errorbar(ax: Any, xs: Sequence[float], stats: Sequence[tuple[float, float, float]], **kw: Any) -> None:
    med = [s[0] for s in stats]
    lo = [s[0] - s[1] for s in stats]
    hi = [s[2] - s[0] for s in stats]
    ax.errorbar(xs, med, yerr=[lo, hi], capsize=3, linewidth=1.5, markersize=6, **kw)


def _subtitle(series: Iterable[Series]) -> str:
    corpora = sorted({str(s.metadata.get("corpus", "?")) for s in series})
    revs = sorted({str(s.metadata.get("git_revision", "?")) for s in series})
    work = sorted({str(s.metadata.get("workload", "?")) for s in series})
    return f"corpus: {', '.join(corpora)}; workload: {', '.join(work)}; rev {', '.join(revs)}"


def plot_draft(series: dict[str, Series], anchors: list[dict[str, str]], out: Path) -> Path | None:
    draft = [s for s in series.values() if s.metadata.get("concern") == "draft"]
    if not draft:
        return None
    plt = pyplot()
    fig, (ax0, ax) = plt.subplots(1, 2, figsize=(11, 5.5), gridspec_kw={"width_ratios": [1, 4]}, sharey=True)
    by_impl: dict[str, list[Series]] = defaultdict(list)
    for s in draft:
        by_impl[s.impl].append(s)
    for i, (impl, group) in enumerate(sorted(by_impl.items())):
        color = IMPL_COLORS.get(impl)
        none = [s for s in group if int(s.metadata.get("static_tokens", 0)) == 0]
        sized = sorted((s for s in group if int(s.metadata.get("static_tokens", 0)) > 0), key=_static_tokens)
        replay = group[0].metadata.get("replay_tokens", "?")
        label = f"lookupdec {impl} (replay {replay} tokens)"
        if none:
            _errorbar(ax0, [i], [none[0].stats(1e6)], fmt="o", color=color, label=label)
        if sized:
            _errorbar(ax, [_static_tokens(s) for s in sized], [s.stats(1e6) for s in sized], fmt="-o", color=color)
            ax.plot([], [], "-o", color=color, label=label)
    n_impl = len(by_impl)
    for j, source in enumerate(ANCHOR_STYLE):
        color, ls, marker = ANCHOR_STYLE[source]
        pts = anchor_points(anchors, source, "draft_us")
        none_pts = [float(r["value"]) for r in pts if int(r["static_tokens"]) == 0]
        sized_pts = [r for r in pts if int(r["static_tokens"]) > 0]
        label = f"{source}, measured here (full WikiText test replay)"
        if none_pts:
            ax0.plot([n_impl + j], none_pts[:1], marker=marker, color=color, markersize=9, linestyle="none")
        if sized_pts:
            ax.plot(
                [int(r["static_tokens"]) for r in sized_pts],
                [float(r["value"]) for r in sized_pts],
                linestyle=ls,
                marker=marker,
                color=color,
                markersize=8,
                label=label,
            )
    ax0.set_xticks(range(n_impl + len(ANCHOR_STYLE)))
    ax0.set_xticklabels([*sorted(by_impl), *ANCHOR_STYLE], fontsize=8, rotation=40, ha="right")
    ax0.set_xlim(-0.6, n_impl + len(ANCHOR_STYLE) - 0.4)
    ax0.set_title("no static cache")
    ax0.set_ylabel("µs per drafted token (drafting + context updates)")
    ax0.set_yscale("log")
    ax0.grid(True, which="both", alpha=0.3)
    ax.set_xscale("log")
    ax.set_xlabel("static corpus size (tokens)")
    ax.set_title("with a static cache")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.suptitle("Drafting cost per drafted token (n_ctx 4096, n_draft 8; error bars: min-max)")
    fig.text(0.5, 0.01, _subtitle(draft), ha="center", fontsize=8, color="dimgray")
    fig.tight_layout(rect=(0, 0.03, 1, 0.97))
    path = out / "draft_us_vs_static.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _static_tokens(s: Series) -> int:
    return int(s.metadata.get("static_tokens", 0))


def _file_mb(s: Series) -> float:
    st = s.run_stats("file_bytes", 1e-6)
    return st[0] if st else float("nan")


def plot_open(series: dict[str, Series], anchors: list[dict[str, str]], out: Path) -> Path | None:
    opens = [s for s in series.values() if s.metadata.get("concern") == "static-open"]
    if not opens:
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(9, 6))
    groups: dict[tuple[str, str], list[Series]] = defaultdict(list)
    for s in opens:
        groups[(s.impl, str(s.metadata.get("mode", "")))].append(s)
    for (impl, mode), group in sorted(groups.items()):
        group.sort(key=_file_mb)
        _errorbar(
            ax,
            [_file_mb(s) for s in group],
            [s.stats(1e3) for s in group],
            fmt="-" + MODE_MARKERS.get(mode, "o"),
            color=IMPL_COLORS.get(impl),
            alpha=0.85,
            label=f"{impl}: {mode}",
        )
    for source, file_metric in (("upstream C++", "legacy_file_mb"), ("fork C++", "v2_file_mb")):
        color, ls, marker = ANCHOR_STYLE[source]
        sizes = {r["static_tokens"]: float(r["value"]) for r in anchor_points(anchors, source, file_metric)}
        pts = [(sizes[r["static_tokens"]], float(r["value"])) for r in anchor_points(anchors, source, "load_ms")]
        pts = sorted(p for p in pts if p[0])
        if pts:
            fmt_name = "legacy" if source.startswith("upstream") else "v2"
            ax.plot(
                *zip(*pts, strict=True), linestyle=ls, marker=marker, color=color, label=f"{source} load ({fmt_name})"
            )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("static file size (MB)")
    ax.set_ylabel("open / load time (ms)")
    ax.set_title("Static cache open time vs file size (error bars: min-max)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    fig.text(0.5, 0.01, _subtitle(opens), ha="center", fontsize=8, color="dimgray")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    path = out / "static_open_vs_file_size.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_memory(series: dict[str, Series], anchors: list[dict[str, str]], out: Path) -> Path | None:
    opens = [s for s in series.values() if s.metadata.get("concern") == "static-open"]
    if not opens:
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(9, 6))
    groups: dict[tuple[str, str], list[Series]] = defaultdict(list)
    xs_seen: list[float] = []
    for s in opens:
        groups[(s.impl, str(s.metadata.get("mode", "")))].append(s)
    for (impl, mode), group in sorted(groups.items()):
        group.sort(key=_file_mb)
        xs_seen.extend(_file_mb(s) for s in group)
        # After open for every mode; a memory-mapped index also after the lookups (pages touched).
        keys = [("rss_open_bytes", "-", "")]
        if mode == "lookupdec-mmap":
            keys.append(("rss_lookup_bytes", ":", " after 20k lookups"))
        for key, line, suffix in keys:
            pts = [(s, s.run_stats(key, 1e-6)) for s in group]
            good = [(s, st) for s, st in pts if st is not None]
            if not good:
                continue
            _errorbar(
                ax,
                [_file_mb(s) for s, _ in good],
                [(max(st[0], MEM_FLOOR), max(st[1], MEM_FLOOR), max(st[2], MEM_FLOOR)) for _, st in good],
                fmt=line + MODE_MARKERS.get(mode, "o"),
                color=IMPL_COLORS.get(impl),
                alpha=0.85,
                label=f"{impl}: {mode}{suffix}",
            )
    for source, file_metric in (("upstream C++", "legacy_file_mb"), ("fork C++", "v2_file_mb")):
        color, ls, marker = ANCHOR_STYLE[source]
        sizes = {r["static_tokens"]: float(r["value"]) for r in anchor_points(anchors, source, file_metric)}
        rss = anchor_points(anchors, source, "static_rss_mb")
        apts = sorted((sizes[r["static_tokens"]], float(r["value"])) for r in rss if r["static_tokens"] in sizes)
        if apts:
            xs_seen.extend(p[0] for p in apts)
            ax.plot(*zip(*apts, strict=True), linestyle=ls, marker=marker, color=color, label=f"{source} static RSS")
    lims = [v for v in xs_seen if v == v]  # drop NaN
    if lims:
        xs = [min(lims), max(lims)]
        ax.plot(xs, xs, color="green", alpha=0.4, linewidth=1, label="= file size")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("static file size (MB)")
    ax.set_ylabel(f"resident memory added by opening (MB; 0 drawn at {MEM_FLOOR})")
    ax.set_title("Memory of an opened static cache vs file size (error bars: min-max over runs)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, ncol=2, loc="lower right")
    fig.text(0.5, 0.01, _subtitle(opens), ha="center", fontsize=8, color="dimgray")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    path = out / "memory_vs_size.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_create(series: dict[str, Series], anchors: list[dict[str, str]], out: Path) -> Path | None:
    create = [s for s in series.values() if s.metadata.get("concern") == "create"]
    if not create:
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    by_impl: dict[str, list[Series]] = defaultdict(list)
    for s in create:
        by_impl[s.impl].append(s)
    for impl, group in sorted(by_impl.items()):
        group.sort(key=_static_tokens)
        _errorbar(
            ax,
            [_static_tokens(s) for s in group],
            [s.stats() for s in group],
            fmt="-o",
            color=IMPL_COLORS.get(impl),
            label=f"lookupdec {impl} (build_static only)",
        )
    mb = {"25 MB": 25.0, "50 MB": 50.0, "100 MB": 100.0, "200 MB": 200.0, "541 MB": 541.0}
    for source, (color, ls, marker) in ANCHOR_STYLE.items():
        pts = [
            (int(r["static_tokens"]), float(r["value"]) / mb[r["static_label"]])
            for r in anchor_points(anchors, source, "create_s")
            if r["static_label"] in mb
        ]
        if pts:
            ax.plot(
                *zip(*pts, strict=True), linestyle=ls, marker=marker, color=color, label=f"{source} create (spec 15)"
            )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("corpus size (tokens)")
    ax.set_ylabel("seconds per MB of corpus text")
    ax.set_title("Static cache creation cost (error bars: min-max)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.text(0.5, 0.01, _subtitle(create), ha="center", fontsize=8, color="dimgray")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    path = out / "create_per_mb.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m perf plot", description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="+", type=Path, help="stored results (pyperf suite JSON)")
    p.add_argument("-o", "--output", type=Path, default=REPO / "results" / "plots", help="folder for the PNGs")
    p.add_argument("--anchors", type=Path, default=ANCHORS, help="anchor CSV (default perf/anchors.csv)")
    args = p.parse_args(argv)
    try:
        pyplot()  # every run of this command draws: say so before reading anything
        series = load_series(args.files)
    except (MatplotlibMissing, InputError) as e:
        p.error(str(e))
    try:
        anchors = load_anchors(args.anchors)
    except (OSError, UnicodeDecodeError, csv.Error, KeyError) as e:  # KeyError: a CSV without our columns
        p.error(f"--anchors {args.anchors}: not an anchors CSV ({type(e).__name__}: {e})")
    try:
        args.output.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        p.error(f"--output {args.output}: {e.strerror or e}")
    written = [
        path
        for plot in (plot_draft, plot_open, plot_memory, plot_create)
        if (path := plot(series, anchors, args.output)) is not None
    ]
    for path in written:
        print(f"wrote {path}")
    if not written:
        print("nothing to plot: no draft, static or create benchmarks in the files", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
