"""``python -m perf COMMAND`` given bad arguments or files: one clear line (argparse's usage error, exit 2).

Each case runs the real command line in a fresh interpreter and must stop while parsing or
reading its inputs: no benchmark runs, and no Python traceback reaches the user.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pyperf
import pytest

from perf import _cli

REPO = Path(__file__).resolve().parents[1]

# Runs perf's entry point with matplotlib made unimportable (None in sys.modules), as in an
# install without the optional `perf` extra, whether or not this environment has it.
NO_MATPLOTLIB = (
    "import sys; sys.modules['matplotlib'] = None; from perf.__main__ import main; sys.exit(main(sys.argv[1:]))"
)


def perf(
    *args: str, env: dict[str, str] | None = None, no_matplotlib: bool = False
) -> subprocess.CompletedProcess[str]:
    """``python -m perf ARGS`` from the repository (15 s at most: each case must stop at once)."""
    cmd = [sys.executable, "-c", NO_MATPLOTLIB] if no_matplotlib else [sys.executable, "-m", "perf"]
    return subprocess.run(
        [*cmd, *args],
        cwd=REPO,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=15,
        check=False,
    )


def assert_usage_error(proc: subprocess.CompletedProcess[str], *names: str) -> None:
    """Exit 2, no traceback, and the last stderr line names each of ``names``."""
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 2, proc.stdout + proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert "error:" in last, proc.stderr
    for name in names:
        assert name in last, last


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    """A missing file, a binary (non-JSON) one, a JSON list, a folder that is a file."""
    binary = tmp_path / "a.bin"
    binary.write_bytes(b"\1\0\0\0")
    listed = tmp_path / "list.json"
    listed.write_text("[1, 2]")
    return {"missing": tmp_path / "missing.json", "binary": binary, "list": listed, "dir": tmp_path}


# --- compare, table, plot, gate, batch-replay: files ------------------------------------------


@pytest.mark.parametrize("which", ["missing", "binary", "list"])
def test_compare_names_a_bad_results_file(files: dict[str, Path], which: str) -> None:
    bad = str(files[which])
    assert_usage_error(perf("compare", bad, bad, "--no-pyperf"), bad)
    assert_usage_error(perf("compare", "--impls", bad), bad)


def test_compare_reads_both_files_before_pyperf_prints_anything(files: dict[str, Path]) -> None:
    proc = perf("compare", str(files["missing"]), str(files["missing"]))
    assert_usage_error(proc, str(files["missing"]))
    assert proc.stdout == ""  # not pyperf compare_to's own traceback first


@pytest.mark.parametrize("command", ["plot", "table"])
def test_plot_and_table_help_need_no_matplotlib(command: str) -> None:
    proc = perf(command, "--help", no_matplotlib=True)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert "usage:" in proc.stdout


def test_plot_without_matplotlib_says_how_to_install_it(files: dict[str, Path]) -> None:
    proc = perf("plot", str(files["missing"]), no_matplotlib=True)
    assert_usage_error(proc, "needs matplotlib", "pip install 'lookupdec[perf]'")


def test_table_runs_without_matplotlib(tmp_path: Path) -> None:
    path = tmp_path / "run.json"
    runs = [
        pyperf.Run([v], metadata={"name": name, "unit": "second", "loops": 1}, collect_metadata=False)
        for name in ("draft.static=none@reference", "draft.static=none@fast")
        for v in (1.0, 1.1)
    ]
    benches = [pyperf.Benchmark(runs[:2]), pyperf.Benchmark(runs[2:])]
    for bench in benches:
        bench.update_metadata({"concern": "draft", "static_tokens": 0})
    pyperf.BenchmarkSuite(benches).dump(str(path))
    proc = perf("table", str(path), no_matplotlib=True)
    assert proc.returncode == 0, proc.stderr
    assert "| none (0) |" in proc.stdout


@pytest.mark.parametrize("which", ["missing", "binary", "list"])
def test_table_names_a_bad_results_file(files: dict[str, Path], which: str) -> None:
    assert_usage_error(perf("table", str(files[which]), no_matplotlib=True), str(files[which]))


def test_gate_head_vs_base_names_a_bad_results_file(files: dict[str, Path]) -> None:
    bad = str(files["binary"])
    assert_usage_error(perf("gate", "--base", bad, "--head", bad), bad)


@pytest.mark.parametrize("which", ["missing", "binary"])
def test_batch_replay_names_a_bad_outputs_file(files: dict[str, Path], which: str) -> None:
    assert_usage_error(perf("batch-replay", str(files[which])), str(files[which]))


# --- grounded -------------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["missing", "binary", "list"])
def test_grounded_from_json_names_a_bad_file(files: dict[str, Path], which: str) -> None:
    assert_usage_error(perf("grounded", "--from-json", str(files[which])), "--from-json", str(files[which]))


def test_grounded_work_that_cannot_be_a_folder_is_refused(files: dict[str, Path]) -> None:
    # a file where the folder should be: mkdir fails at once (a missing folder would be created and
    # filled with downloads, which is what --work is for)
    assert_usage_error(perf("grounded", "--work", str(files["binary"])), "--work", str(files["binary"]))


def test_grounded_needs_a_source_of_pairs() -> None:
    assert_usage_error(perf("grounded"), "--sample", "--work")


def test_grounded_plot_without_matplotlib_is_refused_before_the_run(files: dict[str, Path]) -> None:
    proc = perf("grounded", "--sample", "--plot", str(files["dir"] / "p.png"), no_matplotlib=True)
    assert_usage_error(proc, "--plot", "needs matplotlib")


# --- length-replay ----------------------------------------------------------------------------


def test_length_replay_without_the_data_folder_names_the_file(tmp_path: Path) -> None:
    proc = perf("length-replay", "--curve", "1,2,3", env={"LOOKUPDEC_DATA": str(tmp_path / "none")})
    assert_usage_error(proc, str(tmp_path / "none" / "wiki.test.raw.llama3.bin"), "LOOKUPDEC_DATA")


@pytest.mark.parametrize("curve", ["1,nan,3", "1,inf,3", "1,-2,3", "1,0"])
def test_length_replay_curve_must_be_finite_and_positive(curve: str) -> None:
    assert_usage_error(perf("length-replay", "--curve", curve), "--curve", curve)


@pytest.mark.parametrize(
    ("option", "value"),
    [("--rounds", "0"), ("--prompts", "-1"), ("--new-tokens", "0"), ("--context", "0"), ("--k", "x")],
)
def test_length_replay_counts_must_be_at_least_1(option: str, value: str) -> None:
    assert_usage_error(perf("length-replay", "--curve", "1,2,3", option, value), option)


# --- open -----------------------------------------------------------------------------------


@pytest.mark.parametrize("sizes", ["abc", "nan", "inf", "0", "-5"])
def test_open_sizes_must_be_sizes(sizes: str) -> None:
    assert_usage_error(perf("open", "--sizes", sizes), "--sizes")


@pytest.mark.parametrize(("option", "value"), [("--rounds", "-1"), ("--rounds", "0"), ("--opens", "0")])
def test_open_counts_must_be_at_least_1(option: str, value: str, files: dict[str, Path]) -> None:
    proc = perf("open", option, value, "--sizes", "1M", "--work", str(files["dir"]))
    assert_usage_error(proc, option)


def test_open_a_missing_index_is_named_before_anything_is_built(files: dict[str, Path]) -> None:
    proc = perf("open", "--index", str(files["missing"]), "--sizes", "1M", "--work", str(files["dir"]))
    assert_usage_error(proc, "--index", str(files["missing"]))
    assert not list(files["dir"].glob("*.lkdc"))


def test_open_a_missing_tree_is_named(files: dict[str, Path]) -> None:
    proc = perf("open", "--index", str(files["binary"]), "--tree", str(files["missing"]))
    assert_usage_error(proc, "--tree", str(files["missing"]))


# --- the other commands' numbers ----------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["gate", "--rounds", "-1"],
        ["gate", "--tolerance", "nan"],
        ["gate", "--min-speedup", "0"],
        ["track", "--base", "HEAD", "--values", "-1"],
        ["track", "--base", "HEAD", "--tolerance", "inf"],
        ["history", "plot", "h.jsonl", "-o", "out", "--last", "0"],
        ["profile", "--tokens", "0"],
        ["profile", "--static-tokens", "-1"],
        ["policy", "--repeats", "0"],
        ["policy", "--rounds", "0"],
        ["policy", "--branches", "x"],
        ["speedup", "--k", "a"],
        ["speedup", "--k", "0"],
        ["speedup", "--rounds", "0"],
        ["speedup", "--new-tokens", "0"],
        ["speedup", "--threads", "0"],
        ["speedup", "--prompts", "0"],
        ["vllm-speedup", "--rounds", "0"],
        ["vllm-speedup", "--threads", "-1"],
        ["batch-invariance", "--threads", "x"],
        ["fork", "--sizes", "abc"],
        ["fork", "--rounds", "0"],
        ["fork", "--warmup", "-1"],
        ["fork", "--open-repeat", "0"],
        ["grounded", "--sample", "--max-tokens", "0"],
        ["grounded-data", "--work", "w", "--max-tokens", "0"],
    ],
    ids=lambda args: " ".join(args),
)
def test_bad_numbers_are_usage_errors(args: list[str]) -> None:
    option = next(a for a in reversed(args) if a.startswith("--"))
    assert_usage_error(perf(*args), option)


# --- the type functions ---------------------------------------------------------------------


def test_type_functions_take_good_values_and_refuse_the_rest() -> None:
    assert _cli.positive_int("3") == 3 and _cli.nonnegative_int("0") == 0
    assert _cli.positive_float("0.5") == 0.5 and _cli.nonnegative_float("0") == 0.0
    assert _cli.positive_ints("4,8,") == [4, 8]
    assert _cli.corpus_sizes("4M, 25") == ["4M", "25"]
    bad: list[tuple[Callable[[str], object], str]] = [
        (_cli.positive_int, "0"),
        (_cli.positive_int, "1.5"),
        (_cli.nonnegative_int, "-1"),
        (_cli.positive_float, "nan"),
        (_cli.positive_float, "inf"),
        (_cli.positive_float, "0"),
        (_cli.nonnegative_float, "-0.1"),
        (_cli.positive_ints, ","),
        (_cli.positive_ints, "4,0"),
        (_cli.corpus_sizes, "1M,abc"),
    ]
    for func, text in bad:
        with pytest.raises(argparse.ArgumentTypeError):
            func(text)


def test_read_json_and_load_pyperf_suite_name_the_file(files: dict[str, Path]) -> None:
    for which in ("missing", "binary"):
        with pytest.raises(_cli.InputError, match=str(files[which])):
            _cli.read_json(files[which])
    assert _cli.read_json(files["list"]) == [1, 2]
    for which in ("missing", "binary", "list"):
        with pytest.raises(_cli.InputError, match=str(files[which])):
            _cli.load_pyperf_suite(files[which])
