"""A request open alongside others (detached from the hybrid history) matches repeats within itself.

Only one open request owns the hybrid policy's history; the others draft with
``HybridState.propose_detached``. Their own tokens are held in a request history
(``HybridState.request_history``), whose occurrences come first (the newest), then the shared
history's. Both implementations, and the fast one against the reference.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

import lookupdec.reference as ref
from lookupdec.reference.history import OWN_BASE, SuffixHistory
from lookupdec.reference.hybrid import merge_candidates, source_class
from tests.conftest import DEMO_DATA, fast_impl
from tests.impls import FastImpl, ImplTests, ReferenceImpl


class DetachedTests(ImplTests):
    def state(self, owner: list[int]) -> Any:
        """A state at a fixed threshold of 0.02 whose history's current request (its owner) has ``owner``."""
        s = self.impl.HybridState(self.impl.SuffixHistory(), threshold=0.02, target_waste=0)
        s.begin_request()
        s.propose(owner, 0, self.impl.NgramCache(), self.impl.NgramCache())
        return s

    def detached(self, s: Any, tokens: list[int], own: Any = None) -> list[int]:
        empty = self.impl.NgramCache()  # no llama.cpp n-grams: the draft is the suffix match's alone
        return list(s.propose_detached(tokens, 8, empty, empty, None, own))

    def test_a_detached_request_continues_a_repeat_of_its_own(self) -> None:
        s = self.state([50, 51, 52])
        tokens = [1, 2, 3, 4, 5, 6, 7, 9, 1, 2, 3]
        # (2, 3) occurs only in the request itself: its continuation, each token estimated 1/2
        # (nothing observed yet), until the running product 1/2^6 falls below 0.02
        assert self.detached(s, tokens) == [4, 5, 6, 7, 9]
        own = s.request_history()
        assert self.detached(s, tokens, own) == [4, 5, 6, 7, 9]
        s.observe(0)
        assert self.detached(s, [*tokens, 8], own) == []  # (3, 8) never occurred, nor 8
        assert len(s.history) == 4  # the shared history: a separator and the owner's three tokens

    def test_its_own_occurrences_come_first(self) -> None:
        # The owner's tokens have (1, 2, 3) followed by 8, the request's own by 4: one vote each,
        # and the request's own is the newer (its tokens count as coming after the history's), so
        # its vote weighs more.
        s = self.state([1, 2, 3, 8, 8, 8])
        assert self.detached(s, [1, 2, 3, 4, 0, 1, 2, 3])[0] == 4
        # Where its own tokens match only the last token, the history's longer match drafts.
        s = self.state([1, 2, 3, 8, 8, 8])
        assert self.detached(s, [3, 4, 0, 1, 2, 3])[0] == 8

    def test_a_request_history_out_of_step_is_an_error(self) -> None:
        s = self.state([50, 51, 52])
        own = s.request_history()
        self.detached(s, [1, 2, 3, 4], own)
        s.observe(0)
        with pytest.raises(ValueError, match="request history already holds 4"):
            self.detached(s, [1, 2], own)


class TestDetachedReference(ReferenceImpl, DetachedTests):
    pass


class TestDetachedFast(FastImpl, DetachedTests):
    pass


def test_merge_candidates() -> None:
    mine = [(OWN_BASE + 9, 3), (OWN_BASE + 4, 2)]
    theirs = [(7, 2), (3, 5)]
    assert merge_candidates(mine, theirs) == mine + theirs  # its own first: the newest
    assert merge_candidates(mine, [(7, 1), (3, 1)]) == mine  # one-token matches give way
    assert merge_candidates([(OWN_BASE + 9, 1)], theirs) == theirs
    assert merge_candidates([(OWN_BASE + 9, 1)], [(7, 1)]) == [(OWN_BASE + 9, 1), (7, 1)]
    assert merge_candidates([], theirs) == theirs
    assert merge_candidates(mine, []) == mine


def test_source_class_of_a_detached_request() -> None:
    h = SuffixHistory()
    h.add_separator()
    h.extend([1, 2, 3])  # the owner's request
    assert source_class(h, 2) == 1  # the owner's own tokens, for the owner
    assert source_class(h, 2, detached=True) == 0  # another request's, for a detached one
    assert source_class(h, OWN_BASE + 2, detached=True) == 1


def drive_open_requests(impl: Any, text: list[int], seed: int, trees: bool) -> tuple[list[Any], int]:
    """Three hybrid requests open at once, each a passage then a copy of its start (so the
    detached ones have repeats of their own to find): the proposals, then the drafter's stats;
    and how many tokens the two detached requests' suffix matches (past llama.cpp's rule's
    tokens) had accepted in their copies."""
    rng = random.Random(seed)
    drafter = impl.Drafter(policy="hybrid", n_draft=8)
    parts = []
    for i in range(3):
        passage = text[400 * i : 400 * i + 250]
        parts.append(passage + passage[:120])
    reqs = [drafter.request(p[:30]) for p in parts]  # the first owns the history
    seen: list[Any] = []
    copied = 0
    while any(len(r.tokens) < len(p) for r, p in zip(reqs, parts, strict=True)):
        i = rng.randrange(3)
        req, part = reqs[i], parts[i]
        if len(req.tokens) >= len(part):
            continue
        tree = trees and rng.random() < 0.3
        proposal = req.propose_tree(branches=2) if tree else req.propose()
        seen.append((i, proposal, req.rule_tokens))
        first = (proposal[0] if proposal else []) if tree else proposal
        pos = len(req.tokens)
        acc = 0
        while acc < len(first) and pos + acc < len(part) and part[pos + acc] == first[acc]:
            acc += 1
        if i > 0 and pos >= 250:
            copied += max(0, acc - req.rule_tokens)
        req.extend(part[pos : pos + acc + 1])
    for req in reqs:
        req.end()
    seen.append(drafter.stats)
    return seen, copied


@pytest.mark.parametrize("trees", [False, True])
def test_open_requests_identical_in_both_implementations(trees: bool) -> None:
    from lookupdec.tokens import read_tokens

    text = read_tokens(DEMO_DATA / "wiki.test.demo.llama3.bin").tolist()[:1200]
    fast = fast_impl()
    for seed in range(2):
        got, copied = drive_open_requests(fast, text, seed, trees)
        assert (got, copied) == drive_open_requests(ref, text, seed, trees)
        # The detached requests' suffix matches drafted from their own passages (none of the
        # history's requests has those tokens): with no request history, 0.
        assert copied >= 10, copied
