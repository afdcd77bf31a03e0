"""The static source drafting reads followers through: a fast cache, a mapped index, or any ``part(key)``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from mypy_extensions import i32, i64

from lookupdec.fast._tables import NULL32, TOKEN_NULL, low32

# Returned by StaticSource._st_count for "this follower is not in the static part"; no real
# count can be this (counts are int32 in files and > 0 in caches).
ABSENT: Final[i64] = -(2**62)
# The static-only draft (spec 3.2) takes the LAX thresholds of a 2-gram, as the reference's
# try_static reads them: LAX_MIN_SAMPLE[NGRAM_STATIC - 1] and LAX_MIN_PERCENT[NGRAM_STATIC - 1].
# Written as literals because mypyc puts a Final native-int literal straight into the C
# expression, where a vec index is a load and a bounds check. tests/test_semantics.py checks
# every threshold at its boundary, in both implementations.
STATIC_MIN_SAMPLE: Final[i64] = 2
STATIC_MIN_PERCENT: Final[i64] = 50


class StaticSource:
    """What drafting needs from a static cache: per drafted position, the part of the last two
    tokens (``_st_begin``), then the count of a follower in it (``_st_count``) and the static-only
    draft (``_st_pick``). Implemented by :class:`NgramCache` and ``StaticIndex``.
    """

    def _st_begin(self, a: i32, b: i32) -> bool:
        """Select the part of the 2-gram (a, b); True when it has followers."""
        return False

    def _st_count(self, tok: i32) -> i64:
        """Count of ``tok`` in the selected part, :data:`ABSENT` when it is not a follower."""
        return ABSENT

    def _st_pick(self) -> i32:
        """The static-only draft of the selected part (spec 3.2), -1 if none."""
        return NULL32


class PartAdapter(StaticSource):
    """Any object with the reference's ``part(key) -> Mapping | None`` used as a static source.

    Lets ``draft``/``replay`` keep their native loops with a static cache of a foreign type
    (a reference NgramCache, a fork v1 file opened by ``lookupdec.formats.ForkStatic``);
    each lookup is then a Python call and dict reads instead of native array reads.
    """

    def __init__(self, source: Any) -> None:
        self.source = source
        self.cur: Mapping[int, int] = {}

    def _st_begin(self, a: i32, b: i32) -> bool:
        part = self.source.part((int(a), int(b), TOKEN_NULL, TOKEN_NULL))
        self.cur = part if part else {}
        return len(self.cur) > 0

    def _st_count(self, tok: i32) -> i64:
        c = self.cur.get(int(tok))
        if c is None:
            return ABSENT
        # Only the low 32 bits matter to the int32 weight (spec 5); masking the Python int
        # first keeps huge counts (unbounded in the reference) from overflowing i64.
        return i64(low32(i64(c & 0xFFFFFFFF)))

    def _st_pick(self) -> i32:
        best = TOKEN_NULL
        mx = 0
        total = 0
        for t in sorted(self.cur):  # spec 3.2 exactly as the reference: ascending, strict >
            c = self.cur[t]
            if c > mx:
                best = t
                mx = c
            total += c
        if total < STATIC_MIN_SAMPLE or 100 * mx < STATIC_MIN_PERCENT * total:
            return NULL32
        return i32(best)
