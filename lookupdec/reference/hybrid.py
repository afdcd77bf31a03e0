"""The hybrid drafting policy, readable model (the fast path's ``_hybrid`` gives identical drafts).

llama.cpp's rule drafts only when its caches are confident, and stays silent on most steps.
The hybrid policy keeps every token llama.cpp's rule drafts and, where that draft stops
short of ``n_draft`` (or is empty), continues it with a *suffix match*:

1. The query is the request so far followed by the tokens drafted so far. Its last two tokens
   (a bigram) are looked up in the :class:`SuffixHistory`: the token stream of the earlier
   requests and of the current one. Up to :data:`MAX_CANDIDATES` earlier occurrences are
   compared, newest first, and each is extended backwards while it agrees with the query (up
   to :data:`MAX_MATCH` tokens, never across a request boundary). The longest wins; among
   equally long ones the newest. If the bigram never occurred, the newest occurrence of the
   last token alone is used (a match of length 1).
2. The tokens that followed the match in the history are drafted one by one, while the
   estimated probability that the token is reached *and* accepted stays at or above
   :data:`THRESHOLD`. That probability is a running product: the chance that a llama.cpp draft
   of this length is accepted whole (when there is one), times, for each suffix token, the
   acceptance rate seen so far for suffix tokens at this offset after a match of this
   length. Rates are counted per (match length 1..16, offset 0..15) with a Laplace prior
   ``(ok + 1) / (tried + 2)`` and halved when ``tried`` reaches :data:`DECAY_AT`, so
   long matches draft long and the length follows the acceptance actually seen.

Everything is integer counting plus one float product in a fixed order: deterministic, and
the fast path computes the same floats.

Memory: the history keeps at most ``max_tokens`` tokens (separators included); when it is
full, the older half is dropped and the index rebuilt over the rest.
"""

from __future__ import annotations

from collections.abc import Sequence

from lookupdec.reference.cache import NGRAM_MAX, NGRAM_MIN, NgramCache
from lookupdec.reference.draft import PartSource, draft

SEP = -1
"""Separator written before every request in the history stream (never matched)."""
DEFAULT_MAX_TOKENS = 1 << 22
"""Default bound of a :class:`SuffixHistory` (4,194,304 tokens)."""
MAX_CANDIDATES = 48
"""How many earlier occurrences of the last bigram are compared, newest first."""
MAX_MATCH = 32
"""Matches are measured up to this many tokens (longer ones count as this long)."""
N_BUCKETS = 17
"""Acceptance statistics per match length 1..16 (16 = "16 or more") ..."""
N_OFFSETS = 16
"""... and per offset 0..15 into the suffix part of the draft (15 = "15 or later")."""
N_LLAMA = 17
"""Whole-acceptance statistics per llama draft length 1..16 (16 = "16 or more")."""
THRESHOLD = 0.22
"""Draft a suffix token only while its estimated chance to be reached and accepted is at least this."""
PRIOR_OK = 1.0
PRIOR_TRIED = 2.0
"""Laplace prior of every estimate: (ok + 1) / (tried + 2)."""
DECAY_AT = 1 << 14
"""Counts of a statistic are halved (integer division) when its ``tried`` reaches this."""
POLICIES = ("llama", "hybrid")
"""The drafting policies: llama.cpp's rule (the default, exact) and the hybrid policy."""


def check_policy(policy: str) -> None:
    """Raise ValueError unless ``policy`` is one of :data:`POLICIES`."""
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}: choose 'llama' or 'hybrid'")


class SuffixHistory:
    """The token history the hybrid policy matches against: earlier requests and the current one.

    Holds at most ``max_tokens`` tokens; when full, the older half is evicted.
    """

    def __init__(self, max_tokens: int = DEFAULT_MAX_TOKENS) -> None:
        if max_tokens < 16:
            raise ValueError(f"max_tokens must be >= 16, got {max_tokens}")
        self.max_tokens = max_tokens
        self.n_evictions = 0
        self._reset()

    def _reset(self) -> None:
        self.toks: list[int] = []
        # bigram -> its indexed positions p (toks[p-2], toks[p-1] == bigram), oldest first
        self.positions: dict[tuple[int, int], list[int]] = {}
        # token -> the newest indexed position p with toks[p-1] == token
        self.last_after: dict[int, int] = {}

    def __len__(self) -> int:
        """Number of tokens (and separators) held."""
        return len(self.toks)

    def tokens(self) -> list[int]:
        """The stream held, separators as -1."""
        return list(self.toks)

    def _index_last(self) -> None:
        toks = self.toks
        p = len(toks) - 1
        if p < 2:
            return
        a, b, c = toks[p - 2], toks[p - 1], toks[p]
        if SEP not in (a, b, c):
            self.positions.setdefault((a, b), []).append(p)
        if b != SEP and c != SEP:
            self.last_after[b] = p

    def push(self, token: int) -> None:
        """Append one token (or :data:`SEP`), evicting the older half first when full."""
        if len(self.toks) >= self.max_tokens:
            kept = self.toks[len(self.toks) - self.max_tokens // 2 :]
            self._reset()
            self.n_evictions += 1
            for t in kept:
                self.toks.append(t)
                self._index_last()
        self.toks.append(token)
        self._index_last()

    def add_separator(self) -> None:
        """Start a new request: matches never cross this point."""
        self.push(SEP)

    def extend(self, tokens: Sequence[int]) -> None:
        """Append tokens of the current request."""
        for t in tokens:
            self.push(int(t))

    def match(self, drafted: Sequence[int]) -> tuple[int, int]:
        """(position, length) of the best earlier occurrence of the query's suffix, (-1, 0) if none.

        The query is the stream followed by ``drafted``; the continuation starts at the position.
        """
        def query(j: int) -> int:  # the query token j places before its end
            if j < len(drafted):
                return drafted[len(drafted) - 1 - j]
            p = len(self.toks) - 1 - (j - len(drafted))
            return self.toks[p] if p >= 0 else SEP

        last, before = query(0), query(1)
        if last == SEP:
            return -1, 0
        if before != SEP and (before, last) in self.positions:
            best_p, best_len = -1, 0
            for p in reversed(self.positions[(before, last)][-MAX_CANDIDATES:]):
                length = 2
                while length < MAX_MATCH:
                    at = p - 1 - length
                    if at < 0 or self.toks[at] == SEP or self.toks[at] != query(length):
                        break
                    length += 1
                if length > best_len:
                    best_p, best_len = p, length
                    if length >= MAX_MATCH:
                        break
            return best_p, best_len
        if last in self.last_after:
            return self.last_after[last], 1
        return -1, 0


def _estimate(ok: int, tried: int) -> float:
    return (float(ok) + PRIOR_OK) / (float(tried) + PRIOR_TRIED)


class HybridState:
    """Per-drafter state of the hybrid policy: a :class:`SuffixHistory` and acceptance statistics.

    Per request: :meth:`begin_request`, then per verification step :meth:`propose` and, once
    the engine verified the proposal, :meth:`observe`. ``tokens`` given to :meth:`propose` is
    the whole request so far and only grows; tokens not seen yet join the history first.
    """

    def __init__(self, history: SuffixHistory | None = None, threshold: float = THRESHOLD) -> None:
        self.history = history if history is not None else SuffixHistory()
        self.threshold = threshold
        self.tried = [[0] * N_OFFSETS for _ in range(N_BUCKETS)]
        self.ok = [[0] * N_OFFSETS for _ in range(N_BUCKETS)]
        self.l_tried = [0] * N_LLAMA
        self.l_ok = [0] * N_LLAMA
        self.seen = 0
        self.last_llama = 0
        self.last_suffix = 0
        self.last_bucket = 0

    def begin_request(self) -> None:
        """Start a new request (the previous one stays in the history)."""
        self.history.add_separator()
        self.seen = 0
        self.last_llama = self.last_suffix = 0

    def _sync(self, tokens: Sequence[int]) -> None:
        if len(tokens) < self.seen:
            raise ValueError(
                f"tokens has {len(tokens)} tokens but the request already had {self.seen}: "
                "call begin_request() before a new request"
            )
        self.history.extend(tokens[self.seen :])
        self.seen = len(tokens)

    def extend_draft(self, drafted: list[int], n_draft: int) -> None:
        """Append suffix-match tokens to ``drafted`` (llama.cpp's draft for the current history)."""
        m = len(drafted)
        self.last_llama, self.last_suffix = m, 0
        if m >= n_draft:
            return
        p, length = self.history.match(drafted)
        if p < 0:
            return
        bucket = min(length, N_BUCKETS - 1)
        self.last_bucket = bucket
        prob = 1.0
        if m > 0:
            li = min(m, N_LLAMA - 1)
            prob = _estimate(self.l_ok[li], self.l_tried[li])
        toks = self.history.toks
        k = 0
        while m + k < n_draft and p + k < len(toks) and toks[p + k] != SEP:
            off = min(k, N_OFFSETS - 1)
            prob = prob * _estimate(self.ok[bucket][off], self.tried[bucket][off])
            if prob < self.threshold:
                break
            drafted.append(toks[p + k])
            k += 1
        self.last_suffix = k

    def propose(
        self,
        tokens: Sequence[int],
        n_draft: int,
        nc_context: PartSource,
        nc_dynamic: PartSource,
        nc_static: PartSource | None = None,
    ) -> list[int]:
        """Up to ``n_draft`` tokens to verify after ``tokens`` (the whole request so far)."""
        if n_draft < 0:
            raise ValueError(f"n_draft must be >= 0, got {n_draft}")
        self._sync(tokens)
        drafted = [tokens[-1]] if tokens else [0]
        draft(tokens, drafted, n_draft, NGRAM_MIN, NGRAM_MAX, nc_context, nc_dynamic, nc_static or NgramCache())
        out = drafted[1:]
        if tokens:
            self.extend_draft(out, n_draft)
        else:
            self.last_llama = self.last_suffix = 0
        return out

    def observe(self, n_accepted: int, committed: Sequence[int] = ()) -> None:
        """Record that the first ``n_accepted`` tokens of the last proposal were accepted.

        ``committed`` (optional): the tokens the request grew by; or pass them with the next propose.
        """
        if n_accepted < 0:
            raise ValueError(f"n_accepted must be >= 0, got {n_accepted}")
        m, s = self.last_llama, self.last_suffix
        if m > 0:
            li = min(m, N_LLAMA - 1)
            self.l_tried[li] += 1
            if n_accepted >= m:
                self.l_ok[li] += 1
            if self.l_tried[li] >= DECAY_AT:
                self.l_tried[li] //= 2
                self.l_ok[li] //= 2
        if s > 0 and n_accepted >= m:
            acc = n_accepted - m
            tried, ok = self.tried[self.last_bucket], self.ok[self.last_bucket]
            for k in range(min(s, acc + 1)):  # offsets reached: all accepted ones and the first miss
                off = min(k, N_OFFSETS - 1)
                tried[off] += 1
                if k < acc:
                    ok[off] += 1
                if tried[off] >= DECAY_AT:
                    tried[off] //= 2
                    ok[off] //= 2
        self.last_llama = self.last_suffix = 0
        if committed:
            self.history.extend(committed)
            self.seen += len(committed)


def hybrid_chunk_step(
    state: HybridState,
    out: list[int],
    n_draft: int,
    context: NgramCache,
    dynamic: NgramCache,
    static: PartSource,
) -> list[int]:
    """One replay step's proposal: llama.cpp's draft after ``out`` (if ``len(out) >= 2``), then the suffix part."""
    drafted = [out[-1]]
    draft(out, drafted, n_draft, NGRAM_MIN, NGRAM_MAX, context, dynamic, static)
    proposal = drafted[1:]
    state.extend_draft(proposal, n_draft)
    return proposal


__all__ = [
    "DEFAULT_MAX_TOKENS",
    "POLICIES",
    "HybridState",
    "SuffixHistory",
    "check_policy",
]
