// What the rendezvous trusts (issue 17): invalid control values written into a running job's
// store by another client are reported and ignored, the rendezvous store's keys do not grow
// over restarts, and a host name endpoint binds that name's address, never 0.0.0.0.
#include "agent_support.hpp"

#include <elastic/rendezvous/store_rendezvous.hpp>
#include <elastic/rendezvous/tcp_rendezvous.hpp>
#include <elastic/store/blocking_client.hpp>

#include <doctest/doctest.h>

#include <fmt/format.h>

#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace test_rendezvous_trust {

using agent_support::launched;
using agent_support::temp_dir;

using agent_support::free_port;

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

/// One job of real agents on loopback, c10d; agent i runs with RDZV_TEST_NODE=i.
struct job {
    job(std::string id_, std::string nnodes_) : id(std::move(id_)), nnodes(std::move(nnodes_)) {}

    temp_dir dir;
    int port = free_port();
    std::string id;
    std::string nnodes;
    std::string endpoint_host = "127.0.0.1";
    std::vector<std::unique_ptr<launched>> agents;

    launched& start(const std::string& rules, const std::vector<std::string>& extra = {}) {
        const int node = static_cast<int>(agents.size());
        std::vector<std::string> args{"--rdzv-backend=c10d", fmt::format("--rdzv-endpoint={}:{}", endpoint_host, port),
                                      fmt::format("--rdzv-id={}", id), fmt::format("--nnodes={}", nnodes),
                                      "--nproc-per-node=1"};
        args.insert(args.end(), extra.begin(), extra.end());
        args.push_back(agent_support::worker());
        auto env = agent_support::clean_environment();
        env["AGENT_WORKER_DIR"] = dir.str();
        env["AGENT_WORKER_DO"] = rules;
        env["RDZV_TEST_NODE"] = std::to_string(node);
        env["LOGLEVEL"] = "WARNING";
        agents.push_back(std::make_unique<launched>(args, env));
        return *agents.back();
    }

    launched& operator[](int node) { return *agents.at(static_cast<std::size_t>(node)); }

    /// A client of the rendezvous store, as any program on the network could open one.
    [[nodiscard]] std::unique_ptr<elastic::blocking_store_client> client() const {
        elastic::store_client_options options;
        options.port = static_cast<std::uint16_t>(port);
        options.timeout = std::chrono::seconds(120);  // turns a hang into a failure only
        return std::make_unique<elastic::blocking_store_client>(options);
    }

    /// The store key of `name` in this job's rendezvous.
    [[nodiscard]] std::string key(const std::string& name) const {
        return fmt::format("elastic.rendezvous.{}/{}", id, name);
    }
};

/// Reads the agent's pipes until its stderr holds `text`.
void await_stderr(launched& agent, const std::string& text) {
    const bool seen = agent.read_until([&](const std::string&) { return has(agent.err(), text); });
    INFO("stdout:\n" << agent.out());
    INFO("stderr:\n" << agent.err());
    REQUIRE_MESSAGE(seen, "expected '" << text << "' on stderr");
}

/// The pid of the worker that printed "ready <rank> <attempt> <pid>" on the agent's stdout.
pid_t ready_worker(launched& agent) {
    const bool seen = agent.read_lines("ready ", 1);
    INFO("stdout:\n" << agent.out());
    INFO("stderr:\n" << agent.err());
    REQUIRE(seen);
    std::istringstream in(agent.out().substr(agent.out().find("ready ")));
    std::string word;
    int rank = -1;
    int attempt = -1;
    pid_t pid = -1;
    in >> word >> rank >> attempt >> pid;
    REQUIRE(pid > 0);
    return pid;
}

/// The "world <WORLD_SIZE> <GROUP_WORLD_SIZE> <RANK> <GROUP_RANK> <RESTART_COUNT> ..." lines.
std::vector<std::vector<int>> worlds(const std::string& out) {
    std::vector<std::vector<int>> lines;
    std::istringstream in(out);
    for (std::string text; std::getline(in, text);) {
        if (text.rfind("world ", 0) != 0) continue;
        std::istringstream fields(text.substr(6));
        std::vector<int> w(5, -1);
        for (auto& v : w) fields >> v;
        lines.push_back(w);
    }
    return lines;
}

TEST_CASE("rendezvous trust: the decoders refuse what the rendezvous never writes") {
    using elastic::detail::rdzv::invalid_value;
    namespace rdzv = elastic::detail::rdzv;
    CHECK_THROWS_AS(rdzv::decode_abort("{not json", 2), invalid_value);
    CHECK_THROWS_AS(rdzv::decode_abort("[1,2]", 2), invalid_value);
    CHECK_THROWS_AS(rdzv::decode_abort(R"({"group_rank":5,"host":"h","reason":"r","kind":"failure"})", 2),
                    invalid_value);
    CHECK_THROWS_AS(rdzv::decode_abort(R"({"group_rank":0,"host":"h","reason":"r","kind":"reboot"})", 2),
                    invalid_value);
    CHECK_THROWS_AS(rdzv::decode_abort(R"({"group_rank":"0","host":"h","reason":"r","kind":"failure"})", 2),
                    invalid_value);
    CHECK_THROWS_AS(rdzv::decode_abort(
                        fmt::format(R"({{"group_rank":0,"host":"h","reason":"{}","kind":"failure"}})",
                                    std::string(100'000, 'x')),
                        2),
                    invalid_value);
    CHECK(rdzv::decode_abort(R"({"group_rank":-1,"host":"h","reason":"r","kind":"membership"})", 2).what ==
          elastic::abort_notice::kind::membership);
    CHECK_THROWS_AS(rdzv::decode_decision(R"({"restart":1,"exit_code":0,"reason":""})"), invalid_value);
    CHECK_THROWS_AS(rdzv::decode_decision(R"({"restart":false,"exit_code":300,"reason":""})"), invalid_value);
    CHECK_THROWS_AS(rdzv::decode_decision(R"({"restart":false,"exit_code":18446744073709551615,"reason":""})"),
                    invalid_value);
    CHECK(rdzv::decode_decision(R"({"restart":false,"exit_code":7,"reason":"x"})").exit_code == 7);
    CHECK_THROWS_AS(rdzv::decode_node(R"({"host":"h","addr":"a","port":0,"nproc":1,"pid":1})"), invalid_value);
    CHECK_THROWS_AS(rdzv::decode_node(R"({"host":"h","addr":"a","port":1,"nproc":-3,"pid":1})"), invalid_value);
    CHECK_THROWS_AS(rdzv::decode_round_successors(R"({"host_in":true,"successors":[{"id":"x","addr":"a"}]})"),
                    invalid_value);
    CHECK_THROWS_AS(rdzv::decode_round_successors("garbage"), invalid_value);
    CHECK_THROWS_AS(rdzv::decode_assignment(R"({"size":2,"epoch":0,"restarts":-1,"group_rank":0,"rank_base":0,)"
                                            R"("world_size":2,"master_addr":"a","master_port":1})",
                                            2),
                    invalid_value);
    CHECK_THROWS_AS(rdzv::decode_assignment(R"({"size":2,"epoch":0,"restarts":0,"group_rank":2,"rank_base":0,)"
                                            R"("world_size":2,"master_addr":"a","master_port":1})",
                                            2),
                    invalid_value);
    CHECK_THROWS_AS(rdzv::decode_count("-1", 0, 10), invalid_value);
    CHECK_THROWS_AS(rdzv::decode_count("7x", 0, 10), invalid_value);
    CHECK(rdzv::decode_count("7", 0, 10) == 7);
    // What is shown of a value: printable, truncated.
    CHECK(rdzv::shown(std::string("a\x01") + std::string(500, 'b')).size() < 200);
    CHECK(has(rdzv::shown("a\x01"), "a\\x01"));
}

TEST_CASE("rendezvous trust: the workers' store accepts loopback and the round's members, no one else") {
    elastic::detail::rdzv::peer_list peers;
    CHECK(peers.accepts(asio::ip::make_address("127.0.0.1")));
    CHECK(peers.accepts(asio::ip::make_address("::1")));
    CHECK_FALSE(peers.accepts(asio::ip::make_address("192.0.2.7")));
    for (const auto& a : elastic::detail::rdzv::resolve_all("192.0.2.7")) peers.allowed.push_back(a);
    CHECK(peers.accepts(asio::ip::make_address("192.0.2.7")));
    CHECK(peers.accepts(asio::ip::make_address("::ffff:192.0.2.7")));  // through a dual-stack listener
    CHECK_FALSE(peers.accepts(asio::ip::make_address("192.0.2.8")));
    CHECK_FALSE(peers.accepts(asio::ip::make_address("2001:db8::8")));
}

TEST_CASE("rendezvous trust: an invalid abort, decision and restart count written into a running 2-agent job are "
          "reported and ignored; a real failure still restarts the job") {
    job j("trust-abort", "2");
    // Attempt 0: both workers run until the test kills one; attempt 1: both succeed.
    const std::string rules = "a0:hang;*:world+exit0";
    j.start(rules, {"--max-restarts=1"});
    j.start(rules, {"--max-restarts=1"});
    (void)ready_worker(j[0]);
    const pid_t victim = ready_worker(j[1]);
    const auto abort_key = j.key("0/abort");
    const auto decision_key = j.key("0/decision");
    {
        auto c = j.client();
        // Not JSON: the agents used to stop watching (one then exited 251 with a parse error).
        c->set(abort_key, "{not json\x01");
        c->set(decision_key, R"({"restart":false,"exit_code":0,"reason":5})");
        c->set(j.key("restarts"), "-5");
    }
    for (int node = 0; node < 2; ++node) {
        CAPTURE(node);
        await_stderr(j[node], fmt::format("key '{}' holds '{{not json\\x01' (not JSON)", abort_key));
    }
    // The job goes on watching: a real failure still aborts the round and restarts the job.
    REQUIRE(::kill(victim, SIGKILL) == 0);
    for (int node = 0; node < 2; ++node) {
        CAPTURE(node);
        const int code = j[node].wait();
        INFO("stdout:\n" << j[node].out());
        INFO("stderr:\n" << j[node].err());
        CHECK(code == 0);
        const auto lines = worlds(j[node].out());
        REQUIRE(lines.size() == 1);
        CHECK(lines[0][0] == 2);
        CHECK(lines[0][4] == 1);  // TORCHELASTIC_RESTART_COUNT: the job-wide count, repaired
        CHECK(has(j[node].err(), "restarting every node's worker group (job-wide restart 1)"));
        // Reported by the node that decided (it took the next slot) and by the one that followed.
        CHECK(has(j[node].err(),
                  fmt::format("key '{}' holds '{{\"restart\":false,\"exit_code\":0,\"reason\":5}}'", decision_key)));
        CHECK_FALSE(has(j[node].err(), "parse_error"));
    }
    // The node that decided found the restart count invalid and wrote its own before adding 1.
    CHECK(has(j[1].err(), fmt::format("key '{}' holds '-5'", j.key("restarts"))));
}

TEST_CASE("rendezvous trust: a forged arrival (it names no lease and another MASTER_ADDR) is left out of "
          "the round") {
    job j("trust-arrival", "2:3");
    // Attempt 1: every worker also uses the workers' store ("store"), which accepts them.
    const std::string rules = "a0:hang;*:env+store+world+exit0";
    const std::vector<std::string> extra{"--max-restarts=1", "--rdzv-conf=last_call_timeout=0.2"};
    j.start(rules, extra);
    j.start(rules, extra);
    (void)ready_worker(j[0]);
    const pid_t victim = ready_worker(j[1]);
    {
        // Round 1 forms after the restart: a client arrives first, as a node of its own.
        auto c = j.client();
        REQUIRE(c->add(j.key("1/count"), 1) == 1);
        c->set(j.key("1/info/1"), R"({"host":"evil","addr":"10.9.9.9","port":4242,"nproc":1,"pid":4242})");
    }
    REQUIRE(::kill(victim, SIGKILL) == 0);
    bool reported = false;
    for (int node = 0; node < 2; ++node) {
        CAPTURE(node);
        const int code = j[node].wait();
        INFO("stdout:\n" << j[node].out());
        INFO("stderr:\n" << j[node].err());
        CHECK(code == 0);
        const auto lines = worlds(j[node].out());
        REQUIRE(lines.size() == 1);
        CHECK(lines[0][0] == 2);  // the forged node was no member
        CHECK(lines[0][4] == 1);
        reported = reported || has(j[node].err(), fmt::format("key '{}' holds '{{\"host\":\"evil\"", j.key("1/info/1")));
    }
    CHECK(reported);  // by the node that completed the round
    // The workers were never sent to the forged MASTER_ADDR.
    for (int rank = 0; rank < 2; ++rank) {
        const auto env = agent_support::read_env_file(j.dir.path() / fmt::format("env.1.{}", rank));
        REQUIRE(env.count("MASTER_ADDR") == 1);
        CHECK(env.at("MASTER_ADDR") == "127.0.0.1");
    }
}

TEST_CASE("rendezvous trust: a standby that reads garbage successors reports them, waits, and exits 0 when the job "
          "ends") {
    job j("trust-successors", "1:2");
    const std::vector<std::string> extra{"--rdzv-conf=last_call_timeout=5"};
    j.start("*:world+hang", extra);
    j.start("*:world+hang", extra);
    // Both run in one full round (world 2), whichever round that is.
    for (int node = 0; node < 2; ++node) {
        const bool seen = j[node].read_until([](const std::string& out) { return has(out, "world 2 "); });
        INFO("stderr:\n" << j[node].err());
        REQUIRE(seen);
    }
    const auto pid = ready_worker(j[1]);
    std::string successors_key;
    {
        auto c = j.client();
        successors_key = j.key(c->get(j.key("round")) + "/successors");
        c->set(successors_key, "[\"not\", {\"the\": \"successors\"}]");
    }
    auto& standby = j.start("*:world+hang", extra);
    await_stderr(standby, "this node waits as a standby");
    CHECK(has(standby.err(), fmt::format("key '{}' holds '[\"not\"", successors_key)));
    CHECK(has(standby.err(), "this node knows no successor of the store's host"));
    // The job ends (a worker fails, no restart left): the standby exits 0.
    REQUIRE(::kill(pid, SIGKILL) == 0);
    const int code = standby.wait();
    INFO("stderr:\n" << standby.err());
    CHECK(code == 0);
    CHECK(has(standby.err(), "the job ended while this node waited as a standby"));
    CHECK(worlds(standby.out()).empty());
    for (int node = 0; node < 2; ++node) CHECK(j[node].wait() != 0);
}

TEST_CASE("rendezvous trust: the rendezvous store's key count stays flat over 50 restarts of a 2-agent job") {
    job j("trust-gc", "2");
    // Attempts 0..49 fail at once (a restart each, no backoff); attempt 50 runs until stopped.
    const std::string rules = "a50:hang;*:exit1";
    j.start(rules, {"--max-restarts=50"});
    j.start(rules, {"--max-restarts=50"});
    for (int node = 0; node < 2; ++node) {
        CAPTURE(node);
        const pid_t pid = ready_worker(j[node]);
        CHECK(pid > 0);
        CHECK(has(j[node].out(), "ready 0 50 ") != has(j[node].out(), "ready 1 50 "));
    }
    std::int64_t keys = 0;
    {
        auto c = j.client();
        keys = c->num_keys();
        // Round 50 runs: round 48's keys and older are gone.
        CHECK_FALSE(c->check({j.key("47/count")}));
        CHECK_FALSE(c->check({j.key("0/abort")}));
        CHECK(c->check({j.key("48/count"), j.key("49/decision"), j.key("50/assign/2")}));
    }
    // The bound does not depend on the number of restarts: about a dozen job-wide keys (the
    // torchrun guard, keep_alive, registered, round, restarts, collected, two leases and their
    // epoch) and 14 per kept round of 2 nodes (count, 2 infos, 2 assignments, 2 members,
    // successors, hosts, size, manifest, abort, decision) for 3 rounds. Without collection the
    // 51 rounds leave about 700.
    MESSAGE("keys in the rendezvous store after 50 restarts: " << keys);
    CHECK(keys <= 60);
    for (int node = 0; node < 2; ++node) j[node].signal(SIGTERM);
    for (int node = 0; node < 2; ++node) CHECK(j[node].wait() != 0);
}

/// The local addresses ("127.0.0.1", "0.0.0.0", "::", ...) of the TCP sockets `pid` listens on:
/// the LISTEN rows of /proc/net/tcp and tcp6 whose inode is one of its descriptors.
std::vector<std::string> listening(pid_t pid) {
    std::set<std::string> inodes;
    const auto fd_dir = std::filesystem::path("/proc") / std::to_string(pid) / "fd";
    for (const auto& entry : std::filesystem::directory_iterator(fd_dir)) {
        std::error_code ec;
        const auto target = std::filesystem::read_symlink(entry.path(), ec).string();
        if (!ec && target.rfind("socket:[", 0) == 0) inodes.insert(target.substr(8, target.size() - 9));
    }
    std::vector<std::string> out;
    for (const bool six : {false, true}) {
        std::ifstream table(six ? "/proc/net/tcp6" : "/proc/net/tcp");
        std::string line;
        std::getline(table, line);  // the header
        while (std::getline(table, line)) {
            std::istringstream fields(line);
            std::string slot, local, remote, state, queues, timer, retransmits, uid, timeout, inode;
            fields >> slot >> local >> remote >> state >> queues >> timer >> retransmits >> uid >> timeout >> inode;
            if (state != "0A" || inodes.count(inode) == 0) continue;
            const auto hex = local.substr(0, local.find(':'));
            // The address as the kernel holds it: 32-bit words in this host's byte order.
            unsigned char bytes[16] = {};
            for (std::size_t w = 0; w < hex.size() / 8; ++w) {
                const auto word = static_cast<std::uint32_t>(std::stoul(hex.substr(w * 8, 8), nullptr, 16));
                std::memcpy(bytes + 4 * w, &word, 4);
            }
            char text[INET6_ADDRSTRLEN] = {};
            REQUIRE(::inet_ntop(six ? AF_INET6 : AF_INET, bytes, text, sizeof text) != nullptr);
            out.emplace_back(text);
        }
    }
    return out;
}

/// The addresses `name` resolves to on this machine.
std::set<std::string> resolved(const std::string& name) {
    std::set<std::string> out;
    for (const auto& a : elastic::detail::rdzv::resolve_all(name)) out.insert(a.to_string());
    return out;
}

TEST_CASE("rendezvous trust: a host name endpoint binds the address the name resolves to here, never 0.0.0.0") {
    // This host's name: not a loopback name, so it used to bind every interface for the
    // rendezvous store, the workers' stores and the spare stores.
    const auto name = elastic::detail::rdzv::gethostname_string();
    REQUIRE_FALSE(name.empty());
    REQUIRE_FALSE(elastic::detail::rdzv::is_loopback(name));
    const auto chosen = elastic::detail::rdzv::owned_address(name);
    INFO("host name " << name << " resolves here to " << chosen);
    REQUIRE_FALSE(chosen.empty());
    CHECK(resolved(name).count(chosen) == 1);
    job j("trust-bind", "2:3");
    j.endpoint_host = name;
    const std::vector<std::string> extra{"--rdzv-conf=last_call_timeout=0.2"};
    j.start("*:hang", extra);
    j.start("*:hang", extra);
    std::vector<std::string> all;
    for (int node = 0; node < 2; ++node) {
        CAPTURE(node);
        (void)ready_worker(j[node]);
        const auto bound = listening(j[node].pid());
        CAPTURE(bound.size());
        for (const auto& address : bound) {
            CAPTURE(address);
            CHECK(address == chosen);
        }
        all.insert(all.end(), bound.begin(), bound.end());
    }
    // The rendezvous store, group rank 0's workers' store and the other agent's spare store.
    CHECK(all.size() >= 3);
    for (int node = 0; node < 2; ++node) j[node].signal(SIGTERM);
    for (int node = 0; node < 2; ++node) CHECK(j[node].wait() != 0);
}

}  // namespace test_rendezvous_trust
