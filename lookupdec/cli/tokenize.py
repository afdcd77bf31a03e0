"""``lookupdec tokenize``: a text file to raw int32 ids with a model's vocabulary, as llama.cpp tokenizes."""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

from lookupdec.cli._common import EXIT_OK, add_command, check_workers, mb, want_progress
from lookupdec.cli._pipeline import progress_bar, require_file
from lookupdec.errors import UsageError


def cmd_tokenize(args: argparse.Namespace) -> int:
    """``lookupdec tokenize``: a text file to raw int32 ids with a model's vocabulary (llama.cpp's ids)."""
    from lookupdec._atomic import atomic_writer, check_output_path
    from lookupdec.tokenizer.stream import iter_file_ids, write_ids
    from lookupdec.tokens import exact_tokenizer

    require_file(args.text, "text file")
    require_file(args.tokenizer, "vocabulary, --tokenizer")
    # before the work: writing over the text or the vocabulary would destroy it
    check_output_path(args.output, [args.text, args.tokenizer])
    check_workers(args.workers)
    t0 = time.perf_counter()
    tok = exact_tokenizer(args.tokenizer)
    if tok is None:
        raise UsageError(f"{args.tokenizer}: not a vocabulary lookupdec tokenizes exactly (give a .gguf)")
    t_load = time.perf_counter() - t0
    t0 = time.perf_counter()
    with progress_bar(want_progress(args), "tokenize") as progress, atomic_writer(args.output) as f:
        parts = iter_file_ids(
            args.text,
            tok,
            add_special=args.add_special,
            parse_special=args.parse_special,
            workers=args.workers,
            progress=progress,
        )
        n = write_ids(parts, f)
    t_encode = time.perf_counter() - t0
    if not args.quiet:
        size = os.path.getsize(args.text)
        print(
            f"{args.output}: {n:,} tokens from {mb(size)} of text in {t_encode:.2f} s "
            f"({size / 1e6 / max(t_encode, 1e-9):.1f} MB/s; vocabulary {tok.n_vocab:,} ids, engine {tok.engine}, "
            f"loaded in {t_load:.2f} s)"
        )
    return EXIT_OK


def add_parser(sub: Any) -> None:
    """Add ``tokenize`` and its options to the subparsers ``sub``."""
    p = add_command(
        sub,
        "tokenize",
        summary="tokenize a text file with a model's vocabulary, as llama.cpp does (GGUF)",
        description="Tokenize a UTF-8 text file as one text with a model's own vocabulary and write the ids as "
        "raw little-endian int32 (the token file format create and stats read). The ids are llama.cpp's "
        "(llama_tokenize with add_special and parse_special on, as llama-lookup-create and -stats use): "
        "BOS when the vocabulary asks for it, special-token text such as <|begin_of_text|> read as the "
        "special token. VOCAB is a .gguf file (vocabulary-only or a full model; only its header is read) "
        "or a byte-level BPE tokenizer.json of a type llama.cpp knows. Large files are streamed in bounded "
        "memory and encoded on every core; the ids equal those of encoding the whole file at once.",
        examples="""
            lookupdec tokenize wiki.test.raw --tokenizer ggml-vocab-llama-bpe.gguf -o wiki.test.llama3.bin
            lookupdec tokenize corpus.txt --tokenizer Meta-Llama-3-8B.Q4_K_M.gguf -o corpus.bin --workers 4
            lookupdec tokenize prompt.txt --tokenizer qwen2.gguf -o p.bin --no-add-special --no-parse-special
            """,
        func=cmd_tokenize,
    )
    p.add_argument("text", metavar="TEXT_FILE", help="UTF-8 text, tokenized as one text (one BOS)")
    p.add_argument("--tokenizer", required=True, metavar="VOCAB", help="the model's .gguf (or a tokenizer.json)")
    p.add_argument("-o", "--output", required=True, metavar="OUT", help="the token file to write (raw int32)")
    p.add_argument(
        "--no-add-special", dest="add_special", action="store_false",
        help="add no BOS/EOS (llama.cpp's add_special=false); by default the vocabulary's add_bos/add_eos decide",
    )  # fmt: skip
    p.add_argument(
        "--no-parse-special", dest="parse_special", action="store_false",
        help="keep control-token text such as <|begin_of_text|> as plain text (parse_special=false)",
    )  # fmt: skip
    p.add_argument("--workers", type=int, metavar="N", help="processes encoding in parallel (default: every CPU)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar and no summary line")
