"""lookupdec.builder: bounded-memory, multi-process create and streaming merge of static indexes.

Expected files come from independent writers: ``lookupdec.formats.write_static`` fed with
counts made here by ``collections.Counter`` (or by the fast implementation's NgramCache on
real data), never from the code under test.
"""

from __future__ import annotations

import os
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lookupdec import builder, formats
from lookupdec.cli import main
from lookupdec.errors import CacheFormatError, TokenFileError

from .conftest import DEMO_DATA, SHARED_DATA, fast_impl

DEMO = DEMO_DATA / "enwiki_wt.demo.llama3.bin"


def counted(corpora: list[list[int]]) -> dict[tuple[int, int, int, int], dict[int, int]]:
    """Static contents by plain counting: every (t[i-2], t[i-1]) -> t[i], corpus by corpus."""
    triples: Counter[tuple[int, int, int]] = Counter()
    for toks in corpora:
        for i in range(2, len(toks)):
            triples[(toks[i - 2], toks[i - 1], toks[i])] += 1
    contents: dict[tuple[int, int, int, int], dict[int, int]] = {}
    for (a, b, c), n in triples.items():
        contents.setdefault((a, b, -1, -1), {})[c] = n
    return contents


def expected_bytes(tmp_path: Path, corpora: list[list[int]]) -> bytes:
    path = tmp_path / "expected.lkdc"
    formats.write_static(counted(corpora).items(), path, "lookupdec")
    return path.read_bytes()


def write_corpora(tmp_path: Path, corpora: list[list[int]], suffix: str = ".bin") -> list[str]:
    paths = []
    for i, toks in enumerate(corpora):
        p = tmp_path / f"c{i}{suffix}"
        arr = np.array(toks, dtype="<i4")
        if suffix == ".npy":
            np.save(p, arr.astype(np.int64))
        else:
            arr.tofile(p)
        paths.append(str(p))
    return paths


def random_corpora(seed: int, lo: int, hi: int, sizes: list[int]) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    # A small alphabet makes repeated 2-grams and followers, so counts and picks are exercised.
    alphabet = rng.integers(lo, hi, size=40)
    return [alphabet[rng.integers(0, 40, size=n)].tolist() for n in sizes]


# Budgets: everything in memory; a few KB (many shards and buckets spilled).
BUDGETS = [None, 20_000, 3_000]


@pytest.mark.parametrize("memory", BUDGETS)
@pytest.mark.parametrize(
    ("lo", "hi"),
    [(0, 50_000), (-(2**31), 2**31 - 1), (2**21 - 20, 2**21 + 20)],
    ids=["vocab", "any-int32", "past-21-bits"],
)
def test_create_matches_independent_writer(tmp_path: Path, memory: int | None, lo: int, hi: int) -> None:
    corpora = random_corpora(7, lo, hi, [3000, 1, 2, 3, 0, 1500])
    paths = write_corpora(tmp_path, corpora)
    out = tmp_path / "out.lkdc"
    summary = builder.create_index(paths, out, memory=memory, workers=1)
    assert out.read_bytes() == expected_bytes(tmp_path, corpora)
    assert summary.total_count == sum(max(len(c) - 2, 0) for c in corpora)
    assert summary.saturated == 0


# Process pools are slow-marked (the default run stays light); one process covers the same spills.
POOL = pytest.mark.slow


@pytest.mark.parametrize(
    ("memory", "workers"),
    [
        (100_000, 1),
        pytest.param(None, 2, marks=POOL),
        pytest.param(200_000, 2, marks=POOL),
        pytest.param(100_000, 3, marks=POOL),
    ],
)
def test_create_same_bytes_for_any_workers_and_budget(tmp_path: Path, memory: int | None, workers: int) -> None:
    corpora = random_corpora(3, 0, 128_000, [20_000, 7_000])
    paths = write_corpora(tmp_path, corpora)
    want = expected_bytes(tmp_path, corpora)
    # 200 KB over 2 workers: 7 shards of 4096 ids, 19 buckets; 100 KB over 3: 40 buckets.
    out = tmp_path / f"out-{memory}-{workers}.lkdc"
    builder.create_index(paths, out, memory=memory, workers=workers)
    assert out.read_bytes() == want, (memory, workers)


def test_create_reads_npy_and_arrays(tmp_path: Path) -> None:
    corpora = random_corpora(5, 0, 1000, [500, 800])
    want = expected_bytes(tmp_path, corpora)
    npy = write_corpora(tmp_path, corpora, ".npy")
    builder.create_index(npy, tmp_path / "a.lkdc", memory=4_000)
    builder.create_index([np.array(c, dtype=np.int32) for c in corpora], tmp_path / "b.lkdc")
    assert (tmp_path / "a.lkdc").read_bytes() == want
    assert (tmp_path / "b.lkdc").read_bytes() == want


def test_create_empty_corpus_writes_empty_index(tmp_path: Path) -> None:
    paths = write_corpora(tmp_path, [[], [5, 6]])
    builder.create_index(paths, tmp_path / "e.lkdc")
    assert (tmp_path / "e.lkdc").read_bytes() == expected_bytes(tmp_path, [])
    assert (tmp_path / "e.lkdc").stat().st_size == 112


def test_create_demo_matches_fast_builder(tmp_path: Path) -> None:
    """The demo corpus: the same bytes as the fast implementation's NgramCache + write_static."""
    fast = fast_impl()
    from lookupdec.cli._pipeline import build_static_cache

    tokens = np.fromfile(DEMO, dtype="<i4")[:60_000]
    corpus = tmp_path / "demo-slice.bin"
    tokens.tofile(corpus)
    cache = build_static_cache(fast, [tokens.tolist()])
    formats.write_static(cache.items(), tmp_path / "old.lkdc", "lookupdec")
    for memory in [None, 400_000]:  # in memory, then spilled (2 workers: the slow real-slice test)
        builder.create_index([corpus], tmp_path / "new.lkdc", memory=memory, workers=1)
        assert (tmp_path / "new.lkdc").read_bytes() == (tmp_path / "old.lkdc").read_bytes()


@pytest.mark.parametrize(("impl", "n_tokens"), [("fast", 60_000), ("reference", 15_000)])
def test_cli_create_matches_the_in_memory_create(tmp_path: Path, capsys: Any, impl: str, n_tokens: int) -> None:
    """``lookupdec create`` (lookupdec format: lookupdec.builder) writes the bytes of the in-memory path.

    The in-memory path is what ``create --format llama``/``fork-v2`` still run, and what the
    default format ran before lookupdec.builder: an implementation's NgramCache counted by
    ``_pipeline.build_static_cache`` and written by ``_pipeline.write_cache`` (formats' writer).
    """
    import lookupdec
    from lookupdec.cli._pipeline import build_static_cache, write_cache

    tokens = np.fromfile(DEMO, dtype="<i4")[:n_tokens]
    halves = [tokens[: n_tokens // 3].tolist(), tokens[n_tokens // 3 :].tolist()]  # two corpora: no 2-gram spans them
    paths = write_corpora(tmp_path, halves)
    cache = build_static_cache(lookupdec.implementation(impl), halves)
    write_cache(cache, str(tmp_path / "old.lkdc"), "lookupdec", vocab_size=128256)
    out = str(tmp_path / "new.lkdc")
    assert main(["create", *paths, "-o", out, "-q", "--vocab-size", "128256"]) == 0, capsys
    assert Path(out).read_bytes() == (tmp_path / "old.lkdc").read_bytes()


@pytest.mark.parametrize("fmt", ["lookupdec", "llama"])
def test_cli_create_refuses_ids_past_the_vocabulary(tmp_path: Path, capsys: Any, fmt: str) -> None:
    (path,) = write_corpora(tmp_path, [[5, 6, 7, 300, 8]])
    out = tmp_path / "o.lkdc"
    assert main(["create", path, "-o", str(out), "-q", "--vocab-size", "300", "--format", fmt]) == 2
    err = capsys.readouterr().err
    assert err.startswith("lookupdec: error: ") and err.count("\n") == 1
    assert path in err and "token id 300" in err and "vocabulary size 300" in err
    assert not out.exists()
    assert main(["create", path, "-o", str(out), "-q", "--vocab-size", "301", "--format", fmt]) == 0


@pytest.mark.slow
def test_create_real_slice_matches_fast_builder(tmp_path: Path) -> None:
    """A 1M-token slice of enwiki_wt.10M, with budgets that spill dozens of buckets."""
    fast = fast_impl()
    from lookupdec.cli._pipeline import build_static_cache

    src = SHARED_DATA / "enwiki_wt.10M.llama3.bin"
    if not src.exists():
        pytest.skip(f"{src} is not here")
    tokens = np.fromfile(src, dtype="<i4")[:1_000_000]
    corpus = tmp_path / "slice.bin"
    tokens.tofile(corpus)
    cache = build_static_cache(fast, [tokens.tolist()])
    formats.write_static(cache.items(), tmp_path / "old.lkdc", "lookupdec")
    want = (tmp_path / "old.lkdc").read_bytes()
    for memory, workers in [(None, 2), (2_000_000, 2), (500_000, 1)]:
        builder.create_index([corpus], tmp_path / "new.lkdc", memory=memory, workers=workers)
        assert (tmp_path / "new.lkdc").read_bytes() == want, (memory, workers)


def test_bad_token_file_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "bad.bin"
    bad.write_bytes(b"\x01\x00\x00\x00\x02\x00")
    with pytest.raises(TokenFileError, match=r"bad\.bin"):
        builder.create_index([bad], tmp_path / "out.lkdc")
    assert not (tmp_path / "out.lkdc").exists()


@pytest.mark.parametrize(
    ("text", "value"), [("512M", 512 << 20), ("2G", 2 << 30), ("1.5g", 3 << 29), ("800K", 800 << 10), ("1000", 1000)]
)
def test_parse_memory(text: str, value: int) -> None:
    assert builder.parse_memory(text) == value


@pytest.mark.parametrize("text", ["", "lots", "-1G", "0", "nan"])
def test_parse_memory_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="memory"):
        builder.parse_memory(text)


# --------------------------------------------------------------------------------------
# merge of static indexes


def _indexes(tmp_path: Path, corpora: list[list[int]]) -> list[str]:
    paths = []
    for i, c in enumerate(corpora):
        p = tmp_path / f"in{i}.lkdc"
        formats.write_static(counted([c]).items(), p, "lookupdec")
        paths.append(str(p))
    return paths


@pytest.mark.parametrize("memory", [None, 30_000, 5_000])
def test_merge_indexes_matches_counting_everything(tmp_path: Path, memory: int | None) -> None:
    corpora = random_corpora(11, -5, 200, [2000, 10, 3000])
    inputs = _indexes(tmp_path, corpora)
    builder.merge_indexes(inputs, tmp_path / "m.lkdc", memory=memory)
    assert (tmp_path / "m.lkdc").read_bytes() == expected_bytes(tmp_path, corpora)


def test_merge_corrupt_input_writes_nothing(tmp_path: Path) -> None:
    inputs = _indexes(tmp_path, random_corpora(2, 0, 50, [300, 300]))
    data = bytearray(Path(inputs[1]).read_bytes())
    data[-3] ^= 0x40
    Path(inputs[1]).write_bytes(bytes(data))
    with pytest.raises(CacheFormatError, match=r"in1\.lkdc"):
        builder.merge_indexes(inputs, tmp_path / "m.lkdc")
    assert not (tmp_path / "m.lkdc").exists()


def test_merge_saturates_counts_past_int32(tmp_path: Path) -> None:
    big = 2**31 - 10
    for name in ("a", "b"):
        formats.write_static([((1, 2, -1, -1), {3: big, 4: 5})], tmp_path / f"{name}.lkdc", "lookupdec")
    summary = builder.merge_indexes([tmp_path / "a.lkdc", tmp_path / "b.lkdc"], tmp_path / "m.lkdc")
    assert summary.saturated == 1
    assert list(formats.read_as_contents(tmp_path / "m.lkdc")) == [((1, 2, -1, -1), [(3, 2**31 - 1), (4, 10)])]


# --------------------------------------------------------------------------------------
# command line


@POOL
def test_cli_create_memory_and_workers_same_file(tmp_path: Path, capsys: Any) -> None:
    a, b = str(tmp_path / "a.lkdc"), str(tmp_path / "b.lkdc")
    assert main(["create", str(DEMO), "-o", a, "-q"]) == 0
    assert main(["create", str(DEMO), "-o", b, "-q", "--memory", "4M", "--workers", "2"]) == 0
    assert Path(a).read_bytes() == Path(b).read_bytes()


@pytest.mark.parametrize(
    ("flag", "value", "message"), [("--memory", "lots", "--memory"), ("--workers", "0", "--workers")]
)
def test_cli_create_bad_budget(tmp_path: Path, capsys: Any, flag: str, value: str, message: str) -> None:
    code = main(["create", str(DEMO), "-o", str(tmp_path / "x.lkdc"), flag, value])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("lookupdec: error: ") and message in err and err.count("\n") == 1
    assert not (tmp_path / "x.lkdc").exists()


def test_cli_memory_below_the_floor_is_refused_before_any_work(tmp_path: Path, capsys: Any) -> None:
    # 64K made a create of 1M tokens crawl for over a minute (thousands of tiny spill pieces).
    code = main(["create", str(DEMO), "-o", str(tmp_path / "x.lkdc"), "--memory", "64K"])
    err = capsys.readouterr().err
    assert code == 2 and "--memory 64K" in err and "1M" in err and err.count("\n") == 1
    assert not (tmp_path / "x.lkdc").exists()


def test_cli_memory_is_checked_and_warned_about_where_unused(tmp_path: Path, capsys: Any) -> None:
    llama = str(tmp_path / "a.bin")
    assert main(["create", str(DEMO), "-o", llama, "--format", "llama", "-q"]) == 0
    out = str(tmp_path / "m.bin")
    # A bad value is refused whichever path the merge takes (the legacy merge ignored it).
    assert main(["merge", llama, llama, "-o", out, "--memory", "lots"]) == 2
    assert "--memory" in capsys.readouterr().err and not os.path.exists(out)
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        assert main(["merge", llama, llama, "-o", out, "--memory", "64M", "-q"]) == 0
        err = capsys.readouterr().err
        assert "warning" in err and "--memory" in err and "--format llama" in err
        assert main(["create", str(DEMO), "-o", llama, "--format", "llama", "--memory", "64M", "-q"]) == 0
        assert "does not use it" in capsys.readouterr().err


def test_a_budget_that_cuts_tiny_spill_pieces_warns_with_one_that_would_not(tmp_path: Path) -> None:
    sources = [builder.Source.open(DEMO)]
    with pytest.warns(UserWarning, match="is slow") as record:
        builder.make_plan(sources, memory=20_000, workers=2)
    suggested = int(str(record[0].message).split(" MiB or more")[0].rsplit(" ", 1)[1].replace(",", ""))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the suggested budget does not warn
        plan = builder.make_plan(sources, memory=suggested << 20, workers=2, force_spill=True)
    assert len(plan.shards) * max(len(plan.splitters) + 1, 2) <= builder._create.SLOW_PIECES


def test_pool_workers_leave_ctrl_c_to_the_parent() -> None:
    import multiprocessing
    import signal

    from lookupdec.builder import _create

    plan = builder.make_plan([builder.Source.open(DEMO)], memory=1 << 30, workers=1)
    with multiprocessing.get_context("fork").Pool(1, initializer=_create._set_state, initargs=(plan,)) as pool:
        assert pool.apply(signal.getsignal, (signal.SIGINT,)) == signal.SIG_IGN
        assert pool.apply(signal.getsignal, (signal.SIGTERM,)) == signal.SIG_DFL


def test_cli_killed_mid_create_removes_its_spill_folder(tmp_path: Path) -> None:
    """SIGTERM (kill) ended the program without clean-up: the spill folder stayed in $TMPDIR."""
    import subprocess
    import sys

    spill = tmp_path / "spill"
    spill.mkdir()
    script = f"""
import os, signal, sys, tempfile
from lookupdec.builder import _create
from lookupdec.cli import main
count = _create.count_spilled
def killed(plan, folder, *a, **k):
    assert os.listdir({str(spill)!r})  # the spill folder exists now
    os.kill(os.getpid(), signal.SIGTERM)
    return count(plan, folder, *a, **k)
_create.count_spilled = killed
sys.exit(main(["create", {str(DEMO)!r}, "-o", {str(tmp_path / "x.lkdc")!r}, "--memory", "1M", "--workers", "1"]))
"""
    env = {**os.environ, "TMPDIR": str(spill)}
    run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 143, run.stderr
    assert run.stderr == "lookupdec: terminated\n"
    assert os.listdir(spill) == [] and not (tmp_path / "x.lkdc").exists()


def test_cli_merge_streams_indexes_and_warns_once(tmp_path: Path, capsys: Any) -> None:
    big = 2**31 - 10
    for name in ("a", "b"):
        formats.write_static([((1, 2, -1, -1), {3: big}), ((5, 6, -1, -1), {7: big})], tmp_path / f"{name}.lkdc")
    out = str(tmp_path / "m.lkdc")
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        code = main(["merge", str(tmp_path / "a.lkdc"), str(tmp_path / "b.lkdc"), "-o", out, "--format", "lookupdec"])
    err = capsys.readouterr().err
    assert code == 0
    assert err.count("warning") == 1 and "m.lkdc" in err and "saturated" in err
    assert dict(formats.read_as_contents(out))[(1, 2, -1, -1)] == [(3, 2**31 - 1)]
    assert os.path.getsize(out) > 0


def test_plain_functions_as_another_engine_calls_them(tmp_path: Path) -> None:
    """docs/building.md's Spark recipe, with Python's map and a dict for the shuffle."""
    corpora = random_corpora(13, 0, 3000, [5000, 3000])
    paths = write_corpora(tmp_path, corpora)
    plan = builder.make_plan([builder.Source.open(p) for p in paths], memory=40_000, workers=1, force_spill=True)
    assert len(plan.shards) > 2 and len(plan.splitters) > 2
    grouped: dict[int, list[Any]] = {}
    for shard in reversed(plan.shards):  # any order: the reduce adds the runs up
        for b, run in enumerate(builder.count_shard(shard.read(plan.sources), plan.code, plan.splitters)):
            grouped.setdefault(b, []).append(run)
    parts = [builder.reduce_bucket(grouped[b], plan.code) for b in sorted(grouped)]
    stored = [builder.StoredPart.save(p, str(tmp_path / f"part-{b}")) for b, p in enumerate(parts)]
    builder.write_index(tmp_path / "out.lkdc", stored)
    assert (tmp_path / "out.lkdc").read_bytes() == expected_bytes(tmp_path, corpora)


@pytest.mark.parametrize("bits", [17, 21, 3])
def test_merge_runs_adds_counts_of_any_size(bits: int) -> None:
    from lookupdec.builder._count import merge_runs

    rng = np.random.default_rng(bits)
    runs = []
    want: Counter[int] = Counter()
    for _ in range(4):
        u = np.unique(rng.integers(0, min(2 ** (3 * bits), 5000), size=300)).astype(np.int64)
        c = rng.integers(1, 5, size=len(u)).astype(np.int64)
        c[rng.integers(0, len(u), size=10)] = rng.integers(4000, 2**40, size=10)  # past 12 bits
        runs.append((u, c))
        for a, n in zip(u.tolist(), c.tolist(), strict=True):
            want[a] += n
    u, c = merge_runs(runs)
    assert u.tolist() == sorted(want)
    assert c.tolist() == [want[a] for a in sorted(want)]


def _probe_in_python(homes: list[int], n_slots: int) -> list[int]:
    """The spec's canonical slot layout, key by key (docs/static-index.md "Canonical bytes")."""
    slots = [-1] * n_slots
    for ordinal, h in enumerate(homes):
        while slots[h] != -1:
            h = (h + 1) % n_slots
        slots[h] = ordinal
    return slots


@pytest.mark.parametrize("n_ranges", [1, 2, 8, 32])
@pytest.mark.parametrize("crowd", ["uniform", "end"], ids=["uniform", "wrapping"])
def test_slot_table_in_ranges_is_the_canonical_one(tmp_path: Path, n_ranges: int, crowd: str) -> None:
    """Filled range by range (carries between ranges, wrap past the last slot) = key by key."""
    from lookupdec.builder._write import fill_slots, fill_slots_ranged

    n_slots = 256
    rng = np.random.default_rng(n_ranges)
    n_keys = 120
    if crowd == "end":  # most homes in the last slots: clusters run past the end and wrap to slot 0
        homes = np.where(rng.random(n_keys) < 0.7, rng.integers(230, 256, n_keys), rng.integers(0, 256, n_keys))
    else:
        homes = rng.integers(0, n_slots, n_keys)
    homes = homes.astype(np.int64)
    want = _probe_in_python(homes.tolist(), n_slots)
    chunks = [homes[:50], homes[50:51], homes[51:]]
    table = fill_slots_ranged(chunks, n_slots, n_ranges, str(tmp_path))
    assert np.fromfile(table, dtype="<i4").tolist() == want
    slots = fill_slots(chunks, n_slots)
    assert [slots[i] for i in range(n_slots)] == want


def test_create_with_the_slot_table_in_ranges(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from lookupdec.builder import _write

    monkeypatch.setattr(_write, "MIN_RANGE", 16)
    corpora = random_corpora(17, 0, 5000, [4000])
    paths = write_corpora(tmp_path, corpora)
    n_slots = _write.n_slots_for(len({tuple(k) for k in counted(corpora)}))
    assert _write.slot_ranges(n_slots, 20_000) > 4
    builder.create_index(paths, tmp_path / "out.lkdc", memory=20_000, workers=1)
    assert (tmp_path / "out.lkdc").read_bytes() == expected_bytes(tmp_path, corpora)


def test_cli_create_asks_whether_an_unknown_name_is_tokens_or_text(tmp_path: Path, capsys: Any) -> None:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("some text, not token ids\n")
    out = tmp_path / "x.lkdc"
    assert main(["create", str(corpus), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "corpus.txt" in err and "--tokens" in err and err.count("\n") == 1
    assert not out.exists()
    # With --tokens the same bytes are read as raw int32 ids (28 bytes: 7 ids, 5 triples).
    corpus.write_bytes(np.arange(7, dtype="<i4").tobytes())
    assert main(["create", str(corpus), "-o", str(out), "--tokens", "-q"]) == 0
    assert out.read_bytes() == expected_bytes(tmp_path, [list(range(7))])


def test_a_full_disk_while_spilling_names_the_temporary_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """numpy's and a file's write raise ENOSPC naming no file: the error was a bare errno line."""
    import errno
    import tempfile

    from lookupdec.builder import _write

    spill = tmp_path / "spill"
    spill.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(spill))

    def full(part: Any, path: str) -> Any:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(_write.StoredPart, "save", staticmethod(full))
    out = tmp_path / "x.lkdc"
    code = main(["create", str(DEMO), "-o", str(out), "--memory", "1M", "--workers", "1"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert err.startswith(f"lookupdec: error: {spill}: No space left on device in lookupdec's temporary folder")
    assert "TMPDIR" in err
    assert not out.exists() and os.listdir(spill) == []
    # an error naming a file outside the folder (the output itself) is left as it was
    with pytest.raises(OSError, match="elsewhere") as info, _write.spill_folder("x-", spill):
        raise OSError(errno.ENOSPC, "elsewhere", str(out))
    assert info.value.filename == str(out)
    with pytest.raises(OSError, match="read failed") as info, _write.spill_folder("x-", spill):
        raise OSError(errno.EIO, "read failed")  # not a full disk: maybe an input's, left alone
    assert info.value.filename is None
