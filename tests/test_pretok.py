"""The hand-written Llama 3 / Qwen2 splitter (``lookupdec.tokenizer._pretok``) against the regex it replaces.

``PreType.split`` (the ``regex`` module running llama.cpp's regex, exact on llama.cpp's test
vectors) is the reference. Compared on random text over an adversarial alphabet (whitespace
runs, ``\\r\\n`` mixes, contractions in both cases, digits of several scripts, combining marks,
non-BMP letters and symbols, lone surrogates), on random code points, on every code point in
a few contexts, and on the shared data texts; both the module as installed (compiled in CI) and
its source run interpreted. The ``split+tiktoken`` engine is compared with tiktoken's
``encode_ordinary`` (the engine it replaces, exact on the vectors) the same way.
"""

from __future__ import annotations

import importlib.util
import random
from functools import cache
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from lookupdec.tokenizer import _pretok
from lookupdec.tokenizer.bpe import class_table, pre_type
from tests.conftest import SHARED_DATA, require_compiled

VOCAB = SHARED_DATA / "vocab"
LLAMA3 = VOCAB / "ggml-vocab-llama-bpe.gguf"
needs_vocab = pytest.mark.skipif(not LLAMA3.is_file(), reason=f"vocabulary {LLAMA3} is absent")

# Characters where the regex's alternatives meet: each whitespace kind (\s and not: U+0085,
# U+00A0, U+2028, U+3000 are \s; U+200B, U+FEFF, U+001C are not), the contraction letters in
# both cases, digits that are \p{N} (Nd, No, Nl; ASCII and not), letters (BMP, non-BMP, CJK),
# marks and symbols that are neither, ASCII punctuation.
ALPHABET = (
    [" "] * 6
    + ["\n"] * 3
    + ["\r", "\t", "\x0b", "\x0c", "\x85", "\xa0", "\u2028", "\u3000", "\u200b", "\ufeff", "\x1c"]
    + ["'"] * 4
    + list("sStTrReEvVlLmMdDaZxq")
    + list("0123456789")
    + ["\u0663", "\xb2", "\u216b", "\U000104a0"]
    + ["\xe9", "\xdf", "\u4e2d", "\U0001d400", "\u0301", "\U0001f600", "\u20ac"]
    + list('.,!-_()[]{}<>"#/\\;:')
)


def _random_text(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(ALPHABET) for _ in range(n))


def _random_code_points(rng: random.Random, n: int) -> str:
    return "".join(chr(rng.randrange(0x110000)) for _ in range(n))


@cache
def _interpreted() -> ModuleType:
    """``_pretok``'s source loaded as a plain Python module (what runs when nothing is compiled)."""
    source = Path(_pretok.__file__ or "").with_name("_pretok.py")
    spec = importlib.util.spec_from_file_location("_pretok_interpreted", source)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert (module.__file__ or "").endswith(".py")
    return module


def _texts(seed: int, count: int) -> list[str]:
    rng = random.Random(seed)
    out = [_random_text(rng, rng.randrange(0, 40)) for _ in range(count)]
    out += [_random_code_points(rng, rng.randrange(1, 20)) for _ in range(count // 10)]
    # long runs: whitespace only, digits only, quotes only
    out += ["".join(rng.choice(" \t\n\r\xa0") for _ in range(rng.randrange(1, 30))) for _ in range(count // 10)]
    out += ["".join(rng.choice("0123\u0663\xb2") for _ in range(rng.randrange(1, 12))) for _ in range(count // 20)]
    out += ["".join(rng.choice("'sSlLeE ") for _ in range(rng.randrange(1, 12))) for _ in range(count // 20)]
    return out


# pre-tokenizer type -> its hand-written split (max digits for Llama 3 / Qwen2, digits apart for GPT-2 / SmolLM)
SPLITTERS = [("llama3", 3), ("qwen2", 1), ("gpt-2", False), ("smollm", True)]


def _split(module: ModuleType, text: str, table: bytes, how: int | bool) -> list[str]:
    if isinstance(how, bool):
        result: list[str] = module.split_gpt2(text, table, how)
    else:
        result = module.split(text, table, how)
    return result


@pytest.mark.parametrize(("pre", "how"), SPLITTERS)
@pytest.mark.parametrize("impl", ["installed", "interpreted"])
def test_split_equals_regex_on_random_text(pre: str, how: int | bool, impl: str) -> None:
    module = _pretok if impl == "installed" else _interpreted()
    table = class_table()
    ref = pre_type(pre)
    seed = SPLITTERS.index((pre, how)) + (10 if impl == "installed" else 20)
    for text in _texts(seed=seed, count=3000 if impl == "installed" else 600):
        assert _split(module, text, table, how) == ref.split(text), repr(text)


@pytest.mark.slow  # seconds: run by .ci/run's slow stage, not the README's command
@pytest.mark.parametrize(("pre", "how"), [("llama3", 3), ("gpt-2", False)])
def test_split_equals_regex_on_every_code_point(pre: str, how: int | bool) -> None:
    """Every code point next to another, and between a quote, a digit, a newline, a space, a letter.

    (Qwen2's splitter is Llama 3's with another digit count, SmolLM's GPT-2's after cutting at
    digits: the random texts cover what differs, at a fraction of this test's time.)
    """
    table = class_table()
    ref = pre_type(pre)
    everything = np.arange(0x110000, dtype="<u4").tobytes().decode("utf-32-le", "surrogatepass")
    for sep in ("", " a", "'1\n"):
        text = sep.join(everything[k : k + 2] for k in range(0, 0x110000, 2)) if sep else everything
        assert _split(_pretok, text, table, how) == ref.split(text), repr(sep)


def _shared_texts() -> list[str]:
    texts = [
        (SHARED_DATA / "enwiki_wt.10M.txt").read_bytes()[:1_000_000].decode("utf-8", "ignore"),
        (SHARED_DATA / "wiki.test.raw").read_text(encoding="utf-8"),
    ]
    texts += [p.read_text(encoding="utf-8") for p in sorted(VOCAB.glob("*.inp"))]
    texts.append(
        "".join(p.read_text(encoding="utf-8") for p in sorted(Path(_pretok.__file__ or "").parent.glob("*.py")))
    )
    return texts


@needs_vocab
@pytest.mark.parametrize(("pre", "how"), SPLITTERS)
def test_split_equals_regex_on_shared_texts(pre: str, how: int | bool) -> None:
    table = class_table()
    ref = pre_type(pre)
    for text in _shared_texts():
        assert _split(_pretok, text, table, how) == ref.split(text)
        # and with Windows line ends
        crlf = text.replace("\n", "\r\n")
        assert _split(_pretok, crlf, table, how) == ref.split(crlf)


@cache
def _llama3():  # type: ignore[no-untyped-def]
    from lookupdec.tokenizer import load_tokenizer

    return load_tokenizer(LLAMA3)


@needs_vocab
def test_llama3_engine() -> None:
    """The Llama 3 vocabulary uses split+tiktoken whenever the splitter is compiled."""
    if require_compiled():
        assert _llama3().engine == "split+tiktoken"


@needs_vocab
@pytest.mark.parametrize("impl", ["installed", "interpreted"])
def test_encode_equals_tiktoken(impl: str) -> None:
    """split+tiktoken gives tiktoken's ``encode_ordinary`` ids (the engine exact on llama.cpp's vectors)."""
    from lookupdec.tokenizer.bpe import BpeModel

    tok = _llama3()
    assert tok._bpe is not None
    bpe: BpeModel = tok._bpe
    enc = bpe._tiktoken
    model = BpeModel.__new__(BpeModel)
    model.__dict__.update(bpe.__dict__)
    model.use_split(_pretok if impl == "installed" else _interpreted())
    rng = random.Random(7)
    texts = _texts(seed=7, count=2000 if impl == "installed" else 300)
    texts = [t for t in texts if not any("\ud800" <= c <= "\udfff" for c in t)]
    if impl == "installed":
        texts += _shared_texts()
    for text in texts:
        assert model.encode(text).tolist() == enc.encode_ordinary(text), repr(text[:200])
    # Pieces seen before come from the cache: encode a text twice, and after the cache was emptied.
    text = _random_text(rng, 5000)
    first = model.encode(text).tolist()
    assert model.encode(text).tolist() == first
    model._seen.clear()
    assert model.encode(text).tolist() == first == enc.encode_ordinary(text)


@needs_vocab
def test_encode_lone_surrogates_as_tiktoken() -> None:
    """A lone surrogate (only a str from Python can hold one) is replaced by the engine as tiktoken
    does, and a pair joins; the public encode refuses a lone one (not UTF-8, which is what llama.cpp
    tokenizes), as every engine then does alike."""
    tok = _llama3()
    assert tok._bpe is not None
    enc = tok._bpe._tiktoken
    for text in ("a\ud800b", "x \udfff\n", "'s\ud83d\ude00 1234", "\ud835\udc00bc", "\ud800"):
        assert list(tok._bpe.encode(text)) == enc.encode_ordinary(text), repr(text)
    assert tok.encode("'s\ud83d\ude00 1234", add_special=False).tolist() == enc.encode_ordinary("'s\ud83d\ude00 1234")
    with pytest.raises(ValueError, match="lone surrogate at index 1"):
        tok.encode("a\ud800b", add_special=False)


def test_class_table_cache_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The table is built once, kept in the cache folder, read back; a damaged file is rebuilt."""
    import regex

    expected = class_table()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    try:
        class_table.cache_clear()
        assert class_table() == expected  # built
        (path,) = (tmp_path / "lookupdec" / "pretok").iterdir()
        assert path.name == f"classes-regex-{regex.__version__}"
        assert path.read_bytes() == expected
        class_table.cache_clear()
        assert class_table() == expected  # read
        path.write_bytes(expected[:1000])
        class_table.cache_clear()
        assert class_table() == expected  # rebuilt
        assert path.read_bytes() == expected
    finally:
        class_table.cache_clear()


def _piece_hash(piece: str) -> int:
    """The hash ``_pretok.encode`` gives a piece (FNV-1a on 31 bits, high bits folded)."""
    h = 0
    for ch in piece:
        h = ((h ^ ord(ch)) * 16777619) & 0x7FFFFFFF
    return h ^ (h >> 15)


@needs_vocab
@pytest.mark.parametrize("impl", ["installed", "interpreted"])
def test_piece_cache_bounds_growth_and_collisions(impl: str) -> None:
    """A tiny bound (the cache is emptied mid-text), growth past the first slots, and two pieces of one hash."""
    module = _pretok if impl == "installed" else _interpreted()
    tok = _llama3()
    assert tok._bpe is not None
    enc = tok._bpe._tiktoken
    bpe = enc._core_bpe.encode_single_piece
    table = class_table()
    # Two different letter pieces with the same hash: each must get its own ids.
    rng = random.Random(3)
    seen: dict[int, str] = {}
    while True:
        word = " " + "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(7))
        other = seen.setdefault(_piece_hash(word), word)
        if other != word:
            break
    pair = f"{other}{word}{other}{word}"
    assert module.split(pair, table, 3) == [other, word, other, word]
    cache = module.PieceCache()
    got = np.frombuffer(module.encode(pair, table, 3, cache, bpe, 1 << 20), dtype="<i4").tolist()
    assert got == enc.encode_ordinary(pair)
    assert len(cache) == 2
    # Many distinct pieces (the slots double several times), then a bound of 7 pieces.
    text = " ".join(f"w{k}x{k * 7919 % 1000003}" for k in range(20_000 if impl == "installed" else 3000))
    text += _random_text(rng, 3000)
    expected = enc.encode_ordinary(text)
    for cache_max in (1 << 20, 7):
        cache = module.PieceCache()
        for _ in range(2):  # cold, then warm
            got = np.frombuffer(module.encode(text, table, 3, cache, bpe, cache_max), dtype="<i4").tolist()
            assert got == expected
        assert len(cache) <= cache_max
