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


def _pmd_mapped_kb(path: Path) -> int:
    """FilePmdMapped of a fresh 2 MiB-aligned mapping of ``path`` after touching every page."""
    from lookupdec.fast import _mapbytes

    if not _mapbytes.supported():
        pytest.skip("mapped bytes need CPython on Linux")
    fd = os.open(path, os.O_RDONLY)
    try:
        mb = _mapbytes.map_bytes(fd, path.stat().st_size)
    finally:
        os.close(fd)
    assert mb is not None
    data = mb.data
    touched = 0
    for off in range(0, len(data), 4096):
        touched ^= data[off]  # a read that faults the page in
    lines = Path("/proc/self/smaps").read_text().splitlines()
    kb = 0
    for i, line in enumerate(lines):
        if line.endswith(str(path)):
            kb = next(int(f.split()[1]) for f in lines[i + 1 :] if f.startswith("FilePmdMapped:"))
            break
    del data, touched
    mb.close()
    return kb


def test_written_files_map_with_huge_pages_where_plain_aligned_writes_do(tmp_path: Path) -> None:
    # Whether the page cache gives 2 MiB folios depends on the file system and kernel: a file
    # written with plain 2 MiB os.write calls is the yardstick, and atomic_writer's file, written
    # through small and large writes, must map as well as that one.
    data = os.urandom(8 << 20)
    plain = tmp_path / "plain.bin"
    fd = os.open(plain, os.O_WRONLY | os.O_CREAT)
    for off in range(0, len(data), BLOCK):
        os.write(fd, data[off : off + BLOCK])
    os.close(fd)
    want = _pmd_mapped_kb(plain)
    if want == 0:
        pytest.skip("this file system caches no 2 MiB folios even for aligned 2 MiB writes")
    ours = tmp_path / "ours.bin"
    with _atomic.atomic_writer(ours) as f:
        f.write(data[:100])
        f.write(data[100 : 3 * BLOCK + 5])
        for off in range(3 * BLOCK + 5, len(data), 4096):
            f.write(data[off : off + 4096])
    assert ours.read_bytes() == data
    assert _pmd_mapped_kb(ours) == want
