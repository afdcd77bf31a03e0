"""Hand-worked cases for each rule of the spec that is easy to get wrong, for every implementation.

Expected values here were worked out by hand from the spec, not taken from the code.
"""

from __future__ import annotations

from typing import Any

import pytest

from lookupdec.errors import TokenRangeError
from tests.impls import FastImpl, ImplTests, ReferenceImpl

K = -1  # key padding


class SemanticsTests(ImplTests):
    def cache(self, contents: list[Any]) -> Any:
        return self.impl.NgramCache.from_contents(contents)

    def draft(self, inp: list[int], ctx: Any = None, dyn: Any = None, st: Any = None, n_draft: int = 8) -> list[int]:
        empty = self.impl.NgramCache()
        d = [inp[-1] if inp else 0]
        self.impl.draft(inp, d, n_draft, 1, 4, ctx or empty, dyn or empty, st or empty)
        return list(d[1:])

    # --- update (spec 2) ---

    def test_update_counts_again_without_memory(self) -> None:
        c = self.impl.NgramCache()
        c.update([1, 2, 3], 3)
        c.update([1, 2, 3], 3)
        assert c.get([2]) == {3: 2}
        assert c.get([1, 2]) == {3: 2}

    def test_update_nnew_zero_and_tail(self) -> None:
        c = self.impl.NgramCache()
        c.update([1, 2, 3], 0)
        assert len(c) == 0
        c.update([1, 2, 3, 4], 1)  # only follower 4 is counted, for n = 1..3 (n = 4 has no full n-gram)
        assert c.contents() == [((1, 2, 3, K), [(4, 1)]), ((2, 3, K, K), [(4, 1)]), ((3, K, K, K), [(4, 1)])]

    def test_update_rejects_non_int32(self) -> None:
        with pytest.raises(TokenRangeError):
            self.impl.NgramCache().update([1, 2**31], 2)
        with pytest.raises(ValueError, match="ngram_min"):
            self.impl.NgramCache().update([1, 2], 2, 0, 4)

    def test_merge_copies_and_adds(self) -> None:
        a = self.cache([((1, K, K, K), [(2, 1)])])
        b = self.cache([((1, K, K, K), [(2, 2), (3, 1)]), ((4, 5, K, K), [(6, 7)])])
        a.merge(b)
        assert a.contents() == [((1, K, K, K), [(2, 3), (3, 1)]), ((4, 5, K, K), [(6, 7)])]
        assert b.contents() == [((1, K, K, K), [(2, 2), (3, 1)]), ((4, 5, K, K), [(6, 7)])]

    # --- drafting (spec 3) ---

    def test_no_draft_below_two_tokens(self) -> None:
        st = self.cache([((1, 2, K, K), [(3, 5)])])
        assert self.draft([], st=st) == []
        assert self.draft([2], st=st) == []

    def test_draft_needs_exactly_one_token(self) -> None:
        empty = self.impl.NgramCache()
        with pytest.raises(ValueError, match="exactly"):
            self.impl.draft([1, 2], [2, 3], 4, 1, 4, empty, empty, empty)

    def test_static_weight_can_select_a_failing_token(self) -> None:
        """Selection is weighted, thresholds use raw counts: the weighted pick fails the share test."""
        ctx = self.cache([((7, K, K, K), [(1, 4), (2, 1)])])
        assert self.draft([9, 7], ctx=ctx, n_draft=1) == [1]  # 4 of 5 >= 66 %
        st = self.cache([((9, 7, K, K), [(2, 1)])])  # follower 2 now weighs 100: picked, 1 of 5 fails
        assert self.draft([9, 7], ctx=ctx, st=st, n_draft=1) == []  # and static alone has only 1 sample

    def test_int32_wrap_of_weighted_score(self) -> None:
        """100 * 21474837 wraps negative in int32, so the statically-known follower is never chosen."""
        ctx = self.cache([((7, K, K, K), [(1, 1), (2, 3)])])
        st = self.cache([((9, 7, K, K), [(1, 21474837)])])
        # wrapped: follower 1 scores -2147483596 < 0; follower 2 scores 3 and has 3 of 4 >= 66 %.
        # (exact arithmetic would pick 1, fail the share test, and then draft 1 from static alone)
        assert self.draft([9, 7], ctx=ctx, st=st, n_draft=1) == [2]

    def test_tie_smallest_token_wins(self) -> None:
        ctx = self.cache([((1, 2, 3, 4), [(9, 1), (8, 1)])])  # 4-gram: a=1, p=50: 1 of 2 passes
        assert self.draft([1, 2, 3, 4], ctx=ctx, n_draft=1) == [8]

    def test_ngram_before_start_is_skipped(self) -> None:
        """With 2 tokens, n = 3 and 4 do not exist; they must not fall back to a shorter key."""
        ctx = self.cache([((2, K, K, K), [(7, 1)])])  # 1 sample: fails n=1's a=2, would pass n=3's a=1
        assert self.draft([1, 2], ctx=ctx) == []

    def test_static_alone(self) -> None:
        st = self.cache([((3, 4, K, K), [(6, 1), (4, 1)])])  # 2 samples, 50 %: smallest id 4 wins
        assert self.draft([3, 4], st=st, n_draft=1) == [4]
        st1 = self.cache([((3, 4, K, K), [(6, 1)])])  # 1 sample: not enough
        assert self.draft([3, 4], st=st1) == []

    def test_dynamic_is_strict(self) -> None:
        part = [((5, K, K, K), [(6, 3)])]  # 3 samples: enough for context (a=2), not dynamic (a=4)
        assert self.draft([4, 5], ctx=self.cache(part), n_draft=1) == [6]
        assert self.draft([4, 5], dyn=self.cache(part), n_draft=1) == []
        part4 = [((5, K, K, K), [(6, 4)])]
        assert self.draft([4, 5], dyn=self.cache(part4), n_draft=1) == [6]

    def test_threshold_tables_at_every_n(self) -> None:
        """Each entry of the spec 3.1 tables, at its boundary: the minimum sample passes and one
        fewer fails; the minimum percent passes and one point less fails (100 observations)."""
        inp = [1, 2, 3, 4]  # every n from 1 to 4 is available

        def drafted(which: str, key: tuple[int, ...], followers: list[tuple[int, int]]) -> list[int]:
            return self.draft(inp, n_draft=1, **{which: self.cache([(key, followers)])})

        # (n, a, p) copied from the spec 3.1 table, LAX for the context cache, STRICT for dynamic
        lax = [(1, 2, 66), (2, 2, 50), (3, 1, 50), (4, 1, 50)]
        strict = [(1, 4, 75), (2, 3, 66), (3, 2, 66), (4, 2, 66)]
        for which, table in (("ctx", lax), ("dyn", strict)):
            for n, a, pct in table:
                key = tuple(inp[4 - n :]) + (K,) * (4 - n)
                where = f"{which} n={n}"
                assert drafted(which, key, [(9, a)]) == [9], where
                if a > 1:
                    assert drafted(which, key, [(9, a - 1)]) == [], where
                rest = 100 - pct  # split in two so token 9 keeps the maximum
                assert drafted(which, key, [(9, pct), (7, rest - rest // 2), (8, rest // 2)]) == [9], where
                rest += 1
                assert drafted(which, key, [(9, pct - 1), (7, rest - rest // 2), (8, rest // 2)]) == [], where

    def test_static_thresholds(self) -> None:
        """Spec 3.2: at least 2 observations and a 50 % share (the LAX entries of a 2-gram)."""
        assert self.draft([3, 4], st=self.cache([((3, 4, K, K), [(6, 2)])]), n_draft=1) == [6]
        assert self.draft([3, 4], st=self.cache([((3, 4, K, K), [(6, 50), (5, 25), (4, 25)])]), n_draft=1) == [6]
        assert self.draft([3, 4], st=self.cache([((3, 4, K, K), [(6, 49), (5, 26), (4, 25)])]), n_draft=1) == []

    def test_drafts_chain_and_stop_at_n_draft(self) -> None:
        ctx = self.cache([((1, K, K, K), [(1, 5)])])  # 1 -> 1 forever
        assert self.draft([0, 1], ctx=ctx, n_draft=3) == [1, 1, 1]
        assert self.draft([0, 1], ctx=ctx, n_draft=0) == []

    def test_longest_ngram_first(self) -> None:
        ctx = self.cache([((1, K, K, K), [(5, 9)]), ((0, 1, K, K), [(6, 2)])])
        assert self.draft([0, 1], ctx=ctx, n_draft=1) == [6]

    # --- replay (spec 8.2) ---

    def test_replay_drops_last_full_chunk(self) -> None:
        dyn = self.impl.NgramCache()
        result = self.impl.replay([1, 2, 3, 4, 5, 6, 7, 8], 4, 8, None, dyn)
        expected = self.impl.NgramCache()
        expected.update([1, 2, 3, 4], 4)  # only the first chunk was replayed and merged
        assert dyn.contents() == expected.contents()
        assert (result.n_predict, result.n_tokens) == (8, 8)

    def test_replay_accepts_repetition(self) -> None:
        tokens = [1, 2, 3] * 30
        result = self.impl.replay(tokens, 64, 4)
        assert result.n_accept > 40
        assert 0 < result.accept <= 100
        assert result.n_drafted >= result.n_accept
        assert result.t_draft_s > 0

    def test_replay_progress(self) -> None:
        seen: list[tuple[int, int]] = []
        self.impl.replay(list(range(10)), 3, 2, progress=lambda done, total: seen.append((done, total)))
        assert seen == [(3, 10), (6, 10), (9, 10)]


class TestSemanticsReference(ReferenceImpl, SemanticsTests):
    pass


class TestSemanticsFast(FastImpl, SemanticsTests):
    pass
