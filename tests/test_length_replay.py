"""perf.length_replay: the adaptive draft length on a fake clock over teacher-forced windows."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from lookupdec.adapters import DraftLength
from perf.length_replay import REPO, Controller, draft_length_at, fixed_length, main, replay, window_order
from perf.speedup import Workload


def copy_workload(n: int = 4, new: int = 48) -> Workload:
    """Windows whose continuation repeats their prompt: every draft of the prompt's n-grams is right."""
    prompts, truth = [], []
    for w in range(n):
        span = [1000 + 97 * w + i for i in range(80)]  # no token repeats inside a span
        prompts.append(span + span[:20])
        truth.append(span[20 : 20 + new])
    return Workload("copy", prompts, truth)


def totals(curve: list[float]) -> dict[str, tuple[float, float]]:
    out = replay(curve, 4, [copy_workload()], {"llama": ("llama", DraftLength), "hybrid": ("hybrid", DraftLength)})
    return {name: (t.plain / t.seconds, t.tokens / t.steps) for (name, _), t in out.items()}


def test_a_copy_is_drafted_long_where_verification_is_cheap() -> None:
    for name, (speedup, per_step) in totals([100.0, 101.0, 102.0, 103.0, 104.0]).items():
        # 48 tokens per window, drafts of 4 accepted whole: 5 per step once learned
        assert per_step > 3.5 and speedup > 3.0, name


def test_no_draft_is_sent_where_verification_costs_more_than_it_gains() -> None:
    for name, (speedup, per_step) in totals([100.0, 250.0, 400.0, 550.0, 700.0]).items():
        # a draft of d accepted whole yields d + 1 tokens for 1 + 1.5 d steps: the controller,
        # timing the fake clock's steps, stops drafting (exploring costs a little); drafting
        # 4 every step would run at 5 / 7 of plain greedy's speed
        assert 0.9 < speedup <= 1.0 + 1e-9 and per_step < 1.5, name


def test_the_clock_is_exact_so_replays_repeat() -> None:
    curve = [89.2, 119.8, 167.9, 205.7, 264.8]
    assert totals(curve) == totals(curve)


def test_a_burst_slows_the_clock_of_its_windows_only() -> None:
    curve = [89.2, 119.8, 167.9, 205.7, 264.8]
    variants: dict[str, tuple[str, Controller]] = {"llama": ("llama", DraftLength)}
    calm = replay(curve, 4, [copy_workload()], variants)
    # every window 3x slower: every cost 3x, so the same decisions, 3x the time, the same speedup
    slow = replay(curve, 4, [copy_workload()], variants, burst=(100, 3))
    c, s = calm[("llama", "copy")], slow[("llama", "copy")]
    assert (s.steps, s.tokens) == (c.steps, c.tokens)
    assert s.seconds == 3 * c.seconds and s.plain == 3 * c.plain
    # the first window alone: plain greedy's time grows by 2x that window's share
    first = replay(curve, 4, [copy_workload()], variants, burst=(1, 3))[("llama", "copy")]
    assert first.plain == c.plain + 2 * c.plain / 8  # 8 windows (2 rounds of 4), all as long
    assert first.seconds > c.seconds


def test_window_orders() -> None:
    a, b = copy_workload(3), Workload("other", [[1, 2]], [[3]])
    ordered = window_order([a, b], 2, 0)
    # perf speedup's order: every round, the texts in turn, each text's windows in turn
    assert [(t, p) for t, p, _ in ordered] == 2 * ([("copy", p) for p in a.prompts] + [("other", [1, 2])])
    shuffled = window_order([a, b], 2, 1)
    assert shuffled != ordered and sorted(map(str, shuffled)) == sorted(map(str, ordered))
    assert sorted(map(str, shuffled[:4])) == sorted(map(str, ordered[:4]))  # each round holds every window once
    assert window_order([a, b], 2, 1) == shuffled  # seeded


def test_code_windows_come_from_the_pinned_releases(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import perf.grounded_data
    from perf.speedup import teacher_forced_workloads

    released = list(range(5000, 6000))
    monkeypatch.setattr(perf.grounded_data, "code_tokens", lambda work: released if work == tmp_path else [])
    (code,) = teacher_forced_workloads(2, 100, 20, ["code"], tmp_path)
    assert code.name == "code" and code.truth is not None and len(code.prompts) == 2
    for prompt, truth in zip(code.prompts, code.truth, strict=True):
        start = prompt[0] - 5000
        assert prompt == released[start : start + 100] and truth == released[start + 100 : start + 120]


def test_a_fixed_variant_always_drafts_k() -> None:
    # Verification dear (T(n) = n * T(1)): the controller holds back; the fixed variant does not.
    variants: dict[str, tuple[str, Controller]] = {
        "hybrid": ("hybrid", DraftLength),
        "hybrid/fixed": ("hybrid", fixed_length),
    }
    out = replay([100.0, 200.0, 300.0, 400.0, 500.0], 4, [copy_workload()], variants)
    fixed, adaptive = out[("hybrid/fixed", "copy")], out[("hybrid", "copy")]
    # 48 tokens per window, every draft of 4 right: 9 steps of 5 and one of 3; 4 windows, 2 rounds
    assert (fixed.tokens, fixed.steps) == (384, 80)
    assert adaptive.steps > fixed.steps


def test_main_prints_every_drafter(capsys: pytest.CaptureFixture[str]) -> None:
    # the edit pairs shipped with the tests (the wheel check runs this away from ../shared)
    argv = ["--curve", "90,120,168,206,265", "--texts", "edits", "--prompts", "2", "--new-tokens", "16"]
    rc = main([*argv, "--orders", "2"])
    out = capsys.readouterr().out
    assert rc == 0
    lines = out.splitlines()
    assert "k = 4" in lines[0] and "2 order(s)" in lines[0] and "edits" in lines[1]
    assert [line.split()[0] for line in lines[2:]] == ["llama", "hybrid"]
    assert main([*argv, "--fixed"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines[2:]] == ["llama", "llama/fixed", "hybrid", "hybrid/fixed"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--curve", "90,abc"], "expected milliseconds"),
        (["--curve", "90"], "at least 2 positive costs"),
        (["--curve", "90,120", "--k", "3"], "k up to 1"),
        (["--curve", "90,120", "--drafters", "suffix"], "unknown suffix"),
        (["--curve", "90,120", "--orders", "0"], "at least 1"),
        (["--curve", "90,120", "--burst", "3"], "N,FACTOR as two whole numbers"),
        (["--curve", "90,120", "--burst", "3,0"], "FACTOR >= 1"),
    ],
)
def test_bad_arguments_are_refused_clearly(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(argv)
    assert message in capsys.readouterr().err


@pytest.mark.skipif(
    shutil.which("git") is None or not (REPO / ".git").exists(), reason="needs the project's git checkout"
)
def test_a_baseline_revision_runs_side_by_side() -> None:
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
    cls = draft_length_at(head.stdout.strip())
    assert issubclass(cls, DraftLength) and cls is not DraftLength
    assert isinstance(cls(4).choose(), int)
    with pytest.raises(SystemExit, match="cannot read"):
        draft_length_at("no-such-revision")
