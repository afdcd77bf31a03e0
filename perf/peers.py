"""Peer drafters replayed with lookupdec's own protocol: tokens per step on WikiText and held-out text.

The hybrid policy against the drafters other engines ship: this script replays
the two sets of ``perf.bench_policy`` (``wikitext``: WikiText-103 test with the static index of
``enwiki_wt.10M``; ``heldout``: the second half of ``enwiki_wt.10M`` with the first half as the
static corpus; on request ``code``: held-out Python with the ``enwiki_wt.10M`` static corpus) with
each peer, in exactly the loop of ``lookupdec.reference.replay`` (spec 8.2,
llama-lookup-stats): the text is cut into ``n_ctx`` chunks while ``i_start + n_ctx < len``; each
chunk is one request whose first token is given; every step drafts (up to ``k`` tokens), accepts
the drafted tokens that equal the text (not past the chunk end), then appends the true next token
(the "sampled" one) unless the chunk is full; drafted tokens past the chunk end still count.

Peers (``--peers``, comma-separated):

- ``llama``: llama.cpp's rule with the static index, lookupdec's own ``replay`` (the baseline);
- ``hf``: Hugging Face prompt lookup, transformers' own ``PromptLookupCandidateGenerator``
  (``max_matching_ngram_size=2``, ``num_output_tokens=k``) called on the request's token tensor;
  ``hf3`` (only when asked for) the same with ``max_matching_ngram_size=3``;
- ``vllm``, ``vllm25``: vLLM's ngram proposer, defaults (``prompt_lookup_min = max = 5``) and
  n = 2..5, reimplemented (vLLM is not a dependency; :class:`VllmNgram` says what it follows);
- ``suffix``, ``suffix+corpus``: SuffixDecoding, Arctic Inference's own ``SuffixDecodingCache``
  (its defaults, ``max_spec_tokens=k``), driven as its ``simulator.py`` drives it; ``+corpus``
  first adds the static corpus as one earlier response; ``suffix4``, ``suffix4+corpus`` (only when
  asked for) the same with ``max_spec_factor=4``. Needs the ``arctic_inference.suffix_decoding``
  extension on ``PYTHONPATH`` (perf/README.md, "Peers": how to build it).

A peer whose package is not importable is skipped with a message.

    python -m perf.peers                                  # both sets, every peer
    python -m perf.peers --sets wikitext --peers hf,vllm --json results/peers.json
    python -m perf.peers --sets code --peers suffix,suffix+corpus --work /work/grounded
    python -m perf.peers --match-waste   # and lookupdec's hybrid policy at each peer's waste

``--match-waste`` answers "more tokens per step at no more waste?": for every peer but
``llama`` it replays ``hybrid`` and ``hybrid+corpus`` (``perf policy``'s, the corpus's static
index, and the corpus in the history too) with the waste controller steered to the largest tenth
of a token at least 0.01 below the peer's wasted tokens per step (:func:`matched_target`), and
prints their tokens per step against the peer's.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from lookupdec.result import ReplayResult
from perf._common import N_CTX, N_DRAFT, data_dir
from perf.bench_policy import ALL_SETS, DEFAULT_WORK, SETS, corpus_history, load_set, static_index
from perf.grounded_data import GroundedDataError

ProgressCallback = Callable[[int, int], None]
"""Called as ``progress(tokens_done, tokens_total)`` after every chunk."""

PEERS = ("llama", "hf", "vllm", "vllm25", "suffix", "suffix+corpus")
"""The peers of docs/performance.md's table, the default ``--peers``."""
EXTRA_PEERS = ("suffix4", "suffix4+corpus", "hf3")
"""Only on request: SuffixDecoding with ``max_spec_factor=4`` (a length factor of 4)."""
HYBRID_VARIANTS = ("hybrid", "hybrid+corpus")
"""``--match-waste``'s lookupdec rows: the hybrid policy with the static index, and with the corpus in
its history too."""
MATCH_MARGIN = 0.01
"""``--match-waste`` steers at least this far below a peer's waste: the controller ends a run a few
thousandths of a token above its target (1.902-1.903 wasted per step at 1.9)."""
# Large enough that an engine's own length limit never cuts a draft: the lookup-stats protocol
# counts drafts past the chunk end, and a request's model context is not the chunk.
NO_LIMIT = 1 << 30


class PeerUnavailable(Exception):
    """The package a peer needs is not importable."""


class PeerDrafter(Protocol):
    """What the replay loop drives: one request at a time, like an engine's drafter."""

    def begin(self, prompt: list[int]) -> None:
        """A new request starts with ``prompt`` (the chunk's first token)."""

    def propose(self, out: list[int]) -> list[int]:
        """The draft for the next step; ``out`` is the request's tokens so far."""

    def observe(self, new_tokens: list[int]) -> None:
        """The step's outcome: the accepted drafted tokens, then the sampled one (if any)."""

    def end(self) -> None:
        """The request is finished."""


@dataclass
class Generation:
    """The counts of one teacher-forced generation (:func:`teacher_force`)."""

    n_steps: int = 0
    n_drafted: int = 0
    n_accept: int = 0
    t_draft_s: float = 0.0

    def add(self, other: Generation) -> None:
        """Add another generation's counts and time to these."""
        self.n_steps += other.n_steps
        self.n_drafted += other.n_drafted
        self.n_accept += other.n_accept
        self.t_draft_s += other.t_draft_s


def teacher_force(drafter: PeerDrafter, target: Sequence[int], n_given: int, n_draft: int, name: str) -> Generation:
    """Generate ``target[n_given:]`` after the given ``target[:n_given]``, one request of ``drafter``.

    The llama-lookup-stats step (spec 8.2): draft (up to ``n_draft`` tokens), accept the drafted
    tokens equal to the target (not past its end), then append the true next token (the
    "sampled" one) unless the target is complete; drafted tokens past the end still count. A draft
    longer than ``n_draft`` is an error in the drafter's configuration. ``t_draft_s`` times
    ``propose`` and ``observe`` (drafting and the drafter's updates).
    """
    g = Generation()
    end = len(target)
    out = list(target[:n_given])
    drafter.begin(list(out))
    while len(out) < end:
        g.n_steps += 1
        t0 = time.perf_counter()
        proposal = drafter.propose(out)
        g.t_draft_s += time.perf_counter() - t0
        if len(proposal) > n_draft:
            raise ValueError(f"{name}: drafted {len(proposal)} tokens, more than n_draft = {n_draft}")
        g.n_drafted += len(proposal)
        start = len(out)
        for token in proposal:
            if len(out) >= end or target[len(out)] != token:
                break
            out.append(token)
        g.n_accept += len(out) - start
        if len(out) < end:  # the "sampled" token is the ground truth
            out.append(target[len(out)])
        t0 = time.perf_counter()
        drafter.observe(out[start:])
        g.t_draft_s += time.perf_counter() - t0
    drafter.end()
    return g


def replay_peer(
    tokens: Sequence[int],
    drafter: PeerDrafter,
    n_ctx: int = N_CTX,
    n_draft: int = N_DRAFT,
    name: str = "peer",
    progress: ProgressCallback | None = None,
) -> ReplayResult:
    """Replay ``tokens`` with ``drafter`` in the llama-lookup-stats loop of ``lookupdec.reference.replay``.

    Chunking, acceptance and counting are those of ``replay`` (spec 8.2): only the drafting
    differs. A draft longer than ``n_draft`` is an error in the peer's configuration.
    ``t_draft_s`` times ``propose`` and ``observe`` (drafting and the drafter's updates).
    """
    if n_ctx < 1:
        raise ValueError(f"n_ctx must be >= 1, got {n_ctx}")
    if n_draft < 0:
        raise ValueError(f"n_draft must be >= 0, got {n_draft}")
    tokens = list(tokens)
    total = len(tokens)
    g = Generation()
    i_start = 0
    while i_start + n_ctx < total:
        g.add(teacher_force(drafter, tokens[i_start : i_start + n_ctx], 1, n_draft, name))
        i_start += n_ctx
        if progress is not None:
            progress(min(i_start, total), total)
    # The fields in ReplayResult's order: n_ctx, n_draft, n_tokens, n_predict (as llama.cpp prints
    # it), n_drafted, n_accept, t_draft_s, n_steps, policy.
    n_predict = total - total % n_ctx
    return ReplayResult(n_ctx, n_draft, total, n_predict, g.n_drafted, g.n_accept, g.t_draft_s, g.n_steps, name)


# --- the peers ------------------------------------------------------------------------------


class HFPromptLookup:
    """Hugging Face prompt lookup: transformers' own ``PromptLookupCandidateGenerator.get_candidates``.

    (``transformers/generation/candidate_generator.py``, transformers 5.24.0: for n from
    ``max_matching_ngram_size`` down to 1, the leftmost earlier occurrence of the last n tokens
    that has a continuation; up to ``num_output_tokens`` tokens after it.)

    Its call contract needs only the ``(1, length)`` token tensor (no model): it returns the
    input with the candidates appended. The request's tokens live in one preallocated tensor
    whose prefix is passed, so each step costs only HF's own matching. ``max_length`` is set
    out of reach (:data:`NO_LIMIT`): the protocol drafts up to the chunk end and beyond.
    """

    def __init__(self, n_draft: int, n_ctx: int, max_ngram: int = 2) -> None:
        try:
            import torch
            from transformers.generation.candidate_generator import PromptLookupCandidateGenerator
        except ImportError as e:
            raise PeerUnavailable(f"transformers/torch not importable ({e})") from e
        # One thread: the replays are single-threaded by design (a shared 2-core machine), and
        # HF's matching on <= 4096 tokens gains nothing from more.
        torch.set_num_threads(1)
        self._torch = torch
        # Any: HF annotates LongTensor, which torch's stubs do not give for a slice of a long tensor.
        self._gen: Any = PromptLookupCandidateGenerator(
            num_output_tokens=n_draft, max_matching_ngram_size=max_ngram, max_length=NO_LIMIT
        )
        self._buf = torch.zeros((1, n_ctx + n_draft + 1), dtype=torch.long)
        self._len = 0

    def begin(self, prompt: list[int]) -> None:
        self._len = 0
        self.observe(prompt)

    def propose(self, out: list[int]) -> list[int]:
        if len(out) != self._len:
            raise AssertionError(f"hf: the request has {len(out)} tokens, the tensor {self._len}")
        candidates, _ = self._gen.get_candidates(self._buf[:, : self._len])
        result: list[int] = candidates[0, self._len :].tolist()
        return result

    def observe(self, new_tokens: list[int]) -> None:
        n = len(new_tokens)
        if n:
            self._buf[0, self._len : self._len + n] = self._torch.tensor(new_tokens, dtype=self._torch.long)
            self._len += n

    def end(self) -> None:
        self._len = 0


class VllmNgram:
    """vLLM's ngram proposer (``NgramProposer``), reimplemented: vLLM is not a dependency here.

    The rule followed is ``_find_longest_matched_ngram_and_propose_tokens`` in
    ``vllm/v1/spec_decode/ngram_proposer.py`` (vllm-project/vllm @ 016e8ede870e3c087fdcdfb36ed3622112712f10):
    within the request's own tokens, find the longest n in ``min_n..max_n`` whose last-n-token
    suffix occurs earlier, ending before the last token (occurrences may overlap the suffix);
    of its occurrences take the *earliest*; propose the up to ``k`` tokens that follow it (fewer
    when the sequence ends first; none when the sequence is shorter than ``min_n``; ``k`` also
    capped by ``max_model_len - len``). vLLM finds it with a KMP scan over the reversed tokens on
    every step; here the first occurrence of every n-gram is kept in a dict as tokens arrive (the
    first occurrence never changes), which gives the same draft. tests/test_peers.py checks it
    against a brute-force scan of the rule.
    """

    def __init__(self, min_n: int, max_n: int, k: int, max_model_len: int = NO_LIMIT) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"vllm: need 1 <= min_n <= max_n, got {min_n}..{max_n}")
        self.min_n, self.max_n, self.k, self.max_model_len = min_n, max_n, k, max_model_len
        self._seq: list[int] = []
        self._first: list[dict[tuple[int, ...], int]] = [{} for _ in range(max_n + 1)]

    def begin(self, prompt: list[int]) -> None:
        self._seq = []
        self._first = [{} for _ in range(self.max_n + 1)]
        self.observe(prompt)

    def propose(self, out: list[int]) -> list[int]:
        seq = self._seq
        total = len(seq)
        if total != len(out):
            raise AssertionError(f"vllm: the request has {len(out)} tokens, the drafter {total}")
        k = min(self.k, self.max_model_len - total)
        if total < self.min_n or k <= 0:
            return []
        for n in range(min(self.max_n, total - 1), self.min_n - 1, -1):
            start = self._first[n].get(tuple(seq[total - n :]))
            if start is not None:
                return seq[start + n : start + n + k]
        return []

    def observe(self, new_tokens: list[int]) -> None:
        seq = self._seq
        old = len(seq)
        seq.extend(new_tokens)
        # An occurrence ending at index e is usable once a token follows it (e <= len - 2).
        for e in range(max(old - 1, 0), len(seq) - 1):
            for n in range(self.min_n, min(self.max_n, e + 1) + 1):
                self._first[n].setdefault(tuple(seq[e - n + 1 : e + 1]), e - n + 1)

    def end(self) -> None:
        self._seq = []


def import_suffix_cache() -> Any:
    """Arctic Inference's ``SuffixDecodingCache`` class, or :class:`PeerUnavailable`."""
    try:
        from arctic_inference.suffix_decoding import SuffixDecodingCache
    except ImportError as e:
        raise PeerUnavailable(
            f"arctic_inference.suffix_decoding not importable ({e}); build it as perf/README.md ('Peers') says"
        ) from e
    return SuffixDecodingCache


class SuffixDecoding:
    """SuffixDecoding: Arctic Inference's own ``SuffixDecodingCache``, driven as its ``simulator.py`` does.

    Each request: ``start_request(id, prompt)``; every step ``speculate(id, prompt + response,
    max_spec_tokens=k)`` with the cache's defaults otherwise (``max_tree_depth`` 64,
    ``max_spec_factor`` 1, ``max_spec_offset`` 0, ``min_token_prob`` 0.1, a path, not a tree),
    then ``add_active_response(id, accepted + sampled)``; at the end ``stop_request(id)`` (its
    response stays in the global tree for later requests). ``corpus`` is added first as one
    earlier request's response (``start_request``/``add_active_response``/``stop_request``, as
    the simulator adds its training examples).
    """

    def __init__(self, n_draft: int, n_ctx: int, corpus: Sequence[int] | None = None, **speculate: Any) -> None:
        cls = import_suffix_cache()
        self._cache = cls()
        self._k = n_draft
        self._speculate = speculate
        self._depth: int = self._cache.max_tree_depth
        self._buf = np.zeros(n_ctx + n_draft + 1, dtype=np.int32)
        self._len = 0
        self._req = 0
        if corpus is not None:
            self._cache.start_request(-1, np.zeros(0, dtype=np.int32))
            self._cache.add_active_response(-1, np.ascontiguousarray(corpus, dtype=np.int32))
            self._cache.stop_request(-1)

    def begin(self, prompt: list[int]) -> None:
        self._req += 1
        n = len(prompt)
        self._buf[:n] = prompt
        self._len = n
        self._cache.start_request(self._req, self._buf[:n].copy())

    def propose(self, out: list[int], n_draft: int | None = None) -> list[int]:
        """The draft after ``out`` (the request so far), up to ``n_draft`` tokens (default: the ``k`` given)."""
        if len(out) != self._len:
            raise AssertionError(f"suffix: the request has {len(out)} tokens, the buffer {self._len}")
        # The cache itself keeps only the last max_tree_depth tokens of the context; cutting here
        # first only saves passing the whole request.
        context = self._buf[max(0, self._len - self._depth) : self._len]
        k = self._k if n_draft is None else n_draft
        draft = self._cache.speculate(self._req, context, max_spec_tokens=k, **self._speculate)
        result: list[int] = list(draft.token_ids)
        return result

    def observe(self, new_tokens: list[int]) -> None:
        n = len(new_tokens)
        self._buf[self._len : self._len + n] = new_tokens
        self._len += n
        self._cache.add_active_response(self._req, new_tokens)

    def end(self) -> None:
        self._cache.stop_request(self._req)


# --- the replays ----------------------------------------------------------------------------


def llama_replay(replay: list[int], corpus: list[int], cache: Path, name: str) -> ReplayResult:
    """llama.cpp's rule with the corpus's static index: lookupdec's fast ``replay``."""
    from lookupdec import fast

    static = static_index(fast, corpus, cache / f"{name}.static.lkdc")
    result: ReplayResult = fast.replay(replay, N_CTX, N_DRAFT, static, None, None, "llama")
    return result


def make_drafter(peer: str, corpus: list[int], k: int = N_DRAFT, n_ctx: int = N_CTX) -> PeerDrafter:
    """The drafter of one peer name (:data:`PEERS` but ``llama``, :data:`EXTRA_PEERS`) drafting up
    to ``k`` tokens in requests of at most ``n_ctx``; may raise :class:`PeerUnavailable`."""
    if peer == "hf":
        return HFPromptLookup(k, n_ctx)
    if peer == "hf3":
        return HFPromptLookup(k, n_ctx, max_ngram=3)
    if peer == "vllm":
        return VllmNgram(5, 5, k)
    if peer == "vllm25":
        return VllmNgram(2, 5, k)
    if peer == "suffix":
        return SuffixDecoding(k, n_ctx)
    if peer == "suffix+corpus":
        return SuffixDecoding(k, n_ctx, corpus)
    if peer == "suffix4":
        return SuffixDecoding(k, n_ctx, max_spec_factor=4.0)
    if peer == "suffix4+corpus":
        return SuffixDecoding(k, n_ctx, corpus, max_spec_factor=4.0)
    raise ValueError(f"unknown peer {peer!r} (known: {', '.join(PEERS + EXTRA_PEERS)})")


def row(set_name: str, peer: str, r: ReplayResult, setup_s: float) -> dict[str, Any]:
    """One result row (JSON and table)."""
    return {
        "set": set_name,
        "peer": peer,
        "n_tokens": r.n_tokens,
        "n_steps": r.n_steps,
        "n_accept": r.n_accept,
        "n_drafted": r.n_drafted,
        "tokens_per_step": r.tokens_per_step,
        "wasted_per_step": r.wasted_per_step,
        "us_per_step": 1e6 * r.t_draft_s / r.n_steps if r.n_steps else 0.0,
        "setup_s": setup_s,
    }


def matched_target(wasted_per_step: float) -> float | None:
    """The hybrid policy's ``target_waste`` for a comparison with a peer that wasted
    ``wasted_per_step`` tokens per step: the largest tenth of a token (the waste controller's
    resolution) at least :data:`MATCH_MARGIN` below it; None below 0.1 (a target of 0 fixes the
    threshold instead of steering it)."""
    t10 = math.floor(round((wasted_per_step - MATCH_MARGIN) * 10, 9))
    return t10 / 10 if t10 >= 1 else None


def hybrid_replay(
    replay: list[int], corpus: list[int], cache: Path, name: str, target_waste: float, with_corpus: bool
) -> ReplayResult:
    """The hybrid policy steered to ``target_waste``, with the corpus's static index and, with
    ``with_corpus``, the corpus in its history (``perf policy``'s ``hybrid`` and ``hybrid+corpus``)."""
    from lookupdec import fast

    static = static_index(fast, corpus, cache / f"{name}.static.lkdc")
    history = corpus_history(fast, corpus) if with_corpus else None
    result: ReplayResult = fast.replay(
        replay, N_CTX, N_DRAFT, static, None, None, "hybrid", history, target_waste=target_waste
    )
    return result


def match_waste(
    set_rows: list[dict[str, Any]], replay: list[int], corpus: list[int], cache: Path, set_name: str
) -> list[dict[str, Any]]:
    """``hybrid`` and ``hybrid+corpus`` at each peer's waste (:func:`matched_target`), a row each,
    its ``matched_to`` the peer's name (one replay per distinct target and variant)."""
    done: dict[tuple[str, float], dict[str, Any]] = {}
    rows: list[dict[str, Any]] = []
    for peer_row in set_rows:
        target = matched_target(peer_row["wasted_per_step"])
        if peer_row["peer"] == "llama" or target is None:
            continue
        for variant in HYBRID_VARIANTS:
            key = (variant, target)
            if key not in done:
                t0 = time.perf_counter()
                r = hybrid_replay(replay, corpus, cache, set_name, target, variant == "hybrid+corpus")
                done[key] = row(set_name, f"{variant}@{target}", r, 0.0)
                print(
                    f"perf.peers: {set_name} {variant} at {target} wasted/step: "
                    f"{done[key]['tokens_per_step']:.4f} tokens/step ({time.perf_counter() - t0:.0f} s)",
                    file=sys.stderr,
                    flush=True,
                )
            rows.append({**done[key], "matched_to": peer_row["peer"], "variant": variant, "target_waste": target})
    return rows


def print_matched(rows: list[dict[str, Any]]) -> None:
    """The table of each peer against the hybrid policy at no more waste per step."""
    peer_rows = {(x["set"], x["peer"]): x for x in rows if "matched_to" not in x}
    matched: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
    for x in rows:
        if "matched_to" in x:
            matched.setdefault((x["set"], x["matched_to"]), {})[x["variant"]] = x
    if not matched:
        return
    print()
    print("At no more waste: each peer against the hybrid policy steered to a tenth of a token below its waste")
    print()
    hybrid_cols = " | ".join(f"{v} | wasted/step | ratio" for v in HYBRID_VARIANTS)
    print(f"| set | peer | tokens/step | wasted/step | target | {hybrid_cols} |")
    print("|---" * (5 + 3 * len(HYBRID_VARIANTS)) + "|")
    over = False
    for (set_name, peer), by in matched.items():
        p = peer_rows[(set_name, peer)]
        cells = []
        for variant in HYBRID_VARIANTS:
            h = by[variant]
            # the controller cannot always steer as low as asked (its threshold is bounded)
            mark = " (more waste)" if h["wasted_per_step"] > p["wasted_per_step"] else ""
            over = over or bool(mark)
            cells.append(
                f"{h['tokens_per_step']:.4f} | {h['wasted_per_step']:.3f} | "
                f"{h['tokens_per_step'] / p['tokens_per_step']:.3f}x{mark}"
            )
        target = by[HYBRID_VARIANTS[0]]["target_waste"]
        print(
            f"| {set_name} | {peer} | {p['tokens_per_step']:.4f} | {p['wasted_per_step']:.3f} | {target} | "
            + " | ".join(cells)
            + " |"
        )
    if over:
        print()
        print(
            "(more waste): the hybrid policy wasted more per step than the peer: its waste controller's "
            "threshold reached its bound before the target (a comparison at no more waste fails there)"
        )


def replay_all(
    peers: list[str], sets: list[str], cache: Path, work: Path = DEFAULT_WORK, matched: bool = False
) -> list[dict[str, Any]]:
    """Every peer on every set: the table's rows (llama's index files kept in ``cache``); with
    ``matched``, then the hybrid policy at each peer's waste (:func:`match_waste`)."""
    d = data_dir()
    rows: list[dict[str, Any]] = []
    for set_name in sets:
        replay, corpus = load_set(set_name, d, work)
        first = len(rows)
        for peer in peers:
            t0 = time.perf_counter()
            if peer == "llama":
                r = llama_replay(replay, corpus, cache, set_name)
                setup = 0.0
            else:
                try:
                    drafter = make_drafter(peer, corpus)
                except PeerUnavailable as e:
                    print(f"perf.peers: skipping {peer}: {e}", file=sys.stderr)
                    continue
                setup = time.perf_counter() - t0
                r = replay_peer(replay, drafter, name=peer)
                del drafter  # a SuffixDecoding cache over a corpus holds GBs
            rows.append(row(set_name, peer, r, setup))
            x = rows[-1]
            print(
                f"perf.peers: {set_name} {peer}: {x['tokens_per_step']:.4f} tokens/step "
                f"({time.perf_counter() - t0:.0f} s)",
                file=sys.stderr,
                flush=True,
            )
        if matched:
            rows += match_waste(rows[first:], replay, corpus, cache, set_name)
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m perf.peers", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--sets",
        default=",".join(SETS),
        help="comma-separated: " + ", ".join(ALL_SETS) + " (default: the first two)",
    )
    p.add_argument(
        "--work",
        metavar="DIR",
        type=Path,
        default=DEFAULT_WORK,
        help=f"where the code set's sdists and pairs are kept (default: {DEFAULT_WORK}; downloads 6 MB once)",
    )
    p.add_argument(
        "--peers",
        default=",".join(PEERS),
        help="comma-separated: " + ", ".join(PEERS + EXTRA_PEERS) + " (default: the first six)",
    )
    p.add_argument(
        "--match-waste",
        action="store_true",
        help="also replay hybrid and hybrid+corpus steered to each peer's waste (a tenth of a token "
        "below it) and print a table of the two against each peer at no more waste",
    )
    p.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    p.add_argument("--cache-dir", metavar="DIR", help="where llama's static index files are kept (default: a temp dir)")
    args = p.parse_args(argv)
    peers = [x for x in args.peers.split(",") if x]
    sets = [x for x in args.sets.split(",") if x]
    for peer in peers:
        if peer not in PEERS + EXTRA_PEERS:
            p.error(f"unknown peer {peer!r} (known: {', '.join(PEERS + EXTRA_PEERS)})")
    for s in sets:
        if s not in ALL_SETS:
            p.error(f"unknown set {s!r} (known: {', '.join(ALL_SETS)})")
    # Without --cache-dir, llama's index files live in a temporary folder removed at the end.
    with tempfile.TemporaryDirectory(prefix="lookupdec-peers-") as tmp:
        cache = Path(args.cache_dir or tmp)
        cache.mkdir(parents=True, exist_ok=True)
        try:
            rows = replay_all(peers, sets, cache, args.work, args.match_waste)
        except GroundedDataError as e:
            print(f"perf.peers: the code set: {e}", file=sys.stderr)
            return 2
    print("| set | peer | tokens/step | accepted | drafted | wasted/step | steps | µs/step |")
    print("|---|---|---|---|---|---|---|---|")
    for x in rows:
        if "matched_to" in x:
            continue
        print(
            f"| {x['set']} | {x['peer']} | {x['tokens_per_step']:.4f} | {x['n_accept']:,} | {x['n_drafted']:,} | "
            f"{x['wasted_per_step']:.3f} | {x['n_steps']:,} | {x['us_per_step']:.1f} |"
        )
    print_matched(rows)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
