"""Single-thread tokenization (MB/s) per vocabulary on English and code, against tiktoken in the same run.

    python -m perf.bench_tokenize [--mb 4] [--vocab llama-bpe ...] [--repeat 5]

The per-core goal: ``Tokenizer.encode`` with the Llama 3 GGUF at least 1.0x tiktoken's
``encode_ordinary`` (Llama 3 ranks, same text, one thread). Texts: English is the start of
shared/data/enwiki_wt.10M.txt; code is C: the ``*.h`` files under /usr/include in sorted path
order, concatenated (the C and C++ headers of this machine; files that are not UTF-8 are
skipped; Python's standard library sources if there is no /usr/include).

Each round times ``Tokenizer.encode`` on the whole text (one call, one thread, piece caches
emptied first: every round starts cold, as a new process does) and tiktoken's
``encode_ordinary`` on the same text, alternating which goes first. The ratio is taken per
round (tiktoken's time over ours) and its median printed with the medians of both MB/s. The
tiktoken column repeats for every vocabulary: it is the anchor, always the Llama 3 ranks.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import sysconfig
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
VOCABS = ["llama-bpe", "qwen2", "deepseek-coder", "gpt-2", "llama-spm", "phi-3"]
INCLUDE = Path("/usr/include")


def english(n_bytes: int) -> str:
    """The first ``n_bytes`` of shared/data's English (WikiText-style Wikipedia)."""
    raw = (SHARED / "enwiki_wt.10M.txt").read_bytes()[:n_bytes]
    return raw.decode("utf-8", errors="ignore")


def code(n_bytes: int) -> str:
    """About ``n_bytes`` of C: /usr/include's ``*.h`` files (sorted, UTF-8 only), else Python's stdlib sources."""
    files = sorted(INCLUDE.rglob("*.h")) if INCLUDE.is_dir() else []
    if not files:
        files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
    parts: list[str] = []
    size = 0
    for path in files:
        try:
            raw = path.read_bytes()
            text = raw.decode("utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        parts.append(text)
        size += len(raw)
        if size >= n_bytes:
            break
    return "".join(parts)


def clear_caches(tok: object) -> None:
    """Empty the per-model piece caches (split+tiktoken, tokenizers engine, SentencePiece segments)."""
    for engine, attr in (("_bpe", "_pieces"), ("_bpe", "_seen"), ("_spm", "_cache")):
        cache = getattr(getattr(tok, engine, None), attr, None)
        if cache is not None:
            cache.clear()  # a dict, or split+tiktoken's PieceCache


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=float, default=4.0, help="MB of each text (default 4)")
    ap.add_argument("--vocab", nargs="*", default=VOCABS)
    ap.add_argument("--repeat", type=int, default=5, help="rounds (default 5)")
    args = ap.parse_args()
    from lookupdec.tokenizer import load_tokenizer

    base = load_tokenizer(SHARED / "vocab" / "ggml-vocab-llama-bpe.gguf")
    assert base._bpe is not None
    tiktoken_enc = base._bpe._tiktoken
    n = int(args.mb * 1e6)
    texts = {"english": english(n), "code": code(n)}
    print(f"{'vocabulary':<16} {'text':<8} {'engine':<15} {'MB/s':>7} {'tiktoken MB/s':>14} {'ratio':>6}")
    for name in args.vocab:
        tok = load_tokenizer(SHARED / "vocab" / f"ggml-vocab-{name}.gguf")
        for kind, text in texts.items():
            size = len(text.encode("utf-8")) / 1e6
            ours: list[float] = []
            theirs: list[float] = []
            for r in range(args.repeat):
                for which in (0, 1) if r % 2 == 0 else (1, 0):  # alternate who goes first
                    if which == 0:
                        clear_caches(tok)  # every round starts cold: the piece caches would serve repeats
                        t0 = time.perf_counter()
                        tok.encode(text)
                        ours.append(time.perf_counter() - t0)
                    else:
                        t0 = time.perf_counter()
                        tiktoken_enc.encode_ordinary(text)
                        theirs.append(time.perf_counter() - t0)
            ratio = statistics.median(b / a for a, b in zip(ours, theirs, strict=True))
            print(
                f"{name:<16} {kind:<8} {tok.engine:<15} {size / statistics.median(ours):7.2f} "
                f"{size / statistics.median(theirs):14.2f} {ratio:5.2f}x"
            )
            sys.stdout.flush()
    print("ratio: tiktoken encode_ordinary time / Tokenizer.encode time, median of the rounds (goal >= 1.0x)")


if __name__ == "__main__":
    main()
