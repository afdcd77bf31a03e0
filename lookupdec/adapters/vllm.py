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

# The per-step row loop is compiled with the fast path (it calls any Drafter's requests, the
# reference's too, through their methods; lookupdec.fast's natively).
from lookupdec.fast._rows import RowTracker


def drafter_from_env(n_draft: int) -> Any:
    """A :class:`lookupdec.Drafter` configured by ``LOOKUPDEC_STATIC``/``_DYNAMIC``/``_POLICY``."""
    static = os.environ.get("LOOKUPDEC_STATIC") or None
    dynamic = os.environ.get("LOOKUPDEC_DYNAMIC") or None
    policy = os.environ.get("LOOKUPDEC_POLICY") or "llama"
    return lookupdec.Drafter(static=static, dynamic=dynamic, n_draft=n_draft, policy=policy)


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
        self._tracker = RowTracker()  # which request is in which batch row
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
        ids = np.asarray(token_ids_cpu)
        return self._tracker.step(self.drafter, sampled_token_ids, num_tokens_no_spec, ids, self.k, self.max_model_len)

    def end_all(self) -> None:
        """End every request still open (their contexts go into the dynamic cache)."""
        self._tracker.end_all()

    def close(self) -> None:
        """End every open request and save the dynamic cache file, if the Drafter has one (locked merge)."""
        self.end_all()
        if self.drafter.dynamic_path is not None:
            self.drafter.save()


__all__ = ["LookupProposer", "drafter_from_env"]
