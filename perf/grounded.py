"""Input-grounded drafting: every drafter generates real outputs that copy much of their prompt.

The replays (``perf policy``, ``perf.peers``) start each chunk from an empty context: the
drafter never sees a prompt. Prompt lookup is used for the opposite case, an output that copies
long spans of its input. This benchmark measures that case on real, human-written pairs
(``perf.grounded_data``): a source file in two consecutive releases of a package (``code``:
prompt = an instruction line + the old file, output = the new file) and a changed document of
the same releases (``docs``).

The protocol, per pair: one request whose context is the prompt (``Drafter.request(prompt)``
for lookupdec, each peer's own way of starting a request), then the output generated
teacher-forced as llama-lookup-stats does (``perf.peers.teacher_force``: propose, accept the
matching prefix, append the one true token). Every drafter sees the pairs in the same order and
keeps what it learns across them (lookupdec's dynamic cache, SuffixDecoding's global tree), as an
engine serving one request after another would. The drafters run side by side, pair by pair.

Drafters (``--drafters``), each at ``n_draft`` = every ``--k`` value:

- ``llama``, ``llama+static``: lookupdec's llama.cpp policy (``lookupdec.fast.Drafter``), without
  and with the static index of ``enwiki_wt.10M`` (the project's sample corpus);
- ``hybrid``, ``hybrid+static``, ``hybrid+corpus``: the hybrid policy, alone, with that static
  index, and with the static index and its corpus in the history; ``hybrid/w0.5``: alone,
  steered to 0.5 rejected tokens per step (``Drafter(target_waste=0.5)``; the default is 1.9);
- ``hf``, ``hf3``: transformers' own ``PromptLookupCandidateGenerator`` (``max_matching_ngram_size``
  2, its default, and 3);
- ``vllm``, ``vllm25``: vLLM's n-gram rule at n = 5 and at n = 2..5 (``perf.peers.VllmNgram``);
- ``suffix``, ``suffix4``: Arctic Inference's ``SuffixDecodingCache`` at its defaults and with
  ``max_spec_factor`` 4 (needs the extension, perf/README.md "Peers"; skipped otherwise);
- ``oracle``, ``oracle/anchored``: not drafters but ceilings (``perf.oracle``): a clairvoyant
  that drafts the longest prefix of the true continuation occurring in the history (anywhere, or
  after an occurrence of the last token), so that no drafter copying a span accepts more per step.
- ``hybrid@T``: the hybrid policy alone at a fixed threshold ``T`` (no waste controller: its
  threshold moves by 0.01 % a step, too slowly to settle within these pairs at large ``k``).

``--match-waste`` answers the question "more tokens per step at no more waste?": it adds
``hybrid@T`` at every threshold of :data:`SWEEP` and, for each peer at each ``k``, prints the
hybrid policy's best row that wasted no more per step than the peer (the sweep's points, not an
interpolation: a conservative comparison).

Tokens per step (output tokens / steps) and accepted tokens are deterministic; µs per step is
``propose`` + ``observe`` through each drafter's Python API (for the peers that is not their
engine's own cost), noisy on a shared machine.

    python -m perf grounded --sample                       # the pairs shipped in tests/data, seconds
    python -m perf grounded --work /work/grounded          # the whole set (downloads the sdists once)
    python -m perf grounded --work /work/grounded --k 8,16 --json results/grounded.json
    python -m perf grounded --work /work/grounded --drafters hybrid,suffix --judge   # vs the ceiling
    python -m perf grounded --work /work/grounded --k 8,16,32 --match-waste          # at the peers' waste
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from perf import peers
from perf._cli import MATPLOTLIB_MISSING, InputError, positive_int, read_json
from perf._common import STATIC_FILE, data_dir
from perf.bench_policy import read_tokens, static_index
from perf.grounded_data import GroundedDataError, build_pairs, load_sample
from perf.oracle import Judged, OracleDrafter, Shortfall, SpanOracle
from perf.peers import Generation, PeerDrafter, PeerUnavailable, teacher_force

DRAFTERS = (
    "llama",
    "llama+static",
    "hybrid",
    "hybrid+static",
    "hybrid+corpus",
    "hybrid/w0.5",
    "hf",
    "hf3",
    "vllm",
    "vllm25",
    "suffix",
    "suffix4",
    "oracle",
    "oracle/anchored",
)
"""Every drafter this benchmark knows, the default ``--drafters``."""
ORACLES = ("oracle", "oracle/anchored")
"""The ceilings of :mod:`perf.oracle`: neither lookupdec's nor a peer."""
LOOKUPDEC = ("llama", "llama+static", "hybrid", "hybrid+static", "hybrid+corpus", "hybrid/w0.5")
"""The drafters that are lookupdec's (the others are peers)."""
FIXED = "hybrid@"
"""The prefix of the hybrid policy's fixed-threshold drafters: ``hybrid@0.3`` drafts at a threshold of 0.3."""
SWEEP = (
    *(0.002, 0.003, 0.005, 0.007, 0.01, 0.015, 0.02, 0.03, 0.05, 0.07, 0.1, 0.15, 0.2),
    *(0.22, 0.25, 0.27, 0.3, 0.33, 0.36, 0.4, 0.45, 0.5),
)
"""``--match-waste``'s thresholds: the waste controller's range (0.002..0.5), about 1.5x apart, and
about 1.1x from 0.2 on, where the peers that waste least are matched (a peer is compared with a
sweep point, so the gaps bound how close the comparison gets: at k = 32, SuffixDecoding's
defaults' 1.313 wasted per step fell between 0.3 and 0.4, 1.43 and 0.97 wasted, 2026-12-06)."""


def fixed_name(threshold: float) -> str:
    """The drafter name of the hybrid policy at the fixed ``threshold``."""
    return f"{FIXED}{threshold:g}"


def fixed_threshold(name: str) -> float | None:
    """The threshold of a ``hybrid@T`` name; None for any other name (or a ``T`` not in [0, 1])."""
    if not name.startswith(FIXED):
        return None
    try:
        t = float(name[len(FIXED) :])
    except ValueError:
        return None
    return t if 0.0 <= t <= 1.0 else None


def is_lookupdec(name: str) -> bool:
    """Whether the drafter called ``name`` is lookupdec's (else a peer's or a ceiling)."""
    return name in LOOKUPDEC or fixed_threshold(name) is not None


def is_peer(name: str) -> bool:
    """Whether the drafter called ``name`` is a peer's: neither lookupdec's nor a ceiling."""
    return not is_lookupdec(name) and name not in ORACLES


class LookupdecDrafter:
    """lookupdec's public API as a :class:`perf.peers.PeerDrafter`: one ``Drafter.request`` per pair.

    ``impl``: the implementation module (``lookupdec.fast`` by default, or ``lookupdec.reference``).
    ``threshold`` (hybrid only): draft at this fixed threshold instead of steering to ``target_waste``.
    ``drafter``: drive this ``Drafter`` instead of making one (the other arguments are then unused).
    """

    def __init__(
        self,
        policy: str,
        n_draft: int,
        static: Any = None,
        corpus: list[int] | None = None,
        impl: Any = None,
        target_waste: float | None = None,
        threshold: float | None = None,
        drafter: Any = None,
    ) -> None:
        self._request: Any = None
        if drafter is not None:
            self._drafter = drafter
            return
        if impl is None:
            from lookupdec import fast as impl
        if threshold is not None:  # fixed: no waste target steers it
            if policy != "hybrid":
                raise ValueError(f"a fixed threshold is the hybrid policy's, not the {policy!r} policy's")
            target_waste = 0.0
        self._drafter = impl.Drafter(static, policy=policy, n_draft=n_draft, corpus=corpus, target_waste=target_waste)
        if threshold is not None:
            self._drafter.policy_state.threshold = threshold

    def begin(self, prompt: list[int]) -> None:
        self._request = self._drafter.request(prompt)

    def propose(self, out: list[int]) -> list[int]:
        result: list[int] = self._request.propose()
        return result

    def observe(self, new_tokens: list[int]) -> None:
        self._request.extend(new_tokens)

    def end(self) -> None:
        self._request.end()
        self._request = None


@dataclass
class Totals:
    """One drafter's sums over the pairs of one kind."""

    pairs: int = 0
    output_tokens: int = 0
    gen: Generation = field(default_factory=Generation)
    shortfall: Shortfall | None = None
    """Against the anchored ceiling, when ``run(judge=True)``."""

    def add(self, pairs: int, n_output: int, g: Generation, shortfall: Shortfall | None = None) -> None:
        """Count ``pairs`` pairs of ``n_output`` output tokens in all, generated as ``g`` says."""
        self.pairs += pairs
        self.output_tokens += n_output
        self.gen.add(g)
        if shortfall is not None:
            if self.shortfall is None:
                self.shortfall = Shortfall()
            self.shortfall.add(shortfall)

    def row(self, kind: str, name: str, k: int) -> dict[str, Any]:
        """The table's row."""
        g = self.gen
        steps = max(g.n_steps, 1)
        return {
            "kind": kind,
            "drafter": name,
            "k": k,
            "pairs": self.pairs,
            "output_tokens": self.output_tokens,
            "n_steps": g.n_steps,
            "n_accept": g.n_accept,
            "n_drafted": g.n_drafted,
            "tokens_per_step": self.output_tokens / steps,
            "wasted_per_step": (g.n_drafted - g.n_accept) / steps,
            "us_per_step": 1e6 * g.t_draft_s / steps,
            **({} if self.shortfall is None else {"shortfall": asdict(self.shortfall)}),
        }


STATIC_DRAFTERS = ("llama+static", "hybrid+static", "hybrid+corpus")
"""The drafters that read the static index (and ``hybrid+corpus`` its corpus)."""


def make_drafter(
    name: str, k: int, n_ctx: int, static: Any, corpus: list[int], oracle: SpanOracle | None = None
) -> PeerDrafter:
    """The drafter called ``name`` drafting up to ``k`` tokens; may raise :class:`PeerUnavailable`.

    The oracles need ``oracle``, to which the caller gives each pair before it is generated."""
    if name in ORACLES:
        if oracle is None:
            raise ValueError(f"{name} needs a SpanOracle")
        return OracleDrafter(oracle, k, anchored=name == "oracle/anchored")
    if name == "llama":
        return LookupdecDrafter("llama", k)
    if name == "llama+static":
        return LookupdecDrafter("llama", k, static)
    if name == "hybrid":
        return LookupdecDrafter("hybrid", k)
    if name == "hybrid+static":
        return LookupdecDrafter("hybrid", k, static)
    if name == "hybrid+corpus":
        return LookupdecDrafter("hybrid", k, static, corpus)
    if name == "hybrid/w0.5":
        return LookupdecDrafter("hybrid", k, target_waste=0.5)
    threshold = fixed_threshold(name)
    if threshold is not None:
        return LookupdecDrafter("hybrid", k, threshold=threshold)
    if name in DRAFTERS:  # a peer: perf.peers makes it
        return peers.make_drafter(name, corpus, k, n_ctx)
    raise ValueError(f"unknown drafter {name!r} (known: {', '.join(DRAFTERS)}, {FIXED}T)")


def run(
    pairs: Sequence[Any], names: Sequence[str], ks: Sequence[int], cache: Path, judge: bool = False
) -> list[dict[str, Any]]:
    """Every drafter at every ``k`` on ``pairs`` (``perf.grounded_data.Pair``), side by side pair by pair.

    ``judge``: also judge every drafter's steps against the anchored ceiling at the same
    position (:class:`perf.oracle.Judged`; each row gets a ``shortfall``)."""
    corpus: list[int] = []
    static: Any = None
    if set(names) & set(STATIC_DRAFTERS):  # read and index the corpus only for those who use it
        from lookupdec import fast

        corpus = read_tokens(data_dir() / STATIC_FILE)
        static = static_index(fast, corpus, cache / "enwiki.static.lkdc")
    n_ctx = max((len(p.prompt) + len(p.output) for p in pairs), default=1)
    # one oracle for every k: it indexes the stream of pairs, the same for all
    oracle = SpanOracle() if judge or set(names) & set(ORACLES) else None
    drafters: dict[tuple[str, int], PeerDrafter] = {}
    for name in names:
        for k in ks:
            try:
                drafter = make_drafter(name, k, n_ctx, static, corpus, oracle)
                if judge and oracle is not None and name not in ORACLES:
                    drafter = Judged(drafter, oracle, k)
                drafters[(name, k)] = drafter
            except PeerUnavailable as e:
                print(f"perf.grounded: skipping {name}: {e}", file=sys.stderr)
                break
    totals: dict[tuple[str, str, int], Totals] = {}
    t0 = time.perf_counter()
    for i, pair in enumerate(pairs):
        target = list(pair.prompt) + list(pair.output)
        if oracle is not None:
            oracle.add_pair(target)
        for (name, k), drafter in drafters.items():
            g = teacher_force(drafter, target, len(pair.prompt), k, name)
            judged = drafter.shortfall if isinstance(drafter, Judged) else None  # this pair's
            totals.setdefault((pair.kind, name, k), Totals()).add(1, len(pair.output), g, judged)
        print(
            f"\rperf.grounded: {i + 1}/{len(pairs)} pairs ({time.perf_counter() - t0:.0f} s)",
            end="",
            file=sys.stderr,
            flush=True,
        )
    print(file=sys.stderr)
    kinds = sorted({kind for kind, _, _ in totals}, key=lambda x: (x != "code", x))
    rows: list[dict[str, Any]] = []
    for kind in [*kinds, "all"]:
        for name, k in drafters:
            if kind == "all":
                t = Totals()
                for kd in kinds:
                    part = totals[(kd, name, k)]
                    t.add(part.pairs, part.output_tokens, part.gen, part.shortfall)
            else:
                t = totals[(kind, name, k)]
            rows.append(t.row(kind, name, k))
    return rows


def best_peer(rows: Sequence[dict[str, Any]], kind: str, k: int | None = None) -> dict[str, Any] | None:
    """The peer row of ``kind`` (at draft length ``k``, or any) with the most tokens per step."""
    peers = [r for r in rows if r["kind"] == kind and is_peer(r["drafter"]) and k in (None, r["k"])]
    return max(peers, key=lambda r: r["tokens_per_step"], default=None)


def print_table(rows: Sequence[dict[str, Any]]) -> None:
    """One markdown table per kind, each row with its ratio to the best peer at the same ``k``."""
    for kind in dict.fromkeys(r["kind"] for r in rows):
        first = next(r for r in rows if r["kind"] == kind)
        print(f"\n### {kind}: {first['pairs']} pairs, {first['output_tokens']:,} output tokens\n")
        print("| drafter | k | tokens/step | vs best peer at k | accepted | drafted | wasted/step | steps | µs/step |")
        print("|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            if r["kind"] != kind or fixed_threshold(r["drafter"]) is not None:  # the sweep: print_matched
                continue
            best = best_peer(rows, kind, r["k"])
            vs = f"{r['tokens_per_step'] / best['tokens_per_step']:.3f}x" if best else "-"
            mark = " (best peer)" if r is best else ""
            print(
                f"| {r['drafter']}{mark} | {r['k']} | {r['tokens_per_step']:.4f} | {vs} | {r['n_accept']:,} | "
                f"{r['n_drafted']:,} | {r['wasted_per_step']:.3f} | {r['n_steps']:,} | {r['us_per_step']:.1f} |"
            )
        best = best_peer(rows, kind)
        if best is not None:
            print(
                f"\nbest peer at any k: {best['drafter']} at k = {best['k']}, {best['tokens_per_step']:.4f} tokens/step"
            )
        judged = [r for r in rows if r["kind"] == kind and "shortfall" in r]
        if judged:
            print(f"\n{kind}, each step against the anchored ceiling at its position (--judge):\n")
            print("| drafter | k | steps | at the ceiling | drafted a wrong token (tokens below) | ", end="")
            print("stopped short (tokens below) |")
            print("|---|---|---|---|---|---|")
            for r in judged:
                f = r["shortfall"]
                print(
                    f"| {r['drafter']} | {r['k']} | {r['n_steps']:,} | {f['at_ceiling']:,} | "
                    f"{f['wrong']:,} ({f['wrong_tokens']:,}) | {f['short']:,} ({f['short_tokens']:,}) |"
                )


def matched(rows: Sequence[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any] | None]]:
    """Each peer row with the ``hybrid@T`` row of its kind and ``k`` that has the most tokens per
    step among those that wasted no more per step than the peer (None: none did)."""
    out: list[tuple[dict[str, Any], dict[str, Any] | None]] = []
    for peer in rows:
        if not is_peer(peer["drafter"]):
            continue
        fits = [
            r
            for r in rows
            if fixed_threshold(r["drafter"]) is not None
            and (r["kind"], r["k"]) == (peer["kind"], peer["k"])
            and r["wasted_per_step"] <= peer["wasted_per_step"]
        ]
        out.append((peer, max(fits, key=lambda r: r["tokens_per_step"], default=None)))
    return out


def print_matched(rows: Sequence[dict[str, Any]]) -> None:
    """``--match-waste``'s table per kind: each peer against the hybrid policy at no more waste."""
    if not any(fixed_threshold(r["drafter"]) is not None for r in rows):
        return
    pairs = matched(rows)
    for kind in dict.fromkeys(peer["kind"] for peer, _ in pairs):
        print(
            f"\n{kind}, at no more waste: each peer against the hybrid policy's best fixed threshold (--match-waste)\n"
        )
        print("| k | peer | tokens/step | wasted/step | hybrid at | tokens/step | wasted/step | ratio |")
        print("|---|---|---|---|---|---|---|---|")
        for peer, h in sorted((x for x in pairs if x[0]["kind"] == kind), key=lambda x: (x[0]["k"], x[0]["drafter"])):
            mine = (
                f"{h['drafter']} | {h['tokens_per_step']:.4f} | {h['wasted_per_step']:.3f} | "
                f"{h['tokens_per_step'] / peer['tokens_per_step']:.3f}x"
                if h is not None
                else "- | - | - | - (every threshold wasted more)"
            )
            print(
                f"| {peer['k']} | {peer['drafter']} | {peer['tokens_per_step']:.4f} | "
                f"{peer['wasted_per_step']:.3f} | {mine} |"
            )


def plot(rows: Sequence[dict[str, Any]], path: Path) -> None:
    """Tokens per step against wasted tokens per step, a line per drafter through its ``k`` values,
    a panel per kind (PNG at ``path``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = list(dict.fromkeys(r["kind"] for r in rows))
    fig, axes = plt.subplots(1, len(kinds), figsize=(5.2 * len(kinds), 4.4), squeeze=False)
    for ax, kind in zip(axes[0], kinds, strict=True):
        # the hybrid policy's fixed thresholds (--match-waste): a thin line per k, its frontier
        sweep = [r for r in rows if r["kind"] == kind and fixed_threshold(r["drafter"]) is not None]
        for k in sorted({r["k"] for r in sweep}):
            line = sorted((r["wasted_per_step"], r["tokens_per_step"]) for r in sweep if r["k"] == k)
            ax.plot(
                [x[0] for x in line],
                [x[1] for x in line],
                marker=".",
                markersize=3,
                linewidth=0.8,
                color="darkgreen",
                alpha=0.6,
                label="hybrid, fixed thresholds (a line per k)" if k == min(r["k"] for r in sweep) else None,
            )
        for name in dict.fromkeys(r["drafter"] for r in rows if fixed_threshold(r["drafter"]) is None):
            pts = sorted(
                (r["k"], r["wasted_per_step"], r["tokens_per_step"])
                for r in rows
                if r["kind"] == kind and r["drafter"] == name
            )
            mine, ceiling = name in LOOKUPDEC, name in ORACLES
            ax.plot(
                [x[1] for x in pts],
                [x[2] for x in pts],
                marker="*" if ceiling else "o" if mine else "s",
                linestyle=":" if ceiling else "-" if mine else "--",
                linewidth=2.0 if mine else 1.0,
                label=f"{name} (ceiling)" if ceiling else name,
                # the ceilings in greys, apart from the drafters' colour cycle
                **({"color": "black" if name == "oracle" else "dimgray"} if ceiling else {}),
            )
            for k, w, t in pts:
                ax.annotate(str(k), (w, t), fontsize=6, xytext=(2, 2), textcoords="offset points")
        ax.set_title(f"{kind}: {rows[[r['kind'] for r in rows].index(kind)]['pairs']} pairs")
        ax.set_xlabel("wasted drafted tokens per step")
        ax.set_ylabel("tokens per step (labels: k)")
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m perf grounded``: see the module docstring."""
    p = argparse.ArgumentParser(
        prog="python -m perf grounded",
        description=__doc__.split("\n\n")[0],
        epilog="examples:\n  python -m perf grounded --sample\n  python -m perf grounded --work DIR --k 8,16",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument("--sample", action="store_true", help="the few pairs shipped in tests/data (no download)")
    src.add_argument("--work", metavar="DIR", help="folder of perf.grounded_data (sdists and tokenized pairs)")
    p.add_argument(
        "--drafters",
        default=",".join(DRAFTERS),
        help="comma-separated: " + ", ".join(DRAFTERS) + f", {FIXED}T (the hybrid policy at the fixed threshold T)",
    )
    p.add_argument("--k", default="8", help="comma-separated n_draft values, each drafter runs at each (default 8)")
    p.add_argument("--kinds", default="code,docs", help="pair kinds to run (default code,docs)")
    p.add_argument(
        "--max-tokens", type=positive_int, default=16384, help="longest prompt + output kept (perf.grounded_data)"
    )
    p.add_argument("--cache-dir", metavar="DIR", help="where the static index is kept (default: a temp dir)")
    p.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    p.add_argument("--plot", metavar="PNG", help="also plot tokens/step against wasted/step per drafter")
    p.add_argument(
        "--judge",
        action="store_true",
        help="also judge each step against the anchored ceiling at its position: at it, below it by a wrong "
        "token, or below it by stopping short (a table per kind; µs/step then include the judging)",
    )
    p.add_argument(
        "--match-waste",
        action="store_true",
        help=f"also run the hybrid policy at fixed thresholds ({SWEEP[0]}..{SWEEP[-1]}) and compare each peer "
        "with its best one that wasted no more per step",
    )
    p.add_argument("--from-json", metavar="PATH", help="print (and plot) stored rows instead of running")
    args = p.parse_args(argv)
    # a plot is drawn at the end: without matplotlib, say so before the run rather than after it
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        p.error(f"--plot: {MATPLOTLIB_MISSING}")
    if args.from_json:
        try:
            rows = read_json(args.from_json)
        except InputError as e:
            p.error(f"--from-json {e}")
        # printed into a buffer first: rows of another shape end with one line, not half a table
        out = io.StringIO()
        try:
            if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
                raise TypeError("not a list of rows")
            with contextlib.redirect_stdout(out):
                print_table(rows)
                print_matched(rows)
        except (KeyError, TypeError, ValueError, IndexError, StopIteration, ZeroDivisionError) as e:
            p.error(f"--from-json {args.from_json}: not rows written by --json ({type(e).__name__}: {e})")
        sys.stdout.write(out.getvalue())
        if args.plot:
            plot(rows, Path(args.plot))
        return 0
    if not args.sample and not args.work:
        p.error("give --sample or --work DIR (or --from-json PATH)")
    names = [x for x in args.drafters.split(",") if x]
    for name in names:
        if name not in DRAFTERS and fixed_threshold(name) is None:
            p.error(f"unknown drafter {name!r} (known: {', '.join(DRAFTERS)}, or {FIXED}T with T in [0, 1])")
    if args.match_waste:
        names += [n for n in map(fixed_name, SWEEP) if n not in names]
    try:
        ks = [int(x) for x in args.k.split(",") if x]
    except ValueError:
        p.error(f"--k takes comma-separated integers, got {args.k!r}")
    if not ks or min(ks) < 1:
        p.error("--k needs at least one value >= 1")
    try:
        pairs = load_sample() if args.sample else build_pairs(Path(args.work), max_tokens=args.max_tokens)
    except GroundedDataError as e:
        p.error(f"--sample: {e}" if args.sample else f"--work {args.work}: {e}")
    kinds = {x for x in args.kinds.split(",") if x}
    pairs = [x for x in pairs if x.kind in kinds]
    if not pairs:
        p.error(f"no pairs of kinds {sorted(kinds)}")
    with tempfile.TemporaryDirectory(prefix="lookupdec-grounded-") as tmp:
        cache = Path(args.cache_dir or tmp)
        cache.mkdir(parents=True, exist_ok=True)
        rows = run(pairs, names, ks, cache, judge=args.judge)
    print_table(rows)
    print_matched(rows)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    if args.plot:
        plot(rows, Path(args.plot))
    return 0


if __name__ == "__main__":
    sys.exit(main())
