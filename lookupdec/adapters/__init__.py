"""lookupdec inside inference engines: transformers, vLLM and llama-cpp-python.

Each adapter module imports its engine only when it is imported itself, so ``import lookupdec``
never pulls torch, vLLM or llama-cpp-python. Install an engine with its extra:
``pip install 'lookupdec[transformers]'``, ``'lookupdec[vllm]'``, ``'lookupdec[llama-cpp]'``.

This package's own code (:class:`HistoryFollower`) is engine-free: it maps "the committed
history, as the engine shows it each step" onto a :class:`lookupdec.Drafter` request.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any


class HistoryFollower:
    """Follow the generations an engine shows as their whole committed history at each step.

    :meth:`propose` syncs the current request with the history, then drafts. Within one
    generation, each call's history extends the last one by the accepted part of the last
    proposal and the model's own token: at most ``len(proposal) + 1`` tokens. A history that
    extends the last by more (a chat's next turn: the previous history, the reply's tail, the
    new message) or that does not extend it (a new prompt, a rewind) is a new generation: the
    request ends (merging it into the dynamic cache) and a new one starts with the history as
    its prompt.

    ``vocab_size``, the model's vocabulary size when known, bounds the drafted ids: a drafter
    built for a larger vocabulary is refused, and a drafted id past it is a clear error (an
    engine given such an id may crash).
    """

    def __init__(self, drafter: Any, vocab_size: int | None = None) -> None:
        self.drafter = drafter
        """The :class:`lookupdec.Drafter` the requests belong to."""
        self.request: Any = None
        """The request being followed (None before the first :meth:`sync` and after :meth:`end`)."""
        self.vocab_size = vocab_size
        """The model's vocabulary size (None: not checked)."""
        self.max_growth: int | None = None
        """How many tokens the next history may add and still be the same generation (None: any)."""
        drafter_vocab = getattr(drafter, "vocab_size", None)
        if vocab_size is not None and drafter_vocab is not None and drafter_vocab > vocab_size:
            raise ValueError(
                f"the drafter's vocabulary has {drafter_vocab} tokens, the model's {vocab_size}: "
                "its caches were built for another tokenizer"
            )

    def sync(self, history: Sequence[int], same_generation: bool = False) -> Any:
        """The request whose tokens are now exactly ``history`` (a list of ints).

        ``same_generation``: any extension of the last history continues the request (for the
        final history of a generation, which may hold more than one step's tokens).
        """
        req = self.request
        if req is not None:
            known = req.tokens
            n = len(known)
            grows = len(history) - n
            within = same_generation or self.max_growth is None or grows <= self.max_growth
            if grows >= 0 and within and history[:n] == known:
                if grows > 0:
                    req.extend(history[n:])
                return req
            req.end()
        self.request = self.drafter.request(history)
        self.max_growth = None
        return self.request

    def propose(self, history: Sequence[int], k: int, stop: Collection[int] = ()) -> list[int]:
        """Sync with ``history``, then up to ``k`` drafted tokens (cut before any ``stop`` id)."""
        req = self.sync(history)
        proposal: list[int] = req.propose(k, stop=stop)
        limit = self.vocab_size
        if limit is not None:
            for t in proposal:
                if t >= limit:
                    raise ValueError(
                        f"lookupdec drafted token id {t}, past the model's vocabulary of {limit} tokens: the "
                        f"drafter's caches hold ids of another tokenizer (give Drafter(vocab_size={limit}) to "
                        "refuse them when they are opened)"
                    )
        self.max_growth = len(proposal) + 1
        return proposal

    def end(self, history: Sequence[int] | None = None) -> None:
        """End the request (after syncing it to the final ``history`` when given)."""
        if history is not None:
            self.sync(history, same_generation=True)
        if self.request is not None:
            self.request.end()
            self.request = None
        self.max_growth = None


__all__ = ["HistoryFollower"]
