"""lookupdec inside inference engines: transformers, vLLM and llama-cpp-python.

Each adapter module imports its engine only when it is imported itself, so ``import lookupdec``
never pulls torch, vLLM or llama-cpp-python. Install an engine with its extra:
``pip install 'lookupdec[transformers]'``, ``'lookupdec[vllm]'``, ``'lookupdec[llama-cpp]'``.

This package's own code (:class:`HistoryFollower`) is engine-free: it maps "the committed
history, as the engine shows it each step" onto a :class:`lookupdec.Drafter` request.
:class:`IsolatedDrafter` stands in for a Drafter where requests must not draft from one another.
"""

from __future__ import annotations

import math
import operator
import time
from collections.abc import Collection, Sequence
from typing import Any

from lookupdec.errors import VocabularyError
from lookupdec.rules import MAX_DRAFT

STREAKS = 3
""":class:`DraftLength` learns acceptance apart after 0, 1, and 2 or more drafts accepted whole in a row."""
SOURCES = 2
""":class:`DraftLength` learns acceptance apart by where a draft's first token comes from:
:data:`RULE` or :data:`SUFFIX`."""
RULE = 0
"""A draft that begins with llama.cpp's rule's tokens: every draft of the llama policy, and the hybrid
policy's drafts that keep llama.cpp's (see :attr:`lookupdec.Request.rule_tokens`)."""
SUFFIX = 1
"""A draft of the hybrid policy's suffix match alone (llama.cpp's rule drafted nothing there, or was replaced)."""


def _line(points: list[tuple[int, float]], n: int) -> float:
    """The cost at ``n`` on the line through the two points of ``points`` (sorted, 2 or more) nearest to it.

    Between two points, interpolated; past the last, extended (at least the last cost); before
    the first, extended back (between the first cost and that cost scaled to ``n``)."""
    lower = [p for p in points if p[0] < n]
    upper = [p for p in points if p[0] > n]
    if lower and upper:
        (a, ca), (b, cb) = lower[-1], upper[0]
        return ca + (cb - ca) * (n - a) / (b - a)
    if lower:
        (a, ca), (b, cb) = lower[-2], lower[-1]
        return max(cb, cb + (cb - ca) * (n - b) / (b - a))
    (a, ca), (b, cb) = upper[0], upper[1]
    return min(ca, max(ca * n / a, ca - (cb - ca) * (a - n) / (b - a)))


class DraftLength:
    """How many drafted tokens to send, so that drafting never makes generation slower.

    A draft of ``d`` tokens makes the engine verify ``d + 1`` tokens in one step, which costs
    ``T(d + 1)``; it yields ``E(d) = 1 + p1 + p1 p2 + ... + p1...pd`` tokens, where ``pi`` is how
    often the ``i``-th drafted token was accepted when the ones before it were. :meth:`choose`
    picks the ``d <= k`` that maximizes tokens per second, ``E(d) / T(d + 1)``, from what this
    engine's steps measured (:meth:`observe_step`: the wall time of a step by how many tokens it
    verified) and what its drafts achieved (:meth:`observe_accept`), both weighted towards the
    recent (``decay`` per observation of the same kind). On a GPU, where ``T`` barely grows with the tokens, that
    is the full ``k`` whenever drafts are accepted at all; on a CPU, where verifying 5 tokens can
    cost 3 single steps, it drafts only what is likely to be accepted, and nothing when nothing is.

    The ``i``-th position is counted only in drafts whose tokens before it were accepted (a token
    after a rejected one was never reached), so one early miss does not count against every
    later position.

    Acceptance is learned in :data:`STREAKS` tables, by how many of the generation's last
    drafts were accepted whole in a row: none (after a miss, no draft, or at a generation's
    start), one, or two and more (the text is being copied: the next draft likely is too).
    Copied spans run long (an edited file, a quoted passage), so one acceptance for all steps
    would keep a draft length learned on new text through the copy that follows, and the
    other way round. (Measured with ``python -m perf speedup --texts wikitext,code,edits``: with
    one table, the edits drafted half of what a fixed length did.)

    Acceptance is also learned apart by the draft's source (:data:`SOURCES`): a draft of the
    hybrid policy that begins with llama.cpp's rule's tokens is accepted far more often than one
    of its suffix match alone, so one acceptance for both would draft neither where verification
    is dear. The adapter asks :meth:`choose` for the longest draft any source may pay for,
    proposes it, then cuts it to :meth:`fit` for the source it came from. (Measured with SmolLM2
    in llama-cpp-python, where verifying 2 tokens costs 1.57 single steps: see docs/speedup.md.)

    Until a cost is measured it is taken as the nearest measured one (optimistic, so that long
    drafts are tried and measured); the acceptance starts at 1 for the same reason. A draft must
    promise ``margin`` more tokens per second than none. One controller can serve every
    generation on the same engine (the costs are the engine's): engines' adapters keep theirs. After
    ``explore`` steps in a row without a draft, one token is drafted anyway, so that a text that
    becomes predictable again is noticed (then after twice as many, up to 64 times ``explore``,
    while drafting still does not pay). Those steps are counted per streak: "no draft" ends a
    streak, so a streak whose table says "draft nothing" would otherwise never be observed again.
    An exploring draft of llama.cpp's rule accepted whole is followed at once by the shortest
    draft from twice its length that would pay were it accepted whole, and so on up to ``k``
    while they are accepted whole (the ladder): where one drafted token costs more than it can
    yield (a steep CPU curve, ``T(2)`` near ``2 T(1)``), exploring one token at a time never
    shows that a copy has begun. (Measured in llama-cpp-python with SmolLM2 and Gemma 3 on
    sixteen task prompts, against the controller without it: docs/speedup.md.)

    Within a streak of whole drafts, a length ``d`` that pays is probed one token further
    (``d + 1`` is sent) when position ``d + 1`` has been reached less than half as often as
    position ``d`` lately and a draft of ``d + 1`` would pay more than ``d`` were its last token
    always accepted (else the cost stops it, not the acceptance), after ``explore`` such steps
    (twice as many after each probe that is not accepted whole, and at once again after one
    that is). A copy whose drafts were cut short by what other text taught then lengthens them
    again. Each new generation (:meth:`start`) resets these waits, as a new text may copy where
    the last ones did not.

    A cost not measured for ``stale`` steps counts at most what the fresh costs imply, and a
    step under half its length's average restarts that average (:meth:`costs`): on a shared
    machine a burst of another job's load makes the lengths measured during it look dear, and a
    length that looks dear is never sent to be measured again, or too rarely to wash the load out.

    Without exploring per streak, probing and the reset, learning on WikiText and code before
    the edits kept the drafts there short where verification costs: on fake clocks with the
    verify curves of docs/speedup.md (``python -m perf length-replay``), the edits gain 9-19 %
    with them. Real engines, noisier, measured level or up to 5 % behind, within their noise
    (docs/speedup.md, "The adaptive length's waits").
    """

    def __init__(self, k: int, decay: float = 0.95, explore: int = 8, margin: float = 0.03, stale: int = 128) -> None:
        # checked here: out of range they failed later, deep inside (IndexError, ZeroDivisionError)
        k = operator.index(k)  # 4.5 failed making the tables ("can't multiply sequence by non-int")
        if not 0 <= k <= MAX_DRAFT:
            raise ValueError(f"k must be in 0..{MAX_DRAFT}, got {k}")
        if not 0 < decay < 1:
            raise ValueError(f"decay must be in (0, 1), got {decay}")
        if explore < 1 or stale < 1:
            raise ValueError(f"explore and stale must be >= 1, got {explore} and {stale}")
        if not 0 <= margin < 1:  # nan passed, and then no draft ever paid
            raise ValueError(f"margin must be in [0, 1), got {margin}")
        self.k = k
        """The longest draft."""
        self.stale = stale
        """Steps after which a cost not measured since is taken as never measured (see :meth:`costs`)."""
        self.margin = margin
        """How much faster (a fraction) a draft must promise to be than no draft: estimates are noisy."""
        self.decay = decay
        """The weight an observation keeps after each newer one (per kind)."""
        self.explore = explore
        """Steps without a draft after which one token is drafted anyway."""
        # decayed sums: step seconds and step counts by tokens verified (index n: n tokens)
        self._cost = [0.0] * (k + 2)
        self._cost_w = [0.0] * (k + 2)
        self._cost_at = [0] * (k + 2)  # the step (observe_step's count) that last measured each
        self._steps = 0
        # decayed counts by draft position (index i: the i-th drafted token, 1-based), one table
        # per source and streak (the drafts accepted whole in a row just before, at most STREAKS - 1)
        self._accepted = [[[1.0] * (k + 1) for _ in range(STREAKS)] for _ in range(SOURCES)]
        self._tried = [[[1.0] * (k + 1) for _ in range(STREAKS)] for _ in range(SOURCES)]
        # the same tables' positions reached lately: every position decays with each observation
        # of its table (the ones past the draft with nothing added), so that choose() sees which
        # lengths have not been tried for a while
        self._recent = [[[0.0] * (k + 1) for _ in range(STREAKS)] for _ in range(SOURCES)]
        # the sources drafts came from so far: a source the drafter never uses (the llama
        # policy's SUFFIX) must not make choose() ask for drafts on its untried optimism
        self._seen = [True] + [False] * (SOURCES - 1)
        self._streak = 0
        self._reset_waits()
        self._probing = False  # the last choose() probed one position further
        self._explored = False  # the last choose() was an exploring (or probing) draft: fit() keeps it
        self._ladder = 0  # the next draft's length at least: an exploring draft accepted whole, doubled
        self._climbing = False  # the last draft sent was an exploring one or the ladder's
        self._chosen_costs = [1.0] * (k + 1)  # the costs choose() used: fit() comes in the same step

    def observe_step(self, verified: int, seconds: float) -> None:
        """A step verified ``verified`` tokens (the draft and the model's own) in ``seconds``."""
        if not 1 <= verified <= self.k + 1 or not 0 < seconds < math.inf:
            return  # nan or inf would stay in the average for good (and no draft would pay again)
        self._steps += 1
        w = self._cost_w[verified]
        if self._steps - self._cost_at[verified] > self.stale or (w > 0 and seconds < 0.5 * self._cost[verified] / w):
            # Measured again after being stale, or under half its average: the old average is
            # likely a burst of load's (on a shared machine; load only ever slows a step), and
            # diluted into the new one it would keep the length dear long after the load ended.
            self._cost[verified] = self._cost_w[verified] = 0.0
        # Each length keeps its own recent average: a cost is the engine's.
        self._cost[verified] = self._cost[verified] * self.decay + seconds
        self._cost_w[verified] = self._cost_w[verified] * self.decay + 1.0
        self._cost_at[verified] = self._steps

    def observe_accept(self, drafted: int, accepted: int, source: int = RULE) -> None:
        """``accepted`` of a draft's first ``drafted`` tokens were accepted (a step of the same generation).

        ``source``: where the draft came from (:data:`RULE` or :data:`SUFFIX`)."""
        _check_source(source)
        probed, self._probing = self._probing, False
        climbed, self._climbing = self._climbing, False
        # An exploring draft accepted whole is followed at once by one twice as long, and so on
        # up to k while they are accepted whole: the ladder. Where one token cannot pay for its
        # verification (Gemma 3 in llama.cpp: T(2) 2.3x T(1)), exploring one token at a time
        # never shows that longer drafts would (docs/speedup.md: a copy task drafted 3 tokens in
        # 92 steps after other prompts had taught the tables that drafts fail). Only llama.cpp's
        # rule's drafts climb: with the hybrid policy's suffix-only drafts climbing too, its
        # real-engine runs gained less (docs/performance-log.md, 2026-12-07 morning).
        whole = climbed and source == RULE and drafted > 0 and accepted >= drafted
        self._ladder = min(self.k, 2 * drafted) if whole else 0
        if drafted <= 0:
            self._streak = 0
            return
        self._seen[source] = True
        d = self.decay
        s = self._streak
        if probed and accepted >= drafted:
            self._probe_patience[s] = 1  # the probe was accepted: probe again at once, until the table follows
        tried = self._tried[source][s]
        ok = self._accepted[source][s]
        # A position counts only where the tokens before it were accepted: its acceptance is
        # conditional, as _best() multiplies it. Counting the positions past the first rejected
        # token as tried too (until 2026-12-06) counted that one miss again at every later
        # position, so one early miss made every long draft look unlikely: on copied text, where
        # a draft either follows the copy or fails early, long drafts were cut (docs/speedup.md,
        # "Acceptance given the tokens before").
        for i in range(1, min(drafted, accepted + 1, self.k) + 1):
            tried[i] = tried[i] * d + 1.0
            ok[i] = ok[i] * d + (1.0 if i <= accepted else 0.0)
        recent = self._recent[source][s]
        for i in range(1, self.k + 1):
            recent[i] = recent[i] * d + (1.0 if i <= drafted else 0.0)
        self._streak = min(s + 1, STREAKS - 1) if accepted >= drafted else 0

    def start(self) -> None:
        """A new generation begins: its first draft follows no accepted one, and exploring starts afresh.

        What was learned stays (the engine's costs, the acceptance), but the waits before
        exploring and probing go back to ``explore``: a new text may copy its prompt where the
        last ones did not, and after a few texts that never paid the wait would outlast it.
        """
        self._streak = 0
        self._ladder = 0
        self._climbing = False
        self._reset_waits()

    def _reset_waits(self) -> None:
        # steps without a draft, and the steps to wait before exploring, per slot and streak:
        # slot 0 for choose(), 1 + source for fit() (a source cut to nothing is explored too, or
        # it would never be measured again)
        self._idle = [[0] * STREAKS for _ in range(SOURCES + 1)]
        self._patience = [[self.explore] * STREAKS for _ in range(SOURCES + 1)]
        # steps of a streak that could have probed one position further, and the steps to wait
        # before probing, per streak
        self._probe_idle = [0] * STREAKS
        self._probe_patience = [self.explore] * STREAKS

    def acceptance(self, source: int = RULE) -> list[float]:
        """The learned acceptance of the 1st..k-th drafted token (given the ones before), next from ``source``."""
        _check_source(source)  # 7 was an IndexError, -1 the SUFFIX table
        ok = self._accepted[source][self._streak]
        tried = self._tried[source][self._streak]
        return [ok[i] / tried[i] for i in range(1, self.k + 1)]

    def costs(self) -> list[float]:
        """``T(n)`` estimated for n = 1..k+1 (index n - 1).

        Measured where measured, interpolated in between; above the longest step measured, as
        that step (optimistic: longer drafts get tried); below the shortest, proportional to n
        (pessimistic: a shorter step gets tried, and measured). Nothing measured: all 1.

        A length's average starts afresh when a step takes under half of it (the load that made it
        dear has ended) or after it went stale. A cost last measured more than :attr:`stale` steps
        ago is not trusted above what the fresh ones imply: it counts as at most the line through
        the two nearest fresh costs (interpolated between them, else extended). A burst of load on a
        shared machine makes the lengths measured during it look dear, and a length that looks dear
        is not drafted, so never measured again. (In a real run, 0.5B float32 in transformers, three
        windows slowed 5x by another job left one controller drafting nothing for the 45 windows
        that followed, and another drafting one token per step on copied text, where two paid.)
        """
        now = self._steps
        known = [(n, self._cost[n] / self._cost_w[n]) for n in range(1, self.k + 2) if self._cost_w[n] > 0.01]
        fresh = [(n, c) for n, c in known if now - self._cost_at[n] <= self.stale]
        if len(fresh) >= 2:
            known = [(n, c if now - self._cost_at[n] <= self.stale else min(c, _line(fresh, n))) for n, c in known]
        if not known:
            return [1.0] * (self.k + 1)
        out = []
        for n in range(1, self.k + 2):
            lower = [(m, c) for m, c in known if m <= n]
            upper = [(m, c) for m, c in known if m >= n]
            if not lower:
                m, c = upper[0]
                out.append(c * n / m)
            elif not upper:
                out.append(lower[-1][1])
            else:
                (lo_n, lo_c), (hi_n, hi_c) = lower[-1], upper[0]
                out.append(lo_c if hi_n == lo_n else lo_c + (hi_c - lo_c) * (n - lo_n) / (hi_n - lo_n))
        return out

    def _best(self, costs: list[float], source: int) -> int:
        """The draft length that maximizes tokens per second for a draft from ``source`` (0: none)."""
        accept = self.acceptance(source)
        best, best_rate = 0, (1.0 + self.margin) / costs[0]
        expected, run = 1.0, 1.0
        for d in range(1, self.k + 1):
            run *= accept[d - 1]
            expected += run
            rate = expected / costs[d]
            if rate > best_rate:
                best, best_rate = d, rate
        return best

    def _may_pay_further(self, costs: list[float], source: int, best: int) -> bool:
        """Would a draft of ``best + 1`` pay more than one of ``best`` if its last token were always accepted?

        If not, the cost stops the draft there, not the acceptance: probing cannot help."""
        accept = self.acceptance(source)
        expected, run = 1.0, 1.0
        for i in range(best):
            run *= accept[i]
            expected += run
        return (expected + run) / costs[best + 1] > expected / costs[best]

    def choose(self) -> int:
        """The draft length to ask for now (0..k): the longest that pays for a draft from any source seen so far.

        Cut the draft to :meth:`fit` once its source is known."""
        costs = self._chosen_costs = self.costs()
        best, source = max(((self._best(costs, s), s) for s in range(SOURCES) if self._seen[s]), key=lambda b: b[0])
        s = self._streak
        if s > 0 and 0 < best < self.k and self._may_pay_further(costs, source, best):
            # Probe one position further where it has been reached less than half as often as
            # the last one that pays lately: in a copy, the table may hold what other text
            # taught. Each probe that is not accepted whole doubles the wait for the next, as
            # exploring does, so that a text where it is rejected pays for few (one accepted
            # sets the wait to 1 in observe_accept: the table needs several to follow).
            recent = self._recent[source][s]
            if recent[best + 1] < 0.5 * recent[best]:
                self._probe_idle[s] += 1
                if self._probe_idle[s] >= self._probe_patience[s]:
                    self._probe_idle[s] = 0
                    self._probe_patience[s] = min(max(2 * self._probe_patience[s], self.explore), 64 * self.explore)
                    self._explore(0, best)  # a draft is sent: the idle count restarts
                    self._probing = self._explored = True
                    return best + 1
        if self._ladder > best:
            # the ladder's next rung: the shortest draft from twice the last that would pay were
            # it accepted whole (where none would, as where verifying costs more than it can
            # yield, there is no ladder)
            floor = (1.0 + self.margin) / costs[0]
            rung = next((d for d in range(self._ladder, self.k + 1) if (d + 1) / costs[d] > floor), 0)
            if rung > best:
                self._explored = self._climbing = True  # sent whole by fit(), and followed by a longer one
                return rung
        self._explored = self._climbing = self._explore(0, best)
        return 1 if self._explored else best

    def fit(self, drafted: int, source: int) -> int:
        """How many of a draft's ``drafted`` tokens from ``source`` to send (after :meth:`choose`).

        An exploring draft is sent whole; a source that does not pay now is explored with one
        token as :meth:`choose` explores."""
        _check_source(source)
        if self._explored or drafted <= 0:
            return drafted
        best = min(drafted, self._best(self._chosen_costs, source))
        return 1 if self._explore(1 + source, best) else best

    def _explore(self, slot: int, best: int) -> bool:
        """Count a step whose best draft length was ``best`` in ``slot``; True: explore one token now."""
        idle, patience, s = self._idle[slot], self._patience[slot], self._streak
        if best > 0:
            idle[s] = 0
            patience[s] = self.explore
            return False
        idle[s] += 1
        if idle[s] < patience[s]:
            return False
        # Explore one token; if that does not make drafting pay, wait twice as long next time
        # (a text that never drafts well pays for a few exploring steps, not 1 in 8).
        idle[s] = 0
        patience[s] = min(2 * patience[s], 64 * self.explore)
        return True


class BatchCost:
    """The least acceptance a drafted token must promise to pay for its place in a batched step.

    A step of a batch verifies ``N`` tokens (every row's draft and its own token) in ``T(N)``
    seconds and produces ``P`` tokens. One more drafted token, accepted (reached and accepted)
    with probability ``q``, turns ``P / T`` tokens per second into ``(P + q) / (T + b)``, where
    ``b`` is what one more verified token adds to the step: it pays when ``q > b * P / T``.
    :meth:`threshold` is that ``b * P / T``, from the steps :meth:`observe` saw: ``T = a + b N``
    fitted by least squares, and ``P / T`` their ratio, both weighted towards the recent
    (``decay`` per step). On a GPU, where ``b`` is about 0, any likely token pays; on a CPU,
    where every verified token costs, only the likely ones do. A batch raises ``P / T`` (the
    rows share the step's fixed cost ``a``), so it pays for fewer drafted tokens than one
    request does alone.

    It is the hybrid policy's threshold (its running estimate of each drafted token's chance of
    being reached and accepted) in the vLLM adapter, by default (``LOOKUPDEC_ADAPTIVE=0`` steers
    to the policy's waste target instead).
    Until ``warmup`` steps were seen, and their verified tokens spread enough to fit a slope,
    it has no threshold.
    """

    def __init__(self, decay: float = 0.95, warmup: int = 8, min_spread: float = 0.25) -> None:
        if not 0 < decay <= 1:  # 2 made the threshold nan, -1 was taken (1: no decay, plain sums)
            raise ValueError(f"decay must be in (0, 1], got {decay}")
        self.decay = decay
        """The weight a step keeps after each newer one."""
        self.warmup = warmup
        """Steps observed before :meth:`threshold` answers."""
        self.min_spread = min_spread
        """The least variance of the recent steps' verified tokens that the slope is fitted on."""
        self.steps = 0
        """Steps observed."""
        self.slope = 0.0
        """The last fitted ``b``: seconds one more verified token adds to a step."""
        # decayed sums: weight, N, N^2, T, N*T, P
        self._w = self._n = self._nn = self._t = self._nt = self._p = 0.0
        self._fitted = False

    def observe(self, verified: int, produced: int, seconds: float) -> None:
        """A step verified ``verified`` tokens and produced ``produced`` (committed) in ``seconds``."""
        if verified <= 0 or produced <= 0 or seconds <= 0:
            return
        d = self.decay
        n = float(verified)
        self._w = self._w * d + 1.0
        self._n = self._n * d + n
        self._nn = self._nn * d + n * n
        self._t = self._t * d + seconds
        self._nt = self._nt * d + n * seconds
        self._p = self._p * d + produced
        self.steps += 1
        spread = self._w * self._nn - self._n * self._n  # w^2 times the variance of N
        if spread >= self.min_spread * self._w * self._w:
            # Between fits (drafts all of one length) the last slope stands: a spread too small
            # for a slope says nothing about it.
            self.slope = max(0.0, (self._w * self._nt - self._n * self._t) / spread)
            self._fitted = True

    def threshold(self) -> float | None:
        """The acceptance a drafted token must promise, ``b * P / T`` (None: not known yet)."""
        if not self._fitted or self.steps < self.warmup:
            return None
        return self.slope * self._p / self._t


class HistoryFollower:
    """Follow the generations an engine shows as their whole committed history at each step.

    :meth:`propose` syncs the current request with the history, then drafts. Within one
    generation, each call's history extends the last one by the accepted part of the last
    proposal and the model's own token: one token, then at most ``len(proposal)`` of the
    proposal's first. A history that extends the last otherwise (a chat's next turn: the
    previous history, the reply's tail, the new message; a continuation of the generated text),
    or not at all (a new prompt, the same prompt again, a rewind), is a new generation: the
    request ends (merging it into the dynamic cache) and a new one starts with the history as
    its prompt.

    ``vocab_size``, the model's vocabulary size when known, bounds the drafted ids: a drafter
    built for a larger vocabulary is refused, and a drafted id past it is a clear error (an
    engine given such an id may crash).

    ``adaptive`` (a :class:`DraftLength`, or None for always ``k``): the draft length is chosen
    from the wall time between calls (the engine's step, by the tokens it verified) and the
    acceptance seen in the histories, per source of the draft: the drafter proposes the longest
    any source may pay for, and the proposal is cut (``Request.trim``) to what its own source
    (``Request.rule_tokens``) pays for.
    """

    def __init__(self, drafter: Any, vocab_size: int | None = None, adaptive: DraftLength | None = None) -> None:
        if adaptive is not None and not isinstance(adaptive, DraftLength):
            # True (what RequestProposer and LookupDraftModel take) failed at the first step
            raise TypeError(f"adaptive must be a DraftLength or None, not {type(adaptive).__name__}")
        if vocab_size is not None and vocab_size < 1:
            raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
        self.drafter = drafter
        """The :class:`lookupdec.Drafter` the requests belong to."""
        self.request: Any = None
        """The request being followed (None before the first :meth:`sync` and after :meth:`end`)."""
        self.vocab_size = vocab_size
        """The model's vocabulary size (None: not checked)."""
        self.adaptive = adaptive
        """The draft length's controller (None: always the ``k`` asked for)."""
        self._returned = 0.0  # when the last proposal was returned (perf_counter)
        self._sent: list[int] | None = None  # the last proposal as returned (None: none in this generation)
        self._source = RULE  # where the last proposal came from (DraftLength's sources)
        drafter_vocab = getattr(drafter, "vocab_size", None)
        if vocab_size is not None and drafter_vocab is not None and drafter_vocab > vocab_size:
            raise ValueError(
                f"the drafter's vocabulary has {drafter_vocab} tokens, the model's {vocab_size}: "
                "its caches were built for another tokenizer"
            )

    def sync(self, history: Sequence[int], same_generation: bool = False) -> Any:
        """The request whose tokens are now exactly ``history`` (ints: a list, a tuple, an array).

        ``same_generation``: any extension of the last history continues the request (for the
        final history of a generation, which may hold more than one step's tokens).
        """
        history = _as_ids(history)
        req = self.request
        if req is not None:
            known = req.tokens
            n = len(known)
            grows = len(history) - n
            within = same_generation or self._sent is None or self._follows_proposal(history, n, self._sent)
            if grows >= 0 and within and history[:n] == known:
                if grows > 0:
                    self._check_ids(history, n)
                    req.extend(history[n:])
                return req
        self._check_ids(history, 0)  # before the old request ends: a refused history leaves it open
        if req is not None:
            req.end()
        self.request = self.drafter.request(history)
        self._sent = None
        return self.request

    def _check_ids(self, history: list[int], start: int) -> None:
        """VocabularyError naming the first id of ``history[start:]`` outside the model's vocabulary.

        The Drafter checks against its own ``vocab_size`` (2^31 when not given): without this, an
        id of the history past the model's was drafted back, and the error blamed the caches.
        """
        limit = self.vocab_size
        if limit is None or len(history) <= start:
            return
        new = history[start:]
        if min(new) < 0 or max(new) >= limit:
            i = next(i for i, t in enumerate(new) if not 0 <= t < limit) + start
            raise VocabularyError(f"history token {i} is {history[i]}: not an id of the model's vocabulary of {limit}")

    def propose(self, history: Sequence[int], k: int, stop: Collection[int] | None = ()) -> list[int]:
        """Sync with ``history``, then up to ``k`` drafted tokens (cut before any ``stop`` id; None: none)."""
        if stop is None:
            stop = ()
        entered = time.perf_counter()
        last = self.max_growth  # the last proposal's length + 1 (None: no proposal in this generation)
        known = len(self.request.tokens) if self.request is not None else 0
        req = self.sync(history)
        ctl = self.adaptive
        if ctl is not None:
            if last is not None and self.max_growth is not None:  # the same generation went on
                ctl.observe_step(last, entered - self._returned)
                ctl.observe_accept(last - 1, len(history) - known - 1, self._source)
            else:
                ctl.start()
            k = min(k, ctl.choose())
        proposal: list[int] = req.propose(k, stop=stop)
        if ctl is not None and proposal:
            # the longest any source may pay for was drafted; cut it to what its own source pays for
            self._source = RULE if req.rule_tokens > 0 else SUFFIX
            n = ctl.fit(len(proposal), self._source)
            if n < len(proposal):
                req.trim(n)
                proposal = proposal[:n]
        limit = self.vocab_size
        if limit is not None:
            for t in proposal:
                if t >= limit:
                    raise ValueError(
                        f"lookupdec drafted token id {t}, past the model's vocabulary of {limit} tokens: the "
                        f"drafter's caches hold ids of another tokenizer (give Drafter(vocab_size={limit}) to "
                        "refuse them when they are opened)"
                    )
        self._sent = proposal
        self._returned = time.perf_counter()
        return proposal

    def end(self, history: Sequence[int] | None = None) -> None:
        """End the request (after syncing it to the final ``history`` when given)."""
        if history is not None:
            self.sync(history, same_generation=True)
        if self.request is not None:
            self.request.end()
            self.request = None
        self._sent = None

    @property
    def max_growth(self) -> int | None:
        """The most tokens the next history adds in the same generation: the last proposal's
        length + 1 (None: no proposal in this generation yet, so any extension continues it)."""
        return None if self._sent is None else len(self._sent) + 1

    @staticmethod
    def _follows_proposal(history: list[int], n: int, sent: list[int]) -> bool:
        """Whether ``history`` adds to the request's ``n`` tokens what one step after proposing
        ``sent`` adds: its first tokens (those accepted), then one of the model's.

        Growth alone (at most :attr:`max_growth` tokens) also took the same prompt again, when
        the last request stopped after one draft call (a regenerated answer), for the same
        generation, and the adaptive length timed the pause between the calls as one step.
        """
        grows = len(history) - n
        if not 1 <= grows <= len(sent) + 1:
            return False
        return history[n : n + grows - 1] == sent[: grows - 1]


def _check_source(source: int) -> None:
    """ValueError unless ``source`` is :data:`RULE` or :data:`SUFFIX` (an index into per-source tables)."""
    if source not in (RULE, SUFFIX):
        raise ValueError(f"source must be RULE ({RULE}) or SUFFIX ({SUFFIX}), got {source!r}")


def _as_ids(history: Sequence[int]) -> list[int]:
    """``history`` as a list of ints: the generation is recognized by comparing it with the
    request's tokens (a list), and a tuple never equals a list (every step was a new request),
    nor does a numpy array compare as one bool."""
    if isinstance(history, list):
        return history
    tolist = getattr(history, "tolist", None)  # numpy arrays, torch tensors
    if tolist is not None:
        ids: list[int] = tolist()
        if ids and not isinstance(ids[0], int):  # a 2-D array (a batch) failed deep inside
            raise ValueError(f"history must be one sequence of token ids, got {type(history).__name__} of rows")
        return ids
    return [operator.index(t) for t in history]


# Imported last: IsolatedDrafter's module imports lookupdec, not this package's names above.
from lookupdec.adapters._isolated import IsolatedDrafter, set_threshold  # noqa: E402

__all__ = [
    "RULE",
    "SOURCES",
    "STREAKS",
    "SUFFIX",
    "BatchCost",
    "DraftLength",
    "HistoryFollower",
    "IsolatedDrafter",
    "set_threshold",
]
