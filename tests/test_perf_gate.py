"""The performance gate can go red: a deliberately slowed "fast" side fails it, a fast one passes.

No absolute timing is asserted. The gate is pointed at the reference on both sides (the
``--candidate reference`` test hook, so these tests do not need the compiled fast path) and
one side is slowed down 20x (``--inject-slowdown``); against a threshold of 2x the measured
ratio is ~0.05x or ~20x, a margin no machine noise closes.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pyperf
import pytest

from perf import gate

REPO = Path(__file__).resolve().parents[1]

# A tiny workload on the seeded synthetic corpus: a fraction of a second per round.
TINY = [
    "--candidate",
    "reference",
    "--allow-interpreted",
    "--synthetic",
    "--n-ctx",
    "128",
    "--chunks",
    "2",
    "--warm-chunks",
    "2",
    "--rounds",
    "3",
]


def measured_speedup(output: str) -> float:
    m = re.search(r"measured speedup ([0-9.]+)x", output)
    assert m, output
    return float(m.group(1))


def test_gate_fails_on_a_slowed_fast_path(capsys: pytest.CaptureFixture[str]) -> None:
    rc = gate.main([*TINY, "--inject-slowdown", "fast:20", "--min-speedup", "2"])
    out = capsys.readouterr().out
    assert rc == gate.EXIT_FAIL, out
    assert "GATE FAILED" in out
    assert "threshold 2x" in out
    assert measured_speedup(out) < 2.0
    assert "TEST HOOK: fast side slowed down 20x" in out


def test_gate_passes_when_the_ratio_exceeds_the_threshold(capsys: pytest.CaptureFixture[str]) -> None:
    rc = gate.main([*TINY, "--inject-slowdown", "reference:20", "--min-speedup", "2"])
    out = capsys.readouterr().out
    assert rc == gate.EXIT_PASS, out
    assert "GATE PASSED" in out
    assert measured_speedup(out) > 2.0


def test_threshold_comes_from_the_environment(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(gate.ENV_MIN_SPEEDUP, "2")
    rc = gate.main([*TINY, "--inject-slowdown", "fast:20"])
    out = capsys.readouterr().out
    assert rc == gate.EXIT_FAIL, out
    assert f"from ${gate.ENV_MIN_SPEEDUP}" in out
    assert gate.min_speedup() == (2.0, f"${gate.ENV_MIN_SPEEDUP}")


def test_default_threshold_is_the_one_constant(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(gate.ENV_MIN_SPEEDUP, raising=False)
    assert gate.min_speedup() == (gate.MIN_SPEEDUP, "perf/gate.py MIN_SPEEDUP")
    assert gate.min_speedup(3.5) == (3.5, "--min-speedup")


def test_an_interpreted_candidate_is_refused_without_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    args = [a for a in TINY if a != "--allow-interpreted"]
    rc = gate.main(args)
    out = capsys.readouterr().out
    assert rc == gate.EXIT_CANNOT_MEASURE, out
    assert "NOT compiled" in out
    assert "GATE FAILED" in out


def test_report_only_never_fails(capsys: pytest.CaptureFixture[str]) -> None:
    rc = gate.main([*TINY, "--inject-slowdown", "fast:20", "--min-speedup", "2", "--report-only"])
    out = capsys.readouterr().out
    assert rc == gate.EXIT_PASS, out
    assert measured_speedup(out) < 2.0
    assert "would fail" in out


def test_the_cli_exits_non_zero_and_prints_the_ratio() -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    env.pop(gate.ENV_MIN_SPEEDUP, None)
    proc = subprocess.run(
        [sys.executable, "-m", "perf", "gate", *TINY, "--inject-slowdown", "fast:20", "--min-speedup", "2"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == gate.EXIT_FAIL, proc.stdout + proc.stderr
    assert measured_speedup(proc.stdout) < 2.0
    assert "GATE FAILED" in proc.stdout


# --- head vs base -----------------------------------------------------------------------------


def _suite(path: Path, values: dict[str, list[float]]) -> Path:
    benches = []
    for name, vals in values.items():
        runs = [
            pyperf.Run([v], metadata={"name": name, "unit": "second", "loops": 1}, collect_metadata=False) for v in vals
        ]
        benches.append(pyperf.Benchmark(runs))
    pyperf.BenchmarkSuite(benches).dump(str(path), replace=True)
    return path


BASE = {
    "draft.static=none@fast": [1.00, 1.02, 0.98, 1.01, 0.99, 1.00],
    "update.context@fast": [2.00, 2.02, 1.98, 2.01, 1.99, 2.00],
}


def test_head_vs_base_fails_on_a_significant_slowdown(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = _suite(tmp_path / "base.json", BASE)
    slowed = {**BASE, "draft.static=none@fast": [3 * v for v in BASE["draft.static=none@fast"]]}
    head = _suite(tmp_path / "head.json", slowed)
    rc = gate.main(["--base", str(base), "--head", str(head), "--tolerance", "0.1"])
    out = capsys.readouterr().out
    assert rc == gate.EXIT_FAIL, out
    assert "SLOWER" in out
    assert "draft.static=none@fast: 3.000x of base" in out


def test_head_vs_base_passes_within_tolerance(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = _suite(tmp_path / "base.json", BASE)
    head = _suite(tmp_path / "head.json", {k: [1.02 * v for v in vals] for k, vals in BASE.items()})
    rc = gate.main(["--base", str(base), "--head", str(head), "--tolerance", "0.1"])
    out = capsys.readouterr().out
    assert rc == gate.EXIT_PASS, out
    assert "GATE PASSED" in out
