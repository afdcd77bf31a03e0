"""The request lifecycle of llama.cpp's lookup loop, written once for both implementations.

:class:`Drafter` holds the caches every request shares (the static index, opened once, and the
dynamic cache); :class:`Request` holds one generation's context cache and tokens. The n-gram
operations themselves (``NgramCache``, ``draft``, ``load_static``) are the implementation's: each
implementation binds them in a subclass (``lookupdec.reference.Drafter``,
``lookupdec.fast.Drafter``), so this module imports nothing but the standard library and
lookupdec's leaf modules, and never an implementation.

The loop is llama.cpp's ``examples/lookup``: the prompt's n-grams are counted into a fresh
context cache, each step drafts from context, dynamic and static caches, the tokens the model
commits are counted one by one (``common_ngram_cache_update(..., nnew=1)``), and when the
request ends its context cache is merged into the dynamic cache.

With ``policy="hybrid"`` the Drafter also holds one hybrid-policy state (the implementation's
``HybridState``: a bounded suffix history shared by its requests and the acceptance
statistics): a request begins in it when it starts, proposes through it, tells it how much of
each proposal was accepted as ``extend`` confirms it, and hands it its last tokens when it ends.
"""

from __future__ import annotations

import operator
import os
import threading
import weakref
from array import array
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, ClassVar, Protocol, cast

from lookupdec._atomic import check_output_path
from lookupdec._shared_file import merge_into_file
from lookupdec.errors import CacheFormatError, RequestClosedError, VocabularyError
from lookupdec.formats.detect import detect_format
from lookupdec.formats.index_header import read_index_vocab
from lookupdec.result import common_prefix, tree_nodes
from lookupdec.rules import (
    INT32_MAX,
    MAX_DRAFT,
    NGRAM_MAX,
    NGRAM_MIN,
    check_branches,
    check_corpus,
    check_draft_length,
    check_history_tokens,
    check_policy,
    check_target_waste,
    check_vocab_fingerprint,
)


class Cache(Protocol):
    """The cache operations the lifecycle uses (both implementations' ``NgramCache`` have them)."""

    def update(self, tokens: Sequence[int], nnew: int, /) -> None:
        """Count the n-grams whose follower is among the last ``nnew`` tokens."""

    def merge(self, other: Any, /) -> None:
        """Add every count of ``other``."""

    def save(self, path: str | os.PathLike[str], /) -> None:
        """Write the cache in llama.cpp's legacy format."""

    def __len__(self) -> int: ...


class PartSource(Protocol):
    """A static cache: answers the followers of a padded 2-gram key."""

    def part(self, key: tuple[int, int, int, int], /) -> Mapping[int, int] | None:
        """The followers of ``key`` or None."""


DraftFunction = Callable[[Sequence[int], list[int], int, int, int, Any, Any, Any], None]


class Tally:
    """A Drafter's counters, updated by its requests (an implementation may give a compiled twin)."""

    __slots__ = ("n_accept", "n_drafted", "open", "proposals", "requests")

    def __init__(self) -> None:
        self.requests = 0
        self.proposals = 0
        self.n_drafted = 0
        self.n_accept = 0
        self.open = 0


class CacheType(Protocol):
    """An implementation's ``NgramCache`` class: called for an empty cache, ``load`` reads a file."""

    def __call__(self) -> Cache: ...

    def load(self, path: str, /) -> Cache:
        """Read a cache file in llama.cpp's format."""


@dataclass(frozen=True)
class Primitives:
    """What an implementation gives the lifecycle: its cache class and its drafting operations."""

    name: str
    cache: CacheType
    draft: DraftFunction
    load_static: Callable[..., Any]
    new_hybrid: Callable[[int | None, float | None], Any] | None = None
    """A fresh ``HybridState`` over a ``SuffixHistory`` of at most that many tokens (None: its
    default); None when the implementation has no hybrid policy."""
    new_tally: Callable[[], Any] = Tally
    """A fresh set of counters with :class:`Tally`'s fields (the one requests of ``new_request`` update)."""
    new_request: Callable[[RequestHost, Iterable[int]], Any] | None = None
    """A request of the ``"llama"`` policy with :class:`Request`'s API (e.g. compiled with the
    caches), made from the Drafter's :class:`RequestHost`; None: :class:`Request`."""


class RequestHost:
    """What a request uses of its Drafter: the one seam between a Drafter and its requests.

    A :class:`Drafter` keeps the state its requests share here; the requests (:class:`Request`,
    or an implementation's own such as the compiled ``lookupdec.fast._request.Request``) hold
    this object, not the Drafter, and use only the names below.
    """

    # __weakref__: lookupdec.adapters.IsolatedDrafter follows its requests' hosts without keeping them.
    __slots__ = ("__weakref__", "_owner", "added", "cache", "draft", "dynamic", "hybrid", "id_limit", "lock",
                 "n_draft", "static", "tally", "vocab_size", "waiting")  # fmt: skip

    def __init__(
        self,
        p: Primitives,
        n_draft: int,
        vocab_size: int | None,
        policy: str,
        history_tokens: int | None,
        target_waste: float | None = None,
    ) -> None:
        self.cache = p.cache
        """The implementation's cache class."""
        self.draft = p.draft
        """The implementation's ``draft`` (read by every proposal: an attribute, not a lookup)."""
        self.n_draft = n_draft
        """Tokens a proposal holds at most (the Drafter's ``n_draft``)."""
        self.vocab_size = vocab_size
        self.id_limit = vocab_size if vocab_size is not None else INT32_MAX + 1
        """Token ids must be below this."""
        self.static: Any = None
        """The static cache (set by the Drafter once opened)."""
        self.dynamic: Cache = p.cache()
        """The dynamic cache requests draft from (``Drafter.save`` may replace it)."""
        self.added: Cache | None = None
        """What ended requests added since the last save; None while ``dynamic`` holds exactly that."""
        self.tally: Any = p.new_tally()
        """The Drafter's counters (:class:`Tally`'s fields)."""
        self.hybrid: Any = p.new_hybrid(history_tokens, target_waste) if policy == "hybrid" and p.new_hybrid else None
        """The hybrid policy's ``HybridState`` (None for ``"llama"``)."""
        # Weak: a request dropped without end() (an exception, a client gone) would otherwise own
        # the history for the Drafter's life, and every later request would draft detached
        # from it, its tokens never joining (4x fewer tokens drafted in a check of 20 requests).
        self._owner: weakref.ref[Request] | None = None
        self.waiting: list[list[int]] = []
        """Tokens of requests that ended while the owner was open: they join the history after it."""
        self.lock = threading.RLock()
        """Held by every request's ``propose``, ``propose_tree``, ``trim``, ``extend`` and ``end``, by
        a request's start and by ``Drafter.save``: so threads may share a Drafter (a server's
        thread pool), each call running whole, as if the calls came one after another in one
        thread. Without it, two threads' calls interleaved inside the hybrid policy's shared state
        (the reference raised IndexError and "call begin_request()" errors; the counters lost
        updates), and a save could miss a request ended while it wrote. Reentrant: a request's
        ``end`` holds it when the host's :meth:`end` takes it again, and a finalizer that the
        garbage collector runs in the middle of a call (an engine adapter ending its requests when
        it is collected) must not deadlock. The compiled request of
        ``lookupdec.fast`` (the llama policy) takes it only through :meth:`end`: its ``propose``
        and ``extend`` change only its own state and the counters, in compiled code that no
        other thread runs between (it calls no Python code there).
        """

    @property
    def owner(self) -> Request | None:
        """The request whose tokens the hybrid history is following (the *history owner*).

        None when there is none: it ended, or it was dropped without ending and collected (then
        the tokens of the requests that ended while it was open join the history now).
        """
        ref = self._owner
        if ref is None:
            return None
        request = ref()
        if request is None:
            self._owner = None
            self._join_waiting()
        return request

    def _join_waiting(self) -> None:
        """The tokens of requests that ended while the owner was open join the history, in order."""
        state = self.hybrid
        waiting, self.waiting = self.waiting, []
        for tokens in waiting:
            state.begin_request()
            state.sync(tokens)

    def check_ids(self, ids: Sequence[int], what: str) -> None:
        """VocabularyError naming the first of ``ids`` outside ``0 <= id < id_limit`` (``what`` names them)."""
        if ids and (min(ids) < 0 or max(ids) >= self.id_limit):
            for i, t in enumerate(ids):
                if t < 0 or t >= self.id_limit:
                    bound = f"the vocabulary size {self.vocab_size}" if self.vocab_size is not None else "2^31"
                    raise VocabularyError(f"{what} {i} is {t}: token ids must be >= 0 and below {bound}")

    def end(self, context: Cache) -> None:
        """A request ended: its context cache joins the dynamic cache (and what the next save adds)."""
        with self.lock:
            self.dynamic.merge(context)
            if self.added is not None:
                self.added.merge(context)
            self.tally.open -= 1

    def claim_history(self, request: Request) -> None:
        """Make ``request`` the history owner: a new request in the suffix history."""
        self.hybrid.begin_request()
        self._owner = weakref.ref(request)

    def history_end(self, request: Request) -> None:
        """``request`` ended: its tokens complete the history (now, or after the owner's)."""
        state = self.hybrid
        owner = self.owner
        if request is owner:
            state.sync(request._tokens)
            self._owner = None
            self._join_waiting()
        elif owner is None:
            state.begin_request()
            state.sync(request._tokens)
        else:
            self.waiting.append(request._tokens)
            # Bounded as the history is: what waits beyond its size would be evicted as it joined
            # (an owner kept open for long, or never ended, held every later request's tokens).
            room = int(state.history.max_tokens)
            held = sum(len(t) for t in self.waiting)
            while held > room and len(self.waiting) > 1:
                held -= len(self.waiting.pop(0))


@dataclass(frozen=True)
class DrafterStats:
    """What a Drafter's requests drafted, as ``llama-lookup-stats`` counts it."""

    requests: int
    """Requests started."""
    proposals: int
    """``propose`` calls."""
    n_drafted: int
    """Tokens proposed, in all proposals."""
    n_accept: int
    """Proposed tokens confirmed by ``extend``: for each proposal, the prefix that the committed tokens matched."""

    @property
    def accept(self) -> float:
        """``n_accept`` as a percentage of ``n_drafted`` (0 when nothing was drafted)."""
        return 100.0 * self.n_accept / self.n_drafted if self.n_drafted else 0.0


class Drafter:
    """Draft inside real generation: many requests at once, sharing a static and a dynamic cache.

    ``static`` is a path (opened once with the implementation's ``load_static``; a lookupdec
    index is memory-mapped by the fast path; the stdlib-only reference opens legacy files by
    path and takes other formats opened, e.g. ``lookupdec.cli._pipeline.load_static``) or an opened
    cache; None means no static cache.
    ``dynamic`` is a path (loaded when the file exists, an empty cache otherwise, and the default
    target of :meth:`save`), an opened cache (used and updated in place), or None (an in-memory
    cache shared by this Drafter's requests, which is what ``replay`` does).

    ``vocab_size`` (when known) bounds the token ids requests accept and the files' ids: a
    static index or corpus file that records a larger vocabulary is refused, and a static or
    dynamic cache file given by path that records none (llama.cpp's, the fork's) has its ids
    read once when it is opened and is refused if one is at or past ``vocab_size`` (VocabularyError
    naming the file); ``vocab_fingerprint`` (8
    bytes, ``lookupdec.tokens.vocab_info``) is compared with a lookupdec static index's. The
    ``policy`` is how a proposal is drafted: ``"llama"``, llama.cpp's own (exactly ``replay``'s
    drafts), or ``"hybrid"``, llama.cpp's drafts continued by a suffix match over this Drafter's
    requests (exactly ``replay(..., policy="hybrid")``'s drafts when requests run one at a time).
    ``history_tokens`` bounds the hybrid policy's history (None: 4,194,304 tokens; the older
    half is dropped when it is full). ``target_waste`` (hybrid only): the rejected drafted
    tokens per step the policy steers its drafts' length to (0 to 64; None: 1.9). Lower
    wastes less verification work per step for fewer tokens per step (docs/hybrid.md).
    ``corpus`` (hybrid only): a corpus the suffix match also follows, older than every
    request and never evicted: the path of a corpus file
    (``lookupdec create --corpus-out``; memory-mapped, opened in O(1), shared by every process
    that maps it; its recorded vocabulary is checked against ``vocab_size`` and
    ``vocab_fingerprint`` when they are given, and a file that records none has its ids read
    when ``vocab_size`` is), an opened one (``lookupdec.fast.CorpusIndex``, checked on what it
    records) or token ids (built in memory, in time and memory linear in its length).

    With the hybrid policy, one open request at a time (the *history owner*: the first one to
    start or propose while no other owns it) has its tokens indexed in the suffix history as
    they come; requests open at the same time match their own last tokens against the history
    (earlier requests and the owner's tokens so far, not their own), and their tokens join the
    history when they end (after the owner's, if it is still open).

    Threads may share it: its requests' calls and :meth:`save` run whole under one lock
    (``RequestHost.lock``), as if they came one after another in one thread. A request is one
    generation: use it from one thread at a time.
    """

    primitives: ClassVar[Primitives]
    """The implementation's operations; set by each implementation's subclass."""

    def __init__(
        self,
        static: str | os.PathLike[str] | PartSource | None = None,
        dynamic: str | os.PathLike[str] | Cache | None = None,
        *,
        n_draft: int = 8,
        policy: str = "llama",
        vocab_size: int | None = None,
        vocab_fingerprint: bytes | None = None,
        in_memory: bool = False,
        history_tokens: int | None = None,
        corpus: Iterable[int] | str | os.PathLike[str] | object | None = None,
        target_waste: float | None = None,
    ) -> None:
        if not hasattr(type(self), "primitives"):
            raise TypeError("use the Drafter of an implementation: lookupdec.Drafter, lookupdec.fast.Drafter, ...")
        check_policy(policy)
        n_draft = operator.index(n_draft)
        check_draft_length(n_draft, "n_draft")
        if vocab_size is not None:
            vocab_size = operator.index(vocab_size)  # an int: 2.5 was taken, and failed at the first request
        if vocab_size is not None and not 0 < vocab_size <= INT32_MAX + 1:
            raise ValueError(f"vocab_size must be in 1..2^31, got {vocab_size}")
        if vocab_fingerprint is not None and len(vocab_fingerprint) != 8:
            raise ValueError(f"vocab_fingerprint must be 8 bytes, got {len(vocab_fingerprint)}")
        p = self.primitives
        if policy == "hybrid" and p.new_hybrid is None:
            raise ValueError(f"the {p.name} implementation has no hybrid policy")
        check_history_tokens(history_tokens, policy)
        check_target_waste(target_waste, policy)
        check_corpus(corpus, policy)
        host = RequestHost(p, n_draft, vocab_size, policy, history_tokens, target_waste)
        self._host = host
        self.policy = policy
        """The drafting policy."""
        self.vocab_size = vocab_size
        """Token ids must be below this (None: any int32 id >= 0)."""
        host.static = self._open_static(static, vocab_fingerprint, in_memory)
        self._dynamic_path: str | None = None
        self._owns_dynamic = True
        if isinstance(dynamic, (str, os.PathLike)):
            self._dynamic_path = os.fspath(dynamic)
            # save() writes there: an empty path, a folder or device, a missing folder failed only
            # then, at the end of a server's run, with everything its requests taught lost (a
            # read-only folder may be meant: not refused)
            check_output_path(self._dynamic_path, what="the dynamic cache", writable=False)
            if os.path.exists(self._dynamic_path) and os.path.getsize(self._dynamic_path) > 0:
                fmt = detect_format(self._dynamic_path)
                if fmt != "llama":  # save() would write it back in llama.cpp's format, merged
                    raise CacheFormatError(
                        self._dynamic_path,
                        f"a {fmt} file given as the dynamic cache, which is llama.cpp's format (what save() "
                        "writes): a static cache goes in static=",
                    )
                host.dynamic = p.cache.load(self._dynamic_path)
                self._check_file_ids(self._dynamic_path, "dynamic cache")
                host.added = p.cache()
        elif dynamic is not None:
            host.dynamic = dynamic
            self._owns_dynamic = False
            host.added = p.cache()
        # The implementation's own request class, if any (the hybrid policy's bookkeeping is
        # the shared Request's).
        self._new_request = p.new_request if policy == "llama" else None
        if corpus is not None:
            state: Any = host.hybrid  # the implementation's HybridState (policy is "hybrid" here)
            if isinstance(corpus, (str, os.PathLike)):
                path = os.fspath(corpus)
                self._check_corpus_file(path, vocab_fingerprint)
                state.history.add_corpus(path)
            elif hasattr(corpus, "vocab_fingerprint"):  # an opened corpus file (fast.CorpusIndex)
                # Checked on what it records, as an opened static index is: its ids are read only
                # when it is given by path (an IsolatedDrafter hands the opened corpus to a new
                # Drafter per request, and reading 458,000 ids took 27-57 ms each time).
                opened: Any = corpus
                self._check_corpus_vocab(opened.path, opened.vocab_size, opened.vocab_fingerprint, vocab_fingerprint)
                state.history.add_corpus(corpus)
            else:
                # an int32 array (a token file as lookupdec reads it) as it is: no list of ints
                is_i32 = isinstance(corpus, array) and corpus.typecode == "i" and corpus.itemsize == 4
                ids = corpus if is_i32 else [operator.index(t) for t in cast(Iterable[int], corpus)]
                host.check_ids(cast(Sequence[int], ids), "corpus token")
                state.history.add_corpus(ids)

    def _open_static(
        self, static: str | os.PathLike[str] | PartSource | None, fingerprint: bytes | None, in_memory: bool
    ) -> Any:
        p = self.primitives
        if static is None:
            return p.cache()
        if isinstance(static, (str, os.PathLike)):
            path = os.fspath(static)
            header = read_index_vocab(path) if os.path.isfile(path) else None
            if header is not None:
                if fingerprint is not None:
                    check_vocab_fingerprint(path, "static index", header[1], fingerprint)
                self._check_static_vocab(path, header[0])
            opened = p.load_static(path, in_memory=in_memory)
            if header is None or header[0] == 0:  # a file that records no vocabulary: its ids are read
                self._check_file_ids(path, "static cache")
            return opened
        where = getattr(static, "path", "the static index")
        known = getattr(static, "vocab_fingerprint", None)
        if fingerprint is not None and isinstance(known, bytes):
            check_vocab_fingerprint(where, "static index", known, fingerprint)
        recorded = getattr(static, "vocab_size", None)  # an opened lookupdec index's header
        if isinstance(recorded, int):
            self._check_static_vocab(where, recorded)
        return static

    def _check_static_vocab(self, where: str, recorded: int) -> None:
        """VocabularyError when the static index records a larger vocabulary (0: none recorded) than
        ``vocab_size``: it would draft ids the model does not have."""
        if self.vocab_size is not None and recorded > self.vocab_size:
            raise VocabularyError(
                f"{where}: the static index was built for a vocabulary of {recorded} ids, more than the "
                f"vocabulary size {self.vocab_size}: it would draft ids the model does not have"
            )

    def _check_file_ids(self, path: str, what: str) -> None:
        """VocabularyError when the cache file at ``path`` (``what`` names its role), which records
        no vocabulary, holds a token id at or past ``vocab_size``: it was made with another
        tokenizer and would draft ids the model does not have (an engine may crash on them)."""
        if self.vocab_size is None:
            return
        # Imported here: it reads the ids with numpy, which a Drafter needs only when told the
        # model's vocabulary and given a file that does not record one.
        from lookupdec.formats import max_token_id

        top = max_token_id(path)
        if top >= self.vocab_size:
            raise VocabularyError(
                f"{path}: the {what} holds token id {top}, not below the vocabulary size {self.vocab_size}: "
                "it was made with another tokenizer and would draft ids the model does not have"
            )

    # --- requests -----------------------------------------------------------------------

    def request(self, prompt: Iterable[int] = ()) -> Request:
        """Start a request whose context so far is ``prompt`` (its n-grams are counted now).

        Use it as a context manager, or call :meth:`Request.end` when the generation is over.
        """
        if self._new_request is not None:
            # The implementation's request has Request's API (lookupdec.fast's is compiled).
            return cast(Request, self._new_request(self._host, prompt))
        return Request(self, prompt)

    @property
    def n_draft(self) -> int:
        """Tokens a proposal holds at most (``propose(k)`` asks for fewer or more); may be changed."""
        return self._host.n_draft

    @n_draft.setter
    def n_draft(self, n: int) -> None:
        n = operator.index(n)
        check_draft_length(n, "n_draft")
        self._host.n_draft = n

    @property
    def stats(self) -> DrafterStats:
        """Counts over every request so far (a snapshot)."""
        t = self._host.tally
        return DrafterStats(t.requests, t.proposals, t.n_drafted, t.n_accept)

    @property
    def open_requests(self) -> int:
        """Requests started and not yet ended.

        A request dropped without :meth:`Request.end` stays counted (its context is never merged
        into the dynamic cache): a count that keeps growing on a server tells of requests its
        code never ends.
        """
        return int(self._host.tally.open)

    @property
    def dynamic(self) -> Cache:
        """The dynamic cache requests draft from (ended requests are merged into it)."""
        return self._host.dynamic

    @property
    def static(self) -> Any:
        """The static cache (an empty cache when none was given)."""
        return self._host.static

    @property
    def policy_state(self) -> Any:
        """The hybrid policy's ``HybridState`` (its ``history``, ``threshold``, ...); None for ``"llama"``."""
        return self._host.hybrid

    @property
    def dynamic_path(self) -> str | None:
        """The file :meth:`save` writes by default (the ``dynamic`` path given, if any)."""
        return self._dynamic_path

    # --- saving -------------------------------------------------------------------------

    def save(self, path: str | os.PathLike[str] | None = None) -> None:
        """Add what ended requests counted since the last save to the dynamic cache file.

        Under an exclusive lock on ``PATH.lock``, the file as it is *now* is read, this
        Drafter's new counts are added, and the result is written atomically in llama.cpp's
        format: processes sharing one file lose nothing. Counts past 2^31-1 saturate, with one
        warning naming the file. ``path`` defaults to the ``dynamic`` path the Drafter was given.
        Requests still open are not included: they count when they end.
        """
        if path is None:
            if self._dynamic_path is None:
                raise ValueError("save() needs a path: this Drafter was not given a dynamic cache file")
            target = self._dynamic_path
        else:
            target = os.fspath(path)
        host = self._host
        # The whole save under the requests' lock: a request ending while the file is written
        # would merge into the counts being written, then be forgotten with them.
        with host.lock:
            added = host.added if host.added is not None else host.dynamic
            written = merge_into_file(target, added, host.cache.load, host.cache)
            host.added = host.cache()
            if self._owns_dynamic and target == self._dynamic_path:
                # Draft from what every process has saved so far, not only from this one's counts.
                host.dynamic = written

    def _check_corpus_file(self, path: str, fingerprint: bytes | None) -> None:
        """The corpus file's header (checked: CacheFormatError) against the vocabulary, if known."""
        from lookupdec.formats.corpus import read_corpus_header

        h = read_corpus_header(path)
        self._check_corpus_vocab(path, h.vocab_size, h.vocab_fingerprint, fingerprint)
        if h.vocab_size == 0:  # records none: its ids are read
            self._check_file_ids(path, "corpus file")

    def _check_corpus_vocab(self, where: str, recorded: int, known: bytes, fingerprint: bytes | None) -> None:
        """A corpus file's recorded vocabulary (``recorded`` ids, fingerprint ``known``) against the
        Drafter's, where known. VocabularyError naming ``where``."""
        if fingerprint is not None:
            check_vocab_fingerprint(where, "corpus file", known, fingerprint)
        if self.vocab_size is not None and recorded > self.vocab_size:
            raise VocabularyError(
                f"{where}: the corpus file was built for a vocabulary of {recorded} ids, "
                f"more than the vocabulary size {self.vocab_size}"
            )

    def __repr__(self) -> str:
        return (
            f"<{self.primitives.name}.Drafter n_draft={self.n_draft} policy={self.policy} open={self._host.tally.open} "
            f"requests={self._host.tally.requests} dynamic={self._dynamic_path or 'memory'}>"
        )


class Request:
    """One generation: its tokens so far and its context cache. Made by :meth:`Drafter.request`."""

    __slots__ = (
        "__weakref__",  # the Drafter's history owner is held weakly (RequestHost.owner)
        "_context",
        "_host",
        "_matched",
        "_observing",
        "_own",
        "_proposal",
        "_rule",
        "_step",
        "_tokens",
        "_tree",
        "n_accept",
        "n_drafted",
    )

    def __init__(self, drafter: Drafter, prompt: Iterable[int] = ()) -> None:
        host = drafter._host
        tokens = [operator.index(t) for t in prompt]
        host.check_ids(tokens, "prompt token")
        self._host = host
        self._tokens = tokens
        self._context: Cache | None = host.cache()
        self._context.update(tokens, len(tokens))
        self._proposal: list[int] = []
        self._rule = 0  # the proposal's first tokens that are llama.cpp's rule's (rule_tokens)
        self._matched = -1  # proposal tokens confirmed so far; -1: no live proposal
        self._observing = False  # the hybrid policy awaits how much of the proposal was accepted
        self._step: Any = None  # the hybrid policy's bookkeeping of that proposal (HybridState.last_step)
        # propose_tree's branches still agreeing with what extend committed (None: a linear
        # proposal); _proposal is then branch 0, the one the hybrid policy observes
        self._tree: list[list[int]] | None = None
        # while this request is not the hybrid history's owner: its own tokens, indexed
        # (HybridState.request_history), so that it matches repeats within itself too
        self._own: Any = None
        self.n_drafted = 0
        """Tokens this request proposed."""
        self.n_accept = 0
        """Proposed tokens this request's ``extend`` calls confirmed."""
        with host.lock:
            host.tally.requests += 1
            host.tally.open += 1
            if host.hybrid is not None and host.owner is None:
                host.claim_history(self)

    @property
    def tokens(self) -> Sequence[int]:
        """The prompt and every committed token (do not modify)."""
        return self._tokens

    @property
    def closed(self) -> bool:
        """True once the request has ended."""
        return self._context is None

    def propose(self, k: int | None = None, stop: Collection[int] = ()) -> list[int]:
        """Up to ``k`` (default: the Drafter's ``n_draft``; at most ``lookupdec.rules.MAX_DRAFT``,
        65,536) tokens likely to follow :attr:`tokens`.

        Drafts nothing before two tokens are known. A proposal is cut before its first token in
        ``stop`` (end-of-sequence ids: the model must not accept past them). The proposal counts
        toward the stats; the next :meth:`extend` calls say how much of it was right.
        """
        with self._host.lock:  # see RequestHost.lock
            context = self._context  # inline checks, not a helper call: propose and extend run every step
            if context is None:
                raise RequestClosedError("propose() on a request that has ended")
            d = self._host
            n = d.n_draft if k is None else operator.index(k)
            if not 0 <= n <= MAX_DRAFT:
                check_draft_length(n, "k")
            tokens = self._tokens
            state = d.hybrid
            observing = False
            if state is not None:
                owner = self._begin_step(d)
                observing = bool(tokens)
            if observing:
                # The history owner's tokens are the history's current request; a request open at
                # the same time matches its own last tokens against the history instead.
                if owner is self:
                    self._own = None
                    proposal: list[int] = state.propose(tokens, n, context, d.dynamic, d.static)
                else:
                    if self._own is None:
                        self._own = state.request_history()
                    proposal = state.propose_detached(tokens, n, context, d.dynamic, d.static, self._own)
                drafted_len = len(proposal)
            elif tokens and n > 0:
                drafted = [tokens[-1]]
                d.draft(tokens, drafted, n, NGRAM_MIN, NGRAM_MAX, context, d.dynamic, d.static)
                proposal = drafted[1:]
            else:
                proposal = []
            if len(stop):  # not truth: a numpy array of ids has none
                for i, t in enumerate(proposal):
                    if t in stop:
                        del proposal[i:]
                        break
            rule = len(proposal)
            if observing:
                if len(proposal) < drafted_len:
                    state.truncate(len(proposal))
                rule = state.last_llama if proposal else 0
                if proposal:
                    self._observing = True
                    self._step = state.last_step()  # other requests may propose before the verdict
                else:
                    state.observe(0)  # nothing to verify: the step is over
            self._proposal = proposal
            self._rule = rule
            self._tree = None
            self._matched = 0
            self.n_drafted += len(proposal)
            tally = d.tally
            tally.proposals += 1
            tally.n_drafted += len(proposal)
            return proposal

    def propose_tree(self, k: int | None = None, branches: int = 3, stop: Collection[int] = ()) -> list[list[int]]:
        """Up to ``branches`` drafts of up to ``k`` tokens, for an engine that verifies a tree (hybrid policy).

        The first branch is exactly what :meth:`propose` would return; the others are
        alternatives (``HybridState.propose_tree``): none empty, none a prefix of another, so
        together they form a tree whose root is :attr:`tokens`' last token. ``[]`` when
        :meth:`propose` would draft nothing. Each branch is cut before its first token in
        ``stop`` (branches left empty or a prefix of another are dropped; all of them when branch
        0 is left empty). The tree's distinct nodes count as drafted; the next :meth:`extend`
        calls confirm along whichever branch matches the committed ids longest and count those
        tokens as accepted. The hybrid policy learns as if only branch 0 had been proposed (its
        common prefix with the accepted tokens), so branch 0 stays the linear policy's draft.
        """
        with self._host.lock:  # see RequestHost.lock
            context = self._context
            if context is None:
                raise RequestClosedError("propose_tree() on a request that has ended")
            d = self._host
            state = d.hybrid
            if state is None:
                raise ValueError("propose_tree() needs a Drafter(policy='hybrid'): llama.cpp's rule drafts one branch")
            n = d.n_draft if k is None else operator.index(k)
            if not 0 <= n <= MAX_DRAFT:
                check_draft_length(n, "k")
            check_branches(operator.index(branches), "hybrid")
            tokens = self._tokens
            owner = self._begin_step(d)
            tree: list[list[int]] = []
            if tokens:
                detached = owner is not self  # as in propose: it matches its own last tokens
                if detached and self._own is None:
                    self._own = state.request_history()
                elif not detached:
                    self._own = None
                tree = state.propose_tree(tokens, n, context, d.dynamic, d.static, branches, detached, self._own)
                drafted_len = len(tree[0]) if tree else 0
                if len(stop):  # not truth: a numpy array of ids has none
                    tree = _cut_tree(tree, stop)
                first = len(tree[0]) if tree else 0
                if first < drafted_len:
                    state.truncate(first)
                if tree:
                    self._observing = True
                    self._step = state.last_step()  # other requests may propose before the verdict
                else:
                    state.observe(0)  # nothing to verify: the step is over
            self._proposal = tree[0] if tree else []
            self._rule = state.last_llama if tree else 0
            self._tree = tree if tree else None  # nothing drafted: extend treats it as an empty proposal
            self._matched = 0
            nodes = tree_nodes(tree)
            self.n_drafted += nodes
            tally = d.tally
            tally.proposals += 1
            tally.n_drafted += nodes
            return [list(b) for b in tree]  # copies: the request keeps its own

    @property
    def rule_tokens(self) -> int:
        """How many of the last proposal's first tokens llama.cpp's rule drafted.

        All of them with the llama policy. With the hybrid policy, the tokens of llama.cpp's
        draft it kept (0 when the proposal is its suffix match alone); the rest continue them
        from the suffix match. An engine adapter that learns acceptance apart by source reads it
        (:class:`lookupdec.adapters.DraftLength`).
        """
        return self._rule

    def trim(self, n: int) -> None:
        """Send only the first ``n`` tokens of the last proposal to the model (call it before :meth:`extend`).

        The tokens cut count as never proposed: not as drafted, and the hybrid policy does not
        learn from them. For an engine that decides how much of a draft to verify after seeing
        it (:class:`lookupdec.adapters.DraftLength` does). A tree proposal cannot be trimmed.
        """
        with self._host.lock:  # see RequestHost.lock
            if self._context is None:
                raise RequestClosedError("trim() on a request that has ended")
            n = operator.index(n)
            if n < 0:
                raise ValueError(f"n must be >= 0, got {n}")
            if self._tree is not None:
                raise ValueError("trim() cuts a linear proposal: a propose_tree() proposal cannot be trimmed")
            if self._matched != 0:
                raise ValueError("trim() must come after propose() and before extend() confirms any of the proposal")
            cut = len(self._proposal) - n
            if cut <= 0:
                return
            self._proposal = self._proposal[:n]  # a new list: the caller's copy of the proposal stays as it was
            self._rule = min(self._rule, n)
            self.n_drafted -= cut
            d = self._host
            d.tally.n_drafted -= cut
            state = d.hybrid
            if state is not None and self._observing:
                state.resume_step(self._step)  # other requests may have proposed since
                state.truncate(n)
                if n:
                    self._step = state.last_step()
                else:
                    state.observe(0)  # nothing to verify: the step is over
                    self._observing = False
                    self._step = None

    def extend(self, ids: Iterable[int]) -> None:
        """Commit ``ids``: the accepted part of the last proposal and the model's own token(s).

        Counting them equals llama.cpp's one ``common_ngram_cache_update(..., nnew=1)`` per
        token. The proposal's tokens that ``ids`` confirm, in order from its first, count as
        accepted; the first mismatch ends the proposal.
        """
        with self._host.lock:  # see RequestHost.lock
            context = self._context
            if context is None:
                raise RequestClosedError("extend() on a request that has ended")
            new = list(ids)
            if not new:
                return
            d = self._host
            limit = d.id_limit
            # A plain loop: for the usual 1-9 plain ints it costs a fraction of a list comprehension.
            for t in new:
                if type(t) is not int or t < 0 or t >= limit:
                    # numpy integers become ints; floats raise TypeError (the reference would take them)
                    new = [operator.index(x) for x in new]
                    d.check_ids(new, "token")
                    break
            matched = self._matched
            if matched >= 0 and self._tree is not None:
                self._extend_tree(new)
            elif matched >= 0:
                proposal = self._proposal
                accepted = 0
                confirmed = matched
                for t in new:
                    if matched + accepted >= len(proposal) or proposal[matched + accepted] != t:
                        matched = -1
                        break
                    accepted += 1
                else:
                    matched += accepted
                self._matched = matched
                self.n_accept += accepted
                d.tally.n_accept += accepted
                if self._observing and (matched < 0 or matched == len(proposal)):
                    self._observe(confirmed + accepted)  # the verdict: how much of it was accepted
            tokens = self._tokens
            tokens.extend(new)
            # One update over the new tokens counts exactly what one nnew=1 update per token counts.
            context.update(tokens, len(new))

    def end(self) -> None:
        """Merge this request's context cache into the dynamic cache (once; later calls do nothing)."""
        with self._host.lock:  # see RequestHost.lock
            context = self._context
            if context is None:
                return
            d = self._host
            if d.hybrid is not None:
                if self._observing:
                    self._observe(self._observed_prefix())
                d.history_end(self)
            self._context = None
            self._own = None
            self._proposal = []
            self._matched = -1
            d.end(context)

    def _begin_step(self, d: RequestHost) -> Request:
        """A hybrid proposal's start (under the lock): the last proposal's verdict if it never
        came (what extend confirmed of it), and the history owner, this request if none is."""
        if self._observing:
            self._observe(self._observed_prefix())
        owner = d.owner
        if owner is None:
            d.claim_history(self)
            owner = self
        return owner

    def _extend_tree(self, new: list[int]) -> None:
        """:meth:`extend`'s confirmation for a tree proposal: along the branches that match longest."""
        tree = self._tree
        assert tree is not None
        matched = self._matched
        accepted = 0
        for b in tree:
            a = common_prefix(b[matched:], new)
            if a > accepted:
                accepted = a
        # Live on: the branches that confirmed every new id and go on past them.
        live = [b for b in tree if len(b) > matched + len(new) and common_prefix(b[matched:], new) == len(new)]
        if accepted == len(new) and live:
            self._matched = matched + accepted
            self._tree = live
        else:
            self._matched = -1
            self._tree = [max(tree, key=lambda b: common_prefix(b[matched:], new))[: matched + accepted]]
        self.n_accept += accepted
        self._host.tally.n_accept += accepted
        if self._observing and self._matched < 0:
            self._observe(self._observed_prefix())  # the verdict: branch 0's share of the accepted tokens

    def _observed_prefix(self) -> int:
        """How many of the tokens confirmed so far branch 0 (the proposal the policy observes) shares."""
        tree = self._tree
        if tree is None:
            return self._matched
        if self._matched >= 0:  # live: the live branches' first _matched tokens are the confirmed ones
            return common_prefix(self._proposal, tree[0][: self._matched])
        return common_prefix(self._proposal, tree[0])  # ended: tree[0] is the accepted path

    def _observe(self, n_accepted: int) -> None:
        """Tell the hybrid policy that ``n_accepted`` tokens of this request's proposal were accepted."""
        state = self._host.hybrid
        state.resume_step(self._step)
        state.observe(n_accepted)
        self._observing = False
        self._step = None

    def __enter__(self) -> Request:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.end()

    def __repr__(self) -> str:
        state = "ended" if self._context is None else "open"
        return f"<Request {state} tokens={len(self._tokens)} drafted={self.n_drafted} accepted={self.n_accept}>"


def _cut_tree(tree: list[list[int]], stop: Collection[int]) -> list[list[int]]:
    """``tree``'s branches cut before their first token in ``stop``, dropping those left empty or
    a prefix of (or prefixed by) one kept before; nothing when branch 0 is left empty."""
    kept: list[list[int]] = []
    for b in tree:
        cut = next((i for i, t in enumerate(b) if t in stop), len(b))
        b = b[:cut]
        if not kept and not b:
            return []
        if b and all(common_prefix(b, o) < min(len(b), len(o)) for o in kept):
            kept.append(b)
    return kept
