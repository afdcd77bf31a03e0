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
