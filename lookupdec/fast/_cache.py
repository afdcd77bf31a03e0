"""The n-gram cache as flat native arrays (the reference's :mod:`lookupdec.reference.cache`).

This module is compiled by mypyc (``HOT_MODULES`` in ``setup.py``); it also runs unchanged as plain Python,
only much slower. Everything hot is a plain typed function or a method of a native class
working on ``librt.vecs.vec`` of ``i32``/``i64``, which mypyc indexes without boxing.

Layout of :class:`NgramCache` (all arrays indexed by a key ordinal ``kid`` or a node ``nid``;
the first ``_nk`` items of each key array are the keys, the first ``_nn`` of each node array the
nodes, and the rest is spare room that new keys and nodes are stored into: code that takes an
array's length as the count calls ``_compact`` first):

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
  so a count update never walks a long list. Most keys of a replay are seen once or twice, so
  the table holds a small share of the nodes and stays small.

Counts (``ncnt``) and the per-key ``sum`` and ``max`` are exact, like the reference's unbounded
Python ints, but stored in int32 slots: a value past 2^31-1, which only merges of big caches
reach, lives in an i64 side array (``wcnt``, ``wsum``, ``wmax``) and its slot holds
``-1 - index`` there (no real count or sum is negative; see :func:`get_count`). That is 12
bytes a key and node less than i64 slots. Counts
saturate only when written to a file. The int32 wrap-around of llama.cpp's weight and score
(spec 5) is emulated explicitly with :func:`wrap32`.
"""

from __future__ import annotations

import operator
import os
from array import array
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Final, SupportsIndex, cast

from librt.vecs import append, vec
from mypy_extensions import i32, i64

from lookupdec.errors import TokenRangeError, warn_saturated
from lookupdec.fast import _legacy
from lookupdec.fast._merge import merge_sorted
from lookupdec.fast._source import ABSENT, STATIC_MIN_PERCENT, STATIC_MIN_SAMPLE, StaticSource
from lookupdec.fast._tables import (
    INT32_MAX,
    INT32_MIN,
    NGRAM_MAX,
    NGRAM_MIN,
    NGRAM_STATIC,
    NULL32,
    TOKEN_NULL,
    copy_i32,
    copy_i64,
    empty_slot,
    empty_slot64,
    filled_i32,
    filled_i64,
    get_count,
    grown_i32,
    grown_i64,
    hash_tag,
    key_hash,
    key_probe,
    key_tag,
    low32,
    pack,
    pair_hash,
    pair_probe,
    set_count,
)

Key = tuple[int, int, int, int]
"""A padded 4-slot n-gram key."""
Contents = list[tuple[Key, list[tuple[int, int]]]]
"""A cache's canonical form: keys ascending, each with its followers ascending by token."""


# pack(TOKEN_NULL, TOKEN_NULL): the second word of every key of size <= 2.
PAD_WORD: Final[i64] = -1
INITIAL_SLOTS: Final[i64] = 16
# A key whose counts sum to at most this many is scanned (its list has at most this many
# nodes); the pair table holds the nodes of the keys past it. Bigger saves table memory and
# costs longer scans (each node is two reads, ``ntok`` and ``nnext``, often cache misses).
SCAN_MAX: Final[i64] = 8
# NgramCache.merge probes the tables (built) for every key and follower of the other cache
# when this cache has at least this many times more keys; otherwise it orders both caches'
# keys and walks them side by side (see _merge.merge_sorted), which reads memory in order.
MERGE_PROBE_RATIO: Final[i64] = 8


def table_size(n: i64) -> i64:
    """The open-addressing table size for ``n`` entries: a power of two >= 2n, at least INITIAL_SLOTS."""
    size = INITIAL_SLOTS
    while size < 2 * n:
        size *= 2
    return size


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
    _slots: vec[i64]
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
    _nk: i64
    _nn: i64

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
        self._slots = filled_i64(INITIAL_SLOTS, -1)
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
        self._nk = 0
        self._nn = 0

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
            self._rehash_keys(table_size(self._nk))
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
        slots = filled_i64(size, -1)
        mask = size - 1
        k0 = self._k0
        k1 = self._k1
        for kid in range(self._nk):
            h = key_hash(k0[kid], k1[kid])
            slots[empty_slot64(slots, h & mask, mask)] = hash_tag(h) | kid
        self._slots = slots
        self._smask = mask

    def _intern(self, w0: i64, w1: i64) -> i64:
        """Ordinal of the packed key, inserting it (with no followers) if absent.

        Makes the tables fresh, so :meth:`_bump` of the ordinal it returns needs no check.
        """
        if self._stale:
            self._fresh()
        s = key_probe(self._slots, self._k0, self._k1, self._smask, w0, w1)
        if s >= 0:
            return s
        return self._new_key(-1 - s, w0, w1, NULL32, 0, NULL32)

    def _new_key(self, slot: i64, w0: i64, w1: i64, node: i32, c: i32, best: i32) -> i64:
        """Add the packed key at the empty key-table ``slot`` and return its ordinal: its list
        is the one node ``node`` (-1: none), its sum and max ``c``, its best token ``best``."""
        kid = self._nk
        if kid == i64(len(self._k0)):
            self._grow_keys()
        self._slots[slot] = key_tag(w0, w1) | kid
        # Stores into spare room, not appends: an append is a call through librt's API table
        # (and a reference-count round trip for the vec), seven per new key, which was most of
        # the replay's context updates (docs/performance-log.md).
        self._k0[kid] = w0
        self._k1[kid] = w1
        self._head[kid] = node
        self._tail[kid] = node
        self._sum[kid] = c
        self._max[kid] = c
        self._best[kid] = best
        self._nk = kid + 1
        mask = self._smask
        if 2 * (kid + 1) > mask + 1:  # past load 1/2: double the table
            self._rehash_keys(2 * (mask + 1))
        return kid

    def _grow_keys(self) -> None:
        """More room in the key arrays (``_nk`` of them are keys; the rest is spare)."""
        self._k0 = grown_i64(self._k0)
        self._k1 = grown_i64(self._k1)
        self._head = grown_i32(self._head)
        self._tail = grown_i32(self._tail)
        self._sum = grown_i32(self._sum)
        self._max = grown_i32(self._max)
        self._best = grown_i32(self._best)

    def _grow_nodes(self) -> None:
        """More room in the node arrays (``_nn`` of them are nodes; the rest is spare)."""
        self._ntok = grown_i32(self._ntok)
        self._ncnt = grown_i32(self._ncnt)
        self._nnext = grown_i32(self._nnext)
        self._nkey = grown_i32(self._nkey)

    def _new_node(self, kid: i64, tok: i32, c: i32) -> i64:
        """Add a node (follower ``tok`` of key ``kid``, count slot ``c``, no next) and return it;
        the caller links it into the key's list."""
        nid = self._nn
        if nid == i64(len(self._ntok)):
            self._grow_nodes()
        self._ntok[nid] = tok
        self._ncnt[nid] = c
        self._nnext[nid] = NULL32
        self._nkey[nid] = i32(kid)
        self._nn = nid + 1
        return nid

    def _compact(self) -> None:
        """Drop the spare room of every array, so that each holds exactly the keys or nodes: for
        the code that takes an array's length as its count (the file encoder, the sorted merge)."""
        nk = self._nk
        if i64(len(self._k0)) != nk:
            self._k0 = self._k0[:nk]
            self._k1 = self._k1[:nk]
            self._head = self._head[:nk]
            self._tail = self._tail[:nk]
            self._sum = self._sum[:nk]
            self._max = self._max[:nk]
            self._best = self._best[:nk]
        nn = self._nn
        if i64(len(self._ntok)) != nn:
            self._ntok = self._ntok[:nn]
            self._ncnt = self._ncnt[:nn]
            self._nnext = self._nnext[:nn]
            self._nkey = self._nkey[:nn]

    def _add(self, w0: i64, w1: i64, tok: i32, c: i64) -> None:
        """Add ``c`` (> 0) to the count of follower ``tok`` of the packed key, creating either.

        ``update``'s step: :meth:`_intern` then :meth:`_bump`, except that a new key is written
        with its one follower at once (most keys of a replay are new: its 3- and 4-grams),
        without the empty key's writes that ``_bump`` would then read back and overwrite.
        """
        if self._stale:
            self._fresh()
        s = key_probe(self._slots, self._k0, self._k1, self._smask, w0, w1)
        if s >= 0:
            self._bump(s, tok, c)
            return
        if c > INT32_MAX:  # only a merge of big counts: the general way, through the side arrays
            self._bump(self._intern(w0, w1), tok, c)
            return
        kid = self._new_key(-1 - s, w0, w1, i32(self._nn), i32(c), tok)
        self._new_node(kid, tok, i32(c))
        if c > SCAN_MAX:
            self._start_probing(kid)

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
        for nid in range(self._nn):
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
        for nid in range(self._nn):
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
        if c <= INT32_MAX:
            nid = self._new_node(kid, tok, i32(c))
        else:  # past int32 (a merge of big counts): kept exactly in the side array
            nid = self._new_node(kid, tok, 0)
            self._wcnt = set_count(self._ncnt, self._wcnt, nid, c)
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
                self._add(pack(t0, t1), pack(t2, t3), toks[base + i], 1)

    def _merge_native(self, other: NgramCache) -> None:
        """Add every count of ``other`` (key order, then follower order, as the reference)."""
        ok0 = other._k0
        ok1 = other._k1
        ohead = other._head
        n_keys = other._nk
        for kid in range(n_keys):
            mine = self._intern(ok0[kid], ok1[kid])
            node = i64(ohead[kid])
            while node >= 0:
                self._bump(mine, other._ntok[node], get_count(other._ncnt, other._wcnt, node))
                node = i64(other._nnext[node])

    def _clear_keep(self) -> None:
        """Remove every key but keep the arrays' room and the table sizes (the replay clears its
        context per chunk)."""
        # The key and node arrays are kept whole: what is past the counts is spare room, which
        # the next keys overwrite (no reallocation, no page faults on fresh memory per chunk).
        self._nk = 0
        self._nn = 0
        self._wsum = vec[i64]()
        self._wmax = vec[i64]()
        self._wcnt = vec[i64]()
        slots = self._slots
        for j in range(len(slots)):
            slots[j] = -1
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
        return self._nk

    def _count(self, node: i64) -> i64:
        """The exact count of ``node`` (its int32 slot, or its side entry past INT32_MAX)."""
        return get_count(self._ncnt, self._wcnt, node)

    # --- the static-source interface ------------------------------------------------

    def _st_begin(self, a: i32, b: i32) -> bool:
        """Select the part of the 2-gram (a, b); True when it has followers."""
        if self._nk == 0:
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
        if self._nk == 0:
            # Into an empty cache, a merge is a copy (same keys, followers and insertion order):
            # copy the arrays and tables instead of probing for every key and follower.
            self._copy_from(other)
            return
        if not self._stale and MERGE_PROBE_RATIO * other._nk < self._nk:
            # A few counts into a big cache whose tables are built: a probe per key and
            # follower touches less memory than ordering both caches' keys.
            self._merge_native(other)
            return
        merge_sorted(self, other)

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

        self._compact()  # the encoder takes the arrays' lengths as the counts
        with atomic_writer(path) as f:
            # Keys and followers ascending, as the reference writes them; native sorts, in pieces.
            n_saturated = _legacy.encode(self._k0, self._k1, self._head, self._ntok, self._ncnt, self._nnext, f.write)
        # Compiled, this method has no Python frame: the caller is one level up, not two.
        warn_saturated(path, int(n_saturated), stacklevel=1)

    def _copy_from(self, other: NgramCache) -> None:
        """Make this cache an exact copy of ``other`` (arrays, tables and insertion order)."""
        other._compact()  # only its keys and nodes are copied
        self._nk = other._nk
        self._nn = other._nn
        self._k0 = copy_i64(other._k0)
        self._k1 = copy_i64(other._k1)
        self._head = copy_i32(other._head)
        self._tail = copy_i32(other._tail)
        self._sum = copy_i32(other._sum)
        self._max = copy_i32(other._max)
        self._wsum = copy_i64(other._wsum)
        self._wmax = copy_i64(other._wmax)
        self._best = copy_i32(other._best)
        self._slots = copy_i64(other._slots)
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
        self._nk = i64(len(d.k0))
        self._nn = i64(len(d.ntok))
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
        self._slots = filled_i64(INITIAL_SLOTS, -1)
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
        return iter([unpack_key(self._k0[kid], self._k1[kid]) for kid in range(self._nk)])

    def items(self) -> Iterator[tuple[Key, dict[int, int]]]:
        """(key, part) pairs in insertion order; the parts are new dicts."""
        return iter([(unpack_key(self._k0[kid], self._k1[kid]), self._part_dict(kid)) for kid in range(self._nk)])

    def _sorted_kids(self) -> list[int]:
        """Key ordinals ordered by key (signed slot-wise, as tuples sort)."""
        self._compact()  # key_order takes the arrays' length as the number of keys
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
        return int(self._nk)

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
        if self._nk != other._nk or self._nn != other._nn:
            return False
        for kid in range(self._nk):
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
        return int(self._nn)

    @property
    def total_count(self) -> int:
        """Sum of all counts (the number of observations)."""
        total = 0
        for kid in range(self._nk):
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


def build_static(tokens: Sequence[int]) -> NgramCache:
    """The static cache of a corpus: all its 2-grams (llama-lookup-create, spec 8.1)."""
    cache = NgramCache()
    cache.update(tokens, len(tokens), NGRAM_STATIC, NGRAM_STATIC)
    return cache
