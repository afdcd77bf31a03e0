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
    def test_wikitext_no_static(self) -> None:
        result = self.impl.replay(tokens(REPLAY), 4096, 8)
        assert (result.n_drafted, result.n_accept) == (265417, 40442)

    def test_wikitext_static_enwiki_10m(self) -> None:
        static = self.impl.build_static(tokens(CORPUS))
        result = self.impl.replay(tokens(REPLAY), 4096, 8, static)
        assert (result.n_drafted, result.n_accept) == (295500, 48672)


@pytest.mark.slow  # the reference's full replays take minutes; the fast path's run by default
class TestRealDataReference(ReferenceImpl, RealDataTests):
    pass


class TestRealDataFast(FastImpl, RealDataTests):
    pass
