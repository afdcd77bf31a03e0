"""Drafting from the fast caches (spec 3, 4, 5, 9, 10): llama.cpp's ``common_ngram_cache_draft``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from librt.vecs import append, vec
from mypy_extensions import i32, i64

from lookupdec.errors import TokenRangeError
from lookupdec.fast._cache import NgramCache, check_ngram_range, fits_tokens, require_cache, to_vec
from lookupdec.fast._source import ABSENT, PartAdapter, StaticSource
from lookupdec.fast._tables import (
    HI32,
    INT32_MAX,
    M32,
    NGRAM_MAX,
    NGRAM_MIN,
    NULL32,
    filled_i64,
    get_count,
    hash_tag,
    key_hash,
    key_probe_h,
    pack,
    wrap32,
)

# Thresholds by index i = n - ngram_min (spec 3.1): minimum number of observations and the
# minimum percent share of the selected token. LAX for the context cache, STRICT for dynamic.
# The reference's tables are tuples; these are vec[i64] because mypyc indexes a tuple of ints
# through boxed Python objects (PyTuple_New, CPySequenceTuple_GetItem in the generated C),
# while a module-level Final vec[i64] compiles to a bounds check and a native load.
LAX_MIN_SAMPLE: Final = vec[i64]([2, 2, 1, 1])
LAX_MIN_PERCENT: Final = vec[i64]([66, 50, 50, 50])
STRICT_MIN_SAMPLE: Final = vec[i64]([4, 3, 2, 2])
STRICT_MIN_PERCENT: Final = vec[i64]([75, 66, 66, 66])


TOUCH_MIN_KEYS: Final[i64] = 1 << 15
"""From this many keys on, :func:`touch_keys` reads a cache's slots ahead (a smaller cache stays in
the CPU's caches, where the extra pass would only cost)."""


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


def require_static_source(nc_static: object) -> StaticSource:
    """``nc_static`` as a :class:`StaticSource` (see :func:`as_static_source`); TypeError if it has no ``part``."""
    st = as_static_source(nc_static)
    if st is None:
        raise TypeError(
            "nc_static must be None, a lookupdec.fast NgramCache or StaticIndex, or an object with "
            f"part(key), not {type(nc_static).__module__}.{type(nc_static).__name__}"
        )
    return st


def ngram_words(seq: vec[i32], p: i64, n: i64) -> tuple[i64, i64]:
    """The packed key of the ``n``-gram at ``seq[p:p+n]`` (padded with -1 to four tokens)."""
    t0 = seq[p]
    t1 = seq[p + 1] if n > 1 else NULL32
    t2 = seq[p + 2] if n > 2 else NULL32
    t3 = seq[p + 3] if n > 3 else NULL32
    return pack(t0, t1), pack(t2, t3)


def keys_buffer() -> vec[i64]:
    """Scratch space for :func:`step_keys` at any n-gram range (3 words per n-gram size)."""
    return filled_i64(3 * (NGRAM_MAX - NGRAM_MIN + 1), 0)


def step_keys(keys: vec[i64], seq: vec[i32], avail: i64, nmin: i64, nmax: i64) -> None:
    """Fill ``keys`` (3 * (nmax - nmin + 1) items) with the packed words and the hash of each
    n-gram ending ``seq``, longest first: ``keys[3k : 3k + 3]`` = (w0, w1, key_hash) of the
    ``nmax - k``-gram, the hash -1 for one longer than ``avail`` (spec 9: it would start before
    position 0; a real hash is >= 0).

    Once per drafted token: the context and the dynamic cache look up the same n-grams, and each
    n-gram used to be packed and hashed for each cache (twice for the dynamic one's read-ahead).
    """
    end = i64(len(seq))
    top = nmax - nmin
    for k in range(top + 1):
        n = nmax - k
        if n > avail:
            keys[3 * k + 2] = -1
            continue
        w0, w1 = ngram_words(seq, end - n, n)
        keys[3 * k] = w0
        keys[3 * k + 1] = w1
        keys[3 * k + 2] = key_hash(w0, w1)


def touch_keys(c: NgramCache, keys: vec[i64], top: i64) -> None:
    """Read ahead the slot of each n-gram of ``keys`` in ``c``, and the key a slot of its hash
    holds, in a pass that branches on none of the keys.

    In a big cache (the dynamic one) every probe is a cache miss; issued here, before the static
    lookup and the context cache's probes, the misses overlap with that work and with each
    other, where :func:`try_primary` would wait for each n-gram's before the next.
    """
    if c._nk < TOUCH_MIN_KEYS or c._stale:
        return
    slots = c._slots
    k0 = c._k0
    mask = c._smask
    sink: i64 = 0
    for k in range(top + 1):
        h = keys[3 * k + 2]
        if h >= 0:
            e = slots[h & mask]
            # Only a slot holding this key's hash bits (see _tables.key_probe) is followed:
            # another key's would be a wasted miss. Reading its k1, sum and max here too was
            # slower (A/B of `lookupdec stats -lcs`, 2026-12-03).
            if e >= 0 and e & HI32 == hash_tag(h):
                sink ^= k0[e & M32]
    c._touch = sink  # kept, so the compiler keeps the reads


def try_primary(
    c: NgramCache,
    keys: vec[i64],
    top: i64,
    min_sample: vec[i64],
    min_percent: vec[i64],
    st: StaticSource,
    has_st: bool,
) -> i32:
    """The token ``c`` proposes after the n-grams of ``keys`` (spec 3.1, see :func:`step_keys`), -1 if none.

    ``top`` = ngram_max - ngram_min; ``min_sample`` and ``min_percent`` are indexed by
    n - ngram_min.
    """
    if c._nk == 0:
        return NULL32
    if c._stale:
        c._fresh()
    slots = c._slots
    ck0 = c._k0
    ck1 = c._k1
    mask = c._smask
    # The reference's ``for i in range(top, -1, -1)``, longest n-gram first. mypyc compiles a
    # range with a negative step through tagged Python ints (CPyTagged_* calls in the generated
    # C) but one with the default step on i64 natively, hence the count up and ``top - k``.
    for k in range(top + 1):
        i = top - k  # indexes the threshold tables
        h = keys[3 * k + 2]
        if h < 0:  # spec 9: the n-gram would start before position 0
            continue
        kid = key_probe_h(slots, ck0, ck1, mask, keys[3 * k], keys[3 * k + 1], h)
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
    keys: vec[i64],
) -> vec[i32]:
    """Append up to ``n_draft`` drafted tokens to ``seq`` (the last <= 4 tokens of ``inp``, at least 2).

    ``avail0`` = ``len(inp)``; ``keys`` is scratch space from :func:`keys_buffer` (a replay
    passes one for all its steps). Returns the grown vec (vecs are values: append may reallocate).
    """
    top = nmax - nmin
    k: i64 = 0
    while k < n_draft:
        pos = i64(len(seq))
        step_keys(keys, seq, avail0 + k, nmin, nmax)
        # The caches' reads first: their misses overlap the static lookup's (see touch_keys).
        touch_keys(ctx, keys, top)
        touch_keys(dyn, keys, top)
        has_st = st._st_begin(seq[pos - 2], seq[pos - 1])
        t = try_primary(ctx, keys, top, LAX_MIN_SAMPLE, LAX_MIN_PERCENT, st, has_st)
        if t == NULL32:
            t = try_primary(dyn, keys, top, STRICT_MIN_SAMPLE, STRICT_MIN_PERCENT, st, has_st)
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
    out = draft_core(tail, n, n_draft, ngram_min, ngram_max, ctx, dyn, st, keys_buffer())
    for j in range(base, len(out)):
        drafted.append(int(out[j]))


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
