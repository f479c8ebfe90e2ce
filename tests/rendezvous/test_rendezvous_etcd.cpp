// The etcd-v3 rendezvous with real elasticrun agents and a real etcd cluster on loopback: ranks
// as with c10d, a node killed and one added (--nnodes=MIN:MAX), a member of etcd killed while the
// job trains, the cluster's quorum lost, and PyTorch DDP across two agents.
// test-tags: etcd
#include "agent_support.hpp"
#include "etcd_support.hpp"
#include "store_support.hpp"
#include "world_support.hpp"

#include <elastic/store/etcd_client.hpp>

#include <doctest/doctest.h>

#include <asio/io_context.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace test_rendezvous_etcd {

using agent_support::launched;
using agent_support::temp_dir;
using world_support::await_lines;
using world_support::await_stderr;
using world_support::has;
using world_support::worlds;

/// A killed agent's lease is gone once etcd expires it: 5 s of silence, long enough that a
/// machine starved by other tests never loses a live agent.
constexpr const char* keep_alive = "keep_alive_interval=0.5,keep_alive_max_attempt=10";

/// One job over etcd-v3: agents started one by one; agent i runs with RDZV_TEST_NODE=i.
struct job {
    job(const etcd_support::cluster& etcd, std::string id_) : endpoints(etcd.endpoints()), id(std::move(id_)) {}

    temp_dir dir;
    std::string endpoints;
    std::string id;
    std::string nnodes = "2";
    int nproc = 1;
    std::string conf = keep_alive;
    std::vector<std::unique_ptr<launched>> agents;

    launched& start(const std::string& rules, const std::vector<std::string>& extra = {},
                    std::map<std::string, std::string> more_env = {}) {
        const int node = static_cast<int>(agents.size());
        std::vector<std::string> args{"--rdzv-backend=etcd-v3",
                                      fmt::format("--rdzv-endpoint={}", endpoints),
                                      fmt::format("--rdzv-id={}", id),
                                      fmt::format("--nnodes={}", nnodes),
                                      fmt::format("--nproc-per-node={}", nproc),
                                      fmt::format("--rdzv-conf={}", conf)};
        args.insert(args.end(), extra.begin(), extra.end());
        if (!rules.empty()) args.push_back(agent_support::worker());
        auto env = agent_support::clean_environment();
        env["AGENT_WORKER_DIR"] = dir.str();
        env["AGENT_WORKER_DO"] = rules;
        env["RDZV_TEST_NODE"] = std::to_string(node);
        env["LOGLEVEL"] = "WARNING";
        for (auto& [k, v] : more_env) env[k] = v;
        agents.push_back(std::make_unique<launched>(args, env));
        return *agents.back();
    }
    launched& operator[](int node) { return *agents.at(static_cast<std::size_t>(node)); }
    void go() const { std::ofstream(dir.path() / "go") << "go\n"; }
};

/// How many keys etcd holds under elastic's prefix.
std::int64_t keys_left(const etcd_support::cluster& etcd) {
    asio::io_context io;
    elastic::etcd_options o;
    for (const auto& m : etcd.members()) o.endpoints.push_back({"127.0.0.1", m.client_port});
    elastic::etcd_client client(io.get_executor(), o);
    return store_support::run(io, client.range("/elastic/", elastic::etcd_prefix_end("/elastic/"), true)).count;
}

/// Watches job `id`'s status keys in etcd (each agent publishes its status every 2 s) until
/// `enough(writes)` holds, `writes` counting the puts seen per status key with the last value of
/// each.
void await_status(const etcd_support::cluster& etcd, const std::vector<int>& members, const std::string& id,
                  const std::function<bool(const std::map<std::string, std::pair<int, std::string>>&)>& enough) {
    asio::io_context io;
    elastic::etcd_options o;
    for (const int m : members)
        o.endpoints.push_back({"127.0.0.1", etcd.members()[static_cast<std::size_t>(m)].client_port});
    elastic::etcd_client client(io.get_executor(), o);
    const std::string status = fmt::format("/elastic/elastic.rendezvous.{}/status/", id);
    store_support::run(io, [&]() -> asio::awaitable<void> {
        const auto now = co_await client.range(status, elastic::etcd_prefix_end(status));
        auto w = co_await client.watch(status, elastic::etcd_prefix_end(status), now.revision + 1);
        std::map<std::string, std::pair<int, std::string>> writes;
        while (!enough(writes)) {
            auto batch = co_await w.next();
            for (const auto& e : batch.events) {
                if (e.kv.key.ends_with("/count")) continue;  // the index counter, not a status
                auto& seen = writes[e.kv.key];
                ++seen.first;
                seen.second = e.kv.value;
            }
        }
    }());
}

}  // namespace test_rendezvous_etcd

using namespace test_rendezvous_etcd;

TEST_CASE(
    "rendezvous etcd: 4 agents over one member get distinct ranks and one workers' store, then clear their keys") {
    etcd_support::cluster etcd(1);
    job j(etcd, "ranks");
    j.nnodes = "4";
    j.nproc = 2;
    for (int node = 0; node < 4; ++node) j.start("*:world+store+exit0");
    std::set<int> ranks;
    std::set<int> group_ranks;
    std::set<std::string> masters;
    for (int node = 0; node < 4; ++node) {
        CAPTURE(node);
        const int code = j[node].wait();
        INFO(j[node].err());
        CHECK(code == 0);
        const auto lines = worlds(j[node].out());
        REQUIRE(lines.size() == 2);
        for (const auto& w : lines) {
            CHECK(w.world == 8);
            CHECK(w.group_world == 4);
            CHECK(w.attempt == 0);
            CHECK(w.rank / 2 == w.group_rank);
            ranks.insert(w.rank);
            group_ranks.insert(w.group_rank);
        }
        CHECK(agent_support::launched::count_lines(j[node].out(), "store ok ") == 2);
    }
    CHECK(ranks.size() == 8);
    CHECK(group_ranks.size() == 4);
    // The last agent to leave cleared the job's keys: the id can be used again.
    CHECK(keys_left(etcd) == 0);
}

TEST_CASE("rendezvous etcd: --nnodes=2:3, a node added is admitted by a restart, a node killed is left out once its "
          "lease expires") {
    etcd_support::cluster etcd(1);
    job j(etcd, "elastic");
    j.nnodes = "2:3";
    j.conf = fmt::format("{},last_call_timeout=1", keep_alive);
    // World 2 waits for the test's word; world 3 waits for ever (until a node is killed).
    const std::string rules = "w2:world+go+exit0;w3:world+hang";
    j.start(rules);
    j.start(rules);
    await_lines(j[0], "world 2 ");
    await_lines(j[1], "world 2 ");
    j.start(rules);  // scale-up: the round of 2 restarts to admit it
    for (int node = 0; node < 3; ++node) await_lines(j[node], "world 3 ");
    const auto third = worlds(j[2].out(), 3).back();
    j[2].signal(SIGKILL);
    CHECK(j[2].wait() == 128 + SIGKILL);
    CHECK(world_support::ended(third.pid));
    await_lines(j[0], "world 2 ", 2);
    await_lines(j[1], "world 2 ", 2);
    j.go();
    for (int node = 0; node < 2; ++node) {
        CAPTURE(node);
        const int code = j[node].wait();
        INFO(j[node].err());
        CHECK(code == 0);
        const auto lines = worlds(j[node].out());
        REQUIRE(lines.size() == 3);
        CHECK(lines[0].world == 2);
        CHECK(lines[1].world == 3);
        CHECK(lines[2].world == 2);
        for (const auto& w : lines) CHECK(w.attempt == 0);  // membership restarts spend no restart
        CHECK(has(j[node].err(), "was lost"));
    }
    CHECK(keys_left(etcd) == 0);
}

TEST_CASE("rendezvous etcd: three members, one killed while the job trains: no restart, a second killed: the agents "
          "end naming the quorum, the members back: a new job runs") {
    etcd_support::cluster etcd(3);
    job j(etcd, "quorum");
    // read_timeout bounds each request to a member that takes a connection and never answers.
    j.conf = fmt::format("{},read_timeout=3", keep_alive);
    const std::string rules = "*:world+go+exit0";
    j.start(rules);
    j.start(rules);
    await_lines(j[0], "world 2 ");
    await_lines(j[1], "world 2 ");
    // The agents' requests go to the first member, which answered first.
    etcd.kill(0);
    (void)etcd.await_leader();
    // The job goes on at the other members: every agent's lease is renewed there. The proof that
    // each agent moved is two writes of its status after the kill, watched in etcd.
    await_status(etcd, {1, 2}, "quorum", [](const auto& writes) {
        return writes.size() == 2 && writes.begin()->second.first >= 2 && writes.rbegin()->second.first >= 2;
    });
    // A second member killed: no quorum. The agents cannot renew their leases: once the TTL
    // passed they stop their workers, find that the cluster grants no new lease, and end
    // naming the quorum; nothing of theirs runs on.
    etcd.kill(1);
    for (int node = 0; node < 2; ++node) {
        CAPTURE(node);
        const auto worker = worlds(j[node].out()).front();
        const int code = j[node].wait();
        INFO(j[node].err());
        CHECK(code == 250);
        CHECK(has(j[node].err(), "no quorum"));
        CHECK(world_support::ended(worker.pid));
        CHECK(worlds(j[node].out()).size() == 1);  // no restart when the first member went
    }

    // The members back: a job runs.
    etcd.restart(std::vector<int>{0, 1});
    (void)etcd.await_leader();
    job again(etcd, "again");
    again.nnodes = "1";
    auto& agent = again.start("*:world+exit0");
    const int again_code = agent.wait();
    INFO(agent.err());
    CHECK(again_code == 0);
    CHECK(worlds(agent.out()).size() == 1);
}

TEST_CASE("rendezvous etcd: an agent that cannot reach etcd, or reaches a server that is no etcd, ends naming it") {
    etcd_support::cluster etcd(1);
    {
        job j(etcd, "unreachable");
        j.nnodes = "1";
        j.endpoints = fmt::format("127.0.0.1:{}", agent_support::free_port());
        auto& agent = j.start("*:exit0");
        CHECK(agent.wait() != 0);
        CHECK(has(agent.err(), "cannot use the etcd cluster at http://127.0.0.1:"));
        CHECK(has(agent.err(), "cannot connect"));
    }
    {
        job j(etcd, "team/exp1");  // a prefix of another job's keys: refused
        j.nnodes = "1";
        auto& agent = j.start("*:exit0");
        CHECK(agent.wait() == 2);
        CHECK(has(agent.err(), "with etcd-v3 the id must not hold '/'"));
    }
    {
        job j(etcd, "tls-to-plain");
        j.nnodes = "1";
        j.conf = fmt::format("{},protocol=https", keep_alive);
        auto& agent = j.start("*:exit0");
        CHECK(agent.wait() != 0);
        CHECK(has(agent.err(), "the member ended the connection during the TLS handshake"));
        CHECK(has(agent.err(), "does it serve https"));
    }
}

TEST_CASE("rendezvous etcd: elasticrun status reads every agent's status from etcd") {
    etcd_support::cluster etcd(1);
    job j(etcd, "status");
    j.start("*:world+go+exit0");
    j.start("*:world+go+exit0");
    await_lines(j[0], "world 2 ");
    await_lines(j[1], "world 2 ");
    await_status(etcd, {0}, "status", [](const auto& writes) {
        int running = 0;
        for (const auto& [key, seen] : writes) running += has(seen.second, "\"state\":\"running\"") ? 1 : 0;
        return running == 2;
    });
    const std::vector<std::string> status{"status", "--json", "--rdzv-backend=etcd-v3",
                                          "--rdzv-endpoint=" + etcd.endpoints(), "--rdzv-id=status"};
    const auto r = agent_support::run(status, agent_support::clean_environment());
    INFO(r.err);
    REQUIRE(r.code == 0);
    const auto agents = nlohmann::json::parse(r.out);
    REQUIRE(agents.size() == 2);
    for (const auto& a : agents) {
        CHECK(a["state"] == "running");
        CHECK(a["run_id"] == "status");
    }
    j.go();
    CHECK(j[0].wait() == 0);
    CHECK(j[1].wait() == 0);
    // The job's keys went with its last agent: nothing to show.
    const auto after = agent_support::run(status, agent_support::clean_environment());
    CHECK(after.code == 1);
    CHECK(has(after.err, "no agent of run 'status' published its status in the etcd cluster at http://127.0.0.1:"));
}

TEST_CASE("rendezvous etcd: etcd-v3 in every spelling torchrun accepts, PET_ variables included, runs the job") {
    etcd_support::cluster etcd(1);
    for (int spelling = 0; spelling < 3; ++spelling) {
        CAPTURE(spelling);
        temp_dir dir;
        auto env = agent_support::worker_env(dir, "*:world+exit0");
        env["RDZV_TEST_NODE"] = "0";
        std::vector<std::string> args;
        const auto endpoint = etcd.endpoints();
        if (spelling == 0) args = {"--rdzv-backend=etcd-v3", "--rdzv-endpoint=" + endpoint};
        if (spelling == 1) args = {"--rdzv_backend", "etcd-v3", "--rdzv_endpoint", endpoint};
        if (spelling == 2) {
            env["PET_RDZV_BACKEND"] = "etcd-v3";
            env["PET_RDZV_ENDPOINT"] = endpoint;
        }
        args.push_back(fmt::format("--rdzv-id=spelling{}", spelling));
        const auto r = agent_support::run(agent_support::with_worker(args), env);
        INFO(r.err);
        CHECK(r.code == 0);
        CHECK(worlds(r.out).size() == 1);
    }
    CHECK(keys_left(etcd) == 0);
}

TEST_CASE("rendezvous etcd: PyTorch DDP (gloo) across two agents, all_reduce correct, also after a restart") {
    etcd_support::cluster etcd(1);
    job j(etcd, "ddp");
    j.nproc = 2;
    for (int node = 0; node < 2; ++node) {
        j.start("", {"--max-restarts=1", ELASTIC_TEST_SOURCE_DIR "/tests/agent/ddp_worker.py"},
                {{"PYTHON_EXEC", ELASTIC_TORCH_PYTHON}, {"DDP_FAIL_RANK", "2"}});
    }
    std::string out;
    for (int node = 0; node < 2; ++node) {
        const int code = j[node].wait();
        INFO(j[node].err());
        CHECK(code == 0);
        out += j[node].out();
    }
    INFO(out);
    for (int rank = 0; rank < 4; ++rank) {
        CHECK(has(out, fmt::format("ddp rank={} world=4 attempt=1 sum=10 expected=10 same=True\n", rank)));
    }
    CHECK(launched::count_lines(out, "ddp ") == 4);
}
