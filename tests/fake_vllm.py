"""A faithful fake of how vLLM's V1 model runner drives a draft proposer.

What it reproduces of vLLM (``gpu_model_runner`` / ``InputBatch``): requests live in rows of a
persistent batch (``token_ids_cpu``: rows x max_model_len, int32; ``num_tokens_no_spec``);
at the start of a step, finished requests are removed and the batch is condensed (the last
occupied rows move into the holes, lowest hole first), then waiting requests take the free rows
at the end; a prompt is prefilled in chunks, and a row that is still prefilling has an empty
sampled list; after the forward pass each decoding row's sampled tokens (the accepted drafts
and one token of the model's own) are written into the row, and the proposer is called once
for the batch. A request finishes when it reaches its target length; its row stays in the
batch (and is drafted for) until the next step, as in vLLM.

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

    @property
    def finished(self) -> bool:
        return self.n_tokens >= self.target_len


class FakeVllm:
    """Runs requests through ``proposer.propose`` the way vLLM's V1 engine calls it."""

    def __init__(
        self,
        proposer: Any,
        max_num_seqs: int,
        max_model_len: int,
        chunk: int = 64,
        model: Callable[[list[int]], int] | None = None,
    ) -> None:
        self.proposer = proposer
        self.model = model  # next token from the context (greedy); None: the request's text
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        self.chunk = chunk  # prefill chunk size (chunked prefill)
        self.token_ids_cpu = np.zeros((max_num_seqs, max_model_len), dtype=np.int32)
        self.num_tokens_no_spec = np.zeros(max_num_seqs, dtype=np.int32)
        self.rows: list[FakeRequest] = []  # row i holds rows[i]
        self.moves = 0  # rows moved by condense
        self.steps = 0
        # Per step, what an oracle that knows request ids needs: the requests that left the batch,
        # then (rid, tokens committed in this step) per decoding row, in row order.
        self.log: list[tuple[list[int], list[tuple[int, list[int]]]]] = []
        self._ended: list[int] = []

    def _condense(self) -> None:
        keep = [r for r in self.rows if not r.finished]
        if len(keep) == len(self.rows):
            return
        self._ended.extend(r.rid for r in self.rows if r.finished)
        # vLLM's condense: fill each hole (lowest first) with the last occupied row.
        rows: list[FakeRequest | None] = [None if r.finished else r for r in self.rows]
        hole = 0
        last = len(rows) - 1
        while True:
            while hole < len(rows) and rows[hole] is not None:
                hole += 1
            while last >= 0 and rows[last] is None:
                last -= 1
            if hole >= last:
                break
            rows[hole], rows[last] = rows[last], None
            self.token_ids_cpu[hole] = self.token_ids_cpu[last]
            self.num_tokens_no_spec[hole] = self.num_tokens_no_spec[last]
            self.moves += 1
        self.rows = [r for r in rows if r is not None]
        assert sorted(r.rid for r in self.rows) == sorted(r.rid for r in keep)

    def _next(self, i: int, r: FakeRequest, extra: list[int]) -> int:
        """The model's token after row ``i``'s tokens followed by ``extra`` (accepted drafts)."""
        if self.model is None:
            return r.text[r.n_tokens + len(extra)]
        return self.model([int(t) for t in self.token_ids_cpu[i, : r.n_tokens]] + extra)

    def step(self, waiting: list[FakeRequest]) -> None:
        self._condense()
        while waiting and len(self.rows) < self.max_num_seqs:
            r = waiting.pop(0)
            i = len(self.rows)
            self.rows.append(r)
            self.token_ids_cpu[i, :] = 0
            self.token_ids_cpu[i, : r.prompt_len] = r.text[: r.prompt_len]
            self.num_tokens_no_spec[i] = r.prompt_len
        sampled: list[list[int]] = []
        committed: list[tuple[int, list[int]]] = []
        for i, r in enumerate(self.rows):
            if r.prefilled < r.prompt_len:  # chunked prefill: sample only after the last chunk
                r.prefilled = min(r.prompt_len, r.prefilled + self.chunk)
                if r.prefilled < r.prompt_len:
                    sampled.append([])
                    continue
                r.n_tokens = r.prompt_len
                new = [self._next(i, r, [])]
            else:
                accepted: list[int] = []
                for t in r.drafts:  # the rejection sampler: accept while the model agrees
                    if self._next(i, r, accepted) != t:
                        break
                    accepted.append(t)
                new = [*accepted, self._next(i, r, accepted)]
                new = new[: r.target_len - r.n_tokens]  # the stop condition cuts the committed tokens
                r.n_accept += min(len(accepted), len(new))
            self.token_ids_cpu[i, r.n_tokens : r.n_tokens + len(new)] = new
            r.n_tokens += len(new)
            self.num_tokens_no_spec[i] = r.n_tokens
            if r.finished:
                r.output = [int(t) for t in self.token_ids_cpu[i, : r.n_tokens]]
            sampled.append(new)
            committed.append((r.rid, new))
        self.log.append((self._ended, committed))
        self._ended = []
        drafts = self.proposer.propose(sampled, self.num_tokens_no_spec[: len(self.rows)], self.token_ids_cpu)
        assert len(drafts) == len(self.rows)
        for r, s, d in zip(self.rows, sampled, drafts, strict=True):
            assert all(isinstance(t, int) for t in d)
            assert len(d) <= self.proposer.k and r.n_tokens + len(d) <= self.max_model_len
            if not s:
                assert d == []
                continue
            r.drafts = d
            r.n_drafted += len(d)
            r.proposals.append((r.n_tokens, d))
        self.steps += 1

    def run(self, requests: list[FakeRequest], arrivals: dict[int, list[FakeRequest]] | None = None) -> None:
        """Run until every request finished; ``arrivals[step]`` join the waiting queue at that step."""
        waiting = list(requests)
        arrivals = dict(arrivals or {})
        while waiting or arrivals or any(not r.finished for r in self.rows):
            waiting.extend(arrivals.pop(self.steps, []))
            self.step(waiting)
        self._condense()  # the last finished requests leave the batch: an empty step ends them
        self.log.append((self._ended, []))
        self._ended = []
        self.proposer.propose([], np.zeros(0, dtype=np.int32), self.token_ids_cpu)
