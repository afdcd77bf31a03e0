"""Merging, loading and saving legacy (llama.cpp) cache files on the fast path: the reference's bytes.

The fast path reads and writes legacy files in ``lookupdec.fast._legacy`` (native decode,
radix-sorted encode) and ``lookupdec merge`` of legacy files streams them there without
building a cache. Every expected value here comes from the reference implementation: its
``NgramCache.load``, ``merge`` and the canonical, saturating encoder its ``save`` uses.
"""

from __future__ import annotations

import os
import random
import shutil
import struct
import subprocess
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lookupdec
from lookupdec import cli, reference
from lookupdec.errors import CacheFormatError, CountSaturationWarning
from lookupdec.formats.legacy import encode_legacy_saturating
from tests.conftest import fast_impl

fast = fast_impl()
INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1
PACKAGE = Path(lookupdec.__file__).resolve().parent

Record = tuple[tuple[int, int, int, int], list[tuple[int, int]]]


def raw_file(records: Sequence[Record], tail: bytes = b"") -> bytes:
    """Legacy-format bytes of ``records`` exactly as given: any order, repeats kept."""
    out = bytearray()
    for key, followers in records:
        out += struct.pack("<4ii", *key, len(followers))
        for tok, cnt in followers:
            out += struct.pack("<ii", tok, cnt)
    return bytes(out) + tail


def reference_merge(paths: Sequence[Path]) -> tuple[bytes, int, reference.NgramCache]:
    """What the reference's ``lookupdec merge`` writes: load, merge, saturating canonical save."""
    merged = reference.NgramCache()
    for p in paths:
        merged.merge(reference.NgramCache.load(p))
    data, n_saturated = encode_legacy_saturating(merged.contents())
    return data, n_saturated, merged


def state(cache: Any) -> list[list[int]]:
    """Every array of a fast cache, hash tables (built first: load and merge leave them to
    the first lookup) and per-key aggregates included."""
    cache._fresh()
    cache._compact()  # the arrays as the counts say: past them is spare room, whatever it holds
    names = ["_k0", "_k1", "_head", "_tail", "_sum", "_max", "_wsum", "_wmax", "_best", "_slots"]
    names += ["_ntok", "_ncnt", "_wcnt", "_nnext", "_nkey"]
    # The pair table as its size and the nodes it holds: it holds the nodes of the keys whose
    # sum passed SCAN_MAX, put in when the sum passed it, so its layout depends on that history
    # (a table built at once puts them in node order).
    pslots = list(cache._pslots)
    return [list(getattr(cache, name)) for name in names] + [[len(pslots), *sorted(n for n in pslots if n >= 0)]]


def caught_messages(category: type[Warning], record: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, category)]


# Few distinct values, so keys and followers repeat across records and files; the extremes
# of int32 and -1 (the padding) among them, so packing and signed order are exercised.
SLOT = st.sampled_from([-1, 0, 1, 2, 3, 77, 128255, -2, INT32_MIN, INT32_MAX])
COUNT = st.sampled_from([1, 2, 3, 5, 1000, 2**30, INT32_MAX - 1, INT32_MAX])
RECORD = st.tuples(st.tuples(SLOT, SLOT, SLOT, SLOT), st.lists(st.tuples(SLOT, COUNT), min_size=1, max_size=5))
FILE = st.tuples(
    st.lists(RECORD, max_size=12),
    st.booleans(),  # canonical (as lookupdec writes it) or raw (hash-map order, repeats)
    st.integers(min_value=0, max_value=15),  # trailing bytes too few for a record
)


def write_inputs(tmp: Path, files: list[tuple[list[Record], bool, int]]) -> list[Path]:
    paths = []
    for i, (records, canonical, n_tail) in enumerate(files):
        p = tmp / f"in{i}.bin"
        if canonical:
            p.write_bytes(raw_file(records))
            # the reference's own canonical file of the same contents
            p.write_bytes(encode_legacy_saturating(reference.NgramCache.load(p).contents())[0] + b"\x07" * n_tail)
        else:
            p.write_bytes(raw_file(records, b"\x07" * n_tail))
        paths.append(p)
    return paths


# 120 examples (was 250) keep the README's test command under a minute; the fuzz tests cover
# the same files with many more mutants.
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(files=st.lists(FILE, min_size=1, max_size=3))
def test_merge_files_equals_reference(tmp_path_factory: pytest.TempPathFactory, files: list[Any]) -> None:
    tmp = tmp_path_factory.mktemp("m")
    paths = write_inputs(tmp, files)
    with warnings.catch_warnings(record=True) as ref_record:
        warnings.simplefilter("always")
        expected, n_saturated, ref_merged = reference_merge(paths)
    out = tmp / "out.bin"
    with warnings.catch_warnings(record=True) as fast_record:
        warnings.simplefilter("always")
        n_keys, n_entries = fast.merge_legacy_files([str(p) for p in paths], str(out))
    assert out.read_bytes() == expected
    assert (n_keys, n_entries) == (len(ref_merged), ref_merged.n_entries)
    # the same trailing-bytes warnings, and one saturation warning naming the output
    assert caught_messages(UserWarning, fast_record) == [
        *caught_messages(UserWarning, ref_record),
        *([f"{out}: {n_saturated} count(s) above 2^31-1 saturated at 2147483647"] if n_saturated else []),
    ]
    # The cache path behind it (load, merge, save) gives the same bytes and the same insertion order.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        merged = fast.NgramCache()
        loaded = [fast.NgramCache.load(p) for p in paths]
        for cache in loaded:
            merged.merge(cache)
        out2 = tmp / "out2.bin"
        merged.save(out2)
        assert [list(c.items()) for c in loaded] == [list(reference.NgramCache.load(p).items()) for p in paths]
        # Built at once, the arrays and tables are those of inserting key by key (the aggregates
        # drafting reads included); a merge into an empty cache is an exact copy.
        for cache in loaded:
            rebuilt = fast.NgramCache.from_contents([(k, list(p.items())) for k, p in cache.items()])
            assert state(cache) == state(rebuilt)
        copied = fast.NgramCache()
        copied.merge(loaded[0])
        assert state(copied) == state(loaded[0])
    assert out2.read_bytes() == expected
    assert list(merged.items()) == list(ref_merged.items())


def test_merge_cli_streams_the_same_bytes(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    tokens = np.fromfile(PACKAGE / "data" / "enwiki_wt.demo.llama3.bin", dtype="<i4").tolist()
    a, b = tmp_path / "a.bin", tmp_path / "b.bin"
    for path, part in ((a, tokens[:15000]), (b, tokens[10000:25000])):  # overlapping: shared keys
        cache = reference.NgramCache()
        cache.update(part, len(part))
        cache.save(path)
    outs = {}
    for impl in ("reference", "fast"):
        outs[impl] = tmp_path / f"{impl}.bin"
        assert cli.main(["merge", str(a), str(b), "-o", str(outs[impl]), "--impl", impl]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert outs["fast"].read_bytes() == outs["reference"].read_bytes() == reference_merge([a, b])[0]
    assert lines[0].split(":", 1)[1] == lines[1].split(":", 1)[1]  # the same summary (keys, entries, MB)


def test_save_load_many_keys_equals_reference(tmp_path: Path) -> None:
    """Past the comparison-sort size: the radix sort, and the sorted-prefix shortcut after a merge."""
    tokens = np.fromfile(PACKAGE / "data" / "wiki.test.demo.llama3.bin", dtype="<i4").tolist()
    ref, fst = reference.NgramCache(), fast.NgramCache()
    for cache in (ref, fst):
        cache.update(tokens[:20000], 20000)
    assert len(ref) > 4096
    ref.save(tmp_path / "r.bin")
    fst.save(tmp_path / "f.bin")
    assert (tmp_path / "f.bin").read_bytes() == (tmp_path / "r.bin").read_bytes()
    # loaded (keys ascending), then new keys appended by a merge: the shortcut's case
    ref2, fst2 = reference.NgramCache.load(tmp_path / "r.bin"), fast.NgramCache.load(tmp_path / "f.bin")
    more = tokens[19000:26000]
    for cache, impl in ((ref2, reference), (fst2, fast)):
        add = impl.NgramCache()
        add.update(more, len(more))
        cache.merge(add)
    assert list(fst2.items()) == list(ref2.items())
    ref2.save(tmp_path / "r2.bin")
    fst2.save(tmp_path / "f2.bin")
    assert (tmp_path / "f2.bin").read_bytes() == (tmp_path / "r2.bin").read_bytes()


@pytest.mark.parametrize("n", [0, 1, 10, 4096, 4097, 30000])
@pytest.mark.parametrize("layout", ["random", "sorted", "sorted-prefix", "two-runs", "reversed"])
def test_key_order_is_a_stable_tuple_sort(n: int, layout: str) -> None:
    from librt.vecs import vec
    from mypy_extensions import i64

    from lookupdec.fast import _legacy, _tables

    rng = random.Random(n * 7 + len(layout))
    pool = [-1, 0, 1, 5, 300, 65535, 65536, 128255, -70000, INT32_MIN, INT32_MAX]
    keys = [tuple(rng.choice(pool) if rng.random() < 0.5 else rng.randrange(-(2**20), 2**20) for _ in range(4))
            for _ in range(n)]  # fmt: skip
    if layout == "sorted":
        keys = sorted(set(keys))
    elif layout == "sorted-prefix":
        keys = sorted(set(keys[: 3 * n // 4])) + keys[3 * n // 4 :]  # the tail may repeat prefix keys
    elif layout == "two-runs":  # a sorted merge's layout: the tail ascending too, sharing keys with the prefix
        keys = sorted(set(keys[: 3 * n // 4])) + sorted(set(keys[n // 2 :]))
    elif layout == "reversed":
        keys = sorted(keys, reverse=True)
    k0 = vec[i64]([_tables.pack(k[0], k[1]) for k in keys])
    k1 = vec[i64]([_tables.pack(k[2], k[3]) for k in keys])
    got = list(_legacy.key_order(k0, k1))
    assert got == sorted(range(len(keys)), key=lambda i: (keys[i], i))


# --- saturation -----------------------------------------------------------------------------------


def test_merge_saturates_every_count_once_warned(tmp_path: Path) -> None:
    a, b, c = tmp_path / "a.bin", tmp_path / "b.bin", tmp_path / "c.bin"
    a.write_bytes(raw_file([((1, 2, 3, 4), [(7, INT32_MAX), (8, 1)]), ((5, -1, -1, -1), [(9, 2**30)])]))
    b.write_bytes(raw_file([((5, -1, -1, -1), [(9, 2**30)]), ((1, 2, 3, 4), [(7, 1), (8, INT32_MAX - 1)])]))
    c.write_bytes(raw_file([((5, -1, -1, -1), [(9, 2**30)])]))
    out = tmp_path / "out.bin"
    with pytest.warns(CountSaturationWarning) as record:
        fast.merge_legacy_files([str(a), str(b), str(c)], str(out))
    assert [str(w.message) for w in record] == [f"{out}: 2 count(s) above 2^31-1 saturated at 2147483647"]
    assert list(reference.NgramCache.load(out).contents()) == [
        ((1, 2, 3, 4), [(7, INT32_MAX), (8, INT32_MAX)]),
        ((5, -1, -1, -1), [(9, INT32_MAX)]),  # 3 * 2**30 > 2**31-1
    ]
    assert out.read_bytes() == reference_merge([a, b, c])[0]


# --- bad input ------------------------------------------------------------------------------------

GOOD = raw_file([((1, 2, -1, -1), [(3, 4), (5, 6)]), ((2, 3, -1, -1), [(4, 1)])])


@pytest.mark.parametrize(
    "bad",
    [
        GOOD[:-4],  # the last count missing
        GOOD[:24],  # a record cut inside its followers
        GOOD[:18],  # a key, half an ntokens
        GOOD[:16] + struct.pack("<i", 0) + GOOD[20:],  # ntokens = 0
        GOOD[:16] + struct.pack("<i", -3) + GOOD[20:],  # ntokens < 0
        GOOD[:24] + struct.pack("<i", 0) + GOOD[28:],  # count = 0
        GOOD[:32] + struct.pack("<i", -1) + GOOD[36:],  # count < 0
        GOOD + GOOD[:20] + struct.pack("<i", 5),  # a record's followers cut after a complete file
    ],
)
def test_bad_input_error_names_the_file(tmp_path: Path, bad: bytes) -> None:
    good_path, bad_path = tmp_path / "good.bin", tmp_path / "bad input.bin"
    good_path.write_bytes(GOOD)
    bad_path.write_bytes(bad)
    with pytest.raises(CacheFormatError) as ref_error:
        reference.NgramCache.load(bad_path)
    assert str(bad_path) in str(ref_error.value)
    with pytest.raises(CacheFormatError) as load_error:
        fast.NgramCache.load(bad_path)
    assert str(load_error.value) == str(ref_error.value)
    out = tmp_path / "out.bin"
    out.write_bytes(b"keep me")
    with pytest.raises(CacheFormatError) as merge_error:
        fast.merge_legacy_files([str(good_path), str(bad_path)], str(out))
    assert str(merge_error.value) == str(ref_error.value)
    assert out.read_bytes() == b"keep me"  # nothing written


def test_strict_merge_refuses_trailing_bytes(tmp_path: Path) -> None:
    path = tmp_path / "t.bin"
    path.write_bytes(GOOD + b"\x01\x02\x03")
    with pytest.raises(CacheFormatError) as ref_error:
        reference.NgramCache.load(path, strict=True)
    with pytest.raises(CacheFormatError) as fast_error:
        fast.merge_legacy_files([str(path)], str(tmp_path / "o.bin"), strict=True)
    assert str(fast_error.value) == str(ref_error.value)
    with pytest.warns(UserWarning, match="3 trailing bytes"):
        fast.merge_legacy_files([str(path)], str(tmp_path / "o.bin"))
    assert (tmp_path / "o.bin").read_bytes() == GOOD


# --- interpreted ------------------------------------------------------------------------------------


def test_interpreted_merge_equals_reference(tmp_path: Path) -> None:
    """The same module run as plain Python (no extension modules) writes the same bytes."""
    src = tmp_path / "src" / "lookupdec"
    shutil.copytree(PACKAGE, src, ignore=shutil.ignore_patterns("*.so", "*.pyd", "__pycache__", "data"))
    rng = random.Random(5)
    paths = []
    for i in range(2):
        records = [((rng.choice([-1, 1, 2, INT32_MIN]), rng.choice([-1, 3, INT32_MAX]), -1, rng.choice([-1, 4])),
                    [(rng.choice([1, 2, -7]), rng.choice([1, INT32_MAX])) for _ in range(rng.randint(1, 3))])
                   for _ in range(40)]  # fmt: skip
        paths.append(tmp_path / f"{i}.bin")
        paths[-1].write_bytes(raw_file(records))
    code = (
        "import sys, warnings\n"
        "warnings.simplefilter('ignore')\n"
        "import lookupdec.fast as f\n"
        "assert not f.COMPILED\n"
        "f.merge_legacy_files(sys.argv[1:3], sys.argv[3])\n"
        "c = f.NgramCache()\n"
        "for p in sys.argv[1:3]:\n"
        "    c.merge(f.NgramCache.load(p))\n"
        "c.save(sys.argv[4])\n"
    )
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "src"))
    env.pop("LOOKUPDEC_REQUIRE_MYPYC", None)
    outs = [tmp_path / "stream.bin", tmp_path / "cache.bin"]
    subprocess.run([sys.executable, "-c", code, *map(str, paths), *map(str, outs)], env=env, cwd=tmp_path, check=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = reference_merge(paths)[0]
    assert outs[0].read_bytes() == outs[1].read_bytes() == expected


TOKEN = st.integers(min_value=0, max_value=6)  # few ids: keys and followers shared by both caches
BARE_KEY = st.tuples(st.sampled_from([0, 1, 9, INT32_MIN]), st.just(-1), st.just(-1), st.just(-1))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    a=st.lists(TOKEN, max_size=40),
    b=st.lists(TOKEN, max_size=40),
    bare=st.lists(st.tuples(BARE_KEY, st.booleans()), max_size=3),
    through_files=st.booleans(),
)
def test_merge_paths_equal_reference(
    tmp_path_factory: pytest.TempPathFactory,
    a: list[int],
    b: list[int],
    bare: list[tuple[tuple[int, int, int, int], bool]],
    through_files: bool,
) -> None:
    """The sorted merge and the probe merge give the reference's caches and the same arrays."""
    if through_files:
        bare = []  # a key without followers cannot be saved (a record needs ntokens > 0)
    refs = []
    for tokens, side in ((a, False), (b, True)):
        ref = reference.NgramCache.from_contents([(key, []) for key, on_b in bare if on_b == side])
        ref.update(tokens, len(tokens))  # followers in insertion order, not ascending
        refs.append(ref)
    expected = reference.NgramCache()
    for r in refs:
        # Through files, each cache is loaded in canonical order (keys and followers ascending).
        expected.merge(reference.NgramCache.from_contents(r.contents()) if through_files else r)

    def fast_pair() -> tuple[Any, Any]:
        caches = [fast.NgramCache.from_contents([(k, list(p.items())) for k, p in r.items()]) for r in refs]
        if through_files:  # loaded: keys ascending, tables not built yet
            tmp = tmp_path_factory.mktemp("p")
            for i, cache in enumerate(caches):
                cache.save(tmp / f"{i}.bin")
            caches = [fast.NgramCache.load(tmp / f"{i}.bin") for i in range(2)]
        return caches[0], caches[1]

    from lookupdec.fast._merge import merge_sorted

    by_sort, other = fast_pair()
    merge_sorted(by_sort, other)
    by_probe, other = fast_pair()
    by_probe._merge_native(other)
    public, other = fast_pair()
    public.merge(other)
    for cache in (by_sort, by_probe, public):
        assert list(cache.items()) == list(expected.items())
        keys = list(expected.keys())  # expected is a cache, not a dict
        assert [cache.get(k) for k in keys] == [expected.get(k) for k in keys]
        assert (1 << 20, 0, 0, 0) not in cache
    assert state(by_sort) == state(by_probe) == state(public)
