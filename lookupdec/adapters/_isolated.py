"""Requests that never draft from one another: a fresh Drafter per request (see :class:`IsolatedDrafter`)."""

from __future__ import annotations

import operator
import os
import threading
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import lookupdec
from lookupdec._lifecycle import DrafterStats
from lookupdec.rules import check_draft_length, check_threshold


class IsolatedDrafter:
    """A drafter whose requests draft only from their own tokens, the static index and the corpus.

    A :class:`lookupdec.Drafter` shared by a server's requests drafts each one from the others'
    text too: llama.cpp's dynamic cache merges every ended request, and the hybrid policy's
    history holds their tokens. Verification keeps every output exact, but how fast a request
    is generated then depends on what other requests held: whoever can time their own requests
    can learn whether some text was in someone else's prompt or output. Where requests come
    from users who must not learn about one another, isolate them: each :meth:`request` is the
    only request of a fresh Drafter (its own context, an empty dynamic cache, for the hybrid
    policy its own history and acceptance counts), and only the static index, read-only and
    opened once, is shared. Isolated drafts are exactly what a fresh ``Drafter`` per request
    drafts; they give up what a shared one learns from earlier requests (docs/speedup.md
    measures both).

    The arguments are :class:`lookupdec.Drafter`'s, but for ``dynamic``, which an isolated
    drafter cannot have (it would merge the requests' text into one cache). A ``corpus`` (the
    hybrid policy's: a corpus file, an opened one, or token ids), like the static index, is
    read-only and shared: every request's history holds the corpus and its own tokens. The
    compiled implementation opens it (or builds it from the ids) once; the reference, the
    oracle, rebuilds it for every request. ``drafter_class`` makes the Drafters (default
    :class:`lookupdec.Drafter`; e.g. ``lookupdec.reference.Drafter``).
    A hybrid-policy request's Drafter holds its own acceptance tables: about 5 MB while the
    request is open, and about 2 ms to make on a 2-core CPU (once per request, not per step); a
    llama-policy one, about 10 µs (docs/speedup.md). Threads may share an IsolatedDrafter, as
    they may a Drafter: its counts and open requests are kept under a lock of its own.
    """

    def __init__(
        self,
        static: Any = None,
        n_draft: int = 8,
        policy: str = "llama",
        target_waste: float | None = None,
        vocab_size: int | None = None,
        vocab_fingerprint: bytes | None = None,
        history_tokens: int | None = None,
        corpus: Any = None,
        drafter_class: Callable[..., Any] | None = None,
    ) -> None:
        self._make = drafter_class if drafter_class is not None else lookupdec.Drafter
        first = self._make(
            static=static,
            n_draft=n_draft,
            policy=policy,
            target_waste=target_waste,
            vocab_size=vocab_size,
            vocab_fingerprint=vocab_fingerprint,
            history_tokens=history_tokens,
            corpus=corpus,
        )  # checks every argument once, as the Drafter would, and opens the static index and the corpus
        self._static = first.static
        self._kwargs: dict[str, Any] = dict(
            policy=policy, target_waste=target_waste, vocab_size=vocab_size, history_tokens=history_tokens
        )
        if corpus is not None:
            opened = first.policy_state.history.corpus
            if hasattr(opened, "vocab_fingerprint"):  # the compiled CorpusIndex: read-only, shared as it is
                self._kwargs["corpus"] = opened
            elif isinstance(corpus, (str, os.PathLike)):
                self._kwargs["corpus"] = corpus  # the reference reads the file again for every request
            else:
                self._kwargs["corpus"] = list(opened)  # the ids as checked (an iterator is read only once)
        self._n_draft: int = int(first.n_draft)
        self.policy: str = policy
        """The drafting policy of every request (``"llama"`` or ``"hybrid"``)."""
        self.vocab_size = vocab_size
        """The model's vocabulary size, when given: every request's ids are checked against it."""
        self._threshold: float | None = None
        # The open requests' Drafters, by what their requests hold of them (RequestHost: the
        # Drafter object itself is dropped once its request starts), weakly: a request collected
        # after it ended takes its host along, and its counts are folded into _done.
        self._live: weakref.WeakSet[Any] = weakref.WeakSet()
        self._done = [0, 0, 0, 0]  # the collected requests' counts: requests, proposals, drafted, accepted
        # Guards _live and _done for threads sharing this drafter: iterating a WeakSet while
        # another thread adds to it raised "Set changed size during iteration", and a fold
        # interleaved with another lost counts. Reentrant: the finalizer that folds a collected
        # request's counts can run, through the garbage collector, while this thread holds it.
        self._lock = threading.RLock()

    @property
    def n_draft(self) -> int:
        """Tokens a proposal holds at most (may be changed: for the open requests too)."""
        return self._n_draft

    @n_draft.setter
    def n_draft(self, n: int) -> None:
        n = operator.index(n)  # as Drafter.n_draft: 2.5 or 10**6 were taken, and every later request failed
        check_draft_length(n, "n_draft")
        with self._lock:
            self._n_draft = n
            for host in list(self._live):
                host.n_draft = n

    @property
    def static(self) -> Any:
        """The static index every request shares (an empty cache when none was given)."""
        return self._static

    dynamic_path: None = None
    """No dynamic cache file: there is nothing shared to save."""

    @property
    def threshold(self) -> float | None:
        """The hybrid policy's threshold set on every request's Drafter (None: each steers its own)."""
        return self._threshold

    @threshold.setter
    def threshold(self, value: float) -> None:
        if self.policy != "hybrid":
            raise ValueError(f"a threshold is the hybrid policy's; these requests draft with {self.policy!r}")
        with self._lock:
            self._threshold = checked = check_threshold(value)
            for host in list(self._live):
                host.hybrid.threshold = checked

    def request(self, prompt: Iterable[int] = ()) -> Any:
        """Start a request, the only one of a fresh Drafter (see :class:`lookupdec.Drafter.request`)."""
        d = self._make(static=self._static, n_draft=self._n_draft, **self._kwargs)
        if self._threshold is not None:
            d.policy_state.threshold = self._threshold
        req = d.request(prompt)
        host = d._host  # what the request holds of its Drafter (lookupdec._lifecycle.RequestHost)
        with self._lock:
            self._live.add(host)
            # When the request and its host are collected, its counts join the total. The
            # finalizer holds the counters, not the host (which would then never be collected).
            weakref.finalize(host, self._fold, host.tally)
        return req

    def _fold(self, tally: Any) -> None:
        with self._lock:
            done = self._done
            done[0] += int(tally.requests)
            done[1] += int(tally.proposals)
            done[2] += int(tally.n_drafted)
            done[3] += int(tally.n_accept)

    @property
    def stats(self) -> DrafterStats:
        """Counts over every request so far (a snapshot), as :attr:`lookupdec.Drafter.stats` counts them."""
        with self._lock:
            r, p, n, a = self._done
            for host in list(self._live):
                t = host.tally
                r, p, n, a = r + t.requests, p + t.proposals, n + t.n_drafted, a + t.n_accept
        return DrafterStats(int(r), int(p), int(n), int(a))

    @property
    def open_requests(self) -> int:
        """Requests started and not yet ended (one dropped without ``end()`` counts until it is collected)."""
        with self._lock:
            return sum(int(host.tally.open) for host in list(self._live))

    def save(self, path: Any = None) -> None:
        """Nothing to save: isolated requests share no dynamic cache (for the adapters, which save a Drafter's)."""

    def __repr__(self) -> str:
        return f"IsolatedDrafter(policy={self.policy!r}, n_draft={self._n_draft}, open_requests={self.open_requests})"


def set_threshold(drafter: Any, value: float) -> None:
    """Set the hybrid policy's threshold of ``drafter``: a :class:`lookupdec.Drafter` or an :class:`IsolatedDrafter`."""
    if isinstance(drafter, IsolatedDrafter):
        drafter.threshold = value
        return
    state = drafter.policy_state
    if state is None:
        raise ValueError(f"a threshold is the hybrid policy's; this Drafter drafts with {drafter.policy!r}")
    state.threshold = check_threshold(value)
