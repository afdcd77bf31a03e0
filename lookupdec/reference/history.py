"""The token history the hybrid policy matches against, readable model (fast: ``_history``).

A :class:`SuffixHistory` is the stream of every request's tokens, each request after a
separator (:data:`SEP`), indexed by bigram, trigram and single token so that
:meth:`SuffixHistory.candidates` finds the earlier occurrences of a query's suffix newest
first. It keeps at most ``max_tokens`` tokens: when it is full, the older half is dropped and
the index rebuilt over the rest. A corpus (:meth:`SuffixHistory.add_corpus`) is held apart:
older than every request (its occurrences come after theirs), never evicted, closed at both
ends (no match or continuation crosses them); its positions are numbered from
:data:`CORPUS_BASE`. :mod:`lookupdec.reference.hybrid` drafts from it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

SEP = -1
"""Separator written before every request in the history stream (never matched)."""
CORPUS_BASE = 1 << 40
"""Positions at or above this are the corpus's: its ids' positions plus this."""
OWN_BASE = 1 << 42
"""Positions at or above this are a detached request's own (its request history's positions plus
this; see :meth:`lookupdec.reference.hybrid.HybridState.propose_detached`)."""
OWN_MAX_TOKENS = 1 << 30
"""Bound of a request history: one request's tokens, never evicted."""
DEFAULT_MAX_TOKENS = 1 << 22
"""Default bound of a :class:`SuffixHistory` (4,194,304 tokens)."""
MAX_CANDIDATES = 32
"""How many earlier occurrences of the last bigram are compared, newest first."""
UNIGRAM_CANDIDATES = 64
"""If the last bigram never occurred: how many of the last token's occurrences vote, newest first."""
DEEP_CANDIDATES = 32
"""When the last bigram has at least ``max_candidates`` occurrences: how many older occurrences of
the last trigram are compared too."""
MAX_MATCH = 64
"""Matches are measured up to this many tokens (longer ones count as this long). 64, as deep as
SuffixDecoding's tree (32 until 2026-12-06): where an edited file is copied, two occurrences can
both agree 32 tokens back, and how much further back each agrees tells the span being copied. On the
input-grounded pairs at the fixed threshold 0.33, k = 32 (``perf grounded --match-waste``):
18.2073 tokens per step at 1.288 wasted, against 18.0145 at 1.312 with 32; the longer matches'
choice of span alone (the copy floor, ``copy_floor``, given the match length capped at 32 as
before) made 18.1521 at 1.247. The replays moved by at most 0.04 %."""


class SuffixHistory:
    """The token history the hybrid policy matches against: earlier requests and the current one.

    Holds at most ``max_tokens`` tokens; when full, the older half is evicted.
    """

    def __init__(self, max_tokens: int = DEFAULT_MAX_TOKENS) -> None:
        if max_tokens < 16:
            raise ValueError(f"max_tokens must be >= 16, got {max_tokens}")
        self.max_tokens = max_tokens
        self.n_evictions = 0
        self.req_start = 0  # where the latest request starts (after its separator)
        self.corpus: list[int] | None = None
        # the corpus's positions (ids indices) by bigram, by trigram and by the token before, as
        # positions, positions3 and after hold the requests' (oldest first)
        self.corpus_positions: dict[tuple[int, int], list[int]] = {}
        self.corpus_positions3: dict[tuple[int, int, int], list[int]] = {}
        self.corpus_after: dict[int, list[int]] = {}
        self._reset()

    def _reset(self) -> None:
        self.toks: list[int] = []
        # bigram -> its indexed positions p (toks[p-2], toks[p-1] == bigram), oldest first
        self.positions: dict[tuple[int, int], list[int]] = {}
        # trigram -> its indexed positions p (toks[p-3:p] == trigram), oldest first
        self.positions3: dict[tuple[int, int, int], list[int]] = {}
        # token -> the positions p with toks[p-1] == token (and toks[p] a token), oldest first
        self.after: dict[int, list[int]] = {}

    def corpus_tokens(self) -> int:
        """Number of the corpus's ids (separators between its documents included; 0 without a corpus)."""
        return len(self.corpus) if self.corpus is not None else 0

    def __len__(self) -> int:
        """Number of tokens (and separators) held: the corpus's (and a separator before it), then the requests'."""
        return len(self.tokens())

    def tokens(self) -> list[int]:
        """The stream held, separators as -1: with a corpus, -1 and its ids first, then the requests'."""
        head = [] if self.corpus is None else [SEP, *self.corpus]
        return head + self.toks

    def token_at(self, p: int) -> int:
        """The token at position ``p`` of the stream or (from :data:`CORPUS_BASE`) the corpus; -1 past the end."""
        if p >= CORPUS_BASE:
            ids = self.corpus or []
            return ids[p - CORPUS_BASE] if p - CORPUS_BASE < len(ids) else SEP
        return self.toks[p] if p < len(self.toks) else SEP

    def _index_last(self) -> None:
        toks = self.toks
        p = len(toks) - 1
        if p < 2:
            return
        a, b, c = toks[p - 2], toks[p - 1], toks[p]
        if SEP not in (a, b, c):
            self.positions.setdefault((a, b), []).append(p)
            if p >= 3 and toks[p - 3] != SEP:
                self.positions3.setdefault((toks[p - 3], a, b), []).append(p)
        if b != SEP and c != SEP:
            self.after.setdefault(b, []).append(p)

    def push(self, token: int) -> None:
        """Append one token (or :data:`SEP`), evicting the older half first when full."""
        if len(self.toks) >= self.max_tokens:
            start = len(self.toks) - self.max_tokens // 2
            kept = self.toks[start:]
            self._reset()
            self.n_evictions += 1
            self.req_start = max(self.req_start - start, 0)
            for t in kept:
                self.toks.append(t)
                self._index_last()
        self.toks.append(token)
        self._index_last()

    def add_separator(self) -> None:
        """Start a new request: matches never cross this point."""
        self.push(SEP)
        self.req_start = len(self.toks)

    def add_corpus(self, corpus: Sequence[int] | str | os.PathLike[str]) -> None:
        """Add a corpus: token ids (-1 between documents) or the path of a corpus file (its ids are read).

        Its occurrences are older than every request's, it is never evicted (``max_tokens``
        bounds the requests' tokens) and no match crosses its ends. A history holds one corpus.
        """
        if self.corpus is not None:
            raise ValueError("this history already holds a corpus")
        if isinstance(corpus, (str, os.PathLike)):
            from lookupdec.formats.corpus import read_corpus_ids

            ids = read_corpus_ids(corpus)
        else:
            ids = [int(t) for t in corpus]
            bad = next((t for t in ids if t < SEP), None)
            if bad is not None:
                raise ValueError(f"corpus token {bad} is negative (only -1, between documents)")
        self.corpus = ids
        for i in range(1, len(ids)):  # as _index_last indexes the requests' positions
            a, b, c = ids[i - 2] if i >= 2 else SEP, ids[i - 1], ids[i]
            if SEP not in (a, b, c):
                self.corpus_positions.setdefault((a, b), []).append(CORPUS_BASE + i)
                if i >= 3 and ids[i - 3] != SEP:
                    self.corpus_positions3.setdefault((ids[i - 3], a, b), []).append(CORPUS_BASE + i)
            if b != SEP and c != SEP:
                self.corpus_after.setdefault(b, []).append(CORPUS_BASE + i)

    @staticmethod
    def _age(p: int) -> tuple[int, int]:
        """Sorts positions oldest first: the corpus's (from :data:`CORPUS_BASE`) before the requests'."""
        return (0, p) if p >= CORPUS_BASE else (1, p)

    @staticmethod
    def _newest_first(requests: list[int], corpus: list[int]) -> list[int]:
        """Occurrences in the requests and in the corpus (each oldest first), newest first."""
        return [*reversed(requests), *reversed(corpus)]

    def extend(self, tokens: Sequence[int]) -> None:
        """Append tokens of the current request."""
        for t in tokens:
            self.push(int(t))

    def query_token(self, drafted: Sequence[int], j: int, request: Sequence[int] | None = None) -> int:
        """The query's token ``j`` places before its end (:data:`SEP` before its start); see :meth:`candidates`."""
        if j < len(drafted):
            return drafted[len(drafted) - 1 - j]
        if request is not None:
            i = len(request) - 1 - (j - len(drafted))
            return request[i] if i >= 0 else SEP
        p = len(self.toks) - 1 - (j - len(drafted))
        return self.toks[p] if p >= 0 else SEP

    def candidates(
        self, drafted: Sequence[int], max_candidates: int = MAX_CANDIDATES, request: Sequence[int] | None = None
    ) -> list[tuple[int, int]]:
        """Earlier occurrences of the query's suffix as (position, match length), newest first.

        The query is the stream followed by ``drafted``; an occurrence's continuation starts at
        its position. With ``request`` (a request not in the stream: its tokens so far), the
        query is ``request`` followed by ``drafted``, and it starts after a separator. Up to
        ``max_candidates`` occurrences of the last two tokens, each measured backwards (at most
        :data:`MAX_MATCH`, never across a separator); when there were that many, then up to
        :data:`DEEP_CANDIDATES` older occurrences of the last three tokens, newest first. If the
        last two tokens never occurred, up to :data:`UNIGRAM_CANDIDATES` newest occurrences of
        the last token alone, with length 1. "Newest first" puts the corpus's occurrences after
        every request's (the corpus is the oldest part, as if it were the first request). The
        corpus's occurrences of the last two tokens count only where the requests have them too
        or never had the last token (else the one-token fallback follows the requests' own).
        """

        def query(j: int) -> int:
            return self.query_token(drafted, j, request)

        def measure(p: int, length: int) -> tuple[int, int]:
            start = CORPUS_BASE if p >= CORPUS_BASE else 0  # where p's part begins
            while length < MAX_MATCH:
                at = p - 1 - length
                t = self.token_at(at) if at >= start else SEP
                if t == SEP or t != query(length):
                    break
                length += 1
            return p, length

        last, before = query(0), query(1)
        if last == SEP:
            return []
        # Newest first: the requests' occurrences, then the corpus's (older than every request).
        bigram = (before, last)
        mine = self.positions.get(bigram, [])
        # The corpus's occurrences of the bigram join only where the requests have the bigram too,
        # or have never had its last token: where the requests know the token but not the
        # bigram, their occurrences of the token (the one-token fallback below) predict better
        # than a corpus that may be of another kind of text.
        theirs = self.corpus_positions.get(bigram, []) if mine or last not in self.after else []
        ordered = self._newest_first(mine, theirs)
        if before != SEP and ordered:
            newest = ordered[:max_candidates]
            found = [measure(p, 2) for p in newest]
            third = query(2)
            if len(found) >= max_candidates and third != SEP:
                trigram = (third, before, last)
                ordered3 = self._newest_first(self.positions3.get(trigram, []), self.corpus_positions3.get(trigram, []))
                oldest = self._age(newest[-1])
                older = [p for p in ordered3 if self._age(p) < oldest]
                found += [measure(p, 3) for p in older[:DEEP_CANDIDATES]]
            return found
        ordered = self._newest_first(self.after.get(last, []), self.corpus_after.get(last, []))
        if ordered:
            return [(p, 1) for p in ordered[:UNIGRAM_CANDIDATES]]
        return []


__all__ = ["CORPUS_BASE", "DEFAULT_MAX_TOKENS", "MAX_MATCH", "OWN_BASE", "OWN_MAX_TOKENS", "SEP", "SuffixHistory"]
