"""The result of a replay, shared by every implementation."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class ReplayResult:
    """Counts and timings of one llama-lookup-stats replay (spec 8.2).

    ``t_draft_s`` covers the draft calls and the context-cache updates, as llama.cpp's
    ``t_draft`` does; loading caches is timed by the caller.
    """

    n_ctx: int
    n_draft: int
    n_tokens: int
    n_predict: int
    n_drafted: int
    n_accept: int
    t_draft_s: float

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
        return d
