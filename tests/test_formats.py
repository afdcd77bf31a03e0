"""Cache file formats (lookupdec.formats): real llama.cpp files, round trips, corruption, atomicity."""

from __future__ import annotations

import contextlib
import hashlib
import os
import struct
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import fastconstmap
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from lookupdec import formats
from lookupdec.errors import CacheFormatError
from lookupdec.formats import (
    FORMATS,
    ForkStatic,
    LookupdecIndexReader,
    detect_format,
    inspect_file,
    read_as_contents,
    write_static,
)
from lookupdec.reference.cache import NgramCache, build_static
from lookupdec.reference.draft import try_static
from lookupdec.reference.files import parse_legacy
from tests.conftest import vectors

Contents = list[tuple[tuple[int, int, int, int], list[tuple[int, int]]]]

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


def as_contents(raw: list[Any]) -> Contents:
    """files.json contents (lists) as tuples."""
    return [((k[0], k[1], k[2], k[3]), [(t, c) for t, c in f]) for k, f in raw]


def canonical(contents: Any) -> Contents:
    return sorted(((k[0], k[1], k[2], k[3]), sorted((t, c) for t, c in f)) for k, f in contents)


def sample_contents() -> Contents:
    """A small static cache with negative and extreme ids, ties and a pick."""
    return [
        ((5, 6, -1, -1), [(5, 2), (7, 1)]),
        ((0, -1, -1, -1), [(INT32_MIN, 1), (-7, 3), (INT32_MAX, 3)]),
        ((-3, INT32_MAX, -1, -1), [(0, INT32_MAX)]),
        ((INT32_MIN, 4, -1, -1), [(1, 1), (2, 1)]),
        ((1, 0, -1, -1), [(9, 5)]),
    ]


def write(tmp_path: Path, name: str, data: bytes) -> Path:
    p = tmp_path / name
    p.write_bytes(data)
    return p


def written(tmp_path: Path, fmt: str, contents: Contents | None = None, **kw: Any) -> bytes:
    p = tmp_path / f"w.{fmt}"
    write_static(sample_contents() if contents is None else contents, p, fmt, **kw)
    return p.read_bytes()


def read_fully(path: Path) -> None:
    """Everything a user can do to a file: enumerate it, or (fork v1) open it and look keys up."""
    fmt = detect_format(path)
    if fmt == "fork-v1":
        fs = ForkStatic(path)
        for key, _ in sample_contents():
            fs.part(key)
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        list(read_as_contents(path))
    if fmt == "lookupdec":
        with LookupdecIndexReader(path) as r:
            for key, _ in sample_contents():
                r.part(key)
            r.verify()


# --- files.json: real files written by llama.cpp ---------------------------------------------


@pytest.mark.parametrize("i", range(len(vectors("files")["legacy"])))
@pytest.mark.parametrize("writer", ["upstream_file_hex", "fork_legacy_file_hex"])
def test_legacy_real_files(tmp_path: Path, i: int, writer: str) -> None:
    case = vectors("files")["legacy"][i]
    data = bytes.fromhex(case[writer])
    path = write(tmp_path, "legacy.bin", data)
    assert detect_format(path) == "llama"
    expected = as_contents(case["contents"])
    assert parse_legacy(data, path, strict=True).contents() == expected
    assert NgramCache.load(path).contents() == expected
    assert list(read_as_contents(path)) == expected
    info = inspect_file(path)
    assert info["format"] == "llama"
    assert info["n_keys"] == len(expected)
    assert info["n_entries"] == sum(len(f) for _, f in expected)
    assert info["total_count"] == sum(c for _, f in expected for _, c in f)
    sizes = dict.fromkeys(range(1, 5), 0)
    for k, _ in expected:
        sizes[4 - k.count(-1)] += 1  # no -1 tokens in these cases
    assert info["key_sizes"] == sizes
    assert all(n == 0 for s, n in info["key_sizes"].items() if not case["ngram_min"] <= s <= case["ngram_max"])
    tops = [r["total"] for r in info["top"]]
    assert tops == sorted(tops, reverse=True)
    assert len(tops) == min(10, len(expected))


@pytest.mark.parametrize("i", range(len(vectors("files")["legacy"])))
def test_legacy_static_cases_through_every_format(tmp_path: Path, i: int) -> None:
    case = vectors("files")["legacy"][i]
    if (case["ngram_min"], case["ngram_max"]) != (2, 2):
        with pytest.raises(ValueError, match="2-gram"):
            write_static(as_contents(case["contents"]), tmp_path / "x", "lookupdec")
        assert not (tmp_path / "x").exists()
        return
    expected = as_contents(case["contents"])
    assert build_static(case["seq"]).contents() == expected
    for fmt in FORMATS:
        p = tmp_path / f"s.{fmt}"
        write_static(expected, p, fmt)
        assert detect_format(p) == fmt
        if fmt != "fork-v1":
            assert canonical(read_as_contents(p)) == expected
        fs_or_cache: Any = ForkStatic(p) if fmt.startswith("fork") else NgramCache.from_contents(read_as_contents(p))
        for key, followers in expected:
            assert dict(fs_or_cache.part(key)) == dict(followers)


def test_truncated_legacy_vectors(tmp_path: Path) -> None:
    data = vectors("files")["truncated_legacy_load"]
    full = bytes.fromhex(data["file_hex"])
    for res in data["results"]:
        cut = full[: res["truncate_to_bytes"]]
        path = write(tmp_path, "cut.bin", cut)
        for strict, result in ((False, res["upstream_result"]), (True, res["fork_result"])):
            if result.startswith("ok"):
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    assert len(parse_legacy(cut, path, strict=strict)) == int(result.split()[1])
            else:
                with pytest.raises(CacheFormatError, match=r"cut\.bin"):
                    parse_legacy(cut, path, strict=strict)


def real_v2() -> tuple[bytes, Contents, list[int]]:
    case = vectors("files")["fork_static_v2"]
    return bytes.fromhex(case["file_hex"]), as_contents(case["contents"]), case["seq"]


def test_real_fork_v2_reads_to_its_contents(tmp_path: Path) -> None:
    data, expected, seq = real_v2()
    path = write(tmp_path, "real.bin", data)
    assert detect_format(path) == "fork-v2"
    assert list(read_as_contents(path)) == expected
    assert NgramCache.from_contents(read_as_contents(path)).contents() == expected
    assert build_static(seq).contents() == expected
    fs = ForkStatic(path)
    assert (fs.format, fs.n_keys, fs.n_entries, fs.map_hash) == ("fork-v2", 4, 5, "xxh64")
    assert fs.total_count() == 6
    for key, followers in expected:
        assert fs.part(key) == dict(followers)
        assert fs.get(key[:2]) == dict(followers)
    assert fs.part((5, 7, -1, -1)) is None
    assert fs.part((5, 6, 5, -1)) is None  # only 2-grams live in a static file
    assert fs.part((2**31, 0, -1, -1)) is None  # not an int32: cannot be there
    info = inspect_file(path)
    assert info["top"][0]["ngram"] == (5, 6)
    assert info["top"][0]["total"] == 3
    assert info["details"]["map_magic"] == "VMAP0001"


def test_fork_v2_writer_is_byte_identical(tmp_path: Path) -> None:
    data, expected, seq = real_v2()
    assert written(tmp_path, "fork-v2", expected) == data
    # The fork writes keys in first-insertion order: a cache built from the corpus gives it.
    cache = build_static(seq)
    write_static(cache.items(), tmp_path / "from_cache.bin", "fork-v2")
    assert (tmp_path / "from_cache.bin").read_bytes() == data
    # Followers given in any order are sorted by token, as the fork does.
    shuffled = [(k, list(reversed(f))) for k, f in expected]
    assert written(tmp_path, "fork-v2", shuffled) == data


def test_constmap_independent_of_key_order(tmp_path: Path) -> None:
    """The map section depends only on the key set (spec 11.3); the key table follows the order given."""
    data, expected, _ = real_v2()
    rev = written(tmp_path, "fork-v2", list(reversed(expected)))
    map_end = 32 + 8 * 5 + 424
    entries_rev = b"".join(struct.pack("<ii", t, c) for _, f in reversed(expected) for t, c in f)
    assert rev[32 : 32 + 40] == entries_rev
    spans = {struct.pack("<ii", t0, t1): s for t0, t1, s in struct.iter_unpack("<iiQ", rev[map_end:])}
    assert [k for k, _ in read_as_contents(tmp_path / "w.fork-v2")] == [k for k, _ in reversed(expected)]
    for order in (list(spans.items()), list(reversed(spans.items()))):
        assert fastconstmap.VerifiedConstMap(dict(order)).to_bytes() == rev[72:map_end]
    assert canonical(read_as_contents(tmp_path / "w.fork-v2")) == expected
    assert (
        data[72:map_end]
        == fastconstmap.VerifiedConstMap(
            {struct.pack("<ii", t0, t1): s for t0, t1, s in struct.iter_unpack("<iiQ", data[map_end:])}
        ).to_bytes()
    )


# --- round trips ----------------------------------------------------------------------------

token = st.integers(INT32_MIN, INT32_MAX)
small_token = st.integers(-3, 6)
count = st.one_of(st.integers(1, 5), st.integers(1, INT32_MAX))


@st.composite
def static_contents(draw: st.DrawFn) -> Contents:
    tok = draw(st.sampled_from([token, small_token]))
    keys = draw(st.lists(st.tuples(tok, tok), unique=True, max_size=40))
    out: Contents = []
    for a, b in keys:
        followers = draw(st.dictionaries(tok, count, min_size=1, max_size=6))
        out.append(((a, b, -1, -1), list(followers.items())))
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(contents=static_contents())
def test_round_trip_every_format(tmp_path: Path, contents: Contents) -> None:
    want = canonical(contents)
    for fmt in FORMATS:
        p = tmp_path / f"rt.{fmt}"
        write_static(contents, p, fmt, vocab_size=123, vocab_fingerprint=b"\x01" * 8)
        assert detect_format(p) == fmt
        if fmt == "fork-v1":
            with pytest.raises(CacheFormatError, match="key table"):
                read_as_contents(p)
        else:
            assert canonical(read_as_contents(p)) == want
        if fmt == "fork-v2":  # key table in the order given
            assert [k for k, _ in read_as_contents(p)] == [k for k, _ in contents]
        if fmt == "lookupdec":  # keys ascending (signed pairs)
            assert list(read_as_contents(p)) == want
        info = inspect_file(p, verify=True)
        assert (info["n_keys"], info["n_entries"]) == (len(want), sum(len(f) for _, f in want))
        assert info["total_count"] == sum(c for _, f in want for _, c in f)
        if fmt.startswith("fork"):
            fs = ForkStatic(p)
            for key, followers in want:
                assert fs.part(key) == dict(followers)
            assert fs.part((7, 7, 7, -1)) is None
    with LookupdecIndexReader(tmp_path / "rt.lookupdec") as r:
        assert (r.n_keys, r.vocab_size, r.vocab_fingerprint) == (len(want), 123, b"\x01" * 8)
        r.verify()
        present = {k for k, _ in want}
        for key, followers in want:
            assert r.part(key) == dict(followers)
            assert r.pick(key) == try_static(dict(followers))
        for probe in [(0, 0, -1, -1), (-1, -1, -1, -1), (INT32_MAX, INT32_MIN, -1, -1), (2**40, 0, -1, -1)]:
            if probe not in present:
                assert r.part(probe) is None
                assert r.pick(probe) == -1


@pytest.mark.parametrize("fmt", FORMATS)
def test_empty_static(tmp_path: Path, fmt: str) -> None:
    p = tmp_path / "empty"
    write_static([], p, fmt)
    if fmt == "fork-v1":
        assert ForkStatic(p).part((1, 2, -1, -1)) is None
    else:
        assert list(read_as_contents(p)) == []
    info = inspect_file(p, verify=True)
    assert (info["n_keys"], info["n_entries"], info["total_count"]) == (0, 0, 0)
    if fmt == "lookupdec":
        with LookupdecIndexReader(p) as r:
            assert (r.n_keys, r.n_slots, r.file_size) == (0, 2, os.path.getsize(p))
            assert r.file_size == 112
            assert r.part((1, 2, -1, -1)) is None
            r.verify()


def test_mapping_followers_and_index_layout(tmp_path: Path) -> None:
    contents = [((1, 2, -1, -1), {9: 1, 3: 4}), ((1, -2, -1, -1), {4: 1})]
    write_static(contents, tmp_path / "m", "lookupdec")
    # (1, -2) sorts before (1, 2) as a signed pair, though its packed i64 is larger.
    assert list(read_as_contents(tmp_path / "m")) == [((1, -2, -1, -1), [(4, 1)]), ((1, 2, -1, -1), [(3, 4), (9, 1)])]
    data = (tmp_path / "m").read_bytes()
    n_keys, n_entries, n_slots = struct.unpack_from("<QQQ", data, 24)
    assert (n_keys, n_entries, n_slots) == (2, 3, 4)
    keys = struct.unpack_from("<2q", data, 96 + 16)
    assert keys == ((1 << 32) | 0xFFFFFFFE, (1 << 32) | 2)
    assert struct.unpack_from("<Q", data, 72)[0] == len(data)
    assert data[80:88] == hashlib.blake2b(data[96:], digest_size=8).digest()


def test_lookupdec_writer_matches_the_compiled_builder(tmp_path: Path) -> None:
    """Two writers of docs/static-index.md, written independently, agree byte for byte."""
    from lookupdec.fast import _index_write as index

    contents = canonical(sample_contents() + [((k, k + 1, -1, -1), [(k, k % 3 + 1)]) for k in range(50, 90)])
    assert written(tmp_path, "lookupdec", contents) == index.index_bytes_from_contents(contents)


@pytest.mark.parametrize(
    ("contents", "match"),
    [
        ([((1, 2, 3, -1), [(1, 1)])], "2-gram"),
        ([((1, -1, -1, -1), [(1, 1)]), ((1, 2, 3, 4), [(1, 1)])], "2-gram"),
        ([((1, 2, -1), [(1, 1)])], "2-gram"),
        ([((1, 2, -1, -1), [])], "no followers"),
        ([((1, 2, -1, -1), [(1, 1)]), ((1, 2, -1, -1), [(3, 1)])], "twice"),
        ([((1, 2, -1, -1), [(1, 1), (1, 2)])], "twice"),
        ([((1, 2, -1, -1), [(1, 0)])], "count"),
        ([((1, 2, -1, -1), [(1, -5)])], "count"),
        ([((1, 2, -1, -1), [(1, 2**31)])], "int32"),
        ([((1, 2, -1, -1), [(2**31, 1)])], "int32"),
        ([((2**31, 2, -1, -1), [(1, 1)])], "int32"),
        ([((1, 2, -1, -1), [(1, 2**70)])], "int32"),
    ],
)
@pytest.mark.parametrize("fmt", FORMATS)
def test_write_rejects_bad_contents(tmp_path: Path, fmt: str, contents: Any, match: str) -> None:
    p = tmp_path / "bad"
    with pytest.raises(ValueError, match=match):
        write_static(contents, p, fmt)
    assert not p.exists()
    assert os.listdir(tmp_path) == []


def test_write_rejects_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="format"):
        write_static([], tmp_path / "x", "json")
    with pytest.raises(ValueError, match="8 bytes"):
        write_static([], tmp_path / "x", vocab_fingerprint=b"short")
    with pytest.raises(ValueError, match="vocab_size"):
        write_static([], tmp_path / "x", vocab_size=-1)
    assert os.listdir(tmp_path) == []


@pytest.mark.slow  # builds 2**24 + 1 followers; test_fork_span_limit_check runs the same check small
def test_fork_span_limits(tmp_path: Path) -> None:
    big = [((1, 2, -1, -1), [(t, 1) for t in range((1 << 24) + 1)])]
    with pytest.raises(ValueError, match="followers"):
        write_static(big, tmp_path / "big", "fork-v2")


def test_fork_span_limit_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from lookupdec.formats import fork

    # spec 11: a span is offset << 24 | length, so a 2-gram holds at most 2**24 - 1 followers.
    assert fork._SPAN_BITS == 24 and fork._SPAN_MAX_LENGTH == (1 << 24) - 1
    # The writer's check itself, with the limit lowered so the input stays small.
    monkeypatch.setattr(fork, "_SPAN_MAX_LENGTH", 15)
    with pytest.raises(ValueError, match="followers"):
        write_static([((1, 2, -1, -1), [(t, 1) for t in range(16)])], tmp_path / "big", "fork-v2")
    write_static([((1, 2, -1, -1), [(t, 1) for t in range(15)])], tmp_path / "ok", "fork-v2")


# --- malformed files ------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["lookupdec", "fork-v1", "fork-v2"])
def test_every_truncation_raises_cache_format_error(tmp_path: Path, fmt: str) -> None:
    data = written(tmp_path, fmt)
    path = tmp_path / "cut"
    for n in range(8, len(data)):  # shorter than the magic, a file reads as legacy
        path.write_bytes(data[:n])
        with pytest.raises(CacheFormatError, match="cut") as e:
            read_fully(path)
        assert e.value.path == str(path)
        if fmt == "lookupdec":
            with pytest.raises(CacheFormatError):
                LookupdecIndexReader(path)
        else:
            with pytest.raises(CacheFormatError):
                ForkStatic(path)
    path.write_bytes(data + b"\0")
    with pytest.raises(CacheFormatError):
        read_fully(path)


def test_truncated_magic_is_a_cut_file(tmp_path: Path) -> None:
    # llama.cpp reads any file under 20 bytes as an empty cache with trailing bytes; one that is
    # the start of a magic (4-7 bytes) is a cut copy of a file with that magic, said as such.
    data = written(tmp_path, "fork-v2")
    path = write(tmp_path, "cut", data[:7])
    with pytest.raises(CacheFormatError, match="7 bytes that begin the magic of a fork v2 static cache"):
        detect_format(path)
    with pytest.raises(CacheFormatError, match="a cut file"):
        list(read_as_contents(path))
    path = write(tmp_path, "short", data[:3])  # too short to tell: llama.cpp's reading, as before
    assert detect_format(path) == "llama"
    with pytest.warns(UserWarning, match="trailing"):
        assert list(read_as_contents(path)) == []


def put(data: bytes, offset: int, fmt: str, value: int | bytes) -> bytes:
    b = bytearray(data)
    if isinstance(value, bytes):
        b[offset : offset + len(value)] = value
    else:
        struct.pack_into(fmt, b, offset, value)
    return bytes(b)


def reseal(data: bytes) -> bytes:
    """Recompute a lookupdec index's checksum, so that only structural checks can catch a change."""
    return put(data, 80, "", hashlib.blake2b(data[96:], digest_size=8).digest())


def layout(data: bytes) -> dict[str, int]:
    n_keys, n_entries, n_slots = struct.unpack_from("<QQQ", data, 24)

    def a8(x: int) -> int:
        return (x + 7) & ~7

    keys = a8(96 + 4 * n_slots)
    starts = a8(keys + 8 * n_keys)
    picks = a8(starts + 8 * (n_keys + 1))
    tokens = a8(picks + 4 * n_keys)
    counts = a8(tokens + 4 * n_entries)
    return {"slots": 96, "keys": keys, "starts": starts, "picks": picks, "tokens": tokens, "counts": counts}


@pytest.mark.parametrize(
    ("offset", "fmt", "value", "match"),
    [
        (0, "", b"LKDCIDX\x01", None),  # no longer our magic: read as legacy, fails as legacy
        (8, "<I", 2, "version 2"),
        (12, "<I", 64, "header_size"),
        (16, "<I", 3, "ngram_size"),
        (24, "<Q", 6, "n_keys"),
        (24, "<Q", 1 << 62, "n_keys"),
        (32, "<Q", 7, "need"),
        (32, "<Q", 2, "n_keys"),
        (40, "<Q", 32, "need"),
        (40, "<Q", 12, "power of two"),
        (40, "<Q", 4, "power of two"),
        (72, "<Q", 10, "file_size"),
    ],
)
def test_index_header_fields_checked_on_open(
    tmp_path: Path, offset: int, fmt: str, value: Any, match: str | None
) -> None:
    path = write(tmp_path, "h.lkdc", put(written(tmp_path, "lookupdec"), offset, fmt, value))
    with pytest.raises(CacheFormatError, match=match):
        LookupdecIndexReader(path)
    with pytest.raises(CacheFormatError, match=match):
        list(read_as_contents(path))
    with pytest.raises(CacheFormatError, match=match):
        inspect_file(path)


@pytest.mark.parametrize(
    ("offset", "fmt", "value", "match"),
    [
        (20, "<I", 1, "flags"),
        (88, "<Q", 1, "reserved"),
        (64, "<Q", 99, "total_count"),
        (80, "", b"\0" * 8, "checksum"),
    ],
)
def test_index_header_fields_checked_by_verify(tmp_path: Path, offset: int, fmt: str, value: Any, match: str) -> None:
    path = write(tmp_path, "h.lkdc", put(written(tmp_path, "lookupdec"), offset, fmt, value))
    with LookupdecIndexReader(path) as r, pytest.raises(CacheFormatError, match=match):
        r.verify()
    with pytest.raises(CacheFormatError, match=match):
        inspect_file(path, verify=True)


def test_verify_catches_every_flipped_byte(tmp_path: Path) -> None:
    data = written(tmp_path, "lookupdec")
    path = tmp_path / "flip.lkdc"
    undetectable = set(range(48, 64))  # vocab_size and vocab_fingerprint: not covered by the checksum
    for i in range(len(data)):
        b = bytearray(data)
        b[i] ^= 0x10
        path.write_bytes(b)
        if i in undetectable:
            with LookupdecIndexReader(path) as r:
                r.verify()
            continue
        with pytest.raises(CacheFormatError):
            if detect_format(path) != "lookupdec":
                raise CacheFormatError(path, "not detected as an index")
            with LookupdecIndexReader(path) as r:
                r.verify()


def index_cases() -> Iterator[tuple[str, Callable[[bytes, dict[str, int]], bytes], str]]:
    yield "starts0", lambda d, o: put(d, o["starts"], "<q", 1), r"starts\[0\]"
    yield "starts_end", lambda d, o: put(d, o["starts"] + 8 * 5, "<q", 7), r"starts\[n_keys\]"
    yield "starts_order", lambda d, o: put(d, o["starts"] + 8, "<q", 0), "strictly increasing"
    yield "starts_range", lambda d, o: put(d, o["starts"] + 8, "<q", 1 << 40), "strictly increasing"
    yield "keys_order", lambda d, o: put(d, o["keys"], "<q", 1 << 40), "keys not strictly ascending"
    yield "tokens_order", lambda d, o: put(d, o["tokens"] + 4, "<i", -(2**31)), "not strictly ascending"
    yield "count_zero", lambda d, o: put(d, o["counts"], "<i", 0), "count 0"
    yield "count_negative", lambda d, o: put(d, o["counts"], "<i", -4), "count -4"
    yield "picks", lambda d, o: put(d, o["picks"], "<i", 12345), r"picks\[0\]"
    yield "padding", lambda d, o: put(d, o["tokens"] - 1, "", b"\x01"), "padding"
    yield (
        "slot_range",
        lambda d, o: put(d, o["slots"] + 4 * next(i for i in range(16) if slot(d, i) == -1), "<i", 99),
        "slot",
    )
    yield (
        "slot_dup",
        lambda d, o: put(d, o["slots"] + 4 * next(i for i in range(16) if slot(d, i) == -1), "<i", 0),
        "exactly 1",
    )
    yield "slot_moved", move_a_key, "reachable"


def slot(d: bytes, i: int) -> int:
    v: int = struct.unpack_from("<i", d, 96 + 4 * i)[0]
    return v


def move_a_key(d: bytes, o: dict[str, int]) -> bytes:
    """Move a key to an empty slot that is not on its probe path (right after another empty one)."""
    n_slots = struct.unpack_from("<Q", d, 40)[0]
    src = next(i for i in range(n_slots) if slot(d, i) >= 0)
    dst = next(i for i in range(n_slots) if slot(d, i) == -1 and slot(d, i - 1) == -1 and i != (src + 1) % n_slots)
    d = put(d, 96 + 4 * dst, "<i", slot(d, src))
    return put(d, 96 + 4 * src, "<i", -1)


@pytest.mark.parametrize(("name", "corrupt", "match"), list(index_cases()), ids=[c[0] for c in index_cases()])
def test_verify_structure(
    tmp_path: Path, name: str, corrupt: Callable[[bytes, dict[str, int]], bytes], match: str
) -> None:
    data = written(tmp_path, "lookupdec")
    assert struct.unpack_from("<Q", data, 24)[0] == 5
    bad = reseal(corrupt(data, layout(data)))
    assert bad != data
    path = write(tmp_path, "s.lkdc", bad)
    with LookupdecIndexReader(path) as r:  # the header is fine: opening works
        with pytest.raises(CacheFormatError, match=match) as e:
            r.verify()
        assert e.value.path == str(path)
        for key, _ in sample_contents():  # a lookup may still answer, or raise CacheFormatError
            with contextlib.suppress(CacheFormatError):
                r.part(key)
    with pytest.raises(CacheFormatError, match=match):
        list(read_as_contents(path))


def test_lookup_bounds_checked(tmp_path: Path) -> None:
    data = written(tmp_path, "lookupdec")
    o = layout(data)
    for k in range(5):
        bad = put(data, o["starts"] + 8 * k, "<q", 1 << 40)
        path = write(tmp_path, "b.lkdc", bad)
        with LookupdecIndexReader(path) as r, pytest.raises(CacheFormatError, match="followers"):
            r.part(r_key(bad, k))
    # every slot pointing past the keys array
    n_slots = struct.unpack_from("<Q", data, 40)[0]
    bad = data
    for i in range(n_slots):
        bad = put(bad, 96 + 4 * i, "<i", 1000)
    with LookupdecIndexReader(write(tmp_path, "c.lkdc", bad)) as r, pytest.raises(CacheFormatError, match="slot"):
        r.part((5, 6, -1, -1))
    # a full slot table (no -1): probing must stop, not loop forever
    bad = data
    for i in range(n_slots):
        bad = put(bad, 96 + 4 * i, "<i", 0)
    with LookupdecIndexReader(write(tmp_path, "d.lkdc", bad)) as r:
        absent = next((a, 77, -1, -1) for a in range(1000) if (a, 77, -1, -1) not in {k for k, _ in sample_contents()})
        with pytest.raises(CacheFormatError, match="no empty slot"):
            r.part(absent)


def r_key(data: bytes, k: int) -> tuple[int, int, int, int]:
    o = layout(data)
    w: int = struct.unpack_from("<q", data, o["keys"] + 8 * k)[0]
    return (w >> 32, ((w & 0xFFFFFFFF) ^ 0x80000000) - 0x80000000, -1, -1)


def fork_fields(fmt: str) -> list[tuple[int, str, int | bytes, str | None]]:
    rows: list[tuple[int, str, int | bytes, str | None]] = [
        (0, "", b"ggngcmp3", None),  # unknown magic: read as legacy, fails as legacy
        (8, "<Q", 6, "sizes do not add up"),
        (8, "<Q", 1 << 61, "sizes do not add up"),
        (16, "<Q", 400, "sizes do not add up"),
    ]
    if fmt == "fork-v2":
        rows += [(24, "<Q", 3, "sizes do not add up"), (24, "<Q", 0, "sizes do not add up")]
    return rows


def map_offset(fmt: str) -> int:
    return (24 if fmt == "fork-v1" else 32) + 8 * len([1 for _, f in sample_contents() for _ in f])


@pytest.mark.parametrize("fmt", ["fork-v1", "fork-v2"])
def test_fork_header_and_map_fields(tmp_path: Path, fmt: str) -> None:
    data = written(tmp_path, fmt)
    m = map_offset(fmt)
    rows = [
        *fork_fields(fmt),
        (m, "", b"VMAP0002", "constmap section has magic"),
        (m + 8, "<Q", 12345, "constmap section"),  # seed: fastconstmap's own checksum
        (m + 16, "<I", 3, "power of two"),
        (m + 20, "<I", 1000, "dimensions inconsistent"),
        (m + 24, "<I", 1, "dimensions inconsistent"),
        (m + 28, "<I", 4, "constmap" if fmt == "fork-v1" else "key table has 5 keys but the constmap holds 4"),
        (m + 40, "", b"\xff", "checksum"),
    ]
    for offset, f, value, match in rows:
        path = write(tmp_path, "h.bin", put(data, offset, f, value))
        with pytest.raises(CacheFormatError, match=match):
            read_fully(path)
        with pytest.raises(CacheFormatError, match=match):
            inspect_file(path)


def test_fork_v2_key_table_checked(tmp_path: Path) -> None:
    data = written(tmp_path, "fork-v2")
    nk = 5
    table = len(data) - 16 * nk
    n_entries = struct.unpack_from("<Q", data, 8)[0]
    rows: list[tuple[int, str, int | bytes, str]] = [
        (table + 8, "<Q", (n_entries << 24) | 1, "outside"),  # span past the end
        (table + 8, "<Q", (0 << 24) | 0, "empty"),  # zero-length span
        (table + 8, "<Q", (1 << 24) | 2, "constmap|overlap"),  # inside, not what the map says (and overlapping)
        (table + 16, "<ii", 0, "twice"),  # the second key = the first
        (table, "<i", 4242, "constmap"),  # a key the map does not hold
    ]
    for offset, f, value, match in rows:
        b = put(data, offset, "", data[table : table + 8]) if f == "<ii" else put(data, offset, f, value)
        path = write(tmp_path, "k.bin", b)
        ForkStatic(path)  # drafting never reads the key table
        with pytest.raises(CacheFormatError, match=match):
            list(read_as_contents(path))
        with pytest.raises(CacheFormatError, match=match):
            inspect_file(path)


def fork_file(fmt: str, entries: list[tuple[int, int]], spans: dict[tuple[int, int], int]) -> bytes:
    """A hand-made fork file (the writer refuses to make broken ones)."""
    cmap = fastconstmap.VerifiedConstMap({struct.pack("<ii", *k): s for k, s in spans.items()}).to_bytes()
    body = b"".join(struct.pack("<ii", t, c) for t, c in entries) + cmap
    if fmt == "fork-v1":
        return struct.pack("<8sQQ", b"ggngcmap", len(entries), len(cmap)) + body
    table = b"".join(struct.pack("<iiQ", *k, s) for k, s in spans.items())
    return struct.pack("<8sQQQ", b"ggngcmp2", len(entries), len(cmap), len(spans)) + body + table


@pytest.mark.parametrize("fmt", ["fork-v1", "fork-v2"])
def test_fork_spans_out_of_range(tmp_path: Path, fmt: str) -> None:
    entries = [(1, 1), (2, 1), (3, 1)]
    good = fork_file(fmt, entries, {(1, 2): (0 << 24) | 2, (3, 4): (2 << 24) | 1})
    fs = ForkStatic(write(tmp_path, "good.bin", good))
    assert fs.part((1, 2, -1, -1)) == {1: 1, 2: 1}
    for span in [(2 << 24) | 2, (3 << 24) | 1, (0 << 24) | 0, (1 << 63) | 1]:
        path = write(tmp_path, "bad.bin", fork_file(fmt, entries, {(1, 2): (0 << 24) | 2, (3, 4): span}))
        fs = ForkStatic(path)
        assert fs.part((1, 2, -1, -1)) == {1: 1, 2: 1}
        with pytest.raises(CacheFormatError, match=r"\(3, 4\)"):
            fs.part((3, 4, -1, -1))
        if fmt == "fork-v2":
            with pytest.raises(CacheFormatError, match="outside"):
                list(read_as_contents(path))


def test_fork_v2_runs_checked_on_expansion(tmp_path: Path) -> None:
    cases = [
        ([(2, 1), (1, 1)], "ascending"),
        ([(1, 1), (1, 1)], "ascending"),
        ([(1, 1), (2, 0)], "count 0"),
        ([(1, -3), (2, 1)], "count -3"),
    ]
    for entries, match in cases:
        path = write(tmp_path, "r.bin", fork_file("fork-v2", entries, {(1, 2): 2}))
        ForkStatic(path).part((1, 2, -1, -1))  # the fork does not check runs when drafting
        with pytest.raises(CacheFormatError, match=match):
            list(read_as_contents(path))
    overlap = fork_file("fork-v2", [(1, 1), (2, 1)], {(1, 2): 2, (3, 4): 2})
    with pytest.raises(CacheFormatError, match="overlap"):
        list(read_as_contents(write(tmp_path, "o.bin", overlap)))


def test_fork_v1_cannot_be_enumerated(tmp_path: Path) -> None:
    path = tmp_path / "v1.bin"
    write_static(sample_contents(), path, "fork-v1")
    with pytest.raises(CacheFormatError, match="no key table"):
        read_as_contents(path)
    with pytest.raises(CacheFormatError, match=r"reads only llama\.cpp's legacy format"):
        NgramCache.load(path)
    info = inspect_file(path)
    assert info["top"] is None
    assert info["n_keys"] == 5
    assert info["warnings"]


def test_fork_v1_layout(tmp_path: Path) -> None:
    v1 = written(tmp_path, "fork-v1")
    v2 = written(tmp_path, "fork-v2")
    n_entries, map_size = struct.unpack_from("<QQ", v1, 8)
    assert v1[:8] == b"ggngcmap"
    assert v2[:8] == b"ggngcmp2"
    assert len(v1) == 24 + 8 * n_entries + map_size
    assert v1[24:] == v2[32 : 32 + 8 * n_entries + map_size]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    fmt=st.sampled_from(["lookupdec", "fork-v1", "fork-v2", "llama"]),
    edits=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=4),
    cut=st.one_of(st.none(), st.integers(0, 10**6)),
)
def test_random_damage_only_raises_cache_format_error(
    tmp_path: Path, fmt: str, edits: list[tuple[int, int]], cut: int | None
) -> None:
    b = bytearray(written(tmp_path, fmt))
    for pos, val in edits:
        b[pos % len(b)] = val
    if cut is not None:
        del b[cut % (len(b) + 1) :]
    path = write(tmp_path, "dmg.bin", bytes(b))
    with contextlib.suppress(CacheFormatError):
        read_fully(path)
    with contextlib.suppress(CacheFormatError):
        inspect_file(path, verify=True)


def test_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.bin"
    for call in (detect_format, read_as_contents, ForkStatic, LookupdecIndexReader, inspect_file):
        with pytest.raises(FileNotFoundError, match=r"nope\.bin"):
            call(missing)


def test_short_files(tmp_path: Path) -> None:
    for data in (b"", b"LKDCIDX\x00", b"LKDCIDX\x00" + bytes(40), b"ggngcmp2", b"ggngcmap" + bytes(10)):
        path = write(tmp_path, "short.bin", data)
        if data == b"":
            assert list(read_as_contents(path)) == []
            continue
        with pytest.raises(CacheFormatError, match="shorter"):
            read_fully(path)
    with pytest.raises(CacheFormatError, match="not a lookupdec"):
        LookupdecIndexReader(write(tmp_path, "x.bin", b"ggngcmp2" + bytes(100)))
    with pytest.raises(CacheFormatError, match="not a fork"):
        ForkStatic(write(tmp_path, "y.bin", written(tmp_path, "lookupdec")))


# --- atomic writes --------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
def test_failed_write_leaves_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fmt: str) -> None:
    path = tmp_path / "static.bin"
    path.write_bytes(b"old contents")

    def failing() -> Iterator[tuple[tuple[int, int, int, int], list[tuple[int, int]]]]:
        yield (1, 2, -1, -1), [(3, 4)]
        raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError, match="fire"):
        write_static(failing(), path, fmt)
    assert path.read_bytes() == b"old contents"

    def no_fsync(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", no_fsync)
    with pytest.raises(OSError, match="No space"):
        write_static(sample_contents(), path, fmt)
    assert path.read_bytes() == b"old contents"
    assert sorted(os.listdir(tmp_path)) == ["static.bin"]
    monkeypatch.undo()
    write_static(sample_contents(), path, fmt)
    assert detect_format(path) == fmt


def test_reader_close_and_repr(tmp_path: Path) -> None:
    path = tmp_path / "i.lkdc"
    write_static(sample_contents(), path)
    r = LookupdecIndexReader(path)
    r.verify()
    list(r.contents())
    assert "keys=5" in repr(r)
    r.close()  # no numpy view may keep the map alive
    fs = ForkStatic(write(tmp_path, "f.bin", written(tmp_path, "fork-v2")))
    assert "fork-v2" in repr(fs)


def test_inspect_top_order(tmp_path: Path) -> None:
    contents = [((k, 0, -1, -1), [(1, k + 1), (2, 1)]) for k in range(15)] + [((-5, 0, -1, -1), [(1, 1)])]
    for fmt in FORMATS:
        path = tmp_path / f"t.{fmt}"
        write_static(contents, path, fmt)
        info = inspect_file(path)
        if fmt == "fork-v1":
            continue
        top = info["top"]
        assert [r["ngram"] for r in top] == [(k, 0) for k in range(14, 4, -1)]
        assert top[0] == {
            "key": (14, 0, -1, -1),
            "ngram": (14, 0),
            "total": 16,
            "n_followers": 2,
            "followers": [(1, 15), (2, 1)],
        }
    assert formats.__all__


def test_readers_draft_like_the_cache(tmp_path: Path) -> None:
    """ForkStatic and LookupdecIndexReader serve as the static cache of reference drafting."""
    from lookupdec.reference.draft import draft

    corpus = [(i * 7 + i // 3) % 11 for i in range(400)]
    static = build_static(corpus)
    sources: list[Any] = [static]
    for fmt in ("fork-v1", "fork-v2"):
        write_static(static.items(), tmp_path / fmt, fmt)
        sources.append(ForkStatic(tmp_path / fmt))
    write_static(static.items(), tmp_path / "idx", "lookupdec")
    with LookupdecIndexReader(tmp_path / "idx") as r:
        sources.append(r)
        empty = NgramCache()
        drafted = 0
        for start in range(0, 60, 3):
            inp = corpus[start : start + 5]
            drafts = []
            for src in sources:
                out = [inp[-1]]
                draft(inp, out, 8, 1, 4, empty, empty, src)
                drafts.append(out)
            assert all(d == drafts[0] for d in drafts)
            drafted += len(drafts[0]) - 1
        assert drafted > 20


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(contents=static_contents())
@example(contents=[((-2, -2, -1, -1), [(-2, 1)])])  # found by hypothesis: every id below -1
def test_max_token_id_every_format(tmp_path: Path, contents: Contents) -> None:
    # Expected from the contents as written (keys' two tokens, followers), not from the reader.
    # The largest id written, -1 only when nothing is (ids below -1 can be written: the contents
    # strategy makes them, and the largest of them is what the file holds).
    key_ids = [t for (a, b, _, _), _ in contents for t in (a, b)]
    follower_ids = [t for _, f in contents for t, _ in f]
    for fmt in FORMATS:
        p = tmp_path / f"m.{fmt}"
        write_static(contents, p, fmt)
        # fork v1 has no key table: only followers are there to read. A legacy file writes all
        # four slots of a 2-gram key, the last two as -1, and every slot counts.
        ids = follower_ids if fmt == "fork-v1" else key_ids + follower_ids
        pads = [-1] if fmt == "llama" and contents else []
        want = max(ids + pads, default=-1)
        assert formats.max_token_id(p) == want, fmt
    # A legacy dynamic cache holds 1..4-gram keys: every slot counts.
    p = tmp_path / "d.bin"
    p.write_bytes(
        struct.pack("<4ii2i", 5, 7, 70_000, -1, 1, 3, 1) + struct.pack("<4ii4i", 1, -1, -1, -1, 2, 9, 1, 8, 2)
    )
    assert formats.max_token_id(p) == 70_000
