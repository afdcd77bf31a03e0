"""Writing lookupdec's static index file (docs/static-index.md) from a fast cache, compiled.

The reader is :mod:`lookupdec.fast._index`; the header is packed by
:func:`lookupdec.formats.index_header.pack_index_header`, as every writer packs it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from librt.strings import BytesWriter, write_i32_le, write_i64_le
from librt.vecs import append, vec
from mypy_extensions import i32, i64

from lookupdec.fast._cache import PAD_WORD, NgramCache
from lookupdec.fast._source import STATIC_MIN_PERCENT, STATIC_MIN_SAMPLE
from lookupdec.fast._tables import INT32_MAX, NULL32, empty_slot, filled_i32, low32, pack, static_slot
from lookupdec.formats.index_header import INDEX_HEADER_SIZE, pack_index_header


def align8(x: i64) -> i64:
    """``x`` rounded up to a multiple of 8."""
    return (x + 7) & ~7


def static_pick(toks: vec[i32], cnts: vec[i64]) -> i32:
    """Spec 3.2 on one part: the max-count follower (smallest id on ties), if >= 2 and >= 50 %."""
    best = NULL32
    mx: i64 = 0
    total: i64 = 0
    for j in range(len(toks)):
        c = cnts[j]
        t = toks[j]
        if c > mx or (c == mx and t < best):
            best = t
            mx = c
        total += c
    if total < STATIC_MIN_SAMPLE or 100 * mx < STATIC_MIN_PERCENT * total:
        return NULL32
    return best


def sort_pairs(toks: vec[i32], cnts: vec[i64]) -> None:
    """Sort (token, count) pairs by token, in place (insertion sort; big parts go through ``sorted``)."""
    n = i64(len(toks))
    if n > 32:
        order = sorted(range(n), key=lambda j: int(toks[j]))
        t2 = vec[i32]([toks[j] for j in order])
        c2 = vec[i64]([cnts[j] for j in order])
        for j in range(n):
            toks[j] = t2[j]
            cnts[j] = c2[j]
        return
    for j in range(1, n):
        t = toks[j]
        c = cnts[j]
        m = j - 1
        while m >= 0 and toks[m] > t:
            toks[m + 1] = toks[m]
            cnts[m + 1] = cnts[m]
            m -= 1
        toks[m + 1] = t
        cnts[m + 1] = c


class IndexBuilder:
    """Accumulates a static cache's 2-grams in key order and writes the index bytes."""

    def __init__(self) -> None:
        self.keys = vec[i64]()
        self.starts = vec[i64]([0])
        self.picks = vec[i32]()
        self.tokens = vec[i32]()
        self.counts = vec[i32]()
        self.total: i64 = 0

    def add(self, a: i32, b: i32, toks: vec[i32], cnts: vec[i64]) -> None:
        """Add the next key (keys must come ascending) with its followers (any order)."""
        sort_pairs(toks, cnts)
        for j in range(len(toks)):
            c = cnts[j]
            if c <= 0 or c > INT32_MAX:
                raise ValueError(f"count of follower {toks[j]} of ({a}, {b}) must be in 1..2**31-1, got {c}")
            if j > 0 and toks[j] == toks[j - 1]:
                raise ValueError(f"follower {toks[j]} of ({a}, {b}) is repeated")
            self.tokens = append(self.tokens, toks[j])
            self.counts = append(self.counts, i32(c))
            self.total += c
        self.keys = append(self.keys, pack(a, b))
        self.picks = append(self.picks, static_pick(toks, cnts))
        self.starts = append(self.starts, i64(len(self.tokens)))

    def to_bytes(self, vocab_size: int = 0, vocab_fingerprint: bytes = bytes(8)) -> bytes:
        """The complete file: header, then slots, keys, starts, picks, tokens, counts."""
        n_keys = i64(len(self.keys))
        n_entries = i64(len(self.tokens))
        n_slots: i64 = 2
        bits: i64 = 1
        while n_slots < 2 * n_keys:
            n_slots *= 2
            bits += 1
        slots = filled_i32(n_slots, NULL32)
        mask = n_slots - 1
        keys = self.keys
        for o in range(n_keys):
            kw = keys[o]
            slots[empty_slot(slots, static_slot(i32(kw >> 32), low32(kw), bits), mask)] = i32(o)
        w = BytesWriter()
        pos: i64 = INDEX_HEADER_SIZE
        for j in range(n_slots):
            write_i32_le(w, slots[j])
        pos += 4 * n_slots
        pos = pad_to(w, pos, align8(pos))
        for j in range(n_keys):
            write_i64_le(w, keys[j])
        for j in range(n_keys + 1):
            write_i64_le(w, self.starts[j])
        pos += 8 * n_keys + 8 * (n_keys + 1)
        for j in range(n_keys):
            write_i32_le(w, self.picks[j])
        pos += 4 * n_keys
        pos = pad_to(w, pos, align8(pos))
        for j in range(n_entries):
            write_i32_le(w, self.tokens[j])
        pos += 4 * n_entries
        pos = pad_to(w, pos, align8(pos))
        for j in range(n_entries):
            write_i32_le(w, self.counts[j])
        pos += 4 * n_entries
        body = w.getvalue()
        # Imported here, not at the top: hashlib loads OpenSSL's libcrypto, megabytes of a
        # replay's peak RSS, and only writing an index needs it.
        import hashlib

        checksum = hashlib.blake2b(body, digest_size=8).digest()
        header = pack_index_header(
            int(n_keys),
            int(n_entries),
            int(n_slots),
            vocab_size,
            vocab_fingerprint,
            int(self.total),
            int(pos),
            checksum,
        )
        return header + body


def pad_to(w: BytesWriter, pos: i64, target: i64) -> i64:
    """Write zero bytes up to offset ``target``."""
    while pos < target:
        w.append(0)
        pos += 1
    return pos


def index_bytes_from_cache(cache: NgramCache) -> bytes:
    """Index bytes of a static cache (only 2-gram keys) built natively from a fast NgramCache."""
    n = cache._n_keys_native()
    order: list[int] = []
    for kid in range(n):
        w0 = cache._k0[kid]
        if cache._k1[kid] != PAD_WORD:
            raise ValueError("a static index holds only 2-gram keys; this cache has longer or shorter ones")
        # Flip the low word's sign bit: then a signed compare of the i64 orders (t0, t1) signed.
        order.append(int(w0 ^ 0x80000000))
    order.sort()
    b = IndexBuilder()
    for s in order:
        w0 = i64(s) ^ 0x80000000
        kid = cache._find(w0, PAD_WORD)
        toks = vec[i32]()
        cnts = vec[i64]()
        node = i64(cache._head[kid])
        while node >= 0:
            toks = append(toks, cache._ntok[node])
            cnts = append(cnts, cache._count(node))
            node = i64(cache._nnext[node])
        b.add(i32(w0 >> 32), low32(w0), toks, cnts)
    return b.to_bytes()


def index_bytes_from_contents(contents: Iterable[tuple[Sequence[int], Iterable[tuple[int, int]]]]) -> bytes:
    """Index bytes of static-cache contents (2-gram keys; repeated keys and followers are summed)."""
    return index_bytes_from_cache(NgramCache.from_contents(contents))
