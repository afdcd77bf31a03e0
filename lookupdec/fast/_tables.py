"""The flat native tables the fast path is built on: packing, hashing, probing, int32 count slots.

Compiled by mypyc (``HOT_MODULES`` in ``setup.py``). Plain typed functions on ``librt.vecs.vec``
of ``i32``/``i64``, which mypyc indexes without boxing; every open-addressing table of the fast
path probes through the functions here.
"""

from __future__ import annotations

from typing import Final

from librt.vecs import append, extend, vec
from mypy_extensions import i32, i64

# Final ints of the rules module: mypyc folds their values into the C code here.
from lookupdec.rules import INT32_MAX as INT32_MAX
from lookupdec.rules import INT32_MIN as INT32_MIN
from lookupdec.rules import NGRAM_MAX as NGRAM_MAX
from lookupdec.rules import NGRAM_MIN as NGRAM_MIN
from lookupdec.rules import NGRAM_STATIC as NGRAM_STATIC
from lookupdec.rules import TOKEN_NULL as TOKEN_NULL

M32: Final[i64] = 0xFFFFFFFF
HI32: Final[i64] = -4294967296  # ~M32: the high 32 bits of an i64
TWO32: Final[i64] = 4294967296
NULL32: Final[i32] = -1


FILL_BLOCK: Final[i64] = 4096
"""Items per copy in :func:`filled_i32` (16 KiB: stays in the L1 cache while it is copied)."""


def filled_i32(n: i64, value: i32) -> vec[i32]:
    """A vec of ``n`` copies of ``value``."""
    # Whole blocks copied by extend (a memcpy each), not n appends: a hash table's slots are
    # filled this way on every rehash, where an append per slot showed in a replay's profile.
    # The block is a separate vec because extending a vec with
    # itself reallocates it every time; ``v`` is allocated once, at its final size.
    blk = vec[i32]([value])
    while 2 * i64(len(blk)) <= n and i64(len(blk)) < FILL_BLOCK:
        blk = extend(blk, blk)
    v = vec[i32](capacity=n)
    while i64(len(v)) + i64(len(blk)) <= n:
        v = extend(v, blk)
    if i64(len(v)) < n:
        v = extend(v, blk[: n - i64(len(v))])
    return v


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
# through these functions (the other in-memory tables through word_probe and token_probe
# below): the only copies of the probe loop. A probe returns one i64,
# the entry found or ``-1 - slot`` for the empty slot, so a caller tests its sign and an
# insert knows where to write without probing again. mypyc compiles each call to a direct C
# call (``CPyDef__tables___key_probe``), which gcc inlines only because setup.py passes
# -fno-semantic-interposition (see there): without it a shared probe costs more than a copied
# loop.


def hash_tag(h: i64) -> i64:
    """The key table's entry bits above the ordinal for a key of hash ``h``: its high 31 bits
    (``key_hash`` is below 2**63), in place. An entry is ``tag | kid``; -1 is an empty slot."""
    return (h >> 32) << 32


def key_tag(w0: i64, w1: i64) -> i64:
    """:func:`hash_tag` of the packed key (w0, w1)."""
    return hash_tag(key_hash(w0, w1))


def key_probe(slots: vec[i64], k0: vec[i64], k1: vec[i64], mask: i64, w0: i64, w1: i64) -> i64:
    """Probe ``slots`` for the packed key (w0, w1): its ordinal if present, else ``-1 - h``
    for the empty slot ``h`` where it would be inserted (so any negative result means absent).

    An entry holds the key's hash bits above its ordinal (see :func:`key_tag`), as the fork's
    buckets hold a fingerprint: a slot of another key is passed over without reading that key,
    which in a big cache (the dynamic one) was a cache miss per slot passed (two and a half
    slots on average for an absent key at load 1/2).
    """
    return key_probe_h(slots, k0, k1, mask, w0, w1, key_hash(w0, w1))


def key_probe_h(slots: vec[i64], k0: vec[i64], k1: vec[i64], mask: i64, w0: i64, w1: i64, h: i64) -> i64:
    """:func:`key_probe` with the key's :func:`key_hash` ``h`` given (drafting hashes each
    n-gram once for the context and the dynamic cache)."""
    tag = hash_tag(h)
    h &= mask
    while True:
        e = slots[h]
        if e < 0:
            return -1 - h
        if e & HI32 == tag:
            s = e & M32
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


# The tables of one-word keys (the hybrid policy's bigrams, a corpus's bigrams) and of single
# tokens (its unigrams) probe the same way, hashed as key_hash hashes a key of that word.
# Two functions of one shape, not one generic: mypyc indexes vec[i64] and vec[i32] natively only
# when the type is known, and a Union or a type variable would box every read.


def word_probe(slots: vec[i32], keys: vec[i64], mask: i64, w: i64) -> i64:
    """Probe ``slots`` for the word ``w`` among ``keys``, like :func:`key_probe`: its ordinal if
    present, else ``-1 - h`` for the empty slot ``h`` where it would be inserted."""
    h = key_hash(w, -1) & mask
    while True:
        s = i64(slots[h])
        if s < 0:
            return -1 - h
        if keys[s] == w:
            return s
        h = (h + 1) & mask


def word_slots(keys: vec[i64], size: i64) -> vec[i32]:
    """A table of ``size`` slots (a power of two) holding the ordinals of ``keys`` (distinct)
    where :func:`word_probe` finds them."""
    slots = filled_i32(size, NULL32)
    for j in range(len(keys)):
        slots[empty_slot(slots, key_hash(keys[j], -1) & (size - 1), size - 1)] = i32(j)
    return slots


def token_probe(slots: vec[i32], keys: vec[i32], mask: i64, t: i32) -> i64:
    """Probe ``slots`` for token ``t`` among ``keys``, like :func:`word_probe`."""
    h = key_hash(pack(t, t), -1) & mask
    while True:
        s = i64(slots[h])
        if s < 0:
            return -1 - h
        if keys[s] == t:
            return s
        h = (h + 1) & mask


def token_slots(keys: vec[i32], size: i64) -> vec[i32]:
    """A table of ``size`` slots (a power of two) holding the ordinals of ``keys`` (distinct
    tokens) where :func:`token_probe` finds them."""
    slots = filled_i32(size, NULL32)
    for j in range(len(keys)):
        slots[empty_slot(slots, key_hash(pack(keys[j], keys[j]), -1) & (size - 1), size - 1)] = i32(j)
    return slots


# The home slot of a 2-gram in the lookupdec index and corpus files (their format's hash).
# The hash multiplier 0x9E3779B97F4A7C15 as two 32-bit halves (see static_slot).
MUL_HI: Final[i64] = 0x9E3779B9
MUL_LO: Final[i64] = 0x7F4A7C15


def mul32(a: i64, b: i64) -> tuple[i64, i64]:
    """(high 32 bits, low 32 bits) of ``a * b`` for ``0 <= a, b < 2**32``.

    Computed from 16-bit pieces so no intermediate reaches 2**63: the same result compiled
    (where i64 would silently wrap) and interpreted (where ints are unbounded).
    """
    al = a & 0xFFFF
    ah = a >> 16
    p1 = al * b
    p2 = ah * b
    s = p1 + ((p2 & 0xFFFF) << 16)
    return (p2 >> 16) + (s >> 32), s & M32


def static_slot(a: i32, b: i32, bits: i64) -> i64:
    """Home slot of the 2-gram (a, b): ``((k * 0x9E3779B97F4A7C15) mod 2**64) >> (64 - bits)``.

    ``k`` is the packed key ``(a << 32) | (b & 0xFFFFFFFF)`` as an unsigned 64-bit number.
    """
    hi = i64(a) & M32
    lo = i64(b) & M32
    h1, l1 = mul32(lo, MUL_LO)
    # Named, not ``_``: mypyc types ``_`` as object and boxed both high halves (see filled_i32).
    _h2, x1 = mul32(lo, MUL_HI)
    _h3, x2 = mul32(hi, MUL_LO)
    rhi = (h1 + x1 + x2) & M32
    if bits <= 32:
        return rhi >> (32 - bits)
    return (rhi << (bits - 32)) | (l1 >> (64 - bits))


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


def empty_slot(slots: vec[i32], h: i64, mask: i64) -> i64:
    """The first empty (-1) slot at or after ``h``, wrapping by ``mask``: where a rehash puts an
    entry (every entry is distinct, so nothing needs comparing)."""
    while slots[h] >= 0:
        h = (h + 1) & mask
    return h


def empty_slot64(slots: vec[i64], h: i64, mask: i64) -> i64:
    """:func:`empty_slot` for a table of i64 entries (the key table of an NgramCache)."""
    while slots[h] >= 0:
        h = (h + 1) & mask
    return h


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


def zeros_i64(n: i64) -> vec[i64]:
    """A vec of ``n`` zeros."""
    if n >= FILL_BLOCK:
        # Block copies: a fresh HybridState's tables hold about a million items, which one
        # append each made in about a third of the time a fresh hybrid Drafter took to make.
        return filled_i64(n, 0)
    v = vec[i64](capacity=n)
    for _i in range(n):  # not ``_``, which mypyc boxes: see filled_i32
        v = append(v, 0)
    return v


def filled_i64(n: i64, value: i64) -> vec[i64]:
    """A vec of ``n`` copies of ``value`` (block copies, as :func:`filled_i32`)."""
    # filled_i32's code for vec[i64]: mypyc indexes a vec natively only at a concrete item type.
    blk = vec[i64]([value])
    while 2 * i64(len(blk)) <= n and i64(len(blk)) < FILL_BLOCK:
        blk = extend(blk, blk)
    v = vec[i64](capacity=n)
    while i64(len(v)) + i64(len(blk)) <= n:
        v = extend(v, blk)
    if i64(len(v)) < n:
        v = extend(v, blk[: n - i64(len(v))])
    return v


GROW_BLOCK: Final[i64] = 4096
"""Items an array of an NgramCache grows by when its spare room runs out (see :func:`grown_i64`)."""
ZEROS_I64: Final = filled_i64(GROW_BLOCK, 0)
ZEROS_I32: Final = filled_i32(GROW_BLOCK, 0)


def grown_i64(v: vec[i64]) -> vec[i64]:
    """``v`` with GROW_BLOCK zeros more: spare room that stores fill in place of appends.

    A fixed block, not a doubling: the zeros are written, so they are resident memory, while
    the room librt reserves past a vec's length (it doubles its capacity when an extend runs
    out, as for an append) is never touched until used. Doubling the length made a replay's
    peak RSS 1.22x the fork's at 4M tokens and 1.14x at 25 MB (``perf fork``, 2026-12-03), against
    1.04x and 1.00x with blocks.
    """
    return extend(v, ZEROS_I64)


def grown_i32(v: vec[i32]) -> vec[i32]:
    """``v`` with GROW_BLOCK zeros more (see :func:`grown_i64`)."""
    return extend(v, ZEROS_I32)
