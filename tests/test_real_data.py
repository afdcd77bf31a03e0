"""The issue's acceptance numbers on real text (shared/data), for every implementation.

Expected values are what llama.cpp's own C++ reports under the smallest-id tie rule
(issue 2, "Done when"; spec 15): WikiText-103 test replayed with n_ctx 4096, n_draft 8.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tests.conftest import SHARED_DATA
from tests.impls import FastImpl, ImplTests, ReferenceImpl

REPLAY = SHARED_DATA / "wiki.test.raw.llama3.bin"
CORPUS = SHARED_DATA / "enwiki_wt.10M.llama3.bin"

pytestmark = pytest.mark.skipif(not REPLAY.exists(), reason=f"real data not present at {SHARED_DATA}")


def tokens(path: Any) -> list[int]:
    return list(np.fromfile(path, dtype="<i4").tolist())


class RealDataTests(ImplTests):
    # Each replay also checks tokens per verification step against issue 13's table (llama.cpp's
    # rule: 1.164 without a static cache, 1.204 with enwiki_wt.10M's). The table gives three
    # decimals cut, not rounded (48,672 accepted over 237,994 steps is 1.20451), so the check
    # allows the last digit; one replay per case keeps the reference's slow run to two replays.
    def check_steps(self, result: Any, tokens_per_step: float) -> None:
        assert abs(result.tokens_per_step - tokens_per_step) < 1e-3
        # 70 chunks of 4095 generated tokens: one step per sampled token (+1 per chunk ending on a draft)
        assert 0 <= result.n_steps - (70 * 4095 - result.n_accept) <= 70

    def test_wikitext_no_static(self) -> None:
        result = self.impl.replay(tokens(REPLAY), 4096, 8)
        assert (result.n_drafted, result.n_accept) == (265417, 40442)
        self.check_steps(result, 1.164)

    def test_wikitext_static_enwiki_10m(self) -> None:
        static = self.impl.build_static(tokens(CORPUS))
        result = self.impl.replay(tokens(REPLAY), 4096, 8, static)
        assert (result.n_drafted, result.n_accept) == (295500, 48672)
        self.check_steps(result, 1.204)


@pytest.mark.slow  # the reference's full replays take minutes; the fast path's run by default
class TestRealDataReference(ReferenceImpl, RealDataTests):
    pass


class TestRealDataFast(FastImpl, RealDataTests):
    pass


@pytest.mark.slow
def test_wikitext_hybrid_fast_equals_reference() -> None:
    """The full WikiText replay with the hybrid policy: the fast path's counts are the reference model's."""
    import lookupdec.reference as ref
    from tests.conftest import fast_impl

    fast = fast_impl()
    corpus = tokens(CORPUS)
    results = [
        impl.replay(tokens(REPLAY), 4096, 8, impl.build_static(corpus), None, None, "hybrid") for impl in (fast, ref)
    ]
    assert results[0].n_steps == results[1].n_steps
    assert (results[0].n_drafted, results[0].n_accept) == (results[1].n_drafted, results[1].n_accept)
    # and it gains over llama.cpp's rule (1.204 tokens per step, the table) within the waste budget
    assert results[0].tokens_per_step > 1.204
    assert results[0].wasted_per_step <= 2.0


# Slow: three full WikiText replays with an index built from 2.2M tokens (about 17 s of CPU);
# the default run keeps the in-memory replay of the same counts (TestRealDataFast) and the
# mapped paths on small indexes (test_hardening, test_mapbytes).
@pytest.mark.slow
@pytest.mark.parametrize("mode", ["mapped", "mapped-slices", "loaded"])
def test_wikitext_enwiki_10m_index_file(tmp_path: Any, monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    """The same counts from the ``enwiki_wt.10M`` index file in each way the fast path opens it:
    mapped as bytes (the default), mapped through mmap slices (where that is unavailable), loaded."""
    from tests.conftest import fast_impl

    fast = fast_impl()
    path = tmp_path / "enwiki.lkdc"
    fast.StaticIndex.from_cache(fast.build_static(tokens(CORPUS))).save(path)
    monkeypatch.setenv("LOOKUPDEC_MAPPED_BYTES", "0" if mode == "mapped-slices" else "1")
    with fast.load_static(path, in_memory=mode == "loaded") as static:
        if mode == "mapped-slices":
            assert not static._direct
        result = fast.replay(tokens(REPLAY), 4096, 8, static)
    assert (result.n_drafted, result.n_accept) == (295500, 48672)
