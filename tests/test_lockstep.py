"""A Hypothesis state machine drives the reference and the fast path in lockstep.

Update, draft, merge, replay and save/load in every file format are applied to both
implementations; after every step their caches and drafts must agree. The reference is
the oracle: this never compares an implementation with itself.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import lookupdec.reference as ref
from lookupdec.errors import CacheFormatError
from tests.conftest import fast_impl

# Few distinct ids make repeated n-grams (and so drafts) common; a few extremes test int32 edges.
token_ids = st.one_of(st.integers(0, 5), st.sampled_from([-(2**31), -2, 2**31 - 1, 1000]))
STATIC_FORMATS = ("llama", "lookupdec", "fork-v2")


class Lockstep(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.fast = fast_impl()
        self.dir = Path(tempfile.mkdtemp(prefix="lookupdec-lockstep-"))
        self.tokens: list[int] = []
        self.ctx = (ref.NgramCache(), self.fast.NgramCache())
        self.dyn = (ref.NgramCache(), self.fast.NgramCache())
        self.static: tuple[Any, Any] = (ref.NgramCache(), self.fast.NgramCache())
        self.n_files = 0

    def path(self) -> Path:
        self.n_files += 1
        return self.dir / f"f{self.n_files}.bin"

    @rule(new=st.lists(token_ids, min_size=1, max_size=12), extra=st.integers(-1, 3))
    def update(self, new: list[int], extra: int) -> None:
        """Append tokens and count them; ``extra`` over- or under-counts like a careless caller."""
        self.tokens += new
        nnew = max(0, len(new) + extra)
        for cache in self.ctx:
            cache.update(self.tokens, nnew)

    @precondition(lambda self: len(self.tokens) >= 1)
    @rule(n_draft=st.integers(0, 10), ngram_min=st.integers(1, 2), ngram_max=st.integers(2, 4))
    def draft(self, n_draft: int, ngram_min: int, ngram_max: int) -> None:
        drafts = []
        for impl, ctx, dyn, static in zip((ref, self.fast), self.ctx, self.dyn, self.static, strict=True):
            d = [self.tokens[-1]]
            impl.draft(self.tokens, d, n_draft, ngram_min, ngram_max, ctx, dyn, static)
            drafts.append(d)
        assert drafts[0] == drafts[1]

    @rule()
    def merge_context_into_dynamic(self) -> None:
        for ctx, dyn in zip(self.ctx, self.dyn, strict=True):
            dyn.merge(ctx)
            ctx.clear()

    @rule(which=st.sampled_from(["ctx", "dyn"]))
    def save_and_load_crosswise(self, which: str) -> None:
        """Each implementation loads the legacy file the other one wrote."""
        pair = getattr(self, which)
        p_ref, p_fast = self.path(), self.path()
        pair[0].save(p_ref)
        pair[1].save(p_fast)
        setattr(self, which, (ref.NgramCache.load(p_fast), self.fast.NgramCache.load(p_ref)))

    @rule(fmt=st.sampled_from(STATIC_FORMATS), in_memory=st.booleans(), big=st.booleans())
    def static_from_tokens(self, fmt: str, in_memory: bool, big: bool) -> None:
        """Build a static cache from the tokens, write it in a format, open it with each implementation."""
        from lookupdec.formats import write_static

        contents = ref.build_static(self.tokens).contents()
        if big:  # counts whose weight 100*c or score c*w overflows int32 (spec 5)
            contents = [(k, [(t, min(c * 21474837 + t % 7, 2**31 - 1)) for t, c in f]) for k, f in contents]
        path = self.path()
        write_static(contents, path, fmt)
        from lookupdec.cli._pipeline import load_static

        if fmt == "llama" and not contents:  # a 0-byte file: refused as a static cache by both
            with pytest.raises(CacheFormatError, match="empty file"):
                load_static(ref, str(path))
            with pytest.raises(CacheFormatError, match="empty file"):
                self.fast.load_static(path)
            return
        self.static = (load_static(ref, str(path)), self.fast.load_static(path, in_memory=in_memory))

    @rule(n_ctx=st.integers(2, 40), n_draft=st.integers(1, 9))
    def replay(self, n_ctx: int, n_draft: int) -> None:
        results = [
            (r.n_drafted, r.n_accept, r.n_predict)
            for r in (
                impl.replay(self.tokens, n_ctx, n_draft, static, dyn)
                for impl, static, dyn in zip((ref, self.fast), self.static, self.dyn, strict=True)
            )
        ]
        assert results[0] == results[1]

    def teardown(self) -> None:
        """Remove this run's files (hypothesis runs the machine dozens of times per test)."""
        for source in self.static:
            close = getattr(source, "close", None)
            if close is not None:
                close()
        shutil.rmtree(self.dir, ignore_errors=True)

    @invariant()
    def caches_agree(self) -> None:
        for a, b in (self.ctx, self.dyn):
            assert a.contents() == b.contents()
            assert (len(a), a.n_entries, a.total_count) == (len(b), b.n_entries, b.total_count)


def test_lockstep(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where mkdtemp puts the machines' folders
    Lockstep.TestCase.settings = settings(
        max_examples=60, stateful_step_count=25, deadline=None, suppress_health_check=[HealthCheck.too_slow]
    )
    runner = Lockstep.TestCase("runTest")
    runner.runTest()
    assert not list(tmp_path.glob("lookupdec-lockstep-*")), "the state machine left its temporary folders"


if __name__ == "__main__":  # pragma: no cover
    pytest.main([__file__])
