"""The ``lookupdec`` command line, in-process through ``lookupdec.cli.main`` and once as ``python -m``."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import lookupdec
from lookupdec import cli, formats
from lookupdec.cli import _pipeline
from lookupdec.reference import NgramCache, build_static, replay
from tests.conftest import vectors
from tests.test_tokens import make_tokenizer


def load_any(path: str | os.PathLike[str]) -> NgramCache:
    """A cache file of any enumerable format as a reference cache (it reads only legacy files itself)."""
    return NgramCache.from_contents(formats.read_as_contents(path))


STATS_JSON_FIELDS = {
    "n_ctx", "n_draft", "n_predict", "n_drafted", "n_accept", "accept", "t_draft_ms", "t_load_ms",
    "us_per_drafted_token", "impl", "compiled", "peak_rss_mb",
}  # fmt: skip


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def write_bin(path: Path, tokens: list[int]) -> str:
    np.asarray(tokens, dtype="<i4").tofile(path)
    return str(path)


def assert_clean_error(code: int, err: str, *needles: str) -> None:
    assert code == 2
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("lookupdec: error: "), err
    for needle in needles:
        assert needle in lines[0], (needle, err)


@pytest.fixture(scope="module")
def replay_vectors() -> dict[str, Any]:
    return vectors("replay")


@pytest.fixture
def files(tmp_path: Path, replay_vectors: dict[str, Any]) -> dict[str, str]:
    """The replay vector's tokens and static corpus as token files."""
    return {
        "replay": write_bin(tmp_path / "replay.bin", replay_vectors["tokens"]),
        "corpus": write_bin(tmp_path / "corpus.bin", replay_vectors["static_corpus"]),
        "dir": str(tmp_path),
    }


# --- version and help ------------------------------------------------------------------------


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--version")
    assert code == 0
    yes_no = "yes" if lookupdec.COMPILED else "no"
    assert out.strip() == f"lookupdec {lookupdec.__version__} (compiled: {yes_no})"


@pytest.mark.parametrize(
    ("command", "mirrors"),
    [
        ("create", "llama-lookup-create"),
        ("stats", "llama-lookup-stats"),
        ("merge", "llama-lookup-merge"),
        ("inspect", "No llama.cpp counterpart"),
        ("demo", "llama-lookup-stats"),
    ],
)
def test_help_teaches(capsys: pytest.CaptureFixture[str], command: str, mirrors: str) -> None:
    code, out, _ = run(capsys, command, "--help")
    assert code == 0
    assert mirrors in " ".join(out.split())
    assert "examples:" in out
    assert f"lookupdec {command}" in out


def test_top_help_lists_commands(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--help")
    assert code == 0
    for command in ("create", "stats", "merge", "inspect", "demo"):
        assert command in out


def test_no_command(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys)
    assert code == 2
    assert "usage" in err


# --- create / inspect / stats round trip -------------------------------------------------------


@pytest.mark.parametrize("fmt", ["llama", "lookupdec", "fork-v2"])
def test_create_inspect_stats_roundtrip(
    capsys: pytest.CaptureFixture[str], files: dict[str, str], replay_vectors: dict[str, Any], fmt: str
) -> None:
    static = os.path.join(files["dir"], f"static.{fmt}")
    code, out, err = run(capsys, "create", files["corpus"], "-o", static, "--format", fmt)
    assert code == 0, err
    assert static in out and "2-grams" in out
    expected = build_static(replay_vectors["static_corpus"])
    assert load_any(static) == expected

    code, out, err = run(capsys, "inspect", static, "--json", "--top", "3")
    assert code == 0, err
    info = json.loads(out)
    assert info["format"] == fmt
    assert info["kind"].startswith("static")
    assert info["n_keys"] == len(expected)
    assert info["n_entries"] == expected.n_entries
    assert info["total_count"] == expected.total_count
    assert info["keys_by_ngram_size"] == {"2": len(expected)}
    assert len(info["heaviest"]) == 3
    top = info["heaviest"][0]
    assert top["total"] == max(sum(part.values()) for _, part in expected.items())

    code, out, err = run(capsys, "stats", files["replay"], "-lcs", static, "-c", "256", "--n-draft", "8", "--json")
    assert code == 0, err
    stats = json.loads(out)
    run_vec = next(r for r in replay_vectors["runs"] if (r["n_ctx"], r["n_draft"], r["use_static"]) == (256, 8, True))
    assert (stats["n_drafted"], stats["n_accept"]) == (run_vec["expected_n_drafted"], run_vec["expected_n_accept"])
    assert stats["static_format"] == fmt


def test_create_several_corpora_counts_each_separately(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    a = write_bin(tmp_path / "a.bin", [1, 2, 3, 4])
    b = write_bin(tmp_path / "b.bin", [5, 6, 1, 2, 3])
    out_path = str(tmp_path / "s.bin")
    code, _, err = run(capsys, "create", a, b, "-o", out_path, "--format", "llama", "-q")
    assert code == 0, err
    expected = build_static([1, 2, 3, 4])
    expected.merge(build_static([5, 6, 1, 2, 3]))
    got = load_any(out_path)
    assert got == expected
    assert got.get([4, 5]) == {}  # no 2-gram across the two files
    assert got.get([1, 2]) == {3: 2}


def test_create_long_corpus_windows(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # longer than one progress window (65536 tokens): the windows must not lose or double 2-grams
    rng = np.random.default_rng(7)
    tokens = rng.integers(0, 50, size=70_000).tolist()
    corpus = write_bin(tmp_path / "c.bin", tokens)
    out_path = str(tmp_path / "s.bin")
    code, _, err = run(capsys, "create", corpus, "-o", out_path, "--format", "llama", "-q", "--impl", "reference")
    assert code == 0, err
    assert load_any(out_path) == build_static(tokens)


def test_create_from_text_with_tokenizer(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    tok = make_tokenizer(tmp_path / "tokenizer.json")
    text = tmp_path / "corpus.txt"
    text.write_text("the cat sat on the mat . the cat sat .", encoding="utf-8")
    out_path = str(tmp_path / "s.bin")
    code, _, err = run(capsys, "create", str(text), "--tokenizer", str(tok), "-o", out_path, "--format", "llama")
    assert code == 0, err
    assert load_any(out_path) == build_static([1, 2, 3, 4, 5, 2, 6, 7, 2, 3, 4, 7])
    code, _, err = run(
        capsys, "create", str(text), "--tokenizer", str(tok), "--no-add-bos", "-o", out_path, "--format", "llama"
    )
    assert code == 0, err
    assert load_any(out_path) == build_static([2, 3, 4, 5, 2, 6, 7, 2, 3, 4, 7])


# --- stats ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("impl", ["reference", "fast"])
@pytest.mark.parametrize(("n_ctx", "n_draft"), [(256, 3), (512, 8), (650, 16)])
@pytest.mark.parametrize("use_static", [False, True])
def test_stats_matches_replay_vectors(
    capsys: pytest.CaptureFixture[str],
    files: dict[str, str],
    replay_vectors: dict[str, Any],
    impl: str,
    n_ctx: int,
    n_draft: int,
    use_static: bool,
) -> None:
    argv = ["stats", files["replay"], "-c", str(n_ctx), "--n-draft", str(n_draft), "--json", "--impl", impl]
    if use_static:
        static = os.path.join(files["dir"], "static.bin")
        build_static(replay_vectors["static_corpus"]).save(static)
        argv += ["-lcs", static]
    code, out, err = run(capsys, *argv)
    assert code == 0, err
    stats = json.loads(out)
    vec = next(
        r for r in replay_vectors["runs"] if (r["n_ctx"], r["n_draft"], r["use_static"]) == (n_ctx, n_draft, use_static)
    )
    assert stats["n_drafted"] == vec["expected_n_drafted"]
    assert stats["n_accept"] == vec["expected_n_accept"]
    assert stats["impl"] == impl


def test_stats_json_fields(capsys: pytest.CaptureFixture[str], files: dict[str, str]) -> None:
    code, out, err = run(capsys, "stats", files["replay"], "-c", "512", "--json")
    assert code == 0, err
    stats = json.loads(out)
    assert set(stats) >= STATS_JSON_FIELDS
    n_tokens = len(vectors("replay")["tokens"])
    assert stats["n_ctx"] == 512 and stats["n_draft"] == 8
    assert stats["n_predict"] == n_tokens - n_tokens % 512
    assert stats["accept"] == pytest.approx(100 * stats["n_accept"] / stats["n_drafted"])
    assert stats["us_per_drafted_token"] == pytest.approx(1e3 * stats["t_draft_ms"] / stats["n_drafted"])
    assert stats["impl"] == lookupdec.IMPLEMENTATION
    assert stats["compiled"] is lookupdec.COMPILED
    assert stats["peak_rss_mb"] > 1
    assert stats["t_load_ms"] >= 0


def test_stats_default_n_ctx(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    tokens = (list(range(40)) * 120)[:4500]  # > 4096: one chunk at the default n_ctx
    path = write_bin(tmp_path / "r.bin", tokens)
    code, out, err = run(capsys, "stats", path, "--json", "--impl", "reference")
    assert code == 0, err
    stats = json.loads(out)
    expected = replay(tokens, 4096, 8)
    assert (stats["n_ctx"], stats["n_draft"]) == (4096, 8)
    assert (stats["n_drafted"], stats["n_accept"]) == (expected.n_drafted, expected.n_accept)


def test_stats_human_output_mirrors_llama(capsys: pytest.CaptureFixture[str], files: dict[str, str]) -> None:
    code, out, err = run(capsys, "stats", files["replay"], "-c", "256", "--n-draft", "3", "--impl", "reference")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == "n_draft      = 3"
    assert lines[1] == f"n_predict    = {2600 - 2600 % 256}"
    assert lines[2] == "n_drafted    = 2619"
    assert lines[3].startswith("t_draft_flat = ") and lines[3].endswith(" ms")
    assert lines[4].startswith("t_draft      = ") and "us per token" in lines[4] and "tokens per second" in lines[4]
    assert lines[5] == "n_accept     = 1098"
    assert lines[6] == f"accept       = {100 * 1098 / 2619:.3f}%"
    assert lines[7].startswith("impl         = reference (compiled: no)")


def test_stats_dynamic_cache(capsys: pytest.CaptureFixture[str], files: dict[str, str], tmp_path: Path) -> None:
    tokens = vectors("replay")["tokens"]
    dyn_path = str(tmp_path / "dynamic.bin")
    dynamic = NgramCache()
    dynamic.update(tokens[:1000], 1000)
    dynamic.save(dyn_path)
    code, out, err = run(capsys, "stats", files["replay"], "-lcd", dyn_path, "-c", "256", "--json")
    assert code == 0, err
    stats = json.loads(out)
    expected = replay(tokens, 256, 8, None, load_any(dyn_path))
    assert (stats["n_drafted"], stats["n_accept"]) == (expected.n_drafted, expected.n_accept)
    assert stats["dynamic_found"] is True
    before = Path(dyn_path).read_bytes()
    assert Path(dyn_path).read_bytes() == before  # lookup-stats never writes the dynamic cache


def test_stats_missing_dynamic_is_empty(capsys: pytest.CaptureFixture[str], files: dict[str, str]) -> None:
    missing = os.path.join(files["dir"], "no-such-dynamic.bin")
    code, out, err = run(capsys, "stats", files["replay"], "-lcd", missing, "-c", "256", "--n-draft", "3", "--json")
    assert code == 0, err
    stats = json.loads(out)
    assert (stats["n_drafted"], stats["n_accept"]) == (2619, 1098)
    assert stats["dynamic_found"] is False
    assert not os.path.exists(missing)


def test_stats_text_with_tokenizer(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    tok = make_tokenizer(tmp_path / "tokenizer.json")
    text = tmp_path / "replay.txt"
    text.write_text(" ".join(["the cat sat on the mat ."] * 40), encoding="utf-8")
    code, out, err = run(capsys, "stats", str(text), "--tokenizer", str(tok), "-c", "64", "--json")
    assert code == 0, err
    stats = json.loads(out)
    ids = [1] + [2, 3, 4, 5, 2, 6, 7] * 40
    expected = replay(ids, 64, 8)
    assert (stats["n_drafted"], stats["n_accept"]) == (expected.n_drafted, expected.n_accept)
    assert stats["n_tokens"] == len(ids)


def test_stats_npy_replay(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    tokens = vectors("replay")["tokens"]
    path = tmp_path / "replay.npy"
    np.save(path, np.asarray(tokens, dtype=np.int64))
    code, out, err = run(capsys, "stats", str(path), "-c", "256", "--n-draft", "3", "--json")
    assert code == 0, err
    assert json.loads(out)["n_drafted"] == 2619


def test_stats_load_flag(capsys: pytest.CaptureFixture[str], files: dict[str, str], tmp_path: Path) -> None:
    static = str(tmp_path / "static.bin")
    build_static(vectors("replay")["static_corpus"]).save(static)
    code, out, err = run(capsys, "stats", files["replay"], "-lcs", static, "--load", "-c", "256", "--json")
    assert code == 0, err
    stats = json.loads(out)
    assert stats["static_in_memory"] is True
    assert (stats["n_drafted"], stats["n_accept"]) == (6033, 1278)


# --- merge and inspect ------------------------------------------------------------------------


@pytest.mark.parametrize("impl", ["reference", "fast"])
def test_merge(capsys: pytest.CaptureFixture[str], tmp_path: Path, impl: str) -> None:
    tokens = vectors("replay")["tokens"]
    a, b = NgramCache(), NgramCache()
    a.update(tokens[:1300], 1300)
    b.update(tokens[1300:], 1300)
    a.save(tmp_path / "a.bin")
    b.save(tmp_path / "b.bin")
    out_path = str(tmp_path / "merged.bin")
    code, out, err = run(
        capsys, "merge", str(tmp_path / "a.bin"), str(tmp_path / "b.bin"), "-o", out_path, "--impl", impl
    )
    assert code == 0, err
    assert out_path in out
    expected = NgramCache()
    expected.merge(a)
    expected.merge(b)
    assert load_any(out_path) == expected
    assert formats.detect_format(out_path) == "llama"

    code, out, err = run(capsys, "inspect", out_path)
    assert code == 0, err
    assert "dynamic or context" in out
    assert "heaviest n-grams" in out


def test_merge_dynamic_into_static_format_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    dyn = NgramCache()
    dyn.update([1, 2, 3, 4, 5], 5)
    dyn.save(tmp_path / "d.bin")
    out_path = tmp_path / "out.lkdc"
    code, _, err = run(capsys, "merge", str(tmp_path / "d.bin"), "-o", str(out_path), "--format", "lookupdec")
    assert_clean_error(code, err, str(out_path), "2-grams")
    assert not out_path.exists()


def test_merge_static_parts_into_lookupdec(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    corpus = vectors("replay")["static_corpus"]
    build_static(corpus[:5000]).save(tmp_path / "a.bin")
    build_static(corpus[5000:]).save(tmp_path / "b.bin")
    out_path = str(tmp_path / "s.lkdc")
    code, _, err = run(capsys, "merge", str(tmp_path / "a.bin"), str(tmp_path / "b.bin"), "-o", out_path,
                       "--format", "lookupdec")  # fmt: skip
    assert code == 0, err
    expected = build_static(corpus[:5000])
    expected.merge(build_static(corpus[5000:]))
    assert load_any(out_path) == expected
    code, out, err = run(capsys, "inspect", out_path, "--verify")
    assert code == 0, err
    assert "verify" in out and "ok" in out


def test_inspect_human(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    static = tmp_path / "s.bin"
    build_static([5, 6, 7, 5, 6, 8, 5, 6, 7]).save(static)
    code, out, err = run(capsys, "inspect", str(static), "--top", "2", "--verify")
    assert code == 0, err
    assert "format" in out and "llama" in out
    assert "static (2-grams only)" in out
    assert "5 6" in out  # the heaviest 2-gram
    assert "7x2" in out
    assert "verify" in out


def test_inspect_empty_cache(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    empty = tmp_path / "empty.bin"
    empty.write_bytes(b"")
    code, out, err = run(capsys, "inspect", str(empty), "--json")
    assert code == 0, err
    info = json.loads(out)
    assert info["kind"] == "empty" and info["n_keys"] == 0 and info["heaviest"] == []


def test_inspect_verify_strict_on_trailing_bytes(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    static = tmp_path / "s.bin"
    build_static([1, 2, 3]).save(static)
    with open(static, "ab") as f:
        f.write(b"\x00" * 5)
    code, _, err = run(capsys, "inspect", str(static))
    assert code == 0
    assert "lookupdec: warning:" in err and "trailing" in err
    code, _, err = run(capsys, "inspect", str(static), "--verify")
    assert_clean_error(code, err, str(static), "byte offset")


# --- bad input: one line, exit 2, no traceback -------------------------------------------------


def test_error_missing_replay(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    missing = str(tmp_path / "missing.bin")
    code, _, err = run(capsys, "stats", missing)
    assert_clean_error(code, err, missing)


def test_error_missing_static(capsys: pytest.CaptureFixture[str], files: dict[str, str]) -> None:
    missing = os.path.join(files["dir"], "missing.lkdc")
    code, _, err = run(capsys, "stats", files["replay"], "-lcs", missing)
    assert_clean_error(code, err, missing, "-lcs")


def test_error_missing_corpus_leaves_no_output(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out_path = tmp_path / "s.bin"
    code, _, err = run(capsys, "create", str(tmp_path / "missing.bin"), "-o", str(out_path))
    assert_clean_error(code, err, "missing.bin")
    assert not out_path.exists()


@pytest.mark.parametrize(
    ("data", "offset"),
    [
        (struct.pack("<4i", 1, 2, -1, -1), 16),  # key only: ntokens missing
        (struct.pack("<4ii", 1, 2, -1, -1, 0), 16),  # ntokens = 0
        (struct.pack("<4iiii", 1, 2, -1, -1, 2, 7, 1), 20),  # record cut short
        (struct.pack("<4iiii", 1, 2, -1, -1, 1, 7, 0), 24),  # count 0
    ],
)
def test_error_malformed_legacy_static(
    capsys: pytest.CaptureFixture[str], files: dict[str, str], data: bytes, offset: int
) -> None:
    bad = os.path.join(files["dir"], "bad.bin")
    Path(bad).write_bytes(data)
    code, _, err = run(capsys, "stats", files["replay"], "-lcs", bad)
    assert_clean_error(code, err, bad, f"at byte offset {offset}")


def test_error_truncated_legacy_cache_inspect_and_merge(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    good = tmp_path / "good.bin"
    build_static(vectors("replay")["static_corpus"][:300]).save(good)
    bad = tmp_path / "truncated.bin"
    bad.write_bytes(good.read_bytes()[:-20])
    code, _, err = run(capsys, "inspect", str(bad))
    assert_clean_error(code, err, str(bad), "byte offset")
    out_path = tmp_path / "out.bin"
    out_path.write_bytes(b"keep me")
    code, _, err = run(capsys, "merge", str(good), str(bad), "-o", str(out_path))
    assert_clean_error(code, err, str(bad), "byte offset")
    assert out_path.read_bytes() == b"keep me"  # the old output is left alone


def test_error_token_file_size(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = tmp_path / "odd.bin"
    bad.write_bytes(b"\x01\x00\x00\x00\x02\x00")
    code, _, err = run(capsys, "stats", str(bad))
    assert_clean_error(code, err, str(bad), "multiple of 4", "at byte offset 4")
    code, _, err = run(capsys, "create", str(bad), "-o", str(tmp_path / "s.bin"))
    assert_clean_error(code, err, str(bad), "at byte offset 4")
    assert not (tmp_path / "s.bin").exists()


def test_error_npy_out_of_int32(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = tmp_path / "big.npy"
    np.save(bad, np.array([1, 2, 2**40], dtype=np.int64))
    with open(bad, "rb") as f:
        np.lib.format.read_magic(f)
        np.lib.format.read_array_header_1_0(f)
        data_offset = f.tell()
    code, _, err = run(capsys, "stats", str(bad))
    assert_clean_error(code, err, str(bad), "int32", f"at byte offset {data_offset + 16}")


def test_error_text_without_tokenizer(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    text = tmp_path / "a.txt"
    text.write_text("hello")
    code, _, err = run(capsys, "stats", str(text))
    assert_clean_error(code, err, str(text), "--tokenizer")


@pytest.mark.parametrize(
    "argv",
    [
        ["stats"],
        ["stats", "x.bin", "--bogus"],
        ["stats", "x.bin", "-c", "many"],
        ["create", "x.bin"],
        ["create", "x.bin", "-o", "y", "--format", "gguf"],
        ["stats", "x.bin", "--impl", "turbo"],
        ["frobnicate"],
        ["stats", "x.bin", "--tokens", "--tokenizer", "t.json"],
    ],
)
def test_error_bad_args(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    code, _, err = run(capsys, *argv)
    assert_clean_error(code, err)


def test_error_bad_numbers(capsys: pytest.CaptureFixture[str], files: dict[str, str]) -> None:
    code, _, err = run(capsys, "stats", files["replay"], "-c", "0")
    assert_clean_error(code, err, "-c")
    code, _, err = run(capsys, "stats", files["replay"], "--n-draft", "-1")
    assert_clean_error(code, err, "--n-draft")


def test_error_folder_as_file(capsys: pytest.CaptureFixture[str], files: dict[str, str]) -> None:
    code, _, err = run(capsys, "stats", files["replay"], "-lcs", files["dir"])
    assert_clean_error(code, err, files["dir"], "folder")


# --- progress ----------------------------------------------------------------------------------------


def test_progress_bar_draws_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    with _pipeline.progress_bar(True, "replay") as progress:
        assert progress is not None
        progress(50, 100)
        progress(100, 100)
    _, err = capsys.readouterr()
    assert "replay" in err
    with _pipeline.progress_bar(False, "replay") as progress:
        progress(50, 100)  # silent, and interpreted: where signal handlers run (see the slow test below)
    assert capsys.readouterr().err == ""


# --- demo ----------------------------------------------------------------------------------------------


def demo_data() -> tuple[list[int], list[int]]:
    """The demo's corpus and replay tokens, read from the shipped files."""
    from lookupdec.cli import demo
    from lookupdec.tokens import read_tokens

    with demo.data_file(demo.CORPUS_FILE) as c, demo.data_file(demo.REPLAY_FILE) as r:
        return read_tokens(c).tolist(), read_tokens(r).tolist()


@pytest.mark.slow  # the reference replays 67,716 tokens twice (about 16 s)
def test_demo_reference(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "demo", "--impl", "reference", "--json")
    assert code == 0, err
    doc = json.loads(out)
    corpus, text = demo_data()
    assert doc["corpus_tokens"] == len(corpus) == 367_182 and doc["replay_tokens"] == len(text) == 67_716
    rows = doc["rows"]
    assert [(r["impl"], r["static"]) for r in rows] == [("reference", False), ("reference", True)]
    # Expected counts from the other implementation on the same tokens (n_ctx 4096, n_draft 8).
    from lookupdec import fast

    none = fast.replay(text, 4096, 8)
    corpus_static = fast.replay(text, 4096, 8, fast.build_static(corpus))
    assert (rows[0]["n_drafted"], rows[0]["n_accept"]) == (none.n_drafted, none.n_accept)
    assert (rows[1]["n_drafted"], rows[1]["n_accept"]) == (corpus_static.n_drafted, corpus_static.n_accept)


def test_demo_fast(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from lookupdec import tokens
    from lookupdec.cli import demo

    real_read = tokens.read_tokens

    def read_short(path: Any) -> Any:  # the reference computes the expected counts: keep it short
        arr = real_read(path)
        return arr[:6000] if str(path).endswith(demo.REPLAY_FILE) else arr[:60000]

    monkeypatch.setattr(tokens, "read_tokens", read_short)
    code, out, err = run(capsys, "demo", "--impl", "fast", "--json", "-c", "1024")
    assert code == 0, err
    rows = json.loads(out)["rows"]
    corpus, text = demo_data()  # read through the same shortening
    assert (len(corpus), len(text)) == (60000, 6000)
    # Expected counts from the reference on the same tokens.
    none = replay(text, 1024, 8)
    corpus_static = replay(text, 1024, 8, build_static(corpus))
    assert [(r["static"], r["n_drafted"], r["n_accept"]) for r in rows] == [
        (False, none.n_drafted, none.n_accept),
        (True, corpus_static.n_drafted, corpus_static.n_accept),
    ]


def test_demo_table(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from lookupdec import tokens
    from lookupdec.cli import demo

    real_read = tokens.read_tokens

    def read_short(path: Any) -> Any:  # a short replay keeps this test quick
        arr = real_read(path)
        return arr[:3000] if str(path).endswith(demo.REPLAY_FILE) else arr

    monkeypatch.setattr(tokens, "read_tokens", read_short)
    code, out, err = run(capsys, "demo", "--impl", "reference", "-c", "512")
    assert code == 0, err
    assert "implementation" in out and "accept %" in out and "load ms" in out
    assert "reference" in out and "corpus" in out and "none" in out
    assert "3,000 tokens" in out


# --- python -m lookupdec -----------------------------------------------------------------------------


def _subprocess_env() -> dict[str, str]:
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def test_python_m_version() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "lookupdec", "--version"], capture_output=True, text=True, env=_subprocess_env()
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"lookupdec {lookupdec.__version__} (compiled: ")


def test_python_m_error_has_no_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "odd.bin"
    bad.write_bytes(b"\x01\x02\x03")
    proc = subprocess.run(
        [sys.executable, "-m", "lookupdec", "stats", str(bad)], capture_output=True, text=True, env=_subprocess_env()
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip() == (
        f"lookupdec: error: {bad}: size 3 bytes is not a multiple of 4 (a raw token file holds little-endian "
        f"int32 ids); the last id is incomplete at byte offset 0"
    )


@pytest.mark.parametrize("static", [False, True])
def test_python_m_stats_reads_a_raw_replay_without_numpy(
    capsys: pytest.CaptureFixture[str], files: dict[str, str], static: bool
) -> None:
    """The replay's peak RSS (issue 10 item 4): numpy (~11 MB) stays out of ``stats`` on a raw
    token file, with no static cache or a lookupdec index (-lcs)."""
    args = [files["replay"], "-c", "256", "--n-draft", "3", "--json"]
    if static:
        index = str(Path(files["dir"]) / "static.lkdc")
        assert run(capsys, "create", files["corpus"], "-o", index, "-q")[0] == 0
        args += ["-lcs", index]
    code, out, err = run(capsys, "stats", *args, "--impl", "reference")
    assert code == 0, err
    expected = json.loads(out)["n_drafted"]
    script = (
        "import runpy, sys; sys.argv = ['lookupdec', 'stats', *sys.argv[1:]]\n"
        "try:\n    runpy.run_module('lookupdec', run_name='__main__')\n"
        "except SystemExit:\n    pass\n"
        "print('numpy' in sys.modules)"
    )
    proc = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, env=_subprocess_env())
    assert proc.returncode == 0, proc.stderr
    stats_line, numpy_line = proc.stdout.splitlines()
    assert json.loads(stats_line)["n_drafted"] == expected
    assert numpy_line == "False"


def test_python_m_stats(files: dict[str, str]) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "lookupdec", "stats", files["replay"], "-c", "256", "--n-draft", "3"],
        capture_output=True,
        text=True,
        env=_subprocess_env(),
    )
    assert proc.returncode == 0, proc.stderr
    assert "n_drafted    = 2619" in proc.stdout
    assert proc.stderr == ""  # stderr is not a terminal: no progress bar


def test_inspect_fork_v1_cannot_list(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "s.v1"
    formats.write_static(build_static([1, 2, 3, 1, 2, 4, 1, 2, 3]).items(), path, "fork-v1")
    code, out, err = run(capsys, "inspect", str(path))
    assert code == 0, err
    assert "fork-v1" in out and "not available" in out
    assert "lookupdec: warning:" in err
    code, out, err = run(capsys, "stats", str(path.with_suffix(".missing")), "-lcs", str(path))
    assert_clean_error(code, err, "missing")


def test_error_impl_not_available(
    capsys: pytest.CaptureFixture[str], files: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    real = lookupdec.implementation

    def no_fast(name: str) -> Any:
        if name == "fast":
            raise ImportError("No module named 'lookupdec.fast._cache'")
        return real(name)

    monkeypatch.setattr(lookupdec, "implementation", no_fast)
    assert _pipeline.available_implementations() == ["reference"]
    code, _, err = run(capsys, "stats", files["replay"], "--impl", "fast")
    assert_clean_error(code, err, "fast implementation is not available")


def test_create_records_vocab(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from lookupdec.tokens import vocab_info

    tok = make_tokenizer(tmp_path / "tokenizer.json")
    text = tmp_path / "corpus.txt"
    text.write_text("the cat sat on the mat .", encoding="utf-8")
    out_path = str(tmp_path / "s.lkdc")
    code, _, err = run(capsys, "create", str(text), "--tokenizer", str(tok), "-o", out_path)
    assert code == 0, err
    code, out, err = run(capsys, "inspect", out_path, "--json")
    assert code == 0, err
    details = json.loads(out)["details"]
    size, fingerprint = vocab_info(tok)
    assert details["vocab_size"] == size == 8
    assert details["vocab_fingerprint"] == fingerprint.hex()
    code, _, err = run(capsys, "create", str(text), "--tokenizer", str(tok), "-o", out_path, "--vocab-size", "128256")
    assert code == 0, err
    code, out, _ = run(capsys, "inspect", out_path, "--json")
    assert json.loads(out)["details"]["vocab_size"] == 128256


@pytest.mark.parametrize("impl", ["reference", "fast"])
def test_stats_policy_hybrid(capsys: pytest.CaptureFixture[str], files: dict[str, str], impl: str) -> None:
    results = {}
    for policy in ("llama", "hybrid"):
        code, out, err = run(
            capsys, "stats", files["replay"], "-c", "512", "--json", "--policy", policy, "--impl", impl
        )
        assert code == 0, err
        results[policy] = stats = json.loads(out)
        assert stats["policy"] == policy
        assert stats["tokens_per_step"] == pytest.approx((stats["n_accept"] + stats["n_steps"]) / stats["n_steps"])
        assert stats["wasted_per_step"] == pytest.approx((stats["n_drafted"] - stats["n_accept"]) / stats["n_steps"])
    # the llama policy is the default and unchanged: the same counts as the replay vectors
    vec = next(r for r in vectors("replay")["runs"] if (r["n_ctx"], r["n_draft"], r["use_static"]) == (512, 8, False))
    assert results["llama"]["n_drafted"] == vec["expected_n_drafted"]
    assert results["hybrid"]["n_accept"] >= results["llama"]["n_accept"]


@pytest.mark.parametrize("impl", ["reference", "fast"])
def test_stats_corpus_in_history(capsys: pytest.CaptureFixture[str], files: dict[str, str], impl: str) -> None:
    # --corpus puts the corpus into the hybrid history: the replay's counts are those of
    # replay(..., policy="hybrid", history=...) holding it
    code, out, err = run(
        capsys, "stats", files["replay"], "-c", "512", "--json", "--policy", "hybrid", "--impl", impl,
        "--corpus", files["corpus"],
    )  # fmt: skip
    assert code == 0, err
    stats = json.loads(out)
    m = lookupdec.implementation(impl)
    corpus = np.fromfile(files["corpus"], dtype="<i4").tolist()
    history = m.SuffixHistory()
    history.add_corpus(corpus)
    tokens = np.fromfile(files["replay"], dtype="<i4").tolist()
    want = m.replay(tokens, 512, 8, None, None, None, "hybrid", history)
    without = m.replay(tokens, 512, 8, None, None, None, "hybrid")
    assert (stats["n_steps"], stats["n_accept"], stats["n_drafted"]) == (want.n_steps, want.n_accept, want.n_drafted)
    assert (want.n_accept, want.n_drafted) != (without.n_accept, without.n_drafted)  # the corpus made a difference
    assert stats["corpus"] == files["corpus"] and stats["corpus_tokens"] == len(corpus)


def test_stats_corpus_needs_hybrid_and_a_file(capsys: pytest.CaptureFixture[str], files: dict[str, str]) -> None:
    code, _, err = run(capsys, "stats", files["replay"], "--corpus", files["corpus"])
    assert_clean_error(code, err, "--corpus", "--policy hybrid")
    missing = str(Path(files["dir"]) / "missing.bin")
    code, _, err = run(capsys, "stats", files["replay"], "--policy", "hybrid", "--corpus", missing)
    assert_clean_error(code, err, "missing.bin")


def test_corpus_file_and_static_index_swapped(capsys: pytest.CaptureFixture[str], files: dict[str, str]) -> None:
    # create writes the static index and the corpus file side by side; each given where the
    # other (or text) belongs is refused naming the file and what it is, not read as llama.cpp's
    # format or as token ids (which failed on a "record" or a "negative id" inside its header).
    d = Path(files["dir"])
    static, corpus = str(d / "s.lkdc"), str(d / "c.lkcorpus")
    code, _, err = run(
        capsys, "create", files["corpus"], "-o", static, "--corpus-out", corpus, "--vocab-size", "128256", "-q"
    )
    assert code == 0, err
    argv: tuple[str, ...]
    for argv in (
        ("stats", files["replay"], "-lcs", corpus),
        ("stats", files["replay"], "-lcd", corpus),
        ("merge", corpus, static, "-o", str(d / "m.lkdc")),
    ):
        code, _, err = run(capsys, *argv)
        assert_clean_error(code, err, corpus, "a lookupdec corpus file", "not an n-gram cache")
    for argv in (
        ("stats", files["replay"], "--policy", "hybrid", "--corpus", static),
        ("stats", static),
        ("create", static, "-o", str(d / "again.lkdc")),
    ):
        code, _, err = run(capsys, *argv)
        assert_clean_error(code, err, static, "a lookupdec static index", "not text or token ids")
    code, _, err = run(capsys, "stats", corpus, "--tokens")
    assert_clean_error(code, err, corpus, "a lookupdec corpus file", "not text or token ids")
    assert not (d / "m.lkdc").exists() and not (d / "again.lkdc").exists()


def test_more_inputs_refused_before_the_work(
    capsys: pytest.CaptureFixture[str], files: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    d = Path(files["dir"])
    argv: tuple[str, ...]
    fifo = d / "vocab.fifo"
    os.mkfifo(fifo)  # read, it would block stats and create forever
    for argv in (
        ("stats", files["replay"], "--tokenizer", str(fifo)),
        ("create", files["corpus"], "--tokenizer", str(fifo), "-o", str(d / "x.lkdc")),
    ):
        code, _, err = run(capsys, *argv)
        assert_clean_error(code, err, "vocab.fifo", "is a fifo", "--tokenizer")
    for bad in ("-1", "0", str(2**31 + 1)):
        code, _, err = run(capsys, "create", files["corpus"], "-o", str(d / "v.lkdc"), "--vocab-size", bad)
        assert_clean_error(code, err, "--vocab-size must be in 1..2^31")
    gguf = d / "model.gguf"
    gguf.write_bytes(b"GGUF" + bytes(60))  # a model or vocabulary given as a cache
    for argv in (("stats", files["replay"], "-lcs", str(gguf)), ("inspect", str(gguf))):
        code, _, err = run(capsys, *argv)
        assert_clean_error(code, err, "model.gguf", "a GGUF file", "not an n-gram cache")
    # a draft length past MAX_DRAFT took gigabytes and never ended
    code, _, err = run(capsys, "stats", files["replay"], "--n-draft", "2147483647")
    assert_clean_error(code, err, "n_draft must be <= 65536")
    # an output folder that cannot be written is named before anything is written (create with
    # -o and --corpus-out wrote -o, then failed on the other); as root chmod does not stop a
    # write, so the check is made to fail here
    (d / "s.lkdc").write_bytes(b"old")
    real_access = os.access
    ro = str(d / "ro")
    os.mkdir(ro)
    monkeypatch.setattr(os, "access", lambda path, mode: False if str(path) == ro else real_access(path, mode))
    code, _, err = run(
        capsys, "create", files["corpus"], "-o", str(d / "s.lkdc"), "--corpus-out", str(d / "ro" / "c.lkcorpus")
    )
    assert_clean_error(code, err, "c.lkcorpus", "folder is not writable")
    assert (d / "s.lkdc").read_bytes() == b"old"
    # -o and --corpus-out naming one new file: the index was written, then replaced by the
    # corpus file, with no error; an empty -o was "exists and is a folder" (realpath('') is '.')
    same = str(d / "same.lkdc")
    for argv in (
        ("create", files["corpus"], "-o", same, "--corpus-out", same),
        ("create", files["corpus"], "-o", same, "--corpus-out", str(d / "." / "same.lkdc")),
    ):
        code, _, err = run(capsys, *argv)
        assert_clean_error(code, err, "same.lkdc", "is also the command's other output")
    assert not os.path.exists(same)
    for argv in (
        ("create", files["corpus"], "-o", ""),
        ("create", files["corpus"], "-o", same, "--corpus-out", ""),
        ("merge", files["corpus"], "-o", ""),
        ("tokenize", files["corpus"], "--tokenizer", files["corpus"], "-o", ""),
    ):
        code, _, err = run(capsys, *argv)
        assert_clean_error(code, err, "an empty output path")
    assert not os.path.exists(same)


def test_inspect_corpus_file(capsys: pytest.CaptureFixture[str], files: dict[str, str]) -> None:
    d = Path(files["dir"])
    corpus = str(d / "c.lkcorpus")
    code, _, err = run(
        capsys,
        "create",
        files["corpus"],
        "-o",
        str(d / "s.lkdc"),
        "--corpus-out",
        corpus,
        "--vocab-size",
        "128256",
        "-q",
    )
    assert code == 0, err
    ids = np.fromfile(files["corpus"], dtype="<i4")
    code, out, err = run(capsys, "inspect", corpus, "--verify", "--json")
    assert code == 0, err
    info = json.loads(out)
    assert (info["format"], info["n_tokens"], info["vocab_size"], info["verified"]) == (
        "corpus",
        len(ids),
        128256,
        True,
    )
    # bigrams with a token after them, counted from the ids (the file indexes those)
    assert info["n_bigrams"] == len(set(zip(ids[:-2].tolist(), ids[1:-1].tolist(), strict=True)))
    code, out, err = run(capsys, "inspect", corpus)
    assert code == 0, err
    assert f"{len(ids):,} (ids" in out and "128,256 ids" in out and "corpus, version" in out
    data = bytearray(Path(corpus).read_bytes())
    data[-1] ^= 0xFF  # the trigram section's last byte: only the full check reads it
    Path(corpus).write_bytes(bytes(data))
    code, _, err = run(capsys, "inspect", corpus)
    assert code == 0, err
    code, _, err = run(capsys, "inspect", corpus, "--verify")
    assert_clean_error(code, err, corpus, "checksum")


@pytest.mark.parametrize("impl", ["reference", "fast"])
def test_stats_target_waste(capsys: pytest.CaptureFixture[str], files: dict[str, str], impl: str) -> None:
    # --target-waste gives replay(..., target_waste=W)'s counts; a low target wastes less than the default
    tokens = np.fromfile(files["replay"], dtype="<i4").tolist()
    m = lookupdec.implementation(impl)
    wasted = {}
    for tw in (0.3, None):
        flag = ["--target-waste", str(tw)] if tw is not None else []
        code, out, err = run(
            capsys, "stats", files["replay"], "-c", "512", "--json", "--policy", "hybrid", "--impl", impl, *flag
        )
        assert code == 0, err
        stats = json.loads(out)
        want = m.replay(tokens, 512, 8, None, None, None, "hybrid", None, 1, tw)
        counts = (stats["n_steps"], stats["n_accept"], stats["n_drafted"])
        assert counts == (want.n_steps, want.n_accept, want.n_drafted)
        assert stats["target_waste"] == tw
        wasted[tw] = stats["wasted_per_step"]
    assert wasted[0.3] < wasted[None]


def test_stats_target_waste_errors(capsys: pytest.CaptureFixture[str], files: dict[str, str]) -> None:
    code, _, err = run(capsys, "stats", files["replay"], "--target-waste", "0.5")
    assert_clean_error(code, err, "--target-waste", "--policy hybrid")
    code, _, err = run(capsys, "stats", files["replay"], "--policy", "hybrid", "--target-waste", "-1")
    assert_clean_error(code, err, "--target-waste", "[0, 64]")


def test_stats_policy_text_and_bad_choice(capsys: pytest.CaptureFixture[str], files: dict[str, str]) -> None:
    code, out, err = run(capsys, "stats", files["replay"], "-c", "512", "--policy", "hybrid")
    assert code == 0, err
    assert "policy       = hybrid:" in out and "tokens per step" in out
    code, out, err = run(capsys, "stats", files["replay"], "--policy", "best")
    assert code == 2
    assert "invalid choice: 'best'" in err


@pytest.mark.slow
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_a_long_compiled_replay_stops_at_once_when_asked(tmp_path: Path, sig: str) -> None:
    """Without a progress bar the compiled replay never entered the interpreter: a Ctrl-C or a
    kill waited for the whole replay (60 s for enwiki_wt.10M with the hybrid policy)."""
    import signal
    import time

    from tests.conftest import SHARED_DATA

    corpus = SHARED_DATA / "enwiki_wt.10M.llama3.bin"
    if not corpus.exists():
        pytest.skip(f"{corpus} is not here")
    ids = np.fromfile(corpus, dtype="<i4")
    big = tmp_path / "big.bin"
    np.concatenate([ids, ids]).tofile(big)  # a replay of tens of seconds in any implementation
    argv = [sys.executable, "-m", "lookupdec", "stats", str(big), "--policy", "hybrid", "-q"]
    run = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(4)  # past the start: the replay runs
    assert run.poll() is None
    sent = time.monotonic()
    run.send_signal(getattr(signal, sig))
    _, err = run.communicate(timeout=60)
    waited = time.monotonic() - sent
    # stats has no temporary folder: kill keeps its default (the process ends at once)
    assert run.returncode == (-signal.SIGTERM if sig == "SIGTERM" else 130), err
    assert err.strip() == ("" if sig == "SIGTERM" else "lookupdec: interrupted")
    assert waited < 30, waited  # one chunk of 4,096 tokens (ms), not the rest of the replay (over a minute)
