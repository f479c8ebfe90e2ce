// The workers' output and the agent's log: prefixes and their template, the route of each stream,
// the console relay, the log tree, the agent's line format (golden texts); then the real
// elasticrun with logs-flood workers: 100 000 lines per stream, restarts, filters, /dev/null.
#include "agent_support.hpp"

#include "elastic/agent/agent_log.hpp"
#include "elastic/agent/log_tree.hpp"
#include "elastic/agent/output.hpp"
#include "elastic/launch/config.hpp"

#include <doctest/doctest.h>

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

namespace test_logs {

namespace fs = std::filesystem;
using agent_support::temp_dir;

std::string flood() { return ELASTIC_TEST_PROGRAM_DIR "/logs-flood"; }

std::string slurp(const fs::path& path) {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::vector<std::string> lines_of(const std::string& text) {
    std::vector<std::string> lines;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    return lines;
}

std::vector<std::string> sorted_lines(const std::string& text) {
    auto lines = lines_of(text);
    std::sort(lines.begin(), lines.end());
    return lines;
}

/// What a line_relay writes, read back from a pipe.
std::string relayed(const std::vector<std::string>& chunks, const std::string& prefix, std::size_t max_line = 64 * 1024,
                    std::vector<std::string> filters = {}) {
    int fds[2];
    REQUIRE(::pipe2(fds, O_CLOEXEC) == 0);
    {
        elastic::line_relay relay(fds[1], prefix, max_line);
        relay.only_lines_with(std::move(filters));
        for (const auto& c : chunks) relay.feed(c);
        relay.flush();
    }
    ::close(fds[1]);
    std::string out;
    char buffer[4096];
    for (ssize_t n; (n = ::read(fds[0], buffer, sizeof buffer)) > 0;) out.append(buffer, static_cast<std::size_t>(n));
    ::close(fds[0]);
    return out;
}

elastic::launch_config config_with(int nproc, const std::string& redirects, const std::string& tee,
                                   std::set<int> filter = {}) {
    elastic::launch_config c;
    c.nproc_per_node = nproc;
    c.redirects = elastic::parse_stream_selection(redirects, "--redirects");
    c.tee = elastic::parse_stream_selection(tee, "--tee");
    c.local_ranks_filter = std::move(filter);
    return c;
}

std::map<std::string, std::string> env_in(const temp_dir& tmp) {
    auto env = agent_support::clean_environment();
    env["TMPDIR"] = tmp.str();
    env["OMP_NUM_THREADS"] = "1";  // no torchrun warning about it on the agent's stderr
    return env;
}

/// The single directory under `dir` whose name starts with `prefix`.
fs::path only_dir(const fs::path& dir, const std::string& prefix) {
    std::vector<fs::path> found;
    for (const auto& e : fs::directory_iterator(dir)) {
        if (e.path().filename().string().rfind(prefix, 0) == 0) found.push_back(e.path());
    }
    REQUIRE(found.size() == 1);
    return found.front();
}

std::vector<std::string> names_in(const fs::path& dir) {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
}

TEST_CASE("logs: the prefix template follows Python's safe_substitute, as torchrun applies it") {
    using elastic::format_log_prefix;
    CHECK(format_log_prefix("[${role_name}${local_rank}]:", "default", 0, 0) == "[default0]:");
    CHECK(format_log_prefix("[${role_name}${local_rank}]:", "trainer", 12, 40) == "[trainer12]:");
    CHECK(format_log_prefix("$role_name/$rank/$local_rank ", "r", 3, 7) == "r/7/3 ");
    CHECK(format_log_prefix("$$rank=${rank}$", "r", 3, 7) == "$rank=7$");
    CHECK(format_log_prefix("${rank", "r", 3, 7) == "${rank");
    CHECK(format_log_prefix("$ranked ${other} $9", "r", 3, 7) == "$ranked ${other} $9");
    CHECK(format_log_prefix("", "r", 3, 7).empty());
}

TEST_CASE("logs: each stream's route follows torchrun's table (tee implies redirect, the filter, /dev/null)") {
    using elastic::console_copy;
    using elastic::route_streams;
    using elastic::stream_route;
    const stream_route raw{false, console_copy::raw};
    const stream_route file_only{true, console_copy::none};
    const stream_route tee{true, console_copy::prefixed};
    const stream_route nowhere{false, console_copy::none};
    const stream_route console_only{false, console_copy::prefixed};

    auto c = config_with(2, "0", "0");
    CHECK(route_streams(c, 0).out == raw);
    CHECK(route_streams(c, 1).err == raw);
    c = config_with(2, "1", "2");  // stdout redirected, stderr tee'd (tee implies redirect)
    CHECK(route_streams(c, 0).out == file_only);
    CHECK(route_streams(c, 0).err == tee);
    c = config_with(12, "0", "11:3,0:1");  // per rank, a two-digit local rank
    CHECK(route_streams(c, 11).out == tee);
    CHECK(route_streams(c, 11).err == tee);
    CHECK(route_streams(c, 0).out == tee);
    CHECK(route_streams(c, 0).err == raw);
    CHECK(route_streams(c, 5).out == raw);
    c = config_with(3, "2", "1", {0, 2});  // rank 1 filtered out: no console, files kept
    CHECK(route_streams(c, 0).out == tee);
    CHECK(route_streams(c, 1).out == file_only);
    CHECK(route_streams(c, 1).err == file_only);
    c = config_with(3, "0", "0", {1});
    CHECK(route_streams(c, 0).out == nowhere);
    CHECK(route_streams(c, 1).out == raw);
    CHECK_FALSE(elastic::writes_log_files(c));
    c = config_with(2, "1", "2");
    c.log_dir = "/dev/null";
    CHECK(route_streams(c, 0).out == nowhere);
    CHECK(route_streams(c, 0).err == console_only);
    CHECK_FALSE(elastic::writes_log_files(c));
    c.log_dir.reset();
    CHECK(elastic::writes_log_files(c));
}

TEST_CASE("logs: the console relay writes whole lines, each after the prefix (golden)") {
    // Lines cut anywhere across chunks, \r\n split between two chunks, a lone \r, a last line
    // without its newline.
    const std::vector<std::string> chunks{"one\ntw", "o\nthr", "ee\r", "\nbar 50%\rbar 100%\r", "\nlast"};
    CHECK(relayed(chunks, "[default0]:") ==
          "[default0]:one\n[default0]:two\n[default0]:three\r\n[default0]:bar 50%\r[default0]:bar 100%\r\n"
          "[default0]:last\n");
    CHECK(relayed(chunks, "") == "one\ntwo\nthree\r\nbar 50%\rbar 100%\r\nlast\n");
    // A partial line reaching the bound is cut into pieces, each a line of its own (a complete
    // line in one chunk is written whole).
    CHECK(relayed({"abcdefghij", "klm\nxy"}, "> ", 4) == "> abcd\n> efgh\n> ijklm\n> xy\n");
    CHECK(relayed({}, "[x]:").empty());
    CHECK(relayed({"", "\n"}, "[x]:") == "[x]:\n");
}

TEST_CASE("logs: duplicate filters keep the lines holding one of their texts, and ,, is a comma inside one") {
    using elastic::parse_duplicate_filters;
    CHECK(parse_duplicate_filters("loss,step") == std::vector<std::string>{"loss", "step"});
    CHECK(parse_duplicate_filters("a,,b,c") == std::vector<std::string>{"a,b", "c"});
    CHECK(parse_duplicate_filters(",,x,,") == std::vector<std::string>{",x,"});
    CHECK(parse_duplicate_filters(" spaced ,") == std::vector<std::string>{" spaced "});
    CHECK(parse_duplicate_filters("").empty());
    CHECK(parse_duplicate_filters(",").empty());
    // Lines cut across chunks are matched whole; a \r-ended piece is a line; the partial last
    // line is matched too.
    const std::vector<std::string> chunks{"loss 1.5\nacc", "uracy 0.1\nlo", "ss 0.9\rnoise\nfinal loss"};
    CHECK(relayed(chunks, "[t0]:", 64 * 1024, {"loss"}) == "[t0]:loss 1.5\n[t0]:loss 0.9\r[t0]:final loss\n");
    CHECK(relayed(chunks, "", 64 * 1024, {"curacy", "nois"}) == "accuracy 0.1\nnoise\n");
    CHECK(relayed(chunks, "", 64 * 1024, {"absent"}).empty());
    CHECK(relayed({"x,y\nxy\n"}, "", 64 * 1024, parse_duplicate_filters("x,,y")) == "x,y\n");
}

TEST_CASE("logs: the tree never wipes an attempt and is made lazily, /dev/null makes nothing") {
    temp_dir tmp;
    {
        elastic::log_tree tree(tmp.path() / "base" / "deeper", "job", tmp.path());
        CHECK(tree.run_dir().empty());
        const auto a0 = tree.make_attempt(0, 2);
        CHECK(a0.filename() == "attempt_0");
        CHECK(a0.parent_path().filename().string().rfind("job_", 0) == 0);
        CHECK(a0.parent_path().parent_path() == tmp.path() / "base" / "deeper");
        CHECK(names_in(a0) == std::vector<std::string>{"0", "1"});
        std::ofstream(a0 / "0" / "stdout.log") << "kept\n";
        const auto a1 = tree.make_attempt(1, 2);
        CHECK(a1.filename() == "attempt_1");
        // The same attempt number again (a restart count seen twice): a sibling, nothing wiped.
        const auto again = tree.make_attempt(0, 2);
        CHECK(again.filename() == "attempt_0.1");
        CHECK(slurp(a0 / "0" / "stdout.log") == "kept\n");
        CHECK(names_in(tree.run_dir()) == std::vector<std::string>{"attempt_0", "attempt_0.1", "attempt_1"});
        tree.remove_temporary();  // --log-dir given: stays
        CHECK(fs::exists(a0 / "0" / "stdout.log"));
    }
    {
        const auto parent = tmp.path() / "t";
        fs::create_directory(parent);
        elastic::log_tree tree(std::nullopt, "none", parent);
        const auto a0 = tree.make_attempt(0, 1);
        CHECK(tree.base().parent_path() == parent);
        CHECK(tree.base().filename().string().rfind("torchelastic_", 0) == 0);
        CHECK(fs::is_directory(a0 / "0"));
        tree.remove_temporary();
        CHECK(fs::is_empty(parent));
    }
    {
        const auto parent = tmp.path() / "n";
        fs::create_directory(parent);
        elastic::log_tree tree(fs::path("/dev/null"), "none", parent);
        CHECK(tree.disabled());
        CHECK(tree.make_attempt(0, 4).empty());
        CHECK(fs::is_empty(parent));
    }
    {
        std::ofstream(tmp.path() / "file") << "x";
        elastic::log_tree tree(tmp.path() / "file" / "sub", "none", tmp.path());
        CHECK_THROWS_AS(tree.make_attempt(0, 1), elastic::log_error);
    }
}

TEST_CASE("logs: the agent's line format is torchrun's newest layout (golden)") {
    std::tm t{};
    t.tm_mon = 10;
    t.tm_mday = 2;
    t.tm_hour = 9;
    t.tm_min = 5;
    t.tm_sec = 7;
    using elastic::agent_log;
    using elastic::log_level;
    CHECK(agent_log::format(log_level::warning, t, 42, 4242, "elasticrun", "worker group failed") ==
          "W1102 09:05:07.000042 4242 elasticrun] worker group failed\n");
    CHECK(agent_log::format(log_level::info, t, 999999, 7, "run", "Starting:\n  a : 1\n  b : 2\n") ==
          "I1102 09:05:07.999999 7 run] Starting:\nI1102 09:05:07.999999 7 run]   a : 1\n"
          "I1102 09:05:07.999999 7 run]   b : 2\n");
    CHECK(agent_log::format(log_level::debug, t, 0, 1, "x", "d").front() == 'D');
    CHECK(agent_log::format(log_level::error, t, 0, 1, "x", "e").front() == 'E');
    CHECK(agent_log::format(log_level::critical, t, 0, 1, "x", "c").front() == 'C');
    const agent_log quiet("x", log_level::warning);
    CHECK_FALSE(quiet.enabled(log_level::info));
    CHECK(quiet.enabled(log_level::error));
}

// Checks that `text` holds, for each of `ranks`, exactly the lines "<stream> <rank> <i> ..." for i
// in [0, count) in order and then "<stream> <rank> end", each after the rank's prefix, and nothing
// else (a line of two workers mixed would match no form).
void check_flood_console(const std::string& text, const char* stream, int ranks, int count) {
    std::vector<int> next(static_cast<std::size_t>(ranks), 0);
    std::vector<bool> ended(static_cast<std::size_t>(ranks), false);
    const std::string tail = " abcdefghijklmnopqrstuvwxyz";
    std::size_t bad = 0;
    std::string first_bad;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) {
        int rank = -1;
        if (line.rfind("[default", 0) == 0 && line.size() > 11 && line[9] == ']' && line[10] == ':') {
            rank = line[8] - '0';
        }
        const auto r = static_cast<std::size_t>(rank);
        const std::string body = rank >= 0 ? line.substr(11) : std::string();
        const std::string expected = rank < 0 || rank >= ranks ? std::string("?")
                                     : next[r] < count ? fmt::format("{} {} {:06}{}", stream, rank, next[r], tail)
                                                       : fmt::format("{} {} end", stream, rank);
        if (body != expected || ended[r]) {
            if (bad++ == 0) first_bad = line;
            continue;
        }
        if (next[r] < count) {
            ++next[r];
        } else {
            ended[r] = true;
        }
    }
    INFO("first unexpected line: " << first_bad);
    CHECK(bad == 0);
    for (int r = 0; r < ranks; ++r) {
        CHECK(next[static_cast<std::size_t>(r)] == count);
        CHECK(ended[static_cast<std::size_t>(r)]);
    }
}

std::string flood_file(const char* stream, int rank, int count) {
    std::string text;
    for (int i = 0; i < count; ++i) text += fmt::format("{} {} {:06} abcdefghijklmnopqrstuvwxyz\n", stream, rank, i);
    return text + fmt::format("{} {} end", stream, rank);
}

TEST_CASE("logs: 100 000 lines per stream as fast as a worker writes: files and console hold each once and in order") {
    temp_dir tmp;
    const auto logs = tmp.path() / "logs";
    constexpr int count = 100000;
    auto r = agent_support::run({"--nproc-per-node=2", "--tee=3", "--log-dir", logs.string(), "--rdzv-id=flood",
                                 flood(), "flood", std::to_string(count)},
                                env_in(tmp));
    REQUIRE(r.code == 0);
    check_flood_console(r.out, "out", 2, count);
    check_flood_console(r.err, "err", 2, count);
    const auto attempt = only_dir(logs, "flood_") / "attempt_0";
    for (int rank = 0; rank < 2; ++rank) {
        CAPTURE(rank);
        const auto dir = attempt / std::to_string(rank);
        // The files hold the bytes as written, the last line without its newline.
        CHECK(slurp(dir / "stdout.log") == flood_file("out", rank, count));
        CHECK(slurp(dir / "stderr.log") == flood_file("err", rank, count));
    }
}

TEST_CASE("logs: a full file system under --log-dir is a warning at once and a line at the end, the console "
          "and the exit code untouched") {
    // --log-dir on a 256 KiB tmpfs of a mount namespace of its own (unshare; as another user than
    // root, in a user namespace that maps the user to root there), for 4 streams of 410 KB each:
    // the files fill up.
    temp_dir tmp;
    const auto logs = tmp.path() / "logs";
    fs::create_directories(logs);
    constexpr int count = 10000;
    // In the namespace: mount, run elasticrun, then print each log file's size ("size N PATH")
    // before the tmpfs goes with the namespace.
    const std::string unshare_flags = ::geteuid() == 0 ? "-m" : "-Urm";
    const std::vector<std::string> script{
        unshare_flags,
        "sh",
        "-c",
        "mount -t tmpfs -o size=256k tmpfs \"$0\" || exit 97\n"
        "\"$@\"; code=$?\n"
        "find \"$0\" -name '*.log' | while read -r f; do echo \"size $(wc -c < \"$f\") $f\" >&2; done\n"
        "exit $code\n",
        logs.string(),
        agent_support::elasticrun()};
    if (const auto probe = agent_support::run({unshare_flags, "true"}, env_in(tmp), "/usr/bin/unshare");
        probe.code != 0) {
        MESSAGE("skipped: this machine allows no mount namespace (unshare " << unshare_flags << ": " << probe.err
                                                                            << ")");
        return;
    }
    // The third adds attempt_0/filtered_stdout.log, which every stdout line of both ranks matches.
    for (const std::string mode : {"--tee=3", "--redirects=3", "--tee=3 --duplicate-stdout-filters=out"}) {
        CAPTURE(mode);
        const bool filtered = mode.find("filters") != std::string::npos;
        auto args = script;
        args.push_back("--nproc-per-node=2");
        args.push_back(mode.substr(0, mode.find(' ')));
        if (filtered) args.push_back(mode.substr(mode.find(' ') + 1));
        for (const auto& a : {std::string("--log-dir"), logs.string(), std::string("--rdzv-id=full"), flood(),
                              std::string("flood"), std::to_string(count)})
            args.push_back(a);
        auto r = agent_support::run(args, env_in(tmp), "/usr/bin/unshare");
        INFO(r.err);
        CHECK(r.code == 0);  // the workers' code: they succeeded
        if (mode.rfind("--tee=3", 0) == 0) check_flood_console(r.out, "out", 2, count);  // whole on the console
        // At once: the first failed write of a file, named with its path and errno.
        const auto first = r.err.find("cannot write local_rank ");
        REQUIRE(first != std::string::npos);
        CHECK(r.err.find("No space left on device; what the worker writes to it from now on is lost", first) !=
              std::string::npos);
        // At the end of the attempt and of the job: every incomplete file and the bytes it lost.
        const auto end = r.err.find("of this node's log files are incomplete (writes to them failed; the exit code "
                                    "is the workers' all the same):");
        REQUIRE(end != std::string::npos);
        CHECK(first < end);
        std::uint64_t lost = 0;
        const std::regex line(R"(local_rank [01]'s std(out|err) log file \S+ is incomplete: ([0-9]+) bytes not )"
                              R"(written \(No space left on device\))");
        for (std::sregex_iterator it(r.err.begin(), r.err.end(), line), none; it != none; ++it)
            lost += std::stoull((*it)[2].str());
        std::uint64_t kept = 0;
        int files = 0;
        std::uint64_t filtered_kept = 0;
        const std::regex size_line(R"(size ([0-9]+) (\S+)\.log)");
        for (std::sregex_iterator it(r.err.begin(), r.err.end(), size_line), none; it != none; ++it) {
            if ((*it)[2].str().ends_with("/filtered_stdout")) {
                filtered_kept = std::stoull((*it)[1].str());
                continue;
            }
            kept += std::stoull((*it)[1].str());
            ++files;
        }
        CHECK(files == 4);
        CHECK(lost > 0);
        // Every byte of the 4 streams is either in its file or counted as lost.
        CHECK(kept + lost == 4 * flood_file("out", 0, count).size());
        if (!filtered) continue;
        // The filtered file: a warning at its first failed write, and its loss in the summary.
        const auto filtered_first = r.err.find("cannot write the filtered log file ");
        REQUIRE(filtered_first != std::string::npos);
        CHECK(r.err.find("filtered_stdout.log: No space left on device; matching lines are lost from it until writes "
                         "succeed again",
                         filtered_first) != std::string::npos);
        const std::regex filtered_line(R"(the filtered log file \S+/filtered_stdout\.log is incomplete: ([0-9]+) )"
                                       R"(bytes not written \(No space left on device\))");
        std::smatch m;
        REQUIRE(std::regex_search(r.err, m, filtered_line));
        const std::uint64_t filtered_lost = std::stoull(m[1].str());
        CHECK(filtered_lost > 0);
        // Both ranks' stdout lines, each after its "[defaultN]:" prefix, the last one ended by the agent.
        const std::uint64_t per_rank = flood_file("out", 0, count).size() + 1 +
                                       (count + 1) * std::string("[default0]:").size();
        CHECK(filtered_kept + filtered_lost == 2 * per_rank);
    }
}

TEST_CASE("logs: after two restarts the tree holds every attempt, the failure report keeps the stderr tail") {
    temp_dir tmp;
    const auto logs = tmp.path() / "logs";
    auto r = agent_support::run({"--nproc-per-node=2", "-r", "3", "--max-restarts=2", "--log-dir", logs.string(),
                                 "--rdzv-id=job", flood(), "attempts", "2"},
                                env_in(tmp));
    INFO(r.err);
    REQUIRE(r.code == 0);
    const auto run_dir = only_dir(logs, "job_");
    CHECK(names_in(run_dir) == std::vector<std::string>{"attempt_0", "attempt_1", "attempt_2"});
    for (int attempt = 0; attempt < 3; ++attempt) {
        for (int rank = 0; rank < 2; ++rank) {
            const auto dir = run_dir / fmt::format("attempt_{}", attempt) / std::to_string(rank);
            CHECK(slurp(dir / "stdout.log") == fmt::format("attempt {} rank {} out\n", attempt, rank));
            CHECK(slurp(dir / "stderr.log") == fmt::format("attempt {} rank {} err\n", attempt, rank));
        }
    }
    // Redirected only: nothing of the workers on the console.
    CHECK(r.out.empty());
    CHECK(r.err.find("rank 0 err") == std::string::npos);

    // Redirected stderr still feeds the summary's tail.
    r = agent_support::run({"-r", "3", "--log-dir", logs.string(), flood(), "attempts", "5"}, env_in(tmp));
    CHECK(r.code == 1);
    CHECK(r.err.find("attempt 0 rank 0 err") != std::string::npos);
    CHECK(r.err.find("Root Cause") != std::string::npos);
}

TEST_CASE("logs: console prefixes and the per-rank filter and the template (golden)") {
    temp_dir tmp;
    SUBCASE("--tee=3: every line prefixed, the partial last line ended") {
        auto r = agent_support::run({"--nproc-per-node=2", "--tee=3", "--log-dir", (tmp.path() / "l").string(), flood(),
                                     "say"},
                                    env_in(tmp));
        REQUIRE(r.code == 0);
        CHECK(sorted_lines(r.out) == std::vector<std::string>{"[default0]:hello from 0", "[default0]:partial 0",
                                                              "[default0]:second line", "[default1]:hello from 1",
                                                              "[default1]:partial 1", "[default1]:second line"});
        const bool either_order = r.err == "[default0]:warning from 0\n[default1]:warning from 1\n" ||
                                  r.err == "[default1]:warning from 1\n[default0]:warning from 0\n";
        CHECK(either_order);
    }
    SUBCASE("without -r/-t: torchrun's raw console, stdout inherited, stderr relayed whole lines") {
        auto r = agent_support::run({"--nproc-per-node=2", flood(), "say"}, env_in(tmp));
        REQUIRE(r.code == 0);
        CHECK(r.out.find("hello from 0\n") != std::string::npos);
        CHECK(r.out.find("partial 1") != std::string::npos);
        CHECK(sorted_lines(r.err) == std::vector<std::string>{"warning from 0", "warning from 1"});
        CHECK(fs::is_empty(tmp.path()));  // the temporary error-file tree is gone after a success
    }
    SUBCASE("--local-ranks-filter=0,2 with --tee=2: ranks 1 silent, files for all") {
        const auto logs = tmp.path() / "l";
        auto r = agent_support::run({"--nproc-per-node=3", "--tee=2", "--local-ranks-filter=0,2", "--log-dir",
                                     logs.string(), "--rdzv-id=f", flood(), "say"},
                                    env_in(tmp));
        REQUIRE(r.code == 0);
        CHECK(sorted_lines(r.err) ==
              std::vector<std::string>{"[default0]:warning from 0", "[default2]:warning from 2"});
        CHECK(r.out.find("hello from 0\n") != std::string::npos);
        CHECK(r.out.find("hello from 2\n") != std::string::npos);
        CHECK(r.out.find("from 1") == std::string::npos);
        CHECK(slurp(only_dir(logs, "f_") / "attempt_0" / "1" / "stderr.log") == "warning from 1\n");
        CHECK_FALSE(fs::exists(only_dir(logs, "f_") / "attempt_0" / "1" / "stdout.log"));
    }
    SUBCASE("--duplicate-*-filters: matching tee'd lines of every rank in one file per attempt") {
        const auto logs = tmp.path() / "l";
        // Ranks 0 and 1 tee stdout, rank 2 only redirects it; the console shows rank 0 alone.
        auto r = agent_support::run({"--nproc-per-node=3", "-t", "0:1,1:1", "-r", "2:1", "--local-ranks-filter=0",
                                     "--duplicate-stdout-filters=hello from 1,partial,zz,,z",
                                     "--duplicate_stderr_filters=warning", "--log-dir", logs.string(), "--rdzv-id=d",
                                     flood(), "say"},
                                    env_in(tmp));
        INFO(r.err);
        REQUIRE(r.code == 0);
        const auto attempt = only_dir(logs, "d_") / "attempt_0";
        CHECK(sorted_lines(slurp(attempt / "filtered_stdout.log")) ==
              std::vector<std::string>{"[default0]:partial 0", "[default1]:hello from 1", "[default1]:partial 1"});
        // No rank tees stderr: the file is there and empty, and the agent said why.
        CHECK(fs::exists(attempt / "filtered_stderr.log"));
        CHECK(slurp(attempt / "filtered_stderr.log").empty());
        CHECK(r.err.find("--duplicate-stderr-filters: no local rank tees its stderr (-t), so filtered_stderr.log "
                         "stays empty; tee it (-t 3)") != std::string::npos);
        CHECK(r.err.find("--duplicate-stdout-filters:") == std::string::npos);
        // The rest of the routes as without filters.
        CHECK(slurp(attempt / "2" / "stdout.log") == "hello from 2\nsecond line\npartial 2");
        CHECK(r.out.find("[default0]:hello from 0\n") != std::string::npos);
        CHECK(r.out.find("from 1") == std::string::npos);

        // Rank 1 tees stderr too: its matching line is copied, and nobody is warned.
        r = agent_support::run({"--nproc-per-node=2", "-t", "1:3", "--duplicate-stderr-filters=from 1,absent",
                                "--log-dir", logs.string(), "--rdzv-id=e", flood(), "say"},
                               env_in(tmp));
        REQUIRE(r.code == 0);
        CHECK(slurp(only_dir(logs, "e_") / "attempt_0" / "filtered_stderr.log") == "[default1]:warning from 1\n");
        CHECK_FALSE(fs::exists(only_dir(logs, "e_") / "attempt_0" / "filtered_stdout.log"));
        CHECK(r.err.find("--duplicate") == std::string::npos);
    }
    SUBCASE("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE and a two-digit local rank in -t") {
        auto env = env_in(tmp);
        env["TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"] = "${role_name}-${rank}/${local_rank}|$$ ";
        auto r = agent_support::run({"--nproc-per-node=12", "--role=trainer", "-t", "11:1", "--local-ranks-filter=11",
                                     "--log-dir", (tmp.path() / "l").string(), flood(), "say"},
                                    env);
        REQUIRE(r.code == 0);
        CHECK(r.out == "trainer-11/11|$ hello from 11\ntrainer-11/11|$ second line\ntrainer-11/11|$ partial 11\n");
        CHECK(r.err == "warning from 11\n");  // not tee'd: raw, as the worker wrote it
    }
}

TEST_CASE("logs: --log-dir=/dev/null writes no file, tee'd streams still reach the console") {
    temp_dir tmp;
    auto r = agent_support::run({"--nproc-per-node=2", "--log-dir=/dev/null", "-r", "1", "-t", "2", "--max-restarts=1",
                                 flood(), "attempts", "1"},
                                env_in(tmp));
    REQUIRE(r.code == 0);
    CHECK(fs::is_empty(tmp.path()));
    CHECK(r.out.empty());  // redirected to no file: nowhere
    CHECK(r.err.find("[default1]:attempt 1 rank 1 err\n") != std::string::npos);
    r = agent_support::run({"--log-dir=/dev/null", flood(), "errfile"}, env_in(tmp));
    CHECK(r.code == 0);
    CHECK(r.out == "errfile=\n");  // torchrun's newest: an empty TORCHELASTIC_ERROR_FILE
    CHECK(fs::is_empty(tmp.path()));
}

TEST_CASE("logs: the agent is quiet by default, LOGLEVEL=INFO shows the banner and the log directory") {
    temp_dir tmp;
    auto r = agent_support::run({"-t", "3", flood(), "errfile"}, env_in(tmp));
    REQUIRE(r.code == 0);
    CHECK(r.err.empty());
    // Without --log-dir, -t's files are kept in the temporary tree after a success.
    const auto base = only_dir(tmp.path(), "torchelastic_");
    CHECK(slurp(only_dir(base, "none_") / "attempt_0" / "0" / "stdout.log").rfind("errfile=", 0) == 0);

    auto env = env_in(tmp);
    env["LOGLEVEL"] = "info";
    const auto logs = tmp.path() / "l";
    r = agent_support::run({"-t", "3", "--log-dir", logs.string(), flood(), "errfile"}, env);
    REQUIRE(r.code == 0);
    const std::regex agent_line(R"(^[DIWEC]\d{4} \d\d:\d\d:\d\d\.\d{6} \d+ agent-elasticrun\] .*)");
    const auto lines = lines_of(r.err);
    REQUIRE(!lines.empty());
    for (const auto& line : lines) {
        CAPTURE(line);
        CHECK(std::regex_match(line, agent_line));
    }
    CHECK(r.err.find("agent-elasticrun] Starting elastic agent with launch configs:\n") != std::string::npos);
    CHECK(r.err.find(fmt::format("agent-elasticrun]   {:<20} : {}\n", "log_dir", logs.string())) != std::string::npos);
    CHECK(r.err.find(fmt::format("agent-elasticrun]   {:<20} : 3\n", "tee")) != std::string::npos);
    CHECK(r.err.find(fmt::format("agent-elasticrun] log directory set to: {}/none_", logs.string())) !=
          std::string::npos);
}

TEST_CASE("logs: the four options in their three spellings (dashed, underscored, PET_)") {
    struct option_case {
        std::string dashed;
        std::string value;  ///< empty: the temporary directory's "l"
        std::string mode;   ///< logs-flood's
        std::function<void(const temp_dir&, const agent_support::result&)> check;
    };
    const std::vector<option_case> cases{
        {"--log-dir", "", "say",
         [](const temp_dir& t, const agent_support::result& r) {
             CHECK(r.out == "hello from 0\nsecond line\npartial 0");  // raw: inherited stdout
             CHECK(fs::is_directory(only_dir(t.path() / "l", "none_") / "attempt_0" / "0"));
         }},
        {"--redirects", "1", "say",
         [](const temp_dir& t, const agent_support::result& r) {
             CHECK(r.out.empty());
             CHECK(slurp(only_dir(t.path() / "l", "none_") / "attempt_0" / "0" / "stdout.log") ==
                   "hello from 0\nsecond line\npartial 0");
         }},
        {"--tee", "1", "say",
         [](const temp_dir&, const agent_support::result& r) {
             CHECK(r.out == "[default0]:hello from 0\n[default0]:second line\n[default0]:partial 0\n");
         }},
        {"--local-ranks-filter", "1", "errfile",
         [](const temp_dir&, const agent_support::result& r) {
             // Two workers; rank 0's stdout (not redirected, filtered out) goes nowhere.
             CHECK(std::count(r.out.begin(), r.out.end(), '\n') == 1);
             CHECK(r.out.find("/attempt_0/1/error.json\n") != std::string::npos);
         }},
    };
    for (const auto& c : cases) {
        for (int spelling = 0; spelling < 3; ++spelling) {
            CAPTURE(c.dashed);
            CAPTURE(spelling);
            temp_dir tmp;
            auto env = env_in(tmp);
            const std::string value = c.value.empty() ? (tmp.path() / "l").string() : c.value;
            std::vector<std::string> args{"--nproc-per-node=" + std::string(c.mode == "errfile" ? "2" : "1")};
            if (c.dashed != "--log-dir") args.push_back("--log-dir=" + (tmp.path() / "l").string());
            std::string underscored = c.dashed;
            std::replace(underscored.begin() + 2, underscored.end(), '-', '_');
            if (spelling < 2) {
                args.push_back((spelling == 0 ? c.dashed : underscored) + "=" + value);
            } else {
                std::string pet = "PET_" + underscored.substr(2);
                std::transform(pet.begin(), pet.end(), pet.begin(),
                               [](char ch) { return static_cast<char>(std::toupper(static_cast<unsigned char>(ch))); });
                env[pet] = value;
            }
            args.push_back(flood());
            args.push_back(c.mode);
            auto r = agent_support::run(args, env);
            INFO(r.err);
            REQUIRE(r.code == 0);
            c.check(tmp, r);
        }
    }
}
}  // namespace test_logs
