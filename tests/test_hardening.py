"""Regression tests of issue 9: every file path hardened (outputs, inputs, corrupt files, arguments).

Each test names the defect it pins (1..14 in the issue). Expected behaviour comes from the
issue and llama.cpp's (write through symlinks, a 0-byte dynamic cache is empty), never from
the code under test.
"""

from __future__ import annotations

import errno
import os
import signal
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import lookupdec.reference as ref
from lookupdec import _atomic, formats
from lookupdec.cli import _pipeline
from lookupdec.errors import CacheFormatError, OutputFileError
from tests.conftest import fast_impl
from tests.test_cli import assert_clean_error, run, write_bin

CORPUS = [1, 2, 3, 1, 2, 4, 1, 2, 3, 5, 1, 2, 3, 7, 7, 1, 2]


def make_index(path: Path, tokens: list[int] = CORPUS) -> str:
    formats.write_static(ref.build_static(tokens).contents(), path, "lookupdec")
    return str(path)


# --- 1: outputs through symlinks, never replacing a device ---------------------------------


def test_output_symlink_is_written_through(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    corpus = write_bin(tmp_path / "c.bin", CORPUS)
    target = tmp_path / "real" / "static.lkdc"
    target.parent.mkdir()
    target.write_bytes(b"old")
    link = tmp_path / "link.lkdc"
    link.symlink_to(target)
    code, _, err = run(capsys, "create", corpus, "-o", str(link), "-q")
    assert code == 0, err
    assert link.is_symlink()
    assert formats.detect_format(target) == "lookupdec"
    assert sorted(os.listdir(target.parent)) == ["static.lkdc"]  # the temp file lived in the target's folder


@pytest.mark.parametrize("device", ["/dev/full", "/dev/null"])
def test_output_device_is_refused_not_replaced(tmp_path: Path, capsys: pytest.CaptureFixture[str], device: str) -> None:
    if not os.path.exists(device):
        pytest.skip(f"no {device} here")
    corpus = write_bin(tmp_path / "c.bin", CORPUS)
    code, _, err = run(capsys, "create", corpus, "-o", device, "-q")
    assert_clean_error(code, err, device, "character device")
    assert not os.path.isfile(device)  # still a device (as root, a rename would have replaced it)


def test_output_fifo_is_refused(tmp_path: Path) -> None:
    fifo = tmp_path / "out"
    os.mkfifo(fifo)
    with pytest.raises(OutputFileError, match="exists and is a fifo"), _atomic.atomic_writer(fifo) as f:
        f.write(b"x")


def test_output_keeps_the_replaced_files_permissions(tmp_path: Path) -> None:
    out = tmp_path / "o.bin"
    out.write_bytes(b"old")
    out.chmod(0o640)
    with _atomic.atomic_writer(out) as f:
        f.write(b"new")
    assert (out.read_bytes(), out.stat().st_mode & 0o777) == (b"new", 0o640)


# --- 8: errors name the user's file -----------------------------------------------------------


def test_output_errors_name_the_users_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    corpus = write_bin(tmp_path / "c.bin", CORPUS)
    code, _, err = run(capsys, "create", corpus, "-o", str(tmp_path), "-q")
    assert_clean_error(code, err, str(tmp_path), "folder")
    missing = tmp_path / "no" / "such" / "x.lkdc"
    code, _, err = run(capsys, "create", corpus, "-o", str(missing), "-q")
    assert_clean_error(code, err, str(missing), "folder does not exist")
    assert ".lookupdec-" not in err


def test_disk_full_names_the_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "o.bin"
    out.write_bytes(b"old")

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError) as info, _atomic.atomic_writer(out) as f:
        f.write(b"new")
    assert info.value.errno == errno.ENOSPC and info.value.filename == str(out)
    assert out.read_bytes() == b"old" and os.listdir(tmp_path) == ["o.bin"]


def test_written_together_puts_every_file_in_place_or_none(tmp_path: Path) -> None:
    a, b = tmp_path / "a.bin", tmp_path / "b.bin"
    a.write_bytes(b"old a")
    with pytest.raises(RuntimeError), _atomic.written_together():
        with _atomic.atomic_writer(a) as f:
            f.write(b"new a")
        assert a.read_bytes() == b"old a"  # complete, but waiting for the block's end
        raise RuntimeError("the second file's work failed")
    assert a.read_bytes() == b"old a" and sorted(os.listdir(tmp_path)) == ["a.bin"]
    with _atomic.written_together():
        for path, data in ((a, b"new a"), (b, b"new b")):
            with _atomic.atomic_writer(path) as f:
                f.write(data)
        assert a.read_bytes() == b"old a" and not b.exists()
    assert (a.read_bytes(), b.read_bytes()) == (b"new a", b"new b")
    assert sorted(os.listdir(tmp_path)) == ["a.bin", "b.bin"]


def test_create_puts_index_and_corpus_file_in_place_together(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk while --corpus-out is written leaves the index of the run before, not a new
    index beside the old corpus file (the index used to be replaced first)."""
    corpus = write_bin(tmp_path / "c.bin", CORPUS)
    index, corpus_out = tmp_path / "s.lkdc", tmp_path / "c.lkcorpus"
    code, _, _ = run(capsys, "create", corpus, "-o", str(index), "--corpus-out", str(corpus_out), "-q")
    assert code == 0
    before = (index.read_bytes(), corpus_out.read_bytes())
    write_bin(tmp_path / "c.bin", CORPUS[::-1])
    from lookupdec.cli import create

    def disk_full(parts: object, path: str, *args: object) -> None:
        with _atomic.atomic_writer(path) as f:
            f.write(b"the start of a corpus file")
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(create, "write_corpus_file", disk_full)
    code, out, err = run(capsys, "create", corpus, "-o", str(index), "--corpus-out", str(corpus_out))
    assert_clean_error(code, err, "c.lkcorpus", "No space left")
    assert (index.read_bytes(), corpus_out.read_bytes()) == before and out == ""
    assert sorted(os.listdir(tmp_path)) == ["c.bin", "c.lkcorpus", "s.lkdc"]
    monkeypatch.undo()
    code, out, _ = run(capsys, "create", corpus, "-o", str(index), "--corpus-out", str(corpus_out))
    assert code == 0 and "s.lkdc: lookupdec static cache" in out and "c.lkcorpus: lookupdec corpus file" in out
    assert index.read_bytes() != before[0] and corpus_out.read_bytes() != before[1]


def test_read_only_folder_names_the_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As root a read-only folder is writable, so the refusal is simulated at the open."""
    real_open = os.open

    def denied(path: str, flags: int, mode: int = 0o777, **kw: object) -> int:
        if str(path).startswith(str(tmp_path)):
            raise PermissionError(errno.EACCES, "Permission denied", path)
        return real_open(path, flags, mode)

    monkeypatch.setattr(os, "open", denied)
    with pytest.raises(PermissionError) as info, _atomic.atomic_writer(tmp_path / "o.bin") as f:
        f.write(b"x")
    assert info.value.filename == str(tmp_path / "o.bin")


@pytest.mark.parametrize("flag", ["-c", "--n-draft"])
def test_huge_replay_options_are_clear_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str) -> None:
    replay = write_bin(tmp_path / "r.bin", CORPUS)
    code, _, err = run(capsys, "stats", replay, flag, str(2**63))
    assert_clean_error(code, err, "2147483647", str(2**63))


# --- 9: no litter after kill -9 --------------------------------------------------------------

_SLOW_WRITER = """
import sys, time
from lookupdec import _atomic
if sys.argv[2] == "named":
    _atomic._open_unnamed = lambda folder: None
with _atomic.atomic_writer(sys.argv[1]) as f:
    f.write(b"x" * 1_000_000)
    f.flush()
    print("writing", flush=True)
    time.sleep(60)
"""


@pytest.mark.parametrize("mode", ["unnamed", "named"])
def test_kill_9_during_a_write_leaves_no_litter(tmp_path: Path, mode: str) -> None:
    out = tmp_path / "cache.bin"
    out.write_bytes(b"old")
    proc = subprocess.Popen([sys.executable, "-c", _SLOW_WRITER, str(out), mode], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "writing\n"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert out.read_bytes() == b"old"  # the old file is intact
    if mode == "named":  # no O_TMPFILE: the next write to the same path removes the dead process's file
        assert len(os.listdir(tmp_path)) == 2
        with _atomic.atomic_writer(out) as f:
            f.write(b"new")
    assert os.listdir(tmp_path) == ["cache.bin"]


# --- 11: the output is not an input ----------------------------------------------------------


def test_output_that_is_an_input_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    corpus = write_bin(tmp_path / "c.bin", CORPUS)
    before = Path(corpus).read_bytes()
    code, _, err = run(capsys, "create", corpus, "-o", corpus, "-q")
    assert_clean_error(code, err, corpus, "also an input")
    assert Path(corpus).read_bytes() == before
    a = tmp_path / "a.bin"
    ref.build_static(CORPUS).save(a)
    link = tmp_path / "alias.bin"
    link.symlink_to(a)
    code, _, err = run(capsys, "merge", str(a), "-o", str(link), "-q")
    assert_clean_error(code, err, str(link), "also an input")


# --- 6: caches are regular files; 0-byte static vs dynamic -----------------------------------


@pytest.mark.parametrize("flag", ["-lcs", "-lcd", "inspect", "merge", "replay"])
def test_fifo_input_is_an_error_not_a_hang(tmp_path: Path, flag: str) -> None:
    fifo = tmp_path / "fifo.bin"
    os.mkfifo(fifo)
    replay = write_bin(tmp_path / "r.bin", CORPUS)
    argv = {
        "-lcs": ["stats", replay, "-lcs", str(fifo)],
        "-lcd": ["stats", replay, "-lcd", str(fifo)],
        "inspect": ["inspect", str(fifo)],
        "merge": ["merge", str(fifo), "-o", str(tmp_path / "m.bin")],
        "replay": ["stats", str(fifo)],
    }[flag]
    # A subprocess with a timeout: a hang must fail the test, not the suite.
    done = subprocess.run([sys.executable, "-m", "lookupdec", *argv], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "is a fifo, not a regular file" in done.stderr and str(fifo) in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("impl", ["reference", "fast"])
def test_fifo_through_the_api_is_an_error(tmp_path: Path, impl: str) -> None:
    module = ref if impl == "reference" else fast_impl()
    fifo = tmp_path / "fifo.bin"
    os.mkfifo(fifo)
    with pytest.raises(CacheFormatError, match="is a fifo, not a regular file"):
        module.NgramCache.load(fifo)
    with pytest.raises(CacheFormatError, match="is a fifo, not a regular file"):
        module.load_static(fifo)


def test_zero_byte_static_is_an_error_dynamic_is_empty(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty.lkdc"
    empty.write_bytes(b"")
    replay = write_bin(tmp_path / "r.bin", CORPUS * 3)
    for impl in ("reference", "fast"):
        code, _, err = run(capsys, "stats", replay, "-c", "8", "-lcs", str(empty), "--impl", impl)
        assert_clean_error(code, err, str(empty), "empty file")
        code, _, err = run(capsys, "stats", replay, "-c", "8", "-lcd", str(empty), "--impl", impl, "--json")
        assert code == 0, err
    for module in (ref, fast_impl()):
        with pytest.raises(CacheFormatError, match="empty file"):
            module.load_static(empty)
        assert len(module.NgramCache.load(empty)) == 0
    code, _, err = run(capsys, "stats", replay, "-c", "8", "-lcd", "/dev/null")
    assert_clean_error(code, err, "/dev/null", "not a regular file")


# --- 7: header fields >= 2**63 -------------------------------------------------------------


def _patch_u64(path: Path, offset: int, value: int) -> None:
    data = bytearray(path.read_bytes())
    struct.pack_into("<Q", data, offset, value)
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("offset", [24, 32, 40, 48, 64, 72, 88])
def test_header_fields_past_2_63(tmp_path: Path, capsys: pytest.CaptureFixture[str], offset: int) -> None:
    """Every u64 field at 2**64-1: a one-line error naming the file, or (vocab_size, total_count) accepted."""
    path = tmp_path / "x.lkdc"
    make_index(path)
    _patch_u64(path, offset, 2**64 - 1)
    replay = write_bin(tmp_path / "r.bin", CORPUS * 3)
    results = []
    for impl in ("reference", "fast"):
        code, _, err = run(capsys, "stats", replay, "-c", "8", "-lcs", str(path), "--impl", impl, "--json")
        if code:
            assert_clean_error(code, err, str(path))
        results.append(code)
    assert results[0] == results[1]
    code, _, err = run(capsys, "inspect", str(path), "--verify")
    if offset == 48:  # vocab_size is opaque to the format: both accept it, verify too
        assert results == [0, 0] and code == 0, err
    else:
        assert_clean_error(code, err, str(path))


# --- 10: negative token ids ------------------------------------------------------------------


def test_negative_token_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    corpus = write_bin(tmp_path / "c.bin", [5, 6, -1, 7])
    for fmt in ("lookupdec", "llama"):
        code, _, err = run(capsys, "create", corpus, "-o", str(tmp_path / "o"), "--format", fmt, "-q")
        assert_clean_error(code, err, corpus, "-1", "position 2", "at byte offset 8")
    assert not (tmp_path / "o").exists()
    npy = tmp_path / "c.npy"
    np.save(npy, np.array([5, -3], dtype=np.int64))
    code, _, err = run(capsys, "create", str(npy), "-o", str(tmp_path / "o"), "-q")
    assert_clean_error(code, err, str(npy), "-3", "position 1")


# --- 12: a replay shorter than -c ------------------------------------------------------------


def test_replay_shorter_than_ctx_warns(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    replay = write_bin(tmp_path / "r.bin", CORPUS)
    code, out, err = run(capsys, "stats", replay, "-c", "4096")
    assert code == 0
    assert "n_drafted    = 0" in out  # llama.cpp's counts, kept
    assert err.startswith("lookupdec: warning: ") and replay in err and "nothing is replayed" in err
    code, _, err = run(capsys, "stats", replay, "-c", "4")
    assert code == 0 and "warning" not in err


# --- 4: fork v2 overlapping spans --------------------------------------------------------------


def test_fork_v2_overlapping_spans_fail_verification(tmp_path: Path) -> None:
    """Two keys whose spans overlap (same total length as before): refused though the lengths add up."""
    path = tmp_path / "f.v2"
    contents = [((1, 2, -1, -1), [(3, 2), (4, 1)]), ((5, 6, -1, -1), [(7, 1), (8, 1)])]
    formats.write_static(contents, path, "fork-v2")
    fs = formats.ForkStatic(path)
    rows = fs._table_offset
    data = bytearray(path.read_bytes())
    # key 0 keeps 0..1; key 1 (entries 2..3) becomes 1..2: lengths still sum to 4 = n_entries.
    span1 = struct.unpack_from("<Q", data, rows + 16 + 8)[0]
    struct.pack_into("<Q", data, rows + 16 + 8, ((span1 >> 24) - 1) << 24 | 2)
    path.write_bytes(bytes(data))
    with pytest.raises(CacheFormatError, match=r"rows 0 and 1: spans overlap \(entries 0\.\.1 and 1\.\.2\)"):
        list(formats.read_as_contents(path))


# --- 5: merge past 2**31-1 -----------------------------------------------------------------


@pytest.mark.parametrize("impl", ["reference", "fast"])
@pytest.mark.parametrize("fmt", ["llama", "lookupdec"])
def test_merge_saturates_with_one_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], impl: str, fmt: str
) -> None:
    big = (2**31 - 1) - 5
    a, b = tmp_path / "a.bin", tmp_path / "b.bin"
    formats.write_static([((1, 2, -1, -1), [(3, big), (4, 1)])], a, "llama")
    formats.write_static([((1, 2, -1, -1), [(3, 10), (4, 1)])], b, "llama")
    out = tmp_path / "m"
    code, _, err = run(capsys, "merge", str(a), str(b), "-o", str(out), "--format", fmt, "--impl", impl, "-q")
    assert code == 0, err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("lookupdec: warning: ") and str(out) in lines[0], err
    assert list(formats.read_as_contents(out)) == [((1, 2, -1, -1), [(3, 2**31 - 1), (4, 2)])]


# --- 3: one verifier, the same per-lookup checks -------------------------------------------


@pytest.mark.parametrize(("offset", "value"), [(20, 1), (88, 1), (64, 12345)])
def test_fast_verify_is_the_formats_verifier(tmp_path: Path, offset: int, value: int) -> None:
    """flags = 1, reserved = 1, a wrong total_count: rejected by StaticIndex.verify as by formats (docs)."""
    path = tmp_path / "x.lkdc"
    make_index(path)
    data = bytearray(path.read_bytes())
    struct.pack_into("<I" if offset == 20 else "<Q", data, offset, value)
    path.write_bytes(bytes(data))
    with pytest.raises(CacheFormatError):
        formats.inspect_file(path, verify=True)
    for in_memory in (False, True):
        ix = fast_impl().load_static(path, in_memory=in_memory)
        with pytest.raises(CacheFormatError):
            ix.verify()
        ix.close()
        with pytest.raises(CacheFormatError):
            fast_impl().load_static(path, in_memory=in_memory, verify=True)
    with pytest.raises(CacheFormatError):
        _pipeline.load_static(ref, str(path), verify=True)


def _corrupt_count(path: Path) -> None:
    """Set every count of the index to 0 (what the fuzzer found drafting in the fast path)."""
    with formats.LookupdecIndexReader(path) as r:
        h = r._h
    data = bytearray(path.read_bytes())
    for j in range(h.n_entries):
        struct.pack_into("<i", data, h.counts_offset + 4 * j, 0)
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("impl", ["reference", "fast"])
@pytest.mark.parametrize("load", [False, True])
def test_count_zero_is_an_error_in_both(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], impl: str, load: bool
) -> None:
    path = tmp_path / "x.lkdc"
    make_index(path)
    _corrupt_count(path)
    replay = write_bin(tmp_path / "r.bin", CORPUS * 3)
    argv = ["stats", replay, "-c", "8", "-lcs", str(path), "--impl", impl] + (["--load"] if load else [])
    code, _, err = run(capsys, *argv)
    assert_clean_error(code, err, str(path), "count 0")
    code, _, err = run(capsys, "stats", replay, "-c", "8", "-lcs", str(path), "--impl", impl, "--verify")
    assert_clean_error(code, err, str(path))


def test_opening_does_not_checksum(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A flipped checksum byte: both implementations open in O(1) and draft the same; verify refuses."""
    path = tmp_path / "x.lkdc"
    make_index(path)
    data = bytearray(path.read_bytes())
    data[80] ^= 0xFF
    path.write_bytes(bytes(data))
    replay = write_bin(tmp_path / "r.bin", CORPUS * 3)
    outs = []
    for impl in ("reference", "fast"):
        code, out, err = run(capsys, "stats", replay, "-c", "8", "-lcs", str(path), "--impl", impl)
        assert code == 0, err
        outs.append([line for line in out.splitlines() if line.startswith(("n_drafted", "n_accept"))])
        code, _, err = run(capsys, "stats", replay, "-c", "8", "-lcs", str(path), "--impl", impl, "--verify")
        assert_clean_error(code, err, str(path), "checksum")
    assert outs[0] == outs[1]


# --- 14: nothing rewrites an index in place --------------------------------------------------


def test_rewriting_a_mapped_index_leaves_the_mapping_intact(tmp_path: Path) -> None:
    """``create -o`` over an index another process has mapped: a new file, the old mapping stays readable."""
    path = tmp_path / "x.lkdc"
    make_index(path)
    ix = fast_impl().load_static(path)
    before = ix.get((1, 2))
    inode = path.stat().st_ino
    make_index(path, [9, 9, 9, 9])
    assert path.stat().st_ino != inode  # replaced by rename, not truncated in place
    assert ix.get((1, 2)) == before  # no SIGBUS: the old pages are still there
    ix.close()


def test_load_help_documents_sigbus(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "stats", "--help")
    assert code == 0 and "SIGBUS" in out


def _replay_outcome(
    impl_name: str, path: str, in_memory: bool, tokens: list[int], mapped_bytes: bool = True
) -> tuple[str, object]:
    impl = ref if impl_name == "reference" else fast_impl()
    old = os.environ.get("LOOKUPDEC_MAPPED_BYTES")
    os.environ["LOOKUPDEC_MAPPED_BYTES"] = "1" if mapped_bytes else "0"  # "0": the mmap-slices fallback
    try:
        static = _pipeline.load_static(impl, path, in_memory=in_memory)
        r = impl.replay(tokens, 8, 4, static, impl.NgramCache())
    except CacheFormatError as e:
        assert path in str(e)  # the error names the file
        return "error", None
    finally:
        if old is None:
            del os.environ["LOOKUPDEC_MAPPED_BYTES"]
        else:
            os.environ["LOOKUPDEC_MAPPED_BYTES"] = old
    return "ok", (r.n_drafted, r.n_accept, r.n_predict)


@pytest.mark.slow  # seconds: run by .ci/run's slow stage, not the README's command
def test_every_int32_of_an_index_body_refused_or_same_counts(tmp_path: Path) -> None:
    """Item 3: each 4-byte word of the body (slots .. counts) set to 0, -1 and 2**31-1, one at a
    time: the reference's reader and the fast path (mapped as bytes, mapped through mmap slices,
    loaded) all refuse the file or give the same counts."""
    seed = tmp_path / "seed.lkdc"
    make_index(seed)
    original = seed.read_bytes()
    tokens = CORPUS * 3
    path = tmp_path / "m.lkdc"
    seen = {"error": 0, "ok": 0}
    for offset in range(96, len(original), 4):
        for value in (0, -1, 2**31 - 1):
            data = bytearray(original)
            struct.pack_into("<i", data, offset, value)
            path.write_bytes(bytes(data))
            outcomes = [
                _replay_outcome("reference", str(path), False, tokens),
                _replay_outcome("fast", str(path), False, tokens),
                _replay_outcome("fast", str(path), True, tokens),
                _replay_outcome("fast", str(path), False, tokens, mapped_bytes=False),
            ]
            assert outcomes[0] == outcomes[1] == outcomes[2] == outcomes[3], (offset, value, outcomes)
            seen[outcomes[0][0]] += 1
    assert seen["error"] and seen["ok"]  # both outcomes happen: the test exercises the checks


@pytest.mark.parametrize("in_memory", [False, True])
def test_a_part_that_fails_its_check_fails_every_time(tmp_path: Path, in_memory: bool) -> None:
    """The fast path remembers looked-up parts (a memo of recent 2-grams): never one that failed."""
    path = tmp_path / "x.lkdc"
    make_index(path)
    _corrupt_count(path)
    static = fast_impl().load_static(path, in_memory=in_memory)
    for _ in range(2):
        with pytest.raises(CacheFormatError, match="count 0"):
            fast_impl().replay(CORPUS * 3, 8, 4, static, fast_impl().NgramCache())
    static.close()
