"""lookupdec in llama-cpp-python: LookupDraftModel under a fake of ``Llama.generate``'s draft loop."""

from __future__ import annotations

import random
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import lookupdec
from lookupdec.adapters.llama_cpp import LLAMA_CPP_AVAILABLE, LookupDraftModel
from lookupdec.errors import VocabularyError

VOCAB = 24


class FakeLlama:
    """The draft loop of llama-cpp-python 0.3.x's ``Llama.generate``, with a deterministic model.

    As upstream: the pending tokens are evaluated (appended to the KV state), the model samples
    at every evaluated position; a sampled token that differs from the token evaluated after it
    rewinds the state there; then the draft model is called with the committed history
    (``input_ids[: n_tokens + len(tokens)]``, an ``intc`` array) and its draft, cut to the context
    size, joins the tokens evaluated next. A new prompt reuses the longest common prefix.
    The model's next token is a fixed pseudo-random function of the last two tokens (greedy).
    ``n_buffer``: the size of ``input_ids`` when not ``n_ctx``, as upstream sizes it by the
    context asked for while llama.cpp may give a larger one (``Llama(n_ctx=128).n_ctx()`` is 256).
    """

    def __init__(self, draft_model: Any = None, n_ctx: int = 256, seed: int = 7, n_buffer: int | None = None) -> None:
        rng = random.Random(seed)
        self.table = {(a, b): rng.randrange(VOCAB) for a in range(VOCAB) for b in range(VOCAB)}
        self.draft_model = draft_model
        self.ctx_size = n_ctx
        self.input_ids = np.zeros(n_ctx if n_buffer is None else n_buffer, dtype=np.intc)
        self.n_tokens = 0
        self.drafted = 0
        self.accepted = 0  # drafted tokens the model confirmed (counted when the confirmation is yielded)

    def n_ctx(self) -> int:
        return self.ctx_size

    def token_eos(self) -> int:
        return VOCAB  # never sampled: the table's tokens are below VOCAB

    def next_token(self, upto: int) -> int:
        return self.table[(int(self.input_ids[upto - 2]), int(self.input_ids[upto - 1]))]

    def generate(self, prompt: list[int], **kwargs: Any) -> Iterator[int]:
        common = 0
        while common < min(self.n_tokens, len(prompt) - 1) and self.input_ids[common] == prompt[common]:
            common += 1
        self.n_tokens = common
        tokens = list(prompt[common:])
        sample_idx = self.n_tokens + len(tokens) - 1  # set once, as upstream: it follows the state
        while True:
            self.input_ids[self.n_tokens : self.n_tokens + len(tokens)] = tokens  # eval
            self.n_tokens += len(tokens)
            while sample_idx < self.n_tokens:
                token = self.next_token(sample_idx + 1)
                sample_idx += 1
                drafted_here = sample_idx < self.n_tokens  # a draft token was evaluated at sample_idx
                confirmed = drafted_here and token == self.input_ids[sample_idx]
                self.accepted += confirmed
                yield token
                tokens = [token]
                if drafted_here and not confirmed:
                    self.n_tokens = sample_idx  # rewind: the rest of the draft is rejected
                    break
            if self.draft_model is not None:
                self.input_ids[self.n_tokens : self.n_tokens + len(tokens)] = tokens
                draft = self.draft_model(self.input_ids[: self.n_tokens + len(tokens)])
                assert isinstance(draft, np.ndarray) and draft.dtype == np.intc
                draft = draft.astype(int)[: self.ctx_size - self.n_tokens - len(tokens)]
                self.drafted += len(draft)
                tokens.extend(draft)

    def complete(self, prompt: list[int], max_tokens: int) -> list[int]:
        out: list[int] = []
        for token in self.generate(prompt):
            out.append(token)
            if len(out) == max_tokens:
                break
        return out


PROMPT = [1, 2, 3, 4, 5, 1, 2, 3]


@pytest.mark.parametrize("policy", ["llama", "hybrid"])
@pytest.mark.parametrize("impl", ["reference", "fast"])
def test_output_identical_and_drafts_counted(impl: str, policy: str) -> None:
    plain = FakeLlama().complete(PROMPT, 120)
    drafter = lookupdec.implementation(impl).Drafter(n_draft=6, policy=policy)
    # adaptive=False: the draft length would follow the fake's step times (tests/test_draft_length.py)
    draft_model = LookupDraftModel(drafter, adaptive=False)
    llm = FakeLlama(draft_model)
    out = llm.complete(PROMPT, 120)
    assert out == plain
    draft_model.end(PROMPT + out)
    stats = drafter.stats
    assert stats.requests == 1 and drafter.open_requests == 0
    assert stats.n_drafted == llm.drafted > 50
    assert stats.n_accept == llm.accepted > 20
    expected = lookupdec.implementation(impl).NgramCache()
    expected.update(PROMPT + out, len(PROMPT + out))
    assert drafter.dynamic.contents() == expected.contents()


def test_a_new_prompt_starts_a_new_request() -> None:
    drafter = lookupdec.Drafter(n_draft=4)
    draft_model = LookupDraftModel(drafter)
    llm = FakeLlama(draft_model)
    first = llm.complete(PROMPT, 30)
    # What the draft model saw: the history at its last call (tokens yielded after it are unseen).
    seen = list(draft_model.follower.request.tokens)
    assert len(seen) > len(PROMPT) and (PROMPT + first)[: len(seen)] == seen
    llm.complete([9, 8, 7, 9, 8], 30)  # not an extension of the first history
    assert drafter.stats.requests == 2 and drafter.open_requests == 1
    # The first request was merged into the dynamic cache when the second began.
    expected = lookupdec.NgramCache()
    expected.update(seen, len(seen))
    assert drafter.dynamic.contents() == expected.contents()
    draft_model.end()
    assert drafter.open_requests == 0


def test_a_chat_turn_that_extends_the_history_is_a_new_request() -> None:
    drafter = lookupdec.Drafter(n_draft=4)
    draft_model = LookupDraftModel(drafter)
    llm = FakeLlama(draft_model)
    first = llm.complete(PROMPT, 40)
    seen = list(draft_model.follower.request.tokens)
    # The next turn: the whole first exchange, then a new message (more than one step can add).
    turn = PROMPT + first + [11, 12, 13, 14, 15, 16, 17, 18]
    llm.complete(turn, 20)
    assert drafter.stats.requests == 2 and drafter.open_requests == 1
    expected = lookupdec.NgramCache()
    expected.update(seen, len(seen))
    assert drafter.dynamic.contents() == expected.contents()  # the first turn was merged
    assert list(draft_model.follower.request.tokens[: len(turn)]) == turn


def test_the_same_prompt_again_is_a_new_request(monkeypatch: pytest.MonkeyPatch) -> None:
    # A completion that stops right after the first draft call (max_tokens=2, a stop string, end
    # of sequence) leaves the request at prompt + first token; the same prompt again (a
    # regenerated answer) shows the draft model exactly that history once more. Taken as the
    # same generation, every regeneration joined the first request, and the adaptive length
    # measured the time between the two requests as one step's.
    drafter = lookupdec.Drafter(n_draft=4)
    draft_model = LookupDraftModel(drafter)
    steps: list[int] = []
    ctl = draft_model.follower.adaptive
    assert ctl is not None
    observe_step = ctl.observe_step

    def spy(verified: int, seconds: float) -> None:
        steps.append(verified)
        observe_step(verified, seconds)

    monkeypatch.setattr(ctl, "observe_step", spy)
    llm = FakeLlama(draft_model)
    outs = [llm.complete(PROMPT, 2) for _ in range(3)]
    assert outs == [FakeLlama().complete(PROMPT, 2)] * 3
    assert drafter.stats.requests == 3 and drafter.open_requests == 1
    assert steps == []  # one draft call per generation: no step to measure
    draft_model.end()


def test_a_history_that_does_not_follow_the_draft_is_a_new_request() -> None:
    # Within one generation, each draft call's history adds the accepted part of the last
    # proposal and the model's own token. A new prompt that extends the last history by no more
    # than that many tokens (a continuation of the generated text) but not by the proposal's
    # first tokens is another generation.
    history = [1, 2, 3, 4, 5, 1, 2, 3]
    for follows in (True, False):
        drafter = lookupdec.Drafter(n_draft=4)
        draft_model = LookupDraftModel(drafter, adaptive=False)
        proposal = draft_model(np.array(history, dtype=np.intc)).tolist()
        assert len(proposal) == 4
        other = next(t for t in range(VOCAB) if t != proposal[0])
        step = [proposal[0], other] if follows else [other, proposal[0]]
        draft_model(np.array(history + step, dtype=np.intc))
        assert drafter.stats.requests == (1 if follows else 2) and drafter.open_requests == 1
        assert drafter.stats.n_accept == (1 if follows else 0)
        draft_model.end()


def test_generate_ends_the_request_with_every_token() -> None:
    plain = FakeLlama().complete(PROMPT, 60)
    drafter = lookupdec.Drafter(n_draft=5)
    draft_model = LookupDraftModel(drafter)
    llm = FakeLlama(draft_model)
    out = list(draft_model.generate(llm, PROMPT, max_tokens=60))
    assert out == plain and drafter.open_requests == 0 and drafter.stats.requests == 1
    # The last draft call saw fewer tokens than were generated; the request still counts them all.
    expected = lookupdec.NgramCache()
    expected.update(PROMPT + out, len(PROMPT + out))
    assert drafter.dynamic.contents() == expected.contents()
    # Closing the generator early ends the request with what was yielded.
    gen = draft_model.generate(llm, [3, 1, 4, 1, 5], max_tokens=60)
    head = [next(gen) for _ in range(7)]
    gen.close()
    assert drafter.open_requests == 0 and drafter.stats.requests == 2
    with pytest.raises(ValueError, match="draft_model"):
        next(LookupDraftModel(drafter).generate(llm, PROMPT))
    assert head == FakeLlama().complete([3, 1, 4, 1, 5], 7)


def test_drafts_fit_the_history_buffer_when_the_context_is_padded() -> None:
    # llama-cpp-python 0.3.36 sizes its input_ids and scores by the n_ctx asked for, but cuts a
    # draft at llama.cpp's context, which may be padded past it (n_ctx=128 gives 256): a draft
    # past the buffer's end failed the step ("could not broadcast input array from shape (9,)
    # into shape (6,)") where plain generation still had room for every token it was asked for.
    prompt = PROMPT * 4
    plain = FakeLlama(n_ctx=256, n_buffer=128).complete(prompt, 128 - len(prompt) - 1)
    drafter = lookupdec.Drafter(n_draft=8)
    draft_model = LookupDraftModel(drafter, adaptive=False)
    llm = FakeLlama(draft_model, n_ctx=256, n_buffer=128)
    assert llm.complete(prompt, len(plain)) == plain
    assert drafter.stats.n_drafted == llm.drafted  # what was counted is what the engine verified
    # generate stops at the buffer's end (without a limit: at the context's end, which it cannot reach)
    out = list(draft_model.generate(llm, prompt))
    assert len(prompt) + len(out) == 128 and out[: len(plain)] == plain


def test_vocabulary_mismatch_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=r"vocabulary has 128256 tokens, the model's 49152"):
        LookupDraftModel(lookupdec.Drafter(vocab_size=128256), n_vocab=49152)
    # A drafter that does not know its vocabulary drafts an id the model does not have (its
    # static cache is another tokenizer's).
    drafter = lookupdec.Drafter(static=lookupdec.build_static([1, 2, 21] * 50), n_draft=4)
    draft_model = LookupDraftModel(drafter, n_vocab=20)
    with pytest.raises(ValueError, match=r"token id 21, past the model's vocabulary of 20 tokens"):
        draft_model(np.array([5, 1, 2], dtype=np.intc))
    # An id past it in the history itself is named as the history's
    with pytest.raises(VocabularyError, match=r"history token 0 is 21: not an id of the model's vocabulary of 20"):
        draft_model(np.array([21, 22, 23, 21, 22, 23, 21, 22], dtype=np.intc))


def test_draft_model_contract() -> None:
    drafter = lookupdec.Drafter(n_draft=8)
    draft_model = LookupDraftModel(drafter, n_draft=3, stop=(4,))
    out = draft_model(np.array([1, 2, 3, 1, 2, 3, 1, 2], dtype=np.intc))
    assert out.dtype == np.intc and out.tolist() == [3, 1, 2]
    cut = LookupDraftModel(lookupdec.Drafter(), stop=(4,))
    assert cut(np.array([4, 5, 4, 5, 4, 5], dtype=np.intc)).tolist() == []  # it would draft 4, 5, 4, ...
    assert cut(np.array([4, 5, 4, 5, 4, 5, 7, 5], dtype=np.intc)).tolist() == []
    assert cut(np.array([9, 8, 9, 8, 9], dtype=np.intc)).tolist() == [8, 9, 8, 9, 8, 9, 8, 9]
    assert isinstance(draft_model, _llama_draft_model_class()) == LLAMA_CPP_AVAILABLE


def _llama_draft_model_class() -> type:
    try:
        from llama_cpp.llama_speculative import LlamaDraftModel
    except ImportError:
        return type(None)
    return LlamaDraftModel  # type: ignore[no-any-return,unused-ignore]


def test_cpu_has_amx_reads_the_cpu_flags(tmp_path: Path) -> None:
    from lookupdec.adapters.llama_cpp import cpu_has_amx

    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx512f avx512_bf16 amx_bf16 amx_tile amx_int8\n")
    assert cpu_has_amx(info)
    info.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f\n")
    assert not cpu_has_amx(info)
    assert not cpu_has_amx(tmp_path / "missing")


def test_no_repack_loads_without_extra_buffers_and_restores(monkeypatch: pytest.MonkeyPatch) -> None:
    import lookupdec.adapters.llama_cpp as adapter

    class Params:
        use_extra_bufts = True

    def default_params() -> Params:
        return Params()

    # a stand-in for llama-cpp-python's ctypes module, whose default parameters Llama() asks for
    lib = types.ModuleType("llama_cpp.llama_cpp")
    lib.llama_model_default_params = default_params  # type: ignore[attr-defined]
    package = types.ModuleType("llama_cpp")
    package.llama_cpp = lib  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "llama_cpp", package)
    monkeypatch.setitem(sys.modules, "llama_cpp.llama_cpp", lib)
    with adapter.no_repack():
        assert lib.llama_model_default_params().use_extra_bufts is False
    assert lib.llama_model_default_params is default_params
    monkeypatch.setattr(adapter, "cpu_has_amx", lambda: False)
    with adapter.no_repack(where_amx=True):
        assert lib.llama_model_default_params is default_params
    monkeypatch.setattr(adapter, "cpu_has_amx", lambda: True)
    with adapter.no_repack(where_amx=True):
        assert lib.llama_model_default_params().use_extra_bufts is False
    assert lib.llama_model_default_params is default_params
