"""Token input: raw int32 files, .npy arrays, and text through a (tiny, local) Hugging Face tokenizer."""

from __future__ import annotations

from array import array
from pathlib import Path

import numpy as np
import pytest

from lookupdec._rawids import read_raw_ids
from lookupdec.errors import TokenFileError
from lookupdec.tokens import bos_token_id, check_token_ids, load_tokens, read_tokens, tokenize_file, vocab_info

VOCAB = {"<unk>": 0, "<bos>": 1, "the": 2, "cat": 3, "sat": 4, "on": 5, "mat": 6, ".": 7}


def make_tokenizer(path: Path, *, post_processor: bool = True, bos: str = "<bos>") -> Path:
    """A WordLevel tokenizer.json built here, so no download is needed."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {(bos if k == "<bos>" else k): v for k, v in VOCAB.items()}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens([bos])
    if post_processor:
        tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", special_tokens=[(bos, 1)])
    tok.save(str(path))
    return path


@pytest.fixture
def tokenizer_json(tmp_path: Path) -> Path:
    return make_tokenizer(tmp_path / "tokenizer.json")


def write_text(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


# --- raw int32 files -------------------------------------------------------------------


def test_raw_roundtrip(tmp_path: Path) -> None:
    ids = np.array([0, 1, -1, 2**31 - 1, -(2**31), 128255], dtype="<i4")
    path = tmp_path / "t.bin"
    ids.tofile(path)
    got = read_tokens(path)
    assert got.dtype == np.int32
    assert got.tolist() == ids.tolist()


def test_raw_empty(tmp_path: Path) -> None:
    path = tmp_path / "empty.bin"
    path.write_bytes(b"")
    assert read_tokens(path).tolist() == []


def test_raw_is_little_endian(tmp_path: Path) -> None:
    path = tmp_path / "t.bin"
    path.write_bytes(b"\x01\x00\x00\x00\x00\x01\x00\x00")
    assert read_tokens(path).tolist() == [1, 256]


@pytest.mark.parametrize("size", [1, 2, 3, 5, 10])
def test_raw_size_not_multiple_of_4(tmp_path: Path, size: int) -> None:
    path = tmp_path / "bad.bin"
    path.write_bytes(b"\x07" * size)
    with pytest.raises(TokenFileError) as info:
        read_tokens(path)
    assert info.value.path == str(path)
    assert info.value.offset == size - size % 4
    assert str(path) in str(info.value) and "byte offset" in str(info.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_tokens(tmp_path / "nope.bin")


# --- raw files without numpy (the replay's path) ----------------------------------------


@pytest.mark.parametrize("ids", [[], [0, 1, 2**31 - 1, 128255, 256]])
def test_raw_ids_equal_read_tokens(tmp_path: Path, ids: list[int]) -> None:
    path = tmp_path / "t.bin"
    np.array(ids, dtype="<i4").tofile(path)
    got = read_raw_ids(path)
    assert got.typecode == "i" and got.itemsize == 4
    assert got.tolist() == read_tokens(path).tolist()


@pytest.mark.parametrize("size", [1, 3, 10])
def test_raw_ids_size_error_is_read_tokens_error(tmp_path: Path, size: int) -> None:
    path = tmp_path / "bad.bin"
    path.write_bytes(b"\x07" * size)
    with pytest.raises(TokenFileError) as expected:
        read_tokens(path)
    with pytest.raises(TokenFileError) as got:
        read_raw_ids(path)
    assert (str(got.value), got.value.offset) == (str(expected.value), expected.value.offset)


def test_raw_ids_negative_error_is_check_token_ids_error(tmp_path: Path) -> None:
    path = tmp_path / "neg.bin"
    np.array([5, 6, -1, 7, -3], dtype="<i4").tofile(path)
    with pytest.raises(TokenFileError) as expected:
        check_token_ids(path, read_tokens(path), raw=True)
    with pytest.raises(TokenFileError) as got:
        read_raw_ids(path)
    assert (str(got.value), got.value.offset) == (str(expected.value), expected.value.offset)
    assert got.value.offset == 8  # the third id


def test_fast_path_copies_an_int32_array_like_a_list() -> None:
    from lookupdec.fast._cache import to_vec

    ids = [3, -1, 2**31 - 1, -(2**31), 0, 9]
    for lo in (0, 2, 6, 9):
        assert list(to_vec(array("i", ids), lo)) == list(to_vec(ids, lo)) == ids[lo:]


# --- .npy ------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["<i8", ">i8", "<u2", "i1", "<u4", "<i4", ">i4"])
def test_npy_integer_dtypes(tmp_path: Path, dtype: str) -> None:
    ids = [0, 5, 100, 127]
    path = tmp_path / "t.npy"
    np.save(path, np.array(ids, dtype=dtype))
    got = read_tokens(path)
    assert got.dtype == np.int32
    assert got.tolist() == ids


def _npy_data_offset(path: Path) -> int:
    with open(path, "rb") as f:
        np.lib.format.read_magic(f)
        np.lib.format.read_array_header_1_0(f)
        return f.tell()


@pytest.mark.parametrize(("dtype", "bad"), [("<i8", 2**31), ("<i8", -(2**31) - 1), ("<u4", 2**32 - 1), ("<u8", 2**63)])
def test_npy_out_of_int32(tmp_path: Path, dtype: str, bad: int) -> None:
    arr = np.array([1, 2, 3, bad, 4], dtype=dtype)
    path = tmp_path / "t.npy"
    np.save(path, arr)
    with pytest.raises(TokenFileError) as info:
        read_tokens(path)
    itemsize = np.dtype(dtype).itemsize
    assert info.value.offset == _npy_data_offset(path) + 3 * itemsize
    assert info.value.path == str(path)
    assert str(bad) in str(info.value)


def test_npy_int64_edges_fit(tmp_path: Path) -> None:
    path = tmp_path / "t.npy"
    np.save(path, np.array([-(2**31), 2**31 - 1], dtype=np.int64))
    assert read_tokens(path).tolist() == [-(2**31), 2**31 - 1]


def test_npy_float_rejected(tmp_path: Path) -> None:
    path = tmp_path / "t.npy"
    np.save(path, np.array([1.0, 2.0]))
    with pytest.raises(TokenFileError, match="integer dtype"):
        read_tokens(path)


def test_npy_2d_rejected(tmp_path: Path) -> None:
    path = tmp_path / "t.npy"
    np.save(path, np.zeros((2, 3), dtype=np.int32))
    with pytest.raises(TokenFileError, match="one-dimensional"):
        read_tokens(path)


def test_npy_truncated(tmp_path: Path) -> None:
    path = tmp_path / "t.npy"
    np.save(path, np.arange(10, dtype=np.int32))
    path.write_bytes(path.read_bytes()[:-6])
    with pytest.raises(TokenFileError, match="cut short"):
        read_tokens(path)


def test_npy_garbage(tmp_path: Path) -> None:
    path = tmp_path / "t.npy"
    path.write_bytes(b"definitely not numpy")
    with pytest.raises(TokenFileError) as info:
        read_tokens(path)
    assert info.value.offset == 0


# --- text through a tokenizer ------------------------------------------------------------


def test_tokenize_default_follows_post_processor(tmp_path: Path, tokenizer_json: Path) -> None:
    text = write_text(tmp_path / "a.txt", "the cat sat on the mat .")
    assert tokenize_file(text, tokenizer_json).tolist() == [1, 2, 3, 4, 5, 2, 6, 7]


def test_tokenize_no_bos(tmp_path: Path, tokenizer_json: Path) -> None:
    text = write_text(tmp_path / "a.txt", "the cat sat")
    assert tokenize_file(text, tokenizer_json, add_bos=False).tolist() == [2, 3, 4]


def test_tokenize_force_bos(tmp_path: Path, tokenizer_json: Path) -> None:
    text = write_text(tmp_path / "a.txt", "the cat")
    assert tokenize_file(text, tokenizer_json, add_bos=True).tolist() == [1, 2, 3]


def test_tokenize_special_text_is_parsed(tmp_path: Path, tokenizer_json: Path) -> None:
    # like llama.cpp's parse_special = true
    text = write_text(tmp_path / "a.txt", "the <bos> cat")
    assert tokenize_file(text, tokenizer_json, add_bos=False).tolist() == [2, 1, 3]


def test_tokenizer_without_post_processor(tmp_path: Path) -> None:
    tok = make_tokenizer(tmp_path / "tok.json", post_processor=False, bos="<s>")
    text = write_text(tmp_path / "a.txt", "the cat")
    assert tokenize_file(text, tok).tolist() == [2, 3]  # nothing added, like Qwen2.5 in llama.cpp
    assert tokenize_file(text, tok, add_bos=True).tolist() == [1, 2, 3]  # "<s>" found by name


def test_tokenizer_without_any_bos(tmp_path: Path) -> None:
    tok = make_tokenizer(tmp_path / "tok.json", post_processor=False, bos="<sep>")
    text = write_text(tmp_path / "a.txt", "the cat")
    with pytest.raises(TokenFileError, match="no BOS"):
        tokenize_file(text, tok, add_bos=True)


def test_bos_token_id(tmp_path: Path, tokenizer_json: Path) -> None:
    from tokenizers import Tokenizer

    assert bos_token_id(Tokenizer.from_file(str(tokenizer_json))) == 1


def test_tokenize_invalid_utf8(tmp_path: Path, tokenizer_json: Path) -> None:
    path = tmp_path / "a.txt"
    path.write_bytes(b"the cat \xff sat")
    with pytest.raises(TokenFileError) as info:
        tokenize_file(path, tokenizer_json)
    assert info.value.offset == 8


def test_bad_tokenizer_file(tmp_path: Path) -> None:
    text = write_text(tmp_path / "a.txt", "the cat")
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{not json")
    with pytest.raises(TokenFileError) as info:
        tokenize_file(text, bad)
    assert str(bad) in str(info.value)


def test_missing_tokenizer(tmp_path: Path) -> None:
    text = write_text(tmp_path / "a.txt", "the cat")
    with pytest.raises(FileNotFoundError):
        tokenize_file(text, tmp_path / "missing.json")


def test_vocab_info(tmp_path: Path, tokenizer_json: Path) -> None:
    size, fingerprint = vocab_info(tokenizer_json)
    assert size == len(VOCAB)
    assert len(fingerprint) == 8
    assert vocab_info(make_tokenizer(tmp_path / "same.json"))[1] == fingerprint
    other = make_tokenizer(tmp_path / "other.json", bos="<s>")
    assert vocab_info(other)[1] != fingerprint


# --- dispatch --------------------------------------------------------------------------------


def test_load_tokens_dispatch(tmp_path: Path, tokenizer_json: Path) -> None:
    bin_path = tmp_path / "t.bin"
    np.array([4, 5, 6], dtype="<i4").tofile(bin_path)
    raw = tmp_path / "t.tok"
    np.array([7, 8], dtype="<i4").tofile(raw)
    text = write_text(tmp_path / "t.txt", "the mat")
    assert load_tokens(bin_path).tolist() == [4, 5, 6]  # by extension
    assert load_tokens(raw, tokens=True).tolist() == [7, 8]
    assert load_tokens(text, tokenizer=tokenizer_json).tolist() == [1, 2, 6]
    assert load_tokens(text, tokenizer=tokenizer_json, add_bos=False).tolist() == [2, 6]
    with pytest.raises(ValueError, match="token file or text"):
        load_tokens(text)
    with pytest.raises(ValueError, match="not both"):
        load_tokens(text, tokens=True, tokenizer=tokenizer_json)
    with pytest.raises(ValueError, match="--add-bos"):
        load_tokens(bin_path, add_bos=True)
    with pytest.raises(FileNotFoundError):
        load_tokens(tmp_path / "missing.txt")
