"""perf speedup's arithmetic: tokens per second, speedup, tokens per step, the predicted speedup."""

from __future__ import annotations

import pytest

from perf.speedup import Run, summarize


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
