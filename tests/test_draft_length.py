"""DraftLength: the adapters' draft length, chosen from measured step costs and acceptance."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

import lookupdec
import lookupdec.reference
from lookupdec.adapters import RULE, SUFFIX, DraftLength, HistoryFollower


def best_by_brute_force(k: int, cost: Callable[[int], float], p: float) -> int:
    """The d maximizing expected tokens per second, for acceptance p at every position (the formula, independently)."""
    rates = [sum(p**i for i in range(d + 1)) / cost(d + 1) for d in range(k + 1)]
    return max(range(k + 1), key=lambda d: (rates[d], -d))


def trained(k: int, cost: Callable[[int], float], p_num: int, p_den: int, rounds: int = 200) -> DraftLength:
    ctl = DraftLength(k)
    for r in range(rounds):
        for n in range(1, k + 2):
            ctl.observe_step(n, cost(n))
        # drafts of k tokens whose i-th token is accepted p_num/p_den of the time, given the ones before
        accepted = 0
        while accepted < k and (r * 7 + accepted * 3) % p_den < p_num:
            accepted += 1
        ctl.observe_accept(k, accepted)
    return ctl


@pytest.mark.parametrize("slope", [0.0, 0.1, 0.5, 1.0])
def test_choice_maximizes_tokens_per_second(slope: float) -> None:
    k = 8

    def cost(n: int) -> float:
        return 1.0 + slope * (n - 1)

    for p_num, p_den in [(1, 4), (1, 2), (3, 4), (9, 10)]:
        ctl = trained(k, cost, p_num, p_den)
        est = ctl.acceptance()  # what it learned per position, for the state the last draft left
        # independent check of the choice against the learned acceptances
        rates = []
        for d in range(k + 1):
            run, expected = 1.0, 1.0
            for i in range(d):
                run *= est[i]
                expected += run
            rates.append(expected / cost(d + 1))
        want = max(range(k + 1), key=lambda d: (rates[d], -d))
        got = ctl.choose()
        assert got == want or (want == 0 and got == 1 and ctl._idle[0][ctl._streak] == 0)
        if slope == 0.0:
            assert got >= 1  # verification is free: draft whatever has been accepted
        if slope == 1.0:
            assert got == 0  # verifying n tokens costs n steps: no draft can pay


def test_costs_not_measured_are_taken_from_the_nearest() -> None:
    ctl = DraftLength(4)
    assert ctl.costs() == [1.0] * 5
    ctl.observe_step(1, 2.0)
    assert ctl.costs() == [2.0] * 5  # above the longest step measured: as that one (long drafts get tried)
    ctl.observe_step(5, 6.0)
    assert ctl.costs() == pytest.approx([2.0, 3.0, 4.0, 5.0, 6.0])  # interpolated in between
    only_long = DraftLength(4)
    only_long.observe_step(5, 10.0)
    assert only_long.costs() == pytest.approx([2.0, 4.0, 6.0, 8.0, 10.0])  # below: proportional to n


def test_a_stale_cost_counts_at_most_as_the_fresh_ones_imply() -> None:
    def measured(dear: float, cheap: float) -> DraftLength:
        ctl = DraftLength(4, stale=10)
        ctl.observe_step(5, dear)  # step 1
        ctl.observe_step(4, cheap)  # step 2
        for _ in range(5):  # steps 3..12
            ctl.observe_step(1, 2.0)
            ctl.observe_step(2, 3.0)
        return ctl

    ctl = measured(20.0, 4.0)
    # T(5), measured 11 steps ago, is stale: at most the line through the two nearest fresh
    # costs, T(2) and T(4) (measured 10 steps ago: still fresh), extended: 4.5
    assert ctl.costs() == pytest.approx([2.0, 3.0, 3.5, 4.0, 4.5])
    ctl.observe_step(5, 20.0)
    assert ctl.costs()[4] == 20.0  # measured anew: the stale average is dropped, not diluted
    assert measured(4.2, 4.0).costs() == pytest.approx([2.0, 3.0, 3.5, 4.0, 4.2])  # below the line: kept
    lone = DraftLength(4, stale=10)
    lone.observe_step(5, 20.0)
    for _ in range(11):
        lone.observe_step(1, 2.0)
    assert lone.costs()[4] == 20.0  # one fresh cost draws no line: the stale one is kept


def test_a_step_under_half_the_average_restarts_it() -> None:
    ctl = DraftLength(4)
    for _ in range(30):
        ctl.observe_step(3, 10.0)  # under another job's load
    ctl.observe_step(3, 2.0)  # the load has ended: the average restarts
    assert ctl.costs()[2] == 2.0
    ctl.observe_step(3, 6.0)  # a slow step (over twice the average) is only averaged in
    assert ctl.costs()[2] == pytest.approx((2.0 * 0.95 + 6.0) / 1.95)


def test_a_burst_of_load_does_not_keep_drafts_short() -> None:
    # A text whose drafts hold two right tokens, drafted while another job loads the machine
    # (every step 5x slower); the load ends while the next text's drafts are rejected, so only
    # some lengths are measured again; then a copy. The costs measured under the load look dear,
    # and lengths that look dear are not drafted: with costs that never go stale nor restart, the
    # controller never drafts k again.
    k = 4

    def run(ctl: DraftLength, steps: int, right: int, slow: float) -> list[int]:
        lengths = []
        for _ in range(steps):
            d = ctl.choose()
            lengths.append(d)
            ctl.observe_step(d + 1, (1.0 + 0.1 * d) * slow)
            ctl.observe_accept(d, min(d, right))
        return lengths

    class NeverForgets(DraftLength):
        """The costs as they were before 2026-12-05: a decayed average per length, never restarted."""

        def observe_step(self, verified: int, seconds: float) -> None:
            self._cost[verified] = self._cost[verified] * self.decay + seconds
            self._cost_w[verified] = self._cost_w[verified] * self.decay + 1.0

    for cls, drafts_whole in ((DraftLength, True), (NeverForgets, False)):
        ctl = cls(k)
        assert k in run(ctl, 50, 2, 5.0)
        run(ctl, 100, 0, 1.0)
        tail = run(ctl, 400, k, 1.0)[-100:]
        assert (tail == [k] * 100) is drafts_whole, tail


def test_explores_after_idle_steps_less_and_less_often() -> None:
    ctl = trained(4, lambda n: float(n), 0, 4)
    choices = [ctl.choose() for _ in range(8 + 16 + 32)]
    explored = [i for i, d in enumerate(choices) if d]
    assert explored == [7, 8 + 15, 8 + 16 + 31] and set(choices) == {0, 1}


def test_acceptance_after_a_whole_draft_is_learned_apart() -> None:
    # Where drafts after a miss fail (new text), a draft accepted whole (a copy begins) is
    # followed by long drafts, and a miss ends them: the two states keep their own acceptance.
    ctl = DraftLength(8)
    for n in range(1, 10):
        ctl.observe_step(n, 1.0 + 0.05 * (n - 1))  # verification nearly free (a GPU-like curve)
    for _ in range(100):
        ctl.observe_accept(8, 0)  # drafts after a miss are rejected at once
    assert ctl.acceptance()[0] < 0.01 and ctl.choose() == 0
    ctl.observe_accept(1, 1)  # an exploring draft accepted whole
    assert ctl.choose() == 8  # nothing learned against drafts after a whole one: the longest
    for _ in range(50):
        ctl.observe_accept(8, 8)
        assert ctl.choose() == 8  # the copy goes on: so do the long drafts
    assert ctl.acceptance() == pytest.approx([1.0] * 8)
    ctl.observe_accept(8, 3)  # a miss: back to what follows a miss (the exploring draft counted there)
    assert ctl.acceptance()[0] < 0.1 and ctl.choose() == 0
    ctl.observe_accept(1, 1)
    assert ctl.acceptance()[0] == 1.0  # after a whole draft
    ctl.start()  # a new generation: its first draft follows no accepted one
    assert ctl.acceptance()[0] < 0.1


def test_a_position_is_learned_given_the_tokens_before_it() -> None:
    # Copied text: a draft either follows the copy (accepted whole) or fails at its first token,
    # half the time each. So the 1st token is accepted half the time and every later one always
    # (when the ones before it were): E(8) = 1 + 8 / 2 = 5 tokens per step. A miss at the first
    # token says nothing of the positions after it, which were never reached.
    k = 8
    ctl = DraftLength(k)

    def cost(n: int) -> float:
        return 1.0 + 0.1 * (n - 1)

    for n in range(1, k + 2):
        ctl.observe_step(n, cost(n))
    for r in range(200):
        ctl.start()  # each draft the first of its generation: one table learns both kinds
        ctl.observe_accept(k, k if r % 2 else 0)
    ctl.start()
    assert ctl.acceptance() == pytest.approx([0.5] + [1.0] * (k - 1), abs=0.03)
    # the whole draft pays most: 5 tokens for 1.8 steps' time (2.8 a step's time), where 1 token
    # drafted makes 1.5 for 1.1 (1.4); with the miss counted at every position, 2 tokens were chosen
    assert ctl.choose() == k


def test_streaks_of_whole_drafts_are_learned_apart() -> None:
    # After one whole draft the next fails half the time (a short repeat in new text); after
    # two in a row it never fails (a copy): the third draft of a streak is long, the second short.
    ctl = DraftLength(8)
    for n in range(1, 10):
        ctl.observe_step(n, 1.0 + 0.1 * (n - 1))
    for r in range(60):
        ctl.start()
        ctl.observe_accept(2, 2)  # -> a streak of 1
        ctl.observe_accept(8, 8 if r % 2 else 0)  # after 1: whole half of the time, else at once rejected
        if r % 2:
            ctl.observe_accept(8, 8)  # after 2: whole
            ctl.observe_accept(8, 8)  # after 2 still: whole
    ctl.start()
    ctl.observe_accept(2, 2)
    after_one = ctl.acceptance()
    ctl.observe_accept(8, 8)
    after_two = ctl.acceptance()
    assert after_one[0] == pytest.approx(0.5, abs=0.1) and after_two == pytest.approx([1.0] * 8)
    assert ctl.choose() == 8


class Clock:
    """A fake perf_counter: the simulated engine advances it."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("slope", [0.05, 1.5])
def test_adaptive_never_slower_than_plain_greedy(monkeypatch: pytest.MonkeyPatch, slope: float) -> None:
    """A simulated engine: verifying n tokens costs 1 + slope (n - 1); the model's text repeats with noise."""
    import lookupdec.adapters as adapters

    clock = Clock()
    # the adapters' step timer: the simulated engine's clock instead of time.perf_counter
    monkeypatch.setattr(adapters, "time", SimpleNamespace(perf_counter=clock))
    text = [(i * 7) % 23 if i % 11 else 99 for i in range(600)]  # a cycle the lookup learns, broken now and then
    prompt, n_new = text[:40], 400

    def run(adaptive: bool | None) -> tuple[float, int]:
        clock.now = 0.0
        drafter = lookupdec.Drafter(n_draft=8)
        follower = HistoryFollower(drafter, adaptive=DraftLength(8) if adaptive else None)
        history = list(prompt)
        steps = 0
        while len(history) < len(prompt) + n_new:
            draft = follower.propose(history, 8) if adaptive is not None else []
            clock.now += 1.0 + slope * len(draft)  # the engine verifies the draft and one more token
            steps += 1
            truth = text[len(history) : len(history) + len(draft) + 1]
            n = 0
            while n < len(draft) and draft[n] == truth[n]:
                n += 1
            history += truth[: n + 1]
        follower.end(history)
        return clock.now, steps

    plain, _ = run(None)
    fixed, _ = run(False)
    adaptive, _ = run(True)
    if slope < 1:
        assert adaptive < 0.8 * plain  # cheap verification: drafting pays, and the adaptive length keeps it
    else:
        assert fixed > plain  # expensive verification: always drafting k loses
        assert adaptive <= 1.05 * plain  # the adaptive length does not lose (beyond exploring)


def test_sources_are_learned_apart() -> None:
    # llama.cpp's rule's drafts are accepted, the suffix match's alone rejected: on a steep
    # curve the rule's are sent and the suffix match's cut to nothing (exploring aside).
    ctl = DraftLength(4)
    for n in range(1, 6):
        ctl.observe_step(n, 1.0 + 0.57 * (n - 1))
    for _ in range(100):
        ctl.start()
        ctl.observe_accept(4, 4, RULE)
        ctl.start()
        ctl.observe_accept(4, 0, SUFFIX)
    ctl.start()
    assert ctl.acceptance(RULE) == pytest.approx([1.0] * 4) and ctl.acceptance(SUFFIX)[0] < 0.01
    assert ctl.choose() == 4
    assert ctl.fit(4, RULE) == 4 and ctl.fit(3, RULE) == 3
    fits = [ctl.fit(4, SUFFIX) for _ in range(8 + 16)]
    assert fits == [0] * 7 + [1] + [0] * 15 + [1]  # explored as choose() explores: after 8, then 16


def test_a_source_never_seen_asks_for_no_draft() -> None:
    # The llama policy never drafts from the suffix match: its untried (optimistic) table must
    # not make choose() ask for drafts the rule's own acceptance says do not pay.
    ctl = DraftLength(4)
    for n in range(1, 6):
        ctl.observe_step(n, float(n))
    for _ in range(100):
        ctl.observe_accept(4, 0, RULE)
    assert ctl.choose() == 0


class SourcedRequest:
    """A fake request: every other stretch of the text, "llama.cpp's rule" drafts it right;
    elsewhere "the suffix match alone" drafts wrong tokens. ``pooled``: every draft reports
    itself as the rule's (one acceptance for both, as before sources were learned apart)."""

    def __init__(self, text: list[int], prompt: list[int], pooled: bool) -> None:
        self.text = text
        self.tokens = list(prompt)
        self.pooled = pooled
        self.proposal: list[int] = []
        self.from_rule = False
        self.sent: list[tuple[int, int]] = []  # (source, tokens sent) per non-empty draft

    @property
    def rule_tokens(self) -> int:
        return len(self.proposal) if self.from_rule or self.pooled else 0

    def propose(self, k: int, stop: object = ()) -> list[int]:
        pos = len(self.tokens)
        self.from_rule = (pos // 16) % 2 == 0
        self.proposal = self.text[pos : pos + k] if self.from_rule else [10_000] * k
        return list(self.proposal)

    def trim(self, n: int) -> None:
        self.proposal = self.proposal[:n]

    def extend(self, ids: list[int]) -> None:
        if self.proposal:
            self.sent.append((RULE if self.from_rule else SUFFIX, len(self.proposal)))
        self.proposal = []
        self.tokens += ids

    def end(self) -> None:
        pass


@pytest.mark.parametrize("by_source", [True, False])
def test_drafts_of_a_source_that_pays_are_sent(monkeypatch: pytest.MonkeyPatch, by_source: bool) -> None:
    """A simulated engine where a draft of 4 costs 3.3 steps: the rule's drafts pay, the suffix match's never."""
    import lookupdec.adapters as adapters

    clock = Clock()
    monkeypatch.setattr(adapters, "time", SimpleNamespace(perf_counter=clock))
    text = list(range(2000))
    requests: list[SourcedRequest] = []

    class Drafter:
        def request(self, prompt: list[int]) -> SourcedRequest:
            requests.append(SourcedRequest(text, prompt, pooled=not by_source))
            return requests[-1]

    follower = HistoryFollower(Drafter(), adaptive=DraftLength(4))
    history = text[:10]
    steps = 0
    while len(history) < 1600:
        draft = follower.propose(history, 4)
        clock.now += 1.0 + 0.57 * len(draft)
        steps += 1
        n = 0
        while n < len(draft) and draft[n] == text[len(history) + n]:
            n += 1
        history = history + text[len(history) : len(history) + n + 1]
    follower.end(history)
    plain = len(history) - 10
    suffix_sent = sum(n for s, n in requests[0].sent if s == SUFFIX)
    if by_source:
        # the rule's drafts are sent (16 tokens in about 3.2 steps of 3.3), the suffix match's
        # only when exploring: about (10.5 + 16) / 32 of plain greedy's time at best
        assert clock.now < 0.85 * plain
        assert suffix_sent < 0.05 * steps
    else:
        assert clock.now > 0.9 * plain  # pooled, half the drafts fail: drafting cannot pay


def on_steep_curve(k: int) -> DraftLength:
    """A controller that measured a CPU's verify curve: 2 tokens cost 1.34 single steps (the 0.5B model in bfloat16)."""
    ctl = DraftLength(k)
    for n in range(1, k + 2):
        ctl.observe_step(n, 1.0 + 0.34 * (n - 1))
    return ctl


def copy(ctl: DraftLength, steps: int) -> list[int]:
    """The draft lengths chosen over ``steps`` steps of a copy: every draft accepted whole."""
    lengths: list[int] = []
    for _ in range(steps):
        d = ctl.choose()
        lengths.append(d)
        ctl.observe_accept(d, d)
    return lengths


def test_a_streak_whose_table_says_no_draft_is_explored() -> None:
    # Earlier text taught: after one whole draft, the next is rejected. Then a copy begins.
    # "No draft" ends the streak, so the streak-1 table would never be observed again unless
    # exploring counts the steps of each streak apart (choose() drafts at streak 0 every other
    # step, which would restart one shared count).
    k = 4
    ctl = on_steep_curve(k)
    for _ in range(100):
        ctl.start()
        ctl.observe_accept(1, 1)  # a one-token draft after a miss: accepted
        ctl.observe_accept(k, 0)  # the next one: rejected at once
    ctl.start()
    lengths = copy(ctl, 200)
    assert lengths[1] == 0  # after a whole draft: no draft, as learned
    assert lengths[-50:] == [k] * 50  # explored, the copy is found, and drafted whole


def test_a_copy_lengthens_drafts_cut_short_by_other_text() -> None:
    # Earlier text taught: in a streak, the third drafted token is rejected. Then a copy: the
    # drafts of 2 are accepted whole, position 3 is no longer tried, and its fading weight
    # makes choose() probe it; accepted, the drafts lengthen to k.
    k = 8
    ctl = on_steep_curve(k)
    for _ in range(100):
        ctl.start()
        ctl.observe_accept(2, 2)
        ctl.observe_accept(k, 2)  # after one whole draft: the third token rejected
        ctl.observe_accept(2, 2)
        ctl.observe_accept(2, 2)
        ctl.observe_accept(k, 2)  # after two: the same
    ctl.start()
    ctl.observe_accept(2, 2)
    assert ctl.choose() == 2
    lengths = copy(ctl, 300)
    # probed after the wait (8 steps), then again whenever accepted: the drafts lengthen one
    # token at a time until the table follows, up to k
    assert lengths[:8] == [2] * 8 and 3 in lengths[8:30]
    assert all(b >= a - 1 for a, b in itertools.pairwise(lengths))  # a probe drops back one at most
    assert min(lengths[-50:]) >= k - 1 and k in lengths[-50:]


def test_probes_stay_rare_where_the_next_token_is_rejected() -> None:
    # Where position 3 really is rejected, probing it costs a draft now and then, not every step.
    k = 8
    ctl = on_steep_curve(k)
    ctl.start()
    ctl.observe_accept(2, 2)
    lengths: list[int] = []
    for _ in range(2000):
        d = ctl.choose()
        lengths.append(d)
        accepted = min(d, 2)
        ctl.observe_accept(d, accepted)
        if accepted < d:
            ctl.observe_accept(2, 2)  # the model's token, then a new streak of one whole draft
    tail = lengths[100:]
    assert set(tail) == {2, 3}  # probed, but each rejected probe doubles the wait for the next
    assert sum(1 for d in tail if d == 3) < 0.01 * len(tail)


def test_a_new_generation_explores_afresh() -> None:
    # After texts where no draft paid, the wait before exploring has grown (8, 16, 32, ...);
    # a new generation may copy its prompt, so it explores after `explore` idle steps again.
    ctl = trained(4, lambda n: float(n), 0, 4)
    before = [ctl.choose() for _ in range(8 + 16 + 32 + 63)]
    assert [i for i, d in enumerate(before) if d] == [7, 23, 55]  # the next would be after 64 more
    ctl.start()
    after = [ctl.choose() for _ in range(8)]
    assert after == [0] * 7 + [1]


GEMMA3_CURVE = (20.5, 46.3, 54.1, 60.5, 94.8, 100.9, 111.6, 89.7, 121.6)
"""Gemma 3 270M in llama-cpp-python, ms for 1..9 tokens (docs/speedup.md): one drafted token can never pay."""


def test_an_exploring_draft_accepted_whole_climbs_a_ladder() -> None:
    # Where verifying 2 tokens costs 2.3 single steps, a one-token draft cannot pay even when
    # accepted, so exploring one token at a time never shows the tables that a copy has begun.
    # An exploring draft accepted whole is followed at once by the shortest draft from twice its
    # length that would pay if accepted whole: 1, then 2 (3 tokens for 2.6 steps), 4, 8.
    k = 8
    ctl = DraftLength(k)
    for n, ms in enumerate(GEMMA3_CURVE, start=1):
        ctl.observe_step(n, ms / 1000)
    for _ in range(100):  # earlier text: every draft's second token rejected, in every streak, from either source
        for src in (RULE, SUFFIX):
            ctl.start()
            ctl.observe_accept(k, 1, src)
            ctl.observe_accept(1, 1, src)
            ctl.observe_accept(k, 1, src)
            ctl.observe_accept(1, 1, src)
            ctl.observe_accept(1, 1, src)
            ctl.observe_accept(k, 1, src)
    ctl.start()
    lengths = copy(ctl, 60)
    assert lengths[:11] == [0] * 7 + [1, 2, 4, 8]
    assert lengths[-40:] == [k] * 40  # the tables followed: drafted whole
    # a rejected rung ends the ladder: exploring waits again
    ctl.start()
    assert [ctl.choose() for _ in range(8)] == [0] * 7 + [1]
    ctl.observe_accept(1, 1)
    assert ctl.choose() == 2
    ctl.observe_accept(2, 1)
    assert ctl.choose() == 0
    # the hybrid policy's suffix match alone does not climb
    ctl.start()
    assert [ctl.choose() for _ in range(8)] == [0] * 7 + [1]
    ctl.observe_accept(1, 1, SUFFIX)
    assert ctl.choose() == 0


def test_no_ladder_where_no_draft_could_pay() -> None:
    # Verifying each drafted token costs 1.5 single steps: no draft pays even accepted whole,
    # so an exploring token accepted is not followed by a longer draft.
    ctl = trained(4, lambda n: 1.0 + 1.5 * (n - 1), 0, 4)
    assert [ctl.choose() for _ in range(8)] == [0] * 7 + [1]
    ctl.observe_accept(1, 1)
    assert ctl.choose() == 0


def test_a_generation_given_as_a_tuple_or_an_array_is_one_request() -> None:
    # The history is compared with the request's tokens to tell one generation from the next: a
    # tuple never equalled the list (every step started a new request and counted the whole
    # history again), and a numpy array could not be compared at all.
    import array

    import numpy as np

    text = [1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2]
    as_list = lookupdec.Drafter()
    follower = HistoryFollower(as_list)
    for n in range(4, len(text)):
        follower.propose(text[:n], 4)
    follower.end(text)
    converts: list[Callable[[list[int]], Any]] = [tuple, lambda ids: array.array("i", ids), np.array]
    for convert in converts:
        drafter = lookupdec.Drafter()
        follower = HistoryFollower(drafter)
        for n in range(4, len(text)):
            follower.propose(convert(text[:n]), 4)
        follower.end(convert(text))
        assert drafter.stats == as_list.stats  # one request, the same proposals
        assert drafter.stats.requests == 1


def test_bad_arguments_are_named() -> None:
    # out of range they failed later, deep inside: IndexError, ZeroDivisionError
    for kwargs, message in (
        ({"k": -1}, "k must be in 0..65536"),
        ({"k": 4, "decay": -1.0}, r"decay must be in \(0, 1\)"),
        ({"k": 4, "decay": 1.0}, r"decay must be in \(0, 1\)"),
        ({"k": 4, "explore": 0}, "explore and stale must be >= 1"),
    ):
        with pytest.raises(ValueError, match=message):
            DraftLength(**kwargs)
    ctl = DraftLength(4)
    with pytest.raises(ValueError, match="source must be RULE"):
        ctl.observe_accept(2, 1, source=5)
    with pytest.raises(ValueError, match="source must be RULE"):
        ctl.fit(3, 9)


def test_stop_ids_as_a_numpy_array() -> None:
    import numpy as np

    for impl in (lookupdec.reference, lookupdec):
        for policy in ("llama", "hybrid"):
            tokens = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2]
            with impl.Drafter(policy=policy, static=impl.build_static(tokens)).request(tokens) as req:
                want = req.propose(6, stop=[4])
                assert want and 4 not in want
                assert req.propose(6, stop=np.array([4, 99])) == want
                if policy == "hybrid":
                    assert req.propose_tree(6, stop=np.array([4])) == req.propose_tree(6, stop=[4])
