"""Write a tiny random-weight llama.cpp model around a real tokenizer, for engine tests.

The tests of lookupdec's llama-cpp-python adapter must run against the real engine (llama.cpp through
``llama_cpp.Llama``) without downloading a model: `write_tiny_llama` takes one of the
vocabulary-only GGUF files that llama.cpp ships for its tokenizer tests (no weights, so llama.cpp can
only tokenize with them) and writes a complete ``llama``-architecture GGUF file with the same
tokenizer and seeded random weights (41 MB for Llama 3, mostly its 128,256-row embeddings). The
model is nonsense, but it is a real model: llama.cpp loads it, tokenizes exactly as with the
vocabulary alone, decodes one or many tokens per batch (what speculative verification needs), and
its greedy output is deterministic for a seed.

Run as a script to write one file: ``python tests/gguf_model.py VOCAB.gguf OUT.gguf``.
"""

from __future__ import annotations

import os
import re
import struct
import sys
from typing import Any

import gguf
import numpy as np
import numpy.typing as npt

__all__ = ["write_tiny_llama"]

# GGUF value types (the GGUF spec's numbering, the same as gguf.GGUFValueType) of fixed size, as
# struct formats and numpy dtypes (little-endian: the only byte order the vocabulary files use).
_SCALAR_FORMATS: dict[int, str] = {
    0: "<B",  # UINT8
    1: "<b",  # INT8
    2: "<H",  # UINT16
    3: "<h",  # INT16
    4: "<I",  # UINT32
    5: "<i",  # INT32
    6: "<f",  # FLOAT32
    7: "<?",  # BOOL
    10: "<Q",  # UINT64
    11: "<q",  # INT64
    12: "<d",  # FLOAT64
}
_STRING = 8
_ARRAY = 9
_TOKEN_TYPE_NORMAL = 1  # llama.cpp's LLAMA_TOKEN_TYPE_NORMAL (gguf.TokenType.NORMAL)
# The greedy output cycles through this many distinct words (see _cycle_output).
_CYCLE_LEN = 16
_CYCLE_GAIN = 2.0
_WORD_POOL = 256


class _KV:
    """One metadata key/value of a GGUF file: its value and GGUF value type (and item type for arrays)."""

    __slots__ = ("sub_type", "value", "vtype")

    def __init__(self, value: Any, vtype: int, sub_type: int | None) -> None:
        self.value = value
        self.vtype = vtype
        self.sub_type = sub_type


def _read_metadata(path: str | os.PathLike[str]) -> dict[str, _KV]:
    """Read the metadata key/values of a GGUF file (strings stay bytes: they are written back unchanged).

    Not gguf.GGUFReader: it makes a numpy view per array element, through a recursive call, which for
    the Llama 3 vocabulary (128,256 token strings and 280,147 merges) takes 5-10 s here; this parse
    takes a fraction of a second and gives the same values (checked against GGUFReader once).
    """
    with open(path, "rb") as f:
        buf = f.read()
    magic, version, _n_tensors, n_kv = struct.unpack_from("<4sIQQ", buf, 0)
    if magic != b"GGUF" or version not in (2, 3):
        raise ValueError(f"{os.fspath(path)!r}: not a little-endian GGUF v2/v3 file")
    pos = 24

    def read_string() -> bytes:
        nonlocal pos
        (n,) = struct.unpack_from("<Q", buf, pos)
        pos += 8 + n
        return buf[pos - n : pos]

    def read_value(vtype: int) -> Any:
        nonlocal pos
        if vtype == _STRING:
            return read_string()
        fmt = _SCALAR_FORMATS.get(vtype)
        if fmt is None:
            raise ValueError(f"{os.fspath(path)!r}: unsupported GGUF value type {vtype}")
        (v,) = struct.unpack_from(fmt, buf, pos)
        pos += struct.calcsize(fmt)
        return v

    out: dict[str, _KV] = {}
    for _ in range(n_kv):
        key = read_string().decode("utf-8")
        (vtype,) = struct.unpack_from("<I", buf, pos)
        pos += 4
        if vtype != _ARRAY:
            out[key] = _KV(read_value(vtype), vtype, None)
            continue
        item_type, count = struct.unpack_from("<IQ", buf, pos)
        pos += 12
        fmt = _SCALAR_FORMATS.get(item_type)
        if fmt is not None:
            # Fixed-size items: one numpy read instead of one struct call per item.
            dtype = np.dtype(fmt)
            items = np.frombuffer(buf, dtype=dtype, count=count, offset=pos).tolist()
            pos += dtype.itemsize * count
        elif item_type == _STRING:
            items = [read_string() for _ in range(count)]
        else:
            # Arrays of arrays: in the GGUF spec, but in no tokenizer.
            raise ValueError(f"{os.fspath(path)!r}: {key}: unsupported GGUF array item type {item_type}")
        out[key] = _KV(items, vtype, item_type)
    return out


def _normal(rng: np.random.Generator, shape: tuple[int, ...], std: float) -> npt.NDArray[np.float32]:
    a = rng.standard_normal(shape, dtype=np.float32)
    a *= np.float32(std)
    return a


def _cycle_words(rng: np.random.Generator, meta: dict[str, _KV]) -> npt.NDArray[np.int64]:
    """Pick `_CYCLE_LEN` distinct common word tokens (a space, then 4-8 lowercase ASCII letters), in random order."""
    tokens: list[bytes] = meta["tokenizer.ggml.tokens"].value
    token_type = meta.get("tokenizer.ggml.token_type")
    types: list[int] = [_TOKEN_TYPE_NORMAL] * len(tokens) if token_type is None else token_type.value
    # The space is "\u0120" in byte-level BPE vocabularies (GPT-2's byte-to-unicode map) and "\u2581"
    # in SentencePiece ones. Whole words keep the generated text plain ASCII: no control tokens and
    # no byte tokens or pieces of a UTF-8 character, whose detokenized text depends on neighbours.
    word = re.compile("(\u0120|\u2581)[a-z]{4,8}".encode())
    ids = [
        i for i, (t, y) in enumerate(zip(tokens, types, strict=True)) if y == _TOKEN_TYPE_NORMAL and word.fullmatch(t)
    ]
    if len(ids) < _CYCLE_LEN:
        # Some other tokenizer: any normal tokens will do.
        ids = [i for i, y in enumerate(types) if y == _TOKEN_TYPE_NORMAL]
    if len(ids) < _CYCLE_LEN:
        raise ValueError(f"the vocabulary has fewer than {_CYCLE_LEN} normal tokens")
    # Only the lowest ids: BPE merges and SentencePiece pieces are numbered about by frequency, so
    # these are common words ("that", "with", "return", ...), which keeps test logs readable, rather
    # than any of the 10,000-20,000 rarer word tokens (fragments, names, profanity).
    return rng.choice(np.asarray(ids[:_WORD_POOL], dtype=np.int64), size=_CYCLE_LEN, replace=False)


def _cycle_output(
    rng: np.random.Generator, embd: npt.NDArray[np.float32], meta: dict[str, _KV]
) -> npt.NDArray[np.float32]:
    """The output projection: after word k of the cycle comes word k+1 (and after the last, the first).

    Row ``w[k+1]`` is ``_CYCLE_GAIN`` times the unit vector of ``embd[w[k]]``, every other row is zero.
    The final RMS norm makes the hidden state a vector of length sqrt(n_embd) (8 for n_embd = 64)
    close to the current token's embedding, so after ``w[k]`` the logit of ``w[k+1]`` is about
    8 * _CYCLE_GAIN = 16, the other words' are cos * 16 with cos ~ N(0, 1/n_embd), and every other
    token's is exactly 0. After a token outside the cycle the best-aligned word wins (one of 16
    random cosines, all but surely positive), so a greedy continuation enters the cycle at once.

    Why a cycle rather than all-random rows: random rows give a random next-token map with ties
    within float rounding now and then (one-token and many-token decode could then disagree), and
    a prompt-lookup drafter would never be right; with the cycle, greedy output is never EOS (or
    any control token: their logits are 0), has 16 distinct words, repeats after 16 tokens (drafts
    from the generated text get accepted, drafts from the prompt rejected), and wins by a margin of
    ~10 logits, which float16 weights and any batch shape keep.
    """
    words = _cycle_words(rng, meta)
    output = np.zeros_like(embd)
    unit = embd[words] / np.linalg.norm(embd[words], axis=1, keepdims=True)
    output[np.roll(words, -1)] = _CYCLE_GAIN * unit
    return output


def write_tiny_llama(
    vocab_path: str | os.PathLike[str],
    out_path: str | os.PathLike[str],
    *,
    seed: int = 0,
    n_embd: int = 64,
    n_layer: int = 2,
    n_head: int = 4,
    n_head_kv: int = 2,
    n_ff: int = 128,
    n_ctx_train: int = 2048,
) -> None:
    """Write a ``llama`` GGUF model with seeded random weights and the tokenizer of `vocab_path`.

    `vocab_path` is a GGUF file with ``tokenizer.*`` metadata (e.g. llama.cpp's vocabulary-only
    ``ggml-vocab-llama-bpe.gguf``); every ``tokenizer.*`` key is copied with its value type, so
    llama.cpp tokenizes with the new file exactly as with that one. The weights have the standard
    llama shapes (grouped-query attention when `n_head_kv` < `n_head`) and come from ``numpy``'s
    generator seeded with `seed`: the same arguments write the same bytes. The two vocabulary-sized
    matrices are float16 (half the file: 41 MB for Llama 3's 128,256 ids at n_embd = 64), the rest
    float32.

    Greedy decoding cycles through 16 distinct word tokens and never produces a control token such
    as EOS (see `_cycle_output`): generations run to ``max_tokens`` and read as plain ASCII words.
    """
    if n_embd % n_head != 0 or n_head % n_head_kv != 0:
        raise ValueError("n_embd must be a multiple of n_head, and n_head of n_head_kv")
    meta = _read_metadata(vocab_path)
    tokens = meta.get("tokenizer.ggml.tokens")
    if tokens is None:
        raise ValueError(f"{os.fspath(vocab_path)!r} has no tokenizer.ggml.tokens")
    n_vocab = len(tokens.value)
    head_dim = n_embd // n_head

    writer = gguf.GGUFWriter(out_path, "llama")  # writes general.architecture = "llama"
    writer.add_name("lookupdec-tiny-llama")
    writer.add_context_length(n_ctx_train)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head_kv)
    writer.add_rope_dimension_count(head_dim)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(n_vocab)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    for key, kv in meta.items():
        if key.startswith("tokenizer."):
            sub_type = None if kv.sub_type is None else gguf.GGUFValueType(kv.sub_type)
            writer.add_key_value(key, kv.value, gguf.GGUFValueType(kv.vtype), sub_type=sub_type)

    rng = np.random.default_rng(seed)
    # numpy shapes are (rows, columns); GGUF stores dimensions innermost first, so llama.cpp's
    # {n_embd, n_vocab} token_embd is a (n_vocab, n_embd) array here, and each projection is
    # (outputs, inputs). The residual stream stays mostly the current token's embedding (std 1):
    # the blocks add small mixes of the context (std 0.02-0.1 weights, unit RMS-norm gains), which
    # the output projection below ignores unless it decides between near ties.
    embd = _normal(rng, (n_vocab, n_embd), 1.0)
    writer.add_tensor("token_embd.weight", embd.astype(np.float16))
    for i in range(n_layer):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(n_embd, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.attn_q.weight", _normal(rng, (n_head * head_dim, n_embd), 0.1))
        writer.add_tensor(f"blk.{i}.attn_k.weight", _normal(rng, (n_head_kv * head_dim, n_embd), 0.1))
        writer.add_tensor(f"blk.{i}.attn_v.weight", _normal(rng, (n_head_kv * head_dim, n_embd), 0.1))
        writer.add_tensor(f"blk.{i}.attn_output.weight", _normal(rng, (n_embd, n_head * head_dim), 0.02))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(n_embd, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", _normal(rng, (n_ff, n_embd), 0.1))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", _normal(rng, (n_ff, n_embd), 0.1))
        writer.add_tensor(f"blk.{i}.ffn_down.weight", _normal(rng, (n_embd, n_ff), 0.02))
    writer.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    writer.add_tensor("output.weight", _cycle_output(rng, embd, meta).astype(np.float16))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def main(argv: list[str] | None = None) -> int:
    """Write the tiny model: ``gguf_model.py VOCAB.gguf OUT.gguf``."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python tests/gguf_model.py VOCAB.gguf OUT.gguf", file=sys.stderr)
        return 2
    write_tiny_llama(args[0], args[1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
