"""Merging two fast caches by walking both in key order (``NgramCache.merge`` of big caches)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from librt.vecs import append, vec
from mypy_extensions import i32, i64

from lookupdec.fast import _legacy
from lookupdec.fast._tables import INT32_MAX, INT32_MIN, M32, NULL32, filled_i32, get_count, set_count

if TYPE_CHECKING:
    from lookupdec.fast._cache import NgramCache


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


def merge_sorted(self: NgramCache, other: NgramCache) -> None:
    """:meth:`_merge_native` without the hash tables: the same arrays, tables left stale.

    Both caches' keys are put in key order (``key_order``: one pass when they already are,
    as in a loaded lookupdec file) and walked side by side to find each key of ``other``
    in this cache. Then ``other``'s keys are applied in its insertion order, as the probe
    merge does: a new key gets a copy of ``other``'s followers (and aggregates); a shared
    key's followers are found by a binary search in its own followers, sorted by token.
    Keys and nodes get the ordinals the probe merge gives them, so the tables, built on
    first use, come out the same too.
    """
    # The arrays' lengths are taken as the counts below: their spare room dropped first.
    self._compact()
    other._compact()
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
            # The int32 slots read and written inline, the side arrays only past int32: a
            # get_count and set_count per follower showed in this loop's profile.
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
    self._adopt(_legacy.Decoded((k0, k1, head, tail, ksum, kmax, best), (ntok, ncnt, nnext, nkey), (wcnt, wsum, wmax)))
