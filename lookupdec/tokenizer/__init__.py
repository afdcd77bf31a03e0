"""Tokenize text with a model's own vocabulary, id for id as llama.cpp's ``llama_tokenize`` does.

``load_tokenizer(path)`` reads a GGUF file (vocabulary-only or a full model: only its key-value
header) or a Hugging Face ``tokenizer.json`` (byte-level BPE of a type llama.cpp knows), and
returns a :class:`Tokenizer`::

    tok = load_tokenizer("ggml-vocab-llama-bpe.gguf")
    ids = tok.encode("Hello world")            # numpy int32: [128000, 9906, 1917]
    tok.encode("Hello", add_special=False)      # no BOS

``encode(text, add_special=True, parse_special=True)`` follows llama.cpp step by step (see
``shared/spec/tokenization.md``): the special-token partition, BOS, the BPE or SentencePiece
segmentation of each raw fragment, EOS. The lookup tools (``llama-lookup-create``,
``llama-lookup-stats``) tokenize with both flags on, the defaults here.

Supported: ``tokenizer.ggml.model`` ``gpt2`` with the pre-tokenizers of
:data:`lookupdec.tokenizer.bpe.SUPPORTED_PRE` (Llama 3, Qwen2, DeepSeek Coder, GPT-2, SmolLM and their
llama.cpp aliases) and ``llama`` (SentencePiece: Llama 2, Phi-3, ...). Anything else raises
:class:`UnsupportedVocabError` naming what is not supported.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from functools import cached_property

import numpy as np
import numpy.typing as npt

from lookupdec.errors import TokenFileError
from lookupdec.tokenizer.errors import UnsupportedVocabError
from lookupdec.tokenizer.vocab import ATTR_CONTROL, ATTR_LSTRIP, ATTR_RSTRIP, ATTR_UNKNOWN, Vocab

__all__ = ["Tokenizer", "UnsupportedVocabError", "load_tokenizer"]

_C_SPACE = " \t\n\v\f\r"  # C isspace() in the "C" locale: what llama.cpp's lstrip/rstrip eat
_HEX = frozenset("0123456789abcdefABCDEF")
# A surrogate that is not half of a pair (a high one not followed by a low one, a low one not
# after a high one): no UTF-8 text holds one, so llama.cpp is never given one.
_LONE_SURROGATE = re.compile("[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]")


def _is_hex2(s: str) -> bool:
    """Whether ``s`` is two hex digits (``int(s, 16)`` also takes ``" 1"``, ``"+1"``, ``"1_"``...)."""
    return len(s) == 2 and s[0] in _HEX and s[1] in _HEX


def _utf8_text(text: object, what: str) -> str:
    """``text`` checked to be a str that UTF-8 can encode (what llama.cpp is given).

    :class:`TypeError` for anything but a str (``None`` was a silent ``[BOS]``, bytes failed
    deep inside); :class:`ValueError` naming the index of the first lone surrogate, which each
    engine handled differently (tokenized as U+FFFD, UnicodeEncodeError, a ``tokenizers``
    TypeError). A surrogate pair (a str built from UTF-16 halves) is its character, as
    tiktoken reads it. ASCII and ordinary text pass with one check.
    """
    if not isinstance(text, str):
        raise TypeError(f"{what} must be a str, not {type(text).__name__}")
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        pass
    else:
        return text
    lone = _LONE_SURROGATE.search(text)
    if lone is not None:
        raise ValueError(f"{what} holds a lone surrogate at index {lone.start()} (not valid UTF-8)")
    return text.encode("utf-16", "surrogatepass").decode("utf-16")  # joins the pairs


class Tokenizer:
    """A loaded vocabulary with llama.cpp's tokenization (build it with :func:`load_tokenizer`)."""

    def __init__(self, vocab: Vocab) -> None:
        self.vocab = vocab
        self.path = vocab.source
        self.n_vocab: int = vocab.n_vocab
        """Number of token ids; every id produced is below it."""
        self.bos_id: int | None = vocab.bos_id
        """The BOS id (``None`` when the vocabulary has none)."""
        self.eos_id: int | None = vocab.eos_id
        """The EOS id (``None`` when the vocabulary has none)."""
        self.add_bos: bool = vocab.add_bos
        """Whether ``add_special`` puts BOS first (the vocabulary's ``add_bos_token``)."""
        self.add_eos: bool = vocab.add_eos
        """Whether ``add_special`` puts EOS last (the vocabulary's ``add_eos_token``)."""
        if (self.add_bos and self.bos_id is None) or (self.add_eos and self.eos_id is None):
            raise UnsupportedVocabError(f"{self.path}: add_bos/add_eos is set but the vocabulary has no BOS/EOS id")
        # A special token with empty text matches at every position: llama.cpp's partition would
        # insert it again and again at the same place, and so did this one (without end, eating
        # memory). No text can be split by it, so it is left out of the matching.
        self._specials = [i for i in vocab.special_tokens() if vocab.tokens[i]]
        self._texts = [vocab.tokens[i] for i in self._specials]
        self._prefixes: dict[str, list[int]] = {}
        for k, text in enumerate(self._texts):
            self._prefixes.setdefault(text[:2], []).append(k)
        self._engine: object = None
        if vocab.model == "gpt2":
            from lookupdec.tokenizer.bpe import BpeModel, pre_type

            self._bpe: BpeModel | None = BpeModel(
                pre_type(vocab.pre), vocab.tokens, vocab.types, lambda: vocab.merges, vocab.header_digest
            )
            self._spm = None
            self.engine = self._bpe.engine
        else:
            from lookupdec.tokenizer.spm import SpmModel

            byte_ids: dict[int, int] = {}
            for i, (text, t) in enumerate(zip(vocab.tokens, vocab.types, strict=True)):
                if t == 6 and len(text) == 6 and text.startswith("<0x") and text.endswith(">"):
                    if not _is_hex2(text[3:5]):
                        raise TokenFileError(self.path, f"byte token {i} is {text!r}, not <0xNN> with hex digits NN")
                    byte_ids[int(text[3:5], 16)] = i
            self._bpe = None
            self._spm = SpmModel(vocab.tokens, vocab.scores or [0.0] * vocab.n_vocab, byte_ids)
            self.engine = "spm"

    def __repr__(self) -> str:
        return (
            f"<Tokenizer {os.path.basename(self.path)!r} {self.vocab.model}/{self.vocab.pre} "
            f"n_vocab={self.n_vocab} engine={self.engine}>"
        )

    @cached_property
    def fingerprint(self) -> bytes:
        """8 bytes identifying the vocabulary (see :meth:`lookupdec.tokenizer.vocab.Vocab.fingerprint`)."""
        return self.vocab.fingerprint()

    # ----------------------------------------------------------------------------------
    # llama_tokenize

    def encode(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> npt.NDArray[np.int32]:
        """The ids llama.cpp's ``llama_tokenize(vocab, text, add_special, parse_special)`` gives.

        Raises :class:`TypeError` when ``text`` is not a ``str`` and :class:`ValueError` when it
        holds a lone surrogate (no UTF-8 text, which is what llama.cpp tokenizes, can hold one).
        """
        return self._encode(_utf8_text(text, "text"), add_special, add_special, parse_special, first=True)

    def _encode(
        self, text: str, add_bos: bool, add_eos: bool, parse_special: bool, first: bool
    ) -> npt.NDArray[np.int32]:
        """Tokenize ``text``; ``first=False`` for a chunk that continues earlier text (no SPM prefix)."""
        parts: list[npt.NDArray[np.int32]] = []
        ids: list[int] = []  # special tokens and SPM output, flushed into parts before a BPE array

        if add_bos and self.add_bos:
            assert self.bos_id is not None
            ids.append(self.bos_id)
        prev_special = first  # SPM: a space is put before the first fragment and after a special token
        for frag in self._partition(text, parse_special):
            if isinstance(frag, int):
                ids.append(frag)
                prev_special = True
                continue
            if self._spm is not None:
                if self.vocab.add_space_prefix and prev_special:
                    frag = " " + frag
                self._spm.encode(frag.replace(" ", "\u2581"), ids)
                prev_special = False
            else:
                assert self._bpe is not None
                if ids:
                    parts.append(np.asarray(ids, dtype=np.int32))
                    ids = []
                parts.append(self._bpe.encode(frag))
        if add_eos and self.add_eos:
            assert self.eos_id is not None
            ids.append(self.eos_id)
        if ids or not parts:
            parts.append(np.asarray(ids, dtype=np.int32))
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def _partition(self, text: str, parse_special: bool) -> list[str | int]:
        """llama.cpp's ``tokenizer_st_partition``: raw text fragments and special token ids, in order."""
        if not text:
            return []
        frags: list[str | int | tuple[int, int]] = [(0, len(text))]
        for k in self._present(text):
            tid = self._specials[k]
            attr = self.vocab.attrs[tid]
            if not parse_special and attr & (ATTR_CONTROL | ATTR_UNKNOWN):
                continue
            stext = self._texts[k]
            slen = len(stext)
            if not slen:  # never in the list (see __init__): it would match at one place forever
                continue
            new: list[str | int | tuple[int, int]] = []
            for frag in frags:
                if not isinstance(frag, tuple):
                    new.append(frag)
                    continue
                a, b = frag
                while True:
                    m = text.find(stext, a, b)
                    if m < 0:
                        new.append((a, b))
                        break
                    left_end = m
                    if attr & ATTR_LSTRIP:
                        while left_end > a and text[left_end - 1] in _C_SPACE:
                            left_end -= 1
                    if left_end > a:
                        new.append((a, left_end))
                    new.append(tid)
                    a = m + slen
                    if attr & ATTR_RSTRIP:
                        while a < b and text[a] in _C_SPACE:
                            a += 1
                    if a >= b:
                        break
            frags = new
        return [text[f[0] : f[1]] if isinstance(f, tuple) else f for f in frags]

    def _present(self, text: str) -> Iterator[int]:
        """Indexes (into the longest-first special list) of the special texts that occur in ``text``.

        Scanning a large text once per special token (256 for Llama 3) would cost more than the
        BPE itself; the texts are grouped by their first two characters and each group is looked
        for only where its prefix occurs. Absent tokens cannot split anything, so skipping them
        changes nothing.
        """
        found: set[int] = set()
        for prefix, group in self._prefixes.items():
            pos = text.find(prefix)
            while pos >= 0 and len(found) < len(self._texts):
                for k in group:
                    if k not in found and text.startswith(self._texts[k], pos):
                        found.add(k)
                pos = text.find(prefix, pos + 1)
                if all(k in found for k in group):
                    break
        return iter(sorted(found))

    # ----------------------------------------------------------------------------------
    # cutting a text for chunked / parallel encoding

    @cached_property
    def _cut_ok(self) -> bool:
        """Whether text may be cut at all (see :meth:`find_cut`)."""
        if self._spm is not None:
            # SPM merges over the whole fragment: a newline must never be part of a longer token.
            return not any("\n" in t and len(t) > 1 for t in self.vocab.tokens)
        return True

    @cached_property
    def _nl_specials(self) -> list[str]:
        return [t for t in self._texts if "\n" in t]

    @cached_property
    def _special_starts(self) -> frozenset[str]:
        return frozenset(t[0] for t in self._texts if t)

    def is_cut(self, text: str, i: int) -> bool:
        r"""True when encoding ``text[:i]`` and ``text[i:]`` separately gives the ids of ``text``.

        (With BOS only before the first part, EOS only after the last, and the second part
        encoded as a continuation: no SentencePiece prefix space.) Accepted cuts are right after
        a newline, where either (a) the newline follows a non-space character and comes before
        a printable ASCII character, or (b) it comes before one space and then a printable ASCII
        character (WikiText's line layout). Why no token can span such a cut:

        * Llama 3 / Qwen2 regexes: a whitespace run holding a newline is matched by
          ``\s*[\r\n]+`` up to its last newline (that alternative comes before ``\s+(?!\S)``;
          ``[^\s\p{L}\p{N}]+[\r\n]*`` also ends at the last newline), and in (a) and (b) the
          newline at ``i - 1`` is the last of its run; no alternative starts with a newline and
          goes on (``[^\r\n\p{L}\p{N}]?`` excludes it). At the end of the first part the same
          alternative matches the same run, so both sides split as in the whole text.
        * GPT-2 regex (no ``\r\n`` special case): ``\s+(?!\S)`` takes a whitespace run but
          its last character when a non-space follows. (a): the run is the newline alone; it is
          one piece in the whole text (left over between matches) and at the end of the first
          part. (b): the run ends with the one space, so ``\s+(?!\S)`` stops at ``i`` in the
          whole text, and takes the same characters at the end of the first part.
        * DeepSeek Coder: its first regex isolates every newline.
        * None of these regexes looks behind, so the second part splits as in the whole text.
        * SentencePiece: merges only join neighbours whose concatenation is a token; when no
          token longer than one character holds a newline (checked per vocabulary, true of Llama
          2 and Phi-3), the newline symbol never merges and the two sides are independent.
        * Special tokens: only a special text holding a newline could span the cut; such texts
          are checked around it. A special token starting at ``i`` or ``i + 1`` could strip the
          spaces before it (lstrip), so those characters must not start a special text.
        """
        if not self._cut_ok or i < 2 or i + 1 >= len(text) or text[i - 1] != "\n":
            return False
        c = text[i]
        if c == " ":
            c = text[i + 1]
        elif text[i - 2].isspace():
            return False
        if not ("!" <= c <= "~") or c in self._special_starts or text[i] in self._special_starts:
            return False
        for s in self._nl_specials:
            k = s.find("\n")
            while k >= 0:
                if k < len(s) - 1 and text.startswith(s, i - 1 - k):
                    return False
                k = s.find("\n", k + 1)
        return True

    def find_cut(self, text: str, lo: int, hi: int) -> int:
        """The last position ``i`` in ``[lo, hi)`` where :meth:`is_cut` holds, or -1."""
        pos = text.rfind("\n", lo, hi)
        while pos >= 0:
            if self.is_cut(text, pos + 1):
                return pos + 1
            pos = text.rfind("\n", lo, pos)
        return -1

    def find_next_cut(self, text: str, lo: int, hi: int) -> int:
        """The first position ``i`` in ``[lo, hi)`` where :meth:`is_cut` holds, or -1."""
        pos = text.find("\n", max(lo - 1, 0), hi)
        while pos >= 0:
            if pos + 1 >= lo and self.is_cut(text, pos + 1):
                return pos + 1
            pos = text.find("\n", pos + 1, hi)
        return -1

    def encode_chunks(
        self, chunks: list[str], *, add_special: bool = True, parse_special: bool = True
    ) -> npt.NDArray[np.int32]:
        """Encode consecutive parts of one text (cut at :meth:`is_cut` points) as the whole text.

        Each chunk is checked as :meth:`encode` checks its text.
        """
        if isinstance(chunks, str):  # a str is a sequence of 1-character chunks: surely a mistake
            raise TypeError("chunks must be a list of str, not a str")
        chunks = [_utf8_text(chunk, f"chunks[{k}]") for k, chunk in enumerate(chunks)]
        parts = [
            self._encode(chunk, add_special and k == 0, add_special and k == len(chunks) - 1, parse_special, k == 0)
            for k, chunk in enumerate(chunks)
        ]
        return np.concatenate(parts) if parts else self.encode("", add_special=add_special)


def load_tokenizer(path: str | os.PathLike[str]) -> Tokenizer:
    """Load the vocabulary of a ``.gguf`` file or a Hugging Face ``tokenizer.json`` (by content).

    Raises :class:`FileNotFoundError`, :class:`lookupdec.errors.TokenFileError` (not a readable
    vocabulary, or not a regular file, naming the file) or :class:`UnsupportedVocabError` (a tokenizer type or
    pre-tokenizer llama.cpp's tokenization is not reproduced for, naming it).
    """
    from lookupdec.tokenizer._files import open_regular
    from lookupdec.tokenizer.vocab import vocab_from_gguf, vocab_from_tokenizer_json

    name = os.fspath(path)
    with open_regular(name) as f:  # a fifo or a device is refused before a byte is read
        magic = f.read(4)
    if magic == b"GGUF":
        return Tokenizer(vocab_from_gguf(name))
    return Tokenizer(vocab_from_tokenizer_json(name))
