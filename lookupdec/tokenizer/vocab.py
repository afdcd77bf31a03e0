"""A vocabulary as llama.cpp loads it: token texts, types and attributes, special ids and flags.

Read from a GGUF key-value header (:func:`vocab_from_gguf`) or from a Hugging Face
``tokenizer.json`` (:func:`vocab_from_tokenizer_json`, byte-level BPE only), and turned into
the fields ``llama_vocab::impl::load`` computes (``src/llama-vocab.cpp``).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lookupdec.errors import LookupdecError, TokenFileError
from lookupdec.tokenizer.errors import UnsupportedVocabError
from lookupdec.tokenizer.gguf import LazyStrings

# token types (tokenizer.ggml.token_type) and llama.cpp's attribute bits
TYPE_NORMAL, TYPE_UNKNOWN, TYPE_CONTROL, TYPE_USER_DEFINED, TYPE_UNUSED, TYPE_BYTE = 1, 2, 3, 4, 5, 6
ATTR_UNKNOWN, ATTR_UNUSED, ATTR_NORMAL, ATTR_CONTROL, ATTR_USER_DEFINED, ATTR_BYTE = 1, 2, 4, 8, 16, 32
ATTR_LSTRIP, ATTR_RSTRIP = 128, 256
_TYPE_TO_ATTR = {
    TYPE_UNKNOWN: ATTR_UNKNOWN,
    TYPE_UNUSED: ATTR_UNUSED,
    TYPE_NORMAL: ATTR_NORMAL,
    TYPE_CONTROL: ATTR_CONTROL,
    TYPE_USER_DEFINED: ATTR_USER_DEFINED,
    TYPE_BYTE: ATTR_BYTE,
}

# Texts llama.cpp marks as end-of-generation and forces to CONTROL (llama_vocab::impl::load,
# "maintain a list of tokens that cause end-of-generation"), so with parse_special they are
# matched in the text even when the file typed them otherwise.
_EOG_TEXTS = frozenset(
    [
        "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
        "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
        "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
        "<｜end▁of▁sentence｜>", "[e~[",  # noqa: RUF001 - DeepSeek's token really uses U+FF5C
    ]
)  # fmt: skip
_ALWAYS_USER_DEFINED = frozenset(["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"])


@dataclass
class Vocab:
    """What tokenization needs of a vocabulary (see the module docstring)."""

    source: str
    model: str  # "gpt2" (byte-level BPE) or "llama" (SentencePiece)
    pre: str
    tokens: list[str]
    types: list[int]
    scores: list[float] | None
    merges_source: list[str] | LazyStrings
    bos_id: int | None
    eos_id: int | None
    add_bos: bool
    add_eos: bool
    add_space_prefix: bool
    name: str = ""
    header_digest: str | None = None
    attrs: list[int] = field(default_factory=list)

    @property
    def merges(self) -> list[str]:
        """The BPE merges in rank order (decoded from the GGUF header on first use)."""
        if isinstance(self.merges_source, LazyStrings):
            self.merges_source = self.merges_source.load()
        return self.merges_source

    @property
    def n_vocab(self) -> int:
        """Number of token ids (the largest id + 1)."""
        return len(self.tokens)

    def fingerprint(self) -> bytes:
        """8 bytes identifying the id -> token text mapping (the index header's ``vocab_fingerprint``).

        BLAKE2b (8-byte digest) of the compact UTF-8 JSON list of ``[id, text]`` pairs in id
        order: the definition :func:`lookupdec.tokens.vocab_info` uses for a tokenizer.json, so
        a GGUF and the tokenizer.json it was converted from give the same fingerprint when their
        token texts agree. Two vocabularies with the same texts for the same ids make the same
        ids for the same cache; that is what the fingerprint guards.
        """
        pairs = [[i, t] for i, t in enumerate(self.tokens)]
        blob = json.dumps(pairs, ensure_ascii=False, separators=(",", ":")).encode("utf-8", errors="surrogateescape")
        return hashlib.blake2b(blob, digest_size=8).digest()

    def special_tokens(self) -> list[int]:
        """llama.cpp's ``cache_special_tokens``: control, user-defined and unknown ids, longest text first.

        llama.cpp sorts with ``std::sort`` (not stable); equal lengths are ordered by id here.
        That order matters only when two special texts of the same length overlap in the text.
        """
        mask = ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN
        ids = [i for i, a in enumerate(self.attrs) if a & mask]
        ids.sort(key=lambda i: (-len(self.tokens[i].encode("utf-8", errors="surrogateescape")), i))
        return ids


def _finish(v: Vocab) -> Vocab:
    """Token attributes as llama.cpp derives them from the types, the EOG texts and the model name."""
    attrs = [_TYPE_TO_ATTR.get(t, 0) for t in v.types]
    for i, text in enumerate(v.tokens):
        if text in _EOG_TEXTS:
            attrs[i] |= ATTR_CONTROL
        elif text in _ALWAYS_USER_DEFINED:
            attrs[i] = ATTR_USER_DEFINED
    name = v.name.lower()
    if "phi-3" in name or "phi3" in name:
        # llama.cpp: every special token of a Phi-3 model eats the spaces after it, except these.
        for i, a in enumerate(attrs):
            if a & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN):
                attrs[i] |= ATTR_RSTRIP
        index = {t: i for i, t in enumerate(v.tokens)}
        if "</s>" in index:
            attrs[index["</s>"]] |= ATTR_RSTRIP
        for t in ("<unk>", "<s>", "<|endoftext|>"):
            if t in index:
                attrs[index[t]] &= ~ATTR_RSTRIP
    v.attrs = attrs
    return v


def vocab_from_gguf(path: str | os.PathLike[str]) -> Vocab:
    """The vocabulary in the key-value header of a GGUF file (vocabulary-only or a full model).

    Raises :class:`TokenFileError` naming the file (and the key) for a header that is not a
    vocabulary llama.cpp could load, :class:`UnsupportedVocabError` for one it does not reproduce.
    """
    name = os.fspath(path)
    with _file_errors(name):
        return _vocab_from_gguf(name)


@contextmanager
def _file_errors(name: str) -> Iterator[None]:
    """Turn an error from deep inside the building of a vocabulary into a :class:`TokenFileError`.

    The last line of defence: every key is checked where it is read, but a malformed file
    must not surface as a bare IndexError from a helper. The original error is kept in the
    message and as ``__cause__`` (with its traceback), so a bug is still traceable.
    """
    try:
        yield
    except LookupdecError:
        raise
    except (ValueError, TypeError, IndexError, KeyError, AttributeError, RecursionError, OverflowError) as e:
        raise TokenFileError(name, f"not a vocabulary this reader can load ({type(e).__name__}: {e})") from e


def _what(value: object) -> str:
    """A short description of a header value of the wrong type, for an error message."""
    if isinstance(value, (list, LazyStrings, np.ndarray)):
        return "an array"
    if isinstance(value, str):
        return f"the string {value[:40]!r}"
    return f"{type(value).__name__} {value!r}"


def _vocab_from_gguf(name: str) -> Vocab:
    from lookupdec.tokenizer.bpe import pre_type
    from lookupdec.tokenizer.gguf import read_gguf_kv

    kv = read_gguf_kv(name, lazy=frozenset(["tokenizer.ggml.merges"]))

    def string(key: str) -> str | None:
        value = kv.get(key)
        if value is not None and not isinstance(value, str):
            raise TokenFileError(name, f"{key} is {_what(value)}, not a string")
        return value

    def flag(key: str, default: bool) -> bool:
        value = kv.get(key)
        if value is None:
            return default
        if not isinstance(value, int):  # bool, or an integer type (a Python int from the reader)
            raise TokenFileError(name, f"{key} is {_what(value)}, not a bool")
        return bool(value)

    def numbers(key: str, kinds: str, what: str, n: int) -> np.ndarray[Any, Any] | None:
        value = kv.get(key)
        if value is None:
            return None
        if not isinstance(value, np.ndarray) or value.dtype.kind not in kinds:
            raise TokenFileError(name, f"{key} is {_what(value)}, not an array of {what}")
        # llama.cpp reads entry i for every token i: a shorter array is read past its end.
        if len(value) < n:
            raise TokenFileError(name, f"{key} has {len(value)} entries for {n} tokens")
        return value[:n]

    model = string("tokenizer.ggml.model")
    if model is None:
        raise TokenFileError(name, "GGUF file has no tokenizer.ggml.model (no vocabulary)")
    tokens = kv.get("tokenizer.ggml.tokens")
    if tokens is None or (isinstance(tokens, (list, np.ndarray)) and len(tokens) == 0):
        raise TokenFileError(name, "GGUF file has no tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not all(type(t) is str for t in tokens):
        raise TokenFileError(name, "tokenizer.ggml.tokens is not an array of strings")
    n = len(tokens)
    raw_types = numbers("tokenizer.ggml.token_type", "iu", "integers", n)
    types = [int(t) for t in raw_types] if raw_types is not None else [TYPE_NORMAL] * n
    pre = string("tokenizer.ggml.pre") or "default"
    raw_scores = numbers("tokenizer.ggml.scores", "fiu", "numbers", n)
    scores = [float(s) for s in raw_scores] if raw_scores is not None else None
    if model == "gpt2":
        pt = pre_type(pre)  # raises for an unsupported pre-tokenizer, naming it
        add_bos, add_eos, add_space_prefix = pt.add_bos, False, False
        bos_default: int | None = 11
        eos_default: int | None = 11
        found = kv.get("tokenizer.ggml.merges")
        if found is None:
            raise TokenFileError(name, "byte-level BPE vocabulary without tokenizer.ggml.merges")
        if not isinstance(found, LazyStrings):
            raise TokenFileError(name, f"tokenizer.ggml.merges is {_what(found)} not of strings")
        merges: list[str] | LazyStrings = found
    elif model == "llama":
        add_bos, add_eos, add_space_prefix = True, False, True
        bos_default, eos_default = 1, 2
        merges = []
        # The merge queue ranks the scores: a NaN has no rank (and no order in llama.cpp's queue).
        bad = next((i for i, s in enumerate(scores or ()) if s != s), None)
        if bad is not None:
            raise TokenFileError(name, f"tokenizer.ggml.scores holds NaN (token {bad})")
    else:
        raise UnsupportedVocabError(
            f"{name}: tokenizer type {model!r} (tokenizer.ggml.model) is not supported; "
            "supported: 'gpt2' (byte-level BPE), 'llama' (SentencePiece)"
        )
    add_space_prefix = flag("tokenizer.ggml.add_space_prefix", add_space_prefix)
    if flag("tokenizer.ggml.remove_extra_whitespaces", False):
        raise UnsupportedVocabError(f"{name}: tokenizer.ggml.remove_extra_whitespaces is not supported")
    add_bos = flag("tokenizer.ggml.add_bos_token", add_bos)
    add_eos = flag("tokenizer.ggml.add_eos_token", add_eos)

    def special(key: str, default: int | None) -> int | None:
        # llama.cpp: a default out of range is disabled; a bad id in the file keeps the default.
        value = default if default is not None and default < n else None
        given = kv.get(key)
        if given is None:
            return value
        # An id of another type (a string, an array, NaN) is no id at all: llama.cpp asserts
        # the type. An integral float is taken as before, for files written loosely.
        if isinstance(given, bool) or not (isinstance(given, int) or (isinstance(given, float) and given.is_integer())):
            raise TokenFileError(name, f"{key} is {_what(given)}, not a token id")
        if 0 <= int(given) < n:
            value = int(given)
        return value

    return _finish(
        Vocab(
            source=name,
            model=model,
            pre=pre,
            tokens=tokens,
            types=types,
            scores=scores,
            merges_source=merges,
            bos_id=special("tokenizer.ggml.bos_token_id", bos_default),
            eos_id=special("tokenizer.ggml.eos_token_id", eos_default),
            add_bos=add_bos,
            add_eos=add_eos,
            add_space_prefix=add_space_prefix,
            name=string("general.name") or "",
            header_digest=kv["\0header_digest"],
        )
    )


# Hugging Face pre-tokenizer regexes that name a llama.cpp pre-tokenizer type (what llama.cpp's
# convert_hf_to_gguf.py recognizes by hashing a tokenization; the regex is the reliable part).
_HF_SPLIT_TO_PRE = {
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+": "llama-bpe",  # noqa: E501
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+": "qwen2",  # noqa: E501
}  # fmt: skip


def vocab_from_tokenizer_json(path: str | os.PathLike[str]) -> Vocab:
    """The vocabulary of a Hugging Face ``tokenizer.json``, as llama.cpp's GGUF conversion would give it.

    Only byte-level BPE with a Llama 3 or Qwen2 Split regex, or GPT-2's plain ByteLevel
    pre-tokenizer, is recognized; anything else is :class:`UnsupportedVocabError` (convert the
    model to GGUF with llama.cpp and pass the ``.gguf``). Added tokens become control tokens
    (``special: true``) or user-defined ones; BOS is added when the post-processor adds it.
    A file that is not a well-formed tokenizer.json is :class:`TokenFileError` naming it.
    """
    name = os.fspath(path)
    with _file_errors(name):
        return _vocab_from_tokenizer_json(name)


def _vocab_from_tokenizer_json(name: str) -> Vocab:
    from lookupdec.tokenizer._files import open_regular

    with open_regular(name) as fb:
        raw = fb.read()
    try:
        data: dict[str, Any] = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TokenFileError(name, f"not a Hugging Face tokenizer.json ({e})") from None
    if not isinstance(data, dict) or not isinstance(data.get("model") or {}, dict):
        raise TokenFileError(name, "not a Hugging Face tokenizer.json (no JSON object with a model in it)")
    model = data.get("model") or {}
    if model.get("type") != "BPE":
        raise UnsupportedVocabError(f"{name}: tokenizer model {model.get('type')!r} is not supported (only BPE)")
    pre = _hf_pre_type(name, data.get("pre_tokenizer"))
    if pre is None:
        raise UnsupportedVocabError(
            f"{name}: pre-tokenizer {json.dumps(data.get('pre_tokenizer'))[:200]} is not one llama.cpp's "
            "llama-bpe, qwen2 or gpt-2 types reproduce; convert the model to GGUF and use the .gguf"
        )
    added = data.get("added_tokens") or []
    if not isinstance(added, list) or not all(isinstance(t, dict) for t in added):
        raise TokenFileError(name, "not a Hugging Face tokenizer.json: added_tokens is not a list of objects")
    for k, t in enumerate(added):
        if not isinstance(t.get("content"), str):
            raise TokenFileError(name, f"added_tokens[{k}].content is {_json_what(t.get('content'))}, not a string")
    try:
        vocab_map: dict[str, int] = dict(model.get("vocab") or {})
        for t in added:
            vocab_map[t["content"]] = int(t["id"])
    except (TypeError, ValueError, KeyError, AttributeError) as e:
        raise TokenFileError(name, f"not a Hugging Face tokenizer.json: bad vocab or added_tokens ({e!r})") from None
    if not all(isinstance(text, str) for text in vocab_map):
        raise TokenFileError(name, "model.vocab has a token text that is not a string")
    # Ids index a table of that size: a negative one failed deep inside, and a huge one (2**40)
    # made a table of gigabytes. A vocabulary is dense, so more ids than entries is a bad file.
    bad = [i for i in vocab_map.values() if not isinstance(i, int) or not 0 <= i < 2 * len(vocab_map) + 1024]
    if bad:
        top = 2 * len(vocab_map) + 1023
        raise TokenFileError(
            name, f"token id {bad[0]!r} is outside 0..{top} for a vocabulary of {len(vocab_map):,} tokens"
        )
    n = max(vocab_map.values(), default=-1) + 1
    tokens = [f"[PAD{i}]" for i in range(n)]
    types = [TYPE_USER_DEFINED] * n  # llama.cpp's converter fills holes with user-defined [PADn]
    for text, i in vocab_map.items():
        tokens[i] = text
        types[i] = TYPE_NORMAL
    for t in added:
        types[int(t["id"])] = TYPE_CONTROL if t.get("special") else TYPE_USER_DEFINED
    merges = _hf_merges(name, model.get("merges"))
    from lookupdec.tokenizer.bpe import pre_type

    pt = pre_type(pre)
    bos = _hf_bos(name, data, vocab_map)
    if pt.ignore_merges != bool(model.get("ignore_merges", False)):
        raise UnsupportedVocabError(
            f"{name}: ignore_merges={model.get('ignore_merges', False)} does not match llama.cpp's {pre!r} type"
        )
    return _finish(
        Vocab(
            source=name,
            model="gpt2",
            pre=pre,
            tokens=tokens,
            types=types,
            scores=None,
            merges_source=merges,
            bos_id=bos,
            eos_id=None,
            add_bos=bos is not None,
            add_eos=False,
            add_space_prefix=False,
        )
    )


def _json_what(value: object) -> str:
    """A short description of a JSON value of the wrong type, for an error message."""
    return json.dumps(value)[:60]


def _hf_merges(name: str, merges: Any) -> list[str]:
    """``model.merges`` as ``"a b"`` strings; they come as such strings or as ``[a, b]`` pairs."""
    if merges is None:
        return []
    if not isinstance(merges, list):
        raise TokenFileError(name, f"model.merges is {_json_what(merges)}, not a list")
    out: list[str] = []
    for k, m in enumerate(merges):
        if isinstance(m, str):
            out.append(m)
        elif isinstance(m, list) and len(m) == 2 and all(isinstance(x, str) for x in m):
            out.append(" ".join(m))
        else:
            raise TokenFileError(name, f"model.merges[{k}] is {_json_what(m)}, not a string or a pair of strings")
    return out


def _hf_pre_type(name: str, pre: Any) -> str | None:
    """The llama.cpp pre-tokenizer type ``pre_tokenizer`` matches, or None (an unsupported one)."""
    if not isinstance(pre, dict):
        return None
    if pre.get("type") == "ByteLevel" and pre.get("use_regex", True) and not pre.get("add_prefix_space", False):
        return "gpt-2"
    if pre.get("type") != "Sequence":
        return None
    steps = pre.get("pretokenizers") or []
    if not isinstance(steps, list) or not all(isinstance(step, dict) for step in steps):
        raise TokenFileError(name, "pre_tokenizer.pretokenizers is not a list of objects")
    if len(steps) != 2 or steps[1].get("type") != "ByteLevel" or steps[1].get("use_regex", True):
        return None
    split = steps[0]
    if split.get("type") != "Split" or split.get("behavior") != "Isolated" or split.get("invert"):
        return None
    pattern = split.get("pattern") or {}
    if not isinstance(pattern, dict):
        raise TokenFileError(name, f"pre_tokenizer Split pattern is {_json_what(pattern)}, not an object")
    regex = pattern.get("Regex", "")
    return _HF_SPLIT_TO_PRE.get(regex) if isinstance(regex, str) else None


def _hf_bos(name: str, data: dict[str, Any], vocab_map: dict[str, int]) -> int | None:
    """The id the post-processor puts first (TemplateProcessing's single template), if any."""
    post = data.get("post_processor") or {}
    if not isinstance(post, dict):
        raise TokenFileError(name, f"post_processor is {_json_what(post)}, not an object")
    procs = post.get("processors", [post]) if post.get("type") == "Sequence" else [post]
    if not isinstance(procs, list) or not all(isinstance(p, dict) for p in procs):
        raise TokenFileError(name, "post_processor.processors is not a list of objects")
    for p in procs:
        if p.get("type") == "TemplateProcessing":
            single = p.get("single") or []
            if not isinstance(single, list) or not all(isinstance(piece, dict) for piece in single):
                raise TokenFileError(name, "post_processor TemplateProcessing single is not a list of objects")
            if single and "SpecialToken" in single[0]:
                special = single[0]["SpecialToken"]
                if not isinstance(special, dict) or not isinstance(special.get("id"), str):
                    raise TokenFileError(
                        name, f"post_processor SpecialToken is {_json_what(special)}, not an object with an id"
                    )
                return vocab_map.get(special["id"])
    return None
