"""The hybrid policy's corpus file (issue 13): its layout from docs/formats.md, the same drafts
mapped, in memory and in the reference, the corpus kept through evictions, version 2 files
(no trigram section) read with the same drafts, and clear errors for bad files (truncated,
wrong magic or version, sizes that do not add up, corrupt sections)."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lookupdec.reference as ref
from lookupdec.errors import CacheFormatError, VocabularyError
from lookupdec.formats.corpus import read_corpus_header, read_corpus_ids
from lookupdec.reference.history import CORPUS_BASE
from lookupdec.reference.hybrid import source_class
from tests.conftest import DATA, fast_impl
from tests.test_cli import assert_clean_error, run, write_bin
from tests.test_hybrid import demo, lockstep

HEADER = struct.Struct("<8sIIIIQQQQQQ8sQ8s")
IDS = [5, 7, 8, 1, 3, 6, 7, 8, 2, -1, 7, 8, 4, 4, 7, 8]


def home_slot(a: int, b: int, bits: int) -> int:
    """docs/static-index.md's slot hash: ((k * 0x9E3779B97F4A7C15) mod 2**64) >> (64 - bits)."""
    k = ((a & 0xFFFFFFFF) << 32) | (b & 0xFFFFFFFF)
    return ((k * 0x9E3779B97F4A7C15) % 2**64) >> (64 - bits)


def corpus_file(tmp_path: Path, ids: list[int], name: str = "c.lkcorpus", version: int = 3, **kw: Any) -> Path:
    """A corpus file of ``ids`` (version 2: the same without the trigram section)."""
    path = tmp_path / name
    if version == 3:
        fast_impl().CorpusIndex.from_tokens(ids, **kw).save(path)
    else:
        fast = fast_impl()
        path.write_bytes(fast._corpus.corpus_bytes(fast._cache.to_vec(ids), version=version, **kw))
    return path


def test_layout_follows_the_format(tmp_path: Path) -> None:
    """Every section of a small file, computed here from the definition in docs/formats.md."""
    data = corpus_file(tmp_path, IDS, vocab_size=10, vocab_fingerprint=b"abcdefgh").read_bytes()
    f = HEADER.unpack_from(data, 0)
    magic, version, header_size, flags, n_after, n_tokens, n_bigrams, n_slots, n_entries, n_uni = f[:10]
    assert (magic, version, header_size, flags) == (b"LKDCCRP\x00", 3, 96, 0)
    assert (f[10], f[11], f[12]) == (10, b"abcdefgh", len(data))
    assert n_tokens == len(IDS)
    assert list(struct.unpack_from(f"<{n_tokens}i", data, 96)) == IDS
    # indexed positions: three tokens, none a separator; bigrams numbered by first position
    indexed = [i for i in range(2, len(IDS)) if -1 not in IDS[i - 2 : i + 1]]
    order: list[tuple[int, int]] = []
    for i in indexed:
        if (IDS[i - 2], IDS[i - 1]) not in order:
            order.append((IDS[i - 2], IDS[i - 1]))
    assert (n_bigrams, n_entries) == (len(order), len(indexed))
    assert n_slots == 16  # the smallest power of two >= 2 with 3 * n_slots >= 4 * 9 bigrams
    o_slots = 96 + (4 * n_tokens + 7) // 8 * 8
    o_entries = o_slots + 16 * n_slots
    runs = {bg: sorted((i for i in indexed if (IDS[i - 2], IDS[i - 1]) == bg), reverse=True) for bg in order}
    expected_slots: list[tuple[int, int, int] | None] = [None] * n_slots
    start = 0
    for a, b in order:
        h = home_slot(a, b, 4)
        while expected_slots[h] is not None:
            h = (h + 1) % n_slots
        expected_slots[h] = ((a << 32) | b, start, len(runs[(a, b)]))
        start += len(runs[(a, b)])
    got_slots = [struct.unpack_from("<qii", data, o_slots + 16 * h) for h in range(n_slots)]
    assert got_slots == [s if s is not None else (0, 0, 0) for s in expected_slots]
    entries = [struct.unpack_from("<ii", data, o_entries + 8 * g) for g in range(n_entries)]
    assert entries == [(i, IDS[i - 3] if i >= 3 else -1) for bg in order for i in runs[bg]]
    # per token t, the positions i with IDS[i-1] == t and IDS[i] a token: a run newest first,
    # the runs in ascending token order, each unigram record holding its run's first index
    after: dict[int, list[int]] = {}
    for i in range(len(IDS) - 1, 0, -1):
        if IDS[i - 1] != -1 and IDS[i] != -1:
            after.setdefault(IDS[i - 1], []).append(i)
    o_uni = o_entries + 8 * n_entries
    assert (n_uni, n_after) == (len(after), 13)  # IDS[0..8] and IDS[10..15]: 8 + 5 positions
    firsts: list[tuple[int, int]] = []
    flat: list[int] = []
    for t in sorted(after):
        firsts.append((t, len(flat)))
        flat += after[t]
    assert [struct.unpack_from("<ii", data, o_uni + 8 * u) for u in range(n_uni)] == firsts
    o_after = o_uni + 8 * n_uni
    assert list(struct.unpack_from(f"<{n_after}i", data, o_after)) == flat
    o_tri = (o_after + 4 * n_after + 7) // 8 * 8
    assert data[o_after + 4 * n_after : o_tri] == bytes(4)  # 13 positions: padded by one zero word
    # the trigram section: each bigram's run again (the same places), by token before ascending,
    # then newest first
    pre = {i: IDS[i - 3] if i >= 3 else -1 for i in indexed}
    trigrams = [struct.unpack_from("<ii", data, o_tri + 8 * g) for g in range(n_entries)]
    assert trigrams == [(i, pre[i]) for bg in order for i in sorted(runs[bg], key=lambda i: (pre[i], -i))]
    assert trigrams != entries  # (7, 8) at 12, 8, 3, with -1, 6, 5 before it: 12, 3, 8
    assert o_tri + 8 * n_entries == len(data)


def test_open_mapped_and_in_memory_hold_the_same_file(tmp_path: Path) -> None:
    fast = fast_impl()
    path = corpus_file(tmp_path, IDS)
    built = fast.CorpusIndex.from_tokens(IDS)
    for in_memory in (False, True):
        with fast.CorpusIndex.open(path, in_memory=in_memory) as c:
            assert c.to_bytes() == built.to_bytes() == path.read_bytes()
            assert c.tokens() == IDS == read_corpus_ids(path)
            assert len(c) == len(IDS) and c.in_memory == in_memory
            c.verify()


def test_empty_and_separator_only_corpora(tmp_path: Path) -> None:
    fast = fast_impl()
    for ids in ([], [-1], [3, -1, 4]):
        path = corpus_file(tmp_path, ids)
        c = fast.CorpusIndex.open(path)
        assert c.tokens() == ids and c.n_bigrams == 0
        c.verify()
        h = fast.SuffixHistory()
        h.add_corpus(c)
        assert fast.replay([1, 2, 1, 2, 1, 2, 0], 3, 4, None, None, None, "hybrid", h).n_steps > 0


def test_replay_counts_identical_mapped_in_memory_and_reference(tmp_path: Path) -> None:
    """The same counts from the file (mapped), the ids (in memory) and the reference reading the
    file or given the ids."""
    fast = fast_impl()
    tokens = demo("wiki.test.demo.llama3.bin", 9000)
    corpus = demo("enwiki_wt.demo.llama3.bin", 60000)
    path = corpus_file(tmp_path, corpus)
    results = []
    for impl, how in ((fast, "file"), (fast, "ids"), (ref, "file"), (ref, "ids")):
        h = impl.SuffixHistory()
        h.add_corpus(str(path) if how == "file" else corpus)
        r = impl.replay(tokens, 2048, 8, impl.build_static(corpus[:20000]), None, None, "hybrid", h)
        results.append((r.n_steps, r.n_accept, r.n_drafted))
    assert len(set(results)) == 1, results


@settings(max_examples=25, deadline=None)
@given(
    tokens=st.lists(st.integers(0, 4), min_size=2, max_size=200),
    corpus=st.lists(st.integers(-1, 4), min_size=0, max_size=300),
    chunk=st.integers(2, 60),
    max_tokens=st.integers(16, 300),
    max_candidates=st.integers(1, 40),
)
def test_lockstep_corpus_file_with_documents(
    tmp_path_factory: pytest.TempPathFactory,
    tokens: list[int],
    corpus: list[int],
    chunk: int,
    max_tokens: int,
    max_candidates: int,
) -> None:
    # -1 in the corpus separates documents: no match or continuation crosses it
    path = corpus_file(tmp_path_factory.mktemp("c"), corpus)
    lockstep(tokens, 8, chunk, max_tokens, None, corpus=str(path), max_candidates=max_candidates)


# The bigram (2, 3) continues at ids 3, 7, 11, 15 (tokens before it 1, 1, 5, 4; next 9, 9, 9, 7).
DEEP = [1, 2, 3, 9, 1, 2, 3, 9, 5, 2, 3, 9, 4, 2, 3, 7]
# The token 7 is followed at ids 1, 3, 5, 7 (by 1, 2, 1, 3); the bigram (5, 7) never occurs.
AFTER = [7, 1, 7, 2, 7, 1, 7, 3]


def corpus_forms(tmp_path: Path, ids: list[int]) -> list[tuple[Any, str, Any]]:
    """(implementation, form, corpus): the file mapped and in memory, and the ids."""
    fast = fast_impl()
    path = corpus_file(tmp_path, ids)
    return [
        (fast, "mapped", str(path)),
        (fast, "loaded", fast.CorpusIndex.open(path, in_memory=True)),
        (fast, "ids", ids),
        (ref, "file", str(path)),
        (ref, "ids", ids),
    ]


def history_with(impl: Any, form: str, corpus: Any) -> Any:
    """A history holding ``corpus`` in the given form (see :func:`corpus_forms`)."""
    h = impl.SuffixHistory()
    h.add_corpus(corpus)
    return h


def first_token(impl: Any, form: str, corpus: Any, request: list[int], max_candidates: int) -> list[int]:
    s = impl.HybridState(history_with(impl, form, corpus), 0.02, max_candidates, 0)
    s.begin_request()
    empty = impl.NgramCache()
    return list(s.propose(request, 1, empty, empty))


def test_trigram_search_reaches_older_corpus_occurrences(tmp_path: Path) -> None:
    """Hand-worked: with 2 candidates, the bigram's two newest (ids 15 and 11, next 7 and 9, a
    tie the newest wins) would draft 7; the deep search adds the trigram (1, 2, 3)'s older
    occurrences 7 and 3 (matching 3 tokens, the request's start), which vote for 9."""
    h = ref.SuffixHistory()
    h.add_corpus(DEEP)
    h.add_separator()
    base = CORPUS_BASE
    assert h.candidates([], 2, [1, 2, 3]) == [(base + 15, 2), (base + 11, 2), (base + 7, 3), (base + 3, 3)]
    for impl, form, corpus in corpus_forms(tmp_path, DEEP):
        assert first_token(impl, form, corpus, [1, 2, 3], 2) == [9], (impl.__name__, form)
        # with 4 candidates the bigram's occurrences are all of them: no deep search, 9 still wins
        assert first_token(impl, form, corpus, [1, 2, 3], 4) == [9], (impl.__name__, form)


def test_unigram_fallback_votes_over_corpus_occurrences(tmp_path: Path) -> None:
    """Hand-worked: (5, 7) never occurred, so the corpus's four occurrences of 7 vote: 1 twice
    (ids 5 and 1), 3 and 2 once; the newest alone would have drafted 3."""
    h = ref.SuffixHistory()
    h.add_corpus(AFTER)
    h.add_separator()
    base = CORPUS_BASE
    assert h.candidates([], 32, [5, 7]) == [(base + 7, 1), (base + 5, 1), (base + 3, 1), (base + 1, 1)]
    for impl, form, corpus in corpus_forms(tmp_path, AFTER):
        assert first_token(impl, form, corpus, [5, 7], 32) == [1], (impl.__name__, form)


def test_requests_occurrences_come_before_the_corpus(tmp_path: Path) -> None:
    """Hand-worked: an earlier request's 7 -> 2 is newer than the corpus's four: then 1 and 2 have
    two votes each and the newest of the tied (the request's 2) wins."""
    for impl, form, corpus in corpus_forms(tmp_path, AFTER):
        s = impl.HybridState(history_with(impl, form, corpus), 0.02, 16, 0)
        s.begin_request()
        s.propose([4, 7, 2], 0, impl.NgramCache(), impl.NgramCache())
        s.begin_request()
        assert list(s.propose([5, 7], 1, impl.NgramCache(), impl.NgramCache())) == [2], (impl.__name__, form)


# The bigram (6, 7) is followed by 9 at both its corpus occurrences.
GIVE_WAY = [6, 7, 9, 1, 6, 7, 9]


def test_corpus_bigram_gives_way_to_the_requests_token(tmp_path: Path) -> None:
    """Hand-worked: the earlier requests had 7 (followed by 2, twice) but never (6, 7), so the
    corpus's (6, 7) -> 9 is not followed: the one-token fallback's votes are 2 twice (the
    requests') and 9 twice (the corpus's 7s), and 2 wins (the requests' recent occurrences weigh
    more than the corpus's). Requests that never had 7 follow the corpus's bigram (9); requests
    that had (6, 7) too follow both, and their one recent occurrence (-> 5, 4 tokens back: a vote
    of 65536 // 4**2) outweighs the corpus's two (an age of 2**24: 65536 // 26**2 each)."""
    base = CORPUS_BASE
    for earlier, want in (([[3, 7, 2], [4, 7, 2]], 2), ([[3, 8, 2]], 9), ([[6, 7, 5]], 5)):
        h = ref.SuffixHistory()
        h.add_corpus(GIVE_WAY)
        for r in earlier:
            h.add_separator()
            h.extend(r)
        h.add_separator()
        found = h.candidates([], 32, [6, 7])
        mine = [p for p, _ in found if p < base]
        length = 1 if want == 2 else 2  # the one-token fallback, or the bigram
        assert found == [(p, length) for p in mine] + [(base + 6, length), (base + 2, length)]
        assert len(mine) == (2 if want == 2 else 1 if earlier[0][:2] == [6, 7] else 0)
        for impl, form, corpus in corpus_forms(tmp_path, GIVE_WAY):
            st_ = impl.HybridState(history_with(impl, form, corpus), 0.02, 32, 0)
            for r in earlier:
                st_.begin_request()
                st_.propose(r, 0, impl.NgramCache(), impl.NgramCache())
            st_.begin_request()
            got = list(st_.propose([6, 7], 1, impl.NgramCache(), impl.NgramCache()))
            assert got == [want], (impl.__name__, form, earlier)


def test_corpus_tokens_have_their_own_source_class() -> None:
    """A token drafted from the corpus alone is counted apart (source 2) from the requests'
    (0 an earlier request, 1 the current one), so a corpus that fails stops being drafted."""
    h = ref.SuffixHistory()
    h.add_corpus([1, 2, 3, 4])
    h.add_separator()
    h.extend([5, 6, 7])
    s = ref.HybridState(h, 0.02, 32, 0)
    s.begin_request()
    empty = ref.NgramCache()
    assert s.propose([1, 2], 1, empty, empty) == [3]
    assert [c[3] for c in s.last_step()[3]] == [2]
    s.observe(0, [9])
    assert s.propose([1, 2, 9, 5, 6], 1, empty, empty) == [7]
    assert [c[3] for c in s.last_step()[3]] == [0]
    assert [source_class(h, p) for p in (0, h.req_start - 1, h.req_start, CORPUS_BASE)] == [0, 0, 1, 2]


@settings(max_examples=40, deadline=None)
@given(
    tokens=st.lists(st.integers(0, 3), min_size=2, max_size=200),
    corpus=st.lists(st.integers(-1, 5), min_size=0, max_size=400),
    chunk=st.integers(2, 60),
    max_candidates=st.integers(1, 6),
    version=st.sampled_from([3, 3, 2]),
)
def test_lockstep_corpus_deep_and_unigram_searches(
    tmp_path_factory: pytest.TempPathFactory,
    tokens: list[int],
    corpus: list[int],
    chunk: int,
    max_candidates: int,
    version: int,
) -> None:
    # few candidates and a small alphabet: common bigrams (the trigram search runs into the
    # corpus: the trigram section, or in version 2 the bigram's run) and tokens unseen in the
    # request whose corpus occurrences vote
    path = corpus_file(tmp_path_factory.mktemp("c"), corpus, version=version)
    lockstep(tokens, 8, chunk, 10_000, None, corpus=str(path), max_candidates=max_candidates)


def test_corpus_stays_through_evictions() -> None:
    for impl in (fast_impl(), ref):
        h = impl.SuffixHistory(16)
        h.add_corpus([9, 8, 7, 6])
        h.add_separator()
        h.extend(list(range(40)))
        assert h.n_evictions >= 1 and h.corpus_tokens() == 4
        assert h.tokens()[:5] == [-1, 9, 8, 7, 6]
        s = impl.HybridState(h, 0.02, 16, 0)
        s.begin_request()
        empty = impl.NgramCache()
        assert s.propose([1, 9, 8], 1, empty, empty) == [7]  # still matched in the corpus
        with pytest.raises(ValueError, match="already holds a corpus"):
            h.add_corpus([1, 2, 3])


def test_drafter_corpus_file_same_as_ids(tmp_path: Path) -> None:
    fast = fast_impl()
    tokens = demo("wiki.test.demo.llama3.bin", 3000)
    corpus = demo("enwiki_wt.demo.llama3.bin", 20000)
    path = corpus_file(tmp_path, corpus, vocab_size=128256, vocab_fingerprint=b"12345678")
    proposals = []
    for impl in (fast, ref):
        for source in (str(path), corpus):
            d = impl.Drafter(policy="hybrid", corpus=source)
            out = []
            with d.request(tokens[:100]) as req:
                for t in tokens[100:600]:
                    out.append(req.propose())
                    req.extend([t])
            proposals.append(out)
    assert all(p == proposals[0] for p in proposals[1:])
    with pytest.raises(VocabularyError, match="another vocabulary"):
        fast.Drafter(policy="hybrid", corpus=path, vocab_fingerprint=b"87654321")
    with pytest.raises(VocabularyError, match="vocabulary of 128256 ids"):
        fast.Drafter(policy="hybrid", corpus=path, vocab_size=1000)
    with pytest.raises(ValueError, match="policy='hybrid'"):
        fast.Drafter(corpus=path)


def test_cli_create_corpus_out_and_stats(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    corpus = demo("enwiki_wt.demo.llama3.bin", 30000)
    src = write_bin(tmp_path / "corpus.bin", corpus)
    replay = write_bin(tmp_path / "replay.bin", demo("wiki.test.demo.llama3.bin", 5000))
    static, out = str(tmp_path / "s.lkdc"), tmp_path / "c.lkcorpus"
    code, _, err = run(capsys, "create", src, "-o", static, "--corpus-out", str(out), "-q")
    assert code == 0, err
    assert read_corpus_ids(out) == corpus and read_corpus_header(out).n_bigrams > 0
    counts = set()
    for source, impl in ((str(out), "fast"), (src, "fast"), (str(out), "reference")):
        argv = ["stats", replay, "-lcs", static, "--policy", "hybrid", "--corpus", source, "-c", "1024"]
        code, stdout, err = run(capsys, *argv, "--json", "-q", "--impl", impl)
        assert code == 0, err
        d = json.loads(stdout)
        assert d["corpus_tokens"] == len(corpus)
        counts.add((d["n_steps"], d["n_accept"], d["n_drafted"]))
    assert len(counts) == 1, counts
    code, _, err = run(capsys, "create", src, "-o", static, "--corpus-out", src, "-q")
    assert_clean_error(code, err, "corpus.bin")  # never overwrites an input


# --- bad files: a clear error naming the file, never a crash ------------------------------


def corrupt(tmp_path: Path, patch: Any) -> Path:
    path = corpus_file(tmp_path, IDS)
    data = bytearray(path.read_bytes())
    patch(data)
    bad = tmp_path / "bad.lkcorpus"
    bad.write_bytes(bytes(data))
    return bad


OPEN_ERRORS = [
    ("truncated header", lambda d: d.__delitem__(slice(50, None)), "shorter than the 96-byte"),
    ("truncated", lambda d: d.__delitem__(slice(len(d) - 8, None)), "file_size"),
    ("extended", lambda d: d.extend(b"\x00" * 8), "file_size"),
    ("wrong magic", lambda d: d.__setitem__(slice(0, 8), b"NOTMAGIC"), "not a lookupdec corpus file"),
    ("a static index's magic", lambda d: d.__setitem__(slice(0, 8), b"LKDCIDX\x00"), "a lookupdec static index"),
    ("a fork file's magic", lambda d: d.__setitem__(slice(0, 8), b"ggngcmp2"), "a fork v2 static cache"),
    ("version 1", lambda d: struct.pack_into("<I", d, 8, 1), "version 1 is not supported"),
    ("wrong version", lambda d: struct.pack_into("<I", d, 8, 4), "version 4 is not supported"),
    ("version 2 of a version 3 file", lambda d: struct.pack_into("<I", d, 8, 2), "bytes in version 2"),
    ("header size", lambda d: struct.pack_into("<I", d, 12, 64), "header_size"),
    ("n_tokens", lambda d: struct.pack_into("<Q", d, 24, 2**40), "n_tokens"),
    ("n_slots", lambda d: struct.pack_into("<Q", d, 40, 12), "n_slots"),
    ("n_entries", lambda d: struct.pack_into("<Q", d, 48, 1), "n_bigrams"),
    ("n_after", lambda d: struct.pack_into("<I", d, 20, 10**6), "n_after"),
    ("n_unigrams", lambda d: struct.pack_into("<Q", d, 56, 0), "every unigram"),
    ("sizes", lambda d: struct.pack_into("<QQ", d, 72, 0, len(d) + 8), "file_size"),
]


@pytest.mark.parametrize(("what", "patch", "needle"), OPEN_ERRORS, ids=[e[0] for e in OPEN_ERRORS])
def test_bad_header_is_a_clear_error(tmp_path: Path, what: str, patch: Any, needle: str) -> None:
    bad = corrupt(tmp_path, patch)
    for in_memory in (False, True):
        with pytest.raises(CacheFormatError, match=needle) as e:
            fast_impl().CorpusIndex.open(bad, in_memory=in_memory)
        assert e.value.path == str(bad)
    with pytest.raises(CacheFormatError, match=needle):
        read_corpus_ids(bad)  # the reference's reader
    with pytest.raises(CacheFormatError, match=needle):
        ref.SuffixHistory().add_corpus(str(bad))


def used_slots(data: bytearray) -> list[int]:
    """Byte offsets of the slots that hold a bigram."""
    n_tokens, n_slots = struct.unpack_from("<Q", data, 24)[0], struct.unpack_from("<Q", data, 40)[0]
    o_slots = 96 + (4 * n_tokens + 7) // 8 * 8
    return [o_slots + 16 * h for h in range(n_slots) if struct.unpack_from("<i", data, o_slots + 16 * h + 12)[0] > 0]


def entries_offset(data: bytearray) -> int:
    n_tokens: int = struct.unpack_from("<Q", data, 24)[0]
    n_slots: int = struct.unpack_from("<Q", data, 40)[0]
    return 96 + (4 * n_tokens + 7) // 8 * 8 + 16 * n_slots


def set_words(data: bytearray, offsets: list[int], value: int) -> None:
    for o in offsets:
        struct.pack_into("<i", data, o, value)


def entry_offsets(data: bytearray) -> list[int]:
    n_entries: int = struct.unpack_from("<Q", data, 48)[0]
    return [entries_offset(data) + 8 * g for g in range(n_entries)]


def unigram_offsets(data: bytearray) -> list[int]:
    """Byte offsets of the unigram records (then the after section's positions, n_after i32)."""
    n_entries: int = struct.unpack_from("<Q", data, 48)[0]
    n_uni: int = struct.unpack_from("<Q", data, 56)[0]
    return [entries_offset(data) + 8 * n_entries + 8 * u for u in range(n_uni)]


def after_offsets(data: bytearray) -> list[int]:
    n_after: int = struct.unpack_from("<I", data, 20)[0]
    o_after = unigram_offsets(data)[-1] + 8
    return [o_after + 4 * g for g in range(n_after)]


def trigram_offsets(data: bytearray) -> list[int]:
    """Byte offsets of the trigram section's entries (version 3)."""
    n_entries: int = struct.unpack_from("<Q", data, 48)[0]
    o_tri = (after_offsets(data)[-1] + 4 + 7) // 8 * 8
    return [o_tri + 8 * g for g in range(n_entries)]


LOOKUP_ERRORS = [
    ("run outside the entries", lambda d: set_words(d, [o + 8 for o in used_slots(d)], 10**6), "outside the"),
    ("negative run", lambda d: set_words(d, [o + 12 for o in used_slots(d)], -3), "outside the"),
    ("entry position", lambda d: set_words(d, entry_offsets(d), 10**6), "position"),
    ("token id", lambda d: set_words(d, [96 + 4 * i for i in range(len(IDS))], -7), "token id -7"),
    ("unigram run", lambda d: set_words(d, [o + 4 for o in unigram_offsets(d)], 10**6), "outside the"),
    ("after position", lambda d: set_words(d, after_offsets(d), 10**6), "after position"),
]  # fmt: skip


@pytest.mark.parametrize(("what", "patch", "needle"), LOOKUP_ERRORS, ids=[e[0] for e in LOOKUP_ERRORS])
def test_corrupt_sections_are_clear_errors(tmp_path: Path, what: str, patch: Any, needle: str) -> None:
    """Opened (the header is fine), then found corrupt where a match reads it; verify() finds it too."""
    fast = fast_impl()
    bad = corrupt(tmp_path, patch)
    c = fast.CorpusIndex.open(bad)
    with pytest.raises(CacheFormatError, match="checksum"):
        c.verify()
    h = fast.SuffixHistory()
    h.add_corpus(c)
    text = [t for t in IDS if t >= 0] * 4 + [0]
    with pytest.raises(CacheFormatError, match=needle) as e:
        fast.replay(text, 8, 4, None, None, None, "hybrid", h)
    assert e.value.path == str(bad)


def test_verify_finds_structure_that_disagrees_with_the_ids(tmp_path: Path) -> None:
    import hashlib

    def swap_entries(d: bytearray) -> None:
        o = entries_offset(d)
        d[o : o + 8], d[o + 8 : o + 16] = d[o + 8 : o + 16], d[o : o + 8]
        d[88:96] = hashlib.blake2b(bytes(d[96:]), digest_size=8).digest()  # a consistent checksum

    c = fast_impl().CorpusIndex.open(corrupt(tmp_path, swap_entries))
    with pytest.raises(CacheFormatError, match="differ from what the ids give"):
        c.verify()


def test_verify_finds_a_header_count_that_disagrees_with_the_ids(tmp_path: Path) -> None:
    # n_bigrams is not needed to find anything, so opening and drafting never read it: only the
    # full check can say it is wrong (it said "ok" to any value).
    def one_bigram(d: bytearray) -> None:
        struct.pack_into("<Q", d, 32, 1)

    path = corrupt(tmp_path, one_bigram)
    c = fast_impl().CorpusIndex.open(path)
    with pytest.raises(CacheFormatError, match="header fields differ from what the ids give"):
        c.verify()


def test_cli_bad_corpus_file_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = corrupt(tmp_path, lambda d: struct.pack_into("<I", d, 8, 9))
    replay = write_bin(tmp_path / "replay.bin", [1, 2, 3] * 20)
    for impl in ("fast", "reference"):
        code, _, err = run(capsys, "stats", replay, "--policy", "hybrid", "--corpus", str(bad), "-q", "--impl", impl)
        assert_clean_error(code, err, "bad.lkcorpus", "version 9")


def test_negative_ids_are_refused() -> None:
    with pytest.raises(ValueError, match="only -1"):
        fast_impl().CorpusIndex.from_tokens([1, 2, -2])
    with pytest.raises(ValueError, match="only -1"):
        ref.SuffixHistory().add_corpus([1, 2, -2])


@pytest.mark.slow  # seconds: run by .ci/run's slow stage, not the README's command
def test_every_word_of_the_body_refused_or_drafted(tmp_path: Path) -> None:
    """Every 4-byte word after the header set to 0, -1 and 2^31-1, one at a time, in a version 3
    file and a version 2 one: the fast path (which reads the structure) refuses with a
    CacheFormatError naming the file or drafts; so does the reference for the words of the ids
    (all it reads). Never another exception, never a crash. Drafting is a replay and
    :func:`deep_drafts` (one candidate: the trigram search reads the trigram section, or scans
    the run in version 2)."""
    fast = fast_impl()
    v3 = corpus_file(tmp_path, [*IDS, 2, 3, 1, 5, 7, 8, 1])
    text = [t for t in IDS if t >= 0] * 3 + [0]
    bad = tmp_path / "w.lkcorpus"
    for path, n_ids in ((v3, 23), (V2_FILE, len(V2_IDS))):
        original = path.read_bytes()
        outcomes = set()
        for off in range(96, len(original), 4):
            for value in (0, -1, 2**31 - 1):
                data = bytearray(original)
                struct.pack_into("<i", data, off, value)
                bad.write_bytes(bytes(data))
                for impl in (fast, ref) if off < 96 + 4 * n_ids else (fast,):  # the reference reads the ids only
                    h = impl.SuffixHistory()
                    try:
                        h.add_corpus(str(bad))
                        impl.replay(text, 8, 4, None, None, None, "hybrid", h)
                        deep_drafts(impl, str(bad))
                        outcomes.add("drafted")
                    except CacheFormatError as e:
                        assert e.path == str(bad)
                        outcomes.add("refused")
        assert outcomes == {"drafted", "refused"}, path.name


# --- the trigram section (version 3) and version 2 files ----------------------------------


def deep_drafts(impl: Any, corpus: Any, max_candidates: int = 1) -> list[list[int]]:
    """Proposals along an earlier request and IDS's text with few candidates, so that the trigram
    search runs into the corpus both after some of a bigram's run (the corpus's bigram
    occurrences fill the candidates) and before any (the earlier request's fill them)."""
    s = impl.HybridState(history_with(impl, "file", corpus), 0.02, max_candidates, 0)
    empty = impl.NgramCache()
    s.begin_request()
    s.propose([7, 8, 4, 7, 8, 2, 7, 8], 0, empty, empty)
    s.begin_request()
    text = [t for t in IDS if t >= 0] * 2
    return [list(s.propose(text[:i], 2, empty, empty)) for i in range(3, len(text))]


TRIGRAM_ERRORS = [
    ("position below 3", 2, "trigram entry"),
    ("position past the ids", 10**6, "trigram entry"),
    ("negative position", -5, "trigram entry"),
]


@pytest.mark.parametrize(("what", "value", "needle"), TRIGRAM_ERRORS, ids=[e[0] for e in TRIGRAM_ERRORS])
def test_corrupt_trigram_section_is_a_clear_error(tmp_path: Path, what: str, value: int, needle: str) -> None:
    """Every trigram entry's position set out of range: opened, then refused where the trigram
    search takes one (the earlier request's occurrences fill the candidates: it takes them all)."""
    fast = fast_impl()
    bad = corrupt(tmp_path, lambda d: set_words(d, trigram_offsets(d), value))
    with pytest.raises(CacheFormatError, match=needle) as e:
        deep_drafts(fast, str(bad))
    assert e.value.path == str(bad)
    with pytest.raises(CacheFormatError, match="checksum"):
        fast.CorpusIndex.open(bad).verify()
    assert deep_drafts(ref, str(bad)) == deep_drafts(ref, str(corpus_file(tmp_path, IDS)))  # ids only


def test_verify_finds_a_trigram_section_out_of_order(tmp_path: Path) -> None:
    import hashlib

    def swap(d: bytearray) -> None:
        o = trigram_offsets(d)[0]
        d[o : o + 8], d[o + 8 : o + 16] = d[o + 8 : o + 16], d[o : o + 8]
        d[88:96] = hashlib.blake2b(bytes(d[96:]), digest_size=8).digest()

    with pytest.raises(CacheFormatError, match="trigram section differ"):
        fast_impl().CorpusIndex.open(corrupt(tmp_path, swap)).verify()


V2_FILE = DATA / "corpus-v2.lkcorpus"
"""A version 2 file written by main's writer before version 3 (commit b85b5ed): ``DEEP``, -1,
``IDS``, vocab_size 10, fingerprint ``v2-file!``."""
V2_IDS = [*DEEP, -1, *IDS]


def test_version_2_file_opens_and_verifies() -> None:
    fast = fast_impl()
    assert read_corpus_header(V2_FILE).version == 2 and read_corpus_ids(V2_FILE) == V2_IDS
    for in_memory in (False, True):
        with fast.CorpusIndex.open(V2_FILE, in_memory=in_memory) as c:
            assert (c.version, c.tokens(), c.vocab_size, c.vocab_fingerprint) == (2, V2_IDS, 10, b"v2-file!")
            c.verify()
    # this tree's version 2 writer gives that file's bytes; version 3 adds the trigram section
    assert fast._corpus.corpus_bytes(fast._cache.to_vec(V2_IDS), 10, b"v2-file!", 2) == V2_FILE.read_bytes()
    v3 = fast.CorpusIndex.from_tokens(V2_IDS, 10, b"v2-file!").to_bytes()
    assert v3[96 : V2_FILE.stat().st_size] == V2_FILE.read_bytes()[96:]
    assert len(v3) == V2_FILE.stat().st_size + 8 * read_corpus_header(V2_FILE).n_entries


def test_version_2_and_3_files_draft_the_same(tmp_path: Path) -> None:
    """The trigram search through the trigram section (version 3) and by scanning the run
    (version 2, main's file), against the reference, with few candidates."""
    v3 = corpus_file(tmp_path, V2_IDS, vocab_size=10, vocab_fingerprint=b"v2-file!")
    for max_candidates in (1, 2, 3):
        want = deep_drafts(ref, V2_IDS, max_candidates)
        for impl in (fast_impl(), ref):
            for path in (V2_FILE, v3):
                assert deep_drafts(impl, str(path), max_candidates) == want, (impl.__name__, path.name)
    v2 = corpus_file(tmp_path, DEEP, "deep-v2.lkcorpus", version=2)
    for impl in (fast_impl(), ref):  # the hand-worked deep search, version 2
        assert first_token(impl, "file", str(v2), [1, 2, 3], 2) == [9], impl.__name__


@pytest.mark.parametrize("mode", ["mapped", "in_memory", "from_bytes"])
def test_a_closed_corpus_says_so(tmp_path: Path, mode: str) -> None:
    # Closed, a corpus's bytes are gone: saving it over the file it came from wrote an empty
    # file (the corpus lost), and drafting from it drafted as from no corpus, without a word.
    fast = fast_impl()
    path = tmp_path / "c.lkcorpus"
    ids = demo("enwiki_wt.demo.llama3.bin", 3000)
    fast.CorpusIndex.from_tokens(ids).save(path)
    before = path.read_bytes()
    if mode == "from_bytes":
        corpus = fast.CorpusIndex.from_bytes(before)
    else:
        corpus = fast.CorpusIndex.open(path, in_memory=mode == "in_memory")
    drafter = fast.Drafter(policy="hybrid", corpus=corpus)
    with drafter.request(ids[100:120]) as req:
        assert req.propose()  # the corpus holds these tokens and their continuation
    corpus.close()
    for use in (lambda: corpus.save(path), corpus.to_bytes, corpus.verify, corpus.tokens):
        with pytest.raises(ValueError, match="corpus file is closed"):
            use()
    assert path.read_bytes() == before
    with pytest.raises(ValueError, match="corpus file is closed"), drafter.request(ids[200:220]) as req:
        req.propose()


@pytest.mark.parametrize("in_memory", [False, True])
def test_a_closed_static_index_says_so(tmp_path: Path, in_memory: bool) -> None:
    # The same for a static index: an in-memory one drafted as an empty index once closed, or
    # failed with a bare IndexError once its lookup memo had grown; saving it wrote an empty file.
    fast = fast_impl()
    path = tmp_path / "s.lkdc"
    ids = demo("enwiki_wt.demo.llama3.bin", 20_000)
    fast.build_static(ids).save(path)
    before = path.read_bytes()
    static = fast.load_static(path, in_memory=in_memory)
    fast.replay(ids[:5000], 512, 8, static)  # enough lookups to grow its lookup memo
    static.close()
    for use in (lambda: static.save(path), static.to_bytes, static.verify):
        with pytest.raises(ValueError, match="static index is closed"):
            use()
    assert path.read_bytes() == before
    with pytest.raises(ValueError, match="static index is closed"):
        fast.replay(ids[:5000], 512, 8, static)


def test_from_tokens_checks_the_vocabulary_arguments() -> None:
    fast = fast_impl()
    for bad in (-1, 2**64):
        with pytest.raises(ValueError, match=f"vocab_size must be in 0..2\\^31 .*got {bad}"):
            fast.CorpusIndex.from_tokens([1, 2, 3], vocab_size=bad)
    with pytest.raises(ValueError, match=r"vocab_fingerprint must be 8 bytes .*got 3"):
        fast.CorpusIndex.from_tokens([1, 2, 3], vocab_size=10, vocab_fingerprint=b"abc")
