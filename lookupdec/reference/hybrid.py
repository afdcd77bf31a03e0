"""The hybrid drafting policy, readable model (the fast path's ``_hybrid`` gives identical drafts).

llama.cpp's rule drafts only when its caches are confident, and stays silent on most steps.
The hybrid policy keeps llama.cpp's draft (trimmed where the running estimate below says its
tokens are unlikely to be accepted: per (confirmed, draft length, position) acceptance counts)
and, where it stops short of ``n_draft`` (or is empty), continues it with a *suffix match*
(steps 1 and 2). When llama.cpp drafted, the suffix match of the request alone (the
*suffix-only draft*) is made first: the llama.cpp tokens it agrees with, from the first on,
are *confirmed*; where the two first disagree (at any position), the suffix-only draft
replaces llama.cpp's if its token there has a higher estimate (the copy floor included, as its
draft estimated it) than an unconfirmed token at that position of a llama.cpp draft of this
length.

1. The query is the request so far followed by the tokens drafted so far. Its last two tokens
   (a bigram) are looked up in the :class:`SuffixHistory`: the token stream of the earlier
   requests and of the current one. Up to :data:`MAX_CANDIDATES` earlier occurrences are
   taken, newest first, and each is extended backwards while it agrees with the query (up
   to :data:`MAX_MATCH` tokens, never across a request boundary). The occurrences with the
   longest match, and those at most :data:`MATCH_SLACK` shorter, are followed (so a
   continuation several slightly shorter matches agree on outvotes a single longest one; the
   match length of the statistics below is the longest). When the bigram has that many
   occurrences (a common bigram: the newest ones are a small sample of it), up to
   :data:`DEEP_CANDIDATES` older occurrences of the last *three* tokens are measured too, so a
   longer match further back is found. If the bigram never occurred, up to
   :data:`UNIGRAM_CANDIDATES` newest occurrences of the last token alone are followed (a match
   of length 1; their votes, weighed by age, pick the follower most of the recent ones agree
   on, not merely the newest one's).
2. Token by token, the draft takes the continuation with the heaviest vote among the followed
   occurrences, each weighed by its age (:func:`vote_weight`: recent ones weigh more, how much
   more learned from the text, see :meth:`HybridState.exponent`; on a tie, the continuation
   more of them follow, then the newest occurrence's; where the static index counts some of the
   tokens voted for after the two tokens before, they share a quarter of the vote's weight by
   those counts, :func:`static_vote`), and keeps following only the occurrences that agree. It
   stops when the estimated probability that the token is reached *and* accepted falls below
   :data:`THRESHOLD`. That probability is a running product: the chance that a
   llama.cpp draft of this length is accepted whole (when there is one), times, for each
   suffix token, the acceptance rate seen so far for suffix tokens of the same kind. The
   kind is (support class, share class, source, effective match length): the support class
   says whether the token had one occurrence behind it, won a tie, was unanimous among several,
   had a majority or only a plurality, and how many occurrences that was (:func:`support_class`);
   the share class how much of a contested vote's weight the token held (:func:`share_class`);
   the source where the newest occurrence behind it is: an earlier request, the current
   request (after the history's last separator) or the corpus (:func:`source_class`); the
   effective match length is the match length plus the
   offset into the suffix part (a token drafted after ``k`` accepted ones extends the match
   by ``k``), capped at 32. Kinds are also split by the *static class* of the
   token (how the static index supports it after the two tokens before it:
   :func:`static_class`) and by whether the suffix tokens follow llama.cpp's kept tokens (or
   none: kind 0) or form the suffix-only draft (kind 1). Rates are ``(ok + 1) / (tried + 2)`` (Laplace prior);
   both counts are halved when ``tried`` reaches :data:`DECAY_AT`, so recent steps weigh
   more. Long, unanimous matches therefore draft long, and a kind of token that keeps
   failing stops being drafted beyond its first position.

3. The threshold starts at :data:`THRESHOLD` and is steered after every :meth:`HybridState.observe`
   so that the rejected drafted tokens average ``target_waste`` per step over the run (see
   :data:`TARGET_WASTE`, :data:`THRESHOLD_STEP`, :data:`BALANCE_CAP`): slowly, and by the
   balance of about the last 1,000 steps plus an eighth of the run's (:data:`RECENT_SHIFT`,
   :data:`RUN_SHIFT`), because a steady threshold gains more per wasted token than a swinging one.
   Once, after the first :data:`CALIBRATE_AT` steps, it is *calibrated*: where those steps
   wasted more than the target (by a tenth), it rises at once to the threshold at which their own
   estimates say they would have met it (:meth:`HybridState.observe`).

Everything is integer counting plus floats in a fixed order (the running product, and the static
index's share in a vote): deterministic, and the fast path computes the same floats.

The history the policy matches against is :class:`~lookupdec.reference.history.SuffixHistory`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from lookupdec.reference.cache import NGRAM_MAX, NGRAM_MIN, TOKEN_NULL, NgramCache
from lookupdec.reference.draft import PartSource, draft, try_static
from lookupdec.reference.history import (
    CORPUS_BASE,
    MAX_CANDIDATES,
    MAX_MATCH,
    OWN_BASE,
    OWN_MAX_TOKENS,
    SEP,
    SuffixHistory,
)
from lookupdec.rules import check_branches, check_target_waste

MATCH_SLACK = 1
"""Occurrences whose match is at most this much shorter than the longest are followed too (they vote)."""
N_LEN = 33
"""Acceptance statistics per effective match length 1..32 (match length + offset into the suffix part) ..."""
N_CLASS = 9
"""... per support class of the drafted token (see :func:`support_class`) ..."""
N_SHARE = 6
"""... per share class of its vote (see :func:`share_class`) ..."""
N_CUR = 3
"""... per where the newest followed occurrence with that token is (see :func:`source_class`) ..."""
N_STATIC = 6
"""... per static class of the drafted token (see :func:`static_class`) ..."""
N_KIND = 2
"""... and per kind of suffix draft: 0 after llama.cpp's kept tokens (or none), 1 in place of its draft."""
N_LLAMA = 17
"""Acceptance statistics of llama.cpp's tokens per draft length 1..16 (16 = "16 or more") ..."""
N_LLAMA_POS = 16
"""... and position 0..15 in it (15 = "15 or later")."""
THRESHOLD = 0.015
"""Initial threshold: draft a token only while its estimated chance to be reached and accepted is at least this."""
TARGET_WASTE = 1.9
"""Wasted drafted tokens per step the threshold is steered to (0 keeps it fixed)."""
THRESHOLD_STEP = 1.0001
"""Factor the threshold moves by after every observed step (slowly: a steady threshold wastes less for
what it gains than a swinging one)."""
RECENT_SHIFT = 10
"""The recent waste balance forgets 1/2^10 of itself every step: it sums about the last 1,000 steps."""
RUN_SHIFT = 3
"""The whole run's balance weighs 1/2^3 against the recent one in the threshold's direction."""
THRESHOLD_MIN = 0.002
THRESHOLD_MAX = 0.5
"""Bounds of the steered threshold."""
BALANCE_CAP = 100_000_000
"""The run's waste balance is kept within +-10,000,000 tokens (in tenths): the whole run's budget."""
VOTE_SCALE = 1 << 29
"""An occurrence's vote weighs ``VOTE_SCALE // (b + 1) ** e``, ``b`` the bit length of its age and
``e`` one of :data:`EXPONENTS` (see :func:`vote_weight`)."""
EXPONENTS = (2, 3, 4, 6)
"""The exponents the age weights may fall with: 2 gently (WikiText's best), 6 steeply (the newest
occurrence outvotes all but many older ones: code's best). The state learns which one to use
(see :meth:`HybridState.exponent`)."""
SCORE_GRID = 8
"""The exponents are scored at every 8th token of a request (see :meth:`HybridState.exponent`) ..."""
SCORE_LEN = 8
"""... on drafts of up to 8 tokens."""
EXPONENT_MARGIN = 16
EXPONENT_LEAD = 64
"""Another exponent replaces the first only when its score is more than 1/16 above the first's,
plus 64 (tokens): early on, a few lucky drafts do not switch it."""
EXPONENT_DECAY_AT = 1 << 16
"""The exponents' scores are halved (integer division) when one of them reaches this."""
MAX_CANDIDATES_LIMIT = 1024
"""The largest ``max_candidates``: the fast path packs a vote's count and its first candidate's rank
into 12 bits each (a detached request follows up to twice ``max_candidates`` + 32 occurrences)."""
SHORTER_SHIFT = 2
"""The vote of an occurrence whose match is shorter than the longest (followed through
:data:`MATCH_SLACK`) is its age's weight >> 2: a quarter."""
CORPUS_AGE = 1 << 24
"""The age a corpus occurrence votes with: older than every request's (at most
:data:`~lookupdec.reference.history.DEFAULT_MAX_TOKENS` tokens back by default)."""
STATIC_VOTE_DIV = 4
"""The static index's counts add to a contested vote a quarter of its total weight, shared among
the tokens by their counts (see :func:`static_vote`)."""
SHARE_BINS = (0.4, 0.6, 0.8, 0.95)
"""The bounds of a contested vote's share classes: the winner holds less than 40 % of the vote's
weight, 40-60 %, 60-80 %, 80-95 % or more (see :func:`share_class`)."""
PRIOR_OK = 1.0
PRIOR_TRIED = 2.0
"""Laplace prior of every estimate: (ok + 1) / (tried + 2)."""
COPY_MIN = 16
"""From this match length on (the match plus the tokens drafted after it), a token every followed
occurrence agrees on is estimated at least at the rule of succession on the copy (see :func:`copy_floor`)."""
CALIBRATE_AT = 1024
"""The threshold is calibrated once, after this many observed steps (see :meth:`HybridState.observe`)."""
CALIBRATE_MARGIN = 11
"""It is raised at calibration only where those steps wasted more than ``CALIBRATE_MARGIN / 10``
times the target."""
CALIBRATE_GRID = 1.02
"""Calibration raises the threshold by steps of this factor until the steps' waste would have met the target."""
DECAY_AT = 1 << 14
"""Counts of a statistic are halved (integer division) when its ``tried`` reaches this."""
TOKEN_SLOTS = 1 << 17
"""The token factors' slots per table (see :meth:`HybridState._by_token`): a token's slot is its
id modulo this (ids & (TOKEN_SLOTS - 1)), so every id of a vocabulary of up to 131,072 tokens has
its own, and larger vocabularies share some."""
TOKEN_ONE = 1 << 10
"""The token factors count in 1/1024 of a token: integers, the same in both implementations."""
TOKEN_PRIOR = 2 * TOKEN_ONE
"""A token factor is (accepted + 2) / (expected + 2) tokens: 1 for a token not seen yet."""
TOKEN_DECAY_AT = 64 * TOKEN_ONE
"""A token factor's counts are halved (integer division) when its expected count reaches 64 tokens."""
TOKEN_CAP = 0.999
"""An estimate with its token factors is at most this."""
Cell = tuple[int, int, int, int, int, int]
"""A suffix token's statistic: (kind, static class, support class, source, effective match length,
share class)."""
LlamaCell = tuple[bool, int, int]
"""A llama.cpp token's statistic: (confirmed, its draft's length, position)."""
Step = tuple[int, int, int, list[Cell], int, list[float], list[int]]
"""A proposal's bookkeeping (see :meth:`HybridState.last_step`)."""


def support_class(count: int, n_active: int) -> int:
    """How well the ``n_active`` candidates support a drafted token that ``count`` of them follow:
    0 a single candidate, 1 one of several (the newest wins a tie), all of 2 / 3-5 / >= 6 (2, 3,
    4), at least half with ``count`` <= 3 / >= 4 (5, 6), fewer than half with ``count`` >= 4 /
    2-3 (7, 8)."""
    if n_active == 1:
        return 0
    if count == 1:
        return 1
    if count == n_active:
        return 2 if n_active == 2 else (3 if n_active <= 5 else 4)
    if 2 * count >= n_active:
        return 5 if count <= 3 else 6
    return 7 if count >= 4 else 8


def share_class(winner: float, total: float, contested: bool) -> int:
    """How much of a vote the winner holds: 0 the vote is not contested (one token has votes),
    else 1 + the number of :data:`SHARE_BINS` ``winner`` reaches as a share of ``total``.

    The support class counts occurrences; the weights (age, a shorter match, the static index's
    share) say more. On held-out Python, where the newest occurrence outvotes many older ones
    (exponent 6), a winner that a minority of the occurrences follows can hold almost all of the
    weight: with the share class the acceptance estimates tell those apart, 1.6772 -> 1.6863
    tokens per step with the corpus in the history (1.6756 -> 1.6832 without), WikiText with the
    corpus 1.3720 -> 1.3728 (the replays of ``perf policy``, 2026-12-06). Comparisons of floats,
    so both implementations agree.
    """
    if not contested:
        return 0
    return 1 + sum(1 for x in SHARE_BINS if winner >= x * total)


def vote_weight(age: int, exponent: int = 2) -> int:
    """The weight of the vote of an occurrence ``age`` tokens back: ``VOTE_SCALE // (b + 1) **
    exponent``, ``b`` the bit length of ``age``.

    Among the occurrences followed, a recent one predicts the next token better than an old one:
    on the replays' contested votes (two tokens or more), counting every occurrence once picked
    the token that came 21.2 % of the time on code and 19.1 % on WikiText, weighing them by age
    with the exponent 2 24.0 % and 20.7 %, and with a match shorter than the longest at a quarter
    (:data:`SHORTER_SHIFT`) 24.4 % and 20.9 % (a log of the reference replay's votes, 2026-12-05).
    How steeply is a property of the text (:data:`EXPONENTS`). Integers, so both implementations
    sum them exactly.
    """
    denominator: int = (age.bit_length() + 1) ** exponent  # int ** int is Any to mypy
    return VOTE_SCALE // denominator


def static_vote(score: int, total: int, count: int, n_static: int) -> float:
    """A token's vote with the static index's support: its occurrences' weight ``score`` plus
    ``total`` (the weight of the whole vote) / :data:`STATIC_VOTE_DIV` times ``count`` / ``n_static``
    (its count after the two tokens before it in the static index, over the counts of all the
    tokens voted for).

    The followed occurrences are a sample, at most a few dozen, where the static index counted the
    whole corpus: on the WikiText replay's contested votes (two tokens or more; the corpus in the
    history), the vote's winner was the next token 20.7 % of the time, with the static share added
    21.4 % (22.3 % against 21.3 % where the static index counts one of them at least; the first
    suffix tokens of the reference replay's drafts, logged before this rule, 2026-12-05). Floats
    in this order, so both implementations compute the same sums.
    """
    return float(score) + float(total) * float(count) / (STATIC_VOTE_DIV * float(n_static))


def source_class(history: SuffixHistory, p: int, detached: bool = False) -> int:
    """Where the occurrence at ``p`` is: 0 an earlier request, 1 the current request, 2 the corpus.

    Corpus tokens have acceptance counts of their own, so a corpus that does not fit the text
    (an English corpus while the requests are code) stops being drafted without holding back
    the requests' own matches. For a ``detached`` request (:meth:`HybridState.propose_detached`)
    the current request is its own history (positions from :data:`OWN_BASE`): the history
    owner's tokens are another request's.
    """
    if p >= OWN_BASE:
        return 1
    if p >= CORPUS_BASE:
        return 2
    if detached:
        return 0
    return int(p >= history.req_start)


def merge_candidates(mine: list[tuple[int, int]], theirs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """A detached request's candidates: ``mine`` (its own occurrences, positions from
    :data:`OWN_BASE`, the newest) before ``theirs`` (the history's), each newest first.

    Where one side matched two tokens or more and the other only the last token (its one-token
    fallback), the one-token matches are dropped, as :meth:`SuffixHistory.candidates` falls back
    to the last token only where the last two never occurred.
    """
    if not mine or not theirs:
        return mine or theirs
    two_mine = max(n for _, n in mine) >= 2
    two_theirs = max(n for _, n in theirs) >= 2
    if two_mine and not two_theirs:
        return mine
    if two_theirs and not two_mine:
        return theirs
    return mine + theirs


def static_class(static: PartSource, a: int, b: int, token: int) -> int:
    """How the static index supports ``token`` after ``(a, b)``: 0 it has no followers of
    that 2-gram (or ``a``/``b`` is a separator), 5 ``token`` is its own draft there (spec 3.2),
    else 1 ``token`` is not a follower, 2 a follower seen 1-2 times, 3 3-19 times, 4 more."""
    if SEP in (a, b):
        return 0
    part = static.part((a, b, TOKEN_NULL, TOKEN_NULL))
    if not part:
        return 0
    if token == try_static(part):
        return 5
    count = part.get(token)
    if count is None:
        return 1
    if count <= 2:
        return 2
    return 3 if count < 20 else 4


def copy_floor(m: int, share: int) -> float:
    """The least estimate of a suffix token after a match of ``m`` tokens (the match length plus
    the tokens drafted after it) when its vote is not contested (``share`` class 0: every followed
    occurrence that goes on agrees): ``(m + 1) / (m + 2)``, Laplace's rule of succession on the copy
    so far, from :data:`COPY_MIN` on; else 0 (no floor).

    A draft that copies one span of the history is a run of such tokens, and along it the floors
    multiply to ``(m + 1) / (m + j + 1)`` after ``j`` tokens: the draft goes on about as far as the
    match reaches back, as SuffixDecoding's does. The cells' own rates (by match length up to 32)
    pool long copies with everything else and are low there: on the input-grounded pairs, tokens
    they estimated at 0.4-0.6 were accepted 94-95 % of the time where no drafted token had been
    rejected for 128 tokens (this policy instrumented, on ``perf grounded``'s pairs, 2026-12-06).
    With the floor the hybrid policy drafts more tokens per step for less waste there at the
    thresholds 0.15 and 0.3, at k = 8, 16 and 32.
    """
    if share != 0 or m < COPY_MIN:
        return 0.0
    return float(m + 1) / float(m + 2)


def _estimate(ok: int, tried: int) -> float:
    return (float(ok) + PRIOR_OK) / (float(tried) + PRIOR_TRIED)


class HybridState:
    """Per-drafter state of the hybrid policy: a :class:`SuffixHistory` and acceptance statistics.

    Per request: :meth:`begin_request`, then per verification step :meth:`propose` and, once
    the engine verified the proposal, :meth:`observe`. ``tokens`` given to :meth:`propose` is
    the whole request so far and only grows; tokens not seen yet join the history first.
    """

    def __init__(
        self,
        history: SuffixHistory | None = None,
        threshold: float = THRESHOLD,
        max_candidates: int = MAX_CANDIDATES,
        target_waste: float = TARGET_WASTE,
        match_slack: int = MATCH_SLACK,
        token_factors: bool = True,
    ) -> None:
        if not 0.0 <= threshold <= 1.0:
            raise ValueError(f"threshold must be in [0, 1], got {threshold}")
        if not 1 <= max_candidates <= MAX_CANDIDATES_LIMIT:
            raise ValueError(f"max_candidates must be in [1, {MAX_CANDIDATES_LIMIT}], got {max_candidates}")
        if not 0 <= match_slack <= MAX_MATCH:
            raise ValueError(f"match_slack must be in [0, {MAX_MATCH}], got {match_slack}")
        self.match_slack = match_slack
        self.token_factors = token_factors  # False: the cells' rates alone (see _by_token)
        self.history = history if history is not None else SuffixHistory()
        check_target_waste(target_waste, "hybrid")
        self.threshold = threshold
        self.max_candidates = max_candidates
        self.target_waste10 = round(target_waste * 10)  # tenths of a token: the balance stays an integer
        self.balance = 0  # waste budget left over the run, in tenths of a token
        self.recent = 0  # the same over about the last 1,000 steps (it forgets 1/1024 a step)
        # acceptance counts per cell (kind, static class, support class, source, effective match length)
        self.tried: Counter[Cell] = Counter()
        self.ok: Counter[Cell] = Counter()
        # acceptance counts of llama.cpp's tokens per (confirmed?, its draft's length, position)
        self.l_tried: Counter[LlamaCell] = Counter()
        self.l_ok: Counter[LlamaCell] = Counter()
        self.last_llama_full = 0
        self.last_confirmed = 0  # llama.cpp's first tokens the suffix-only draft agreed with
        self.seen = 0
        self.last_llama = 0
        self.last_suffix = 0
        self.last_cells: list[Cell] = []
        # The threshold's calibration (see observe): the steps observed so far while steering (up
        # to CALIBRATE_AT), the running estimates of the last proposal's tokens and of the last
        # walk's, and those of every drafted token those steps wasted.
        self.observed = 0 if self.target_waste10 > 0 else CALIBRATE_AT  # a fixed threshold: none
        self.last_probs: list[float] = []
        self.walk_probs: list[float] = []
        self.walk_factors: list[float] = []  # the last walk's estimate of each token it drafted
        self.calibration: list[float] = []
        # The token factors (see _by_token): accepted and expected counts, in 1/TOKEN_ONE of a
        # token, by the token before a drafted token (slots 0..TOKEN_SLOTS-1), then by the drafted
        # token itself; and the last proposal's tokens after the one before them, which observe reads.
        self.tok_ok = [0] * (2 * TOKEN_SLOTS)
        self.tok_exp = [0] * (2 * TOKEN_SLOTS)
        self.last_tokens: list[int] = []
        self._own: SuffixHistory | None = None  # a detached proposal's request history, while it is made
        # Which exponent of the age weights drafts best here (see exponent()): per exponent, the
        # tokens its drafts would have had accepted at the points scored so far, and the scorings
        # waiting for their text: (the drafts' position in the history, the draft each exponent
        # would have made there).
        self.exponent_scores = [0] * len(EXPONENTS)
        self.pending: list[tuple[int, list[list[int]]]] = []

    def request_history(self) -> SuffixHistory:
        """An empty history for one request's own tokens, to pass to :meth:`propose_detached`
        (it keeps it in step with the request's tokens) for as long as that request is detached."""
        own = SuffixHistory(OWN_MAX_TOKENS)
        own.add_separator()
        return own

    def _sync_own(self, own: SuffixHistory, tokens: Sequence[int]) -> None:
        held = len(own) - 1  # after its separator
        if len(tokens) < held:
            raise ValueError(
                f"tokens has {len(tokens)} tokens but its request history already holds {held}: "
                "one request history per request"
            )
        own.extend(tokens[held:])

    def _candidates(self, drafted: list[int], request: Sequence[int] | None) -> list[tuple[int, int]]:
        """The candidates of the query (see :meth:`SuffixHistory.candidates`); for a detached
        request, its own occurrences too (:func:`merge_candidates`)."""
        found = self.history.candidates(drafted, self.max_candidates, request)
        own = self._own
        if own is None:
            return found
        mine = [(OWN_BASE + p, n) for p, n in own.candidates(drafted, self.max_candidates)]
        return merge_candidates(mine, found)

    def _token_at(self, p: int) -> int:
        """The token at candidate position ``p`` (the history's, or from :data:`OWN_BASE` the request history's)."""
        own = self._own
        if p >= OWN_BASE and own is not None:
            return own.token_at(p - OWN_BASE)
        return self.history.token_at(p)

    def exponent(self) -> int:
        """The exponent the age weights fall with now (one of :data:`EXPONENTS`): the first, unless
        another one's drafts would have had more than 1/16 + 64 more tokens accepted
        (:data:`EXPONENT_MARGIN`, :data:`EXPONENT_LEAD`); then the best of those (the first on a
        tie).

        The score is taken from the text alone, not from what was drafted: at every
        :data:`SCORE_GRID`-th token of a request, where the occurrences the suffix match follows
        there disagree on the next token, the draft each exponent would make (the heaviest vote
        token after token, up to :data:`SCORE_LEN` tokens, no threshold) is kept; once the text
        has gone that far, each exponent scores the length of the prefix its draft shares with it
        (scorings a request's end or an eviction cuts short are dropped). Scored where the policy
        drafted (after its own steps), the exponent in use tended to score best, because it chose
        where the steps began. WikiText keeps 2; code moves to 6 within its first files.
        Deterministic.
        """
        scores = self.exponent_scores
        best = 0
        for i in range(1, len(scores)):
            if scores[i] > scores[best] and scores[i] > scores[0] + scores[0] // EXPONENT_MARGIN + EXPONENT_LEAD:
                best = i
        return EXPONENTS[best]

    def _score_exponents(self) -> None:
        """Score the pending drafts whose text has arrived (see :meth:`exponent`)."""
        toks = self.history.toks
        while self.pending:
            at, drafts = self.pending[0]
            if len(toks) < at + max(len(d) for d in drafts):
                return  # later ones need more
            self.pending.pop(0)
            for i, d in enumerate(drafts):
                n = 0
                while n < len(d) and d[n] == toks[at + n]:
                    n += 1
                self.exponent_scores[i] += n
            if max(self.exponent_scores) >= EXPONENT_DECAY_AT:
                self.exponent_scores = [x // 2 for x in self.exponent_scores]

    def _append(self, tokens: Sequence[int]) -> None:
        """Add the current request's next ``tokens`` to the history, scoring the exponents at
        every :data:`SCORE_GRID`-th (see :meth:`exponent`)."""
        for t in tokens:
            n = len(self.history.toks)
            self.history.extend([t])
            self.seen += 1
            if len(self.history.toks) != n + 1:  # the history evicted its older half: positions moved
                self.pending.clear()
            if self.seen % SCORE_GRID != 0:
                continue
            self._score_exponents()
            found = self.history.candidates([], self.max_candidates)
            if not found:
                continue
            best = max(length for _, length in found)
            followed = [(p, length) for p, length in found if length >= best - self.match_slack]
            if len({self._token_at(p) for p, _ in followed} - {SEP}) >= 2:  # contested
                drafts = self._exponent_drafts([p for p, _ in followed], [n for _, n in followed], best, SCORE_LEN)
                self.pending.append((len(self.history.toks), drafts))

    def _vote(self, nexts: list[int], weights: list[int], part: Mapping[int, int] | None = None) -> int:
        """The heaviest vote among ``nexts`` (the followed occurrences' next tokens, newest first;
        :data:`SEP` votes for nothing); on a tie the token more occurrences follow, then the newest
        one's. SEP when nobody votes.

        ``part``: the static index's followers of the two tokens before (or None). Where two tokens
        or more have votes and the static index counts any of them there, each gains
        :func:`static_vote`'s share of the vote's total (on a tie of those sums: the heavier vote
        first, then as above).
        """
        return self._ballot(nexts, weights, part)[0]

    def _ballot(self, nexts: list[int], weights: list[int], part: Mapping[int, int] | None) -> tuple[int, int]:
        """:meth:`_vote`'s winner and the :func:`share_class` of its vote."""
        keys, whole = self._tally(nexts, weights, part)
        if not keys:
            return SEP, 0
        won = max(keys, key=keys.__getitem__)
        return won, share_class(keys[won][0], whole, len(keys) >= 2)

    def _tally(
        self, nexts: list[int], weights: list[int], part: Mapping[int, int] | None
    ) -> tuple[dict[int, tuple[float, int, int, int]], float]:
        """:meth:`_vote`'s tally: each token voted for with its rank (the highest wins): its sum
        (with the static index's share where it joined, see :meth:`_vote`), its weight, its votes,
        minus the index of its newest occurrence; and the whole vote's sum (the total weight, plus
        a :data:`STATIC_VOTE_DIV`-th of it where the static index joined: its shares add up to that)."""
        score: Counter[int] = Counter()
        votes: Counter[int] = Counter()
        for t, w in zip(nexts, weights, strict=True):
            if t != SEP:
                score[t] += w
                votes[t] += 1
        total = sum(score.values())
        summed = {t: float(score[t]) for t in votes}
        whole = float(total)
        if part and len(votes) >= 2:
            counts = {t: part.get(t, 0) for t in votes}
            n_static = sum(counts.values())
            if n_static > 0:
                summed = {t: static_vote(score[t], total, counts[t], n_static) for t in votes}
                whole = float(total) + float(total) / STATIC_VOTE_DIV
        return {t: (summed[t], score[t], votes[t], -nexts.index(t)) for t in votes}, whole

    def _exponent_drafts(self, active: list[int], lengths: list[int], best: int, n_max: int) -> list[list[int]]:
        """The draft each of :data:`EXPONENTS` would make from the ``active`` occurrences (matching
        ``lengths`` tokens, ``best`` the longest): up to ``n_max`` vote winners, no threshold."""
        drafts = []
        for e in EXPONENTS:
            act = active
            weights = [
                self._age_weight(p, e) >> (0 if n >= best else SHORTER_SHIFT)
                for p, n in zip(active, lengths, strict=True)
            ]
            d: list[int] = []
            while len(d) < n_max:
                nexts = [self._token_at(p + len(d)) for p in act]
                token = self._vote(nexts, weights)
                if token == SEP:
                    break
                d.append(token)
                kept = [i for i, t in enumerate(nexts) if t == token]
                act = [act[i] for i in kept]
                weights = [weights[i] for i in kept]
            drafts.append(d)
        return drafts

    def _age_weight(self, p: int, exponent: int) -> int:
        """The vote weight of the occurrence at candidate position ``p`` (:func:`vote_weight`): its
        age is counted back from the end of the requests' stream; for a detached request, from the
        end of its own tokens, which come after the history's (its own occurrences are its newest,
        as :func:`merge_candidates` orders them). The corpus's occurrences are :data:`CORPUS_AGE` old."""
        own = self._own
        n_own = 0 if own is None else len(own.toks)
        if p >= OWN_BASE and own is not None:
            return vote_weight(n_own - (p - OWN_BASE), exponent)
        if p >= CORPUS_BASE:
            return vote_weight(CORPUS_AGE, exponent)
        return vote_weight(n_own + len(self.history.toks) - p, exponent)

    def _llama_cell(self, m_full: int, j: int) -> LlamaCell:
        """The cell of token ``j`` of a llama.cpp draft of ``m_full`` tokens in the last proposal."""
        return (j < self.last_confirmed, min(m_full, N_LLAMA - 1), min(j, N_LLAMA_POS - 1))

    def _llama_estimate(self, cell: LlamaCell) -> float:
        return _estimate(self.l_ok[cell], self.l_tried[cell])

    def _token_factor(self, slot: int) -> float:
        """How a token's drafts have done against their estimates: accepted over expected, with the prior."""
        return float(self.tok_ok[slot] + TOKEN_PRIOR) / float(self.tok_exp[slot] + TOKEN_PRIOR)

    def _by_token(self, rate: float, before: int, token: int) -> float:
        """The estimate of drafting ``token`` after ``before``, from its cell's ``rate``.

        The cells do not know which tokens they draft, and some tokens are drafted right far more
        often than their cells say (and some far less), as are the tokens after some tokens. So
        the rate is multiplied by two *token factors*: how often the drafted tokens that followed
        ``before`` were accepted against how often their cells expected it, and the same for
        drafts of ``token`` (expected there after the first factor); at most :data:`TOKEN_CAP`.
        """
        if not self.token_factors:
            return rate
        mask = TOKEN_SLOTS - 1
        q = rate * self._token_factor(before & mask) * self._token_factor(TOKEN_SLOTS + (token & mask))
        return q if q < TOKEN_CAP else TOKEN_CAP

    def _learn_token(self, rate: float, before: int, token: int, accepted: bool) -> None:
        """Count a drafted ``token`` (after ``before``) that was reached, whose cell's rate is ``rate`` now."""
        mask = TOKEN_SLOTS - 1
        p = before & mask
        t = TOKEN_SLOTS + (token & mask)
        factor = self._token_factor(p)
        ok = TOKEN_ONE if accepted else 0
        for slot, expected in ((p, int(rate * float(TOKEN_ONE))), (t, int(rate * factor * float(TOKEN_ONE)))):
            self.tok_ok[slot] += ok
            self.tok_exp[slot] += expected
            if self.tok_exp[slot] >= TOKEN_DECAY_AT:
                self.tok_ok[slot] //= 2
                self.tok_exp[slot] //= 2

    def begin_request(self) -> None:
        """Start a new request (the previous one stays in the history)."""
        self.history.add_separator()
        self.seen = 0
        self.last_llama = self.last_suffix = 0
        self.pending.clear()  # the scorings the request's end cut short are dropped

    def _sync(self, tokens: Sequence[int]) -> None:
        if len(tokens) < self.seen:
            raise ValueError(
                f"tokens has {len(tokens)} tokens but the request already had {self.seen}: "
                "call begin_request() before a new request"
            )
        self._append(tokens[self.seen :])

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
        m, s = self.last_llama, self.last_suffix
        self.last_llama = min(m, n)
        self.last_suffix = min(s, max(n - m, 0))

    def _follow(
        self,
        drafted: list[int],
        n_max: int,
        prob: float,
        kind: int,
        request: Sequence[int] | None,
        static: PartSource,
    ) -> tuple[list[int], list[Cell]]:
        """Up to ``n_max`` suffix-match tokens after the query (the stream, or ``request``, then
        ``drafted``) and their cells, while the running estimate (from ``prob``) allows."""
        found = self._candidates(drafted, request)
        if not found:
            return [], []
        best = max(length for _, length in found)
        # newest first: the longest matches and those at most match_slack shorter, with their votes
        active, weights = self._followed(found, best, self.exponent())
        # the two tokens before the next drafted one, for static_class
        b2 = self.history.query_token(drafted, 1, request)
        b1 = self.history.query_token(drafted, 0, request)
        return self._walk(active, best, 0, n_max, prob, kind, b2, b1, static, weights)

    def _followed(self, found: list[tuple[int, int]], best: int, exponent: int) -> tuple[list[int], list[int]]:
        """The occurrences of ``found`` followed (newest first: the longest matches, ``best`` tokens,
        and those at most ``match_slack`` shorter) and their votes' weights: by age with
        ``exponent``, a quarter for a match shorter than the longest."""
        followed = [(p, n) for p, n in found if n >= best - self.match_slack]
        weights = [self._age_weight(p, exponent) >> (0 if n >= best else SHORTER_SHIFT) for p, n in followed]
        return [p for p, _ in followed], weights

    def _walk(
        self,
        active: list[int],
        best: int,
        k: int,
        n_max: int,
        prob: float,
        kind: int,
        b2: int,
        b1: int,
        static: PartSource,
        weights: list[int],
    ) -> tuple[list[int], list[Cell]]:
        """:meth:`_follow`'s draft from its ``k``-th token on: ``active`` are the occurrences still
        followed (matching ``best`` tokens at most ``match_slack`` shorter), ``b2``, ``b1`` the
        two tokens before the next one, ``prob`` the running estimate so far. Each token is the
        vote's winner, the occurrences weighing ``weights`` (see :meth:`_followed`) with the
        static index's counts joining the vote (see :meth:`_vote`)."""
        detached = self._own is not None
        out: list[int] = []
        cells: list[Cell] = []
        self.walk_probs = probs = []  # the running estimate at each token drafted (for the calibration)
        self.walk_factors = factors = []  # each token's own estimate (for the replacement, step 1)
        while k < n_max:
            nexts = [self._token_at(p + k) for p in active]
            part = None
            if SEP not in (b2, b1):
                part = static.part((b2, b1, TOKEN_NULL, TOKEN_NULL))
            token, share = self._ballot(nexts, weights, part)
            if token == SEP:
                break
            top = nexts.count(token)
            newest = next(p for p, t in zip(active, nexts, strict=True) if t == token)
            cell = (
                kind,
                static_class(static, b2, b1, token),
                support_class(top, len(active)),
                source_class(self.history, newest, detached),
                min(best + k, N_LEN - 1),
                share,
            )
            factor = max(
                self._by_token(_estimate(self.ok[cell], self.tried[cell]), b1, token), copy_floor(best + k, share)
            )
            prob = prob * factor
            if prob < self.threshold:
                break
            out.append(token)
            cells.append(cell)
            probs.append(prob)
            factors.append(factor)
            b2, b1 = b1, token
            kept = [i for i, t in enumerate(nexts) if t == token]
            active = [active[i] for i in kept]
            weights = [weights[i] for i in kept]
            k += 1
        return out, cells

    def _extend_draft(
        self,
        drafted: list[int],
        n_draft: int,
        request: Sequence[int] | None = None,
        static: PartSource | None = None,
    ) -> None:
        """Choose, trim and extend ``drafted``, llama.cpp's draft for the current history, in place.

        When llama.cpp drafted, the suffix-only draft (the suffix match from the request alone,
        kind 1) is made first: where it agrees with llama.cpp's first tokens they count as
        *confirmed*; where the two first disagree and the suffix-only draft's token there has
        the higher estimate (the copy floor included), it replaces llama.cpp's draft (whose tokens before that position
        are its own). Otherwise
        llama.cpp's tokens are kept while the running estimate stays at or above the
        threshold, and suffix-match tokens (kind 0) follow under the same running estimate.
        ``request``: the tokens of a request not in the history (see :meth:`propose_detached`),
        else None. ``static``: the static cache (for :func:`static_class`; None: empty).
        """
        st: PartSource = static if static is not None else NgramCache()
        m_full = len(drafted)
        self.last_llama_full, self.last_suffix, self.last_confirmed = m_full, 0, 0
        before = self.history.query_token([], 0, request)  # the request's last token
        self.last_tokens = [before, *drafted]
        self.last_probs = []
        if m_full > 0:
            self.walk_probs = []
            self.walk_factors = []
            alt, alt_cells = self._follow([], n_draft, 1.0, 1, request, st)
            alt_factors = self.walk_factors
            agree = 0
            while agree < min(len(alt), m_full) and alt[agree] == drafted[agree]:
                agree += 1
            self.last_confirmed = agree
            # The suffix token's estimate as its draft made it, the copy floor included. By its
            # cell's rate alone, a long copy's token tied with llama.cpp's while both cells were at
            # their prior (1/2), and llama.cpp's tokens stayed: a fresh drafter's edits drafted
            # 10.9 tokens per step at n_draft 32 instead of 12.8 (docs/performance-log.md).
            if agree < min(len(alt), m_full) and alt_factors[agree] > self._by_token(
                self._llama_estimate(self._llama_cell(m_full, agree)), self.last_tokens[agree], drafted[agree]
            ):
                drafted[:] = alt
                self.last_tokens = [before, *alt]
                self.last_llama, self.last_suffix, self.last_cells = 0, len(alt), alt_cells
                self.last_probs = self.walk_probs
                return
        prob = 1.0
        m = 0
        probs: list[float] = []
        while m < m_full:
            p_ok = self._by_token(self._llama_estimate(self._llama_cell(m_full, m)), self.last_tokens[m], drafted[m])
            if prob * p_ok < self.threshold:
                break
            prob = prob * p_ok
            probs.append(prob)
            m += 1
        del drafted[m:]
        self.last_llama = m
        self.last_probs = probs
        if m >= n_draft:
            return
        self.walk_probs = []
        more, cells = self._follow(drafted, n_draft - m, prob, 0, request, st)
        drafted.extend(more)
        self.last_tokens = [before, *drafted]
        self.last_cells = cells
        self.last_suffix = len(more)
        self.last_probs = probs + self.walk_probs

    def propose(
        self,
        tokens: Sequence[int],
        n_draft: int,
        nc_context: PartSource,
        nc_dynamic: PartSource,
        nc_static: PartSource | None = None,
    ) -> list[int]:
        """Up to ``n_draft`` tokens to verify after ``tokens`` (the whole request so far)."""
        return self._propose(tokens, n_draft, nc_context, nc_dynamic, nc_static, detached=False)

    def propose_detached(
        self,
        tokens: Sequence[int],
        n_draft: int,
        nc_context: PartSource,
        nc_dynamic: PartSource,
        nc_static: PartSource | None = None,
        own: SuffixHistory | None = None,
    ) -> list[int]:
        """Like :meth:`propose`, for a request that is not the history's current one.

        For a request open at the same time as the one whose tokens the history is following:
        the match is sought for its own last tokens (``tokens``, the whole request so far)
        among the history's occurrences, and among its own earlier tokens, which ``own`` holds
        (from :meth:`request_history`, one per request, passed at each of its proposals; this
        adds the tokens it lacks). Its own occurrences come first, as the newest (see
        :func:`merge_candidates`); for it the history owner's tokens are an earlier request's.
        ``own`` None: one is built from ``tokens`` for this call. Its tokens are not added to
        the shared history. Observe it like any proposal (see :meth:`last_step`).
        """
        return self._propose(tokens, n_draft, nc_context, nc_dynamic, nc_static, detached=True, own=own)

    def _propose(
        self,
        tokens: Sequence[int],
        n_draft: int,
        nc_context: PartSource,
        nc_dynamic: PartSource,
        nc_static: PartSource | None,
        detached: bool,
        branches: int = 1,
        tree: list[list[int]] | None = None,
        own: SuffixHistory | None = None,
    ) -> list[int]:
        if n_draft < 0:
            raise ValueError(f"n_draft must be >= 0, got {n_draft}")
        if not detached:
            self._sync(tokens)
        else:
            if own is None:
                own = self.request_history()
            self._sync_own(own, tokens)
            self._own = own if tokens else None
        try:
            return self._propose_with(tokens, n_draft, nc_context, nc_dynamic, nc_static, detached, branches, tree)
        finally:
            self._own = None

    def _propose_with(
        self,
        tokens: Sequence[int],
        n_draft: int,
        nc_context: PartSource,
        nc_dynamic: PartSource,
        nc_static: PartSource | None,
        detached: bool,
        branches: int,
        tree: list[list[int]] | None,
    ) -> list[int]:
        if not tokens:
            self.last_llama = self.last_suffix = 0
            return []
        drafted = [tokens[-1]]
        draft(tokens, drafted, n_draft, NGRAM_MIN, NGRAM_MAX, nc_context, nc_dynamic, nc_static or NgramCache())
        out = drafted[1:]
        if tree is not None:  # propose_tree: branch 0 is this proposal, then the alternatives
            tree.extend(self._tree_step(out, n_draft, tokens if detached else None, nc_static, branches))
            return tree[0] if tree else []
        self._extend_draft(out, n_draft, tokens if detached else None, nc_static)
        return out

    def last_step(self) -> Step:
        """The bookkeeping of the last proposal, to :meth:`observe` it later with :meth:`resume_step`.

        Needed when proposals of several requests are outstanding at once.
        """
        return (
            self.last_llama_full,
            self.last_llama,
            self.last_suffix,
            self.last_cells,
            self.last_confirmed,
            self.last_probs,
            self.last_tokens,
        )

    def resume_step(self, step: Step) -> None:
        """Make ``step`` (from :meth:`last_step`) the proposal the next :meth:`observe` is about."""
        (
            self.last_llama_full,
            self.last_llama,
            self.last_suffix,
            self.last_cells,
            self.last_confirmed,
            self.last_probs,
            self.last_tokens,
        ) = step

    def observe(self, n_accepted: int, committed: Sequence[int] = ()) -> None:
        """Record that the first ``n_accepted`` tokens of the last proposal were accepted.

        ``committed`` (optional): the tokens the request grew by; or pass them with the next propose.
        """
        if n_accepted < 0:
            raise ValueError(f"n_accepted must be >= 0, got {n_accepted}")
        m, s = self.last_llama, self.last_suffix
        if self.target_waste10 > 0:  # steer the threshold to the target waste per step
            wasted = max(m + s - n_accepted, 0)
            e = self.target_waste10 - 10 * wasted
            self.balance = max(-BALANCE_CAP, min(BALANCE_CAP, self.balance + e))
            # Steered by the recent balance, so the threshold settles instead of swinging: with the
            # run's balance alone, a debt run up while the threshold climbs is repaid by an
            # overshoot, and the threshold swung between 0.006 and 0.05 on WikiText (0.02 and the
            # 0.5 bound on code), drafting the same tokens at times and not at others. An eighth
            # of the run's balance keeps the average over the run at the target: the recent
            # balance alone makes its median, not its mean, zero (a step wastes up to n_draft tokens
            # and saves at most target_waste).
            self.recent += e
            self.recent -= self.recent >> RECENT_SHIFT
            up = self.recent + (self.balance >> RUN_SHIFT) < 0
            t = self.threshold * THRESHOLD_STEP if up else self.threshold / THRESHOLD_STEP
            self.threshold = max(THRESHOLD_MIN, min(THRESHOLD_MAX, t))
            if self.observed < CALIBRATE_AT:
                self.observed += 1
                # the running estimates of this step's wasted tokens (those after the accepted ones)
                self.calibration.extend(self.last_probs[n_accepted : m + s])
                if self.observed == CALIBRATE_AT:
                    self._calibrate()
        toks = self.last_tokens  # the token before the proposal, then the proposal
        for j in range(min(m, n_accepted + 1)):  # llama.cpp's tokens reached: the accepted ones and the first miss
            lc = self._llama_cell(self.last_llama_full, j)
            self._learn_token(self._llama_estimate(lc), toks[j], toks[j + 1], j < n_accepted)
            self.l_tried[lc] += 1
            if j < n_accepted:
                self.l_ok[lc] += 1
            if self.l_tried[lc] >= DECAY_AT:
                self.l_tried[lc] //= 2
                self.l_ok[lc] //= 2
        if s > 0 and n_accepted >= m:
            acc = n_accepted - m
            for k in range(min(s, acc + 1)):  # the tokens reached: the accepted ones and the first miss
                cell = self.last_cells[k]
                self._learn_token(_estimate(self.ok[cell], self.tried[cell]), toks[m + k], toks[m + k + 1], k < acc)
                self.tried[cell] += 1
                if k < acc:
                    self.ok[cell] += 1
                if self.tried[cell] >= DECAY_AT:
                    self.tried[cell] //= 2
                    self.ok[cell] //= 2
        self.last_llama = self.last_suffix = 0
        if committed:
            self._append(committed)

    def _calibrate(self) -> None:
        """Raise the threshold, once, to where the first :data:`CALIBRATE_AT` steps would have
        wasted no more than the target: where they wasted more than :data:`CALIBRATE_MARGIN` / 10
        times it, the threshold rises by :data:`CALIBRATE_GRID` until no more than the target's
        worth of the tokens they wasted had a running estimate at or above it; the balances start
        afresh.

        A drafted token is kept while its running estimate is at or above the threshold, and the
        estimates fall along a draft, so a higher threshold would have kept exactly the tokens
        whose estimates reach it: the waste it would have had is known from the tokens wasted,
        where a lower one's is not. The controller's steps (0.01 %) are slow on purpose, and a
        threshold that has far to go does not get there: at ``n_draft`` 32 the input-grounded
        pairs need about 0.2 where WikiText keeps about 0.016, and the default policy wasted 4.53
        tokens per step there against its target 1.9 (2026-12-06). Which start is right depends on
        the text; its first steps tell.
        """
        wasted = self.calibration
        self.calibration = []
        budget = self.target_waste10 * CALIBRATE_AT  # tenths of a token
        if 100 * len(wasted) <= CALIBRATE_MARGIN * budget:
            return
        t = self.threshold
        while t < THRESHOLD_MAX:
            t = min(t * CALIBRATE_GRID, THRESHOLD_MAX)
            if 10 * sum(1 for p in wasted if p >= t) <= budget:
                break
        self.threshold = t
        self.balance = self.recent = 0

    def propose_tree(
        self,
        tokens: Sequence[int],
        n_draft: int,
        nc_context: PartSource,
        nc_dynamic: PartSource,
        nc_static: PartSource | None = None,
        branches: int = 3,
        detached: bool = False,
        own: SuffixHistory | None = None,
    ) -> list[list[int]]:
        """Up to ``branches`` drafts after ``tokens``, for an engine that verifies them as a tree.

        The first is exactly :meth:`propose`'s (:meth:`propose_detached`'s with ``detached``,
        and its ``own``);
        the others are alternatives (see :meth:`_tree_step`), none empty and no two of them one
        a prefix of the other. ``[]`` when :meth:`propose` would draft nothing.

        Learning stays linear: observe the step as if only branch 0 had been proposed, with
        :meth:`observe` ``(n)``, ``n`` the length of the accepted tokens' common prefix with
        branch 0. The state then evolves as the linear policy's would on the same committed
        tokens, so branch 0 is, step by step, what :meth:`propose` returns, and a tree verifier
        accepts at least as much per step as one verifying branch 0 alone.
        """
        check_branches(branches, "hybrid")
        tree: list[list[int]] = []
        self._propose(tokens, n_draft, nc_context, nc_dynamic, nc_static, detached, branches, tree, own)
        return tree

    def _tree_step(
        self, drafted: list[int], n_draft: int, request: Sequence[int] | None, static: PartSource | None, branches: int
    ) -> list[list[int]]:
        """The branches of one tree proposal from llama.cpp's draft ``drafted`` (changed in place
        to branch 0, :meth:`_extend_draft`'s proposal, whose bookkeeping is the step's).

        Alternatives, in this order while there is room (see :func:`add_branch`):

        1. llama.cpp's own draft, where the policy trimmed or replaced it;
        2. the runner-ups of the vote that chose branch 0's first suffix-match token: branch 0's
           tokens before it, the runner-up, and its continuation as :meth:`_follow` continues a
           draft (the occurrences that agree vote, while the running estimate stays at or above
           the threshold); at most ``branches - 1`` runner-ups, ranked as the vote ranks its
           tokens but with the gentlest age weights (see :meth:`_runner_ups`), are tried;
        3. the suffix-only draft (the suffix match from the request alone), when llama.cpp's
           tokens were kept.
        """
        st: PartSource = static if static is not None else NgramCache()
        llama = list(drafted)
        self._extend_draft(drafted, n_draft, request, static)
        if not drafted:
            return []
        tree = [list(drafted)]
        add_branch(tree, llama, branches)
        m, m_full = self.last_llama, self.last_llama_full
        if self.last_suffix > 0 and len(tree) < branches:
            replaced = m_full > 0 and m == 0 and self.last_cells[0][0] == 1
            prob = 1.0
            if not replaced:
                toks = self.last_tokens  # the token before the proposal, then branch 0
                for j in range(m):  # the running estimate after llama.cpp's kept tokens, as _extend_draft has it
                    rate = self._llama_estimate(self._llama_cell(m_full, j))
                    prob = prob * self._by_token(rate, toks[j], toks[j + 1])
            self._runner_ups(drafted, m, prob, int(replaced), request, st, n_draft - m, branches, tree)
        if m > 0 and len(tree) < branches:
            alt, _ = self._follow([], n_draft, 1.0, 1, request, st)
            add_branch(tree, alt, branches)
        return tree

    def _runner_ups(
        self,
        b0: list[int],
        m: int,
        prob: float,
        kind: int,
        request: Sequence[int] | None,
        static: PartSource,
        n_max: int,
        branches: int,
        tree: list[list[int]],
    ) -> None:
        """Add the branches that take a runner-up of the vote for ``b0[m]`` in its place (see :meth:`_tree_step`).

        The runner-ups are ranked as the vote ranks its tokens (:meth:`_tally`), by the gentlest
        of the age weights (``EXPONENTS[0]``) whatever the exponent drafting with: an alternative
        is a hedge, and where the learned exponent is steep (code) the next newest occurrence's
        token is a worse one than the gentle vote's. Each is continued by the exponent in use.
        Against ranking and continuing by counts (until 2026-12-06), with 3 branches: WikiText
        1.4270 -> 1.4353 tokens per step, held-out Python 1.7798 -> 1.7815 (ranked by the steep
        exponent too: 1.7775; a prototype of the reference replay).
        """
        h = self.history
        detached = self._own is not None
        prefix = b0[:m]
        found = self._candidates(prefix, request)
        best = max(length for _, length in found)
        active, weights = self._followed(found, best, self.exponent())
        gentle = self._followed(found, best, EXPONENTS[0])[1]
        nexts = [self._token_at(p) for p in active]
        b2, b1 = h.query_token(prefix, 1, request), h.query_token(prefix, 0, request)
        part = static.part((b2, b1, TOKEN_NULL, TOKEN_NULL)) if SEP not in (b2, b1) else None
        keys, whole = self._tally(nexts, gentle, part)
        ranked = sorted((t for t in keys if t != b0[m]), key=keys.__getitem__, reverse=True)
        for r in ranked[: branches - 1]:
            if len(tree) >= branches:
                break
            sclass = static_class(static, b2, b1, r)
            votes, first = keys[r][2], -keys[r][3]
            cur = source_class(h, active[first], detached)
            share = share_class(keys[r][0], whole, len(keys) >= 2)
            cell = (kind, sclass, support_class(votes, len(active)), cur, min(best, N_LEN - 1), share)
            p = prob * self._by_token(_estimate(self.ok[cell], self.tried[cell]), b1, r)
            if p < self.threshold:
                continue
            kept = [i for i, t in enumerate(nexts) if t == r]
            follow = [active[i] for i in kept]
            more, _ = self._walk(follow, best, 1, n_max, p, kind, b1, r, static, [weights[i] for i in kept])
            add_branch(tree, [*prefix, r, *more], branches)


def add_branch(tree: list[list[int]], branch: list[int], branches: int) -> None:
    """Append ``branch`` to ``tree`` unless it is empty, the tree has ``branches`` branches, or
    ``branch`` and a branch already there are one a prefix of the other (a tree verifier gains
    nothing from it)."""
    if not branch or len(tree) >= branches:
        return
    for b in tree:
        k = min(len(b), len(branch))
        if b[:k] == branch[:k]:
            return
    tree.append(branch)


__all__ = ["HybridState", "add_branch", "merge_candidates", "share_class", "static_vote", "vote_weight"]
