// A reader and a builder for fastconstmap 0.10.0's serialized VerifiedConstMap ("VMAP0001"),
// written for lookupdec's C++ anchor from the format described in the lookupdec spec (section
// 11.3) and from reading fastconstmap's public C sources (lemire/fastconstmap). No code of
// fastconstmap or xxHash is copied; the steps are restated here so that the same keys give the
// same bytes (the builder is deterministic: the seed sequence starts from a fixed counter).
//
// The structure is a binary fuse filter over 64-bit key hashes with three slots per key: a key's
// value is the XOR of the data words at its three slots, and the XOR of the check words at the
// same slots must equal a fingerprint of its hash, so that absent keys are (almost always)
// reported absent.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace anchor {

// ---------------------------------------------------------------------------------------------
// XXH64 (seed 0 is what fastconstmap uses for its keys). Written from the published algorithm.

namespace xxh64_detail {
constexpr uint64_t P1 = 0x9E3779B185EBCA87ull;
constexpr uint64_t P2 = 0xC2B2AE3D27D4EB4Full;
constexpr uint64_t P3 = 0x165667B19E3779F9ull;
constexpr uint64_t P4 = 0x85EBCA77C2B2AE63ull;
constexpr uint64_t P5 = 0x27D4EB2F165667C5ull;

inline uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
inline uint64_t load64(const unsigned char *p) {
    uint64_t v;
    std::memcpy(&v, p, 8);  // little-endian hosts only (checked where files are read)
    return v;
}
inline uint32_t load32(const unsigned char *p) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
}
inline uint64_t step(uint64_t acc, uint64_t lane) {
    acc += lane * P2;
    acc = rotl(acc, 31);
    return acc * P1;
}
inline uint64_t fold(uint64_t acc, uint64_t v) {
    acc ^= step(0, v);
    return acc * P1 + P4;
}
inline uint64_t finish(uint64_t h) {
    h ^= h >> 33;
    h *= P2;
    h ^= h >> 29;
    h *= P3;
    h ^= h >> 32;
    return h;
}
}  // namespace xxh64_detail

inline uint64_t xxh64(const void *data, size_t len, uint64_t seed = 0) {
    using namespace xxh64_detail;
    const unsigned char *p = static_cast<const unsigned char *>(data);
    const unsigned char *end = p + len;
    uint64_t h;
    if (len >= 32) {
        uint64_t a = seed + P1 + P2, b = seed + P2, c = seed, d = seed - P1;
        const unsigned char *limit = end - 32;
        do {
            a = step(a, load64(p));
            b = step(b, load64(p + 8));
            c = step(c, load64(p + 16));
            d = step(d, load64(p + 24));
            p += 32;
        } while (p <= limit);
        h = rotl(a, 1) + rotl(b, 7) + rotl(c, 12) + rotl(d, 18);
        h = fold(h, a);
        h = fold(h, b);
        h = fold(h, c);
        h = fold(h, d);
    } else {
        h = seed + P5;
    }
    h += static_cast<uint64_t>(len);
    for (; p + 8 <= end; p += 8) {
        h ^= step(0, load64(p));
        h = rotl(h, 27) * P1 + P4;
    }
    if (p + 4 <= end) {
        h ^= static_cast<uint64_t>(load32(p)) * P1;
        h = rotl(h, 23) * P2 + P3;
        p += 4;
    }
    for (; p < end; ++p) {
        h ^= static_cast<uint64_t>(*p) * P5;
        h = rotl(h, 11) * P1;
    }
    return finish(h);
}

// The same for exactly one 8-byte key: the static cache's keys are two int32 tokens, and the
// drafting loop hashes one per drafted token, so the general loop's branches are worth saving.
inline uint64_t xxh64_8(uint64_t lane) {
    using namespace xxh64_detail;
    uint64_t h = P5 + 8;
    h ^= step(0, lane);
    h = rotl(h, 27) * P1 + P4;
    return finish(h);
}

// ---------------------------------------------------------------------------------------------
// The map's own hashing (fastconstmap restates these from Lemire's Go constmap).

inline uint64_t murmur_fmix64(uint64_t h) {
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 33;
    return h;
}
inline uint64_t mix_with_seed(uint64_t key_hash, uint64_t seed) { return murmur_fmix64(key_hash + seed); }
inline uint64_t splitmix64_next(uint64_t &state) {
    state += 0x9E3779B97F4A7C15ull;
    uint64_t z = state;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
inline uint64_t check_word(uint64_t h) { return h ^ (h >> 32); }

inline uint64_t fnv1a64(const unsigned char *p, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; ++i) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

constexpr uint64_t CONSTMAP_NOT_FOUND = ~0ull;
constexpr size_t CONSTMAP_HEADER = 32;

// Segment geometry of one map: positions of a hash are h0 in [0, count_length), and h1, h2 one
// and two segments further, each with some low bits flipped.
struct FuseGeometry {
    uint32_t segment_length = 0;
    uint32_t segment_mask = 0;
    uint32_t segment_count = 0;
    uint32_t count_length = 0;

    void set(uint32_t length, uint32_t count) {
        segment_length = length;
        segment_mask = length ? length - 1 : 0;
        segment_count = count;
        count_length = count * length;
    }
    void slots(uint64_t h, uint32_t out[3]) const {
        uint32_t a = static_cast<uint32_t>((static_cast<unsigned __int128>(h) * count_length) >> 64);
        uint32_t b = a + segment_length;
        uint32_t c = b + segment_length;
        b ^= static_cast<uint32_t>(h >> 18) & segment_mask;
        c ^= static_cast<uint32_t>(h) & segment_mask;
        out[0] = a;
        out[1] = b;
        out[2] = c;
    }
};

// A map viewed in place over a serialized buffer (the buffer must outlive it).
class ConstMapView {
public:
    // Parses and checks a serialized map at `p` (`n` bytes, 8-byte aligned). Throws
    // std::runtime_error with the reason when the bytes are not a VMAP0001 map.
    void open(const unsigned char *p, size_t n) {
        if (n < 8) throw std::runtime_error("constmap section shorter than its magic");
        if (std::memcmp(p, "VMAP0001", 8) != 0) {
            if (std::memcmp(p, "VCMP0002", 8) == 0)
                throw std::runtime_error(
                    "constmap uses XXH3 keys (fastconstmap <= 0.9, magic VCMP0002); the anchor reads only "
                    "VMAP0001 (XXH64) maps");
            throw std::runtime_error("constmap magic is not VMAP0001");
        }
        if (n < CONSTMAP_HEADER + 8) throw std::runtime_error("constmap section shorter than its header");
        uint64_t seed;
        uint32_t seg_len, seg_count, data_len, n_keys;
        std::memcpy(&seed, p + 8, 8);
        std::memcpy(&seg_len, p + 16, 4);
        std::memcpy(&seg_count, p + 20, 4);
        std::memcpy(&data_len, p + 24, 4);
        std::memcpy(&n_keys, p + 28, 4);
        const size_t need = CONSTMAP_HEADER + static_cast<size_t>(data_len) * 16 + 8;
        if (n != need)
            throw std::runtime_error("constmap with data_len " + std::to_string(data_len) + " needs " +
                                     std::to_string(need) + " bytes, the section has " + std::to_string(n));
        uint64_t stored;
        std::memcpy(&stored, p + need - 8, 8);
        // fastconstmap's view checks the whole checksum on every open; the fork pays it at load.
        if (fnv1a64(p, need - 8) != stored) throw std::runtime_error("constmap checksum mismatch");
        if (data_len != 0) {
            if (seg_len == 0 || (seg_len & (seg_len - 1)) != 0)
                throw std::runtime_error("constmap segment_length is not a power of two");
            if (seg_count == 0 || (static_cast<uint64_t>(seg_count) + 2) * seg_len != data_len)
                throw std::runtime_error("constmap dimensions inconsistent");
        }
        if ((reinterpret_cast<uintptr_t>(p + CONSTMAP_HEADER) & 7u) != 0)
            throw std::runtime_error("constmap section not 8-byte aligned");
        seed_ = seed;
        geo_.set(seg_len, seg_count);
        data_len_ = data_len;
        n_keys_ = n_keys;
        data_ = reinterpret_cast<const uint64_t *>(p + CONSTMAP_HEADER);
        checks_ = data_ + data_len;
    }

    uint64_t get_hashed(uint64_t key_hash) const {
        if (data_len_ == 0) return CONSTMAP_NOT_FOUND;
        const uint64_t h = mix_with_seed(key_hash, seed_);
        uint32_t s[3];
        geo_.slots(h, s);
        if ((checks_[s[0]] ^ checks_[s[1]] ^ checks_[s[2]]) != check_word(h)) return CONSTMAP_NOT_FOUND;
        return data_[s[0]] ^ data_[s[1]] ^ data_[s[2]];
    }
    uint64_t get8(uint64_t key_bytes) const { return get_hashed(xxh64_8(key_bytes)); }
    uint32_t n_keys() const { return n_keys_; }

private:
    uint64_t seed_ = 0;
    FuseGeometry geo_;
    uint32_t data_len_ = 0;
    uint32_t n_keys_ = 0;
    const uint64_t *data_ = nullptr;
    const uint64_t *checks_ = nullptr;
};

// Builds the serialized bytes of a map from (key hash, value) pairs, key hashes = XXH64 of the
// key bytes. Same bytes as fastconstmap 0.10.0's VerifiedConstMap for the same keys and values,
// whatever their order: construction depends only on the hashes.
class ConstMapBuilder {
public:
    // Throws std::runtime_error on duplicate keys or when no seed in 100 works.
    static std::vector<unsigned char> build(const std::vector<uint64_t> &key_hashes,
                                            const std::vector<uint64_t> &values) {
        if (key_hashes.size() != values.size()) throw std::runtime_error("constmap: keys and values differ in length");
        if (key_hashes.size() > 0xFFFFFFFFull) throw std::runtime_error("constmap: more than 2^32 - 1 keys");
        const uint32_t size = static_cast<uint32_t>(key_hashes.size());
        std::vector<unsigned char> out;
        if (size == 0) {  // an empty map: every dimension and the seed 0
            write_header(out, 0, 0, 0, 0, 0);
            append_checksum(out);
            return out;
        }
        // Initial geometry from the key count (a power-of-two segment length growing with the
        // key count, and about 12.5% or more spare slots).
        uint32_t seg_len = size == 0 ? 4 : (1u << static_cast<int>(std::floor(std::log(double(size)) / std::log(3.33) + 2.25)));
        if (seg_len > 262144u) seg_len = 262144u;
        uint32_t capacity = 0;
        if (size > 1) {
            double factor = 0.875 + 0.25 * std::log(1000000.0) / std::log(double(size));
            if (factor < 1.125) factor = 1.125;
            capacity = static_cast<uint32_t>(std::round(double(size) * factor));
        }
        uint32_t total = (capacity + seg_len - 1) / seg_len;
        if (total < 3) total = 3;
        const uint32_t array_len = total * seg_len;
        FuseGeometry geo;
        geo.set(seg_len, total - 2);

        std::vector<uint64_t> order(size_t(size) + 1, 0);  // slot-sorted hashes, then the peel stack
        std::vector<uint8_t> which(size);                   // per stack entry: which of the 3 slots
        std::vector<uint8_t> degree(array_len, 0);          // 4 * keys at a slot | XOR of their slot index
        std::vector<uint64_t> xor_hash(array_len, 0);       // XOR of the hashes at a slot
        std::vector<uint32_t> queue(array_len);
        std::vector<uint32_t> bucket_start;

        uint64_t rng = 1;
        uint64_t seed = splitmix64_next(rng);
        order[size] = 1;  // sentinel: the bucket fill below never writes past the end
        bool done = false;
        for (int attempt = 0; !done; ++attempt) {
            if (attempt > 100) throw std::runtime_error("constmap: construction failed after 100 seeds");
            // Mid-sized maps alternate between halving and doubling the segment length on
            // later attempts (the slot count stays the same).
            if (size > 4 && size < 1000000) {
                if (attempt % 4 == 2) geo.set(geo.segment_length / 2, geo.segment_count * 2 + 2);
                else if (attempt % 4 == 3) geo.set(geo.segment_length * 2, geo.segment_count / 2 - 1);
            }
            // Place the mixed hashes in an approximately sorted order (by their top bits, into
            // as many buckets as segments rounded up to a power of two), which keeps the
            // slot updates below local.
            int bits = 1;
            while ((1u << bits) < geo.segment_count) ++bits;
            const uint32_t buckets = 1u << bits;
            bucket_start.assign(buckets, 0);
            for (uint32_t b = 0; b < buckets; ++b)
                bucket_start[b] = static_cast<uint32_t>((uint64_t(b) * size) >> bits);
            for (uint32_t i = 0; i < size; ++i) {
                const uint64_t h = mix_with_seed(key_hashes[i], seed);
                uint64_t b = h >> (64 - bits);
                while (order[bucket_start[b]] != 0) b = (b + 1) & (buckets - 1);
                order[bucket_start[b]] = h;
                ++bucket_start[b];
            }
            bool retry = false;
            for (uint32_t i = 0; i < size; ++i) {
                const uint64_t h = order[i];
                uint32_t s[3];
                geo.slots(h, s);
                for (uint32_t k = 0; k < 3; ++k) {
                    degree[s[k]] = static_cast<uint8_t>(degree[s[k]] + 4);
                    degree[s[k]] ^= static_cast<uint8_t>(k);
                    xor_hash[s[k]] ^= h;
                }
                // Two equal hashes cancel out at a slot they alone share: a duplicate key.
                if ((xor_hash[s[0]] & xor_hash[s[1]] & xor_hash[s[2]]) == 0) {
                    for (uint32_t k = 0; k < 3; ++k)
                        if (xor_hash[s[k]] == 0 && degree[s[k]] == 8) throw std::runtime_error("constmap: duplicate key");
                }
                // The 6-bit key count wrapped: too many keys on one slot for this seed.
                if (degree[s[0]] < 4 || degree[s[1]] < 4 || degree[s[2]] < 4) retry = true;
            }
            if (!retry) {
                // Peel: repeatedly take a slot holding exactly one key, record (key, slot),
                // and remove the key from its two other slots.
                uint32_t q = 0;
                for (uint32_t i = 0; i < array_len; ++i) {
                    queue[q] = i;
                    if ((degree[i] >> 2) == 1) ++q;
                }
                uint32_t stack = 0;
                while (q > 0) {
                    const uint32_t slot = queue[--q];
                    if ((degree[slot] >> 2) != 1) continue;
                    const uint64_t h = xor_hash[slot];
                    const uint8_t k = degree[slot] & 3;
                    which[stack] = k;
                    order[stack] = h;
                    ++stack;
                    uint32_t s[3];
                    geo.slots(h, s);
                    for (uint32_t step = 1; step <= 2; ++step) {  // the next slot, then the one after
                        const uint32_t other_k = (k + step) % 3;
                        const uint32_t other = s[other_k];
                        queue[q] = other;
                        if ((degree[other] >> 2) == 2) ++q;
                        degree[other] = static_cast<uint8_t>(degree[other] - 4);
                        degree[other] ^= static_cast<uint8_t>(other_k);
                        xor_hash[other] ^= h;
                    }
                }
                if (stack == size) {
                    done = true;
                    break;
                }
            }
            std::fill(order.begin(), order.begin() + size, 0);
            std::fill(degree.begin(), degree.end(), 0);
            std::fill(xor_hash.begin(), xor_hash.end(), 0);
            seed = splitmix64_next(rng);
        }
        degree = std::vector<uint8_t>();
        xor_hash = std::vector<uint64_t>();
        queue = std::vector<uint32_t>();

        // Values by mixed hash, then assign slots in reverse peel order so that each key's
        // chosen slot is written after the two others are final.
        std::vector<std::pair<uint64_t, uint64_t>> by_hash(size);
        for (uint32_t i = 0; i < size; ++i) by_hash[i] = {mix_with_seed(key_hashes[i], seed), values[i]};
        std::sort(by_hash.begin(), by_hash.end(),
                  [](const std::pair<uint64_t, uint64_t> &a, const std::pair<uint64_t, uint64_t> &b) { return a.first < b.first; });
        std::vector<uint64_t> data(array_len, 0), checks(array_len, 0);
        for (int64_t i = int64_t(size) - 1; i >= 0; --i) {
            const uint64_t h = order[i];
            auto it = std::lower_bound(by_hash.begin(), by_hash.end(), h,
                                       [](const std::pair<uint64_t, uint64_t> &e, uint64_t v) { return e.first < v; });
            uint32_t s[3];
            geo.slots(h, s);
            const uint32_t k = which[i];
            const uint32_t a = s[k], b = s[(k + 1) % 3], c = s[(k + 2) % 3];
            data[a] = it->second ^ data[b] ^ data[c];
            checks[a] = check_word(h) ^ checks[b] ^ checks[c];
        }
        out.reserve(CONSTMAP_HEADER + size_t(array_len) * 16 + 8);
        write_header(out, seed, geo.segment_length, geo.segment_count, array_len, size);
        append_words(out, data);
        append_words(out, checks);
        append_checksum(out);
        return out;
    }

private:
    static void put(std::vector<unsigned char> &out, const void *p, size_t n) {
        const unsigned char *b = static_cast<const unsigned char *>(p);
        out.insert(out.end(), b, b + n);
    }
    static void write_header(std::vector<unsigned char> &out, uint64_t seed, uint32_t seg_len, uint32_t seg_count,
                             uint32_t data_len, uint32_t n) {
        put(out, "VMAP0001", 8);
        put(out, &seed, 8);
        put(out, &seg_len, 4);
        put(out, &seg_count, 4);
        put(out, &data_len, 4);
        put(out, &n, 4);
    }
    static void append_words(std::vector<unsigned char> &out, const std::vector<uint64_t> &w) {
        put(out, w.data(), w.size() * 8);
    }
    static void append_checksum(std::vector<unsigned char> &out) {
        const uint64_t sum = fnv1a64(out.data(), out.size());
        put(out, &sum, 8);
    }
};

}  // namespace anchor
