"""llama.cpp's SentencePiece (``tokenizer.ggml.model = llama``) segmentation, id for id.

This is ``llm_tokenizer_spm_session::tokenize`` of llama.cpp's ``src/llama-vocab.cpp``,
transcribed: the text (spaces already escaped to U+2581) starts as one symbol per character;
every adjacent pair whose concatenation is a vocabulary entry is a candidate, and the candidate
with the highest score (ties: the leftmost) is merged, repeatedly; each final symbol is its own
token, or else one ``<0xNN>`` byte token per UTF-8 byte (byte fallback).

Neither the Hugging Face ``tokenizers`` BPE model (merge ranks, not piece scores) nor
``sentencepiece`` (a different normalizer and its own treatment of leading spaces) reproduces
this, so it runs here in Python: the slow path, parallel over chunks.
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Sequence

_INNER_SPACE = re.compile("[^\u2581]\u2581")
_SEGMENT = re.compile("\u2581*[^\u2581]+|\u2581+")
_CACHE_MAX = 1 << 20


class SpmModel:
    """The SentencePiece vocabulary as llama.cpp uses it: text to id, per-id score, byte tokens."""

    def __init__(self, tokens: Sequence[str], scores: Sequence[float], byte_ids: dict[int, int]) -> None:
        self.token_to_id: dict[str, int] = {}
        for i, text in enumerate(tokens):
            # llama.cpp's token_to_id map keeps the last id of a duplicated text.
            self.token_to_id[text] = i
        # The heap holds plain ints (a tuple compare costs more): the dense rank of the
        # token's score (0 = highest; equal scores, equal rank) first, then the left index,
        # then the merged size, packed as ((rank * SHIFT) + left) * SIZE + size.
        distinct = sorted({float(s) for s in scores}, reverse=True)
        rank_of = {score: r for r, score in enumerate(distinct)}
        self.rank = [rank_of[float(s)] for s in scores]
        self.byte_ids = byte_ids
        self.size_mult = max((len(t) for t in tokens), default=1) + 1
        # When no token has a U+2581 right after another character (true of Llama 2 and Phi-3:
        # SentencePiece splits at whitespace when it trains), no merge can join a symbol ending
        # in a non-space to a following U+2581, so the text falls into independent segments
        # ("▁▁word"): each is merged as it would be in the whole text (the queue handles the
        # segments' merges in their own order), and repeated segments come from a cache.
        self.segmented = not any(_INNER_SPACE.search(t) for t in tokens)
        self._cache: dict[str, list[int]] = {}

    def encode(self, text: str, out: list[int]) -> None:
        """Append the ids of one raw fragment (already escaped, prefix space already added)."""
        if not self.segmented:
            self._merge(text, out)
            return
        cache = self._cache
        if len(cache) > _CACHE_MAX:
            cache.clear()
        for seg in _SEGMENT.findall(text):
            ids = cache.get(seg)
            if ids is None:
                ids = []
                self._merge(seg, ids)
                cache[seg] = ids
            out.extend(ids)

    def _merge(self, text: str, out: list[int]) -> None:
        """llama.cpp's bigram merge loop and resegment on ``text``."""
        n = len(text)
        if n == 0:
            return
        token_to_id = self.token_to_id
        rank = self.rank
        size_mult = self.size_mult
        shift = (n + 1) * size_mult  # rank * shift + left * size_mult + size: ordered as llama.cpp's queue
        # Symbols as [start, end) character spans in a doubly linked list (llama.cpp's llm_symbol).
        start = list(range(n))
        end = list(range(1, n + 1))
        prev = list(range(-1, n - 1))
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        # llama.cpp's queue pops the highest score, then the smallest left index. The right
        # symbol is not stored: it is nxt[left] at pop time, and the size check rejects the
        # entry exactly when llama.cpp's (left.n == 0 || right.n == 0 || left.n + right.n !=
        # size) would (a symbol's text is fixed by its span, so characters count as bytes do).
        heap: list[int] = []
        get = token_to_id.get
        for i in range(n - 1):
            tid = get(text[i : i + 2])
            if tid is not None:
                heap.append(rank[tid] * shift + i * size_mult + 2)
        heapq.heapify(heap)  # same pops as pushing one by one: the keys are distinct
        pop = heapq.heappop
        push = heapq.heappush
        while heap:
            key = pop(heap)
            rest = key % shift
            left, size = divmod(rest, size_mult)
            if end[left] == start[left]:
                continue
            right = nxt[left]
            if right < 0 or end[right] - start[left] != size:
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
                tid = get(text[start[pl] : end[left]])
                if tid is not None:
                    push(heap, rank[tid] * shift + pl * size_mult + end[left] - start[pl])
            if nr >= 0:
                tid = get(text[start[left] : end[nr]])
                if tid is not None:
                    push(heap, rank[tid] * shift + left * size_mult + end[nr] - start[left])
        append = out.append
        byte_ids = self.byte_ids
        i = 0
        while i != -1:
            piece = text[start[i] : end[i]]
            tid = get(piece)
            if tid is not None:
                append(tid)
            else:
                # resegment(): a symbol that is not a token was never merged (merged symbols are
                # tokens by construction), so llama.cpp's rev_merge lookup finds nothing and
                # every UTF-8 byte becomes its <0xNN> token.
                for b in piece.encode("utf-8", errors="surrogateescape"):
                    bid = byte_ids.get(b)
                    if bid is None:
                        raise ValueError(f"the vocabulary has no byte token <0x{b:02X}> for byte fallback")
                    append(bid)
            i = nxt[i]
