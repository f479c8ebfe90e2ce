// The "world" lines agent-worker prints, and waits on real agents' output and workers' ends,
// shared by the tests that run several agents (c10d and etcd-v3).
#pragma once

#include "agent_support.hpp"

#include <doctest/doctest.h>

#include <cerrno>
#include <csignal>
#include <sstream>
#include <string>
#include <vector>

#include <poll.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace world_support {

using agent_support::launched;

/// One "world" line of agent-worker: world <WORLD_SIZE> <GROUP_WORLD_SIZE> <RANK> <GROUP_RANK>
/// <TORCHELASTIC_RESTART_COUNT> <RDZV_TEST_NODE> <pid>.
struct world_line {
    int world = -1;
    int group_world = -1;
    int rank = -1;
    int group_rank = -1;
    int attempt = -1;
    int node = -1;
    pid_t pid = -1;
};

/// The world lines of one agent's stdout, in order; `world` > 0 keeps only that world size.
inline std::vector<world_line> worlds(const std::string& out, int world = 0) {
    std::vector<world_line> lines;
    std::istringstream in(out);
    for (std::string text; std::getline(in, text);) {
        if (text.rfind("world ", 0) != 0) continue;
        std::istringstream fields(text.substr(6));
        world_line w;
        fields >> w.world >> w.group_world >> w.rank >> w.group_rank >> w.attempt >> w.node >> w.pid;
        REQUIRE_MESSAGE(!fields.fail(), "malformed world line: " << text);
        if (world <= 0 || w.world == world) lines.push_back(w);
    }
    return lines;
}

/// The first stderr line holding `text` (empty when none does).
inline std::string line_with(const std::string& err, const std::string& text) {
    std::istringstream in(err);
    for (std::string line; std::getline(in, line);) {
        if (line.find(text) != std::string::npos) return line;
    }
    return {};
}

inline bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

/// Reads the agent's pipes until stdout has `count` lines starting with `prefix`; fails the case
/// (with the agent's stderr) when its pipes end first.
inline void await_lines(launched& agent, const std::string& prefix, int count = 1) {
    const bool seen = agent.read_lines(prefix, count);
    INFO("stdout:\n" << agent.out());
    INFO("stderr:\n" << agent.err());
    REQUIRE_MESSAGE(seen, "expected " << count << " line(s) starting with '" << prefix << "'");
}

/// Reads the agent's pipes until its stderr holds `text` (launched::read_until hands the
/// predicate stdout, but both pipes are read on every round, so err() grows as well).
inline void await_stderr(launched& agent, const std::string& text) {
    const bool seen = agent.read_until([&](const std::string&) { return has(agent.err(), text); });
    INFO("stdout:\n" << agent.out());
    INFO("stderr:\n" << agent.err());
    REQUIRE_MESSAGE(seen, "expected '" << text << "' on stderr");
}

/// Awaits the end of `pid` — a worker of an agent, not our child — through a pidfd, which reads
/// as readable once the process has exited (a zombie nobody reaped yet counts as ended). The
/// bound is no speed requirement: it only turns a leaked worker into a failed check instead of a
/// hung case; a leaked worker is then killed, so the case can still read its agent's pipes to
/// the end.
inline bool ended(pid_t pid) {
    const int fd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0U));
    if (fd < 0) return errno == ESRCH;
    pollfd p{fd, POLLIN, 0};
    int rc = 0;
    do {
        rc = ::poll(&p, 1, 120'000);
    } while (rc < 0 && errno == EINTR);
    ::close(fd);
    if (rc == 1) return true;
    ::kill(pid, SIGKILL);
    return false;
}

/// Whether `pid` is gone and reaped: for the workers of an agent that has exited (it reaps its
/// own workers before it exits).
inline bool reaped(pid_t pid) { return ::kill(pid, 0) == -1 && errno == ESRCH; }

}  // namespace world_support
