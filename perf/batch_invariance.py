"""Whether llama.cpp verifies a draft as it decodes one token at a time (batch invariance).

    python -m perf batch-invariance [--model smollm2|gemma3] [--threads 1,2] [--batch 5] [--tokens 96]

Speculative decoding gives exactly the model's greedy output only if the logits of a token
verified in a batch pick the same argmax as when it is decoded alone. For each task prompt of
``perf speedup`` (SmolLM2-135M-Instruct or Gemma 3 270M through llama-cpp-python, ``flash_attn=True``), this
decodes ``--tokens`` greedily one token per forward pass, then feeds the same tokens again in
batches of ``--batch`` and reports the first position whose argmax differs, per thread count.
Where it differs, every drafter (llama-cpp-python's own too) can change the output.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any

from perf._cli import positive_ints


def _argmax(row: Any) -> int:
    return int(row.argmax())


def first_difference(
    eval_tokens: Callable[[list[int]], None],
    logits: Callable[[int], Any],
    n_tokens: Callable[[], int],
    reset: Callable[[], None],
    prompt: Sequence[int],
    n: int,
    batch: int,
) -> int | None:
    """Index of the first of ``n`` greedy tokens after ``prompt`` that batched verification
    predicts differently from one-token decoding; None when all agree.

    ``eval_tokens`` runs a forward pass over new tokens, ``logits(i)`` is the row of position
    ``i``, ``n_tokens()`` the positions evaluated, ``reset()`` forgets them all.
    """
    reset()
    eval_tokens(list(prompt))
    greedy: list[int] = []
    for _ in range(n):
        greedy.append(_argmax(logits(n_tokens() - 1)))
        eval_tokens([greedy[-1]])
    reset()
    eval_tokens(list(prompt))
    if _argmax(logits(n_tokens() - 1)) != greedy[0]:
        return 0
    for i in range(0, n - 1, batch):
        chunk = greedy[i : min(i + batch, n - 1)]
        base = n_tokens()
        eval_tokens(chunk)
        for j in range(len(chunk)):
            if _argmax(logits(base + j)) != greedy[i + j + 1]:
                return i + j + 1
    return None


def check(threads: int, batch: int, n: int, model: str = "smollm2") -> dict[str, int | None]:
    """First differing position per task prompt, for ``model`` (a key of ``perf.speedup.LLAMA_CPP_MODELS``)
    in llama-cpp-python on ``threads`` threads."""
    from llama_cpp import Llama

    from lookupdec.adapters.llama_cpp import no_repack
    from perf.speedup import LLAMA_CPP_MODELS, llama_cpp_task_prompts

    _, find, instruct = LLAMA_CPP_MODELS[model]
    with no_repack(where_amx=True):  # AMX weight buffers crash llama-cpp-python 0.3.36 (adapters/llama_cpp.py)
        llm = Llama(
            model_path=str(find()), n_ctx=4096, n_threads=threads, n_threads_batch=threads, logits_all=True,
            flash_attn=True, verbose=False,
        )  # fmt: skip
    out: dict[str, int | None] = {}
    for name, prompt in llama_cpp_task_prompts(llm, instruct):
        out[name] = first_difference(
            llm.eval, lambda i: llm.scores[i], lambda: int(llm.n_tokens), llm.reset, prompt, n, batch
        )
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Print, per thread count and prompt, whether batched verification agrees with one-token decoding."""
    ap = argparse.ArgumentParser(prog="python -m perf batch-invariance", description=__doc__.split("\n\n")[0])
    from perf.speedup import LLAMA_CPP_MODELS

    ap.add_argument("--model", choices=list(LLAMA_CPP_MODELS), default="smollm2", help="the GGUF (default: smollm2)")
    ap.add_argument("--threads", default="1,2", help="thread counts, comma-separated (default: 1,2)")
    ap.add_argument("--batch", type=int, default=5, help="tokens per verification batch (default: 5, a draft of 4)")
    ap.add_argument("--tokens", type=int, default=96, help="greedy tokens per prompt (default: 96)")
    args = ap.parse_args(argv)
    if args.batch < 2 or args.tokens < 2:
        ap.error("--batch and --tokens must be at least 2")
    try:
        thread_counts = positive_ints(args.threads)
    except argparse.ArgumentTypeError as e:
        ap.error(f"--threads: {e}")
    for threads in thread_counts:
        try:
            found = check(threads, args.batch, args.tokens, args.model)
        except (FileNotFoundError, ImportError) as e:
            print(f"perf batch-invariance: {e}", file=sys.stderr)
            return 2
        for name, at in found.items():
            verdict = "batch-invariant" if at is None else f"differs at generated token {at}"
            print(f"{args.model}  threads {threads}  batch {args.batch}  {name:<10} {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
