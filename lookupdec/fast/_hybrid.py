"""The hybrid drafting policy, compiled: llama.cpp's confident drafts, then a suffix match.

Compiled by mypyc with :mod:`lookupdec.fast._core` (see ``setup.py``); it also runs as plain
Python. :mod:`lookupdec.reference.hybrid` is the readable model of the same policy, and
the two give identical drafts (``tests/test_hybrid.py``). The algorithm and its parameters
are described there and in the README ("The hybrid policy").

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

A corpus (:meth:`SuffixHistory.add_corpus`) is held apart, as a
:class:`~lookupdec.fast._corpus.CorpusIndex` (a corpus file, mapped or built in memory):
older than every request, never evicted, and closed at both ends (matches and
continuations stop at its start and end). Candidate positions ``>= CORPUS_BASE`` are its
ids' positions plus :data:`CORPUS_BASE`; :meth:`SuffixHistory._next_tokens` reads either part. They
are no request's (the current-request statistic leaves them out) and are walked after the
requests' occurrences: the bigram's run, the trigram's (the run's entries whose token
before is the trigram's first) and the last token's occurrences.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Final, cast

from librt.strings import read_i32_le
from librt.vecs import append, vec
from mypy_extensions import i32, i64

from lookupdec.fast._core import (
    ABSENT,
    M32,
    NGRAM_MAX,
    NGRAM_MIN,
    NULL32,
    NgramCache,
    StaticSource,
    as_static_source,
    check_ngram_range,
    check_policy,
    draft_core,
    filled_i32,
    key_hash,
    pack,
    replay_core,
    require_cache,
    require_static_source,
    to_vec,
)
from lookupdec.fast._corpus import HEADER_SIZE as CORPUS_IDS
from lookupdec.fast._corpus import CorpusIndex, slots_for
from lookupdec.result import ReplayResult, check_branches

SEP: Final[i32] = -1
"""Separator written before every request in the history stream (never matched)."""
CORPUS_BASE: Final[i64] = 1 << 40
"""Candidate positions at or above this are the corpus's (its id positions plus this)."""
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
MATCH_SLACK: Final[i64] = 1
"""Occurrences whose match is at most this much shorter than the longest are followed too (they vote)."""
MAX_MATCH: Final[i64] = 32
"""Matches are measured up to this many tokens (longer ones count as this long)."""
N_LEN: Final[i64] = 33
"""Acceptance statistics are kept per effective match length 1..32 (match length + offset) ..."""
N_CLASS: Final[i64] = 9
"""... per support class of the drafted token (see :func:`support_class`) ..."""
N_CUR: Final[i64] = 2
"""... per whether the newest followed occurrence with that token is in the current request ..."""
N_STATIC: Final[i64] = 6
"""... per static class of the drafted token (see :func:`static_class`) ..."""
N_KIND: Final[i64] = 2
"""... and per kind of suffix draft: 0 after llama.cpp's kept tokens (or none), 1 in place of its draft."""
N_LLAMA: Final[i64] = 17
"""Acceptance statistics of llama.cpp's tokens per draft length 1..16 (16 = "16 or more") ..."""
N_LLAMA_POS: Final[i64] = 16
"""... and position 0..15 in it (15 = "15 or later"), once for confirmed tokens, once for the others."""
N_LLAMA_CELLS: Final[i64] = N_LLAMA * N_LLAMA_POS
"""Cells of one of those two sets (see :func:`llama_cell`)."""
THRESHOLD: Final = 0.015
"""Initial threshold: draft a token only while the estimated chance that it is reached and accepted is at least this."""
TARGET_WASTE: Final = 1.9
"""Wasted drafted tokens per step the threshold is steered to (0 keeps it fixed)."""
THRESHOLD_STEP: Final = 1.0001
"""Factor the threshold moves by after every observed step (slowly: a threshold that swings wastes more
for what it gains than a steady one, so it drifts by at most e in 10,000 steps)."""
THRESHOLD_MIN: Final = 0.002
THRESHOLD_MAX: Final = 0.5
"""Bounds of the steered threshold."""
BALANCE_CAP: Final[i64] = 100_000_000
"""The waste balance is kept within +-10,000,000 tokens (in tenths): in practice the whole run's
budget, so the average over the run is what is steered."""
PRIOR_OK: Final = 1.0
PRIOR_TRIED: Final = 2.0
"""Laplace prior of every acceptance estimate: (ok + 1) / (tried + 2)."""
DECAY_AT: Final[i64] = 1 << 14
"""A statistic's counts are halved (integer division) when its ``tried`` reaches this: recent steps weigh more."""
INITIAL_SLOTS: Final[i64] = 1 << 10
VOTE_HASH: Final[i64] = 2654435761
"""Multiplier of the vote table's hash (Knuth's: a prime near 2^32 / phi)."""
VOTE_ONE: Final[i64] = 1 << 32
"""One vote in a vote slot's score (count << 32 | rank of the token's first candidate)."""
VOTE_STAMP_MAX: Final[i64] = 1 << 30
"""Vote rounds before the vote table is cleared (its keys hold the round's stamp << 32)."""


def zeros_i64(n: i64) -> vec[i64]:
    """A vec of ``n`` zeros."""
    v = vec[i64](capacity=n)
    for _i in range(n):  # not ``_``, which mypyc boxes: see _core.filled_i32
        v = append(v, 0)
    return v


def support_class(count: i64, n_active: i64) -> i64:
    """How well the ``n_active`` candidates support a drafted token that ``count`` of them follow:
    0 a single candidate, 1 one of several (the newest wins a tie), all of 2 / 3-5 / >= 6 (2, 3,
    4), at least half with ``count`` <= 3 / >= 4 (5, 6), fewer than half with ``count`` >= 4 /
    2-3 (7, 8)."""
    if n_active == 1:
        return 0
    if count == 1:
        return 1
    if count == n_active:
        if n_active == 2:
            return 2
        if n_active <= 5:
            return 3
        return 4
    if 2 * count >= n_active:
        if count <= 3:
            return 5
        return 6
    if count >= 4:
        return 7
    return 8


def static_class(st: StaticSource, a: i32, b: i32, t: i32) -> i64:
    """How the static index supports token ``t`` after ``(a, b)``: 0 it has no followers of
    that 2-gram (or ``a``/``b`` is a separator), 5 ``t`` is its own draft there (spec 3.2),
    else 1 ``t`` is not a follower, 2 a follower seen 1-2 times, 3 3-19 times, 4 more."""
    if a == SEP or b == SEP or not st._st_begin(a, b):
        return 0
    if t == st._st_pick():
        return 5
    c = st._st_count(t)
    if c == ABSENT:
        return 1
    if c <= 2:
        return 2
    if c < 20:
        return 3
    return 4


def llama_cell(m: i64, j: i64, confirmed: bool) -> i64:
    """Index of the acceptance statistic of token ``j`` of a llama.cpp draft of ``m`` tokens
    (``confirmed``: the suffix-only draft has the same first ``j + 1`` tokens)."""
    row = m if m < N_LLAMA - 1 else N_LLAMA - 1
    cell = row * N_LLAMA_POS + (j if j < N_LLAMA_POS - 1 else N_LLAMA_POS - 1)
    return cell if confirmed else cell + N_LLAMA_CELLS


def stat_cell(count: i64, n_active: i64, length: i64, sclass: i64, kind: i64, cur: i64) -> i64:
    """Index of the acceptance statistic for a token drafted after a match of ``length`` tokens
    (``sclass``: :func:`static_class`; ``kind``: see :data:`N_KIND`; ``cur``: see :data:`N_CUR`)."""
    eff = length if length < N_LEN - 1 else N_LEN - 1
    return (((kind * N_STATIC + sclass) * N_CLASS + support_class(count, n_active)) * N_CUR + cur) * N_LEN + eff


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


KIND_STRIDE: Final[i64] = N_STATIC * N_CLASS * N_CUR * N_LEN
"""Cells of one kind of suffix draft: a cell at or above this is of kind 1 (see :func:`stat_cell`)."""


class TreeVotes:
    """The tree's votes among candidates' next tokens: per token its count and first candidate.

    An open-addressing table whose slots are live only with the current stamp, as
    :meth:`HybridState._follow`'s vote (O(candidates) per vote), but a table of its own: the
    tree code shares no scratch with the linear policy's.
    """

    key: vec[i32]
    cnt: vec[i64]
    first: vec[i64]
    live: vec[i64]
    slot: vec[i64]
    mask: i64
    stamp: i64

    def __init__(self) -> None:
        self.key = vec[i32]()
        self.cnt = vec[i64]()
        self.first = vec[i64]()
        self.live = vec[i64]()
        self.slot = vec[i64]()
        self.mask = -1
        self.stamp = 0

    def tally(self, nx: vec[i32], n: i64) -> None:
        """Count the tokens of ``nx[:n]`` (-1 is no token)."""
        if 2 * n > self.mask + 1:
            size: i64 = 128
            while size < 2 * n:
                size *= 2
            self.key = filled_i32(size, SEP)
            self.cnt = zeros_i64(size)
            self.first = zeros_i64(size)
            self.live = zeros_i64(size)
            self.slot = zeros_i64(size)
            self.mask = size - 1
        self.stamp += 1
        stamp = self.stamp
        key = self.key
        live = self.live
        mask = self.mask
        for i in range(n):
            t = nx[i]
            if t == SEP:
                self.slot[i] = -1
                continue
            g = ((i64(t) * VOTE_HASH) >> 16) & mask  # t < 2^31: no overflow
            while live[g] == stamp and key[g] != t:
                g = (g + 1) & mask
            if live[g] != stamp:
                live[g] = stamp
                key[g] = t
                self.cnt[g] = 1
                self.first[g] = i
            else:
                self.cnt[g] += 1
            self.slot[i] = g

    def best(self, nx: vec[i32], n: i64, skip: vec[i32]) -> tuple[i64, i64]:
        """After :meth:`tally` of ``nx[:n]``: the most frequent token not in ``skip`` as (the index of
        its first occurrence, its count), (-1, 0) if none; a tie goes to the one occurring first
        (the newest candidate's), as in :meth:`HybridState._follow`'s vote."""
        best_f: i64 = -1
        best_c: i64 = 0
        for i in range(n):
            g = self.slot[i]
            if g < 0 or self.first[g] != i or self.cnt[g] <= best_c:
                continue
            t = nx[i]
            skipped = False
            for j in range(len(skip)):
                if skip[j] == t:
                    skipped = True
            if not skipped:
                best_c = self.cnt[g]
                best_f = i
        return best_f, best_c


def add_branch(tree: list[vec[i32]], v: vec[i32], branches: i64) -> None:
    """Append ``v`` to ``tree`` unless it is empty, the tree has ``branches`` branches, or ``v``
    and a branch already there are one a prefix of the other (a tree verifier gains nothing from it)."""
    n = i64(len(v))
    if n == 0 or i64(len(tree)) >= branches:
        return
    for b in tree:
        k = i64(len(b))
        if n < k:
            k = n
        j: i64 = 0
        while j < k and b[j] == v[j]:
            j += 1
        if j == k:
            return
    tree.append(v)


def tree_nodes(tree: list[vec[i32]]) -> i64:
    """Distinct nodes of the tree the branches form (shared prefixes counted once): what a tree
    verifier evaluates."""
    total: i64 = 0
    for i in range(len(tree)):
        b = tree[i]
        shared: i64 = 0
        for j in range(i):
            o = tree[j]
            k = i64(len(o))
            if i64(len(b)) < k:
                k = i64(len(b))
            c: i64 = 0
            while c < k and o[c] == b[c]:
                c += 1
            if c > shared:
                shared = c
        total += i64(len(b)) - shared
    return total


def tree_path(
    tree: list[vec[i32]], toks: vec[i32], at: i64, room: i64, tail: vec[i32], base: i64
) -> tuple[vec[i32], i64]:
    """``tail[:base]`` followed by the branch of ``tree`` that agrees longest with the text
    ``toks[at:at + room]`` (the first of them on a tie), and how far branch 0 agrees with it."""
    best: i64 = -1
    pick: i64 = 0
    acc0: i64 = 0
    for bi in range(len(tree)):
        b = tree[bi]
        a: i64 = 0
        while a < i64(len(b)) and a < room and toks[at + a] == b[a]:
            a += 1
        if bi == 0:
            acc0 = a
        if a > best:
            best = a
            pick = bi
    path = vec[i32](capacity=base + 16)
    for j in range(base):
        path = append(path, tail[j])
    if len(tree) > 0:
        b = tree[pick]
        for j in range(len(b)):
            path = append(path, b[j])
    return path, acc0


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
    last_best: i64
    cand_len: vec[i64]
    n_cand: i64
    vote_k: vec[i64]
    vote_s: vec[i64]
    vote_mask: i64
    vote_stamp: i64
    next_t: vec[i32]
    qv: vec[i32]
    corpus: CorpusIndex | None
    touched: i32

    def __init__(self, max_tokens: int = DEFAULT_MAX_TOKENS) -> None:
        if max_tokens < 16:
            raise ValueError(f"max_tokens must be >= 16, got {max_tokens}")
        self.max_tokens = max_tokens
        self.n_evictions = 0
        self.req_start = 0  # where the latest request starts (after its separator)
        self.cand_p = vec[i64]()
        self.act = vec[i64]()
        self.last_best = 0
        self.cand_len = vec[i64]()
        self.n_cand = 0
        self.vote_k = vec[i64]()
        self.vote_s = vec[i64]()
        self.vote_mask = 0
        self.vote_stamp = 0
        self.next_t = vec[i32]()
        self.qv = filled_i32(MAX_MATCH + 1, SEP)
        self.corpus = None
        self.touched = 0
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
        for i in range(n_act):
            p = act[i] + k
            t = SEP
            if p < CORPUS_BASE:
                if p < n_toks:
                    t = toks[p]
            elif c is not None and p - CORPUS_BASE < n_ids:
                t = read_i32_le(buf, CORPUS_IDS + 4 * (p - CORPUS_BASE))
                if t < SEP:
                    raise c._corrupt(f"token id {t} < -1", CORPUS_IDS + 4 * (p - CORPUS_BASE))
            nx[i] = t

    # --- bigram table ---------------------------------------------------------------

    def _bfind(self, w: i64) -> i64:
        """Ordinal of bigram ``w`` (packed), -1 if never indexed."""
        slots = self.bslots
        keys = self.bkey
        mask = self.bmask
        h = key_hash(w, -1) & mask
        while True:
            s = i64(slots[h])
            if s < 0:
                return -1
            if keys[s] == w:
                return s
            h = (h + 1) & mask

    def _bintern(self, w: i64) -> i64:
        slots = self.bslots
        keys = self.bkey
        mask = self.bmask
        h = key_hash(w, -1) & mask
        while True:
            s = i64(slots[h])
            if s < 0:
                break
            if keys[s] == w:
                return s
            h = (h + 1) & mask
        kid = i64(len(keys))
        slots[h] = i32(kid)
        self.bkey = append(keys, w)
        self.bhead = append(self.bhead, NULL32)
        if 2 * (kid + 1) > mask + 1:
            self.bslots = slots_for(self.bkey, 2 * (mask + 1))
            self.bmask = 2 * mask + 1
        return kid

    # --- unigram table --------------------------------------------------------------

    def _ufind(self, t: i32) -> i64:
        slots = self.uslots
        keys = self.ukey
        mask = self.umask
        h = key_hash(pack(t, t), -1) & mask
        while True:
            s = i64(slots[h])
            if s < 0:
                return -1
            if keys[s] == t:
                return s
            h = (h + 1) & mask

    def _uset(self, t: i32, p: i64) -> None:
        """Make ``p`` the newest position after token ``t`` (in its ring, over the oldest)."""
        slots = self.uslots
        keys = self.ukey
        mask = self.umask
        h = key_hash(pack(t, t), -1) & mask
        while True:
            s = i64(slots[h])
            if s < 0:
                break
            if keys[s] == t:
                g = i64(self.uhead[s])
                self.uring[UNIGRAM_CANDIDATES * s + g] = i32(p)
                self.uhead[s] = i32((g + 1) & (UNIGRAM_CANDIDATES - 1))
                return
            h = (h + 1) & mask
        kid = i64(len(keys))
        slots[h] = i32(kid)
        self.ukey = append(keys, t)
        self.uring = append(self.uring, i32(p))
        for _j in range(UNIGRAM_CANDIDATES - 1):  # ``_j``, not ``_``: see _core.filled_i32
            self.uring = append(self.uring, NULL32)
        self.uhead = append(self.uhead, 1)
        if 2 * (kid + 1) > mask + 1:
            size = 2 * (mask + 1)
            ns = filled_i32(size, NULL32)
            nm = size - 1
            uk = self.ukey
            for j in range(len(uk)):
                g = key_hash(pack(uk[j], uk[j]), -1) & nm
                while ns[g] >= 0:
                    g = (g + 1) & nm
                ns[g] = i32(j)
            self.uslots = ns
            self.umask = nm

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

    def _push(self, t: i32) -> None:
        if i64(len(self.toks)) >= self.max_tokens:
            self._evict()
        self.toks = append(self.toks, t)
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
        self._push(SEP)
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
            self._push(v[j])

    # --- matching -------------------------------------------------------------------

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
        newest first (the requests', then the corpus's), and their match lengths; when there
        were that many, then up to :data:`DEEP_CANDIDATES` older occurrences of its last
        trigram (newest first). If the bigram never occurred, up to :data:`UNIGRAM_CANDIDATES`
        occurrences of the last token alone, newest first (length 1).
        """
        self.n_cand = 0
        cap = max_candidates + DEEP_CANDIDATES
        if cap < UNIGRAM_CANDIDATES:
            cap = UNIGRAM_CANDIDATES
        if i64(len(self.cand_p)) < cap:
            self.cand_p = zeros_i64(cap)
            self.act = zeros_i64(cap)
            self.cand_len = zeros_i64(cap)
            self.next_t = filled_i32(cap, SEP)
            size: i64 = 1
            while size < 2 * cap:
                size *= 2
            self.vote_k = zeros_i64(size)
            self.vote_s = zeros_i64(size)
            self.vote_mask = size - 1
            self.vote_stamp = 0
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
            if c is not None:
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
            for _g in range(take):  # ``_g``, not ``_``: see _core.filled_i32
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


class HybridStep:
    """One proposal's bookkeeping (see :meth:`HybridState.last_step`): how many of its tokens were
    llama.cpp's (of a draft of ``llama_full``, the first ``confirmed`` of them confirmed by the
    suffix-only draft) and suffix tokens, and their statistics' cells."""

    llama_full: i64
    llama: i64
    suffix: i64
    cells: vec[i64]
    confirmed: i64

    def __init__(self, llama_full: i64, llama: i64, suffix: i64, cells: vec[i64], confirmed: i64) -> None:
        self.llama_full = llama_full
        self.llama = llama
        self.suffix = suffix
        self.cells = cells
        self.confirmed = confirmed


class HybridState:
    """Per-drafter state of the hybrid policy: a :class:`SuffixHistory` and acceptance statistics.

    Protocol per request: :meth:`begin_request`, then per verification step :meth:`propose`
    and, after the engine verified the proposal, :meth:`observe`. ``tokens`` passed to
    :meth:`propose` is the whole request so far (prompt and generated tokens), append-only:
    tokens the state has not seen yet are added to the history first.
    """

    history: SuffixHistory
    tried: vec[i64]
    ok: vec[i64]
    l_tried: vec[i64]
    l_ok: vec[i64]
    seen: i64
    last_llama: i64
    last_llama_full: i64
    last_confirmed: i64
    last_suffix: i64
    last_cells: vec[i64]
    threshold: float
    max_candidates: i64
    match_slack: i64
    target_waste10: i64
    balance: i64
    tree_votes: TreeVotes | None

    def __init__(
        self,
        history: SuffixHistory | None = None,
        threshold: float = THRESHOLD,
        max_candidates: int = MAX_CANDIDATES,
        target_waste: float = TARGET_WASTE,
        match_slack: int = MATCH_SLACK,
    ) -> None:
        if not 0.0 <= threshold <= 1.0:
            raise ValueError(f"threshold must be in [0, 1], got {threshold}")
        if max_candidates < 1:
            raise ValueError(f"max_candidates must be >= 1, got {max_candidates}")
        if not 0 <= match_slack <= MAX_MATCH:
            raise ValueError(f"match_slack must be in [0, {MAX_MATCH}], got {match_slack}")
        self.match_slack = match_slack
        self.history = history if history is not None else SuffixHistory()
        if not 0.0 <= target_waste <= 64.0:
            raise ValueError(f"target_waste must be in [0, 64], got {target_waste}")
        self.threshold = threshold
        self.max_candidates = max_candidates
        # tenths of a token, so the waste balance stays an integer (identical in both implementations)
        self.target_waste10 = i64(round(target_waste * 10))
        self.balance = 0
        self.tried = zeros_i64(N_KIND * N_STATIC * N_CLASS * N_CUR * N_LEN)
        self.ok = zeros_i64(N_KIND * N_STATIC * N_CLASS * N_CUR * N_LEN)
        self.l_tried = zeros_i64(2 * N_LLAMA_CELLS)
        self.l_ok = zeros_i64(2 * N_LLAMA_CELLS)
        self.last_llama_full = 0
        self.last_confirmed = 0
        self.seen = 0
        self.last_llama = 0
        self.last_suffix = 0
        self.last_cells = vec[i64]()
        self.tree_votes = None  # made by the first tree proposal

    def begin_request(self) -> None:
        """Start a new request (the previous one stays in the history)."""
        self.history.add_separator()
        self.seen = 0
        self.last_llama = 0
        self.last_suffix = 0

    def _sync(self, tokens: Sequence[int]) -> None:
        n = len(tokens)
        if n < self.seen:
            raise ValueError(
                f"tokens has {n} tokens but the request already had {self.seen}: "
                "call begin_request() before a new request"
            )
        if n > self.seen:
            self.history.extend(tokens[self.seen :])
            self.seen = n

    def sync(self, tokens: Sequence[int]) -> None:
        """Add the tokens of ``tokens`` (the whole request so far) not in the history yet.

        :meth:`propose` does this itself; call it when a request ends, so that its last tokens
        join the history too.
        """
        self._sync(tokens)

    def truncate(self, n: int) -> None:
        """Only the first ``n`` tokens of the last proposal are verified (the caller cut it).

        Keeps :meth:`observe`'s waste count and statistics to the tokens the engine really saw.
        """
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        m = self.last_llama
        rest = n - m if n > m else 0
        if m > n:
            self.last_llama = n
        if self.last_suffix > rest:
            self.last_suffix = rest

    def _push_token(self, t: i32) -> None:
        self.history._push(t)
        self.seen += 1

    def _estimate(self, cell: i64) -> float:
        """Estimated acceptance of a suffix token of statistic ``cell``."""
        return (float(self.ok[cell]) + PRIOR_OK) / (float(self.tried[cell]) + PRIOR_TRIED)

    def _l_estimate(self, cell: i64) -> float:
        """Estimated acceptance of a llama.cpp token of statistic ``cell``."""
        return (float(self.l_ok[cell]) + PRIOR_OK) / (float(self.l_tried[cell]) + PRIOR_TRIED)

    def _follow(
        self,
        q: vec[i32],
        drafted: vec[i32],
        n_max: i64,
        prob: float,
        kind: i64,
        st: StaticSource,
        cmp: vec[i32],
        cmp_base: i64,
        cmp_n: i64,
        reuse: bool = False,
    ) -> tuple[vec[i32], vec[i64]]:
        """Append up to ``n_max`` suffix-match tokens for the query ``q`` to ``drafted``.

        ``q`` is what follows the history's stream in the query (see ``SuffixHistory._collect``);
        ``prob`` the running estimate so far. Returns the vec and the drafted tokens' cells.
        With ``cmp_n > 0`` it stops early, after the first token that differs from
        ``cmp[cmp_base + k]`` or after ``cmp_n`` tokens: only a prefix of the same draft (a
        speed-up for the suffix-only draft when only its agreement with llama.cpp's is needed).
        ``reuse``: ``q`` is the last call's query and the history has not grown since, so the
        candidates that call collected are used again (collecting them is most of the cost).
        """
        cells = vec[i64](capacity=n_max)
        h = self.history
        if reuse:
            best = h.last_best  # the same query as the last call's, and nothing added since
        else:
            best = h._collect(q, self.max_candidates)
            h.last_best = best
        if best == 0:
            return drafted, cells
        # The candidates followed: every occurrence matching at most match_slack shorter than the
        # best, in h.act (n_act of them), newest first; h.cand_p stays as _collect left it.
        act = h.act
        cand = h.cand_p
        n_act: i64 = 0
        shortest = best - self.match_slack
        for j in range(h.n_cand):
            if h.cand_len[j] >= shortest:
                act[n_act] = cand[j]
                n_act += 1
        vk = h.vote_k
        vs = h.vote_s
        vmask = h.vote_mask
        nx = h.next_t
        b2 = h._query_at(q, 1)  # the two tokens before the next drafted one (for static_class)
        b1 = h._query_at(q, 0)
        k: i64 = 0
        while k < n_max:
            # The most frequent next token among the candidates; on a tie the newest one's, i.e.
            # the one whose first (newest) candidate comes first. Counted in an open-addressing
            # table of at least twice the candidates (O(candidates), where comparing with each
            # distinct token so far was O(candidates x distinct tokens): the cost of the one-token
            # fallback's 64 votes). A slot is two words, so a probe reads two vecs (each read is
            # a bounds check too): its key, this round's stamp << 32 | the token (a slot of an
            # older stamp is free: no clearing), and its score, count << 32 | (2^32 - 1 - the
            # token's first candidate), so the highest score is the vote's winner, tie included.
            h._next_tokens(act, n_act, k, nx)  # the request stream's or the corpus's (-1 past their ends)
            stamp = h.vote_stamp + 1
            if stamp >= VOTE_STAMP_MAX:  # the key's high half would overflow: start the table afresh
                for g in range(vmask + 1):
                    vk[g] = 0
                stamp = 1
            h.vote_stamp = stamp
            high = stamp << 32
            best_t = SEP
            best_s: i64 = 0
            sc: i64 = 0
            for i in range(n_act):
                ti = nx[i]
                if ti == SEP:
                    continue
                key = high | i64(ti)
                g = ((i64(ti) * VOTE_HASH) >> 16) & vmask  # ti < 2^31: no overflow, interpreted or compiled
                while True:
                    w = vk[g]
                    if w == key:
                        sc = vs[g] + VOTE_ONE
                        vs[g] = sc
                        break
                    if w < high:  # an older round's (or never used): free
                        vk[g] = key
                        sc = VOTE_ONE + (M32 - i)
                        vs[g] = sc
                        break
                    g = (g + 1) & vmask
                if sc > best_s:
                    best_s = sc
                    best_t = ti
            if best_s == 0:
                break
            best_c = best_s >> 32
            best_f = M32 - (best_s & M32)
            cur: i64 = 0  # whether the newest followed occurrence with it is this request's (the corpus is none)
            if h.req_start <= act[best_f] < CORPUS_BASE:
                cur = 1
            cell = stat_cell(best_c, n_act, best + k, static_class(st, b2, b1, best_t), kind, cur)
            prob = prob * self._estimate(cell)
            if prob < self.threshold:
                break
            drafted = append(drafted, best_t)
            cells = append(cells, cell)
            b2 = b1
            b1 = best_t
            k += 1
            if cmp_n > 0 and (best_t != cmp[cmp_base + k - 1] or k >= cmp_n):
                break
            n_kept: i64 = 0
            for i in range(n_act):
                if nx[i] == best_t:
                    act[n_kept] = act[i]
                    n_kept += 1
            n_act = n_kept
        return drafted, cells

    def _suffix(self, drafted: vec[i32], base: i64, n_draft: i64, before: vec[i32], st: StaticSource) -> vec[i32]:
        """Choose, trim and extend ``drafted[base:]`` (llama.cpp's draft); returns the vec.

        When llama.cpp drafted, the suffix-only draft (from the request alone, kind 1) is made
        first: it confirms llama.cpp's first tokens where it agrees, and replaces the whole draft
        when they disagree on the first token and its first token's estimate is higher than
        llama.cpp's. Otherwise llama.cpp's tokens are kept while the running estimate stays at
        or above the threshold, and suffix-match tokens (kind 0) follow under the same running
        estimate. ``before`` is what precedes the draft in the query: empty for the history's
        current request (its tokens end the stream), else a detached request's last tokens
        (see :meth:`propose_detached`).
        """
        m_full = i64(len(drafted)) - base
        self.last_llama_full = m_full
        self.last_suffix = 0
        self.last_confirmed = 0
        if m_full > 0:
            alt = vec[i32](capacity=base + n_draft)
            for j in range(base):
                alt = append(alt, drafted[j])
            # Only as far as it agrees with llama.cpp's draft (plus the first token that does not):
            # all the agreement needs; the whole draft is made again if it replaces llama.cpp's.
            short, alt_cells = self._follow(before, alt, n_draft, 1.0, 1, st, drafted, base, m_full)
            n_alt = i64(len(alt_cells))
            agree: i64 = 0
            while agree < n_alt and agree < m_full and short[base + agree] == drafted[base + agree]:
                agree += 1
            self.last_confirmed = agree
            if (
                agree == 0
                and n_alt > 0
                and self._estimate(alt_cells[0]) > self._l_estimate(llama_cell(m_full, 0, False))
            ):
                alt = vec[i32](capacity=base + n_draft)
                for j in range(base):
                    alt = append(alt, drafted[j])
                alt, alt_cells = self._follow(before, alt, n_draft, 1.0, 1, st, drafted, base, 0, True)
                self.last_llama = 0
                self.last_suffix = i64(len(alt_cells))
                self.last_cells = alt_cells
                return alt
        prob = 1.0
        m: i64 = 0
        while m < m_full:
            p_ok = self._l_estimate(llama_cell(m_full, m, m < self.last_confirmed))
            if prob * p_ok < self.threshold:
                break
            prob = prob * p_ok
            m += 1
        if m < m_full:
            kept = vec[i32](capacity=base + n_draft)
            for j in range(base + m):
                kept = append(kept, drafted[j])
            drafted = kept
        self.last_llama = m
        if m >= n_draft:
            return drafted
        q = vec[i32](capacity=i64(len(before)) + m)
        for j in range(len(before)):
            q = append(q, before[j])
        for j in range(base, len(drafted)):
            q = append(q, drafted[j])
        # m == 0 after a suffix-only draft: the same query as that draft's (``before``)
        drafted, cells = self._follow(q, drafted, n_draft - m, prob, 0, st, drafted, base, 0, m == 0 and m_full > 0)
        self.last_suffix = i64(len(cells))
        self.last_cells = cells
        return drafted

    def _observe(self, n_accepted: i64) -> None:
        m = self.last_llama
        s = self.last_suffix
        if self.target_waste10 > 0:
            # The waste controller: the balance is the waste budget left (in tenths of a token),
            # clamped to +-BALANCE_CAP; overspent, the threshold rises, else it falls.
            wasted = m + s - n_accepted if n_accepted < m + s else 0
            b = self.balance + self.target_waste10 - 10 * wasted
            b = BALANCE_CAP if b > BALANCE_CAP else (-BALANCE_CAP if b < -BALANCE_CAP else b)
            self.balance = b
            t = self.threshold * THRESHOLD_STEP if b < 0 else self.threshold / THRESHOLD_STEP
            self.threshold = THRESHOLD_MAX if t > THRESHOLD_MAX else (THRESHOLD_MIN if t < THRESHOLD_MIN else t)
        j: i64 = 0
        while j < m and j <= n_accepted:  # llama.cpp's tokens reached: the accepted ones and the first miss
            cell = llama_cell(self.last_llama_full, j, j < self.last_confirmed)
            self.l_tried[cell] += 1
            if j < n_accepted:
                self.l_ok[cell] += 1
            if self.l_tried[cell] >= DECAY_AT:
                self.l_tried[cell] //= 2
                self.l_ok[cell] //= 2
            j += 1
        if s > 0 and n_accepted >= m:
            acc = n_accepted - m
            k: i64 = 0
            while k < s and k <= acc:
                off = self.last_cells[k]
                self.tried[off] += 1
                if k < acc:
                    self.ok[off] += 1
                if self.tried[off] >= DECAY_AT:
                    self.tried[off] //= 2
                    self.ok[off] //= 2
                k += 1
        self.last_llama = 0
        self.last_suffix = 0

    def propose(
        self,
        tokens: Sequence[int],
        n_draft: int,
        nc_context: NgramCache,
        nc_dynamic: NgramCache,
        nc_static: object = None,
    ) -> list[int]:
        """Up to ``n_draft`` tokens to verify after ``tokens`` (the whole request so far).

        First llama.cpp's draft from the three caches (exactly ``draft``'s output), then, if it
        is shorter than ``n_draft``, the continuation of the longest earlier match of the
        sequence's suffix in the history, as long as the estimated acceptance allows.
        """
        return self._propose(tokens, n_draft, nc_context, nc_dynamic, nc_static, False)

    def propose_detached(
        self,
        tokens: Sequence[int],
        n_draft: int,
        nc_context: NgramCache,
        nc_dynamic: NgramCache,
        nc_static: object = None,
    ) -> list[int]:
        """Like :meth:`propose`, for a request that is not the history's current one.

        For a request open at the same time as the one whose tokens the history is following:
        the match is sought for its own last tokens (``tokens``, the whole request so far),
        among the history's occurrences; its tokens are not added to the history, so it never
        matches itself. Observe it like any proposal (see :meth:`last_step`).
        """
        return self._propose(tokens, n_draft, nc_context, nc_dynamic, nc_static, True)

    def _propose(
        self,
        tokens: Sequence[int],
        n_draft: int,
        nc_context: NgramCache,
        nc_dynamic: NgramCache,
        nc_static: object,
        detached: bool,
        branches: i64 = 1,
        tree: list[list[int]] | None = None,
    ) -> list[int]:
        if n_draft < 0:
            raise ValueError(f"n_draft must be >= 0, got {n_draft}")
        if not detached:
            self._sync(tokens)
        st = as_static_source(nc_static)
        if st is None:
            raise TypeError(f"nc_static must be a static cache, a StaticIndex or None, not {type(nc_static).__name__}")
        n = len(tokens)
        if n < 1:
            self.last_llama = 0
            self.last_suffix = 0
            return []
        lo = n - NGRAM_MAX if n > NGRAM_MAX else 0
        tail = to_vec(tokens, lo)
        base = i64(len(tail))
        if n >= 2:
            tail = draft_core(tail, n, n_draft, NGRAM_MIN, NGRAM_MAX, nc_context, nc_dynamic, st)
        before = vec[i32]()  # attached: the query goes on into the stream, whose end is this request
        if detached:
            # The query reaches MAX_MATCH tokens back at most: that many of the request's last
            # tokens, after a separator when the request is shorter (its start ends any match).
            if n >= MAX_MATCH:
                before = to_vec(tokens, n - MAX_MATCH)
            else:
                before = append(before, SEP)
                rest = to_vec(tokens)
                for j in range(len(rest)):
                    before = append(before, rest[j])
        if tree is not None:  # propose_tree: branch 0 is this proposal, then the alternatives
            for b in self._tree_step(tail, base, n_draft, before, st, branches):
                tree.append([int(t) for t in b])
            return tree[0] if tree else []
        tail = self._suffix(tail, base, n_draft, before, st)
        return [int(tail[j]) for j in range(base, len(tail))]

    def last_step(self) -> HybridStep:
        """The bookkeeping of the last proposal, to :meth:`observe` it later with :meth:`resume_step`.

        Needed when proposals of several requests are outstanding at once.
        """
        return HybridStep(self.last_llama_full, self.last_llama, self.last_suffix, self.last_cells, self.last_confirmed)

    def resume_step(self, step: HybridStep) -> None:
        """Make ``step`` (from :meth:`last_step`) the proposal the next :meth:`observe` is about."""
        self.last_llama_full = step.llama_full
        self.last_llama = step.llama
        self.last_suffix = step.suffix
        self.last_cells = step.cells
        self.last_confirmed = step.confirmed

    def observe(self, n_accepted: int, committed: Sequence[int] = ()) -> None:
        """Record that the engine accepted the first ``n_accepted`` tokens of the last proposal.

        ``committed`` (optional) are the tokens the request grew by (accepted and sampled);
        they may instead be passed with the next :meth:`propose`.
        """
        if n_accepted < 0:
            raise ValueError(f"n_accepted must be >= 0, got {n_accepted}")
        self._observe(n_accepted)
        if len(committed) > 0:
            self.history.extend(committed)
            self.seen += len(committed)

    def propose_tree(
        self,
        tokens: Sequence[int],
        n_draft: int,
        nc_context: NgramCache,
        nc_dynamic: NgramCache,
        nc_static: object = None,
        branches: int = 3,
        detached: bool = False,
    ) -> list[list[int]]:
        """Up to ``branches`` drafts after ``tokens``, for an engine that verifies them as a tree.

        The first is exactly :meth:`propose`'s (:meth:`propose_detached`'s with ``detached``)
        proposal; the others are alternatives, none empty and none a prefix of another branch
        (nor one of them a prefix of it), in this order while there is room: llama.cpp's own
        draft where the policy trimmed or replaced it; the runner-ups of the vote that chose the
        first suffix-match token (branch 0's tokens before it, the runner-up, and its own
        continuation while the running estimate stays at or above the threshold); the
        suffix-only draft, when llama.cpp's tokens were kept. ``[]`` when :meth:`propose` would
        draft nothing.

        Learning stays linear: observe the step as if only branch 0 had been proposed, with
        :meth:`observe` ``(n)``, ``n`` the length of the accepted tokens' common prefix with
        branch 0. The state then evolves as the linear policy's would on the same committed
        tokens, so branch 0 is, step by step, what :meth:`propose` returns, and a tree verifier
        accepts at least as much per step as one verifying branch 0 alone.
        """
        if branches < 1:
            raise ValueError(f"branches must be >= 1, got {branches}")
        tree: list[list[int]] = []
        self._propose(tokens, n_draft, nc_context, nc_dynamic, nc_static, detached, branches, tree)
        return tree

    def _tree_step(
        self, tail: vec[i32], base: i64, n_draft: i64, before: vec[i32], st: StaticSource, branches: i64
    ) -> list[vec[i32]]:
        """The branches of one tree proposal (see :meth:`propose_tree`) from llama.cpp's draft
        ``tail[base:]``: branch 0 is :meth:`_suffix`'s, and its bookkeeping is the step's."""
        m_full = i64(len(tail)) - base
        llama = vec[i32](capacity=m_full)
        for j in range(base, base + m_full):
            llama = append(llama, tail[j])
        tail = self._suffix(tail, base, n_draft, before, st)
        b0 = vec[i32](capacity=n_draft)
        for j in range(base, len(tail)):
            b0 = append(b0, tail[j])
        tree: list[vec[i32]] = []
        if len(b0) == 0:
            return tree
        tree.append(b0)
        add_branch(tree, llama, branches)  # llama.cpp's draft, where the policy trimmed or replaced it
        m = self.last_llama
        if self.last_suffix > 0 and i64(len(tree)) < branches:
            # The candidates of the query before branch 0's first suffix token are still the
            # history's (its last _collect), so the runner-ups cost no new search.
            kind: i64 = 0
            prob = 1.0
            if m_full > 0 and m == 0 and self.last_cells[0] >= KIND_STRIDE:
                kind = 1  # the suffix-only draft replaced llama.cpp's
            else:
                for j in range(m):  # the running estimate after llama.cpp's kept tokens, as _suffix has it
                    prob = prob * self._l_estimate(llama_cell(m_full, j, j < self.last_confirmed))
            q = vec[i32](capacity=i64(len(before)) + m)
            for j in range(len(before)):
                q = append(q, before[j])
            for j in range(m):
                q = append(q, b0[j])
            self._runner_ups(q, b0, m, prob, kind, st, n_draft - m, branches, tree)
        if m > 0 and i64(len(tree)) < branches:
            # The suffix-only draft (one more search): it differs where llama.cpp's kept tokens do.
            alt = vec[i32](capacity=n_draft)
            alt, _cells = self._follow(before, alt, n_draft, 1.0, 1, st, alt, 0, 0)
            add_branch(tree, alt, branches)
        return tree

    def _runner_ups(
        self,
        q: vec[i32],
        b0: vec[i32],
        m: i64,
        prob: float,
        kind: i64,
        st: StaticSource,
        n_max: i64,
        branches: i64,
        tree: list[vec[i32]],
    ) -> None:
        """Add branches that take the runner-ups of the vote for ``b0[m]`` (branch 0's first
        suffix token, after the query ``q``) in its place, each continued as :meth:`_follow`
        continues a draft (the candidates that agree vote, while the running estimate from
        ``prob`` stays at or above the threshold). At most ``branches - 1`` runner-ups are tried."""
        h = self.history
        best = h.last_best
        shortest = best - self.match_slack
        act0 = vec[i64](capacity=h.n_cand)
        for j in range(h.n_cand):
            if h.cand_len[j] >= shortest:
                act0 = append(act0, h.cand_p[j])
        n0 = i64(len(act0))
        nx0 = filled_i32(n0, SEP)
        h._next_tokens(act0, n0, 0, nx0)
        b2 = h._query_at(q, 1)
        b1 = h._query_at(q, 0)
        votes = self.tree_votes
        if votes is None:
            votes = TreeVotes()
            self.tree_votes = votes
        votes.tally(nx0, n0)
        # The runner-ups first (the continuations' votes reuse the table): most votes first.
        taken = vec[i32]()
        taken = append(taken, b0[m])
        picks = vec[i64]()
        counts = vec[i64]()
        for _r in range(branches - 1):  # ``_r``, not ``_``: see _core.filled_i32
            f, c = votes.best(nx0, n0, taken)
            if f < 0:
                break
            taken = append(taken, nx0[f])
            picks = append(picks, f)
            counts = append(counts, c)
        none = vec[i32]()
        for ri in range(len(picks)):
            if i64(len(tree)) >= branches:
                break
            f = picks[ri]
            c = counts[ri]
            r = nx0[f]
            cur: i64 = 0  # an if statement, not a conditional expression: see replay_core
            if h.req_start <= act0[f] < CORPUS_BASE:
                cur = 1
            p = prob * self._estimate(stat_cell(c, n0, best, static_class(st, b2, b1, r), kind, cur))
            if p < self.threshold:
                continue
            d = vec[i32](capacity=m + n_max)
            for j in range(m):
                d = append(d, b0[j])
            d = append(d, r)
            act = vec[i64](capacity=c)
            for i in range(n0):
                if nx0[i] == r:
                    act = append(act, act0[i])
            n_act = i64(len(act))
            nx = filled_i32(n_act, SEP)
            a2 = b1
            a1 = r
            k: i64 = 1
            while k < n_max:
                h._next_tokens(act, n_act, k, nx)
                votes.tally(nx, n_act)
                g, cnt = votes.best(nx, n_act, none)
                if g < 0:
                    break
                t = nx[g]
                cur = 0
                if h.req_start <= act[g] < CORPUS_BASE:
                    cur = 1
                p = p * self._estimate(stat_cell(cnt, n_act, best + k, static_class(st, a2, a1, t), kind, cur))
                if p < self.threshold:
                    break
                d = append(d, t)
                a2 = a1
                a1 = t
                k += 1
                n_kept: i64 = 0
                for i in range(n_act):
                    if nx[i] == t:
                        act[n_kept] = act[i]
                        n_kept += 1
                n_act = n_kept
            add_branch(tree, d, branches)


def replay_hybrid_core(
    toks: vec[i32],
    n_ctx: i64,
    n_draft: i64,
    st: StaticSource,
    dyn: NgramCache,
    state: HybridState,
    progress: Callable[[int, int], None] | None,
    total: i64,
    branches: i64 = 1,
) -> tuple[i64, i64, i64, float]:
    """The replay loop of ``_core.replay_core`` with hybrid drafts; (n_drafted, n_accept, n_steps, t).

    ``branches`` > 1: tree drafts (:meth:`HybridState.propose_tree`); a step accepts the longest
    prefix any branch shares with the text (what a tree verifier accepts) and is observed as
    branch 0's; ``n_drafted`` counts the trees' distinct nodes.
    """
    import time

    ctx = NgramCache()
    n_drafted: i64 = 0
    n_accept: i64 = 0
    n_steps: i64 = 0
    t_draft = 0.0
    i_start: i64 = 0
    check_ngram_range(NGRAM_MIN, NGRAM_MAX)
    own = vec[i32]()  # the query's context is the stream's end (the chunk is the current request)
    while i_start + n_ctx < total:
        t0 = time.perf_counter()
        state.begin_request()
        state._push_token(toks[i_start])
        pos: i64 = 1
        while pos < n_ctx:
            n_steps += 1
            tail = vec[i32](capacity=NGRAM_MAX + n_draft)
            lo: i64 = 0  # an if statement, not a conditional expression: see replay_core
            if pos > 4:
                lo = pos - 4
            for j in range(i_start + lo, i_start + pos):
                tail = append(tail, toks[j])
            base = i64(len(tail))
            if pos >= 2:
                tail = draft_core(tail, pos, n_draft, NGRAM_MIN, NGRAM_MAX, ctx, dyn, st)
            obs: i64 = -1  # what the policy observes: the accepted count, or branch 0's share of it
            if branches > 1:
                tree = state._tree_step(tail, base, n_draft, own, st, branches)
                n_drafted += tree_nodes(tree)
                tail, obs = tree_path(tree, toks, i_start + pos, n_ctx - pos, tail, base)
                nd = i64(len(tail)) - base
            else:
                tail = state._suffix(tail, base, n_draft, own, st)
                nd = i64(len(tail)) - base
                n_drafted += nd
            acc: i64 = 0
            while acc < nd and pos < n_ctx:
                if toks[i_start + pos] != tail[base + acc]:
                    break
                n_accept += 1
                acc += 1
                pos += 1
                ctx._update_at(toks, i_start, pos, 1, NGRAM_MIN, NGRAM_MAX)
                state._push_token(toks[i_start + pos - 1])
            if obs < 0:
                obs = acc
            state._observe(obs)
            if pos < n_ctx:
                pos += 1
                ctx._update_at(toks, i_start, pos, 1, NGRAM_MIN, NGRAM_MAX)
                state._push_token(toks[i_start + pos - 1])
        t_draft += time.perf_counter() - t0
        dyn._merge_native(ctx)
        ctx._clear_keep()
        i_start += n_ctx
        if progress is not None:
            progress(int(min(i_start, total)), int(total))
    return n_drafted, n_accept, n_steps, t_draft


# --- the public replay (here, not in _core: it runs both policies, and _hybrid builds on _core) ---


def replay(
    tokens: Sequence[int],
    n_ctx: int = 4096,
    n_draft: int = 8,
    nc_static: object = None,
    nc_dynamic: NgramCache | None = None,
    progress: Callable[[int, int], None] | None = None,
    policy: str = "llama",
    history: object = None,
    branches: int = 1,
) -> ReplayResult:
    """Replay ``tokens`` as llama-lookup-stats does and return the counts and timings.

    ``policy`` is ``"llama"`` (llama.cpp's rule, exact) or ``"hybrid"`` (llama.cpp's drafts,
    then a suffix match over the chunks replayed so far: ``lookupdec.fast._hybrid``);
    ``history`` is the hybrid policy's ``SuffixHistory`` (a fresh one if None; kept and
    grown when given, like ``nc_dynamic``). ``branches`` > 1 (hybrid only) replays tree drafts
    (:meth:`HybridState.propose_tree`): a step accepts the longest prefix any branch shares with
    the text, and ``n_drafted`` counts the trees' distinct nodes.

    The tokens are cut into chunks of ``n_ctx`` while ``i_start + n_ctx < len(tokens)``
    (so a last chunk that ends exactly at the end is dropped too, as in llama.cpp).
    Each chunk starts with an empty context cache; after a chunk the context cache is
    merged into the dynamic one, which therefore grows through the run. ``nc_dynamic``
    is modified in place when given and must be a fast NgramCache (TypeError otherwise).
    ``nc_static`` is a fast NgramCache, a StaticIndex, None, or any object with the
    reference's ``part(key)`` (looked up through Python calls).
    """
    if n_ctx < 1:
        raise ValueError(f"n_ctx must be >= 1, got {n_ctx}")
    if n_draft < 0:
        raise ValueError(f"n_draft must be >= 0, got {n_draft}")
    check_policy(policy)
    check_branches(branches, policy)
    st = require_static_source(nc_static)
    dyn = require_cache(nc_dynamic, "nc_dynamic") if nc_dynamic is not None else NgramCache()
    total = len(tokens)
    n_chunks = max(0, (total - 1) // n_ctx) if total > n_ctx else 0
    # Only the chunks' tokens are ever read (and range-checked, as the reference's updates do).
    used = n_chunks * n_ctx if n_ctx >= 2 else 0
    toks = to_vec(tokens[:used] if used < total else tokens)
    if policy == "hybrid":
        if history is None:
            history = SuffixHistory()
        if not isinstance(history, SuffixHistory):
            raise TypeError(f"history must be a fast SuffixHistory, not {type(history).__name__}")
        state = HybridState(history)
        n_drafted, n_accept, n_steps, t_draft = replay_hybrid_core(
            toks, n_ctx, n_draft, st, dyn, state, progress, total, branches
        )
    else:
        n_drafted, n_accept, n_steps, t_draft = replay_core(toks, n_ctx, n_draft, st, dyn, progress, total)
    return ReplayResult(
        n_ctx=n_ctx,
        n_draft=n_draft,
        n_tokens=total,
        n_predict=total - total % n_ctx,
        n_drafted=int(n_drafted),
        n_accept=int(n_accept),
        t_draft_s=t_draft,
        n_steps=int(n_steps),
        policy=policy,
        branches=branches,
    )
