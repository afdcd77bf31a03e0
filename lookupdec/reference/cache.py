"""The n-gram cache: llama.cpp's map of maps, as nested dicts (spec sections 1, 2 and 6).

A key is always four token slots; an n-gram of size n < 4 is padded with -1
(``LLAMA_TOKEN_NULL``), so keys of every size live side by side in one cache.
A *part* maps a follower token to how often it followed the key (always >= 1).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping, Sequence

from lookupdec.errors import CacheFormatError, TokenRangeError
from lookupdec.formats.detect import detect_format, read_all
from lookupdec.formats.legacy import decode_legacy, write_legacy
from lookupdec.rules import INT32_MAX, INT32_MIN
from lookupdec.rules import NGRAM_MAX as NGRAM_MAX  # re-exported: the reference's modules read them here
from lookupdec.rules import NGRAM_MIN as NGRAM_MIN
from lookupdec.rules import NGRAM_STATIC as NGRAM_STATIC
from lookupdec.rules import TOKEN_NULL as TOKEN_NULL

Key = tuple[int, int, int, int]
"""A padded 4-slot n-gram key."""
Contents = list[tuple[Key, list[tuple[int, int]]]]
"""A cache's canonical form: keys ascending, each with its followers ascending by token."""


def make_key(ngram: Sequence[int]) -> Key:
    """Pad an n-gram of 1..4 tokens to a 4-slot key with -1."""
    n = len(ngram)
    if not 1 <= n <= NGRAM_MAX:
        raise ValueError(f"an n-gram has 1..{NGRAM_MAX} tokens, got {n}")
    slots = list(ngram) + [TOKEN_NULL] * (NGRAM_MAX - n)
    return (slots[0], slots[1], slots[2], slots[3])


def check_tokens(tokens: Iterable[int], what: str = "token") -> None:
    """Raise :class:`TokenRangeError` if any id does not fit in int32."""
    for i, t in enumerate(tokens):
        if not INT32_MIN <= t <= INT32_MAX:
            raise TokenRangeError(f"{what} {i} is {t}, outside the int32 range of a llama.cpp token id")


def check_ngram_range(ngram_min: int, ngram_max: int) -> None:
    """Raise ValueError unless 1 <= ngram_min <= ngram_max <= 4."""
    if not 1 <= ngram_min <= ngram_max <= NGRAM_MAX:
        raise ValueError(f"need 1 <= ngram_min <= ngram_max <= {NGRAM_MAX}, got {ngram_min}..{ngram_max}")


class NgramCache:
    """An n-gram cache: key -> {follower token: count}, like llama.cpp's ``common_ngram_cache``.

    The same class holds context, dynamic and static caches; a static cache simply
    holds only 2-gram keys.
    """

    def __init__(self) -> None:
        self._map: dict[Key, dict[int, int]] = {}

    # --- the llama.cpp operations -------------------------------------------------

    def update(self, tokens: Sequence[int], nnew: int, ngram_min: int = NGRAM_MIN, ngram_max: int = NGRAM_MAX) -> None:
        """Count the n-grams whose follower is among the last ``nnew`` tokens (spec 2).

        For every size n in ``ngram_min..ngram_max`` (outer loop) and every position
        ``i`` from ``max(len(tokens) - nnew, n)`` to the end (inner loop), the n tokens
        before ``i`` gain one observation of ``tokens[i]``. Nothing remembers what was
        counted before: calling twice with overlapping ``nnew`` counts twice, exactly
        like llama.cpp.
        """
        check_ngram_range(ngram_min, ngram_max)
        if nnew < 0:
            raise ValueError(f"nnew must be >= 0, got {nnew}")
        size = len(tokens)
        check_tokens(tokens[max(size - nnew - ngram_max, 0) :])
        for n in range(ngram_min, ngram_max + 1):
            for i in range(max(size - nnew, n), size):
                key = make_key(tokens[i - n : i])
                part = self._map.setdefault(key, {})
                follower = tokens[i]
                part[follower] = part.get(follower, 0) + 1

    def merge(self, other: NgramCache) -> None:
        """Add every count of ``other`` into this cache (llama.cpp's ``merge``, spec 6)."""
        for key, add_part in other._map.items():
            part = self._map.get(key)
            if part is None:
                self._map[key] = dict(add_part)
                continue
            for token, count in add_part.items():
                part[token] = part.get(token, 0) + count

    def clear(self) -> None:
        """Remove every key (what llama-lookup-stats does to the context cache per chunk)."""
        self._map.clear()

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the cache in llama.cpp's legacy format (atomically); counts past 2^31-1 saturate.

        This overwrites ``path`` with this cache alone, as llama.cpp's ``save`` does: when
        several processes share one dynamic cache file, the last save wins and the others'
        new counts are lost. Use ``Drafter.save()``, which merges this process's new counts
        into the file under an exclusive lock, for a shared file.
        """
        write_legacy(self.contents(), path)

    @classmethod
    def load(cls, path: str | os.PathLike[str], *, strict: bool = False) -> NgramCache:
        """Read a cache file in llama.cpp's legacy format (spec 7).

        ``strict``: trailing bytes too few for a record are an error instead of a warning.
        The reference reads only this format (its codec is pure Python); for the others,
        convert canonical contents: ``NgramCache.from_contents(lookupdec.formats.read_as_contents(path))``.
        """
        fmt = detect_format(path)
        if fmt != "llama":
            raise CacheFormatError(
                path,
                f"a {fmt} file: the pure-Python reference reads only llama.cpp's legacy format; load it with "
                "NgramCache.from_contents(lookupdec.formats.read_as_contents(path))",
            )
        cache = cls()
        cache._map = decode_legacy(read_all(path), path, strict=strict)
        return cache

    # --- reading -----------------------------------------------------------------

    def get(self, key: Sequence[int]) -> dict[int, int]:
        """The followers of an n-gram (1..4 tokens or a padded key) as a new dict; empty if absent."""
        return dict(self._map.get(make_key(key) if len(key) != NGRAM_MAX else _as_key(key), {}))

    def part(self, key: Key) -> Mapping[int, int] | None:
        """The followers of a padded key, without a copy (read-only by convention), or None."""
        return self._map.get(key)

    def keys(self) -> Iterator[Key]:
        """Every key, in insertion order."""
        return iter(self._map)

    def items(self) -> Iterator[tuple[Key, dict[int, int]]]:
        """(key, part) pairs in insertion order; do not modify the parts."""
        return iter(self._map.items())

    def contents(self) -> Contents:
        """The canonical form: keys ascending, each with its (token, count) pairs ascending."""
        store = self._map
        return [(key, sorted(store[key].items())) for key in sorted(store)]

    def __len__(self) -> int:
        """Number of keys."""
        return len(self._map)

    def __contains__(self, key: object) -> bool:
        return key in self._map

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, NgramCache):
            return NotImplemented
        return self._map == other._map

    __hash__ = None  # type: ignore[assignment]  # mutable, like dict

    def __repr__(self) -> str:
        return f"<reference.NgramCache keys={len(self)} entries={self.n_entries}>"

    @property
    def n_entries(self) -> int:
        """Number of (key, follower) pairs."""
        return sum(len(part) for part in self._map.values())

    @property
    def total_count(self) -> int:
        """Sum of all counts (the number of observations)."""
        return sum(sum(part.values()) for part in self._map.values())

    @classmethod
    def from_contents(cls, contents: Iterable[tuple[Sequence[int], Iterable[tuple[int, int]]]]) -> NgramCache:
        """Build a cache from (key, [(token, count), ...]) pairs, e.g. :meth:`contents` output."""
        cache = cls()
        for key, followers in contents:
            k = _as_key(key)
            part = cache._map.setdefault(k, {})
            for token, count in followers:
                if count <= 0:
                    raise ValueError(f"count of follower {token} of {k} must be > 0, got {count}")
                part[token] = part.get(token, 0) + count
        return cache


def _as_key(key: Sequence[int]) -> Key:
    if len(key) != NGRAM_MAX:
        raise ValueError(f"a key has {NGRAM_MAX} slots, got {len(key)}")
    return (key[0], key[1], key[2], key[3])


def build_static(tokens: Sequence[int]) -> NgramCache:
    """The static cache of a corpus: all its 2-grams (llama-lookup-create, spec 8.1)."""
    cache = NgramCache()
    cache.update(tokens, len(tokens), NGRAM_STATIC, NGRAM_STATIC)
    return cache
