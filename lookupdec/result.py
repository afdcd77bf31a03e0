"""The result of a replay and the checks of its arguments, shared by every implementation."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class ReplayResult:
    """Counts and timings of one llama-lookup-stats replay (spec 8.2).

    ``t_draft_s`` covers the draft calls and the context-cache updates, as llama.cpp's
    ``t_draft`` does; loading caches is timed by the caller. ``n_steps`` counts verification
    steps (iterations of the loop, including each chunk's first one, which cannot draft);
    ``policy`` is the drafting policy replayed; ``branches`` the most branches of a step's
    draft (1: one linear draft; more: tree drafts of the hybrid policy, each step accepting the
    longest prefix any branch shares with the text, and ``n_drafted`` counting the trees'
    distinct nodes, shared prefixes once).
    """

    n_ctx: int
    n_draft: int
    n_tokens: int
    n_predict: int
    n_drafted: int
    n_accept: int
    t_draft_s: float
    n_steps: int = 0
    policy: str = "llama"
    branches: int = 1

    @property
    def tokens_per_step(self) -> float:
        """Tokens gained per verification step, ``(n_accept + n_steps) / n_steps`` (0 without steps).

        Every step of the llama-lookup-stats loop verifies one draft (possibly empty) and gains
        the accepted drafted tokens plus the one token the model samples.
        """
        return (self.n_accept + self.n_steps) / self.n_steps if self.n_steps else 0.0

    @property
    def wasted_per_step(self) -> float:
        """Drafted tokens that were not accepted, per verification step (0 without steps)."""
        return (self.n_drafted - self.n_accept) / self.n_steps if self.n_steps else 0.0

    @property
    def accept(self) -> float:
        """Accepted drafted tokens in percent of drafted tokens (0 when nothing was drafted)."""
        return 100.0 * self.n_accept / self.n_drafted if self.n_drafted else 0.0

    @property
    def us_per_drafted_token(self) -> float:
        """Drafting time per drafted token in microseconds (0 when nothing was drafted)."""
        return 1e6 * self.t_draft_s / self.n_drafted if self.n_drafted else 0.0

    def to_dict(self) -> dict[str, Any]:
        """All fields plus the derived ``accept``, ``t_draft_ms`` and ``us_per_drafted_token``."""
        d = asdict(self)
        d["accept"] = self.accept
        d["t_draft_ms"] = 1e3 * self.t_draft_s
        d["us_per_drafted_token"] = self.us_per_drafted_token
        d["tokens_per_step"] = self.tokens_per_step
        d["wasted_per_step"] = self.wasted_per_step
        d["us_per_step"] = 1e6 * self.t_draft_s / self.n_steps if self.n_steps else 0.0
        return d


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many first tokens ``a`` and ``b`` share."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def tree_nodes(tree: Sequence[Sequence[int]]) -> int:
    """Distinct nodes of the tree that the branches ``tree`` form (shared prefixes counted once):
    the drafted tokens a tree verifier evaluates."""
    return sum(len(b) - max((common_prefix(b, o) for o in tree[:i]), default=0) for i, b in enumerate(tree))
