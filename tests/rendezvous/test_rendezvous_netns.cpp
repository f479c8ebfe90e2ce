// Two hosts in network namespaces this test creates itself, joined by a veth pair: a real
// partition (the link cut) between the store's host and the other agent, with elastic membership;
// and an agent cut off from the etcd cluster of an etcd-v3 job.
//
// Needs root and iproute2's `ip` (CI runs as root). Without either, every case says so with a
// doctest MESSAGE and asserts nothing else: namespaces cannot be made without CAP_SYS_ADMIN, and
// a test that fails for want of privileges would only teach people to ignore it. Everything a
// case creates (two namespaces, the veth pair inside them, the processes started in them) is
// removed by an RAII guard, also when a REQUIRE fails or something throws, and by a sentinel
// process when the test process itself is killed (ctest's timeout).
#include "agent_support.hpp"
#include "etcd_support.hpp"

#include <doctest/doctest.h>

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

namespace test_rendezvous_netns {

using agent_support::launched;
using agent_support::temp_dir;

/// iproute2's `ip`: /usr/sbin/ip, else the first `ip` on PATH; empty when there is none.
std::optional<std::string> find_ip() {
    std::vector<std::string> candidates{"/usr/sbin/ip", "/sbin/ip"};
    if (const char* path = std::getenv("PATH")) {
        std::istringstream dirs(path);
        for (std::string dir; std::getline(dirs, dir, ':');) {
            if (!dir.empty()) candidates.push_back(dir + "/ip");
        }
    }
    for (const auto& c : candidates) {
        if (::access(c.c_str(), X_OK) == 0) return c;
    }
    return std::nullopt;
}

struct command_result {
    int code = -1;       ///< exit code, 128+N for signal N, -1 when it could not be started
    std::string output;  ///< stdout and stderr together
};

/// Runs `program args...` (posix_spawn, no shell: the arguments reach it as they are) to its end.
/// Asserts nothing, so the namespace guard's destructor can use it too.
command_result run_command(const std::string& program, const std::vector<std::string>& args) noexcept {
    command_result result;
    try {
        int pipe_fds[2];
        if (::pipe2(pipe_fds, O_CLOEXEC) != 0) {
            result.output = fmt::format("pipe2: {}", std::strerror(errno));
            return result;
        }
        posix_spawn_file_actions_t actions;
        posix_spawn_file_actions_init(&actions);
        posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], 1);
        posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], 2);
        std::vector<std::string> argv_strings{program};
        argv_strings.insert(argv_strings.end(), args.begin(), args.end());
        std::vector<char*> argv;
        for (auto& a : argv_strings) argv.push_back(a.data());
        argv.push_back(nullptr);
        pid_t pid = -1;
        const int rc = ::posix_spawn(&pid, program.c_str(), &actions, nullptr, argv.data(), environ);
        posix_spawn_file_actions_destroy(&actions);
        ::close(pipe_fds[1]);
        if (rc != 0) {
            ::close(pipe_fds[0]);
            result.output = fmt::format("posix_spawn {}: {}", program, std::strerror(rc));
            return result;
        }
        char buffer[4096];
        for (;;) {
            const ssize_t n = ::read(pipe_fds[0], buffer, sizeof buffer);
            if (n > 0) {
                result.output.append(buffer, static_cast<std::size_t>(n));
            } else if (n == 0 || errno != EINTR) {
                break;
            }
        }
        ::close(pipe_fds[0]);
        int status = 0;
        while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
        }
        result.code = WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
    } catch (...) {
        result.code = -1;
    }
    return result;
}

/// "a.b.c.d" of a host-order IPv4 address.
std::string dotted(std::uint32_t address) {
    return fmt::format("{}.{}.{}.{}", address >> 24, (address >> 16) & 0xFFU, (address >> 8) & 0xFFU, address & 0xFFU);
}

/// Two network namespaces `elastic-<pid>-a` and `elastic-<pid>-b` joined by a veth pair
/// (`el<pid>a` in a, `el<pid>b` in b: at most 10 characters for a 22-bit pid, within IFNAMSIZ's
/// 15) on the /30 subnet 10.0.0.0/8 + 4 * (pid mod 2^22): different for every live test process,
/// so a concurrent case never shares a name or an address with this one. `lo` is up in both.
///
/// The destructor SIGKILLs every process still in either namespace (`ip netns pids`: an agent,
/// worker or watcher left over by a failed case; all of them ours) and deletes both namespaces,
/// which also destroys the veth pair. Construction only names things: `create()` makes them, so a
/// REQUIRE failing halfway through still leaves a constructed guard that cleans up.
class two_hosts {
public:
    explicit two_hosts(std::string ip) : ip_(std::move(ip)) {
        const auto pid = static_cast<std::uint32_t>(::getpid());
        ns_a_ = fmt::format("elastic-{}-a", pid);
        ns_b_ = fmt::format("elastic-{}-b", pid);
        veth_a_ = fmt::format("el{}a", pid);
        veth_b_ = fmt::format("el{}b", pid);
        const std::uint32_t subnet = (10U << 24) | ((pid & 0x3FFFFFU) << 2);
        addr_a_ = dotted(subnet + 1);
        addr_b_ = dotted(subnet + 2);
    }
    two_hosts(const two_hosts&) = delete;
    two_hosts& operator=(const two_hosts&) = delete;
    ~two_hosts() {
        remove();
        if (sentinel_fd_ >= 0) {
            if (::write(sentinel_fd_, "x", 1) != 1) {
                // The sentinel is gone already: nothing to tell it.
            }
            ::close(sentinel_fd_);
        }
    }

    void create() {
        // Namespaces named after this pid can only be left over by a dead process that had the
        // same pid before: nobody else's, so remove them.
        remove();
        start_sentinel();
        ip_ok({"netns", "add", ns_a_});
        ip_ok({"netns", "add", ns_b_});
        ip_ok({"link", "add", veth_a_, "netns", ns_a_, "type", "veth", "peer", "name", veth_b_, "netns", ns_b_});
        ip_ok({"-n", ns_a_, "addr", "add", addr_a_ + "/30", "dev", veth_a_});
        ip_ok({"-n", ns_b_, "addr", "add", addr_b_ + "/30", "dev", veth_b_});
        for (const auto& [ns, veth] : {std::pair{ns_a_, veth_a_}, std::pair{ns_b_, veth_b_}}) {
            ip_ok({"-n", ns, "link", "set", "lo", "up"});
            ip_ok({"-n", ns, "link", "set", veth, "up"});
        }
    }

    /// The partition: a's end of the link goes down. Neither side gets a reset or an error it
    /// could act on at once (b's packets vanish in the veth; a keeps its own address, only the
    /// route to b goes), so each notices only the other's silence.
    void cut() { ip_ok({"-n", ns_a_, "link", "set", veth_a_, "down"}); }

    /// The partition heals: a's end of the link comes up again (with its address and route).
    void heal() { ip_ok({"-n", ns_a_, "link", "set", veth_a_, "up"}); }

    /// `ip netns exec <ns> <program> args...`: the argv of a launched child inside namespace `ns`.
    [[nodiscard]] std::vector<std::string> exec_in(const std::string& ns, const std::string& program,
                                                   const std::vector<std::string>& args) const {
        std::vector<std::string> argv{"netns", "exec", ns, program};
        argv.insert(argv.end(), args.begin(), args.end());
        return argv;
    }

    /// Pids of the processes in namespace `ns` (empty when it does not exist).
    [[nodiscard]] std::vector<pid_t> pids_in(const std::string& ns) const {
        std::vector<pid_t> pids;
        const auto r = run_command(ip_, {"netns", "pids", ns});
        if (r.code != 0) return pids;
        std::istringstream in(r.output);
        for (long pid = 0; in >> pid;) pids.push_back(static_cast<pid_t>(pid));
        return pids;
    }

    [[nodiscard]] const std::string& ip() const { return ip_; }
    [[nodiscard]] const std::string& ns_a() const { return ns_a_; }
    [[nodiscard]] const std::string& ns_b() const { return ns_b_; }
    [[nodiscard]] const std::string& addr_a() const { return addr_a_; }
    [[nodiscard]] const std::string& addr_b() const { return addr_b_; }

private:
    void ip_ok(const std::vector<std::string>& args) const {
        const auto r = run_command(ip_, args);
        std::string line = ip_;
        for (const auto& a : args) line += " " + a;
        INFO(line);
        INFO(r.output);
        REQUIRE(r.code == 0);
    }

    /// The destructor does not run when the test process is killed (ctest's timeout sends
    /// SIGKILL to the test's process tree; Ctrl-C): a sentinel process outside that tree (double
    /// fork, own session) waits on a pipe whose write end only this process holds (O_CLOEXEC: no
    /// agent inherits it). One byte from the destructor says "cleaned up"; end of file without it
    /// means the test died, and the sentinel removes the namespaces and whatever runs in them.
    void start_sentinel() {
        int fds[2];
        REQUIRE(::pipe2(fds, O_CLOEXEC) == 0);
        const pid_t child = ::fork();
        REQUIRE(child >= 0);
        if (child == 0) {
            // This process is single-threaded (doctest, posix_spawn'd agents), so the child may
            // go on with the heap and fmt; it never returns into doctest and ends with _exit.
            ::setsid();
            if (::fork() != 0) ::_exit(0);
            const int null = ::open("/dev/null", O_RDWR);
            if (null >= 0) {
                ::dup2(null, 0);
                ::dup2(null, 1);  // nor hold ctest's output pipe open
                ::dup2(null, 2);
            }
            ::dup2(fds[0], 3);
            ::close_range(4, ~0U, 0);
            char byte = 0;
            ssize_t n = 0;
            while ((n = ::read(3, &byte, 1)) < 0 && errno == EINTR) {
            }
            if (n != 1) remove();
            ::_exit(0);
        }
        ::close(fds[0]);
        sentinel_fd_ = fds[1];
        int status = 0;
        while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
        }
    }

    void remove() noexcept {
        for (const auto* ns : {&ns_a_, &ns_b_}) {
            for (const pid_t pid : pids_in(*ns)) {
                if (pid > 1 && pid != ::getpid()) ::kill(pid, SIGKILL);
            }
            // Fails harmlessly when the namespace does not exist; its veth end goes with it.
            (void)run_command(ip_, {"netns", "delete", *ns});
        }
    }

    std::string ip_;
    std::string ns_a_;
    std::string ns_b_;
    std::string veth_a_;
    std::string veth_b_;
    std::string addr_a_;
    std::string addr_b_;
    int sentinel_fd_ = -1;
};

/// The ip path when this machine can run the case; otherwise a MESSAGE saying why, and nothing.
std::optional<std::string> usable_ip() {
    if (::geteuid() != 0) {
        MESSAGE("skipped: network namespaces need root (CI runs this case as root)");
        return std::nullopt;
    }
    auto ip = find_ip();
    if (!ip) MESSAGE("skipped: iproute2's `ip` is not installed (neither /usr/sbin/ip nor `ip` on PATH)");
    return ip;
}

constexpr int store_port = 29400;  // a fresh namespace has every port free
// --rdzv-conf join_timeout, in seconds: the first round must form within it (both agents start
// at once: ample on a busy machine), and it is what the agents left without a majority or below
// --nnodes wait after the cut before they give up, so it sets how long a case takes.
constexpr const char* join_timeout_s = "3";

std::map<std::string, std::string> node_env(const temp_dir& dir, const std::string& rules, const std::string& node) {
    auto env = agent_support::clean_environment();
    env["AGENT_WORKER_DIR"] = dir.str();
    env["AGENT_WORKER_DO"] = rules;
    env["RDZV_TEST_NODE"] = node;
    env["LOGLEVEL"] = "INFO";  // the agents' stderr is the case's diagnosis when it fails
    return env;
}

/// elasticrun's arguments for the agent at `own_addr` (the store's host when `host`): the
/// store at a's address, leases of 0.2 s x 5, `own_addr` as MASTER_ADDR (routable from the
/// other namespace, unlike the hostname).
std::vector<std::string> agent_args(const two_hosts& net, const std::string& nnodes, const std::string& own_addr,
                                    bool host, const std::string& join_timeout) {
    return {"--rdzv-backend=c10d",
            fmt::format("--rdzv-endpoint={}:{}", net.addr_a(), store_port),
            "--rdzv-id=netns",
            fmt::format("--nnodes={}", nnodes),
            "--nproc-per-node=1",
            fmt::format("--rdzv-conf=keep_alive_interval=0.2,keep_alive_max_attempt=10,join_timeout={},"
                        "last_call_timeout=3600,is_host={}",
                        join_timeout, host),
            fmt::format("--local-addr={}", own_addr),
            agent_support::worker()};
}

/// The fields of a worker's "world" line: WORLD_SIZE GROUP_WORLD_SIZE RANK GROUP_RANK attempt
/// node pid.
struct world_line {
    int world = -1;
    int group_world = -1;
    int rank = -1;
    int group_rank = -1;
    int attempt = -1;
    std::string node;
    pid_t pid = -1;
};

std::vector<world_line> world_lines(const std::string& out) {
    std::vector<world_line> lines;
    std::istringstream in(out);
    for (std::string text; std::getline(in, text);) {
        if (text.rfind("world ", 0) != 0) continue;
        std::istringstream fields(text.substr(6));
        world_line w;
        long pid = -1;
        fields >> w.world >> w.group_world >> w.rank >> w.group_rank >> w.attempt >> w.node >> pid;
        w.pid = static_cast<pid_t>(pid);
        lines.push_back(w);
    }
    return lines;
}

/// Whether `pid` is gone; if not, its /proc state line (a "Z" there: exited but never reaped).
std::string still_there(pid_t pid) {
    if (pid <= 0) return "no pid was read from its world line";
    if (::kill(pid, 0) != 0 && errno == ESRCH) return {};
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string text;
    std::getline(stat, text);
    return text.empty() ? std::string("alive") : text;
}

/// The command names of the agent workers still in namespace `ns` (none once the agents are gone).
std::vector<std::string> workers_left(const two_hosts& net, const std::string& ns) {
    std::vector<std::string> left;
    for (const pid_t pid : net.pids_in(ns)) {
        std::ifstream comm("/proc/" + std::to_string(pid) + "/comm");
        std::string name;
        std::getline(comm, name);
        if (name == "agent-worker") left.push_back(fmt::format("{} (pid {})", name, pid));
    }
    return left;
}

/// Starts the two agents and waits until both workers run in one round of two.
struct partitioned_job {
    launched a;
    launched b;
    world_line a_worker;
    world_line b_worker;

    partitioned_job(const two_hosts& net, const temp_dir& dir, const std::string& nnodes, const std::string& rules,
                    const std::string& join_timeout)
        : a(net.exec_in(net.ns_a(), agent_support::elasticrun(),
                        agent_args(net, nnodes, net.addr_a(), true, join_timeout)),
            node_env(dir, rules, "A"), net.ip()),
          b(net.exec_in(net.ns_b(), agent_support::elasticrun(),
                        agent_args(net, nnodes, net.addr_b(), false, join_timeout)),
            node_env(dir, rules, "B"), net.ip()) {
        const bool a_runs = a.read_lines("world 2 ", 1);
        const bool b_runs = b.read_lines("world 2 ", 1);
        INFO("agent A's stderr:\n" << a.err());
        INFO("agent B's stderr:\n" << b.err());
        REQUIRE(a_runs);
        REQUIRE(b_runs);
        a_worker = world_lines(a.out()).front();
        b_worker = world_lines(b.out()).front();
        // One round of two nodes across the link: distinct group ranks, each node's own worker.
        CHECK(a_worker.node == "A");
        CHECK(b_worker.node == "B");
        CHECK(a_worker.group_world == 2);
        CHECK(b_worker.group_world == 2);
        CHECK(a_worker.group_rank + b_worker.group_rank == 1);
        CHECK(a_worker.rank != b_worker.rank);
    }
};

TEST_CASE("rendezvous netns: a partition of --nnodes=1:2 ends both agents with 250: neither half is a majority") {
    const auto ip = usable_ip();
    if (!ip) return;
    temp_dir dir;
    two_hosts net(*ip);  // before the agents: they die before the namespaces go
    net.create();
    // Round of two: both workers hang. A round of one, which neither side may form, would end
    // the job at once.
    // join_timeout: what each side waits for a majority after the cut (below), and the margin
    // for the first round to form while the machine is busy.
    partitioned_job job(net, dir, "1:2", "w2:world+hang;w1:world+exit0", join_timeout_s);
    net.cut();

    const int code_b = job.b.wait();
    const int code_a = job.a.wait();
    INFO("agent A's stderr:\n" << job.a.err());
    INFO("agent B's stderr:\n" << job.b.err());
    INFO("agent A's stdout:\n" << job.a.out());
    INFO("agent B's stdout:\n" << job.b.out());

    // B hears no heartbeat answers: it stops its worker and moves the rendezvous to its own
    // idle store (docs/rendezvous.md, "the store moves"), where the next round needs a majority
    // of the last round's 2 nodes, so that the cut-off part never trains alone: 1 of 2 is none,
    // and B ends as a rendezvous failure after join_timeout, never in a world of its own.
    CHECK(code_b == 250);
    CHECK(job.b.err().find("lost the rendezvous store") != std::string::npos);
    CHECK(job.b.err().find("majority") != std::string::npos);
    CHECK(job.b.err().find("joined within the join timeout") != std::string::npos);
    CHECK(launched::count_lines(job.b.out(), "world ") == 1);
    CHECK(still_there(job.b_worker.pid).empty());

    // A's store counts B's lease lost, and silent: B may be training on the far side of a cut,
    // so A, MIN on its own but no majority of the last round, never trains alone either.
    CHECK(code_a == 250);
    CHECK(job.a.err().find("membership changed:") != std::string::npos);
    CHECK(job.a.err().find("a member went silent or stayed away with a live lease since") != std::string::npos);
    CHECK(job.a.err().find("joined within the join timeout") != std::string::npos);
    CHECK(launched::count_lines(job.a.out(), "world ") == 1);
    CHECK(still_there(job.a_worker.pid).empty());

    // No worker outlives its agent on either side of the cut.
    CHECK(workers_left(net, net.ns_a()).empty());
    CHECK(workers_left(net, net.ns_b()).empty());
}

TEST_CASE("rendezvous netns: a partition of --nnodes=1:2 that heals within the join timeout: the node that moved "
          "the store goes back to the store's host, and both train again") {
    const auto ip = usable_ip();
    if (!ip) return;
    temp_dir dir;
    two_hosts net(*ip);
    net.create();
    // Every round of two waits for the test's word; the job ends once the second round runs.
    // join_timeout: far longer than the cut's detection, the move and the way back, so that
    // without the way back both sides would wait it out and end with 250.
    partitioned_job job(net, dir, "1:2", "w2:world+go+exit0", "60");
    net.cut();

    // B lost the store's host for longer than its reconnect, and moved the job's rendezvous to
    // its own idle store, where one node is no majority of the last round's two; A, left with
    // B's lease lost and silent, waits for a majority too. Neither trains alone.
    const bool b_moved = job.b.read_err_until([](const std::string& err) {
        return err.find("the job's rendezvous moves to") != std::string::npos;
    });
    const bool a_lost_b = job.a.read_err_until([](const std::string& err) {
        return err.find("membership changed:") != std::string::npos;
    });
    INFO("agent A's stderr:\n" << job.a.err());
    INFO("agent B's stderr:\n" << job.b.err());
    REQUIRE(b_moved);
    REQUIRE(a_lost_b);
    net.heal();

    // B finds the store where its last round formed answering again (the same store: its
    // instance), leaves the moved store, where no round formed, and rejoins the job there.
    const bool a_again = job.a.read_lines("world 2 ", 2);
    const bool b_again = job.b.read_lines("world 2 ", 2);
    INFO("agent A's stdout:\n" << job.a.out());
    INFO("agent B's stdout:\n" << job.b.out());
    REQUIRE(a_again);
    REQUIRE(b_again);
    { std::ofstream go(dir.str() + "/go"); }
    const int code_a = job.a.wait();
    const int code_b = job.b.wait();
    INFO("agent A's stderr at the end:\n" << job.a.err());
    INFO("agent B's stderr at the end:\n" << job.b.err());
    CHECK(code_a == 0);
    CHECK(code_b == 0);
    CHECK(job.b.err().find("goes back there from") != std::string::npos);
    const auto a_lines = world_lines(job.a.out());
    const auto b_lines = world_lines(job.b.out());
    REQUIRE(a_lines.size() == 2);
    REQUIRE(b_lines.size() == 2);
    CHECK(a_lines[1].group_world == 2);
    CHECK(b_lines[1].group_world == 2);
    CHECK(a_lines[1].group_rank + b_lines[1].group_rank == 1);
    CHECK(a_lines[1].rank != b_lines[1].rank);
    CHECK(still_there(job.a_worker.pid).empty());
    CHECK(still_there(job.b_worker.pid).empty());
    CHECK(workers_left(net, net.ns_a()).empty());
    CHECK(workers_left(net, net.ns_b()).empty());
}

TEST_CASE("rendezvous netns: a partition of --nnodes=1:4 into halves that heals within the join timeout: the half "
          "that moved the store goes back, and all four train again") {
    const auto ip = usable_ip();
    if (!ip) return;
    temp_dir dir;
    two_hosts net(*ip);
    net.create();
    // A round of three (the first of C and D back, with A and B: a majority) runs until the
    // last one is back and admitted. join_timeout: the wait of A and B, and of the first mover,
    // spans the other mover's notice of the cut, which the machine's load can slow.
    const std::string rules = "w4:world+go+exit0;w3:world+hang";
    // A hosts the store, B beside it; C and D across the link.
    std::vector<std::unique_ptr<launched>> agents;
    for (const auto* node : {"A", "B", "C", "D"}) {
        const bool near = node[0] == 'A' || node[0] == 'B';
        agents.push_back(std::make_unique<launched>(
            net.exec_in(near ? net.ns_a() : net.ns_b(), agent_support::elasticrun(),
                        agent_args(net, "1:4", near ? net.addr_a() : net.addr_b(), node[0] == 'A', "300")),
            node_env(dir, rules, node), net.ip()));
    }
    for (auto& agent : agents) {
        const bool runs = agent->read_lines("world 4 ", 1);
        INFO("stderr:\n" << agent->err());
        REQUIRE(runs);
    }
    net.cut();

    // C and D lose the store's host and move the job's rendezvous to a successor across the
    // cut: 2 of the last round's 4, no majority; A and B, 2 of 4 too, wait at the store.
    for (auto* agent : {agents[2].get(), agents[3].get()}) {
        const bool moved = agent->read_err_until([](const std::string& err) {
            return err.find("the job's rendezvous moves to") != std::string::npos;
        });
        INFO("stderr:\n" << agent->err());
        REQUIRE(moved);
    }
    net.heal();

    // Both go back where the last round formed (the one that hosted the moved store stops it;
    // the other loses it, or leaves first), and the four form a round again (after a round of
    // three, when one of them is back first).
    bool all_again = true;
    for (auto& agent : agents) all_again = agent->read_lines("world 4 ", 2) && all_again;
    INFO("agent A's stderr:\n" << agents[0]->err());
    INFO("agent B's stderr:\n" << agents[1]->err());
    INFO("agent C's stderr:\n" << agents[2]->err());
    INFO("agent D's stderr:\n" << agents[3]->err());
    REQUIRE(all_again);
    { std::ofstream go(dir.str() + "/go"); }
    std::vector<int> group_ranks;
    for (auto& agent : agents) {
        const int code = agent->wait();
        INFO("stderr:\n" << agent->err());
        CHECK(code == 0);
        const auto lines = world_lines(agent->out());
        REQUIRE(lines.size() >= 2);
        CHECK(launched::count_lines(agent->out(), "world 4 ") == 2);
        CHECK(lines.back().group_world == 4);
        group_ranks.push_back(lines.back().group_rank);
    }
    std::sort(group_ranks.begin(), group_ranks.end());
    CHECK(group_ranks == std::vector<int>{0, 1, 2, 3});
    for (auto* agent : {agents[2].get(), agents[3].get()}) {
        INFO("stderr:\n" << agent->err());
        CHECK(agent->err().find("this node goes back there from") != std::string::npos);
    }
    CHECK(workers_left(net, net.ns_a()).empty());
    CHECK(workers_left(net, net.ns_b()).empty());
}

TEST_CASE("rendezvous netns: a partition leaves the store's host with a minority (--nnodes=1:3, A | B C): the "
          "majority moves the store and trains, the host never trains again") {
    // Before the split-brain rule both sides trained: A alone (1 >= MIN) on the store it hosts,
    // B and C as a world of 2 on a successor.
    const auto ip = usable_ip();
    if (!ip) return;
    temp_dir dir;
    two_hosts net(*ip);
    net.create();
    const std::string rules = "w3:world+hang;w2:world+exit0;w1:world+exit0";
    launched a(net.exec_in(net.ns_a(), agent_support::elasticrun(),
                           agent_args(net, "1:3", net.addr_a(), true, join_timeout_s)),
               node_env(dir, rules, "A"), net.ip());
    launched b(net.exec_in(net.ns_b(), agent_support::elasticrun(),
                           agent_args(net, "1:3", net.addr_b(), false, join_timeout_s)),
               node_env(dir, rules, "B"), net.ip());
    launched c(net.exec_in(net.ns_b(), agent_support::elasticrun(),
                           agent_args(net, "1:3", net.addr_b(), false, join_timeout_s)),
               node_env(dir, rules, "C"), net.ip());
    for (auto* agent : {&a, &b, &c}) {
        const bool runs = agent->read_lines("world 3 ", 1);
        INFO("stderr:\n" << agent->err());
        REQUIRE(runs);
    }
    const auto a_worker = world_lines(a.out()).front();
    net.cut();

    const int code_b = b.wait();
    const int code_c = c.wait();
    const int code_a = a.wait();
    INFO("agent A's stderr:\n" << a.err());
    INFO("agent B's stderr:\n" << b.err());
    INFO("agent C's stderr:\n" << c.err());
    INFO("agent A's stdout:\n" << a.out());
    INFO("agent B's stdout:\n" << b.out());
    INFO("agent C's stdout:\n" << c.out());

    // B and C move to a successor, 2 of the last round's 3: a majority, a world of 2.
    CHECK(code_b == 0);
    CHECK(code_c == 0);
    const auto b_lines = world_lines(b.out());
    const auto c_lines = world_lines(c.out());
    REQUIRE(b_lines.size() == 2);
    REQUIRE(c_lines.size() == 2);
    CHECK(b_lines[1].world == 2);
    CHECK(c_lines[1].world == 2);
    CHECK(b_lines[1].rank + c_lines[1].rank == 1);
    CHECK(b.err().find("lost the rendezvous store") != std::string::npos);

    // A keeps the store and counts both leases lost, silently: no majority, no world of its own.
    CHECK(code_a == 250);
    CHECK(a.err().find("a member went silent or stayed away with a live lease since") != std::string::npos);
    CHECK(a.err().find("joined within the join timeout") != std::string::npos);
    CHECK(launched::count_lines(a.out(), "world ") == 1);
    CHECK(still_there(a_worker.pid).empty());

    CHECK(workers_left(net, net.ns_a()).empty());
    CHECK(workers_left(net, net.ns_b()).empty());
}

TEST_CASE("rendezvous netns: a partition of a fixed job (--nnodes=2:2) ends both agents with 250") {
    const auto ip = usable_ip();
    if (!ip) return;
    temp_dir dir;
    two_hosts net(*ip);
    net.create();
    partitioned_job job(net, dir, "2:2", "w2:world+hang;w1:world+exit0", join_timeout_s);
    net.cut();

    const int code_b = job.b.wait();
    const int code_a = job.a.wait();
    INFO("agent A's stderr:\n" << job.a.err());
    INFO("agent B's stderr:\n" << job.b.err());
    INFO("agent A's stdout:\n" << job.a.out());
    INFO("agent B's stdout:\n" << job.b.out());

    // B has no membership to keep (a fixed job cannot go on without A): 250 at once.
    CHECK(code_b == 250);
    CHECK(job.b.err().find("lost the rendezvous store") != std::string::npos);
    CHECK(still_there(job.b_worker.pid).empty());

    // A stops its worker, waits join_timeout for a second node that cannot come, and gives up.
    CHECK(code_a == 250);
    CHECK(job.a.err().find("membership changed:") != std::string::npos);
    CHECK(job.a.err().find("1 of 2 nodes joined within the join timeout") != std::string::npos);
    CHECK(launched::count_lines(job.a.out(), "world ") == 1);
    CHECK(still_there(job.a_worker.pid).empty());

    CHECK(workers_left(net, net.ns_a()).empty());
    CHECK(workers_left(net, net.ns_b()).empty());
}

TEST_CASE("rendezvous netns: etcd-v3, an agent's link cut: etcd expires its lease, the other trains without it, the "
          "cut-off agent stops its worker and ends with 250") {
    const auto ip = usable_ip();
    if (!ip) return;
    temp_dir dir;
    two_hosts net(*ip);  // before etcd and the agents: they die before the namespaces go
    net.create();
    // etcd on host A: B reaches it over the link, A on its own address.
    etcd_support::options o;
    o.host = net.addr_a();
    o.wrapper = {*ip, "netns", "exec", net.ns_a()};
    etcd_support::cluster etcd(1, o);
    const auto args = [&](const std::string& own_addr) {
        return std::vector<std::string>{
            "--rdzv-backend=etcd-v3", "--rdzv-endpoint=" + etcd.endpoints(), "--rdzv-id=netns-etcd", "--nnodes=1:2",
            "--nproc-per-node=1",
            // Leases of 0.5 s x 6; each request to an unreachable etcd gives up after 2 s.
            "--rdzv-conf=keep_alive_interval=0.5,keep_alive_max_attempt=6,read_timeout=2,join_timeout=60,"
            "last_call_timeout=3600",
            fmt::format("--local-addr={}", own_addr), agent_support::worker()};
    };
    const std::string rules = "w2:world+hang;w1:world+exit0";
    launched a(net.exec_in(net.ns_a(), agent_support::elasticrun(), args(net.addr_a())), node_env(dir, rules, "A"),
               net.ip());
    launched b(net.exec_in(net.ns_b(), agent_support::elasticrun(), args(net.addr_b())), node_env(dir, rules, "B"),
               net.ip());
    {
        const bool a_runs = a.read_lines("world 2 ", 1);
        const bool b_runs = b.read_lines("world 2 ", 1);
        INFO("agent A's stderr:\n" << a.err());
        INFO("agent B's stderr:\n" << b.err());
        REQUIRE(a_runs);
        REQUIRE(b_runs);
    }
    const auto b_worker = world_lines(b.out()).front();
    net.cut();

    const int code_b = b.wait();
    const int code_a = a.wait();
    INFO("agent A's stderr:\n" << a.err());
    INFO("agent B's stderr:\n" << b.err());
    INFO("agent A's stdout:\n" << a.out());
    INFO("agent B's stdout:\n" << b.out());

    // A: B's lease expired in etcd; A re-forms alone (MIN is 1) and its worker succeeds.
    CHECK(code_a == 0);
    CHECK(a.err().find("membership changed:") != std::string::npos);
    CHECK(a.err().find("etcd ended its agent's lease") != std::string::npos);
    const auto a_worlds = world_lines(a.out());
    REQUIRE(a_worlds.size() == 2);
    CHECK(a_worlds[0].world == 2);
    CHECK(a_worlds[1].world == 1);

    // B: no renewal reaches etcd, so B takes its lease for lost, stops its worker, finds no
    // member that grants it a new one, and ends: it never trains alone.
    CHECK(code_b == 250);
    CHECK(b.err().find("no etcd member renewed this node's lease") != std::string::npos);
    CHECK(b.err().find("grants this node no new lease") != std::string::npos);
    CHECK(launched::count_lines(b.out(), "world ") == 1);
    CHECK(still_there(b_worker.pid).empty());

    CHECK(workers_left(net, net.ns_a()).empty());
    CHECK(workers_left(net, net.ns_b()).empty());
}

}  // namespace test_rendezvous_netns
