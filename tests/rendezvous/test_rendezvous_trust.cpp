// What the rendezvous trusts: invalid control values written into a running job's
// store by another client are reported and ignored, the rendezvous store's keys do not grow
// over restarts, a host name endpoint binds that name's address, never 0.0.0.0, and an
// endpoint where PyTorch's TCPStore listens is refused at once.
#include "agent_support.hpp"
#include "client_support.hpp"

#include <elastic/usage_error.hpp>
#include <elastic/launch/values.hpp>
#include <elastic/rendezvous/codec.hpp>
#include <elastic/rendezvous/moved_record.hpp>
#include <elastic/rendezvous/planner.hpp>
#include <elastic/rendezvous/store_rendezvous.hpp>
#include <elastic/rendezvous/tcp_rendezvous.hpp>
#include <elastic/store/blocking_client.hpp>
#include <elastic/store/client.hpp>
#include <elastic/store/lease.hpp>
#include <elastic/store/memory_store.hpp>
#include <elastic/store/server.hpp>

#include <asio/experimental/as_tuple.hpp>
#include <asio/co_spawn.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <doctest/doctest.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <utility>
#include <map>
#include <memory>
#include <optional>
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
        env["XDG_RUNTIME_DIR"] = dir.str();  // the job's own status files and moved-store record
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

/// A store server on loopback (`tune` adjusts its options) and `n` clients of it (`c`), on one
/// io_context: the in-process cases' real store.
struct loopback_store {
    explicit loopback_store(int n, const std::function<void(elastic::store_server_options&)>& tune = {})
        : server(ctx.get_executor(), server_options(tune)) {
        server.start();
        for (int i = 0; i < n; ++i) c.push_back(client());
    }
    static elastic::store_server_options server_options(
        const std::function<void(elastic::store_server_options&)>& tune) {
        elastic::store_server_options so;
        so.host = "127.0.0.1";
        so.log = [](std::string_view) {};
        if (tune) tune(so);
        return so;
    }
    [[nodiscard]] std::unique_ptr<elastic::tcp_store_client> client() { return client_of(ctx, server.port()); }
    /// A client of the server at `port` (another one of the test's, on the same context).
    [[nodiscard]] static std::unique_ptr<elastic::tcp_store_client> client_of(asio::io_context& ctx,
                                                                              std::uint16_t port) {
        return std::make_unique<elastic::tcp_store_client>(ctx.get_executor(), client_options(port));
    }
    /// The options of those clients.
    [[nodiscard]] static elastic::store_client_options client_options(std::uint16_t port) {
        elastic::store_client_options o;
        o.port = port;
        o.dialect = elastic::client_dialect::current;
        o.timeout = std::chrono::seconds(120);  // turns a hang into a failure only
        return o;
    }
    asio::io_context ctx;
    elastic::tcp_store_server server;
    std::vector<std::unique_ptr<elastic::tcp_store_client>> c;
};

/// An elastic job's options (--nnodes=1:`nnodes`, a 4 s join timeout, a last call of 0.5 s)
/// whose lines go to `said`.
elastic::store_rendezvous_options split_options(std::string run_id, int nnodes, std::vector<std::string>& said) {
    elastic::store_rendezvous_options o;
    o.run_id = std::move(run_id);
    o.nnodes = nnodes;
    o.min_nodes = 1;
    o.hosts_store = true;
    o.join_timeout = std::chrono::seconds(4);
    o.last_call_timeout = std::chrono::milliseconds(500);
    o.log = [&said](std::string_view line) { said.emplace_back(line); };
    return o;
}

/// This process as a node named "me" (a store port nobody dials; tcp_rendezvous names its lease).
elastic::node_info this_process() {
    elastic::node_info me;
    me.host = "me";
    me.store_addr = "127.0.0.1";
    me.store_port = 1;
    me.pid = static_cast<long>(::getpid());
    return me;
}

/// An elastic c10d job (--nnodes=1:2) of run `run_id` at 127.0.0.1:`port`, as its store's host
/// sees it (is_host=true), with a 100 ms last call.
elastic::rendezvous_parameters elastic_job(const std::string& run_id, std::uint16_t port) {
    elastic::rendezvous_parameters parameters;
    parameters.backend = elastic::rendezvous_backend::c10d;
    parameters.endpoint = elastic::host_port{"127.0.0.1", port};
    parameters.run_id = run_id;
    parameters.nnodes = elastic::node_range{1, 2};
    parameters.settings.is_host = true;
    parameters.settings.last_call_timeout = std::chrono::milliseconds(100);
    return parameters;
}

/// Node y's leave (a membership abort) from group rank `group_rank`, reason "node y leaves".
elastic::abort_notice y_leaves(int group_rank) {
    elastic::abort_notice leaving;
    leaving.what = elastic::abort_notice::kind::membership;
    leaving.group_rank = group_rank;
    leaving.host = "y";
    leaving.reason = "node y leaves";
    return leaving;
}

/// A node whose host and lease name are `id` (pid 1, a store port nobody dials).
elastic::node_info lease_node(const std::string& id) {
    elastic::node_info n;
    n.host = id;
    n.store_addr = "127.0.0.1";
    n.store_port = 1;
    n.pid = 1;
    n.id = id;
    return n;
}

TEST_CASE("rendezvous trust: the decoders refuse what the rendezvous never writes") {
    using elastic::detail::rendezvous::invalid_value;
    namespace rdzv = elastic::detail::rendezvous;
    CHECK_THROWS_AS(rdzv::decode_abort("{not json", 2), invalid_value);
    CHECK_THROWS_AS(rdzv::decode_abort("[1,2]", 2), invalid_value);
    CHECK_THROWS_AS(rdzv::decode_abort(R"({"group_rank":5,"host":"h","reason":"r","kind":"failure"})", 2),
                    invalid_value);
    CHECK_THROWS_AS(rdzv::decode_abort(R"({"group_rank":0,"host":"h","reason":"r","kind":"reboot"})", 2),
                    invalid_value);
    CHECK_THROWS_AS(rdzv::decode_abort(R"({"group_rank":"0","host":"h","reason":"r","kind":"failure"})", 2),
                    invalid_value);
    CHECK_THROWS_AS(rdzv::decode_abort(fmt::format(R"({{"group_rank":0,"host":"h","reason":"{}","kind":"failure"}})",
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
    // A regroup is a restart; the reporter's lease name is a string of at most max_id bytes.
    CHECK_THROWS_AS(rdzv::decode_decision(R"({"restart":false,"exit_code":0,"reason":"","regroup":true})"),
                    invalid_value);
    CHECK(rdzv::decode_decision(R"({"restart":true,"exit_code":0,"reason":"","regroup":true})").regroup);
    CHECK_THROWS_AS(rdzv::decode_abort(R"({"group_rank":0,"host":"h","reason":"r","kind":"failure","node":7})", 2),
                    invalid_value);
    CHECK_THROWS_AS(rdzv::decode_abort(R"({"group_rank":0,"host":"h","reason":"r","kind":"failure","node":""})", 2),
                    invalid_value);
    // The server's own names are no lease: "__epoch" always exists, and would pass for one held.
    CHECK_THROWS_AS(rdzv::decode_abort(R"({"group_rank":0,"host":"h","reason":"r","kind":"failure","node":"__epoch"})",
                                       2),
                    invalid_value);
    CHECK_THROWS_AS(rdzv::decode_node(R"({"host":"h","addr":"a","port":1,"nproc":1,"pid":1,"id":"__lost/1"})"),
                    invalid_value);
    {
        elastic::abort_notice a{0, "h", "r"};
        a.node = "h:12:t";
        CHECK(rdzv::decode_abort(rdzv::encode(a), 2).node == "h:12:t");
        elastic::job_decision d{true, 0, "r"};
        d.regroup = true;
        CHECK(rdzv::decode_decision(rdzv::encode(d)).regroup);
    }
    CHECK_THROWS_AS(rdzv::decode_node(R"({"host":"h","addr":"a","port":0,"nproc":1,"pid":1})"), invalid_value);
    CHECK_THROWS_AS(rdzv::decode_node(R"({"host":"h","addr":"a","port":1,"nproc":-3,"pid":1})"), invalid_value);
    // Interface addresses: literals only, at most max_addrs.
    CHECK_THROWS_AS(rdzv::decode_node(R"({"host":"h","addr":"a","port":1,"nproc":1,"pid":1,"addrs":["h.example"]})"),
                    invalid_value);
    CHECK_THROWS_AS(rdzv::decode_node(R"({"host":"h","addr":"a","port":1,"nproc":1,"pid":1,"addrs":"10.0.0.1"})"),
                    invalid_value);
    CHECK_THROWS_AS(rdzv::decode_node(R"({"host":"h","addr":"a","port":1,"nproc":1,"pid":1,"addrs":[7]})"),
                    invalid_value);
    {
        nlohmann::json many = nlohmann::json::array();
        for (std::size_t i = 0; i <= rdzv::max_addrs; ++i) many.push_back(fmt::format("10.0.{}.{}", i / 256, i % 256));
        nlohmann::json j{{"host", "h"}, {"addr", "a"}, {"port", 1}, {"nproc", 1}, {"pid", 1}, {"addrs", many}};
        CHECK_THROWS_AS(rdzv::decode_node(j.dump()), invalid_value);
    }
    {
        elastic::node_info n;
        n.host = "h";
        n.store_addr = "a";
        n.store_port = 1;
        n.pid = 1;
        n.addrs = {"10.0.0.1", "2001:db8::1"};
        CHECK(rdzv::decode_node(rdzv::encode(n)).addrs == n.addrs);
    }
    {
        // A role travels when it is not the default; an empty one is refused.
        elastic::node_info n;
        n.host = "h";
        n.store_addr = "a";
        n.store_port = 1;
        n.pid = 1;
        CHECK(rdzv::encode(n).find("role") == std::string::npos);
        CHECK(rdzv::decode_node(rdzv::encode(n)).role == "default");
        n.role = "reader";
        CHECK(rdzv::decode_node(rdzv::encode(n)).role == "reader");
        CHECK_THROWS_AS(rdzv::decode_node(R"({"host":"h","addr":"a","port":1,"nproc":1,"pid":1,"role":""})"),
                        invalid_value);
        CHECK_THROWS_AS(rdzv::decode_node(R"({"host":"h","addr":"a","port":1,"nproc":1,"pid":1,"role":7})"),
                        invalid_value);
    }
    {
        // Role ranks: within the world; absent (an older completer), the global ones.
        const std::string base = R"({"size":2,"epoch":0,"restarts":0,"group_rank":1,"rank_base":2,)"
                                 R"("world_size":4,"master_addr":"a","master_port":1)";
        const auto old = rdzv::decode_assignment(base + "}", 2);
        REQUIRE(old);
        CHECK(old->role_rank_base == 2);
        CHECK(old->role_world_size == 4);
        const auto roles = rdzv::decode_assignment(base + R"(,"role_rank_base":0,"role_world_size":2})", 2);
        REQUIRE(roles);
        CHECK(roles->role_rank_base == 0);
        CHECK(roles->role_world_size == 2);
        CHECK_THROWS_AS(rdzv::decode_assignment(base + R"(,"role_rank_base":0,"role_world_size":5})", 2),
                        invalid_value);
        CHECK_THROWS_AS(rdzv::decode_assignment(base + R"(,"role_rank_base":2,"role_world_size":2})", 2),
                        invalid_value);
        CHECK(rdzv::decode_assignment(rdzv::encode(*roles), 2)->role_world_size == 2);
    }
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
    // A retry may name the last round's size whose majority the next rounds need (1..nnodes).
    CHECK(rdzv::decode_retry_majority(rdzv::encode_retry(), 4) == 0);
    CHECK(rdzv::decode_retry_majority(rdzv::encode_retry(3), 4) == 3);
    CHECK_FALSE(rdzv::decode_assignment(rdzv::encode_retry(3), 4));
    CHECK(rdzv::decode_retry_majority(R"({"size":2})", 4) == 0);  // no retry: nothing needed
    CHECK_THROWS_AS(rdzv::decode_retry_majority(R"({"retry":true,"majority_of":5})", 4), invalid_value);
    CHECK_THROWS_AS(rdzv::decode_retry_majority(R"({"retry":true,"majority_of":0})", 4), invalid_value);
    CHECK_THROWS_AS(rdzv::decode_retry_majority(R"({"retry":true,"majority_of":"3"})", 4), invalid_value);
    CHECK_THROWS_AS(rdzv::decode_retry_majority("garbage", 4), invalid_value);
    // A manifest records the silent losses at its completion, or nothing (-1).
    CHECK(rdzv::decode_manifest(rdzv::encode(rdzv::round_manifest{2, 2, {"a", "b"}, 5}), 4).silent == 5);
    CHECK(rdzv::decode_manifest(rdzv::encode(rdzv::round_manifest{2, 2, {"a", "b"}}), 4).silent == -1);
    CHECK_THROWS_AS(rdzv::decode_manifest(R"({"k":1,"n":1,"ids":["a"],"silent":-2})", 4), invalid_value);
    // ... and its number, whose members the majority rule counts (-1: not recorded).
    CHECK(rdzv::decode_manifest(rdzv::encode(rdzv::round_manifest{2, 2, {"a", "b"}, 5, 7}), 4).round == 7);
    CHECK(rdzv::decode_manifest(rdzv::encode(rdzv::round_manifest{2, 2, {"a", "b"}, 5}), 4).round == -1);
    CHECK_THROWS_AS(rdzv::decode_manifest(R"({"k":1,"n":1,"ids":["a"],"silent":0,"round":-1})", 4), invalid_value);
    // ... the members' lease names by rank, and the round before as the split-brain rule needs it.
    {
        rdzv::round_manifest m{2, 2, {"a", "b"}, 5, 7};
        m.by_rank = {"b", "a"};
        m.prior = rdzv::round_manifest::prior_round{6, 3, {2}, {{0, 1}, {1, 0}}};
        const auto back = rdzv::decode_manifest(rdzv::encode(m), 4);
        CHECK(back.by_rank == m.by_rank);
        REQUIRE(back.prior);
        CHECK(back.prior->round == 6);
        CHECK(back.prior->size == 3);
        CHECK(back.prior->absent == std::vector<int>{2});
        CHECK(back.prior->from == m.prior->from);
        CHECK_FALSE(rdzv::decode_manifest(rdzv::encode(rdzv::round_manifest{2, 2, {"a", "b"}, 5, 7}), 4).prior);
    }
    const auto manifest = [](std::string_view extra) {
        return fmt::format(R"({{"k":2,"n":2,"ids":["a","b"],"silent":0,"round":1,{}}})", extra);
    };
    CHECK(rdzv::decode_manifest(manifest(R"("by_rank":["a","b"])"), 4).by_rank.size() == 2);
    CHECK_THROWS_AS(rdzv::decode_manifest(manifest(R"("by_rank":["a"])"), 4), invalid_value);  // one per member
    CHECK_THROWS_AS(rdzv::decode_manifest(manifest(R"("by_rank":["a",2])"), 4), invalid_value);
    CHECK_THROWS_AS(rdzv::decode_manifest(manifest(R"("prior":[])"), 4), invalid_value);
    CHECK_THROWS_AS(rdzv::decode_manifest(manifest(R"("prior":{"round":0,"size":5,"absent":[],"from":[]})"), 4),
                    invalid_value);  // larger than MAX
    CHECK_THROWS_AS(rdzv::decode_manifest(manifest(R"("prior":{"round":0,"size":2,"absent":[2],"from":[]})"), 4),
                    invalid_value);  // a rank outside it
    CHECK_THROWS_AS(rdzv::decode_manifest(manifest(R"("prior":{"round":0,"size":2,"absent":[],"from":[[2,0]]})"), 4),
                    invalid_value);  // a rank outside this round
    CHECK_THROWS_AS(rdzv::decode_manifest(manifest(R"("prior":{"round":0,"size":2,"absent":[],"from":[[0]]})"), 4),
                    invalid_value);
    CHECK_THROWS_AS(rdzv::decode_manifest(manifest(R"("prior":{"round":0,"size":2,"from":[]})"), 4), invalid_value);
    // The store's host that stays after it finished: "<round> <group rank>".
    CHECK(rdzv::decode_staying("7 1", 2) == std::pair{7, 1});
    CHECK_THROWS_AS(rdzv::decode_staying("7 2", 2), invalid_value);
    CHECK_THROWS_AS(rdzv::decode_staying("7", 2), invalid_value);
    CHECK_THROWS_AS(rdzv::decode_staying("x 1", 2), invalid_value);
    CHECK_THROWS_AS(rdzv::decode_manifest(manifest(R"("prior":{"round":1,"size":2,"absent":[],"from":[]})"), 4),
                    invalid_value);  // no round before this one (1)
    // A retry may name the round before the last, refused for its unacknowledged members.
    CHECK(rdzv::decode_retry_prior(rdzv::encode_retry(5, 3), 5) == 3);
    CHECK(rdzv::decode_retry_majority(rdzv::encode_retry(5, 3), 5) == 5);
    CHECK(rdzv::decode_retry_prior(rdzv::encode_retry(5), 5) == 0);
    CHECK_THROWS_AS(rdzv::decode_retry_prior(R"({"retry":true,"prior_of":9})", 5), invalid_value);
    // Where a moved job came from: a round and its size (1..nnodes).
    const auto from = rdzv::decode_moved_from(rdzv::encode(rdzv::moved_from{6, 3}), 4);
    CHECK(from.round == 6);
    CHECK(from.size == 3);
    CHECK_THROWS_AS(rdzv::decode_moved_from(R"({"round":6,"size":5})", 4), invalid_value);
    CHECK_THROWS_AS(rdzv::decode_moved_from(R"({"round":6,"size":0})", 4), invalid_value);
    CHECK_THROWS_AS(rdzv::decode_moved_from(R"({"round":-1,"size":2})", 4), invalid_value);
    CHECK_THROWS_AS(rdzv::decode_moved_from(R"({"size":2})", 4), invalid_value);
    CHECK_THROWS_AS(rdzv::decode_moved_from("[6,3]", 4), invalid_value);
    // The round before the movers' one: before it, of 1..nnodes nodes.
    const auto before = rdzv::decode_moved_from(rdzv::encode(rdzv::moved_from{6, 3, rdzv::earlier_round{5, 2}}), 4);
    REQUIRE(before.before);
    CHECK(before.before->round == 5);
    CHECK(before.before->size == 2);
    CHECK_FALSE(from.before);
    CHECK_THROWS_AS(rdzv::decode_moved_from(R"({"round":6,"size":3,"before":[6,2]})", 4), invalid_value);
    CHECK_THROWS_AS(rdzv::decode_moved_from(R"({"round":6,"size":3,"before":[5,5]})", 4), invalid_value);
    CHECK_THROWS_AS(rdzv::decode_moved_from(R"({"round":6,"size":3,"before":[5]})", 4), invalid_value);
    CHECK_THROWS_AS(rdzv::decode_moved_from(R"({"round":6,"size":3,"before":{"round":5}})", 4), invalid_value);
    // An assignment names the round formed before its own the same way; a node its rank there.
    elastic::rendezvous_round assigned;
    assigned.group_world_size = 2;
    assigned.world_size = 2;
    assigned.master_addr = "127.0.0.1";
    assigned.master_port = 1;
    const auto named = rdzv::decode_assignment_before(rdzv::encode(assigned, rdzv::earlier_round{3, 2}), 4, 4);
    REQUIRE(named);
    CHECK(named->round == 3);
    CHECK(named->size == 2);
    CHECK_FALSE(rdzv::decode_assignment_before(rdzv::encode(assigned), 4, 4));
    CHECK_THROWS_AS(rdzv::decode_assignment_before(rdzv::encode(assigned, rdzv::earlier_round{4, 2}), 4, 4),
                    invalid_value);
    elastic::node_info mover = lease_node("m");
    mover.member_of = 4;
    mover.previous_rank = 1;
    mover.earlier_of = 3;
    mover.earlier_rank = 0;
    const auto said_mover = rdzv::decode_node(rdzv::encode(mover));
    CHECK(said_mover.earlier_of == 3);
    CHECK(said_mover.earlier_rank == 0);
    CHECK_THROWS_AS(rdzv::decode_node(R"({"host":"m","addr":"a","port":1,"nproc":1,"pid":1,"earlier":[3,0]})"),
                    invalid_value);  // no member_of
    CHECK_THROWS_AS(
        rdzv::decode_node(R"({"host":"m","addr":"a","port":1,"nproc":1,"pid":1,"member_of":3,"earlier":[3,0]})"),
        invalid_value);  // not before it
    CHECK_THROWS_AS(
        rdzv::decode_node(R"({"host":"m","addr":"a","port":1,"nproc":1,"pid":1,"member_of":4,"earlier":[3,-1]})"),
        invalid_value);
    // An arrival's member_of is a round number; and it round-trips.
    CHECK_THROWS_AS(rdzv::decode_node(R"({"host":"h","addr":"a","port":1,"nproc":1,"pid":1,"member_of":-1})"),
                    invalid_value);
    CHECK_THROWS_AS(rdzv::decode_node(R"({"host":"h","addr":"a","port":1,"nproc":1,"pid":1,"member_of":"2"})"),
                    invalid_value);
    {
        elastic::node_info n = lease_node("m");
        n.previous_rank = 1;
        n.member_of = 4;
        const auto back = rdzv::decode_node(rdzv::encode(n));
        CHECK(back.member_of == std::optional<int>(4));
        CHECK(back.previous_rank == std::optional<int>(1));
    }
    CHECK(rdzv::decode_count("7", 0, 10) == 7);
    // What is shown of a value: printable, truncated.
    CHECK(rdzv::shown(std::string("a\x01") + std::string(500, 'b')).size() < 200);
    CHECK(has(rdzv::shown("a\x01"), "a\\x01"));
}

TEST_CASE("rendezvous trust: the workers' store accepts loopback and the round's members, no one else") {
    elastic::detail::rendezvous::peer_list peers;
    CHECK(peers.accepts(asio::ip::make_address("127.0.0.1")));
    CHECK(peers.accepts(asio::ip::make_address("::1")));
    CHECK_FALSE(peers.accepts(asio::ip::make_address("192.0.2.7")));
    for (const auto& a : elastic::detail::rendezvous::resolve_all("192.0.2.7")) peers.allowed.push_back(a);
    CHECK(peers.accepts(asio::ip::make_address("192.0.2.7")));
    CHECK(peers.accepts(asio::ip::make_address("::ffff:192.0.2.7")));  // through a dual-stack listener
    CHECK_FALSE(peers.accepts(asio::ip::make_address("192.0.2.8")));
    CHECK_FALSE(peers.accepts(asio::ip::make_address("2001:db8::8")));
}

TEST_CASE("rendezvous trust: group rank 0's allow-list is the members' published literals, each once, names only "
          "for a member that published none") {
    namespace rdzv = elastic::detail::rendezvous;
    elastic::node_info multi;  // two NICs; its name resolves to neither of them
    multi.host = "multi.invalid";
    multi.store_addr = "multi.invalid";
    multi.addrs = {"192.0.2.1", "198.51.100.1", "2001:db8::1"};
    elastic::node_info twin;  // advertises a literal it also publishes, and one more
    twin.host = "twin.invalid";
    twin.store_addr = "192.0.2.9";
    twin.addrs = {"192.0.2.1", "203.0.113.5"};
    elastic::node_info old;  // published nothing
    old.host = "old.invalid";
    old.store_addr = "old.invalid";
    const auto peers = rdzv::peers_of({multi, twin, old});
    CHECK(peers == std::vector<std::string>{"192.0.2.1", "198.51.100.1", "2001:db8::1", "203.0.113.5", "192.0.2.9",
                                            "old.invalid"});
    // The list is added to once per address however often it is given.
    rdzv::peer_list list;
    list.allow(asio::ip::make_address("192.0.2.1"));
    list.allow(asio::ip::make_address("::ffff:192.0.2.1"));
    CHECK(list.allowed.size() == 1);
    CHECK(list.accepts(asio::ip::make_address("192.0.2.1")));

    // What this node publishes: literals, no loopback, no link-local IPv6, each once.
    const auto mine = rdzv::interface_addresses();
    CHECK(mine.size() <= rdzv::max_addrs);
    for (const auto& a : mine) {
        INFO(a);
        const auto address = asio::ip::make_address(a);
        CHECK_FALSE(address.is_loopback());
        CHECK_FALSE((address.is_v6() && address.to_v6().is_link_local()));
        CHECK(std::count(mine.begin(), mine.end(), a) == 1);
    }
}

TEST_CASE("rendezvous trust: --rdzv-conf workers_store_peers is members (the default) or any") {
    using elastic::rendezvous_backend;
    CHECK_FALSE(elastic::parse_rendezvous_settings("", "--rdzv-conf", rendezvous_backend::c10d).workers_store_any_peer);
    CHECK(elastic::parse_rendezvous_settings("workers_store_peers=any", "--rdzv-conf", rendezvous_backend::c10d)
              .workers_store_any_peer);
    CHECK_FALSE(elastic::parse_rendezvous_settings("workers_store_peers=members", "--rdzv-conf",
                                                   rendezvous_backend::c10d)
                    .workers_store_any_peer);
    CHECK_THROWS_WITH_AS((void)elastic::parse_rendezvous_settings("workers_store_peers=all", "--rdzv-conf",
                                                                  rendezvous_backend::c10d),
                         doctest::Contains("workers_store_peers must be members"), elastic::usage_error);
    CHECK_THROWS_AS((void)elastic::parse_rendezvous_settings("workers_store_peers=any", "--rdzv-conf",
                                                             rendezvous_backend::static_),
                    elastic::usage_error);
}

TEST_CASE("rendezvous trust: an invalid abort, decision and restart count written into a running 2-agent job are "
          "reported and ignored, and a real failure still restarts the job") {
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

TEST_CASE("rendezvous trust: a failure notice that names no lease is ignored, one whose reporter holds no lease "
          "is taken over, and the job re-forms instead of waiting for ever for its decision") {
    job j("trust-decider", "2");
    // Every attempt's workers wait for the test's word: the takeover's restart is a membership
    // restart, so the attempt stays 0.
    const std::string rules = "*:world+go";
    j.start(rules);
    j.start(rules);
    for (int node = 0; node < 2; ++node) REQUIRE(j[node].read_lines("world ", 1));
    const auto abort_key = j.key("0/abort");
    const auto ghost_key = j.key("0/abort/1");
    {
        auto c = j.client();
        // Written by no agent: every agent's notice names its lease.
        c->set(abort_key, R"({"group_rank":1,"host":"x","reason":"forged","kind":"failure"})");
        for (int node = 0; node < 2; ++node) {
            CAPTURE(node);
            await_stderr(j[node], fmt::format("key '{}' holds", abort_key));
        }
        // A reporter whose lease is gone (or never was): nobody would ever decide the round.
        c->set(ghost_key, R"({"group_rank":1,"host":"x","reason":"ghost","kind":"failure","node":"x:1:ghost"})");
    }
    for (int node = 0; node < 2; ++node) {
        CAPTURE(node);
        INFO("stdout:\n" << j[node].out());
        INFO("stderr:\n" << j[node].err());
        REQUIRE(j[node].read_lines("world ", 2));
    }
    std::ofstream(j.dir.path() / "go") << "go\n";
    for (int node = 0; node < 2; ++node) {
        CAPTURE(node);
        const int code = j[node].wait();
        INFO("stdout:\n" << j[node].out());
        INFO("stderr:\n" << j[node].err());
        CHECK(code == 0);
        const auto lines = worlds(j[node].out());
        REQUIRE(lines.size() == 2);
        for (const auto& w : lines) {
            CHECK(w[0] == 2);
            CHECK(w[4] == 0);  // a regroup spends no restart
        }
        const auto& err = j[node].err();
        CHECK(has(err, "(it names no lease (every agent holds one)); it does not abort the round"));
        CHECK(has(err, "the reporting node, x (pid 1), was lost before it decided; the others took the decision "
                       "over and re-form without it"));
        CHECK(has(err, "a membership restart: TORCHELASTIC_RESTART_COUNT stays 0"));
    }
}

/// Two agents, --nnodes=2:3, one restart allowed: attempt 0 hangs until a worker is killed, then
/// round 1 forms, into which `forge` (a client of the store, as any program could open) writes
/// first. Checks that both agents end 0 in one world of 2 (whatever the client wrote was no
/// member) at attempt 1, and returns whether either agent's stderr holds `reported`.
bool round_one_forged(job& j, const std::string& rules,
                      const std::function<void(elastic::blocking_store_client&)>& forge, const std::string& reported) {
    const std::vector<std::string> extra{"--max-restarts=1", "--rdzv-conf=last_call_timeout=0.2"};
    j.start(rules, extra);
    j.start(rules, extra);
    (void)ready_worker(j[0]);
    const pid_t victim = ready_worker(j[1]);
    forge(*j.client());
    REQUIRE(::kill(victim, SIGKILL) == 0);
    bool seen = false;
    for (int node = 0; node < 2; ++node) {
        CAPTURE(node);
        const int code = j[node].wait();
        INFO("stdout:\n" << j[node].out());
        INFO("stderr:\n" << j[node].err());
        CHECK(code == 0);
        const auto lines = worlds(j[node].out());
        REQUIRE(lines.size() == 1);
        CHECK(lines[0][0] == 2);
        CHECK(lines[0][4] == 1);
        seen = seen || has(j[node].err(), reported);
    }
    return seen;
}

TEST_CASE("rendezvous trust: a forged arrival (it names no lease and another MASTER_ADDR) is left out of "
          "the round") {
    job j("trust-arrival", "2:3");
    // Attempt 1: every worker also uses the workers' store ("store"), which accepts them. In
    // round 1, a client arrives first, as a node of its own.
    const bool reported = round_one_forged(
        j, "a0:hang;*:env+store+world+exit0",
        [&](elastic::blocking_store_client& c) {
            REQUIRE(c.add(j.key("1/count"), 1) == 1);
            c.set(j.key("1/info/1"), R"({"host":"evil","addr":"10.9.9.9","port":4242,"nproc":1,"pid":4242})");
        },
        fmt::format("key '{}' holds '{{\"host\":\"evil\"", j.key("1/info/1")));
    CHECK(reported);  // by the node that completed the round
    // The workers were never sent to the forged MASTER_ADDR.
    for (int rank = 0; rank < 2; ++rank) {
        const auto env = agent_support::read_env_file(j.dir.path() / fmt::format("env.1.{}", rank));
        REQUIRE(env.count("MASTER_ADDR") == 1);
        CHECK(env.at("MASTER_ADDR") == "127.0.0.1");
    }
}

TEST_CASE("rendezvous trust: an arrival that counts itself but never writes its info does not hold the round: it "
          "is left out after a grace") {
    job j("trust-hole", "2:3");
    // In round 1 a client takes the first arrival and writes nothing. The agents are arrivals 2
    // and 3. Either the first of them, finding as many arrivals as live nodes, seals the round
    // with the hole and itself (one node, below MIN: every arrival retries, and the other
    // agent, late, is admitted to the next round), or the second completes it at MAX, without
    // the hole. Both read the hole's info, which would hold the round for good.
    const bool reported = round_one_forged(
        j, "a0:hang;*:world+exit0",
        [&](elastic::blocking_store_client& c) { REQUIRE(c.add(j.key("1/count"), 1) == 1); },
        "round 1 of run 'trust-hole': arrival 1 counted itself but wrote no node info within 1000 ms");
    CHECK(reported);  // by the node that completed the round
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
    // torchrun guard, keep_alive, registered, round, last_round, restarts, collected, two leases
    // and their epoch and silent-loss count) and about 16 per kept round of 2 nodes (count, 2
    // infos, 2 assignments, 2 members, successors, hosts, size, manifest, abort, decision, the
    // completer's claim, the restart's token) for 3 rounds: 53 here. Without collection the 51
    // rounds leave about 700.
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
    for (const auto& a : elastic::detail::rendezvous::resolve_all(name)) out.insert(a.to_string());
    return out;
}

TEST_CASE("rendezvous trust: a host name endpoint binds the address the name resolves to here, never 0.0.0.0") {
    // This host's name: not a loopback name, so it used to bind every interface for the
    // rendezvous store, the workers' stores and the spare stores.
    const auto name = elastic::host_name();
    REQUIRE_FALSE(name.empty());
    REQUIRE_FALSE(elastic::detail::rendezvous::is_loopback(name));
    const auto chosen = elastic::detail::rendezvous::owned_address(name);
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

TEST_CASE("rendezvous trust: an observer behind the store's kept loss records counts the erased ones and still "
          "sees a member's loss") {
    // The server keeps 4 records; 10 losses of leases no member holds, then member b's loss,
    // all before member a's observer reads any: records 1..7 are gone when it starts.
    loopback_store net(7, [](elastic::store_server_options& so) { so.lease_lost_records_kept = 4; });
    auto& ctx = net.ctx;
    auto& server = net.server;
    auto& c = net.c;
    auto client = [&] { return net.client(); };
    auto& observer = *c[6];
    std::vector<std::string> warnings;
    elastic::store_rendezvous_options o;
    o.run_id = "pruned";
    o.nnodes = 2;
    o.warn = [&](std::string_view line) { warnings.emplace_back(line); };
    elastic::store_rendezvous<elastic::tcp_store_client> a(*c[0], *c[1], o);
    elastic::store_rendezvous<elastic::tcp_store_client> b(*c[2], *c[3], o);
    const auto node = lease_node;
    std::string reason;
    bool finished = false;
    asio::co_spawn(
        ctx,
        [&]() -> asio::awaitable<void> {
            using namespace asio::experimental::awaitable_operators;
            co_await a.start_liveness(*c[4], node("a"));
            co_await b.start_liveness(*c[5], node("b"));
            (void)co_await (a.next_round(node("a")) && b.next_round(node("b")));
            const auto group = a.lease_group();
            for (int i = 1; i <= 10; ++i) {
                auto junk = client();
                co_await junk->hold_lease(elastic::lease_key(group, fmt::format("junk{}", i)), "x");
                junk->close();
                std::vector<std::string> lost{elastic::lease_lost_key(group, i)};
                co_await observer.wait(std::move(lost), std::chrono::seconds(120));
            }
            c[5]->close();  // b's lease connection ends: b is lost
            std::vector<std::string> lost{elastic::lease_lost_key(group, 11)};
            co_await observer.wait(std::move(lost), std::chrono::seconds(120));
            CHECK(co_await observer.get(elastic::lease_lost_key(group, 11)) == "b");
            std::vector<std::string> first{elastic::lease_lost_key(group, 7)};
            CHECK_FALSE(co_await observer.check(std::move(first)));
            // a's observer starts at the loss count it read when it took its lease (0).
            auto which = co_await (a.keep_membership() || a.wait_for_abort());
            REQUIRE(which.index() == 1);
            reason = std::get<1>(which).reason;
            for (auto& each : c) each->close();
            server.stop();
            finished = true;
        },
        [](std::exception_ptr e) {
            if (e) std::rethrow_exception(e);
        });
    ctx.run_for(std::chrono::minutes(2));  // turns a hang into a failure only
    REQUIRE(finished);
    CHECK(has(reason, "node b was lost"));
    REQUIRE(warnings.size() == 1);
    CHECK(has(warnings[0], "missed 7 lease losses of run 'pruned'"));
    CHECK(has(warnings[0], "__lost/1 to "));
    CHECK(has(warnings[0], "__lost/7)"));
}

TEST_CASE("rendezvous trust: a full round whose completer was lost before it completed is voided, and the live "
          "node forms the next one instead of waiting for the join timeout") {
    // --nnodes=1:2: a and a second node arrive in round 0, which is full; the second is its
    // completer and dies before it completes the round: before its info is written, after it,
    // or after it also claimed the round.
    for (const int got_to : {0, 1, 2}) {
        CAPTURE(got_to);
        loopback_store net(5);
        auto& ctx = net.ctx;
        auto& server = net.server;
        auto& c = net.c;
        std::vector<std::string> said;
        elastic::store_rendezvous_options o;
        o.run_id = "orphan";
        o.nnodes = 2;
        o.min_nodes = 1;
        o.hosts_store = true;
        o.join_timeout = std::chrono::minutes(10);
        o.last_call_timeout = std::chrono::minutes(10);  // only the void completes a round in time
        o.log = [&](std::string_view line) { said.emplace_back(line); };
        elastic::store_rendezvous<elastic::tcp_store_client> a(*c[0], *c[1], o);
        const auto node = lease_node;
        std::optional<elastic::rendezvous_round> round;
        asio::co_spawn(
            ctx,
            [&]() -> asio::awaitable<void> {
                using namespace asio::experimental::awaitable_operators;
                co_await a.start_liveness(*c[2], node("a"));
                // The second node: its lease, its registration, and then its arrival (the MAX-th).
                auto& ghost = *c[3];
                auto& ghost_lease = *c[4];
                co_await ghost_lease.hold_lease(elastic::lease_key(a.lease_group(), "ghost"), "x");
                (void)co_await ghost.add(a.job_key("registered"), 1);
                auto arrive = [&]() -> asio::awaitable<void> {
                    std::vector<std::string> first{a.key(0, "info/1")};
                    co_await ghost.wait(std::move(first), std::chrono::seconds(120));
                    CHECK(co_await ghost.add(a.key(0, "count"), 1) == 2);
                    if (got_to >= 1)
                        co_await ghost.set(a.key(0, "info/2"), elastic::detail::rendezvous::encode(node("ghost")));
                    if (got_to >= 2) CHECK(co_await ghost.compare_set(a.key(0, "completer"), "", "ghost") == "ghost");
                    ghost_lease.close();  // it dies before it completes the round
                    co_await asio::steady_timer(co_await asio::this_coro::executor, std::chrono::hours(1))
                        .async_wait(asio::use_awaitable);
                };
                auto which = co_await (a.keep_membership() || a.next_round(node("a")) || arrive());
                REQUIRE(which.index() == 1);
                round = std::get<1>(std::move(which));
                for (auto& each : c) each->close();
                server.stop();
            },
            [](std::exception_ptr e) {
                if (e) std::rethrow_exception(e);
            });
        ctx.run_for(std::chrono::minutes(2));  // turns a hang into a failure only
        REQUIRE(round);
        CHECK(round->number == 1);
        CHECK(round->group_world_size == 1);
        CHECK(round->group_rank == 0);
        const auto line = std::find_if(said.begin(), said.end(), [](const std::string& l) {
            return has(l, "round 0 of run 'orphan' was full, but its completer");
        });
        REQUIRE(line != said.end());
        CHECK(has(*line, "was lost before it completed the round; the round is void and the live nodes form the "
                         "next one"));
        CHECK(has(*line, got_to >= 2 ? "its completer (ghost)" : "its completer (its last arrival)"));
    }
}

TEST_CASE("rendezvous trust: a regroup written while the node that decides still holds its lease is ignored by "
          "every node, and its real decision is followed") {
    loopback_store net(7);
    auto& ctx = net.ctx;
    auto& server = net.server;
    auto& c = net.c;
    std::vector<std::string> warnings;
    elastic::store_rendezvous_options o;
    o.run_id = "forged-regroup";
    o.nnodes = 2;
    o.warn = [&](std::string_view line) { warnings.emplace_back(line); };
    elastic::store_rendezvous<elastic::tcp_store_client> a(*c[0], *c[1], o);
    elastic::store_rendezvous<elastic::tcp_store_client> b(*c[2], *c[3], o);
    const auto node = lease_node;
    std::optional<elastic::job_decision> followed;
    std::optional<elastic::job_decision> standing;
    asio::co_spawn(
        ctx,
        [&]() -> asio::awaitable<void> {
            using namespace asio::experimental::awaitable_operators;
            co_await a.start_liveness(*c[4], node("a"));
            co_await b.start_liveness(*c[5], node("b"));
            (void)co_await (a.next_round(node("a")) && b.next_round(node("b")));
            elastic::abort_notice notice{1, "b", "local_rank 0 exited with 3"};
            REQUIRE(co_await b.abort(notice));
            elastic::job_decision forged{true, 0, "forged"};
            forged.regroup = true;
            co_await c[6]->set(a.key(0, "decision"), elastic::detail::rendezvous::encode(forged));
            const elastic::job_decision stop{false, 3, "no restart left"};
            auto follow = [&]() -> asio::awaitable<void> {
                (void)co_await a.wait_for_abort();
                followed = co_await a.await_decision();
            };
            auto decide = [&]() -> asio::awaitable<void> { standing = co_await b.decide(stop); };
            co_await (follow() && decide());
            for (auto& each : c) each->close();
            server.stop();
        },
        [](std::exception_ptr e) {
            if (e) std::rethrow_exception(e);
        });
    ctx.run_for(std::chrono::minutes(2));  // turns a hang into a failure only
    REQUIRE(followed);
    REQUIRE(standing);
    CHECK_FALSE(followed->restart);
    CHECK(followed->exit_code == 3);
    CHECK_FALSE(standing->regroup);
    CHECK(standing->exit_code == 3);
    const auto said = [&](const std::string& part) {
        return std::any_of(warnings.begin(), warnings.end(), [&](const std::string& w) { return has(w, part); });
    };
    CHECK(said("(a regroup, but the node that reported the failure still holds its lease)"));
    CHECK(said("(a regroup, but this node, which decides, still holds its lease)"));
}

TEST_CASE("rendezvous trust: once the lease connection ended, the rendezvous ends its waits with store_lost_error") {
    loopback_store net(3);
    auto& ctx = net.ctx;
    auto& server = net.server;
    auto& c = net.c;
    elastic::store_rendezvous_options o;
    o.run_id = "lost";
    o.nnodes = 1;
    elastic::store_rendezvous<elastic::tcp_store_client> a(*c[0], *c[1], o);
    const auto me = lease_node("a");
    bool confirmed = false;
    std::optional<elastic::store_lost_error> lost;
    asio::co_spawn(
        ctx,
        [&]() -> asio::awaitable<void> {
            using namespace asio::experimental::awaitable_operators;
            co_await a.start_liveness(*c[2], me);
            (void)co_await a.next_round(me);
            co_await (a.keep_membership() || [&]() -> asio::awaitable<void> {
                server.stop();  // as when the store's host dies: every connection ends
                confirmed = co_await a.confirm_store_lost(std::chrono::minutes(2));
                try {
                    (void)co_await a.wait_for_abort();
                } catch (const elastic::store_lost_error& e) {
                    lost = e;
                }
            }());
            for (auto& each : c) each->close();
        },
        [](std::exception_ptr e) {
            if (e) std::rethrow_exception(e);
        });
    ctx.run_for(std::chrono::minutes(3));  // turns a hang into a failure only
    REQUIRE(confirmed);
    REQUIRE(lost);
    CHECK(a.store_lost() == lost->reason());
    CHECK(std::string(lost->what()) == "lost the rendezvous store: " + lost->reason());
    CHECK_FALSE(lost->reason().empty());
}

/// A TCP store client that can hold its read of a round's first abort slot: the watcher's read
/// between its check of the key and its get, where a cut of the network holds a real one.
class abort_read_held_client : public elastic::tcp_store_client {
public:
    abort_read_held_client(const asio::any_io_executor& ex, const elastic::store_client_options& o)
        : elastic::tcp_store_client(ex, o), entered_(ex, std::chrono::minutes(1)) {}
    asio::awaitable<std::string> get(std::string k) {
        if (hold && k.ends_with("/abort")) {
            held_ = true;
            entered_.cancel();
            // Cancelled when the read is given up; a minute at most, so that a regression fails
            // the test's checks and never hangs it.
            asio::steady_timer gate(co_await asio::this_coro::executor, std::chrono::minutes(1));
            co_await gate.async_wait(asio::use_awaitable);
        }
        co_return co_await elastic::tcp_store_client::get(std::move(k));
    }
    /// Completes once a read is held.
    asio::awaitable<void> await_held() {
        if (!held_) co_await entered_.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
    }
    bool hold = false;

private:
    asio::steady_timer entered_;
    bool held_ = false;
};

TEST_CASE("rendezvous trust: the store lost while the abort watcher reads a slot it saw written ends the watch "
          "with store_lost_error") {
    // The watcher's read of a written abort slot does not answer (as when the network is cut
    // between its check and its get) and the lease connection then ends: the watch ends with
    // the store's loss, not after the read's timeout.
    loopback_store net(0);
    auto& ctx = net.ctx;
    const auto co = loopback_store::client_options(net.server.port());
    abort_read_held_client store(ctx.get_executor(), co);
    abort_read_held_client watcher(ctx.get_executor(), co);
    abort_read_held_client lease(ctx.get_executor(), co);
    elastic::store_rendezvous_options o;
    o.run_id = "held";
    o.nnodes = 1;
    elastic::store_rendezvous<abort_read_held_client> a(store, watcher, o);
    const auto me = lease_node("a");
    bool won = false;
    bool held = false;
    std::optional<elastic::store_lost_error> lost;
    asio::co_spawn(
        ctx,
        [&]() -> asio::awaitable<void> {
            using namespace asio::experimental::awaitable_operators;
            co_await a.start_liveness(lease, me);
            const auto round = co_await a.next_round(me);
            // (named, not braced temporaries: g++ 12 miscompiles those inside co_await)
            const elastic::abort_notice failed{round.group_rank, "a", "local_rank 0 exited with 1"};
            won = co_await a.abort(failed);
            watcher.hold = true;
            auto watch = [&]() -> asio::awaitable<void> {
                try {
                    (void)co_await a.wait_for_abort();
                } catch (const elastic::store_lost_error& e) {
                    lost = e;
                }
            };
            auto cut = [&]() -> asio::awaitable<void> {
                co_await watcher.await_held();
                held = true;
                net.server.stop();  // every connection ends, the lease's too
                asio::steady_timer after(co_await asio::this_coro::executor, std::chrono::hours(1));
                co_await after.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
            };
            co_await (a.keep_membership() || (watch() || cut()));
            store.close();
            watcher.close();
            lease.close();
        },
        [](std::exception_ptr e) {
            if (e) std::rethrow_exception(e);
        });
    ctx.run_for(std::chrono::minutes(3));  // turns a hang into a failure only
    CHECK(won);
    CHECK(held);
    REQUIRE(lost);
    CHECK(a.store_lost() == lost->reason());
    CHECK_FALSE(lost->reason().empty());
}

TEST_CASE("rendezvous trust: a rejoin that meets a store refusing the secret ends the agent with the secret's "
          "error, it does not move the job") {
    // The agent joined the store of secret "one"; another store, of secret "two", now serves
    // that port (the first one went away).
    asio::io_context ctx;
    elastic::store_server_options so;
    so.host = "127.0.0.1";
    so.secret = "one";
    so.log = [](std::string_view) {};
    auto first = std::make_unique<elastic::tcp_store_server>(ctx.get_executor(), so);
    first->start();
    const auto port = first->port();
    elastic::rendezvous_parameters parameters;
    parameters.backend = elastic::rendezvous_backend::c10d;
    parameters.endpoint = elastic::host_port{"127.0.0.1", port};
    parameters.run_id = "refused";
    parameters.nnodes = elastic::node_range{1, 2};
    parameters.settings.is_host = false;
    parameters.settings.secret = "one";
    elastic::tcp_rendezvous agent(ctx.get_executor(), parameters, [](std::string_view) {});
    auto me = this_process();
    std::string error;
    bool rejoined = false;
    asio::co_spawn(
        ctx,
        [&]() -> asio::awaitable<void> {
            co_await agent.start();
            co_await agent.start_liveness(me);
            first->stop();
            first.reset();
            so.port = port;
            so.secret = "two";
            elastic::tcp_store_server second(ctx.get_executor(), so);
            second.start();
            try {
                rejoined = (co_await agent.rejoin_store(me)).empty();
            } catch (const elastic::rendezvous_error& e) {
                error = e.what();
            }
            agent.stop();
            second.stop();
        },
        [](std::exception_ptr e) {
            if (e) std::rethrow_exception(e);
        });
    ctx.run_for(std::chrono::minutes(2));  // turns a hang into a failure only
    CHECK_FALSE(rejoined);
    CHECK(has(error,
              fmt::format("the rendezvous store at 127.0.0.1:{} and this node do not share the job's secret", port)));
    CHECK(has(error, "give every agent the same secret"));
}

TEST_CASE("rendezvous trust: a node whose store's address another store took since does not reconnect there: the "
          "job's store is lost, and the node moves it") {
    // A store's host was lost, and a store started since (another agent's) listens at its
    // address and port. A node of an elastic job that finds it there when its lease connection
    // ended is not to rejoin: that store holds none of the job's rounds, and a round formed
    // there would be a second job beside the one that moved on. The node takes the job's store
    // for lost and moves it to the last round's successors, under their majority rule. A fixed
    // job's agent, of the same run id, hosts the new store: it holds the job's keep-alive key,
    // like any agent's store. The lost store is either the first one, or one the job moved to
    // and lost before a round formed there: the round before's successors still name its
    // address first, and the node must not move into the new store there either.
    bool moved_first = false;
    SUBCASE("the first store's host is lost") {}
    SUBCASE("the moved store's host is lost before a round formed there") { moved_first = true; }
    CAPTURE(moved_first);
    asio::io_context ctx;
    const auto port = static_cast<std::uint16_t>(free_port());
    auto parameters = elastic_job("taken", port);                    // the store's host joins no round here
    if (moved_first) parameters.nnodes = elastic::node_range{2, 3};  // both members form round 0
    elastic::tcp_rendezvous host(ctx.get_executor(), parameters, [](std::string_view) {});
    auto fixed = parameters;
    fixed.nnodes = elastic::node_range{2, 2};
    std::optional<elastic::tcp_rendezvous> other;
    parameters.settings.is_host = false;
    elastic::tcp_rendezvous x(ctx.get_executor(), parameters, [](std::string_view) {});
    elastic::tcp_rendezvous y(ctx.get_executor(), parameters, [](std::string_view) {});
    auto me = this_process();
    std::string said;
    std::string error;
    std::uint16_t idle_port = 0;  // the last node's idle store
    bool moved_here = false;
    std::string endpoint;
    asio::co_spawn(
        ctx,
        [&]() -> asio::awaitable<void> {
            using namespace asio::experimental::awaitable_operators;
            co_await host.start();
            co_await x.join(me);
            auto* last = &x;  // the node that finds another store at its store's address
            auto* first = &y;
            if (!moved_first) {
                (void)co_await x.next_round(me);  // round 0, of x alone (MIN 1)
            } else {
                co_await y.join(me);
                (void)co_await (x.next_round(me) && y.next_round(me));
                // The round's first successor takes the store when the host is lost.
                if (x.rendezvous().successors().at(0).port == x.backup_port()) std::swap(first, last);
            }
            idle_port = last->backup_port();
            auto steps = [&]() -> asio::awaitable<void> {
                host.stop();  // the store's host is lost: every connection to it ends
                auto lost_port = port;
                if (moved_first) {
                    lost_port = first->backup_port();
                    (void)co_await (x.recover("the lease connection ended", me) &&
                                    y.recover("the lease connection ended", me));
                    first->stop();  // the moved store's host is lost too, before a round formed there
                }
                fixed.endpoint = elastic::host_port{"127.0.0.1", lost_port};
                other.emplace(ctx.get_executor(), fixed, [](std::string_view) {});
                co_await other->start();
                try {
                    said = co_await last->recover("the lease connection ended", me);
                } catch (const elastic::rendezvous_error& e) {
                    error = e.what();
                }
                endpoint = fmt::format("127.0.0.1:{}", lost_port);  // where the other store listens
            };
            // (A node that never joined keeps no membership: its keep_membership() ends at once.)
            if (moved_first) co_await (x.keep_membership() || y.keep_membership() || steps());
            else co_await (x.keep_membership() || steps());
            moved_here = last->hosts_store();
            CHECK(last->store_endpoint() != endpoint);
            endpoint = last->store_endpoint();
            x.stop();
            y.stop();
            other->stop();
        },
        [](std::exception_ptr e) {
            if (e) std::rethrow_exception(e);
        });
    ctx.run_for(std::chrono::minutes(2));  // turns a hang into a failure only
    INFO("said: " << said);
    INFO("error: " << error);
    REQUIRE(error.empty());
    REQUIRE(idle_port != 0);
    CHECK_FALSE(has(said, "reconnected"));
    CHECK(has(said, "now is another store than the job's"));
    CHECK(has(said, fmt::format("the job's rendezvous moves to 127.0.0.1:{} (this node)", idle_port)));
    CHECK(moved_here);
    CHECK(endpoint == fmt::format("127.0.0.1:{}", idle_port));
}

TEST_CASE("rendezvous trust: a node moving the job's store passes over a successor whose address another store "
          "took since, and moves the store to the next successor") {
    // Round 0's members x and y both keep an idle store, and its successors name both. The first
    // successor's agent ended (its idle store with it), and another store listens at its address
    // since: a fixed job's store of the same run id, which names no owner, or another agent's
    // idle store, which names its own. When the store's host is lost, the other member does not
    // move the job into that store (rounds formed there would not be the job's): it passes it
    // over, says why, and moves the job to the next successor, its own idle store. At a
    // --rdzv-endpoint list's entry, though, where newcomers look for the job, another agent's
    // idle store of the job (one restarted on that machine) is where the job goes.
    enum class stranger { nameless, named, listed } there = stranger::nameless;
    SUBCASE("a store that names no owner") {}
    SUBCASE("a store that names another owner") { there = stranger::named; }
    SUBCASE("another agent's idle store at a --rdzv-endpoint list's entry: the job moves there") {
        there = stranger::listed;
    }
    const auto kind = static_cast<int>(there);
    CAPTURE(kind);
    asio::io_context ctx;
    const auto port = static_cast<std::uint16_t>(free_port());
    auto parameters = elastic_job("owner", port);  // the store's host joins no round here
    parameters.nnodes = elastic::node_range{2, 3};
    if (there == stranger::listed) {
        // The first member to start listens there; the list's entries lead the successors.
        parameters.successor_endpoints = {elastic::host_port{"127.0.0.1", static_cast<std::uint16_t>(free_port())}};
    }
    elastic::tcp_rendezvous host(ctx.get_executor(), parameters, [](std::string_view) {});
    auto fixed = parameters;
    fixed.nnodes = elastic::node_range{2, 2};
    std::optional<elastic::tcp_rendezvous> other;
    parameters.settings.is_host = false;
    elastic::tcp_rendezvous x(ctx.get_executor(), parameters, [](std::string_view) {});
    elastic::tcp_rendezvous y(ctx.get_executor(), parameters, [](std::string_view) {});
    elastic::tcp_rendezvous restarted(ctx.get_executor(), parameters, [](std::string_view) {});
    auto me = this_process();
    std::string said;
    std::string error;
    std::string gone;  // the first successor's lease name
    std::uint16_t taken_port = 0;
    std::uint16_t idle_port = 0;
    bool moved_here = false;
    asio::co_spawn(
        ctx,
        [&]() -> asio::awaitable<void> {
            using namespace asio::experimental::awaitable_operators;
            co_await host.start();
            co_await x.join(me);
            co_await y.join(me);
            (void)co_await (x.next_round(me) && y.next_round(me));
            auto* first = &x;  // the first successor, gone
            auto* last = &y;
            if (x.rendezvous().successors().at(0).port == y.backup_port()) std::swap(first, last);
            gone = first->node_id();
            taken_port = first->backup_port();
            idle_port = last->backup_port();
            auto steps = [&]() -> asio::awaitable<void> {
                first->stop();  // its agent ends, and its idle store with it
                if (there == stranger::listed) {
                    co_await restarted.join(me);  // its idle store takes the list's entry
                } else {
                    fixed.endpoint = elastic::host_port{"127.0.0.1", taken_port};
                    other.emplace(ctx.get_executor(), fixed, [](std::string_view) {});
                    co_await other->start();
                }
                if (there == stranger::named) {
                    elastic::store_client_options o;
                    o.host = "127.0.0.1";
                    o.port = taken_port;
                    elastic::tcp_store_client stranger(ctx.get_executor(), o);
                    co_await stranger.connect();
                    co_await stranger.set(elastic::store_rendezvous<elastic::tcp_store_client>::job_key("owner",
                                                                                                        "owner"),
                                          "elsewhere:1:0001");
                    stranger.close();
                }
                host.stop();  // the store's host is lost: every connection to it ends
                try {
                    said = co_await last->recover("the lease connection ended", me);
                } catch (const elastic::rendezvous_error& e) {
                    error = e.what();
                }
            };
            co_await (x.keep_membership() || y.keep_membership() || steps());
            moved_here = last->hosts_store();
            x.stop();
            y.stop();
            restarted.stop();
            if (other) other->stop();
        },
        [](std::exception_ptr e) {
            if (e) std::rethrow_exception(e);
        });
    ctx.run_for(std::chrono::minutes(2));  // turns a hang into a failure only
    INFO("said: " << said);
    INFO("error: " << error);
    REQUIRE(error.empty());
    REQUIRE(idle_port != 0);
    REQUIRE(taken_port != 0);
    if (there == stranger::listed) {
        REQUIRE(parameters.successor_endpoints.at(0).port == taken_port);
        CHECK(restarted.backup_port() == taken_port);
        CHECK(has(said, fmt::format("the job's rendezvous moves to 127.0.0.1:{}, the first member's idle store that "
                                    "answered;",
                                    taken_port)));
        CHECK_FALSE(moved_here);
    } else {
        CHECK(has(said, fmt::format("the job's rendezvous moves to 127.0.0.1:{} (this node)", idle_port)));
        CHECK(has(said, fmt::format("passing over 127.0.0.1:{} (what answers there is not the idle store of {} "
                                    "(another store took its address since))",
                                    taken_port, gone)));
        CHECK(moved_here);
    }
}

TEST_CASE("rendezvous trust: a --rdzv-endpoint list's store is joined only when it holds the job's registrations and "
          "a round, a marked one is awaited, never before a live first endpoint, and one refusing the secret ends "
          "the start") {
    // The listed store (a member's idle one, on 127.0.0.2) and, in some cases, the first
    // endpoint's store hold what the case seeds.
    asio::io_context ctx;
    const auto seeded = [](elastic::tcp_store_server& server, const std::string& run, const std::string& name) {
        server.engine().set(elastic::store_client_options{}.key_prefix +
                                elastic::store_rendezvous<elastic::tcp_store_client>::job_key(run, name),
                            std::string("1"));
    };
    const auto server_options = [](const std::string& host, const std::optional<std::string>& secret) {
        elastic::store_server_options so;
        so.host = host;
        so.secret = secret;
        so.log = [](std::string_view) {};
        return so;
    };
    std::optional<std::string> listed_secret;
    std::string run = "listed";
    bool seed_registered = true;
    bool seed_round = false;
    bool seed_mark = false;
    std::string mark_names = "127.0.0.1";  // the first endpoint the mark names
    bool first_holds_job = false;
    bool first_silent = false;  // something listens at the first endpoint and never answers
    bool move_later = false;    // the round appears at the listed store while the agent waits
    bool lose_mark = false;     // the listed store's mark goes away while the agent waits
    SUBCASE("registrations without a round, unmarked: passed over once the movers' time is out") { run = "unmarked"; }
    SUBCASE("registrations without a round, marked: the members may still be moving; it waits, never hosts, and "
            "ends at the join timeout") {
        run = "stale";
        seed_mark = true;
    }
    SUBCASE("registrations and a round: joined") {
        run = "moved";
        seed_round = true;
    }
    SUBCASE("the first endpoint holds the job too: the first endpoint wins") {
        run = "first";
        seed_round = true;
        first_holds_job = true;
    }
    SUBCASE("only a formed round's member's idle store, the first endpoint lost: it waits for the move, no fresh "
            "store, and ends at the join timeout naming what it saw") {
        run = "marked";
        seed_registered = false;
        seed_mark = true;
    }
    SUBCASE("a marked idle store, then the move completes there: it waits, then joins the moved store") {
        run = "late";
        seed_registered = false;
        seed_mark = true;
        move_later = true;
    }
    SUBCASE("a marked idle store whose mark goes away while it waits: once seen, a mark keeps it from a fresh "
            "store for the whole search") {
        run = "lost";
        seed_registered = false;
        seed_mark = true;
        lose_mark = true;
    }
    SUBCASE("a mark of a job on another first endpoint: not this job's, the agent hosts at once") {
        run = "other";
        seed_registered = false;
        seed_mark = true;
        mark_names = "127.0.0.3";
    }
    SUBCASE("a first endpoint that accepts but never answers, a marked idle store: its host may be stopped, it "
            "waits for the move and ends at the join timeout naming what it saw") {
        run = "silent";
        seed_registered = false;
        seed_mark = true;
        first_silent = true;
    }
    SUBCASE("a first endpoint that accepts but never answers, no mark: the usual start says what is wrong") {
        run = "unanswered";
        seed_registered = false;
        first_silent = true;
    }
    SUBCASE("a store refusing this node's secret: the start ends, naming it") {
        run = "secret";
        listed_secret = "two";
    }
    elastic::tcp_store_server listed(ctx.get_executor(), server_options("127.0.0.2", listed_secret));
    listed.start();
    const auto listed_port = listed.port();
    std::unique_ptr<elastic::tcp_store_server> first;
    asio::ip::tcp::acceptor silent(ctx);
    std::uint16_t first_port = static_cast<std::uint16_t>(free_port());
    if (first_holds_job) {
        first = std::make_unique<elastic::tcp_store_server>(ctx.get_executor(), server_options("127.0.0.1", {}));
        first->start();
        seeded(*first, run, "registered");
        first_port = first->port();
    }
    if (first_silent) {  // listens, never accepts: the kernel completes connections, nothing answers
        const asio::ip::tcp::endpoint at(asio::ip::make_address("127.0.0.1"), 0);
        silent.open(at.protocol());
        silent.bind(at);
        silent.listen();
        first_port = silent.local_endpoint().port();
    }
    if (seed_registered) seeded(listed, run, "registered");
    if (seed_round) seeded(listed, run, "last_round");
    if (seed_mark) seeded(listed, run, fmt::format("formed@{}:{}", mark_names, first_port));
    elastic::rendezvous_parameters parameters;
    parameters.backend = elastic::rendezvous_backend::c10d;
    parameters.endpoint = elastic::host_port{"127.0.0.1", first_port};
    parameters.successor_endpoints = {elastic::host_port{"127.0.0.2", listed_port}};
    parameters.run_id = run;
    parameters.nnodes = elastic::node_range{1, 2};
    parameters.settings.is_host = !first_holds_job && !first_silent;  // would host the first endpoint's store
    parameters.settings.last_call_timeout = std::chrono::milliseconds(200);
    parameters.settings.keep_alive_interval = std::chrono::milliseconds(100);
    parameters.settings.keep_alive_max_attempt = 3;
    parameters.settings.join_timeout = std::chrono::seconds(run == "late" ? 60 : 1);
    parameters.settings.read_timeout = std::chrono::seconds(1);  // the silent first endpoint's bound
    if (listed_secret) parameters.settings.secret = "one";
    std::vector<std::string> log;
    bool waiting = false;  // the agent said it waits for a move
    asio::steady_timer moved(ctx);
    elastic::tcp_rendezvous agent(ctx.get_executor(), parameters, [&](std::string_view line) {
        log.emplace_back(line);
        if (has(log.back(), "this node looks again until the join timeout")) {
            waiting = true;
            moved.cancel();
        }
    });
    std::string error;
    bool started = false;
    if (move_later || lose_mark) {  // once it waits: the members' move completes, or the mark goes
        asio::co_spawn(
            ctx,
            [&]() -> asio::awaitable<void> {
                moved.expires_at(asio::steady_timer::time_point::max());
                (void)co_await moved.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
                if (!waiting) co_return;  // it ended first
                if (lose_mark) {
                    listed.engine().erase(elastic::store_client_options{}.key_prefix +
                                          elastic::store_rendezvous<elastic::tcp_store_client>::job_key(
                                              run, fmt::format("formed@{}:{}", mark_names, first_port)));
                    co_return;
                }
                seeded(listed, run, "registered");
                seeded(listed, run, "last_round");
            },
            [](std::exception_ptr e) {
                if (e) std::rethrow_exception(e);
            });
    }
    asio::co_spawn(
        ctx,
        [&]() -> asio::awaitable<void> {
            try {
                co_await agent.start();
                started = true;
            } catch (const std::exception& e) {  // a rendezvous_error, or the silent store's timeout
                error = e.what();
            }
            moved.cancel();
            agent.stop();
            listed.stop();
            if (first) first->stop();
            if (silent.is_open()) silent.close();
        },
        [](std::exception_ptr e) {
            if (e) std::rethrow_exception(e);
        });
    ctx.run_for(std::chrono::minutes(2));  // turns a hang into a failure only
    std::string said;
    for (const auto& line : log) said += line + "\n";
    INFO(said);
    INFO(error);
    const auto listed_at = fmt::format("127.0.0.2:{}", listed_port);
    const auto first_at = fmt::format("127.0.0.1:{}", first_port);
    if (run == "unmarked" || run == "other") {
        REQUIRE(started);
        CHECK(agent.hosts_store());  // it looked on, found nothing, and hosts as told
        CHECK(agent.store_endpoint() == first_at);
        CHECK_FALSE(waiting);
        if (run == "unmarked") {
            CHECK(has(said, fmt::format("the job's nodes registered at {} from the --rdzv-endpoint list", listed_at)));
            CHECK(has(said, fmt::format("{} holds registrations of the job but no round it formed", listed_at)));
        }
    } else if (run == "moved" || run == "late") {
        REQUIRE(started);
        CHECK_FALSE(agent.hosts_store());  // is_host=true, but the job lives on elsewhere
        CHECK(agent.store_endpoint() == listed_at);
        CHECK(has(said,
                  fmt::format("the job's rendezvous store moved to {} from the --rdzv-endpoint list", listed_at)));
        CHECK(waiting == (run == "late"));
    } else if (run == "lost") {
        CHECK_FALSE(started);
        CHECK_FALSE(agent.hosts_store());
        CHECK(waiting);
        CHECK(has(error,
                  "no listed or recorded store holds the job's registrations and a round (none is marked or silent "
                  "now)"));
        CHECK(has(error, "still after the join timeout (1 s)"));
    } else if (run == "marked" || run == "stale" || run == "silent") {
        CHECK_FALSE(started);
        CHECK_FALSE(agent.hosts_store());
        CHECK(waiting);
        CHECK(has(said, "the members are moving the store"));
        const auto seen = run == "silent" ? "nothing gives a store's answer in time (a host down or stopped)"
                                          : "nothing answers";
        const auto state = run == "stale" ? "registrations without a round" : "a marked idle store";
        CHECK(has(error, fmt::format("the job ran (a member's idle store, listed or in this machine's record, is "
                                     "marked as a formed round's) with its rendezvous store at {}, where {}; no "
                                     "listed or recorded store "
                                     "holds the job's registrations and a round ({}: {})",
                                     first_at, seen, listed_at, state)));
        CHECK(has(error, "still after the join timeout (1 s)"));
        if (run == "stale") {
            CHECK(has(said, fmt::format("{} holds registrations of the job but no round it formed", listed_at)));
        }
    } else if (run == "first") {
        REQUIRE(started);
        CHECK(agent.store_endpoint() == first_at);
        CHECK_FALSE(has(said, "moved to"));
    } else if (run == "unanswered") {
        CHECK_FALSE(started);  // the usual dial: nothing there answers as a store
        CHECK_FALSE(waiting);
        CHECK_FALSE(has(error, "the job ran with"));
        CHECK(has(said, fmt::format("{} from the --rdzv-endpoint list answers but is no store", first_at)));
        CHECK_FALSE(error.empty());
    } else {
        CHECK_FALSE(started);
        CHECK(has(error,
                  fmt::format("the rendezvous store at {} and this node do not share the job's secret", listed_at)));
    }
}

TEST_CASE("rendezvous trust: a store in this machine's record is joined only with this job's mark, and one refusing "
          "the secret is passed over") {
    // The record outlives a job that failed or was killed: its ports may serve another job by now.
    agent_support::temp_dir runtime;
    ::setenv("XDG_RUNTIME_DIR", runtime.str().c_str(), 1);
    struct restore {
        ~restore() { ::unsetenv("XDG_RUNTIME_DIR"); }
    } restore_env;
    asio::io_context ctx;
    std::string run = "recmoved";
    std::optional<std::string> secret;
    bool seed_mark = true;
    SUBCASE("registrations, a round and the mark: the job moved there, joined") {}
    SUBCASE("registrations and a round under the run id, no mark: another job's store, passed over") {
        run = "recother";
        seed_mark = false;
    }
    SUBCASE("a store refusing this node's secret: another job's store by now, passed over") {
        run = "recsecret";
        secret = "two";
    }
    elastic::store_server_options so;
    so.host = "127.0.0.2";
    so.secret = secret;
    so.log = [](std::string_view) {};
    elastic::tcp_store_server recorded(ctx.get_executor(), so);
    recorded.start();
    const auto recorded_port = recorded.port();
    const auto first_port = static_cast<std::uint16_t>(free_port());
    const auto key = [&](const std::string& name) {
        return elastic::store_client_options{}.key_prefix +
               elastic::store_rendezvous<elastic::tcp_store_client>::job_key(run, name);
    };
    const auto mark = elastic::store_rendezvous<elastic::tcp_store_client>::job_key(run,
                                                                                    fmt::format("formed@127.0.0.1:{}",
                                                                                                first_port));
    recorded.engine().set(key("registered"), std::string("1"));
    recorded.engine().set(key("last_round"), std::string("1"));
    if (seed_mark) recorded.engine().set(elastic::store_client_options{}.key_prefix + mark, std::string("0"));
    REQUIRE(elastic::detail::rendezvous::write_moved_record(mark, {{"", "127.0.0.2", recorded_port}}).empty());

    elastic::rendezvous_parameters parameters;
    parameters.backend = elastic::rendezvous_backend::c10d;
    parameters.endpoint = elastic::host_port{"127.0.0.1", first_port};
    parameters.run_id = run;
    parameters.nnodes = elastic::node_range{1, 2};
    parameters.settings.is_host = true;
    parameters.settings.keep_alive_interval = std::chrono::milliseconds(100);
    parameters.settings.keep_alive_max_attempt = 3;
    parameters.settings.join_timeout = std::chrono::seconds(1);
    if (secret) parameters.settings.secret = "one";
    std::vector<std::string> log;
    elastic::tcp_rendezvous agent(ctx.get_executor(), parameters,
                                  [&](std::string_view line) { log.emplace_back(line); });
    std::string error;
    bool started = false;
    asio::co_spawn(
        ctx,
        [&]() -> asio::awaitable<void> {
            try {
                co_await agent.start();
                started = true;
            } catch (const std::exception& e) {
                error = e.what();
            }
            agent.stop();
            recorded.stop();
        },
        [](std::exception_ptr e) {
            if (e) std::rethrow_exception(e);
        });
    ctx.run_for(std::chrono::minutes(2));  // turns a hang into a failure only
    std::string said;
    for (const auto& line : log) said += line + "\n";
    INFO(said);
    INFO(error);
    REQUIRE(started);
    const auto recorded_at = fmt::format("127.0.0.2:{}", recorded_port);
    if (run == "recmoved") {
        CHECK_FALSE(agent.hosts_store());  // is_host=true, but the job lives on there
        CHECK(agent.store_endpoint() == recorded_at);
        CHECK(has(said, fmt::format("the job's rendezvous store moved to {} from this machine's record of the job's "
                                    "successors",
                                    recorded_at)));
    } else {
        CHECK(agent.hosts_store());  // a fresh job: it hosts at the first endpoint, as told
        CHECK(agent.store_endpoint() == fmt::format("127.0.0.1:{}", first_port));
        CHECK(has(said, run == "recother" ? "is not this job's store (another job's, started with the same run id)"
                                          : "refuses this node's secret"));
    }
}

TEST_CASE("rendezvous trust: a member of a formed round marks its idle store with the job and its first endpoint") {
    asio::io_context ctx;
    const auto port = static_cast<std::uint16_t>(free_port());
    auto parameters = elastic_job("mark", port);  // the store's host has no idle store: it joins no round here
    elastic::tcp_rendezvous host(ctx.get_executor(), parameters, [](std::string_view) {});
    parameters.settings.is_host = false;
    elastic::tcp_rendezvous member(ctx.get_executor(), parameters, [](std::string_view) {});
    auto me = this_process();
    const auto key = [&](const std::string& name) {
        return elastic::store_rendezvous<elastic::tcp_store_client>::job_key("mark", name);
    };
    std::uint16_t idle_port = 0;
    std::optional<bool> before;
    std::optional<bool> after;
    std::optional<bool> other;
    asio::co_spawn(
        ctx,
        [&]() -> asio::awaitable<void> {
            co_await host.start();
            co_await member.join(me);
            idle_port = member.backup_port();
            if (idle_port != 0) {
                elastic::store_client_options o;
                o.host = "127.0.0.1";
                o.port = idle_port;
                elastic::tcp_store_client idle(ctx.get_executor(), o);
                co_await idle.connect();
                std::vector<std::string> keys{key(fmt::format("formed@127.0.0.1:{}", port))};
                before = co_await idle.check(keys);
                (void)co_await member.next_round(me);
                after = co_await idle.check(keys);
                std::vector<std::string> elsewhere{key(fmt::format("formed@127.0.0.3:{}", port))};
                other = co_await idle.check(std::move(elsewhere));
                idle.close();
            }
            member.stop();
            host.stop();
        },
        [](std::exception_ptr e) {
            if (e) std::rethrow_exception(e);
        });
    ctx.run_for(std::chrono::minutes(2));  // turns a hang into a failure only
    REQUIRE(idle_port != 0);               // an elastic job's member keeps an idle store
    REQUIRE(before);
    REQUIRE(after);
    REQUIRE(other);
    CHECK_FALSE(*before);  // an idle store is unmarked until its node is in a formed round
    CHECK(*after);
    CHECK_FALSE(*other);  // the mark names this job's first endpoint only
}

TEST_CASE("rendezvous trust: when every member of a running round was dropped with its lease, the nodes that "
          "rejoin abort it by the store's record and form the next round, fixed or elastic") {
    // What a store host stopped past the keep-alive leaves: round 0 runs, every member's lease
    // is gone, and the agents rejoin under new lease names. No member is left to see a loss,
    // so the round is full of nodes nobody runs: before, a fixed job's rejoiners took it for
    // another job's round and exited, and an elastic job's waited beside it as standbys.
    for (const int min_nodes : {2, 1}) {
        CAPTURE(min_nodes);
        loopback_store net(13);
        auto& ctx = net.ctx;
        auto& c = net.c;
        std::vector<std::string> said;
        elastic::store_rendezvous_options o;
        o.run_id = "dropped-all";
        o.nnodes = 2;
        o.min_nodes = min_nodes;
        o.hosts_store = true;
        o.join_timeout = std::chrono::minutes(10);
        o.last_call_timeout = std::chrono::minutes(10);  // rounds complete at MAX = 2 arrivals
        o.log = [&](std::string_view line) { said.emplace_back(line); };
        elastic::store_rendezvous<elastic::tcp_store_client> x1(*c[0], *c[1], o);
        elastic::store_rendezvous<elastic::tcp_store_client> y1(*c[3], *c[4], o);
        elastic::store_rendezvous<elastic::tcp_store_client> x2(*c[6], *c[7], o);
        elastic::store_rendezvous<elastic::tcp_store_client> y2(*c[9], *c[10], o);
        const auto node = lease_node;
        int first = -1;
        std::optional<elastic::rendezvous_round> a;
        std::optional<elastic::rendezvous_round> b;
        std::string aborted;  // round 0's abort notice
        asio::co_spawn(
            ctx,
            [&]() -> asio::awaitable<void> {
                using namespace asio::experimental::awaitable_operators;
                co_await x1.start_liveness(*c[2], node("x1"));
                co_await y1.start_liveness(*c[5], node("y1"));
                auto formed = co_await (x1.keep_membership() || y1.keep_membership() ||
                                        (x1.next_round(node("x1")) && y1.next_round(node("y1"))));
                REQUIRE(formed.index() == 2);
                first = std::get<0>(std::get<2>(formed)).number;
                // Both dropped with their leases; the store records both losses.
                c[2]->close();
                c[5]->close();
                std::vector<std::string> lost{elastic::lease_lost_key(x1.lease_group(), 1),
                                              elastic::lease_lost_key(x1.lease_group(), 2)};
                co_await c[12]->wait(std::move(lost), std::chrono::seconds(120));
                // Both rejoin under new lease names.
                co_await x2.start_liveness(*c[8], node("x2"));
                co_await y2.start_liveness(*c[11], node("y2"));
                auto again = co_await (x2.keep_membership() || y2.keep_membership() ||
                                       (x2.next_round(node("x2")) && y2.next_round(node("y2"))));
                REQUIRE(again.index() == 2);
                a = std::get<0>(std::get<2>(again));
                b = std::get<1>(std::get<2>(again));
                aborted = co_await c[12]->get(x2.key(0, "abort"));
                // The mark of a round every member acknowledged: the abort is in the next slot.
                if (aborted == "acknowledged by all") aborted = co_await c[12]->get(x2.key(0, "abort/1"));
                for (auto& each : c) each->close();
                net.server.stop();
            },
            [](std::exception_ptr e) {
                if (e) std::rethrow_exception(e);
            });
        ctx.run_for(std::chrono::minutes(2));  // turns a hang into a failure only
        std::string log;
        for (const auto& line : said) log += line + "\n";
        INFO(log);
        CHECK(first == 0);
        REQUIRE(a);
        REQUIRE(b);
        CHECK(a->number == 1);
        CHECK(b->number == 1);
        CHECK(a->group_world_size == 2);
        CHECK(a->group_rank != b->group_rank);
        INFO(aborted);
        CHECK(has(aborted, "was lost (its agent's connection to the rendezvous store ended or went silent)"));
        CHECK((has(aborted, "node x1") || has(aborted, "node y1")));
        CHECK_FALSE(has(log, "waits as a standby"));
    }
}

TEST_CASE("rendezvous trust: a value no agent wrote in a round's first abort slot delays neither the mark that "
          "every member acknowledged the round nor the round's abort") {
    // The last member to acknowledge an elastic round marks it in an abort slot, which the
    // members watch; a forged value in the first slot must not keep the mark out (the members
    // would then still go by the round before it if the store's host were lost), nor hide an
    // abort behind the mark.
    loopback_store net(7);
    auto& ctx = net.ctx;
    auto& c = net.c;
    std::vector<std::string> said;
    auto o = split_options("forgedslot", 2, said);  // round 0 completes at MAX = 2 arrivals
    elastic::store_rendezvous<elastic::tcp_store_client> x(*c[0], *c[1], o);
    elastic::store_rendezvous<elastic::tcp_store_client> y(*c[3], *c[4], o);
    std::string mark;  // round 0's second slot
    std::optional<elastic::abort_notice> seen;
    std::string stored;  // round 0's third slot
    bool won = false;
    asio::co_spawn(
        ctx,
        [&]() -> asio::awaitable<void> {
            using namespace asio::experimental::awaitable_operators;
            co_await x.start_liveness(*c[2], lease_node("x"));
            co_await y.start_liveness(*c[5], lease_node("y"));
            co_await c[6]->set(x.key(0, "abort"), "{not json");
            // Both keep their membership for the whole case (a cancelled keep_membership()
            // closes its lease connection).
            auto done = co_await (x.keep_membership() || y.keep_membership() || [&]() -> asio::awaitable<void> {
                auto formed = co_await (x.next_round(lease_node("x")) && y.next_round(lease_node("y")));
                std::vector<std::string> second{x.key(0, "abort/1")};
                if (co_await c[6]->check(std::move(second))) mark = co_await c[6]->get(x.key(0, "abort/1"));
                const auto leaving = y_leaves(std::get<1>(formed).group_rank);
                auto ended = co_await (x.wait_for_abort() && y.abort(leaving));
                seen = std::get<0>(ended);
                won = std::get<1>(ended);
                stored = co_await c[6]->get(x.key(0, "abort/2"));
            }());
            CHECK(done.index() == 2);
            for (auto& each : c) each->close();
            net.server.stop();
        },
        [](std::exception_ptr e) {
            if (e) std::rethrow_exception(e);
        });
    ctx.run_for(std::chrono::minutes(2));  // turns a hang into a failure only
    std::string log;
    for (const auto& line : said) log += line + "\n";
    INFO(log);
    CHECK(mark == "acknowledged by all");
    REQUIRE(seen);
    CHECK(won);
    CHECK(seen->reason == "node y leaves");
    CHECK(seen->what == elastic::abort_notice::kind::membership);
    CHECK(has(stored, "node y leaves"));
    CHECK(has(log, "ignored an invalid value in the rendezvous store"));
}

TEST_CASE("rendezvous trust: a finished store host staying for the others judges an abort's group rank by its "
          "round's size: a forged one past it does not end the stay, a member's abort does") {
    // Round 0 forms of 2 nodes under MAX 3. x hosts the store, finishes first and stays while
    // y still works. A client writes a notice naming group rank 2, which MAX would allow but a
    // round of 2 does not: y ignores it, and so must x, or it would take the store away from
    // y. Then y leaves (a real abort, in the next slot), which ends x's stay.
    loopback_store net(7);
    auto& ctx = net.ctx;
    auto& c = net.c;
    std::vector<std::string> said;
    std::vector<std::string> y_said;
    bool reported = false;  // x reported the forged value
    asio::steady_timer report(ctx, asio::steady_timer::time_point::max());
    bool staying = false;  // x said it stays
    asio::steady_timer stays(ctx, asio::steady_timer::time_point::max());
    auto o = split_options("stayforged", 3, said);  // round 0 forms of 2 after the 0.5 s last call
    o.close_timeout = std::chrono::milliseconds(100);
    o.log = [&](std::string_view line) {
        said.emplace_back(line);
        if (line.find("it stays until they finish or leave") == std::string_view::npos) return;
        staying = true;
        stays.cancel();
    };
    o.warn = [&](std::string_view line) {
        said.emplace_back(line);
        reported = true;
        report.cancel();
    };
    auto oy = split_options("stayforged", 3, y_said);
    oy.hosts_store = false;
    elastic::store_rendezvous<elastic::tcp_store_client> x(*c[0], *c[1], o);
    elastic::store_rendezvous<elastic::tcp_store_client> y(*c[3], *c[4], oy);
    int size = 0;
    bool y_left = false;  // y's abort was written (x's stay may end only after it)
    std::optional<std::size_t> ended;
    asio::co_spawn(
        ctx,
        [&]() -> asio::awaitable<void> {
            using namespace asio::experimental::awaitable_operators;
            co_await x.start_liveness(*c[2], lease_node("x"));
            co_await y.start_liveness(*c[5], lease_node("y"));
            // Both keep their membership for the whole case (a cancelled keep_membership()
            // closes its lease connection).
            (void)co_await (x.keep_membership() || y.keep_membership() || [&]() -> asio::awaitable<void> {
                auto formed = co_await (x.next_round(lease_node("x")) && y.next_round(lease_node("y")));
                size = std::get<0>(formed).group_world_size;
                (void)co_await x.finish(std::chrono::milliseconds(0));  // x is done, y works on
                auto stay = co_await (x.leave() || [&]() -> asio::awaitable<void> {
                    if (!staying) (void)co_await stays.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
                    if (!staying) co_return;  // cancelled: x's leave() ended first
                    elastic::abort_notice forged;
                    forged.what = elastic::abort_notice::kind::failure;
                    forged.group_rank = 2;
                    forged.host = "nobody";
                    forged.reason = "forged";
                    forged.node = "y";  // a lease the store holds
                    // In the first free slot (the acknowledgement mark holds the first).
                    const auto value = elastic::detail::rendezvous::encode(forged);
                    const std::array<const char*, 3> slots{"abort", "abort/1", "abort/2"};
                    for (const auto* slot : slots) {
                        if (co_await c[6]->compare_set(x.key(0, slot), std::string(), value) == value) break;
                    }
                    if (!reported) (void)co_await report.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
                    if (!reported) co_return;  // cancelled: x's stay ended on the forged notice
                    const auto leaving = y_leaves(std::get<1>(formed).group_rank);
                    y_left = true;
                    (void)co_await y.abort(leaving);
                    asio::steady_timer never(ctx, asio::steady_timer::time_point::max());
                    (void)co_await never.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
                }());
                ended = stay.index();
            }());
            for (auto& each : c) each->close();
            net.server.stop();
        },
        [](std::exception_ptr e) {
            if (e) std::rethrow_exception(e);
        });
    ctx.run_for(std::chrono::minutes(2));  // turns a hang into a failure only
    std::string log;
    for (const auto& line : said) log += line + "\n";
    INFO(log);
    CHECK(size == 2);
    REQUIRE(ended);
    CHECK(*ended == 0);  // the stay ended by itself
    CHECK(y_left);       // and only after y's abort
    CHECK(staying);
    CHECK(has(log, "ignored an invalid value in the rendezvous store"));
}

TEST_CASE("rendezvous trust: after members went silent, a round with no majority of the last one's members is not "
          "formed, its node is told the majority it needs, a newcomer does not make one, a rejoined member does, "
          "closed losses impose nothing") {
    // Three nodes, --nnodes=1:3; y and z are lost. Silent (the store's count says so, as a cut
    // or a stall would leave it): x alone is MIN but no majority of 3, so round 1 is not formed.
    // A newcomer, s, joins: x and s are 2 nodes but 1 member of the last round, so round 2 is not
    // formed either. Then y rejoins (y2: a new lease, y's group rank and round): x and y2 are 2
    // of the 3 members, and round 3 forms with the three. Closed (killed agents): x goes on alone.
    for (const bool silent : {true, false}) {
        CAPTURE(silent);
        loopback_store net(17);
        auto& ctx = net.ctx;
        auto& c = net.c;
        std::vector<std::string> said;
        std::function<void()> on_told;
        elastic::store_rendezvous_options o;
        o.run_id = "silent-majority";
        o.nnodes = 3;
        o.min_nodes = 1;
        o.hosts_store = true;
        o.join_timeout = std::chrono::minutes(10);
        // Round 0 completes at MAX = 3 arrivals (all three arrive within milliseconds), as does
        // round 3 (x, s and y2); a node between rounds refused for want of a majority waits this
        // long (the grace).
        o.last_call_timeout = std::chrono::seconds(3);
        o.log = [&](std::string_view line) {
            said.emplace_back(line);
            if (on_told && line.find("so the next rounds need 2 nodes") != std::string_view::npos)
                std::exchange(on_told, nullptr)();
        };
        elastic::store_rendezvous<elastic::tcp_store_client> x(*c[0], *c[1], o);
        elastic::store_rendezvous<elastic::tcp_store_client> y(*c[3], *c[4], o);
        elastic::store_rendezvous<elastic::tcp_store_client> z(*c[6], *c[7], o);
        elastic::store_rendezvous<elastic::tcp_store_client> y2(*c[9], *c[10], o);
        elastic::store_rendezvous<elastic::tcp_store_client> s(*c[13], *c[14], o);
        const auto node = lease_node;
        bool formed = false;
        int y_rank = -1;
        std::optional<elastic::rendezvous_round> a;
        std::optional<elastic::rendezvous_round> b;
        std::optional<elastic::rendezvous_round> newcomer;
        std::optional<std::string> round_two;  // round 2's size: "0" when it was not formed
        const auto rethrow = [](std::exception_ptr e) {
            if (e) std::rethrow_exception(e);
        };
        const auto end_when_done = [&] {  // whichever of x, s and y2 is formed last ends the case
            if (!a || (silent && (!b || !newcomer))) return;
            for (auto& each : c) each->close();
            net.server.stop();
        };
        on_told = [&] {
            // Told, x waits for a majority. A newcomer joins: no member, no majority (round 2's
            // size is "0"). Then y rejoins and makes one.
            asio::co_spawn(
                ctx,
                [&]() -> asio::awaitable<void> {
                    using namespace asio::experimental::awaitable_operators;
                    co_await s.start_liveness(*c[15], node("s"));
                    auto joined = co_await (s.keep_membership() || s.next_round(node("s")));
                    REQUIRE(joined.index() == 1);
                    newcomer = std::get<1>(joined);
                    end_when_done();
                },
                rethrow);
            asio::co_spawn(
                ctx,
                [&]() -> asio::awaitable<void> {
                    using namespace asio::experimental::awaitable_operators;
                    const auto size_key = fmt::format("elastic.rendezvous.{}/2/size", o.run_id);
                    std::vector<std::string> size{size_key};
                    co_await c[16]->wait(std::move(size), std::chrono::seconds(120));
                    round_two = co_await c[16]->get(size_key);
                    auto rejoined = node("y2");
                    rejoined.previous_rank = y_rank;
                    rejoined.member_of = 0;
                    co_await y2.start_liveness(*c[11], rejoined);
                    auto joined = co_await (y2.keep_membership() || y2.next_round(rejoined));
                    REQUIRE(joined.index() == 1);
                    b = std::get<1>(joined);
                    end_when_done();
                },
                rethrow);
        };
        // x keeps its membership for the whole case (a cancelled keep_membership() closes its
        // lease connection, and x would be lost too); y's and z's end with round 0.
        const auto run = [&]() -> asio::awaitable<void> {
            using namespace asio::experimental::awaitable_operators;
            auto first = co_await (y.keep_membership() || z.keep_membership() ||
                                   (x.next_round(node("x")) && y.next_round(node("y")) && z.next_round(node("z"))));
            REQUIRE(first.index() == 2);
            formed = std::get<0>(std::get<2>(first)).group_world_size == 3;
            y_rank = std::get<1>(std::get<2>(first)).group_rank;
            if (silent) net.server.engine().set("/" + elastic::lease_silent_key(x.lease_group()), std::string("2"));
            c[5]->close();
            c[8]->close();
            std::vector<std::string> lost{elastic::lease_lost_key(x.lease_group(), 1),
                                          elastic::lease_lost_key(x.lease_group(), 2)};
            co_await c[12]->wait(std::move(lost), std::chrono::seconds(120));
            a = co_await x.next_round(node("x"));
            end_when_done();
        };
        asio::co_spawn(
            ctx,
            [&]() -> asio::awaitable<void> {
                using namespace asio::experimental::awaitable_operators;
                co_await x.start_liveness(*c[2], node("x"));
                co_await y.start_liveness(*c[5], node("y"));
                co_await z.start_liveness(*c[8], node("z"));
                co_await (x.keep_membership() || run());
            },
            rethrow);
        ctx.run_for(std::chrono::minutes(2));  // turns a hang into a failure only
        std::string log;
        for (const auto& line : said) log += line + "\n";
        INFO(log);
        CHECK(formed);
        REQUIRE(a);
        if (silent) {
            REQUIRE(b);
            REQUIRE(newcomer);
            CHECK(round_two == std::optional<std::string>("0"));  // x and the newcomer: no majority
            CHECK(a->number == 3);
            for (const auto* r : {&*a, &*b, &*newcomer}) {
                CHECK(r->group_world_size == 3);
                CHECK(r->number == a->number);
            }
            CHECK(std::set<int>{a->group_rank, b->group_rank, newcomer->group_rank} == std::set<int>{0, 1, 2});
            CHECK(has(
                log,
                "too few of the last round's 3 members joined for a majority after a member went silent or stayed away with a live lease"));
        } else {
            CHECK_FALSE(b);
            CHECK(a->group_world_size == 1);
            CHECK_FALSE(has(log, "majority"));
        }
    }
}

TEST_CASE("rendezvous trust: standbys that fill a round to MAX while members of the last round stay away with live "
          "leases do not form it, a majority of the members back does") {
    // --nnodes=1:3: x, y and z form round 0; two standbys wait beside it. x aborts the round (a
    // worker failure that a cut caused, say) and comes back with the standbys at once: 3 = MAX.
    // y and z still hold their leases but stay away, as members on the far side of a cut do
    // until their keep-alive runs out, and there they may already move the store and train as
    // 2 of the 3. So round 1 is not formed. Then y comes back: x and y are a majority of round
    // 0, and the next round forms with a standby in z's seat.
    loopback_store net(16);
    auto& ctx = net.ctx;
    auto& c = net.c;
    std::vector<std::string> said;
    std::function<void()> on_standbys;
    int standbys = 0;
    elastic::store_rendezvous_options o;
    o.run_id = "live-away";
    o.nnodes = 3;
    o.min_nodes = 1;
    o.hosts_store = true;
    o.join_timeout = std::chrono::minutes(10);
    o.last_call_timeout = std::chrono::seconds(1);  // the grace of a node between refused rounds
    o.log = [&](std::string_view line) {
        said.emplace_back(line);
        if (line.find("waits as a standby") != std::string_view::npos && ++standbys == 2 && on_standbys)
            std::exchange(on_standbys, nullptr)();
    };
    elastic::store_rendezvous<elastic::tcp_store_client> x(*c[0], *c[1], o);
    elastic::store_rendezvous<elastic::tcp_store_client> y(*c[3], *c[4], o);
    elastic::store_rendezvous<elastic::tcp_store_client> z(*c[6], *c[7], o);
    elastic::store_rendezvous<elastic::tcp_store_client> s1(*c[9], *c[10], o);
    elastic::store_rendezvous<elastic::tcp_store_client> s2(*c[12], *c[13], o);
    const auto node = lease_node;
    const auto rethrow = [](std::exception_ptr e) {
        if (e) std::rethrow_exception(e);
    };
    std::optional<elastic::rendezvous_round> first;
    std::optional<elastic::rendezvous_round> a;
    std::optional<elastic::rendezvous_round> b;
    std::optional<std::string> round_one;  // round 1's size: "0" when it was not formed
    std::string job_round;                 // the job's round after round 1
    std::vector<int> seated;               // the standbys' rounds
    int waiting = 0;                       // standbys still beside the round at the end
    asio::steady_timer finished(ctx, asio::steady_timer::time_point::max());
    const auto until_finished = [&]() -> asio::awaitable<void> {
        co_await finished.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
    };
    const auto end_when_done = [&] {  // ends every wait on `finished`, now and later
        if (a && b && !seated.empty()) finished.expires_at(asio::steady_timer::time_point::min());
    };
    const auto standby = [&](elastic::store_rendezvous<elastic::tcp_store_client>& s, elastic::tcp_store_client& lease,
                             std::string id) -> asio::awaitable<void> {
        using namespace asio::experimental::awaitable_operators;
        co_await s.start_liveness(lease, node(id));
        auto joined = co_await (s.keep_membership() || s.next_round(node(id)) || until_finished());
        REQUIRE(joined.index() != 0);
        if (joined.index() == 2) {
            ++waiting;
            co_return;
        }
        seated.push_back(std::get<1>(joined).number);
        end_when_done();
        co_await (s.keep_membership() || until_finished());  // a member keeps its lease
    };
    on_standbys = [&] {
        asio::co_spawn(
            ctx,
            [&]() -> asio::awaitable<void> {
                elastic::abort_notice notice;
                notice.group_rank = first->group_rank;
                notice.host = "x";
                notice.reason = "a worker failed";
                notice.what = elastic::abort_notice::kind::membership;
                REQUIRE(co_await x.abort(notice));
                a = co_await x.next_round(node("x"));
                end_when_done();
            },
            rethrow);
        asio::co_spawn(
            ctx,
            [&]() -> asio::awaitable<void> {
                const auto size_key = fmt::format("elastic.rendezvous.{}/1/size", o.run_id);
                std::vector<std::string> size{size_key};
                co_await c[15]->wait(std::move(size), std::chrono::seconds(120));
                round_one = co_await c[15]->get(size_key);
                // A refused round is where a new node starts (it finds size 0 and moves on).
                job_round = co_await c[15]->get(x.job_key("round"));
                b = co_await y.next_round(node("y"));
                end_when_done();
            },
            rethrow);
    };
    const auto run = [&]() -> asio::awaitable<void> {
        using namespace asio::experimental::awaitable_operators;
        auto formed = co_await (x.next_round(node("x")) && y.next_round(node("y")) && z.next_round(node("z")));
        first = std::get<0>(formed);
        asio::co_spawn(ctx, standby(s1, *c[11], "s1"), rethrow);
        asio::co_spawn(ctx, standby(s2, *c[14], "s2"), rethrow);
        // Leases kept for the whole case: y's and z's live while they stay away.
        co_await (x.keep_membership() || y.keep_membership() || z.keep_membership() || until_finished());
        for (auto& each : c) each->close();
        net.server.stop();
    };
    asio::co_spawn(
        ctx,
        [&]() -> asio::awaitable<void> {
            co_await x.start_liveness(*c[2], node("x"));
            co_await y.start_liveness(*c[5], node("y"));
            co_await z.start_liveness(*c[8], node("z"));
            co_await run();
        },
        rethrow);
    ctx.run_for(std::chrono::minutes(2));  // turns a hang into a failure only
    std::string log;
    for (const auto& line : said) log += line + "\n";
    INFO(log);
    REQUIRE(first);
    CHECK(first->group_world_size == 3);
    CHECK(round_one == std::optional<std::string>("0"));  // x and two standbys: no majority of round 0
    CHECK(job_round == "1");
    CHECK(has(log, "too few of the last round's 3 members joined for a majority after a member went silent or "
                   "stayed away with a live lease"));
    REQUIRE(a);
    REQUIRE(b);
    CHECK(a->number == b->number);
    CHECK(a->number >= 2);
    CHECK(a->group_world_size == 3);
    CHECK(a->group_rank != b->group_rank);
    REQUIRE(seated.size() == 1);  // one standby takes z's seat, the other waits beside the round
    CHECK(seated.front() == a->number);
    CHECK(waiting == 1);
}

TEST_CASE("rendezvous trust: after an admission round formed, members that never acknowledged it and went silent "
          "keep the store's side from going on by its majority alone, acknowledged they do not") {
    // --nnodes=1:5: x, y and z form round 0; d and e join, and round 1 forms with all five. Then
    // y and z go silent. x, d and e are a majority of round 1, but if y and z never learned
    // that round 1 formed (cut off between their arrival and their assignment: no
    // `acked/<rank>`), they go by round 0, where they are 2 of 3 and may move the store and
    // train. So x, d and e do not form round 2, and end at the join timeout naming why. When
    // y and z had acknowledged round 1 (they go by it, where they are 2 of 5), round 2 forms.
    for (const bool acknowledged : {false, true}) {
        CAPTURE(acknowledged);
        loopback_store net(17);
        auto& ctx = net.ctx;
        auto& c = net.c;
        std::vector<std::string> said;
        const auto o = split_options("unacknowledged", 5, said);
        elastic::store_rendezvous<elastic::tcp_store_client> x(*c[0], *c[1], o);
        elastic::store_rendezvous<elastic::tcp_store_client> y(*c[3], *c[4], o);
        elastic::store_rendezvous<elastic::tcp_store_client> z(*c[6], *c[7], o);
        elastic::store_rendezvous<elastic::tcp_store_client> d(*c[9], *c[10], o);
        elastic::store_rendezvous<elastic::tcp_store_client> e(*c[12], *c[13], o);
        const auto node = lease_node;
        std::optional<elastic::rendezvous_round> zero;
        std::optional<elastic::rendezvous_round> one;
        std::vector<std::string> ended;  // x's, d's and e's round 2: "formed N", or the error
        std::optional<std::string> round_two;
        const auto second = [&](elastic::store_rendezvous<elastic::tcp_store_client>& n,
                                std::string id) -> asio::awaitable<void> {
            try {
                const auto r = co_await n.next_round(node(id));
                ended.push_back(fmt::format("formed {} of {}", r.number, r.group_world_size));
            } catch (const elastic::rendezvous_error& error) {
                ended.emplace_back(error.what());
            }
        };
        const auto read_round_two = [&]() -> asio::awaitable<void> {  // before later rounds collect it
            const auto size_key = fmt::format("elastic.rendezvous.{}/2/size", o.run_id);
            std::vector<std::string> size{size_key};
            co_await c[16]->wait(std::move(size), std::chrono::seconds(120));
            round_two = co_await c[16]->get(size_key);
        };
        // Round 1 admits d and e; then y and z go silent, and x, d and e try round 2.
        const auto admit = [&]() -> asio::awaitable<void> {
            using namespace asio::experimental::awaitable_operators;
            auto admitted = co_await (x.next_round(node("x")) && y.next_round(node("y")) && z.next_round(node("z")) &&
                                      d.next_round(node("d")) && e.next_round(node("e")));
            one = std::get<0>(admitted);
            const int y_rank = std::get<1>(admitted).group_rank;
            const int z_rank = std::get<2>(admitted).group_rank;
            if (!acknowledged) {
                // What y and z leave when the cut came before they read their assignment. A
                // get on the connection of each one's set (which has no reply) orders it first.
                for (const auto& [store, g] : {std::pair{c[3].get(), y_rank}, std::pair{c[6].get(), z_rank}}) {
                    const auto ack = x.job_key(fmt::format("acked/{}", g));
                    CHECK(co_await store->get(ack) == "1");
                    net.server.engine().set("/" + ack, std::string("0"));
                }
            }
            net.server.engine().set("/" + elastic::lease_silent_key(x.lease_group()), std::string("2"));
            c[5]->close();
            c[8]->close();
            std::vector<std::string> lost{elastic::lease_lost_key(x.lease_group(), 1),
                                          elastic::lease_lost_key(x.lease_group(), 2)};
            co_await c[15]->wait(std::move(lost), std::chrono::seconds(120));
            co_await (second(x, "x") && second(d, "d") && second(e, "e") && read_round_two());
        };
        const auto run = [&]() -> asio::awaitable<void> {
            using namespace asio::experimental::awaitable_operators;
            auto formed = co_await (x.next_round(node("x")) && y.next_round(node("y")) && z.next_round(node("z")));
            zero = std::get<0>(formed);
            co_await d.start_liveness(*c[11], node("d"));
            co_await e.start_liveness(*c[14], node("e"));
            co_await (d.keep_membership() || e.keep_membership() || admit());
        };
        asio::co_spawn(
            ctx,
            [&]() -> asio::awaitable<void> {
                using namespace asio::experimental::awaitable_operators;
                co_await x.start_liveness(*c[2], node("x"));
                co_await y.start_liveness(*c[5], node("y"));
                co_await z.start_liveness(*c[8], node("z"));
                co_await (x.keep_membership() || y.keep_membership() || z.keep_membership() || run());
                for (auto& each : c) each->close();
                net.server.stop();
            },
            [](std::exception_ptr error) {
                if (error) std::rethrow_exception(error);
            });
        ctx.run_for(std::chrono::minutes(2));  // turns a hang into a failure only
        std::string log;
        for (const auto& line : said) log += line + "\n";
        INFO(log);
        REQUIRE(zero);
        REQUIRE(one);
        CHECK(zero->group_world_size == 3);
        CHECK(one->group_world_size == 5);
        std::string ends;
        for (const auto& each : ended) ends += each + "\n";
        INFO(ends);
        REQUIRE(ended.size() == 3);
        if (acknowledged) {
            CHECK(round_two == std::optional<std::string>("3"));
            for (const auto& each : ended) CHECK(each == "formed 2 of 3");
            CHECK_FALSE(has(log, "round before the last one"));
        } else {
            CHECK(round_two == std::optional<std::string>("0"));
            CHECK(has(log, "too many of the 3 members of the round before the last one are away and never "
                           "acknowledged that the last one formed"));
            for (const auto& each : ended) {
                CHECK(has(each, "too many of the 3 members of the round before the last one stayed away without "
                                "acknowledging the last round within the join timeout (4 s)"));
            }
        }
    }
}

TEST_CASE("rendezvous trust: the store's host lost while some members of an admission round never learned of it: "
          "the movers that knew it need a majority of the round before too, unless they saw every member "
          "acknowledge it") {
    // --nnodes=1:7: a (the store's host), b and c form round 0; d, e, f and g join, and round 1
    // forms with all seven. Then a dies and the others move the store to a successor.
    // - b and c cut off before they read their assignment: they go by round 0, where they are 2
    //   of 3, while d, e, f and g, 4 of 7, go by round 1; each side would move the store to a
    //   successor of its own. d, e, f and g never saw every member acknowledge round 1, so
    //   their first round there needs a majority of round 0 too: they end at the join timeout
    //   naming why.
    // - nobody cut off: all seven acknowledged, d, e, f and g saw the mark, and go on as 4 of 7.
    // - d cut off (a newcomer: it goes by no round): b, c, e, f and g never saw the mark, but
    //   b and c say they were 2 of round 0's 3, and they go on as 5 of 7.
    struct variant {
        std::vector<int> cut;     // nodes whose round-1 connections end before it forms
        std::vector<int> movers;  // the nodes that move the store (the first hosts it)
        std::string ends;         // how each mover's first round there ends
    };
    const std::vector<variant> variants{
        {{1, 2}, {3, 4, 5, 6}, "too many of the 3 members of the round before the last one stayed away"},
        {{}, {3, 4, 5, 6}, "formed 2 of 4"},
        {{3}, {1, 2, 4, 5, 6}, "formed 2 of 5"},
    };
    for (const auto& v : variants) {
        CAPTURE(v.ends);
        loopback_store net(22);
        auto& ctx = net.ctx;
        auto& c = net.c;
        elastic::tcp_store_server successor(ctx.get_executor(), loopback_store::server_options({}));
        successor.start();
        std::vector<std::unique_ptr<elastic::tcp_store_client>> s;  // each mover's three there
        for (std::size_t i = 0; i < 3 * v.movers.size(); ++i)
            s.push_back(loopback_store::client_of(ctx, successor.port()));
        std::vector<std::string> said;
        const auto o = split_options("moved-unacknowledged", 7, said);
        using node_type = elastic::store_rendezvous<elastic::tcp_store_client>;
        std::vector<std::unique_ptr<node_type>> n;  // a, b, c, d, e, f, g
        for (std::size_t i = 0; i < 7; ++i) n.push_back(std::make_unique<node_type>(*c[3 * i], *c[3 * i + 1], o));
        const std::vector<std::string> ids{"a", "b", "c", "d", "e", "f", "g"};
        const auto node = lease_node;
        const auto at = [&](int i) -> node_type& { return *n[static_cast<std::size_t>(i)]; };
        std::optional<elastic::rendezvous_round> zero;
        std::vector<int> one;          // round 1's size as each member that read it saw it
        std::vector<std::string> cut;  // how the cut nodes' round 1 ended
        std::vector<std::string> ended;
        const auto round_one = [&](int i) -> asio::awaitable<void> {
            try {
                one.push_back((co_await at(i).next_round(node(ids[static_cast<std::size_t>(i)]))).group_world_size);
            } catch (const std::exception& error) {
                cut.emplace_back(error.what());
            }
        };
        const auto moved = [&](int i) -> asio::awaitable<void> {
            try {
                const auto r = co_await at(i).next_round(node(ids[static_cast<std::size_t>(i)]));
                ended.push_back(fmt::format("formed {} of {}", r.number, r.group_world_size));
            } catch (const elastic::rendezvous_error& error) {
                ended.emplace_back(error.what());
            }
        };
        // Round 1 for every node but those in `skip` (the cut ones, arrived already).
        const auto rest = [&](std::vector<int> skip) -> asio::awaitable<void> {
            using namespace asio::experimental::awaitable_operators;
            std::vector<int> left;
            for (int i = 0; i < 7; ++i) {
                if (std::find(skip.begin(), skip.end(), i) == skip.end()) left.push_back(i);
            }
            auto all = round_one(left[0]);
            for (std::size_t k = 1; k < left.size(); ++k) all = std::move(all) && round_one(left[k]);
            co_await std::move(all);
        };
        const auto admitted = [&]() -> asio::awaitable<void> {
            using namespace asio::experimental::awaitable_operators;
            if (v.cut.empty()) {
                co_await rest({});
            } else {
                // The cut nodes arrive first; their connections for the round end before it
                // forms (their leases live on: the round counts them, and they never read it).
                auto early = [&]() -> asio::awaitable<void> {
                    std::vector<std::string> infos;
                    for (std::size_t k = 1; k <= v.cut.size(); ++k)
                        infos.push_back(fmt::format("elastic.rendezvous.{}/1/info/{}", o.run_id, k));
                    co_await c[21]->wait(std::move(infos), std::chrono::seconds(120));
                    for (const int i : v.cut) {
                        c[static_cast<std::size_t>(3 * i)]->close();
                        c[static_cast<std::size_t>(3 * i + 1)]->close();
                    }
                    co_await rest(v.cut);
                };
                auto cut_ones = round_one(v.cut[0]);
                for (std::size_t k = 1; k < v.cut.size(); ++k) cut_ones = std::move(cut_ones) && round_one(v.cut[k]);
                co_await (std::move(cut_ones) && early());
            }
            // a reports a failure; the movers read it (and the mark before it, if there is one).
            elastic::abort_notice notice;
            notice.group_rank = 0;
            notice.host = "a";
            notice.reason = "a worker failed";
            notice.what = elastic::abort_notice::kind::membership;
            (void)co_await at(0).abort(notice);
            for (const int i : v.movers) (void)co_await at(i).wait_for_abort();
            // The store's host dies; the movers move to the first one's idle server.
            net.server.stop();
            for (std::size_t k = 0; k < v.movers.size(); ++k) {
                auto& mover = at(v.movers[k]);
                mover.move_to(*s[3 * k], *s[3 * k + 1], k == 0);
                co_await mover.start_liveness(*s[3 * k + 2], node(ids[static_cast<std::size_t>(v.movers[k])]));
            }
            auto all = moved(v.movers[0]);
            for (std::size_t k = 1; k < v.movers.size(); ++k) all = std::move(all) && moved(v.movers[k]);
            co_await std::move(all);
        };
        const auto scenario = [&]() -> asio::awaitable<void> {
            using namespace asio::experimental::awaitable_operators;
            auto formed = co_await (at(0).next_round(node("a")) && at(1).next_round(node("b")) &&
                                    at(2).next_round(node("c")));
            zero = std::get<0>(formed);
            for (int i = 3; i < 7; ++i) {
                co_await at(i).start_liveness(*c[static_cast<std::size_t>(3 * i + 2)],
                                              node(ids[static_cast<std::size_t>(i)]));
            }
            // (keep_membership() ends at once before start_liveness(): started only now.)
            co_await (at(3).keep_membership() || at(4).keep_membership() || at(5).keep_membership() ||
                      at(6).keep_membership() || admitted());
        };
        asio::co_spawn(
            ctx,
            [&]() -> asio::awaitable<void> {
                using namespace asio::experimental::awaitable_operators;
                for (int i = 0; i < 3; ++i) {
                    co_await at(i).start_liveness(*c[static_cast<std::size_t>(3 * i + 2)],
                                                  node(ids[static_cast<std::size_t>(i)]));
                }
                co_await (at(0).keep_membership() || at(1).keep_membership() || at(2).keep_membership() || scenario());
                for (auto& each : c) each->close();
                for (auto& each : s) each->close();
                successor.stop();
            },
            [](std::exception_ptr error) {
                if (error) std::rethrow_exception(error);
            });
        ctx.run_for(std::chrono::minutes(2));  // turns a hang into a failure only
        std::string log;
        for (const auto& line : said) log += line + "\n";
        INFO(log);
        REQUIRE(zero);
        CHECK(zero->group_world_size == 3);
        std::string ends;
        for (const auto& each : ended) ends += each + "\n";
        for (const auto& each : cut) ends += "cut: " + each + "\n";
        INFO(ends);
        CHECK(one == std::vector<int>(7 - v.cut.size(), 7));
        CHECK(cut.size() == v.cut.size());
        REQUIRE(ended.size() == v.movers.size());
        for (const auto& each : ended) CHECK(has(each, v.ends));
        if (has(v.ends, "formed")) {
            CHECK_FALSE(has(log, "round before the last one"));
        } else {
            CHECK(has(log, "too many of the 3 members of the round before the last one are away and never "
                           "acknowledged that the last one formed"));
            for (const auto& each : ended) CHECK(has(each, "within the join timeout (4 s)"));
        }
    }
}

TEST_CASE("rendezvous trust: a round with the nodes it needs that waits out the join timeout for a live node says "
          "so, not \"N of the N needed joined\"") {
    // 2:3, three registered and live nodes; z keeps its lease but never arrives (an agent still
    // stopping its workers, say). x and y are MIN, and the round waits for z up to the join timeout.
    loopback_store net(9);
    auto& c = net.c;
    elastic::store_rendezvous_options o;
    o.run_id = "waits-for-live";
    o.nnodes = 3;
    o.min_nodes = 2;
    o.hosts_store = true;
    o.join_timeout = std::chrono::seconds(2);
    o.last_call_timeout = std::chrono::milliseconds(500);
    elastic::store_rendezvous<elastic::tcp_store_client> x(*c[0], *c[1], o);
    elastic::store_rendezvous<elastic::tcp_store_client> y(*c[3], *c[4], o);
    elastic::store_rendezvous<elastic::tcp_store_client> z(*c[6], *c[7], o);
    std::vector<std::string> ended;
    const auto arrive = [&](elastic::store_rendezvous<elastic::tcp_store_client>& node,
                            std::string id) -> asio::awaitable<void> {
        try {
            (void)co_await node.next_round(lease_node(id));
            ended.emplace_back("formed");
        } catch (const elastic::rendezvous_error& e) {
            ended.emplace_back(e.what());
        }
    };
    asio::co_spawn(
        net.ctx,
        [&]() -> asio::awaitable<void> {
            using namespace asio::experimental::awaitable_operators;
            co_await x.start_liveness(*c[2], lease_node("x"));
            co_await y.start_liveness(*c[5], lease_node("y"));
            co_await z.start_liveness(*c[8], lease_node("z"));
            co_await (x.keep_membership() || y.keep_membership() || z.keep_membership() ||
                      (arrive(x, "x") && arrive(y, "y")));
            for (auto& each : c) each->close();
            net.server.stop();
        },
        [](std::exception_ptr e) {
            if (e) std::rethrow_exception(e);
        });
    net.ctx.run_for(std::chrono::minutes(2));  // turns a hang into a failure only
    REQUIRE(ended.size() == 2);
    for (const auto& message : ended) {
        CAPTURE(message);
        CHECK(has(message, "rendezvous of run 'waits-for-live' round 0: 2 nodes arrived (2 needed, --nnodes=2:3), "
                           "yet the round did not form within the join timeout (2 s): it waits for every live node "
                           "of the job, and 1 of the 3 registered and live never arrived"));
    }
}

TEST_CASE("rendezvous trust: a node that comes to a round's abort or decision after the round was collected "
          "rejoins instead of waiting for ever") {
    // A member slow to stop its workers after round 0 was aborted comes back when later rounds
    // completed and the completer of round 3 deleted round 0's keys (`collected` = 1).
    asio::io_context ctx;
    elastic::memory_store memory;
    elastic::store_rendezvous_options o;
    o.run_id = "slow";
    o.nnodes = 1;
    std::vector<std::string> said;
    o.log = [&](std::string_view line) { said.emplace_back(line); };
    elastic::store_rendezvous<elastic::memory_store> node(memory, memory, o);
    elastic::node_info me;
    me.host = "me";
    me.store_addr = "127.0.0.1";
    me.store_port = 1;
    me.pid = 1;
    elastic::abort_notice notice;
    elastic::job_decision decision;
    int rejoined_at = -1;
    bool finished = false;
    asio::co_spawn(
        ctx,
        [&]() -> asio::awaitable<void> {
            (void)co_await node.next_round(me);
            REQUIRE(node.round_number() == 0);
            // Rounds 1..3 completed elsewhere; round 0's abort and decision are gone.
            memory.engine().set(std::string_view("elastic.rendezvous.slow/round"), std::string_view("3"));
            memory.engine().set(std::string_view("elastic.rendezvous.slow/collected"), std::string_view("1"));
            notice = co_await node.wait_for_abort();
            decision = co_await node.await_decision();
            const auto round = co_await node.next_round(me);
            rejoined_at = round.number;
            finished = true;
        },
        [](std::exception_ptr e) {
            if (e) std::rethrow_exception(e);
        });
    ctx.run_for(std::chrono::minutes(2));  // turns a hang into a failure only
    REQUIRE(finished);
    CHECK(notice.what == elastic::abort_notice::kind::membership);
    CHECK(has(notice.reason, "round 0 of run 'slow' ended and was deleted while this node was away from it"));
    CHECK(decision.restart);
    CHECK(has(decision.reason, "the decision after round 0 of run 'slow' was deleted with the round"));
    // It rejoins where the job is, the last completed round (which holds no arrival in this
    // store, so it completes it alone), not round 1.
    CHECK(rejoined_at == 3);
}

TEST_CASE("rendezvous trust: an agent pointed at PyTorch's own TCPStore says at once that it is no elastic store") {
    // PyTorch 1.13's TCPStore (Debian's), as a torchrun agent or a finished job's workers leave
    // one on a port: it keeps no leases, so nothing there would ever count this node's loss.
    asio::io_context ctx;
    auto server = client_support::torch_server::start(ctx);
    temp_dir dir;
    auto args = [&](const std::string& id) {
        return std::vector<std::string>{"--rdzv-backend=c10d",
                                        fmt::format("--rdzv-endpoint=127.0.0.1:{}", server.port),
                                        fmt::format("--rdzv-id={}", id),
                                        "--nnodes=1:2",
                                        "--nproc-per-node=1",
                                        agent_support::worker()};
    };
    auto env = agent_support::clean_environment();
    env["AGENT_WORKER_DIR"] = dir.str();
    env["AGENT_WORKER_DO"] = "*:env";
    SUBCASE("an empty store") {
        const auto r = agent_support::run(args("plain"), env);
        INFO(r.err);
        CHECK(r.code == 250);
        CHECK(has(r.err, fmt::format("the rendezvous store at 127.0.0.1:{}: it keeps no leases, so it is no "
                                     "elastic store: a PyTorch TCPStore",
                                     server.port)));
    }
    SUBCASE("a store that holds a torchrun agent's state for the run") {
        const auto seeded = client_support::python(
            ctx, fmt::format("import datetime\n"
                             "import torch.distributed as d\n"
                             "s = d.TCPStore('127.0.0.1', {}, None, False, datetime.timedelta(seconds=30))\n"
                             "s.set('torch.rendezvous.pickled', 'gASVAAAAAAAAAAB9lC4=')\n",
                             server.port));
        INFO(seeded.first);
        REQUIRE(seeded.second == 0);
        const auto r = agent_support::run(args("pickled"), env);
        INFO(r.err);
        CHECK(r.code == 250);
        CHECK(has(r.err, "the store already holds torchrun's rendezvous state for run 'pickled'"));
    }
    CHECK_FALSE(std::filesystem::exists(dir.path() / "env.0.0"));  // no worker started
    const auto stopped = server.stop(ctx);
    INFO(stopped.first);
    CHECK(client_support::exit_code(stopped.second) == 0);
}

}  // namespace test_rendezvous_trust
