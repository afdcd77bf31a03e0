"""README.md's examples run as written, and so do docs/hybrid.md's (moved there from the README).

Every ```sh block is run with bash (``set -euo pipefail``) and every ```python block with this
Python, in a fresh directory, on small data: the start of the shipped demo token files stands in for the
sample data under the names the README uses (``LOOKUPDEC_DATA`` for the shell blocks, the
literal ``../shared/data`` replaced in the Python blocks). Two kinds of command are not run
here: ``pip install`` (the test runs inside that install) and ``python -m pytest`` (this very
suite). The heavy lines (``--impl reference``, ``lookupdec demo``) run only in the slow run.
The engine examples (blocks that use ``lookupdec.adapters``) need a model and are not run here:
the adapter tests (``tests/test_adapter_*.py``) run the same calls on tiny models and fakes.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import DEMO_DATA

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
HYBRID = ROOT / "docs" / "hybrid.md"
# The package's own copy, so the test also runs against an installed wheel (.ci/test_installed.py).
DEMO = DEMO_DATA
# The README's sample-data names -> the shipped demo files that stand in for them.
STAND_INS = {
    "enwiki_wt.10M.llama3.bin": DEMO / "enwiki_wt.demo.llama3.bin",
    "wiki.test.raw.llama3.bin": DEMO / "wiki.test.demo.llama3.bin",
}
NOT_RUN = re.compile(r"^(pip install\b|python -m pytest\b)")
HEAVY = re.compile(r"--impl reference|lookupdec demo")
ENGINE = re.compile(r"lookupdec\.adapters")


def blocks(lang: str, doc: Path = README) -> list[str]:
    """The fenced code blocks of language ``lang`` in ``doc`` (the README by default), in order."""
    return re.findall(rf"^```{lang}\n(.*?)^```", doc.read_text(encoding="utf-8"), re.S | re.M)


def runnable(block: str, heavy: bool) -> str:
    """A shell block with the commands this test does not run removed (see the module docstring)."""
    lines = []
    for line in block.splitlines():
        parts = [p.strip() for p in line.split("&&")]
        kept = [p for p in parts if not NOT_RUN.match(p)]
        if not heavy and any(HEAVY.search(p) for p in kept):
            kept = []
        lines.append(" && ".join(kept) if kept != parts else line)
    return "\n".join(lines) + "\n"


@pytest.fixture
def sandbox(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A working directory and an environment whose sample data is the shipped demo data."""
    data = tmp_path / "data"
    data.mkdir()
    for name, src in STAND_INS.items():
        # The first 40,000 tokens (160,000 bytes of int32) do: the size proves nothing here.
        (data / name).write_bytes(src.read_bytes()[:160_000])
    work = tmp_path / "work"
    work.mkdir()
    env = dict(os.environ, LOOKUPDEC_DATA=str(data))
    # `lookupdec` and `python` as the README means them: this interpreter's.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return work, env


def run_shell_blocks(work: Path, env: dict[str, str], heavy: bool, doc: Path = README, least: int = 3) -> None:
    """Run every sh block of ``doc`` in ``work``; fail with the block's output on an error."""
    sh = blocks("sh", doc)
    assert len(sh) >= least, f"{doc.name} lost its command examples"
    for block in sh:
        script = "set -euo pipefail\n" + runnable(block, heavy)
        proc = subprocess.run(["bash", "-c", script], cwd=work, env=env, capture_output=True, text=True, check=False)
        assert proc.returncode == 0, f"{doc.name} failed:\n{block}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"


def test_runnable_drops_only_what_it_says() -> None:
    assert runnable("pip install . && lookupdec demo", heavy=True) == "lookupdec demo\n"
    assert runnable("pip install . && lookupdec demo", heavy=False) == "\n"
    assert runnable("pip install -e '.[test]' && python -m pytest", heavy=True) == "\n"
    assert runnable("lookupdec stats --tokens x.bin  # c", heavy=False) == "lookupdec stats --tokens x.bin  # c\n"


def test_readme_commands(sandbox: tuple[Path, dict[str, str]]) -> None:
    work, env = sandbox
    run_shell_blocks(work, env, heavy=False)
    # What the blocks promise to leave behind.
    for name in ("enwiki.lkdc", "enwiki.bin", "dynamic-1.bin", "dynamic-2.bin", "dynamic.bin"):
        assert (work / name).stat().st_size > 0, name
    assert not (work / "dynamic.bin.tmp").exists()


@pytest.mark.slow
def test_readme_commands_with_heavy_lines(sandbox: tuple[Path, dict[str, str]]) -> None:
    work, env = sandbox
    run_shell_blocks(work, env, heavy=True)


def run_python_blocks(work: Path, env: dict[str, str], py: list[str]) -> None:
    """Run the Python blocks ``py`` (but the engine examples) in ``work``; each prints ``drafted:``."""
    # The Drafter examples draft from the index the README's first command block creates.
    index = ["lookupdec", "create", "--tokens", str(Path(env["LOOKUPDEC_DATA"]) / "enwiki_wt.10M.llama3.bin")]
    subprocess.run([*index, "-o", "enwiki.lkdc"], cwd=work, env=env, check=True, capture_output=True)
    for block in (b for b in py if not ENGINE.search(b)):
        code = block.replace("../shared/data", env["LOOKUPDEC_DATA"])
        proc = subprocess.run(
            [sys.executable, "-c", code], cwd=work, env=env, capture_output=True, text=True, check=False
        )
        assert proc.returncode == 0, f"example failed:\n{block}\nstderr:\n{proc.stderr}"
        assert "drafted:" in proc.stdout


def test_readme_python(sandbox: tuple[Path, dict[str, str]]) -> None:
    work, env = sandbox
    py = blocks("python")
    assert py, "README.md lost its Python example"
    assert any(ENGINE.search(b) for b in py), "the engine examples moved: update ENGINE"
    run_python_blocks(work, env, py)


def test_hybrid_doc_examples(sandbox: tuple[Path, dict[str, str]]) -> None:
    if not HYBRID.exists():  # .ci/test_installed.py copies the README and the tests, not docs/
        pytest.skip("docs/hybrid.md is not next to the tests")
    work, env = sandbox
    run_shell_blocks(work, env, heavy=False, doc=HYBRID, least=1)
    assert (work / "enwiki.lkcorpus").stat().st_size > 0
    py = blocks("python", HYBRID)
    assert len(py) >= 3, "docs/hybrid.md lost its Python examples"
    run_python_blocks(work, env, py)
