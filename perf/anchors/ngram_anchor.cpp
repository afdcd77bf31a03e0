// ngram-anchor: the command line of lookupdec's C++ anchor (a replica of the optimized fork's
// llama-lookup-create, llama-lookup-stats and llama-lookup-merge over raw int32 token files, so
// that no model or tokenizer is needed). Built by `python -m perf anchors build`.
//
//   ngram-anchor create CORPUS.bin [CORPUS.bin ...] -o STATIC [--format fork-v2|llama]
//   ngram-anchor stats REPLAY.bin [-lcs STATIC] [-lcd DYNAMIC] [-c 4096] [--draft 8] [--json]
//   ngram-anchor merge A B [...] -o OUT
//   ngram-anchor update TOKENS.bin [...] -o DYNAMIC
//   ngram-anchor open STATIC [--repeat N] [--json]
//   ngram-anchor measure -o RESULT.json -- COMMAND [ARGS...]
//
// Errors in inputs are one line on stderr ("ngram-anchor: FILE: problem") and exit code 1;
// usage errors exit 2.
#include "ngram_cache.hpp"

#include <dirent.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

using namespace anchor;

namespace {

struct UsageError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// This process's own peak resident set (VmHWM): exact, and unlike ru_maxrss it does not start
// from the parent's peak (Linux carries ru_maxrss across fork and exec).
int64_t vm_hwm_bytes() {
    std::ifstream f("/proc/self/status");
    std::string line;
    while (std::getline(f, line)) {
        if (line.rfind("VmHWM:", 0) == 0) return std::atoll(line.c_str() + 6) * 1024;
    }
    return -1;
}

int64_t ru_maxrss_bytes() {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return static_cast<int64_t>(ru.ru_maxrss) * 1024;
}

std::string json_str(const std::string &s) {
    std::string out = "\"";
    for (char c : s) {
        if (c == '"' || c == '\\') {
            out += '\\';
            out += c;
        } else if (static_cast<unsigned char>(c) < 0x20) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\u%04x", c);
            out += buf;
        } else {
            out += c;
        }
    }
    return out + "\"";
}

std::string num(double v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.17g", v);
    return buf;
}

// Raw little-endian int32 tokens (the shared data's .bin files).
std::vector<token_t> read_tokens(const std::string &path) {
    FILE *f = std::fopen(path.c_str(), "rb");
    if (!f) throw FileError(path, "cannot open the token file");
    struct stat st;
    if (fstat(fileno(f), &st) != 0) {
        std::fclose(f);
        throw FileError(path, "cannot stat the token file");
    }
    const size_t size = static_cast<size_t>(st.st_size);
    if (size % 4 != 0) {
        std::fclose(f);
        throw FileError(path, "size " + std::to_string(size) + " is not a multiple of 4: not a raw int32 token file");
    }
    std::vector<token_t> tokens(size / 4);
    if (!tokens.empty() && std::fread(tokens.data(), 4, tokens.size(), f) != tokens.size()) {
        std::fclose(f);
        throw FileError(path, "read failed");
    }
    std::fclose(f);
    return tokens;
}

bool file_exists(const std::string &path) {
    struct stat st;
    return stat(path.c_str(), &st) == 0;
}

struct Args {
    std::vector<std::string> positional;
    std::vector<std::pair<std::string, std::string>> options;
    std::vector<std::string> flags;

    std::string get(const std::string &a, const std::string &b, const std::string &def) const {
        for (const auto &o : options)
            if (o.first == a || o.first == b) return o.second;
        return def;
    }
    bool has(const std::string &name) const { return std::find(flags.begin(), flags.end(), name) != flags.end(); }
};

// Parses argv: `with_value` options take the next argument; `flag_names` take none; anything
// else starting with '-' is a usage error.
Args parse(int argc, char **argv, int first, const std::vector<std::string> &with_value,
           const std::vector<std::string> &flag_names) {
    Args a;
    for (int i = first; i < argc; ++i) {
        const std::string s = argv[i];
        if (std::find(with_value.begin(), with_value.end(), s) != with_value.end()) {
            if (i + 1 >= argc) throw UsageError("option " + s + " needs a value");
            a.options.emplace_back(s, argv[++i]);
        } else if (std::find(flag_names.begin(), flag_names.end(), s) != flag_names.end()) {
            a.flags.push_back(s);
        } else if (s.size() > 1 && s[0] == '-') {
            throw UsageError("unknown option " + s);
        } else {
            a.positional.push_back(s);
        }
    }
    return a;
}

int to_int(const std::string &s, const std::string &what) {
    char *end = nullptr;
    const long v = std::strtol(s.c_str(), &end, 10);
    if (s.empty() || *end != '\0' || v <= 0 || v > 1000000000) throw UsageError(what + " must be a positive integer, got '" + s + "'");
    return static_cast<int>(v);
}

// --- create: llama-lookup-create over token files -------------------------------------------

int cmd_create(int argc, char **argv) {
    Args a = parse(argc, argv, 2, {"-o", "--output", "-i", "-f", "--format", "-lcs"}, {"--tokens", "-q", "--quiet", "--json"});
    std::vector<std::string> inputs = a.positional;
    for (const auto &o : a.options)
        if (o.first == "-i" || o.first == "-f") inputs.push_back(o.second);
    const std::string out = a.get("-o", a.get("--output", "-lcs", ""), "");
    const std::string format = a.get("--format", "--format", "fork-v2");
    if (inputs.empty() || out.empty()) throw UsageError("usage: ngram-anchor create CORPUS.bin [...] -o STATIC [--format fork-v2|llama]");
    if (format != "fork-v2" && format != "llama") throw UsageError("--format must be fork-v2 or llama");
    const double t0 = now_s();
    NgramMap cache;
    uint64_t n_tokens = 0;
    for (const auto &path : inputs) {
        // Each corpus counted on its own (no 2-gram spans two files), as lookupdec create does;
        // llama-lookup-create takes one file.
        std::vector<token_t> tokens = read_tokens(path);
        n_tokens += tokens.size();
        update(cache, NGRAM_STATIC, NGRAM_STATIC, tokens, static_cast<int64_t>(tokens.size()));
    }
    const double t1 = now_s();
    if (format == "llama") {
        save_legacy(cache, out);
    } else {
        FILE *f = std::fopen(out.c_str(), "wb");
        if (!f) throw FileError(out, "cannot write the static file");
        bool ok = true;
        try {
            StaticCache::write_v2(cache, [&](const void *p, size_t n) { ok = ok && std::fwrite(p, 1, n, f) == n; });
        } catch (...) {
            std::fclose(f);
            std::remove(out.c_str());  // no half-written file left behind
            throw;
        }
        if (std::fclose(f) != 0 || !ok) throw FileError(out, "write failed");
    }
    const double t2 = now_s();
    if (a.has("--json")) {
        std::printf("{\"n_tokens\": %" PRIu64 ", \"n_keys\": %zu, \"format\": %s, \"t_count_s\": %s, \"t_write_s\": %s, "
                    "\"wall_s\": %s, \"peak_rss_bytes\": %" PRId64 ", \"ru_maxrss_bytes\": %" PRId64 "}\n",
                    n_tokens, cache.size(), json_str(format).c_str(), num(t1 - t0).c_str(), num(t2 - t1).c_str(),
                    num(t2 - t0).c_str(), vm_hwm_bytes(), ru_maxrss_bytes());
    } else if (!a.has("-q") && !a.has("--quiet")) {
        std::fprintf(stderr, "ngram-anchor create: %" PRIu64 " tokens, %zu 2-grams -> %s (%s) in %.2f s\n", n_tokens,
                     cache.size(), out.c_str(), format.c_str(), t2 - t0);
    }
    return 0;
}

// --- stats: the llama-lookup-stats loop (spec 8.2) -------------------------------------------

int cmd_stats(int argc, char **argv) {
    Args a = parse(argc, argv, 2,
                   {"-f", "-lcs", "--lookup-cache-static", "-lcd", "--lookup-cache-dynamic", "-c", "--ctx-size", "--draft",
                    "--n-draft"},
                   {"--json", "--tokens", "-q", "--quiet"});
    std::string replay = a.get("-f", "-f", "");
    if (replay.empty() && a.positional.size() == 1) replay = a.positional[0];
    if (replay.empty() || a.positional.size() > (a.get("-f", "-f", "").empty() ? 1u : 0u))
        throw UsageError("usage: ngram-anchor stats REPLAY.bin [-lcs STATIC] [-lcd DYNAMIC] [-c 4096] [--draft 8] [--json]");
    const std::string lcs = a.get("-lcs", "--lookup-cache-static", "");
    const std::string lcd = a.get("-lcd", "--lookup-cache-dynamic", "");
    const int n_ctx = to_int(a.get("-c", "--ctx-size", "4096"), "-c");
    const int n_draft = to_int(a.get("--draft", "--n-draft", "8"), "--draft");

    std::vector<token_t> tokens = read_tokens(replay);
    const double t_load0 = now_s();
    std::unique_ptr<StaticCache> st;
    if (!lcs.empty()) st = StaticCache::load(lcs);
    const double t_load1 = now_s();
    NgramMap dynamic;
    bool dynamic_found = false;
    if (!lcd.empty() && file_exists(lcd)) {  // a missing dynamic file is an empty cache
        dynamic = load_legacy(lcd);
        dynamic_found = true;
    }
    const double t_load2 = now_s();

    NgramMap context;
    uint64_t n_drafted = 0, n_accept = 0;
    double t_draft = 0;
    const int64_t n = static_cast<int64_t>(tokens.size());
    std::vector<token_t> out, d;
    out.reserve(static_cast<size_t>(n_ctx) + 1);
    for (int64_t i_start = 0; i_start + n_ctx < n; i_start += n_ctx) {
        const token_t *slice = tokens.data() + i_start;
        out.clear();
        out.push_back(slice[0]);
        while (static_cast<int64_t>(out.size()) < n_ctx) {
            d.clear();
            d.push_back(out.back());
            double t = now_s();
            anchor::draft(out, d, n_draft, NGRAM_MIN, NGRAM_MAX, context, dynamic, st.get());
            t_draft += now_s() - t;
            n_drafted += d.size() - 1;
            for (size_t j = 1; j < d.size() && static_cast<int64_t>(out.size()) < n_ctx; ++j) {
                if (slice[out.size()] != d[j]) break;
                ++n_accept;
                out.push_back(d[j]);
                t = now_s();
                update(context, NGRAM_MIN, NGRAM_MAX, out, 1);
                t_draft += now_s() - t;
            }
            if (static_cast<int64_t>(out.size()) < n_ctx) {
                out.push_back(slice[out.size()]);
                t = now_s();
                update(context, NGRAM_MIN, NGRAM_MAX, out, 1);
                t_draft += now_s() - t;
            }
        }
        merge(dynamic, context);
        context.clear();
    }
    const int64_t n_predict = n - n % n_ctx;
    const double us_per = n_drafted ? 1e6 * t_draft / static_cast<double>(n_drafted) : 0.0;
    const double accept = n_drafted ? 100.0 * static_cast<double>(n_accept) / static_cast<double>(n_drafted) : 0.0;
    const int64_t hwm = vm_hwm_bytes();
    if (a.has("--json")) {
        std::ostringstream js;
        js << "{\"impl\": \"fork-anchor\", \"n_tokens\": " << n << ", \"n_ctx\": " << n_ctx << ", \"n_draft\": " << n_draft
           << ", \"n_predict\": " << n_predict << ", \"n_drafted\": " << n_drafted << ", \"n_accept\": " << n_accept
           << ", \"accept\": " << num(accept) << ", \"t_draft_ms\": " << num(1e3 * t_draft)
           << ", \"us_per_drafted_token\": " << num(us_per) << ", \"t_draft_flat_ms\": " << num(1e3 * (t_load2 - t_load0))
           << ", \"t_load_ms\": " << num(1e3 * (t_load1 - t_load0)) << ", \"t_load_dynamic_ms\": " << num(1e3 * (t_load2 - t_load1))
           << ", \"static\": " << (lcs.empty() ? "null" : json_str(lcs))
           << ", \"static_format\": " << (st ? json_str(st->format) : "null")
           << ", \"dynamic\": " << (lcd.empty() ? "null" : json_str(lcd))
           << ", \"dynamic_found\": " << (dynamic_found ? "true" : "false") << ", \"peak_rss_bytes\": " << hwm
           << ", \"peak_rss_mb\": " << num(static_cast<double>(hwm) / 1048576.0)
           << ", \"ru_maxrss_bytes\": " << ru_maxrss_bytes() << ", \"replay\": " << json_str(replay) << "}";
        std::printf("%s\n", js.str().c_str());
    } else {
        std::printf("n_draft      = %d\nn_predict    = %" PRId64 "\nn_drafted    = %" PRIu64 "\nt_draft_flat = %.2f ms\n"
                    "t_draft      = %.2f ms, %.2f us per token, %.2f tokens per second\nn_accept     = %" PRIu64 "\n"
                    "accept       = %.3f%%\n",
                    n_draft, n_predict, n_drafted, 1e3 * (t_load2 - t_load0), 1e3 * t_draft, us_per,
                    t_draft > 0 ? static_cast<double>(n_drafted) / t_draft : 0.0, n_accept, accept);
    }
    return 0;
}

// --- merge: llama-lookup-merge over legacy cache files --------------------------------------

int cmd_merge(int argc, char **argv) {
    Args a = parse(argc, argv, 2, {"-o", "--output"}, {"-q", "--quiet", "--json"});
    std::vector<std::string> inputs = a.positional;
    std::string out = a.get("-o", "--output", "");
    if (out.empty() && inputs.size() >= 3) {  // llama-lookup-merge's own order: IN... OUT
        out = inputs.back();
        inputs.pop_back();
    }
    if (inputs.empty() || out.empty()) throw UsageError("usage: ngram-anchor merge A B [...] -o OUT");
    const double t0 = now_s();
    NgramMap target = load_legacy(inputs[0]);
    for (size_t i = 1; i < inputs.size(); ++i) {
        NgramMap add = load_legacy(inputs[i]);
        merge(target, add);
    }
    save_legacy(target, out);
    const double t1 = now_s();
    if (a.has("--json")) {
        std::printf("{\"n_keys\": %zu, \"wall_s\": %s, \"peak_rss_bytes\": %" PRId64 ", \"ru_maxrss_bytes\": %" PRId64 "}\n",
                    target.size(), num(t1 - t0).c_str(), vm_hwm_bytes(), ru_maxrss_bytes());
    } else if (!a.has("-q") && !a.has("--quiet")) {
        std::fprintf(stderr, "ngram-anchor merge: %zu inputs, %zu keys -> %s in %.2f s\n", inputs.size(), target.size(),
                     out.c_str(), t1 - t0);
    }
    return 0;
}

// --- update: a dynamic cache file from token files (what llama-lookup saves with -lcd) -------

int cmd_update(int argc, char **argv) {
    Args a = parse(argc, argv, 2, {"-o", "--output"}, {"--tokens", "-q", "--quiet", "--json"});
    const std::string out = a.get("-o", "--output", "");
    if (a.positional.empty() || out.empty()) throw UsageError("usage: ngram-anchor update TOKENS.bin [...] -o DYNAMIC");
    const double t0 = now_s();
    NgramMap cache;
    for (const auto &path : a.positional) {
        // Each file a context of its own, merged into the cache (as llama-lookup's sessions).
        std::vector<token_t> tokens = read_tokens(path);
        NgramMap context;
        update(context, NGRAM_MIN, NGRAM_MAX, tokens, static_cast<int64_t>(tokens.size()));
        merge(cache, context);
    }
    save_legacy(cache, out);
    if (a.has("--json"))
        std::printf("{\"n_keys\": %zu, \"wall_s\": %s, \"peak_rss_bytes\": %" PRId64 "}\n", cache.size(),
                    num(now_s() - t0).c_str(), vm_hwm_bytes());
    return 0;
}

// --- open: static load time alone ------------------------------------------------------------

int cmd_open(int argc, char **argv) {
    Args a = parse(argc, argv, 2, {"--repeat", "-lcs"}, {"--json"});
    std::string path = a.get("-lcs", "-lcs", "");
    if (path.empty() && a.positional.size() == 1) path = a.positional[0];
    if (path.empty()) throw UsageError("usage: ngram-anchor open STATIC [--repeat N] [--json]");
    const int repeat = to_int(a.get("--repeat", "--repeat", "1"), "--repeat");
    std::vector<double> ms;
    std::string format;
    uint32_t keys = 0;
    for (int r = 0; r < repeat; ++r) {
        const double t0 = now_s();
        std::unique_ptr<StaticCache> st = StaticCache::load(path);
        ms.push_back(1e3 * (now_s() - t0));
        format = st->format;
        keys = st->n_keys();
    }
    std::vector<double> sorted = ms;
    std::sort(sorted.begin(), sorted.end());
    const double median = sorted[sorted.size() / 2];
    if (a.has("--json")) {
        std::string list;
        for (double v : ms) list += (list.empty() ? "" : ", ") + num(v);
        std::printf("{\"static\": %s, \"format\": %s, \"n_keys\": %u, \"load_ms\": [%s], \"load_ms_median\": %s, "
                    "\"peak_rss_bytes\": %" PRId64 "}\n",
                    json_str(path).c_str(), json_str(format).c_str(), keys, list.c_str(), num(median).c_str(), vm_hwm_bytes());
    } else {
        std::printf("%s: %s, %u keys, load %.3f ms (median of %d)\n", path.c_str(), format.c_str(), keys, median, repeat);
    }
    return 0;
}

// --- measure: wall time and peak memory of another command ---------------------------------
//
// Run from this small process, the command starts with a small ru_maxrss (Linux carries the
// parent's peak into the child), and the resident memory of its whole process tree is sampled
// every 20 ms, which ru_maxrss (one process) cannot see for commands with worker processes.

int64_t tree_rss_bytes(pid_t root) {
    const int64_t page = sysconf(_SC_PAGESIZE);
    int64_t total = 0;
    std::vector<pid_t> todo{root};
    while (!todo.empty()) {
        const pid_t p = todo.back();
        todo.pop_back();
        std::ifstream statm("/proc/" + std::to_string(p) + "/statm");
        int64_t size = 0, resident = 0;
        if (!(statm >> size >> resident)) continue;
        total += resident * page;
        const std::string tasks = "/proc/" + std::to_string(p) + "/task";
        if (DIR *dir = opendir(tasks.c_str())) {
            while (dirent *e = readdir(dir)) {
                if (e->d_name[0] == '.') continue;
                std::ifstream ch(tasks + "/" + e->d_name + "/children");
                pid_t c;
                while (ch >> c) todo.push_back(c);
            }
            closedir(dir);
        }
    }
    return total;
}

int cmd_measure(int argc, char **argv) {
    std::string out;
    int i = 2;
    for (; i < argc; ++i) {
        const std::string s = argv[i];
        if (s == "--") {
            ++i;
            break;
        }
        if ((s == "-o" || s == "--output") && i + 1 < argc) {
            out = argv[++i];
        } else {
            throw UsageError("usage: ngram-anchor measure -o RESULT.json -- COMMAND [ARGS...]");
        }
    }
    if (out.empty() || i >= argc) throw UsageError("usage: ngram-anchor measure -o RESULT.json -- COMMAND [ARGS...]");
    const double t0 = now_s();
    const pid_t pid = fork();
    if (pid < 0) throw std::runtime_error("fork failed");
    if (pid == 0) {
        execvp(argv[i], argv + i);
        std::fprintf(stderr, "ngram-anchor measure: cannot run %s\n", argv[i]);
        _exit(127);
    }
    std::atomic<bool> stop{false};
    std::atomic<int64_t> peak{0};
    std::thread sampler([&] {
        while (!stop.load()) {
            const int64_t r = tree_rss_bytes(pid);
            if (r > peak.load()) peak.store(r);
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
    });
    int status = 0;
    struct rusage ru;
    while (wait4(pid, &status, 0, &ru) < 0) {
        if (errno != EINTR) throw std::runtime_error("wait4 failed");
    }
    const double wall = now_s() - t0;
    stop.store(true);
    sampler.join();
    const int64_t maxrss = static_cast<int64_t>(ru.ru_maxrss) * 1024;
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    FILE *f = std::fopen(out.c_str(), "w");
    if (!f) throw FileError(out, "cannot write the result");
    std::fprintf(f,
                 "{\"wall_s\": %s, \"peak_rss_bytes\": %" PRId64 ", \"ru_maxrss_bytes\": %" PRId64
                 ", \"sampled_tree_rss_bytes\": %" PRId64 ", \"user_s\": %s, \"sys_s\": %s, \"exit_code\": %d}\n",
                 num(wall).c_str(), std::max(maxrss, peak.load()), maxrss, peak.load(),
                 num(static_cast<double>(ru.ru_utime.tv_sec) + 1e-6 * static_cast<double>(ru.ru_utime.tv_usec)).c_str(),
                 num(static_cast<double>(ru.ru_stime.tv_sec) + 1e-6 * static_cast<double>(ru.ru_stime.tv_usec)).c_str(), code);
    std::fclose(f);
    return code;
}

const char *USAGE =
    "usage: ngram-anchor COMMAND ...\n"
    "  create CORPUS.bin [...] -o STATIC [--format fork-v2|llama] [--json]   llama-lookup-create (2-grams)\n"
    "  stats REPLAY.bin [-lcs STATIC] [-lcd DYNAMIC] [-c 4096] [--draft 8] [--json]   llama-lookup-stats\n"
    "  merge A B [...] -o OUT [--json]                                        llama-lookup-merge\n"
    "  update TOKENS.bin [...] -o DYNAMIC                                     a dynamic cache (1..4-grams)\n"
    "  open STATIC [--repeat N] [--json]                                      static load time\n"
    "  measure -o RESULT.json -- COMMAND [ARGS...]                            wall time, peak RSS of a command\n"
    "Token files are raw little-endian int32 ids. The fork's algorithms, reconstructed: see perf/anchors/README.md.\n";

}  // namespace

int main(int argc, char **argv) {
    if (argc < 2 || std::string(argv[1]) == "-h" || std::string(argv[1]) == "--help") {
        std::fputs(USAGE, argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const std::string cmd = argv[1];
    try {
        if (cmd == "create") return cmd_create(argc, argv);
        if (cmd == "stats") return cmd_stats(argc, argv);
        if (cmd == "merge") return cmd_merge(argc, argv);
        if (cmd == "open") return cmd_open(argc, argv);
        if (cmd == "update") return cmd_update(argc, argv);
        if (cmd == "measure") return cmd_measure(argc, argv);
        std::fprintf(stderr, "ngram-anchor: unknown command '%s'\n%s", cmd.c_str(), USAGE);
        return 2;
    } catch (const UsageError &e) {
        std::fprintf(stderr, "ngram-anchor %s: %s\n", cmd.c_str(), e.what());
        return 2;
    } catch (const std::bad_alloc &) {
        std::fprintf(stderr, "ngram-anchor %s: out of memory\n", cmd.c_str());
        return 1;
    } catch (const std::exception &e) {
        std::fprintf(stderr, "ngram-anchor %s: %s\n", cmd.c_str(), e.what());
        return 1;
    }
}
