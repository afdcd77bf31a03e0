"""Every test vector produced by llama.cpp's own C++ (shared/spec/vectors), for every implementation."""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import Any

import pytest

from tests.conftest import vectors
from tests.impls import FastImpl, ImplTests, ReferenceImpl


def build(impl: ModuleType, seqs: Sequence[Sequence[int]], ngram_min: int, ngram_max: int) -> Any:
    """A cache made like the vectors' harness: one cache per sequence, merged in order."""
    cache = impl.NgramCache()
    for seq in seqs:
        part = impl.NgramCache()
        part.update(seq, len(seq), ngram_min, ngram_max)
        cache.merge(part)
    return cache


def as_json(contents: Any) -> list[Any]:
    """A cache's canonical contents in the vectors' JSON shape."""
    return [[list(key), [list(pair) for pair in followers]] for key, followers in contents]


def run_draft_case(impl: ModuleType, case: dict[str, Any]) -> list[int]:
    lo, hi = case["ngram_min"], case["ngram_max"]
    ctx = build(impl, case["context_from"], lo, hi)
    dyn = build(impl, case["dynamic_from"], lo, hi)
    static = build(impl, case["static_from"], 2, 2)
    inp = case["inp"]
    drafted = [inp[-1] if inp else 0]
    impl.draft(inp, drafted, case["n_draft"], lo, hi, ctx, dyn, static)
    return list(drafted[1:])


class VectorTests(ImplTests):
    @pytest.mark.parametrize("name", ["draft", "draft_ties"])
    def test_draft(self, name: str) -> None:
        cases = vectors(name)["cases"]
        assert len(cases) >= 100
        failures = [
            (case["id"], got, case["expected"])
            for case in cases
            if (got := run_draft_case(self.impl, case)) != case["expected"]
        ]
        assert failures == [], f"{len(failures)} of {len(cases)} cases differ (id, got, expected): {failures[:5]}"

    def test_update(self) -> None:
        for case in vectors("update")["cases"]:
            cache = self.impl.NgramCache()
            seq, n = case["seq"], 0
            for append_len, nnew in case["steps"]:
                n += append_len
                cache.update(seq[:n], nnew, case["ngram_min"], case["ngram_max"])
            assert as_json(cache.contents()) == case["expected"], f"update case {case['id']}"

    def test_merge(self) -> None:
        for case in vectors("merge")["cases"]:
            target = build(self.impl, case["target_from"], 1, 4)
            target.merge(build(self.impl, case["add_from"], 1, 4))
            assert as_json(target.contents()) == case["expected"], f"merge case {case['id']}"

    @pytest.mark.parametrize("run", range(18))
    def test_replay(self, run: int) -> None:
        data = vectors("replay")
        spec = data["runs"][run]
        static = self.impl.build_static(data["static_corpus"]) if spec["use_static"] else None
        result = self.impl.replay(data["tokens"], spec["n_ctx"], spec["n_draft"], static)
        assert (result.n_drafted, result.n_accept) == (spec["expected_n_drafted"], spec["expected_n_accept"])

    def test_legacy_files_load(self, tmp_path: Any) -> None:
        for i, case in enumerate(vectors("files")["legacy"]):
            expected = as_json(build(self.impl, [case["seq"]], case["ngram_min"], case["ngram_max"]).contents())
            assert expected == case["contents"]  # the harness's own description of the file
            for writer in ("upstream_file_hex", "fork_legacy_file_hex"):
                path = tmp_path / f"{i}-{writer}.bin"
                path.write_bytes(bytes.fromhex(case[writer]))
                assert as_json(self.impl.NgramCache.load(path).contents()) == case["contents"], (i, writer)


class TestVectorsReference(ReferenceImpl, VectorTests):
    pass


class TestVectorsFast(FastImpl, VectorTests):
    pass
