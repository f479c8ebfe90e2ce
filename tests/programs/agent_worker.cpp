// agent-worker: a worker for the agent's tests and benchmark whose behaviour its environment
// chooses, per rank and per attempt.
//
// AGENT_WORKER_DO = rule;rule;...   rule = selector:step+step+...   (first matching rule wins)
//   selector: *  |  r<rank>  |  a<attempt>  |  a<attempt>r<rank>  |  w<world>  |  w<world>r<rank>
//             (rank = RANK, attempt = TORCHELASTIC_RESTART_COUNT, world = WORLD_SIZE: a
//             membership restart keeps the attempt and changes the world)
//   steps, in order:
//     env      write every variable to $AGENT_WORKER_DIR/env.<attempt>.<rank> (NAME=value lines)
//     envw     the same to $AGENT_WORKER_DIR/env.w<world>.<rank>
//     world    print "world <WORLD_SIZE> <GROUP_WORLD_SIZE> <RANK> <GROUP_RANK> <attempt>
//              <RDZV_TEST_NODE> <pid>"
//     argv     write the arguments to $AGENT_WORKER_DIR/argv.<attempt>.<rank> (one per line)
//     store    connect to MASTER_ADDR:MASTER_PORT; fail (exit 99) if a key "stale/<r>" written
//              by an earlier attempt (its value: that attempt) is visible; then set "stale/<rank>"
//     waitfor<r> wait until rank r has done its "store" step (its key exists)
//     go       wait until the file $AGENT_WORKER_DIR/go exists (the test's word to go on)
//     stderr   write three lines to stderr, the last without its newline
//     running  print "running <attempt> <rank> <CLOCK_MONOTONIC ns>"
//     exit<N>  exit with code N                 sig<N>  raise signal N (default action)
//     sleep<ms> work for <ms> milliseconds (a stand-in for training time, never a synchronisation)
//     hang     print "ready <rank> <attempt> <pid>", then wait forever (signals act by default)
//     trap     handle HUP INT QUIT TERM USR1 USR2; print "ready ..."; on a signal print
//              "got <rank> <signal number>" and exit 0
//     trapgo   trap, but on the signal first wait for the "go" file (a worker slow to stop)
//     ignore   ignore SIGTERM; print "ready ..."; wait forever (only SIGKILL ends it)
//   watchdog (elastic/watchdog.hpp, elasticrun --watchdog):
//     record   install elastic::record's handlers (the stack dump on the watchdog's signal)
//     beat<N>  progress(0) .. progress(N-1): N heartbeats
//     enter<S> enter section S (until leave)         leave  leave the innermost section
//     thread   start a thread that waits forever in agent_worker_helper_thread()
//     threads<N> start N such threads       blocker  one that blocks SIGUSR2 first
//     truncate cut $ELASTIC_WATCHDOG_FILE to 0 bytes (a hostile worker)
//     fifo     put a FIFO where $ELASTIC_WATCHDOG_STACKS goes (a hostile worker)
//     ownusr2  install a SIGUSR2 handler of the program's own that prints "own usr2 <rank>"
//     selfusr2 send SIGUSR2 to itself (kill: not from the agent), then wait for "own usr2"
//     xsections enter "data", enter "allreduce", leave "data", leave "allreduce" (out of order)
//     stuck    print "ready ...", then wait forever in agent_worker_stuck_in_collective()
//   torch's file timer (TORCHELASTIC_TIMER_FILE), requests written as FileTimerClient does:
//     ftset<S>_<ms>_<sig>  scope S expires in <ms> ms, then signal <sig> (0: none)
//     ftrel<S>  release scope S
//     ftjunk   write lines that are no requests: not JSON, 5000 bytes, a bad pid, a bad signal
//     ftforeign ask for $AGENT_WORKER_VICTIM's pid to get SIGKILL at once (a hostile worker)
//     ftchild  fork a child (same process group) whose own scope asks for SIGKILL in 100 ms;
//              print "child killed <rank>" once it died of it (else exit 96)
//   Without a matching rule, or after the last step: exit 0.
// Every line goes out in one write(2), so lines of different workers never mix.
#include "elastic/record.hpp"
#include "elastic/store/blocking_client.hpp"
#include "elastic/watchdog.hpp"

#include <fmt/format.h>

#include <cerrno>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <memory>
#include <thread>
#include <string>
#include <string_view>
#include <vector>

#include <fcntl.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <pthread.h>
#include <unistd.h>

extern "C" char** environ;

// Named functions (outside the anonymous namespace) the watchdog tests find in the stacks.
[[gnu::noinline]] void agent_worker_stuck_in_collective() {
    for (;;) ::pause();
}
[[gnu::noinline]] void agent_worker_helper_thread() {
    for (;;) ::pause();
}

namespace {
volatile std::sig_atomic_t own_usr2_seen = 0;
int own_usr2_rank = 0;
void on_own_usr2(int) {
    char line[32];
    const int n = std::snprintf(line, sizeof line, "own usr2 %d\n", own_usr2_rank);
    if (n > 0) (void)!::write(1, line, static_cast<std::size_t>(n));
    own_usr2_seen = 1;
}
}  // namespace

namespace {

// One line into torch's file timer FIFO, as FileTimerClient writes it (non-blocking open,
// one write). False when the FIFO cannot be opened or written.
bool timer_request(const std::string& line) {
    const int fd = ::open(std::getenv("TORCHELASTIC_TIMER_FILE"), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return false;
    const auto n = ::write(fd, line.data(), line.size());
    ::close(fd);
    return n == static_cast<ssize_t>(line.size());
}

std::string timer_json(long pid, const std::string& scope, double expires, int sig) {
    return fmt::format("{{\"version\": 1, \"pid\": {}, \"scope_id\": \"{}\", \"expiration_time\": {:.6f}, "
                       "\"signal\": {}}}\n",
                       pid, scope, expires, sig);
}

double wall_seconds() {
    timespec t{};
    ::clock_gettime(CLOCK_REALTIME, &t);
    return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) / 1e9;
}

std::string var(const char* name, const char* fallback = "") {
    const char* v = std::getenv(name);
    return v != nullptr ? std::string(v) : std::string(fallback);
}

void say(int fd, const std::string& line) {
    std::string_view rest = line;
    while (!rest.empty()) {
        const ssize_t n = ::write(fd, rest.data(), rest.size());
        if (n <= 0) return;
        rest.remove_prefix(static_cast<std::size_t>(n));
    }
}

std::vector<std::string> split(std::string_view text, char sep) {
    std::vector<std::string> out;
    for (;;) {
        const auto at = text.find(sep);
        out.emplace_back(text.substr(0, at));
        if (at == std::string_view::npos) return out;
        text.remove_prefix(at + 1);
    }
}

bool matches(const std::string& selector, const std::string& rank, const std::string& attempt,
             const std::string& world) {
    if (selector == "*") return true;
    std::string want_rank;
    std::string want_attempt;
    std::string_view s = selector;
    if (!s.empty() && s.front() == 'w') {
        s.remove_prefix(1);
        const auto r = s.find('r');
        if (std::string(s.substr(0, r)) != world) return false;
        s = r == std::string_view::npos ? std::string_view{} : s.substr(r);
    } else if (!s.empty() && s.front() == 'a') {
        s.remove_prefix(1);
        const auto r = s.find('r');
        want_attempt = std::string(s.substr(0, r));
        s = r == std::string_view::npos ? std::string_view{} : s.substr(r);
    }
    if (!s.empty() && s.front() == 'r') want_rank = std::string(s.substr(1));
    return (want_rank.empty() || want_rank == rank) && (want_attempt.empty() || want_attempt == attempt);
}

volatile std::sig_atomic_t received = 0;
extern "C" void on_signal(int sig) { received = sig; }

void write_file(const std::string& name, const std::string& text) {
    const auto path = var("AGENT_WORKER_DIR", ".") + "/" + name;
    std::ofstream out(path + ".tmp");
    out << text;
    out.close();
    std::rename((path + ".tmp").c_str(), path.c_str());  // whole or absent for the reader
}

// Waits (inotify, no polling) until $AGENT_WORKER_DIR/go exists.
void wait_for_go() {
    const auto dir = var("AGENT_WORKER_DIR", ".");
    const int fd = ::inotify_init1(IN_CLOEXEC);
    if (fd < 0 || ::inotify_add_watch(fd, dir.c_str(), IN_CREATE | IN_MOVED_TO) < 0) {
        say(2, fmt::format("agent-worker: cannot watch {}: {}\n", dir, std::strerror(errno)));
        std::exit(98);
    }
    alignas(inotify_event) char buffer[4096];
    while (::access((dir + "/go").c_str(), F_OK) != 0) {
        if (::read(fd, buffer, sizeof buffer) < 0 && errno != EINTR) std::exit(98);
    }
    ::close(fd);
}

}  // namespace

int main(int argc, char** argv) {
    const auto rank = var("RANK", "0");
    const auto attempt = var("TORCHELASTIC_RESTART_COUNT", "0");
    const auto world_size = var("WORLD_SIZE", "1");
    const auto ready = [&] { say(1, fmt::format("ready {} {} {}\n", rank, attempt, ::getpid())); };

    std::vector<std::string> steps;
    for (const auto& rule : split(var("AGENT_WORKER_DO"), ';')) {
        const auto colon = rule.find(':');
        if (colon == std::string::npos) continue;
        if (matches(rule.substr(0, colon), rank, attempt, world_size)) {
            steps = split(std::string_view(rule).substr(colon + 1), '+');
            break;
        }
    }
    std::vector<std::unique_ptr<elastic::section>> sections;
    for (const auto& step : steps) {
        if (step == "env") {
            std::string text;
            for (char** e = environ; e != nullptr && *e != nullptr; ++e) text += std::string(*e) + "\n";
            write_file(fmt::format("env.{}.{}", attempt, rank), text);
        } else if (step == "envw") {
            std::string text;
            for (char** e = environ; e != nullptr && *e != nullptr; ++e) text += std::string(*e) + "\n";
            write_file(fmt::format("env.w{}.{}", world_size, rank), text);
        } else if (step == "world") {
            say(1, fmt::format("world {} {} {} {} {} {} {}\n", world_size, var("GROUP_WORLD_SIZE", "1"), rank,
                               var("GROUP_RANK", "0"), attempt, var("RDZV_TEST_NODE", "-"), ::getpid()));
        } else if (step == "argv") {
            std::string text;
            for (int i = 0; i < argc; ++i) text += std::string(argv[i]) + "\n";
            write_file(fmt::format("argv.{}.{}", attempt, rank), text);
        } else if (step == "store") {
            elastic::store_client_options options;
            options.host = var("MASTER_ADDR");
            options.port = static_cast<std::uint16_t>(std::stoi(var("MASTER_PORT", "0")));
            elastic::blocking_store_client client(options);
            const int world = std::stoi(var("WORLD_SIZE", "1"));
            for (int r = 0; r < world; ++r) {
                const auto key = fmt::format("stale/{}", r);
                if (client.check({key}) && client.get(key) != attempt) {
                    say(1, fmt::format("STALE key stale/{} seen by rank {} in attempt {}\n", r, rank, attempt));
                    return 99;
                }
            }
            // The line first: a rank waiting for this key (waitfor) may end the group as soon
            // as it exists.
            say(1, fmt::format("store ok {} {}\n", rank, attempt));
            client.set(fmt::format("stale/{}", rank), attempt);
        } else if (step.rfind("waitfor", 0) == 0) {
            elastic::store_client_options options;
            options.host = var("MASTER_ADDR");
            options.port = static_cast<std::uint16_t>(std::stoi(var("MASTER_PORT", "0")));
            elastic::blocking_store_client client(options);
            client.wait({fmt::format("stale/{}", step.substr(7))});
        } else if (step == "go") {
            wait_for_go();
        } else if (step == "stderr") {
            say(2, fmt::format("line 1 from rank {}\nline 2 from rank {}\n", rank, rank));
            say(2, fmt::format("last words of rank {}", rank));
        } else if (step == "running") {
            timespec now{};
            ::clock_gettime(CLOCK_MONOTONIC, &now);
            say(1, fmt::format("running {} {} {}\n", attempt, rank,
                               static_cast<long long>(now.tv_sec) * 1000000000LL + now.tv_nsec));
        } else if (step.rfind("sleep", 0) == 0) {
            const long ms = std::atol(step.c_str() + 5);
            timespec left{ms / 1000, (ms % 1000) * 1000000L};
            while (::nanosleep(&left, &left) != 0 && errno == EINTR) {
            }
        } else if (step.rfind("exit", 0) == 0) {
            return std::atoi(step.c_str() + 4);
        } else if (step.rfind("sig", 0) == 0) {
            const int sig = std::atoi(step.c_str() + 3);
            std::signal(sig, SIG_DFL);
            std::raise(sig);
            return 120;  // not reached for a deadly signal
        } else if (step == "hang") {
            ready();
            for (;;) ::pause();
        } else if (step == "record") {
            elastic::install_error_handlers();
        } else if (step.rfind("beat", 0) == 0) {
            const long n = std::atol(step.c_str() + 4);
            for (long i = 0; i < n; ++i) elastic::progress(static_cast<std::uint64_t>(i));
        } else if (step.rfind("enter", 0) == 0) {
            sections.push_back(std::make_unique<elastic::section>(step.substr(5)));
        } else if (step == "leave") {
            if (!sections.empty()) sections.pop_back();
        } else if (step == "thread") {
            std::thread(agent_worker_helper_thread).detach();
        } else if (step.rfind("threads", 0) == 0) {
            for (long n = std::atol(step.c_str() + 7); n > 0; --n) std::thread(agent_worker_helper_thread).detach();
        } else if (step == "blocker") {
            std::thread([] {
                sigset_t usr2;
                sigemptyset(&usr2);
                sigaddset(&usr2, SIGUSR2);
                ::pthread_sigmask(SIG_BLOCK, &usr2, nullptr);
                agent_worker_helper_thread();
            }).detach();
        } else if (step == "truncate") {
            if (::truncate(var("ELASTIC_WATCHDOG_FILE").c_str(), 0) != 0) return 98;
        } else if (step == "ownusr2") {
            own_usr2_rank = std::atoi(rank.c_str());
            std::signal(SIGUSR2, on_own_usr2);
        } else if (step == "selfusr2") {
            ::kill(::getpid(), SIGUSR2);
            while (own_usr2_seen == 0) ::pause();
        } else if (step == "xsections") {
            auto data = std::make_unique<elastic::section>("data");
            auto allreduce = std::make_unique<elastic::section>("allreduce");
            data.reset();
            allreduce.reset();
        } else if (step == "fifo") {
            const auto path = var("ELASTIC_WATCHDOG_STACKS");
            ::unlink(path.c_str());
            if (::mkfifo(path.c_str(), 0600) != 0) return 98;
        } else if (step.rfind("ftset", 0) == 0) {
            const auto fields = step.substr(5);
            const auto a = fields.find('_');
            const auto b = fields.find('_', a + 1);
            const double ms = std::atof(fields.substr(a + 1, b - a - 1).c_str());
            const int sig = std::atoi(fields.substr(b + 1).c_str());
            if (!timer_request(timer_json(::getpid(), fields.substr(0, a), wall_seconds() + ms / 1000.0, sig))) {
                return 97;
            }
        } else if (step.rfind("ftrel", 0) == 0) {
            if (!timer_request(timer_json(::getpid(), step.substr(5), -1, 0))) return 97;
        } else if (step == "ftjunk") {
            const std::string lines[] = {
                "not json at all\n",
                std::string(5000, 'x') + "\n",
                "{\"pid\": \"me\", \"scope_id\": \"s\", \"expiration_time\": 1, \"signal\": 9}\n",
                timer_json(::getpid(), "badsignal", wall_seconds(), 4242),
                std::string("\x01\xff{\n"),
            };
            for (const auto& line : lines) {
                if (!timer_request(line)) return 97;
            }
        } else if (step == "ftchild") {
            const pid_t child = ::fork();
            if (child == 0) {
                if (!timer_request(timer_json(::getpid(), "loader", wall_seconds() + 0.1, SIGKILL))) ::_exit(97);
                for (;;) ::pause();
            }
            int status = 0;
            if (child < 0 || ::waitpid(child, &status, 0) != child || !WIFSIGNALED(status) ||
                WTERMSIG(status) != SIGKILL) {
                return 96;
            }
            say(1, fmt::format("child killed {}\n", rank));
        } else if (step == "ftforeign") {
            if (!timer_request(timer_json(std::atol(var("AGENT_WORKER_VICTIM").c_str()), "foreign", 0, SIGKILL))) {
                return 97;
            }
        } else if (step == "stuck") {
            ready();
            agent_worker_stuck_in_collective();
        } else if (step == "trap" || step == "trapgo") {
            sigset_t block;
            sigset_t old;
            sigemptyset(&block);
            for (const int s : {SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1, SIGUSR2}) {
                std::signal(s, on_signal);
                sigaddset(&block, s);
            }
            ::sigprocmask(SIG_BLOCK, &block, &old);
            ready();
            while (received == 0) ::sigsuspend(&old);
            if (step == "trapgo") wait_for_go();
            say(1, fmt::format("got {} {}\n", rank, static_cast<int>(received)));
            return 0;
        } else if (step == "ignore") {
            std::signal(SIGTERM, SIG_IGN);
            ready();
            for (;;) ::pause();
        }
    }
    return 0;
}
