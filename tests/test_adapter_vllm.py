"""lookupdec in vLLM: the LookupProposer under a faithful fake of vLLM V1's call contract."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lookupdec.adapters.vllm import LookupProposer
from lookupdec.formats import write_static
from tests.fake_vllm import FakeRequest, FakeVllm, vllm_config
from tests.impls import FastImpl, ImplTests, ReferenceImpl
from tests.test_drafter import demo_tokens


def oracle_proposals(
    impl: Any, static: Any, fake: FakeVllm, k: int, requests: list[FakeRequest], policy: str = "llama"
) -> tuple[dict[int, list[tuple[int, list[int]]]], Any]:
    """What a Drafter driven by request ids (which vLLM does not give) proposes for the fake's log."""
    by_id = {r.rid: r for r in requests}
    drafter = impl.Drafter(static=static, n_draft=k, policy=policy)
    open_requests: dict[int, Any] = {}
    proposals: dict[int, list[tuple[int, list[int]]]] = {}
    for ended, committed in fake.log:
        for rid in ended:
            open_requests.pop(rid).end()
        for rid, new in committed:
            if rid not in open_requests:
                r = by_id[rid]
                open_requests[rid] = drafter.request(r.text[: r.prompt_len + len(new)])
            else:
                open_requests[rid].extend(new)
            n = len(open_requests[rid].tokens)
            budget = min(k, fake.max_model_len - n)
            proposals.setdefault(rid, []).append((n, open_requests[rid].propose(budget) if budget > 0 else []))
    assert not open_requests
    return proposals, drafter


def make_requests(n: int, max_model_len: int) -> list[FakeRequest]:
    tokens, _ = demo_tokens()
    out = []
    for rid in range(n):
        start = (rid * 137) % (len(tokens) - max_model_len)
        plen = 1 + (rid * 53) % 150  # some prompts need several prefill chunks
        target = min(max_model_len, plen + 40 + (rid * 31) % 120)
        out.append(FakeRequest(rid, tokens[start : start + max_model_len], plen, target))
    return out


class VllmProposerTests(ImplTests):
    def static(self) -> Any:
        return self.impl.build_static(demo_tokens()[1])

    @pytest.mark.parametrize("policy", ["llama", "hybrid"])
    def test_follows_requests_through_condense_and_prefill(self, policy: str) -> None:
        k, max_model_len = 6, 300
        static = self.static()
        drafter = self.impl.Drafter(static=static, n_draft=k, policy=policy)
        proposer = LookupProposer(vllm_config(k, max_model_len), drafter=drafter)
        fake = FakeVllm(proposer, max_num_seqs=8, max_model_len=max_model_len)
        requests = make_requests(40, max_model_len)
        fake.run(requests[:20], arrivals={5: requests[20:30], 40: requests[30:]})
        assert fake.moves > 10  # rows really moved
        # Output identity: every request's row holds exactly the model's text.
        for r in requests:
            assert r.finished and r.n_tokens == r.target_len
        expected, oracle = oracle_proposals(self.impl, static, fake, k, requests, policy)
        assert {r.rid: r.proposals for r in requests} == expected
        stats = proposer.drafter.stats
        assert stats == oracle.stats
        assert stats.requests == 40 and proposer.drafter.open_requests == 0
        assert stats.n_accept == sum(r.n_accept for r in requests) > 100
        assert proposer.drafter.dynamic.contents() == oracle.dynamic.contents()

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

            def propose(self, sampled: list[list[int]], *_: object) -> list[list[int]]:
                return [[] for _ in sampled]

        k, max_model_len = 6, 300

        def run(proposer: Any) -> list[FakeRequest]:
            requests = make_requests(24, max_model_len)
            fake = FakeVllm(proposer, max_num_seqs=6, max_model_len=max_model_len, model=model)
            fake.run(requests[:12], arrivals={3: requests[12:18], 25: requests[18:]})
            return requests

        drafter = self.impl.Drafter(static=self.static(), n_draft=k, policy=policy)
        with_drafts = run(LookupProposer(vllm_config(k, max_model_len), drafter=drafter))
        without = run(NoDrafts())
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
        proposer = LookupProposer(vllm_config(k, n_ctx + k), drafter=self.impl.Drafter(static=static, n_draft=k))
        fake = FakeVllm(proposer, max_num_seqs=1, max_model_len=n_ctx + k)
        chunks = [tokens[i : i + n_ctx + 1] for i in range(0, len(tokens) - n_ctx, n_ctx)]
        requests = [FakeRequest(rid, chunk, 1, n_ctx) for rid, chunk in enumerate(chunks)]
        fake.run(requests)
        # vLLM drafts once more for a request in the step it finishes; llama-lookup-stats does not.
        wasted = sum(len(d) for r in requests for n, d in r.proposals if n == r.target_len)
        assert sum(r.n_accept for r in requests) == expected.n_accept
        assert sum(r.n_drafted for r in requests) - wasted == expected.n_drafted
        assert proposer.drafter.dynamic.contents() == expected_dynamic.contents()

    def test_drafts_stay_within_max_model_len(self) -> None:
        k, max_model_len = 8, 40
        proposer = LookupProposer(vllm_config(k, max_model_len), drafter=self.impl.Drafter(n_draft=k))
        fake = FakeVllm(proposer, max_num_seqs=2, max_model_len=max_model_len)
        text = [3, 4, 5, 6] * 12  # longer than max_model_len: the fake reads the next true token
        requests = [FakeRequest(0, text, 8, max_model_len), FakeRequest(1, text[1:], 5, max_model_len)]
        fake.run(requests)  # the fake asserts n_tokens + len(draft) <= max_model_len at every step
        last = {r.rid: r.proposals[-1] for r in requests}
        assert last == {0: (40, []), 1: (40, [])}
        assert any(0 < len(d) < k and n + len(d) == max_model_len for r in requests for n, d in r.proposals)


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
    monkeypatch.setenv("LOOKUPDEC_POLICY", "hybrid")
    proposer = LookupProposer(vllm_config(5, 100))
    assert proposer.drafter.policy == "hybrid" and proposer.drafter.policy_state is not None
    assert proposer.propose([[2]], [3], rows) == [[3]]  # llama.cpp's draft first, as with "llama"
    proposer.close()
    monkeypatch.setenv("LOOKUPDEC_POLICY", "best")
    with pytest.raises(ValueError, match="policy 'best'"):
        LookupProposer(vllm_config(5, 100))
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        LookupProposer(object())


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
