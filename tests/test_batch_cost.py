"""BatchCost: the least acceptance a drafted token must promise, from a batched engine's step times."""

from __future__ import annotations

import pytest

from lookupdec.adapters import BatchCost


def decayed_ratio(produced: list[int], seconds: list[float], decay: float) -> float:
    """Sum of decay^age * P over sum of decay^age * T: the recent tokens per second, written out."""
    n = len(produced)
    weights = [decay ** (n - 1 - i) for i in range(n)]
    return sum(w * p for w, p in zip(weights, produced, strict=True)) / sum(
        w * t for w, t in zip(weights, seconds, strict=True)
    )


@pytest.mark.parametrize("decay", [0.9, 0.95, 1.0])
def test_threshold_is_slope_times_tokens_per_second(decay: float) -> None:
    # A step of N verified tokens costs a + b N exactly: the fitted slope is b, whatever the
    # lengths, and the threshold b times the recent tokens per second.
    a, b = 0.080, 0.0065
    cost = BatchCost(decay=decay, warmup=4)
    verified = [4, 9, 6, 12, 4, 15, 7, 8, 11, 5, 13, 10]
    produced = [4, 6, 5, 9, 4, 8, 6, 7, 4, 5, 9, 8]
    seconds = [a + b * n for n in verified]
    for i, (n, p, t) in enumerate(zip(verified, produced, seconds, strict=True)):
        cost.observe(n, p, t)
        if i + 1 < 4:
            assert cost.threshold() is None  # before the warm-up
    assert cost.steps == len(verified)
    assert cost.slope == pytest.approx(b, rel=1e-9)
    assert cost.threshold() == pytest.approx(b * decayed_ratio(produced, seconds, decay), rel=1e-9)
    # 4 rows at 80 ms and 6.5 ms per verified token: a drafted token must be accepted about 1 time in 3
    assert 0.2 < (cost.threshold() or 0.0) < 0.5


def test_no_threshold_without_a_spread_of_lengths() -> None:
    # Every step verified the same number of tokens: nothing tells what one more would cost.
    cost = BatchCost(warmup=2)
    for _ in range(20):
        cost.observe(4, 4, 0.08)
    assert cost.threshold() is None
    # Once lengths differ, it is fitted; then steps of one length keep the last slope.
    cost.observe(10, 6, 0.08 + 6 * 0.005)
    assert cost.slope == pytest.approx(0.005, rel=1e-9)
    for _ in range(200):
        cost.observe(4, 4, 0.08)
    assert cost.slope == pytest.approx(0.005, rel=1e-6)
    assert cost.threshold() == pytest.approx(0.005 * 4 / 0.08, rel=1e-3)


def test_a_cheaper_longer_step_means_no_cost() -> None:
    # Noise can make longer steps look cheaper: the slope is never negative (any likely token pays).
    cost = BatchCost(warmup=1)
    for n, t in ((4, 0.09), (8, 0.08), (6, 0.085), (10, 0.075)):
        cost.observe(n, 4, t)
    assert cost.slope == 0.0 and cost.threshold() == 0.0


def test_steps_that_say_nothing_are_ignored() -> None:
    cost = BatchCost(warmup=1)
    cost.observe(0, 1, 0.1)  # nothing verified
    cost.observe(4, 0, 0.1)  # nothing produced
    cost.observe(4, 4, 0.0)  # no time
    cost.observe(4, 4, -1.0)
    assert cost.steps == 0 and cost.threshold() is None
