"""perf.peers: its replay loop on hand-worked sequences, against lookupdec's replay, and its vLLM rule."""

from __future__ import annotations

import json
import random
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from lookupdec.reference.cache import NGRAM_MAX, NGRAM_MIN, NgramCache, build_static
from lookupdec.reference.draft import draft
from lookupdec.reference.replay import replay
from perf import peers
from perf._common import REPLAY_FILE, STATIC_FILE
from perf.peers import VllmNgram, replay_peer
from tests.conftest import torch_with_transformers


class Oracle:
    """Proposes the true next ``k`` tokens of the text (past the chunk end too)."""

    def __init__(self, text: Sequence[int], n_ctx: int, k: int) -> None:
        self.text, self.n_ctx, self.k = list(text), n_ctx, k
        self.i_start = -n_ctx

    def begin(self, prompt: list[int]) -> None:
        self.i_start += self.n_ctx
        assert prompt == [self.text[self.i_start]]

    def propose(self, out: list[int]) -> list[int]:
        pos = self.i_start + len(out)
        return self.text[pos : pos + self.k]

    def observe(self, new_tokens: list[int]) -> None:
        pass

    def end(self) -> None:
        pass


class Constant:
    """Proposes the same draft every step."""

    def __init__(self, tokens: list[int]) -> None:
        self.tokens = tokens
        self.seen: list[list[int]] = []

    def begin(self, prompt: list[int]) -> None:
        self.seen.append(list(prompt))

    def propose(self, out: list[int]) -> list[int]:
        assert out == self.seen[-1]
        return list(self.tokens)

    def observe(self, new_tokens: list[int]) -> None:
        self.seen[-1] += new_tokens

    def end(self) -> None:
        pass


class Llama:
    """llama.cpp's rule through the peer interface (lookupdec.reference's draft and caches)."""

    def __init__(self, k: int, static: NgramCache) -> None:
        self.k, self.static = k, static
        self.context, self.dynamic = NgramCache(), NgramCache()
        self.out: list[int] = []

    def begin(self, prompt: list[int]) -> None:
        self.out = list(prompt)  # the given first token is not counted into the context cache

    def propose(self, out: list[int]) -> list[int]:
        assert out == self.out
        drafted = [out[-1]]
        draft(out, drafted, self.k, NGRAM_MIN, NGRAM_MAX, self.context, self.dynamic, self.static)
        return drafted[1:]

    def observe(self, new_tokens: list[int]) -> None:
        for token in new_tokens:
            self.out.append(token)
            self.context.update(self.out, 1, NGRAM_MIN, NGRAM_MAX)

    def end(self) -> None:
        self.dynamic.merge(self.context)
        self.context.clear()


def counts(text: Sequence[int], drafter: object, n_ctx: int, k: int) -> tuple[int, int, int]:
    r = replay_peer(text, drafter, n_ctx, k)  # type: ignore[arg-type]
    return r.n_steps, r.n_accept, r.n_drafted


def test_oracle_hand_worked() -> None:
    text = list(range(10))  # chunks [0..3], [4..7]; 8 + 4 < 10 fails, so [8, 9] is dropped
    # k = 2: out [0], draft [1, 2] both accepted, the sampled 3 fills the chunk: one step per chunk.
    assert counts(text, Oracle(text, 4, 2), 4, 2) == (2, 4, 4)
    # k = 1: [0] -> accept 1, sample 2; [0, 1, 2] -> accept 3, chunk full, no sample.
    assert counts(text, Oracle(text, 4, 1), 4, 1) == (4, 4, 4)
    # k = 8: [1..8] drafted, 3 accepted before the chunk end; the 5 past it still count as drafted.
    # The second chunk's oracle has only [5..9] left in the text: 8 + 5 drafted.
    r = replay_peer(text, Oracle(text, 4, 8), 4, 8)
    assert (r.n_steps, r.n_accept, r.n_drafted) == (2, 6, 13)
    assert r.tokens_per_step == 4.0 and r.wasted_per_step == 3.5


def test_oracle_accepts_everything_inside_chunks() -> None:
    text = [random.Random(1).randrange(50) for _ in range(1000)]
    for n_ctx, k in [(7, 3), (16, 8), (100, 8), (64, 1)]:
        r = replay_peer(text, Oracle(text, n_ctx, k), n_ctx, k)
        n_chunks = (len(text) - 1) // n_ctx
        # Each chunk gains n_ctx - 1 tokens at k + 1 per step; its last step samples only when the
        # chunk has room left after the k accepted tokens.
        steps_per_chunk = -(-(n_ctx - 1) // (k + 1))
        last_samples = (n_ctx - 1) % (k + 1) == 0
        samples = steps_per_chunk - 1 + last_samples
        assert r.n_steps == n_chunks * steps_per_chunk
        assert r.n_accept == n_chunks * (n_ctx - 1 - samples)
        assert r.n_drafted == r.n_steps * k  # the text goes on past every chunk: always k proposed
        if last_samples:  # no draft reaches past a chunk end: nothing wasted
            assert r.n_accept == r.n_drafted


def test_silent_and_wrong_drafters() -> None:
    text = list(range(8))  # an exact multiple of n_ctx: the last full chunk is dropped, as in llama.cpp
    assert counts(text, Constant([]), 4, 8) == (3, 0, 0)
    assert counts(text * 3, Constant([]), 4, 8) == (15, 0, 0)
    assert counts(text, Constant([-1, -2]), 4, 2) == (3, 0, 6)
    # A constant draft that is right once: [0] then 1 accepted, 2 sampled; [0, 1, 2] then 3 sampled.
    assert counts([0, 1, 2, 3, 9], Constant([1, 5]), 4, 2) == (2, 1, 4)
    with pytest.raises(ValueError, match="more than n_draft"):
        replay_peer(text, Constant([1, 2, 3]), 4, 2)


def test_llama_rule_through_the_loop_equals_replay() -> None:
    rng = random.Random(7)
    phrases = [[rng.randrange(30) for _ in range(rng.randrange(2, 9))] for _ in range(12)]
    text: list[int] = []
    while len(text) < 3000:
        text += rng.choice(phrases) if rng.random() < 0.7 else [rng.randrange(30)]
    static = build_static(text[:1500])
    for n_ctx, k in [(256, 8), (97, 3)]:
        ref = replay(text[1500:], n_ctx, k, static)
        got = replay_peer(text[1500:], Llama(k, static), n_ctx, k)
        assert (got.n_steps, got.n_accept, got.n_drafted) == (ref.n_steps, ref.n_accept, ref.n_drafted)
        assert ref.n_accept > 100  # the text repeats enough for the rule to draft


def vllm_rule(seq: list[int], min_n: int, max_n: int, k: int) -> list[int]:
    """vLLM's ngram rule by brute force: the longest n in min_n..max_n whose suffix occurs earlier
    (ending before the last token), its earliest occurrence, the k tokens after it."""
    total = len(seq)
    if total < min_n:
        return []
    for n in range(max_n, min_n - 1, -1):
        starts = [a for a in range(0, total - n) if seq[a : a + n] == seq[total - n :]]
        if starts:
            return seq[starts[0] + n : starts[0] + n + k]
    return []


@pytest.mark.parametrize(("min_n", "max_n", "k"), [(5, 5, 8), (2, 5, 8), (1, 2, 8), (1, 1, 3), (3, 4, 1)])
def test_vllm_ngram_matches_the_rule(min_n: int, max_n: int, k: int) -> None:
    rng = random.Random(min_n * 100 + max_n * 10 + k)
    for _ in range(30):
        seq = [rng.randrange(rng.choice([2, 3, 6])) for _ in range(rng.randrange(1, 6))]
        drafter = VllmNgram(min_n, max_n, k)
        drafter.begin(seq[:1])
        grown = seq[:1]
        while len(grown) < 60:
            assert drafter.propose(grown) == vllm_rule(grown, min_n, max_n, k), grown
            new = [rng.randrange(3) for _ in range(rng.randrange(1, 4))]
            grown += new
            drafter.observe(new)


def test_vllm_example_from_its_docstring() -> None:
    # NgramProposer.propose's docstring: [1,2,3,4,2,3], min_n 2, max_n 3, k 4 -> [4, 2, 3].
    d = VllmNgram(2, 3, 4)
    d.begin([1, 2, 3, 4, 2, 3])
    assert d.propose([1, 2, 3, 4, 2, 3]) == [4, 2, 3]


def test_vllm_max_model_len_caps_the_draft() -> None:
    d = VllmNgram(1, 1, 8, max_model_len=7)
    d.begin([1, 2, 3, 1])
    assert d.propose([1, 2, 3, 1]) == [2, 3, 1]  # k = min(8, 7 - 4) = 3
    d.observe([5, 6, 1])
    assert d.propose([1, 2, 3, 1, 5, 6, 1]) == []


@pytest.mark.slow  # imports torch and transformers (~10 s); checked on WikiText too (docs/performance.md)
def test_hf_prompt_lookup_is_the_n2_rule() -> None:
    """transformers' own generator drafts what the n <= 2 rule (earliest occurrence) drafts."""
    torch_with_transformers()
    from perf.peers import HFPromptLookup

    rng = random.Random(3)
    text = [rng.randrange(6) for _ in range(400)]
    hf = replay_peer(text, HFPromptLookup(8, 64), 64, 8)
    rule = replay_peer(text, VllmNgram(1, 2, 8), 64, 8)
    assert (hf.n_steps, hf.n_accept, hf.n_drafted) == (rule.n_steps, rule.n_accept, rule.n_drafted)
    assert hf.n_drafted > hf.n_steps


def test_main_skips_a_missing_peer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    rng = random.Random(5)
    phrase = [rng.randrange(100) for _ in range(40)]
    np.array(phrase * 300, dtype="<i4").tofile(tmp_path / REPLAY_FILE)
    np.array(phrase * 50, dtype="<i4").tofile(tmp_path / STATIC_FILE)
    monkeypatch.setenv("LOOKUPDEC_DATA", str(tmp_path))
    monkeypatch.setitem(sys.modules, "arctic_inference.suffix_decoding", None)  # import fails
    out = tmp_path / "rows.json"
    assert peers.main(["--sets", "wikitext", "--peers", "vllm,suffix", "--json", str(out)]) == 0
    captured = capsys.readouterr()
    assert "skipping suffix" in captured.err
    rows = json.loads(out.read_text())
    assert [r["peer"] for r in rows] == ["vllm"]
    # A text that repeats one 40-token phrase: vLLM's rule drafts 8 right tokens nearly every step.
    assert rows[0]["tokens_per_step"] > 8.0


def test_main_code_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # --sets code replays perf.grounded_data.code_tokens(--work) with the enwiki static corpus;
    # a failure to build it (here: no network) is one clear line and exit status 2
    from perf import grounded_data as gd

    rng = random.Random(6)
    phrase = [rng.randrange(100) for _ in range(40)]
    np.array(phrase * 50, dtype="<i4").tofile(tmp_path / STATIC_FILE)
    monkeypatch.setenv("LOOKUPDEC_DATA", str(tmp_path))
    asked: list[Path] = []

    def code_tokens(work: Path) -> list[int]:
        asked.append(work)
        return phrase * 300

    monkeypatch.setattr(gd, "code_tokens", code_tokens)
    out = tmp_path / "rows.json"
    assert peers.main(["--sets", "code", "--peers", "vllm", "--work", str(tmp_path / "w"), "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert asked == [tmp_path / "w"] and [(r["set"], r["n_tokens"]) for r in rows] == [("code", 12_000)]
    capsys.readouterr()

    def offline(work: Path) -> list[int]:
        raise gd.GroundedDataError("cannot download https://files.pythonhosted.org/x.tar.gz: no network")

    monkeypatch.setattr(gd, "code_tokens", offline)
    assert peers.main(["--sets", "code", "--peers", "vllm"]) == 2
    err = capsys.readouterr().err
    assert "the code set" in err and "x.tar.gz" in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("wasted", "target"),
    [(1.54, 1.5), (1.51, 1.5), (1.505, 1.4), (4.72, 4.7), (0.12, 0.1), (0.1, None), (0.0, None)],
)
def test_matched_target_is_a_tenth_at_least_a_hundredth_below(wasted: float, target: float | None) -> None:
    assert peers.matched_target(wasted) == target


def test_main_match_waste(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # --match-waste: hybrid and hybrid+corpus steered below each peer's waste, a row each, and a
    # table of ratios; their waste per step is no more than the peer's
    rng = random.Random(7)
    words = [[rng.randrange(30) for _ in range(rng.randrange(2, 6))] for _ in range(40)]
    text = [t for _ in range(3000) for t in rng.choice(words)]
    np.array(text[:13_000], dtype="<i4").tofile(tmp_path / REPLAY_FILE)
    np.array(text[13_000:], dtype="<i4").tofile(tmp_path / STATIC_FILE)
    monkeypatch.setenv("LOOKUPDEC_DATA", str(tmp_path))
    out = tmp_path / "rows.json"
    assert peers.main(["--sets", "wikitext", "--peers", "llama,vllm25", "--match-waste", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    peer = next(r for r in rows if r["peer"] == "vllm25")
    target = peers.matched_target(peer["wasted_per_step"])
    assert target is not None
    matched = [r for r in rows if "matched_to" in r]
    assert [(r["peer"], r["matched_to"]) for r in matched] == [
        (f"hybrid@{target}", "vllm25"),
        (f"hybrid+corpus@{target}", "vllm25"),
    ]
    assert [(r["variant"], r["target_waste"]) for r in matched] == [("hybrid", target), ("hybrid+corpus", target)]
    for r in matched:
        assert r["n_steps"] > 0 and r["wasted_per_step"] <= peer["wasted_per_step"]
    table = capsys.readouterr().out
    assert f"| wikitext | vllm25 | {peer['tokens_per_step']:.4f} |" in table
    assert f"{matched[0]['tokens_per_step'] / peer['tokens_per_step']:.3f}x" in table


def test_print_matched_marks_more_waste(capsys: pytest.CaptureFixture[str]) -> None:
    # a hybrid row that wasted more than its peer (the controller could not steer that low) is marked
    def r(peer: str, tps: float, wasted: float, to: str | None = None) -> dict[str, object]:
        x: dict[str, object] = {"set": "s", "peer": peer, "tokens_per_step": tps, "wasted_per_step": wasted}
        if to is None:
            return x
        variant, target = peer.split("@")
        return {**x, "matched_to": to, "variant": variant, "target_waste": float(target)}

    peers.print_matched(
        [r("vllm", 1.0, 0.127), r("hybrid@0.1", 1.1, 0.154, "vllm"), r("hybrid+corpus@0.1", 1.2, 0.12, "vllm")]
    )
    out = capsys.readouterr().out
    assert "| s | vllm | 1.0000 | 0.127 | 0.1 | 1.1000 | 0.154 | 1.100x (more waste) | 1.2000 | 0.120 | 1.200x |" in out
    assert "threshold reached its bound" in out
