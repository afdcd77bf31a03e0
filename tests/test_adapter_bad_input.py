"""Bad values given to the engine adapters and the token-file readers: clear errors, not silent drafts.

Each case was found by a hunt for bad input (2026-12-07): before its fix it was accepted and
drafted wrongly (a nan threshold, a negative row count), failed deep inside (IndexError, mypyc's
"int too large to convert to i64"), or blocked for ever (a fifo read as a token file).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import lookupdec
from lookupdec.adapters import BatchCost, DraftLength, HistoryFollower, IsolatedDrafter, set_threshold
from lookupdec.adapters.vllm import LookupProposer, save_interval_from_env
from lookupdec.errors import TokenFileError
from lookupdec.tokens import check_token_ids, exact_tokenizer, load_tokens, read_tokens, vocab_info
from tests.fake_vllm import vllm_config
from tests.test_tokenizer import gguf, needs_vocab

IMPLS = ["reference", "fast"]


@pytest.mark.parametrize("impl", IMPLS)
def test_a_threshold_must_be_a_number_in_0_1(impl: str) -> None:
    m = lookupdec.implementation(impl)
    for target in (
        m.Drafter(policy="hybrid"),
        IsolatedDrafter(policy="hybrid", drafter_class=lookupdec.implementation(impl).Drafter),
    ):
        for bad in (math.nan, math.inf, -1.0, 7.0):
            with pytest.raises(ValueError, match="threshold must be in"):
                set_threshold(target, bad)
        with pytest.raises(TypeError, match="threshold must be a number"):
            set_threshold(target, "x")  # type: ignore[arg-type]
        set_threshold(target, 0.25)
    assert IsolatedDrafter(policy="hybrid", drafter_class=lookupdec.implementation(impl).Drafter).threshold is None
    with pytest.raises(ValueError, match="hybrid policy's"):
        set_threshold(m.Drafter(policy="llama"), 0.5)  # was an AttributeError on None


@pytest.mark.parametrize("impl", IMPLS)
def test_isolated_n_draft_and_history_bounds(impl: str) -> None:
    isolated = IsolatedDrafter(policy="hybrid", drafter_class=lookupdec.implementation(impl).Drafter)
    with pytest.raises(ValueError, match="n_draft"):
        isolated.n_draft = 10**6  # taken, and every later request failed
    with pytest.raises(TypeError):
        isolated.n_draft = 2.5  # type: ignore[assignment]
    isolated.n_draft = 4
    with isolated.request([1, 2, 3]) as req:
        assert req.propose() == []
    m = lookupdec.implementation(impl)
    with pytest.raises(ValueError, match="history_tokens must be <= 2\\^62"):
        m.Drafter(policy="hybrid", history_tokens=2**63)


def rows(n: int = 64) -> Any:
    ids = np.zeros((2, n), dtype=np.int32)
    ids[0, :6] = [1, 2, 3, 1, 2, 3]
    return ids


def test_vllm_step_arrays_that_do_not_fit_are_refused() -> None:
    proposer = LookupProposer(vllm_config(4, 64), drafter=lookupdec.Drafter(n_draft=4))
    for counts, ids, match in (
        ([-3, 0], rows(), "row 0: num_tokens_no_spec is -3, not a token count in 0..64"),  # drafted from a slice
        ([100, 0], rows(), "row 0: num_tokens_no_spec is 100, not a token count in 0..64"),
        ([6], rows()[0], "2-D array"),  # was an IndexError
        ([6, 0], rows().astype(np.float32), "integer token ids"),  # was mypyc's "int object expected"
    ):
        with pytest.raises(ValueError, match=match):
            proposer.propose([[3]], np.array(counts), ids)
    with pytest.raises(ValueError, match="3 rows of sampled_token_ids, but token_ids_cpu has 2"):
        proposer.propose([[3], [3], [3]], np.array([6, 6, 6]), rows())
    assert proposer.propose([[3]], np.array([6, 0]), rows()) == [[1, 2, 3, 1]]  # the same proposer still works
    proposer.close()
    with pytest.raises(ValueError, match="after close"):  # accepted, and its request never saved
        proposer.propose([[3]], np.array([6, 0]), rows())


@pytest.mark.parametrize(
    ("k", "length", "match"),
    [
        (-1, 64, "num_speculative_tokens must be in 0..65536"),
        ("x", 64, "num_speculative_tokens must be an integer"),
        (4, 2**63, "max_model_len must be in 1.."),  # was "int too large to convert to i64" at the first step
    ],
)
def test_vllm_config_values_are_checked(k: Any, length: int, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        LookupProposer(vllm_config(k, length), drafter=lookupdec.Drafter(n_draft=4))


def test_save_interval_nan_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOOKUPDEC_SAVE_INTERVAL", "nan")  # no interval ever passed: never saved while serving
    with pytest.raises(ValueError, match="LOOKUPDEC_SAVE_INTERVAL must be >= 0"):
        save_interval_from_env()


def test_draft_length_and_batch_cost_values() -> None:
    with pytest.raises(TypeError):
        DraftLength(4.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="margin"):
        DraftLength(4, margin=math.nan)  # no draft ever paid
    ctl = DraftLength(4)
    ctl.observe_step(1, math.nan)  # ignored: it stayed in the average for good
    ctl.observe_step(2, math.inf)
    assert all(math.isfinite(c) for c in ctl.costs())
    with pytest.raises(ValueError, match="source"):
        ctl.acceptance(7)  # an IndexError; -1 read the SUFFIX table
    with pytest.raises(ValueError, match="source"):
        ctl.acceptance(-1)
    for decay in (2.0, -1.0, 0.0):
        with pytest.raises(ValueError, match="decay"):
            BatchCost(decay=decay)
    BatchCost(decay=1.0)  # no decay: plain sums
    drafter = lookupdec.Drafter()
    with pytest.raises(TypeError, match="adaptive must be a DraftLength"):
        HistoryFollower(drafter, adaptive=True)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="vocab_size"):
        HistoryFollower(drafter, vocab_size=0)


def test_llama_cpp_generate_max_tokens() -> None:
    from lookupdec.adapters.llama_cpp import LookupDraftModel
    from tests.test_adapter_llama_cpp import PROMPT, FakeLlama

    draft_model = LookupDraftModel(lookupdec.Drafter(n_draft=5))
    llm = FakeLlama(draft_model)
    with pytest.raises(TypeError, match="max_tokens must be an int"):
        next(draft_model.generate(llm, PROMPT, max_tokens=2.5))  # type: ignore[arg-type]
    # 0 or less: to the context's end, as llama-cpp-python's create_completion reads it
    everything = list(draft_model.generate(llm, PROMPT))
    assert list(draft_model.generate(llm, PROMPT, max_tokens=0)) == everything
    assert list(draft_model.generate(llm, PROMPT, max_tokens=-1)) == everything
    assert list(draft_model.generate(llm, PROMPT, max_tokens=3)) == everything[:3]
    # an empty prompt: llama-cpp-python's bare AssertionError, and a request counted for it
    requests = draft_model.follower.drafter.stats.requests
    with pytest.raises(ValueError, match="at least one token"):
        next(draft_model.generate(llm, []))
    assert draft_model.follower.drafter.stats.requests == requests


def test_token_readers_refuse_what_is_not_a_regular_file(tmp_path: Path) -> None:
    fifo = tmp_path / "ids.bin"
    os.mkfifo(fifo)
    calls: list[Callable[[], object]] = [
        lambda: read_tokens(fifo),  # blocked for ever
        lambda: read_tokens("/dev/zero"),  # silently []
        lambda: load_tokens("/dev/zero", tokens=True),
        lambda: load_tokens(tmp_path / "x.bin", tokenizer=fifo),
        lambda: vocab_info(fifo),  # blocked for ever: is_gguf opened it after load_tokenizer refused it
        lambda: exact_tokenizer("/dev/zero"),  # None: Hugging Face's reader was then given /dev/zero
    ]
    for call in calls:
        with pytest.raises(TokenFileError, match="not a regular file"):
            call()


@needs_vocab
def test_token_text_that_is_a_device_is_refused() -> None:
    with pytest.raises(TokenFileError, match="/dev/zero: is a character device"):
        load_tokens("/dev/zero", tokenizer=gguf("llama-spm"))  # silently [BOS]


def test_npy_headers_and_shapes(tmp_path: Path) -> None:
    good = tmp_path / "good.npy"
    np.save(good, np.array([1, 2, 3, 4], dtype=np.int32))
    data = good.read_bytes()
    negative = tmp_path / "negative.npy"
    negative.write_bytes(data.replace(b"(4,)", b"(-1,)"))  # read every byte after the header as ids
    with pytest.raises(TokenFileError, match="shape"):
        read_tokens(negative)
    unbalanced = tmp_path / "unbalanced.npy"
    unbalanced.write_bytes(data.replace(b"(4,)", b"(3, "))  # tokenize.TokenError leaked
    with pytest.raises(TokenFileError, match=r"not a valid \.npy file"):
        read_tokens(unbalanced)
    with pytest.raises(TokenFileError, match="one-dimensional"):
        check_token_ids("x", np.zeros((2, 2), dtype=np.int32))  # an IndexError
    assert read_tokens(os.fsencode(good)).tolist() == [1, 2, 3, 4]  # type: ignore[arg-type]  # a bytes path


def test_history_follower_checks_the_history_it_is_given() -> None:
    import numpy as np

    from lookupdec.errors import VocabularyError

    history = [1, 2, 3, 1, 2, 3, 1, 2]
    follower = HistoryFollower(lookupdec.Drafter(n_draft=4), vocab_size=10)
    assert follower.propose(history, 4) == [3, 1, 2, 3]
    # an id past the model's vocabulary in the history: it was drafted back, and the caches blamed
    with pytest.raises(VocabularyError, match="history token 9 is 12: not an id of the model's vocabulary of 10"):
        follower.propose([*history, 3, 12], 4)
    with pytest.raises(VocabularyError, match="history token 0 is 11"):
        follower.propose([11, 2], 4)  # a new generation: refused before the open request ends
    assert follower.request is not None and not follower.request.closed
    assert follower.propose([*history, 3, 1], 4, None) == [2, 3, 1, 2]  # stop=None: no stop ids
    with pytest.raises(ValueError, match="one sequence of token ids"):
        rows = np.array([history])  # a batch of rows
        HistoryFollower(lookupdec.Drafter(n_draft=4)).propose(rows, 4)  # type: ignore[arg-type]
