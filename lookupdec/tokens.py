"""Token input: raw int32 token files, ``.npy`` arrays, and text through a model's vocabulary.

Token files are used exactly as they are (no BOS is added or removed). Text files are
tokenized as llama.cpp's lookup tools do (``add_special = true, parse_special = true``): with
a ``.gguf`` vocabulary (or a tokenizer.json :mod:`lookupdec.tokenizer` reproduces) through
:func:`tokenize_exact`, llama.cpp's ids exactly; with any other Hugging Face tokenizer.json
through :func:`tokenize_file` and that library's own rules (a warning says so). A BOS token is
put in front when the vocabulary asks for one (Llama 3 does, Qwen2.5 does not), unless told
otherwise.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import os
import tokenize
import warnings
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO

import numpy as np
import numpy.typing as npt

from lookupdec._rawids import TOKEN_SUFFIXES as TOKEN_SUFFIXES  # re-exported: its home before _rawids
from lookupdec._rawids import check_raw_size, refuse_irregular, require_regular
from lookupdec.errors import TokenFileError
from lookupdec.rules import INT32_MAX as INT32_MAX  # re-exported: callers read them here
from lookupdec.rules import INT32_MIN as INT32_MIN

TokenArray = npt.NDArray[np.int32]
"""A one-dimensional array of token ids."""


_BOS_NAMES = ("<|begin_of_text|>", "<s>", "<bos>", "<|startoftext|>", "<|endoftext|>")


def read_tokens(path: str | os.PathLike[str]) -> TokenArray:
    """Read a token file: raw little-endian int32 ids, or a ``.npy`` array (by extension).

    A raw file whose size is not a multiple of 4 raises :class:`TokenFileError` naming
    the offset of the incomplete last id. A ``.npy`` file may hold any integer dtype; an
    id outside the int32 range raises :class:`TokenFileError` with the byte offset of
    that element. A missing file raises :class:`FileNotFoundError`.
    """
    name = os.fsdecode(path)  # a bytes path too
    if name.lower().endswith(".npy"):
        return _read_npy(name)  # npy_layout refuses a fifo or a device
    require_regular(name)
    check_raw_size(name)
    data = np.fromfile(name, dtype="<i4")
    return data.astype(np.int32, copy=False)


def check_token_ids(path: str | os.PathLike[str], ids: TokenArray, *, raw: bool = False) -> None:
    """TokenFileError at the first negative id, naming its position (and byte offset if ``raw``).

    The API accepts any int32 id; a corpus or replay given to the command line is text of
    a vocabulary, where no id is negative (-1 is llama.cpp's "no token", and a key padding).
    Without this a -1 made keys look like shorter n-grams, and misleading errors later.
    """
    if ids.ndim != 1:
        raise TokenFileError(path, f"token ids must be one-dimensional, got shape {ids.shape}")
    if ids.size:
        bad = np.flatnonzero(ids < 0)
        if bad.size:
            i = int(bad[0])
            raise TokenFileError(
                path,
                f"token id {int(ids[i])} at position {i} is negative; token ids are >= 0",
                4 * i if raw else None,
            )


def npy_layout(name: str) -> tuple[int, np.dtype[Any], int]:
    """``(length, dtype, data offset)`` of a one-dimensional integer ``.npy`` file, header checked.

    Raises :class:`TokenFileError` naming the file for a bad header, a non-integer dtype, more
    than one dimension, or data cut short. Only the header is read.
    """
    fmt = np.lib.format
    require_regular(name)
    try:
        with open(name, "rb") as f:
            version = fmt.read_magic(f)
            if version == (1, 0):
                shape, _, dtype = fmt.read_array_header_1_0(f)
            else:
                shape, _, dtype = fmt.read_array_header_2_0(f)
            data_offset = f.tell()
    except (ValueError, EOFError, SyntaxError, tokenize.TokenError) as e:  # the header is a Python literal
        raise TokenFileError(name, f"not a valid .npy file ({e})", 0) from None
    if dtype.kind not in "iu":
        raise TokenFileError(name, f".npy array has dtype {dtype}, token ids need an integer dtype", 0)
    if len(shape) != 1 or not isinstance(shape[0], int) or shape[0] < 0:  # (-1,) read every byte as ids
        raise TokenFileError(name, f".npy array has shape {shape}, token ids need a one-dimensional array", 0)
    expected = data_offset + int(shape[0]) * dtype.itemsize
    size = os.path.getsize(name)
    if size < expected:
        raise TokenFileError(
            name, f".npy data cut short: {shape[0]} ids of {dtype.itemsize} bytes need {expected} bytes", size
        )
    return int(shape[0]), dtype, data_offset


def _read_npy(name: str) -> TokenArray:
    length, dtype, data_offset = npy_layout(name)
    arr: npt.NDArray[Any] = np.fromfile(name, dtype=dtype, count=length, offset=data_offset)
    if arr.size and dtype.itemsize >= 4 and not np.can_cast(dtype, np.int32):
        bad = np.flatnonzero((arr < INT32_MIN) | (arr > INT32_MAX))
        if bad.size:
            i = int(bad[0])
            raise TokenFileError(
                name,
                f"token id {int(arr[i])} (element {i}) is outside the int32 range of a llama.cpp token id",
                data_offset + i * dtype.itemsize,
            )
    return arr.astype(np.int32)


def _load_tokenizer(tokenizer_json: str | os.PathLike[str]) -> Any:
    from tokenizers import Tokenizer

    name = os.fspath(tokenizer_json)
    if not os.path.exists(name):
        raise FileNotFoundError(2, "No such file or directory", name)
    require_regular(name)  # a fifo blocked the read for ever
    try:
        return Tokenizer.from_file(name)
    except Exception as e:  # tokenizers raises a bare Exception on a malformed file
        raise TokenFileError(name, f"not a Hugging Face tokenizer.json ({e})") from None


def bos_token_id(tokenizer: Any) -> int | None:
    """The BOS id of a ``tokenizers.Tokenizer``: what its post-processor puts in front, else a known BOS name."""
    with_special: list[int] = tokenizer.encode("", add_special_tokens=True).ids
    if with_special:
        return with_special[0]
    for name in _BOS_NAMES:
        token_id = tokenizer.token_to_id(name)
        if token_id is not None:
            return int(token_id)
    return None


def tokenize_file(
    path: str | os.PathLike[str], tokenizer_json: str | os.PathLike[str], add_bos: bool | None = None
) -> TokenArray:
    """Tokenize a UTF-8 text file as one string with a Hugging Face ``tokenizer.json``.

    ``add_bos=None`` (the default) follows llama.cpp's lookup tools, which tokenize with
    ``add_special = true``: the tokenizer's own post-processor decides, so Llama 3 gets its
    ``<|begin_of_text|>`` and a tokenizer that adds nothing gets nothing. ``True`` forces a
    BOS in front (error if the tokenizer has none); ``False`` adds no special tokens. Special
    tokens written in the text are matched as special tokens, like llama.cpp's
    ``parse_special = true``.
    """
    name = os.fspath(path)
    require_regular(name)
    with open(name, "rb") as f:
        raw = f.read()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TokenFileError(name, f"text is not valid UTF-8 ({e.reason})", e.start) from None
    tokenizer = _load_tokenizer(tokenizer_json)
    if add_bos is None:
        ids: list[int] = tokenizer.encode(text, add_special_tokens=True).ids
    else:
        ids = tokenizer.encode(text, add_special_tokens=False).ids
        if add_bos:
            bos = bos_token_id(tokenizer)
            if bos is None:
                raise TokenFileError(
                    os.fspath(tokenizer_json), "the tokenizer has no BOS token; use --no-add-bos or the default"
                )
            ids = [bos, *ids]
    return np.asarray(ids, dtype=np.int32)


def is_gguf(path: str | os.PathLike[str]) -> bool:
    """True when ``path`` starts with the GGUF magic (a llama.cpp vocabulary or model file)."""
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"GGUF"
    except OSError:
        return False


def exact_tokenizer(path: str | os.PathLike[str]) -> Any:
    """The :class:`lookupdec.tokenizer.Tokenizer` of ``path`` (llama.cpp's ids), or None for a tokenizer.json
    that package does not reproduce (then the Hugging Face path of this module is used, with a warning).

    Loaded once per path and modification time (``create`` needs it for the ids and the header).
    """
    name = os.fspath(path)
    try:
        st = os.stat(name)
    except FileNotFoundError:
        raise FileNotFoundError(2, "No such file or directory", name) from None
    # Here, not in the readers behind: a fifo's TokenFileError from load_tokenizer was taken for
    # "not a tokenizer.json", and is_gguf then opened the fifo and blocked for ever.
    refuse_irregular(name, st.st_mode)
    return _exact_tokenizer(os.path.abspath(name), st.st_mtime_ns)


@functools.cache
def _exact_tokenizer(name: str, mtime_ns: int) -> Any:
    from lookupdec.tokenizer import UnsupportedVocabError, load_tokenizer

    try:
        return load_tokenizer(name)
    except UnsupportedVocabError as e:
        if is_gguf(name):
            raise
        warnings.warn(
            f"{e}; tokenizing with Hugging Face tokenizers' own rules, whose ids may differ from llama.cpp's",
            stacklevel=3,
        )
        return None
    except TokenFileError:
        if is_gguf(name):
            raise
        return None  # not a tokenizer.json lookupdec.tokenizer reads: the HF path reports the error


def _exact_parts(
    path: str,
    tok: Any,
    add_bos: bool | None,
    workers: int | None,
    progress: Callable[[int, int], None] | None = None,
) -> Iterator[TokenArray]:
    """The ids of :func:`tokenize_exact`, in parts (bounded memory); checks run before the first part."""
    from lookupdec.tokenizer.stream import iter_file_ids

    if not os.path.exists(path):
        raise FileNotFoundError(2, "No such file or directory", path)
    parts = iter_file_ids(path, tok, add_special=add_bos is not False, workers=workers, progress=progress)
    if add_bos and not tok.add_bos:
        if tok.bos_id is None:
            raise TokenFileError(tok.path, "the vocabulary has no BOS token; use --no-add-bos or the default")
        parts = itertools.chain([np.array([tok.bos_id], dtype=np.int32)], parts)
    return parts


def tokenize_exact(path: str, tok: Any, add_bos: bool | None = None, workers: int | None = None) -> TokenArray:
    """Tokenize the text file ``path`` with a :class:`lookupdec.tokenizer.Tokenizer`, as llama.cpp's lookup tools do.

    ``add_bos=None`` is ``add_special=True`` (the vocabulary's add_bos/add_eos decide),
    ``False`` adds nothing, ``True`` puts BOS first even when the vocabulary would not.
    """
    parts = list(_exact_parts(path, tok, add_bos, workers))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)


def tokenize_to_file(
    path: str,
    tok: Any,
    out: BinaryIO,
    add_bos: bool | None = None,
    workers: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> int:
    """Tokenize the text file ``path`` as :func:`tokenize_exact` does, streaming raw int32 ids to ``out``.

    Memory stays bounded by the tokenizer's chunks, whatever the file's size; returns the
    number of ids written.
    """
    from lookupdec.tokenizer.stream import write_ids

    return write_ids(_exact_parts(path, tok, add_bos, workers, progress), out)


def vocab_info(tokenizer_json: str | os.PathLike[str]) -> tuple[int, bytes]:
    """``(vocab_size, fingerprint)`` of a tokenizer, for the static index header.

    The fingerprint is the first 8 bytes of a BLAKE2b digest of the vocabulary: the JSON
    list of ``[id, token]`` pairs (added tokens included) sorted by id, compact, UTF-8
    (for a GGUF file, its token list: see :meth:`lookupdec.tokenizer.vocab.Vocab.fingerprint`).
    """
    exact = exact_tokenizer(tokenizer_json)
    if exact is not None:
        return int(exact.n_vocab), bytes(exact.fingerprint)
    tokenizer = _load_tokenizer(tokenizer_json)
    vocab: dict[str, int] = tokenizer.get_vocab(with_added_tokens=True)
    pairs = sorted((token_id, token) for token, token_id in vocab.items())
    blob = json.dumps(pairs, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    size = max((token_id for token_id, _ in pairs), default=-1) + 1
    return size, hashlib.blake2b(blob, digest_size=8).digest()


def load_tokens(
    path: str | os.PathLike[str],
    tokens: bool = False,
    tokenizer: str | os.PathLike[str] | None = None,
    add_bos: bool | None = None,
) -> TokenArray:
    """Read ``path`` as a token file (``tokens=True``) or tokenize it as text with ``tokenizer``.

    With neither, a name ending in ``.bin`` or ``.npy`` is read as a token file; anything
    else is an error (a ``ValueError`` saying which flag to give).
    """
    name = os.fsdecode(path)
    if tokens and tokenizer is not None:
        raise ValueError("give either --tokens or --tokenizer, not both")
    require_regular(name)
    if tokenizer is not None:
        exact = exact_tokenizer(tokenizer)  # refuses a tokenizer that is not a regular file
        if exact is not None:
            return tokenize_exact(name, exact, add_bos=add_bos)
        return tokenize_file(name, tokenizer, add_bos=add_bos)
    if tokens or name.lower().endswith(TOKEN_SUFFIXES):
        if add_bos:
            raise ValueError("--add-bos applies to text tokenized with --tokenizer; token files are used as they are")
        return read_tokens(name)
    if not os.path.exists(name):
        raise FileNotFoundError(2, "No such file or directory", name)
    raise ValueError(
        f"{name}: is this a token file or text? Give --tokens (raw int32 or .npy) or --tokenizer PATH/tokenizer.json"
    )
