"""llama.cpp's byte-level BPE (``tokenizer.ggml.model = gpt2``): pre-tokenizer and merge engines.

llama.cpp splits each raw fragment with the regular expressions of its pre-tokenizer type
(``tokenizer.ggml.pre``; ``llm_tokenizer_bpe`` in ``src/llama-vocab.cpp``), applied one after
the other, each cutting the pieces of the previous one, and keeping the text between matches
as pieces too (``unicode_regex_split``). Every piece is mapped to GPT-2's byte-to-unicode
alphabet and merged by merge rank (``llm_tokenizer_bpe_session``); with ``ignore_merges``
(the Llama 3 family) a piece that is itself a token is emitted whole first.

Engines, chosen per vocabulary:

* ``split+tiktoken`` for the Llama 3 pre-tokenizer when tiktoken is exact for the vocabulary
  (next item) and :mod:`lookupdec.tokenizer._pretok` is compiled: the pieces are cut by that
  module's hand-written Llama 3 splitter (a loop over a code-point class table, compared with
  the regex on random and real text by the tests), and each piece's ids come from a table of
  the pieces seen so far (:class:`~lookupdec.tokenizer._pretok.PieceCache`), else from
  tiktoken's BPE of that one piece (``CoreBPE.encode_single_piece``: the token if the piece is
  one, else its merges; what ``encode_ordinary`` does per piece). Why not tiktoken alone: most
  of its ``encode_ordinary`` time goes to cutting the pieces with its regex engines (a
  backtracking one, for the ``\\s+(?!\\S)`` lookahead), little to the merges; a compiled
  loop over a class table, and a cache of the pieces seen, cut that cost (figures:
  docs/performance.md, "Tokenizing"). tiktoken stays the merge engine (well kept, Rust, exact
  here) for the pieces not seen before. Interpreted (no compiler) the splitter is far slower
  than tiktoken's regex, so then tiktoken runs alone, as below.
* ``tiktoken`` (Rust) when the vocabulary has ``ignore_merges`` and passes
  :func:`tiktoken_exact`'s checks. tiktoken merges by the rank of the merged *token* and takes a
  piece that is a token whole, which is llama.cpp's ``ignore_merges`` merge by *pair* rank
  exactly when the merge list is sorted by the id of the merged token and every split of a
  token into two tokens is a merge (true of vocabularies converted from tiktoken, like Llama 3).
  It cannot serve the other vocabularies: without ``ignore_merges`` a piece that is a token
  must still be merged pair by pair (e.g. Qwen2), which tiktoken never does.
* Hugging Face ``tokenizers``' BPE model otherwise: it merges by pair rank, like llama.cpp,
  and has the ``ignore_merges`` switch. Its own pre-tokenizers use Oniguruma regexes and
  behaviours that differ from llama.cpp's in places (gaps between matches, ``\\s``), so the
  pieces are cut here with the ``regex`` module (llama.cpp's regexes, its gap rule) and given
  to it pre-split (``is_pretokenized``); the Qwen2 (Llama 3's with single digits), GPT-2 and
  SmolLM regexes are cut by :mod:`._pretok`'s hand-written splitters when compiled. Slower
  than tiktoken; exact.
"""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Callable, Sequence
from functools import cache
from typing import Any

import numpy as np
import numpy.typing as npt
import regex

from lookupdec.tokenizer.errors import UnsupportedVocabError

# llama.cpp's regexes per pre-tokenizer type (src/llama-vocab.cpp, llm_tokenizer_bpe), in the
# syntax of the ``regex`` module. Only the types below are supported; any other name is an
# error, never a guess (a wrong pre-tokenizer silently changes ids).
_LLAMA3 = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# llama.cpp's GPT-2 regex has no final ``|\s+``: the whitespace it leaves between matches is a
# piece of its own (the gap rule), which is what a final ``\s+`` would match.
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_DEEPSEEK_CODER = (r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", r"[一-龥ࠀ-一가-퟿]+", r"\p{N}")


@cache  # asked once per fragment by PreType.pieces: the answer never changes in a process
def _pretok_compiled() -> bool:
    from lookupdec.tokenizer import _pretok

    return (_pretok.__file__ or "").endswith((".so", ".pyd"))


@cache
def class_table() -> bytes:
    """The class of every code point for :mod:`lookupdec.tokenizer._pretok` (one byte each, 0x110000 bytes).

    Built with the ``regex`` module's own ``\\p{L}``, ``\\p{N}`` and ``\\s`` over all code points
    (surrogates included), so the hand-written splitter sees exactly the classes of the regexes
    it replaces. Building it takes a noticeable part of a second, so it is kept in the user's
    cache folder under the ``regex`` version (whose Unicode tables it reflects); a file of the
    wrong size is rebuilt.
    """
    path = os.path.join(_cache_dir(), "pretok", f"classes-regex-{regex.__version__}")
    with contextlib.suppress(OSError), open(path, "rb") as f:
        data = f.read()
        if len(data) == 0x110000:
            return data
    from lookupdec.tokenizer import _pretok

    everything = np.arange(0x110000, dtype="<u4").tobytes().decode("utf-32-le", "surrogatepass")
    table = bytearray(0x110000)  # OTHER (0) unless set below
    classes = (0, _pretok.LETTER, _pretok.DIGIT, _pretok.SPACE, _pretok.NEWLINE)
    for m in regex.finditer(r"(\p{L}+)|(\p{N}+)|([^\S\r\n]+)|([\r\n]+)", everything):
        a, b = m.span()
        table[a:b] = bytes([classes[m.lastindex or 0]]) * (b - a)
    data = bytes(table)
    _write_cache(path, data)
    return data


class PreType:
    """One llama.cpp pre-tokenizer type: its regexes and flags."""

    def __init__(self, name: str, regexes: tuple[str, ...], ignore_merges: bool, add_bos: bool) -> None:
        self.name = name
        self.regexes = regexes
        self.ignore_merges = ignore_merges
        self.add_bos = add_bos  # llama.cpp's default when the GGUF has no add_bos_token key
        self.compiled = [regex.compile(r) for r in regexes]
        digits: dict[tuple[str, ...], int] = {(_LLAMA3,): 3, (_QWEN2,): 1}
        self.max_digits: int | None = digits.get(regexes)
        """Digits per piece when the regex is Llama 3's or Qwen2's (:mod:`._pretok` can cut it), else None."""
        gpt2: dict[tuple[str, ...], bool] = {(_GPT2,): False, (r"\p{N}", _GPT2): True}
        self.gpt2_digits_apart: bool | None = gpt2.get(regexes)
        """For GPT-2's regex (:mod:`._pretok` can cut it): whether every digit is a piece first (SmolLM)."""

    @property
    def hand_written(self) -> bool:
        """Whether :mod:`lookupdec.tokenizer._pretok` has a splitter for this type."""
        return self.max_digits is not None or self.gpt2_digits_apart is not None

    def pieces(self, text: str) -> list[str]:
        """:meth:`split`, by the compiled hand-written splitter when there is one for this type."""
        if self.hand_written and _pretok_compiled():
            from lookupdec.tokenizer import _pretok

            if self.max_digits is not None:
                return _pretok.split(text, class_table(), self.max_digits)
            return _pretok.split_gpt2(text, class_table(), bool(self.gpt2_digits_apart))
        return self.split(text)

    def split(self, text: str) -> list[str]:
        """The pieces of ``text``, as llama.cpp's ``unicode_regex_split`` cuts them (before byte mapping)."""
        spans = [(0, len(text))]
        for rx in self.compiled:
            out: list[tuple[int, int]] = []
            for a, b in spans:
                pos = a
                for m in rx.finditer(text, a, b):
                    s, e = m.span()
                    if s > pos:
                        out.append((pos, s))  # the gap before a match is a piece too
                    out.append((s, e))
                    pos = e
                if pos < b:
                    out.append((pos, b))
            spans = out
        return [text[a:b] for a, b in spans]


# name in tokenizer.ggml.pre -> (regexes, ignore_merges, add_bos default); the aliases are
# llama.cpp's own (llama_vocab::impl::load).
_PRE_TYPES: dict[str, tuple[tuple[str, ...], bool, bool]] = {}
for _n in ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "jina-v5-nano"):
    _PRE_TYPES[_n] = ((_LLAMA3,), True, True)
for _n in ("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2"):
    _PRE_TYPES[_n] = ((_QWEN2,), False, False)
_PRE_TYPES["deepseek-coder"] = (_DEEPSEEK_CODER, False, False)
for _n in (
    "gpt-2",
    "phi-2",
    "jina-es",
    "jina-de",
    "gigachat",
    "jina-v2-es",
    "jina-v2-de",
    "a.x-4.0",
    "mellum",
    "modern-bert",
):
    _PRE_TYPES[_n] = ((_GPT2,), False, False)
# SmolLM's: GPT-2's split after one that makes every digit a piece of its own.
_PRE_TYPES["smollm"] = ((r"\p{N}", _GPT2), False, False)

SUPPORTED_PRE = tuple(sorted(_PRE_TYPES))
"""Values of ``tokenizer.ggml.pre`` this package tokenizes exactly like llama.cpp."""


@cache
def pre_type(name: str) -> PreType:
    """The pre-tokenizer type ``name`` (``tokenizer.ggml.pre``); :class:`UnsupportedVocabError` if unknown."""
    try:
        regexes, ignore_merges, add_bos = _PRE_TYPES[name]
    except KeyError:
        raise UnsupportedVocabError(
            f"BPE pre-tokenizer {name!r} (tokenizer.ggml.pre) is not supported; supported: {', '.join(SUPPORTED_PRE)}"
        ) from None
    return PreType(name, regexes, ignore_merges, add_bos)


@cache
def byte_decoder() -> dict[str, int]:
    """GPT-2's unicode-to-byte map: the alphabet of byte-level BPE token texts."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs, strict=True)}


@cache
def _byte_table() -> dict[int, int]:
    # str.translate table: alphabet character -> its byte; any other character below 256 -> a
    # character latin-1 cannot encode, so that a text outside the alphabet fails to encode.
    table = {c: 0x10FFFF for c in range(256)}
    table.update({ord(ch): b for ch, b in byte_decoder().items()})
    return table


def byte_ranks(tokens: Sequence[str], types: Sequence[int]) -> dict[bytes, int] | None:
    """tiktoken's ``mergeable_ranks`` (bytes -> id of each normal token); None if not a byte-level vocabulary.

    None when two normal tokens stand for the same bytes, a text is outside GPT-2's alphabet,
    or a single byte is not a normal token (tiktoken needs every byte).
    """
    ids = [i for i, ttype in enumerate(types) if ttype == 1]
    texts = [tokens[i] for i in ids]
    # One translate + encode over all texts at once (C speed, not a per-token loop), then cut
    # by the texts' lengths: GPT-2's alphabet has one character per byte.
    try:
        joined = "".join(texts).translate(_byte_table()).encode("latin-1")
    except UnicodeEncodeError:
        return None
    ends = list(itertools.accumulate(len(t) for t in texts))
    parts = [joined[e - len(t) : e] for t, e in zip(texts, ends, strict=True)]
    ranks = dict(zip(parts, ids, strict=True))
    if len(ranks) != len(ids) or any(bytes([x]) not in ranks for x in range(256)):
        return None
    return ranks


def tiktoken_exact(tokens: Sequence[str], types: Sequence[int], merges: Sequence[str]) -> bool:
    """Whether tiktoken's rank BPE gives llama.cpp's ``ignore_merges`` pair-rank BPE ids for this vocabulary.

    The merges, in order, must produce normal tokens of non-decreasing id from normal tokens,
    and every way of splitting a normal multi-character token into two normal tokens must be
    a merge: then at every step both pick the same pair (the lowest id of the result is the
    lowest merge rank). Works on the token texts (GPT-2's alphabet is one character per byte).
    ~0.5 s for Llama 3's 280K merges, so the answer is cached on disk per vocabulary.
    """
    normal = {t: i for i, (t, ty) in enumerate(zip(tokens, types, strict=False)) if ty == 1}
    merge_set = set(merges)
    if len(merge_set) != len(merges):
        return False
    last = -1
    for m in merges:
        pos = m.find(" ", 1)
        if pos < 0:
            return False
        a, c = m[:pos], m[pos + 1 :]
        rid = normal.get(a + c)
        if rid is None or rid < last or a not in normal or c not in normal:
            return False
        last = rid
    for t in normal:
        for k in range(1, len(t)):
            if t[:k] in normal and t[k:] in normal and f"{t[:k]} {t[k:]}" not in merge_set:
                return False
    return True


def _cache_dir() -> str:
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "lookupdec")


def _cache_path(key: str) -> str:
    return os.path.join(_cache_dir(), "tiktoken-exact", key)


def _tiktoken_exact_cached(
    key: str | None, tokens: Sequence[str], types: Sequence[int], merges: Callable[[], Sequence[str]]
) -> bool:
    """:func:`tiktoken_exact`, remembered in the user's cache folder under ``key`` (the GGUF header digest)."""
    path = _cache_path(key) if key else None
    if path is not None:
        try:
            with open(path) as f:
                return f.read().strip() == "1"
        except OSError:
            pass
    ok = tiktoken_exact(tokens, types, merges())
    if path is not None:
        _write_cache(path, b"1" if ok else b"0")
    return ok


def _write_cache(path: str, data: bytes) -> None:
    """Write a cache file atomically (a reader sees the old file or the whole new one); errors are ignored."""
    with contextlib.suppress(OSError):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)


_PIECE_CACHE_MAX = 1 << 20
"""Distinct pieces remembered per model before the cache starts over (bounds memory)."""


class BpeModel:
    """Byte-level BPE for one vocabulary: pre-tokenizer + the engine chosen for it (see module docstring)."""

    def __init__(
        self,
        pre: PreType,
        tokens: Sequence[str],
        types: Sequence[int],
        merges: Callable[[], Sequence[str]],
        cache_key: str | None = None,
    ) -> None:
        self.pre = pre
        self.engine = "tokenizers"
        self._tiktoken: Any = None
        self._hf: Any = None
        self._pieces: dict[str, list[int]] = {}
        self._seen: Any = None  # split+tiktoken: the pieces seen so far (a _pretok.PieceCache)
        self._pretok: Any = None  # the module doing split+tiktoken (a test may swap in the interpreted one)
        if pre.ignore_merges and len(pre.regexes) == 1:
            ranks = byte_ranks(tokens, types)
            if ranks is not None and _tiktoken_exact_cached(cache_key, tokens, types, merges):
                import tiktoken

                self._tiktoken = tiktoken.Encoding(
                    name=f"lookupdec-{pre.name}", pat_str=pre.regexes[0], mergeable_ranks=ranks, special_tokens={}
                )
                self.engine = "tiktoken"
                if pre.max_digits == 3 and _pretok_compiled() and self._piece_bpe() is not None:
                    from lookupdec.tokenizer import _pretok

                    self.use_split(_pretok)
        if self._tiktoken is None:
            self._hf = _hf_bpe(tokens, merges(), pre.ignore_merges)
            if pre.hand_written and _pretok_compiled():
                class_table()  # now: worker processes forked later inherit it

    def _piece_bpe(self) -> Callable[[bytes], list[int]] | None:
        """tiktoken's BPE of one piece (its Rust ``CoreBPE.encode_single_piece``), None if this tiktoken has none.

        The piece's token if it is one, else its byte-pair merge: what ``encode_ordinary`` does
        to each piece its regex cuts. A private attribute (the public Python wrapper,
        ``Encoding._encode_single_piece``, is private too and only adds a frame), hence the check.
        """
        return getattr(getattr(self._tiktoken, "_core_bpe", None), "encode_single_piece", None)

    def use_split(self, module: Any) -> None:
        """Encode with ``module``'s splitter (:mod:`._pretok`, compiled or not) and tiktoken for new pieces."""
        class_table()  # now: worker processes forked later inherit it
        self._seen = module.PieceCache()
        self._pretok = module
        self.engine = "split+tiktoken"

    def encode(self, text: str) -> npt.NDArray[np.int32]:
        """The ids of one raw fragment."""
        if not text:
            return np.zeros(0, dtype=np.int32)
        if self._pretok is not None:
            table, mod, bpe = class_table(), self._pretok, self._piece_bpe()
            try:
                data = mod.encode(text, table, 3, self._seen, bpe, _PIECE_CACHE_MAX)
            except UnicodeEncodeError:
                # A lone surrogate: tiktoken's encode_ordinary replaces it (a pair becomes its
                # character) and encodes that text; so do we, so the ids stay tiktoken's.
                text = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
                data = mod.encode(text, table, 3, self._seen, bpe, _PIECE_CACHE_MAX)
            return np.frombuffer(data, dtype="<i4").astype(np.int32)
        if self._tiktoken is not None:
            # encode_ordinary + one numpy conversion, not tiktoken's encode_to_numpy: that one
            # goes through the special-token-aware encode, which is slower.
            return np.asarray(self._tiktoken.encode_ordinary(text), dtype=np.int32)
        pieces = self.pre.pieces(text)
        cache = self._pieces
        # BPE of a piece does not depend on its neighbours: each distinct new piece goes to
        # tokenizers once (one call for all of them; word_ids says which ids are whose), and
        # repeats come from this cache (natural text repeats most of its pieces).
        new = [p for p in dict.fromkeys(pieces) if p not in cache]
        if new:
            if len(cache) + len(new) > _PIECE_CACHE_MAX:
                cache.clear()
            enc = self._hf.encode(new, is_pretokenized=True, add_special_tokens=False)
            groups: list[list[int]] = [[] for _ in new]
            for tid, w in zip(enc.ids, enc.word_ids, strict=True):
                groups[w].append(tid)
            cache.update(zip(new, groups, strict=True))
        return np.fromiter(itertools.chain.from_iterable(map(cache.__getitem__, pieces)), dtype=np.int32)


def _hf_bpe(tokens: Sequence[str], merges: Sequence[str], ignore_merges: bool) -> Any:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab: dict[str, int] = {}
    for i, t in enumerate(tokens):
        vocab[t] = i  # llama.cpp's token_to_id keeps the last id of a duplicated text
    pairs: list[tuple[str, str]] = []
    for m in merges:
        # llama.cpp splits a merge at the first space after position 0 (word.find(' ', 1)).
        pos = m.find(" ", 1)
        a, b = (m[:pos], m[pos + 1 :]) if pos >= 0 else ("", "")
        if a + b not in vocab:
            # llama.cpp would merge and then spell the result out byte by byte; tokenizers cannot.
            raise UnsupportedVocabError(f"BPE merge {m!r} produces {a + b!r}, which is not a token")
        if a in vocab and b in vocab:
            # A merge whose parts are not tokens can never fire (parts are always tokens or
            # bytes): leaving it out keeps the relative order of the others, all that counts.
            pairs.append((a, b))
    model = models.BPE(vocab=vocab, merges=pairs, ignore_merges=ignore_merges, fuse_unk=False, byte_fallback=False)
    tok = Tokenizer(model)
    # Map each given piece to GPT-2's byte alphabet, nothing more (pieces are cut by PreType.split).
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    return tok
