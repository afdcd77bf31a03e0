"""The fast path's compiled request and vLLM row loop behave exactly like the shared interpreted ones.

``lookupdec.fast.Drafter`` (llama policy) hands out ``lookupdec.fast._request.Request``, the
per-step bookkeeping compiled; the shared lifecycle's ``Request`` over the same fast caches is
the expected behaviour (itself tested against ``replay`` and the reference in test_drafter).
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

from lookupdec import _lifecycle
from lookupdec.adapters.vllm import LookupProposer
from lookupdec.errors import RequestClosedError
from tests.conftest import fast_impl
from tests.fake_vllm import vllm_config
from tests.test_drafter import demo_tokens


def drive_mixed(drafter: Any, make: Any, text: list[int], seed: int) -> list[Any]:
    """Three requests open at once, committing 0-9 tokens a call (some numpy), proposing with varied k and stop."""
    rng = random.Random(seed)
    seen: list[Any] = []
    starts = [0, 700, 1400]
    reqs = [make(drafter, text[s : s + 1 + rng.randrange(40)]) for s in starts]
    for _ in range(300):
        i = rng.randrange(len(reqs))
        req = reqs[i]
        k = rng.choice([None, 0, 3, 8, 12])
        stop = rng.choice([(), (13,), set(text[:50])])
        proposal = req.propose(k, stop)
        pos = starts[i] + len(req.tokens)
        # The "model": the true text, with an occasional wrong token, in 1 or 2 calls.
        new = text[pos : pos + rng.randrange(10)]
        if new and rng.random() < 0.2:
            new[-1] = (new[-1] + 1) % 128_000
        cut = rng.randrange(len(new) + 1)
        req.extend(new[:cut])
        req.extend(np.array(new[cut:], dtype=np.int32) if rng.random() < 0.3 else new[cut:])
        seen.append((i, proposal, req.n_drafted, req.n_accept, len(req.tokens)))
    for req in reqs:
        req.end()
    seen.append(drafter.stats)
    return seen


@pytest.mark.parametrize("static", [False, True])
def test_compiled_request_matches_the_shared_lifecycle(static: bool) -> None:
    fast = fast_impl()
    text, corpus = demo_tokens()
    st = fast.build_static(corpus) if static else None
    compiled = fast.Drafter(static=st, n_draft=6)
    shared = fast.Drafter(static=st, n_draft=6)
    assert type(fast.Drafter().request()).__module__ == "lookupdec.fast._request"
    for seed in range(3):
        got = drive_mixed(compiled, lambda d, p: d.request(p), text, seed)
        expected = drive_mixed(shared, _lifecycle.Request, text, seed)
        assert got == expected
    assert compiled.dynamic.contents() == shared.dynamic.contents()
    assert compiled.open_requests == shared.open_requests == 0


def test_compiled_request_follows_the_drafter() -> None:
    """n_draft and the dynamic cache are the Drafter's at each step (save() may replace the cache)."""
    fast = fast_impl()
    drafter = fast.Drafter(n_draft=4)
    with drafter.request([1, 2, 3, 1, 2, 3]) as req:
        assert req.propose() == [1, 2, 3, 1]
        drafter.n_draft = 2
        assert req.propose() == [1, 2]
        assert repr(req) == "<Request open tokens=6 drafted=6 accepted=0>"
    assert req.closed
    with pytest.raises(RequestClosedError, match="extend"):
        req.extend([1])
    other = fast.Drafter(n_draft=4)
    for _ in range(3):
        other.request([5, 6, 7, 8, 5, 6, 7, 8]).end()  # its dynamic cache now knows 5 6 -> 7 -> 8
    drafter._host.dynamic = other.dynamic
    expected = _lifecycle.Request(drafter, [9, 5, 6]).propose()
    assert expected  # drafted from the new dynamic cache
    with drafter.request([9, 5, 6]) as req:
        assert req.propose() == expected
    assert drafter.stats == _lifecycle.DrafterStats(
        requests=3, proposals=4, n_drafted=6 + 2 * len(expected), n_accept=0
    )


def test_row_loop_takes_numpy_counts_and_refuses_mismatched_rows() -> None:
    fast = fast_impl()
    proposer = LookupProposer(vllm_config(4, 64), drafter=fast.Drafter(n_draft=4))
    ids = np.zeros((2, 64), dtype=np.int32)
    ids[0, :7] = [1, 2, 3, 1, 2, 3, 1]
    ids[1, :3] = [4, 5, 6]
    counts = [np.int32(7), np.int64(3)]
    assert proposer.propose([[1], []], counts, ids) == [[2, 3, 1, 2], []]
    with pytest.raises(ValueError, match="num_tokens_no_spec has 1 rows, sampled_token_ids 2"):
        proposer.propose([[1], []], [7], ids)
    with pytest.raises(ValueError, match="more than token_ids' 64 columns"):
        proposer.propose([[1]], [70], ids)
