"""perf.oracle: the clairvoyant span copier, checked against brute force and by hand."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import pytest

from perf import grounded
from perf.oracle import Judged, OracleDrafter, Shortfall, SpanOracle
from perf.peers import VllmNgram, teacher_force


def occurs(span: list[int], text: list[int]) -> bool:
    return any(text[i : i + len(span)] == span for i in range(len(text) - len(span) + 1))


def brute_longest(tokens: list[int], text: list[int]) -> int:
    n = 0
    while n < len(tokens) and occurs(tokens[: n + 1], text):
        n += 1
    return n


@pytest.mark.parametrize("seed", range(6))
def test_longest_equals_brute_force(seed: int) -> None:
    rng = random.Random(seed)
    alphabet = rng.choice([2, 3, 5])  # small alphabets: many repeats, many automaton splits
    oracle = SpanOracle()
    for _ in range(3):
        oracle.add_pair([rng.randrange(alphabet) for _ in range(rng.randrange(1, 60))])
    stream = oracle.stream
    for _ in range(300):
        before = rng.randrange(len(stream) + 1)
        query = [rng.randrange(alphabet) for _ in range(rng.randrange(0, 9))]
        if rng.random() < 0.5 and before < len(stream):  # the true continuation, as the drafter asks
            query = stream[before : before + 8]
        assert oracle.longest(query, before) == brute_longest(query, stream[:before]), (query, before)


def test_hand_worked_any_span_and_anchored() -> None:
    # Prompt [1, 2, 3, 4]; output [9, 3, 4, 5].
    # Any span: step 1 drafts nothing (9 never occurred) and samples 9; step 2 drafts [3, 4]
    # (it occurred), accepts both and samples 5: 2 steps, 2 accepted.
    # Anchored: the span must follow an occurrence of the last token. (4, 9) and (9, 3) never
    # occurred: steps 1 and 2 sample 9 and 3; step 3 drafts [4] ((3, 4) occurred, (3, 4, 5) not),
    # accepts it and samples 5: 3 steps, 1 accepted.
    prompt, output = [1, 2, 3, 4], [9, 3, 4, 5]
    counts = {}
    for anchored in (False, True):
        oracle = SpanOracle()
        oracle.add_pair(prompt + output)
        g = teacher_force(OracleDrafter(oracle, 8, anchored), prompt + output, len(prompt), 8, "oracle")
        counts[anchored] = (g.n_steps, g.n_accept, g.n_drafted)
    assert counts == {False: (2, 2, 2), True: (3, 1, 1)}


def test_the_draft_length_and_the_pair_end_bound_the_draft() -> None:
    # The output repeats the prompt: every step drafts k tokens, the last one only what is left.
    prompt = list(range(10, 30))
    oracle = SpanOracle()
    oracle.add_pair(prompt + prompt)
    counts = []
    for anchored in (False, True):
        g = teacher_force(OracleDrafter(oracle, 4, anchored), prompt + prompt, 20, 4, "oracle")
        counts.append((g.n_steps, g.n_accept, g.n_drafted))
    # any span: 4 accepted + 1 sampled per step, 20 tokens in 4 steps. Anchored: (29, 10) never
    # occurred, so step 1 samples 10; then 5 tokens per step; the last drafts the 4 left.
    assert counts == [(4, 16, 16), (5, 16, 16)]


def test_a_request_that_is_not_the_given_pair_is_refused() -> None:
    oracle = SpanOracle()
    oracle.add_pair([1, 2, 3])
    with pytest.raises(ValueError, match="add_pair"):
        OracleDrafter(oracle, 4, anchored=False).begin([7, 8])


@dataclass
class Pair:
    kind: str
    prompt: list[int]
    output: list[int]


def edited_copy(seed: int) -> Pair:
    rng = random.Random(seed)
    old = [rng.randrange(50) for _ in range(400)]  # a small vocabulary: ambiguous matches
    new = old[:120] + [rng.randrange(50) for _ in range(9)] + old[135:300] + old[310:]
    return Pair("code", [999, *old], new)


def test_no_span_copier_takes_fewer_steps_than_the_oracle(tmp_path: Path) -> None:
    # Greedy longest copying is optimal for a copier of contiguous spans (what it can copy from
    # a position, it can copy from any later position inside that span), and vLLM's n-gram rule
    # copies such spans: on the same pairs it needs at least as many steps. It also runs the
    # oracles through `perf grounded`'s own loop, where they waste nothing and lead no table.
    pairs = [edited_copy(s) for s in range(3)]
    rows = grounded.run(pairs, ["vllm", "vllm25", "oracle", "oracle/anchored"], [4, 8], tmp_path)
    by = {(r["drafter"], r["k"]): r for r in rows if r["kind"] == "all"}
    for k in (4, 8):
        any_span, anchored = by[("oracle", k)], by[("oracle/anchored", k)]
        assert any_span["wasted_per_step"] == anchored["wasted_per_step"] == 0.0
        assert any_span["n_steps"] <= anchored["n_steps"]
        for peer in ("vllm", "vllm25"):
            assert anchored["n_steps"] <= by[(peer, k)]["n_steps"], (peer, k)
        best = grounded.best_peer(rows, "all", k)
        assert best is not None and best["drafter"] in ("vllm", "vllm25")
    # and the first pair alone through the protocol gives the oracle's count for it
    oracle = SpanOracle()
    oracle.add_pair(pairs[0].prompt + pairs[0].output)
    g = teacher_force(OracleDrafter(oracle, 8, False), pairs[0].prompt + pairs[0].output, 401, 8, "o")
    v = teacher_force(VllmNgram(2, 5, 8), pairs[0].prompt + pairs[0].output, 401, 8, "v")
    assert g.n_steps < v.n_steps


class Scripted:
    """Proposes fixed drafts, one per step."""

    def __init__(self, drafts: list[list[int]]) -> None:
        self.drafts = drafts

    def begin(self, prompt: list[int]) -> None:
        pass

    def propose(self, out: list[int]) -> list[int]:
        return self.drafts.pop(0) if self.drafts else []

    def observe(self, new_tokens: list[int]) -> None:
        pass

    def end(self) -> None:
        pass


def test_judged_hand_worked() -> None:
    # Prompt [7, 1, 2, 3, 4, 5, 6]; output [1, 2, 3, 4, 5, 6]; k = 4; the anchored ceiling:
    # step 1 (last 6): (6, 1) never occurred: 0. Draft [1], accepted: at the ceiling; 2 sampled.
    # step 2 (last 2): (2, 3, 4, 5, 6) occurred: 4. Draft [3, 9]: a wrong token, 1 accepted, 3 below.
    # step 3 (last 4): (4, 5, 6): 2. Draft [5], accepted, then stopped: short by 1; 6 sampled, done.
    prompt, output = [7, 1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 6]
    oracle = SpanOracle()
    oracle.add_pair(prompt + output)
    judged = Judged(Scripted([[1], [3, 9], [5]]), oracle, 4)
    g = teacher_force(judged, prompt + output, len(prompt), 4, "scripted")
    assert (g.n_steps, g.n_accept, g.n_drafted) == (3, 3, 4)  # the proposals went through unchanged
    assert judged.shortfall == Shortfall(at_ceiling=1, wrong=1, wrong_tokens=3, short=1, short_tokens=1)


def test_run_judges_every_step_of_every_drafter(tmp_path: Path) -> None:
    docs = edited_copy(5)
    pairs = [edited_copy(0), edited_copy(1), Pair("docs", docs.prompt, docs.output)]
    rows = grounded.run(pairs, ["vllm25", "oracle/anchored"], [8], tmp_path, judge=True)
    by = {(r["kind"], r["drafter"]): r for r in rows}
    for kind in ("code", "docs", "all"):
        assert "shortfall" not in by[(kind, "oracle/anchored")]  # the ceiling is not judged against itself
        f = by[(kind, "vllm25")]["shortfall"]
        assert f["at_ceiling"] + f["wrong"] + f["short"] == by[(kind, "vllm25")]["n_steps"]
        assert f["wrong"] > 0  # the edits and the small vocabulary make it copy wrong spans
    code, docs, every = (by[(kind, "vllm25")]["shortfall"] for kind in ("code", "docs", "all"))
    assert every == {key: code[key] + docs[key] for key in every}
