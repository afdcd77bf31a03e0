"""llama.cpp's legacy cache files: loading bad input like llama.cpp (but raising, not aborting), saving safely."""

from __future__ import annotations

import struct
import warnings
from pathlib import Path
from typing import Any

import pytest

from lookupdec.errors import CacheFormatError
from tests.conftest import vectors
from tests.impls import FastImpl, ImplTests, ReferenceImpl


def record(key: tuple[int, int, int, int], followers: list[tuple[int, int]], ntokens: int | None = None) -> bytes:
    n = len(followers) if ntokens is None else ntokens
    return struct.pack("<4ii", *key, n) + b"".join(struct.pack("<ii", t, c) for t, c in followers)


class LegacyFileTests(ImplTests):
    def load(self, path: Path, **kw: Any) -> Any:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return self.impl.NgramCache.load(path, **kw)

    @pytest.mark.parametrize("i", range(len(vectors("files")["truncated_legacy_load"]["results"])))
    def test_truncated_vectors(self, tmp_path: Path, i: int) -> None:
        """Each truncation of a real file behaves as llama.cpp's loaders did (files.json)."""
        data = vectors("files")["truncated_legacy_load"]
        res = data["results"][i]
        path = tmp_path / "cut.bin"
        path.write_bytes(bytes.fromhex(data["file_hex"])[: res["truncate_to_bytes"]])
        upstream, fork = res["upstream_result"], res["fork_result"]
        if upstream.startswith("ok"):
            n = int(upstream.split()[1])
            assert len(self.load(path)) == n
        else:  # llama.cpp aborts the process; we raise, naming the file
            with pytest.raises(CacheFormatError, match=r"cut\.bin"):
                self.load(path)
        if fork.startswith("ok"):
            assert len(self.load(path, strict=True)) == int(fork.split()[1])
        else:
            with pytest.raises(CacheFormatError, match=r"cut\.bin"):
                self.load(path, strict=True)

    def test_trailing_bytes_warn(self, tmp_path: Path) -> None:
        path = tmp_path / "t.bin"
        path.write_bytes(record((1, 2, -1, -1), [(3, 4)]) + b"\x00" * 7)
        with pytest.warns(UserWarning, match="7 trailing bytes"):
            cache = self.impl.NgramCache.load(path)
        assert cache.contents() == [((1, 2, -1, -1), [(3, 4)])]

    @pytest.mark.parametrize(
        ("blob", "offset", "what"),
        [
            (record((1, -1, -1, -1), [(2, 1)], ntokens=0), 16, "ntokens = 0"),
            (record((1, -1, -1, -1), [(2, 1)], ntokens=-5), 16, "ntokens = -5"),
            (record((1, -1, -1, -1), [(2, 0)]), 24, "count 0"),
            (record((1, -1, -1, -1), [(2, 1), (3, -7)]), 32, "count -7"),
            (record((1, -1, -1, -1), [(2, 1)], ntokens=2), 20, "cut short"),
            (record((1, -1, -1, -1), [(2, 1)]) + record((5, -1, -1, -1), [])[:18], 44, "ntokens"),
        ],
    )
    def test_malformed(self, tmp_path: Path, blob: bytes, offset: int, what: str) -> None:
        path = tmp_path / "bad.bin"
        path.write_bytes(blob)
        with pytest.raises(CacheFormatError, match=what) as info:
            self.impl.NgramCache.load(path)
        assert info.value.offset == offset
        assert str(path) in str(info.value)

    def test_duplicates_first_wins(self, tmp_path: Path) -> None:
        """Like std::map emplace: the first record of a key and the first count of a follower win."""
        path = tmp_path / "dup.bin"
        path.write_bytes(record((1, 2, 3, 4), [(5, 1), (5, 9), (6, 2)]) + record((1, 2, 3, 4), [(7, 7)]))
        assert self.impl.NgramCache.load(path).contents() == [((1, 2, 3, 4), [(5, 1), (6, 2)])]

    def test_missing_file(self, tmp_path: Path) -> None:
        with pytest.raises(FileNotFoundError, match=r"nope\.bin"):
            self.impl.NgramCache.load(tmp_path / "nope.bin")

    def test_empty_file(self, tmp_path: Path) -> None:
        path = tmp_path / "empty.bin"
        path.write_bytes(b"")
        assert len(self.impl.NgramCache.load(path)) == 0

    def test_round_trip(self, tmp_path: Path) -> None:
        cache = self.impl.NgramCache()
        seq = [5, -3, 2**31 - 1, 0, 5, -3, 7, 5, -3, 2**31 - 1, -(2**31)]
        cache.update(seq, len(seq))
        path = tmp_path / "c.bin"
        cache.save(path)
        # Every record is 20 + 8 * ntokens bytes, so the size is fixed by the contents.
        assert path.stat().st_size == sum(20 + 8 * len(f) for _, f in cache.contents())
        assert self.impl.NgramCache.load(path) == cache

    def test_save_is_atomic(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """A failed save leaves the previous file intact and no temporary file behind."""
        path = tmp_path / "keep.bin"
        good = record((1, -1, -1, -1), [(2, 3)])
        path.write_bytes(good)
        cache = self.impl.NgramCache()
        cache.update([1, 2, 3], 3)

        def boom(*args: object) -> None:
            raise OSError("disk full")

        monkeypatch.setattr("os.fsync", boom)
        with pytest.raises(OSError, match="disk full"):
            cache.save(path)
        assert path.read_bytes() == good
        assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.bin"]


class TestLegacyFilesReference(ReferenceImpl, LegacyFileTests):
    pass


class TestLegacyFilesFast(FastImpl, LegacyFileTests):
    pass


def test_each_reads_what_the_other_wrote(tmp_path: Path) -> None:
    """Like test_pickle: files written by one implementation load identically in the other."""
    import lookupdec.reference as ref
    from tests.conftest import fast_impl

    fast = fast_impl()
    seq = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4, 6, 2, 6, 4, 3]
    for writer, reader in ((ref, fast), (fast, ref)):
        cache = writer.NgramCache()
        cache.update(seq, len(seq))
        path = tmp_path / f"{writer.IMPLEMENTATION}.bin"
        cache.save(path)
        assert reader.NgramCache.load(path).contents() == cache.contents()
