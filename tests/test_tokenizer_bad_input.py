"""lookupdec.tokenizer on bad input: clear errors naming the file, key or argument; never a hang.

The vocabularies are written here (a small SentencePiece GGUF, a byte-level BPE tokenizer.json),
so these tests need no shared data; the ones that use llama.cpp's vocabularies skip without them.
Whatever could hang or eat memory before its fix (an empty special text, a fifo, /dev/zero) runs
in a child process with a timeout and an address-space limit, so it cannot hang the suite.
"""

from __future__ import annotations

import json
import os
import resource
import struct
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from lookupdec.errors import TokenFileError

SHARED_VOCAB = Path(os.environ.get("LOOKUPDEC_VOCAB", Path(__file__).resolve().parents[2] / "shared/data/vocab"))
needs_vocab = pytest.mark.skipif(not SHARED_VOCAB.is_dir(), reason=f"vocabulary folder {SHARED_VOCAB} is absent")

# --- a tiny GGUF writer ---------------------------------------------------------------------

_STR, _ARR = 8, 9


def _s(b: str | bytes) -> bytes:
    raw = b.encode("utf-8", "surrogateescape") if isinstance(b, str) else b
    return struct.pack("<Q", len(raw)) + raw


def _val(v: Any) -> tuple[int, bytes]:
    """GGUF type and bytes of ``v`` (bool, int32, float32, string, or a list of one of those)."""
    if isinstance(v, bool):
        return 7, struct.pack("<?", v)
    if isinstance(v, int):
        return 5, struct.pack("<i", v)
    if isinstance(v, float):
        return 6, struct.pack("<f", v)
    if isinstance(v, (str, bytes)):
        return _STR, _s(v)
    if isinstance(v, list):
        if not v:
            return _ARR, struct.pack("<IQ", _STR, 0)
        item, _ = _val(v[0])
        return _ARR, struct.pack("<IQ", item, len(v)) + b"".join(_val(x)[1] for x in v)
    raise TypeError(v)


def _gguf(kv: dict[str, Any], extra: bytes = b"", n_extra: int = 0) -> bytes:
    out = b"GGUF" + struct.pack("<IQQ", 3, 0, len(kv) + n_extra)
    for k, v in kv.items():
        t, b = _val(v)
        out += _s(k) + struct.pack("<I", t) + b
    return out + extra


def _spm_kv() -> dict[str, Any]:
    """A 300-token SentencePiece vocabulary: <unk>, <s>, </s>, 256 byte tokens, a few pieces."""
    toks = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)] + ["\u2581", "a", "b", "\u2581a", "ab"]
    toks += [f"t{i}" for i in range(300 - len(toks))]
    return {
        "general.architecture": "llama",
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": toks,
        "tokenizer.ggml.scores": [float(-i) for i in range(len(toks))],
        "tokenizer.ggml.token_type": [2, 3, 3] + [6] * 256 + [1] * (len(toks) - 259),
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
    }


def _write_gguf(path: Path, change: dict[str, Any] | None = None) -> Path:
    kv = _spm_kv()
    kv.update(change or {})
    path.write_bytes(_gguf(kv))
    return path


def _bpe_json(**changes: Any) -> dict[str, Any]:
    """A GPT-2 style byte-level BPE tokenizer.json: the 256 byte symbols, two merges, one added token."""
    from lookupdec.tokenizer.bpe import byte_decoder

    vocab = {c: i for i, c in enumerate(sorted(byte_decoder(), key=byte_decoder().__getitem__))}
    vocab["he"] = 256
    vocab["hel"] = 257
    data: dict[str, Any] = {
        "model": {"type": "BPE", "vocab": vocab, "merges": ["h e", "he l"]},
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "added_tokens": [{"id": 258, "content": "<|end|>", "special": True}],
        "post_processor": None,
    }
    data.update(changes)
    return data


def _write_json(path: Path, data: Any) -> Path:
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def _in_child(code: str, timeout: float = 60) -> str:
    """Run ``code`` in a child Python (2 GB address space): its output, or a failure if it hangs."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

    try:
        p = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(code)],
            capture_output=True,
            text=True,
            timeout=timeout,
            preexec_fn=limit,
            cwd=Path(__file__).resolve().parents[1],
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"still running after {timeout} s: {code}")
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


# --- 1. empty special texts --------------------------------------------------------------


def test_empty_special_text_is_left_out_and_encode_returns(tmp_path: Path) -> None:
    # A control token (GGUF) or an added token (tokenizer.json) with empty text matched at one
    # place forever: encode never returned and grew memory without bound.
    kv = _spm_kv()
    tokens = list(kv["tokenizer.ggml.tokens"])
    tokens[2] = ""  # </s>, a control token
    g = _write_gguf(tmp_path / "empty.gguf", {"tokenizer.ggml.tokens": tokens})
    ref = _write_gguf(tmp_path / "ref.gguf", {"tokenizer.ggml.tokens": [*tokens[:2], "</x>", *tokens[3:]]})
    j = _bpe_json()
    j["added_tokens"].append({"id": 259, "content": "", "special": True})
    jp = _write_json(tmp_path / "empty.json", j)
    out = _in_child(f"""
        from lookupdec.tokenizer import load_tokenizer
        for p in ({str(g)!r}, {str(ref)!r}, {str(jp)!r}):
            print(load_tokenizer(p).encode("ab a b<|end|>hel").tolist())
    """)
    empty, reference, bpe = out.splitlines()
    assert empty == reference  # the empty text changes nothing
    assert json.loads(bpe) == [97, 98, 32, 97, 32, 98, 258, 257]  # "ab a b" in bytes, <|end|>, "hel"


# --- 2. GGUF arrays nested without end ---------------------------------------------------------


def test_gguf_deeply_nested_array_is_a_file_error(tmp_path: Path) -> None:
    from lookupdec.tokenizer import load_tokenizer

    inner = struct.pack("<IQ", 5, 0)
    for _ in range(500):
        inner = struct.pack("<IQ", _ARR, 1) + inner
    p = tmp_path / "nested.gguf"
    p.write_bytes(_gguf(_spm_kv(), extra=_s("x.nested") + struct.pack("<I", _ARR) + inner, n_extra=1))
    with pytest.raises(TokenFileError, match=r"nested\.gguf: GGUF arrays nested more than 8 deep"):
        load_tokenizer(p)
    # A few levels (what a real file might use) are read.
    inner = struct.pack("<IQ", 5, 1) + struct.pack("<i", 7)
    for _ in range(6):
        inner = struct.pack("<IQ", _ARR, 1) + inner
    p.write_bytes(_gguf(_spm_kv(), extra=_s("x.nested") + struct.pack("<I", _ARR) + inner, n_extra=1))
    assert load_tokenizer(p).encode("ab").tolist() == [1, 262, 261]  # <s> "\u2581a" "b"


# --- 3. GGUF fields of the wrong type or value --------------------------------------------------

_N = 300
_BAD_GGUF: dict[str, tuple[Any, str]] = {
    "byte-token": (
        {"tokenizer.ggml.tokens": ["<unk>", "<s>", "</s>", "<0xZZ>", *_spm_kv()["tokenizer.ggml.tokens"][4:]]},
        "byte token 3 is '<0xZZ>'",
    ),
    "types-str": ({"tokenizer.ggml.token_type": ["x"] * _N}, "token_type is an array, not an array of integers"),
    "types-scalar": ({"tokenizer.ggml.token_type": 5}, "tokenizer.ggml.token_type is int 5"),
    "scores-str": ({"tokenizer.ggml.scores": ["x"] * _N}, "scores is an array, not an array of numbers"),
    "scores-scalar": ({"tokenizer.ggml.scores": 1.0}, "tokenizer.ggml.scores is float 1.0"),
    "scores-short": ({"tokenizer.ggml.scores": [1.0, 2.0]}, "tokenizer.ggml.scores has 2 entries for 300 tokens"),
    "scores-nan": ({"tokenizer.ggml.scores": [float("nan")] * _N}, r"tokenizer.ggml.scores holds NaN \(token 0\)"),
    "bos-str": ({"tokenizer.ggml.bos_token_id": "abc"}, "bos_token_id is the string 'abc', not a token id"),
    "bos-nan": ({"tokenizer.ggml.bos_token_id": float("nan")}, "tokenizer.ggml.bos_token_id is float nan"),
    "bos-inf": ({"tokenizer.ggml.bos_token_id": float("inf")}, "tokenizer.ggml.bos_token_id is float inf"),
    "bos-array": ({"tokenizer.ggml.bos_token_id": [1, 2]}, "tokenizer.ggml.bos_token_id is an array"),
    "eos-str": ({"tokenizer.ggml.eos_token_id": "2"}, "tokenizer.ggml.eos_token_id is the string '2'"),
    "model-array": ({"tokenizer.ggml.model": [1, 2]}, "tokenizer.ggml.model is an array, not a string"),
    "pre-array": ({"tokenizer.ggml.pre": [1, 2]}, "tokenizer.ggml.pre is an array, not a string"),
    "name-array": ({"general.name": [1, 2]}, "general.name is an array, not a string"),
    "flag-array": ({"tokenizer.ggml.add_bos_token": [True, False]}, "add_bos_token is an array, not a bool"),
    "flag-str": ({"tokenizer.ggml.add_space_prefix": "false"}, "tokenizer.ggml.add_space_prefix is the string 'false'"),
    "tokens-nested": ({"tokenizer.ggml.tokens": [["a"], ["b"]]}, "tokenizer.ggml.tokens is not an array of strings"),
    "tokens-numbers": ({"tokenizer.ggml.tokens": list(range(_N))}, "tokenizer.ggml.tokens is not an array of strings"),
}


@pytest.mark.parametrize("case", list(_BAD_GGUF))
def test_gguf_bad_fields_are_file_errors(tmp_path: Path, case: str) -> None:
    from lookupdec.tokenizer import load_tokenizer

    change, message = _BAD_GGUF[case]
    p = _write_gguf(tmp_path / f"{case}.gguf", change)
    with pytest.raises(TokenFileError, match=f"{case}.gguf: .*{message}"):
        load_tokenizer(p)


def test_gguf_bpe_merges_of_the_wrong_type(tmp_path: Path) -> None:
    from lookupdec.tokenizer import load_tokenizer

    kv = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "gpt-2", "tokenizer.ggml.tokens": ["a", "b"]}
    for merges, message in ((None, "without tokenizer.ggml.merges"), ([1, 2], "merges is an array not of strings")):
        p = tmp_path / "m.gguf"
        p.write_bytes(_gguf(kv if merges is None else {**kv, "tokenizer.ggml.merges": merges}))
        with pytest.raises(TokenFileError, match=f"m.gguf: .*{message}"):
            load_tokenizer(p)


def test_gguf_good_fields_still_load(tmp_path: Path) -> None:
    # The checks take what valid files hold: integral ids, bools, longer arrays, a missing pre.
    from lookupdec.tokenizer import load_tokenizer

    change = {"tokenizer.ggml.add_bos_token": False, "tokenizer.ggml.eos_token_id": 2.0,
              "tokenizer.ggml.scores": [float(-i) for i in range(_N + 5)]}  # fmt: skip
    tok = load_tokenizer(_write_gguf(tmp_path / "ok.gguf", change))
    assert (tok.add_bos, tok.eos_id) == (False, 2)
    assert (
        tok.encode("ab a b").tolist()
        == load_tokenizer(_write_gguf(tmp_path / "ref.gguf")).encode("ab a b")[1:].tolist()
    )


def test_safety_net_names_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # An error from deep inside the building of a vocabulary still names the file (and keeps the
    # original error as its cause); lookupdec's own errors pass through unchanged.
    import lookupdec.tokenizer.vocab as vocab

    def broken(v: Any) -> Any:
        raise IndexError("list index out of range")

    monkeypatch.setattr(vocab, "_finish", broken)
    p = _write_gguf(tmp_path / "v.gguf")
    with pytest.raises(TokenFileError, match=r"v\.gguf: .*IndexError: list index out of range") as info:
        vocab.vocab_from_gguf(p)
    assert isinstance(info.value.__cause__, IndexError)
    with pytest.raises(TokenFileError, match=r"t\.json: .*IndexError"):
        vocab.vocab_from_tokenizer_json(_write_json(tmp_path / "t.json", _bpe_json()))


# --- 4. tokenizer.json fields of the wrong type ------------------------------------------------


def _edit(path: list[Any], value: Any) -> Any:
    data = _bpe_json()
    target = data
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return data


_SPLIT = {"type": "Split", "behavior": "Isolated", "pattern": "x"}
_BAD_JSON: dict[str, tuple[Any, Any, str]] = {
    "content-int": (["added_tokens", 0, "content"], 5, r"added_tokens\[0\]\.content is 5, not a string"),
    "added-dict": (["added_tokens"], {"a": 1}, "added_tokens is not a list of objects"),
    "merges-int": (["model", "merges"], 5, "model.merges is 5, not a list"),
    "merges-bad": (["model", "merges"], [["a"], 5], r"model\.merges\[0\] is \[\"a\"\], not a string or a pair"),
    "merges-item": (["model", "merges"], ["h e", 5], r"model\.merges\[1\] is 5"),
    "pre-ints": (
        ["pre_tokenizer"],
        {"type": "Sequence", "pretokenizers": [5, 6]},
        "pre_tokenizer.pretokenizers is not a list of objects",
    ),
    "pre-pattern": (
        ["pre_tokenizer"],
        {"type": "Sequence", "pretokenizers": [_SPLIT, {"type": "ByteLevel", "use_regex": False}]},
        'pre_tokenizer Split pattern is "x", not an object',
    ),
    "post-list": (["post_processor"], [1], r"post_processor is \[1\], not an object"),
    "post-procs": (
        ["post_processor"],
        {"type": "Sequence", "processors": "abc"},
        "post_processor.processors is not a list of objects",
    ),
    "post-single": (
        ["post_processor"],
        {"type": "TemplateProcessing", "single": [{"SpecialToken": 5}]},
        "post_processor SpecialToken is 5, not an object with an id",
    ),
    "post-single-str": (
        ["post_processor"],
        {"type": "TemplateProcessing", "single": "abc"},
        "post_processor TemplateProcessing single is not a list of objects",
    ),
}


@pytest.mark.parametrize("case", list(_BAD_JSON))
def test_tokenizer_json_bad_fields_are_file_errors(tmp_path: Path, case: str) -> None:
    from lookupdec.tokenizer import load_tokenizer

    path, value, message = _BAD_JSON[case]
    p = _write_json(tmp_path / f"{case}.json", _edit(path, value))
    with pytest.raises(TokenFileError, match=f"{case}.json: (not a Hugging Face tokenizer.json: )?{message}"):
        load_tokenizer(p)


def test_tokenizer_json_good_file_loads(tmp_path: Path) -> None:
    from lookupdec.tokenizer import load_tokenizer

    post = {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<|end|>", "type_id": 0}}]}
    tok = load_tokenizer(_write_json(tmp_path / "t.json", _bpe_json(post_processor=post)))
    assert tok.encode("hel<|end|>").tolist() == [258, 257, 258]  # BOS from the post-processor


# --- 5. encode's argument ---------------------------------------------------------------------


@pytest.mark.parametrize("bad", [None, b"abc", 5, ["a"]])
def test_encode_refuses_non_str(tmp_path: Path, bad: Any) -> None:
    from lookupdec.tokenizer import load_tokenizer

    tok = load_tokenizer(_write_gguf(tmp_path / "v.gguf"))
    with pytest.raises(TypeError, match=f"text must be a str, not {type(bad).__name__}"):
        tok.encode(bad)
    with pytest.raises(TypeError, match=f"chunks\\[1\\] must be a str, not {type(bad).__name__}"):
        tok.encode_chunks(["ab\n", bad])
    with pytest.raises(TypeError, match="chunks must be a list of str, not a str"):
        tok.encode_chunks("ab")  # type: ignore[arg-type]


def _lone_surrogate_checks(tok: Any) -> None:
    for text, at in (("a\ud800b", 1), ("\udcff", 0), ("é\udc00", 1), ("x\ud83d\ude00\ud800", 3), ("\ude00\ud83d", 0)):
        with pytest.raises(ValueError, match=f"text holds a lone surrogate at index {at} \\(not valid UTF-8\\)"):
            tok.encode(text)
    with pytest.raises(ValueError, match="chunks\\[0\\] holds a lone surrogate at index 1"):
        tok.encode_chunks(["a\ud800"])
    # A surrogate pair is its character (as tiktoken reads it).
    assert tok.encode("a\ud83d\ude00b").tolist() == tok.encode("a\U0001f600b").tolist()


def test_encode_lone_surrogate_is_a_value_error(tmp_path: Path) -> None:
    from lookupdec.tokenizer import load_tokenizer

    _lone_surrogate_checks(load_tokenizer(_write_gguf(tmp_path / "v.gguf")))
    _lone_surrogate_checks(load_tokenizer(_write_json(tmp_path / "t.json", _bpe_json())))


@needs_vocab
@pytest.mark.parametrize("name", ["llama-bpe", "llama-spm", "gpt-2"])
def test_encode_lone_surrogate_same_rule_in_every_engine(name: str) -> None:
    # Each engine did something else: tokenized it as U+FFFD (tiktoken), UnicodeEncodeError
    # (SentencePiece), a TypeError about PreTokenizedInputSequence (tokenizers).
    from lookupdec.tokenizer import load_tokenizer

    _lone_surrogate_checks(load_tokenizer(SHARED_VOCAB / f"ggml-vocab-{name}.gguf"))


# --- 6. fifos and devices ---------------------------------------------------------------------


def test_fifos_and_devices_are_refused(tmp_path: Path) -> None:
    # A fifo blocked open() forever; /dev/zero was read until MemoryError (load_tokenizer) or
    # read as an empty text (tokenize_file): both are refused before a byte is read.
    fifo = tmp_path / "vocab.gguf"
    os.mkfifo(fifo)
    text_fifo = tmp_path / "text.txt"
    os.mkfifo(text_fifo)
    good = _write_gguf(tmp_path / "v.gguf")
    out = _in_child(f"""
        from lookupdec.errors import TokenFileError
        from lookupdec.tokenizer import load_tokenizer
        from lookupdec.tokenizer.gguf import read_gguf_kv
        from lookupdec.tokenizer.stream import chunk_ranges, iter_file_ids, read_range, tokenize_file
        from lookupdec.tokenizer.vocab import vocab_from_tokenizer_json
        tok = load_tokenizer({str(good)!r})
        calls = [
            lambda: load_tokenizer({str(fifo)!r}),
            lambda: load_tokenizer("/dev/zero"),
            lambda: read_gguf_kv({str(fifo)!r}),
            lambda: vocab_from_tokenizer_json({str(fifo)!r}),
            lambda: tokenize_file({str(text_fifo)!r}, tok, workers=1),
            lambda: tokenize_file("/dev/zero", tok, workers=1),
            lambda: list(iter_file_ids("/dev/null", tok, workers=2)),
            lambda: list(chunk_ranges({str(text_fifo)!r}, tok)),
            lambda: read_range({str(text_fifo)!r}, 0, 10),
            lambda: load_tokenizer({str(tmp_path)!r}),
        ]
        for call in calls:
            try:
                call()
                print("no error")
            except TokenFileError as e:
                print(e)
    """)
    assert out.splitlines() == [
        f"{fifo}: is a fifo, not a regular file",
        "/dev/zero: is a character device, not a regular file",
        f"{fifo}: is a fifo, not a regular file",
        f"{fifo}: is a fifo, not a regular file",
        f"{text_fifo}: is a fifo, not a regular file",
        "/dev/zero: is a character device, not a regular file",
        "/dev/null: is a character device, not a regular file",
        f"{text_fifo}: is a fifo, not a regular file",
        f"{text_fifo}: is a fifo, not a regular file",
        f"{tmp_path}: is a folder, not a regular file",
    ]


def test_missing_files_stay_file_not_found(tmp_path: Path) -> None:
    from lookupdec.tokenizer import load_tokenizer
    from lookupdec.tokenizer.stream import tokenize_file

    tok = load_tokenizer(_write_gguf(tmp_path / "v.gguf"))
    with pytest.raises(FileNotFoundError, match="nope"):
        load_tokenizer(tmp_path / "nope.gguf")
    with pytest.raises(FileNotFoundError, match="nope"):
        tokenize_file(tmp_path / "nope.txt", tok)


def test_chunk_bytes_must_be_positive(tmp_path: Path) -> None:
    from lookupdec.tokenizer import load_tokenizer
    from lookupdec.tokenizer.stream import tokenize_file

    tok = load_tokenizer(_write_gguf(tmp_path / "v.gguf"))
    text = tmp_path / "t.txt"
    text.write_text("ab\nab\n" * 10, encoding="utf-8")
    for bad in (0, -5):
        with pytest.raises(ValueError, match=f"chunk_bytes must be >= 1, got {bad}"):
            tokenize_file(text, tok, workers=1, chunk_bytes=bad)
    assert tokenize_file(text, tok, workers=1, chunk_bytes=4).tolist() == tok.encode("ab\nab\n" * 10).tolist()
