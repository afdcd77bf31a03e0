"""The fast path run interpreted (the pure-Python wheel, ``LOOKUPDEC_NO_MYPYC=1``) agrees with the reference.

Everything else tests the compiled modules (the ``.so`` files shadow the ``.py`` files), so
Python semantics that mypyc's native integers hide go unseen there: ``i64(1) << 63`` wraps to
the sign bit compiled but is the Python int 2**63 interpreted, which a ``vec[i64]`` refuses.
Here a copy of the package's sources without any extension module runs in a subprocess: a
static index from a slice of the shipped demo corpus, then ``stats`` over 6,000 tokens,
compared with the reference. The replay is long enough to look up a key whose check bit is
bit 63 of a word under the old layout (with 3,000 tokens this test passed on the bug).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import lookupdec

PACKAGE = Path(lookupdec.__file__).resolve().parent


def _run(work: Path, *args: str) -> str:
    env = dict(os.environ, PYTHONPATH=str(work / "src"))
    env.pop("LOOKUPDEC_REQUIRE_MYPYC", None)
    proc = subprocess.run(
        [sys.executable, "-m", "lookupdec", *args], cwd=work, env=env, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.slow  # seconds: run by .ci/run's slow stage, not the README's command
def test_interpreted_fast_path_matches_the_reference(tmp_path: Path) -> None:
    src = tmp_path / "src" / "lookupdec"
    shutil.copytree(PACKAGE, src, ignore=shutil.ignore_patterns("*.so", "*.pyd", "__pycache__"))
    data = PACKAGE / "data"
    (tmp_path / "corpus.bin").write_bytes((data / "enwiki_wt.demo.llama3.bin").read_bytes()[:120_000])
    (tmp_path / "replay.bin").write_bytes((data / "wiki.test.demo.llama3.bin").read_bytes()[:24_000])
    version = _run(tmp_path, "--version")
    assert "compiled: no" in version, version
    stats = {}
    for impl in ("fast", "reference"):
        _run(tmp_path, "create", "--tokens", "--impl", impl, "-q", "-o", f"{impl}.idx", "corpus.bin")
        out = _run(tmp_path, "stats", "--tokens", "--impl", impl, "-q", "--json", "-lcs", f"{impl}.idx", "replay.bin")
        stats[impl] = json.loads(out)
    assert (tmp_path / "fast.idx").read_bytes() == (tmp_path / "reference.idx").read_bytes()

    def counts(s: dict[str, object]) -> dict[str, object]:
        """The token counts (n_drafted, n_accept, ...), not the timings."""
        return {k: v for k, v in s.items() if k.startswith("n_")}

    assert counts(stats["fast"]) == counts(stats["reference"]) != {}
    # The hybrid policy too (its vote table's packed keys and scores are i64 arithmetic), with
    # the static index and the corpus in the history.
    hybrid = {
        impl: json.loads(
            _run(
                tmp_path,
                *("stats", "--tokens", "--impl", impl, "-q", "--json", "-lcs", f"{impl}.idx"),
                *("--policy", "hybrid", "--corpus", "corpus.bin", "replay.bin"),
            )
        )
        for impl in ("fast", "reference")
    }
    assert counts(hybrid["fast"]) == counts(hybrid["reference"])
    assert hybrid["fast"]["n_accept"] > stats["fast"]["n_accept"]
