// Several real elasticrun agents (processes) on loopback: the c10d and static rendezvous,
// ranks, job-wide restarts, the stop decision, the exit barrier, PyTorch DDP across agents.
#include "agent_support.hpp"

#include <elastic/launch/values.hpp>
#include <elastic/rendezvous/tcp_rendezvous.hpp>
#include <elastic/store/blocking_client.hpp>

#include <doctest/doctest.h>

#include <fmt/format.h>

#include <chrono>
#include <cstdint>
#include <csignal>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

namespace test_rendezvous_agents {

using agent_support::launched;
using agent_support::temp_dir;

using agent_support::free_port;

std::map<std::string, std::string> node_env(const temp_dir& dir, const std::string& rules, int node) {
    auto env = agent_support::clean_environment();
    env["AGENT_WORKER_DIR"] = dir.str();
    env["AGENT_WORKER_DO"] = rules;
    env["RDZV_TEST_NODE"] = std::to_string(node);
    env["LOGLEVEL"] = "WARNING";
    env["XDG_RUNTIME_DIR"] = dir.str();  // the job's own status files and moved-store record
    return env;
}

struct job {
    std::vector<std::unique_ptr<launched>> agents;
    std::vector<int> codes;

    void start(const std::vector<std::string>& args, const std::map<std::string, std::string>& env) {
        agents.push_back(std::make_unique<launched>(args, env));
    }
    void wait_all() {
        for (auto& a : agents) codes.push_back(a->wait());
    }
};

using agent_support::with_worker;

std::vector<std::string> c10d_args(int port, int nnodes, int nproc, const std::string& id) {
    return {"--rdzv-backend=c10d", fmt::format("--rdzv-endpoint=127.0.0.1:{}", port), fmt::format("--rdzv-id={}", id),
            fmt::format("--nnodes={}", nnodes), fmt::format("--nproc-per-node={}", nproc)};
}

/// Starts a two-node c10d job `id` on `port` in `j`: node 0 hosts the store, each node gets
/// `--rdzv-conf=<conf>,is_host=...` and its workers run `rules`.
void start_pair(job& j, const temp_dir& dir, int port, const std::string& id, const std::string& conf,
                const std::string& rules) {
    for (int node = 0; node < 2; ++node) {
        auto args = c10d_args(port, 2, 1, id);
        args.push_back(fmt::format("--node-rank={}", node));
        args.push_back(fmt::format("--rdzv-conf={},is_host={}", conf, node == 0));
        j.start(with_worker(args), node_env(dir, rules, node));
    }
}

/// Reads `host`'s stderr until it says it stays for nodes still working; false if it ended first.
bool says_it_stays(launched& host) {
    return host.read_err_until([](const std::string& err) {
        return err.find("it stays until they finish or leave") != std::string::npos;
    });
}

/// Every env.<attempt>.<rank> file of one attempt, by rank.
std::map<int, std::map<std::string, std::string>> envs_of(const temp_dir& dir, int attempt, int world) {
    std::map<int, std::map<std::string, std::string>> out;
    for (int r = 0; r < world; ++r) {
        auto e = agent_support::read_env_file(dir.path() / fmt::format("env.{}.{}", attempt, r));
        if (!e.empty()) out[r] = std::move(e);
    }
    return out;
}

/// The contract over the whole job: distinct ranks, consistent sizes, one MASTER for all.
void check_job_env(const std::map<int, std::map<std::string, std::string>>& envs, int nnodes, int nproc, int attempt) {
    const int world = nnodes * nproc;
    REQUIRE(static_cast<int>(envs.size()) == world);
    std::set<std::pair<int, int>> group_local;
    std::map<int, std::string> node_of_group;
    for (const auto& entry : envs) {
        const int rank = entry.first;
        const auto& e = entry.second;
        CAPTURE(rank);
        CHECK(e.at("RANK") == std::to_string(rank));
        CHECK(e.at("WORLD_SIZE") == std::to_string(world));
        CHECK(e.at("LOCAL_WORLD_SIZE") == std::to_string(nproc));
        CHECK(e.at("GROUP_WORLD_SIZE") == std::to_string(nnodes));
        CHECK(e.at("ROLE_WORLD_SIZE") == std::to_string(world));
        CHECK(e.at("ROLE_RANK") == std::to_string(rank));
        CHECK(e.at("TORCHELASTIC_RESTART_COUNT") == std::to_string(attempt));
        const int group = std::stoi(e.at("GROUP_RANK"));
        const int local = std::stoi(e.at("LOCAL_RANK"));
        CHECK(rank == group * nproc + local);
        group_local.emplace(group, local);
        // One node: one agent.
        const auto [it, fresh] = node_of_group.emplace(group, e.at("RDZV_TEST_NODE"));
        if (!fresh) CHECK(it->second == e.at("RDZV_TEST_NODE"));
        CHECK(e.at("MASTER_ADDR") == envs.begin()->second.at("MASTER_ADDR"));
        CHECK(e.at("MASTER_PORT") == envs.begin()->second.at("MASTER_PORT"));
    }
    CHECK(static_cast<int>(group_local.size()) == world);
    std::set<std::string> nodes;
    for (const auto& [g, n] : node_of_group) nodes.insert(n);
    CHECK(static_cast<int>(nodes.size()) == nnodes);
}

TEST_CASE("rendezvous agents: c10d with 2, 4 and 8 agents gives every worker consistent, distinct ranks") {
    for (const auto& size : std::vector<std::pair<int, int>>{{2, 2}, {4, 1}, {8, 1}}) {
        const int nnodes = size.first;
        const int nproc = size.second;
        CAPTURE(nnodes);
        temp_dir dir;
        const int port = free_port();
        job j;
        // "store": every worker reaches MASTER_ADDR:MASTER_PORT (group rank 0's store).
        for (int node = 0; node < nnodes; ++node) {
            j.start(with_worker(c10d_args(port, nnodes, nproc, "ranks")), node_env(dir, "*:store+env", node));
        }
        j.wait_all();
        for (std::size_t i = 0; i < j.agents.size(); ++i) {
            INFO(j.agents[i]->err());
            CHECK(j.codes[i] == 0);
        }
        check_job_env(envs_of(dir, 0, nnodes * nproc), nnodes, nproc, 0);
    }
}

TEST_CASE("rendezvous agents: a node that waits for the others says how many joined and how long it still waits") {
    temp_dir dir;
    const int port = free_port();
    job j;
    auto args = c10d_args(port, 2, 1, "progress");
    args.push_back("--rdzv-conf=join_timeout=60");  // a regression fails within a minute, not ten
    j.start(with_worker(args), node_env(dir, "*:env", 0));
    // Alone, it is not silent until its join timeout: the line comes 5 s in (read as it comes).
    const bool said = j.agents[0]->read_err_until([](const std::string& err) {
        return err.find("round 0 of run 'progress': 1 of the 2 nodes needed (--nnodes=2) joined; waiting up to ") !=
               std::string::npos;
    });
    INFO(j.agents[0]->err());
    REQUIRE(said);
    CHECK(j.agents[0]->err().find("(the join timeout) for the rest") != std::string::npos);
    j.start(with_worker(args), node_env(dir, "*:env", 1));
    j.wait_all();
    for (std::size_t i = 0; i < j.agents.size(); ++i) {
        INFO(j.agents[i]->err());
        CHECK(j.codes[i] == 0);
    }
}

TEST_CASE("rendezvous agents: with a --role per agent, ROLE_RANK and ROLE_WORLD_SIZE count within each role") {
    // Three agents of two workers: two trainers, one reader, in whatever group ranks they get.
    const std::vector<std::string> roles{"trainer", "reader", "trainer"};
    const int nproc = 2;
    const int world = static_cast<int>(roles.size()) * nproc;
    temp_dir dir;
    const int port = free_port();
    job j;
    for (std::size_t node = 0; node < roles.size(); ++node) {
        auto args = c10d_args(port, static_cast<int>(roles.size()), nproc, "roles");
        args.push_back("--role=" + roles[node]);
        j.start(with_worker(args), node_env(dir, "*:env", static_cast<int>(node)));
    }
    j.wait_all();
    for (std::size_t i = 0; i < j.agents.size(); ++i) {
        INFO(j.agents[i]->err());
        CHECK(j.codes[i] == 0);
    }
    const auto envs = envs_of(dir, 0, world);
    REQUIRE(static_cast<int>(envs.size()) == world);
    // torchrun's rule: a worker's role rank is the number of workers of its role with a lower
    // global rank; the role's world size, how many there are.
    std::map<std::string, int> seen;
    std::map<std::string, int> role_size{{"trainer", 4}, {"reader", 2}};
    for (const auto& entry : envs) {   // by global rank
        const int rank = entry.first;  // not a structured binding: CAPTURE's lambda
        const auto& e = entry.second;
        CAPTURE(rank);
        const std::string& role = e.at("ROLE_NAME");
        REQUIRE(role_size.count(role) == 1);
        CHECK(e.at("ROLE_RANK") == std::to_string(seen[role]++));
        CHECK(e.at("ROLE_WORLD_SIZE") == std::to_string(role_size[role]));
        CHECK(e.at("WORLD_SIZE") == std::to_string(world));
        // A node's workers share a role.
        CHECK(role == roles.at(static_cast<std::size_t>(std::stoi(e.at("RDZV_TEST_NODE")))));
    }
    CHECK(seen == role_size);
}

/// A socket bound to 127.0.0.1:port that never listens: the port is taken, and nothing serves it.
class held_port {
public:
    explicit held_port(int port) : fd_(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
        REQUIRE(fd_ >= 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        a.sin_port = htons(static_cast<std::uint16_t>(port));
        REQUIRE(::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    }
    held_port(const held_port&) = delete;
    held_port& operator=(const held_port&) = delete;
    ~held_port() { release(); }
    void release() {
        if (fd_ >= 0) ::close(fd_);
        fd_ = -1;
    }

private:
    int fd_;
};

TEST_CASE("rendezvous agents: the endpoint's port held by a program that does not listen, the agents here bind and "
          "dial in turn, and one hosts once the port is free") {
    temp_dir dir;
    const int port = free_port();
    held_port holder(port);
    job j;
    for (int node = 0; node < 2; ++node) {
        j.start(with_worker(c10d_args(port, 2, 1, "held")), node_env(dir, "*:env", node));
    }
    // Both agents find the port taken and nothing serving it.
    for (auto& a : j.agents) {
        REQUIRE(a->read_err_until([](const std::string& err) {
            return err.find("and nothing accepts connections there: this agent binds it again") != std::string::npos;
        }));
    }
    holder.release();
    j.wait_all();
    int hosts = 0;
    for (std::size_t i = 0; i < j.agents.size(); ++i) {
        INFO(j.agents[i]->err());
        CHECK(j.codes[i] == 0);
        if (j.agents[i]->err().find("this agent hosts it after all") != std::string::npos) ++hosts;
    }
    CHECK(hosts == 1);
    check_job_env(envs_of(dir, 0, 2), 2, 1, 0);
}

TEST_CASE("rendezvous agents: the endpoint's port held for good by a program that does not listen, every agent "
          "names it and exits at the join timeout, with no worker started") {
    temp_dir dir;
    const int port = free_port();
    held_port holder(port);
    auto args = c10d_args(port, 2, 1, "held");
    args.push_back("--rdzv-conf=join_timeout=3");
    job j;
    for (int node = 0; node < 2; ++node) j.start(with_worker(args), node_env(dir, "*:env", node));
    j.wait_all();
    for (std::size_t i = 0; i < j.agents.size(); ++i) {
        const auto& err = j.agents[i]->err();
        INFO(err);
        CHECK(j.codes[i] == 250);
        CHECK(err.find(fmt::format("a program on this host holds port {} without listening on it", port)) !=
              std::string::npos);
    }
    CHECK(envs_of(dir, 0, 2).empty());
}

TEST_CASE("rendezvous agents: static honours --node-rank, and --nnodes=2:2 with a long last call starts at once") {
    temp_dir dir;
    const int port = free_port();
    job j;
    const std::vector<int> ranks{2, 0, 1};
    for (std::size_t node = 0; node < ranks.size(); ++node) {
        j.start(with_worker({"--nnodes=3", fmt::format("--node-rank={}", ranks[node]), "--master-addr=127.0.0.1",
                             fmt::format("--master-port={}", port), "--nproc-per-node=2"}),
                node_env(dir, "*:store+env", static_cast<int>(node)));
    }
    j.wait_all();
    for (std::size_t i = 0; i < j.agents.size(); ++i) {
        INFO(j.agents[i]->err());
        CHECK(j.codes[i] == 0);
    }
    const auto envs = envs_of(dir, 0, 6);
    check_job_env(envs, 3, 2, 0);
    for (const auto& entry : envs) {
        const auto& e = entry.second;
        const auto node = static_cast<std::size_t>(std::stoi(e.at("RDZV_TEST_NODE")));
        CHECK(e.at("GROUP_RANK") == std::to_string(ranks[node]));
        // The workers' store is group rank 0's own, not the rendezvous store's --master-port.
        CHECK(e.at("MASTER_PORT") != std::to_string(port));
    }

    temp_dir dir2;
    const int port2 = free_port();
    job k;
    for (int node = 0; node < 2; ++node) {
        auto args = c10d_args(port2, 2, 1, "lastcall");
        args[3] = "--nnodes=2:2";
        args.push_back("--rdzv-conf=last_call_timeout=3600");
        k.start(with_worker(args), node_env(dir2, "*:env", node));
    }
    k.wait_all();
    CHECK(k.codes == std::vector<int>{0, 0});
    check_job_env(envs_of(dir2, 0, 2), 2, 1, 0);
}

TEST_CASE("rendezvous agents: a worker failure on node 1 of 3 restarts all three groups, counts equal everywhere") {
    temp_dir dir;
    const int port = free_port();
    job j;
    // Attempt 0: rank 1 fails, the others run until they are stopped. Attempt 1: all succeed,
    // each in a fresh store (the "store" step fails on a key left by attempt 0).
    const std::string rules = "a0r1:store+exit3;a0:store+hang;*:store+env";
    for (int node = 0; node < 3; ++node) {
        auto args = c10d_args(port, 3, 1, "restart");
        args.push_back("--max-restarts=2");
        j.start(with_worker(args), node_env(dir, rules, node));
    }
    j.wait_all();
    for (std::size_t i = 0; i < j.agents.size(); ++i) {
        INFO(j.agents[i]->err());
        CHECK(j.codes[i] == 0);
        CHECK(j.agents[i]->err().find("restarting every node's worker group (job-wide restart 1)") !=
              std::string::npos);
        CHECK(j.agents[i]->err().find("exited with code 3") != std::string::npos);
    }
    check_job_env(envs_of(dir, 1, 3), 3, 1, 1);
    CHECK(envs_of(dir, 2, 3).empty());
}

TEST_CASE("rendezvous agents: with no restart left, every node stops with the root cause's exit code") {
    temp_dir dir;
    const int port = free_port();
    job j;
    for (int node = 0; node < 2; ++node) {
        j.start(with_worker(c10d_args(port, 2, 1, "stop")), node_env(dir, "r1:exit7;*:hang", node));
    }
    j.wait_all();
    for (std::size_t i = 0; i < j.agents.size(); ++i) {
        INFO(j.agents[i]->err());
        CHECK(j.codes[i] == 7);
        CHECK(j.agents[i]->err().find("stopping the job") != std::string::npos);
    }
}

TEST_CASE("rendezvous agents: the exit barrier's timeout names the missing node, and the store's host stays for it") {
    temp_dir dir;
    const int port = free_port();
    job j;
    start_pair(j, dir, port, "barrier", "exit_barrier_timeout=1,close_timeout=1", "r1:running+go;r0:running");
    // Node 0 (the store's host) finishes, waits 1 s for node 1 and names it; then, past
    // close_timeout, it keeps the store for node 1, which is still working.
    REQUIRE(says_it_stays(*j.agents[0]));
    CHECK(j.agents[0]->err().find("exit barrier: this node's workers succeeded, but group_rank 1 (") !=
          std::string::npos);
    CHECK(j.agents[0]->err().find("did not finish within 1 s") != std::string::npos);
    CHECK(j.agents[0]->err().find("which 1 other node of the job still uses") != std::string::npos);
    // Node 1's worker finishes; node 1 leaves with 0, and node 0 with it.
    std::ofstream(dir.path() / "go") << "go\n";
    for (std::size_t node = 0; node < 2; ++node) {
        CAPTURE(node);
        const int code = j.agents[node]->wait();
        INFO(j.agents[node]->err());
        CHECK(code == 0);
        CHECK(j.agents[node]->err().find("lost the rendezvous store") == std::string::npos);
    }
}

TEST_CASE("rendezvous agents: a node that finished and left is no lost member, the others run to their end") {
    temp_dir dir;
    const int port = free_port();
    job j;
    // A short join timeout bounds the wrong outcome (node 0 re-forming a round alone).
    start_pair(j, dir, port, "finished", "exit_barrier_timeout=1,join_timeout=5", "r0:running+go;r1:running");
    // Node 1's worker succeeds at once; node 1 waits 1 s at the exit barrier for node 0, names
    // it, and leaves with 0.
    const int code1 = j.agents[1]->wait();
    INFO(j.agents[1]->err());
    CHECK(code1 == 0);
    CHECK(j.agents[1]->err().find("did not finish within 1 s") != std::string::npos);
    // Only now does node 0's worker finish: it was never stopped, and node 0 ends with 0.
    std::ofstream(dir.path() / "go") << "go\n";
    const int code0 = j.agents[0]->wait();
    INFO(j.agents[0]->err());
    CHECK(code0 == 0);
    CHECK(j.agents[0]->err().find("left after its workers succeeded") != std::string::npos);
    CHECK(j.agents[0]->err().find("was lost") == std::string::npos);
    CHECK(launched::count_lines(j.agents[0]->out(), "running 0 0 ") == 1);  // one run of its worker
}

TEST_CASE("rendezvous agents: with exit_barrier_timeout=0 a finished node leaves at once, the store's host last, and "
          "the others run to their end") {
    // first: the node whose worker succeeds at once (node 0 hosts the store).
    for (const int first : {1, 0}) {
        CAPTURE(first);
        temp_dir dir;
        const int port = free_port();
        job j;
        const int other = 1 - first;
        start_pair(j, dir, port, "nobarrier", "exit_barrier_timeout=0,join_timeout=5",
                   fmt::format("r{}:running+go;r{}:running", other, first));
        if (first == 1) {
            // No wait at the barrier: node 1 leaves with 0 while node 0's worker still runs.
            const int code = j.agents[1]->wait();
            INFO(j.agents[1]->err());
            CHECK(code == 0);
            CHECK(j.agents[1]->err().find("did not finish within") == std::string::npos);
        } else {
            // The store's host does not take the store away from a node still working: it says
            // so and waits for node 1 to leave.
            REQUIRE(says_it_stays(*j.agents[0]));
        }
        std::ofstream(dir.path() / "go") << "go\n";
        for (auto& agent : j.agents) {
            const int code = agent->wait();
            INFO(agent->err());
            CHECK(code == 0);
            CHECK(agent->err().find("was lost") == std::string::npos);
            CHECK(agent->err().find("lost the rendezvous store") == std::string::npos);
        }
        CHECK(launched::count_lines(j.agents[static_cast<std::size_t>(other)]->out(),
                                    fmt::format("running 0 {} ", other)) == 1);  // one run of its worker
    }
}

TEST_CASE("rendezvous agents: SIGTERM ends a store's host that stays for a node still working") {
    temp_dir dir;
    const int port = free_port();
    job j;
    start_pair(j, dir, port, "staying", "exit_barrier_timeout=0", "r1:running+go;r0:running");
    REQUIRE(says_it_stays(*j.agents[0]));
    j.agents[0]->signal(SIGTERM);
    const int code0 = j.agents[0]->wait();
    INFO(j.agents[0]->err());
    CHECK(code0 == 128 + SIGTERM);
    CHECK(j.agents[0]->err().find("this node's workers succeeded; SIGTERM received while leaving the job (the "
                                  "rendezvous store hosted here may still serve other nodes): stopping") !=
          std::string::npos);
    // Node 1, still working, loses the store (a fixed-size job cannot move it) and stops.
    const int code1 = j.agents[1]->wait();
    INFO(j.agents[1]->err());
    CHECK(code1 != 0);
    CHECK(j.agents[1]->err().find("lost the rendezvous store") != std::string::npos);
    // It tried the store again before it gave up, and says what that found.
    CHECK(j.agents[1]->err().find("reconnecting to it within") != std::string::npos);
}

TEST_CASE("rendezvous agents: a store's host staying for a node ends when that node is killed") {
    temp_dir dir;
    const int port = free_port();
    job j;
    start_pair(j, dir, port, "killed", "exit_barrier_timeout=0", "r1:running+go;r0:running");
    REQUIRE(says_it_stays(*j.agents[0]));
    // The node it stays for dies without a word: its lease ends (keep-alive), and with it the stay.
    j.agents[1]->signal(SIGKILL);
    CHECK(j.agents[1]->wait() == 128 + SIGKILL);
    const int code0 = j.agents[0]->wait();
    INFO(j.agents[0]->err());
    CHECK(code0 == 0);
}

TEST_CASE("rendezvous agents: a failure after the store's host finished re-forms the others without it") {
    temp_dir dir;
    const int port = free_port();
    job j;
    // Node 0 hosts the store and its worker succeeds at once; node 1's fails on the word go,
    // node 2's runs until stopped; in the next attempt both succeed.
    const std::vector<std::string> rules{"*:running", "a0:running+go+exit3;*:running", "a0:hang;*:running"};
    for (int node = 0; node < 3; ++node) {
        auto args = c10d_args(port, 3, 1, "reform");
        args[3] = "--nnodes=2:3";
        args.push_back(fmt::format("--node-rank={}", node));
        args.push_back("--max-restarts=1");
        args.push_back(fmt::format(
            "--rdzv-conf=exit_barrier_timeout=0,close_timeout=2,last_call_timeout=1,join_timeout=30,is_host={}",
            node == 0));
        j.start(with_worker(args), node_env(dir, rules[static_cast<std::size_t>(node)], node));
    }
    REQUIRE(j.agents[0]->read_err_until([](const std::string& err) {
        return err.find("which 2 other nodes of the job still use: it stays until they finish or leave") !=
               std::string::npos;
    }));
    std::ofstream(dir.path() / "go") << "go\n";
    // The failure's abort ends the host's stay: it leaves after close_timeout, so its live lease
    // does not hold back the round the two others form without it.
    j.wait_all();
    for (std::size_t node = 0; node < 3; ++node) {
        CAPTURE(node);
        INFO(j.agents[node]->err());
        CHECK(j.codes[node] == 0);
    }
    for (std::size_t node = 1; node < 3; ++node) {
        CAPTURE(node);
        CHECK(launched::count_lines(j.agents[node]->out(), "running 1 ") == 1);  // attempt 1, world 2
    }
    CHECK(launched::count_lines(j.agents[0]->out(), "running 1 ") == 0);
}

TEST_CASE("rendezvous agents: a join timeout ends the lone agent with exit 250 and names how many joined") {
    temp_dir dir;
    const int port = free_port();
    job j;
    auto args = c10d_args(port, 2, 1, "lonely");
    args.push_back("--rdzv-conf=join_timeout=1,is_host=true");
    j.start(with_worker(args), node_env(dir, "", 0));
    const int code = j.agents[0]->wait();
    INFO(j.agents[0]->err());
    CHECK(code == 250);
    CHECK(j.agents[0]->err().find("1 of 2 nodes joined within the join timeout (1 s)") != std::string::npos);
}

// A secret file of mode 0600 in `dir`.
std::string write_secret(const temp_dir& dir, const std::string& name, const std::string& secret) {
    const auto path = (dir.path() / name).string();
    std::ofstream(path) << secret << "\n";
    REQUIRE(::chmod(path.c_str(), 0600) == 0);
    return path;
}

elastic::store_client_options stranger(int port, std::optional<std::string> secret) {
    elastic::store_client_options o;
    o.host = "127.0.0.1";
    o.port = static_cast<std::uint16_t>(port);
    o.dialect = elastic::client_dialect::legacy;
    o.secret = std::move(secret);
    o.connect_timeout = std::chrono::seconds(120);  // retried (refused) until the host listens
    o.timeout = std::chrono::seconds(120);
    return o;
}

TEST_CASE("rendezvous agents: the job's secret comes from secret_file or ELASTIC_RDZV_SECRET, never reaches workers") {
    temp_dir dir;
    std::vector<std::string> warnings;
    const auto warn = [&](std::string_view line) { warnings.emplace_back(line); };
    // A file: trailing line breaks stripped; the variable is removed from the environment even
    // though the file wins.
    {
        elastic::rendezvous_settings c;
        c.secret_file = write_secret(dir, "s1", "abc\r");
        elastic::environment env{{"ELASTIC_RDZV_SECRET", "from-env"}, {"PATH", "/bin"}};
        elastic::load_rendezvous_secret(c, env, warn);
        CHECK(c.secret == std::optional<std::string>("abc"));
        CHECK(env.count("ELASTIC_RDZV_SECRET") == 0);
        CHECK(env.count("PATH") == 1);
        CHECK(warnings.empty());
    }
    // The variable alone.
    {
        elastic::rendezvous_settings c;
        elastic::environment env{{"ELASTIC_RDZV_SECRET", "from-env"}};
        elastic::load_rendezvous_secret(c, env, warn);
        CHECK(c.secret == std::optional<std::string>("from-env"));
        CHECK(env.empty());
    }
    // Neither: no secret.
    {
        elastic::rendezvous_settings c;
        elastic::environment env;
        elastic::load_rendezvous_secret(c, env, warn);
        CHECK(!c.secret);
    }
    // A file others may read: a warning naming it and chmod 600.
    {
        elastic::rendezvous_settings c;
        const auto path = write_secret(dir, "s2", "abc");
        REQUIRE(::chmod(path.c_str(), 0644) == 0);
        c.secret_file = path;
        elastic::environment env;
        elastic::load_rendezvous_secret(c, env, warn);
        REQUIRE(warnings.size() == 1);
        CHECK(warnings[0].find(path) != std::string::npos);
        CHECK(warnings[0].find("mode 0644); chmod 600") != std::string::npos);
    }
    // Empty secrets, and a missing file, are usage errors.
    {
        elastic::rendezvous_settings c;
        c.secret_file = write_secret(dir, "s3", "");
        elastic::environment env;
        CHECK_THROWS_WITH_AS(elastic::load_rendezvous_secret(c, env, warn), doctest::Contains("the file is empty"),
                             elastic::usage_error);
        c.secret_file = (dir.path() / "missing").string();
        CHECK_THROWS_WITH_AS(elastic::load_rendezvous_secret(c, env, warn), doctest::Contains("cannot read it"),
                             elastic::usage_error);
        elastic::rendezvous_settings d;
        elastic::environment empty{{"ELASTIC_RDZV_SECRET", ""}};
        CHECK_THROWS_WITH_AS(elastic::load_rendezvous_secret(d, empty, warn),
                             doctest::Contains("ELASTIC_RDZV_SECRET is set but empty"), elastic::usage_error);
    }
    // --rdzv-conf reads secret_file for static and c10d, not etcd-v3.
    CHECK(elastic::parse_rendezvous_settings("secret_file=/x", "--rdzv-conf", elastic::rendezvous_backend::c10d)
              .secret_file == std::optional<std::string>("/x"));
    CHECK(elastic::parse_rendezvous_settings("secret_file=/x", "--rdzv-conf", elastic::rendezvous_backend::static_)
              .secret_file == std::optional<std::string>("/x"));
    CHECK_THROWS_AS((void)elastic::parse_rendezvous_settings("secret_file=/x", "--rdzv-conf",
                                                             elastic::rendezvous_backend::etcd_v3),
                    elastic::usage_error);
}

TEST_CASE("rendezvous agents: a job with a secret completes, strangers at its rendezvous port are refused") {
    temp_dir dir;
    const int port = free_port();
    const auto secret_file = write_secret(dir, "secret", "correct horse battery staple");
    job j;
    // The host reads the secret from a file; the other agent from ELASTIC_RDZV_SECRET.
    auto host = c10d_args(port, 2, 1, "secret");
    host.push_back("--rdzv-conf=is_host=true,secret_file=" + secret_file);
    j.start(with_worker(host), node_env(dir, "*:env", 0));
    // While the host waits for the second node: a client without the secret, and one with
    // another secret, are both turned away, and neither reads nor writes a key. (The first
    // connects once the host listens, so the second node, started after, cannot host.)
    {
        elastic::blocking_store_client raw(stranger(port, std::nullopt));
        CHECK_THROWS_WITH_AS(raw.get("/rdzv/secret/keep_alive"), doctest::Contains("closed the connection"),
                             elastic::store_error);
        elastic::blocking_store_client wrong(stranger(port, std::string("guess")));
        CHECK_THROWS_WITH_AS(wrong.set("/rdzv/secret/abort", "forged"),
                             doctest::Contains("the server was given another secret"), elastic::store_auth_error);
    }
    auto env = node_env(dir, "*:env", 1);
    env["ELASTIC_RDZV_SECRET"] = "correct horse battery staple";
    j.start(with_worker(c10d_args(port, 2, 1, "secret")), env);
    j.wait_all();
    for (std::size_t i = 0; i < j.agents.size(); ++i) {
        INFO(j.agents[i]->err());
        CHECK(j.codes[i] == 0);
        CHECK(j.agents[i]->err().find("accepts any client") == std::string::npos);
    }
    const auto envs = envs_of(dir, 0, 2);
    REQUIRE(envs.size() == 2);
    for (const auto& entry : envs) {
        const int rank = entry.first;  // not a structured binding: clang 14 cannot capture one
        CAPTURE(rank);
        CHECK(entry.second.count("ELASTIC_RDZV_SECRET") == 0);  // the workers never see the secret
    }
    // The host's store said whom it refused and why.
    const auto& log = j.agents[0]->err();
    CHECK(log.find("closing connection from 127.0.0.1:") != std::string::npos);
    CHECK(log.find("authentication failed: it sent a TCPStore request of the PyTorch 1.13 dialect") !=
          std::string::npos);
    CHECK(log.find("after this server's challenge") != std::string::npos);
}

TEST_CASE("rendezvous agents: an agent with the wrong secret exits 250 naming the secret, the job goes on") {
    temp_dir dir;
    const int port = free_port();
    const auto secret_file = write_secret(dir, "secret", "right");
    const auto wrong_file = write_secret(dir, "wrong", "wrong");
    job j;
    auto host = c10d_args(port, 2, 1, "wrong-secret");
    host.push_back("--rdzv-conf=is_host=true,secret_file=" + secret_file);
    j.start(with_worker(host), node_env(dir, "", 0));
    // The host listens (a client of the right secret is let in) before the others start, and
    // they are told not to host: otherwise the intruder could bind the port first.
    {
        elastic::blocking_store_client probe(stranger(port, std::string("right")));
        CHECK_NOTHROW(probe.connect());
    }
    auto intruder = c10d_args(port, 2, 1, "wrong-secret");
    intruder.push_back("--rdzv-conf=is_host=false,secret_file=" + wrong_file);
    launched bad(with_worker(intruder), node_env(dir, "", 1));
    const int code = bad.wait();
    INFO(bad.err());
    CHECK(code == 250);
    CHECK(bad.err().find(fmt::format("the rendezvous store at 127.0.0.1:{} and this node do not share the job's "
                                     "secret",
                                     port)) != std::string::npos);
    CHECK(bad.err().find("--rdzv-conf secret_file=PATH, or ELASTIC_RDZV_SECRET") != std::string::npos);
    // The right node still completes the job with the host.
    auto good = c10d_args(port, 2, 1, "wrong-secret");
    good.push_back("--rdzv-conf=is_host=false,secret_file=" + secret_file);
    j.start(with_worker(good), node_env(dir, "", 2));
    j.wait_all();
    for (std::size_t i = 0; i < j.agents.size(); ++i) {
        INFO(j.agents[i]->err());
        CHECK(j.codes[i] == 0);
    }
}

TEST_CASE("rendezvous agents: a multi-node job without a secret warns once, naming the port") {
    temp_dir dir;
    const int port = free_port();
    job j;
    for (int node = 0; node < 2; ++node) j.start(with_worker(c10d_args(port, 2, 1, "open")), node_env(dir, "", node));
    j.wait_all();
    for (std::size_t i = 0; i < j.agents.size(); ++i) {
        const auto& err = j.agents[i]->err();
        INFO(err);
        CHECK(j.codes[i] == 0);
        const auto warning = fmt::format("(port {}) accepts any client", port);
        const auto at = err.find(warning);
        CHECK(at != std::string::npos);
        CHECK(err.find(warning, at + 1) == std::string::npos);
    }
}

TEST_CASE("rendezvous agents: PyTorch DDP (gloo) across two agents, all_reduce correct, also after a restart") {
    temp_dir dir;
    const int port = free_port();
    job j;
    for (int node = 0; node < 2; ++node) {
        auto env = node_env(dir, "", node);
        env["PYTHON_EXEC"] = ELASTIC_TORCH_PYTHON;
        env["DDP_FAIL_RANK"] = "2";
        auto args = c10d_args(port, 2, 2, "ddp");
        args.push_back("--max-restarts=1");
        args.push_back(ELASTIC_TEST_SOURCE_DIR "/tests/agent/ddp_worker.py");
        j.start(args, env);
    }
    j.wait_all();
    std::string out;
    for (std::size_t i = 0; i < j.agents.size(); ++i) {
        INFO(j.agents[i]->err());
        CHECK(j.codes[i] == 0);
        out += j.agents[i]->out();
    }
    INFO(out);
    for (int rank = 0; rank < 4; ++rank) {
        CHECK(out.find(fmt::format("ddp rank={} world=4 attempt=1 sum=10 expected=10 same=True\n", rank)) !=
              std::string::npos);
    }
    CHECK(launched::count_lines(out, "ddp ") == 4);
}

}  // namespace test_rendezvous_agents
