"""The hybrid drafting policy, compiled: llama.cpp's confident drafts, then a suffix match.

Compiled by mypyc (``HOT_MODULES`` in ``setup.py``); it also runs as plain Python.
:mod:`lookupdec.reference.hybrid` is the readable model of the same policy, and the two give
identical drafts (``tests/test_hybrid.py``); the algorithm and its parameters are described
there and in docs/hybrid.md. The history it matches against is :mod:`lookupdec.fast._history`,
its tree drafts' helpers are in :mod:`lookupdec.fast._tree`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from librt.vecs import append, vec
from mypy_extensions import i32, i64

from lookupdec.fast._cache import NgramCache, to_vec
from lookupdec.fast._draft import as_static_source, draft_core, keys_buffer
from lookupdec.fast._history import (
    CORPUS_BASE,
    MATCH_SLACK,
    MAX_CANDIDATES,
    MAX_MATCH,
    OWN_BASE,
    OWN_MAX_TOKENS,
    SEP,
    SuffixHistory,
)
from lookupdec.fast._source import ABSENT, StaticSource
from lookupdec.fast._tables import NGRAM_MAX, NGRAM_MIN, filled_i32, low32, zeros_i64
from lookupdec.fast._tree import VOTE_HASH, add_branch
from lookupdec.rules import check_branches, check_target_waste

N_LEN: Final[i64] = 33
"""Acceptance statistics are kept per effective match length 1..32 (match length + offset) ..."""
N_CLASS: Final[i64] = 9
"""... per support class of the drafted token (see :func:`support_class`) ..."""
N_SHARE: Final[i64] = 6
"""... per share class of its vote (see :func:`share_class`) ..."""
N_CUR: Final[i64] = 3
"""... per where the newest followed occurrence with that token is (see :func:`source_class`) ..."""
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
RECENT_SHIFT: Final[i64] = 10
"""The recent waste balance forgets 1/2^10 of itself every step: it sums about the last 1,000 steps."""
RUN_SHIFT: Final[i64] = 3
"""The whole run's balance weighs 1/2^3 against the recent one in the threshold's direction."""
THRESHOLD_MIN: Final = 0.002
THRESHOLD_MAX: Final = 0.5
"""Bounds of the steered threshold."""
BALANCE_CAP: Final[i64] = 100_000_000
"""The run's waste balance is kept within +-10,000,000 tokens (in tenths): in practice the whole
run's budget, so the average over the run is what is steered."""
CALIBRATE_AT: Final[i64] = 1024
"""The threshold is calibrated once, after this many observed steps (see :meth:`HybridState._calibrate`)."""
CALIBRATE_MARGIN: Final[i64] = 11
"""It is raised at calibration only where those steps wasted more than ``CALIBRATE_MARGIN / 10`` times the target."""
CALIBRATE_GRID: Final = 1.02
"""Calibration raises the threshold by steps of this factor until the steps' waste would have met the target."""
PRIOR_OK: Final = 1.0
PRIOR_TRIED: Final = 2.0
"""Laplace prior of every acceptance estimate: (ok + 1) / (tried + 2)."""
COPY_MIN: Final[i64] = 16
"""From this match length on, an uncontested suffix token's estimate has a floor (see :func:`copy_floor`)."""
DECAY_AT: Final[i64] = 1 << 14
"""A statistic's counts are halved (integer division) when its ``tried`` reaches this: recent steps weigh more."""
TOKEN_SLOTS: Final[i64] = 1 << 17
TOKEN_MASK: Final[i64] = TOKEN_SLOTS - 1
"""The token factors' slots (the reference's ``TOKEN_SLOTS``): a token's slot is its id & TOKEN_MASK."""
TOKEN_ONE: Final[i64] = 1 << 10
TOKEN_ONE_F: Final = 1024.0
"""The token factors count in 1/1024 of a token (integers: the same in both implementations)."""
TOKEN_PRIOR: Final[i64] = 2 * TOKEN_ONE
"""A token factor is (accepted + 2) / (expected + 2): 1 for a token not seen yet."""
TOKEN_DECAY_AT: Final[i64] = 64 * TOKEN_ONE
"""A token factor's counts are halved when its expected count reaches 64 tokens."""
TOKEN_CAP: Final = 0.999
"""An estimate with its token factors is at most this."""

VOTE_SCALE: Final[i64] = 1 << 29
"""An occurrence's vote weighs ``VOTE_SCALE // (b + 1) ** e``, ``b`` the bit length of its age,
``e`` the state's exponent (see the reference's ``vote_weight`` and ``HybridState.exponent``)."""
EXPONENTS: Final = (2, 3, 4, 6)
"""The exponents the age weights may fall with (the reference's ``EXPONENTS``)."""
N_EXPONENTS: Final[i64] = 4
SCORE_GRID: Final[i64] = 8
"""The exponents are scored at every 8th token of a request ..."""
SCORE_LEN: Final[i64] = 8
"""... on drafts of up to 8 tokens."""
EXPONENT_MARGIN: Final[i64] = 16
EXPONENT_LEAD: Final[i64] = 64
"""Another exponent replaces the first only when its score is more than 1/16 above the first's,
plus 64 (tokens)."""
EXPONENT_DECAY_AT: Final[i64] = 1 << 16
"""The exponents' scores are halved (integer division) when one of them reaches this."""
MAX_CANDIDATES_LIMIT: Final = 1024
"""The largest ``max_candidates``: a vote slot's count and rank have 12 bits each (see VOTE_RANK),
and a detached request follows up to 2 x (max_candidates + 32) occurrences."""
SHORTER_SHIFT: Final[i64] = 2
"""A match shorter than the longest votes with its age's weight >> 2."""
STATIC_VOTE_DIV: Final[float] = 4.0
"""The static index's counts add to a contested vote a quarter of its total weight, shared among
the tokens by their counts (the reference's ``static_vote``)."""
SHARE_1: Final = 0.4
SHARE_2: Final = 0.6
SHARE_3: Final = 0.8
SHARE_4: Final = 0.95
"""The bounds of a contested vote's share classes (the reference's ``SHARE_BINS``; named
constants, not a tuple: a tuple's floats would be boxed)."""
CORPUS_AGE: Final[i64] = 1 << 24
"""The age a corpus occurrence votes with (older than every request's)."""
VOTE_W_SHIFT: Final[i64] = 24
VOTE_C_SHIFT: Final[i64] = 12
VOTE_RANK: Final[i64] = (1 << 12) - 1
"""A vote slot's score: weight sum << 24 | count << 12 | (4095 - the token's first candidate), so
the highest score is the heaviest vote, then the most followed, then the newest. Weights are at
most 2^27 (an age of 1 has a bit length of 1) and the candidates at most 2,080 (see
MAX_CANDIDATES_LIMIT), so the sum stays below 2^39 and the score below 2^63."""
VOTE_STAMP_MAX: Final[i64] = 1 << 30
"""Vote rounds before the vote table is cleared (its keys hold the round's stamp << 32)."""


ROOM_MAX: Final[i64] = 256
"""The most room a draft's scratch vecs reserve up front: they grow as tokens are appended."""


def room(n: i64) -> i64:
    """Capacity to reserve for a vec that holds at most ``n`` drafted tokens (appended, so it can
    grow past this): ``propose(k)`` with a huge ``k`` that drafts nothing reserved ``k`` slots
    (16 GB for ``k = 2**31``)."""
    return n if n < ROOM_MAX else ROOM_MAX


def bit_length(x: i64) -> i64:
    """The bit length of ``x`` >= 0 (``int.bit_length``, with native ints: a method call on a boxed
    int per candidate would cost more than the vote)."""
    n: i64 = 0
    if x >= 1 << 32:
        x >>= 32
        n += 32
    if x >= 1 << 16:
        x >>= 16
        n += 16
    if x >= 1 << 8:
        x >>= 8
        n += 8
    while x > 0:
        x >>= 1
        n += 1
    return n


AGE_BITS: Final[i64] = 65
"""Bit lengths of an age, 0..64: a row of :data:`WEIGHTS`."""
MAX_EXPONENT: Final[i64] = 6
"""The largest of :data:`EXPONENTS`: the last row of :data:`WEIGHTS`."""


def weight_table() -> vec[i64]:
    """``VOTE_SCALE // (b + 1) ** e`` at ``e * AGE_BITS + b``, for every exponent ``e`` up to
    MAX_EXPONENT and bit length ``b`` of an age (the reference's ``vote_weight``)."""
    table = vec[i64](capacity=(MAX_EXPONENT + 1) * AGE_BITS)
    for e in range(MAX_EXPONENT + 1):
        for b in range(AGE_BITS):
            d: i64 = 1
            for _i in range(e):  # ``_i``, not ``_``: mypyc boxed ``_`` on every round; (b + 1)^e < 2^37
                d *= b + 1
            table = append(table, VOTE_SCALE // d)
    return table


WEIGHTS: Final = weight_table()
"""The votes' weights by exponent and age (see :func:`weight_table`): a load per followed
occurrence. Computed per occurrence (a power and a division, the power's loop counter boxed by
mypyc), they took 9.7 % of the instructions of the WikiText replay with the corpus in the
history, 3.3 % as loads (callgrind, its first 10 chunks, 2026-12-06)."""


def vote_weight(age: i64, exponent: i64) -> i64:
    """The weight of the vote of an occurrence ``age`` tokens back (the reference's ``vote_weight``);
    ``exponent`` at most MAX_EXPONENT (an IndexError past it)."""
    return WEIGHTS[exponent * AGE_BITS + bit_length(age)]


class PendingScore:
    """A scoring of the exponents waiting for its text (see ``HybridState._score_exponents``)."""

    at: i64
    need: i64
    drafts: vec[i32]
    ends: vec[i64]

    def __init__(self, at: i64, drafts: vec[i32], ends: vec[i64]) -> None:
        self.at = at  # where the drafts' first token is in the history
        self.drafts = drafts  # each exponent's draft, one after the other
        self.ends = ends  # where each ends in drafts
        need: i64 = 0
        prev: i64 = 0
        for i in range(len(ends)):
            if ends[i] - prev > need:
                need = ends[i] - prev
            prev = ends[i]
        self.need = need


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


def source_class(req_start: i64, p: i64) -> i64:
    """Where the occurrence at ``p`` is: 0 an earlier request, 1 the current request (from
    ``req_start``; a detached request's own occurrences, from :data:`OWN_BASE`, for which
    ``req_start`` is :data:`OWN_BASE`), 2 the corpus (so corpus tokens that do not fit the text
    stop being drafted without holding back the requests' own matches)."""
    # if statements, not conditional expressions: mypyc boxes those on native ints (see replay_core)
    if p >= OWN_BASE:
        return 1
    if p >= CORPUS_BASE:
        return 2
    if p >= req_start:
        return 1
    return 0


def static_class(st: StaticSource, a: i32, b: i32, t: i32) -> i64:
    """How the static index supports token ``t`` after ``(a, b)``: 0 it has no followers of
    that 2-gram (or ``a``/``b`` is a separator), 5 ``t`` is its own draft there (spec 3.2),
    else 1 ``t`` is not a follower, 2 a follower seen 1-2 times, 3 3-19 times, 4 more."""
    return selected_class(st, a != SEP and b != SEP and st._st_begin(a, b), t)


NOT_COUNTED: Final[i64] = -1
"""A count not looked up yet (a count found is positive, one not found ABSENT)."""


def selected_class(st: StaticSource, has_part: bool, t: i32, c: i64 = NOT_COUNTED) -> i64:
    """:func:`static_class` of ``t`` in the part ``st`` has selected (``has_part``: it has followers);
    ``c``: ``t``'s count there if already looked up (else it is looked up)."""
    if not has_part:
        return 0
    if t == st._st_pick():
        return 5
    if c == NOT_COUNTED:
        c = st._st_count(t)
    if c == ABSENT:
        return 1
    if c <= 2:
        return 2
    if c < 20:
        return 3
    return 4


def copy_floor(m: i64, share: i64) -> float:
    """The least estimate of a suffix token after a match of ``m`` tokens (match length plus the
    tokens drafted after it) whose vote is not contested (``share`` 0): ``(m + 1) / (m + 2)``, the
    rule of succession on the copy so far, from COPY_MIN on; else 0. The reference's ``copy_floor``
    says why."""
    if share != 0 or m < COPY_MIN:
        return 0.0
    return float(m + 1) / float(m + 2)


def share_class(winner: float, total: float, contested: bool) -> i64:
    """How much of a vote the winner holds (the reference's ``share_class``): 0 the vote is not
    contested, else 1 + the number of the bounds SHARE_1..SHARE_4 that ``winner`` reaches as a
    share of ``total``."""
    if not contested:
        return 0
    c: i64 = 1
    if winner >= SHARE_1 * total:
        c += 1
    if winner >= SHARE_2 * total:
        c += 1
    if winner >= SHARE_3 * total:
        c += 1
    if winner >= SHARE_4 * total:
        c += 1
    return c


def joined_total(total: float) -> float:
    """The sum of every token's vote where the static index joined a vote of weight ``total``: the
    weights, and a STATIC_VOTE_DIV-th of them shared by the counts (the reference's ``_tally``)."""
    return total + total / STATIC_VOTE_DIV


def llama_cell(m: i64, j: i64, confirmed: bool) -> i64:
    """Index of the acceptance statistic of token ``j`` of a llama.cpp draft of ``m`` tokens
    (``confirmed``: the suffix-only draft has the same first ``j + 1`` tokens)."""
    row = m if m < N_LLAMA - 1 else N_LLAMA - 1
    cell = row * N_LLAMA_POS + (j if j < N_LLAMA_POS - 1 else N_LLAMA_POS - 1)
    return cell if confirmed else cell + N_LLAMA_CELLS


def stat_cell(count: i64, n_active: i64, length: i64, sclass: i64, kind: i64, cur: i64, share: i64) -> i64:
    """Index of the acceptance statistic for a token drafted after a match of ``length`` tokens
    (``sclass``: :func:`static_class`; ``kind``: see :data:`N_KIND`; ``cur``: see :data:`N_CUR`;
    ``share``: :func:`share_class`)."""
    eff = length if length < N_LEN - 1 else N_LEN - 1
    support = support_class(count, n_active)
    return ((((kind * N_STATIC + sclass) * N_CLASS + support) * N_SHARE + share) * N_CUR + cur) * N_LEN + eff


N_CELLS: Final[i64] = N_KIND * N_STATIC * N_CLASS * N_SHARE * N_CUR * N_LEN
"""Acceptance statistics of suffix tokens (see :func:`stat_cell`)."""
KIND_STRIDE: Final[i64] = N_STATIC * N_CLASS * N_SHARE * N_CUR * N_LEN
"""Cells of one kind of suffix draft: a cell at or above this is of kind 1 (see :func:`stat_cell`)."""


class HybridStep:
    """One proposal's bookkeeping (see :meth:`HybridState.last_step`): how many of its tokens were
    llama.cpp's (of a draft of ``llama_full``, the first ``confirmed`` of them confirmed by the
    suffix-only draft) and suffix tokens, their statistics' cells, (until the threshold's
    calibration) their running estimates, and its tokens after the one before them."""

    llama_full: i64
    llama: i64
    suffix: i64
    cells: vec[i64]
    confirmed: i64
    probs: list[float]
    tokens: vec[i32]

    def __init__(
        self,
        llama_full: i64,
        llama: i64,
        suffix: i64,
        cells: vec[i64],
        confirmed: i64,
        probs: list[float],
        tokens: vec[i32],
    ) -> None:
        self.llama_full = llama_full
        self.llama = llama
        self.suffix = suffix
        self.cells = cells
        self.confirmed = confirmed
        self.probs = probs
        self.tokens = tokens


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
    recent: i64
    _keys: vec[i64]
    _own: SuffixHistory | None
    _n_before: i64
    exponent_scores: vec[i64]
    pending: list[PendingScore]
    _cf_p: vec[i64]
    _cf_w: vec[i64]
    vote_total: i64
    vote_count: i64
    observed: i64
    last_probs: list[float]
    walk_probs: list[float]
    walk_factor: float
    calibration: list[float]
    token_factors: bool
    tok_ok: vec[i64]
    tok_exp: vec[i64]
    last_tokens: vec[i32]

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
        # tenths of a token, so the waste balance stays an integer (identical in both implementations)
        self.target_waste10 = i64(round(target_waste * 10))
        self.balance = 0
        self.recent = 0
        self.tried = zeros_i64(N_CELLS)
        self.ok = zeros_i64(N_CELLS)
        self.l_tried = zeros_i64(2 * N_LLAMA_CELLS)
        self.l_ok = zeros_i64(2 * N_LLAMA_CELLS)
        self.last_llama_full = 0
        self.last_confirmed = 0
        self.seen = 0
        self.last_llama = 0
        self.last_suffix = 0
        self.last_cells = vec[i64]()
        self._keys = keys_buffer()  # draft_core's scratch, one for every proposal
        # A detached proposal's request history (None: the history owner's proposal) and the
        # length of the request's tokens that start its queries: set by _propose for the
        # proposal being made.
        self._own = None
        self._n_before = 0
        # Which exponent of the age weights drafts best here (the reference's exponent()): the
        # scores, the scorings waiting for their text, and the counterfactual drafts' scratch
        # (their candidates and weights).
        self.exponent_scores = zeros_i64(N_EXPONENTS)
        self.pending = []
        self._cf_p = vec[i64]()
        self._cf_w = vec[i64]()
        self.vote_total = 0  # the last _vote's total weight (for share_class)
        self.vote_count = NOT_COUNTED  # the last _static_vote's winner's count (for selected_class)
        # The threshold's calibration (see _calibrate): the steps observed so far while steering
        # (up to CALIBRATE_AT); until then, the running estimates of the last proposal's tokens
        # and of the last walk's, and those of every drafted token those steps wasted. Lists of
        # floats (boxed), filled only during those first steps.
        self.observed = 0 if self.target_waste10 > 0 else CALIBRATE_AT  # a fixed threshold: none
        self.last_probs = []
        self.walk_probs = []
        # the last walk's estimate of its last drafted token, copy floor included (the replacement
        # in _suffix: the suffix-only draft's walk stops at its first disagreement with llama.cpp's)
        self.walk_factor = 0.0
        self.calibration = []
        # The token factors (the reference's tok_ok and tok_exp): slots by the token before a
        # drafted token, then by the drafted token; the last proposal's tokens, after the one
        # before them, for _observe to find their slots.
        self.tok_ok = zeros_i64(2 * TOKEN_SLOTS)
        self.tok_exp = zeros_i64(2 * TOKEN_SLOTS)
        self.last_tokens = vec[i32]()

    def request_history(self) -> SuffixHistory:
        """An empty history for one request's own tokens, to pass to :meth:`propose_detached`
        (it keeps it in step with the request's tokens) for as long as that request is detached."""
        own = SuffixHistory(OWN_MAX_TOKENS)
        own.add_separator()
        return own

    def begin_request(self) -> None:
        """Start a new request (the previous one stays in the history)."""
        self.history.add_separator()
        self.seen = 0
        self.last_llama = 0
        self.last_suffix = 0
        self.pending = []  # the scorings the request's end cut short are dropped

    def _sync(self, tokens: Sequence[int]) -> None:
        n = len(tokens)
        if n < self.seen:
            raise ValueError(
                f"tokens has {n} tokens but the request already had {self.seen}: "
                "call begin_request() before a new request"
            )
        if n > self.seen:
            self._append(to_vec(tokens, self.seen))

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
        """Add the current request's next token to the history; score the exponents at every
        SCORE_GRID-th (the reference's ``_append``)."""
        h = self.history
        n_toks = i64(len(h.toks))
        h.push(t)
        self.seen += 1
        if i64(len(h.toks)) != n_toks + 1:  # the history evicted its older half: the positions moved
            self.pending = []
        if self.seen % SCORE_GRID != 0:
            return
        self._score_exponents()
        best = h._collect(vec[i32](), self.max_candidates)
        h.last_best = best
        if best == 0:
            return
        cp = self._cf_p
        if i64(len(cp)) < h.n_cand:
            self._cf_p = zeros_i64(h.n_cand)
            self._cf_w = zeros_i64(h.n_cand)
            cp = self._cf_p
        n = self._weigh(best, EXPONENTS[0], cp, self._cf_w)  # the first exponent's draft starts from these
        nx = h.next_t
        h._next_tokens(cp, n, 0, nx)
        first = SEP
        for i in range(n):
            nt = nx[i]
            if nt == SEP:
                continue
            if first == SEP:
                first = nt
            elif nt != first:  # contested: what would each exponent draft?
                self._score_later(best, n)
                return

    def _append(self, tokens: vec[i32]) -> None:
        """Add the current request's next ``tokens`` (see :meth:`_push_token`)."""
        for j in range(len(tokens)):
            self._push_token(tokens[j])

    def _estimate(self, cell: i64) -> float:
        """Estimated acceptance of a suffix token of statistic ``cell``."""
        return (float(self.ok[cell]) + PRIOR_OK) / (float(self.tried[cell]) + PRIOR_TRIED)

    def _l_estimate(self, cell: i64) -> float:
        """Estimated acceptance of a llama.cpp token of statistic ``cell``."""
        return (float(self.l_ok[cell]) + PRIOR_OK) / (float(self.l_tried[cell]) + PRIOR_TRIED)

    def _tok_factor(self, slot: i64) -> float:
        """One token factor (the reference's ``_token_factor``): accepted over expected, with the prior."""
        return float(self.tok_ok[slot] + TOKEN_PRIOR) / float(self.tok_exp[slot] + TOKEN_PRIOR)

    def _by_token(self, rate: float, before: i64, token: i64) -> float:
        """A cell's ``rate`` for ``token`` after ``before``, with token factors (the reference's ``_by_token``)."""
        if not self.token_factors:
            return rate
        q = rate * self._tok_factor(before & TOKEN_MASK) * self._tok_factor(TOKEN_SLOTS + (token & TOKEN_MASK))
        return q if q < TOKEN_CAP else TOKEN_CAP

    def _learn_token(self, rate: float, before: i64, token: i64, accepted: bool) -> None:
        """A drafted token reached, whose cell's rate is ``rate`` now (the reference's ``_learn_token``)."""
        p = before & TOKEN_MASK
        t = TOKEN_SLOTS + (token & TOKEN_MASK)
        factor = self._tok_factor(p)
        ok: i64 = TOKEN_ONE if accepted else 0
        e_before: i64 = int(rate * TOKEN_ONE_F)
        e_token: i64 = int(rate * factor * TOKEN_ONE_F)
        self._tok_add(p, ok, e_before)
        self._tok_add(t, ok, e_token)

    def _tok_add(self, slot: i64, ok: i64, expected: i64) -> None:
        self.tok_ok[slot] += ok
        self.tok_exp[slot] += expected
        if self.tok_exp[slot] >= TOKEN_DECAY_AT:
            self.tok_ok[slot] //= 2
            self.tok_exp[slot] //= 2

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
        cells = vec[i64](capacity=room(n_max))
        h = self.history
        own = self._own
        if reuse:
            best = h.last_best  # the same query as the last call's, and nothing added since
        elif own is not None:
            best = h._collect_detached(own, q, self._n_before, self.max_candidates)
            h.last_best = best
        else:
            best = h._collect(q, self.max_candidates)
            h.last_best = best
        if best == 0:
            return drafted, cells
        # The candidates followed: every occurrence matching at most match_slack shorter than the
        # best, in h.act (n_act of them), newest first, with their votes' weights in h.act_w;
        # h.cand_p stays as _collect left it.
        act = h.act
        act_w = h.act_w
        n_act = self._weigh(best, self.exponent(), act, act_w)
        b2 = h._query_at(q, 1)  # the two tokens before the next drafted one
        b1 = h._query_at(q, 0)
        return self._walk(
            act, act_w, n_act, best, 0, n_max, prob, kind, b2, b1, st, drafted, cells, cmp, cmp_base, cmp_n
        )

    def _walk(
        self,
        act: vec[i64],
        act_w: vec[i64],
        n_act: i64,
        best: i64,
        k: i64,
        n_max: i64,
        prob: float,
        kind: i64,
        b2: i32,
        b1: i32,
        st: StaticSource,
        drafted: vec[i32],
        cells: vec[i64],
        cmp: vec[i32],
        cmp_base: i64,
        cmp_n: i64,
    ) -> tuple[vec[i32], vec[i64]]:
        """:meth:`_follow`'s draft from its ``k``-th token on (the reference's ``_walk``): the
        ``n_act`` candidates in ``act`` (narrowed in place as they disagree) vote with the weights
        in ``act_w``, ``b2``, ``b1`` are the two tokens before the next one, ``prob`` the running
        estimate so far; ``cmp``: see :meth:`_follow`. Appends to ``drafted`` and ``cells``."""
        h = self.history
        cur_start = self._cur_start()
        nx = h.next_t
        while k < n_max:
            h._next_tokens(act, n_act, k, nx)  # the request stream's or the corpus's (-1 past their ends)
            best_t, best_s = self._vote(act_w, n_act)
            if best_s == 0:
                break
            # the static index's part after the two tokens before: it joins a contested vote, and
            # gives the token's static class
            has_part = b2 != SEP and b1 != SEP and st._st_begin(b2, b1)
            contested = h.vote_n >= 2
            top = -1.0  # the winner's sum with the static share, where the static index joined
            win_c = NOT_COUNTED  # the winner's count in the static index, where _static_vote found it
            if has_part and contested:
                best_t, best_s, top = self._static_vote(st, best_t, best_s)
                win_c = self.vote_count
            total = float(self.vote_total)
            if top >= 0.0:
                share = share_class(top, joined_total(total), contested)
            else:
                share = share_class(float(best_s >> VOTE_W_SHIFT), total, contested)
            best_c = (best_s >> VOTE_C_SHIFT) & VOTE_RANK
            best_f = VOTE_RANK - (best_s & VOTE_RANK)
            cur = source_class(cur_start, act[best_f])
            sclass = selected_class(st, has_part, best_t, win_c)
            cell = stat_cell(best_c, n_act, best + k, sclass, kind, cur, share)
            factor = max(self._by_token(self._estimate(cell), i64(b1), i64(best_t)), copy_floor(best + k, share))
            prob = prob * factor
            if prob < self.threshold:
                break
            drafted = append(drafted, best_t)
            cells = append(cells, cell)
            self.walk_factor = factor
            if self.observed < CALIBRATE_AT:
                self.walk_probs.append(prob)
            b2 = b1
            b1 = best_t
            k += 1
            if cmp_n > 0 and (best_t != cmp[cmp_base + k - 1] or k >= cmp_n):
                break
            n_act = self._keep(act, act_w, n_act, best_t)
        return drafted, cells

    def _cur_start(self) -> i64:
        """Where :func:`source_class`'s current request starts: the history's last request, or for
        a detached request :data:`OWN_BASE` (its own tokens; the history's requests are all other ones)."""
        if self._own is not None:
            return OWN_BASE
        return self.history.req_start

    def exponent(self) -> int:
        """The exponent the age weights fall with now (the reference's ``HybridState.exponent``):
        the first of ``EXPONENTS``, unless another one's drafts would have had more than 1/16 + 64
        more tokens accepted at the points scored; then the best of those (the first on a tie)."""
        scores = self.exponent_scores
        best_i: i64 = 0
        for i in range(1, N_EXPONENTS):
            if scores[i] > scores[best_i] and scores[i] > scores[0] + scores[0] // EXPONENT_MARGIN + EXPONENT_LEAD:
                best_i = i
        return int(EXPONENTS[best_i])

    def _weigh(self, best: i64, exponent: i64, act: vec[i64], act_w: vec[i64]) -> i64:
        """Put the candidates followed (``_collect``'s that match at most match_slack shorter than
        ``best``, newest first) in ``act`` and their votes' weights by ``exponent`` in ``act_w``;
        returns how many."""
        h = self.history
        own = self._own
        cand = h.cand_p
        n_act: i64 = 0
        shortest = best - self.match_slack
        # Each followed occurrence votes with a weight by its age (vote_weight), counted back from
        # the end of the requests' stream, or for a detached request from the end of its own tokens
        # (after the history's: its own occurrences are its newest); the corpus's is fixed.
        n_toks = i64(len(h.toks))
        n_own: i64 = 0
        if own is not None:
            n_own = i64(len(own.toks))
        w_corpus = vote_weight(CORPUS_AGE, exponent)
        for j in range(h.n_cand):
            cl = h.cand_len[j]
            if cl >= shortest:
                cp = cand[j]
                act[n_act] = cp
                wt: i64 = w_corpus
                if cp >= OWN_BASE:
                    wt = vote_weight(n_own - (cp - OWN_BASE), exponent)
                elif cp < CORPUS_BASE:
                    wt = vote_weight(n_own + n_toks - cp, exponent)
                if cl < best:  # a match shorter than the longest: a quarter of the vote
                    wt >>= SHORTER_SHIFT
                act_w[n_act] = wt
                n_act += 1
        return n_act

    def _vote(self, act_w: vec[i64], n_act: i64) -> tuple[i32, i64]:
        """The token with the heaviest vote among the ``n_act`` candidates whose next tokens are in
        the history's ``next_t`` (weighing ``act_w``) and its vote slot's score (0: no vote).

        The weights are summed; on a tie the most followed wins, then the newest one's, i.e. the
        one whose first (newest) candidate comes first. Counted in an open-addressing table of at
        least twice the candidates (O(candidates), where comparing with each distinct token so far
        was O(candidates x distinct tokens): the cost of the one-token fallback's 64 votes). A
        slot is two words, so a probe reads two vecs (each read is a bounds check too): its key,
        this round's stamp << 32 | the token (a slot of an older stamp is free: no clearing), and
        its score (see VOTE_RANK), so the highest score is the vote's winner, ties included. The
        slots this round took are listed in the history's ``vote_g`` (``vote_n`` of them), for
        :meth:`_static_vote`.
        """
        h = self.history
        vk = h.vote_k
        vs = h.vote_s
        vmask = h.vote_mask
        nx = h.next_t
        stamp = h.vote_stamp + 1
        if stamp >= VOTE_STAMP_MAX:  # the key's high half would overflow: start the table afresh
            for g in range(vmask + 1):
                vk[g] = 0
            stamp = 1
        h.vote_stamp = stamp
        high = stamp << 32
        vg = h.vote_g
        n_new: i64 = 0
        best_t = SEP
        best_s: i64 = 0
        sc: i64 = 0
        total: i64 = 0
        for i in range(n_act):
            ti = nx[i]
            if ti == SEP:
                continue
            total += act_w[i]
            key = high | i64(ti)
            g = ((i64(ti) * VOTE_HASH) >> 16) & vmask  # ti < 2^31: no overflow, interpreted or compiled
            while True:
                w = vk[g]
                if w == key:
                    sc = vs[g] + (act_w[i] << VOTE_W_SHIFT) + (1 << VOTE_C_SHIFT)
                    vs[g] = sc
                    break
                if w < high:  # an older round's (or never used): free
                    vk[g] = key
                    sc = (act_w[i] << VOTE_W_SHIFT) + (1 << VOTE_C_SHIFT) + (VOTE_RANK - i)
                    vs[g] = sc
                    vg[n_new] = g
                    n_new += 1
                    break
                g = (g + 1) & vmask
            if sc > best_s:
                best_s = sc
                best_t = ti
        h.vote_n = n_new
        self.vote_total = total
        return best_t, best_s

    def _static_vote(self, st: StaticSource, best_t: i32, best_s: i64) -> tuple[i32, i64, float]:
        """The winner of the last :meth:`_vote` (``best_t``, its slot's score ``best_s``) when the
        static index's counts in the part ``st`` has selected join it (the reference's ``_vote``
        with a part): each token's weight sum plus the vote's total / STATIC_VOTE_DIV times its
        share of the tokens' counts, a float computed in the reference's order; on a tie, the
        higher slot score. Returns the winner, its slot's score and its sum; unchanged, and -1.0
        for the sum, when the part counts none of the tokens. Leaves the winner's count in
        ``vote_count`` where it is positive, else NOT_COUNTED: :func:`selected_class` needs it too,
        as ``_st_count`` gave it (the vote counts ABSENT and a negative count, one past 2^31 in
        32 bits, alike as 0; the class does not)."""
        h = self.history
        vg = h.vote_g
        vc = h.vote_c
        vk = h.vote_k
        vs = h.vote_s
        n = h.vote_n
        total: i64 = 0
        n_static: i64 = 0
        for j in range(n):
            g = vg[j]
            total += vs[g] >> VOTE_W_SHIFT
            c = st._st_count(low32(vk[g]))  # the key's low half is the token
            if c < 0:  # ABSENT
                c = 0
            vc[j] = c
            n_static += c
        self.vote_count = NOT_COUNTED
        if n_static == 0:
            return best_t, best_s, -1.0
        den = STATIC_VOTE_DIV * float(n_static)
        top = -1.0
        for j in range(n):
            g = vg[j]
            sc = vs[g]
            a = float(sc >> VOTE_W_SHIFT) + float(total) * float(vc[j]) / den
            if a > top or (a == top and sc > best_s):
                top = a
                best_s = sc
                best_t = low32(vk[g])
                self.vote_count = NOT_COUNTED  # an if, not a conditional expression: mypyc boxed that
                if vc[j] > 0:
                    self.vote_count = vc[j]
        return best_t, best_s, top

    def _keep(self, act: vec[i64], act_w: vec[i64], n_act: i64, t: i32) -> i64:
        """Keep (in place, in order) the candidates whose next token (the history's ``next_t``) is
        ``t``, with their weights; returns how many."""
        nx = self.history.next_t
        n_kept: i64 = 0
        for i in range(n_act):
            if nx[i] == t:
                act[n_kept] = act[i]
                act_w[n_kept] = act_w[i]
                n_kept += 1
        return n_kept

    def _score_later(self, best: i64, n_first: i64) -> None:
        """Keep the draft each exponent would make from the candidates ``_collect`` left (up to
        SCORE_LEN vote winners, no threshold), to score once the text has gone that far. The
        first exponent's ``n_first`` candidates and weights are already in the scratch vecs
        (:meth:`_push_token` weighed them to see the vote contested)."""
        h = self.history
        cp = self._cf_p
        cw = self._cf_w
        nx = h.next_t
        drafts = vec[i32]()
        ends = vec[i64]()
        for i in range(N_EXPONENTS):
            n = n_first
            if i > 0:  # the first's draft narrowed the scratch vecs: weigh afresh
                n = self._weigh(best, EXPONENTS[i], cp, cw)
            k: i64 = 0
            while k < SCORE_LEN:
                h._next_tokens(cp, n, k, nx)
                t, sc = self._vote(cw, n)
                if sc == 0:
                    break
                drafts = append(drafts, t)
                k += 1
                n = self._keep(cp, cw, n, t)
            ends = append(ends, i64(len(drafts)))
        self.pending.append(PendingScore(i64(len(h.toks)), drafts, ends))

    def _score_exponents(self) -> None:
        """Score the pending drafts whose text has arrived (the reference's ``_score_exponents``)."""
        h = self.history
        toks = h.toks
        n_toks = i64(len(toks))
        scores = self.exponent_scores
        while len(self.pending) > 0:
            pd = self.pending[0]
            if n_toks < pd.at + pd.need:
                break  # later ones need more
            self.pending.pop(0)
            at = pd.at
            d = pd.drafts
            prev: i64 = 0
            top: i64 = 0
            for i in range(N_EXPONENTS):
                end = pd.ends[i]
                n: i64 = 0
                while prev + n < end and d[prev + n] == toks[at + n]:
                    n += 1
                scores[i] += n
                if scores[i] > top:
                    top = scores[i]
                prev = end
            if top >= EXPONENT_DECAY_AT:
                for i in range(N_EXPONENTS):
                    scores[i] //= 2

    def _suffix(self, drafted: vec[i32], base: i64, n_draft: i64, before: vec[i32], st: StaticSource) -> vec[i32]:
        """Choose, trim and extend ``drafted[base:]`` (llama.cpp's draft); returns the vec.

        When llama.cpp drafted, the suffix-only draft (from the request alone, kind 1) is made
        first: it confirms llama.cpp's first tokens where it agrees, and replaces the whole draft
        where they first disagree if its token there has a higher estimate than llama.cpp's
        (its copy floor included; the tokens before are the same in both). Otherwise llama.cpp's tokens are kept while
        the running estimate stays at or above the threshold, and suffix-match tokens (kind 0)
        follow under the same running estimate. ``before`` is what precedes the draft in the
        query: empty for the history's current request (its tokens end the stream), else a
        detached request's last tokens (see :meth:`propose_detached`).
        """
        m_full = i64(len(drafted)) - base
        self.last_llama_full = m_full
        self.last_suffix = 0
        self.last_confirmed = 0
        calibrating = self.observed < CALIBRATE_AT
        if calibrating:  # only then: a list per proposal was 1 % of the replay's instructions
            self.last_probs = []
        if m_full > 0:
            alt = vec[i32](capacity=room(base + n_draft))
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
                agree < n_alt
                and agree < m_full
                # the disagreeing token is the walk's last (see walk_factor); the reference says why
                and self.walk_factor
                > self._by_token(
                    self._l_estimate(llama_cell(m_full, agree, False)),
                    i64(drafted[base + agree - 1]),
                    i64(drafted[base + agree]),
                )
            ):
                alt = vec[i32](capacity=room(base + n_draft))
                for j in range(base):
                    alt = append(alt, drafted[j])
                if calibrating:
                    self.walk_probs = []
                alt, alt_cells = self._follow(before, alt, n_draft, 1.0, 1, st, drafted, base, 0, True)
                self.last_llama = 0
                self.last_suffix = i64(len(alt_cells))
                self.last_cells = alt_cells
                if calibrating:
                    self.last_probs = self.walk_probs
                self._keep_tokens(alt, base)
                return alt
        prob = 1.0
        m: i64 = 0
        while m < m_full:
            p_ok = self._by_token(
                self._l_estimate(llama_cell(m_full, m, m < self.last_confirmed)),
                i64(drafted[base + m - 1]),
                i64(drafted[base + m]),
            )
            if prob * p_ok < self.threshold:
                break
            prob = prob * p_ok
            if calibrating:
                self.last_probs.append(prob)
            m += 1
        if m < m_full:
            kept = vec[i32](capacity=room(base + n_draft))
            for j in range(base + m):
                kept = append(kept, drafted[j])
            drafted = kept
        self.last_llama = m
        if m >= n_draft:
            self._keep_tokens(drafted, base)
            return drafted
        q = vec[i32](capacity=i64(len(before)) + m)
        for j in range(len(before)):
            q = append(q, before[j])
        for j in range(base, len(drafted)):
            q = append(q, drafted[j])
        # m == 0 after a suffix-only draft: the same query as that draft's (``before``)
        if calibrating:
            self.walk_probs = []
        drafted, cells = self._follow(
            q,
            drafted,
            n_draft - m,
            prob,
            0,
            st,
            drafted,
            base,
            0,
            m == 0 and m_full > 0,
        )
        self.last_suffix = i64(len(cells))
        self.last_cells = cells
        if calibrating:
            self.last_probs.extend(self.walk_probs)
        self._keep_tokens(drafted, base)
        return drafted

    def _keep_tokens(self, drafted: vec[i32], base: i64) -> None:
        """The proposal ``drafted[base:]`` after the token before it, for :meth:`_observe`."""
        kept = vec[i32](capacity=i64(len(drafted)) - base + 1)
        for j in range(base - 1, len(drafted)):
            kept = append(kept, drafted[j])
        self.last_tokens = kept

    def _observe(self, n_accepted: i64) -> None:
        m = self.last_llama
        s = self.last_suffix
        if self.target_waste10 > 0:
            # The waste controller (see the reference's observe): the threshold rises when the
            # recent balance plus an eighth of the run's is overspent, else it falls. Balances in
            # tenths of a token; >> is floor division on negative values too, as in Python.
            wasted = m + s - n_accepted if n_accepted < m + s else 0
            e = self.target_waste10 - 10 * wasted
            b = self.balance + e
            b = BALANCE_CAP if b > BALANCE_CAP else (-BALANCE_CAP if b < -BALANCE_CAP else b)
            self.balance = b
            r = self.recent + e
            r -= r >> RECENT_SHIFT
            self.recent = r
            t = self.threshold * THRESHOLD_STEP if r + (b >> RUN_SHIFT) < 0 else self.threshold / THRESHOLD_STEP
            self.threshold = THRESHOLD_MAX if t > THRESHOLD_MAX else (THRESHOLD_MIN if t < THRESHOLD_MIN else t)
            if self.observed < CALIBRATE_AT:
                self.observed += 1
                probs = self.last_probs
                for i in range(n_accepted, min(m + s, i64(len(probs)))):  # this step's wasted tokens
                    self.calibration.append(probs[i])
                if self.observed == CALIBRATE_AT:
                    self._calibrate()
                    # No more estimates are recorded (see _suffix's ``calibrating``): drop the last
                    # lists, which last_step() would otherwise hand out stale.
                    self.last_probs = []
                    self.walk_probs = []
        toks = self.last_tokens
        j: i64 = 0
        while j < m and j <= n_accepted:  # llama.cpp's tokens reached: the accepted ones and the first miss
            cell = llama_cell(self.last_llama_full, j, j < self.last_confirmed)
            self._learn_token(self._l_estimate(cell), i64(toks[j]), i64(toks[j + 1]), j < n_accepted)
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
                self._learn_token(self._estimate(off), i64(toks[m + k]), i64(toks[m + k + 1]), k < acc)
                self.tried[off] += 1
                if k < acc:
                    self.ok[off] += 1
                if self.tried[off] >= DECAY_AT:
                    self.tried[off] //= 2
                    self.ok[off] //= 2
                k += 1
        self.last_llama = 0
        self.last_suffix = 0

    def _calibrate(self) -> None:
        """Raise the threshold, once, to where the first CALIBRATE_AT steps would have wasted no
        more than the target (the reference's ``_calibrate``): where they wasted more than
        CALIBRATE_MARGIN / 10 times it, it rises by CALIBRATE_GRID until no more than the
        target's worth of the tokens they wasted had a running estimate at or above it; the
        balances start afresh. The same float products as the reference's, in the same order."""
        wasted = sorted(self.calibration)
        self.calibration = []
        n = i64(len(wasted))
        budget = self.target_waste10 * CALIBRATE_AT  # tenths of a token
        if 100 * n <= CALIBRATE_MARGIN * budget:
            return
        t = self.threshold
        below: i64 = 0  # wasted[below:] are the estimates at or above t: one pass as t rises
        while t < THRESHOLD_MAX:
            t = min(t * CALIBRATE_GRID, THRESHOLD_MAX)
            while below < n and wasted[below] < t:
                below += 1
            if 10 * (n - below) <= budget:
                break
        self.threshold = t
        self.balance = 0
        self.recent = 0

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
        own: SuffixHistory | None = None,
    ) -> list[int]:
        """Like :meth:`propose`, for a request that is not the history's current one.

        For a request open at the same time as the one whose tokens the history is following:
        the match is sought for its own last tokens (``tokens``, the whole request so far)
        among the history's occurrences, and among its own earlier tokens, which ``own`` holds
        (from :meth:`request_history`, one per request, passed at each of its proposals; this
        adds the tokens it lacks). Its own occurrences come first, as the newest; for it the
        history owner's tokens are an earlier request's. ``own`` None: one is built from
        ``tokens`` for this call. Its tokens are not added to the shared history. Observe it
        like any proposal (see :meth:`last_step`).
        """
        return self._propose(tokens, n_draft, nc_context, nc_dynamic, nc_static, True, 1, None, own)

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
        own: SuffixHistory | None = None,
    ) -> list[int]:
        if n_draft < 0:
            raise ValueError(f"n_draft must be >= 0, got {n_draft}")
        h = self.history
        if not detached:
            self._sync(tokens)
        else:
            if own is None:
                own = self.request_history()
            held = i64(len(own.toks)) - 1  # after its separator
            n_tokens = i64(len(tokens))
            if n_tokens < held:
                raise ValueError(
                    f"tokens has {n_tokens} tokens but its request history already holds {held}: "
                    "one request history per request"
                )
            if n_tokens > held:
                own.extend(tokens[held:])
            if n_tokens > 0:
                self._own = own
                h.own = own
        try:
            return self._propose_with(tokens, n_draft, nc_context, nc_dynamic, nc_static, detached, branches, tree)
        finally:
            self._own = None
            h.own = None

    def _propose_with(
        self,
        tokens: Sequence[int],
        n_draft: int,
        nc_context: NgramCache,
        nc_dynamic: NgramCache,
        nc_static: object,
        detached: bool,
        branches: i64,
        tree: list[list[int]] | None,
    ) -> list[int]:
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
            tail = draft_core(tail, n, n_draft, NGRAM_MIN, NGRAM_MAX, nc_context, nc_dynamic, st, self._keys)
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
        self._n_before = i64(len(before))
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
        return HybridStep(
            self.last_llama_full,
            self.last_llama,
            self.last_suffix,
            self.last_cells,
            self.last_confirmed,
            self.last_probs,
            self.last_tokens,
        )

    def resume_step(self, step: HybridStep) -> None:
        """Make ``step`` (from :meth:`last_step`) the proposal the next :meth:`observe` is about."""
        self.last_llama_full = step.llama_full
        self.last_llama = step.llama
        self.last_suffix = step.suffix
        self.last_cells = step.cells
        self.last_confirmed = step.confirmed
        self.last_probs = step.probs
        self.last_tokens = step.tokens

    def observe(self, n_accepted: int, committed: Sequence[int] = ()) -> None:
        """Record that the engine accepted the first ``n_accepted`` tokens of the last proposal.

        ``committed`` (optional) are the tokens the request grew by (accepted and sampled);
        they may instead be passed with the next :meth:`propose`.
        """
        if n_accepted < 0:
            raise ValueError(f"n_accepted must be >= 0, got {n_accepted}")
        self._observe(n_accepted)
        if len(committed) > 0:
            self._append(to_vec(committed))

    def propose_tree(
        self,
        tokens: Sequence[int],
        n_draft: int,
        nc_context: NgramCache,
        nc_dynamic: NgramCache,
        nc_static: object = None,
        branches: int = 3,
        detached: bool = False,
        own: SuffixHistory | None = None,
    ) -> list[list[int]]:
        """Up to ``branches`` drafts after ``tokens``, for an engine that verifies them as a tree.

        The first is exactly :meth:`propose`'s (:meth:`propose_detached`'s with ``detached``,
        and its ``own``)
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
        check_branches(branches, "hybrid")
        tree: list[list[int]] = []
        self._propose(tokens, n_draft, nc_context, nc_dynamic, nc_static, detached, branches, tree, own)
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
        b0 = vec[i32](capacity=room(n_draft))
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
                toks = self.last_tokens  # the token before the proposal, then branch 0
                for j in range(m):  # the running estimate after llama.cpp's kept tokens, as _suffix has it
                    rate = self._l_estimate(llama_cell(m_full, j, j < self.last_confirmed))
                    prob = prob * self._by_token(rate, i64(toks[j]), i64(toks[j + 1]))
            q = vec[i32](capacity=i64(len(before)) + m)
            for j in range(len(before)):
                q = append(q, before[j])
            for j in range(m):
                q = append(q, b0[j])
            self._runner_ups(q, b0, m, prob, kind, st, n_draft - m, branches, tree)
        if m > 0 and i64(len(tree)) < branches:
            # The suffix-only draft (one more search): it differs where llama.cpp's kept tokens do.
            alt = vec[i32](capacity=room(n_draft))
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
        suffix token, after the query ``q``) in its place (the reference's ``_runner_ups``): ranked
        as the vote ranks its tokens, the static index's share included, but with the gentlest age
        weights (``EXPONENTS[0]``), and each continued as :meth:`_follow` continues a draft, with
        the exponent in use, while the running estimate from ``prob`` stays at or above the
        threshold. At most ``branches - 1`` runner-ups are tried."""
        h = self.history
        best = h.last_best
        n_cand = h.n_cand
        # the candidates _collect left (branch 0's, whose vote chose b0[m]), weighed twice: gently
        # to rank the runner-ups, by the exponent in use to continue them (the same order)
        act0 = zeros_i64(n_cand)
        gentle = zeros_i64(n_cand)
        n0 = self._weigh(best, EXPONENTS[0], act0, gentle)
        exponent = i64(self.exponent())
        w0 = gentle
        if exponent != EXPONENTS[0]:
            w0 = zeros_i64(n_cand)
            self._weigh(best, exponent, act0, w0)
        nx0 = filled_i32(n0, SEP)
        h._next_tokens(act0, n0, 0, nx0)
        h._next_tokens(act0, n0, 0, h.next_t)  # _vote's input
        b2 = h._query_at(q, 1)
        b1 = h._query_at(q, 0)
        t0, s0 = self._vote(gentle, n0)
        contested = h.vote_n >= 2
        joined = False
        if contested and b2 != SEP and b1 != SEP and st._st_begin(b2, b1):
            joined = self._static_vote(st, t0, s0)[2] >= 0.0  # fills vote_c with the counts
        # the vote's slots (each token voted for), and every token's sum as _static_vote has it
        vg = h.vote_g
        vk = h.vote_k
        vs = h.vote_s
        vc = h.vote_c
        n_slots = h.vote_n
        total = float(self.vote_total)
        whole = total
        # every slot's sum (a list: vec holds no floats; a few dozen per tree proposal)
        slot_sums: list[float] = []
        for j in range(n_slots):
            slot_sums.append(float(vs[vg[j]] >> VOTE_W_SHIFT))
        if joined:
            n_static: i64 = 0
            for j in range(n_slots):
                n_static += vc[j]
            den = STATIC_VOTE_DIV * float(n_static)
            whole = joined_total(total)
            for j in range(n_slots):
                slot_sums[j] = slot_sums[j] + total * float(vc[j]) / den  # _static_vote's order
        # The runner-ups first (the continuations' votes reuse the table): the highest sums, then
        # slot scores, as the reference's sort; their sums and slot scores kept.
        taken = vec[i32]()
        taken = append(taken, b0[m])
        sums: list[float] = []
        scores = vec[i64]()
        for _r in range(branches - 1):  # ``_r``, not ``_``: see _tables.filled_i32
            pick: i64 = -1
            top = 0.0
            for j in range(n_slots):
                skipped = False
                for i in range(len(taken)):
                    if taken[i] == low32(vk[vg[j]]):
                        skipped = True
                if skipped:
                    continue
                a = slot_sums[j]
                if pick >= 0 and (a < top or (a == top and vs[vg[j]] < vs[vg[pick]])):
                    continue  # no tuples compared here: mypyc would box them per slot
                pick = j
                top = a
            if pick < 0:
                break
            taken = append(taken, low32(vk[vg[pick]]))
            sums.append(slot_sums[pick])
            scores = append(scores, vs[vg[pick]])
        cur_start = self._cur_start()
        none = vec[i32]()
        for ri in range(len(scores)):
            if i64(len(tree)) >= branches:
                break
            sc = scores[ri]
            r = taken[ri + 1]
            c = (sc >> VOTE_C_SHIFT) & VOTE_RANK
            f = VOTE_RANK - (sc & VOTE_RANK)
            cur = source_class(cur_start, act0[f])
            share = share_class(sums[ri], whole, contested)
            rate = self._estimate(stat_cell(c, n0, best, static_class(st, b2, b1, r), kind, cur, share))
            p = prob * self._by_token(rate, i64(b1), i64(r))
            if p < self.threshold:
                continue
            d = vec[i32](capacity=room(m + n_max))
            for j in range(m):
                d = append(d, b0[j])
            d = append(d, r)
            act = vec[i64](capacity=c)
            act_w = vec[i64](capacity=c)
            for i in range(n0):
                if nx0[i] == r:
                    act = append(act, act0[i])
                    act_w = append(act_w, w0[i])
            n_act = i64(len(act))
            d, _cells = self._walk(act, act_w, n_act, best, 1, n_max, p, kind, b1, r, st, d, vec[i64](), none, 0, 0)
            add_branch(tree, d, branches)
