"""perf.batch_invariance's comparison of batched verification with one-token decoding, on a fake model."""

from __future__ import annotations

import numpy as np
import pytest

from perf.batch_invariance import first_difference

VOCAB = 11


class FakeModel:
    """Next token = (3 * previous + 1) mod VOCAB; in a batch, position ``skew`` (absolute) predicts +1."""

    def __init__(self, skew: int | None = None) -> None:
        self.tokens: list[int] = []
        self.rows: list[np.ndarray] = []
        self.skew = skew

    def reset(self) -> None:
        self.tokens, self.rows = [], []

    def eval(self, new: list[int]) -> None:
        for t in new:
            pos = len(self.tokens)
            self.tokens.append(t)
            nxt = (3 * t + 1) % VOCAB
            if len(new) > 1 and pos == self.skew:
                nxt = (nxt + 1) % VOCAB
            row = np.zeros(VOCAB)
            row[nxt] = 1.0
            self.rows.append(row)

    def run(self, prompt: list[int], n: int, batch: int) -> int | None:
        return first_difference(
            self.eval, lambda i: self.rows[i], lambda: len(self.tokens), self.reset, prompt, n, batch
        )


def test_invariant_model_agrees() -> None:
    assert FakeModel().run([1, 2, 3], 20, 5) is None


@pytest.mark.parametrize("skew", [3, 4, 7, 12, 21])
def test_first_differing_generated_token_is_found(skew: int) -> None:
    # The prompt holds positions 0..2; the row at position p predicts generated token p - 2.
    assert FakeModel(skew).run([1, 2, 3], 20, 5) == skew - 2


def test_a_difference_past_the_tokens_checked_is_not_reported() -> None:
    assert FakeModel(40).run([1, 2, 3], 20, 5) is None
