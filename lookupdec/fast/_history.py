"""The hybrid policy's token history, compiled (the reference's :mod:`lookupdec.reference.history`).

Compiled by mypyc (``HOT_MODULES`` in ``setup.py``); it also runs as plain Python.

Layout of :class:`SuffixHistory`:

- ``toks``: the token stream of every request seen, each request preceded by a separator
  (:data:`SEP`); positions are indices into it;
- a position ``p >= 2`` is *indexed* when ``toks[p-2]``, ``toks[p-1]``, ``toks[p]`` are real
  tokens: it is then a candidate continuation for the bigram ``(toks[p-2], toks[p-1])``;
- ``bkey``/``bhead``: the bigrams seen, found through the open-addressing table ``bslots``,
  each with its most recent indexed position; ``prev[p]`` links to the previous indexed
  position of the same bigram (-1 at the end), so candidates are walked newest first;
- ``ukey``/``uring``/``uhead``: per single token ``t``, its :data:`UNIGRAM_CANDIDATES` most
  recent indexed positions ``p`` with ``toks[p-1] == t``, in a circular buffer (``uhead``: where
  the next one goes; -1 where there were fewer): the one-token fallback reads them newest
  first, one run of memory, where following a link from each occurrence to the one before made
  every load (a cache miss in a long stream) wait for the previous one;
- ``tslots``: the trigrams seen, an open-addressing table holding each one's most recent
  indexed position ``p`` (``toks[p-3..p-1]`` is the trigram, so the table stores no keys);
  ``tprev[p]`` links to the previous position of the same trigram (-1 at the end): the deep
  search for matches older than a common bigram's newest occurrences.

When the stream would exceed ``max_tokens``, the older half is dropped and the index rebuilt
over what is left (amortised O(1) per token; memory: 12 bytes per kept token, the token and
its two links, plus the tables, of which the one-token rings take 256 bytes per distinct token).

"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Final, cast

from librt.strings import read_i32_le
from librt.vecs import append, vec
from mypy_extensions import i32, i64

from lookupdec.fast._cache import to_vec
from lookupdec.fast._corpus import HEADER_SIZE as CORPUS_IDS
from lookupdec.fast._corpus import CorpusIndex
from lookupdec.fast._tables import (
    NULL32,
    filled_i32,
    key_hash,
    pack,
    token_probe,
    token_slots,
    word_probe,
    word_slots,
    zeros_i64,
)

MATCH_SLACK: Final[i64] = 1
"""Occurrences whose match is at most this much shorter than the longest are followed too (they vote)."""
SEP: Final[i32] = -1
"""Separator written before every request in the history stream (never matched)."""
CORPUS_BASE: Final[i64] = 1 << 40
"""Candidate positions at or above this are the corpus's (its id positions plus this)."""
OWN_BASE: Final[i64] = 1 << 42
"""Candidate positions at or above this are a detached request's own (its request history's
positions plus this; see :meth:`lookupdec.fast._hybrid.HybridState.propose_detached`)."""
OWN_MAX_TOKENS: Final = 1 << 30
"""Bound of a request history: one request's tokens, never evicted."""
DEFAULT_MAX_TOKENS: Final = 1 << 22
"""Default bound of a :class:`SuffixHistory`: 4,194,304 tokens (48 MB for them and their links, plus the tables)."""
MAX_CANDIDATES: Final[i64] = 32
"""How many earlier occurrences of the last bigram are compared, newest first."""
UNIGRAM_CANDIDATES: Final[i64] = 64
"""If the last bigram never occurred: how many of the last token's occurrences vote, newest first
(a power of two: the size of each token's ring, see :class:`SuffixHistory`)."""
DEEP_CANDIDATES: Final[i64] = 32
"""When the last bigram has at least ``max_candidates`` occurrences: how many older occurrences of
the last trigram are compared too (a common bigram's newest occurrences rarely hold the longest match)."""
MAX_MATCH: Final[i64] = 64
"""Matches are measured up to this many tokens (longer ones count as this long): why 64, in
:data:`lookupdec.reference.history.MAX_MATCH`."""


def candidates_cap(max_candidates: i64) -> i64:
    """The most candidates one search finds: a bigram's and the deep search's, or the one-token fallback's."""
    cap = max_candidates + DEEP_CANDIDATES
    if cap < UNIGRAM_CANDIDATES:
        cap = UNIGRAM_CANDIDATES
    return cap


INITIAL_SLOTS: Final[i64] = 1 << 10
"""Slots of each of the history's tables when it starts or restarts after an eviction."""


def match_back(toks: vec[i32], qv: vec[i32], p: i64, length: i64) -> i64:
    """How far the requests' occurrence continuing at ``p`` (in the stream ``toks``) agrees with
    the query (``qv``, from :meth:`SuffixHistory._fill_query`) backwards: from ``length`` known
    equal tokens, at most :data:`MAX_MATCH`, never across a separator (``qv`` ends with one).
    A function, not a method, so the callers' loops pass the vecs they hold (see ``_collect``)."""
    while length < MAX_MATCH:
        at = p - 1 - length
        if at < 0:
            break
        t = toks[at]
        if t == SEP or t != qv[length]:
            break
        length += 1
    return length


class SuffixHistory:
    """The token history the hybrid policy matches against: earlier requests and the current one.

    Bounded: holds at most ``max_tokens`` tokens; when full, the older half is evicted.
    Share one history between the requests of a drafter (it is the policy's dynamic memory).
    """

    toks: vec[i32]
    prev: vec[i32]
    bkey: vec[i64]
    bhead: vec[i32]
    bslots: vec[i32]
    bmask: i64
    ukey: vec[i32]
    uring: vec[i32]
    uhead: vec[i32]
    uslots: vec[i32]
    umask: i64
    tslots: vec[i32]
    tmask: i64
    n_tri: i64
    tprev: vec[i32]
    max_tokens: i64
    n_evictions: i64
    req_start: i64
    cand_p: vec[i64]
    act: vec[i64]
    act_w: vec[i64]
    last_best: i64
    cand_len: vec[i64]
    n_cand: i64
    vote_k: vec[i64]
    vote_s: vec[i64]
    vote_mask: i64
    vote_stamp: i64
    vote_g: vec[i64]
    vote_c: vec[i64]
    vote_n: i64
    next_t: vec[i32]
    qv: vec[i32]
    corpus: CorpusIndex | None
    touched: i32
    own: SuffixHistory | None

    def __init__(self, max_tokens: int = DEFAULT_MAX_TOKENS) -> None:
        if max_tokens < 16:
            raise ValueError(f"max_tokens must be >= 16, got {max_tokens}")
        self.max_tokens = max_tokens
        self.n_evictions = 0
        self.req_start = 0  # where the latest request starts (after its separator)
        self.cand_p = vec[i64]()
        self.act = vec[i64]()
        self.act_w = vec[i64]()  # the vote weight of each of act's candidates (HybridState._follow)
        self.last_best = 0
        self.cand_len = vec[i64]()
        self.n_cand = 0
        self.vote_k = vec[i64]()
        self.vote_s = vec[i64]()
        self.vote_mask = 0
        self.vote_stamp = 0
        self.vote_g = vec[i64]()  # the vote table's slots taken in the last round, in order (vote_n)
        self.vote_c = vec[i64]()  # and the static index's count of each one's token (HybridState._static_vote)
        self.vote_n = 0
        self.next_t = vec[i32]()
        self.qv = filled_i32(MAX_MATCH + 1, SEP)
        self.corpus = None
        self.touched = 0
        self.own = None  # a detached proposal's request history, while it is made (positions from OWN_BASE)
        self._reset()

    def _reset(self) -> None:
        self.toks = vec[i32]()
        self.prev = vec[i32]()
        self.bkey = vec[i64]()
        self.bhead = vec[i32]()
        self.bslots = filled_i32(INITIAL_SLOTS, NULL32)
        self.bmask = INITIAL_SLOTS - 1
        self.ukey = vec[i32]()
        self.uring = vec[i32]()
        self.uhead = vec[i32]()
        self.uslots = filled_i32(INITIAL_SLOTS, NULL32)
        self.umask = INITIAL_SLOTS - 1
        self.tslots = filled_i32(INITIAL_SLOTS, NULL32)
        self.tmask = INITIAL_SLOTS - 1
        self.n_tri = 0
        self.tprev = vec[i32]()

    def corpus_tokens(self) -> int:
        """Number of the corpus's ids (separators between its documents included; 0 without a corpus)."""
        c = self.corpus
        return 0 if c is None else int(c.n_tokens)

    def __len__(self) -> int:
        """Number of tokens (and separators) held: the corpus's (and a separator before it), then the requests'."""
        return len(self.toks) + (0 if self.corpus is None else self.corpus_tokens() + 1)

    def tokens(self) -> list[int]:
        """The stream held, separators as -1 (for tests and inspection): with a corpus, -1 and the
        corpus's ids first (it is the oldest part), then the requests' stream."""
        c = self.corpus
        head = [] if c is None else [-1, *c.tokens()]
        return head + [int(t) for t in self.toks]

    def _next_tokens(self, act: vec[i64], n_act: i64, k: i64, nx: vec[i32]) -> None:
        """``nx[i]``: the token at candidate position ``act[i] + k`` (a stream or corpus position; -1
        past either's end) for the ``n_act`` candidates: one pass, read in line
        (``_follow`` needs each candidate's token three times per drafted token; a method call per
        read was its largest cost)."""
        toks = self.toks
        n_toks = i64(len(toks))
        c = self.corpus
        buf = b""
        n_ids: i64 = 0
        if c is not None:
            buf = c._buf
            n_ids = c.n_tokens
        own_toks = vec[i32]()
        o = self.own
        if o is not None:
            own_toks = o.toks
        n_own = i64(len(own_toks))
        for i in range(n_act):
            p = act[i] + k
            t = SEP
            if p < CORPUS_BASE:
                if p < n_toks:
                    t = toks[p]
            elif p >= OWN_BASE:
                if p - OWN_BASE < n_own:
                    t = own_toks[p - OWN_BASE]
            elif c is not None and p - CORPUS_BASE < n_ids:
                t = read_i32_le(buf, CORPUS_IDS + 4 * (p - CORPUS_BASE))
                if t < SEP:
                    raise c._corrupt(f"token id {t} < -1", CORPUS_IDS + 4 * (p - CORPUS_BASE))
            nx[i] = t

    # --- bigram table ---------------------------------------------------------------

    def _bfind(self, w: i64) -> i64:
        """Ordinal of bigram ``w`` (packed), -1 if never indexed."""
        s = word_probe(self.bslots, self.bkey, self.bmask, w)
        if s < 0:
            return -1
        return s

    def _bintern(self, w: i64) -> i64:
        """Ordinal of bigram ``w`` (packed), numbered now if new."""
        mask = self.bmask
        s = word_probe(self.bslots, self.bkey, mask, w)
        if s >= 0:
            return s
        kid = i64(len(self.bkey))
        self.bslots[-1 - s] = i32(kid)
        self.bkey = append(self.bkey, w)
        self.bhead = append(self.bhead, NULL32)
        if 2 * (kid + 1) > mask + 1:
            self.bslots = word_slots(self.bkey, 2 * (mask + 1))
            self.bmask = 2 * mask + 1
        return kid

    # --- unigram table --------------------------------------------------------------

    def _ufind(self, t: i32) -> i64:
        """Ordinal of token ``t`` in the unigram table, -1 if it was never indexed."""
        s = token_probe(self.uslots, self.ukey, self.umask, t)
        if s < 0:
            return -1
        return s

    def _uset(self, t: i32, p: i64) -> None:
        """Make ``p`` the newest position after token ``t`` (in its ring, over the oldest)."""
        mask = self.umask
        s = token_probe(self.uslots, self.ukey, mask, t)
        if s >= 0:
            g = i64(self.uhead[s])
            self.uring[UNIGRAM_CANDIDATES * s + g] = i32(p)
            self.uhead[s] = i32((g + 1) & (UNIGRAM_CANDIDATES - 1))
            return
        kid = i64(len(self.ukey))
        self.uslots[-1 - s] = i32(kid)
        self.ukey = append(self.ukey, t)
        self.uring = append(self.uring, i32(p))
        for _j in range(UNIGRAM_CANDIDATES - 1):  # ``_j``, not ``_``: see _tables.filled_i32
            self.uring = append(self.uring, NULL32)
        self.uhead = append(self.uhead, 1)
        if 2 * (kid + 1) > mask + 1:
            self.uslots = token_slots(self.ukey, 2 * (mask + 1))
            self.umask = 2 * mask + 1

    # --- trigram table --------------------------------------------------------------

    def _tslot(self, a: i32, b: i32, c: i32) -> i64:
        """Slot of the trigram (a, b, c): where its newest position is, or the free slot for it."""
        slots = self.tslots
        toks = self.toks
        mask = self.tmask
        h = key_hash(pack(a, b), pack(c, c)) & mask
        while True:
            s = i64(slots[h])
            if s < 0 or (toks[s - 3] == a and toks[s - 2] == b and toks[s - 1] == c):
                return h
            h = (h + 1) & mask

    def _tset(self, p: i64) -> i32:
        """Make ``p`` the newest position of the trigram before it; returns the previous one (-1: none)."""
        toks = self.toks
        h = self._tslot(toks[p - 3], toks[p - 2], toks[p - 1])
        old = self.tslots[h]
        self.tslots[h] = i32(p)
        if old < 0:
            self.n_tri += 1
            if 2 * self.n_tri > self.tmask + 1:
                self._tgrow()
        return old

    def _tgrow(self) -> None:
        old = self.tslots
        self.tslots = filled_i32(2 * (self.tmask + 1), NULL32)
        self.tmask = 2 * (self.tmask + 1) - 1
        toks = self.toks
        for j in range(len(old)):
            s = i64(old[j])
            if s >= 0:
                self.tslots[self._tslot(toks[s - 3], toks[s - 2], toks[s - 1])] = i32(s)

    # --- appending ------------------------------------------------------------------

    def _index_last(self) -> None:
        """Index the position just appended (its ``prev`` link is appended here too)."""
        toks = self.toks
        p = i64(len(toks)) - 1
        link = NULL32
        tlink = NULL32
        if p >= 2:
            a = toks[p - 2]
            b = toks[p - 1]
            c = toks[p]
            if a != SEP and b != SEP and c != SEP:
                kid = self._bintern(pack(a, b))
                link = self.bhead[kid]
                self.bhead[kid] = i32(p)
                if p >= 3 and toks[p - 3] != SEP:
                    tlink = self._tset(p)
            if b != SEP and c != SEP:
                self._uset(b, p)
        self.prev = append(self.prev, link)
        self.tprev = append(self.tprev, tlink)

    def push(self, token: i32) -> None:
        """Append one token (or :data:`SEP`), evicting the older half first when full."""
        if i64(len(self.toks)) >= self.max_tokens:
            self._evict()
        self.toks = append(self.toks, token)
        self._index_last()

    def _evict(self) -> None:
        """Drop the older half of the stream and rebuild the index over the rest."""
        old = self.toks
        keep = self.max_tokens // 2
        start = i64(len(old)) - keep
        self._reset()  # the corpus stays: it is held apart
        self.n_evictions += 1
        # an if statement, not a conditional expression (mypyc boxes those on native ints)
        if self.req_start > start:
            self.req_start -= start
        else:
            self.req_start = 0
        for j in range(start, len(old)):
            self.toks = append(self.toks, old[j])
            self._index_last()

    def add_separator(self) -> None:
        """Start a new request: matches never cross this point."""
        self.push(SEP)
        self.req_start = i64(len(self.toks))

    def add_corpus(self, corpus: object) -> None:
        """Add a corpus: a :class:`~lookupdec.fast._corpus.CorpusIndex`, the path of a corpus
        file (opened memory-mapped) or token ids (built in memory, -1 between documents).

        Its occurrences are older than every request's (compared after theirs, newest first),
        it is never evicted (``max_tokens`` bounds the requests' tokens) and matches never cross
        its ends (nor a -1 in it): on an empty history the same drafts as :meth:`add_separator`
        then :meth:`extend` with the ids, as long as every request starts with a separator
        (:meth:`HybridState.begin_request`) and nothing is evicted. A history holds one corpus.
        """
        if self.corpus is not None:
            raise ValueError("this history already holds a corpus")
        if isinstance(corpus, CorpusIndex):
            self.corpus = corpus
        elif isinstance(corpus, (str, os.PathLike)):
            self.corpus = CorpusIndex.open(corpus)
        elif isinstance(corpus, Sequence) or hasattr(corpus, "__array__"):  # a numpy array too, as extend()
            self.corpus = CorpusIndex.from_tokens(cast(Sequence[int], corpus))
        else:
            raise TypeError(f"corpus must be a CorpusIndex, a path or token ids, not {type(corpus).__name__}")

    def extend(self, tokens: Sequence[int]) -> None:
        """Append tokens of the current request (int32 ids)."""
        v = to_vec(tokens)
        for j in range(len(v)):
            self.push(v[j])

    # --- matching -------------------------------------------------------------------

    def token_at(self, p: int) -> int:
        """The token at position ``p`` of the stream or (from :data:`CORPUS_BASE`) the corpus; -1 past the end."""
        nx = filled_i32(1, SEP)
        self._next_tokens(vec[i64]([p]), 1, 0, nx)
        return int(nx[0])

    def query_token(self, drafted: Sequence[int], j: int, request: Sequence[int] | None = None) -> int:
        """The query's token ``j`` places before its end (:data:`SEP` before its start); see :meth:`candidates`."""
        if j < len(drafted):
            return int(drafted[len(drafted) - 1 - j])
        if request is not None:
            i = len(request) - 1 - (j - len(drafted))
            return int(request[i]) if i >= 0 else int(SEP)
        p = len(self.toks) - 1 - (j - len(drafted))
        return int(self.toks[p]) if p >= 0 else int(SEP)

    def candidates(
        self, drafted: Sequence[int], max_candidates: int = MAX_CANDIDATES, request: Sequence[int] | None = None
    ) -> list[tuple[int, int]]:
        """Earlier occurrences of the query's suffix as (position, match length), newest first.

        The query is the stream followed by ``drafted``, or with ``request`` (a request not in
        the stream) a separator, ``request`` and ``drafted``; the reference's
        :meth:`lookupdec.reference.history.SuffixHistory.candidates` says which occurrences.
        Drafting reads them natively; this list is for inspection and tests.
        """
        q = to_vec([*([int(SEP), *request] if request is not None else []), *drafted])
        self._collect(q, max_candidates)
        return [(int(self.cand_p[i]), int(self.cand_len[i])) for i in range(self.n_cand)]

    def _query_at(self, q: vec[i32], j: i64) -> i32:
        """Query token at distance ``j`` from its end: ``q`` holds the drafted tail, then the stream."""
        nq = i64(len(q))
        if j < nq:
            return q[nq - 1 - j]
        p = i64(len(self.toks)) - 1 - (j - nq)
        if p < 0:
            return SEP
        return self.toks[p]

    def _fill_query(self, q: vec[i32]) -> i64:
        """Copy the query's last tokens, newest first, into ``qv`` up to its first separator (kept
        as the end mark) or :data:`MAX_MATCH` tokens; returns how many are tokens."""
        qv = self.qv
        toks = self.toks
        nq = i64(len(q))
        j: i64 = 0
        m = MAX_MATCH
        if nq < m:
            m = nq
        while j < m:  # the drafted tail, then the stream: two loops, no branch per token on which
            t = q[nq - 1 - j]
            qv[j] = t
            if t == SEP:
                return j
            j += 1
        p = i64(len(toks)) - 1
        while j < MAX_MATCH:
            t = SEP
            if p >= 0:
                t = toks[p]
                p -= 1
            qv[j] = t
            if t == SEP:
                return j
            j += 1
        return j

    def _collect(self, q: vec[i32], max_candidates: i64) -> i64:
        """Find earlier occurrences of the query's suffix; returns the longest match length (0: none).

        The query is the stream followed by ``q`` (the tokens drafted so far). Fills
        ``cand_p``/``cand_len`` with up to ``max_candidates`` occurrences of its last bigram,
        newest first (the requests', then the corpus's, which join only where the requests have
        the bigram or never had its last token), and their match lengths; when there
        were that many, then up to :data:`DEEP_CANDIDATES` older occurrences of its last
        trigram (newest first). If the bigram never occurred, up to :data:`UNIGRAM_CANDIDATES`
        occurrences of the last token alone, newest first (length 1).
        """
        self.n_cand = 0
        self._reserve(candidates_cap(max_candidates))
        qn = self._fill_query(q)
        if qn == 0:
            return 0
        qv = self.qv
        b = qv[0]
        c = self.corpus
        if qn >= 2:
            a = qv[1]
            found = False
            best_len: i64 = 0
            n: i64 = 0
            n_hist: i64 = 0  # how many candidates are the requests'
            taken: i64 = 0  # how many of the corpus run's entries are candidates
            off: i64 = -1
            kid = self._bfind(pack(a, b))
            if kid >= 0:
                found = True
                # vecs read from attributes once: each attribute read of a vec in the loop is a
                # reference count taken and dropped (mypyc), and the buffers are the same.
                cand_p = self.cand_p
                cand_len = self.cand_len
                prev = self.prev
                toks = self.toks
                p = i64(self.bhead[kid])
                while p >= 0 and n < max_candidates:
                    length = match_back(toks, qv, p, 2)
                    cand_p[n] = p
                    cand_len[n] = length
                    n += 1
                    if length > best_len:
                        best_len = length
                    p = i64(prev[p])
                n_hist = n
            # The corpus's occurrences of the bigram join only where the requests have it too, or
            # have never had its last token: where they know the token but not the bigram, their
            # own occurrences of the token (the fallback below) predict better than a corpus that
            # may be another kind of text (the same rule as the reference's candidates()).
            if c is not None and (n_hist > 0 or self._ufind(b) < 0):
                off = c._find(a, b)
                if off >= 0:
                    found = True
                    if n < max_candidates:
                        n, best_len = self._collect_corpus(c, off, n, best_len, max_candidates)
                        taken = n - n_hist
            if found:
                t3 = qv[2]  # SEP when the query has two tokens (qv's end mark)
                if n >= max_candidates and t3 != SEP:
                    n, best_len = self._collect_deep(kid, off, n_hist, taken, n, best_len, t3, a, b)
                self.n_cand = n
                return best_len
        n = 0
        u = self._ufind(b)
        if u >= 0:
            ring = self.uring
            r0 = UNIGRAM_CANDIDATES * u
            g = i64(self.uhead[u])
            cand_p = self.cand_p
            cand_len = self.cand_len
            while n < UNIGRAM_CANDIDATES:
                g = (g - 1) & (UNIGRAM_CANDIDATES - 1)
                p = i64(ring[r0 + g])
                if p < 0:
                    break
                cand_p[n] = p
                cand_len[n] = 1
                n += 1
        if c is not None and n < UNIGRAM_CANDIDATES:
            n = self._collect_corpus_after(c, b, n)
        if n == 0:
            return 0
        self.n_cand = n
        return 1

    def _reserve(self, cap: i64) -> None:
        """Room for ``cap`` candidates (and a vote table of at least twice that).

        What the arrays held is lost when they grow."""
        if i64(len(self.cand_p)) < cap:
            self.cand_p = zeros_i64(cap)
            self.act = zeros_i64(cap)
            self.act_w = zeros_i64(cap)
            self.cand_len = zeros_i64(cap)
            self.next_t = filled_i32(cap, SEP)
            size: i64 = 1
            while size < 2 * cap:
                size *= 2
            self.vote_k = zeros_i64(size)
            self.vote_s = zeros_i64(size)
            self.vote_mask = size - 1
            self.vote_stamp = 0
            self.vote_g = zeros_i64(cap)
            self.vote_c = zeros_i64(cap)

    def _collect_detached(self, own: SuffixHistory, q: vec[i32], n_before: i64, max_candidates: i64) -> i64:
        """:meth:`_collect` for a detached request, whose tokens ``own`` holds: ``q`` is ``n_before``
        of its last tokens (after a separator when it is shorter), then the tokens drafted so far.

        The candidates are its own occurrences (positions from :data:`OWN_BASE`, the newest), then
        the history's, each newest first; where one side matched two tokens or more and the other
        only the last token, the one-token matches are dropped (the reference's
        ``merge_candidates``). Returns the longest match length.
        """
        self._reserve(2 * candidates_cap(max_candidates))  # before collecting: growing loses the candidates
        best_t = self._collect(q, max_candidates)
        n_t = self.n_cand
        q_own = vec[i32](capacity=i64(len(q)) - n_before)
        for j in range(n_before, len(q)):
            q_own = append(q_own, q[j])
        best_m = own._collect(q_own, max_candidates)
        n_m = own.n_cand
        if n_m == 0 or (best_t >= 2 and best_m < 2):
            return best_t
        keep_t = n_t
        if best_m >= 2 and best_t < 2:
            keep_t = 0
        cand_p = self.cand_p  # read once: see _collect
        cand_len = self.cand_len
        j = keep_t - 1
        while j >= 0:  # the history's candidates move after the request's own
            cand_p[n_m + j] = cand_p[j]
            cand_len[n_m + j] = cand_len[j]
            j -= 1
        own_p = own.cand_p
        own_len = own.cand_len
        for i in range(n_m):
            cand_p[i] = OWN_BASE + own_p[i]
            cand_len[i] = own_len[i]
        self.n_cand = n_m + keep_t
        if keep_t > 0 and best_t > best_m:
            return best_t
        return best_m

    def _collect_deep(
        self, kid: i64, off: i64, n_hist: i64, taken: i64, n: i64, best_len: i64, t3: i32, a: i32, b: i32
    ) -> tuple[i64, i64]:
        """Add up to :data:`DEEP_CANDIDATES` occurrences of the trigram ``(t3, a, b)`` older than the
        last bigram candidate (``n_hist`` of the ``n`` candidates are the requests', then ``taken``
        entries of the corpus run at slot ``off``); (n, longest match so far).

        The bigram is common: its newest occurrences were not all of them, and older ones may match
        longer. While the candidates are all the requests', the trigram's occurrences newer than the
        last one are the candidates matching 3+ tokens, so the oldest of those links to the first one
        to take (none: the trigram's newest occurrence is older than all the candidates); after the
        requests' come all of the corpus's. Once the corpus run was reached, the requests' trigram
        occurrences are all newer: only the run's entries after those taken count.
        """
        m: i64 = 0
        cand_p = self.cand_p  # read once: see _collect
        cand_len = self.cand_len
        if taken == 0 and kid >= 0:
            tprev = self.tprev
            toks = self.toks
            qv = self.qv
            p: i64 = -2
            for j in range(n_hist):
                if cand_len[j] >= 3:
                    p = i64(tprev[cand_p[j]])
            if p == -2:
                p = i64(self.tslots[self._tslot(t3, a, b)])
            while p >= 0 and m < DEEP_CANDIDATES:
                length = match_back(toks, qv, p, 3)
                cand_p[n] = p
                cand_len[n] = length
                n += 1
                m += 1
                if length > best_len:
                    best_len = length
                p = i64(tprev[p])
        c = self.corpus
        if c is None or off < 0 or m >= DEEP_CANDIDATES:
            return n, best_len
        # The corpus's trigram occurrences are the entries of the bigram's run (newest first) whose
        # token before is t3, after the first `taken`.
        start, count = c._run(off)
        if taken >= count:
            return n, best_len
        buf = c._buf
        n_tokens = c.n_tokens
        end = start + count
        scan = c._o_trigrams < 0
        if scan:
            # A version 2 file has no per-trigram runs: the run is scanned.
            g = start + taken
            e = c._o_entries + 8 * g
        else:
            # Version 3: they are a range of the bigram's run in the trigram section (by token
            # before, then newest first), from the first one older than the last entry taken.
            g = c._trigram_first(start, count, taken, t3)
            e = c._o_trigrams + 8 * g
        while g < end and m < DEEP_CANDIDATES:
            if read_i32_le(buf, e + 4) == t3:
                pos = i64(read_i32_le(buf, e))
                if pos < 3 or pos >= n_tokens:
                    raise c._bad_deep(g)
                length = self._corpus_match_back(buf, pos)
                cand_p[n] = CORPUS_BASE + pos
                cand_len[n] = length
                n += 1
                m += 1
                if length > best_len:
                    best_len = length
            elif not scan:
                break  # the trigram's range ended
            g += 1
            e += 8
        return n, best_len

    def _collect_corpus_after(self, c: CorpusIndex, t: i32, n: i64) -> i64:
        """Add the corpus's positions ``i`` with ``ids[i-1] == t`` (and ``ids[i]`` a token), newest
        first (the file's run of ``t``), to the ``n`` candidates, up to :data:`UNIGRAM_CANDIDATES`
        in all; returns their number."""
        start, count = c._after_run(t)
        take = UNIGRAM_CANDIDATES - n
        if count < take:
            take = count
        cand_p = self.cand_p  # read once: see _collect
        cand_len = self.cand_len
        for g in range(take):
            cand_p[n] = CORPUS_BASE + c._after_pos(start + g)
            cand_len[n] = 1
            n += 1
        return n

    def _collect_corpus(self, c: CorpusIndex, off: i64, n: i64, best_len: i64, max_candidates: i64) -> tuple[i64, i64]:
        """Add the corpus's occurrences of the bigram at slot ``off`` to the candidates after the
        ``n`` there (newest first, up to ``max_candidates`` in all); (n, longest match so far).

        An entry holds its position and the token before its bigram: a candidate whose match
        ends there (most do) is measured without reading the ids, whose cache line would be a
        miss for nearly every occurrence of a bigram in a large corpus.
        """
        start, count = c._run(off)
        take = max_candidates - n
        if count < take:
            take = count
        buf = c._buf
        n_tokens = c.n_tokens
        qv = self.qv
        q2 = qv[2]
        e0 = c._o_entries + 8 * start
        touched: i32 = 0
        # The ids before the entries that match 3 tokens, read ahead in a pass that branches on
        # none of them (so their loads, cache misses in a large corpus, overlap): measuring those
        # matches below then finds them in the cache, where it waited for each miss in turn.
        e = e0
        if q2 != SEP:
            for _g in range(take):  # ``_g``, not ``_``: see _tables.filled_i32
                pos = i64(read_i32_le(buf, e))
                if read_i32_le(buf, e + 4) == q2 and 4 <= pos < n_tokens:
                    touched ^= read_i32_le(buf, CORPUS_IDS + 4 * (pos - 4))
                e += 8
        e = e0
        n0 = n
        cand_p = self.cand_p  # read once: see _collect
        cand_len = self.cand_len
        for g in range(take):
            pos = i64(read_i32_le(buf, e))
            pre = read_i32_le(buf, e + 4)
            e += 8
            if pos < 2 or pos >= n_tokens:
                raise c._bad_entry(start + g)
            length: i64 = 2
            if pre == q2 and pre != SEP:
                length = self._corpus_match_back(buf, pos)
            cand_p[n] = CORPUS_BASE + pos
            cand_len[n] = length
            n += 1
            if length > best_len:
                best_len = length
        # The continuations of the candidates _follow will likely vote with (within MATCH_SLACK of
        # the longest: a guess, the state's slack may differ), read now though only _follow needs
        # them: nothing here branches on them, so their loads (cache misses in a large corpus)
        # overlap, where _follow's vote, which branches on each, would wait for them one by one.
        for j in range(n0, n):
            if cand_len[j] + MATCH_SLACK >= best_len:
                touched ^= read_i32_le(buf, CORPUS_IDS + 4 * (cand_p[j] - CORPUS_BASE))
        self.touched = touched  # kept, so the compiler keeps the reads
        return n, best_len

    def _corpus_match_back(self, buf: bytes, pos: i64) -> i64:
        """How far the corpus occurrence continuing at id ``pos``, known to match 3 tokens (its
        entry's token before is the query's third), agrees with the query (``qv``) backwards: at
        most :data:`MAX_MATCH`, never across a -1 or the corpus's start."""
        qv = self.qv
        length: i64 = 3
        at = pos - 4
        while length < MAX_MATCH and at >= 0:
            t = read_i32_le(buf, CORPUS_IDS + 4 * at)
            if t == SEP or t != qv[length]:
                break
            length += 1
            at -= 1
        return length
