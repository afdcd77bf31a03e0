"""lookupdec drafting in vLLM (V1 engine), through its ``custom_class`` speculative method.

::

    LOOKUPDEC_STATIC=corpus.lkdc LOOKUPDEC_DYNAMIC=dynamic.bin python serve.py

    from vllm import LLM
    llm = LLM(model=..., speculative_config={
        "method": "custom_class",
        "model": "lookupdec.adapters.vllm.LookupProposer",
        "num_speculative_tokens": 8,
    })

vLLM builds ``LookupProposer(vllm_config)`` and calls :meth:`LookupProposer.propose` once per step
for the whole batch. vLLM's speculative config takes no extra keys, so lookupdec's settings come
from environment variables: ``LOOKUPDEC_STATIC`` (static cache file), ``LOOKUPDEC_DYNAMIC``
(dynamic cache file: loaded at start, saved with a locked merge when the process exits) and
``LOOKUPDEC_POLICY`` (drafting policy: ``llama``, the default, or ``hybrid``). The draft length is vLLM's
``num_speculative_tokens``. vLLM's ``custom_class`` method is experimental upstream.

This module never imports vLLM: the proposer only reads the config fields it needs and the
arrays vLLM passes (NumPy arrays or lists).
"""

from __future__ import annotations

import atexit
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

import lookupdec

_SIGNATURE = 4  # tokens compared at each end of the known history to recognize a request


def drafter_from_env(n_draft: int) -> Any:
    """A :class:`lookupdec.Drafter` configured by ``LOOKUPDEC_STATIC``/``_DYNAMIC``/``_POLICY``."""
    static = os.environ.get("LOOKUPDEC_STATIC") or None
    dynamic = os.environ.get("LOOKUPDEC_DYNAMIC") or None
    policy = os.environ.get("LOOKUPDEC_POLICY") or "llama"
    return lookupdec.Drafter(static=static, dynamic=dynamic, n_draft=n_draft, policy=policy)


def _as_list(ids: Any) -> list[int]:
    if type(ids) is list:
        return ids
    tolist = getattr(ids, "tolist", None)
    return list(tolist()) if tolist is not None else [int(t) for t in ids]


def _continues(req: Any, known: int, first: int, mid: int, last: int) -> bool:
    """True when ``req`` is a request of ``known`` tokens with these first, middle and last tokens.

    Not the whole history: enough to tell requests apart, and O(1) per row.
    """
    tokens: list[int] = req.tokens
    return (
        len(tokens) == known and known > 0 and tokens[-1] == last and tokens[0] == first and tokens[known >> 1] == mid
    )


class LookupProposer:
    """A vLLM V1 draft proposer backed by a :class:`lookupdec.Drafter` (one request per vLLM request).

    vLLM identifies requests only by their row in the batch, and rows move: when requests finish,
    vLLM condenses the batch by moving later rows into the holes, and new requests take free
    rows. The proposer recognizes a request by its length and its first and last tokens: a row
    whose known tokens continue a request extends it (even from another row), a row that
    continues none starts a new request with its whole history as the prompt, and a request that
    appears in no row is ended (its context merged into the dynamic cache) before anything is
    drafted in that step, as llama.cpp ends a request before the next one drafts.
    """

    def __init__(self, vllm_config: Any, *args: Any, drafter: Any = None, **kwargs: Any) -> None:
        spec = getattr(vllm_config, "speculative_config", None)
        k = getattr(spec, "num_speculative_tokens", None)
        if k is None:
            raise ValueError("LookupProposer needs vllm_config.speculative_config.num_speculative_tokens")
        self.k = int(k)
        """Tokens proposed per request and step at most (vLLM's ``num_speculative_tokens``)."""
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        """No draft goes past this many tokens in a request."""
        self.drafter = drafter if drafter is not None else drafter_from_env(self.k)
        """The :class:`lookupdec.Drafter` all requests share (``drafter.stats``, ``drafter.save()``)."""
        self._rows: dict[int, Any] = {}  # batch row -> the request that was in it at the last step
        if drafter is None and self.drafter.dynamic_path is not None:
            # vLLM has no shutdown hook for proposers: save the dynamic cache when the process exits.
            atexit.register(self.close)

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """vLLM asks its drafter to load a model: lookup drafting has none."""

    def propose(
        self,
        sampled_token_ids: Sequence[Any],
        num_tokens_no_spec: Sequence[int] | Any,
        token_ids_cpu: Any,
        slot_mappings: Any = None,
        **kwargs: Any,
    ) -> list[list[int]]:
        """Draft for every row of the batch (an empty list for a row that drafts nothing).

        ``sampled_token_ids[i]``: the tokens committed for row i in this step (empty while the
        row is prefilling); ``num_tokens_no_spec[i]``: how many tokens row i holds, those
        included; ``token_ids_cpu[i]``: the row's tokens (prompt and committed).
        """
        previous = self._rows
        unclaimed: dict[int, Any] = {id(req): req for req in previous.values()}
        rows: dict[int, Any] = {}
        committed: dict[int, list[int]] = {}
        batch = [_as_list(s) for s in sampled_token_ids]
        counts = _as_list(num_tokens_no_spec)[: len(batch)]
        knowns = [int(n) - len(s) for n, s in zip(counts, batch, strict=True)]
        # Each row's first, middle and last known token, gathered in three vectorized reads.
        ids = np.asarray(token_ids_cpu)
        rows_ix = np.arange(len(batch))
        known_ix = np.asarray(knowns, dtype=np.int64)
        firsts = ids[rows_ix, 0].tolist()
        mids = ids[rows_ix, known_ix >> 1].tolist()
        lasts = ids[rows_ix, np.maximum(known_ix - 1, 0)].tolist()
        # Pass 1: which request is in which row now.
        for i, sampled in enumerate(batch):
            known, sig = knowns[i], (firsts[i], mids[i], lasts[i])
            req = previous.get(i)
            if req is None or id(req) not in unclaimed or not _continues(req, known, *sig):
                req = next((r for r in unclaimed.values() if _continues(r, known, *sig)), None)
            if req is not None:
                del unclaimed[id(req)]
                rows[i] = req
                committed[i] = sampled
            elif sampled:
                committed[i] = ids[i, : int(counts[i])].tolist()  # a new request: its whole history is the prompt
        # Requests in no row have finished (or were preempted): merge them before drafting.
        for req in unclaimed.values():
            req.end()
        # Pass 2: count what each row committed, then draft within the model's length budget.
        drafts: list[list[int]] = []
        for i, sampled in enumerate(batch):
            new = committed.get(i)
            if new is None:
                drafts.append([])
                continue
            req = rows.get(i)
            if req is None:
                req = rows[i] = self.drafter.request(new)
            elif new:
                req.extend(new)
            n = len(req.tokens)
            k = min(self.k, self.max_model_len - n)
            drafts.append(req.propose(k) if k > 0 and sampled else [])
        self._rows = rows
        return drafts

    def end_all(self) -> None:
        """End every request still open (their contexts go into the dynamic cache)."""
        for req in self._rows.values():
            req.end()
        self._rows = {}

    def close(self) -> None:
        """End every open request and save the dynamic cache file, if the Drafter has one (locked merge)."""
        self.end_all()
        if self.drafter.dynamic_path is not None:
            self.drafter.save()


__all__ = ["LookupProposer", "drafter_from_env"]
