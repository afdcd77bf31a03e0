"""The compiled core: the n-gram cache as flat native arrays, drafting and the replay loop.

This module is compiled by mypyc (see ``setup.py``); it also runs unchanged as plain Python,
only much slower. Everything hot is a plain typed function or a method of a native class
working on ``librt.vecs.vec`` of ``i32``/``i64``, which mypyc indexes without boxing.

Layout of :class:`NgramCache` (all arrays indexed by a key ordinal ``kid`` or a node ``nid``):

- keys: ``k0[kid] = pack(t0, t1)``, ``k1[kid] = pack(t2, t3)`` (two i64 words hold the four
  int32 slots exactly, so no hash-then-verify is needed), found through an open-addressing
  table ``slots`` (linear probing, load <= 1/2);
- both tables are *stale* (``_stale``) after a load or a merge of big caches, which fill the
  arrays only; the first lookup or insert builds them (``_fresh``), as inserting one by one would;
- per key: the followers as a singly linked list of nodes in insertion order (``head``,
  ``tail``; no follower count per key: 4 bytes a key of a replay's peak, and ``head < 0``
  says "none") and three aggregates kept up to date on every count change: ``sum``,
  ``max`` and ``best`` (the smallest token holding ``max``). They give Lemire's precheck
  (spec 10) in O(1), and with an empty static part the whole of try_primary in O(1);
- nodes: ``ntok``, ``ncnt``, ``nnext``, ``nkey``. A key whose counts sum to at most
  :data:`SCAN_MAX` has at most that many followers, found by walking its list; the nodes of
  every other key are found by (kid, token) through a second open-addressing table ``pslots``,
  so a count update never walks a long list. Most keys of a replay are seen once or twice
  (85 % of the WikiText replay's 599,225 keys have a sum of 1): the table holds a fifth of the
  nodes and is a quarter of the size it had when it held all of them (2 MB instead of 8).

Counts (``ncnt``) and the per-key ``sum`` and ``max`` are exact, like the reference's unbounded
Python ints, but stored in int32 slots: a value past 2^31-1, which only merges of big caches
reach, lives in an i64 side array (``wcnt``, ``wsum``, ``wmax``) and its slot holds
``-1 - index`` there (no real count or sum is negative; see :func:`get_count`). That is 12
bytes a key and node less than i64 slots (8.2 MB of the WikiText replay's peak). Counts
saturate only when written to a file. The int32 wrap-around of llama.cpp's weight and score
(spec 5) is emulated explicitly with :func:`wrap32`.
"""

from __future__ import annotations

import operator
import os
import time
from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Final, SupportsIndex, cast

from librt.vecs import append, vec
from mypy_extensions import i32, i64

from lookupdec.errors import TokenRangeError, warn_saturated
from lookupdec.fast import _legacy
from lookupdec.fast._legacy import filled_i32 as filled_i32  # re-exported: _index and _hybrid import it from here

NGRAM_MIN: Final = 1
"""Smallest n-gram size drafting uses."""
NGRAM_MAX: Final = 4
"""Largest n-gram size drafting uses (and the number of slots in a key)."""
NGRAM_STATIC: Final = 2
"""The n-gram size of a static cache."""
TOKEN_NULL: Final = -1
"""Padding for unused key slots, and "no token" (llama.cpp's ``LLAMA_TOKEN_NULL``)."""

Key = tuple[int, int, int, int]
"""A padded 4-slot n-gram key."""
Contents = list[tuple[Key, list[tuple[int, int]]]]
"""A cache's canonical form: keys ascending, each with its followers ascending by token."""

INT32_MIN: Final[i64] = -2147483648
INT32_MAX: Final[i64] = 2147483647
M32: Final[i64] = 0xFFFFFFFF
TWO32: Final[i64] = 4294967296
NULL32: Final[i32] = -1
# pack(TOKEN_NULL, TOKEN_NULL): the second word of every key of size <= 2.
PAD_WORD: Final[i64] = -1
# Returned by StaticSource._st_count for "this follower is not in the static part"; no real
# count can be this (counts are int32 in files and > 0 in caches).
ABSENT: Final[i64] = -(2**62)
INITIAL_SLOTS: Final[i64] = 16
# A key whose counts sum to at most this many is scanned (its list has at most this many
# nodes); the pair table holds the nodes of the keys past it. Bigger saves table memory and
# costs longer scans (each node is two reads, ``ntok`` and ``nnext``, often cache misses).
SCAN_MAX: Final[i64] = 8
# NgramCache.merge probes the tables (built) for every key and follower of the other cache
# when this cache has at least this many times more keys; otherwise it orders both caches'
# keys and walks them side by side (see _merge_sorted), which reads memory in order.
MERGE_PROBE_RATIO: Final[i64] = 8

# Odd multipliers below 2**31: a product with a 32-bit value stays below 2**63, so hashing
# never overflows i64 (native ints wrap silently in C but are unbounded in interpreted mode;
# staying in range keeps both modes identical).
H0: Final[i64] = 0x7FEB352D
H1: Final[i64] = 0x68E31DA5
H2: Final[i64] = 0x5BD1E995
H3: Final[i64] = 0x2C1B3C6D
H4: Final[i64] = 0x4F1BBCDD


def wrap32(x: i64) -> i64:
    """``x`` as a two's-complement int32 would hold it (what g++ -O2 does on overflow, spec 5).

    Callers keep ``|x| < 2**62`` so the i64 arithmetic here cannot overflow.
    """
    return ((x + 2147483648) & M32) - 2147483648


def low32(w: i64) -> i32:
    """The low 32 bits of ``w`` as a signed int32 (the second token of a packed word)."""
    return i32(wrap32(w & M32))


def pack(a: i32, b: i32) -> i64:
    """Two int32 tokens as one i64 word: ``a`` in the high half, ``b``'s bits in the low half."""
    # Multiply instead of ``<<``: shifting a negative value left is undefined in C.
    return (i64(a) * TWO32) | (i64(b) & M32)


def key_hash(w0: i64, w1: i64) -> i64:
    """Hash of a packed key for the in-memory tables (not a file format)."""
    h = ((w0 >> 32) & M32) * H0 ^ (w0 & M32) * H1 ^ ((w1 >> 32) & M32) * H2 ^ (w1 & M32) * H3
    return h ^ (h >> 29)


def pair_hash(kid: i64, tok: i32) -> i64:
    """Hash of a (key ordinal, follower token) pair."""
    h = kid * H4 ^ (i64(tok) & M32) * H1
    return h ^ (h >> 29)


# The two open-addressing tables of NgramCache (keys; (key, follower) pairs) probe linearly,
# and these three functions are the only copies of the probe loop. A probe returns one i64,
# the entry found or ``-1 - slot`` for the empty slot, so a caller tests its sign and an
# insert knows where to write without probing again. mypyc compiles each call to a direct C
# call (``CPyDef__core___key_probe``), which gcc inlines only because setup.py passes
# -fno-semantic-interposition (see there). Built without that flag, the shared probe cost
# _find 36 more instructions a call than the copied loop it replaced (142 against 106,
# callgrind over a replay), and drafting about 11 % more instructions.


def key_probe(slots: vec[i32], k0: vec[i64], k1: vec[i64], mask: i64, w0: i64, w1: i64) -> i64:
    """Probe ``slots`` for the packed key (w0, w1): its ordinal if present, else ``-1 - h``
    for the empty slot ``h`` where it would be inserted (so any negative result means absent)."""
    h = key_hash(w0, w1) & mask
    while True:
        s = i64(slots[h])
        if s < 0:
            return -1 - h
        if k0[s] == w0 and k1[s] == w1:
            return s
        h = (h + 1) & mask


def pair_probe(pslots: vec[i32], nkey: vec[i32], ntok: vec[i32], mask: i64, kid: i64, tok: i32) -> i64:
    """Probe ``pslots`` for follower ``tok`` of key ``kid``, like :func:`key_probe`: its node
    if present, else ``-1 - h`` for the empty slot ``h`` where it would be inserted."""
    h = pair_hash(kid, tok) & mask
    while True:
        n = i64(pslots[h])
        if n < 0:
            return -1 - h
        if ntok[n] == tok and i64(nkey[n]) == kid:
            return n
        h = (h + 1) & mask


# The int32 count slots and their i64 side arrays (see the module docstring). The values only
# grow, so a slot that escaped to the side array never comes back: every escaped value is past
# INT32_MAX, which lets the legacy writer saturate an escaped slot without reading its value.


def get_count(slots: vec[i32], wide: vec[i64], i: i64) -> i64:
    """The exact value of slot ``i``: the slot itself, or its entry in the side array ``wide``."""
    c = i64(slots[i])
    if c < 0:
        return wide[-1 - c]
    return c


def set_count(slots: vec[i32], wide: vec[i64], i: i64, c: i64) -> vec[i64]:
    """Store ``c`` (>= 0, at least the slot's value) in slot ``i``, in ``wide`` past INT32_MAX.

    Returns ``wide``, which an append may have moved (vecs are values).
    """
    old = i64(slots[i])
    if old < 0:
        wide[-1 - old] = c
    elif c <= INT32_MAX:
        slots[i] = i32(c)
    else:
        slots[i] = i32(-1 - i64(len(wide)))
        wide = append(wide, c)
    return wide


def is_probed(s: i64) -> bool:
    """True when a key of sum slot ``s`` has its nodes in the pair table (sum past SCAN_MAX;
    a negative slot is a sum past INT32_MAX)."""
    return s > SCAN_MAX or s < 0


def scan_list(head: vec[i32], ntok: vec[i32], nnext: vec[i32], kid: i64, tok: i32) -> i64:
    """Node of follower ``tok`` found by walking key ``kid``'s list, ``-1`` if it has none such
    (for keys of at most SCAN_MAX followers, which the pair table does not hold)."""
    node = i64(head[kid])
    while node >= 0:
        if ntok[node] == tok:
            return node
        node = i64(nnext[node])
    return -1


def empty_slot(slots: vec[i32], h: i64, mask: i64) -> i64:
    """The first empty (-1) slot at or after ``h``, wrapping by ``mask``: where a rehash puts an
    entry (every entry is distinct, so nothing needs comparing)."""
    while slots[h] >= 0:
        h = (h + 1) & mask
    return h


# Thresholds by index i = n - ngram_min (spec 3.1): minimum number of observations and the
# minimum percent share of the selected token. LAX for the context cache, STRICT for dynamic.
# The reference's tables are tuples; these are vec[i64] because mypyc indexes a tuple of ints
# through boxed Python objects (PyTuple_New, CPySequenceTuple_GetItem in the generated C),
# while a module-level Final vec[i64] compiles to a bounds check and a native load.
LAX_MIN_SAMPLE: Final = vec[i64]([2, 2, 1, 1])
LAX_MIN_PERCENT: Final = vec[i64]([66, 50, 50, 50])
STRICT_MIN_SAMPLE: Final = vec[i64]([4, 3, 2, 2])
STRICT_MIN_PERCENT: Final = vec[i64]([75, 66, 66, 66])
# The static-only draft (spec 3.2) takes the LAX thresholds of a 2-gram, as the reference's
# try_static reads them: LAX_MIN_SAMPLE[NGRAM_STATIC - 1] and LAX_MIN_PERCENT[NGRAM_STATIC - 1].
# Written as literals because mypyc puts a Final native-int literal straight into the C
# expression, where a vec index is a load and a bounds check. tests/test_semantics.py checks
# every threshold at its boundary, in both implementations.
STATIC_MIN_SAMPLE: Final[i64] = 2
STATIC_MIN_PERCENT: Final[i64] = 50


def token_range_error(tokens: Sequence[int], what: str = "token") -> TokenRangeError:
    """The reference's error for the first id of ``tokens`` outside int32 (same message)."""
    for i, t in enumerate(tokens):
        if not INT32_MIN <= t <= INT32_MAX:
            return TokenRangeError(f"{what} {i} is {t}, outside the int32 range of a llama.cpp token id")
    return TokenRangeError(f"{what} outside the int32 range of a llama.cpp token id")


def as_i32(x: object, tokens: Sequence[object], lo: int) -> i32:
    """One token id as i32; TokenRangeError (the reference's message) if it does not fit."""
    # Typed as object: numpy integers (and other __index__ types) are accepted like the
    # reference accepts them; a Sequence[int] annotation would make mypyc reject them.
    y = x if isinstance(x, int) else operator.index(cast(SupportsIndex, x))
    if y < INT32_MIN or y > INT32_MAX:
        raise token_range_error([operator.index(cast(SupportsIndex, t)) for t in tokens[lo:]])
    return i32(y)


def to_vec(tokens: Sequence[object], lo: int = 0) -> vec[i32]:
    """``tokens[lo:]`` as a vec[i32]; :class:`TokenRangeError` (reference message) if an id does not fit."""
    if isinstance(tokens, array) and tokens.typecode == "i" and tokens.itemsize == 4:
        # Already int32 (``lookupdec stats`` reads a raw token file so, see lookupdec._rawids):
        # vec's constructor copies a buffer of the same item format with one memcpy.
        return vec[i32](tokens[lo:] if lo > 0 else tokens)
    n = len(tokens)
    v = vec[i32](capacity=max(n - lo, 0))
    if isinstance(tokens, list):
        # A list is indexed natively; the common case (replay, build_static) is a list.
        for j in range(lo, n):
            v = append(v, as_i32(tokens[j], tokens, lo))
        return v
    for t in tokens[lo:]:
        v = append(v, as_i32(t, tokens, lo))
    return v


def fits_tokens(tokens: Sequence[object]) -> bool:
    """True when every id is an integer inside int32 (the fast path's key packing needs that)."""
    for t in tokens:
        try:
            y = t if isinstance(t, int) else operator.index(cast(SupportsIndex, t))
        except TypeError:
            return False
        if y < INT32_MIN or y > INT32_MAX:
            return False
    return True


POLICIES: Final = ("llama", "hybrid")
"""The drafting policies: llama.cpp's rule (the default, exact) and the hybrid policy."""


def check_policy(policy: str) -> None:
    """Raise ValueError unless ``policy`` is one of :data:`POLICIES` (reference message)."""
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}: choose 'llama' or 'hybrid'")


def check_ngram_range(ngram_min: int, ngram_max: int) -> None:
    """Raise ValueError unless 1 <= ngram_min <= ngram_max <= 4 (reference message)."""
    if not 1 <= ngram_min <= ngram_max <= NGRAM_MAX:
        raise ValueError(f"need 1 <= ngram_min <= ngram_max <= {NGRAM_MAX}, got {ngram_min}..{ngram_max}")


def make_key(ngram: Sequence[int]) -> Key:
    """Pad an n-gram of 1..4 tokens to a 4-slot key with -1 (reference semantics)."""
    n = len(ngram)
    if not 1 <= n <= NGRAM_MAX:
        raise ValueError(f"an n-gram has 1..{NGRAM_MAX} tokens, got {n}")
    slots = [*list(ngram), *([TOKEN_NULL] * (NGRAM_MAX - n))]
    return (slots[0], slots[1], slots[2], slots[3])


def as_key(key: Sequence[int]) -> Key:
    """A 4-slot key as a tuple; ValueError for any other length."""
    if len(key) != NGRAM_MAX:
        raise ValueError(f"a key has {NGRAM_MAX} slots, got {len(key)}")
    return (key[0], key[1], key[2], key[3])


def key_words(key: Sequence[object]) -> tuple[bool, i64, i64]:
    """(ok, w0, w1) of a 4-slot key; ok is False when a slot is not an int32 (no such key can exist)."""
    if len(key) != NGRAM_MAX:
        return False, 0, 0
    t = [0, 0, 0, 0]
    for j in range(4):
        x = key[j]
        if not isinstance(x, int):
            try:  # numpy integers and other __index__ types hash and compare like ints in the reference
                x = operator.index(cast(SupportsIndex, x))
            except TypeError:
                return False, 0, 0
        if x < INT32_MIN or x > INT32_MAX:
            return False, 0, 0
        t[j] = x
    return True, pack(i32(t[0]), i32(t[1])), pack(i32(t[2]), i32(t[3]))


def unpack_key(w0: i64, w1: i64) -> Key:
    """The 4-slot tuple of a packed key."""
    return (int(w0 >> 32), int(low32(w0)), int(w1 >> 32), int(low32(w1)))


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


def as_static_source(nc_static: object) -> StaticSource | None:
    """``nc_static`` as a StaticSource: itself, an empty cache for None, an adapter for a foreign
    PartSource; None if it has no ``part`` method."""
    if nc_static is None:
        return NgramCache()
    if isinstance(nc_static, StaticSource):
        return nc_static
    if hasattr(nc_static, "part"):
        return PartAdapter(nc_static)
    return None


class NgramCache(StaticSource):
    """An n-gram cache: key -> {follower token: count}, like llama.cpp's ``common_ngram_cache``.

    Same methods and results as ``lookupdec.reference.NgramCache``; stored as flat native
    arrays (see the module docstring). Tokens must fit in int32.
    """

    _k0: vec[i64]
    _k1: vec[i64]
    _head: vec[i32]
    _tail: vec[i32]
    _sum: vec[i32]
    _max: vec[i32]
    _wsum: vec[i64]
    _wmax: vec[i64]
    _best: vec[i32]
    _slots: vec[i32]
    _smask: i64
    _ntok: vec[i32]
    _ncnt: vec[i32]
    _wcnt: vec[i64]
    _nnext: vec[i32]
    _nkey: vec[i32]
    _pslots: vec[i32]
    _pmask: i64
    _pcount: i64
    _stale: bool
    _st_kid: i64
    _touch: i64

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        """Empty the cache and shrink its tables to the initial size."""
        self._k0 = vec[i64]()
        self._k1 = vec[i64]()
        self._head = vec[i32]()
        self._tail = vec[i32]()
        self._sum = vec[i32]()
        self._max = vec[i32]()
        self._wsum = vec[i64]()
        self._wmax = vec[i64]()
        self._best = vec[i32]()
        self._slots = filled_i32(INITIAL_SLOTS, NULL32)
        self._smask = INITIAL_SLOTS - 1
        self._ntok = vec[i32]()
        self._ncnt = vec[i32]()
        self._wcnt = vec[i64]()
        self._nnext = vec[i32]()
        self._nkey = vec[i32]()
        self._pslots = filled_i32(INITIAL_SLOTS, NULL32)
        self._pmask = INITIAL_SLOTS - 1
        self._pcount = 0
        self._stale = False
        self._st_kid = -1
        self._touch = 0

    # --- native internals ------------------------------------------------------------

    def _fresh(self) -> None:
        """Build both hash tables if they are stale (after a load or a sorted merge).

        ``load`` and a merge of big caches fill the arrays without the tables, which only
        lookups and inserts need: building them then (one scatter over every key and node)
        was half the load and most of the merge, and ``save`` never reads them. The tables
        are built in ordinal order at the size incremental inserts reach, so they come out
        exactly as if every key and node had been inserted one by one.
        """
        if self._stale:
            self._rehash_keys(table_size(i64(len(self._k0))))
            self._rehash_pairs(table_size(self._n_probed_nodes()))
            self._stale = False

    def _find(self, w0: i64, w1: i64) -> i64:
        """Ordinal of the packed key, -1 if absent."""
        if self._stale:
            self._fresh()
        s = key_probe(self._slots, self._k0, self._k1, self._smask, w0, w1)
        # An if statement, not ``s if s >= 0 else -1``: mypyc types that expression as a
        # Python int (i64 | literal) and boxes s on the way (box, then unbox, in build/ops.txt).
        if s < 0:
            return -1
        return s

    def _rehash_keys(self, size: i64) -> None:
        slots = filled_i32(size, NULL32)
        mask = size - 1
        k0 = self._k0
        k1 = self._k1
        for kid in range(len(k0)):
            slots[empty_slot(slots, key_hash(k0[kid], k1[kid]) & mask, mask)] = i32(kid)
        self._slots = slots
        self._smask = mask

    def _intern(self, w0: i64, w1: i64) -> i64:
        """Ordinal of the packed key, inserting it (with no followers) if absent.

        Makes the tables fresh, so :meth:`_bump` of the ordinal it returns needs no check.
        """
        if self._stale:
            self._fresh()
        k0 = self._k0
        mask = self._smask
        s = key_probe(self._slots, k0, self._k1, mask, w0, w1)
        if s >= 0:
            return s
        kid = i64(len(k0))
        self._slots[-1 - s] = i32(kid)
        self._k0 = append(k0, w0)
        self._k1 = append(self._k1, w1)
        self._head = append(self._head, NULL32)
        self._tail = append(self._tail, NULL32)
        self._sum = append(self._sum, 0)
        self._max = append(self._max, 0)
        self._best = append(self._best, NULL32)
        if 2 * (kid + 1) > mask + 1:
            self._rehash_keys(2 * (mask + 1))
        return kid

    def _pair_find(self, kid: i64, tok: i32) -> i64:
        """Node of follower ``tok`` of key ``kid``, -1 if absent."""
        if self._stale:
            self._fresh()
        if not is_probed(i64(self._sum[kid])):
            return scan_list(self._head, self._ntok, self._nnext, kid, tok)
        n = pair_probe(self._pslots, self._nkey, self._ntok, self._pmask, kid, tok)
        if n < 0:  # an if statement for the reason given in _find
            return -1
        return n

    def _n_probed_nodes(self) -> i64:
        """Number of nodes the pair table holds: those of keys whose sum is past SCAN_MAX."""
        ksum = self._sum
        nkey = self._nkey
        n: i64 = 0
        for nid in range(len(nkey)):
            if is_probed(i64(ksum[i64(nkey[nid])])):
                n += 1
        return n

    def _rehash_pairs(self, size: i64) -> None:
        """Rebuild the pair table at ``size`` slots from the nodes of the probed keys, in node order."""
        pslots = filled_i32(size, NULL32)
        mask = size - 1
        nkey = self._nkey
        ntok = self._ntok
        ksum = self._sum
        count: i64 = 0
        for nid in range(len(ntok)):
            kid = i64(nkey[nid])
            if is_probed(i64(ksum[kid])):
                pslots[empty_slot(pslots, pair_hash(kid, ntok[nid]) & mask, mask)] = i32(nid)
                count += 1
        self._pslots = pslots
        self._pmask = mask
        self._pcount = count

    def _probe_insert(self, nid: i64, slot: i64) -> None:
        """Put the new node ``nid`` of a probed key in the pair table at the empty ``slot``."""
        self._pslots[slot] = i32(nid)
        self._pcount += 1
        mask = self._pmask
        if 2 * self._pcount > mask + 1:
            self._rehash_pairs(2 * (mask + 1))

    def _start_probing(self, kid: i64) -> None:
        """Key ``kid``'s sum just passed SCAN_MAX: put its nodes (at most SCAN_MAX + 1) in the pair table."""
        head = self._head
        nnext = self._nnext
        m: i64 = 0
        node = i64(head[kid])
        while node >= 0:
            m += 1
            node = i64(nnext[node])
        if 2 * (self._pcount + m) > self._pmask + 1:
            # Grown first, as one by one would have: the rebuilt table holds this key's nodes
            # too, since its sum is past SCAN_MAX already.
            self._rehash_pairs(table_size(self._pcount + m))
            return
        pslots = self._pslots
        ntok = self._ntok
        mask = self._pmask
        node = i64(head[kid])
        while node >= 0:
            pslots[empty_slot(pslots, pair_hash(kid, ntok[node]) & mask, mask)] = i32(node)
            node = i64(nnext[node])
        self._pcount += m

    def _bump(self, kid: i64, tok: i32, c: i64) -> None:
        """Add ``c`` (> 0) to the count of follower ``tok`` of key ``kid``, creating it if absent.

        The tables must be fresh: every caller has ``kid`` from :meth:`_intern`, which makes them so.
        """
        ntok = self._ntok
        s = i64(self._sum[kid])
        probed = is_probed(s)
        if probed:
            n = pair_probe(self._pslots, self._nkey, ntok, self._pmask, kid, tok)
        else:
            n = scan_list(self._head, ntok, self._nnext, kid, tok)
        if n >= 0:
            ncnt = self._ncnt
            nc = i64(ncnt[n]) + c
            if ncnt[n] >= 0 and nc <= INT32_MAX:
                ncnt[n] = i32(nc)
            else:
                nc = get_count(ncnt, self._wcnt, n) + c
                self._wcnt = set_count(ncnt, self._wcnt, n, nc)
            self._after_bump(kid, tok, c, nc)
            if not probed and s + c > SCAN_MAX:
                self._start_probing(kid)
            return
        nid = i64(len(ntok))
        self._ntok = append(ntok, tok)
        if c <= INT32_MAX:
            self._ncnt = append(self._ncnt, i32(c))
        else:  # past int32 (a merge of big counts): kept exactly in the side array
            self._ncnt = append(self._ncnt, 0)
            self._wcnt = set_count(self._ncnt, self._wcnt, nid, c)
        self._nnext = append(self._nnext, NULL32)
        self._nkey = append(self._nkey, i32(kid))
        # Append at the tail: followers keep insertion order, like the reference's dicts.
        tail = self._tail
        last = i64(tail[kid])
        if last < 0:
            self._head[kid] = i32(nid)
        else:
            self._nnext[last] = i32(nid)
        tail[kid] = i32(nid)
        self._after_bump(kid, tok, c, c)
        if probed:
            self._probe_insert(nid, -1 - n)
        elif s + c > SCAN_MAX:
            self._start_probing(kid)

    def _after_bump(self, kid: i64, tok: i32, c: i64, nc: i64) -> None:
        # Counts only grow, so the max and its smallest holder update in O(1).
        ksum = self._sum
        s = i64(ksum[kid])
        if s >= 0 and s + c <= INT32_MAX:
            ksum[kid] = i32(s + c)
        else:
            self._wsum = set_count(ksum, self._wsum, kid, get_count(ksum, self._wsum, kid) + c)
        kmax = self._max
        mx = i64(kmax[kid])
        if mx < 0:
            mx = self._wmax[-1 - mx]
        if nc > mx:
            if nc <= INT32_MAX:  # then mx < INT32_MAX too: its slot is not in the side array
                kmax[kid] = i32(nc)
            else:
                self._wmax = set_count(kmax, self._wmax, kid, nc)
            self._best[kid] = tok
        elif nc == mx and tok < self._best[kid]:
            self._best[kid] = tok

    def _update_at(self, toks: vec[i32], base: i64, size: i64, nnew: i64, nmin: i64, nmax: i64) -> None:
        """``update`` on the sequence ``toks[base:base+size]`` (n outer, position inner, spec 2)."""
        for n in range(nmin, nmax + 1):
            start = size - nnew
            if start < n:
                start = n
            for i in range(start, size):
                p = base + i - n
                t0 = toks[p]
                t1 = toks[p + 1] if n > 1 else NULL32
                t2 = toks[p + 2] if n > 2 else NULL32
                t3 = toks[p + 3] if n > 3 else NULL32
                kid = self._intern(pack(t0, t1), pack(t2, t3))
                self._bump(kid, toks[base + i], 1)

    def _merge_native(self, other: NgramCache) -> None:
        """Add every count of ``other`` (key order, then follower order, as the reference)."""
        ok0 = other._k0
        ok1 = other._k1
        ohead = other._head
        n_keys = i64(len(ok0))
        for kid in range(n_keys):
            mine = self._intern(ok0[kid], ok1[kid])
            node = i64(ohead[kid])
            while node >= 0:
                self._bump(mine, other._ntok[node], get_count(other._ncnt, other._wcnt, node))
                node = i64(other._nnext[node])

    def _merge_sorted(self, other: NgramCache) -> None:
        """:meth:`_merge_native` without the hash tables: the same arrays, tables left stale.

        Both caches' keys are put in key order (``key_order``: one pass when they already are,
        as in a loaded lookupdec file) and walked side by side to find each key of ``other``
        in this cache. Then ``other``'s keys are applied in its insertion order, as the probe
        merge does: a new key gets a copy of ``other``'s followers (and aggregates); a shared
        key's followers are found by a binary search in its own followers, sorted by token.
        Keys and nodes get the ordinals the probe merge gives them, so the tables, built on
        first use, come out the same too.
        """
        k0 = self._k0
        k1 = self._k1
        ok0 = other._k0
        ok1 = other._k1
        n = i64(len(k0))
        m = i64(len(ok0))
        mine = _legacy.key_order(k0, k1)
        theirs = _legacy.key_order(ok0, ok1)
        match = filled_i32(m, NULL32)
        i: i64 = 0
        j: i64 = 0
        while i < n and j < m:
            a = i64(mine[i])
            b = i64(theirs[j])
            if k0[a] == ok0[b] and k1[a] == ok1[b]:
                match[b] = i32(a)
                i += 1
                j += 1
            elif _legacy.key_less(k0[a], k1[a], ok0[b], ok1[b]):
                i += 1
            else:
                j += 1
        mine = vec[i32]()  # freed now: 4 bytes a key of each cache, not needed below
        theirs = vec[i32]()
        # Locals appended in one pass and stored back at the end (vecs are values: an append
        # may move the buffer, and attribute reads per follower cost more than the work).
        head = self._head
        tail = self._tail
        ksum = self._sum
        kmax = self._max
        wsum = self._wsum
        wmax = self._wmax
        best = self._best
        ntok = self._ntok
        ncnt = self._ncnt
        wcnt = self._wcnt
        nnext = self._nnext
        nkey = self._nkey
        ohead = other._head
        ontok = other._ntok
        oncnt = other._ncnt
        owcnt = other._wcnt
        onext = other._nnext
        # The cache lets go of its arrays while the locals grow: an append that moves a buffer
        # frees the old one only if nothing else holds it (the Drafter's merge of a small cache
        # into a loaded 128 MB one peaked 100 MB higher while the attributes kept them).
        self._reset()
        scratch = vec[i64]()
        for okid in range(m):
            kid = i64(match[okid])
            node = i64(ohead[okid])
            if kid < 0:
                # A new key: other's followers in its order, and its aggregates as they are.
                kid = i64(len(k0))
                k0 = append(k0, ok0[okid])
                k1 = append(k1, ok1[okid])
                first = i64(len(ntok))
                while node >= 0:
                    ntok = append(ntok, ontok[node])
                    oc = oncnt[node]
                    if oc >= 0:
                        ncnt = append(ncnt, oc)
                    else:  # a count in other's side array goes to this cache's
                        ncnt = append(ncnt, 0)
                        wcnt = set_count(ncnt, wcnt, i64(len(ncnt)) - 1, owcnt[-1 - i64(oc)])
                    nnext = append(nnext, i32(len(ntok)))  # the next node; the last is fixed below
                    nkey = append(nkey, i32(kid))
                    node = i64(onext[node])
                last = i64(len(ntok)) - 1
                if last < first:  # a key with no followers (from_contents allows one)
                    first = -1
                    last = -1
                else:
                    nnext[last] = NULL32
                head = append(head, i32(first))
                tail = append(tail, i32(last))
                # The aggregates as they are (through the side arrays past int32, as the
                # probe merge would store them). A sum that fits has a max that fits.
                osum = other._sum[okid]
                if osum >= 0:
                    ksum = append(ksum, osum)
                    kmax = append(kmax, other._max[okid])
                else:
                    ksum = append(ksum, 0)
                    wsum = set_count(ksum, wsum, kid, get_count(other._sum, other._wsum, okid))
                    kmax = append(kmax, 0)
                    wmax = set_count(kmax, wmax, kid, get_count(other._max, other._wmax, okid))
                best = append(best, other._best[okid])
                continue
            # A shared key: its own followers as sorted (token, node) words to search.
            nf: i64 = 0
            ascending = True
            prev: i64 = INT32_MIN - 1
            p = i64(head[kid])
            while p >= 0:
                tok = i64(ntok[p])
                if tok <= prev:
                    ascending = False
                prev = tok
                scratch = _legacy.put_i64(scratch, nf, _legacy.tok_node(ntok[p], p))
                nf += 1
                p = i64(nnext[p])
            if not ascending:
                _legacy.sort_i64(scratch, nf)
            total = i64(ksum[kid])
            mx = i64(kmax[kid])
            if total < 0:  # past int32: the exact values are in the side arrays
                total = wsum[-1 - total]
                mx = get_count(kmax, wmax, kid)
            bt = best[kid]
            while node >= 0:
                tok32 = ontok[node]
                # The int32 slots read and written inline, the side arrays only past int32:
                # get_count and set_count per follower cost this loop 7 % (a merge of loaded caches).
                c = i64(oncnt[node])
                if c < 0:
                    c = owcnt[-1 - c]
                at = find_token(scratch, nf, tok32)
                if at >= 0:
                    q = scratch[at] & M32
                    old = i64(ncnt[q])
                    nc = old + c
                    if old >= 0 and nc <= INT32_MAX:
                        ncnt[q] = i32(nc)
                    else:
                        nc = get_count(ncnt, wcnt, q) + c
                        wcnt = set_count(ncnt, wcnt, q, nc)
                else:
                    # A new follower, appended at the key's tail (insertion order).
                    nid = i64(len(ntok))
                    ntok = append(ntok, tok32)
                    if c <= INT32_MAX:
                        ncnt = append(ncnt, i32(c))
                    else:
                        ncnt = append(ncnt, 0)
                        wcnt = set_count(ncnt, wcnt, nid, c)
                    nnext = append(nnext, NULL32)
                    nkey = append(nkey, i32(kid))
                    end = i64(tail[kid])
                    if end < 0:
                        head[kid] = i32(nid)
                    else:
                        nnext[end] = i32(nid)
                    tail[kid] = i32(nid)
                    nc = c
                # The aggregates exactly as _after_bump keeps them.
                total += c
                if nc > mx:
                    mx = nc
                    bt = tok32
                elif nc == mx and tok32 < bt:
                    bt = tok32
                node = i64(onext[node])
            if total <= INT32_MAX:  # then neither slot is in a side array (values only grow)
                ksum[kid] = i32(total)
                kmax[kid] = i32(mx)
            else:
                wsum = set_count(ksum, wsum, kid, total)
                wmax = set_count(kmax, wmax, kid, mx)
            best[kid] = bt
        # The grown arrays, and the old tables freed: _fresh builds them at the new sizes.
        self._adopt(
            _legacy.Decoded((k0, k1, head, tail, ksum, kmax, best), (ntok, ncnt, nnext, nkey), (wcnt, wsum, wmax))
        )

    def _clear_keep(self) -> None:
        """Remove every key but keep the table sizes (the replay clears its context per chunk)."""
        n_keys = i64(len(self._k0))
        n_nodes = i64(len(self._ntok))
        self._k0 = vec[i64](capacity=n_keys)
        self._k1 = vec[i64](capacity=n_keys)
        self._head = vec[i32](capacity=n_keys)
        self._tail = vec[i32](capacity=n_keys)
        self._sum = vec[i32](capacity=n_keys)
        self._max = vec[i32](capacity=n_keys)
        self._wsum = vec[i64]()
        self._wmax = vec[i64]()
        self._best = vec[i32](capacity=n_keys)
        self._ntok = vec[i32](capacity=n_nodes)
        self._ncnt = vec[i32](capacity=n_nodes)
        self._wcnt = vec[i64]()
        self._nnext = vec[i32](capacity=n_nodes)
        self._nkey = vec[i32](capacity=n_nodes)
        slots = self._slots
        for j in range(len(slots)):
            slots[j] = NULL32
        pslots = self._pslots
        for j in range(len(pslots)):
            pslots[j] = NULL32
        self._pcount = 0
        self._stale = False  # no keys: empty tables of any size are right
        self._st_kid = -1

    def _part_dict(self, kid: i64) -> dict[int, int]:
        """The followers of key ``kid`` as a new dict, in insertion order."""
        d: dict[int, int] = {}
        node = i64(self._head[kid])
        while node >= 0:
            d[int(self._ntok[node])] = int(self._count(node))
            node = i64(self._nnext[node])
        return d

    def _n_keys_native(self) -> i64:
        """Number of keys."""
        return i64(len(self._k0))

    def _count(self, node: i64) -> i64:
        """The exact count of ``node`` (its int32 slot, or its side entry past INT32_MAX)."""
        return get_count(self._ncnt, self._wcnt, node)

    # --- the static-source interface ------------------------------------------------

    def _st_begin(self, a: i32, b: i32) -> bool:
        """Select the part of the 2-gram (a, b); True when it has followers."""
        if len(self._k0) == 0:
            self._st_kid = -1
            return False
        kid = self._find(pack(a, b), PAD_WORD)
        self._st_kid = kid
        return kid >= 0 and self._head[kid] >= 0

    def _st_count(self, tok: i32) -> i64:
        """Count of ``tok`` in the selected part, ABSENT when it is not a follower."""
        node = self._pair_find(self._st_kid, tok)
        return self._count(node) if node >= 0 else ABSENT

    def _st_pick(self) -> i32:
        """Spec 3.2 from the aggregates: the max-count follower if >= 2 observations and >= 50 %."""
        kid = self._st_kid
        total = get_count(self._sum, self._wsum, kid)
        if total < STATIC_MIN_SAMPLE or 100 * get_count(self._max, self._wmax, kid) < STATIC_MIN_PERCENT * total:
            return NULL32
        return self._best[kid]

    # --- the llama.cpp operations ----------------------------------------------------

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
        lo = max(size - nnew - ngram_max, 0)
        toks = to_vec(tokens, lo)
        self._update_at(toks, -lo, size, min(nnew, size), ngram_min, ngram_max)

    def merge(self, other: NgramCache) -> None:
        """Add every count of ``other`` into this cache (llama.cpp's ``merge``, spec 6)."""
        if other is self:
            # Merging into itself doubles every count; iterate over a copy so new nodes are not revisited.
            other = NgramCache.from_contents(self.contents())
        if len(self._k0) == 0:
            # Into an empty cache, a merge is a copy (same keys, followers and insertion order):
            # copy the arrays and tables instead of probing for every key and follower.
            self._copy_from(other)
            return
        if not self._stale and MERGE_PROBE_RATIO * i64(len(other._k0)) < i64(len(self._k0)):
            # A few counts into a big cache whose tables are built: a probe per key and
            # follower touches less memory than ordering both caches' keys.
            self._merge_native(other)
            return
        self._merge_sorted(other)

    def clear(self) -> None:
        """Remove every key (what llama-lookup-stats does to the context cache per chunk)."""
        self._reset()

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the cache in llama.cpp's legacy format (atomically); counts past 2^31-1 saturate.

        This overwrites ``path`` with this cache alone, as llama.cpp's ``save`` does: when
        several processes share one dynamic cache file, the last save wins and the others'
        new counts are lost. Use ``Drafter.save()``, which merges this process's new counts
        into the file under an exclusive lock, for a shared file.
        """
        from lookupdec._atomic import atomic_writer

        with atomic_writer(path) as f:
            # Keys and followers ascending, as the reference writes them; native sorts, in pieces.
            n_saturated = _legacy.encode(self._k0, self._k1, self._head, self._ntok, self._ncnt, self._nnext, f.write)
        # Compiled, this method has no Python frame: the caller is one level up, not two.
        warn_saturated(path, int(n_saturated), stacklevel=1)

    def _copy_from(self, other: NgramCache) -> None:
        """Make this cache an exact copy of ``other`` (arrays, tables and insertion order)."""
        self._k0 = copy_i64(other._k0)
        self._k1 = copy_i64(other._k1)
        self._head = copy_i32(other._head)
        self._tail = copy_i32(other._tail)
        self._sum = copy_i32(other._sum)
        self._max = copy_i32(other._max)
        self._wsum = copy_i64(other._wsum)
        self._wmax = copy_i64(other._wmax)
        self._best = copy_i32(other._best)
        self._slots = copy_i32(other._slots)
        self._smask = other._smask
        self._ntok = copy_i32(other._ntok)
        self._ncnt = copy_i32(other._ncnt)
        self._wcnt = copy_i64(other._wcnt)
        self._nnext = copy_i32(other._nnext)
        self._nkey = copy_i32(other._nkey)
        self._pslots = copy_i32(other._pslots)
        self._pmask = other._pmask
        self._pcount = other._pcount
        self._stale = other._stale
        self._st_kid = -1

    def _adopt(self, d: _legacy.Decoded) -> None:
        """Take ``d``'s arrays (a decoded file's, or a sorted merge's) as this cache's; tables left stale."""
        self._k0 = d.k0
        self._k1 = d.k1
        self._head = d.head
        self._tail = d.tail
        self._sum = d.ksum
        self._max = d.kmax
        self._wsum = d.wsum
        self._wmax = d.wmax
        self._best = d.best
        self._ntok = d.ntok
        self._ncnt = d.ncnt
        self._wcnt = d.wcnt
        self._nnext = d.nnext
        self._nkey = d.nkey
        # The tables are built on first use (see _fresh): a load followed by a merge and a
        # save, as a Drafter's merge-on-save does, never needs them.
        self._slots = filled_i32(INITIAL_SLOTS, NULL32)
        self._smask = INITIAL_SLOTS - 1
        self._pslots = filled_i32(INITIAL_SLOTS, NULL32)
        self._pmask = INITIAL_SLOTS - 1
        self._pcount = 0
        self._stale = True
        self._st_kid = -1

    @classmethod
    def load(cls, path: str | os.PathLike[str], *, strict: bool = False) -> NgramCache:
        """Read a cache file in any supported format (detected by its first bytes)."""
        from lookupdec.formats import detect_format, read_as_contents
        from lookupdec.formats.detect import read_all

        fmt = detect_format(path)
        if fmt == "llama":
            return parse_legacy(read_all(path), path, strict)
        return NgramCache.from_contents(read_as_contents(path))

    # --- reading ---------------------------------------------------------------------

    def _kid_of(self, key: Sequence[object]) -> i64:
        """Ordinal of a 4-slot key given as a sequence, -1 if absent."""
        ok, w0, w1 = key_words(key)
        if not ok:  # an if statement for the reason given in _find
            return -1
        return self._find(w0, w1)

    def get(self, key: Sequence[int]) -> dict[int, int]:
        """The followers of an n-gram (1..4 tokens or a padded key) as a new dict; empty if absent."""
        k = make_key(key) if len(key) != NGRAM_MAX else as_key(key)
        kid = self._kid_of(k)
        return self._part_dict(kid) if kid >= 0 else {}

    def part(self, key: Key) -> Mapping[int, int] | None:
        """The followers of a padded key (a new dict), or None."""
        kid = self._kid_of(key)
        return self._part_dict(kid) if kid >= 0 else None

    def keys(self) -> Iterator[Key]:
        """Every key, in insertion order."""
        return iter([unpack_key(self._k0[kid], self._k1[kid]) for kid in range(len(self._k0))])

    def items(self) -> Iterator[tuple[Key, dict[int, int]]]:
        """(key, part) pairs in insertion order; the parts are new dicts."""
        return iter([(unpack_key(self._k0[kid], self._k1[kid]), self._part_dict(kid)) for kid in range(len(self._k0))])

    def _sorted_kids(self) -> list[int]:
        """Key ordinals ordered by key (signed slot-wise, as tuples sort)."""
        order = _legacy.key_order(self._k0, self._k1)  # native: a tuple per key made this slow
        return [int(order[i]) for i in range(len(order))]

    def _sorted_followers(self, kid: i64) -> list[tuple[int, int]]:
        """(token, count) pairs of key ``kid``, ascending by token."""
        fol: list[tuple[int, int]] = []
        node = i64(self._head[kid])
        while node >= 0:
            fol.append((int(self._ntok[node]), int(self._count(node))))
            node = i64(self._nnext[node])
        fol.sort()
        return fol

    def contents(self) -> Contents:
        """The canonical form: keys ascending, each with its (token, count) pairs ascending."""
        return [(unpack_key(self._k0[kid], self._k1[kid]), self._sorted_followers(kid)) for kid in self._sorted_kids()]

    def __len__(self) -> int:
        """Number of keys."""
        return len(self._k0)

    def __contains__(self, key: object) -> bool:
        hash(key)  # like a dict: an unhashable key raises TypeError
        if not isinstance(key, tuple):
            return False
        return self._kid_of(key) >= 0

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, NgramCache):
            return NotImplemented
        # With as many keys and nodes in both, every key and follower of self found in other
        # (with its count) makes the two equal: no key or follower of other can be left over.
        if len(self._k0) != len(other._k0) or len(self._ntok) != len(other._ntok):
            return False
        for kid in range(len(self._k0)):
            okid = other._find(self._k0[kid], self._k1[kid])
            if okid < 0:
                return False
            node = i64(self._head[kid])
            while node >= 0:
                onode = other._pair_find(okid, self._ntok[node])
                if onode < 0 or other._count(onode) != self._count(node):
                    return False
                node = i64(self._nnext[node])
        return True

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        # Native classes have no instance __dict__ and vecs do not pickle: pickle (and copy)
        # the contents in insertion order instead, which from_contents rebuilds identically.
        return (rebuild_cache, ([(k, list(p.items())) for k, p in self.items()],))

    def __repr__(self) -> str:
        return f"<fast.NgramCache keys={len(self)} entries={self.n_entries}>"

    @property
    def n_entries(self) -> int:
        """Number of (key, follower) pairs."""
        return len(self._ntok)

    @property
    def total_count(self) -> int:
        """Sum of all counts (the number of observations)."""
        total = 0
        for kid in range(len(self._sum)):
            total += int(get_count(self._sum, self._wsum, kid))
        return total

    @classmethod
    def from_contents(cls, contents: Iterable[tuple[Sequence[int], Iterable[tuple[int, int]]]]) -> NgramCache:
        """Build a cache from (key, [(token, count), ...]) pairs, e.g. :meth:`contents` output."""
        cache = NgramCache()
        for key, followers in contents:
            k = as_key(key)
            ok, w0, w1 = key_words(k)
            if not ok:
                raise TokenRangeError(f"key {k} has a slot outside the int32 range of a llama.cpp token id")
            kid = cache._intern(w0, w1)
            for token, count in followers:
                if count <= 0:
                    raise ValueError(f"count of follower {token} of {k} must be > 0, got {count}")
                if not INT32_MIN <= token <= INT32_MAX:
                    raise TokenRangeError(f"follower {token} of {k} is outside the int32 range of a llama.cpp token id")
                cache._bump(kid, i32(token), i64(count))
        return cache


def rebuild_cache(items: list[tuple[Key, list[tuple[int, int]]]]) -> NgramCache:
    """Unpickle an :class:`NgramCache` (see ``NgramCache.__reduce__``)."""
    return NgramCache.from_contents(items)


def parse_legacy(data: bytes, path: str | os.PathLike[str], strict: bool) -> NgramCache:
    """Decode a legacy cache file exactly like the reference's ``parse_legacy`` (same errors)."""
    cache = NgramCache()
    # decode checks every record first, then builds the arrays in one pass; the tables are
    # built on first use (inserting key by key probed for every key and follower).
    cache._adopt(_legacy.decode(data, path, strict, 3))
    return cache


def table_size(n: i64) -> i64:
    """The open-addressing table size for ``n`` entries: a power of two >= 2n, at least INITIAL_SLOTS."""
    size = INITIAL_SLOTS
    while size < 2 * n:
        size *= 2
    return size


def find_token(words: vec[i64], n: i64, tok: i32) -> i64:
    """Index of the (token, node) word of ``tok`` in ``words[:n]`` (sorted, tokens unique), -1 if none."""
    lo: i64 = 0
    hi = n
    t = i64(tok)
    while lo < hi:
        mid = (lo + hi) >> 1
        mt = words[mid] >> 32
        if mt < t:
            lo = mid + 1
        elif mt > t:
            hi = mid
        else:
            return mid
    return -1


def copy_i64(v: vec[i64]) -> vec[i64]:
    """A copy of ``v`` (vecs share their buffer when assigned)."""
    out = vec[i64](capacity=len(v))
    for i in range(len(v)):
        out = append(out, v[i])
    return out


def copy_i32(v: vec[i32]) -> vec[i32]:
    """A copy of ``v`` (vecs share their buffer when assigned)."""
    out = vec[i32](capacity=len(v))
    for i in range(len(v)):
        out = append(out, v[i])
    return out


# --- drafting (spec 3, 4, 5, 9, 10) ----------------------------------------------------


TOUCH_MIN_KEYS: Final[i64] = 1 << 15
"""From this many keys on, ``try_primary`` reads its probes' slots ahead (a smaller cache stays in
the CPU's caches, where the extra pass would only cost)."""


def ngram_words(seq: vec[i32], p: i64, n: i64) -> tuple[i64, i64]:
    """The packed key of the ``n``-gram at ``seq[p:p+n]`` (padded with -1 to four tokens)."""
    t0 = seq[p]
    t1 = seq[p + 1] if n > 1 else NULL32
    t2 = seq[p + 2] if n > 2 else NULL32
    t3 = seq[p + 3] if n > 3 else NULL32
    return pack(t0, t1), pack(t2, t3)


def try_primary(
    c: NgramCache,
    seq: vec[i32],
    avail: i64,
    nmin: i64,
    nmax: i64,
    min_sample: vec[i64],
    min_percent: vec[i64],
    st: StaticSource,
    has_st: bool,
) -> i32:
    """The token ``c`` proposes after ``seq`` (spec 3.1), -1 if none.

    ``avail`` is the length of the whole combined sequence (``seq`` holds only its tail);
    n-grams longer than ``avail`` are skipped (spec 9).
    """
    if len(c._k0) == 0:
        return NULL32
    pos = i64(len(seq))
    top = nmax - nmin
    if i64(len(c._k0)) >= TOUCH_MIN_KEYS and not c._stale:
        # Each n-gram's slot, and the key it holds, read ahead in a pass that branches on none
        # of the keys: in a big cache (the dynamic one) every probe is a cache miss, and this
        # way they overlap, where the loop below waited for each n-gram's before the next.
        slots = c._slots
        k0 = c._k0
        mask = c._smask
        sink: i64 = 0
        for k in range(top + 1):
            n = nmin + top - k
            if n <= avail:
                w0, w1 = ngram_words(seq, pos - n, n)
                s = i64(slots[key_hash(w0, w1) & mask])
                if s >= 0:
                    sink ^= k0[s]
        c._touch = sink  # kept, so the compiler keeps the reads
    # The reference's ``for i in range(top, -1, -1)``, longest n-gram first. mypyc compiles a
    # range with a negative step through tagged Python ints (CPyTagged_* calls in the generated
    # C) but one with the default step on i64 natively, hence the count up and ``top - k``.
    for k in range(top + 1):
        i = top - k  # indexes the threshold tables
        n = nmin + i
        if n > avail:  # spec 9: the n-gram would start before position 0
            continue
        w0, w1 = ngram_words(seq, pos - n, n)
        kid = c._find(w0, w1)
        if kid < 0:
            continue
        total = i64(c._sum[kid])
        mx = i64(c._max[kid])
        if total < 0:  # past int32: the exact sum and max are in the side arrays
            total = c._wsum[-1 - total]
            mx = get_count(c._max, c._wmax, kid)
        if total < min_sample[i]:
            continue
        pct = min_percent[i]
        # Lemire's precheck (spec 10): the selected count is <= the max, so this cannot pass later.
        if 100 * mx < pct * total:
            continue
        if not has_st and mx <= INT32_MAX:
            # Every weight is 1 and no count wraps: the selection is the max count, smallest
            # id on ties, i.e. the precomputed best; the share test is the precheck just passed.
            return c._best[kid]
        # Score every follower. The list is in insertion order, not by id, so a tie goes to the
        # smaller id explicitly: the same outcome as ascending order with a strict ">" (spec 4).
        found = False
        best_t = NULL32
        best_c: i64 = 0
        best_s: i64 = 0
        ntok = c._ntok
        ncnt = c._ncnt
        wcnt = c._wcnt
        nnext = c._nnext
        node = i64(c._head[kid])
        while node >= 0:
            tok = ntok[node]
            cnt = i64(ncnt[node])
            if cnt < 0:
                cnt = wcnt[-1 - cnt]
            w: i64 = 1
            if has_st:
                stc = st._st_count(tok)
                if stc != ABSENT:
                    w = wrap32(100 * wrap32(stc))
            s = wrap32(wrap32(cnt) * w)
            if s > best_s or (s == best_s and found and tok < best_t):
                found = True
                best_t = tok
                best_c = cnt
                best_s = s
            node = i64(nnext[node])
        if 100 * best_c < pct * total:
            continue
        return best_t
    return NULL32


def draft_core(
    seq: vec[i32],
    avail0: i64,
    n_draft: i64,
    nmin: i64,
    nmax: i64,
    ctx: NgramCache,
    dyn: NgramCache,
    st: StaticSource,
) -> vec[i32]:
    """Append up to ``n_draft`` drafted tokens to ``seq`` (the last <= 4 tokens of ``inp``, at least 2).

    ``avail0`` = ``len(inp)``. Returns the grown vec (vecs are values: append may reallocate).
    """
    k: i64 = 0
    while k < n_draft:
        pos = i64(len(seq))
        avail = avail0 + k
        has_st = st._st_begin(seq[pos - 2], seq[pos - 1])
        t = try_primary(ctx, seq, avail, nmin, nmax, LAX_MIN_SAMPLE, LAX_MIN_PERCENT, st, has_st)
        if t == NULL32:
            t = try_primary(dyn, seq, avail, nmin, nmax, STRICT_MIN_SAMPLE, STRICT_MIN_PERCENT, st, has_st)
        if t == NULL32 and has_st:
            t = st._st_pick()
        if t == NULL32:
            break
        seq = append(seq, t)
        k += 1
    return seq


def draft_list(
    inp: Sequence[int],
    drafted: list[int],
    n_draft: int,
    ngram_min: int,
    ngram_max: int,
    ctx: NgramCache,
    dyn: NgramCache,
    st: StaticSource,
) -> None:
    """``draft`` for native caches; ``inp`` has >= 2 tokens, all int32."""
    n = len(inp)
    lo = n - NGRAM_MAX if n > NGRAM_MAX else 0
    tail = to_vec(inp, lo)
    base = len(tail)
    out = draft_core(tail, n, n_draft, ngram_min, ngram_max, ctx, dyn, st)
    for j in range(base, len(out)):
        drafted.append(int(out[j]))


# --- the llama-lookup-stats loop (spec 8.2) ----------------------------------------------


def replay_core(
    toks: vec[i32],
    n_ctx: i64,
    n_draft: i64,
    st: StaticSource,
    dyn: NgramCache,
    progress: Callable[[int, int], None] | None,
    total: i64,
) -> tuple[i64, i64, i64, float]:
    """The replay loop; returns (n_drafted, n_accept, n_steps, t_draft seconds).

    The accepted tokens are the chunk's own tokens, so ``out`` is never materialized: it is
    ``toks[i_start : i_start + pos]``. Timing covers each chunk's drafting and context updates
    (and the trivial accept loop), not the merge, as llama.cpp's ``t_draft``.
    """
    ctx = NgramCache()
    n_drafted: i64 = 0
    n_accept: i64 = 0
    n_steps: i64 = 0
    t_draft = 0.0
    i_start: i64 = 0
    # One buffer for every step's tail and drafts: append into spare capacity writes in place
    # and returns a longer vec over the same memory, so starting each step from this empty vec
    # reuses it (a new vec per step was a malloc and a free per step). Nothing reads a step's
    # tail after the step, so sharing is safe; were append ever to copy, it would only be slower.
    empty = vec[i32](capacity=NGRAM_MAX + n_draft)
    while i_start + n_ctx < total:
        t0 = time.perf_counter()
        pos: i64 = 1
        while pos < n_ctx:
            n_steps += 1
            nd: i64 = 0
            tail = empty
            if pos >= 2:
                # Not ``lo = pos - 4 if pos > 4 else 0``: mypyc types that expression as a Python
                # int (i64 | literal), so lo was boxed and the range below ran on tagged ints.
                lo: i64 = 0
                if pos > 4:
                    lo = pos - 4
                for j in range(i_start + lo, i_start + pos):
                    tail = append(tail, toks[j])
                base = i64(len(tail))
                tail = draft_core(tail, pos, n_draft, NGRAM_MIN, NGRAM_MAX, ctx, dyn, st)
                nd = i64(len(tail)) - base
                n_drafted += nd
                j2: i64 = 0
                while j2 < nd and pos < n_ctx:
                    if toks[i_start + pos] != tail[base + j2]:
                        break
                    n_accept += 1
                    pos += 1
                    ctx._update_at(toks, i_start, pos, 1, NGRAM_MIN, NGRAM_MAX)
                    j2 += 1
            if pos < n_ctx:  # the "sampled" token is the ground truth
                pos += 1
                ctx._update_at(toks, i_start, pos, 1, NGRAM_MIN, NGRAM_MAX)
        t_draft += time.perf_counter() - t0
        dyn._merge_native(ctx)
        ctx._clear_keep()
        i_start += n_ctx
        if progress is not None:
            progress(int(min(i_start, total)), int(total))
    return n_drafted, n_accept, n_steps, t_draft


# --- the public functions -----------------------------------------------------------------


def require_cache(cache: object, what: str) -> NgramCache:
    """``cache`` itself when it is a fast :class:`NgramCache`; TypeError naming ``what`` otherwise.

    No silent fallback to slower code: a cache of another type (e.g. the reference's) is
    converted once by the caller, ``NgramCache.from_contents(cache.contents())``.
    """
    if isinstance(cache, NgramCache):
        return cache
    hint = ""
    if hasattr(cache, "contents"):
        hint = "; convert it once with lookupdec.fast.NgramCache.from_contents(cache.contents())"
    raise TypeError(
        f"{what} must be a lookupdec.fast.NgramCache, not {type(cache).__module__}.{type(cache).__name__}{hint}"
    )


def require_static_source(nc_static: object) -> StaticSource:
    """``nc_static`` as a :class:`StaticSource` (see :func:`as_static_source`); TypeError if it has no ``part``."""
    st = as_static_source(nc_static)
    if st is None:
        raise TypeError(
            "nc_static must be None, a lookupdec.fast NgramCache or StaticIndex, or an object with "
            f"part(key), not {type(nc_static).__module__}.{type(nc_static).__name__}"
        )
    return st


def build_static(tokens: Sequence[int]) -> NgramCache:
    """The static cache of a corpus: all its 2-grams (llama-lookup-create, spec 8.1)."""
    cache = NgramCache()
    cache.update(tokens, len(tokens), NGRAM_STATIC, NGRAM_STATIC)
    return cache


def draft(
    inp: Sequence[int],
    draft: list[int],
    n_draft: int,
    ngram_min: int,
    ngram_max: int,
    nc_context: object,
    nc_dynamic: object,
    nc_static: object,
) -> None:
    """Append up to ``n_draft`` drafted tokens to ``draft`` (llama.cpp's ``common_ngram_cache_draft``).

    ``draft`` must hold exactly one token, the last sampled one, which the caller has
    also appended to ``inp``; it is never read. Drafting stops at the first position
    where neither the context, the dynamic nor the static cache proposes a token.
    The context and dynamic caches are fast :class:`NgramCache` objects (anything else
    raises TypeError: convert a reference cache once with
    ``NgramCache.from_contents(cache.contents())``); the static one may also be a
    ``StaticIndex``, None (none), or any object with the reference's ``part(key)``. The
    last 4 ids of ``inp`` must fit in int32 (:class:`TokenRangeError` otherwise), like
    every token the fast path stores.
    """
    if len(draft) != 1:
        raise ValueError(f"draft must hold exactly the last sampled token, got {len(draft)} tokens")
    check_ngram_range(ngram_min, ngram_max)
    if len(inp) < 2:
        return
    ctx = require_cache(nc_context, "nc_context")
    dyn = require_cache(nc_dynamic, "nc_dynamic")
    st = require_static_source(nc_static)
    if not fits_tokens(inp[-NGRAM_MAX:]):
        raise TokenRangeError(
            f"the last {NGRAM_MAX} ids of inp ({list(inp[-NGRAM_MAX:])}) must be integers in the int32 range "
            "of a llama.cpp token id"
        )
    draft_list(inp, draft, n_draft, ngram_min, ngram_max, ctx, dyn, st)
