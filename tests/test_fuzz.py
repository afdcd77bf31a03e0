"""The fuzz suite (tests/fuzz.py): a short and a long seeded run, both marked slow.

Every mutant of every format, through every entry point, must be a clean error or a result,
the same in both implementations: never a traceback, a crash, a hang, a different result
or more than a few MB allocated. The long run: ``python -m tests.fuzz --n 2000``.
"""

from __future__ import annotations

import os

import pytest

from tests import fuzz


def _check(n: int, seed: int) -> None:
    report = fuzz.fuzz(n, seed)
    assert not report["bad"], report["bad"][:5]
    for fmt, counts in report["counts"].items():
        assert sum(counts.values()) == fuzz.n_entries(fmt) * n, (fmt, counts)  # every mutant, every entry point


@pytest.mark.slow  # a process per format, two at once: ~10 s of CPU, which kept the README's
# test command over a minute; the default run keeps the exhaustive word tests of test_hardening
# and test_corpus, and the classifier and seed tests below
def test_fuzz_short() -> None:
    # 5 mutants per entry point of each format: the quick seeded run; test_fuzz_long and
    # `python -m tests.fuzz` go deep.
    _check(int(os.environ.get("LOOKUPDEC_FUZZ_N", "5")), seed=0)


@pytest.mark.slow
def test_fuzz_long() -> None:
    _check(300, seed=12345)


def test_classifier_flags_what_it_must() -> None:
    """The classifier itself: a disagreement, an escape and an allocation are each caught."""
    assert fuzz.classify([("ok", "1", 0), ("ok", "1", 0)])[0] == "same"
    assert fuzz.classify([("ok", "1", 0), ("ok", "2", 0)])[0] == "different"
    assert fuzz.classify([("ok", "1", 0), ("error", "x", 0)])[0] == "different"
    assert fuzz.classify([("error", "x", 0), ("error", "y", 0)])[0] == "error"
    assert fuzz.classify([("traceback", "KeyError", 0), ("ok", "1", 0)])[0] == "traceback"
    assert fuzz.classify([("ok", "1", fuzz.MEMORY_LIMIT + 1)])[0] == "memory"


def test_seeds_are_small_and_valid(tmp_path: object) -> None:
    """The seeds are about 1 KB (the size the memory bound is about), and each opens cleanly."""
    from pathlib import Path

    from lookupdec import formats
    from lookupdec.formats.corpus import read_corpus_header

    for fmt in fuzz.FORMATS:
        path = Path(str(tmp_path)) / fmt
        fuzz.make_seed(fmt, path)
        assert 0 < path.stat().st_size <= 1280, (fmt, path.stat().st_size)  # ~1 KB (a fork constmap is ~0.9 KB)
        if fmt == "corpus":
            assert read_corpus_header(path).n_bigrams > 0
        else:
            assert formats.inspect_file(path, verify=fmt != "fork-v1")["n_keys"] > 0


def test_corpus_seed_replay_reads_the_trigram_section(tmp_path: object) -> None:
    """The corpus format's stats run reaches the trigram search's corpus part: with the seed's
    trigram section's positions all set to 2 (below 3), the fast path refuses it, the reference
    (which reads only the ids) drafts."""
    from pathlib import Path

    import numpy as np

    from tests.test_corpus import set_words, trigram_offsets

    work = Path(str(tmp_path))
    fuzz.make_seed("corpus", work / "seed")
    data = bytearray((work / "seed").read_bytes())
    set_words(data, trigram_offsets(data), 2)
    (work / "mutant").write_bytes(bytes(data))
    replay = str(work / "replay.bin")
    np.asarray(fuzz.CORPUS_REPLAY, dtype="<i4").tofile(replay)
    kinds = {}
    for name, runs in fuzz.entries(str(work / "mutant"), replay, str(work), "corpus"):
        ((argv, _),) = runs
        kind, value, _ = fuzz.run_cli(argv)
        kinds[name] = (kind, value)
    assert kinds["stats --corpus (fast)"][0] == "error" and "trigram entry" in kinds["stats --corpus (fast)"][1]
    assert kinds["stats --corpus (reference)"][0] == "ok"


def test_memory_limit_is_measured(monkeypatch: pytest.MonkeyPatch) -> None:
    """run_cli reports what an entry point allocates: a 16 MB allocation is seen as a blow-up."""
    import tracemalloc

    from lookupdec import cli

    def greedy(argv: list[str]) -> int:
        blob = bytearray(2 * fuzz.MEMORY_LIMIT)
        return len(blob) * 0

    tracemalloc.start()
    try:
        assert fuzz.run_cli(["--version"])[0] == "ok"
        monkeypatch.setattr(cli, "main", greedy)
        kind, value, peak = fuzz.run_cli(["inspect", "x"])
        assert fuzz.classify([(kind, value, peak)])[0] == "memory"
    finally:
        tracemalloc.stop()
