"""The index's slot table, filled by linear probing (compiled with mypyc; plain Python otherwise).

The only sequential step of a create: the canonical slot layout of docs/static-index.md
inserts the keys one by one in ordinal order, each taking the first free slot from its
home, so it cannot be vectorized with numpy. The home slots themselves are computed by
numpy and handed over as little-endian i64 bytes.
"""

from __future__ import annotations

from librt.strings import BytesWriter, read_i64_le, write_i32_le, write_i64_le
from librt.vecs import extend, vec
from mypy_extensions import i32, i64


def empty_slots(n_slots: i64) -> vec[i32]:
    """A slot table of ``n_slots`` empty (-1) slots (``n_slots`` a power of two)."""
    v = vec[i32]([-1])
    # Doubling by extend copies whole blocks: far faster than n_slots appends.
    while i64(len(v)) < n_slots:
        v = extend(v, v)
    return v


def insert_keys(slots: vec[i32], homes: bytes, first_ordinal: i64) -> None:
    """Insert keys ``first_ordinal, first_ordinal + 1, ...`` whose home slots are ``homes`` (i64 LE).

    ``len(slots)`` must be a power of two with room for every key (the writer keeps at
    least half the slots empty), so the probe always ends.
    """
    mask = i64(len(slots)) - 1
    n = i64(len(homes)) // 8
    for j in range(n):
        h = read_i64_le(homes, 8 * j) & mask
        while slots[h] >= 0:
            h = (h + 1) & mask
        slots[h] = i32(first_ordinal + j)


def slots_bytes(slots: vec[i32], start: i64, stop: i64) -> bytes:
    """Slots ``start .. stop - 1`` as little-endian i32 bytes (written in pieces to bound memory)."""
    w = BytesWriter()
    for j in range(start, stop):
        write_i32_le(w, slots[j])
    return w.getvalue()


def insert_range(slots: vec[i32], lo: i64, homes: bytes, ordinals: bytes) -> bytes:
    """Insert keys into the slots ``lo .. lo + len(slots) - 1`` of a bigger table, in the order given.

    ``homes`` and ``ordinals`` (i64 LE) list the keys by ascending ordinal; a key carried
    from the range before has home ``lo``. Keys that find no free slot before the range's
    end are returned (their ordinals, i64 LE): they go on probing from the next range's
    first slot, as they would in the whole table.
    """
    size = i64(len(slots))
    n = i64(len(homes)) // 8
    out = BytesWriter()
    for j in range(n):
        h = read_i64_le(homes, 8 * j) - lo
        while h < size and slots[h] >= 0:
            h += 1
        if h == size:
            write_i64_le(out, read_i64_le(ordinals, 8 * j))
        else:
            slots[h] = i32(read_i64_le(ordinals, 8 * j))
    return out.getvalue()
