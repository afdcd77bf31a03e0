"""perf speedup's arithmetic: tokens per second, speedup, tokens per step, the predicted speedup."""

from __future__ import annotations

import shutil
import sys
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from perf.length_replay import REPO
from perf.speedup import TICKS_FLAT, Run, summarize, tick_labels
from tests.conftest import torch_with_transformers


def test_rows_from_runs() -> None:
    runs = [
        # plain: 101 tokens (the prefill's first + 100 decoded) in 100 steps of 10 ms
        Run("none", "w", 4, new_tokens=101, steps=100, seconds=1.0),
        # drafted: 101 tokens in 40 steps (2.5 per step), 60 drafted tokens (1.5 per step), 0.5 s
        Run("hybrid", "w", 4, new_tokens=101, steps=40, drafted=60, seconds=0.5, draft_seconds=0.004),
    ]
    curve = [0.010, 0.012, 0.014, 0.016, 0.018]  # forward seconds for 1..5 new tokens
    rows = {r["drafter"]: r for r in summarize(runs, {"*": curve})}
    assert rows["none"]["tokens_per_s"] == pytest.approx(100.0)
    assert rows["none"]["speedup"] == pytest.approx(1.0)
    h = rows["hybrid"]
    assert h["tokens_per_s"] == pytest.approx(200.0) and h["speedup"] == pytest.approx(2.0)
    assert h["tokens_per_step"] == pytest.approx(2.5) and h["drafted_per_step"] == pytest.approx(1.5)
    assert h["draft_us_per_step"] == pytest.approx(100.0) and h["draft_share"] == pytest.approx(0.008)
    # predicted: 2.5 tokens per step * T(1) / (T(2.5 tokens verified) + drafting per step)
    t_verify = (0.012 + 0.014) / 2
    assert h["predicted_speedup"] == pytest.approx(2.5 * 0.010 / (t_verify + 0.0001))
    assert rows["none"]["predicted_speedup"] == pytest.approx(1.0)


def test_edit_windows_sample_every_part_of_the_outputs() -> None:
    from perf.grounded_data import Pair
    from perf.speedup import EDITS_MAX_PROMPT, edit_windows

    def pair(n_prompt: int, n_output: int, base: int) -> Pair:
        return Pair("code", "p", f"f{base}", "1", "2", list(range(n_prompt)), list(range(base, base + n_output)))

    pairs = [pair(10, 100, 1000), pair(EDITS_MAX_PROMPT + 1, 100, 2000), pair(10, 30, 3000), pair(20, 200, 4000)]
    w = edit_windows(pairs, 2, 16)
    assert w.name == "edits" and w.truth is not None
    # the long prompt and the short output are left out; the windows sit at 1/4 and 3/4 of what is left
    assert [len(t) for t in w.truth] == [16, 16]
    assert w.truth[0][0] == 1000 + 21  # (100 - 16) / 4
    assert w.truth[1][0] == 4000 + 138  # (200 - 16) * 3 / 4
    # each prompt is the pair's prompt and the output before its window: the text is continuous
    for prompt, truth, p in zip(w.prompts, w.truth, (pairs[0], pairs[3]), strict=True):
        start = truth[0] - p.output[0]
        assert prompt == p.prompt + p.output[:start]
        assert truth == p.output[start : start + 16]
    with pytest.raises(ValueError, match="no edit pair"):
        edit_windows(pairs[1:3], 2, 16)


class _RecordingLlama:
    """llama-cpp-python's ``Llama.tokenize``, recording what it was asked (one id per byte)."""

    def __init__(self) -> None:
        self.calls: list[tuple[bytes, bool, bool]] = []

    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = False) -> list[int]:
        self.calls.append((text, add_bos, special))
        return list(text)


def test_more_prompts_are_the_four_tasks_on_other_material() -> None:
    from perf._common import data_dir
    from perf.speedup import TASK_SETS, some_task_prompts, task_prompts

    if not (data_dir() / "wiki.test.raw").is_file():
        # the wheel check copies tests/ and perf/ out of the checkout, away from ../shared
        pytest.skip(f"WikiText's raw text is not at {data_dir()} (set LOOKUPDEC_DATA)")
    prompts = task_prompts(TASK_SETS)
    assert len(prompts) == 4 * TASK_SETS
    names = [name for name, _, _ in prompts]
    assert names[:4] == ["rename", "summarize", "answer", "continue"] and names[4:6] == ["rename-2", "summarize-2"]
    assert len({text for _, text, _ in prompts}) == len(prompts)  # no request can copy another's prompt
    assert task_prompts(1) == prompts[:4]  # the first set is the four prompts of every earlier table
    for name, text, _ in prompts:
        assert 500 < len(text) < 2000, name
    for bad in (0, TASK_SETS + 1):
        with pytest.raises(ValueError, match="sets must be in"):
            task_prompts(bad)
    assert some_task_prompts(6) == prompts[:6] and some_task_prompts(4 * TASK_SETS) == prompts
    for bad in (0, 4 * TASK_SETS + 1):
        with pytest.raises(ValueError, match="task prompts number"):
            some_task_prompts(bad)


def test_task_prompts_take_the_chat_template_only_for_an_instruct_model() -> None:
    from perf._common import data_dir
    from perf.speedup import llama_cpp_task_prompts, task_prompts

    if not (data_dir() / "wiki.test.raw").is_file():
        # the wheel check copies tests/ and perf/ out of the checkout, away from ../shared
        pytest.skip(f"WikiText's raw text is not at {data_dir()} (set LOOKUPDEC_DATA)")

    texts = task_prompts()
    chat = _RecordingLlama()
    llama_cpp_task_prompts(chat, instruct=True)
    base = _RecordingLlama()
    llama_cpp_task_prompts(base, instruct=False)
    assert len(chat.calls) == len(base.calls) == len(texts)
    for (name, text, is_chat), (c_text, c_bos, c_special), (b_text, b_bos, b_special) in zip(
        texts, chat.calls, base.calls, strict=True
    ):
        assert b_text == text.encode(), name  # a base model reads the task's text as it is
        assert (b_bos, b_special) == (True, False), name  # after BOS, special tokens not parsed
        assert (c_bos, c_special) == (False, True), name  # the template carries the special tokens
        assert (c_text != text.encode()) == is_chat, name
        if is_chat:
            assert c_text.startswith(b"<|im_start|>user\n") and text.encode() in c_text


@pytest.mark.parametrize(
    ("engine", "model", "message"),
    [
        ("llama-cpp", "0.5b", "--engine llama-cpp runs --model smollm2 or gemma3"),
        ("transformers", "gemma3", "runs in --engine llama-cpp"),
    ],
)
def test_a_model_its_engine_cannot_run_is_refused(
    engine: str, model: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from perf.speedup import main

    with pytest.raises(SystemExit) as e:
        main(["--engine", engine, "--model", model])
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_a_baseline_runs_beside_each_adaptive_drafter() -> None:
    import argparse

    from perf.speedup import _drafter_names

    args = argparse.Namespace(drafters="none,llama,hybrid+static,hybrid/fixed", baseline="HEAD~1")
    names = _drafter_names(args, "hf-pld")
    assert names == ["none", "llama", "llama@HEAD~1", "hybrid+static", "hybrid+static@HEAD~1", "hybrid/fixed"]


@pytest.mark.skipif(
    shutil.which("git") is None or not (REPO / ".git").exists(), reason="needs the project's git checkout"
)
def test_a_baseline_controller_is_the_revisions() -> None:
    from lookupdec.adapters import DraftLength
    from perf.speedup import controller

    controllers: dict[tuple[str, int], Any] = {}
    old = controller(controllers, "hybrid@HEAD", 4)
    assert type(old).__name__ == "DraftLength@HEAD" and isinstance(old, DraftLength)
    assert controller(controllers, "hybrid@HEAD", 4) is old  # kept across generations
    assert type(controller(controllers, "hybrid", 4)) is DraftLength
    assert controller(controllers, "hybrid/fixed", 4) is False


def test_a_burst_loads_every_core_for_its_seconds(capsys: pytest.CaptureFixture[str]) -> None:
    import os
    import time

    from perf.speedup import load_burst, main

    procs = load_burst(0.0, 0.3)
    assert len(procs) == (os.cpu_count() or 1) and all(p.is_alive() for p in procs)
    deadline = time.time() + 10
    for p in procs:
        p.join(max(0.0, deadline - time.time()))
    assert not any(p.is_alive() for p in procs)  # they end by themselves
    assert load_burst(5.0, 0.0) == []
    with pytest.raises(SystemExit):
        main(["--burst", "5"])
    assert "START,SECONDS" in capsys.readouterr().err


class _FakeSuffixCache:
    """Stands in for Arctic Inference's SuffixDecodingCache: logs the calls and drafts what followed
    the previous occurrence of the context's last token in the request (prompt and response)."""

    max_tree_depth = 6

    def __init__(self) -> None:
        self.log: list[tuple[Any, ...]] = []
        self.seq: list[int] = []

    def start_request(self, req: int, prompt: Any) -> None:
        assert prompt.dtype == np.int32  # the extension takes int32 arrays
        self.log.append(("start", req, prompt.tolist()))
        self.seq = prompt.tolist()

    def add_active_response(self, req: int, tokens: list[int]) -> None:
        self.log.append(("add", req, list(tokens)))
        self.seq += tokens

    def speculate(self, req: int, context: Any, max_spec_tokens: int, **options: Any) -> Any:
        self.log.append(("speculate", req, context.tolist(), max_spec_tokens, options))
        last = context[-1]
        at = max((i for i in range(len(self.seq) - 1) if self.seq[i] == last), default=None)
        ids = [] if at is None else self.seq[at + 1 : at + 1 + max_spec_tokens]
        return SimpleNamespace(token_ids=ids)

    def stop_request(self, req: int) -> None:
        self.log.append(("stop", req))


@pytest.fixture
def fake_suffix(monkeypatch: pytest.MonkeyPatch) -> list[_FakeSuffixCache]:
    """SuffixDecoding's extension replaced by :class:`_FakeSuffixCache`: the caches made, in order."""
    caches: list[_FakeSuffixCache] = []

    def make() -> _FakeSuffixCache:
        caches.append(_FakeSuffixCache())
        return caches[-1]

    monkeypatch.setitem(sys.modules, "arctic_inference.suffix_decoding", SimpleNamespace(SuffixDecodingCache=make))
    return caches


class _FakeVerifier:
    """decode's verifier without a model: it only counts the tokens it holds."""

    def __init__(self) -> None:
        self.length = 0

    def forward(self, tokens: list[int], keep: int | None = None) -> Any:
        self.length += len(tokens)
        return np.zeros((len(tokens), 1))

    def rollback(self, n: int) -> None:
        self.length -= n


def test_suffix_decoding_is_fed_the_generation_as_the_peer_replay_feeds_it(fake_suffix: list[_FakeSuffixCache]) -> None:
    """The prompt starts the request; the committed tokens join its response before each
    speculation; the context is the last max_tree_depth tokens; the budget is the draft limit."""
    torch_with_transformers()  # decode's module wants both (the wheel check's venv has neither)
    from lookupdec.adapters.transformers import decode
    from perf.speedup import SuffixProposer

    prompt = [5, 1, 2, 3, 4, 9, 1, 2]
    truth = [3, 4, 7, 1, 2, 3, 8, 8, 1, 2, 3, 4]
    propose = SuffixProposer(len(prompt), len(prompt) + len(truth), 3, max_spec_factor=4.0)

    def choose(logits: Any, tokens: Any, start: int) -> list[int]:
        return truth[start - len(prompt) : start - len(prompt) + logits.shape[0]]

    verifier: Any = _FakeVerifier()  # duck-typed: decode only calls forward, rollback and length
    out = decode(verifier, prompt, propose, k=3, max_new_tokens=len(truth), choose=choose)
    propose.end()
    assert out == truth
    log = fake_suffix[0].log
    assert log[0] == ("start", 1, prompt) and log[-1] == ("stop", 1)
    added = [t for e in log if e[0] == "add" for t in e[2]]
    speculations = [e for e in log if e[0] == "speculate"]
    assert len(speculations) >= 3  # drafts were accepted: fewer steps than tokens
    assert all(e[4] == {"max_spec_factor": 4.0} and 1 <= e[3] <= 3 for e in speculations)
    seen = list(prompt)
    for e in log[1:-1]:
        if e[0] == "add":
            seen += e[2]
        else:  # the context ends at the last committed token, max_tree_depth long
            assert e[2] == seen[-_FakeSuffixCache.max_tree_depth :]
    assert added == truth[: len(added)] and len(added) >= len(truth) - 3


def test_suffix_decoding_left_out_by_default_and_refused_when_asked_where_missing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import argparse

    from perf.speedup import _drafter_names

    monkeypatch.setitem(sys.modules, "arctic_inference.suffix_decoding", None)  # import fails
    names = _drafter_names(argparse.Namespace(drafters=None, baseline=None), "hf-pld")
    assert "hf-pld" in names and "hybrid" in names and not {"suffix", "suffix4"} & set(names)
    assert "skipping suffix, suffix4" in capsys.readouterr().err
    with pytest.raises(ImportError, match=r"perf/README\.md"):
        _drafter_names(argparse.Namespace(drafters="none,suffix", baseline=None), "hf-pld")
    # llama-cpp-python's engine runs it too (as a draft model), and refuses it the same way
    names = _drafter_names(argparse.Namespace(drafters=None, baseline=None), "lcp-pld")
    assert "lcp-pld" in names and not {"suffix", "suffix4"} & set(names)
    with pytest.raises(ImportError, match=r"perf/README\.md"):
        _drafter_names(argparse.Namespace(drafters="suffix4", baseline=None), "lcp-pld")
    with pytest.raises(SystemExit, match="unknown drafter"):
        _drafter_names(argparse.Namespace(drafters="suffix8", baseline=None), "lcp-pld")


def test_suffix_decoding_as_a_llama_cpp_draft_model(fake_suffix: list[_FakeSuffixCache]) -> None:
    """llama-cpp-python calls a draft model with the committed history as a numpy array (the
    prompt and the first sampled token at the first call); the prompt starts the request, the
    tokens after it join the response, every call asks for k, the draft comes back as intc."""
    from perf.speedup import SuffixDraftModel

    prompt = [5, 1, 2, 3, 4, 9, 1, 2]
    dm = SuffixDraftModel(len(prompt), len(prompt) + 8, 3)
    first = dm(np.array([*prompt, 3], dtype=np.intc))
    assert first.dtype == np.intc and first.tolist() == [4, 9, 1]  # what followed the 3 in the prompt
    second = dm(np.array([*prompt, 3, 4, 9, 7], dtype=np.intc))  # 4, 9 accepted, 7 the model's own
    assert second.tolist() == []  # 7 never occurred before
    dm.end([*prompt, 3, 4, 9, 7])
    log = fake_suffix[0].log
    assert log[0] == ("start", 1, prompt) and log[-1] == ("stop", 1)
    assert [e[2] for e in log if e[0] == "add"] == [[3], [4, 9, 7]]
    assert [e[3] for e in log if e[0] == "speculate"] == [3, 3]


def _warm_text() -> tuple[list[int], list[int], list[int]]:
    """A text of distinct-looking ids with two passages: ``before`` occurs early (three times, after
    the same two tokens), ``after`` only late."""
    rng = np.random.default_rng(7)
    text = rng.integers(1000, 60000, size=12_000).tolist()
    before = list(range(100, 140))
    after = list(range(200, 240))
    for at in (2000, 3000, 4000):  # three times: llama.cpp's rule drafts from its dynamic cache only then
        text[at - 2 : at + 40] = text[1998:2000] + before
    text[11_000:11_040] = after
    return text, before, after


def test_warm_drafters_are_fed_the_text_before_each_window_and_never_the_window() -> None:
    """A ``/warm`` drafter has the text before a window in its history (it drafts a passage that
    repeats from there), a fresh one has not, and neither has the text after the window."""
    from perf.speedup import WARM_CHUNK, _windows, feed, lookupdec_drafter, warm_drafter

    text, before, after = _warm_text()
    w = _windows(text, 2, 64, 40, "text")
    assert w.source == text and len(w.starts) == 2
    s = w.starts[1]
    # the second window continues with `before`, which occurred from 2000 on; `after` comes at 11000
    text[s + 62 : s + 64 + 40] = text[1998:2000] + before  # the prompt ends as the text did before it
    marker = list(range(300, 320))  # only in the window's prompt: a drafter fed past the window knows it
    text[s + 10 : s + 30] = marker
    w = _windows(text, 2, 64, 40, "text")
    assert w.truth is not None and w.truth[1] == before and w.prompts[1][-2:] == text[1998:2000]
    for name in ("hybrid", "llama"):
        kept = warm_drafter(name, None, 8, 104)
        feed(kept, text, w.starts[0], 8)  # nothing before the first window
        assert kept.fed_tokens == 0 and kept.pos == 0
        kept.pos = w.starts[0] + 104  # the first window's generation joins it (here: not run)
        feed(kept, text, s, 8)
        chunks = -(-(s - 104) // WARM_CHUNK)
        assert kept.pos == s and kept.fed_tokens == s - 104 - chunks  # each chunk's first token is given
        with kept.drafter.request(marker[:3]) as req:  # nor the window's own prompt, before its turn
            assert not set(req.propose()) & set(marker[3:]), name
        with kept.drafter.request(w.prompts[1]) as req:
            warm = req.propose()
        with lookupdec_drafter(name, None, 8).request(w.prompts[1]) as req:
            fresh = req.propose()
        assert warm[:4] == before[:4], (name, warm)
        assert fresh[:1] != before[:1], (name, fresh)
        # and it never had the text from the window on: `after` (at 11000) is unknown to it
        with kept.drafter.request(text[10_900:11_000]) as req:
            assert not set(req.propose()) & set(after), name
        feed(kept, text, s - 500, 8)  # never back
        assert kept.pos == s


def test_warm_suffix_decoding_keeps_one_cache_across_generations(fake_suffix: list[_FakeSuffixCache]) -> None:
    from perf.speedup import SuffixProposer, feed, warm_drafter

    text, _, _ = _warm_text()
    kept = warm_drafter("suffix4", None, 4, 64)
    feed(kept, text, 5000, 4)
    for prompt in ([1, 2, 3], [4, 5, 6]):
        propose = SuffixProposer(len(prompt), 64, 4, kept.drafter, max_spec_factor=4.0)
        propose([*prompt, 7], 4)
        propose.end()
    assert len(fake_suffix) == 1  # one cache: the feed's requests and both generations
    starts = [e for e in fake_suffix[0].log if e[0] == "start"]
    assert len(starts) == 2 + 2 and starts[-1][2] == [4, 5, 6]
    speculations = [e for e in fake_suffix[0].log if e[0] == "speculate"]
    assert speculations[-1][4] == {"max_spec_factor": 4.0}


def test_warm_drafters_only_when_asked_and_never_on_the_edit_pairs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import argparse

    from perf.speedup import _drafter_names, controller, main

    ns = argparse.Namespace
    assert not [n for n in _drafter_names(ns(drafters="none,hybrid", baseline=None), "hf-pld") if "warm" in n]
    names = _drafter_names(ns(drafters="hybrid/fixed/warm,hybrid,llama/warm,none", baseline=None), "hf-pld")
    assert names == ["none", "llama/warm", "hybrid", "hybrid/fixed/warm"]
    for bad in ("none/warm", "hf-pld/warm"):
        with pytest.raises(SystemExit, match="unknown drafter"):
            _drafter_names(ns(drafters=bad, baseline=None), "hf-pld")
    controllers: dict[tuple[str, int], Any] = {}
    assert controller(controllers, "hybrid/fixed/warm", 4) is False
    assert controller(controllers, "hybrid/warm", 4) is not controller(controllers, "hybrid", 4)
    with pytest.raises(SystemExit) as e:
        main(["--texts", "wikitext,edits", "--drafters", "none,hybrid/warm"])
    assert e.value.code == 2
    assert "the edit pairs have none" in capsys.readouterr().err
    for argv, said in (
        (["--engine", "llama-cpp", "--model", "smollm2", "--prompts", "17"], "in 1..16 (the task prompts), got 17"),
        (["--model", "small", "--prompts", "0"], "must be >= 1, got 0"),
    ):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2
        assert said in capsys.readouterr().err


def test_warm_drafters_on_task_prompts_serve_the_rounds_requests_in_turn(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """On task prompts (no text between them), one warm drafter per variant, k and round serves
    every prompt of the round: the second prompt's drafter knows the first's generation, a new
    round's does not, and nothing is fed."""
    from perf.speedup import REQUESTS, WarmDrafter, Workload, kept_drafter, report_warm

    warm: dict[tuple[int, str, str, int], WarmDrafter] = {}
    first, second = Workload("rename", [[1, 2, 3]]), Workload("summarize", [[4, 5, 6]])
    assert kept_drafter(warm, 0, first, 0, "hybrid", None, 8, 64) is None  # not a warm drafter: a fresh one
    kept = kept_drafter(warm, 0, first, 0, "hybrid/warm", None, 8, 64)
    assert kept is not None and kept.fed_tokens == 0
    passage = list(range(500, 540))
    with kept.drafter.request([1, 2, 3]) as req:  # the first request's generation: the passage, twice
        req.extend([*passage, 7, 8, *passage])
    again = kept_drafter(warm, 0, second, 0, "hybrid/warm", None, 8, 64)
    assert again is kept and kept.served == 2 and kept.fed_tokens == 0
    with kept.drafter.request([9, *passage[:4]]) as req:
        assert req.propose()[:4] == passage[4:8]  # it learned from the earlier request
    other_k = kept_drafter(warm, 0, second, 0, "hybrid/warm", None, 4, 64)
    next_round = kept_drafter(warm, 1, first, 0, "hybrid/warm", None, 8, 64)
    assert other_k is not None and next_round is not None and len({id(kept), id(other_k), id(next_round)}) == 3
    with next_round.drafter.request([9, *passage[:4]]) as req:
        assert req.propose()[:1] != passage[4:5]
    assert {key[1] for key in warm} == {REQUESTS}
    report_warm(warm)
    err = capsys.readouterr().err
    assert "hybrid/warm k=8 round 1: kept across 2 requests in turn" in err
    assert "hybrid/warm k=4 round 1: kept across 1 requests in turn" in err


@pytest.mark.slow
def test_warm_drafters_in_the_generation_loop(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """The small model, two WikiText windows: the warm drafter is fed everything between them and
    the outputs equal plain greedy's (exit code 0)."""
    torch_with_transformers()
    from perf._common import data_dir
    from perf.speedup import WARM_CHUNK, _windows, main

    out = tmp_path / "warm.json"
    argv = ["--model", "small", "--k", "4", "--rounds", "1", "--prompts", "2", "--context", "64", "--new-tokens", "16"]
    assert main([*argv, "--texts", "wikitext", "--drafters", "none,hybrid,hybrid/warm", "--json", str(out)]) == 0
    wiki = np.fromfile(data_dir() / "wiki.test.raw.llama3.bin", dtype="<i4").tolist()
    s = _windows(wiki, 2, 64, 16, "wikitext").starts[1]
    fed = s - 80 - -(-(s - 80) // WARM_CHUNK)  # after the first window's 80 tokens; each chunk's first given
    assert f"hybrid/warm k=4 round 1 wikitext: fed {fed:,} tokens" in capsys.readouterr().err
    import json

    runs = json.loads(out.read_text())["runs"]
    assert sorted(r["drafter"] for r in runs) == ["hybrid", "hybrid", "hybrid/warm", "hybrid/warm", "none", "none"]


def test_plot_labels_name_k_only_where_it_varies_and_slant_when_many() -> None:
    labels, rotation = tick_labels([("wikitext", 4), ("wikitext", 8)])
    assert labels == ["wikitext\nk=4", "wikitext\nk=8"]
    assert rotation == 0
    tasks = [(f"rename-{i}", 8) for i in range(TICKS_FLAT + 1)]
    labels, rotation = tick_labels(tasks)
    assert labels == [w for w, _ in tasks]
    assert rotation > 0


def test_drafter_variants_draw_on_what_their_names_say() -> None:
    # +static: the static index; +corpus: the same text as the hybrid policy's corpus (shared, built once)
    from perf.speedup import Corpora, lookupdec_drafter

    text = [5, 6, 7, 8, 9, 10, 11] * 3
    corpora = Corpora.of(text)
    with_corpus = lookupdec_drafter("hybrid+corpus", corpora, 4)
    assert with_corpus.policy_state.history.corpus is corpora.corpus and with_corpus.static.n_entries == 0
    assert with_corpus.request([1, 7, 8]).propose() == [9, 10, 11, 5]
    with_static = lookupdec_drafter("hybrid+static", corpora, 4)
    assert with_static.policy_state.history.corpus is None and with_static.static is corpora.static
    plain = lookupdec_drafter("hybrid", corpora, 4)
    assert plain.policy_state.history.corpus is None and plain.request([1, 7, 8]).propose() == []
