"""Every file lookupdec writes reaches the disk in whole 2 MiB blocks (lookupdec._atomic.BlockWriter).

Written that way, a file system with large folios caches the file in 2 MiB folios, and a
mapped static index or corpus file gets huge pages (issue 10 item 4). The tests check the
bytes written (against the writes asked for) and the shape of the writes the file sees.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from lookupdec import _atomic
from lookupdec._atomic import BLOCK, BlockWriter


def _recorded(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """(offset, length) of every os.write that lookupdec._atomic makes, in order."""
    calls: list[tuple[int, int]] = []

    class Os:  # the os module as _atomic sees it, with write recorded (no other caller's writes)
        def __getattr__(self, name: str) -> object:
            return getattr(os, name)

        @staticmethod
        def write(fd: int, data: memoryview) -> int:
            calls.append((os.lseek(fd, 0, os.SEEK_CUR), len(data)))
            return os.write(fd, data)

    monkeypatch.setattr("lookupdec._atomic.os", Os())
    return calls


@pytest.mark.parametrize("seed", range(4))
def test_writes_are_whole_aligned_blocks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    rng = random.Random(seed)
    sizes = [rng.choice([0, 1, 7, 4096, BLOCK - 1, BLOCK, BLOCK + 3, 3 * BLOCK + 11]) for _ in range(12)]
    pieces = [rng.randbytes(n) for n in sizes]
    calls = _recorded(monkeypatch)
    path = tmp_path / "out.bin"
    with _atomic.atomic_writer(path) as f:
        for p in pieces:
            assert f.write(p if rng.random() < 0.5 else memoryview(p)) == len(p)
    expected = b"".join(pieces)
    assert path.read_bytes() == expected
    assert sum(n for _, n in calls) == len(expected)
    for off, n in calls[:-1]:
        assert off % BLOCK == 0 and n % BLOCK == 0 and n > 0
    if calls:
        assert calls[-1][0] % BLOCK == 0  # the last write may be short, never misaligned


def test_seek_then_patch_in_place(tmp_path: Path) -> None:
    # write_index writes a placeholder header, the body, then the header again at 0.
    body = os.urandom(BLOCK + 1000)
    path = tmp_path / "out.bin"
    with _atomic.atomic_writer(path) as f:
        f.write(bytes(16))
        f.write(body)
        assert f.tell() == 16 + len(body)
        f.seek(0)
        f.write(b"H" * 16)
    assert path.read_bytes() == b"H" * 16 + body


def test_typed_arrays_count_in_bytes(tmp_path: Path) -> None:
    import array

    a = array.array("i", range(1000))
    fd = os.open(tmp_path / "a.bin", os.O_WRONLY | os.O_CREAT)
    with BlockWriter(fd) as f:
        assert f.write(a) == 4000
    os.close(fd)
    assert (tmp_path / "a.bin").read_bytes() == a.tobytes()
