"""The fast cache's compact layout (issue 10 item 4) against the reference.

Two paths of ``lookupdec.fast`` that ordinary data rarely takes are driven here on purpose:

- counts, sums and maxima are int32 slots with an exact i64 side array past 2^31-1: a count
  pushed past it in memory (by update, by either merge, by a copy) stays exact, drafts exactly
  as the reference's unbounded ints, and saturates (with the one warning naming the file) only
  when saved;
- a key whose counts sum to at most ``SCAN_MAX`` finds its followers by walking its list, the
  others through the pair table: keys that cross the limit (one observation at a time, or at
  once by a merge) give the reference's contents and drafts, and the table holds exactly the
  nodes of the keys past the limit.

Expected values come from the reference implementation.
"""

from __future__ import annotations

import pickle
import warnings
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lookupdec import reference
from lookupdec.errors import CountSaturationWarning
from lookupdec.fast import _cache, _tables
from tests.conftest import fast_impl

fast = fast_impl()
BIG = 2**31 - 1


def both(contents: list[tuple[tuple[int, int, int, int], list[tuple[int, int]]]]) -> tuple[Any, Any]:
    return reference.NgramCache.from_contents(contents), fast.NgramCache.from_contents(contents)


def check_same(ref: Any, fst: Any) -> None:
    """Same contents, insertion order of keys, totals, and the pair table's invariant."""
    assert fst.contents() == ref.contents()
    assert list(fst.keys()) == list(ref.keys())
    assert [list(p.items()) for _, p in fst.items()] == [list(p.items()) for _, p in ref.items()]
    assert fst.total_count == ref.total_count
    assert (len(fst), fst.n_entries) == (len(ref), ref.n_entries)
    check_pair_table(fst)


def check_pair_table(c: Any) -> None:
    """The pair table holds the nodes of the keys whose sum is past SCAN_MAX, and no other."""
    c._fresh()
    held = sorted(n for n in c._pslots if n >= 0)
    want = []
    for kid in range(len(c)):
        total = _tables.get_count(c._sum, c._wsum, kid)
        node = c._head[kid]
        while node >= 0:
            if total > _cache.SCAN_MAX:
                want.append(node)
            node = c._nnext[node]
    assert held == sorted(want)
    assert c._pcount == len(want)
    assert 2 * len(want) <= len(c._pslots)


def drafts(impl: Any, ctx: Any, dyn: Any, static: Any, inputs: list[list[int]]) -> list[list[int]]:
    out = []
    static = impl.NgramCache() if static is None else static
    for inp in inputs:
        d = [inp[-1]]
        impl.draft(inp, d, 6, 1, 4, ctx, dyn, static)
        out.append(d)
    return out


# --- counts past int32 -------------------------------------------------------------------------


def test_count_pushed_past_int32_by_update_stays_exact(tmp_path: Path) -> None:
    start = [((1, 2, -1, -1), [(3, BIG - 1), (4, 7)]), ((3, -1, -1, -1), [(9, BIG)])]
    ref, fst = both(start)
    for c in (ref, fst):
        c.update([1, 2, 3, 1, 2, 3, 9, 3, 9], 9, 1, 2)
    check_same(ref, fst)
    assert fst.get([1, 2]) == {3: BIG + 1, 4: 7}
    assert fst.get([3]) == {9: BIG + 2, 1: 1}
    assert fst._wcnt  # the side array really holds them
    # saved: saturated, one warning naming the file, the same bytes as the reference's
    paths = []
    for name, c in (("ref", ref), ("fast", fst)):
        path = tmp_path / f"{name}.bin"
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            c.save(path)
        assert [str(w.message) for w in caught if issubclass(w.category, CountSaturationWarning)] == [
            f"{path}: 2 count(s) above 2^31-1 saturated at 2147483647"
        ]
        paths.append(path)
    assert paths[0].read_bytes() == paths[1].read_bytes()
    assert dict(fast.NgramCache.load(paths[1]).contents())[(1, 2, -1, -1)] == [(3, BIG), (4, 7)]
    # in memory nothing saturated
    assert fst.get([1, 2]) == {3: BIG + 1, 4: 7}


@pytest.mark.parametrize("shape", ["sorted", "probe", "copy", "self"])
def test_counts_past_int32_through_every_merge(shape: str) -> None:
    a = [((5, 6, -1, -1), [(7, BIG), (8, 3)]), ((5, -1, -1, -1), [(6, BIG - 5)])]
    b = [((5, 6, -1, -1), [(7, BIG), (9, BIG)]), ((5, -1, -1, -1), [(6, 10), (1, 2)]), ((4, -1, -1, -1), [(2, BIG)])]
    ref, fst = both(a)
    ref_b, fst_b = both(b)
    if shape == "probe":  # a cache 8 times bigger with its tables built merges by probing
        filler = [((100 + i, -1, -1, -1), [(1, 1)]) for i in range(40)]
        ref, fst = both(a + filler)
        fst._fresh()
    if shape == "copy":
        ref, fst = reference.NgramCache(), fast.NgramCache()
        ref.merge(reference.NgramCache.from_contents(a))
        fst.merge(fast.NgramCache.from_contents(a))
    for _ in range(2):
        if shape == "self":
            ref.merge(ref)
            fst.merge(fst)
        else:
            ref.merge(ref_b)
            fst.merge(fst_b)
    check_same(ref, fst)
    assert fst.get([5, 6]) == ref.get([5, 6])
    assert max(fst.get([5, 6]).values()) > 2 * BIG  # past int32, exact
    assert fst == fast.NgramCache.from_contents(ref.contents())
    # pickling keeps the exact counts
    assert pickle.loads(pickle.dumps(fst)).contents() == ref.contents()


def test_sums_past_int32_draft_like_the_reference() -> None:
    # Followers whose counts and sums pass int32: the precheck, the share test and the
    # score's int32 wrap (spec 5) read the exact values, as the reference's ints.
    contents = [
        ((1, 2, -1, -1), [(3, BIG), (4, BIG), (5, 2)]),
        ((2, -1, -1, -1), [(3, BIG - 1), (6, 3 * BIG)]),
        ((2, 3, -1, -1), [(7, 5 * BIG), (8, 1)]),
        ((3, -1, -1, -1), [(7, 1)]),
    ]
    ref, fst = both(contents)
    ref.merge(reference.NgramCache.from_contents(contents))
    fst.merge(fast.NgramCache.from_contents(contents))
    inputs = [[1, 2], [9, 2], [2, 3], [1, 2, 3], [5, 1, 2]]
    empty_r, empty_f = reference.NgramCache(), fast.NgramCache()
    for static_r, static_f in ((None, None), (ref, fst)):
        # as the dynamic cache (strict thresholds), as the context cache (lax) and as the static one
        assert drafts(fast, empty_f, fst, static_f, inputs) == drafts(reference, empty_r, ref, static_r, inputs)
        assert drafts(fast, fst, empty_f, static_f, inputs) == drafts(reference, ref, empty_r, static_r, inputs)
        assert drafts(fast, empty_f, empty_f, fst, inputs) == drafts(reference, empty_r, empty_r, ref, inputs)


def test_loaded_sum_past_int32(tmp_path: Path) -> None:
    # A file's counts are int32, their sum need not be: a loaded key's sum is exact.
    contents = [((1, -1, -1, -1), [(2, BIG), (3, BIG), (4, 1)]), ((2, -1, -1, -1), [(1, 4)])]
    path = tmp_path / "c.bin"
    reference.NgramCache.from_contents(contents).save(path)
    ref, fst = reference.NgramCache.load(path), fast.NgramCache.load(path)
    assert fst.total_count == ref.total_count == 2 * BIG + 5
    check_same(ref, fst)
    assert drafts(fast, fast.NgramCache(), fst, None, [[5, 1], [9, 2]]) == drafts(
        reference, reference.NgramCache(), ref, None, [[5, 1], [9, 2]]
    )


# --- scanned keys and the pair table ---------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(
    a=st.lists(st.integers(0, 5), min_size=2, max_size=120),
    b=st.lists(st.integers(0, 5), min_size=2, max_size=120),
    sizes=st.sampled_from([(1, 4), (1, 1), (2, 2), (1, 2)]),
)
def test_keys_crossing_the_scan_limit(a: list[int], b: list[int], sizes: tuple[int, int]) -> None:
    # Few distinct tokens: many keys pass SCAN_MAX one observation at a time, others jump
    # past it in a merge, and the pair table grows while whole keys move into it.
    lo, hi = sizes
    ref, fst = reference.NgramCache(), fast.NgramCache()
    for c in (ref, fst):
        c.update(a, len(a), lo, hi)
    check_same(ref, fst)
    ref_b, fst_b = reference.NgramCache(), fast.NgramCache()
    for c in (ref_b, fst_b):
        c.update(b, len(b), lo, hi)
    ref.merge(ref_b)
    fst.merge(fst_b)
    check_same(ref, fst)
    inputs = [a[: i + 2] for i in range(0, len(a) - 1, 7)]
    assert drafts(fast, fst_b, fst, fst, inputs) == drafts(reference, ref_b, ref, ref, inputs)
    for kid in range(len(fst)):  # every follower found, scanned or probed
        node = fst._head[kid]
        while node >= 0:
            assert fst._pair_find(kid, fst._ntok[node]) == node
            node = fst._nnext[node]
        assert fst._pair_find(kid, 99) == -1


@pytest.mark.parametrize("blocks, extra", [(0, 0), (0, 1), (0, 3), (1, -1), (1, 0), (1, 1), (2, 0), (2, 1809)])
def test_filled_i32_has_n_copies(blocks: int, extra: int) -> None:
    # The block copies of filled_i32 (every hash table's fill) at the edges of a block.
    from lookupdec.fast._tables import FILL_BLOCK, filled_i32

    n = blocks * FILL_BLOCK + extra
    v = filled_i32(n, -7)
    assert len(v) == n
    assert list(v) == [-7] * n


@pytest.mark.parametrize("blocks, extra", [(0, 0), (0, 1), (1, -1), (1, 0), (1, 1), (3, 5), (128, 0)])
def test_zeros_i64_has_n_zeros(blocks: int, extra: int) -> None:
    # zeros_i64 appends below FILL_BLOCK and copies blocks from it on (a HybridState's tables).
    n = blocks * _tables.FILL_BLOCK + extra
    v = _tables.zeros_i64(n)
    assert len(v) == n
    assert list(v) == [0] * n
    for i in range(n):  # the tables are written in place: no later vec may share their buffer
        v[i] = 7
    assert list(_tables.zeros_i64(n)) == [0] * n


# --- spare room past the counts ----------------------------------------------------------------


def test_spare_room_past_the_counts(tmp_path: Path) -> None:
    # The key and node arrays hold spare room past _nk / _nn, filled by stores, grown by
    # GROW_BLOCK; _clear_keep keeps it, so the next chunk's keys overwrite the old ones. Past a
    # block of keys and nodes, after a clear that keeps the room, and through every merge and
    # the file encoder (which take the arrays' lengths after _compact), the cache must be the
    # reference's.
    import random

    rng = random.Random(7)
    first = [rng.randrange(40) for _ in range(3 * _tables.GROW_BLOCK)]
    second = [rng.randrange(9) for _ in range(_tables.GROW_BLOCK)]
    fst = fast.NgramCache()
    fst.update(first, len(first))
    assert len(fst) > _tables.GROW_BLOCK and fst.n_entries > _tables.GROW_BLOCK
    fst._clear_keep()
    fst.update(second, len(second))
    assert len(fst._k0) > len(fst)  # the first chunk's room is still there, past the count
    ref = reference.NgramCache()
    ref.update(second, len(second))
    fst.save(tmp_path / "fast.bin")
    ref.save(tmp_path / "ref.bin")
    assert (tmp_path / "fast.bin").read_bytes() == (tmp_path / "ref.bin").read_bytes()
    assert len(fst._k0) == len(fst)  # saved from the arrays cut to the counts
    check_same(ref, fst)
    # into a big cache by probing, then by sorting both (a small cache into a big one)
    other_tokens = [rng.randrange(60) for _ in range(500)]

    def updated(impl: Any, tokens: list[int]) -> Any:
        cache = impl.NgramCache()
        cache.update(tokens, len(tokens))
        return cache

    for kind in ("probe", "sorted"):
        f2, r2 = updated(fast, second), updated(reference, second)
        small_f, small_r = updated(fast, other_tokens), updated(reference, other_tokens)
        if kind == "probe":
            f2.merge(small_f)
            r2.merge(small_r)
        else:
            small_f.merge(f2)
            small_r.merge(r2)
            f2, r2 = small_f, small_r
        check_same(r2, f2)
    fst.update(first[:50], 50)  # and it grows again from there
    ref.update(first[:50], 50)
    check_same(ref, fst)
