"""The vLLM 0.34+ speculator: lookupdec drafting in vLLM's V2 model runner.

Imported by vLLM only, when ``speculative_config["method"]`` is ``"lookupdec"``: it subclasses
vLLM's ``SpeculatorConfig`` and ``BaseSpeculator``, so importing it imports vLLM. How to use it,
and the interface it matches (``vllm==0.34.0``), are in :mod:`lookupdec.adapters.vllm_plugin`.
"""

from __future__ import annotations

import multiprocessing.util
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from vllm.v1.worker.gpu.spec_decode.speculator import BaseSpeculator
from vllm.v1.worker.gpu.spec_decode.speculator_config import SpeculatorConfig

from lookupdec.adapters.vllm import IntervalSaver, model_vocab_size, tensor_parallel_rank
from lookupdec.adapters.vllm_plugin import RequestTable, drafter_from_options, pad_drafts, read_options

if TYPE_CHECKING:
    from vllm.config import SpeculativeConfig, VllmConfig

DEFAULT_K = 8
"""``num_speculative_tokens`` when the config gives none."""


def finish(table: RequestTable, saves: bool) -> None:
    """End every open request and, where this process saves, save the dynamic cache file.

    A module function, not a method: the exit finalizer holds these objects, not the
    speculator. It saves ``table.drafter``, the one in use at exit (``reset_state`` replaces it).
    """
    table.end_all()
    if saves:
        table.drafter.save()


# vLLM is typed Any here (no stubs: pyproject ignores its imports), so mypy sees an Any base.
class LookupdecSpeculatorConfig(SpeculatorConfig):  # type: ignore[misc]
    """vLLM's configuration of the ``"lookupdec"`` method: no draft model, options in ``speculator_options``."""

    speculator_class: ClassVar[str | None] = "lookupdec.adapters.vllm_v2.LookupSpeculator"
    supported_options: ClassVar[frozenset[str]] = frozenset({"speculator_options"})
    # The history is read for each row's new tokens every step: on the device, not through UVA.
    prefer_dense_token_history: ClassVar[bool] = True
    # Drafts come from counts, not from draft logits.
    adaptive_verification_uses_draft_logits: ClassVar[bool] = False

    @classmethod
    def configure(cls, spec: SpeculativeConfig) -> None:
        """No draft model (the target's config stands in for it); ``num_speculative_tokens`` defaults to 8."""
        super().configure(spec)
        if spec.num_speculative_tokens is None:
            spec.num_speculative_tokens = DEFAULT_K


class LookupSpeculator(BaseSpeculator):  # type: ignore[misc]  # an Any base, as above
    """A vLLM 0.34+ speculator backed by a :class:`lookupdec.Drafter`, one request per vLLM request.

    Each step it reads from the runner's ``RequestState`` the tokens each row committed since
    the last step (one device-to-host copy of the lengths, one per row of its new tokens),
    drafts on the host with :class:`lookupdec.adapters.vllm_plugin.RequestTable`, and returns
    the drafts as a device tensor. Finished requests are ended (their contexts merged into the
    dynamic cache) before their slots are freed. The dynamic cache file is saved as requests
    end (at most every ``save_interval`` seconds) and when the process exits, by
    tensor-parallel rank 0 only.
    """

    def __init__(self, vllm_config: VllmConfig, device: torch.device, req_states: Any) -> None:
        spec = vllm_config.speculative_config
        if spec is None:
            raise ValueError("LookupSpeculator needs vllm_config.speculative_config")
        self.k = int(spec.num_speculative_tokens)
        """Tokens drafted per request and step at most (vLLM's ``num_speculative_tokens``)."""
        self.device = device
        self.req_states = req_states
        self.options = getattr(spec, "speculator_options", None)
        """vLLM's ``speculator_options`` (see :func:`lookupdec.adapters.vllm_plugin.drafter_from_options`)."""
        self.save_interval = read_options(self.options)[1]
        """Seconds between two saves while requests end (option ``save_interval``)."""
        self.vocab_size = model_vocab_size(vllm_config)
        """The model's vocabulary size, checked against the static index's and the corpus's."""
        drafter = drafter_from_options(self.options, self.k, self.vocab_size)
        self.table = RequestTable(drafter, self.k, int(vllm_config.model_config.max_model_len))
        """The open requests by vLLM request id, and the Drafter they share (``table.drafter``)."""
        self.saves = drafter.dynamic_path is not None and tensor_parallel_rank() == 0
        """Whether this process writes the dynamic cache file (it has one, and is TP rank 0)."""
        max_num_reqs = int(vllm_config.scheduler_config.max_num_seqs)
        # Batch-ordered drafts, as vLLM's own speculators return them.
        self.drafts = torch.zeros((max_num_reqs, self.k), dtype=torch.int64, device=device)
        self._saver = IntervalSaver(self.save_interval)
        # Runs once: from close(), when the speculator is collected, or when the process exits
        # (a forked multiprocessing child too, where atexit never runs: see lookupdec.adapters.vllm).
        self._finalizer = multiprocessing.util.Finalize(self, finish, args=(self.table, self.saves), exitpriority=10)

    @property
    def drafter(self) -> Any:
        """The :class:`lookupdec.Drafter` all requests share (``drafter.stats``, ``drafter.save()``)."""
        return self.table.drafter

    def init_cudagraph_manager(self, cudagraph_mode: Any) -> None:
        """No CUDA graphs: drafting runs on the host."""

    def capture(self) -> None:
        """No CUDA graphs to capture."""

    def on_requests_finished(self, finished_req_ids: Any) -> None:
        """End the finished requests (their contexts go into the dynamic cache), then save if due."""
        self.table.finish(finished_req_ids)
        if self.saves:
            self._saver.maybe_save(self.drafter, self.table.ended)

    def reset_state(self) -> None:
        """After vLLM's warm-up requests: forget them.

        Their ends merged their dummy tokens into the dynamic cache: the Drafter is made again
        from the options, and so from the files as they were (nothing is saved before the first
        ``save_interval`` has passed), and the open requests are dropped.
        """
        self.table.open.clear()
        self.table.drafter = drafter_from_options(self.options, self.k, self.vocab_size)

    def propose(
        self,
        input_batch: Any,
        attn_metadata: Any,
        slot_mappings: Any,
        last_hidden_states: Any,
        aux_hidden_states: Any,
        num_sampled: torch.Tensor,
        num_rejected: torch.Tensor,
        last_sampled: torch.Tensor,
        next_prefill_tokens: Any,
        temperature: Any,
        seeds: Any,
        dp_sync_state: Any = None,
        dummy_run: bool = False,
        skip_attn_for_dummy_run: bool = False,
        mm_inputs: Any = None,
        is_profile: bool = False,
        num_speculative_tokens: int | None = None,
    ) -> torch.Tensor:
        """Drafts for the batch's rows, ``[num_reqs, k]`` int64 on the device (padded: see ``pad_drafts``)."""
        n = int(input_batch.num_reqs)
        if dummy_run or n == 0:
            return self.drafts[:n]
        slots = [int(s) for s in input_batch.idx_mapping_np[:n]]
        index = torch.as_tensor([max(s, 0) for s in slots], dtype=torch.int64, device=self.device)
        # One copy to the host for the lengths, the counts and the fill tokens of every row.
        totals_d = self.req_states.total_len.gpu[index].to(torch.int64)
        fill_d = last_sampled.view(-1)[index].to(torch.int64)
        host = torch.stack([totals_d, num_sampled[:n].to(torch.int64), fill_d]).cpu().tolist()
        totals, sampled, fill = host
        history = self.req_states.all_token_ids.gpu

        def read(row: int, start: int, end: int) -> list[int]:
            out: list[int] = history[slots[row], start:end].tolist()
            return out

        budget = self.k if num_speculative_tokens is None else int(num_speculative_tokens)
        drafts = self.table.step(list(input_batch.req_ids[:n]), slots, totals, sampled, read, budget)
        padded = pad_drafts(drafts, self.k, fill)
        self.drafts[:n].copy_(torch.as_tensor(padded, dtype=torch.int64), non_blocking=True)
        return self.drafts[:n]

    def close(self) -> None:
        """End every open request and save the dynamic cache file where this process saves one (once)."""
        self._finalizer()


__all__ = ["DEFAULT_K", "LookupSpeculator", "LookupdecSpeculatorConfig", "finish"]
