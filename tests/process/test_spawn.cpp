// Spawning real processes: exit codes and signals, exec errors, descriptors, signal state,
// environment, directory, pipes, sessions, and the agent's own signals.
// test-tags: concurrent
#include "elastic/process/child.hpp"
#include "elastic/process/exit.hpp"
#include "elastic/process/signals.hpp"
#include "elastic/process/spawn.hpp"

#include "process_support.hpp"

#include <doctest/doctest.h>

#include <asio/ip/tcp.hpp>
#include <asio/write.hpp>

#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace test_spawn {

using process_support::read_all;
using process_support::read_line;
using process_support::run;
using process_support::spawn_worker;

elastic::process_exit run_to_exit(asio::io_context& io, std::vector<std::string> args) {
    auto child = spawn_worker(io, std::move(args));
    const auto observed = run(io, child.wait());
    CHECK(observed.pid == child.pid());
    child.reap();
    return observed;
}

std::string temp_dir() {
    std::string pattern = "/tmp/elastic-process-XXXXXX";
    REQUIRE(::mkdtemp(pattern.data()) != nullptr);
    return pattern;
}

}  // namespace test_spawn

TEST_CASE("process: exit codes and signals are reported exactly") {
    using namespace test_spawn;
    asio::io_context io;
    for (int code : {0, 3, 255}) {
        const auto observed = run_to_exit(io, {"exit", std::to_string(code)});
        const auto& status = observed.status;
        CHECK(status.exited());
        CHECK_FALSE(status.signaled());
        CHECK(status.code() == code);
        CHECK(status.signal() == 0);
        CHECK_FALSE(status.core_dumped);
        CHECK(status.returncode() == code);
        CHECK(status.shell_code() == code);
        CHECK(status.success() == (code == 0));
        CHECK(status.describe() == "exited with code " + std::to_string(code));
        CHECK(observed.steady_time.time_since_epoch().count() != 0);
        CHECK(observed.system_time.time_since_epoch().count() != 0);
    }
    for (int sig : {SIGTERM, SIGUSR1, SIGINT}) {
        const auto status = run_to_exit(io, {"raise", std::to_string(sig)}).status;
        CHECK(status.signaled());
        CHECK(status.signal() == sig);
        CHECK(status.code() == -1);
        CHECK(status.returncode() == -sig);
        CHECK(status.shell_code() == 128 + sig);
        CHECK_FALSE(status.success());
    }
    {
        auto child = spawn_worker(io, {"sleep"});
        auto out = child.take_stdout();
        std::string buffer;
        CHECK(run(io, read_line(*out, buffer)) == "ready");
        CHECK_FALSE(child.check_exit());
        CHECK(child.signal(SIGKILL));
        const auto observed = run(io, child.wait());
        CHECK(observed.status.signal() == SIGKILL);
        CHECK(observed.status.describe() == "killed by signal 9 (SIGKILL)");
        // Observed once, the status is kept: a second wait returns it at once.
        const auto again = run(io, child.wait());
        CHECK(again.steady_time == observed.steady_time);
        CHECK_FALSE(child.signal(SIGTERM));  // exited: nothing to signal
        child.reap();
        CHECK(child.reaped());
    }
    CHECK(elastic::signal_name(SIGTERM) == "SIGTERM");
    CHECK(elastic::signal_name(SIGRTMIN + 2) == "SIGRTMIN+2");
}

TEST_CASE("process: a program that cannot be executed is an error with errno's reason") {
    using namespace test_spawn;
    asio::io_context io;
    const std::string dir = temp_dir();
    const auto expect_error = [&](elastic::spawn_options options, int code, const std::string& text) {
        bool thrown = false;
        try {
            elastic::spawn(io.get_executor(), options);
        } catch (const elastic::spawn_error& e) {
            thrown = true;
            CHECK(e.code() == code);
            const std::string what = e.what();
            INFO(what);
            CHECK(what.find(text) != std::string::npos);
        }
        CHECK(thrown);
    };
    elastic::spawn_options options;
    options.program = dir + "/missing";
    expect_error(options, ENOENT, "No such file or directory");

    const std::string not_executable = dir + "/not-executable";
    std::ofstream(not_executable) << "#!/bin/sh\nexit 0\n";
    ::chmod(not_executable.c_str(), 0644);
    options.program = not_executable;
    expect_error(options, EACCES, "Permission denied");

    options.program = "elastic-no-such-program";
    options.env = std::vector<std::string>{"PATH=" + dir};
    expect_error(options, ENOENT, "PATH=" + dir);

    options = {};
    options.program = process_support::worker_program();
    options.args = {"exit", "0"};
    options.cwd = dir + "/no-such-directory";
    expect_error(options, ENOENT, "working directory");

    options = {};
    expect_error(options, EINVAL, "program is empty");

    // Every failed child was reaped: no zombie is left (the watcher is the one live child).
    siginfo_t info{};
    CHECK(::waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT) == 0);
    CHECK(info.si_pid == 0);
    ::unlink(not_executable.c_str());
    ::rmdir(dir.c_str());
}

TEST_CASE("process: a worker sees only descriptors 0, 1 and 2") {
    using namespace test_spawn;
    asio::io_context io;
    // Descriptors a careless agent leaks: no O_CLOEXEC, and an Asio socket (Asio sets none).
    const int leaked_file = ::open("/dev/null", O_RDONLY);
    const int leaked_socket = ::socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(leaked_file >= 0);
    REQUIRE(leaked_socket >= 0);
    asio::ip::tcp::acceptor acceptor(io, {asio::ip::address_v4::loopback(), 0});
    REQUIRE((::fcntl(acceptor.native_handle(), F_GETFD) & FD_CLOEXEC) == 0);

    auto child = spawn_worker(io, {"fds"});
    auto out = child.take_stdout();
    CHECK(run(io, read_all(*out)) == "0 1 2\n");
    CHECK(run(io, child.wait()).status.success());
    child.reap();
    ::close(leaked_file);
    ::close(leaked_socket);
}

TEST_CASE("process: signal dispositions and the signal mask are reset in the worker") {
    using namespace test_spawn;
    asio::io_context io;
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    ::sigaction(SIGUSR2, &ignore, nullptr);
    sigset_t block;
    ::sigemptyset(&block);
    ::sigaddset(&block, SIGUSR1);
    ::pthread_sigmask(SIG_BLOCK, &block, nullptr);
    elastic::signal_events events(io.get_executor(), {SIGHUP});  // a handled signal too

    auto child = spawn_worker(io, {"sigstate"});
    auto out = child.take_stdout();
    CHECK(run(io, read_all(*out)) == "blocked 0000000000000000 ignored 0000000000000000\n");
    CHECK(run(io, child.wait()).status.success());
    child.reap();

    // The agent itself ignores SIGPIPE now (spawn prepared it); the worker did not inherit that.
    struct sigaction current {};
    ::sigaction(SIGPIPE, nullptr, &current);
    const bool ignored = current.sa_handler == SIG_IGN;
    CHECK(ignored);
    ::pthread_sigmask(SIG_UNBLOCK, &block, nullptr);
}

TEST_CASE("process: environment, working directory and pipes") {
    using namespace test_spawn;
    asio::io_context io;
    {
        elastic::spawn_options options;
        options.program = process_support::worker_program();
        options.args = {"env", "ELASTIC_TEST_VALUE"};
        options.env = std::vector<std::string>{"ELASTIC_TEST_VALUE=forty two"};
        options.out = elastic::stdio::pipe();
        auto child = elastic::spawn(io.get_executor(), options);
        auto out = child.take_stdout();
        CHECK(run(io, read_all(*out)) == "forty two\n");
        CHECK(run(io, child.wait()).status.success());
        child.reap();
    }
    {
        // Without env, the agent's own environment.
        ::setenv("ELASTIC_TEST_INHERITED", "yes", 1);
        auto child = spawn_worker(io, {"env", "ELASTIC_TEST_INHERITED"});
        auto out = child.take_stdout();
        CHECK(run(io, read_all(*out)) == "yes\n");
        CHECK(run(io, child.wait()).status.success());
        child.reap();
    }
    {
        const std::string dir = temp_dir();
        elastic::spawn_options options;
        options.program = process_support::worker_program();
        options.args = {"cwd"};
        options.cwd = dir;
        options.out = elastic::stdio::pipe();
        auto child = elastic::spawn(io.get_executor(), options);
        auto out = child.take_stdout();
        CHECK(run(io, read_all(*out)) == dir + "\n");
        CHECK(run(io, child.wait()).status.success());
        child.reap();
        ::rmdir(dir.c_str());
    }
    {
        auto child = spawn_worker(io, {"stderr", "to the error stream"}, elastic::stdio::pipe());
        auto out = child.take_stdout();
        auto err = child.take_stderr();
        CHECK_FALSE(child.take_stderr());  // taken once
        CHECK(run(io, read_all(*err)) == "to the error stream\n");
        CHECK(run(io, read_all(*out)) == "out\n");
        CHECK(run(io, child.wait()).status.success());
        child.reap();
    }
    {
        elastic::spawn_options options;
        options.program = process_support::worker_program();
        options.args = {"cat"};
        options.in = elastic::stdio::pipe();
        options.out = elastic::stdio::pipe();
        auto child = elastic::spawn(io.get_executor(), options);
        auto in = child.take_stdin();
        auto out = child.take_stdout();
        const std::string text = "through stdin and back\n";
        asio::write(*in, asio::buffer(text));
        in->close();
        CHECK(run(io, read_all(*out)) == text);
        CHECK(run(io, child.wait()).status.success());
        child.reap();
    }
    {
        // A program found in PATH, stdout to /dev/null, stderr to a file of the caller's.
        const std::string dir = temp_dir();
        const std::string log = dir + "/err.log";
        const int log_fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
        REQUIRE(log_fd >= 0);
        elastic::spawn_options options;
        options.program = "sh";
        options.args = {"-c", "echo lost; echo kept >&2"};
        options.out = elastic::stdio::null();
        options.err = elastic::stdio::descriptor(log_fd);
        auto child = elastic::spawn(io.get_executor(), options);
        CHECK(run(io, child.wait()).status.success());
        child.reap();
        ::close(log_fd);
        std::ifstream file(log);
        std::string line;
        std::getline(file, line);
        CHECK(line == "kept");
        ::unlink(log.c_str());
        ::rmdir(dir.c_str());
    }
}

TEST_CASE("process: a worker leads its own session or process group") {
    using namespace test_spawn;
    asio::io_context io;
    {
        auto child = spawn_worker(io, {"sleep"});
        auto out = child.take_stdout();
        std::string buffer;
        CHECK(run(io, read_line(*out, buffer)) == "ready");
        CHECK(::getpgid(child.pid()) == child.pid());
        CHECK(::getsid(child.pid()) == child.pid());
        CHECK(child.pgid() == child.pid());
        CHECK(child.signal_group(SIGTERM));
        CHECK(run(io, child.wait()).status.signal() == SIGTERM);
        child.reap();
    }
    {
        elastic::spawn_options options;
        options.program = process_support::worker_program();
        options.args = {"sleep"};
        options.out = elastic::stdio::pipe();
        options.isolation = elastic::process_isolation::process_group;
        auto child = elastic::spawn(io.get_executor(), options);
        auto out = child.take_stdout();
        std::string buffer;
        CHECK(run(io, read_line(*out, buffer)) == "ready");
        CHECK(::getpgid(child.pid()) == child.pid());
        CHECK(::getsid(child.pid()) == ::getsid(0));
        CHECK(child.signal(SIGTERM));
        CHECK(run(io, child.wait()).status.signal() == SIGTERM);
        child.reap();
    }
}

TEST_CASE("process: workers outlive the thread that spawned them") {
    using namespace test_spawn;
    asio::io_context io;
    std::optional<elastic::child_process> child;
    // PR_SET_PDEATHSIG fires when the forking thread ends: the spawner thread does every fork,
    // so a caller's thread ending must not kill the worker.
    std::thread([&] { child.emplace(spawn_worker(io, {"sleep"})); }).join();
    REQUIRE(child);
    auto out = child->take_stdout();
    std::string buffer;
    CHECK(run(io, read_line(*out, buffer)) == "ready");
    CHECK(child->signal(SIGTERM));
    CHECK(run(io, child->wait()).status.signal() == SIGTERM);  // not SIGKILL from a parent death signal
    child->reap();
}

TEST_CASE("process: destroying a child_process kills its process group") {
    using namespace test_spawn;
    asio::io_context io;
    pid_t worker = 0;
    pid_t grandchild = 0;
    {
        auto child = spawn_worker(io, {"fork-grandchild"});
        auto out = child.take_stdout();
        std::string buffer;
        const std::string line = run(io, read_line(*out, buffer));
        REQUIRE(line.rfind("grandchild ", 0) == 0);
        grandchild = static_cast<pid_t>(std::stoi(line.substr(11)));
        CHECK(run(io, read_line(*out, buffer)) == "ready");
        worker = child.pid();
    }
    CHECK(process_support::await_deaths({worker, grandchild}, std::chrono::seconds(60)).empty());
}

TEST_CASE("process: the agent's signals arrive as events") {
    asio::io_context io;
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    ::sigaction(SIGCHLD, &ignore, nullptr);
    elastic::signal_events events(io.get_executor());
    struct sigaction current {};
    ::sigaction(SIGCHLD, nullptr, &current);
    const bool by_default = current.sa_handler == SIG_DFL;
    CHECK(by_default);  // never left ignored: exit statuses would be lost

    auto received = asio::co_spawn(
        io,
        [&]() -> asio::awaitable<std::vector<int>> {
            std::vector<int> got;
            ::kill(::getpid(), SIGHUP);
            got.push_back(co_await events.next());
            ::kill(::getpid(), SIGTERM);
            got.push_back(co_await events.next());
            co_return got;
        },
        asio::use_future);
    io.run();
    CHECK(received.get() == std::vector<int>{SIGHUP, SIGTERM});
}
