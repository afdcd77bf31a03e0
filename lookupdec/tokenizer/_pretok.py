"""llama.cpp's Llama 3 / Qwen2 and GPT-2 / SmolLM pre-tokenizers written out by hand, and a piece-cache encoder.

Compiled with mypyc (see ``setup.py``); it also runs unchanged as plain Python, exact but ~20x
slower (a tenth of tiktoken's speed), so :mod:`lookupdec.tokenizer.bpe` uses it only when
compiled.

The regex it replaces (``_LLAMA3`` in :mod:`lookupdec.tokenizer.bpe`; Qwen2's is the same with
``\\p{N}`` for ``\\p{N}{1,3}``)::

    (?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])   # 1 contractions
    | [^\\r\\n\\p{L}\\p{N}]?\\p{L}+                                 # 2 letters, one leading char
    | \\p{N}{1,3}                                                # 3 digits
    | \\ ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*                               # 4 other, newlines after
    | \\s*[\\r\\n]+                                                # 5 whitespace up to a newline
    | \\s+(?!\\S)                                                 # 6 whitespace but its last
    | \\s+                                                       # 7 whitespace

Every character is a letter, a digit, whitespace or "other", so some alternative matches at
every position and there is never a gap between matches: the pieces are the matches, taken
leftmost-first. :func:`piece_end` gives the end of the match starting at ``i``, trying the
alternatives in order (a backtracking regex takes the first that matches):

1. ``'`` and then s, t, m, d (either case) or re, ve, ll (either case, each letter).
2. a letter run; or one character that is not ``\\r``, ``\\n``, a letter or a digit followed
   by a letter run (the optional character is tried first: greedy).
3. up to ``max_digits`` digits.
4. a run of "other" characters (after one optional space), then any ``\\r``/``\\n`` run.
5. (now the character is whitespace) the whitespace run from ``i``: ``\\s*`` takes it all and
   backtracks to the last ``\\r``/``\\n`` in it, ``[\\r\\n]+`` takes that one (the next
   character is not ``\\r``/``\\n``, or it would be in the run). Fails if the run has none.
6. the run but its last character when a non-space follows (``(?!\\S)`` fails after the
   whole run, succeeds one back), the whole run at the end of the text; fails for a run of
   one character followed by a non-space,
7. which is then the one character.

The character classes come from a table built with the ``regex`` module's own ``\\p{L}``,
``\\p{N}`` and ``\\s`` (:func:`lookupdec.tokenizer.bpe.class_table`), so they are the ones of
the regex this replaces; ``tests/test_pretok.py`` compares each splitter with its regex on
random and real text. :func:`piece_end_gpt2` does the same for GPT-2's regex.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from librt.strings import BytesWriter, write_i32_le
from librt.vecs import append, extend, vec
from mypy_extensions import i32, i64

# The classes of the table (the GPT-2 splitter relies on the order: whitespace classes last).
OTHER: Final = 0
"""Class of a character that is not a letter, a digit or whitespace."""
LETTER: Final = 1
"""Class of ``\\p{L}``."""
DIGIT: Final = 2
"""Class of ``\\p{N}``."""
SPACE: Final = 3
"""Class of ``\\s`` but ``\\r`` and ``\\n``."""
NEWLINE: Final = 4
"""Class of ``\\r`` and ``\\n``."""

_QUOTE: Final = 39  # '
_BLANK: Final = 32  # the space of ` ?` in alternative 4


def piece_end(text: str, n: i64, i: i64, table: bytes, max_digits: i64) -> i64:
    """End of the piece starting at ``i`` of ``text`` (``n = len(text)``, ``i < n``)."""
    # mypyc: ord(s[i]) gives a tagged int; declared i64 locals make the comparisons native, and
    # `|= 32` on an i64 is native where `ord(...) | 32` in one expression was CPyTagged_Or
    # (seen in the generated C).
    c: i64 = ord(text[i])
    if c == _QUOTE and i + 1 < n:
        # ASCII letters only: `| 32` maps 'S' to 's' and so on; no other code point lands on
        # these values (the bit is the only difference).
        d: i64 = ord(text[i + 1])
        d |= 32
        if d == 115 or d == 116 or d == 109 or d == 100:  # s t m d
            return i + 2
        if i + 2 < n:
            e: i64 = ord(text[i + 2])
            e |= 32
            if (e == 101 and (d == 114 or d == 118)) or (d == 108 and e == 108):  # re ve ll
                return i + 3
    k: i64 = table[c]
    j: i64 = i + 1
    if k == LETTER or (k != NEWLINE and k != DIGIT and j < n and table[ord(text[j])] == LETTER):
        while j < n and table[ord(text[j])] == LETTER:
            j += 1
        return j
    if k == DIGIT:
        lim = min(n, i + max_digits)
        while j < lim and table[ord(text[j])] == DIGIT:
            j += 1
        return j
    if k == OTHER or (c == _BLANK and j < n and table[ord(text[j])] == OTHER):
        while j < n and table[ord(text[j])] == OTHER:
            j += 1
        while j < n and table[ord(text[j])] == NEWLINE:
            j += 1
        return j
    # Whitespace (SPACE or NEWLINE) where alternatives 2 and 4 did not match.
    j = i
    last: i64 = -1
    while j < n:
        t: i64 = table[ord(text[j])]
        if t == NEWLINE:
            last = j
        elif t != SPACE:
            break
        j += 1
    if last >= 0:
        return last + 1  # 5
    if j == n or j == i + 1:
        return j  # 6 at the end of the text, or 7
    return j - 1  # 6


def split(text: str, table: bytes, max_digits: i64) -> list[str]:
    """The pieces of ``text`` (what ``PreType.split`` gives for the Llama 3 / Qwen2 regex)."""
    n = i64(len(text))
    out: list[str] = []
    i: i64 = 0
    while i < n:
        e = piece_end(text, n, i, table, max_digits)
        out.append(text[i:e])
        i = e
    return out


def piece_end_gpt2(text: str, n: i64, i: i64, table: bytes) -> i64:
    """End of the piece starting at ``i`` for GPT-2's regex (``n``: the end of the text, ``i < n``).

    ``'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)`` with llama.cpp's gap
    rule (the text between two matches is a piece too): the contractions in lower case only;
    a letter, digit or "other" run after one optional space; a whitespace run but its last
    character when a non-space follows, all of it at the end. Where nothing matches (one
    whitespace character before a non-space that the optional space did not take) the next
    character matches, so the gap is that one character.
    """
    c: i64 = ord(text[i])
    if c == _QUOTE and i + 1 < n:
        d: i64 = ord(text[i + 1])
        if d == 115 or d == 116 or d == 109 or d == 100:  # s t m d
            return i + 2
        if i + 2 < n:
            e: i64 = ord(text[i + 2])
            if (e == 101 and (d == 114 or d == 118)) or (d == 108 and e == 108):  # re ve ll
                return i + 3
    k: i64 = table[c]
    j: i64 = i + 1
    if c == _BLANK and j < n:
        k2: i64 = table[ord(text[j])]
        if k2 < SPACE:  # a letter, a digit or "other" (the classes below SPACE)
            k = k2
            j += 1
    if k < SPACE:
        while j < n and table[ord(text[j])] == k:
            j += 1
        return j
    j = i + 1
    while j < n:
        t: i64 = table[ord(text[j])]
        if t != SPACE and t != NEWLINE:
            break
        j += 1
    if j == n or j == i + 1:
        return j  # at the end of the text, or the gap of one character
    return j - 1


def split_gpt2(text: str, table: bytes, digits_apart: bool) -> list[str]:
    """The pieces of GPT-2's regex (``digits_apart``: SmolLM's, which first makes every ``\\p{N}`` a piece).

    SmolLM's second regex runs on each piece of the first as on a text of its own, so its
    lookahead sees the end of the piece as the end of the text: ``n`` is that end.
    """
    n = i64(len(text))
    out: list[str] = []
    i: i64 = 0
    while i < n:
        end = n
        if digits_apart:
            if table[ord(text[i])] == DIGIT:
                out.append(text[i : i + 1])
                i += 1
                continue
            end = i + 1
            while end < n and table[ord(text[end])] != DIGIT:
                end += 1
        while i < end:
            e = piece_end_gpt2(text, end, i, table)
            out.append(text[i:e])
            i = e
    return out


def _filled(n: i64) -> vec[i32]:
    """``n`` slots of -1 (``n`` a power of two); doubling by ``extend`` copies whole blocks."""
    v = vec[i32]([-1])
    while i64(len(v)) < n:
        v = extend(v, v)
    return v


_FIRST_SLOTS: Final = 1 << 12


class PieceCache:
    """The ids of the pieces seen so far, found from the text itself: a hit makes no ``str``.

    An open-addressing table (linear probing, at most half full) of entry numbers, keyed by a
    31-bit FNV-1a hash of the piece's code points; an entry is its hash, its text (to compare
    code points with, so a hash collision is never a wrong answer) and its ids
    (``ids[first[k]:first[k + 1]]``). Not a ``dict[str, bytes]``, which needs a new ``str`` per
    piece, hashes it with SipHash and compares it with memcmp: a hit here reads the code points
    in place. The hash stays in its own array (packing it into the slot was no faster).
    """

    def __init__(self) -> None:
        self.mask: i64 = _FIRST_SLOTS - 1
        self.slots: vec[i32] = _filled(_FIRST_SLOTS)
        self.hashes: vec[i64] = vec[i64]()
        self.keys: list[str] = []
        self.first: vec[i32] = vec[i32]([0])
        self.ids: vec[i32] = vec[i32]()

    def __len__(self) -> int:
        return len(self.keys)

    def clear(self) -> None:
        """Forget every piece."""
        self.mask = _FIRST_SLOTS - 1
        self.slots = _filled(_FIRST_SLOTS)
        self.hashes = vec[i64]()
        self.keys = []
        self.first = vec[i32]([0])
        self.ids = vec[i32]()

    def grow(self) -> None:
        """Double the slots (every entry is placed again by its hash)."""
        mask = 2 * self.mask + 1
        slots = _filled(mask + 1)
        hashes = self.hashes
        for k in range(i64(len(hashes))):
            s = hashes[k] & mask
            while slots[s] >= 0:
                s = (s + 1) & mask
            slots[s] = i32(k)
        self.slots = slots
        self.mask = mask


def encode(
    text: str, table: bytes, max_digits: i64, cache: PieceCache, bpe: Callable[[bytes], list[int]], cache_max: i64
) -> bytes:
    """The ids of ``text`` as little-endian int32 bytes; a piece's ids from ``cache``, else from ``bpe``.

    ``bpe(piece_utf8)`` gives the ids of one piece (tiktoken's ``encode_single_piece``: the
    piece's token if it is one, else its BPE); they go into ``cache``, which is emptied when it
    holds ``cache_max`` pieces. A piece holding a lone surrogate raises ``UnicodeEncodeError``
    (and is not cached).
    """
    n = i64(len(text))
    out = BytesWriter()
    slots = cache.slots
    mask = cache.mask
    i: i64 = 0
    while i < n:
        e = piece_end(text, n, i, table, max_digits)
        # FNV-1a over the code points, kept to 31 bits: the product stays below 2**55, so
        # compiled (C int64) and interpreted (Python int) give the same hash.
        h: i64 = 0
        for q in range(i, e):
            h = ((h ^ ord(text[q])) * 16777619) & 0x7FFFFFFF
        h ^= h >> 15  # the low bits pick the slot: fold the high ones in
        s = h & mask
        k = i64(slots[s])
        while k >= 0:
            if cache.hashes[k] == h:
                key = cache.keys[k]
                size = e - i
                if i64(len(key)) == size:
                    j: i64 = 0
                    while j < size and ord(key[j]) == ord(text[i + j]):
                        j += 1
                    if j == size:
                        break
            s = (s + 1) & mask
            k = i64(slots[s])
        if k < 0:
            piece = text[i:e]
            new = bpe(piece.encode("utf-8"))  # before any change to the cache: this may raise
            if i64(len(cache.keys)) >= cache_max:
                cache.clear()
                slots = cache.slots
                mask = cache.mask
                s = h & mask
                while slots[s] >= 0:
                    s = (s + 1) & mask
            k = i64(len(cache.keys))
            cache.keys.append(piece)
            cache.hashes = append(cache.hashes, h)
            ids = cache.ids
            for t in new:
                ids = append(ids, i32(t))
            cache.ids = ids
            cache.first = append(cache.first, i32(len(ids)))
            slots[s] = i32(k)
            if 2 * (k + 1) > mask:
                cache.grow()
                slots = cache.slots
                mask = cache.mask
        ids = cache.ids
        for q in range(i64(cache.first[k]), i64(cache.first[k + 1])):
            write_i32_le(out, ids[q])
        i = e
    return out.getvalue()
