// A replica of the optimized fork's common/ngram-cache (jadidbourbaki/llama.cpp, "precheck"
// state), written for lookupdec's C++ anchor from the lookupdec spec (shared/spec) and from a
// reading of the fork's public sources; no llama.cpp code is copied. See README.md here for what
// is reconstructed and what differs.
//
// - n-gram key: 4 int32 slots, unused slots -1; hashed like the fork (XOR of token * 2^64/phi).
// - cache: an insertion-ordered "dense" hash map (values in one vector, an open-addressing index
//   over it), standing in for ankerl::unordered_dense::map, from key to a part;
// - part: a vector of (token, count) sorted by token, found by binary search;
// - static cache: one (token, count) array + a fastconstmap VerifiedConstMap from the 2-gram to
//   its span (offset << 24 | length), read from the fork's static file v2 in one buffer.
#pragma once

#include "constmap.hpp"

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace anchor {

using token_t = int32_t;
constexpr token_t TOKEN_NULL = -1;
constexpr int NGRAM_MIN = 1;
constexpr int NGRAM_MAX = 4;
constexpr int NGRAM_STATIC = 2;

// An error in an input file, reported as "FILE: problem" without a backtrace.
struct FileError : std::runtime_error {
    FileError(const std::string &path, const std::string &what) : std::runtime_error(path + ": " + what) {}
};

struct Ngram {
    token_t t[NGRAM_MAX];
    Ngram() { t[0] = t[1] = t[2] = t[3] = TOKEN_NULL; }
    Ngram(const token_t *p, int n) {
        for (int i = 0; i < NGRAM_MAX; ++i) t[i] = i < n ? p[i] : TOKEN_NULL;
    }
    bool operator==(const Ngram &o) const {
        return t[0] == o.t[0] && t[1] == o.t[1] && t[2] == o.t[2] && t[3] == o.t[3];
    }
};

// The fork's key hash: XOR over the slots of token * 11400714819323198485 (the int32 token
// converted to uint64 first, so -1 becomes 2^64 - 1). It is weak (symmetric in the slots), which
// is why the map below mixes it again, as unordered_dense does for hashes not marked avalanching.
inline uint64_t ngram_hash(const Ngram &g) {
    constexpr uint64_t K = 11400714819323198485ull;
    uint64_t h = static_cast<uint64_t>(static_cast<int64_t>(g.t[0])) * K;
    for (int i = 1; i < NGRAM_MAX; ++i) h ^= static_cast<uint64_t>(static_cast<int64_t>(g.t[i])) * K;
    const unsigned __int128 m = static_cast<unsigned __int128>(h) * 0x9E3779B97F4A7C15ull;
    return static_cast<uint64_t>(m) ^ static_cast<uint64_t>(m >> 64);
}

// int32 arithmetic that wraps like the fork's (signed overflow is UB in C++; g++ -O2 wraps in
// practice, the spec (section 5) pins the wrapped results, so compute them explicitly).
inline int32_t mul_wrap(int32_t a, int32_t b) {
    return static_cast<int32_t>(static_cast<uint32_t>(a) * static_cast<uint32_t>(b));
}
inline int32_t add_wrap(int32_t a, int32_t b) {
    return static_cast<int32_t>(static_cast<uint32_t>(a) + static_cast<uint32_t>(b));
}

struct Entry {
    token_t token;
    int32_t count;
};
static_assert(sizeof(Entry) == 8, "entries are the files' (i32 token, i32 count) pairs");

// Lower bound over a sorted run: halves the range a fixed number of times for a given length
// (no data-dependent branch), as the fork's sorted-vector variants do.
inline const Entry *lower_bound_entries(const Entry *base, size_t n, token_t tok) {
    if (n == 0) return base;
    while (n > 1) {
        const size_t half = n / 2;
        base = (base[half - 1].token < tok) ? base + half : base;
        n -= half;
    }
    return base + (base->token < tok);
}

// A part: followers of one n-gram, sorted by token.
struct Part {
    std::vector<Entry> entries;

    Entry *find(token_t tok) {
        Entry *b = entries.data();
        Entry *it = const_cast<Entry *>(lower_bound_entries(b, entries.size(), tok));
        return (it != b + entries.size() && it->token == tok) ? it : nullptr;
    }
    // Adds `count` to the token's count, inserting it in order if absent.
    void add(token_t tok, int32_t count) {
        Entry *b = entries.data();
        const Entry *it = lower_bound_entries(b, entries.size(), tok);
        const size_t pos = static_cast<size_t>(it - b);
        if (pos < entries.size() && entries[pos].token == tok) {
            entries[pos].count = add_wrap(entries[pos].count, count);
        } else {
            entries.insert(entries.begin() + static_cast<ptrdiff_t>(pos), Entry{tok, count});
        }
    }
};

// An insertion-ordered hash map from Ngram to Part: the values live in one vector in insertion
// order (iteration = insertion order, as in unordered_dense), and a power-of-two table of 8-byte
// buckets (32-bit fingerprint, 32-bit value index + 1) finds them by linear probing. Grows at a
// load factor of 0.8 (unordered_dense's default).
class NgramMap {
public:
    using value_type = std::pair<Ngram, Part>;

    Part *find(const Ngram &k) {
        if (buckets_.empty()) return nullptr;
        const uint64_t h = ngram_hash(k);
        const uint32_t fp = fingerprint(h);
        for (size_t b = h >> shift_;; b = (b + 1) & mask_) {
            const uint64_t e = buckets_[b];
            if (e == 0) return nullptr;
            if (static_cast<uint32_t>(e >> 32) == fp) {
                value_type &v = values_[static_cast<uint32_t>(e) - 1];
                if (v.first == k) return &v.second;
            }
        }
    }
    // The part of `k`, created empty at the end of the insertion order if absent; `created`
    // says which.
    Part &get_or_create(const Ngram &k, bool &created) {
        if ((values_.size() + 1) * 5 > buckets_.size() * 4) grow();
        const uint64_t h = ngram_hash(k);
        const uint32_t fp = fingerprint(h);
        size_t b = h >> shift_;
        for (;; b = (b + 1) & mask_) {
            const uint64_t e = buckets_[b];
            if (e == 0) break;
            if (static_cast<uint32_t>(e >> 32) == fp) {
                value_type &v = values_[static_cast<uint32_t>(e) - 1];
                if (v.first == k) {
                    created = false;
                    return v.second;
                }
            }
        }
        values_.emplace_back(k, Part());
        buckets_[b] = (static_cast<uint64_t>(fp) << 32) | static_cast<uint32_t>(values_.size());
        created = true;
        return values_.back().second;
    }
    // Removes everything; keeps the bucket table's memory (its size is what a chunk needs).
    void clear() {
        values_.clear();
        std::fill(buckets_.begin(), buckets_.end(), 0);
    }
    size_t size() const { return values_.size(); }
    std::vector<value_type>::iterator begin() { return values_.begin(); }
    std::vector<value_type>::iterator end() { return values_.end(); }
    std::vector<value_type>::const_iterator begin() const { return values_.begin(); }
    std::vector<value_type>::const_iterator end() const { return values_.end(); }

private:
    static uint32_t fingerprint(uint64_t h) { return static_cast<uint32_t>(h) | 1u; }  // never 0
    void grow() {
        const size_t n = buckets_.empty() ? 8 : buckets_.size() * 2;
        int bits = 0;
        while ((size_t(1) << bits) < n) ++bits;
        buckets_.assign(n, 0);
        mask_ = n - 1;
        shift_ = 64 - bits;
        for (size_t i = 0; i < values_.size(); ++i) {
            const uint64_t h = ngram_hash(values_[i].first);
            size_t b = h >> shift_;
            while (buckets_[b] != 0) b = (b + 1) & mask_;
            buckets_[b] = (static_cast<uint64_t>(fingerprint(h)) << 32) | static_cast<uint32_t>(i + 1);
        }
    }

    std::vector<value_type> values_;
    std::vector<uint64_t> buckets_;
    size_t mask_ = 0;
    int shift_ = 64;
};

// ---------------------------------------------------------------------------------------------
// update / merge (spec sections 2 and 6)

inline void update(NgramMap &cache, int ngram_min, int ngram_max, const std::vector<token_t> &inp, int64_t nnew) {
    const int64_t n = static_cast<int64_t>(inp.size());
    for (int64_t size = ngram_min; size <= ngram_max; ++size) {
        const int64_t start = std::max(n - nnew, size);
        for (int64_t i = start; i < n; ++i) {
            const Ngram key(&inp[i - size], static_cast<int>(size));
            const token_t tok = inp[i];
            bool created;
            Part &part = cache.get_or_create(key, created);
            if (created) {
                part.entries.push_back(Entry{tok, 1});
            } else {
                part.add(tok, 1);
            }
        }
    }
}

inline void merge(NgramMap &target, const NgramMap &add) {
    for (const auto &kv : add) {
        bool created;
        Part &part = target.get_or_create(kv.first, created);
        if (created) {
            part.entries = kv.second.entries;  // a copy, as the fork's emplace of the whole part
        } else {
            for (const Entry &e : kv.second.entries) part.add(e.token, e.count);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Legacy cache file (spec section 7): records of key (4 x i32), ntokens (i32), ntokens x (i32
// token, i32 count), no header. Read and written field by field through iostreams like
// llama.cpp's common_ngram_cache_load/save; the check rules are the fork's strict ones.

inline NgramMap load_legacy(const std::string &path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw FileError(path, "cannot open the cache file");
    NgramMap cache;
    Ngram key;
    int32_t ntokens, tok, count;
    uint64_t offset = 0;
    while (in.read(reinterpret_cast<char *>(&key), sizeof(key))) {
        if (!in.read(reinterpret_cast<char *>(&ntokens), 4))
            throw FileError(path, "truncated record at byte " + std::to_string(offset) + " (no token count)");
        if (ntokens <= 0)
            throw FileError(path, "record at byte " + std::to_string(offset) + " has ntokens " + std::to_string(ntokens));
        bool created;
        Part &part = cache.get_or_create(key, created);
        if (!created) throw FileError(path, "key of the record at byte " + std::to_string(offset) + " appears twice");
        part.entries.reserve(static_cast<size_t>(ntokens));
        for (int32_t i = 0; i < ntokens; ++i) {
            if (!in.read(reinterpret_cast<char *>(&tok), 4) || !in.read(reinterpret_cast<char *>(&count), 4))
                throw FileError(path, "truncated record at byte " + std::to_string(offset));
            if (count <= 0)
                throw FileError(path, "record at byte " + std::to_string(offset) + " has count " + std::to_string(count));
            if (part.find(tok)) throw FileError(path, "record at byte " + std::to_string(offset) + " repeats token " + std::to_string(tok));
            part.add(tok, count);
        }
        offset += 20 + 8 * static_cast<uint64_t>(ntokens);
    }
    if (in.gcount() != 0)
        throw FileError(path, std::to_string(in.gcount()) + " trailing bytes after the last record (byte " +
                                  std::to_string(offset) + ")");
    return cache;
}

inline void save_legacy(const NgramMap &cache, const std::string &path) {
    std::ofstream out(path, std::ios::binary);
    if (!out) throw FileError(path, "cannot write the cache file");
    for (const auto &kv : cache) {
        const int32_t ntokens = static_cast<int32_t>(kv.second.entries.size());
        out.write(reinterpret_cast<const char *>(&kv.first), sizeof(Ngram));
        out.write(reinterpret_cast<const char *>(&ntokens), 4);
        for (const Entry &e : kv.second.entries) {
            out.write(reinterpret_cast<const char *>(&e.token), 4);
            out.write(reinterpret_cast<const char *>(&e.count), 4);
        }
    }
    out.flush();
    if (!out) throw FileError(path, "write failed");
}

// ---------------------------------------------------------------------------------------------
// Static cache (spec section 11): entries + constmap, from a v2 file read whole into memory.

constexpr uint64_t STATIC_MAGIC_V1 = 0x70616d63676e6767ull;  // "ggngcmap"
constexpr uint64_t STATIC_MAGIC_V2 = 0x32706d63676e6767ull;  // "ggngcmp2"
constexpr int SPAN_BITS = 24;
constexpr uint64_t SPAN_LEN_MASK = (1ull << SPAN_BITS) - 1;

struct StaticPart {
    const Entry *entries = nullptr;
    size_t size = 0;
};

inline uint64_t pack_key(token_t a, token_t b) {
    // The map key is the 2-gram's two int32 tokens as 8 little-endian bytes.
    return static_cast<uint64_t>(static_cast<uint32_t>(a)) | (static_cast<uint64_t>(static_cast<uint32_t>(b)) << 32);
}

class StaticCache {
public:
    std::string format;  // "fork-v2", "fork-v1" or "llama" (legacy, built in memory)

    StaticPart find(token_t a, token_t b) const {
        const uint64_t span = map_.get8(pack_key(a, b));
        if (span == CONSTMAP_NOT_FOUND) return {};
        const uint64_t off = span >> SPAN_BITS, len = span & SPAN_LEN_MASK;
        if (off + len > n_entries_) return {};  // a corrupt span: treated as absent, never read
        return {entries_ + off, static_cast<size_t>(len)};
    }

    // Opens a static file like the fork: the whole file into one buffer, the map viewed in place.
    // A legacy file (no fork magic) is loaded as a cache and turned into entries + map in memory.
    static std::unique_ptr<StaticCache> load(const std::string &path) {
        std::ifstream in(path, std::ios::binary | std::ios::ate);
        if (!in) throw FileError(path, "cannot open the static cache file");
        const auto end = in.tellg();
        if (end < 0) throw FileError(path, "cannot read the static cache file");
        const size_t size = static_cast<size_t>(end);
        uint64_t magic = 0;
        in.seekg(0);
        if (size >= 8) in.read(reinterpret_cast<char *>(&magic), 8);
        if (magic != STATIC_MAGIC_V2 && magic != STATIC_MAGIC_V1) {
            in.close();
            return from_cache(load_legacy(path), "llama");
        }
        auto sc = std::unique_ptr<StaticCache>(new StaticCache());
        // As the fork: a vector of u64 (zero-filled, then read over) keeps the map 8-byte aligned.
        sc->buffer_.resize((size + 7) / 8);
        unsigned char *bytes = reinterpret_cast<unsigned char *>(sc->buffer_.data());
        in.seekg(0);
        if (!in.read(reinterpret_cast<char *>(bytes), static_cast<std::streamsize>(size)))
            throw FileError(path, "read failed");
        sc->view(path, bytes, size, magic == STATIC_MAGIC_V2);
        return sc;
    }

    // Entries + map from a cache's 2-grams, in the cache's iteration order (each run sorted).
    static std::unique_ptr<StaticCache> from_cache(const NgramMap &cache, const std::string &format) {
        auto sc = std::unique_ptr<StaticCache>(new StaticCache());
        std::vector<unsigned char> file = serialize_v2(cache);
        sc->buffer_.resize((file.size() + 7) / 8);
        std::memcpy(sc->buffer_.data(), file.data(), file.size());
        sc->view("(in memory)", reinterpret_cast<unsigned char *>(sc->buffer_.data()), file.size(), true);
        sc->format = format;
        return sc;
    }

    // A fork static file v2 for the 2-grams of `cache` (spec 11.2), handed to `sink(bytes, n)`
    // section by section (header, entries, map, key table) as the fork writes it, so that the
    // file is never held twice in memory.
    template <class Sink>
    static void write_v2(const NgramMap &cache, Sink &&sink) {
        std::vector<Entry> entries;
        std::vector<uint64_t> hashes, spans;
        std::vector<std::pair<uint64_t, uint64_t>> table;  // packed key, span
        for (const auto &kv : cache) {
            const Ngram &g = kv.first;
            if (g.t[1] == TOKEN_NULL || g.t[2] != TOKEN_NULL) continue;  // 2-grams only
            const uint64_t off = entries.size();
            const uint64_t len = kv.second.entries.size();  // already sorted by token
            if (len > SPAN_LEN_MASK || off >= (1ull << (64 - SPAN_BITS)))
                throw std::runtime_error("a 2-gram has too many followers for the fork's 24-bit span length");
            entries.insert(entries.end(), kv.second.entries.begin(), kv.second.entries.end());
            const uint64_t key = pack_key(g.t[0], g.t[1]);
            const uint64_t span = (off << SPAN_BITS) | len;
            hashes.push_back(xxh64_8(key));
            spans.push_back(span);
            table.emplace_back(key, span);
        }
        std::vector<unsigned char> map = ConstMapBuilder::build(hashes, spans);
        hashes = std::vector<uint64_t>();
        spans = std::vector<uint64_t>();
        const uint64_t header[4] = {STATIC_MAGIC_V2, entries.size(), map.size(), table.size()};
        sink(header, sizeof header);
        sink(entries.data(), entries.size() * sizeof(Entry));
        sink(map.data(), map.size());
        static_assert(sizeof(std::pair<uint64_t, uint64_t>) == 16, "key table rows are 16 bytes");
        sink(table.data(), table.size() * 16);  // i32 t0, i32 t1 (= the packed key), u64 span
    }

    static std::vector<unsigned char> serialize_v2(const NgramMap &cache) {
        std::vector<unsigned char> out;
        write_v2(cache, [&out](const void *p, size_t n) {
            const unsigned char *b = static_cast<const unsigned char *>(p);
            out.insert(out.end(), b, b + n);
        });
        return out;
    }

    size_t n_entries() const { return n_entries_; }
    uint32_t n_keys() const { return map_.n_keys(); }

private:
    void view(const std::string &path, const unsigned char *bytes, size_t size, bool v2) {
        const size_t header = v2 ? 32 : 24;
        if (size < header) throw FileError(path, "file of " + std::to_string(size) + " bytes is shorter than its header");
        uint64_t n_entries, map_size, n_table = 0;
        std::memcpy(&n_entries, bytes + 8, 8);
        std::memcpy(&map_size, bytes + 16, 8);
        if (v2) std::memcpy(&n_table, bytes + 24, 8);
        const unsigned __int128 need = static_cast<unsigned __int128>(header) + static_cast<unsigned __int128>(n_entries) * 8 +
                                       map_size + static_cast<unsigned __int128>(n_table) * 16;
        if (need != size)
            throw FileError(path, "sizes do not add up: n_entries " + std::to_string(n_entries) + ", map_size " +
                                      std::to_string(map_size) + ", n_keys " + std::to_string(n_table) + " for a file of " +
                                      std::to_string(size) + " bytes");
        try {
            map_.open(bytes + header + n_entries * 8, map_size);
        } catch (const std::runtime_error &e) {
            throw FileError(path, e.what());
        }
        if (v2 && n_table != map_.n_keys())
            throw FileError(path, "key table has " + std::to_string(n_table) + " keys, the constmap " + std::to_string(map_.n_keys()));
        entries_ = reinterpret_cast<const Entry *>(bytes + header);
        n_entries_ = n_entries;
        format = v2 ? "fork-v2" : "fork-v1";
    }

    std::vector<uint64_t> buffer_;
    const Entry *entries_ = nullptr;
    size_t n_entries_ = 0;
    ConstMapView map_;
};

// ---------------------------------------------------------------------------------------------
// Drafting (spec section 3, with the section 10 precheck, the smallest-id tie rule that sorted
// parts give, int32 wrap-around, and the section 9 rule: n-grams starting before position 0 are
// skipped instead of read out of bounds).

constexpr int MIN_SAMPLE_LAX[NGRAM_MAX] = {2, 2, 1, 1};
constexpr int MIN_PERCENT_LAX[NGRAM_MAX] = {66, 50, 50, 50};
constexpr int MIN_SAMPLE_STRICT[NGRAM_MAX] = {4, 3, 2, 2};
constexpr int MIN_PERCENT_STRICT[NGRAM_MAX] = {75, 66, 66, 66};

inline int32_t static_count(const StaticPart &sp, token_t tok) {
    const Entry *it = lower_bound_entries(sp.entries, sp.size, tok);
    return (it != sp.entries + sp.size && it->token == tok) ? it->count : 0;
}

inline token_t try_static(const StaticPart &sp) {
    int32_t max_c = 0, sum = 0;
    token_t max_t = TOKEN_NULL;
    for (size_t i = 0; i < sp.size; ++i) {
        if (sp.entries[i].count > max_c) {
            max_c = sp.entries[i].count;
            max_t = sp.entries[i].token;
        }
        sum = add_wrap(sum, sp.entries[i].count);
    }
    if (sum < MIN_SAMPLE_LAX[NGRAM_STATIC - 1]) return TOKEN_NULL;
    if (mul_wrap(100, max_c) < mul_wrap(MIN_PERCENT_LAX[NGRAM_STATIC - 1], sum)) return TOKEN_NULL;
    return max_t;
}

inline token_t try_primary(NgramMap &cache, const Ngram *keys, const bool *valid, int ngram_min, int ngram_max,
                           const StaticPart &sp, const int *min_sample, const int *min_percent) {
    for (int i = ngram_max - ngram_min; i >= 0; --i) {
        if (!valid[i]) continue;
        const Part *part = cache.find(keys[i]);
        if (part == nullptr) continue;
        const Entry *e = part->entries.data();
        const size_t n = part->entries.size();
        // The precheck: sample size and the best raw share decide before any static lookup.
        int32_t sum = 0, max_raw = 0;
        for (size_t j = 0; j < n; ++j) {
            sum = add_wrap(sum, e[j].count);
            if (e[j].count > max_raw) max_raw = e[j].count;
        }
        if (sum < min_sample[i]) continue;
        if (mul_wrap(100, max_raw) < mul_wrap(min_percent[i], sum)) continue;
        int32_t best_c = 0, best_w = 0;
        token_t best_t = TOKEN_NULL;
        for (size_t j = 0; j < n; ++j) {
            const int32_t st = static_count(sp, e[j].token);
            const int32_t w = st > 0 ? mul_wrap(100, st) : 1;
            if (mul_wrap(e[j].count, w) > mul_wrap(best_c, best_w)) {
                best_t = e[j].token;
                best_c = e[j].count;
                best_w = w;
            }
        }
        if (mul_wrap(100, best_c) < mul_wrap(min_percent[i], sum)) continue;
        return best_t;
    }
    return TOKEN_NULL;
}

// `out` holds the last sampled token on entry (never read); drafted tokens are appended.
inline void draft(const std::vector<token_t> &inp, std::vector<token_t> &out, int n_draft, int ngram_min, int ngram_max,
                  NgramMap &context, NgramMap &dynamic, const StaticCache *st) {
    const int64_t n_inp = static_cast<int64_t>(inp.size());
    if (n_inp < NGRAM_STATIC) return;
    auto at = [&](int64_t i) -> token_t { return i < n_inp ? inp[i] : out[static_cast<size_t>(1 + i - n_inp)]; };
    Ngram keys[NGRAM_MAX];
    bool valid[NGRAM_MAX];
    while (static_cast<int>(out.size()) - 1 < n_draft) {
        const int64_t L = n_inp + static_cast<int64_t>(out.size()) - 1;
        StaticPart sp;
        if (st != nullptr) sp = st->find(at(L - 2), at(L - 1));
        for (int size = ngram_min; size <= ngram_max; ++size) {
            const int i = size - ngram_min;
            valid[i] = L - size >= 0;
            keys[i] = Ngram();
            if (valid[i])
                for (int j = 0; j < size; ++j) keys[i].t[j] = at(L - size + j);
        }
        token_t t = try_primary(context, keys, valid, ngram_min, ngram_max, sp, MIN_SAMPLE_LAX, MIN_PERCENT_LAX);
        if (t == TOKEN_NULL)
            t = try_primary(dynamic, keys, valid, ngram_min, ngram_max, sp, MIN_SAMPLE_STRICT, MIN_PERCENT_STRICT);
        if (t == TOKEN_NULL) t = try_static(sp);
        if (t == TOKEN_NULL) break;
        out.push_back(t);
    }
}

}  // namespace anchor
