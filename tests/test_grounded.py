"""perf.grounded: the teacher-forced protocol on hand-worked pairs, and lookupdec's drafters in it."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

import pytest

from lookupdec import fast, reference
from perf import grounded
from perf.peers import VllmNgram, teacher_force


class Scripted:
    """Proposes fixed drafts, one per step, and records what the protocol tells it."""

    def __init__(self, drafts: list[list[int]]) -> None:
        self.drafts = drafts
        self.begun: list[list[int]] = []
        self.observed: list[list[int]] = []
        self.ended = 0

    def begin(self, prompt: list[int]) -> None:
        self.begun.append(list(prompt))

    def propose(self, out: list[int]) -> list[int]:
        return self.drafts.pop(0) if self.drafts else []

    def observe(self, new_tokens: list[int]) -> None:
        self.observed.append(list(new_tokens))

    def end(self) -> None:
        self.ended += 1


def test_teacher_force_hand_worked() -> None:
    # Prompt [1, 2]; output [3, 4, 5, 6, 7].
    # Step 1: draft [3, 4, 9] -> accepts 3, 4; samples 5.  Step 2: draft [] -> samples 6.
    # Step 3: draft [7, 8] -> accepts 7, the output is complete: nothing sampled; 8 is wasted.
    d = Scripted([[3, 4, 9], [], [7, 8]])
    g = teacher_force(d, [1, 2, 3, 4, 5, 6, 7], 2, 3, "scripted")
    assert (g.n_steps, g.n_drafted, g.n_accept) == (3, 5, 3)
    assert d.begun == [[1, 2]]
    assert d.observed == [[3, 4, 5], [6], [7]]
    assert d.ended == 1


def test_teacher_force_refuses_an_overlong_draft() -> None:
    with pytest.raises(ValueError, match="more than n_draft"):
        teacher_force(Scripted([[1, 2, 3]]), [0, 1, 2, 3], 1, 2, "scripted")


def copy_pair(seed: int) -> tuple[list[int], list[int]]:
    """A prompt and an output that copies it with a few edits (random ids, so no chance repeats)."""
    rng = random.Random(seed)
    old = [rng.randrange(1000) for _ in range(300)]
    new = old[:100] + [rng.randrange(1000) for _ in range(7)] + old[110:250] + old[260:]
    return [999_999, *old], new


def test_vllm_copies_a_prompt_with_edits() -> None:
    # Outside the edits every step finds its 5-gram earlier in the prompt: nearly every step
    # is a full draft (k + 1 = 9 tokens); each edit costs a few single-token steps.
    prompt, output = copy_pair(0)
    g = teacher_force(VllmNgram(5, 5, 8), prompt + output, len(prompt), 8, "vllm")
    assert len(output) / g.n_steps > 5.0


@pytest.mark.parametrize("policy", ["llama", "hybrid"])
def test_lookupdec_fast_equals_reference_through_the_protocol(policy: str) -> None:
    # The fast path and the reference draft the same tokens, so every count is equal.
    counts = []
    for impl in (fast, reference):
        drafter = grounded.LookupdecDrafter(policy, 8, impl=impl)
        gens = [teacher_force(drafter, p + o, len(p), 8, policy) for p, o in map(copy_pair, range(3))]
        counts.append([(g.n_steps, g.n_drafted, g.n_accept) for g in gens])
    assert counts[0] == counts[1]
    assert counts[0][0][0] < len(copy_pair(0)[1])  # drafting helped: fewer steps than tokens


@dataclass
class Pair:
    kind: str
    prompt: list[int]
    output: list[int]


def test_run_sums_per_kind_and_all(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(grounded, "static_index", lambda fast, corpus, path: None)
    monkeypatch.setattr(grounded, "read_tokens", lambda path: [])
    pairs = [Pair("code", *copy_pair(1)), Pair("docs", *copy_pair(2)), Pair("code", *copy_pair(3))]
    rows = grounded.run(pairs, ["llama", "vllm"], [4, 8], tmp_path)
    by = {(r["kind"], r["drafter"], r["k"]): r for r in rows}
    assert set(by) == {(k, d, n) for k in ("code", "docs", "all") for d in ("llama", "vllm") for n in (4, 8)}
    for d in ("llama", "vllm"):
        for n in (4, 8):
            code, docs, every = by[("code", d, n)], by[("docs", d, n)], by[("all", d, n)]
            assert (code["pairs"], docs["pairs"], every["pairs"]) == (2, 1, 3)
            for key in ("output_tokens", "n_steps", "n_accept", "n_drafted"):
                assert every[key] == code[key] + docs[key]
            # each pair alone, through the protocol, gives the same counts
            v = VllmNgram(5, 5, n) if d == "vllm" else grounded.LookupdecDrafter("llama", n)
            gens = [teacher_force(v, p.prompt + p.output, len(p.prompt), n, d) for p in pairs]
            assert every["n_accept"] == sum(g.n_accept for g in gens)
    assert grounded.best_peer(rows, "all") is not None
    assert grounded.best_peer(rows, "all")["drafter"] == "vllm"  # type: ignore[index]


def test_main_prints_and_plots_stored_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = []
    for k, (t_llama, t_vllm) in {4: (3.0, 4.0), 8: (5.5, 5.0)}.items():
        for name, tps in (("hybrid", t_llama), ("vllm", t_vllm)):
            rows.append(
                {"kind": "code", "drafter": name, "k": k, "pairs": 2, "output_tokens": 100, "n_steps": 10,
                 "n_accept": 50, "n_drafted": 60, "tokens_per_step": tps, "wasted_per_step": 1.0, "us_per_step": 2.0}
            )  # fmt: skip
    stored = tmp_path / "rows.json"
    stored.write_text(json.dumps(rows))
    assert grounded.main(["--from-json", str(stored)]) == 0
    out = capsys.readouterr().out
    # the best peer is vllm at k = 8 (5.0): hybrid at k = 8 is 5.5 / 5.0 = 1.1x of it
    assert "| vllm (best peer) | 8 | 5.0000 | 1.000x |" in out
    assert "| hybrid | 8 | 5.5000 | 1.100x |" in out
    pytest.importorskip("matplotlib")  # the perf extra's; an installed wheel's test run lacks it
    png = tmp_path / "plot.png"
    assert grounded.main(["--from-json", str(stored), "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_fixed_threshold_names() -> None:
    assert grounded.fixed_name(0.3) == "hybrid@0.3"
    assert grounded.fixed_threshold("hybrid@0.3") == 0.3
    assert grounded.fixed_threshold(grounded.fixed_name(0.002)) == 0.002
    for name in ("hybrid", "hybrid@", "hybrid@x", "hybrid@1.5", "suffix"):
        assert grounded.fixed_threshold(name) is None
    assert grounded.is_lookupdec("hybrid@0.1") and grounded.is_lookupdec("hybrid/w0.5")
    assert not grounded.is_lookupdec("suffix") and not grounded.is_lookupdec("oracle")


def test_fixed_threshold_drafter_is_not_steered() -> None:
    # hybrid@T drafts at T throughout; the default hybrid's waste controller moves its threshold.
    prompt, output = copy_pair(4)
    drafted = {}
    for name in ("hybrid@0.002", "hybrid@0.5", "hybrid"):
        d = grounded.make_drafter(name, 8, len(prompt) + len(output), None, [])
        assert isinstance(d, grounded.LookupdecDrafter)
        drafted[name] = teacher_force(d, prompt + output, len(prompt), 8, name).n_drafted
        state = d._drafter.policy_state
        fixed = grounded.fixed_threshold(name)
        if fixed is not None:
            assert state.threshold == fixed and state.target_waste10 == 0
        else:
            assert state.threshold != 0.015  # steered away from its initial threshold
    assert drafted["hybrid@0.002"] > drafted["hybrid@0.5"]
    with pytest.raises(ValueError, match="hybrid policy"):
        grounded.LookupdecDrafter("llama", 8, threshold=0.3)


def test_match_waste_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def row(name: str, tokens: float, wasted: float) -> dict[str, object]:
        return {"kind": "all", "drafter": name, "k": 8, "pairs": 2, "output_tokens": 100, "n_steps": 10,
                "n_accept": 50, "n_drafted": 60, "tokens_per_step": tokens, "wasted_per_step": wasted,
                "us_per_step": 2.0}  # fmt: skip

    rows = [row("vllm", 5.0, 1.0), row("hf", 4.0, 0.2), row("hybrid", 5.9, 1.9)]
    rows += [row("hybrid@0.1", 6.0, 1.5), row("hybrid@0.2", 5.6, 0.9), row("hybrid@0.3", 5.2, 0.5)]
    stored = tmp_path / "rows.json"
    stored.write_text(json.dumps(rows))
    assert grounded.main(["--from-json", str(stored)]) == 0
    out = capsys.readouterr().out
    # the sweep is not a peer (hybrid@0.1's 6.0 would be the best) and not in the main table
    assert "| vllm (best peer) | 8 | 5.0000 | 1.000x |" in out
    assert "| hybrid@0.1 | 8 |" not in out
    # vllm wasted 1.0 a step: the best threshold wasting no more is 0.2 (0.9 wasted), 5.6 / 5.0
    assert "| 8 | vllm | 5.0000 | 1.000 | hybrid@0.2 | 5.6000 | 0.900 | 1.120x |" in out
    assert "| 8 | hf | 4.0000 | 0.200 | - | - | - | - (every threshold wasted more) |" in out
