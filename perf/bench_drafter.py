"""The Drafter and the vLLM adapter against the bare calls they wrap: µs per step and memory.

Three measurements, each side by side with its bare equivalent, interleaved in one process
(rounds in rotating order; medians reported), on the replay text (``wiki.test.raw.llama3.bin``
from the shared data, else the shipped demo text) with the "model" choosing the true text:

1. one request at context 4096: a step is ``propose()`` plus ``extend(accepted + next)``;
   the bare step is ``draft(...)`` plus ``NgramCache.update(tokens, n)`` (what ``replay`` does);
   both include the request's end (its context merged into the dynamic cache);
2. 64 concurrent requests through ``LookupProposer.propose`` (vLLM's call: one per batch), vs
   the same requests driven by id through ``Request`` objects, vs bare ``draft``/``update``;
3. resident memory per open request at 4096 tokens (RSS growth over 64 open requests).

    python -m perf.bench_drafter --impl fast --rounds 5
    python -m perf.bench_drafter --impl fast --static        # with the demo corpus as static cache
    python -m perf.bench_drafter --impl fast --accept        # acceptance on the shipped demo replay
    python -m perf.bench_drafter --impl fast --accept --policy hybrid   # the same with the hybrid policy
    python -m perf.bench_drafter --impl fast --clock cpu     # process CPU time instead of wall time

``--policy`` (default ``llama``) is the Drafters' policy in every measurement.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import lookupdec
from lookupdec.adapters.vllm import LookupProposer
from perf._common import data_dir, rss_bytes

CTX = 4096
BATCH = 64
K = 8
DEMO = Path(lookupdec.__file__).parent / "data"
# The clock every measurement reads (--clock): wall time, or this process's CPU time, which
# leaves out the time the process waits for a core on a shared, loaded machine.
CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}
CLOCK = [time.perf_counter]


def load_text() -> tuple[list[int], str]:
    real = data_dir() / "wiki.test.raw.llama3.bin"
    path = real if real.is_file() else DEMO / "wiki.test.demo.llama3.bin"
    tokens: list[int] = np.fromfile(path, dtype="<i4").tolist()
    return tokens, path.name


def accepted_prefix(draft: list[int], text: list[int], pos: int, end: int) -> list[int]:
    """The draft tokens the "model" (the true text) accepts, plus its own next token."""
    out: list[int] = []
    for t in draft:
        if pos + len(out) >= end or text[pos + len(out)] != t:
            break
        out.append(t)
    if pos + len(out) < end:
        out.append(text[pos + len(out)])
    return out


# --- 1. one request -------------------------------------------------------------------------


def one_request_bare(impl: Any, static: Any, text: list[int]) -> tuple[float, int]:
    """Seconds and steps of the bare loop over one CTX-token request (draft + update)."""
    ctx, dyn = impl.NgramCache(), impl.NgramCache()
    out = text[:1]
    steps = 0
    t0 = CLOCK[0]()
    while len(out) < CTX:
        drafted = [out[-1]]
        impl.draft(out, drafted, K, impl.NGRAM_MIN, impl.NGRAM_MAX, ctx, dyn, static)
        new = accepted_prefix(drafted[1:], text, len(out), CTX)
        out.extend(new)
        ctx.update(out, len(new))
        steps += 1
    dyn.merge(ctx)  # the request ends: its context joins the dynamic cache (the Drafter's end() does this)
    return CLOCK[0]() - t0, steps


def one_request_drafter(impl: Any, static: Any, text: list[int], policy: str = "llama") -> tuple[float, int]:
    """Seconds and steps of the same request through ``Drafter.request`` (propose + extend)."""
    drafter = impl.Drafter(static=static, n_draft=K, policy=policy)
    steps = 0
    t0 = CLOCK[0]()
    with drafter.request(text[:1]) as req:
        while len(req.tokens) < CTX:
            new = accepted_prefix(req.propose(), text, len(req.tokens), CTX)
            req.extend(new)
            steps += 1
    return CLOCK[0]() - t0, steps


# --- 2. a batch of 64 -------------------------------------------------------------------------


class Batch:
    """BATCH requests decoding side by side, each over its own slice of the text."""

    def __init__(self, text: list[int], prompt: int) -> None:
        span = CTX + K + 1
        starts = [(i * 4099) % (len(text) - span) for i in range(BATCH)]
        self.texts = [text[s : s + span] for s in starts]
        self.prompt = prompt
        self.drafts: list[list[int]] = [[] for _ in range(BATCH)]
        self.n_tokens = [prompt] * BATCH

    def commit(self, i: int) -> list[int]:
        new = accepted_prefix(self.drafts[i], self.texts[i], self.n_tokens[i], CTX)
        self.n_tokens[i] += len(new)
        return new

    @property
    def running(self) -> bool:
        return min(self.n_tokens) < CTX


def batch_proposer(
    impl: Any, static: Any, text: list[int], prompt: int, policy: str = "llama"
) -> tuple[float, int, Any]:
    """Seconds inside ``LookupProposer.propose`` and the number of batches, until every row is full."""
    b = Batch(text, prompt)
    proposer = LookupProposer(_config(), drafter=impl.Drafter(static=static, n_draft=K, policy=policy))
    token_ids = np.zeros((BATCH, CTX + K + 1), dtype=np.int32)
    num_tokens = np.zeros(BATCH, dtype=np.int32)
    for i in range(BATCH):
        token_ids[i, :prompt] = b.texts[i][:prompt]
    sampled: list[list[int]] = []
    for i in range(BATCH):  # the prefill step samples each row's first token
        b.n_tokens[i] += 1
        token_ids[i, prompt] = b.texts[i][prompt]
        sampled.append([b.texts[i][prompt]])
    num_tokens[:] = b.n_tokens
    # The prefill step (requests start, prompts counted) is untimed, as in the other two variants.
    b.drafts = proposer.propose(sampled, num_tokens, token_ids)
    sampled = []
    for i in range(BATCH):
        new = b.commit(i)
        token_ids[i, b.n_tokens[i] - len(new) : b.n_tokens[i]] = new
        sampled.append(new)
    num_tokens[:] = b.n_tokens
    elapsed = 0.0
    batches = 0
    while True:
        t0 = CLOCK[0]()
        drafts = proposer.propose(sampled, num_tokens, token_ids)
        elapsed += CLOCK[0]() - t0
        batches += 1
        b.drafts = drafts
        if not b.running:
            break
        sampled = []
        for i in range(BATCH):
            start = b.n_tokens[i]
            new = b.commit(i) if start < CTX else []
            token_ids[i, start : start + len(new)] = new
            sampled.append(new)
        num_tokens[:] = b.n_tokens
    proposer.end_all()
    return elapsed, batches, proposer.drafter


def _run_batch(b: Batch, step: Callable[[list[list[int]]], None]) -> tuple[float, int]:
    """Time ``step(new tokens per row)`` once per batch until every row is full."""
    elapsed = 0.0
    batches = 0
    new_per_row: list[list[int]] = [[] for _ in range(BATCH)]
    while True:
        t0 = CLOCK[0]()
        step(new_per_row)
        elapsed += CLOCK[0]() - t0
        batches += 1
        if not b.running:
            return elapsed, batches
        new_per_row = [b.commit(i) if b.n_tokens[i] < CTX else [] for i in range(BATCH)]


def batch_requests(impl: Any, static: Any, text: list[int], prompt: int, policy: str = "llama") -> tuple[float, int]:
    """The same batch driven by request id: ``Request.extend`` + ``propose`` per row."""
    b = Batch(text, prompt)
    drafter = impl.Drafter(static=static, n_draft=K, policy=policy)
    reqs = [drafter.request(t[: prompt + 1]) for t in b.texts]
    b.n_tokens = [prompt + 1] * BATCH

    def step(new_per_row: list[list[int]]) -> None:
        for i, req in enumerate(reqs):
            if new_per_row[i]:
                req.extend(new_per_row[i])
            b.drafts[i] = req.propose()

    result = _run_batch(b, step)
    for req in reqs:
        req.end()
    return result


def batch_bare(impl: Any, static: Any, text: list[int], prompt: int) -> tuple[float, int]:
    """The same batch with bare caches: ``NgramCache.update`` + ``draft`` per row."""
    b = Batch(text, prompt)
    dyn = impl.NgramCache()
    outs = [t[: prompt + 1] for t in b.texts]
    ctxs = []
    for out in outs:
        c = impl.NgramCache()
        c.update(out, len(out))
        ctxs.append(c)
    b.n_tokens = [prompt + 1] * BATCH

    def step(new_per_row: list[list[int]]) -> None:
        for i, out in enumerate(outs):
            if new_per_row[i]:
                out.extend(new_per_row[i])
                ctxs[i].update(out, len(new_per_row[i]))
            drafted = [out[-1]]
            impl.draft(out, drafted, K, impl.NGRAM_MIN, impl.NGRAM_MAX, ctxs[i], dyn, static)
            b.drafts[i] = drafted[1:]

    return _run_batch(b, step)


def _config() -> Any:
    from types import SimpleNamespace

    return SimpleNamespace(
        speculative_config=SimpleNamespace(num_speculative_tokens=K),
        model_config=SimpleNamespace(max_model_len=CTX + K + 1),
    )


# --- 3. memory --------------------------------------------------------------------------------


def memory_per_request(impl: Any, text: list[int]) -> float:
    """Bytes of resident memory per open request holding CTX tokens (64 requests open)."""
    drafter = impl.Drafter(n_draft=K)
    span = CTX
    slices = [text[(i * 4099) % (len(text) - span) :][:span] for i in range(BATCH)]
    gc.collect()
    before = rss_bytes()
    reqs = [drafter.request(s) for s in slices]
    gc.collect()
    grown = rss_bytes() - before
    for r in reqs:
        r.end()
    return grown / BATCH


# --- acceptance on the shipped demo replay ------------------------------------------------------


def demo_acceptance(impl: Any, policy: str = "llama") -> None:
    """Drafted/accepted on the shipped demo text: replay, a Drafter driven the same way, the vLLM adapter.

    Tokens per step is (accepted + proposals) / proposals: what a verification step gains.
    """
    text: list[int] = np.fromfile(DEMO / "wiki.test.demo.llama3.bin", dtype="<i4").tolist()
    corpus: list[int] = np.fromfile(DEMO / "enwiki_wt.demo.llama3.bin", dtype="<i4").tolist()
    print(f"acceptance on the shipped demo replay ({len(text):,} tokens, n_ctx {CTX}, n_draft {K}, policy {policy}):")
    for label, static in (("none", None), ("demo corpus", impl.build_static(corpus))):
        r = impl.replay(text, CTX, K, static, None, None, policy)
        drafter = impl.Drafter(static=static, n_draft=K, policy=policy)
        for start in range(0, len(text) - CTX, CTX):  # llama-lookup-stats' loop, through requests
            chunk = text[start : start + CTX]
            with drafter.request(chunk[:1]) as req:
                while len(req.tokens) < CTX:
                    req.extend(accepted_prefix(req.propose(), chunk, len(req.tokens), CTX))
        d = drafter.stats
        _, _, v = batch_proposer(impl, static, text, 512, policy)
        vs = v.stats
        print(
            f"  static {label:<12} replay {r.n_accept:,}/{r.n_drafted:,} = {r.accept:.2f} %, "
            f"{r.tokens_per_step:.4f} tokens/step"
        )
        print(f"  {'':19} Drafter {d.n_accept:,}/{d.n_drafted:,} = {d.accept:.2f} %, {_per_step(d):.4f} tokens/step")
        print(
            f"  {'':19} vLLM adapter, {BATCH} concurrent: {vs.n_accept:,}/{vs.n_drafted:,} = {vs.accept:.2f} %, "
            f"{_per_step(vs):.4f} tokens/step"
        )


def _per_step(stats: Any) -> float:
    """Tokens a verification step gains on average: (accepted + proposals) / proposals."""
    return (stats.n_accept + stats.proposals) / stats.proposals if stats.proposals else 0.0


# --- driver ------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--impl", choices=("reference", "fast"), default=lookupdec.IMPLEMENTATION)
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (medians are reported)")
    parser.add_argument("--static", action="store_true", help="use the shipped demo corpus as static cache")
    parser.add_argument("--prompt", type=int, default=512, help="prompt tokens of each batch request")
    parser.add_argument("--accept", action="store_true", help="only the acceptance on the shipped demo replay")
    parser.add_argument("--policy", choices=("llama", "hybrid"), default="llama", help="the Drafters' policy")
    parser.add_argument(
        "--clock", choices=tuple(CLOCKS), default="wall", help="wall time, or process CPU time (steadier when loaded)"
    )
    args = parser.parse_args()
    impl = lookupdec.implementation(args.impl)
    CLOCK[0] = CLOCKS[args.clock]
    if args.accept:
        demo_acceptance(impl, args.policy)
        return
    text, name = load_text()
    static: Any = None
    if args.static:
        corpus: list[int] = np.fromfile(DEMO / "enwiki_wt.demo.llama3.bin", dtype="<i4").tolist()
        static = impl.build_static(corpus)
    chunk = text[:CTX]
    runs: dict[str, Callable[[], tuple[float, int]]] = {
        "one.bare": lambda: one_request_bare(impl, static, chunk),
        "one.drafter": lambda: one_request_drafter(impl, static, chunk, args.policy),
        "batch.bare": lambda: batch_bare(impl, static, text, args.prompt),
        "batch.requests": lambda: batch_requests(impl, static, text, args.prompt, args.policy),
        "batch.vllm": lambda: batch_proposer(impl, static, text, args.prompt, args.policy)[:2],
    }
    per_step: dict[str, list[float]] = {k: [] for k in runs}
    steps: dict[str, int] = {}
    names = list(runs)
    for r in range(args.rounds):
        order = names[r % len(names) :] + names[: r % len(names)]  # rotate: no fixed position advantage
        for key in order:
            seconds, n = runs[key]()
            per_step[key].append(seconds / n)
            steps[key] = n
    med = {k: statistics.median(v) * 1e6 for k, v in per_step.items()}
    _, _, drafter = batch_proposer(impl, static, text, args.prompt, args.policy)
    mem = memory_per_request(impl, text)
    where = "demo corpus" if static is not None else "none"
    label = f"impl={args.impl} compiled={impl.COMPILED} static={where} policy={args.policy} clock={args.clock}"
    print(f"# bench_drafter: {label}, text={name}, rounds={args.rounds}, medians")
    print(f"one request, context {CTX} ({steps['one.bare']} steps):")
    print(f"  bare draft+update        {med['one.bare']:8.2f} µs/step")
    print(
        f"  Drafter propose+extend   {med['one.drafter']:8.2f} µs/step"
        f"   overhead {_pct(med['one.drafter'], med['one.bare'])}"
    )
    print(f"{BATCH} concurrent requests, prompt {args.prompt}, up to {CTX} tokens ({steps['batch.vllm']} batches):")
    for key, title in (
        ("batch.bare", "bare draft+update"),
        ("batch.requests", "Request objects"),
        ("batch.vllm", "vLLM LookupProposer"),
    ):
        v = med[key]
        extra = "" if key == "batch.bare" else f"   overhead {_pct(v, med['batch.bare'])}"
        print(f"  {title:<24} {v:8.1f} µs/batch  {v / BATCH:7.2f} µs/request{extra}")
    st = drafter.stats
    print(f"  vLLM adapter acceptance: {st.n_accept:,} of {st.n_drafted:,} drafted ({st.accept:.2f} %)")
    print(f"memory per open request ({CTX} tokens, {BATCH} open): {mem / 1024:.0f} KiB RSS")


def _pct(value: float, base: float) -> str:
    return f"{100.0 * (value - base) / base:+.1f} %"


if __name__ == "__main__":
    main()
