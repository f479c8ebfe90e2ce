// A worker for the process-layer tests: exits, dies by signals, ignores SIGTERM, forks
// grandchildren, reports its descriptors, signal state, environment and directory.
//   process-worker exit N            exit with code N
//   process-worker raise SIG         die by signal SIG (default disposition)
//   process-worker sleep             print "ready", wait for signals forever
//   process-worker ignore-term       ignore SIGTERM, print "ready", wait forever
//   process-worker term-exit N       exit N on SIGTERM, print "ready", wait forever
//   process-worker fork-grandchild [ignore-term] [main-exits]
//                                    fork a grandchild that waits forever (ignoring SIGTERM if
//                                    asked; with main-exits, in a second thread while its main
//                                    thread ends, so /proc shows it a zombie), print
//                                    "grandchild <pid>" and "ready", wait forever
//   process-worker daemon [exit]     start a daemon (fork, setsid, fork: it leaves the worker's
//                                    process group and session), print "grandchild <pid>" with
//                                    the daemon's pid and "ready", then wait forever (or exit 0)
//   process-worker zombie-child      fork a child that exits at once and is never reaped (a zombie
//                                    of this worker), print "grandchild <pid>" once it is dead and
//                                    "ready", wait forever
//   process-worker setpgid-child [exit] [main-exits]
//                                    fork a child that moves to a process group of its own (it
//                                    stays in the worker's session; main-exits as above), print
//                                    "grandchild <pid>" and "ready", then wait forever (or exit 0)
//   process-worker fds               print the open descriptors, e.g. "0 1 2"
//   process-worker sigstate          print "blocked <hex> ignored <hex>" from /proc/self/status
//   process-worker env NAME          print $NAME or "(unset)"
//   process-worker cwd               print the working directory
//   process-worker stderr TEXT       print TEXT on stderr and "out" on stdout
//   process-worker cat               copy stdin to stdout until EOF
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <climits>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace {

[[noreturn]] void wait_forever() {
    for (;;) ::pause();
}

void say(const std::string& line) {
    std::fputs((line + "\n").c_str(), stdout);
    std::fflush(stdout);
}

void set_disposition(int sig, void (*handler)(int)) {
    struct sigaction action {};
    action.sa_handler = handler;
    ::sigaction(sig, &action, nullptr);
}

void* pause_forever(void*) { wait_forever(); }

// Waits forever in a second thread while the main thread ends: the process lives on, shown in
// /proc as a zombie.
[[noreturn]] void wait_forever_without_main_thread() {
    pthread_t thread;
    if (::pthread_create(&thread, nullptr, pause_forever, nullptr) != 0) ::_exit(3);
    ::pthread_exit(nullptr);
}

// Whether /proc/<pid>/stat shows `pid` a zombie within 10 s.
bool await_zombie(pid_t pid) {
    for (int i = 0; i < 10'000; ++i) {
        std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
        std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
        const auto close = text.rfind(')');
        if (close != std::string::npos && close + 2 < text.size() && text[close + 2] == 'Z') return true;
        ::usleep(1000);
    }
    std::fprintf(stderr, "the grandchild's main thread did not end\n");
    return false;
}

int term_exit_code = 0;
extern "C" void on_term(int) { ::_exit(term_exit_code); }

}  // namespace

int main(int argc, char** argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: process-worker MODE [ARG]\n");
        return 2;
    }
    const std::string mode = argv[1];
    const std::string arg = argc > 2 ? argv[2] : "";
    bool main_exits = false;
    for (int i = 2; i < argc; ++i) main_exits = main_exits || std::string(argv[i]) == "main-exits";
    if (mode == "exit") return std::atoi(arg.c_str());
    if (mode == "raise") {
        const int sig = std::atoi(arg.c_str());
        set_disposition(sig, SIG_DFL);
        ::kill(::getpid(), sig);
        wait_forever();
    }
    if (mode == "sleep") {
        say("ready");
        wait_forever();
    }
    if (mode == "ignore-term") {
        set_disposition(SIGTERM, SIG_IGN);
        say("ready");
        wait_forever();
    }
    if (mode == "term-exit") {
        term_exit_code = std::atoi(arg.c_str());
        set_disposition(SIGTERM, on_term);
        say("ready");
        wait_forever();
    }
    if (mode == "fork-grandchild") {
        // The grandchild is born with its disposition: no window in which SIGTERM kills it.
        if (arg == "ignore-term") set_disposition(SIGTERM, SIG_IGN);
        const pid_t pid = ::fork();
        if (pid < 0) {
            std::perror("fork");
            return 3;
        }
        if (pid == 0) {
            if (main_exits) wait_forever_without_main_thread();
            wait_forever();
        }
        // With main-exits, "grandchild" is said once /proc shows it a zombie (no event tells).
        if (main_exits && !await_zombie(pid)) return 3;
        set_disposition(SIGTERM, SIG_DFL);
        say("grandchild " + std::to_string(pid));
        say("ready");
        wait_forever();
    }
    if (mode == "daemon") {
        int fds[2];
        if (::pipe(fds) != 0) {
            std::perror("pipe");
            return 3;
        }
        const pid_t middle = ::fork();
        if (middle < 0) {
            std::perror("fork");
            return 3;
        }
        if (middle == 0) {
            ::setsid();
            const pid_t daemon = ::fork();
            if (daemon == 0) {
                ::close(fds[0]);
                const int null = ::open("/dev/null", O_RDWR);
                ::dup2(null, 0);
                ::dup2(null, 1);  // nor keep the worker's stdout pipe open
                ::dup2(null, 2);
                const pid_t self = ::getpid();
                if (::write(fds[1], &self, sizeof self) != sizeof self) ::_exit(3);
                ::close(fds[1]);
                wait_forever();
            }
            ::_exit(daemon < 0 ? 3 : 0);
        }
        ::close(fds[1]);
        pid_t daemon = 0;
        if (::read(fds[0], &daemon, sizeof daemon) != sizeof daemon) {
            std::fprintf(stderr, "the daemon did not report its pid\n");
            return 3;
        }
        int status = 0;
        ::waitpid(middle, &status, 0);
        say("grandchild " + std::to_string(daemon));
        say("ready");
        if (arg == "exit") return 0;
        wait_forever();
    }
    if (mode == "zombie-child") {
        const pid_t pid = ::fork();
        if (pid < 0) {
            std::perror("fork");
            return 3;
        }
        if (pid == 0) ::_exit(0);
        siginfo_t info{};
        if (::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOWAIT) != 0) return 3;  // dead, kept
        say("grandchild " + std::to_string(pid));
        say("ready");
        wait_forever();
    }
    if (mode == "setpgid-child") {
        const pid_t child = ::fork();
        if (child < 0) {
            std::perror("fork");
            return 3;
        }
        if (child == 0) {
            ::setpgid(0, 0);
            const int null = ::open("/dev/null", O_RDWR);
            ::dup2(null, 0);
            ::dup2(null, 1);  // nor keep the worker's stdout pipe open
            ::dup2(null, 2);
            if (main_exits) wait_forever_without_main_thread();
            wait_forever();
        }
        ::setpgid(child, child);  // both sides, so that it has moved before anyone is told
        if (main_exits && !await_zombie(child)) return 3;
        say("grandchild " + std::to_string(child));
        say("ready");
        if (arg == "exit") return 0;
        wait_forever();
    }
    if (mode == "fds") {
        DIR* dir = ::opendir("/proc/self/fd");
        if (dir == nullptr) return 4;
        std::vector<int> fds;
        while (const dirent* entry = ::readdir(dir)) {
            if (entry->d_name[0] == '.') continue;
            const int fd = std::atoi(entry->d_name);
            if (fd != ::dirfd(dir)) fds.push_back(fd);
        }
        ::closedir(dir);
        std::string line;
        for (int fd : fds) line += (line.empty() ? "" : " ") + std::to_string(fd);
        say(line);
        return 0;
    }
    if (mode == "sigstate") {
        std::ifstream status("/proc/self/status");
        std::string line;
        std::string blocked;
        std::string ignored;
        while (std::getline(status, line)) {
            if (line.rfind("SigBlk:", 0) == 0) blocked = line.substr(line.find_last_of(" \t") + 1);
            if (line.rfind("SigIgn:", 0) == 0) ignored = line.substr(line.find_last_of(" \t") + 1);
        }
        say("blocked " + blocked + " ignored " + ignored);
        return 0;
    }
    if (mode == "env") {
        const char* value = std::getenv(arg.c_str());
        say(value != nullptr ? value : "(unset)");
        return 0;
    }
    if (mode == "cwd") {
        char buffer[PATH_MAX];
        say(::getcwd(buffer, sizeof buffer) != nullptr ? buffer : "(error)");
        return 0;
    }
    if (mode == "stderr") {
        std::fputs((arg + "\n").c_str(), stderr);
        say("out");
        return 0;
    }
    if (mode == "cat") {
        char buffer[4096];
        for (;;) {
            const ssize_t n = ::read(0, buffer, sizeof buffer);
            if (n <= 0) return n == 0 ? 0 : 5;
            if (::write(1, buffer, static_cast<size_t>(n)) != n) return 6;
        }
    }
    std::fprintf(stderr, "process-worker: unknown mode '%s'\n", mode.c_str());
    return 2;
}
