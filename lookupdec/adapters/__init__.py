"""lookupdec inside inference engines: transformers, vLLM and llama-cpp-python.

Each adapter module imports its engine only when it is imported itself, so ``import lookupdec``
never pulls torch, vLLM or llama-cpp-python. Install an engine with its extra:
``pip install 'lookupdec[transformers]'``, ``'lookupdec[vllm]'``, ``'lookupdec[llama-cpp]'``.

This package's own code (:class:`HistoryFollower`) is engine-free: it maps "the committed
history, as the engine shows it each step" onto a :class:`lookupdec.Drafter` request.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class HistoryFollower:
    """Follow one generation that an engine shows as its whole committed history each step.

    :meth:`sync` extends the current request with the tokens added since the last call, or,
    when the history does not extend the last one (a new prompt, a rewind), ends the request
    (merging it into the dynamic cache) and starts a new one with the history as its prompt.
    """

    def __init__(self, drafter: Any) -> None:
        self.drafter = drafter
        """The :class:`lookupdec.Drafter` the requests belong to."""
        self.request: Any = None
        """The request being followed (None before the first :meth:`sync` and after :meth:`end`)."""

    def sync(self, history: Sequence[int]) -> Any:
        """The request whose tokens are now exactly ``history`` (a list of ints)."""
        req = self.request
        if req is not None:
            known = req.tokens
            n = len(known)
            if len(history) >= n and history[:n] == known:
                if len(history) > n:
                    req.extend(history[n:])
                return req
            req.end()
        self.request = self.drafter.request(history)
        return self.request

    def end(self, history: Sequence[int] | None = None) -> None:
        """End the request (after syncing it to the final ``history`` when given)."""
        if history is not None:
            self.sync(history)
        if self.request is not None:
            self.request.end()
            self.request = None


__all__ = ["HistoryFollower"]
