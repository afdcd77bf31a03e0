"""What the GitHub Actions workflows promise, checked here (they cannot run here).

.ci/check-workflows validates them against the workflow schema and audits them with zizmor;
these tests check the project's own promises: the platforms and Pythons of the matrix, the
README's test command, least privilege, pinned actions, and that every project command a step
calls exists and parses (so a renamed option breaks here, not on the first push).
"""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

import pytest

yaml = pytest.importorskip("ruamel.yaml", reason="the `ci` extra (check-jsonschema) brings ruamel.yaml")

REPO = Path(__file__).resolve().parents[1]
WORKFLOWS = REPO / ".github" / "workflows"
NAMES = ("ci.yml", "perf.yml", "wheels.yml")
README_TEST_COMMAND = "pip install -e '.[test]' && python -m pytest"


def load(name: str) -> dict[Any, Any]:
    data: dict[Any, Any] = yaml.YAML(typ="safe").load((WORKFLOWS / name).read_text())
    return data


def steps(wf: dict[Any, Any]) -> list[dict[str, Any]]:
    return [s for job in wf["jobs"].values() for s in job["steps"]]


def run_lines(wf: dict[Any, Any]) -> list[str]:
    return [line.strip() for s in steps(wf) if "run" in s for line in s["run"].splitlines() if line.strip()]


@pytest.mark.parametrize("name", NAMES)
def test_least_privilege_and_no_persisted_credentials(name: str) -> None:
    wf = load(name)
    assert wf["permissions"] == {"contents": "read"}
    for job_name, job in wf["jobs"].items():
        if "permissions" in job:  # only perf.yml's history job may write, and only contents
            assert (name, job_name, job["permissions"]) == ("perf.yml", "history", {"contents": "write"})
        for s in job["steps"]:
            if s.get("uses", "").startswith("actions/checkout@"):
                assert s["with"]["persist-credentials"] is False, (name, job_name)


@pytest.mark.parametrize("name", NAMES)
def test_actions_are_pinned_by_commit_sha_with_the_tag_beside_it(name: str) -> None:
    text = (WORKFLOWS / name).read_text()
    uses = re.findall(r"uses: (\S+)(.*)", text)
    assert uses
    for ref, rest in uses:
        assert re.fullmatch(r"[\w.-]+/[\w.-]+@[0-9a-f]{40}", ref), ref
        assert re.match(r"\s+# v\d", rest), f"{ref}: say which release the SHA is"


def test_ci_matrix_and_commands() -> None:
    wf = load("ci.yml")
    job = wf["jobs"]["test"]
    matrix = job["strategy"]["matrix"]
    assert set(matrix["os"]) == {"ubuntu-24.04", "ubuntu-24.04-arm", "macos-15", "macos-15-intel"}
    assert matrix["python"] == ["3.11", "3.12", "3.13"]
    assert job["env"]["LOOKUPDEC_REQUIRE_MYPYC"] == "1"
    runs = [s.get("run", "") for s in job["steps"]]
    assert README_TEST_COMMAND in runs
    assert README_TEST_COMMAND in (REPO / "README.md").read_text()
    assert runs.index(README_TEST_COMMAND) < runs.index("mypy --strict") < runs.index("ruff check .")
    assert "ruff format --check ." in runs


def test_perf_runs_track_on_apple_silicon_and_x86() -> None:
    wf = load("perf.yml")
    include = wf["jobs"]["track"]["strategy"]["matrix"]["include"]
    assert {i["os"] for i in include} == {"macos-15", "ubuntu-24.04"}
    assert any(line.startswith("python -m perf track ") for line in run_lines(wf))


@pytest.mark.parametrize("name", NAMES)
def test_project_commands_in_steps_exist_and_parse(name: str) -> None:
    pytest.importorskip("pyperf")
    from perf import __main__ as perf_main
    from perf import track

    for line in run_lines(load(name)):
        for path in re.findall(r"\.ci/[\w.-]+", line):
            assert (REPO / path).is_file(), f"{name}: {line!r} names a missing {path}"
        m = re.search(r"python -m perf (\w+)(.*)", line)
        if not m:
            continue
        assert m.group(1) in perf_main.COMMANDS, line
        if m.group(1) == "track":
            argv = shlex.split(re.sub(r'"\$\w+"', "X", m.group(2)))
            args = track.build_parser().parse_args(argv)  # exits (fails the test) on a bad option
            assert args.base == "X"


def test_cibuildwheel_configuration() -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["cibuildwheel"]
    assert config["build"] == ["cp311-*", "cp312-*", "cp313-*"]
    assert config["environment"] == {"LOOKUPDEC_REQUIRE_MYPYC": "1"}
    assert ".ci/test_installed.py" in config["test-command"]
    assert (REPO / ".ci" / "test_installed.py").is_file()
    matrix = load("wheels.yml")["jobs"]["compiled"]["strategy"]["matrix"]["os"]
    assert {"ubuntu-24.04", "ubuntu-24.04-arm", "macos-15", "macos-15-intel"} <= set(matrix)
