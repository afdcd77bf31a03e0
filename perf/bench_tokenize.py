"""Tokenization throughput (MB/s) per vocabulary on English and code, with tiktoken's baseline in the same run.

    python -m perf.bench_tokenize [--mb 4] [--vocab llama-bpe ...] [--repeat 3]

English: the start of shared/data/enwiki_wt.10M.txt; code: Python standard library sources
(the running interpreter's), concatenated. Piece caches are emptied before every run. For each
vocabulary it times
``Tokenizer.encode`` (one process, one thread) and, interleaved with it, tiktoken's
``encode_ordinary`` on the Llama 3 ranks (the single-thread anchor of the issue); medians are
printed. The whole-process parallel figure is measured with the CLI (docs/performance.md).
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


def english(n_bytes: int) -> str:
    raw = (SHARED / "enwiki_wt.10M.txt").read_bytes()[:n_bytes]
    return raw.decode("utf-8", errors="ignore")


def code(n_bytes: int) -> str:
    parts: list[str] = []
    size = 0
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        text = path.read_text(encoding="utf-8", errors="ignore")
        parts.append(text)
        size += len(text.encode("utf-8"))
        if size >= n_bytes:
            break
    return "".join(parts)


def clear_caches(tok: object) -> None:
    """Empty the per-model piece caches (tokenizers engine, SentencePiece segments)."""
    for engine, attr in (("_bpe", "_pieces"), ("_spm", "_cache")):
        cache = getattr(getattr(tok, engine, None), attr, None)
        if isinstance(cache, dict):
            cache.clear()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=float, default=2.0, help="MB of each text")
    ap.add_argument("--vocab", nargs="*", default=VOCABS)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    from lookupdec.tokenizer import load_tokenizer

    base = load_tokenizer(SHARED / "vocab" / "ggml-vocab-llama-bpe.gguf")
    tiktoken_enc = base._bpe._tiktoken if base._bpe is not None else None
    n = int(args.mb * 1e6)
    texts = {"english": english(n), "code": code(n)}
    print(f"{'vocabulary':<16} {'text':<8} {'engine':<11} {'MB/s':>7} {'tiktoken MB/s':>14}")
    for name in args.vocab:
        tok = load_tokenizer(SHARED / "vocab" / f"ggml-vocab-{name}.gguf")
        for kind, full in texts.items():
            text = full
            size = len(text.encode("utf-8")) / 1e6
            ours: list[float] = []
            theirs: list[float] = []
            for _ in range(args.repeat):
                clear_caches(tok)  # every run starts cold: the piece caches would serve repeats
                t0 = time.perf_counter()
                tok.encode(text)
                ours.append(size / (time.perf_counter() - t0))
                if tiktoken_enc is not None:
                    t0 = time.perf_counter()
                    tiktoken_enc.encode_ordinary(text)
                    theirs.append(size / (time.perf_counter() - t0))
            base_mbs = statistics.median(theirs) if theirs else float("nan")
            print(f"{name:<16} {kind:<8} {tok.engine:<11} {statistics.median(ours):7.2f} {base_mbs:14.2f}")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
