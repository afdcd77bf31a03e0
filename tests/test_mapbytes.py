"""The mapped file seen as ``bytes`` (lookupdec.fast._mapbytes) and the static index opened through it.

The index's mapped mode reads the file as one ``bytes`` whose data is the mapping (issue 10
item 4: drafting from the mapped index at the loaded index's speed); where that is not
available (``LOOKUPDEC_MAPPED_BYTES=0`` here) it falls back to ``mmap`` slices. Both must
draft exactly as the reference does, and a reference kept past ``close()`` must stay readable.
"""

from __future__ import annotations

import gc
import itertools
import os
import random
import subprocess
import sys
import time
import types
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from lookupdec import reference as ref
from lookupdec.fast import _mapbytes
from tests.conftest import DEMO_DATA, fast_impl
from tests.test_hardening import make_index

pytestmark = pytest.mark.skipif(not _mapbytes.supported(), reason="mapped bytes need CPython on Linux")


def _map(path: Path) -> _mapbytes.MappedBytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        mb = _mapbytes.map_bytes(fd, path.stat().st_size)
    finally:
        os.close(fd)  # the mapping outlives the descriptor
    assert mb is not None
    return mb


@pytest.fixture
def no_mapped_bytes(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("LOOKUPDEC_MAPPED_BYTES", "0")
    yield


@pytest.mark.parametrize("size", [1, 31, 4095, 4096, 4097, 3 * 4096, 3 * 4096 + 17, 2 << 20, (2 << 20) + 5])
def test_view_is_the_file(tmp_path: Path, size: int) -> None:
    """Sizes around page boundaries: same bytes, same length, a NUL after the data, usable as bytes."""
    data = os.urandom(size)
    path = tmp_path / "f.bin"
    path.write_bytes(data)
    mb = _map(path)
    view = mb.data
    assert type(view) is bytes
    assert len(view) == size and view == data and view[-1:] == data[-1:]
    assert hash(view) == hash(data)
    assert view[size // 2 : size // 2 + 8] == data[size // 2 : size // 2 + 8]
    assert view + b"x" == data + b"x"
    with pytest.raises(TypeError):
        view[0] = 1  # type: ignore[index]
    start = id(view) + bytes.__basicsize__ - 1  # the data's address (CPython)
    assert start % (2 << 20 if size >= 2 << 20 else 4096) == 0  # huge-page aligned when big enough
    mb.prefetch()  # MADV_WILLNEED: a hint, nothing changes
    assert view == data
    del view
    assert mb.close()  # nothing else references it: unmapped at once


@pytest.mark.skipif(not _mapbytes._NATIVE, reason="the mapping's C module is not built")
@pytest.mark.parametrize("size", [1, 4097, (2 << 20) + 5])
def test_ctypes_mapping_is_the_native_one(tmp_path: Path, size: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Interpreted installs map through ctypes: the same bytes, alignment and header as the C module's."""
    data = os.urandom(size)
    path = tmp_path / "f.bin"
    path.write_bytes(data)
    native = _map(path)
    monkeypatch.setattr(_mapbytes, "_NATIVE", False)
    by_ctypes = _map(path)
    for mb in (native, by_ctypes):
        view = mb.data
        assert type(view) is bytes and view == data and hash(view) == hash(data)
        assert (id(view) + bytes.__basicsize__ - 1) % (2 << 20 if size >= 2 << 20 else 4096) == 0
        assert mb._length == native._length  # the same reservation
        del view
    assert by_ctypes.close()
    monkeypatch.setattr(_mapbytes, "_NATIVE", True)
    assert native.close()


@pytest.mark.parametrize("native", [True, False])
def test_unmappable_descriptor_is_an_os_error(native: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A descriptor the kernel cannot map (a pipe): OSError with errno and what was mapped, in C as through ctypes."""
    if native and not _mapbytes._NATIVE:
        pytest.skip("the mapping's C module is not built")
    monkeypatch.setattr(_mapbytes, "_NATIVE", native)
    r, w = os.pipe()
    try:
        with pytest.raises(OSError, match=r"mmap of the file \(4096 bytes\): ") as caught:
            _mapbytes.map_bytes(r, 4096)
        assert caught.value.errno is not None and caught.value.errno > 0
    finally:
        os.close(r)
        os.close(w)


def test_a_kept_reference_outlives_close(tmp_path: Path) -> None:
    path = tmp_path / "f.bin"
    path.write_bytes(b"0123456789" * 1000)
    mb = _map(path)
    kept = mb.data
    assert not mb.close()  # still referenced: left mapped
    assert mb in _mapbytes._pending
    assert kept[:10] == b"0123456789" and len(kept) == 10_000
    del kept
    gc.collect()
    _mapbytes._sweep()  # what the next map_bytes does
    assert mb not in _mapbytes._pending


def test_threads_that_open_and_close_their_own_mappings(tmp_path: Path) -> None:
    # Each thread maps and closes its own files, some still referenced when closed (as a failed
    # open's traceback keeps its bytes): every map sweeps the pending ones. Unlocked, two sweeps
    # unmapped one mapping twice, or read its count after the other unmapped it: SIGSEGV in a few
    # seconds. Run in a child, with the GIL switched as often as it can be, so a crash fails
    # this test instead of ending the test run.
    (tmp_path / "f.bin").write_bytes(b"0123456789" * 1000)
    script = f"""
import sys, threading, time, os
from pathlib import Path
from lookupdec.fast import _mapbytes
sys.setswitchinterval(1e-6)
path = Path({str(tmp_path / "f.bin")!r})
stop = time.monotonic() + 1.5
def work():
    while time.monotonic() < stop:
        fd = os.open(path, os.O_RDONLY)
        mb = _mapbytes.map_bytes(fd, path.stat().st_size)
        os.close(fd)
        kept = mb.data  # referenced when closed: left to a later sweep
        mb.close()
        del kept
threads = [threading.Thread(target=work) for _ in range(4)]
for t in threads: t.start()
for t in threads: t.join()
_mapbytes._sweep()
print(len(_mapbytes._pending))
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    assert proc.stdout.strip() == "0"  # every mapping unmapped in the end


def test_off_switch(tmp_path: Path, no_mapped_bytes: None) -> None:
    path = tmp_path / "f.bin"
    path.write_bytes(b"abc")
    assert not _mapbytes.supported()
    with open(path, "rb") as f:
        assert _mapbytes.map_bytes(f.fileno(), 3) is None


def _counts(static: object, tokens: list[int], impl: object) -> tuple[int, int, int]:
    r = impl.replay(tokens, 512, 8, static)  # type: ignore[attr-defined]
    return (r.n_drafted, r.n_accept, r.n_predict)


def test_mapped_modes_draft_as_the_reference(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same index mapped as bytes, mapped through mmap slices and loaded: the reference's counts."""
    from lookupdec.cli import _pipeline

    fast = fast_impl()
    corpus = np.fromfile(DEMO_DATA / "enwiki_wt.demo.llama3.bin", dtype="<i4")[:50_000].tolist()
    tokens = np.fromfile(DEMO_DATA / "wiki.test.demo.llama3.bin", dtype="<i4")[:3_000].tolist()
    path = tmp_path / "x.lkdc"
    make_index(path, corpus)
    want = _counts(_pipeline.load_static(ref, str(path)), tokens, ref)
    got = {}
    # loaded: copied into huge pages (copy_bytes); loaded-read: the plain read() where mapped bytes are off
    for mode in ("view", "mmap", "loaded", "loaded-read"):
        monkeypatch.setenv("LOOKUPDEC_MAPPED_BYTES", "0" if mode in ("mmap", "loaded-read") else "1")
        loaded = mode.startswith("loaded")
        ix = _pipeline.load_static(fast, str(path), in_memory=loaded)
        assert ix._direct == (mode != "mmap") and ix.in_memory == loaded
        assert (ix._view is not None) == (mode in ("view", "loaded"))
        got[mode] = _counts(ix, tokens, fast)
        assert ix.to_bytes() == path.read_bytes()
        ix.verify()
        ix.close()
        # never a read of unmapped memory; and a loaded index no longer answers as an empty one
        with pytest.raises(ValueError, match="closed"):
            ix.get((corpus[0], corpus[1]))
    assert got == {"view": want, "mmap": want, "loaded": want, "loaded-read": want}


def test_memo_grows_keeping_what_it_holds(tmp_path: Path) -> None:
    """The mapped index's memo starts small (a first draft zeroes 32 KiB, not 1 MiB) and grows at
    DMEMO_GROW_AT misses, its entries moved to their new home slots; lookups stay the reference's."""
    fast = fast_impl()
    index_module = __import__(fast.StaticIndex.__module__, fromlist=["_"])
    tables = __import__(fast.StaticIndex.__module__.rsplit(".", 1)[0] + "._tables", fromlist=["_"])
    start_bits, full_bits, grow_at = index_module.DMEMO_START_BITS, index_module.DMEMO_BITS, index_module.DMEMO_GROW_AT
    corpus = np.fromfile(DEMO_DATA / "enwiki_wt.demo.llama3.bin", dtype="<i4")[:50_000].tolist()
    path = tmp_path / "x.lkdc"
    make_index(path, corpus)
    pairs = sorted(set(itertools.pairwise(corpus)))
    random.Random(7).shuffle(pairs)
    ix = fast.StaticIndex.open(path)
    for a, b in pairs[: grow_at - 1]:  # each a first lookup: a miss
        assert ix._st_begin(a, b)
    old = list(ix._dmemo)
    assert ix._dbits == start_bits and len(old) == 4 << start_bits
    want: dict[int, list[int]] = {}  # where each entry goes, in the order the growth moves them
    for j in range(0, len(old), 4):
        if old[j + 1] != 0:
            k = old[j]
            want[tables.static_slot(k >> 32, tables.low32(k), full_bits) << 2] = old[j : j + 4]
    assert len(want) > grow_at // 2
    a, b = pairs[grow_at - 1]
    assert ix._st_begin(a, b)  # the miss that grows the memo
    new = list(ix._dmemo)
    assert ix._dbits == full_bits and len(new) == 4 << full_bits
    last = tables.static_slot(a, b, full_bits) << 2
    for home, entry in want.items():
        if home != last:
            assert new[home : home + 4] == entry
    static = ref.build_static(corpus)
    for a, b in [*pairs[: grow_at + 64], (-5, 7)]:  # memo hits (moved entries), new misses, an absent key
        followers = static.get((a, b))
        assert ix._st_begin(a, b) == bool(followers)
        for t, c in followers.items():
            assert ix._st_count(t) == c
    ix.close()


def test_closed_view_index_keeps_returned_bytes_valid(tmp_path: Path) -> None:
    fast = fast_impl()
    path = tmp_path / "x.lkdc"
    make_index(path)
    ix = fast.StaticIndex.open(path)
    assert ix._view is not None
    whole = ix.to_bytes()
    ix.close()
    assert whole == path.read_bytes()  # a copy, not the unmapped pages


def _perms(addr: int) -> str:
    """The permissions of the mapping holding ``addr`` (``/proc/self/maps``)."""
    with open("/proc/self/maps") as f:
        for line in f:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            if lo <= addr < hi:
                return line.split()[1]
    raise AssertionError(f"{addr:#x} is not mapped")


@pytest.mark.parametrize("size", [1, 4095, 4096, 4097, 3 * 4096 + 17, 2 << 20, (2 << 20) + 5])
def test_copy_is_the_file(tmp_path: Path, size: int) -> None:
    """copy_bytes (the in-memory open): the file's bytes in private read-only pages, aligned like a mapping."""
    data = os.urandom(size)
    path = tmp_path / "f.bin"
    path.write_bytes(data)
    with open(path, "rb") as f:
        mb = _mapbytes.copy_bytes(f.fileno(), size)
    assert mb is not None and mb.size == size
    view = mb.data
    assert type(view) is bytes and len(view) == size and view == data and hash(view) == hash(data)
    start = id(view) + bytes.__basicsize__ - 1
    assert start % (2 << 20 if size >= 2 << 20 else 4096) == 0
    assert _perms(start).startswith("r-") and _perms(start + size - 1).startswith("r-")  # never changed
    assert _perms(start - 1).startswith("rw")  # the header page: its reference count changes
    path.write_bytes(bytes(size))  # a copy: the file changing later does not change it
    assert view == data
    del view
    assert mb.close()


def test_copy_of_a_shrunk_file_is_short(tmp_path: Path) -> None:
    """A file shorter than the size asked (it shrank after the caller's fstat): the bytes it had."""
    path = tmp_path / "f.bin"
    path.write_bytes(b"abc" * 1000)
    with open(path, "rb") as f:
        mb = _mapbytes.copy_bytes(f.fileno(), 5000)
    assert mb is not None and mb.size == 3000 and mb.data == b"abc" * 1000
    assert mb.close()


def test_loaded_corpus_is_a_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """CorpusIndex.open(in_memory=True) copies (huge pages) or reads: the mapped file's ids and drafts;
    ``stats --load`` opens the --corpus file that way."""
    from lookupdec.cli import _pipeline

    fast = fast_impl()
    ids = np.fromfile(DEMO_DATA / "enwiki_wt.demo.llama3.bin", dtype="<i4")[:20_000].tolist()
    tokens = np.fromfile(DEMO_DATA / "wiki.test.demo.llama3.bin", dtype="<i4")[:2_000].tolist()
    path = tmp_path / "c.lkcorpus"
    fast.CorpusIndex.from_tokens(ids).save(path)
    mapped = fast.CorpusIndex.open(path)
    assert not mapped.in_memory and mapped._view is not None
    for switch in ("1", "0"):
        monkeypatch.setenv("LOOKUPDEC_MAPPED_BYTES", switch)
        loaded = fast.CorpusIndex.open(path, in_memory=True)
        assert loaded.in_memory and (loaded._view is not None) == (switch == "1")
        assert loaded.tokens() == mapped.tokens() == ids and loaded.to_bytes() == path.read_bytes()
        loaded.close()
    # replay_stats (stats --load) opens the corpus file itself, in memory, only with in_memory:
    # seen through a namespace like the fast package whose CorpusIndex.open records its calls
    opened: list[bool] = []

    class Recorder:
        @staticmethod
        def open(path: str, *, in_memory: bool = False) -> object:
            opened.append(in_memory)
            return fast.CorpusIndex.open(path, in_memory=in_memory)

    impl = types.ModuleType("recording_fast")  # replay_stats takes an implementation module
    impl.__dict__.update({**vars(fast), "CorpusIndex": Recorder})
    counts = []
    for in_memory in (False, True):
        stats = _pipeline.replay_stats(impl, tokens, n_ctx=512, in_memory=in_memory, policy="hybrid", corpus=str(path))
        counts.append({k: v for k, v in stats.items() if k.startswith("n_")})
    assert opened == [True]  # mapped by the history itself without it
    assert counts[0] == counts[1] and counts[0]["n_accept"] > 0
    mapped.close()


def test_huge_copy_of_built_bytes() -> None:
    """huge_copy (a corpus built in memory): the same bytes in read-only aligned pages; None below 2 MiB."""
    data = os.urandom((2 << 20) + 12345)
    mb = _mapbytes.huge_copy(data)
    assert mb is not None and mb.data == data and len(mb.data) == len(data)
    start = id(mb.data) + bytes.__basicsize__ - 1
    assert start % (2 << 20) == 0 and _perms(start).startswith("r-")
    assert mb.close()
    assert _mapbytes.huge_copy(data[: (2 << 20) - 1]) is None


def test_corpus_built_from_ids_is_moved_into_huge_pages() -> None:
    fast = fast_impl()
    ids = np.fromfile(DEMO_DATA / "enwiki_wt.demo.llama3.bin", dtype="<i4")[:100_000].tolist()
    built = fast.CorpusIndex.from_tokens(ids)
    assert len(built.to_bytes()) >= 2 << 20  # big enough to be moved
    assert built.in_memory and built._view is not None
    assert built.tokens() == ids
    small = fast.CorpusIndex.from_tokens(ids[:1000])
    assert small.in_memory and small._view is None and small.tokens() == ids[:1000]
    built.close()
    assert built.n_tokens == 0


def _mapped_rss_kb(path: Path) -> int:
    """Rss of this process's mapping of ``path`` (/proc/self/smaps), 0 if none."""
    lines = Path("/proc/self/smaps").read_text().splitlines()
    for i, line in enumerate(lines):
        if line.endswith(str(path)):
            for field in lines[i + 1 :]:
                if field.startswith("Rss:"):
                    return int(field.split()[1])
    return 0


def _uncache(path: Path) -> None:
    """Drop ``path`` from the page cache, so that mapping it means reading it."""
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)


def _map_populatable(path: Path, size: int) -> _mapbytes.MappedBytes:
    """``size`` random bytes written to ``path`` and mapped; skips where the kernel cannot populate."""
    path.write_bytes(os.urandom(size))
    mb = _map(path)
    if not mb.populate():
        pytest.skip("the kernel refuses MADV_POPULATE_READ (before Linux 5.14)")
    mb.close()
    return _map(path)


@pytest.mark.slow  # about 1.3 s: a 32 MB file read cold
def test_prefetch_maps_the_file_while_the_gil_is_held(tmp_path: Path) -> None:
    # A compiled replay never gives the GIL back: prefetch must map the file while this thread
    # holds the GIL. sorted() of a shuffled list holds the GIL the same way, for about a third
    # of a second; the file is dropped from the page cache first, so mapping it all means
    # reading it. The Python thread (an interpreted install) must be inside its madvise call by
    # the time prefetch returns: done by the end of one sort. The native thread never takes the
    # GIL: it must finish while sorts go on, however busy the machine (prefetched() is a C
    # call: the GIL is held throughout the loop).
    size = 32 << 20
    path = tmp_path / "f.bin"
    mb = _map_populatable(path, size)
    mb.close()
    _uncache(path)
    big = list(range(1_000_000))
    random.Random(0).shuffle(big)
    mb = _map(path)
    mb.prefetch()
    sorted(big)
    if mb.prefetched() is not None:
        deadline = time.monotonic() + 60
        while not mb.prefetched():
            assert time.monotonic() < deadline, "the native prefetch thread made no progress"
            sorted(big)
    assert _mapped_rss_kb(path) == size >> 10  # every page mapped meanwhile
    mb.close()


def _wait_prefetched(mb: _mapbytes.MappedBytes) -> None:
    deadline = time.monotonic() + 30
    while not mb.prefetched():
        assert time.monotonic() < deadline, "the prefetch thread did not finish"
        time.sleep(0.001)


@pytest.mark.skipif(not _mapbytes._NATIVE, reason="the native prefetch module is not built")
def test_native_prefetch_maps_every_page(tmp_path: Path) -> None:
    # More than one 4 MiB chunk, and a size that is not a multiple of a page.
    size = (9 << 20) + 123
    path = tmp_path / "f.bin"
    mb = _map_populatable(path, size)
    assert mb.prefetched() is None  # nothing started yet
    mb.prefetch()
    _wait_prefetched(mb)
    assert _mapped_rss_kb(path) == (size + 4095) >> 12 << 2
    assert mb.data == path.read_bytes()
    assert mb.close()
    assert _mapped_rss_kb(path) == 0


@pytest.mark.skipif(not _mapbytes._NATIVE, reason="the native prefetch module is not built")
def test_close_during_prefetch_unmaps(tmp_path: Path) -> None:
    # Closed right after opening, while the thread is still reading a file that is not cached:
    # close stops it (after its chunk), unmaps, and a new mapping of the file reads right.
    size = 24 << 20
    path = tmp_path / "f.bin"
    payload = os.urandom(size)
    path.write_bytes(payload)
    for _ in range(3):
        _uncache(path)
        mb = _map(path)
        mb.prefetch()
        assert mb.close()
        assert mb.prefetched() is None
        assert _mapped_rss_kb(path) == 0
    mb = _map(path)
    mb.prefetch()
    assert mb.data[-4096:] == payload[-4096:]
    assert mb.close()


def test_prefetch_can_be_turned_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOOKUPDEC_POPULATE", "0")
    path = tmp_path / "f.bin"
    path.write_bytes(os.urandom(4 << 20))
    mb = _map(path)
    called: list[bool] = []

    def populate() -> bool:
        called.append(True)
        return True

    monkeypatch.setattr(mb, "populate", populate)
    mb.prefetch()  # readahead only
    assert not called
    assert mb.data[:10] == path.read_bytes()[:10]
    mb.close()
