"""The C++ anchor (``perf/anchors/``, the fork's ngram-cache replicated) agrees with lookupdec.

Built with ``g++`` on first use (skipped with the reason where no compiler is found). On the
shared data (skipped where it is missing): the same drafted and accepted counts as
``lookupdec stats`` without a static cache, with a static cache in every format either side
writes, and with a dynamic cache; ``create`` writes the same bytes as ``lookupdec create
--format fork-v2``; ``merge`` and ``update`` the same contents as lookupdec's. On the spec's
vectors: the replay runs, and the real fork's v2 file byte for byte.
"""

from __future__ import annotations

import json
import struct
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lookupdec import cli, fast
from lookupdec.formats.legacy import decode_legacy
from perf import anchors
from tests.conftest import SHARED_DATA, vectors

REPLAY_TOKENS = 60_000  # 14 chunks of 4096
STATIC_TOKENS = 300_000


@pytest.fixture(scope="session")
def anchor() -> Path:
    if anchors.find_compiler() is None:
        pytest.skip("no C++ compiler (g++ or $CXX) on PATH: the anchor cannot be built")
    return anchors.build(quiet=True)


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Prefixes of the shared replay and static corpus, and two dynamic cache files."""
    replay, corpus = SHARED_DATA / "wiki.test.raw.llama3.bin", SHARED_DATA / "enwiki_wt.10M.llama3.bin"
    if not (replay.exists() and corpus.exists()):
        pytest.skip(f"shared data not found in {SHARED_DATA} (set LOOKUPDEC_DATA)")
    d = tmp_path_factory.mktemp("anchors")
    out = {"replay": d / "replay.bin", "corpus": d / "corpus.bin"}
    np.fromfile(replay, dtype="<i4", count=REPLAY_TOKENS).tofile(out["replay"])
    tokens = np.fromfile(corpus, dtype="<i4", count=STATIC_TOKENS + 120_000)
    tokens[:STATIC_TOKENS].tofile(out["corpus"])
    for i, part in enumerate((tokens[STATIC_TOKENS : STATIC_TOKENS + 60_000], tokens[STATIC_TOKENS + 60_000 :])):
        part.tofile(d / f"slice{i}.bin")
        cache = fast.NgramCache()
        cache.update(part.tolist(), len(part))
        cache.save(d / f"dynamic{i}.bin")
        out[f"slice{i}"], out[f"dynamic{i}"] = d / f"slice{i}.bin", d / f"dynamic{i}.bin"
    return out


def run_anchor(anchor: Path, *args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(anchor), *map(str, args)], capture_output=True, text=True)


def anchor_stats(anchor: Path, *args: object) -> dict[str, Any]:
    done = run_anchor(anchor, "stats", *args, "--json")
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def lookupdec_stats(capsys: pytest.CaptureFixture[str], *args: object) -> dict[str, Any]:
    assert cli.main(["stats", *map(str, args), "--json", "-q"]) == 0
    result: dict[str, Any] = json.loads(capsys.readouterr().out)
    return result


def counts(stats: dict[str, Any]) -> tuple[int, int]:
    return stats["n_drafted"], stats["n_accept"]


def lookupdec_create(capsys: pytest.CaptureFixture[str], corpus: Path, out: Path, fmt: str) -> Path:
    assert cli.main(["create", str(corpus), "-o", str(out), "--format", fmt, "-q"]) == 0
    capsys.readouterr()
    return out


def legacy_contents(path: Path) -> dict[Any, dict[int, int]]:
    return decode_legacy(path.read_bytes(), path, strict=True)


def test_stats_without_static(anchor: Path, shared: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    got = anchor_stats(anchor, shared["replay"])
    assert counts(got) == counts(lookupdec_stats(capsys, shared["replay"]))
    assert got["n_drafted"] > 10_000
    assert got["peak_rss_bytes"] > 0 and got["us_per_drafted_token"] > 0


@pytest.mark.slow  # seconds: run by .ci/run's slow stage, not the README's command
def test_create_same_bytes_and_counts(
    anchor: Path, shared: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ours = tmp_path / "anchor.v2"
    done = run_anchor(anchor, "create", shared["corpus"], "-o", ours, "-q")
    assert done.returncode == 0, done.stderr
    theirs = lookupdec_create(capsys, shared["corpus"], tmp_path / "lookupdec.v2", "fork-v2")
    # fastconstmap builds deterministically and both write 2-grams in first-insertion order.
    assert ours.read_bytes() == theirs.read_bytes()
    index = lookupdec_create(capsys, shared["corpus"], tmp_path / "static.lkdc", "lookupdec")
    expected = counts(lookupdec_stats(capsys, shared["replay"], "-lcs", index))
    assert counts(lookupdec_stats(capsys, shared["replay"], "-lcs", ours)) == expected
    assert counts(anchor_stats(anchor, shared["replay"], "-lcs", ours)) == expected
    # A legacy static file: loaded and turned into entries + constmap in memory, as the fork does.
    legacy = lookupdec_create(capsys, shared["corpus"], tmp_path / "static.llama", "llama")
    got = anchor_stats(anchor, shared["replay"], "-lcs", legacy)
    assert got["static_format"] == "llama" and counts(got) == expected


@pytest.mark.slow  # seconds: run by .ci/run's slow stage, not the README's command
def test_dynamic_update_and_merge(
    anchor: Path, shared: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ours = tmp_path / "dynamic0.anchor"
    assert run_anchor(anchor, "update", shared["slice0"], "-o", ours).returncode == 0
    assert legacy_contents(ours) == legacy_contents(shared["dynamic0"])
    merged_a, merged_l = tmp_path / "merged.anchor", tmp_path / "merged.lookupdec"
    done = run_anchor(anchor, "merge", shared["dynamic0"], shared["dynamic1"], "-o", merged_a, "-q")
    assert done.returncode == 0, done.stderr
    assert cli.main(["merge", str(shared["dynamic0"]), str(shared["dynamic1"]), "-o", str(merged_l), "-q"]) == 0
    capsys.readouterr()
    assert legacy_contents(merged_a) == legacy_contents(merged_l)
    static = tmp_path / "static.v2"
    assert run_anchor(anchor, "create", shared["corpus"], "-o", static, "-q").returncode == 0
    for extra in ([], ["-lcs", static]):
        got = anchor_stats(anchor, shared["replay"], "-lcd", merged_a, *extra)
        assert got["dynamic_found"]
        assert counts(got) == counts(lookupdec_stats(capsys, shared["replay"], "-lcd", merged_l, *extra))


def test_replay_vectors(anchor: Path, tmp_path: Path) -> None:
    data = vectors("replay")
    replay, corpus, static = tmp_path / "replay.bin", tmp_path / "corpus.bin", tmp_path / "static.v2"
    np.asarray(data["tokens"], dtype="<i4").tofile(replay)
    np.asarray(data["static_corpus"], dtype="<i4").tofile(corpus)
    assert run_anchor(anchor, "create", corpus, "-o", static, "-q").returncode == 0
    for run in data["runs"]:
        extra = ["-lcs", static] if run["use_static"] else []
        got = anchor_stats(anchor, replay, "-c", run["n_ctx"], "--draft", run["n_draft"], *extra)
        assert counts(got) == (run["expected_n_drafted"], run["expected_n_accept"]), run


def test_real_fork_v2_file(anchor: Path, tmp_path: Path) -> None:
    """The spec's v2 file, written by the fork's own code: read, and rebuilt byte for byte."""
    case = vectors("files")["fork_static_v2"]
    fork = tmp_path / "fork.v2"
    fork.write_bytes(bytes.fromhex(case["file_hex"]))
    tokens, contents = (json.loads(v) if isinstance(v, str) else v for v in (case["seq"], case["contents"]))
    seq = tmp_path / "seq.bin"
    seq.write_bytes(struct.pack(f"<{len(tokens)}i", *tokens))
    ours = tmp_path / "ours.v2"
    assert run_anchor(anchor, "create", seq, "-o", ours, "-q").returncode == 0
    assert ours.read_bytes() == fork.read_bytes()
    done = run_anchor(anchor, "open", fork, "--json")
    assert done.returncode == 0 and json.loads(done.stdout)["n_keys"] == len(contents)


@pytest.mark.parametrize("case", ["truncated", "checksum", "legacy"])
def test_bad_static_file(anchor: Path, tmp_path: Path, case: str) -> None:
    seq = tmp_path / "seq.bin"
    np.arange(50, dtype="<i4").tofile(seq)
    good = tmp_path / "good.v2"
    assert run_anchor(anchor, "create", seq, "-o", good, "-q").returncode == 0
    data = good.read_bytes()
    map_at = 32 + 49 * 8  # header, then 49 entries (one per 2-gram of 0..49)
    if case == "truncated":
        bad, needle = data[:-5], "sizes do not add up"
    elif case == "checksum":
        bad, needle = data[: map_at + 40] + bytes([data[map_at + 40] ^ 1]) + data[map_at + 41 :], "checksum mismatch"
    else:  # no fork magic: read as a legacy file, whose record is cut short
        bad, needle = b"\x01" * 25, "truncated record"
    path = tmp_path / "bad.v2"
    path.write_bytes(bad)
    done = run_anchor(anchor, "open", path)
    assert done.returncode == 1
    assert f"{path}: " in done.stderr and needle in done.stderr and "terminate" not in done.stderr


def test_clean_errors(anchor: Path, tmp_path: Path) -> None:
    done = run_anchor(anchor, "stats", tmp_path / "missing.bin")
    assert done.returncode == 1 and "missing.bin: cannot open the token file" in done.stderr
    odd = tmp_path / "odd.bin"
    odd.write_bytes(b"12345")
    done = run_anchor(anchor, "stats", odd)
    assert done.returncode == 1 and "not a multiple of 4" in done.stderr
    done = run_anchor(anchor, "stats", odd, "--bogus")
    assert done.returncode == 2 and "unknown option --bogus" in done.stderr


def test_perf_fork_plan_and_summary() -> None:
    """Every (operation, size) gets both sides once per round, the sides alternating."""
    from perf import fork

    plan = fork.rounds_plan(["1M", "25"], list(fork.OPERATIONS), 4)
    for steps in plan:
        assert sorted((op, size) for op, size, _ in steps) == sorted(
            [(op, s) for op in ("create", "open", "draft") for s in ("1M", "25")] + [("merge", "-")]
        )
    for k in range(3):
        now = {(op, size): sides for op, size, sides in plan[k]}
        after = {(op, size): sides for op, size, sides in plan[k + 1]}
        assert all(now[pair] == after[pair][::-1] for pair in now)
    rows = [
        {"op": "draft", "size": "1M", "side": side, "round": k, "us": us, "rss": rss, "n_drafted": 5, "n_accept": 1}
        for k in range(3)
        for side, us, rss in (("fork", 2.0, 100.0), ("lookupdec", 1.0 + k * 0.5, 110.0))
    ]
    summary = {s["metric"]: s for s in fork.summarize(rows, ["1M"], ["draft"])}
    assert summary["us"]["ratio"] == 0.75 and summary["us"]["met"] and summary["us"]["counts_equal"]
    assert summary["rss"]["ratio"] == pytest.approx(1.1) and summary["rss"]["met"]
    assert "draft" in fork.table(list(summary.values()))


@pytest.mark.slow
def test_perf_fork_quick(anchor: Path, shared: dict[str, Path], tmp_path: Path) -> None:
    """``python -m perf fork --quick`` runs end to end (about 15 s) and the drafts agree."""
    from perf import fork

    out = tmp_path / "fork.json"
    assert fork.main(["--quick", "--rounds", "1", "--work", str(tmp_path / "work"), "--json", str(out)]) == 0
    summary = json.loads(out.read_text())["summary"]
    assert {s["op"] for s in summary} == set(fork.OPERATIONS)
    assert all(s["counts_equal"] for s in summary if s["op"] == "draft")
