"""llama.cpp's SentencePiece (``tokenizer.ggml.model = llama``) segmentation, id for id.

This is ``llm_tokenizer_spm_session::tokenize`` of llama.cpp's ``src/llama-vocab.cpp``,
transcribed: the text (spaces already escaped to U+2581) starts as one symbol per character;
every adjacent pair whose concatenation is a vocabulary entry is a candidate, and the candidate
with the highest score (ties: the leftmost) is merged, repeatedly; each final symbol is its own
token, or else one ``<0xNN>`` byte token per UTF-8 byte (byte fallback).

Neither the Hugging Face ``tokenizers`` BPE model (merge ranks, not piece scores) nor
``sentencepiece`` (a different normalizer and its own treatment of leading spaces) reproduces
this, so it runs here in Python: the slow path (~0.3-1 MB/s per process), parallel over chunks.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence


class SpmModel:
    """The SentencePiece vocabulary as llama.cpp uses it: text to id, per-id score, byte tokens."""

    def __init__(self, tokens: Sequence[str], scores: Sequence[float], byte_ids: dict[int, int]) -> None:
        self.token_to_id: dict[str, int] = {}
        for i, text in enumerate(tokens):
            # llama.cpp's token_to_id map keeps the last id of a duplicated text.
            self.token_to_id[text] = i
        self.scores = [float(s) for s in scores]
        self.byte_ids = byte_ids
        # The longest token in characters: no merge can produce a longer symbol.
        self.max_len = max((len(t) for t in tokens), default=1)

    def encode(self, text: str, out: list[int]) -> None:
        """Append the ids of one raw fragment (already escaped, prefix space already added)."""
        n = len(text)
        if n == 0:
            return
        token_to_id = self.token_to_id
        scores = self.scores
        # Symbols as [start, end) character spans in a doubly linked list (llama.cpp's llm_symbol).
        start = list(range(n))
        end = list(range(1, n + 1))
        prev = list(range(-1, n - 1))
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        heap: list[tuple[float, int, int, int]] = []
        push = heapq.heappush
        # llama.cpp's queue pops the highest score, then the smallest left index: the heap keys
        # are (-score, left). ``size`` (in characters here, bytes there: the same test, since a
        # symbol's text is fixed by its span) detects stale entries.
        for i in range(n - 1):
            tid = token_to_id.get(text[i : i + 2])
            if tid is not None:
                push(heap, (-scores[tid], i, i + 1, 2))
        pop = heapq.heappop
        while heap:
            _, left, right, size = pop(heap)
            if end[left] - start[left] == 0 or end[right] - start[right] == 0:
                continue
            if end[right] - start[left] != size or nxt[left] != right:
                continue
            # merge the right symbol into the left one
            end[left] = end[right]
            start[right] = end[right]  # n = 0
            nr = nxt[right]
            nxt[left] = nr
            if nr >= 0:
                prev[nr] = left
            pl = prev[left]
            if pl >= 0:
                tid = token_to_id.get(text[start[pl] : end[left]])
                if tid is not None:
                    push(heap, (-scores[tid], pl, left, end[left] - start[pl]))
            if nr >= 0:
                tid = token_to_id.get(text[start[left] : end[nr]])
                if tid is not None:
                    push(heap, (-scores[tid], left, nr, end[nr] - start[left]))
        append = out.append
        byte_ids = self.byte_ids
        i = 0
        while i != -1:
            piece = text[start[i] : end[i]]
            tid = token_to_id.get(piece)
            if tid is not None:
                append(tid)
            else:
                # resegment(): a symbol that is not a token was never merged (merged symbols are
                # tokens by construction), so llama.cpp's rev_merge lookup finds nothing and
                # every UTF-8 byte becomes its <0xNN> token (skipped when the vocabulary has none,
                # as byte_to_token would abort there: llama.cpp requires the byte tokens).
                for b in piece.encode("utf-8", errors="surrogateescape"):
                    bid = byte_ids.get(b)
                    if bid is None:
                        raise ValueError(f"the vocabulary has no byte token <0x{b:02X}> for byte fallback")
                    append(bid)
            i = nxt[i]
