"""One greedy vLLM run over a tiny random-weight Llama, with or without the LookupProposer.

``python -m tests.real_vllm_run MODEL_DIR OUT.json plain|spec`` writes the generated token ids
(and, with ``spec``, what the proposer saw, written by :class:`ProbeProposer` in the engine's
worker process) to ``OUT.json``. A script, not a test: vLLM starts its engine and workers as
``multiprocessing`` children, which need a ``__main__`` guard, and one process holds one engine.
``make_model(MODEL_DIR)`` writes the model (transformers, random weights: the output only has to
be the same with and without drafts).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from lookupdec.adapters.vllm import LookupProposer, runner_requests

PROBE_ENV = "LOOKUPDEC_TEST_PROBE"


class ProbeProposer(LookupProposer):
    """A LookupProposer that records, after every call, whether vLLM's runner was found, to a JSON file."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.calls = 0
        self.calls_by_id = 0
        self.buffer_rows = 0

    def propose(
        self, sampled_token_ids: Any, num_tokens_no_spec: Any, token_ids_cpu: Any, slot_mappings: Any = None, **kw: Any
    ) -> list[list[int]]:
        self.calls += 1
        self.calls_by_id += runner_requests(token_ids_cpu, depth=1) is not None
        self.buffer_rows = len(num_tokens_no_spec)
        drafts = super().propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings, **kw)
        stats = self.drafter.stats
        record = {
            "calls": self.calls,
            "calls_by_id": self.calls_by_id,
            "num_tokens_no_spec_rows": self.buffer_rows,
            "requests": stats.requests,
            "n_drafted": stats.n_drafted,
            "n_accept": stats.n_accept,
        }
        with open(os.environ[PROBE_ENV], "w") as f:
            json.dump(record, f)
        return drafts


def make_model(path: str) -> None:
    """A 2-layer Llama with random weights (head size 64: vLLM's CPU attention takes no smaller)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=512,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
    )
    LlamaForCausalLM(config).save_pretrained(path, safe_serialization=True)  # float32 weights


def main(model: str, out: str, mode: str) -> None:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    base = [(i * 7 + 3) % 500 + 5 for i in range(40)]
    # Prompts that repeat themselves, so lookup drafting finds something; 8 requests through 4
    # sequences and a 64-token budget: rows condense, and chunked prefill runs.
    prompts = [TokensPrompt(prompt_token_ids=(base[j:] + base[:j]) * 3) for j in range(0, 40, 5)]
    params = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True, detokenize=False)
    kwargs: dict[str, Any] = {
        "model": model,
        "skip_tokenizer_init": True,
        "enforce_eager": True,
        "max_model_len": 256,
        "dtype": "float32",
        "max_num_seqs": 4,
        "max_num_batched_tokens": 64,
        "gpu_memory_utilization": 0.08,  # on the CPU backend: the share of memory for the KV cache
    }
    if mode == "spec":
        kwargs["speculative_config"] = {
            "method": "custom_class",
            "model": "tests.real_vllm_run.ProbeProposer",
            "num_speculative_tokens": 4,
        }
    outputs = LLM(**kwargs).generate(prompts, params)
    with open(out, "w") as f:
        json.dump([list(o.outputs[0].token_ids) for o in outputs], f)


if __name__ == "__main__":
    main(*sys.argv[1:4])
