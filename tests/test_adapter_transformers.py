"""lookupdec in transformers' assisted decoding: the output never changes, drafts are counted.

A real (tiny, random, seeded) Llama model built offline from a ``LlamaConfig`` on the CPU.
Needs torch and transformers (``pip install torch==2.13.0 'lookupdec[transformers]'``).
"""

from __future__ import annotations

import importlib
import os
from typing import Any

import pytest

import lookupdec

# Importing torch and transformers takes about 7 s: the fixtures below pay it in a worker that
# runs these tests, not at collection, which every pytest-xdist worker does.


@pytest.fixture(scope="module")
def torch() -> Any:
    """The torch module, imported on first use (the engine is heavy to import)."""
    if os.environ.get("LOOKUPDEC_REQUIRE_TRANSFORMERS") == "1":
        # .ci/run installs the engine: there a missing or broken import is a failure, not a skip.
        # (Any, as importorskip gives below: the tests pass plain tensors where stubs want LongTensor.)
        module: Any = importlib.import_module("torch")
        importlib.import_module("transformers")
        return module
    module = pytest.importorskip("torch", reason="torch is not installed (pip install torch==2.13.0)")
    pytest.importorskip("transformers", reason="transformers is not installed (pip install 'lookupdec[transformers]')")
    return module


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


# Not slow-marked: the greedy output-identity check runs in the README's test command wherever
# torch and transformers are installed (.ci/run installs them; elsewhere it skips, saying why).
@pytest.mark.parametrize("impl", ["reference", "fast"])
@pytest.mark.parametrize("seed", [0])
@pytest.mark.parametrize("policy", ["llama", "hybrid"])
def test_greedy_output_identical_and_drafts_counted(
    torch: Any, adapter: Any, impl: str, seed: int, policy: str
) -> None:
    lookup_generate = adapter.lookup_generate
    model = tiny_model(torch, seed)
    prompt = torch.tensor([PROMPT])
    plain = model.generate(prompt, max_new_tokens=48, do_sample=False)
    drafter = lookupdec.implementation(impl).Drafter(n_draft=4, policy=policy)
    out = model.generate(prompt, max_new_tokens=48, do_sample=False, custom_generate=lookup_generate, drafter=drafter)
    assert out.tolist() == plain.tolist()
    stats = drafter.stats
    assert stats.requests == 1 and drafter.open_requests == 0
    assert stats.n_drafted > 0 and 0 < stats.n_accept <= stats.n_drafted
    # The ended request's context (the whole output) is in the dynamic cache.
    expected = lookupdec.implementation(impl).NgramCache()
    expected.update(plain[0].tolist(), plain.shape[1])
    assert drafter.dynamic.contents() == expected.contents()
    # A second call is a new request; its drafts now also come from the dynamic cache.
    again = model.generate(prompt, max_new_tokens=48, do_sample=False, custom_generate=lookup_generate, drafter=drafter)
    assert again.tolist() == plain.tolist()
    assert drafter.stats.requests == 2 and drafter.stats.n_accept > stats.n_accept


@pytest.mark.slow
def test_batch_size_above_one_is_refused(torch: Any, adapter: Any) -> None:
    lookup_generate = adapter.lookup_generate
    model = tiny_model(torch)
    batch = torch.tensor([PROMPT, PROMPT])
    with pytest.raises(ValueError, match="batch size 1"):
        model.generate(batch, max_new_tokens=4, custom_generate=lookup_generate, drafter=lookupdec.Drafter())
    with pytest.raises(TypeError, match="drafter="):
        model.generate(torch.tensor([PROMPT]), max_new_tokens=4, custom_generate=lookup_generate)


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
