"""The request-level Drafter: exactly the replay's counts, locked saves, clear errors (both implementations)."""

from __future__ import annotations

import multiprocessing
import os
import warnings
from functools import cache
from pathlib import Path
from typing import Any

import pytest

import lookupdec
from lookupdec._lifecycle import DrafterStats
from lookupdec.errors import CacheFormatError, CountSaturationWarning, RequestClosedError, VocabularyError
from lookupdec.formats import write_static
from lookupdec.rules import MAX_DRAFT
from tests.conftest import DEMO_DATA
from tests.impls import FastImpl, ImplTests, ReferenceImpl

DATA = DEMO_DATA
N_CTX = 512
N_CHUNKS = 4


@cache
def demo_tokens() -> tuple[list[int], list[int]]:
    """A slice of the shipped replay text (N_CHUNKS chunks and a bit) and of the shipped corpus."""
    from lookupdec.tokens import read_tokens

    text = read_tokens(DATA / "wiki.test.demo.llama3.bin").tolist()[: N_CHUNKS * N_CTX + 7]
    corpus = read_tokens(DATA / "enwiki_wt.demo.llama3.bin").tolist()[:60_000]
    return text, corpus


def drive(drafter: Any, tokens: list[int], n_ctx: int) -> None:
    """Drive ``drafter`` over ``tokens`` the way llama-lookup-stats drives its caches.

    Per chunk of ``n_ctx``: a request that starts with the chunk's first token; propose; the
    "model" (the text itself) accepts the matching prefix; extend with it plus the next true
    token; end the request when the chunk is full.
    """
    i_start = 0
    while i_start + n_ctx < len(tokens):
        chunk = tokens[i_start : i_start + n_ctx]
        with drafter.request(chunk[:1]) as req:
            while len(req.tokens) < n_ctx:
                proposal = req.propose()
                pos = len(req.tokens)
                committed: list[int] = []
                for t in proposal:
                    if pos + len(committed) >= n_ctx or chunk[pos + len(committed)] != t:
                        break
                    committed.append(t)
                if pos + len(committed) < n_ctx:
                    committed.append(chunk[pos + len(committed)])
                req.extend(committed)
        i_start += n_ctx


class DrafterTests(ImplTests):
    def static(self) -> Any:
        return self.impl.build_static(demo_tokens()[1])

    def test_same_counts_as_replay(self) -> None:
        text, _ = demo_tokens()
        static = self.static()
        expected_dynamic = self.impl.NgramCache()
        expected = self.impl.replay(text, N_CTX, 8, static, expected_dynamic)
        drafter = self.impl.Drafter(static=static)
        drive(drafter, text, N_CTX)
        stats = drafter.stats
        assert expected.n_drafted > 1000 and expected.n_accept > 100  # the slice really drafts
        assert (stats.n_drafted, stats.n_accept) == (expected.n_drafted, expected.n_accept)
        assert stats.requests == N_CHUNKS and drafter.open_requests == 0
        assert drafter.dynamic.contents() == expected_dynamic.contents()

    def test_dynamic_file_carries_over_between_drafters(self, tmp_path: Path) -> None:
        # Two Drafters, one after the other, sharing a dynamic file: the same counts as one replay.
        text, _ = demo_tokens()
        static = self.static()
        expected = self.impl.replay(text, N_CTX, 8, static)
        path = tmp_path / "dynamic.bin"
        half = 2 * N_CTX
        first = self.impl.Drafter(static=static, dynamic=path)
        drive(first, text[: half + 1], N_CTX)
        first.save()
        second = self.impl.Drafter(static=static, dynamic=path)
        drive(second, text[half:], N_CTX)
        total = (first.stats.n_drafted + second.stats.n_drafted, first.stats.n_accept + second.stats.n_accept)
        assert total == (expected.n_drafted, expected.n_accept)

    def test_extend_counts_like_one_update_per_token(self) -> None:
        text, _ = demo_tokens()
        tokens = text[:300]
        expected = self.impl.NgramCache()
        for m in range(1, len(tokens) + 1):
            expected.update(tokens[:m], 1)
        drafter = self.impl.Drafter()
        with drafter.request(tokens[:10]) as req:
            req.extend(tokens[10:11])
            req.extend(tokens[11:200])
            req.extend([])
            req.extend(tokens[200:])
        assert drafter.dynamic.contents() == expected.contents()

    def test_accepted_is_the_confirmed_prefix_of_the_last_proposal(self) -> None:
        drafter = self.impl.Drafter(n_draft=4)
        with drafter.request([1, 2, 3, 1, 2, 3, 1, 2]) as req:
            assert req.propose() == [3, 1, 2, 3]
            req.extend([3])  # one at a time, as an engine may commit
            req.extend([1, 9])  # 9 ends the proposal
            req.extend([3])  # after the proposal ended: not accepted, though the 4th draft was 3
            assert req.propose(0) == []
        assert drafter.stats == DrafterStats(requests=1, proposals=2, n_drafted=4, n_accept=2)
        assert drafter.stats.accept == 50.0

    def test_bad_use_is_a_clear_error(self) -> None:
        drafter = self.impl.Drafter(vocab_size=100)
        req = drafter.request([1, 2])
        with pytest.raises(VocabularyError, match="token 1 is -3"):
            req.extend([5, -3])
        with pytest.raises(VocabularyError, match=r"token 0 is 100: .* vocabulary size 100"):
            req.extend([100])
        with pytest.raises(VocabularyError, match="prompt token 1 is -1"):
            drafter.request([0, -1])
        with pytest.raises(VocabularyError, match="below 2\\^31"):
            self.impl.Drafter().request([2**31])
        with pytest.raises(TypeError):
            req.extend([3, 1.5])
        for huge in (2**63, -(2**70)):  # past an i64: the compiled llama path said "int too large"
            for policy in ("llama", "hybrid"):
                with pytest.raises(VocabularyError, match=f"token 0 is {huge}"):
                    self.impl.Drafter(policy=policy).request([1]).extend([huge])
        assert req.tokens == [1, 2]  # a refused extend commits nothing
        import numpy as np

        req.extend(np.array([7, 8], dtype=np.int32))  # numpy integers are token ids
        assert req.tokens == [1, 2, 7, 8] and all(type(t) is int for t in req.tokens)
        req.end()
        req.end()  # ending twice is harmless
        with pytest.raises(RequestClosedError, match="propose"):
            req.propose()
        with pytest.raises(RequestClosedError, match="extend"):
            req.extend([3])
        with pytest.raises(ValueError, match="policy 'best'"):
            self.impl.Drafter(policy="best")
        with pytest.raises(ValueError, match=r"history_tokens .* policy='hybrid'"):
            self.impl.Drafter(history_tokens=1000)
        with pytest.raises(ValueError, match="history_tokens must be >= 16"):
            self.impl.Drafter(policy="hybrid", history_tokens=8)
        with pytest.raises(ValueError, match=r"target_waste .* policy='hybrid'"):
            self.impl.Drafter(target_waste=1.0)
        with pytest.raises(ValueError, match=r"target_waste must be in \[0, 64\]"):
            self.impl.Drafter(policy="hybrid", target_waste=65.0)
        with pytest.raises(ValueError, match="n_draft"):
            self.impl.Drafter(n_draft=-1)
        with pytest.raises(ValueError, match="needs a path"):
            drafter.save()

    def test_static_index_of_another_vocabulary(self, tmp_path: Path) -> None:
        path = tmp_path / "static.lkdc"
        write_static([((1, 2, -1, -1), [(3, 4)])], path, vocab_size=100, vocab_fingerprint=b"A" * 8)
        with pytest.raises(VocabularyError, match=f"{path}: the static index was built for another vocabulary"):
            self.impl.Drafter(static=path, vocab_fingerprint=b"B" * 8)
        # Same fingerprint, or one side unknown: accepted, and it drafts from the index. The
        # reference opens only legacy files by path (it is stdlib-only); it takes the index
        # opened by the layer above, and checks the opened index's fingerprint the same way.
        static: Any = path
        if self.impl.IMPLEMENTATION == "reference":
            from lookupdec.cli._pipeline import load_static

            static = load_static(self.impl, str(path))
            with pytest.raises(VocabularyError, match="built for another vocabulary"):
                self.impl.Drafter(static=static, vocab_fingerprint=b"B" * 8)
        for fingerprint in (b"A" * 8, None, bytes(8)):
            drafter = self.impl.Drafter(static=static, vocab_fingerprint=fingerprint)
            with drafter.request([1, 2]) as req:
                assert req.propose() == [3]
        unknown = tmp_path / "unknown.lkdc"
        write_static([((1, 2, -1, -1), [(3, 4)])], unknown)
        if self.impl.IMPLEMENTATION == "reference":
            from lookupdec.cli._pipeline import load_static

            self.impl.Drafter(static=load_static(self.impl, str(unknown)), vocab_fingerprint=b"B" * 8)
        else:
            self.impl.Drafter(static=unknown, vocab_fingerprint=b"B" * 8)

    def test_static_index_of_a_larger_vocabulary(self, tmp_path: Path) -> None:
        # An index recorded for more ids than the model has would draft ids the model does not have.
        path = tmp_path / "static.lkdc"
        write_static([((1, 2, -1, -1), [(3, 4)])], path, vocab_size=1000)
        static: Any = path
        if self.impl.IMPLEMENTATION == "reference":  # it takes the index opened by the layer above
            from lookupdec.cli._pipeline import load_static

            static = load_static(self.impl, str(path))
        with pytest.raises(VocabularyError, match=f"{path}: the static index was built for a vocabulary of 1000 ids"):
            self.impl.Drafter(static=static, vocab_size=999)
        for vocab_size in (1000, 4096, None):
            with self.impl.Drafter(static=static, vocab_size=vocab_size).request([1, 2]) as req:
                assert req.propose() == [3]
        unknown = tmp_path / "unknown.lkdc"  # no vocabulary recorded: its ids (1, 2, 3) are read
        write_static([((1, 2, -1, -1), [(3, 4)])], unknown)
        if self.impl.IMPLEMENTATION == "fast":
            self.impl.Drafter(static=unknown, vocab_size=4)
            with pytest.raises(VocabularyError, match=f"{unknown}: the static cache holds token id 3, not below"):
                self.impl.Drafter(static=unknown, vocab_size=3)

    def test_cache_files_without_a_vocabulary_have_their_ids_read(self, tmp_path: Path) -> None:
        # llama.cpp's files and the fork's record no vocabulary: given the model's, a Drafter reads
        # their ids when it opens them and refuses one made with a larger vocabulary, naming it,
        # instead of drafting ids the model does not have. Every format the implementation opens
        # by path, as the static cache, and llama.cpp's as the dynamic cache too.
        contents = [((1, 2, -1, -1), [(999, 4)]), ((999, 5, -1, -1), [(6, 1)])]
        formats = ["llama"] if self.impl.IMPLEMENTATION == "reference" else ["llama", "fork-v2", "lookupdec"]
        for fmt in formats:
            path = tmp_path / f"static.{fmt}"
            write_static(contents, path, fmt)
            with pytest.raises(
                VocabularyError, match=f"{path}: the static cache holds token id 999, not below the vocabulary size 999"
            ):
                self.impl.Drafter(static=path, vocab_size=999)
            for vocab_size in (1000, None):
                with self.impl.Drafter(static=path, vocab_size=vocab_size).request([1, 2]) as req:
                    assert req.propose() == [999]
        dynamic = tmp_path / "dynamic.bin"
        a = self.impl.Drafter(dynamic=dynamic)
        with a.request([7, 8, 999] * 8):
            pass
        a.save()
        before = dynamic.read_bytes()
        with pytest.raises(VocabularyError, match=f"{dynamic}: the dynamic cache holds token id 999, not below"):
            self.impl.Drafter(dynamic=dynamic, vocab_size=999)
        assert dynamic.read_bytes() == before  # refused, never rewritten
        with self.impl.Drafter(dynamic=dynamic, vocab_size=1000).request([7, 8]) as req:
            assert req.propose()[:1] == [999]

    def test_a_huge_k_drafts_as_the_reference(self) -> None:
        # The compiled hybrid policy reserved room for k tokens up front (k = 2**31 took 16 GB),
        # and both implementations draft in time linear in k: k is bounded by MAX_DRAFT, up to
        # which both draft the same.
        import lookupdec.reference as ref

        tokens = [1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6, 1, 2]
        proposals = []
        for impl in (self.impl, ref):
            for policy in ("llama", "hybrid"):
                with impl.Drafter(policy=policy, static=impl.build_static(tokens)).request(tokens) as req:
                    proposals.append(req.propose(MAX_DRAFT))
                    if policy == "hybrid":
                        proposals.append(req.propose_tree(MAX_DRAFT))
                    for k in (MAX_DRAFT + 1, 2**40, 2**64):  # beyond it: a clear error, not hours or gigabytes
                        with pytest.raises(ValueError, match=f"k must be <= {MAX_DRAFT}"):
                            req.propose(k)
        assert proposals[:3] == proposals[3:]
        assert proposals[1][:4] == [3, 4, 5, 6]
        with pytest.raises(ValueError, match=f"n_draft must be <= {MAX_DRAFT}"):
            self.impl.Drafter(n_draft=2**62)

    def test_numpy_ids_and_counts_are_taken(self) -> None:
        # Ids from a tokenizer often come as numpy integers: the compiled llama.cpp request refused
        # them (mypyc's own TypeError) where the reference and the hybrid policy took them.
        import numpy as np

        tokens = [1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2]
        for policy in ("llama", "hybrid"):
            drafter = self.impl.Drafter(policy=policy, static=self.impl.build_static(tokens))
            with drafter.request(tokens) as req:
                want = req.propose(4)
            for prompt in (np.array(tokens), np.array(tokens, dtype=np.uint32), tuple(tokens)):
                with drafter.request(prompt) as req:
                    assert req.propose(np.int64(4)) == want, (policy, type(prompt))
                    req.trim(np.int64(2))
                    req.trim(2**70)  # more than any proposal holds: it stays as it is
                    req.extend(np.array(want[:2]))
                    assert req.tokens == [*tokens, *want[:2]]

    def test_what_waits_for_an_open_owner_is_bounded(self) -> None:
        # Requests that end while the history's owner is open wait to join the history after it;
        # an owner never ended made that grow without bound (280,000 tokens for a 4,096 history).
        drafter = self.impl.Drafter(policy="hybrid", history_tokens=64)
        owner = drafter.request([1, 2, 3])
        for i in range(100):
            with drafter.request([10 + i % 7, 20, 30, 40, 50, 60, 70, 80, 90, 100]):
                pass
        held = [len(t) for t in drafter._host.waiting]
        assert sum(held) <= 64 and len(held) == 6  # the newest 6 requests of 10 tokens
        owner.end()
        assert drafter.policy_state.history.tokens()[-10:] == [10 + 99 % 7, 20, 30, 40, 50, 60, 70, 80, 90, 100]

    def test_an_owner_dropped_without_end_gives_the_history_up(self) -> None:
        # The Drafter held its history owner strongly: one dropped without end() (an exception,
        # a client gone) owned the history for good, and every later request drafted detached
        # from it, its tokens never joining.
        import gc

        import numpy as np

        ids = np.fromfile(DATA / "wiki.test.demo.llama3.bin", dtype="<i4")[:3000].tolist()
        stats = []
        for drop in (False, True):
            drafter = self.impl.Drafter(policy="hybrid")
            first = drafter.request([])
            if drop:
                del first
                gc.collect()
            else:
                first.end()
            for start in (0, 1000, 0, 2000, 1000):
                with drafter.request(ids[start : start + 20]) as req:
                    for t in ids[start + 20 : start + 400]:
                        req.propose(8)
                        req.extend([t])
                    assert drafter._host.owner is req
            stats.append(drafter.stats)
        assert stats[1] == stats[0] and stats[0].n_accept > 0

    def test_a_dynamic_file_in_a_missing_folder_is_refused_at_once(self, tmp_path: Path) -> None:
        # save() failed only at the end (a vLLM server's exit), with what its requests taught lost
        from lookupdec.errors import OutputFileError

        with pytest.raises(OutputFileError, match="dynamic cache's folder does not exist"):
            self.impl.Drafter(dynamic=tmp_path / "missing" / "dynamic.bin")
        with pytest.raises(OutputFileError, match="empty output path"):
            self.impl.Drafter(dynamic="")  # accepted, and save() failed
        with pytest.raises(OutputFileError, match="exists and is a folder"):
            self.impl.Drafter(dynamic=tmp_path)
        self.impl.Drafter(dynamic=tmp_path / "dynamic.bin").save()  # a new file in a folder that exists
        assert (tmp_path / "dynamic.bin").exists()

    def test_a_static_index_as_the_dynamic_cache_is_refused(self, tmp_path: Path) -> None:
        # The compiled Drafter loaded it, and save() then wrote it back as llama.cpp's format.
        path = tmp_path / "s.lkdc"
        write_static([((1, 2, -1, -1), [(3, 4)])], path)
        before = path.read_bytes()
        with pytest.raises(CacheFormatError, match=f"{path}: a lookupdec file given as the dynamic cache"):
            self.impl.Drafter(dynamic=path)
        assert path.read_bytes() == before

    def test_replay_of_one_token_chunks(self) -> None:
        # n_ctx 1: no step drafts, but each chunk's token joins the hybrid history (the compiled
        # replay read past the tokens it kept: IndexError).
        import lookupdec.reference as ref

        tokens = [5, 6, 7, 5, 6, 7, 5, 6]
        runs = []
        for impl in (self.impl, ref):
            history = impl.SuffixHistory()
            r = impl.replay(tokens, 1, 8, policy="hybrid", history=history)
            runs.append((r.n_steps, r.n_drafted, r.n_accept, history.tokens()))
        assert runs[0] == runs[1]
        assert runs[0][3] == [-1, 5, -1, 6, -1, 7, -1, 5, -1, 6, -1, 7, -1, 5]  # the 7 chunks' first tokens

    def test_corpus_files_are_checked_against_the_vocabulary(self, tmp_path: Path) -> None:
        # A corpus file that records no vocabulary has its ids read; an opened one is checked on
        # what it records (vocabulary and fingerprint), as an opened static index is.
        unknown, known = tmp_path / "unknown.lkcorpus", tmp_path / "known.lkcorpus"
        lookupdec.fast.CorpusIndex.from_tokens([5, 999, 7, 5, 999]).save(unknown)
        lookupdec.fast.CorpusIndex.from_tokens([5, 6, 7, 5, 6], 1000, b"A" * 8).save(known)
        with pytest.raises(VocabularyError, match=f"{unknown}: the corpus file holds token id 999, not below"):
            self.impl.Drafter(policy="hybrid", corpus=unknown, vocab_size=999)
        with self.impl.Drafter(policy="hybrid", corpus=unknown, vocab_size=1000).request([7, 5]) as req:
            assert req.propose()[:1] == [999]
        if self.impl.IMPLEMENTATION == "fast":  # an opened corpus file is the compiled CorpusIndex
            with lookupdec.fast.CorpusIndex.open(known) as opened:
                with pytest.raises(
                    VocabularyError, match=f"{known}: the corpus file was built for a vocabulary of 1000"
                ):
                    self.impl.Drafter(policy="hybrid", corpus=opened, vocab_size=999)
                self.impl.Drafter(policy="hybrid", corpus=opened, vocab_size=1000)
            message = f"{known}: the corpus file was built for another vocabulary"
            with lookupdec.fast.CorpusIndex.open(known) as opened, pytest.raises(VocabularyError, match=message):
                self.impl.Drafter(policy="hybrid", corpus=opened, vocab_fingerprint=b"B" * 8)

    def test_corpus_file_and_static_index_swapped(self, tmp_path: Path) -> None:
        # Each refused naming the file and what it is, as the static, dynamic or corpus argument
        # the other belongs in (a corpus file read as llama.cpp's format failed on a "record").
        static, corpus = tmp_path / "s.lkdc", tmp_path / "c.lkcorpus"
        write_static([((1, 2, -1, -1), [(3, 4)])], static)
        lookupdec.fast.CorpusIndex.from_tokens([5, 6, 7, 8]).save(corpus)
        for kwargs in ({"static": corpus}, {"dynamic": corpus}):
            with pytest.raises(CacheFormatError, match=f"{corpus}: a lookupdec corpus file .*not an n-gram cache"):
                self.impl.Drafter(**kwargs)
        with pytest.raises(CacheFormatError, match=f"{static}: a lookupdec static index .*not a corpus file"):
            self.impl.Drafter(policy="hybrid", corpus=static)
        with self.impl.Drafter(policy="hybrid", corpus=corpus).request([5, 6]) as req:
            assert req.propose()[:2] == [7, 8]

    def test_a_cut_copy_of_a_file_with_a_magic_is_not_an_empty_llama_cache(self, tmp_path: Path) -> None:
        # Under 20 bytes, llama.cpp's format reads as an empty cache with trailing bytes; the
        # first 4-7 bytes of an index or a corpus file are a truncated copy of that file.
        static, corpus = tmp_path / "s.lkdc", tmp_path / "c.lkcorpus"
        write_static([((1, 2, -1, -1), [(3, 4)])], static)
        lookupdec.fast.CorpusIndex.from_tokens([5, 6, 7, 8]).save(corpus)
        for whole, kind in ((static, "a lookupdec static index"), (corpus, "a lookupdec corpus file")):
            for n in (4, 7):
                cut = tmp_path / f"cut{n}"
                cut.write_bytes(whole.read_bytes()[:n])
                for kwargs in ({"static": cut}, {"dynamic": cut}):
                    # "LKDC" begins both magics: both are named.
                    with pytest.raises(CacheFormatError, match=f"{cut}: {n} bytes that begin the magic of .*{kind}"):
                        self.impl.Drafter(**kwargs)
        other = tmp_path / "other"
        other.write_bytes(b"LKDX123")  # not a magic's start: llama.cpp's format, empty, as before
        with pytest.warns(UserWarning, match="trailing bytes"):
            assert len(self.impl.load_static(other)) == 0

    def test_save_merges_into_what_is_on_disk(self, tmp_path: Path) -> None:
        path = tmp_path / "dynamic.bin"
        a = self.impl.Drafter(dynamic=path)
        b = self.impl.Drafter(dynamic=path)  # both loaded the same (missing: empty) file
        with a.request([1, 2, 3]):
            pass
        with b.request([1, 2, 4]):
            pass
        a.save()
        b.save()
        a.save()  # nothing new since the last save: adds nothing
        expected = self.impl.NgramCache()
        expected.update([1, 2, 3], 3)
        expected.update([1, 2, 4], 3)
        assert self.impl.NgramCache.load(path).contents() == expected.contents()
        assert (tmp_path / "dynamic.bin.lock").exists()
        # After its save, b drafts from everything on disk, a's counts included.
        assert b.dynamic.contents() == expected.contents()
        # save(path) elsewhere: only this Drafter's new counts, merged into that file.
        with a.request([7, 8]):
            pass
        other = tmp_path / "other.bin"
        a.save(other)
        assert self.impl.NgramCache.load(other).contents() == [((7, -1, -1, -1), [(8, 1)])]

    def test_counts_saturate_in_every_save(self, tmp_path: Path) -> None:
        path = tmp_path / "dynamic.bin"
        big = self.impl.NgramCache.from_contents([((1, -1, -1, -1), [(2, 2**31 - 2), (3, 5)])])
        big.save(path)
        drafter = self.impl.Drafter(dynamic=path)
        with drafter.request([1, 2, 1, 2, 1, 2]):
            pass
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            drafter.save()
        messages = [str(w.message) for w in caught if issubclass(w.category, CountSaturationWarning)]
        assert messages == [f"{path}: 1 count(s) above 2^31-1 saturated at 2147483647"]
        contents = dict(self.impl.NgramCache.load(path).contents())
        assert contents[(1, -1, -1, -1)] == [(2, 2**31 - 1), (3, 5)]
        assert contents[(1, 2, -1, -1)] == [(1, 2)]
        assert contents[(2, 1, 2, -1)] == [(1, 1)]

    def test_plain_merge_and_save_saturate_too(self, tmp_path: Path) -> None:
        a = self.impl.NgramCache.from_contents([((5, 6, -1, -1), [(7, 2**31 - 1)])])
        a.merge(self.impl.NgramCache.from_contents([((5, 6, -1, -1), [(7, 2**31 - 1), (8, 1)])]))
        path = tmp_path / "merged.bin"
        with pytest.warns(CountSaturationWarning, match=f"{path}: 1 count"):
            a.save(path)
        assert self.impl.NgramCache.load(path).contents() == [((5, 6, -1, -1), [(7, 2**31 - 1), (8, 1)])]

    # --- the hybrid policy ---------------------------------------------------------

    @pytest.mark.parametrize("history_tokens", [None, 700])  # 700: the history evicts several times
    def test_hybrid_same_counts_as_replay(self, history_tokens: int | None) -> None:
        text, _ = demo_tokens()
        static = self.static()
        history = self.impl.SuffixHistory() if history_tokens is None else self.impl.SuffixHistory(history_tokens)
        expected_dynamic = self.impl.NgramCache()
        expected = self.impl.replay(text, N_CTX, 8, static, expected_dynamic, None, "hybrid", history)
        llama = self.impl.replay(text, N_CTX, 8, static)
        drafter = self.impl.Drafter(static=static, policy="hybrid", history_tokens=history_tokens)
        drive(drafter, text, N_CTX)
        stats = drafter.stats
        assert expected.n_accept > llama.n_accept  # the policy really adds drafts here
        assert (stats.n_drafted, stats.n_accept) == (expected.n_drafted, expected.n_accept)
        assert stats.proposals == expected.n_steps
        assert drafter.dynamic.contents() == expected_dynamic.contents()
        state = drafter.policy_state
        assert state.history.tokens() == history.tokens()  # every request's tokens, in order
        if history_tokens is not None:
            assert state.history.n_evictions == history.n_evictions > 0

    def test_hybrid_target_waste_steers_the_waste(self) -> None:
        # A lower target wastes fewer drafted tokens per proposal than the default (1.9), a
        # higher one more; the default is what target_waste=None gives.
        text, _ = demo_tokens()
        static = self.static()
        wasted = {}
        for tw in (None, 0.3, 1.9, 6.0):
            drafter = self.impl.Drafter(static=static, policy="hybrid", target_waste=tw)
            drive(drafter, text, N_CTX)
            st = drafter.stats
            wasted[tw] = (st.n_drafted - st.n_accept) / st.proposals
        assert wasted[None] == wasted[1.9]
        assert wasted[0.3] < wasted[1.9] < wasted[6.0]

    def test_replay_target_waste_is_the_drafters(self) -> None:
        # replay(target_waste=W) drafts what Drafter(target_waste=W) does, request by request
        text, _ = demo_tokens()
        static = self.static()
        default = self.impl.replay(text, N_CTX, 8, static, None, None, "hybrid")
        for tw in (0.3, 6.0):
            expected = self.impl.replay(text, N_CTX, 8, static, None, None, "hybrid", None, 1, tw)
            assert (expected.n_drafted, expected.n_accept) != (default.n_drafted, default.n_accept)
            drafter = self.impl.Drafter(static=static, policy="hybrid", target_waste=tw)
            drive(drafter, text, N_CTX)
            assert (drafter.stats.n_drafted, drafter.stats.n_accept) == (expected.n_drafted, expected.n_accept)
        with pytest.raises(ValueError, match=r"target_waste .* policy='hybrid'"):
            self.impl.replay(text, N_CTX, 8, static, None, None, "llama", None, 1, 1.0)
        with pytest.raises(ValueError, match=r"target_waste must be in \[0, 64\]"):
            self.impl.replay(text, N_CTX, 8, static, None, None, "hybrid", None, 1, -0.5)

    def test_hybrid_corpus_is_an_earlier_request(self) -> None:
        # Drafter(corpus=...) equals a replay whose history holds the corpus.
        text, corpus = demo_tokens()
        static = self.static()
        history = self.impl.SuffixHistory()
        history.add_corpus(corpus[:20_000])
        expected = self.impl.replay(text, N_CTX, 8, static, None, None, "hybrid", history)
        plain = self.impl.replay(text, N_CTX, 8, static, None, None, "hybrid")
        drafter = self.impl.Drafter(static=static, policy="hybrid", corpus=corpus[:20_000])
        drive(drafter, text, N_CTX)
        assert (expected.n_drafted, expected.n_accept) != (plain.n_drafted, plain.n_accept)  # it changes the drafts
        assert (drafter.stats.n_drafted, drafter.stats.n_accept) == (expected.n_drafted, expected.n_accept)
        assert drafter.policy_state.history.tokens() == history.tokens()
        with pytest.raises(ValueError, match=r"corpus .* policy='hybrid'"):
            self.impl.Drafter(corpus=corpus[:10])
        with pytest.raises(VocabularyError, match="corpus token 1 is -5"):
            self.impl.Drafter(policy="hybrid", corpus=[1, -5])

    def test_hybrid_llama_default_is_unchanged(self) -> None:
        drafter = self.impl.Drafter()
        assert drafter.policy == "llama" and drafter.policy_state is None

    def test_hybrid_one_history_owner_at_a_time(self) -> None:
        # A is open first: it owns the history (its tokens are indexed as they come). B, open at
        # the same time, matches its own last tokens against the history and joins it only
        # after A, contiguously.
        drafter = self.impl.Drafter(policy="hybrid", n_draft=4)
        with drafter.request([10, 11, 12, 13, 14]):
            pass  # an earlier request: 12 13 14 follow 10 11
        a = drafter.request([1, 10, 11])
        b = drafter.request([2, 10, 11])
        # llama.cpp's rule drafts nothing here (one count of 11 -> 12 is below its dynamic
        # threshold); the suffix match continues 10 11 as the earlier request did, up to its end.
        assert b.propose() == [12, 13, 14]
        assert a.propose() == [12, 13, 14]
        b.extend([12])
        a.extend([12])
        b.end()
        history = drafter.policy_state.history
        assert history.tokens() == [-1, 10, 11, 12, 13, 14, -1, 1, 10, 11]  # B waits for A
        a.end()
        assert history.tokens() == [-1, 10, 11, 12, 13, 14, -1, 1, 10, 11, 12, -1, 2, 10, 11, 12]
        c = drafter.request([3, 10])  # no one owns the history now: C does
        assert c.propose() == [11, 12, 13, 14][: len(c.propose())] and c.propose()
        c.end()

    def test_hybrid_stop_cuts_what_is_observed(self) -> None:
        # A proposal cut by stop ids: the policy counts only the tokens the engine saw, so the
        # acceptance statistics match a proposal asked for with k = the cut length.
        def run(cut: bool) -> Any:
            drafter = self.impl.Drafter(policy="hybrid", n_draft=6)
            with drafter.request([5, 6, 7, 8, 9, 1, 2, 3]):
                pass
            with drafter.request([4, 5, 6]) as req:
                proposal = req.propose(stop={9}) if cut else req.propose(2)
                assert proposal == [7, 8]
                req.extend([7, 0])
            return drafter.policy_state

        cut, short = run(True), run(False)
        assert cut.threshold == short.threshold

    def test_trim_is_a_shorter_proposal(self) -> None:
        # llama.cpp's rule drafts token by token: a proposal of 8 trimmed to n is the proposal
        # of n, and the request's counts and later proposals are those of asking for n.
        text, corpus = demo_tokens()
        static = self.impl.build_static(corpus)

        def run(trimmed: bool) -> tuple[Any, list[list[int]]]:
            drafter = self.impl.Drafter(static=static, n_draft=8)
            sent: list[list[int]] = []
            with drafter.request(text[:1]) as req:
                for i in range(400):
                    n = i % 4  # 0..3 tokens sent
                    if trimmed:
                        full = req.propose()
                        req.trim(n)
                        proposal = full[:n]
                    else:
                        proposal = req.propose(n)
                    sent.append(proposal)
                    pos = len(req.tokens)
                    ok = 0
                    while ok < len(proposal) and text[pos + ok] == proposal[ok]:
                        ok += 1
                    req.extend(text[pos : pos + ok + 1])
                counts = (req.n_drafted, req.n_accept)
            return (counts, drafter.stats), sent

        (short, short_sent), (cut, cut_sent) = run(False), run(True)
        assert sum(map(len, short_sent)) > 50  # the rule drafted
        assert cut_sent == short_sent and cut == short

    def test_trim_bad_use(self) -> None:
        drafter = self.impl.Drafter(n_draft=4)
        req = drafter.request([1, 2, 3, 1, 2, 3, 1, 2])
        proposal = req.propose()
        assert proposal
        with pytest.raises(ValueError, match="n must be >= 0"):
            req.trim(-1)
        req.trim(len(proposal) + 3)  # longer than the proposal: nothing to cut
        assert req.n_drafted == len(proposal)
        req.extend(proposal[:1])
        with pytest.raises(ValueError, match="before extend"):
            req.trim(0)
        req.end()
        with pytest.raises(RequestClosedError):
            req.trim(0)

    def test_rule_tokens_are_llama_cpps_part(self) -> None:
        # In lockstep over the same text (so the same caches), the hybrid proposal's first
        # rule_tokens tokens are llama.cpp's rule's own: never more than the prefix it shares
        # with the llama policy's proposal, none where that drafted nothing.
        text, corpus = demo_tokens()
        static = self.impl.build_static(corpus)
        llama = self.impl.Drafter(static=static, n_draft=6)
        hybrid = self.impl.Drafter(static=static, n_draft=6, policy="hybrid")
        kinds = {"rule": 0, "suffix alone": 0}
        for c in range(3):
            chunk = text[c * N_CTX : (c + 1) * N_CTX]
            with llama.request(chunk[:1]) as lr, hybrid.request(chunk[:1]) as hr:
                while len(hr.tokens) < N_CTX - 8:
                    lp, hp = lr.propose(), hr.propose()
                    assert lr.rule_tokens == len(lp)
                    shared = 0
                    while shared < min(len(lp), len(hp)) and lp[shared] == hp[shared]:
                        shared += 1
                    assert 0 <= hr.rule_tokens <= shared
                    if hr.rule_tokens:
                        kinds["rule"] += 1
                    elif hp:
                        kinds["suffix alone"] += 1
                    pos = len(hr.tokens)
                    ok = 0
                    while ok < len(hp) and chunk[pos + ok] == hp[ok]:
                        ok += 1
                    lr.extend(chunk[pos : pos + ok + 1])  # the same tokens: the caches stay the same
                    hr.extend(chunk[pos : pos + ok + 1])
        assert kinds["rule"] > 10 and kinds["suffix alone"] > 10

    @pytest.mark.parametrize("n", [0, 2])
    def test_hybrid_trim_is_observed_as_a_cut_proposal(self, n: int) -> None:
        # As a cut by stop ids: the policy learns only from the tokens the engine saw, so its
        # state (the threshold, the next proposal) is that of a proposal asked for with k = n;
        # trim(0) ends the step as an empty proposal does.
        def run(trimmed: bool) -> Any:
            drafter = self.impl.Drafter(policy="hybrid", n_draft=6)
            with drafter.request([5, 6, 7, 8, 9, 1, 2, 3]):
                pass
            with drafter.request([4, 5, 6]) as req:
                if trimmed:
                    proposal = req.propose()
                    assert len(proposal) > 2
                    req.trim(n)
                    proposal = proposal[:n]
                else:
                    proposal = req.propose(n)
                req.extend([*proposal[:1], 0])
                drafted = req.n_drafted
                follow = req.propose()
            return drafted, drafter.policy_state.threshold, follow

        assert run(True) == run(False)
        assert run(True)[0] == n


class TestDrafterReference(ReferenceImpl, DrafterTests):
    pass


class TestDrafterFast(FastImpl, DrafterTests):
    pass


def hybrid_script(impl: Any) -> list[list[int]]:
    """Every proposal of a hybrid Drafter over overlapping requests (opened, proposed, extended, ended out of order)."""
    text, corpus = demo_tokens()
    drafter = impl.Drafter(static=impl.build_static(corpus), policy="hybrid", n_draft=8, history_tokens=600)
    proposals: list[list[int]] = []
    open_requests: list[tuple[Any, list[int]]] = []
    for i in range(12):
        chunk = text[i * 150 : i * 150 + 300]
        open_requests.append((drafter.request(chunk[:20]), chunk))
        for step in range(30):
            req, want = open_requests[(i + step) % len(open_requests)]
            proposal = req.propose(stop={want[-1]})
            proposals.append(proposal)
            pos = len(req.tokens)
            n_ok = 0
            while n_ok < len(proposal) and pos + n_ok < len(want) and want[pos + n_ok] == proposal[n_ok]:
                n_ok += 1
            req.extend(want[pos : pos + n_ok + 1])
        if i % 3 == 2:  # end the oldest (it may own the history) or the newest
            open_requests.pop(0 if i % 2 else -1)[0].end()
    for req, _ in open_requests:
        req.end()
    proposals.append([len(drafter.policy_state.history), int(drafter.policy_state.threshold * 1e9)])
    return proposals


def test_hybrid_drafter_fast_equals_reference() -> None:
    """Overlapping requests, stop ids, history evictions: the fast path proposes what the reference model does."""
    expected = hybrid_script(lookupdec.reference)
    assert sum(len(p) for p in expected[:-1]) > 200
    assert hybrid_script(lookupdec.implementation("fast")) == expected


def test_package_drafter_is_the_chosen_implementations() -> None:
    assert lookupdec.Drafter is lookupdec.implementation(lookupdec.IMPLEMENTATION).Drafter
    assert lookupdec.Drafter.primitives.name == lookupdec.IMPLEMENTATION


# --- several processes saving into one file ------------------------------------------------

ROUNDS = 3
WORKERS = 4


def worker_requests(worker: int) -> list[list[int]]:
    """The token sequences worker ``worker`` generates, one per round (distinct per worker)."""
    text, _ = demo_tokens()
    return [text[(worker * ROUNDS + r) * 200 : (worker * ROUNDS + r) * 200 + 150] for r in range(ROUNDS)]


def save_rounds(impl_name: str, path: str, worker: int, barrier: Any) -> None:
    drafter = lookupdec.implementation(impl_name).Drafter(dynamic=path)
    for tokens in worker_requests(worker):
        with drafter.request(tokens[:20]) as req:
            req.extend(tokens[20:])
        barrier.wait()  # every worker saves at the same moment
        drafter.save()


class ConcurrentSaveTests(ImplTests):
    def test_four_processes_lose_no_count(self, tmp_path: Path) -> None:
        path = tmp_path / "shared.bin"
        start = self.impl.NgramCache.from_contents([((1, 2, -1, -1), [(3, 10)])])
        start.save(path)
        expected = self.impl.NgramCache.from_contents(start.contents())
        for worker in range(WORKERS):
            for tokens in worker_requests(worker):
                expected.update(tokens, len(tokens))
        ctx: Any = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
        barrier = ctx.Barrier(WORKERS)
        procs = [
            ctx.Process(target=save_rounds, args=(self.impl.IMPLEMENTATION, os.fspath(path), w, barrier))
            for w in range(WORKERS)
        ]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
        assert [p.exitcode for p in procs] == [0] * WORKERS
        assert self.impl.NgramCache.load(path).contents() == expected.contents()


class TestConcurrentSaveReference(ReferenceImpl, ConcurrentSaveTests):
    pass


class TestConcurrentSaveFast(FastImpl, ConcurrentSaveTests):
    pass


def test_import_lookupdec_pulls_no_engine() -> None:
    import subprocess
    import sys

    code = (
        "import sys, lookupdec\n"
        "d = lookupdec.Drafter()\n"
        "bad = [m for m in ('torch', 'transformers', 'vllm', 'llama_cpp', 'lookupdec.adapters') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
