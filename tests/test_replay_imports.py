"""The replay path's imports (issue 10 item 4: replay memory): ``lookupdec stats`` without a static
cache never loads OpenSSL (hashlib, about 4 MB resident) or numpy (about 11 MB)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

from tests.conftest import DEMO_DATA

HEAVY = ("hashlib", "_hashlib", "numpy", "secrets", "tempfile")
SCRIPT = """
import sys
from lookupdec import cli
rc = cli.main(["stats", "--tokens", sys.argv[1], "--json", "-q", "-c", "512"])
print(rc, sorted(m for m in sys.argv[2:] if m in sys.modules))
"""


def test_stats_loads_no_heavy_module(tmp_path: Path) -> None:
    tokens = tmp_path / "t.bin"
    np.fromfile(DEMO_DATA / "wiki.test.demo.llama3.bin", dtype="<i4")[:3000].tofile(tokens)
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tokens), *HEAVY], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    # the last line: the exit code and the heavy modules loaded (the JSON result comes before)
    assert done.stdout.strip().splitlines()[-1] == "0 []"
