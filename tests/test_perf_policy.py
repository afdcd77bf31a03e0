"""``python -m perf policy --trees``: checkouts compared side by side, counts required identical."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from perf import bench_policy
from tests.conftest import DEMO_DATA

REPO = Path(__file__).resolve().parents[1]


def rows(us: float, n_accept: int = 10) -> list[dict[str, Any]]:
    return [
        {"set": "wikitext", "policy": "hybrid", "tokens_per_step": 1.1, "n_steps": 100, "n_accept": n_accept,
         "n_drafted": 50, "us_per_step_median": us}
    ]  # fmt: skip


def test_summarize_medians_per_tree() -> None:
    results = {"a": [rows(3.0), rows(1.0), rows(2.0)], "b": [rows(5.0), rows(4.0), rows(9.0)]}
    lines = bench_policy.summarize(["a", "b"], results)
    assert lines[2] == "| a | wikitext | hybrid | 1.1000 | 2.00 | 3.00, 1.00, 2.00 |"
    assert lines[3] == "| b | wikitext | hybrid | 1.1000 | 5.00 | 5.00, 4.00, 9.00 |"


def test_summarize_refuses_different_counts() -> None:
    results = {"a": [rows(3.0)], "b": [rows(3.0), rows(3.0, n_accept=11)]}
    with pytest.raises(ValueError, match="b wikitext hybrid: counts differ from a"):
        bench_policy.summarize(["a", "b"], results)


def test_summarize_drafts_may_differ_between_trees_not_rounds() -> None:
    changed = [{**rows(4.0, n_accept=11)[0], "tokens_per_step": 1.2}]
    results = {"a": [rows(3.0), rows(1.0)], "b": [changed, [{**changed[0], "us_per_step_median": 6.0}]]}
    lines = bench_policy.summarize(["a", "b"], results, drafts_may_differ=True)
    assert lines[2] == "| a | wikitext | hybrid | 1.1000 | 2.00 | 3.00, 1.00 |"
    assert lines[3] == "| b | wikitext | hybrid | 1.2000 | 5.00 | 4.00, 6.00 |"  # b's own counts
    results["b"].append(rows(3.0, n_accept=12))  # a third round of b drafting otherwise: not deterministic
    with pytest.raises(ValueError, match="b wikitext hybrid: counts differ from b's first round"):
        bench_policy.summarize(["a", "b"], results, drafts_may_differ=True)


@pytest.mark.slow
def test_trees_end_to_end(tmp_path: Path) -> None:
    # this checkout twice, on a small data directory: two rounds each, identical counts
    data = tmp_path / "data"
    data.mkdir()
    np.fromfile(DEMO_DATA / "wiki.test.demo.llama3.bin", dtype="<i4")[:9000].tofile(data / "wiki.test.raw.llama3.bin")
    np.fromfile(DEMO_DATA / "enwiki_wt.demo.llama3.bin", dtype="<i4")[:20000].tofile(data / "enwiki_wt.10M.llama3.bin")
    cmd = [sys.executable, "-m", "perf", "policy", "--sets", "wikitext", "--repeats", "1", "--corpus-history"]
    cmd += ["--trees", f"{REPO},{REPO}", "--rounds", "2", "--cache-dir", str(tmp_path / "cache")]
    done = subprocess.run(cmd, cwd=REPO, env={**_env(), "LOOKUPDEC_DATA": str(data)}, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    table = [line for line in done.stdout.splitlines() if line.startswith(f"| {REPO} |")]
    assert [line.split(" | ")[2] for line in table] == ["llama", "hybrid", "hybrid+corpus"] * 2
    assert done.stderr.count("round ") == 4


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def test_run_set_replays_tree_drafts() -> None:
    # --branches: the tree variants interleaved with the others, their counts the replay's
    from tests.conftest import fast_impl

    fast = fast_impl()
    tokens = np.fromfile(DEMO_DATA / "wiki.test.demo.llama3.bin", dtype="<i4")[:9000].tolist()
    got = bench_policy.run_set(fast, "demo", tokens, None, 1, None, [3])
    assert [r["policy"] for r in got] == ["llama", "hybrid", "hybrid/b3"]
    r = fast.replay(tokens, 4096, 8, None, None, None, "hybrid", None, 3)
    assert (got[2]["n_steps"], got[2]["n_accept"], got[2]["n_drafted"]) == (r.n_steps, r.n_accept, r.n_drafted)
    assert got[2]["n_accept"] != got[1]["n_accept"]


def test_code_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # --sets code replays perf.grounded_data.code_tokens(--work) with the static corpus's index
    # and, with --corpus-history, the corpus in the hybrid history
    import json

    from perf import grounded_data as gd
    from perf._common import REPLAY_FILE, STATIC_FILE
    from tests.conftest import fast_impl

    fast_impl()  # skips where the fast path is not compiled (perf policy refuses it)
    demo = np.fromfile(DEMO_DATA / "wiki.test.demo.llama3.bin", dtype="<i4")
    demo[:3000].tofile(tmp_path / REPLAY_FILE)
    demo[3000:9000].tofile(tmp_path / STATIC_FILE)
    code = demo[9000:14000].tolist()
    monkeypatch.setenv("LOOKUPDEC_DATA", str(tmp_path))
    monkeypatch.setattr(gd, "code_tokens", lambda work: code if work == tmp_path / "w" else [])
    out = tmp_path / "rows.json"
    argv = ["--sets", "code", "--repeats", "1", "--corpus-history", "--work", str(tmp_path / "w")]
    assert bench_policy.main([*argv, "--cache-dir", str(tmp_path / "c"), "--json", str(out)]) == 0
    got = json.loads(out.read_text())
    assert [(r["set"], r["policy"], r["n_tokens"]) for r in got] == [
        ("code", p, 5000) for p in ("llama", "hybrid", "hybrid+corpus")
    ]
    assert "| code | hybrid+corpus |" in capsys.readouterr().out
