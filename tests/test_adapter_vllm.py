"""lookupdec in vLLM: the LookupProposer under a faithful fake of vLLM V1's call contract."""

from __future__ import annotations

import gc
import json
import multiprocessing
import os
import re
import signal
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

import lookupdec
from lookupdec.adapters import IsolatedDrafter
from lookupdec.adapters._vllm_rows import RowTracker
from lookupdec.adapters.vllm import LookupProposer
from lookupdec.errors import CacheFormatError, VocabularyError
from lookupdec.formats import write_static
from lookupdec.reference.hybrid import THRESHOLD_MAX, THRESHOLD_MIN
from tests.fake_vllm import FakeRequest, FakeVllm, vllm_config
from tests.impls import FastImpl, ImplTests, ReferenceImpl
from tests.test_drafter import demo_tokens


def oracle_proposals(
    impl: Any, static: Any, fake: FakeVllm, k: int, requests: list[FakeRequest], policy: str = "llama"
) -> tuple[dict[int, list[tuple[int, list[int]]]], Any]:
    """What a Drafter driven by request ids proposes for the fake's log; the requests still open
    at the end are ended, as the proposer does when the process exits."""
    drafter = impl.Drafter(static=static, n_draft=k, policy=policy)
    open_requests: dict[int, Any] = {}
    proposals: dict[int, list[tuple[int, list[int]]]] = {}
    for ended, committed in fake.log:
        # In the order they started, as the proposer ends them (the hybrid policy's drafts
        # depend on the order requests enter its history).
        for rid in [rid for rid in open_requests if rid in ended]:
            open_requests.pop(rid).end()
        for rid, n, new in committed:
            if rid not in open_requests:
                open_requests[rid] = drafter.request(new)
            else:
                open_requests[rid].extend(new)
            assert len(open_requests[rid].tokens) == n
            budget = min(k, fake.max_model_len - n)
            proposals.setdefault(rid, []).append((n, open_requests[rid].propose(budget) if budget > 0 else []))
    for req in open_requests.values():
        req.end()
    return proposals, drafter


def make_requests(n: int, max_model_len: int, room: int = 0) -> list[FakeRequest]:
    """``n`` requests over the demo text; none longer than ``max_model_len - room`` tokens."""
    tokens, _ = demo_tokens()
    out = []
    for rid in range(n):
        start = (rid * 137) % (len(tokens) - max_model_len)
        plen = 1 + (rid * 53) % 150  # some prompts need several prefill chunks
        target = min(max_model_len - room, plen + 40 + (rid * 31) % 120)
        out.append(FakeRequest(rid, tokens[start : start + max_model_len], plen, target))
    return out


class VllmProposerTests(ImplTests):
    def static(self) -> Any:
        return self.impl.build_static(demo_tokens()[1])

    def check_against_oracle(
        self, fake: FakeVllm, proposer: LookupProposer, requests: list[FakeRequest], policy: str
    ) -> None:
        for r in requests:  # output identity: every request's row holds exactly the model's text
            assert r.finished and r.n_tokens == r.target_len and r.output == r.text[: r.target_len]
        static = proposer.drafter.static
        expected, oracle = oracle_proposals(self.impl, static, fake, proposer.k, requests, policy)
        assert {r.rid: r.proposals for r in requests} == expected
        proposer.end_all()  # what the process's exit does: the last requests are ended
        stats = proposer.drafter.stats
        assert stats == oracle.stats
        assert stats.requests == len(requests) and proposer.drafter.open_requests == 0  # none counted twice
        assert stats.n_accept == sum(r.n_accept_seen for r in requests) > 100
        assert proposer.drafter.dynamic.contents() == oracle.dynamic.contents()

    @pytest.mark.parametrize(("policy", "wrapped"), [("llama", False), ("hybrid", False), ("llama", True)])
    def test_follows_requests_by_id_at_saturation(self, policy: str, wrapped: bool) -> None:
        # The runner's view: a token budget that leaves running requests out of steps, rows
        # reordered, steps without a proposer call near max_model_len, holes filled before
        # condense, drafts written into the rows. Requests are followed by vLLM's ids.
        k, max_model_len = 6, 250  # several requests run to max_model_len
        drafter = self.impl.Drafter(static=self.static(), n_draft=k, policy=policy)
        proposer = LookupProposer(vllm_config(k, max_model_len), drafter=drafter)
        fake = FakeVllm(
            proposer,
            max_num_seqs=8,
            max_model_len=max_model_len,
            max_num_batched_tokens=24,
            reorder=True,
            wrapped=wrapped,
        )
        requests = make_requests(40, max_model_len)
        fake.run(requests[:20], arrivals={5: requests[20:30], 40: requests[30:]})
        # Each case really happened.
        assert fake.moves > 10 and fake.swaps > 0 and fake.unscheduled > 10 and fake.skipped > 0
        assert fake.steps > fake.calls
        self.check_against_oracle(fake, proposer, requests, policy)

    @pytest.mark.parametrize(("policy", "with_corpus"), [("llama", False), ("hybrid", False), ("hybrid", True)])
    def test_isolated_requests_draft_as_a_fresh_drafter_each(
        self, policy: str, with_corpus: bool, tmp_path: Path
    ) -> None:
        # LOOKUPDEC_ISOLATE's drafter: each request drafts what a fresh Drafter of its own drafts
        # (the oracle: one per request id, driven through the same log), never what the others
        # held; the same engine run with one shared Drafter drafts otherwise (the requests'
        # texts overlap, so the shared one drafts from the others). A corpus file (the text the
        # requests are cut from) is every request's, as the static index is.
        k, max_model_len = 6, 250
        corpus = None
        if with_corpus:
            corpus = os.fspath(tmp_path / "demo.lkcorpus")
            lookupdec.fast.CorpusIndex.from_tokens(demo_tokens()[0]).save(corpus)
        runs = {}
        for isolate in (True, False):
            if isolate:
                drafter: Any = IsolatedDrafter(
                    static=self.static(), n_draft=k, policy=policy, corpus=corpus, drafter_class=self.impl.Drafter
                )
            else:
                drafter = self.impl.Drafter(static=self.static(), n_draft=k, policy=policy, corpus=corpus)
            proposer = LookupProposer(vllm_config(k, max_model_len), drafter=drafter)
            fake = FakeVllm(proposer, max_num_seqs=6, max_model_len=max_model_len, max_num_batched_tokens=24)
            requests = make_requests(24, max_model_len)
            fake.run(requests[:12], arrivals={5: requests[12:]})
            runs[isolate] = (requests, fake, proposer)
        requests, fake, proposer = runs[True]
        own: dict[int, Any] = {}
        bare: dict[int, Any] = {}  # without the corpus
        expected: dict[int, list[tuple[int, list[int]]]] = {}
        without_corpus: dict[int, list[tuple[int, list[int]]]] = {}
        n_accept = 0
        for _ended, committed in fake.log:
            for rid, n, new in committed:
                if rid not in own:
                    static = proposer.drafter.static
                    own[rid] = self.impl.Drafter(static=static, n_draft=k, policy=policy, corpus=corpus).request(new)
                    bare[rid] = self.impl.Drafter(static=static, n_draft=k, policy=policy).request(new)
                else:
                    own[rid].extend(new)
                    bare[rid].extend(new)
                budget = min(k, fake.max_model_len - n)
                expected.setdefault(rid, []).append((n, own[rid].propose(budget) if budget > 0 else []))
                without_corpus.setdefault(rid, []).append((n, bare[rid].propose(budget) if budget > 0 else []))
        for req in own.values():
            n_accept += req.n_accept
            req.end()
        assert {r.rid: r.proposals for r in requests} == expected
        # the corpus was drafted from (it holds every request's text), or it was not given
        assert (sum(without_corpus[r.rid] != r.proposals for r in requests) >= 12) == with_corpus
        assert all(r.finished and r.output == r.text[: r.target_len] for r in requests)
        shared = {r.rid: r.proposals for r in runs[False][0]}
        assert sum(shared[r.rid] != r.proposals for r in requests) >= 6  # isolation changed the drafts
        proposer.end_all()
        gc.collect()  # the ended requests' Drafters go; their counts stay in the stats
        stats = proposer.drafter.stats
        assert stats.requests == len(requests) and proposer.drafter.open_requests == 0
        assert stats.n_accept == n_accept == sum(r.n_accept_seen for r in requests) > 50

    @pytest.mark.parametrize("policy", ["llama", "hybrid"])
    def test_follows_requests_by_content_without_the_runner(self, policy: str) -> None:
        # Without vLLM's runner in reach, rows are matched to requests by their tokens: right
        # through condense, reorder and chunked prefill (no token budget, no skipped step).
        k, max_model_len = 6, 300
        drafter = self.impl.Drafter(static=self.static(), n_draft=k, policy=policy)
        proposer = LookupProposer(vllm_config(k, max_model_len), drafter=drafter)
        fake = FakeVllm(proposer, max_num_seqs=8, max_model_len=max_model_len, reorder=True, expose_runner=False)
        requests = make_requests(40, max_model_len, room=2 * k + 1)
        fake.run(requests[:20], arrivals={5: requests[20:30], 40: requests[30:]})
        assert fake.moves > 3 and fake.swaps > 0 and fake.skipped == 0
        self.check_against_oracle(fake, proposer, requests, policy)

    @pytest.mark.parametrize("policy", ["llama", "hybrid"])
    def test_greedy_output_identical_with_and_without_drafting(self, policy: str) -> None:
        # A greedy model that reads the engine's own rows: whatever the proposer drafts, and
        # whatever it does with the batch it is handed, the committed tokens must be the ones
        # decoding without drafts gives. The model's bigram rule makes text that repeats, so
        # drafts are accepted often and the two runs really take different paths.
        def model(ctx: list[int]) -> int:
            return (ctx[-1] * 7 + 3) % 23

        class NoDrafts:
            k = 6

            def propose(self, sampled: list[list[int]], *_: object, **__: object) -> list[list[int]]:
                return [[] for _ in sampled]

        k, max_model_len = 6, 300

        def run(proposer: Any) -> tuple[list[FakeRequest], FakeVllm]:
            requests = make_requests(24, max_model_len)
            fake = FakeVllm(
                proposer,
                max_num_seqs=6,
                max_model_len=max_model_len,
                model=model,
                max_num_batched_tokens=30,
                reorder=True,
            )
            fake.run(requests[:12], arrivals={3: requests[12:18], 25: requests[18:]})
            return requests, fake

        drafter = self.impl.Drafter(static=self.static(), n_draft=k, policy=policy)
        with_drafts, fake = run(LookupProposer(vllm_config(k, max_model_len), drafter=drafter))
        assert fake.unscheduled > 0 and fake.swaps > 0  # drafts filled the token budget: rows were left out
        without, _ = run(NoDrafts())
        assert all(r.output and len(r.output) == r.target_len for r in without)
        assert [r.output for r in with_drafts] == [r.output for r in without]
        assert sum(r.n_accept for r in with_drafts) > 200  # drafting changed the steps taken
        assert sum(r.n_accept for r in without) == 0

    def test_one_request_at_a_time_counts_like_replay(self) -> None:
        n_ctx, k = 512, 8
        tokens, _ = demo_tokens()
        static = self.static()
        expected_dynamic = self.impl.NgramCache()
        expected = self.impl.replay(tokens, n_ctx, k, static, expected_dynamic)
        # Room past n_ctx so that vLLM's gate (longest row + k within max_model_len) never skips a step.
        max_model_len = n_ctx + 3 * k
        proposer = LookupProposer(vllm_config(k, max_model_len), drafter=self.impl.Drafter(static=static, n_draft=k))
        fake = FakeVllm(proposer, max_num_seqs=1, max_model_len=max_model_len)
        chunks = [tokens[i : i + n_ctx + 1] for i in range(0, len(tokens) - n_ctx, n_ctx)]
        requests = [FakeRequest(rid, chunk, 1, n_ctx) for rid, chunk in enumerate(chunks)]
        fake.run(requests)
        assert fake.skipped == 0
        proposer.end_all()  # the last request: what the process's exit does
        # vLLM drafts once more for a request in the step it finishes; llama-lookup-stats does not.
        wasted = sum(len(d) for r in requests for n, d in r.proposals if n == r.target_len)
        assert sum(r.n_accept for r in requests) == expected.n_accept
        assert sum(r.n_drafted for r in requests) - wasted == expected.n_drafted
        assert proposer.drafter.dynamic.contents() == expected_dynamic.contents()

    @pytest.mark.parametrize("expose_runner", [True, False])
    def test_drafts_stay_within_max_model_len(self, expose_runner: bool) -> None:
        # Without vLLM's gate the proposer's own bound is what keeps drafts in: it must cut them.
        k, max_model_len = 8, 40
        proposer = LookupProposer(vllm_config(k, max_model_len), drafter=self.impl.Drafter(n_draft=k))
        fake = FakeVllm(
            proposer, max_num_seqs=2, max_model_len=max_model_len, gate_drafter_len=False, expose_runner=expose_runner
        )
        text = [3, 4, 5, 6] * 12  # longer than max_model_len: the fake reads the next true token
        requests = [FakeRequest(0, text, 8, max_model_len), FakeRequest(1, text[1:], 5, max_model_len)]
        fake.run(requests)  # the fake asserts n_tokens + len(draft) <= max_model_len at every step
        last = {r.rid: r.proposals[-1] for r in requests}
        assert last == {0: (40, []), 1: (40, [])}
        assert any(0 < len(d) < k and n + len(d) == max_model_len for r in requests for n, d in r.proposals)

    def test_steps_without_a_proposer_call_near_max_model_len(self) -> None:
        # vLLM calls no proposer in a step whose longest row is within k of max_model_len: the
        # rows' tokens of those steps reach the request at the next call, and no request is
        # restarted (which would count its context twice).
        k, max_model_len = 8, 60
        proposer = LookupProposer(vllm_config(k, max_model_len), drafter=self.impl.Drafter(n_draft=k))
        fake = FakeVllm(proposer, max_num_seqs=2, max_model_len=max_model_len)
        text = [3, 4, 5, 6] * 20
        # The long request makes every step after its 44th token skip; the short one keeps
        # decoding through those steps and is proposed for again once the long one has left.
        requests = [
            FakeRequest(0, text, 8, max_model_len),
            FakeRequest(1, text[1:], 5, 59),
            FakeRequest(2, text[2:], 4, 30),
        ]
        fake.run(requests[:2], arrivals={12: requests[2:]})
        assert fake.skipped > 0
        expected, oracle = oracle_proposals(self.impl, None, fake, k, requests)
        assert {r.rid: r.proposals for r in requests} == expected
        proposer.end_all()
        assert proposer.drafter.stats == oracle.stats and proposer.drafter.stats.requests == 3
        assert proposer.drafter.dynamic.contents() == oracle.dynamic.contents()

    def test_request_ids_without_the_runners_live_set(self) -> None:
        # A runner with request ids but no `requests`: a request absent from the batch is
        # taken for finished. A row that holds fewer tokens than its request has seen is a new
        # request under a reused id: the old one ends, the new one starts from the row.
        k, width = 4, 32
        tracker = RowTracker()
        drafter = self.impl.Drafter(n_draft=k)
        rows = np.zeros((2, width), dtype=np.int32)
        rows[0, :6] = [5, 6, 7, 5, 6, 7]
        rows[1, :5] = [1, 2, 3, 1, 2]
        drafts = tracker.step_ids(drafter, [[7], [2]], [6, 5], rows, ["a", "b"], None, k, width)
        assert drafts[0][:2] == [5, 6] and drafter.open_requests == 2
        rows[0, :7] = [5, 6, 7, 5, 6, 7, 5]
        tracker.step_ids(drafter, [[5]], [7], rows, ["a"], None, k, width)  # "b" left: ended
        assert drafter.open_requests == 1 and drafter.stats.requests == 2 and tracker.ended == 1
        rows[0, :3] = [9, 8, 9]  # "a" again, but 3 tokens: not the request seen with 7
        tracker.step_ids(drafter, [[9]], [3], rows, ["a"], {"a"}, k, width)
        assert drafter.stats.requests == 3 and drafter.open_requests == 1 and tracker.ended == 2
        assert list(tracker.by_id["a"].tokens) == [9, 8, 9]
        tracker.end_all()
        assert drafter.open_requests == 0 and drafter.stats.requests == 3 and tracker.ended == 3

    def adaptive_run(self, b: float | None) -> tuple[list[FakeRequest], LookupProposer, FakeVllm]:
        """A batch of requests under an engine whose step costs 80 ms plus ``b`` per verified token,
        and 1 s more with a prefill (``b`` None: the proposer is not adaptive)."""
        k, max_model_len = 6, 300
        drafter = self.impl.Drafter(static=self.static(), n_draft=k, policy="hybrid", target_waste=0)
        timed = TimedSteps(a=0.08, b=b or 0.0, prefill=1.0)
        proposer = LookupProposer(vllm_config(k, max_model_len), drafter=drafter, adaptive=b is not None, clock=timed)
        timed.proposer = proposer
        fake = FakeVllm(timed, max_num_seqs=6, max_model_len=max_model_len)
        timed.batch = fake.input_batch
        requests = make_requests(24, max_model_len, room=2 * k + 1)
        fake.run(requests[:8], arrivals={10: requests[8:16], 60: requests[16:]})
        for r in requests:  # drafting, adaptive or not, never changes the output
            assert r.finished and r.output == r.text[: r.target_len]
        return requests, proposer, fake

    @pytest.mark.parametrize("b", [0.0, 0.001, 0.004, 0.03])
    def test_adaptive_threshold_from_the_batch_step_cost(self, b: float) -> None:
        _, proposer, fake = self.adaptive_run(b)
        cost = proposer.cost
        assert cost is not None
        # Only steps of decoding rows of the same requests were timed (a prefill step costs a
        # second more here, and would throw the slope far off), with each row's own last draft.
        assert 0 < cost.steps < fake.calls
        assert cost.slope == pytest.approx(b, abs=1e-9)
        threshold = cost.threshold()
        assert threshold is not None
        assert proposer.drafter.policy_state.threshold == max(THRESHOLD_MIN, min(THRESHOLD_MAX, threshold))

    def test_adaptive_drafts_less_where_verifying_costs_more(self) -> None:
        drafted = {b: sum(r.n_drafted for r in self.adaptive_run(b)[0]) for b in (None, 0.0, 0.004, 0.03)}
        # Free verification drafts at the lowest threshold, more than the hybrid policy's start;
        # dearer verification drafts less and less.
        assert drafted[0.0] > drafted[None] > drafted[0.004] > drafted[0.03] > 0


class TimedSteps:
    """A fake engine's clock and a wrapper of its proposer: each step costs ``a + b`` per token it
    verified (each decoding row's token and its last draft), ``prefill`` more when a row prefilled."""

    def __init__(self, a: float, b: float, prefill: float) -> None:
        self.a, self.b, self.prefill = a, b, prefill
        self.now = 0.0
        self.proposer: Any = None
        self.batch: Any = None
        self.last: dict[str, int] = {}  # the last draft's length by request id
        self.decoding: set[str] = set()  # requests that sampled before

    @property
    def k(self) -> int:
        k: int = self.proposer.k
        return k

    def __call__(self) -> float:
        return self.now

    def propose(self, sampled: list[list[int]], *args: Any, **kwargs: Any) -> list[list[int]]:
        rids = self.batch.req_ids[: len(sampled)]
        verified = sum(1 + self.last.get(rid, 0) for rid, s in zip(rids, sampled, strict=True) if s)
        prefilled = any(not s or rid not in self.decoding for rid, s in zip(rids, sampled, strict=True))
        self.now += self.a + self.b * verified + (self.prefill if prefilled else 0.0)
        drafts: list[list[int]] = self.proposer.propose(sampled, *args, **kwargs)
        self.last = {rid: len(d) for rid, d in zip(rids, drafts, strict=True)}
        self.decoding.update(rid for rid, s in zip(rids, sampled, strict=True) if s)
        return drafts


class TestVllmProposerReference(ReferenceImpl, VllmProposerTests):
    pass


class TestVllmProposerFast(FastImpl, VllmProposerTests):
    pass


def test_settings_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    static, dynamic = tmp_path / "static.lkdc", tmp_path / "dynamic.bin"
    write_static([((1, 2, -1, -1), [(3, 4)])], static)
    monkeypatch.setenv("LOOKUPDEC_STATIC", os.fspath(static))
    monkeypatch.setenv("LOOKUPDEC_DYNAMIC", os.fspath(dynamic))
    monkeypatch.setenv("LOOKUPDEC_POLICY", "llama")
    proposer = LookupProposer(vllm_config(5, 100))
    assert proposer.drafter.n_draft == 5 and proposer.drafter.dynamic_path == os.fspath(dynamic)
    rows = np.zeros((1, 100), dtype=np.int32)
    rows[0, :3] = [9, 1, 2]
    assert proposer.propose([[2]], [3], rows) == [[3]]  # drafted from the static index
    proposer.close()  # what runs at exit: the open request ends and the dynamic file is saved
    assert dynamic.exists() and proposer.drafter.open_requests == 0
    monkeypatch.setenv("LOOKUPDEC_SAVE_INTERVAL", "soon")
    with pytest.raises(ValueError, match="LOOKUPDEC_SAVE_INTERVAL"):
        LookupProposer(vllm_config(5, 100))
    monkeypatch.delenv("LOOKUPDEC_SAVE_INTERVAL")
    monkeypatch.setenv("LOOKUPDEC_POLICY", "hybrid")
    proposer = LookupProposer(vllm_config(5, 100))
    assert proposer.drafter.policy == "hybrid" and proposer.drafter.policy_state is not None
    assert proposer.propose([[2]], [3], rows) == [[3]]  # llama.cpp's draft first, as with "llama"
    proposer.close()
    # by default the batch's step cost sets the threshold: the waste controller is off
    assert proposer.drafter.policy_state.target_waste10 == 0 and proposer.cost is not None
    monkeypatch.setenv("LOOKUPDEC_TARGET_WASTE", "0.5")
    proposer = LookupProposer(vllm_config(5, 100))
    assert proposer.drafter.policy_state.target_waste10 == 5 and proposer.cost is None
    proposer.close()
    for bad, message in (("less", "must be a number"), ("-1", r"must be in \[0, 64\]")):
        monkeypatch.setenv("LOOKUPDEC_TARGET_WASTE", bad)
        with pytest.raises(ValueError, match=f"LOOKUPDEC_TARGET_WASTE.*{message}"):
            LookupProposer(vllm_config(5, 100))
    monkeypatch.setenv("LOOKUPDEC_TARGET_WASTE", "0.5")
    monkeypatch.setenv("LOOKUPDEC_POLICY", "llama")
    with pytest.raises(ValueError, match=r"steers the hybrid policy's drafts.*LOOKUPDEC_POLICY=llama"):
        LookupProposer(vllm_config(5, 100))
    monkeypatch.delenv("LOOKUPDEC_TARGET_WASTE")
    monkeypatch.setenv("LOOKUPDEC_POLICY", "best")
    with pytest.raises(ValueError, match="policy 'best'"):
        LookupProposer(vllm_config(5, 100))
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        LookupProposer(object())


def test_adaptive_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LOOKUPDEC_TARGET_WASTE", raising=False)
    monkeypatch.setenv("LOOKUPDEC_POLICY", "llama")
    proposer = LookupProposer(vllm_config(5, 100))
    assert proposer.cost is None  # llama.cpp's rule: nothing to price by default
    proposer.close()
    monkeypatch.setenv("LOOKUPDEC_POLICY", "hybrid")
    monkeypatch.setenv("LOOKUPDEC_ADAPTIVE", "1")
    proposer = LookupProposer(vllm_config(5, 100))
    # The step cost sets the threshold: the waste controller is off.
    assert proposer.cost is not None and proposer.drafter.policy_state.target_waste10 == 0
    proposer.close()
    monkeypatch.setenv("LOOKUPDEC_ADAPTIVE", "0")  # the waste target instead, its default 1.9
    proposer = LookupProposer(vllm_config(5, 100))
    assert proposer.cost is None and proposer.drafter.policy_state.target_waste10 == 19
    proposer.close()
    refused = (
        ({"LOOKUPDEC_ADAPTIVE": "sometimes"}, "LOOKUPDEC_ADAPTIVE must be 1 or 0, not 'sometimes'"),
        ({"LOOKUPDEC_ADAPTIVE": "1", "LOOKUPDEC_TARGET_WASTE": "0.5"}, "leave LOOKUPDEC_TARGET_WASTE unset"),
        (
            {"LOOKUPDEC_ADAPTIVE": "1", "LOOKUPDEC_POLICY": "llama"},
            "LOOKUPDEC_ADAPTIVE=1 needs LOOKUPDEC_POLICY=hybrid",
        ),
    )
    for env, message in refused:
        with monkeypatch.context() as m:
            for name, value in env.items():
                m.setenv(name, value)
            with pytest.raises(ValueError, match=message):
                LookupProposer(vllm_config(5, 100))
    with pytest.raises(ValueError, match="needs a Drafter"):
        LookupProposer(vllm_config(5, 100), drafter=lookupdec.Drafter(n_draft=5), adaptive=True)


def test_isolated_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    static = tmp_path / "static.lkdc"
    write_static([((1, 2, -1, -1), [(3, 4)])], static)
    for name in ("LOOKUPDEC_TARGET_WASTE", "LOOKUPDEC_ADAPTIVE", "LOOKUPDEC_DYNAMIC"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LOOKUPDEC_STATIC", os.fspath(static))
    monkeypatch.setenv("LOOKUPDEC_POLICY", "hybrid")
    monkeypatch.setenv("LOOKUPDEC_ISOLATE", "1")
    proposer = LookupProposer(vllm_config(5, 100))
    drafter = proposer.drafter
    assert isinstance(drafter, IsolatedDrafter) and drafter.policy == "hybrid" and proposer.cost is not None
    rows = np.zeros((2, 100), dtype=np.int32)
    rows[0, :3] = [9, 1, 2]
    rows[1, :4] = [7, 7, 1, 2]
    assert proposer.propose([[2], [2]], [3, 4], rows) == [[3], [3]]  # the static index is every request's
    assert drafter.open_requests == 2 and drafter.dynamic_path is None
    drafter.threshold = 0.25  # what the batch's step cost sets: every open request's Drafter, and new ones
    assert {host.hybrid.threshold for host in drafter._live} == {0.25}
    assert drafter.request([5, 6]).propose() == [] and {host.hybrid.threshold for host in drafter._live} == {0.25}
    proposer.close()
    monkeypatch.setenv("LOOKUPDEC_DYNAMIC", os.fspath(tmp_path / "dynamic.bin"))
    with pytest.raises(ValueError, match=r"LOOKUPDEC_ISOLATE=1 isolates requests.*dynamic\.bin"):
        LookupProposer(vllm_config(5, 100))
    monkeypatch.delenv("LOOKUPDEC_DYNAMIC")
    monkeypatch.setenv("LOOKUPDEC_ISOLATE", "maybe")
    with pytest.raises(ValueError, match="LOOKUPDEC_ISOLATE must be 1 or 0, not 'maybe'"):
        LookupProposer(vllm_config(5, 100))
    monkeypatch.setenv("LOOKUPDEC_ISOLATE", "0")
    assert isinstance(LookupProposer(vllm_config(5, 100)).drafter, lookupdec.Drafter)


def test_corpus_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("LOOKUPDEC_TARGET_WASTE", "LOOKUPDEC_ADAPTIVE", "LOOKUPDEC_DYNAMIC", "LOOKUPDEC_STATIC"):
        monkeypatch.delenv(name, raising=False)
    path = tmp_path / "c.lkcorpus"
    lookupdec.fast.CorpusIndex.from_tokens([5, 6, 7, 8, 9]).save(path)
    monkeypatch.setenv("LOOKUPDEC_CORPUS", os.fspath(path))
    monkeypatch.setenv("LOOKUPDEC_POLICY", "hybrid")
    rows = np.zeros((1, 100), dtype=np.int32)
    rows[0, :3] = [1, 5, 6]
    for isolate in ("0", "1"):
        monkeypatch.setenv("LOOKUPDEC_ISOLATE", isolate)
        proposer = LookupProposer(vllm_config(3, 100))
        assert isinstance(proposer.drafter, IsolatedDrafter) == (isolate == "1")
        assert proposer.propose([[6]], [3], rows) == [[7, 8, 9]]  # drafted from the corpus
        proposer.close()
    monkeypatch.setenv("LOOKUPDEC_POLICY", "llama")
    with pytest.raises(
        ValueError, match=r"LOOKUPDEC_CORPUS=.*hybrid policy, not 'llama': set LOOKUPDEC_POLICY to hybrid"
    ):
        LookupProposer(vllm_config(3, 100))
    monkeypatch.setenv("LOOKUPDEC_POLICY", "hybrid")
    (tmp_path / "text.txt").write_text("not a corpus file, but some text of a hundred bytes or more. " * 3)
    monkeypatch.setenv("LOOKUPDEC_CORPUS", os.fspath(tmp_path / "text.txt"))
    with pytest.raises(CacheFormatError, match=r"text\.txt: not a lookupdec corpus file"):
        LookupProposer(vllm_config(3, 100))


def test_history_tokens_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("LOOKUPDEC_TARGET_WASTE", "LOOKUPDEC_ADAPTIVE", "LOOKUPDEC_DYNAMIC", "LOOKUPDEC_CORPUS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LOOKUPDEC_POLICY", "hybrid")
    monkeypatch.setenv("LOOKUPDEC_HISTORY_TOKENS", "4096")
    monkeypatch.setenv("LOOKUPDEC_ISOLATE", "0")
    proposer = LookupProposer(vllm_config(3, 100))
    assert proposer.drafter.policy_state.history.max_tokens == 4096
    proposer.close()
    monkeypatch.setenv("LOOKUPDEC_ISOLATE", "1")
    drafter = LookupProposer(vllm_config(3, 100)).drafter
    req = drafter.request([1, 2, 3])  # kept: an open request dropped takes its Drafter along
    assert [h.hybrid.history.max_tokens for h in drafter._live] == [4096]  # every request's own history
    req.end()
    refused = (
        ("lots", "hybrid", "LOOKUPDEC_HISTORY_TOKENS must be a number of tokens, not 'lots'"),
        ("8", "hybrid", "LOOKUPDEC_HISTORY_TOKENS=8: history_tokens must be >= 16, got 8"),
        ("4096", "llama", "LOOKUPDEC_HISTORY_TOKENS=4096: history_tokens bounds the hybrid policy's history"),
    )
    for raw, policy, message in refused:
        monkeypatch.setenv("LOOKUPDEC_HISTORY_TOKENS", raw)
        monkeypatch.setenv("LOOKUPDEC_POLICY", policy)
        with pytest.raises(ValueError, match=re.escape(message)):
            LookupProposer(vllm_config(3, 100))


def test_files_of_a_larger_vocabulary_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The model's vocabulary (model_config.get_vocab_size()) bounds the files' recorded ones: a
    # static index or corpus of another tokenizer would draft ids the engine cannot take.
    for name in ("LOOKUPDEC_TARGET_WASTE", "LOOKUPDEC_ADAPTIVE", "LOOKUPDEC_DYNAMIC", "LOOKUPDEC_HISTORY_TOKENS"):
        monkeypatch.delenv(name, raising=False)
    static, corpus = tmp_path / "static.lkdc", tmp_path / "c.lkcorpus"
    write_static([((1, 2, -1, -1), [(3, 4)])], static, vocab_size=1000)
    lookupdec.fast.CorpusIndex.from_tokens([5, 6, 7], vocab_size=1000).save(corpus)
    config = vllm_config(3, 100)
    config.model_config.get_vocab_size = lambda: 1000
    monkeypatch.setenv("LOOKUPDEC_STATIC", os.fspath(static))
    monkeypatch.setenv("LOOKUPDEC_CORPUS", os.fspath(corpus))
    monkeypatch.setenv("LOOKUPDEC_POLICY", "hybrid")
    for isolate in ("0", "1"):
        monkeypatch.setenv("LOOKUPDEC_ISOLATE", isolate)
        proposer = LookupProposer(config)
        assert proposer.drafter.vocab_size == 1000
        proposer.close()
    config.model_config.get_vocab_size = lambda: 999
    with pytest.raises(VocabularyError, match=r"static\.lkdc: the static index was built for a vocabulary of 1000"):
        LookupProposer(config)
    monkeypatch.delenv("LOOKUPDEC_STATIC")
    with pytest.raises(VocabularyError, match=r"c\.lkcorpus: the corpus file was built for a vocabulary of 1000"):
        LookupProposer(config)
    # llama.cpp's format records no vocabulary: its ids are read when it is opened.
    monkeypatch.delenv("LOOKUPDEC_CORPUS")
    legacy = tmp_path / "static.bin"
    write_static([((1, 2, -1, -1), [(999, 4)])], legacy, "llama")
    monkeypatch.setenv("LOOKUPDEC_STATIC", os.fspath(legacy))
    for isolate in ("0", "1"):
        monkeypatch.setenv("LOOKUPDEC_ISOLATE", isolate)
        with pytest.raises(VocabularyError, match=r"static\.bin: the static cache holds token id 999, not below"):
            LookupProposer(config)


def test_isolated_drafter_alone() -> None:
    tokens = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2]
    llama = IsolatedDrafter(n_draft=3)
    with pytest.raises(ValueError, match="threshold is the hybrid policy's"):
        llama.threshold = 0.1
    first = llama.request(tokens)
    assert first.propose() == lookupdec.Drafter(n_draft=3).request(tokens).propose() == [3, 4, 1]
    first.extend([3, 4])
    first.end()
    # a second request with the first's text drafts nothing from it: it has seen only [1, 2]
    second = llama.request([1, 2])
    assert second.propose() == [] and llama.open_requests == 1
    llama.n_draft = 1
    assert llama.n_draft == 1 and llama.request(tokens).propose() == [3]
    del first
    gc.collect()
    assert llama.stats.requests == 3 and llama.stats.n_accept == 2 and llama.stats.proposals == 3
    assert "IsolatedDrafter(policy='llama', n_draft=1" in repr(llama)
    with pytest.raises(ValueError, match="n_draft must be >= 0"):
        llama.n_draft = -1
    with pytest.raises(ValueError, match="policy 'best'"):
        IsolatedDrafter(policy="best")


@pytest.mark.parametrize("impl", [lookupdec.fast, lookupdec.reference])
def test_isolated_drafter_with_a_corpus(impl: Any, tmp_path: Path) -> None:
    corpus = [5, 6, 7, 8, 9, 5, 6, 7]
    path = tmp_path / "c.lkcorpus"
    lookupdec.fast.CorpusIndex.from_tokens(corpus).save(path)
    for given in (os.fspath(path), iter(corpus)):  # an iterator is read once, for every request
        drafter = IsolatedDrafter(n_draft=3, policy="hybrid", corpus=given, drafter_class=impl.Drafter)
        fresh = impl.Drafter(n_draft=3, policy="hybrid", corpus=corpus)
        first = drafter.request([1, 5, 6])
        assert first.propose() == fresh.request([1, 5, 6]).propose() == [7, 8, 9]  # drafted from the corpus
        first.extend([7, 1, 2, 3])
        first.end()
        second = drafter.request([4, 5, 6])
        assert second.propose() == [7, 8, 9]  # the corpus again, never the first request's [7, 1, 2]
        assert drafter.request([9, 7, 1]).propose() == []  # the first request's text is not the second's
        hosts = list(drafter._live)
        if impl is lookupdec.fast:  # the compiled corpus is opened (or built) once and shared
            assert len({id(h.hybrid.history.corpus) for h in hosts}) == 1 and len(hosts) >= 2
    with pytest.raises(ValueError, match="corpus is matched by the hybrid policy"):
        IsolatedDrafter(corpus=corpus)
    with pytest.raises(FileNotFoundError, match=r"missing\.lkcorpus"):
        IsolatedDrafter(policy="hybrid", corpus=tmp_path / "missing.lkcorpus")


def env_workload(k: int = 6, max_model_len: int = 200) -> tuple[FakeVllm, LookupProposer, list[FakeRequest]]:
    """A LookupProposer configured from the environment, as vLLM builds it, and a fake engine for it."""
    proposer = LookupProposer(vllm_config(k, max_model_len))
    # No token budget and no row near max_model_len: these tests are about saving, not about rows.
    fake = FakeVllm(proposer, max_num_seqs=4, max_model_len=max_model_len)
    return fake, proposer, make_requests(12, max_model_len, room=2 * k + 1)


def expected_dynamic(tmp_path: Path) -> Any:
    """The dynamic counts of env_workload's requests, every one merged once, in this process."""
    fake, proposer, requests = env_workload()
    assert proposer.drafter.dynamic_path is None
    fake.run(requests)
    proposer.end_all()
    assert proposer.drafter.stats.requests == len(requests)
    return proposer.drafter.dynamic.contents()


def saved_dynamic(path: Path) -> Any:
    return lookupdec.Drafter(dynamic=os.fspath(path)).dynamic.contents()


def child_runs_and_returns() -> None:
    fake, _, requests = env_workload()
    fake.run(requests)  # then the process ends: no close(), and no step after the last requests


def child_runs_until_terminated(ready: Any) -> None:
    # vLLM's EngineCore and workers turn SIGTERM into SystemExit (run_engine_core's signal_handler).
    def on_sigterm(signum: int, frame: Any) -> None:
        raise SystemExit()

    signal.signal(signal.SIGTERM, on_sigterm)
    fake, _, requests = env_workload()
    fake.run(requests)
    ready.set()
    signal.pause()


@pytest.mark.parametrize("how", ["returns", "terminated"])
def test_dynamic_file_saved_when_a_forked_engine_process_exits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    # vLLM runs the proposer in a forked multiprocessing child that leaves through os._exit
    # (atexit never runs there), and calls no proposer after the last requests: the dynamic
    # file must still get every request's counts, each once.
    dynamic = tmp_path / "dynamic.bin"
    for name in ("LOOKUPDEC_STATIC", "LOOKUPDEC_DYNAMIC", "LOOKUPDEC_POLICY"):
        monkeypatch.delenv(name, raising=False)
    expected = expected_dynamic(tmp_path)
    assert len(expected) > 100
    monkeypatch.setenv("LOOKUPDEC_DYNAMIC", os.fspath(dynamic))
    monkeypatch.setenv("LOOKUPDEC_SAVE_INTERVAL", "3600")  # no save while running: only the exit's
    ctx = multiprocessing.get_context("fork")
    if how == "returns":
        child = ctx.Process(target=child_runs_and_returns)
        child.start()
    else:
        ready = ctx.Event()
        child = ctx.Process(target=child_runs_until_terminated, args=(ready,))
        child.start()
        assert ready.wait(120)
        child.terminate()
    child.join(120)
    assert child.exitcode == 0
    assert dynamic.exists(), "the forked process saved nothing"
    assert saved_dynamic(dynamic) == expected


def test_dynamic_file_saved_as_requests_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A process killed outright runs no exit hook: what ended before is already in the file.
    dynamic = tmp_path / "dynamic.bin"
    for name in ("LOOKUPDEC_STATIC", "LOOKUPDEC_DYNAMIC", "LOOKUPDEC_POLICY"):
        monkeypatch.delenv(name, raising=False)
    expected = expected_dynamic(tmp_path)
    monkeypatch.setenv("LOOKUPDEC_DYNAMIC", os.fspath(dynamic))
    monkeypatch.setenv("LOOKUPDEC_SAVE_INTERVAL", "0")
    fake, proposer, requests = env_workload()
    fake.run(requests)
    saved = saved_dynamic(dynamic)  # before close(): saved after the steps that ended requests
    assert len(saved) > 0 and saved != expected  # the last requests end only at exit
    proposer.close()
    assert saved_dynamic(dynamic) == expected
    proposer.close()  # once: a second close adds nothing
    assert saved_dynamic(dynamic) == expected


def test_only_tensor_parallel_rank_0_saves(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # With tensor parallelism every rank runs the proposer on the same batch; saving on each
    # would add the same counts once per rank.
    dynamic = tmp_path / "dynamic.bin"
    for name in ("LOOKUPDEC_STATIC", "LOOKUPDEC_DYNAMIC", "LOOKUPDEC_POLICY"):
        monkeypatch.delenv(name, raising=False)
    expected = expected_dynamic(tmp_path)
    monkeypatch.setenv("LOOKUPDEC_DYNAMIC", os.fspath(dynamic))
    ranks = []
    for rank in (0, 1):
        # What vLLM's worker has loaded: its tensor-parallel group, with this rank.
        state = SimpleNamespace(get_tensor_model_parallel_rank=lambda rank=rank: rank)
        monkeypatch.setitem(sys.modules, "vllm.distributed.parallel_state", state)
        fake, proposer, requests = env_workload()
        fake.run(requests)
        ranks.append(proposer)
    for proposer in ranks:
        proposer.close()
        assert proposer.drafter.open_requests == 0
    assert saved_dynamic(dynamic) == expected
    assert [proposer.saves for proposer in ranks] == [True, False]
    monkeypatch.delitem(sys.modules, "vllm.distributed.parallel_state")
    from lookupdec.adapters.vllm import tensor_parallel_rank

    assert tensor_parallel_rank() == 0  # outside vLLM: nothing imported, rank 0


@pytest.mark.slow
def test_real_vllm() -> None:
    pytest.importorskip(
        "vllm", reason="vLLM is not installed (pip install 'lookupdec[vllm]'): real-engine test skipped"
    )
    model = os.environ.get("LOOKUPDEC_VLLM_MODEL")
    if not model:
        pytest.skip("set LOOKUPDEC_VLLM_MODEL to a small local model to run the real vLLM test")
    from vllm import LLM, SamplingParams

    prompts = ["The capital of France is Paris. The capital of France is"]
    params = SamplingParams(temperature=0.0, max_tokens=48)
    plain = LLM(model=model, enforce_eager=True).generate(prompts, params)
    spec = {"method": "custom_class", "model": "lookupdec.adapters.vllm.LookupProposer", "num_speculative_tokens": 4}
    drafted = LLM(model=model, enforce_eager=True, speculative_config=spec).generate(prompts, params)
    assert [o.outputs[0].token_ids for o in drafted] == [o.outputs[0].token_ids for o in plain]


@pytest.mark.slow
def test_real_vllm_tiny_model(tmp_path: Path) -> None:
    # vLLM's own engine (scheduler, model runner, InputBatch, worker processes) on CPU with a
    # tiny random-weight Llama: greedy output identical with and without the LookupProposer,
    # every call made from a runner whose request ids the proposer found, drafts accepted, and
    # the dynamic file written when the engine's processes exit.
    if os.environ.get("LOOKUPDEC_REQUIRE_VLLM") == "1":  # .ci/run's vLLM venv: a skip would hide a break
        import transformers  # noqa: F401
        import vllm  # noqa: F401
    pytest.importorskip("vllm", reason="vLLM is not installed: real-engine test skipped")
    pytest.importorskip("transformers", reason="transformers writes the tiny model")
    import subprocess

    from tests.real_vllm_run import PROBE_ENV, make_model

    model = tmp_path / "tiny-llama"
    make_model(os.fspath(model))
    dynamic, probe = tmp_path / "dynamic.bin", tmp_path / "probe.json"
    env = dict(os.environ, LOOKUPDEC_DYNAMIC=os.fspath(dynamic), **{PROBE_ENV: os.fspath(probe)})
    root = Path(__file__).resolve().parent.parent
    env["PYTHONPATH"] = os.pathsep.join([os.fspath(root), env.get("PYTHONPATH", "")])
    outputs = {}
    for mode in ("plain", "spec"):
        out = tmp_path / f"{mode}.json"
        run = [sys.executable, "-m", "tests.real_vllm_run", os.fspath(model), os.fspath(out), mode]
        subprocess.run(run, cwd=root, env=env, check=True, timeout=900)
        outputs[mode] = json.loads(out.read_text())
    assert len(outputs["plain"]) == 8 and all(len(o) == 64 for o in outputs["plain"])
    assert outputs["spec"] == outputs["plain"]
    seen = json.loads(probe.read_text())
    assert seen["calls"] > 0 and seen["calls_by_id"] == seen["calls"]
    assert seen["requests"] >= 7  # the last one ends when the process exits, after the last record
    assert seen["num_tokens_no_spec_rows"] == 4  # vLLM passes its whole buffer (max_num_seqs rows)
    assert seen["n_accept"] > 0
    assert dynamic.exists() and len(saved_dynamic(dynamic)) > 0
