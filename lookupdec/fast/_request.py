"""The fast path's request: ``Drafter``'s per-step bookkeeping, compiled with the caches.

A step of generation is one ``propose`` and one ``extend``: a few µs of compiled drafting and
counting. Written in interpreted Python (``lookupdec._lifecycle.Request``), the checks around
them (a closed request, the ids' range, which prefix of the last proposal was confirmed, the
Drafter's counters) would cost as much again; here they are native code calling the compiled
``draft``/``update`` directly. :class:`Request` is what ``lookupdec.fast.Drafter.request``
returns for the ``"llama"`` policy (the hybrid policy keeps the shared lifecycle's request),
with the same methods, results and errors as the shared one.

This module is compiled by mypyc (see ``setup.py``); it also runs unchanged as plain Python.
"""

from __future__ import annotations

import operator
from collections.abc import Collection, Iterable
from types import TracebackType
from typing import Any, SupportsIndex, cast

from mypy_extensions import i64

from lookupdec.errors import RequestClosedError
from lookupdec.fast._cache import NgramCache, require_cache
from lookupdec.fast._draft import draft_list, require_static_source
from lookupdec.fast._source import StaticSource
from lookupdec.fast._tables import NGRAM_MAX, NGRAM_MIN
from lookupdec.rules import MAX_DRAFT, check_draft_length


class Tally:
    """A Drafter's counters, as native ints (requests update them every step).

    The shared lifecycle reads and updates the same fields (``lookupdec._lifecycle.Tally`` is
    its interpreted twin, used by the reference).
    """

    requests: i64
    proposals: i64
    n_drafted: i64
    n_accept: i64
    open: i64

    def __init__(self) -> None:
        self.requests = 0
        self.proposals = 0
        self.n_drafted = 0
        self.n_accept = 0
        self.open = 0


class Request:
    """One generation: its tokens so far and its context cache. Made by ``Drafter.request``.

    The same API as ``lookupdec._lifecycle.Request`` (``tokens``, ``closed``, ``propose``,
    ``trim``, ``rule_tokens``, ``extend``, ``end``, ``n_drafted``, ``n_accept``, a context
    manager), for the ``"llama"`` policy.
    """

    n_drafted: i64
    """Tokens this request proposed."""
    n_accept: i64
    """Proposed tokens this request's ``extend`` calls confirmed."""
    _host: Any  # the Drafter's lookupdec._lifecycle.RequestHost (interpreted): n_draft, the caches, end()
    _tally: Tally
    _static: StaticSource
    _limit: i64
    _tokens: list[int]
    _context: NgramCache | None
    _proposal: list[int]
    _matched: i64  # proposal tokens confirmed so far; -1: no live proposal

    def __init__(self, host: Any, prompt: Iterable[int] = ()) -> None:
        # Read as objects: typed as ints, mypyc would reject a numpy integer with its own
        # TypeError before operator.index could convert it (as extend does below).
        raw: list[object] = list(prompt)
        tokens = [operator.index(cast(Any, t)) for t in raw]
        host.check_ids(tokens, "prompt token")
        tally = host.tally
        if not isinstance(tally, Tally):
            raise TypeError("lookupdec.fast's Request needs a Drafter whose counters are lookupdec.fast's Tally")
        self._host = host
        self._tally = tally
        self._static = require_static_source(host.static)
        self._limit = host.id_limit
        self._tokens = tokens
        context = NgramCache()
        context.update(tokens, len(tokens))
        self._context = context
        self._proposal = []
        self._matched = -1
        self.n_drafted = 0
        self.n_accept = 0
        tally.requests += 1
        tally.open += 1

    @property
    def tokens(self) -> list[int]:
        """The prompt and the committed tokens (the list itself: do not modify it)."""
        return self._tokens

    @property
    def closed(self) -> bool:
        """Whether :meth:`end` has run."""
        return self._context is None

    # k and n are SupportsIndex, not int, here: typed int, mypyc would refuse a numpy integer
    # with its own TypeError before operator.index converts it (the shared Request takes one).
    def propose(self, k: SupportsIndex | None = None, stop: Collection[int] = ()) -> list[int]:
        """Up to ``k`` (default ``n_draft``) tokens likely to follow, cut before any ``stop`` token.

        As ``lookupdec._lifecycle.Request.propose``: nothing before two tokens are known.
        """
        context = self._context
        if context is None:
            raise RequestClosedError("propose() on a request that has ended")
        d = self._host
        asked: int = d.n_draft if k is None else operator.index(k)  # a Python int: checked before i64
        if not 0 <= asked <= MAX_DRAFT:
            check_draft_length(asked, "k")
        n: i64 = asked
        tokens = self._tokens
        proposal: list[int] = []
        if len(tokens) >= 2 and n > 0:
            # The dynamic cache is read at each step: Drafter.save() may replace it.
            dynamic = require_cache(d.dynamic, "nc_dynamic")
            draft_list(tokens, proposal, n, NGRAM_MIN, NGRAM_MAX, context, dynamic, self._static)
            if len(stop):  # not truth: a numpy array of ids has none
                for i, t in enumerate(proposal):
                    if t in stop:
                        del proposal[i:]
                        break
        self._proposal = proposal
        self._matched = 0
        drafted: i64 = len(proposal)
        self.n_drafted += drafted
        tally = self._tally
        tally.proposals += 1
        tally.n_drafted += drafted
        return proposal

    @property
    def rule_tokens(self) -> int:
        """How many of the last proposal's first tokens llama.cpp's rule drafted: all of them here."""
        return len(self._proposal)

    def trim(self, n: SupportsIndex) -> None:
        """Send only the first ``n`` tokens of the last proposal (as ``lookupdec._lifecycle.Request.trim``)."""
        if self._context is None:
            raise RequestClosedError("trim() on a request that has ended")
        asked = operator.index(n)
        if asked < 0:
            raise ValueError(f"n must be >= 0, got {asked}")
        # no proposal is longer than MAX_DRAFT: a larger n keeps it whole, and fits an i64
        keep: i64 = asked if asked < MAX_DRAFT else MAX_DRAFT
        if self._matched != 0:
            raise ValueError("trim() must come after propose() and before extend() confirms any of the proposal")
        cut: i64 = len(self._proposal) - keep
        if cut <= 0:
            return
        self._proposal = self._proposal[:keep]  # a new list: the caller's copy of the proposal stays as it was
        self.n_drafted -= cut
        self._tally.n_drafted -= cut

    def propose_tree(
        self, k: SupportsIndex | None = None, branches: int = 3, stop: Collection[int] = ()
    ) -> list[list[int]]:
        """Tree drafts are the hybrid policy's (``lookupdec._lifecycle.Request.propose_tree``): ValueError here."""
        raise ValueError("propose_tree() needs a Drafter(policy='hybrid'): llama.cpp's rule drafts one branch")

    def extend(self, ids: Iterable[int]) -> None:
        """Commit ``ids`` (accepted drafts and the model's own tokens), counted as llama.cpp does.

        As ``lookupdec._lifecycle.Request.extend``: the confirmed prefix of the last proposal
        counts as accepted.
        """
        context = self._context
        if context is None:
            raise RequestClosedError("extend() on a request that has ended")
        # Typed as objects: mypyc would otherwise reject a numpy integer with its own TypeError
        # before the check below can convert it.
        raw: list[object] = list(ids)
        if not raw:
            return
        # A plain int, not i64: mypyc converts the other side of an int/i64 comparison to i64,
        # which fails ("int too large to convert to i64") on an id of 2**63 before the check.
        limit: int = self._limit
        plain = True
        for x in raw:
            # bool is an int subclass: it takes the converting path, as in the shared lifecycle.
            if not isinstance(x, int) or isinstance(x, bool) or x < 0 or x >= limit:
                plain = False
                break
        if plain:
            new = cast(list[int], raw)
        else:
            # numpy integers become ints; floats raise TypeError; the Drafter words range errors.
            new = [operator.index(cast(Any, x)) for x in raw]
            self._host.check_ids(new, "token")
        matched = self._matched
        if matched >= 0:
            proposal = self._proposal
            n_proposed: i64 = len(proposal)
            accepted: i64 = 0
            for t in new:
                if matched + accepted >= n_proposed or proposal[matched + accepted] != t:
                    matched = -1
                    break
                accepted += 1
            else:
                matched += accepted
            self._matched = matched
            self.n_accept += accepted
            self._tally.n_accept += accepted
        tokens = self._tokens
        tokens.extend(new)
        # One update over the new tokens counts exactly what one nnew=1 update per token counts.
        context.update(tokens, len(new))

    def end(self) -> None:
        """Merge the context cache into the dynamic cache, once (as the lifecycle's ``end``)."""
        context = self._context
        if context is None:
            return
        self._context = None
        self._proposal = []
        self._matched = -1
        self._host.end(context)

    def __enter__(self) -> Request:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.end()

    def __repr__(self) -> str:
        state = "ended" if self._context is None else "open"
        return f"<Request {state} tokens={len(self._tokens)} drafted={self.n_drafted} accepted={self.n_accept}>"


def new_request(host: Any, prompt: Iterable[int]) -> Request:
    """A compiled request of the Drafter whose ``RequestHost`` is ``host`` (the llama policy)."""
    return Request(host, prompt)


__all__ = ["Request", "Tally", "new_request"]
