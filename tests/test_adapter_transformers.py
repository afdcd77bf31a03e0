"""lookupdec in transformers' assisted decoding: the output never changes, drafts are counted.

A real (tiny, random, seeded) Llama model built offline from a ``LlamaConfig`` on the CPU.
Needs torch and transformers (``pip install torch==2.13.0 'lookupdec[transformers]'``).
"""

from __future__ import annotations

import importlib
from typing import Any

import pytest

import lookupdec
from tests.conftest import torch_with_transformers

# Importing torch and transformers takes about 7 s: the fixtures below pay it in a worker that
# runs these tests, not at collection, which every pytest-xdist worker does.


@pytest.fixture(scope="module")
def torch() -> Any:
    """The torch module, imported on first use (the engine is heavy to import)."""
    return torch_with_transformers()


@pytest.fixture(scope="module")
def adapter(torch: Any) -> Any:
    """lookupdec.adapters.transformers (it imports torch and transformers)."""
    return importlib.import_module("lookupdec.adapters.transformers")


PROMPT = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7, 9, 10, 5, 6]


def tiny_model(torch: Any, seed: int = 0, eos: int | None = None) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        bos_token_id=0,
        eos_token_id=eos,
        pad_token_id=None,
    )
    model = LlamaForCausalLM(config)
    model.eval()  # type: ignore[no-untyped-call,unused-ignore]
    return model


def transformers_major() -> int:
    import transformers

    return int(transformers.__version__.split(".")[0])


# Not slow-marked: the greedy output-identity check runs in the README's test command wherever
# torch and transformers are installed (.ci/run installs them; elsewhere it skips, saying why).
@pytest.mark.parametrize("impl", ["reference", "fast"])
@pytest.mark.parametrize("seed", [0])
@pytest.mark.parametrize("policy", ["llama", "hybrid"])
def test_greedy_output_identical_and_drafts_counted(
    torch: Any, adapter: Any, impl: str, seed: int, policy: str
) -> None:
    model = tiny_model(torch, seed)
    prompt = torch.tensor([PROMPT])
    plain = model.generate(prompt, max_new_tokens=48, do_sample=False)
    drafter = lookupdec.implementation(impl).Drafter(n_draft=4, policy=policy)
    # adaptive=False: drafts every step, whatever the machine's timings (tests/test_draft_length.py
    # covers the adaptive length; the eos and stopping tests below run with it)
    decoding = adapter.lookup_decoding(drafter, adaptive=False)
    out = model.generate(prompt, max_new_tokens=48, do_sample=False, custom_generate=decoding)
    assert out.tolist() == plain.tolist()
    stats = drafter.stats
    assert stats.requests == 1 and drafter.open_requests == 0
    assert stats.n_drafted > 0 and 0 < stats.n_accept <= stats.n_drafted
    # The ended request's context (the whole output) is in the dynamic cache.
    expected = lookupdec.implementation(impl).NgramCache()
    expected.update(plain[0].tolist(), plain.shape[1])
    assert drafter.dynamic.contents() == expected.contents()
    # A second call is a new request; its drafts now also come from the dynamic cache.
    again = model.generate(prompt, max_new_tokens=48, do_sample=False, custom_generate=decoding)
    assert again.tolist() == plain.tolist()
    assert drafter.stats.requests == 2 and drafter.stats.n_accept > stats.n_accept


@pytest.mark.parametrize("policy", ["llama", "hybrid"])
def test_isolated_generations_draft_alike(torch: Any, adapter: Any, policy: str) -> None:
    # An IsolatedDrafter in place of a Drafter: each generation is a fresh Drafter's request, so
    # a second generation of the same prompt drafts exactly what the first did (a shared Drafter
    # drafts more there, from the first's output: the test above).
    from lookupdec.adapters import IsolatedDrafter

    model = tiny_model(torch, 0)
    prompt = torch.tensor([PROMPT])
    plain = model.generate(prompt, max_new_tokens=48, do_sample=False)
    drafter = IsolatedDrafter(n_draft=4, policy=policy)
    decoding = adapter.lookup_decoding(drafter, adaptive=False)
    first = model.generate(prompt, max_new_tokens=48, do_sample=False, custom_generate=decoding)
    once = drafter.stats
    again = model.generate(prompt, max_new_tokens=48, do_sample=False, custom_generate=decoding)
    assert first.tolist() == again.tolist() == plain.tolist()
    twice = drafter.stats
    assert twice.requests == 2 and drafter.open_requests == 0 and once.n_accept > 0
    assert (twice.n_drafted, twice.n_accept) == (2 * once.n_drafted, 2 * once.n_accept)


def test_drafter_keyword_on_transformers_5(torch: Any, adapter: Any) -> None:
    if transformers_major() < 5:
        pytest.skip("transformers 4.x refuses generate() arguments a custom_generate function adds")
    model = tiny_model(torch)
    prompt = torch.tensor([PROMPT])
    plain = model.generate(prompt, max_new_tokens=24, do_sample=False)
    drafter = lookupdec.Drafter(n_draft=4)
    out = model.generate(
        prompt,
        max_new_tokens=24,
        do_sample=False,
        custom_generate=adapter.lookup_generate,
        drafter=drafter,
        adaptive=False,
    )
    assert out.tolist() == plain.tolist() and drafter.stats.n_drafted > 0


class RecordingStreamer:
    """A transformers streamer (``put``/``end``) that records what it receives."""

    def __init__(self) -> None:
        self.puts: list[list[int]] = []
        self.ended = 0

    def put(self, value: Any) -> None:
        assert self.ended == 0, "put after end"
        self.puts.append(value.flatten().tolist())

    def end(self) -> None:
        self.ended += 1


def test_stream_gets_prompt_every_token_and_end(torch: Any, adapter: Any) -> None:
    model = tiny_model(torch)
    prompt = torch.tensor([PROMPT])
    plain = model.generate(prompt, max_new_tokens=40, do_sample=False)[0].tolist()
    stream = RecordingStreamer()
    drafter = lookupdec.Drafter(n_draft=4)
    out = model.generate(
        prompt,
        max_new_tokens=40,
        do_sample=False,
        custom_generate=adapter.lookup_decoding(drafter, stream=stream, adaptive=False),
    )
    assert out[0].tolist() == plain
    assert stream.puts[0] == PROMPT and stream.ended == 1
    assert [t for put in stream.puts[1:] for t in put] == plain[len(PROMPT) :]
    # drafts were accepted, so some puts carry several tokens: the stream follows the steps
    assert len(stream.puts) - 1 < len(plain) - len(PROMPT)


def eos_model(torch: Any, adapter: Any) -> tuple[Any, int, list[int]]:
    """A tiny model and an id its greedy output reaches after a while (made its end-of-sequence id)."""
    model = tiny_model(torch)
    plain = model.generate(torch.tensor([PROMPT]), max_new_tokens=40, do_sample=False)[0].tolist()
    new = plain[len(PROMPT) :]
    eos = next(t for t in new[8:] if t not in new[:8])
    model.generation_config.eos_token_id = eos
    return model, eos, new


def test_eos_and_stopping_criteria_stop_where_plain_greedy_stops(torch: Any, adapter: Any) -> None:
    from transformers import StoppingCriteria, StoppingCriteriaList

    model, eos, _ = eos_model(torch, adapter)
    prompt = torch.tensor([PROMPT])
    plain = model.generate(prompt, max_new_tokens=40, do_sample=False)[0].tolist()
    assert plain[-1] == eos and len(plain) < len(PROMPT) + 40
    drafter = lookupdec.Drafter(n_draft=8)
    out = model.generate(prompt, max_new_tokens=40, do_sample=False, custom_generate=adapter.lookup_decoding(drafter))
    assert out[0].tolist() == plain

    class StopAfter(StoppingCriteria):  # type: ignore[misc,unused-ignore]
        """Stop once the sequence holds ``n`` tokens (a user criterion, checked per token)."""

        def __init__(self, n: int) -> None:
            self.n = n

        def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
            return torch.full((input_ids.shape[0],), input_ids.shape[1] >= self.n, dtype=torch.bool)

    model.generation_config.eos_token_id = None
    for n in range(len(PROMPT) + 3, len(PROMPT) + 30, 5):
        criteria = StoppingCriteriaList([StopAfter(n)])
        want = model.generate(prompt, max_new_tokens=40, do_sample=False, stopping_criteria=criteria)[0].tolist()
        got = model.generate(
            prompt,
            max_new_tokens=40,
            do_sample=False,
            stopping_criteria=criteria,
            custom_generate=adapter.lookup_decoding(lookupdec.Drafter(n_draft=8)),
        )[0].tolist()
        assert len(want) == n and got == want


def test_sampling_draws_from_the_model(torch: Any, adapter: Any) -> None:
    # Sampling goes through the model's own distribution at every position: with top_k=1 that
    # distribution is one token, so the sampled output is the greedy output, drafts or not.
    model = tiny_model(torch)
    prompt = torch.tensor([PROMPT])
    plain = model.generate(prompt, max_new_tokens=30, do_sample=False)[0].tolist()
    out = model.generate(
        prompt, max_new_tokens=30, do_sample=True, top_k=1, custom_generate=adapter.lookup_decoding(lookupdec.Drafter())
    )
    assert out[0].tolist() == plain


def test_verifier_rollback_gives_the_logits_of_a_fresh_pass(torch: Any, adapter: Any) -> None:
    model = tiny_model(torch)
    ids = [*PROMPT, 11, 12, 13, 14]
    fresh = adapter.Verifier(model).forward(ids)
    v = adapter.Verifier(model)
    v.forward(PROMPT)
    v.forward([40, 41, 42])  # a draft that is rejected whole
    v.rollback(3)
    assert v.length == len(PROMPT) and v.cache.get_seq_length() == len(PROMPT)
    again = v.forward([11, 12, 13, 14])
    assert torch.allclose(again, fresh[len(PROMPT) :], atol=1e-5)


@pytest.mark.slow
def test_batch_size_above_one_is_refused(torch: Any, adapter: Any) -> None:
    model = tiny_model(torch)
    batch = torch.tensor([PROMPT, PROMPT])
    with pytest.raises(ValueError, match="batch size 1"):
        model.generate(batch, max_new_tokens=4, custom_generate=adapter.lookup_decoding(lookupdec.Drafter()))
    with pytest.raises(TypeError, match="drafter="):
        model.generate(torch.tensor([PROMPT]), max_new_tokens=4, custom_generate=adapter.lookup_generate)


def test_candidates_cut_at_eos_and_max_length(torch: Any, adapter: Any) -> None:
    LookupCandidateGenerator = adapter.LookupCandidateGenerator
    drafter = lookupdec.Drafter(n_draft=8)
    ids = torch.tensor([[1, 2, 3, 4, 1, 2, 3, 4, 1, 2]])
    free = LookupCandidateGenerator(drafter)
    candidates, logits = free.get_candidates(ids)
    assert logits is None and candidates[0, 10:].tolist() == [3, 4, 1, 2, 3, 4, 1, 2]
    free.end()
    cut = LookupCandidateGenerator(drafter, eos_token_id=torch.tensor([1]))
    assert cut.get_candidates(ids)[0][0, 10:].tolist() == [3, 4]
    cut.end()
    short = LookupCandidateGenerator(drafter, max_length=14)  # 10 tokens + 3 drafts + the model's own
    assert short.get_candidates(ids)[0][0, 10:].tolist() == [3, 4, 1]
    full = LookupCandidateGenerator(drafter, max_length=11)
    assert full.get_candidates(ids)[0].shape == (1, 10)
    assert drafter.stats.n_drafted == 8 + 2 + 3


def test_generator_follows_the_sequence(torch: Any, adapter: Any) -> None:
    LookupCandidateGenerator = adapter.LookupCandidateGenerator
    drafter = lookupdec.Drafter(n_draft=2)
    gen = LookupCandidateGenerator(drafter)
    gen.get_candidates(torch.tensor([[1, 2, 1, 2, 1]]))  # proposes [2, 1]
    gen.get_candidates(torch.tensor([[1, 2, 1, 2, 1, 2, 7]]))  # 2 accepted, 7 the model's own
    assert drafter.stats.n_accept == 1 and drafter.stats.requests == 1
    gen.get_candidates(torch.tensor([[9, 9, 9]]))  # not an extension: a new request
    assert drafter.stats.requests == 2 and drafter.open_requests == 1
    with pytest.raises(ValueError, match=r"batch size 1.*\(2, 3\)"):
        gen.get_candidates(torch.tensor([[1, 2, 3], [4, 5, 6]]))
    gen.end()
    assert drafter.open_requests == 0


def test_bad_values_are_clear_errors(torch: Any, adapter: Any) -> None:
    """Found by a hunt for bad input: each was accepted and misread, or failed deep inside."""
    import numpy as np

    from lookupdec.errors import VocabularyError

    model = tiny_model(torch)
    drafter = lookupdec.Drafter(n_draft=4)

    def generate(ids: list[int], **kw: Any) -> Any:
        return model.generate(
            torch.tensor([ids]), max_new_tokens=4, custom_generate=adapter.lookup_decoding(drafter, **kw)
        )

    with pytest.raises(VocabularyError, match=r"prompt token 1 is 100: .* vocabulary of 96"):
        generate([5, 100, 6])  # torch's embedding raised an IndexError (a device assert on CUDA)
    with pytest.raises(VocabularyError, match="prompt token 1 is -1"):
        generate([5, -1, 6])
    with pytest.raises(TypeError, match=r"needs a lookupdec\.Drafter, not str"):
        adapter.lookup_decoding("x")  # an AttributeError at generate
    with pytest.raises(TypeError, match="stream must be a transformers streamer"):
        adapter.lookup_decoding(drafter, stream=5)
    with pytest.raises(TypeError, match="not a str"):
        adapter.LookupCandidateGenerator(drafter, eos_token_id="17")  # read as the ids 1 and 7
    with pytest.raises(TypeError, match="torch tensor"):
        adapter.LookupCandidateGenerator(drafter).get_candidates(np.array([PROMPT]))
    verifier = adapter.Verifier(model)
    verifier.forward([1, 2, 3])
    with pytest.raises(ValueError, match="holds 3 tokens"):
        verifier.rollback(10)  # left a length of -7
    assert verifier.length == 3
    assert adapter.decode(adapter.Verifier(model), PROMPT, lambda t, k: [], k=4, max_new_tokens=0) == []
    with pytest.raises(ValueError, match="max_new_tokens must be >= 0"):
        adapter.decode(adapter.Verifier(model), PROMPT, lambda t, k: [], k=4, max_new_tokens=-5)
    assert drafter.open_requests == 0  # the refused generations opened no request
