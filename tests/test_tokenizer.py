"""lookupdec.tokenizer against llama.cpp's own outputs: the test-tokenizer-0 vectors of six vocabularies."""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import SHARED_DATA

SHARED_VOCAB = Path(os.environ.get("LOOKUPDEC_VOCAB", SHARED_DATA / "vocab"))
VOCABS = ["llama-bpe", "llama-spm", "qwen2", "phi-3", "deepseek-coder", "gpt-2"]

needs_vocab = pytest.mark.skipif(not SHARED_VOCAB.is_dir(), reason=f"vocabulary folder {SHARED_VOCAB} is absent")


def gguf(name: str) -> Path:
    return SHARED_VOCAB / f"ggml-vocab-{name}.gguf"


@cache
def tok(name: str):  # type: ignore[no-untyped-def]
    from lookupdec.tokenizer import load_tokenizer

    return load_tokenizer(gguf(name))


def vectors(name: str) -> list[tuple[str, list[int]]]:
    texts = (SHARED_VOCAB / f"ggml-vocab-{name}.gguf.inp").read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n")
    outs = (SHARED_VOCAB / f"ggml-vocab-{name}.gguf.out").read_text().split("\n")
    assert len(outs) >= len(texts)
    return [(t, [int(x) for x in o.split()]) for t, o in zip(texts, outs, strict=False)]


@needs_vocab
@pytest.mark.parametrize("name", VOCABS)
def test_llama_cpp_vectors(name: str) -> None:
    t = tok(name)
    cases = vectors(name)
    assert len(cases) >= 40
    bad = [(text, exp) for text, exp in cases if t.encode(text, add_special=False, parse_special=False).tolist() != exp]
    assert not bad, f"{len(bad)} of {len(cases)} texts differ, first: {bad[0][0]!r}"


@needs_vocab
def test_spm_special_and_bos() -> None:
    t = tok("llama-spm")
    # llama.cpp's own outputs (shared/spec/tokenization.md)
    assert t.encode("<s>Hello</s> world").tolist() == [1, 1, 15043, 2, 29871, 3186]
    assert t.encode("<s>Hello</s> world", add_special=False, parse_special=False).tolist() == [
        529, 29879, 29958, 10994, 829, 29879, 29958, 3186,
    ]  # fmt: skip
    assert t.encode("").tolist() == [1]
    assert t.encode("", add_special=False).tolist() == []


@needs_vocab
def test_llama3_special_flags() -> None:
    t = tok("llama-bpe")
    plain = t.encode("Hello world", add_special=False).tolist()
    assert plain == [9906, 1917]  # the shipped wiki token files' tokenizer gives these too
    assert t.encode("Hello world").tolist() == [128000, *plain]
    with_text = t.encode("<|begin_of_text|>Hello world").tolist()
    assert with_text == [128000, 128000, *plain]
    raw = t.encode("<|begin_of_text|>", add_special=False, parse_special=False).tolist()
    assert 128000 not in raw and len(raw) > 1
    assert t.bos_id == 128000 and t.n_vocab == 128256 and t.add_bos


@needs_vocab
def test_qwen2_no_bos_and_user_defined_always_parsed() -> None:
    t = tok("qwen2")
    assert not t.add_bos
    assert t.encode("hi").tolist() == t.encode("hi", add_special=False).tolist()
    # [PAD151646] is user-defined: matched even without parse_special; <|im_start|> is control: only with it
    assert t.encode("a[PAD151646]b", parse_special=False).tolist()[1] == 151646
    assert 151644 not in t.encode("<|im_start|>", parse_special=False).tolist()
    assert t.encode("<|im_start|>").tolist() == [151644]


@needs_vocab
def test_phi3_rstrip_after_special() -> None:
    t = tok("phi-3")
    # Phi-3's special tokens eat the spaces after them (llama.cpp sets RSTRIP by model name)
    a = t.encode("<|user|>   Hi", add_special=False).tolist()
    b = t.encode("<|user|>Hi", add_special=False).tolist()
    assert a == b and a[0] == 32010


@needs_vocab
def test_fingerprint_and_header_only_read() -> None:
    from lookupdec.tokenizer.gguf import read_gguf_kv

    fps = {tok(n).fingerprint for n in VOCABS}
    assert len(fps) == len(VOCABS) and all(len(f) == 8 for f in fps)
    kv = read_gguf_kv(gguf("gpt-2"))
    assert kv["tokenizer.ggml.model"] == "gpt2" and len(kv["tokenizer.ggml.tokens"]) == 50257


def test_unsupported_pre_tokenizer_is_named() -> None:
    from lookupdec.tokenizer import UnsupportedVocabError
    from lookupdec.tokenizer.bpe import pre_type

    with pytest.raises(UnsupportedVocabError, match="'falcon'"):
        pre_type("falcon")


def test_not_a_gguf(tmp_path: Path) -> None:
    from lookupdec.errors import TokenFileError
    from lookupdec.tokenizer.gguf import read_gguf_kv

    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\x00" * 8 + b"\x05" + b"\x00" * 7 + b"\x01")
    with pytest.raises(TokenFileError, match="cut short"):
        read_gguf_kv(bad)
    bad.write_bytes(b"NOPE" + bytes(40))
    with pytest.raises(TokenFileError, match="not a GGUF"):
        read_gguf_kv(bad)


def _chunk_text() -> str:
    text = (SHARED_DATA / "wiki.test.raw").read_text(encoding="utf-8")[:200_000]
    # edge cases at line starts: special texts, blank lines, indentation, tabs, no trailing newline
    extra = "x\n<|begin_of_text|>a\n\n\nb\n  c\n\td\n<s>e\n</s>\n f\n\n g\n1\n=h\nõ\nend"
    return text + extra * 50


@needs_vocab
@pytest.mark.parametrize(
    "name",
    [
        "llama-bpe",
        "qwen2",
        "gpt-2",
        "deepseek-coder",
        "llama-spm",
        "phi-3",
    ],
)
def test_chunked_equals_whole(tmp_path: Path, name: str) -> None:
    from lookupdec.tokenizer.stream import chunk_ranges, tokenize_file

    t = tok(name)
    text = _chunk_text()
    path = tmp_path / "t.txt"
    path.write_text(text, encoding="utf-8")
    data = path.read_bytes()
    ranges = list(chunk_ranges(str(path), t, 2000))
    assert len(ranges) > 5 and b"".join(data[a:b] for a, b in ranges) == data
    whole = t.encode(text)
    got = tokenize_file(path, t, workers=1, chunk_bytes=2000)
    np.testing.assert_array_equal(got, whole)


@needs_vocab
@pytest.mark.slow
def test_parallel_equals_whole(tmp_path: Path) -> None:
    from lookupdec.tokenizer.stream import tokenize_file

    t = tok("llama-bpe")
    src = SHARED_DATA / "enwiki_wt.10M.txt"
    text = src.read_text(encoding="utf-8")
    got = tokenize_file(src, t, workers=2, chunk_bytes=1 << 20)
    np.testing.assert_array_equal(got, t.encode(text))


@needs_vocab
def test_invalid_utf8_names_offset(tmp_path: Path) -> None:
    from lookupdec.errors import TokenFileError
    from lookupdec.tokenizer.stream import tokenize_file

    path = tmp_path / "bad.txt"
    path.write_bytes(b"Hello\nworld\n" * 500 + b"\xff tail\n" + b"more\n" * 500)
    with pytest.raises(TokenFileError, match="at byte offset 6000"):
        tokenize_file(path, tok("gpt-2"), workers=1, chunk_bytes=1000)


@needs_vocab
def test_cli_tokenize(tmp_path: Path) -> None:
    from lookupdec.cli import main

    text = tmp_path / "t.txt"
    text.write_text("Hello world\n<|begin_of_text|>x", encoding="utf-8")
    out = tmp_path / "t.bin"
    assert main(["tokenize", str(text), "--tokenizer", str(gguf("llama-bpe")), "-o", str(out), "-q"]) == 0
    ids = np.fromfile(out, dtype="<i4")
    np.testing.assert_array_equal(ids, tok("llama-bpe").encode("Hello world\n<|begin_of_text|>x"))
    assert ids[0] == 128000 and (ids == 128000).sum() == 2
    flags = ["--no-add-special", "--no-parse-special", "--workers", "1", "-q"]
    assert main(["tokenize", str(text), "--tokenizer", str(gguf("llama-bpe")), "-o", str(out), *flags]) == 0
    ids = np.fromfile(out, dtype="<i4")
    assert 128000 not in ids.tolist()


@needs_vocab
@pytest.mark.parametrize(("flag", "name"), [(None, "llama-bpe"), ("--add-bos", "phi-3"), ("--no-add-bos", "llama-bpe")])
def test_cli_create_streams_text(tmp_path: Path, flag: str | None, name: str) -> None:
    """``create TEXT... --tokenizer VOCAB`` (text tokenized to files, then counted) writes the index of the ids
    ``Tokenizer.encode`` gives each text, BOS as the flag says, with the vocabulary in the header."""
    from lookupdec.builder import create_index
    from lookupdec.cli import main

    t = tok(name)
    wiki = (SHARED_DATA / "wiki.test.raw").read_text(encoding="utf-8")
    texts = [wiki[:20_000], "<s>x</s> <|begin_of_text|>" + wiki[20_000:32_000]]
    paths = []
    for i, text in enumerate(texts):
        paths.append(tmp_path / f"t{i}.txt")
        paths[-1].write_text(text, encoding="utf-8")
    out = tmp_path / "streamed.lkdc"
    args = ["create", *map(str, paths), "--tokenizer", str(gguf(name)), "-o", str(out), "-q", "--workers", "2"]
    assert main(args + ([flag] if flag else [])) == 0
    expected = []
    for text in texts:
        ids = t.encode(text, add_special=flag != "--no-add-bos").tolist()
        if flag == "--add-bos" and ids[:1] != [t.bos_id]:
            ids = [t.bos_id, *ids]
        expected.append(np.asarray(ids, dtype=np.int32))
    assert (flag == "--no-add-bos") == all(e[0] != t.bos_id for e in expected)
    ref = tmp_path / "from-ids.lkdc"
    create_index(expected, ref, vocab_size=t.n_vocab, vocab_fingerprint=t.fingerprint)
    assert out.read_bytes() == ref.read_bytes()


@needs_vocab
def test_cli_stats_refuses_other_vocab(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from lookupdec.cli import main

    text = tmp_path / "t.txt"
    text.write_text("the cat sat on the mat\nthe cat sat on the mat\n" * 20, encoding="utf-8")
    static = tmp_path / "s.lkdc"
    assert main(["create", str(text), "--tokenizer", str(gguf("gpt-2")), "-o", str(static), "-q"]) == 0
    assert main(["stats", str(text), "--tokenizer", str(gguf("gpt-2")), "-lcs", str(static), "-q", "--json"]) == 0
    capsys.readouterr()
    assert main(["stats", str(text), "--tokenizer", str(gguf("qwen2")), "-lcs", str(static), "-q"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("lookupdec: error: ") and "another vocabulary" in err


@needs_vocab
def test_llama_cpp_python_agrees() -> None:
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")
    for name in VOCABS:
        model = llama_cpp.Llama(model_path=str(gguf(name)), vocab_only=True, verbose=False)
        wiki = (SHARED_DATA / "wiki.test.raw").read_text(encoding="utf-8")[:30_000]
        special = "<s>Hello</s> world <|begin_of_text|>x<|im_start|>y<|user|>  z õ [PAD151650]\n\n  \t end "
        for text in [*(t for t, _ in vectors(name)[:20]), wiki, special * 3]:
            for flag in (True, False):
                expected = model.tokenize(text.encode("utf-8"), add_bos=flag, special=flag)
                assert tok(name).encode(text, add_special=flag, parse_special=flag).tolist() == expected, (name, text)


def _tokenizer_json_from_gguf(name: str, path: Path) -> Path:
    """A tokenizer.json assembled here from a GGUF vocabulary, as Hugging Face ships Llama 3's / GPT-2's."""
    from tokenizers import AddedToken, Regex, Tokenizer, models, pre_tokenizers, processors

    v = tok(name).vocab
    normal = {t: i for i, (t, ty) in enumerate(zip(v.tokens, v.types, strict=True)) if ty == 1}
    merges = [tuple(m.split(" ", 1)) for m in v.merges]
    ignore = name == "llama-bpe"
    hf = Tokenizer(models.BPE(vocab=normal, merges=merges, ignore_merges=ignore))
    if name == "llama-bpe":
        pattern = (
            r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
            r"|\s*[\r\n]+|\s+(?!\S)|\s+"
        )
        hf.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    else:
        hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    specials = [v.tokens[i] for i, ty in enumerate(v.types) if ty == 3]
    hf.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    if name == "llama-bpe":
        hf.post_processor = processors.TemplateProcessing(
            single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", 128000)]
        )
    hf.save(str(path))
    return path


@needs_vocab
@pytest.mark.parametrize("name", [pytest.param("llama-bpe", marks=pytest.mark.slow), "gpt-2"])
def test_tokenizer_json_matches_gguf(tmp_path: Path, name: str) -> None:
    from lookupdec.tokenizer import load_tokenizer

    t = load_tokenizer(_tokenizer_json_from_gguf(name, tmp_path / "tokenizer.json"))
    assert t.vocab.pre == name and t.n_vocab == tok(name).n_vocab
    assert t.fingerprint == tok(name).fingerprint  # same id -> text mapping, same fingerprint
    for text, expected in vectors(name):
        assert t.encode(text, add_special=False, parse_special=False).tolist() == expected, text
        assert t.encode(text).tolist() == tok(name).encode(text).tolist(), text


@needs_vocab
@pytest.mark.parametrize("name", ["llama-spm", "phi-3"])
def test_spm_segments_equal_whole_fragment(name: str) -> None:
    from lookupdec.tokenizer import Tokenizer

    t = tok(name)
    assert t._spm is not None and t._spm.segmented
    whole = Tokenizer(t.vocab)
    assert whole._spm is not None
    whole._spm.segmented = False  # llama.cpp's loop over the whole fragment
    text = (SHARED_DATA / "wiki.test.raw").read_text(encoding="utf-8")[:30_000]
    text += "  two  spaces   three\n\n  \t x  \u00a0 y\u3000z  end  " * 20
    np.testing.assert_array_equal(t.encode(text), whole.encode(text))


@needs_vocab
def test_cli_stats_refuses_caches_with_ids_past_the_vocabulary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Legacy and fork caches record no vocabulary: their ids are read and checked (gpt-2: 50,257 ids)."""
    from lookupdec.cli import main
    from lookupdec.formats import write_static

    text = tmp_path / "t.txt"
    text.write_text("the cat sat on the mat\n" * 40, encoding="utf-8")
    vocab = str(gguf("gpt-2"))
    for name, top in (("ok", 50_256), ("bad", 50_257)):
        for fmt in ("llama", "fork-v2", "lookupdec"):
            path = tmp_path / f"{name}.{fmt}"
            write_static([((1, 2, -1, -1), [(top, 3)])], path, fmt)  # no vocabulary recorded
            for flag in ("-lcs", "-lcd") if fmt == "llama" else ("-lcs",):
                rc = main(["stats", str(text), "--tokenizer", vocab, flag, str(path), "-q", "--json"])
                err = capsys.readouterr().err
                if name == "ok":
                    assert rc == 0, err
                else:
                    assert rc == 2 and f"{path}: holds token id 50,257" in err, err


@needs_vocab
def test_cli_outputs_never_overwrite_the_text_or_the_vocabulary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # tokenize -o TEXT replaced the text by its ids, and -o VOCAB (or create's --corpus-out VOCAB)
    # the vocabulary, with exit 0: they are inputs, refused as create's and merge's corpora are.
    import shutil

    from tests.test_cli import assert_clean_error, run

    text, vocab = tmp_path / "t.txt", tmp_path / "v.gguf"
    text.write_text("Hello world, hello world.\n" * 20, encoding="utf-8")
    shutil.copy(gguf("llama-bpe"), vocab)
    before = (text.read_bytes(), vocab.read_bytes())
    for argv in (
        ("tokenize", str(text), "--tokenizer", str(vocab), "-o", str(text)),
        ("tokenize", str(text), "--tokenizer", str(vocab), "-o", str(vocab)),
        ("create", str(text), "--tokenizer", str(vocab), "-o", str(vocab)),
        ("create", str(text), "--tokenizer", str(vocab), "-o", str(tmp_path / "s.lkdc"), "--corpus-out", str(vocab)),
    ):
        code, _, err = run(capsys, *argv)
        assert_clean_error(code, err, "is also an input")
    assert (text.read_bytes(), vocab.read_bytes()) == before
    assert not (tmp_path / "s.lkdc").exists()


@needs_vocab
def test_cli_text_that_is_not_utf8_in_worker_processes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The error raised in a worker came back unpicklable (FileFormatError needs its path and
    # message), and the pool broke with a traceback: now the worker's own one-line error.
    from tests.test_cli import assert_clean_error, run

    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"Hello\nworld\n" * 50_000 + b"\xff tail\n")
    for argv in (
        ("tokenize", str(bad), "--tokenizer", str(gguf("llama-bpe")), "-o", str(tmp_path / "o.bin"), "--workers", "2"),
        ("stats", str(bad), "--tokenizer", str(gguf("llama-bpe")), "-c", "64"),
    ):
        code, _, err = run(capsys, *argv)
        assert_clean_error(code, err, "bad.txt", "not valid UTF-8", "at byte offset 600000")


def test_lookupdec_errors_survive_pickling() -> None:
    import pickle

    from lookupdec.errors import CacheFormatError, FileFormatError, OutputFileError, TokenFileError

    for e in (FileFormatError("a.txt", "bad", 6), CacheFormatError("c.bin", "short"), TokenFileError("t", "odd", 3),
              OutputFileError("o.bin", "is a folder")):  # fmt: skip
        again = pickle.loads(pickle.dumps(e))
        assert (type(again), str(again), again.path) == (type(e), str(e), e.path)


def test_malformed_vocabularies_are_clear_errors(tmp_path: Path) -> None:
    # A GGUF whose token count the file cannot hold made a list of that many first (MemoryError,
    # or 15 GB for 2**31); a tokenizer.json that is not an object, or whose ids are negative or
    # huge, failed deep inside (AttributeError, IndexError) or built a table of gigabytes.
    import json
    import struct

    from lookupdec.errors import TokenFileError
    from lookupdec.tokenizer.vocab import vocab_from_gguf, vocab_from_tokenizer_json

    if gguf("llama-bpe").exists():
        data = bytearray(gguf("llama-bpe").read_bytes())
        at = data.index(b"tokenizer.ggml.tokens") + len(b"tokenizer.ggml.tokens") + 4 + 4  # the array's count
        for count in (2**31, 2**62):
            struct.pack_into("<Q", data, at, count)
            bad = tmp_path / f"c{count}.gguf"
            bad.write_bytes(bytes(data))
            with pytest.raises(TokenFileError, match=f"{bad.name}: GGUF header is cut short"):
                vocab_from_gguf(bad)
    good = {
        "model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": []},
        "pre_tokenizer": {"type": "ByteLevel"},  # GPT-2's: one this reader takes
        "added_tokens": [],
    }
    cases = {
        "list.json": [],
        "model.json": {"model": "BPE"},
        "negative.json": {**good, "model": {**good["model"], "vocab": {"a": 0, "b": -5}}},  # type: ignore[dict-item]
        "huge.json": {**good, "added_tokens": [{"content": "<x>", "id": 2**40, "special": True}]},
    }
    for name, content in cases.items():
        path = tmp_path / name
        path.write_text(json.dumps(content), encoding="utf-8")
        with pytest.raises(TokenFileError, match=f"{name}: "):
            vocab_from_tokenizer_json(path)
