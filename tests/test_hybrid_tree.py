"""Tree drafts of the hybrid policy (issue 13's stretch): ``HybridState.propose_tree`` in both
implementations, tree replays (``replay(..., branches=N)``, ``stats --branches``) and
``Request.propose_tree``.

Expected trees come from the reference model (the fast path is compared with it) or are
worked by hand below; the linear policy's drafts and counts come from ``propose`` and the
replay without ``branches``, which the tree must leave unchanged.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lookupdec.reference as ref
from lookupdec import cli
from lookupdec.reference.hybrid import add_branch
from lookupdec.result import common_prefix, tree_nodes
from tests.conftest import DEMO_DATA, SHARED_DATA, fast_impl
from tests.impls import FastImpl, ImplTests, ReferenceImpl
from tests.test_hybrid import age_votes

REPLAY = SHARED_DATA / "wiki.test.raw.llama3.bin"
CORPUS = SHARED_DATA / "enwiki_wt.10M.llama3.bin"
real_data = pytest.mark.skipif(not REPLAY.exists(), reason=f"real data not present at {SHARED_DATA}")


def ids(path: Path, n: int, start: int = 0) -> list[int]:
    return list(np.fromfile(path, dtype="<i4")[start : start + n].tolist())


def check_tree(tree: list[list[int]], branches: int) -> None:
    """The shape propose_tree promises: at most ``branches`` branches, none empty, none a prefix of another."""
    assert len(tree) <= branches
    for i, b in enumerate(tree):
        assert b, tree
        for o in tree[:i]:
            assert common_prefix(b, o) < min(len(b), len(o)), tree


# --- helpers of both implementations -----------------------------------------------------------


def test_tree_nodes_counts_shared_prefixes_once() -> None:
    assert tree_nodes([]) == 0
    assert tree_nodes([[1, 2, 3]]) == 3
    # (1, 2) shared by the first two, 5 alone: 3 + 1 + 1 nodes
    assert tree_nodes([[1, 2, 3], [1, 2, 4], [5]]) == 5
    assert tree_nodes([[1, 2, 3], [1, 4], [1, 2, 5, 6]]) == 3 + 1 + 2


def test_add_branch_refuses_empty_full_and_prefix_related() -> None:
    import lookupdec.fast._tree as fh
    from lookupdec.fast._cache import to_vec

    cases = [
        ([], 3, [[1, 2]]),  # empty
        ([1], 3, [[1, 2]]),  # a prefix of branch 0
        ([1, 2, 3], 3, [[1, 2]]),  # branch 0 is its prefix
        ([3], 1, [[1, 2]]),  # the tree is full
        ([1, 3], 3, [[1, 2], [1, 3]]),  # a shared prefix is fine
    ]
    for branch, branches, expected in cases:
        tree = [[1, 2]]
        add_branch(tree, list(branch), branches)
        assert tree == expected
        vecs = [to_vec([1, 2])]
        fh.add_branch(vecs, to_vec(branch), branches)
        assert [[int(vecs[i][j]) for j in range(len(vecs[i]))] for i in range(len(vecs))] == expected


# --- hand-worked trees, per implementation -----------------------------------------------------


class TreeTests(ImplTests):
    def state(self, *requests: list[int]) -> Any:
        """A state with a fixed threshold of 0.02 whose history holds ``requests`` (finished)."""
        s = self.impl.HybridState(self.impl.SuffixHistory(), threshold=0.02, target_waste=0)
        for r in requests:
            s.begin_request()
            s.propose(r, 0, self.impl.NgramCache(), self.impl.NgramCache())
        s.begin_request()
        return s

    def tree(self, s: Any, tokens: list[int], branches: int = 3, static: Any = None) -> list[list[int]]:
        empty = self.impl.NgramCache()
        return [list(b) for b in s.propose_tree(tokens, 8, empty, empty, static, branches)]

    def test_runner_up_of_the_first_vote(self) -> None:
        # (1, 2) was followed by 3, 4 and later by 5, 6: a tie, the newest (5) wins branch 0;
        # the runner-up 3 and what followed it is the alternative. Each token's estimate is a
        # fresh 1/2: 1/2, 1/4, and the separator after each request ends both drafts.
        s = self.state([9, 1, 2, 3, 4], [8, 1, 2, 5, 6])
        assert self.tree(s, [7, 1, 2]) == [[5, 6], [3, 4]]
        assert self.tree(s, [7, 1, 2], branches=1) == [[5, 6]]

    def test_runner_ups_ranked_by_the_gentle_vote(self) -> None:
        # (1, 2) was followed by 3 three times long ago, then by 4, then by 5 (the newest). By the
        # age weights (exponent 2: worked out from the rule) 5 wins branch 0 and 4 outranks 3,
        # which has the most occurrences: the runner-up is 4 (by counts it was 3).
        requests = [[1, 2, 3, 9]] * 3 + [list(range(100, 2100)), [1, 2, 4, 8], [1, 2, 5, 7]]
        votes = age_votes(requests, [6, 1, 2], 64, 2)
        assert votes[5] > votes[4] > votes[3]
        # each estimate a fresh 1/2: 1/2, 1/4 (>= 0.02), and the request's end stops each draft
        assert self.tree(self.state(*requests), [6, 1, 2], branches=2) == [[5, 7], [4, 8]]
        assert self.tree(self.state(*requests), [6, 1, 2]) == [[5, 7], [4, 8], [3, 9]]

    def test_runner_ups_ranked_gently_when_the_exponent_is_steep(self) -> None:
        # Six occurrences followed by 3 thirty tokens before a recent 4 and a newest 5: with the
        # exponent 6 the newest wins (branch 0: 5) and 4 outweighs 3; with the exponent 2, 3 has
        # the heaviest vote and 4 the lightest. The runner-ups are ranked by the latter.
        requests = [[1, 2, 3, 9]] * 6 + [list(range(100, 130)), [1, 2, 4, 8], [1, 2, 5, 7]]
        steep, gentle = age_votes(requests, [6, 1, 2], 64, 6), age_votes(requests, [6, 1, 2], 64, 2)
        assert steep[5] > steep[4] > steep[3] and gentle[3] > gentle[5] > gentle[4]
        s = self.state(*requests)
        s.exponent_scores[3] = 65  # the exponent 6 (see test_hybrid's scoring test)
        assert s.exponent() == 6
        assert self.tree(s, [6, 1, 2]) == [[5, 7], [3, 9], [4, 8]]

    def test_llama_draft_and_suffix_only_draft(self) -> None:
        s = self.state([1, 2, 3, 4, 5, 6])
        static = self.impl.build_static([1, 2, 7, 1, 2, 7])  # llama.cpp drafts 7 after (1, 2)
        # The suffix-only draft (3, 4, 5, 6) disagrees; both first-token estimates are a fresh
        # 1/2, so llama.cpp's [7] stays (nothing follows (2, 7) or 7): branch 0. The
        # suffix-only draft (1/2 ... 1/16 >= 0.02) is the alternative.
        assert self.tree(s, [9, 1, 2], static=static) == [[7], [3, 4, 5, 6]]
        s.observe(0)  # 7 rejected: its estimate falls to 1/3 and the suffix-only draft replaces it
        s.begin_request()
        assert self.tree(s, [9, 1, 2], static=static) == [[3, 4, 5, 6], [7]]

    def test_nothing_to_draft_is_no_tree(self) -> None:
        s = self.state([1, 2, 3])
        assert self.tree(s, [5, 6]) == []  # (5, 6), 6 never seen; no static index
        s.begin_request()
        assert self.tree(s, []) == []

    def test_branches_must_be_positive(self) -> None:
        with pytest.raises(ValueError, match="branches must be >= 1"):
            self.tree(self.state(), [1, 2], branches=0)
        with pytest.raises(ValueError, match="need policy='hybrid'"):
            self.impl.replay([1, 2, 3] * 10, 8, 4, branches=2)


class TestTreeReference(ReferenceImpl, TreeTests):
    pass


class TestTreeFast(FastImpl, TreeTests):
    pass


# --- differential: fast against the reference, branch 0 against the linear policy --------------


def tree_lockstep(
    tokens: list[int],
    n_draft: int,
    chunk: int,
    max_tokens: int,
    static: list[int] | None,
    branches: int = 3,
    corpus: list[int] | None = None,
) -> tuple[int, int]:
    """Drive a fast and a reference state with ``propose_tree`` and a third (fast) with ``propose``
    through the same requests: a tree verifier accepts the longest branch prefix the text
    continues with, and all three observe branch 0's share. Asserts identical trees, branch 0 ==
    the linear proposal, and the tree's shape at every step; returns (steps, steps the tree gained)."""
    fast = fast_impl()
    impls = (fast, ref, fast)
    states = [
        (impl.HybridState(impl.SuffixHistory(max_tokens)), impl.NgramCache(), impl.NgramCache()) for impl in impls
    ]
    if corpus is not None:
        for s, _, _ in states:
            s.history.add_corpus(corpus)
    statics = [impl.build_static(static) if static else None for impl in impls]
    steps = gained = 0
    for start in range(0, len(tokens) - 1, chunk):
        part = tokens[start : start + chunk]
        for s, _, _ in states:
            s.begin_request()
        out = part[:1]
        while len(out) < len(part):
            (sf, cf, df), (sr, cr, dr), (sl, cl, dl) = states
            trees = [
                [list(b) for b in sf.propose_tree(out, n_draft, cf, df, statics[0], branches)],
                sr.propose_tree(out, n_draft, cr, dr, statics[1], branches),
            ]
            linear = list(sl.propose(out, n_draft, cl, dl, statics[2]))
            assert trees[0] == trees[1], f"step {steps}: fast {trees[0]} reference {trees[1]}"
            tree = trees[0]
            assert (tree[0] if tree else []) == linear, f"step {steps}: branch 0 {tree[:1]} linear {linear}"
            check_tree(tree, branches)
            truth = part[len(out) :]
            acc = max((common_prefix(b, truth) for b in tree), default=0)
            acc0 = common_prefix(linear, truth)
            gained += acc > acc0
            steps += 1
            new = part[len(out) : len(out) + acc + 1]
            out = out + new
            for s, c, _ in states:
                s.observe(acc0)
                c.update(out, len(new), 1, 4)
        for _, c, d in states:
            d.merge(c)
            c.clear()
    return steps, gained


def test_lockstep_demo_data() -> None:
    tokens = ids(DEMO_DATA / "wiki.test.demo.llama3.bin", 2000)
    steps, gained = tree_lockstep(tokens, 8, 1000, 1 << 22, ids(DEMO_DATA / "enwiki_wt.demo.llama3.bin", 8000))
    assert steps > 0 and gained > 0  # the alternatives are taken


@real_data
@pytest.mark.parametrize("branches", [2, 3])
def test_lockstep_real_data(branches: int) -> None:
    corpus = ids(CORPUS, 8000)
    steps, gained = tree_lockstep(ids(REPLAY, 1500, 100_000), 8, 800, 1 << 22, corpus, branches)
    assert steps > 0 and gained > 0


@real_data
def test_lockstep_real_data_corpus_in_history() -> None:
    corpus = ids(CORPUS, 8000)
    steps, gained = tree_lockstep(ids(REPLAY, 1500), 8, 800, 1 << 22, corpus, 3, corpus=corpus)
    assert steps > 0 and gained > 0


@settings(max_examples=30, deadline=None)
@given(
    tokens=st.lists(st.integers(0, 5), min_size=2, max_size=250),
    n_draft=st.integers(0, 10),
    chunk=st.integers(2, 80),
    max_tokens=st.integers(16, 120),
    branches=st.integers(1, 4),
    static_repeats=st.integers(0, 12),
)
def test_lockstep_random(
    tokens: list[int], n_draft: int, chunk: int, max_tokens: int, branches: int, static_repeats: int
) -> None:
    tree_lockstep(tokens, n_draft, chunk, max_tokens, tokens[::-1] * static_repeats or None, branches)


@settings(max_examples=20, deadline=None)
@given(
    tokens=st.lists(st.integers(0, 4), min_size=2, max_size=200),
    corpus=st.lists(st.integers(0, 4), min_size=0, max_size=300),
    chunk=st.integers(2, 60),
)
def test_lockstep_random_corpus(tokens: list[int], corpus: list[int], chunk: int) -> None:
    tree_lockstep(tokens, 8, chunk, 600, None, 3, corpus=corpus)


def test_detached_tree_matches_propose_detached() -> None:
    for impl in (fast_impl(), ref):
        s = impl.HybridState(impl.SuffixHistory(), threshold=0.02, target_waste=0)
        s.begin_request()
        s.propose([9, 1, 2, 3, 4, 8, 1, 2, 5, 6], 0, impl.NgramCache(), impl.NgramCache())
        empty = impl.NgramCache()
        # Not the history's request: its own tokens are not in the stream, which ends at 6
        # (branch 0 ends there); the runner-up 3 goes on into (8, 1, 2) until 1/2^6 < 0.02.
        tree = [list(b) for b in s.propose_tree([7, 1, 2], 8, empty, empty, None, 3, True)]
        assert tree == [[5, 6], [3, 4, 8, 1, 2]]
        assert tree[0] == list(s.propose_detached([7, 1, 2], 8, empty, empty))


# --- replays -----------------------------------------------------------------------------------


def demo_replay(impl: Any, branches: int | None) -> tuple[int, int, int]:
    tokens = ids(DEMO_DATA / "wiki.test.demo.llama3.bin", 2500)
    static = impl.build_static(ids(DEMO_DATA / "enwiki_wt.demo.llama3.bin", 10000))
    extra = () if branches is None else (branches,)
    r = impl.replay(tokens, 800, 8, static, None, None, "hybrid", impl.SuffixHistory(2000), *extra)
    assert r.branches == (branches or 1)
    return r.n_steps, r.n_accept, r.n_drafted


def test_replay_one_branch_is_the_linear_replay() -> None:
    for impl in (fast_impl(), ref):
        assert demo_replay(impl, 1) == demo_replay(impl, None)


@pytest.mark.parametrize("branches", [2, 3])
def test_replay_trees_identical_in_both_implementations(branches: int) -> None:
    counts = {demo_replay(impl, branches) for impl in (fast_impl(), ref)}
    assert len(counts) == 1, counts
    assert counts != {demo_replay(fast_impl(), 1)}  # the alternatives were drafted (and taken)


@real_data
@pytest.mark.slow
def test_replay_real_data_both_implementations() -> None:
    tokens = ids(REPLAY, 9000)
    corpus = ids(CORPUS, 100_000)
    counts = set()
    for impl in (fast_impl(), ref):
        r = impl.replay(tokens, 4096, 8, impl.build_static(corpus), None, None, "hybrid", None, 3)
        counts.add((r.n_steps, r.n_accept, r.n_drafted))
    assert len(counts) == 1, counts


# --- Request.propose_tree ----------------------------------------------------------------------


class RequestTreeTests(ImplTests):
    def drafter(self) -> Any:
        d = self.impl.Drafter(policy="hybrid")
        d.policy_state.threshold = 0.02
        d.policy_state.target_waste10 = 0
        with d.request([9, 1, 2, 3, 4]):
            pass
        with d.request([8, 1, 2, 5, 6]):
            pass
        return d

    def test_extend_confirms_along_the_longest_branch(self) -> None:
        d = self.drafter()
        with d.request([7, 1, 2]) as r:
            tree = r.propose_tree()
            assert tree == [[5, 6], [3, 4]]  # as HybridState's hand-worked tree above
            assert (r.n_drafted, d.stats.n_drafted) == (4, 4)  # four distinct nodes
            r.extend([3])  # one at a time: branch 1 stays live
            r.extend([4, 0])  # branch 1 whole, then the model's own token
            assert (r.n_accept, d.stats.n_accept) == (2, 2)
            r.propose_tree()
            r.extend([11])
            assert r.n_accept == 2

    def test_linear_observation(self) -> None:
        # The policy observes branch 0's share of the accepted tokens: a step that accepted
        # branch 1 whole leaves the state as a linear step whose proposal was all rejected.
        states = []
        for tree in (True, False):
            d = self.drafter()
            d.policy_state.target_waste10 = 19  # the waste controller on: it sees each step's waste
            with d.request([7, 1, 2]) as r:
                assert (r.propose_tree() if tree else [r.propose()])[0] == [5, 6]
                r.extend([3, 4, 8])  # branch 1 whole, then the model's 8 (followed by 1, 2 before)
                nxt = r.propose_tree()[0] if tree else r.propose()
                assert nxt[:2] == [1, 2]
                r.extend([nxt[0], 0])
            s = d.policy_state
            counts = [c if isinstance(c, dict) else list(c) for c in (s.tried, s.ok, s.l_tried, s.l_ok)]
            states.append((s.balance, s.threshold, nxt, counts))
        assert states[0] == states[1]

    def test_stop_cuts_every_branch(self) -> None:
        d = self.drafter()
        with d.request([7, 1, 2]) as r:
            assert r.propose_tree(stop={4}) == [[5, 6], [3]]
            assert r.propose_tree(stop={5}) == []  # branch 0 left empty: no tree
            assert r.propose_tree(branches=1) == [[5, 6]]

    def test_llama_policy_refuses(self) -> None:
        d = self.impl.Drafter()
        with d.request([1, 2, 3]) as r, pytest.raises(ValueError, match="policy='hybrid'"):
            r.propose_tree()


class TestRequestTreeReference(ReferenceImpl, RequestTreeTests):
    pass


class TestRequestTreeFast(FastImpl, RequestTreeTests):
    pass


def drive_tree(drafter: Any, tokens: list[int], n_ctx: int, branches: int) -> None:
    """Drive ``drafter`` over ``tokens`` as llama-lookup-stats does (see tests/test_drafter.py's
    ``drive``), with tree proposals: the "model" (the text) accepts the longest branch prefix."""
    i_start = 0
    while i_start + n_ctx < len(tokens):
        chunk = tokens[i_start : i_start + n_ctx]
        with drafter.request(chunk[:1]) as req:
            while len(req.tokens) < n_ctx:
                tree = req.propose_tree(branches=branches)
                pos = len(req.tokens)
                truth = chunk[pos:]
                committed = truth[: max((common_prefix(b, truth) for b in tree), default=0) + 1]
                req.extend(committed)
        i_start += n_ctx


@pytest.mark.parametrize("impl", ["fast", pytest.param("reference", marks=pytest.mark.slow)])
def test_drafter_gives_the_tree_replay_counts(impl: str) -> None:
    m = fast_impl() if impl == "fast" else ref
    tokens = ids(DEMO_DATA / "wiki.test.demo.llama3.bin", 2500)
    static = m.build_static(ids(DEMO_DATA / "enwiki_wt.demo.llama3.bin", 10000))
    drafter = m.Drafter(static=static, policy="hybrid")
    drive_tree(drafter, tokens, 800, 3)
    r = m.replay(tokens, 800, 8, static, None, None, "hybrid", None, 3)
    assert (drafter.stats.n_drafted, drafter.stats.n_accept) == (r.n_drafted, r.n_accept)
    assert r.n_accept > m.replay(tokens, 800, 8, static, None, None, "hybrid").n_accept  # the trees were used


def test_open_requests_branch0_is_propose() -> None:
    # Two requests open at once: the second is not the history's and drafts detached. A tree
    # Drafter and a linear one fed the same committed tokens propose the same branch 0.
    fast = fast_impl()
    text = ids(DEMO_DATA / "wiki.test.demo.llama3.bin", 1200)
    tree_d, lin_d = fast.Drafter(policy="hybrid"), fast.Drafter(policy="hybrid")
    with tree_d.request(text[:300]), lin_d.request(text[:300]):
        pass  # an earlier request in both histories
    parts = [text[300:700], text[700:1200]]
    reqs = [(tree_d.request(p[:20]), lin_d.request(p[:20]), p) for p in parts]
    gained = 0
    for _step in range(60):
        for rt, rl, part in reqs:
            tree = rt.propose_tree(branches=3)
            linear = rl.propose()
            assert (tree[0] if tree else []) == linear
            check_tree(tree, 3)
            truth = part[len(rt.tokens) :]
            n = max((common_prefix(b, truth) for b in tree), default=0)
            gained += n > common_prefix(linear, truth)
            rt.extend(truth[: n + 1])
            rl.extend(truth[: n + 1])
    for rt, rl, _ in reqs:
        rt.end()
        rl.end()
    assert gained > 0


# --- the command line --------------------------------------------------------------------------


def test_cli_branches_need_the_hybrid_policy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "replay.bin"
    np.asarray([1, 2, 3] * 20, dtype="<i4").tofile(path)
    code = cli.main(["stats", str(path), "-c", "16", "--branches", "2"])
    _, err = capsys.readouterr()
    assert code == 2 and "Traceback" not in err
    assert "--branches 2" in err and "--policy hybrid" in err
    code = cli.main(["stats", str(path), "-c", "16", "--policy", "hybrid", "--branches", "0"])
    _, err = capsys.readouterr()
    assert code == 2 and "--branches must be >= 1" in err


def test_cli_tree_replay(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    path = tmp_path / "replay.bin"
    tokens = ids(DEMO_DATA / "wiki.test.demo.llama3.bin", 3000)
    np.asarray(tokens, dtype="<i4").tofile(path)
    fast = fast_impl()
    for b in (1, 3):
        code = cli.main(["stats", str(path), "-c", "1024", "--policy", "hybrid", "--branches", str(b), "--json", "-q"])
        out, _ = capsys.readouterr()
        assert code == 0
        got = json.loads(out)
        r = fast.replay(tokens, 1024, 8, None, None, None, "hybrid", None, b)
        assert (got["n_steps"], got["n_accept"], got["n_drafted"], got["branches"]) == (
            r.n_steps,
            r.n_accept,
            r.n_drafted,
            b,
        )
