"""Sharded create on a Dask ``LocalCluster`` of 2 worker processes (slow; needs the dask extra)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lookupdec import builder
from lookupdec.cli import main
from lookupdec.errors import BuildError
from tests.conftest import DEMO_DATA

pytestmark = pytest.mark.slow
distributed = pytest.importorskip("distributed")

from lookupdec.builder.dask import create_index_dask  # noqa: E402 - only with distributed

DEMO = DEMO_DATA / "enwiki_wt.demo.llama3.bin"


@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    with (
        distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster,
        distributed.Client(cluster) as c,
    ):
        yield c


@pytest.fixture(scope="module")
def local_index(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    path = tmp_path_factory.mktemp("local") / "local.lkdc"
    builder.create_index([DEMO], path, workers=1)
    return path.read_bytes()


def test_dask_create_is_byte_identical(client: Any, local_index: bytes, tmp_path: Path) -> None:
    # 2 MB per task: 9 shards, 14 buckets.
    create_index_dask([DEMO], tmp_path / "d.lkdc", scheduler=client, memory=2_000_000)
    assert (tmp_path / "d.lkdc").read_bytes() == local_index


def test_cli_dask_address(client: Any, local_index: bytes, tmp_path: Path) -> None:
    out = tmp_path / "cli.lkdc"
    assert main(["create", str(DEMO), "-o", str(out), "-q", "--dask", client.scheduler.address, "--memory", "3M"]) == 0
    assert out.read_bytes() == local_index


def test_worker_killed_mid_job_still_gives_the_right_index(client: Any, local_index: bytes, tmp_path: Path) -> None:
    killed: list[int] = []

    def kill_one_worker(done: int, total: int) -> None:
        # The first finished bucket: the other tasks are queued or running on both workers.
        if not killed:
            pid = next(iter(client.run(os.getpid).values()))
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

    out = tmp_path / "k.lkdc"
    try:
        create_index_dask([DEMO], out, scheduler=client, memory=2_000_000, progress=kill_one_worker)
    except BuildError:  # the other allowed ending: a clear error, and no file
        assert not out.exists()
    else:
        assert out.read_bytes() == local_index
    assert killed


def test_a_service_that_never_answers_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A listening socket that never speaks Dask (an HTTP server, say): Client waited forever."""
    import socket

    from lookupdec.builder import dask

    monkeypatch.setattr(dask, "CONNECT_TIMEOUT", 1.0)
    monkeypatch.setattr(dask, "HANDSHAKE_GRACE", 1.0)
    with socket.create_server(("127.0.0.1", 0)) as server:  # the kernel accepts; nobody answers
        address = f"tcp://127.0.0.1:{server.getsockname()[1]}"
        with pytest.raises(BuildError, match="no Dask scheduler answered"):
            create_index_dask([DEMO], tmp_path / "x.lkdc", scheduler=address)
    assert not (tmp_path / "x.lkdc").exists()
