// Stopping groups of real workers (grandchildren included), the first exit among many, an agent
// SIGKILLed with workers running, and the CPU cost of waiting.
// test-tags: concurrent
#include "elastic/process/group.hpp"
#include "elastic/process/proc.hpp"
#include "elastic/process/spawn.hpp"

#include "process_support.hpp"

#include <doctest/doctest.h>

#include "idle_cpu.hpp"

#include <asio/experimental/awaitable_operators.hpp>
#include <asio/steady_timer.hpp>

#include <fcntl.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace test_stop {

using process_support::read_line;
using process_support::run;
using process_support::spawn_worker;

/// A worker started with `args` that has said "ready" (and, for fork-grandchild, its
/// grandchild's pid, returned in `grandchild`).
elastic::child_process ready_worker(asio::io_context& io, std::vector<std::string> args, pid_t* grandchild = nullptr) {
    auto child = spawn_worker(io, std::move(args));
    auto out = child.take_stdout();
    std::string buffer;
    std::string line = run(io, read_line(*out, buffer));
    if (line.rfind("grandchild ", 0) == 0) {
        if (grandchild != nullptr) *grandchild = static_cast<pid_t>(std::stoi(line.substr(11)));
        line = run(io, read_line(*out, buffer));
    }
    REQUIRE(line == "ready");
    return child;
}

bool exited_now(pid_t pid) {
    // Held by a pidfd, a dead process reads as readable at once; ESRCH means reaped already.
    return process_support::await_deaths({pid}, std::chrono::milliseconds(0)).empty();
}

/// Whether this process can give each worker a cgroup (as root here; an unprivileged user
/// needs a delegated cgroup). The daemon tests need it: nothing else reaches a daemon.
bool cgroups_available() {
    const std::string why = process_support::cgroup_unavailable();
    if (why.empty()) return true;
    MESSAGE("skipped: no cgroup for workers: " << why);
    return false;
}

elastic::stop_options quick(std::chrono::milliseconds grace) {
    elastic::stop_options options;
    options.grace = grace;
    options.kill_timeout = std::chrono::seconds(60);  // only catches a hang
    return options;
}

/// Moves `pid` into the cgroup directory `dir`, and checks that the kernel says it is there.
void move_to_cgroup(pid_t pid, const std::string& dir) {
    {
        std::ofstream procs(dir + "/cgroup.procs");
        procs << pid << '\n';
        procs.close();
        REQUIRE(procs);
    }
    std::ifstream where("/proc/" + std::to_string(pid) + "/cgroup");
    std::string line;
    bool found = false;
    while (std::getline(where, line)) {
        // "0::<path below the cgroup2 mount>": `dir` ends with that path.
        const std::string path = line.rfind("0::", 0) == 0 ? line.substr(3) : std::string();
        found = found || (!path.empty() && dir.size() >= path.size() &&
                          dir.compare(dir.size() - path.size(), std::string::npos, path) == 0);
    }
    REQUIRE(found);
}

}  // namespace test_stop

TEST_CASE("process: stopping a worker's group ends the grandchild it forked") {
    using namespace test_stop;
    asio::io_context io;
    pid_t grandchild = 0;
    std::vector<elastic::child_process> workers;
    workers.push_back(ready_worker(io, {"fork-grandchild"}, &grandchild));
    REQUIRE(grandchild > 0);
    CHECK(process_support::alive(grandchild));
    const auto result = run(io, elastic::stop(workers, quick(std::chrono::seconds(60))));
    REQUIRE(result.workers.size() == 1);
    CHECK(result.workers[0].outcome == elastic::stop_outcome::signaled);
    REQUIRE(result.workers[0].status);
    CHECK(result.workers[0].status->status.signal() == SIGTERM);
    CHECK(result.killed_descendants.empty());  // the grandchild ended on SIGTERM in the grace
    CHECK(result.clean());
    CHECK(workers[0].reaped());
    // stop awaited the grandchild's death too: it is gone when stop returns.
    CHECK(exited_now(grandchild));
}

TEST_CASE("process: a worker that ignores SIGTERM is killed after the grace period") {
    using namespace test_stop;
    asio::io_context io;
    auto worker = ready_worker(io, {"ignore-term"});
    const auto result = run(io, elastic::stop(worker, quick(std::chrono::milliseconds(200))));
    REQUIRE(result.workers.size() == 1);
    CHECK(result.workers[0].pid == worker.pid());
    CHECK(result.workers[0].outcome == elastic::stop_outcome::killed);
    REQUIRE(result.workers[0].status);
    CHECK(result.workers[0].status->status.signal() == SIGKILL);
    CHECK(result.clean());
    CHECK(worker.reaped());
}

TEST_CASE("process: stop reports how each worker ended") {
    using namespace test_stop;
    asio::io_context io;
    pid_t stubborn_grandchild = 0;
    std::vector<elastic::child_process> workers;
    workers.push_back(spawn_worker(io, {"exit", "7"}));
    workers.push_back(ready_worker(io, {"term-exit", "0"}));
    workers.push_back(ready_worker(io, {"sleep"}));
    workers.push_back(ready_worker(io, {"ignore-term"}));
    workers.push_back(ready_worker(io, {"fork-grandchild", "ignore-term"}, &stubborn_grandchild));
    CHECK(run(io, workers[0].wait()).status.code() == 7);  // exits before the stop

    elastic::stop_options options = quick(std::chrono::milliseconds(300));
    options.signal = SIGTERM;
    const auto result = run(io, elastic::stop(workers, options));
    REQUIRE(result.workers.size() == workers.size());
    CHECK(result.workers[0].outcome == elastic::stop_outcome::already_exited);
    CHECK(result.workers[0].status->status.code() == 7);
    CHECK(result.workers[1].outcome == elastic::stop_outcome::exited);
    CHECK(result.workers[1].status->status.code() == 0);
    CHECK(result.workers[2].outcome == elastic::stop_outcome::signaled);
    CHECK(result.workers[2].status->status.signal() == SIGTERM);
    CHECK(result.workers[3].outcome == elastic::stop_outcome::killed);
    CHECK(result.workers[3].status->status.signal() == SIGKILL);
    CHECK(result.workers[4].outcome == elastic::stop_outcome::signaled);
    // The grandchild ignored SIGTERM and outlived the grace period: it needed SIGKILL.
    CHECK(result.killed_descendants == std::vector<pid_t>{stubborn_grandchild});
    CHECK(result.clean());
    CHECK(exited_now(stubborn_grandchild));
    for (std::size_t i = 0; i < workers.size(); ++i) {
        CHECK(result.workers[i].pid == workers[i].pid());
        CHECK(workers[i].reaped());
    }
    CHECK(std::string(elastic::to_string(elastic::stop_outcome::killed)) == "killed after the grace period");
    // Stopping again is harmless: everything is reaped already.
    const auto again = run(io, elastic::stop(workers, options));
    CHECK(again.workers[3].outcome == elastic::stop_outcome::already_exited);
    CHECK(again.clean());
}

TEST_CASE("process: stop finds a worker's descendants in its cgroup, in cgroups below it, and by /proc") {
    using namespace test_stop;
    if (!cgroups_available()) return;
    asio::io_context io;
    pid_t grandchild = 0;
    auto worker = ready_worker(io, {"fork-grandchild", "ignore-term"}, &grandchild);
    REQUIRE(grandchild > 0);
    const std::string cgroup = worker.cgroup();
    REQUIRE_FALSE(cgroup.empty());
    // The grandchild moved into a cgroup the worker's tree made below its own.
    const std::string nested = cgroup + "/nested";
    REQUIRE(::mkdir(nested.c_str(), 0755) == 0);
    move_to_cgroup(grandchild, nested);
    std::vector<pid_t> listed;
    const auto collect = [&](pid_t pid) { listed.push_back(pid); };
    CHECK(elastic::detail::process::for_each_cgroup_process(cgroup, 8, collect));
    std::sort(listed.begin(), listed.end());
    CHECK(listed == std::vector<pid_t>{std::min(worker.pid(), grandchild), std::max(worker.pid(), grandchild)});
    listed.clear();
    CHECK_FALSE(elastic::detail::process::for_each_cgroup_process(cgroup, 0, collect));      // deeper than allowed
    CHECK(elastic::detail::process::for_each_cgroup_process(cgroup + "/gone", 8, collect));  // no cgroup, nobody
    const auto members = [&](const std::vector<std::string>& cgroups) {
        std::vector<pid_t> out;
        for (const auto& m : elastic::detail::process::group_members({worker.pgid()}, {worker.pid()}, cgroups)) {
            out.push_back(m.pid);
        }
        return out;
    };
    CHECK(members({cgroup}) == std::vector<pid_t>{grandchild});
    CHECK(members({}) == std::vector<pid_t>{grandchild});                  // the scan of /proc finds the same
    CHECK(members({cgroup + "/gone"}) == std::vector<pid_t>{grandchild});  // a wrong path: the scan

    const auto result = run(io, elastic::stop(worker, quick(std::chrono::milliseconds(200))));
    REQUIRE(result.workers.size() == 1);
    CHECK(result.workers[0].outcome == elastic::stop_outcome::signaled);
    CHECK(result.killed_descendants == std::vector<pid_t>{grandchild});
    CHECK(result.clean());
    CHECK(exited_now(grandchild));
    CHECK_FALSE(std::filesystem::exists(cgroup));  // removed with the cgroup below it
}

TEST_CASE("process: stop awaits a group member that left its worker's cgroup") {
    using namespace test_stop;
    if (!cgroups_available()) return;
    asio::io_context io;
    pid_t grandchild = 0;
    auto worker = ready_worker(io, {"fork-grandchild", "ignore-term"}, &grandchild);
    REQUIRE(grandchild > 0);
    REQUIRE_FALSE(worker.cgroup().empty());
    // Moved up into the agent's own cgroup directory: still in the worker's process group.
    const std::string root = elastic::detail::process::cgroups::instance().root();
    REQUIRE_FALSE(root.empty());
    move_to_cgroup(grandchild, root);
    CHECK(elastic::detail::process::read_pgid(grandchild) == worker.pgid());

    const auto result = run(io, elastic::stop(worker, quick(std::chrono::milliseconds(200))));
    REQUIRE(result.workers.size() == 1);
    CHECK(result.workers[0].outcome == elastic::stop_outcome::signaled);
    CHECK(result.clean());
    // Gone when stop returns, not left dying: SIGKILL reached it with its group, and stop
    // found it after the reap and awaited it.
    CHECK(exited_now(grandchild));
}

TEST_CASE("process: stop awaits a group member whose main thread has ended while another runs") {
    using namespace test_stop;
    asio::io_context io;
    pid_t grandchild = 0;
    // /proc shows the grandchild a zombie; its second thread lives on, ignoring SIGTERM. (Under
    // ThreadSanitizer every forked process has such a thread: SIGKILL ends the main one first.)
    auto worker = ready_worker(io, {"fork-grandchild", "ignore-term", "main-exits"}, &grandchild);
    REQUIRE(grandchild > 0);
    CHECK(elastic::detail::process::read_pgid(grandchild) == worker.pgid());
    const auto members = [&](const std::vector<std::string>& cgroups) {
        std::vector<pid_t> out;
        for (const auto& m : elastic::detail::process::group_members({worker.pgid()}, {worker.pid()}, cgroups)) {
            out.push_back(m.pid);
        }
        return out;
    };
    CHECK(members({}) == std::vector<pid_t>{grandchild});
    if (!worker.cgroup().empty()) CHECK(members({worker.cgroup()}) == std::vector<pid_t>{grandchild});

    const auto result = run(io, elastic::stop(worker, quick(std::chrono::milliseconds(200))));
    REQUIRE(result.workers.size() == 1);
    CHECK(result.workers[0].outcome == elastic::stop_outcome::signaled);
    CHECK(result.killed_descendants == std::vector<pid_t>{grandchild});  // it outlived the grace
    CHECK(result.clean());
    CHECK(exited_now(grandchild));
    // Dead and awaiting its reaper, a zombie is no member: nothing is left to stop.
    CHECK(members({}).empty());
}

TEST_CASE("process: a dead member of a worker's group awaiting its reaper is not stopped") {
    using namespace test_stop;
    asio::io_context io;
    pid_t zombie = 0;
    auto worker = ready_worker(io, {"zombie-child"}, &zombie);
    REQUIRE(zombie > 0);
    CHECK(elastic::detail::process::read_pgid(zombie) == worker.pgid());  // a zombie keeps its group
    CHECK_FALSE(process_support::alive(zombie));
    std::vector<std::string> cgroups;
    if (!worker.cgroup().empty()) cgroups.push_back(worker.cgroup());
    CHECK(elastic::detail::process::group_members({worker.pgid()}, {worker.pid()}).empty());
    CHECK(elastic::detail::process::group_members({worker.pgid()}, {worker.pid()}, cgroups).empty());

    const auto result = run(io, elastic::stop(worker, quick(std::chrono::seconds(60))));
    REQUIRE(result.workers.size() == 1);
    CHECK(result.workers[0].outcome == elastic::stop_outcome::signaled);
    CHECK(result.killed_descendants.empty());
    CHECK(result.clean());
}

TEST_CASE("process: wait_any reports exits as they happen") {
    using namespace test_stop;
    asio::io_context io;
    std::vector<elastic::child_process> workers;
    for (int i = 0; i < 3; ++i) workers.push_back(ready_worker(io, {"sleep"}));
    CHECK(workers[1].signal(SIGUSR1));
    CHECK(run(io, elastic::wait_any(workers)) == 1);
    CHECK(workers[1].status()->status.signal() == SIGUSR1);
    CHECK(workers[2].signal(SIGUSR2));
    CHECK(run(io, elastic::wait_any(workers)) == 2);  // exited ones are not reported again
    CHECK(workers[0].signal(SIGTERM));
    // Workers held elsewhere (in a struct, say) are passed by pointer.
    const std::vector<elastic::child_process*> pointers{&workers[0], &workers[1], &workers[2]};
    CHECK(run(io, elastic::wait_any(pointers)) == 0);
    CHECK(run(io, elastic::wait_any(workers)) == workers.size());  // none left running
    CHECK(workers[1].status()->steady_time < workers[2].status()->steady_time);
    CHECK(workers[2].status()->steady_time < workers[0].status()->steady_time);
    for (auto& w : workers) w.reap();
}

namespace test_stop {

/// Starts the agent program with 3 workers, SIGKILLs it once all are running, and checks that
/// every worker, every grandchild and the watcher are gone. `mode` is "restart-watcher",
/// "daemon", "adopted" or empty (process_agent.cpp).
void agent_killed_leaves_nothing(const std::string& mode) {
    const bool restart_watcher = mode == "restart-watcher";
    asio::io_context io;
    elastic::spawn_options options;
    options.program = process_support::agent_program();
    options.args = {process_support::worker_program(), "3"};
    if (!mode.empty()) options.args.push_back(mode);
    options.out = elastic::stdio::pipe();
    options.own_cgroup = false;  // killing the agent's cgroup would do the watcher's job for it
    auto agent = elastic::spawn(io.get_executor(), options);
    auto out = agent.take_stdout();
    std::string buffer;
    std::vector<pid_t> descendants;
    pid_t watcher = 0;
    pid_t old_watcher = 0;
    for (;;) {
        const std::string line = run(io, process_support::read_line(*out, buffer));
        REQUIRE_FALSE(line.empty());
        if (line == "ready") break;
        std::istringstream words(line);
        std::string what;
        long pid = 0;
        words >> what >> pid;
        if (what == "worker") {
            descendants.push_back(static_cast<pid_t>(pid));
            std::string label;
            long grandchild = 0;
            words >> label >> grandchild;
            REQUIRE(label == "grandchild");
            descendants.push_back(static_cast<pid_t>(grandchild));
        } else if (what == "watcher") {
            watcher = static_cast<pid_t>(pid);
        } else if (what == "old-watcher") {
            old_watcher = static_cast<pid_t>(pid);
        }
    }
    REQUIRE(descendants.size() == 6);
    REQUIRE(watcher > 0);
    CHECK((old_watcher > 0) == restart_watcher);
    CHECK(old_watcher != watcher);
    for (pid_t pid : descendants) CHECK(process_support::alive(pid));
    CHECK(process_support::alive(watcher));

    CHECK(agent.signal(SIGKILL));
    CHECK(run(io, agent.wait()).status.signal() == SIGKILL);
    // Workers die by their parent-death signal, grandchildren by the watcher, which then exits.
    // Awaited before the agent is reaped: reaping kills the agent's process group, which the
    // watcher left (own session), but the workers did too.
    std::vector<pid_t> all = descendants;
    all.push_back(watcher);
    const auto survivors = process_support::await_deaths(all, std::chrono::seconds(60));
    CHECK(survivors.empty());
    for (pid_t pid : all) CHECK_FALSE(process_support::alive(pid));
    if (mode == "daemon") {
        // The watcher removed the agent's cgroup directory before it exited.
        std::string why;
        const std::string own = elastic::detail::process::own_cgroup2_dir(why);
        REQUIRE_FALSE(own.empty());
        const std::string prefix = "elastic." + std::to_string(agent.pid()) + ".";
        for (const auto& entry : std::filesystem::directory_iterator(own)) {
            CHECK(entry.path().filename().string().rfind(prefix, 0) != 0);
        }
    }
    agent.reap();
}

}  // namespace test_stop

TEST_CASE("process: nothing survives an agent killed with SIGKILL") { test_stop::agent_killed_leaves_nothing(""); }

TEST_CASE("process: a killed watcher is replaced and learns every group") {
    // The first worker was registered with a watcher that then died: its grandchild must still
    // be killed, so the replacement must have been told about it.
    test_stop::agent_killed_leaves_nothing("restart-watcher");
}

TEST_CASE("process: a daemon a worker started ends when the agent is killed with SIGKILL") {
    // The daemons left their workers' process groups and sessions: only their cgroups reach them.
    if (!test_stop::cgroups_available()) return;
    test_stop::agent_killed_leaves_nothing("daemon");
}

TEST_CASE("process: without cgroups, a daemon a worker started ends when the agent is killed with SIGKILL") {
    // The agent can make no cgroup (process-agent disables them): it adopts orphans as child
    // subreaper, and the watcher, which followed the workers' trees, kills the daemons.
    test_stop::agent_killed_leaves_nothing("adopted");
}

TEST_CASE("process: without cgroups, what a worker left ends when the worker is reaped") {
    using process_support::run;
    // Worker A starts a daemon (it leaves A's session) and runs on; worker B starts a child that
    // leaves B's process group but not its session, and exits. (B's child runs on in a second
    // thread after its main one ended: /proc shows it a zombie, but it must be killed.) The agent, child subreaper, has
    // adopted both. Reaping B ends B's child (B's session) and not A's daemon, which names no
    // worker while A runs; reaping A, the last, ends the daemon.
    asio::io_context io;
    elastic::spawn_options options;
    options.program = process_support::agent_program();
    options.args = {process_support::worker_program(), "2", "adopted-exit"};
    options.in = elastic::stdio::pipe();
    options.out = elastic::stdio::pipe();
    auto agent = elastic::spawn(io.get_executor(), options);
    auto out = agent.take_stdout();
    auto in = agent.take_stdin();
    std::string buffer;
    std::vector<pid_t> workers;
    std::vector<pid_t> left;  // what each worker started
    std::vector<pid_t> reaped;
    pid_t watcher = 0;
    for (;;) {
        const std::string line = run(io, process_support::read_line(*out, buffer));
        REQUIRE_FALSE(line.empty());
        if (line == "ready") break;
        std::istringstream words(line);
        std::string what;
        long pid = 0;
        words >> what >> pid;
        if (what == "worker") {
            std::string label;
            long grandchild = 0;
            words >> label >> grandchild;
            REQUIRE(label == "grandchild");
            workers.push_back(static_cast<pid_t>(pid));
            left.push_back(static_cast<pid_t>(grandchild));
        } else if (what == "reaped") {
            REQUIRE(left.size() == 2);
            reaped.push_back(static_cast<pid_t>(pid));
            // Killed and awaited before the agent said so: the death is there to see at once.
            if (reaped.size() == 1) {
                CHECK(pid == workers[1]);
                CHECK(process_support::await_deaths({left[1]}, std::chrono::milliseconds(0)).empty());
                CHECK(process_support::alive(left[0]));
                REQUIRE(::write(in->native_handle(), "go\n", 3) == 3);  // now A may go
            } else {
                CHECK(pid == workers[0]);
                CHECK(process_support::await_deaths({left[0]}, std::chrono::milliseconds(0)).empty());
            }
        } else if (what == "watcher") {
            watcher = static_cast<pid_t>(pid);
        }
    }
    CHECK(reaped.size() == 2);
    REQUIRE(watcher > 0);
    CHECK(agent.signal(SIGKILL));
    CHECK(run(io, agent.wait()).status.signal() == SIGKILL);
    CHECK(process_support::await_deaths({watcher}, std::chrono::seconds(60)).empty());
    agent.reap();
}

TEST_CASE("process: /proc is read for a process's parent, session, start time and children") {
    using namespace elastic::detail::process;
    using process_support::run;
    proc_stat self;
    REQUIRE(read_proc_stat(::getpid(), self));
    CHECK(self.state == 'R');
    CHECK(self.ppid == ::getppid());
    CHECK(self.session == ::getsid(0));
    CHECK(self.pgrp == ::getpgrp());
    CHECK(self.start_time > 0);
    CHECK_FALSE(read_proc_stat(0, self));
    CHECK_FALSE(read_proc_stat(-1, self));

    asio::io_context io;
    auto child = test_stop::ready_worker(io, {"sleep"});
    proc_stat stat;
    REQUIRE(read_proc_stat(child.pid(), stat));
    CHECK(stat.ppid == ::getpid());
    CHECK(stat.session == child.pid());  // a worker runs in a session of its own
    CHECK(stat.pgrp == child.pid());
    std::vector<pid_t> children;
    for_each_child(::getpid(), [&](pid_t pid) { children.push_back(pid); });
    CHECK(std::find(children.begin(), children.end(), child.pid()) != children.end());
    std::vector<pid_t> none;
    for_each_child(child.pid(), [&](pid_t pid) { none.push_back(pid); });
    CHECK(none.empty());
    CHECK(child.signal(SIGKILL));
    CHECK(run(io, child.wait()).status.signal() == SIGKILL);
    REQUIRE(read_proc_stat(child.pid(), stat));
    CHECK(stat.state == 'Z');  // unreaped: the number is still ours
    child.reap();
    CHECK_FALSE(read_proc_stat(child.pid(), stat));

    char path[16];
    CHECK_FALSE(proc_path(path, sizeof path, "/proc/", 1234567890, "/stat"));  // does not fit
    REQUIRE(proc_path(path, sizeof path, "/proc/", 42, "/stat"));
    CHECK(std::string(path) == "/proc/42/stat");
}

TEST_CASE("process: a daemon a worker started ends when the worker is reaped") {
    using namespace test_stop;
    if (!cgroups_available()) return;
    asio::io_context io;
    pid_t daemon = 0;
    auto child = ready_worker(io, {"daemon", "exit"}, &daemon);
    REQUIRE(daemon > 0);
    const std::string cgroup = child.cgroup();
    REQUIRE_FALSE(cgroup.empty());
    CHECK(std::filesystem::is_directory(cgroup));
    CHECK(run(io, child.wait()).status.code() == 0);
    CHECK(process_support::alive(daemon));  // the worker is gone, what it started is not yet
    child.reap();
    CHECK(child.cgroup().empty());
    CHECK(process_support::await_deaths({daemon}, std::chrono::seconds(60)).empty());
    // Its cgroup is removed at the reap or, while the daemon was still exiting, at a sweep.
    elastic::detail::process::cgroups::instance().sweep();
    CHECK_FALSE(std::filesystem::exists(cgroup));
}

TEST_CASE("process: each worker runs in its own cgroup from its start") {
    // Born there (clone3 into the cgroup) or moved there before exec: either way the program
    // finds itself in the cgroup its child_process names, and no two workers share one.
    using namespace test_stop;
    if (!cgroups_available()) return;
    asio::io_context io;
    std::vector<std::string> seen;
    for (int i = 0; i < 3; ++i) {
        elastic::spawn_options options;
        options.program = "cat";
        options.args = {"/proc/self/cgroup"};
        options.out = elastic::stdio::pipe();
        auto child = elastic::spawn(io.get_executor(), options);
        REQUIRE_FALSE(child.cgroup().empty());
        auto out = child.take_stdout();
        const std::string text = run(io, process_support::read_all(*out));
        const auto at = text.find("0::");
        REQUIRE(at != std::string::npos);
        const std::string path = text.substr(at + 3, text.find('\n', at) - at - 3);
        REQUIRE_FALSE(path.empty());
        CHECK(child.cgroup().size() > path.size());
        CHECK(child.cgroup().compare(child.cgroup().size() - path.size(), path.size(), path) == 0);
        CHECK(std::find(seen.begin(), seen.end(), path) == seen.end());
        seen.push_back(path);
        CHECK(run(io, child.wait()).status.success());
        child.reap();
    }
    CHECK(elastic::detail::process::cgroups::instance().reason().empty());
#if ELASTIC_DETAIL_CLONE3
    // Here each was born in its cgroup: clone3 was never refused.
    CHECK_FALSE(elastic::detail::process::clone3_fallen_back.load());
#endif
}

TEST_CASE("process: clone3's refusals are a failed fork, or vfork and the child's own move") {
    using elastic::detail::process::classify_clone3_error;
    using elastic::detail::process::clone3_refusal;
    // The process limit, memory: what a failed fork is.
    CHECK(classify_clone3_error(EAGAIN) == clone3_refusal::resources);
    CHECK(classify_clone3_error(ENOMEM) == clone3_refusal::resources);
    // No clone3 or no CLONE_INTO_CGROUP (old kernels), a seccomp filter (ENOSYS, or EPERM in
    // older container runtimes), a cgroup that takes no process: vfork and the write decide.
    for (const int e : {ENOSYS, EINVAL, E2BIG, EPERM, EACCES, EBUSY, EOPNOTSUPP, ENOENT, ENODEV, EBADF}) {
        CHECK(classify_clone3_error(e) == clone3_refusal::fall_back);
    }
}

TEST_CASE("process: a child clone3 will not start in a cgroup is started with vfork, and so are later ones") {
    using namespace elastic::detail::process;
    const bool before = clone3_fallen_back.load();
    int error_pipe[2];
    REQUIRE(::pipe2(error_pipe, O_CLOEXEC) == 0);
    owned_fd error_read(error_pipe[0]);
    owned_fd error_write = raise_above_stdio(owned_fd(error_pipe[1]));
    char path[] = "/bin/true";
    char* argv[] = {path, nullptr};
    char* envp[] = {nullptr};
    const child_plan plan{path, argv,          envp, nullptr, {-1, -1, -1}, true, ::getpid(), error_write.get(),
                          1024, RLIM_INFINITY, -1};
    // A directory that is no cgroup: clone3 refuses it (EBADF).
    owned_fd not_a_cgroup(::open("/tmp", O_PATH | O_DIRECTORY | O_CLOEXEC));
    REQUIRE(static_cast<bool>(not_a_cgroup));
    started_child started;
    auto job = [&] { started = start_child(plan, not_a_cgroup.get()); };
    spawner::instance().run(job);
    REQUIRE(started.pid > 0);
    CHECK(started.error == 0);
    error_write.reset();
    char byte = 0;
    CHECK(::read(error_read.get(), &byte, 1) == 0);  // EOF: the exec happened
    int status = 0;
    REQUIRE(::waitpid(started.pid, &status, 0) == started.pid);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
#if ELASTIC_DETAIL_CLONE3
    CHECK(clone3_fallen_back.load());
#endif
    clone3_fallen_back.store(before);
}

TEST_CASE("process: without its own cgroup, a worker's daemon outlives it (own_cgroup = false)") {
    using namespace test_stop;
    asio::io_context io;
    elastic::spawn_options options;
    options.program = process_support::worker_program();
    options.args = {"daemon", "exit"};
    options.out = elastic::stdio::pipe();
    options.own_cgroup = false;
    auto child = elastic::spawn(io.get_executor(), options);
    CHECK(child.cgroup().empty());
    auto out = child.take_stdout();
    std::string buffer;
    const std::string line = run(io, read_line(*out, buffer));
    REQUIRE(line.rfind("grandchild ", 0) == 0);
    const auto daemon = static_cast<pid_t>(std::stoi(line.substr(11)));
    CHECK(run(io, child.wait()).status.code() == 0);
    child.reap();
    CHECK(process_support::alive(daemon));  // what the option is for: it was left behind
    ::kill(daemon, SIGKILL);
    CHECK(process_support::await_deaths({daemon}, std::chrono::seconds(60)).empty());
}

TEST_CASE("process: the agent's cgroup directory is read from mountinfo and /proc/self/cgroup") {
    using elastic::detail::process::cgroup2_dir_from;
    const std::string hybrid =
        "24 30 0:22 / /sys/fs/cgroup ro,nosuid shared:9 - tmpfs tmpfs ro,mode=755\n"
        "25 24 0:23 / /sys/fs/cgroup/unified rw,nosuid,nodev shared:10 - cgroup2 cgroup2 rw,nsdelegate\n"
        "26 24 0:24 / /sys/fs/cgroup/memory rw shared:11 - cgroup cgroup rw,memory\n";
    const std::string unified = "30 1 0:26 / /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 rw\n";
    // A container's view: the mount's root is the container's cgroup.
    const std::string subtree = "40 1 0:26 /kubepods/pod1 /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
    std::string why;
    CHECK(cgroup2_dir_from(hybrid, "1:name=systemd:/\n0::/user.slice/s.scope\n", why) ==
          "/sys/fs/cgroup/unified/user.slice/s.scope");
    CHECK(cgroup2_dir_from(unified, "0::/\n", why) == "/sys/fs/cgroup");
    CHECK(cgroup2_dir_from(subtree, "0::/kubepods/pod1/c\n", why) == "/sys/fs/cgroup/c");
    CHECK(cgroup2_dir_from(subtree, "0::/kubepods/pod1\n", why) == "/sys/fs/cgroup");
    CHECK(cgroup2_dir_from("50 1 0:26 / /mnt/my\\040cg rw - cgroup2 none rw\n", "0::/a\n", why) == "/mnt/my cg/a");
    // Not under the mount's root: a sibling whose name only starts the same, and "/..".
    why.clear();
    CHECK(cgroup2_dir_from(subtree, "0::/kubepods/pod12/c\n", why).empty());
    CHECK(why.find("no cgroup2 mount shows") != std::string::npos);
    why.clear();
    CHECK(cgroup2_dir_from(unified, "0::/../other\n", why).empty());
    CHECK(why.find("outside what its cgroup namespace shows") != std::string::npos);
    why.clear();
    CHECK(cgroup2_dir_from(hybrid.substr(0, hybrid.find('\n') + 1), "0::/\n", why).empty());
    CHECK(why == "no cgroup2 file system is mounted");
    why.clear();
    CHECK(cgroup2_dir_from(unified, "1:name=systemd:/\n", why).empty());
    CHECK(why.find("no cgroup in a v2 hierarchy") != std::string::npos);
}

TEST_CASE("process: stopping a worker ends the daemon it started") {
    using namespace test_stop;
    if (!cgroups_available()) return;
    asio::io_context io;
    pid_t daemon = 0;
    std::vector<elastic::child_process> workers;
    workers.push_back(ready_worker(io, {"daemon"}, &daemon));
    REQUIRE(daemon > 0);
    const auto result = run(io, elastic::stop(workers, quick(std::chrono::seconds(60))));
    REQUIRE(result.workers.size() == 1);
    CHECK(result.workers[0].outcome == elastic::stop_outcome::signaled);
    CHECK(result.clean());
    CHECK(workers[0].reaped());
    CHECK(process_support::await_deaths({daemon}, std::chrono::seconds(60)).empty());
}

TEST_CASE("process: the wait after SIGKILL is bounded and reports what is left") {
    using namespace test_stop;
    using elastic::detail::process::exit_set;
    asio::io_context io;
    std::vector<elastic::child_process> workers;
    workers.push_back(ready_worker(io, {"sleep"}));
    workers.push_back(ready_worker(io, {"sleep"}));
    CHECK(workers[0].signal(SIGKILL));
    // Stands in for a process in uninterruptible sleep: one that does not die within the bound.
    const auto pending = run(io, [&]() -> asio::awaitable<std::vector<std::size_t>> {
        exit_set set(co_await asio::this_coro::executor);
        set.add(workers[0].native_pidfd(), 0);
        set.add(workers[1].native_pidfd(), 1);
        const auto pointers = elastic::detail::process::addresses(workers);
        co_await elastic::detail::process::await_exits_or_timeout(set, pointers, std::chrono::milliseconds(100));
        co_return set.pending();
    }());
    CHECK(pending == std::vector<std::size_t>{1});
    CHECK(workers[0].status());  // recorded as it was seen
    CHECK_FALSE(workers[1].status());
    const auto result = run(io, elastic::stop(workers, quick(std::chrono::seconds(60))));
    CHECK(result.workers[0].outcome == elastic::stop_outcome::already_exited);
    CHECK(result.workers[1].outcome == elastic::stop_outcome::signaled);
}

TEST_CASE("process: awaiting 16 sleeping children costs the agent no CPU") {
    using namespace test_stop;
    using namespace asio::experimental::awaitable_operators;
    asio::io_context io;
    std::vector<elastic::child_process> workers;
    for (int i = 0; i < 16; ++i) workers.push_back(ready_worker(io, {"sleep"}));
    // The window opens once every wait is armed (setting up is not idling) and spans 2 s.
    std::chrono::nanoseconds before{-1};
    std::chrono::nanoseconds after{-1};
    const auto idle = [&]() -> asio::awaitable<void> {
        asio::steady_timer timer(co_await asio::this_coro::executor, std::chrono::milliseconds(50));
        co_await timer.async_wait(asio::use_awaitable);
        before = idle_cpu::cpu_time(::getpid());
        timer.expires_after(std::chrono::seconds(2));
        co_await timer.async_wait(asio::use_awaitable);
        after = idle_cpu::cpu_time(::getpid());
    };
    const auto outcome = run(io, [&]() -> asio::awaitable<std::size_t> {
        const auto first = co_await (elastic::wait_any(workers) || idle());
        co_return first.index();
    }());
    CHECK(outcome == 1);  // the idle window ended first: no worker exited
    REQUIRE(before.count() >= 0);
    INFO("CPU in the 2 s window: ", idle_cpu::ms(after - before), " ms");
    CHECK(after - before <= idle_cpu::budget);
    const auto result = run(io, elastic::stop(workers, quick(std::chrono::seconds(60))));
    CHECK(result.clean());
    for (const auto& w : result.workers) CHECK(w.outcome == elastic::stop_outcome::signaled);
}
