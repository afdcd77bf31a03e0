"""Drafting (spec sections 3, 4, 5 and 9), written to be read beside the spec.

Deliberate choices, each one the spec's "lookupdec rule":
- followers are visited in ascending token id and a later one replaces the best only on a
  strictly greater score, so among equal scores the smallest token id wins (spec 4);
- the weight ``100 * static_count`` and the products ``count * weight`` wrap around like
  llama.cpp's int32 arithmetic (spec 5);
- an n-gram that would start before position 0 is skipped (spec 9).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from lookupdec.reference.cache import NGRAM_MAX, NGRAM_MIN, NGRAM_STATIC, TOKEN_NULL, Key, check_ngram_range

# Thresholds by index i = n - ngram_min (spec 3.1): minimum number of observations and the
# minimum percent share of the selected token. LAX for the context cache, STRICT for dynamic.
LAX_MIN_SAMPLE: tuple[int, ...] = (2, 2, 1, 1)
LAX_MIN_PERCENT: tuple[int, ...] = (66, 50, 50, 50)
STRICT_MIN_SAMPLE: tuple[int, ...] = (4, 3, 2, 2)
STRICT_MIN_PERCENT: tuple[int, ...] = (75, 66, 66, 66)


class PartSource(Protocol):
    """Anything that answers "the followers of this padded key" (a cache or a static index)."""

    def part(self, key: Key, /) -> Mapping[int, int] | None:
        """The followers of ``key`` or None."""


def wrap_int32(x: int) -> int:
    """``x`` as a two's-complement int32 would hold it (what g++ -O2 does on overflow)."""
    return ((x + 2**31) % 2**32) - 2**31


def _key(seq: Sequence[int], start: int, end: int) -> Key:
    slots = list(seq[start:end]) + [TOKEN_NULL] * (NGRAM_MAX - (end - start))
    return (slots[0], slots[1], slots[2], slots[3])


def try_primary(
    cache: PartSource,
    seq: Sequence[int],
    length: int,
    ngram_min: int,
    ngram_max: int,
    min_sample: tuple[int, ...],
    min_percent: tuple[int, ...],
    part_static: Mapping[int, int],
) -> int:
    """The token the context or dynamic cache proposes after ``seq[:length]``, or -1 (spec 3.1)."""
    for i in range(ngram_max - ngram_min, -1, -1):  # longest n-gram first
        n = ngram_min + i
        if length - n < 0:  # spec 9: the n-gram would start before position 0
            continue
        part = cache.part(_key(seq, length - n, length))
        if not part:
            continue
        best_token, best_count, best_weight = TOKEN_NULL, 0, 0
        total = 0
        for token in sorted(part):  # ascending token id: the smallest id wins a tie
            count = part[token]
            static_count = part_static.get(token)
            weight = wrap_int32(100 * static_count) if static_count is not None else 1
            if wrap_int32(count * weight) > wrap_int32(best_count * best_weight):
                best_token, best_count, best_weight = token, count, weight
            total += count
        # Both thresholds look at raw counts, whatever the weighting selected.
        if total < min_sample[i]:
            continue
        if 100 * best_count < min_percent[i] * total:
            continue
        return best_token
    return TOKEN_NULL


def try_static(part_static: Mapping[int, int]) -> int:
    """The token the static cache alone proposes, or -1 (spec 3.2)."""
    if not part_static:
        return TOKEN_NULL
    max_token, max_count, total = TOKEN_NULL, 0, 0
    for token in sorted(part_static):
        count = part_static[token]
        if count > max_count:
            max_token, max_count = token, count
        total += count
    i = NGRAM_STATIC - 1  # the LAX thresholds of a 2-gram: at least 2 observations, 50 %
    if total < LAX_MIN_SAMPLE[i]:
        return TOKEN_NULL
    if 100 * max_count < LAX_MIN_PERCENT[i] * total:
        return TOKEN_NULL
    return max_token


def draft(
    inp: Sequence[int],
    draft: list[int],
    n_draft: int,
    ngram_min: int,
    ngram_max: int,
    nc_context: PartSource,
    nc_dynamic: PartSource,
    nc_static: PartSource,
) -> None:
    """Append up to ``n_draft`` drafted tokens to ``draft`` (llama.cpp's ``common_ngram_cache_draft``).

    ``draft`` must hold exactly one token, the last sampled one, which the caller has
    also appended to ``inp``; it is never read. Drafting stops at the first position
    where neither the context, the dynamic nor the static cache proposes a token.
    """
    if len(draft) != 1:
        raise ValueError(f"draft must hold exactly the last sampled token, got {len(draft)} tokens")
    check_ngram_range(ngram_min, ngram_max)
    if len(inp) < 2:
        return
    seq = list(inp)  # the combined sequence: inp, then draft[1:] as it grows
    while len(draft) - 1 < n_draft:
        length = len(seq)
        part_static = nc_static.part((seq[length - 2], seq[length - 1], TOKEN_NULL, TOKEN_NULL)) or {}
        token = try_primary(nc_context, seq, length, ngram_min, ngram_max, LAX_MIN_SAMPLE, LAX_MIN_PERCENT, part_static)
        if token == TOKEN_NULL:
            token = try_primary(
                nc_dynamic, seq, length, ngram_min, ngram_max, STRICT_MIN_SAMPLE, STRICT_MIN_PERCENT, part_static
            )
        if token == TOKEN_NULL:
            token = try_static(part_static)
        if token == TOKEN_NULL:
            return
        draft.append(token)
        seq.append(token)


__all__ = ["NGRAM_MAX", "NGRAM_MIN", "draft", "try_primary", "try_static", "wrap_int32"]
