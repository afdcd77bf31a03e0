"""Several requests open at once, offline: real prompts and outputs drafted teacher-forced through R rows.

A server drafts for several requests at once; lookupdec's hybrid policy then has one history
owner and the other requests *detached* (``docs/hybrid.md``). This replays that without a model:
the prompts and the real greedy outputs that ``perf vllm-speedup --save-outputs`` wrote (vLLM's
own generations), requests admitted in order, ``R`` open at a time (a finished one replaced by
the next waiting, as vLLM's ``max_num_seqs`` does), and in each step every open request, in row
order, proposes up to ``k`` tokens, then commits its accepted draft and the true next token. The
output's first token comes from the prefill, as in vLLM::

    python -m perf vllm-speedup --configs none --batch --prompts 16 --max-seqs 4 --rounds 1 \\
        --new-tokens 128 --dtype float32 --threads 1 --save-outputs outputs.json
    python -m perf batch-replay outputs.json --rows 1,4 --k 8 --thresholds 0.1,0.2,0.3

Drafters: ``hybrid@T`` (lookupdec's hybrid policy at a fixed threshold ``T``: the price vLLM's
adapter sets from the step's cost, see ``lookupdec.adapters.BatchCost``), ``llama`` and
``vllm-ngram/2-5`` (vLLM's n-gram rule, :class:`perf.peers.VllmNgram`, one per request: it
keeps nothing across requests). Tokens per step, drafted tokens per step and microseconds per
step (drafting and the drafter's updates), summed over the requests. A real engine's speed also
depends on what a verified token costs: measure that with ``perf vllm-speedup``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from perf._cli import InputError
from perf.peers import Generation, VllmNgram

VLLM_NGRAM: Final = "vllm-ngram/2-5"


@dataclass
class Counts(Generation):
    """:class:`perf.peers.Generation`'s counts summed over the requests, and the tokens they
    committed after each prompt's first (the prefill's)."""

    decoded: int = 0

    @property
    def tokens_per_step(self) -> float:
        """Committed tokens per request and step."""
        return self.decoded / max(self.n_steps, 1)

    @property
    def drafted_per_step(self) -> float:
        """Drafted tokens per request and step."""
        return self.n_drafted / max(self.n_steps, 1)


def read_outputs(path: Path) -> list[tuple[list[int], list[int]]]:
    """(prompt, output) per request from a ``--save-outputs`` file.

    Raises :class:`perf._cli.InputError` naming the file when it is missing or not such a file.
    """
    try:
        data = json.loads(path.read_text())
        pairs = [([int(t) for t in r["prompt"]], [int(t) for t in r["output"]]) for r in data["requests"]]
    except OSError as e:
        raise InputError(f"{path}: {e.strerror or e}") from None
    except (ValueError, KeyError, TypeError) as e:
        raise InputError(f"{path}: not a perf vllm-speedup --save-outputs file ({e})") from None
    if not pairs or any(not p or not o for p, o in pairs):
        raise InputError(f"{path}: no requests, or a request with an empty prompt or output")
    return pairs


def lookupdec_rows(drafter: Any) -> Callable[[list[int]], Any]:
    """A request of ``drafter`` per prompt: ``propose(k)``, ``extend(tokens)``, ``end()``."""
    return lambda prompt: drafter.request(prompt)


class NgramRequest:
    """vLLM's n-gram rule (2..5) as one request: the same calls as a lookupdec request."""

    def __init__(self, prompt: list[int], k: int) -> None:
        self.rule = VllmNgram(2, 5, k)
        self.tokens = list(prompt)
        self.rule.begin(list(prompt))

    def propose(self, k: int) -> list[int]:
        """The rule's draft, at most ``k`` tokens."""
        return self.rule.propose(self.tokens)[:k]

    def extend(self, new: list[int]) -> None:
        """Commit ``new``."""
        self.tokens += new
        self.rule.observe(new)

    def end(self) -> None:
        """The request is finished."""
        self.rule.end()


def replay(
    pairs: Sequence[tuple[list[int], list[int]]], open_request: Callable[[list[int]], Any], rows: int, k: int
) -> Counts:
    """Draft every request's output teacher-forced, ``rows`` requests open at a time (see the module's notes)."""
    c = Counts()
    waiting = list(pairs)
    active: list[list[Any]] = []  # [request, prompt + output, committed so far]
    while waiting or active:
        while waiting and len(active) < rows:
            prompt, output = waiting.pop(0)
            target = prompt + output
            active.append([open_request(target[: len(prompt) + 1]), target, len(prompt) + 1])
        for row in active:
            req, target, n = row
            t0 = time.perf_counter()
            proposal = req.propose(k)
            m = 0
            while m < len(proposal) and n + m < len(target) and target[n + m] == proposal[m]:
                m += 1
            new = target[n : n + m + 1]
            req.extend(new)
            c.t_draft_s += time.perf_counter() - t0  # drafting and the drafter's updates, as teacher_force times them
            row[2] = n + len(new)
            c.n_steps += 1
            c.n_drafted += len(proposal)
            c.n_accept += m
            c.decoded += len(new)
        for row in [r for r in active if r[2] >= len(r[1])]:
            row[0].end()
            active.remove(row)
    return c


def drafters(thresholds: Sequence[float], impl: Any, k: int) -> dict[str, Callable[[], Callable[[list[int]], Any]]]:
    """Each drafter's maker: a fresh drafter (its state shared by its requests) per replay."""

    def hybrid(t: float) -> Callable[[], Callable[[list[int]], Any]]:
        def make() -> Callable[[list[int]], Any]:
            d = impl.Drafter(policy="hybrid", n_draft=k, target_waste=0.0)
            d.policy_state.threshold = t
            return lookupdec_rows(d)

        return make

    out: dict[str, Callable[[], Callable[[list[int]], Any]]] = {f"hybrid@{t:g}": hybrid(t) for t in thresholds}
    out["llama"] = lambda: lookupdec_rows(impl.Drafter(policy="llama", n_draft=k))
    out[VLLM_NGRAM] = lambda: lambda prompt: NgramRequest(prompt, k)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m perf batch-replay",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        epilog="The file comes from python -m perf vllm-speedup --save-outputs FILE. See docs/hybrid.md.",
    )
    p.add_argument("outputs", type=Path, help="prompts and outputs written by perf vllm-speedup --save-outputs")
    p.add_argument("--rows", default="1,4", help="requests open at once, comma-separated (default: 1,4)")
    p.add_argument("--k", type=int, default=8, help="tokens drafted per request and step at most (default: 8)")
    p.add_argument(
        "--thresholds", default="0.1,0.2,0.3", help="the hybrid policy's fixed thresholds (default: 0.1,0.2,0.3)"
    )
    p.add_argument("--impl", choices=["fast", "reference"], default="fast", help="lookupdec's implementation")
    p.add_argument("--json", help="write the rows here")
    args = p.parse_args(argv)
    try:
        rows = [int(r) for r in args.rows.split(",")]
        thresholds = [float(t) for t in args.thresholds.split(",")]
    except ValueError as e:
        p.error(f"--rows and --thresholds are comma-separated numbers ({e})")
    if any(r < 1 for r in rows) or args.k < 1 or any(not 0.0 <= t <= 1.0 for t in thresholds):
        p.error("--rows and --k must be >= 1, --thresholds in [0, 1]")
    impl = importlib.import_module("lookupdec.fast" if args.impl == "fast" else "lookupdec.reference")
    try:
        pairs = read_outputs(args.outputs)
    except InputError as e:
        p.error(str(e))
    table = []
    print(f"{len(pairs)} requests, {sum(len(o) for _, o in pairs)} output tokens, k = {args.k}, {args.impl}")
    print(f"{'drafter':<16} {'rows':>4} {'tokens/step':>12} {'drafted/step':>13} {'accepted':>9} {'us/step':>8}")
    for name, make in drafters(thresholds, impl, args.k).items():
        for r in rows:
            c = replay(pairs, make(), r, args.k)
            table.append(dict(drafter=name, rows=r, **vars(c), tokens_per_step=c.tokens_per_step))
            us = 1e6 * c.t_draft_s / max(c.n_steps, 1)
            print(
                f"{name:<16} {r:>4} {c.tokens_per_step:>12.3f} {c.drafted_per_step:>13.2f} {c.n_accept:>9} {us:>8.1f}"
            )
    if args.json:
        Path(args.json).write_text(json.dumps(table, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
