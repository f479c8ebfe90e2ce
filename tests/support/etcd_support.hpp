// A real etcd cluster on loopback for tests: `members` etcd processes (Debian's etcd 3.4) forming
// one cluster, each with its own data dir in a private temporary directory, on free ports of
// 127.0.0.1, with fast elections (10 ms heartbeat, 100 ms election timeout). Readiness is awaited
// as an event, never by sleeping: each member's stdout and stderr go to a log file in the
// temporary directory, watched with inotify (and the member's death with a pidfd), until the
// member logs that it serves clients and has seen a leader. Everything is killed (SIGKILL),
// reaped and removed when the cluster goes out of scope, also when a REQUIRE throws midway; a
// test process that crashes takes its members along (PR_SET_PDEATHSIG).
//
//     etcd_support::cluster etcd(3);
//     std::system(("etcdctl --endpoints=" + etcd.endpoints() + " put a b").c_str());
//     const int leader = etcd.await_leader();
//     etcd.kill(leader);     // the other two keep a quorum...
//     etcd.await_leader();   // ...and elect a new leader: requests are not lost to the dead one
//     etcd.restart(leader);  // same data dir and ports, --initial-cluster-state existing
//
// With TLS (the client side only; peers speak plain http):
//
//     etcd_support::test_certs certs = etcd_support::make_test_certs(dir);
//     if (certs.status == etcd_support::certs_status::no_openssl) return;  // skip
//     REQUIRE_MESSAGE(certs.status == etcd_support::certs_status::made, certs.error);
//     etcd_support::cluster etcd(1, certs.server_options());
//     // etcdctl --endpoints=<etcd.client_urls()> <certs.etcdctl_flags()> get a
//
// Test code, not product code: plain POSIX, blocking, Linux only.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/inotify.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

extern char** environ;

namespace etcd_support {

/// One member of a cluster: its name (--name) and its ports on `host` (127.0.0.1 by default).
struct member_info {
    std::string name;
    std::uint16_t client_port = 0;
    std::uint16_t peer_port = 0;
    bool tls = false;  ///< whether clients speak https (options::tls)
    std::string host = "127.0.0.1";

    /// "http://HOST:PORT" ("https://..." when tls).
    [[nodiscard]] std::string client_url() const {
        return std::string(tls ? "https" : "http") + "://" + host + ":" + std::to_string(client_port);
    }
    /// "http://HOST:PORT" of the peer port (peers always speak http).
    [[nodiscard]] std::string peer_url() const { return "http://" + host + ":" + std::to_string(peer_port); }
};

/// How a cluster is started.
struct options {
    /// Clients speak https: passes --cert-file and --key-file, --trusted-ca-file when not empty
    /// and --client-cert-auth when client_cert_auth is set. Peer traffic stays plain http.
    bool tls = false;
    std::string cert_file;
    std::string key_file;
    std::string trusted_ca_file;
    bool client_cert_auth = false;
    /// Appended to every member's command line (also on restart).
    std::vector<std::string> extra_args;
    /// The etcd program: a path, or a name looked up in $PATH.
    std::string program = "etcd";
    /// How long a start (or restart) may take until every member is ready.
    std::chrono::milliseconds ready_timeout{30000};
    /// The address every member listens on (one this process's network namespace may lack, with
    /// `wrapper`); its ports are picked free on this process's loopback.
    std::string host = "127.0.0.1";
    /// A command each member runs under, e.g. {"/usr/sbin/ip", "netns", "exec", "ns"}: the
    /// member is `wrapper... etcd args...` (a wrapper that execs keeps the member's pid).
    std::vector<std::string> wrapper;
};

/// `text` quoted for a POSIX shell (std::system): 'text', with each ' written '\''.
inline std::string shell_quote(std::string_view text) {
    std::string out = "'";
    for (char c : text) {
        if (c == '\'') {
            out += "'\\''";
        } else {
            out += c;
        }
    }
    return out + "'";
}

/// What make_test_certs() did.
enum class certs_status { made, no_openssl, failed };

/// The files of make_test_certs(): a CA, a server certificate for 127.0.0.1 and a client
/// certificate, both signed by the CA. All PEM; the keys are unencrypted P-256 keys.
struct test_certs {
    certs_status status = certs_status::failed;
    std::string error;  ///< why, when status is failed (the openssl command and its output)
    std::string ca_cert, ca_key;
    std::string server_cert, server_key;
    std::string client_cert, client_key;

    /// Whether the files were made.
    explicit operator bool() const { return status == certs_status::made; }

    /// Cluster options for TLS with these files (trusted CA: the test CA).
    [[nodiscard]] options server_options(bool client_cert_auth = true) const {
        options o;
        o.tls = true;
        o.cert_file = server_cert;
        o.key_file = server_key;
        o.trusted_ca_file = ca_cert;
        o.client_cert_auth = client_cert_auth;
        return o;
    }

    /// etcdctl's TLS flags for the test CA and the client certificate, shell-quoted:
    /// "--cacert='.../ca.pem' --cert='.../client.pem' --key='.../client.key'".
    [[nodiscard]] std::string etcdctl_flags() const {
        return "--cacert=" + shell_quote(ca_cert) + " --cert=" + shell_quote(client_cert) +
               " --key=" + shell_quote(client_key);
    }
};

namespace detail {

inline std::string errno_text(const std::string& what, int error = errno) { return what + ": " + std::strerror(error); }

/// An owned file descriptor.
class fd_owner {
public:
    fd_owner() = default;
    explicit fd_owner(int fd) : fd_(fd) {}
    fd_owner(fd_owner&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
    fd_owner& operator=(fd_owner&& other) noexcept {
        if (this != &other) {
            reset();
            fd_ = std::exchange(other.fd_, -1);
        }
        return *this;
    }
    fd_owner(const fd_owner&) = delete;
    fd_owner& operator=(const fd_owner&) = delete;
    ~fd_owner() { reset(); }

    [[nodiscard]] int get() const { return fd_; }
    void reset() {
        if (fd_ >= 0) ::close(fd_);
        fd_ = -1;
    }

private:
    int fd_ = -1;
};

/// `fd` moved above the standard descriptors (0-2), so that the child's dup2 onto 0, 1 and 2
/// never overwrites one with another, nor keeps a close-on-exec flag by dup2'ing onto itself.
inline fd_owner above_stdio(int fd, const std::string& what) {
    if (fd < 0) throw std::runtime_error(errno_text(what));
    if (fd > 2) return fd_owner(fd);
    const int high = ::fcntl(fd, F_DUPFD_CLOEXEC, 3);
    const int error = errno;
    ::close(fd);
    if (high < 0) throw std::runtime_error(errno_text(what, error));
    return fd_owner(high);
}

/// The path of `program` (itself when it holds a '/'), or "" when $PATH has no executable one.
inline std::string find_program(const std::string& program) {
    if (program.empty()) return {};
    if (program.find('/') != std::string::npos) return ::access(program.c_str(), X_OK) == 0 ? program : std::string();
    const char* path = std::getenv("PATH");
    const std::string dirs = path != nullptr && path[0] != '\0' ? path : "/usr/local/bin:/usr/bin:/bin";
    std::size_t begin = 0;
    while (begin <= dirs.size()) {
        std::size_t end = dirs.find(':', begin);
        if (end == std::string::npos) end = dirs.size();
        const std::string dir = end > begin ? dirs.substr(begin, end - begin) : std::string(".");
        const std::string candidate = dir + "/" + program;
        struct stat st {};
        if (::stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(candidate.c_str(), X_OK) == 0) {
            return candidate;
        }
        begin = end + 1;
    }
    return {};
}

/// This process's environment without the ETCD_* variables (etcd reads its flags from them too),
/// except ETCD_UNSUPPORTED_ARCH (which etcd 3.4 requires on some architectures).
inline std::vector<std::string> etcd_environment() {
    std::vector<std::string> env;
    for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
        const std::string_view entry(*e);
        if (entry.starts_with("ETCD_") && !entry.starts_with("ETCD_UNSUPPORTED_ARCH=")) continue;
        env.emplace_back(entry);
    }
    return env;
}

inline std::vector<std::string> own_environment() {
    std::vector<std::string> env;
    for (char** e = environ; e != nullptr && *e != nullptr; ++e) env.emplace_back(*e);
    return env;
}

/// Starts `path` with `args` (args[0] included) and `env`: stdin from /dev/null, stdout and
/// stderr to `out_fd`, no other descriptor, an empty signal mask, and SIGKILL when the thread
/// that called this ends (PR_SET_PDEATHSIG: a crashed test leaves nothing running). Throws
/// std::runtime_error when the program cannot be run.
inline pid_t spawn(const std::string& path, const std::vector<std::string>& args, const std::vector<std::string>& env,
                   int out_fd) {
    // Everything the child needs is made before fork(): after it, a multithreaded process's
    // child may only call async-signal-safe functions (no allocation).
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    std::vector<char*> envp;
    for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
    envp.push_back(nullptr);
    const fd_owner in = above_stdio(::open("/dev/null", O_RDONLY | O_CLOEXEC), "open /dev/null");
    const fd_owner out = above_stdio(::fcntl(out_fd, F_DUPFD_CLOEXEC, 3), "dup");
    int error_pipe[2];  // the child writes exec's errno here; EOF (close-on-exec) means exec worked
    if (::pipe2(error_pipe, O_CLOEXEC) != 0) throw std::runtime_error(errno_text("pipe2"));
    fd_owner error_read(error_pipe[0]);
    fd_owner error_write(error_pipe[1]);
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid == 0) {
        ::prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (::getppid() != parent) ::_exit(127);  // the parent died before prctl
        sigset_t none;
        ::sigemptyset(&none);
        ::sigprocmask(SIG_SETMASK, &none, nullptr);
        int error = 0;
        if (::dup2(in.get(), 0) < 0 || ::dup2(out.get(), 1) < 0 || ::dup2(out.get(), 2) < 0) {
            error = errno;
        } else {
#if defined(CLOSE_RANGE_CLOEXEC)
            // Descriptors the test process opened without O_CLOEXEC are not the child's either.
            ::close_range(3, ~0U, CLOSE_RANGE_CLOEXEC);
#endif
            ::execve(path.c_str(), argv.data(), envp.data());
            error = errno;
        }
        while (::write(error_write.get(), &error, sizeof error) < 0 && errno == EINTR) {
        }
        ::_exit(127);
    }
    if (pid < 0) throw std::runtime_error(errno_text("fork"));
    error_write.reset();
    int error = 0;
    ssize_t n = 0;
    while ((n = ::read(error_read.get(), &error, sizeof error)) < 0 && errno == EINTR) {
    }
    if (n > 0) {
        while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
        }
        throw std::runtime_error(errno_text("cannot run " + path, error));
    }
    return pid;
}

/// waitpid(pid) until it is reaped; false if it was not our child (already reaped elsewhere).
inline bool reap(pid_t pid, int* status = nullptr) {
    int ignored = 0;
    for (;;) {
        if (::waitpid(pid, status != nullptr ? status : &ignored, 0) == pid) return true;
        if (errno != EINTR) return false;
    }
}

/// "exited with status N" / "killed by signal N" from a waitpid status.
inline std::string describe_status(int status) {
    if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
    if (WIFSIGNALED(status)) return "killed by signal " + std::to_string(WTERMSIG(status));
    return "ended (status " + std::to_string(status) + ")";
}

/// The bytes of `path` from `offset` on ("" when it cannot be read).
inline std::string read_from(const std::string& path, off_t offset) {
    std::string out;
    const fd_owner fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (fd.get() < 0) return out;
    char buffer[16384];
    for (;;) {
        const ssize_t n = ::pread(fd.get(), buffer, sizeof buffer, offset);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        out.append(buffer, static_cast<std::size_t>(n));
        offset += n;
    }
    return out;
}

inline off_t file_size(const std::string& path) {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0 ? st.st_size : 0;
}

/// `count` distinct free TCP ports of 127.0.0.1: bound to port 0 together, then released. Another
/// process may take one before etcd binds it: the cluster retries its start with new ports then.
inline std::vector<std::uint16_t> free_ports(std::size_t count) {
    std::vector<fd_owner> sockets;
    std::vector<std::uint16_t> ports;
    for (std::size_t i = 0; i < count; ++i) {
        fd_owner s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
        if (s.get() < 0) throw std::runtime_error(errno_text("socket"));
        sockaddr_in address{};
        address.sin_family = AF_INET;
        address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        address.sin_port = 0;
        socklen_t length = sizeof address;
        if (::bind(s.get(), reinterpret_cast<const sockaddr*>(&address), sizeof address) != 0 ||
            ::getsockname(s.get(), reinterpret_cast<sockaddr*>(&address), &length) != 0) {
            throw std::runtime_error(errno_text("bind 127.0.0.1:0"));
        }
        ports.push_back(ntohs(address.sin_port));
        sockets.push_back(std::move(s));
    }
    return ports;
}

/// A start that failed; port_taken: a member could not bind its ports (worth a retry).
struct start_failure : std::runtime_error {
    start_failure(const std::string& what, bool taken) : std::runtime_error(what), port_taken(taken) {}
    bool port_taken;
};

}  // namespace detail

/// Makes in `dir` (which must exist) with the openssl command line: a CA (ca.pem, ca.key), a
/// server certificate for 127.0.0.1 (server.pem, server.key; subjectAltName IP:127.0.0.1 and
/// DNS:localhost; serverAuth and clientAuth, as etcd's gRPC gateway presents it as a client too)
/// and a client certificate (client.pem, client.key), both signed by the CA, valid 10 years.
/// status: made (the paths are set), no_openssl (no openssl in $PATH: skip the test), failed
/// (error says which command failed, with its output). Also leaves openssl.cnf and *.csr in dir.
inline test_certs make_test_certs(const std::string& dir) {
    test_certs certs;
    const std::string openssl = detail::find_program("openssl");
    if (openssl.empty()) {
        certs.status = certs_status::no_openssl;
        certs.error = "no openssl in $PATH";
        return certs;
    }
    const auto file = [&](const std::string& name) { return dir + "/" + name; };
    const std::string config = file("openssl.cnf");
    {
        constexpr std::string_view text = R"([req]
distinguished_name = dn
prompt = no
[dn]
CN = etcd-support
[ca_ext]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
[server_ext]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth, clientAuth
subjectAltName = IP:127.0.0.1, DNS:localhost
authorityKeyIdentifier = keyid
[client_ext]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = clientAuth
authorityKeyIdentifier = keyid
)";
        const detail::fd_owner fd(::open(config.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
        if (fd.get() < 0 || ::write(fd.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size())) {
            certs.error = detail::errno_text("cannot write " + config);
            return certs;
        }
    }
    const std::vector<std::string> env = detail::own_environment();
    // Runs openssl with `args`; false (and certs.error set) when it fails.
    const auto run = [&](std::vector<std::string> args) {
        args.insert(args.begin(), openssl);
        std::string command;
        for (const auto& a : args) command += (command.empty() ? "" : " ") + a;
        int pipe[2];
        if (::pipe2(pipe, O_CLOEXEC) != 0) {
            certs.error = detail::errno_text("pipe2");
            return false;
        }
        detail::fd_owner read_end(pipe[0]);
        detail::fd_owner write_end(pipe[1]);
        std::string output;
        int status = 0;
        try {
            const pid_t pid = detail::spawn(openssl, args, env, write_end.get());
            write_end.reset();
            char buffer[4096];
            for (;;) {
                const ssize_t n = ::read(read_end.get(), buffer, sizeof buffer);
                if (n < 0 && errno == EINTR) continue;
                if (n <= 0) break;
                output.append(buffer, static_cast<std::size_t>(n));
            }
            detail::reap(pid, &status);
        } catch (const std::exception& e) {
            certs.error = command + ": " + e.what();
            return false;
        }
        if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return true;
        certs.error = command + ": " + detail::describe_status(status) + "\n" + output;
        return false;
    };
    const std::vector<std::string> new_key = {"-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"};
    const auto request = [&](const std::string& name, const std::string& subject) {
        std::vector<std::string> args = {"req", "-new", "-config", config, "-subj", subject};
        args.insert(args.end(), new_key.begin(), new_key.end());
        args.insert(args.end(), {"-keyout", file(name + ".key"), "-out", file(name + ".csr")});
        return run(args);
    };
    const auto sign = [&](const std::string& name, const std::string& extensions, const std::string& serial) {
        return run({"x509", "-req", "-in", file(name + ".csr"), "-CA", file("ca.pem"), "-CAkey", file("ca.key"),
                    "-set_serial", serial, "-days", "3650", "-extfile", config, "-extensions", extensions, "-out",
                    file(name + ".pem")});
    };
    std::vector<std::string> ca = {"req", "-x509", "-new", "-config", config, "-extensions", "ca_ext", "-days", "3650"};
    ca.insert(ca.end(), {"-subj", "/CN=etcd-support test CA"});
    ca.insert(ca.end(), new_key.begin(), new_key.end());
    ca.insert(ca.end(), {"-keyout", file("ca.key"), "-out", file("ca.pem")});
    if (!run(ca)) return certs;
    if (!request("server", "/CN=127.0.0.1") || !sign("server", "server_ext", "2")) return certs;
    if (!request("client", "/CN=etcd-support test client") || !sign("client", "client_ext", "3")) return certs;
    certs.status = certs_status::made;
    certs.ca_cert = file("ca.pem");
    certs.ca_key = file("ca.key");
    certs.server_cert = file("server.pem");
    certs.server_key = file("server.key");
    certs.client_cert = file("client.pem");
    certs.client_key = file("client.key");
    return certs;
}

/// The etcd program options::program names, or "" when there is none (tests skip then).
inline std::string find_etcd(const std::string& program = "etcd") { return detail::find_program(program); }

/// A running etcd cluster (see the top of this file). Not copyable, not movable. The members
/// are children of the thread that started them: PR_SET_PDEATHSIG kills a member when the
/// thread that (re)started it ends, so use a cluster from one thread (doctest's is fine).
class cluster {
public:
    /// Starts `members` members as one new cluster and awaits each ready: its log (since its
    /// start) shows that it serves clients ("ready to serve client requests" with etcd 3.4's
    /// default logger, "serving client traffic" with --logger=zap; etcd logs either only once it
    /// has published itself through raft) and that it knows a leader ("elected leader"). At most
    /// options.ready_timeout in all; retries with new ports when a port was taken meanwhile.
    /// Throws std::runtime_error, with the tail of the failing member's log, when it cannot.
    explicit cluster(int members = 1, options opts = {}) : options_(std::move(opts)) {
        if (members < 1) throw std::invalid_argument("etcd_support::cluster: members must be at least 1");
        program_ = detail::find_program(options_.program);
        if (program_.empty()) throw std::runtime_error("etcd_support::cluster: no " + options_.program + " in $PATH");
        env_ = detail::etcd_environment();
        const char* base = std::getenv("TMPDIR");
        std::string pattern = std::string(base != nullptr && base[0] != '\0' ? base : "/tmp") + "/etcd-support-XXXXXX";
        if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error(detail::errno_text("mkdtemp " + pattern));
        root_ = pattern;
        try {
            start_new(members);
        } catch (...) {
            shutdown();
            throw;
        }
    }

    /// Kills (SIGKILL) and reaps every member still running, removes the temporary directory.
    ~cluster() { shutdown(); }

    cluster(const cluster&) = delete;
    cluster& operator=(const cluster&) = delete;
    cluster(cluster&&) = delete;
    cluster& operator=(cluster&&) = delete;

    [[nodiscard]] const std::vector<member_info>& members() const { return members_; }
    [[nodiscard]] int size() const { return static_cast<int>(members_.size()); }

    /// "127.0.0.1:P1,127.0.0.1:P2,..." of every member's client port (killed ones too).
    [[nodiscard]] std::string endpoints() const {
        std::string out;
        for (const auto& m : members_) out += (out.empty() ? "" : ",") + (m.host + ":" + std::to_string(m.client_port));
        return out;
    }
    /// "http://127.0.0.1:P1,http://127.0.0.1:P2,..." (https with options::tls).
    [[nodiscard]] std::string client_urls() const {
        std::string out;
        for (const auto& m : members_) out += (out.empty() ? "" : ",") + m.client_url();
        return out;
    }

    /// How many requests of gRPC method `method` ("Txn", "Range", "Put", ...) member i (plain
    /// http) has started, from its /metrics (grpc_server_started_total): the JSON gateway's
    /// requests count there too. Throws std::runtime_error when the member does not answer.
    [[nodiscard]] long requests(int i, const std::string& method) const {
        const auto& m = members_.at(static_cast<std::size_t>(i));
        const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) throw std::runtime_error(detail::errno_text("socket"));
        std::string text;
        try {
            sockaddr_in address{};
            address.sin_family = AF_INET;
            address.sin_port = htons(m.client_port);
            if (::inet_pton(AF_INET, m.host.c_str(), &address.sin_addr) != 1)
                throw std::runtime_error("host " + m.host);
            if (::connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof address) != 0) {
                throw std::runtime_error(detail::errno_text("connect to " + m.name));
            }
            const std::string ask = "GET /metrics HTTP/1.0\r\nHost: etcd\r\n\r\n";
            if (::send(fd, ask.data(), ask.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(ask.size())) {
                throw std::runtime_error(detail::errno_text("send to " + m.name));
            }
            const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
            for (;;) {  // HTTP/1.0: the member closes the connection after the answer
                const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                    deadline - std::chrono::steady_clock::now());
                pollfd p{fd, POLLIN, 0};
                if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0) {
                    throw std::runtime_error("no /metrics from " + m.name + " within 10 s");
                }
                char buffer[65536];
                const auto n = ::recv(fd, buffer, sizeof buffer, 0);
                if (n < 0) throw std::runtime_error(detail::errno_text("recv from " + m.name));
                if (n == 0) break;
                text.append(buffer, static_cast<std::size_t>(n));
            }
        } catch (...) {
            ::close(fd);
            throw;
        }
        ::close(fd);
        const std::string line = "\ngrpc_server_started_total{grpc_method=\"" + method + "\",";
        long total = 0;
        for (auto at = text.find(line); at != std::string::npos; at = text.find(line, at + 1)) {
            const auto end = text.find('\n', at + 1);
            const auto space = text.rfind(' ', end);
            total += std::strtol(text.c_str() + space + 1, nullptr, 10);
        }
        return total;
    }

    /// SIGKILLs member i and reaps it (nothing when it does not run). When it was the leader,
    /// the others notice only after an election timeout (100 ms or so): a request sent to them
    /// meanwhile may be forwarded to the dead leader, lost, and time out (etcdctl: after 5 s).
    /// Call await_leader() first when the test needs the cluster serving right away.
    void kill(int i) {
        auto& s = state_at(i);
        if (s.pid <= 0) return;
        ::kill(s.pid, SIGKILL);
        int status = 0;
        if (detail::reap(s.pid, &status)) s.last_status = status;
        s.pid = -1;
    }

    /// Starts member i again, with its data dir and ports (--initial-cluster-state existing),
    /// and awaits it ready as the constructor does; kills it first if it still runs. Throws
    /// std::runtime_error when it does not get ready, e.g. without a quorum (restart several
    /// members together then).
    void restart(int i) { restart(std::vector<int>{i}); }

    /// Restarts the members `which` together, then awaits them all ready.
    void restart(const std::vector<int>& which) {
        const auto deadline = std::chrono::steady_clock::now() + options_.ready_timeout;
        for (int i : which) kill(i);
        for (int i : which) spawn_member(i, "existing");
        await_ready(which, deadline);
    }

    /// Awaits until the running members, a quorum of the cluster, agree on a leader that runs
    /// (from raft's "elected leader" / "changed leader" / "lost leader" lines in their logs),
    /// options.ready_timeout at most; returns the leader's index. Throws std::runtime_error
    /// without a quorum or at the deadline.
    int await_leader() {
        std::vector<int> alive;
        for (int i = 0; i < size(); ++i) {
            if (running(i)) alive.push_back(i);
        }
        if (2 * alive.size() <= members_.size()) {
            throw std::runtime_error("etcd_support: no leader to await: " + std::to_string(alive.size()) + " of " +
                                     std::to_string(size()) + " members run");
        }
        int leader = -1;
        const auto pending = [&] {
            leader = -1;
            const std::string& id = states_[static_cast<std::size_t>(alive.front())].leader;
            for (int i : alive) {
                if (states_[static_cast<std::size_t>(i)].leader != id || id.empty()) return i;
                if (states_[static_cast<std::size_t>(i)].id == id) leader = i;
            }
            return leader >= 0 ? -1 : alive.front();
        };
        await(alive, std::chrono::steady_clock::now() + options_.ready_timeout, pending, "a leader they agree on");
        return leader;
    }

    /// Whether member i runs (reaps it if it has died).
    [[nodiscard]] bool running(int i) const {
        auto& s = state_at(i);
        if (s.pid <= 0) return false;
        int status = 0;
        const pid_t r = ::waitpid(s.pid, &status, WNOHANG);
        if (r == 0) return true;
        if (r == s.pid) s.last_status = status;
        if (r == s.pid || (r < 0 && errno == ECHILD)) s.pid = -1;
        return s.pid > 0;
    }

    /// Member i's pid, or -1 when it does not run (to SIGSTOP it, say).
    [[nodiscard]] pid_t pid(int i) const { return running(i) ? state_at(i).pid : -1; }

    /// The last `bytes` of member i's log at most, from a line's start (its stdout and stderr,
    /// over all its starts; each begins with "[etcd_support] starting <name>: <command line>").
    [[nodiscard]] std::string log_tail(int i, std::size_t bytes = 4000) const {
        const std::string& path = state_at(i).log;
        const off_t from = std::max<off_t>(0, detail::file_size(path) - static_cast<off_t>(bytes));
        std::string tail = detail::read_from(path, from);
        if (from > 0) tail.erase(0, std::min(tail.size(), tail.find('\n') + 1));  // npos + 1 == 0
        return tail;
    }

    /// Member i's log file.
    [[nodiscard]] std::string log_file(int i) const { return state_at(i).log; }
    /// Member i's --data-dir.
    [[nodiscard]] std::string data_dir(int i) const { return state_at(i).dir + "/data"; }
    /// The temporary directory of the whole cluster (removed with it).
    [[nodiscard]] const std::string& directory() const { return root_; }

private:
    struct member_state {
        std::string dir;      // <root>/<name>: data/ and etcd.log
        std::string log;      // <dir>/etcd.log
        pid_t pid = -1;       // -1: not running
        int last_status = 0;  // of the last reaped run
        // What the log of the current start showed so far (see scan()).
        off_t scanned = 0;    // how far the log is scanned
        std::string partial;  // an incomplete last line
        bool serving_peers = false;
        bool serving_clients = false;
        bool leader_seen = false;
        bool port_taken = false;
        std::string id;      // the member's raft id (hex)
        std::string leader;  // its leader's raft id, "" when it knows none
    };

    member_state& state_at(int i) const {
        if (i < 0 || i >= static_cast<int>(states_.size())) {
            throw std::out_of_range("etcd_support::cluster: no member " + std::to_string(i));
        }
        return states_[static_cast<std::size_t>(i)];
    }

    void start_new(int members) {
        constexpr int attempts = 5;
        const auto deadline = std::chrono::steady_clock::now() + options_.ready_timeout;
        for (int attempt = 1;; ++attempt) {
            const auto ports = detail::free_ports(2 * static_cast<std::size_t>(members));
            members_.clear();
            states_.clear();
            token_ = std::filesystem::path(root_).filename().string() + "-" + std::to_string(attempt);
            std::vector<int> all;
            for (int i = 0; i < members; ++i) {
                const auto at = static_cast<std::size_t>(i);
                member_info m;
                m.name = "m" + std::to_string(i);
                m.client_port = ports[2 * at];
                m.peer_port = ports[2 * at + 1];
                m.tls = options_.tls;
                m.host = options_.host;
                member_state s;
                s.dir = root_ + "/" + m.name;
                s.log = s.dir + "/etcd.log";
                std::error_code ignored;
                std::filesystem::remove_all(s.dir, ignored);  // a failed attempt's
                if (::mkdir(s.dir.c_str(), 0700) != 0) throw std::runtime_error(detail::errno_text("mkdir " + s.dir));
                members_.push_back(std::move(m));
                states_.push_back(std::move(s));
                all.push_back(i);
            }
            try {
                // One after the other: a new member first asks each peer whether it is already
                // bootstrapped, waiting up to 1 s for each that accepts connections but does not
                // answer yet (a member starting at the same time). So each waits for the one
                // before it to serve its peers (5 s at most: then it just goes on).
                for (int i : all) {
                    spawn_member(i, "new");
                    if (i + 1 == members) break;
                    const auto peers = std::min(deadline, std::chrono::steady_clock::now() + std::chrono::seconds(5));
                    const auto pending = [&] {
                        const auto& s = states_[static_cast<std::size_t>(i)];
                        return s.serving_peers || s.serving_clients ? -1 : i;
                    };
                    (void)await({i}, peers, pending, "it serving its peers", false);
                }
                await_ready(all, deadline);
                return;
            } catch (const detail::start_failure& e) {
                if (!e.port_taken || attempt == attempts) throw;
                stop_all();
            }
        }
    }

    std::vector<std::string> arguments(int i, const char* state) const {
        const auto& m = members_[static_cast<std::size_t>(i)];
        std::string initial_cluster;
        for (const auto& p : members_) {
            initial_cluster += (initial_cluster.empty() ? "" : ",") + p.name + "=" + p.peer_url();
        }
        std::vector<std::string> args = {
            program_,
            "--name=" + m.name,
            "--data-dir=" + data_dir(i),
            "--listen-client-urls=" + m.client_url(),
            "--advertise-client-urls=" + m.client_url(),
            "--listen-peer-urls=" + m.peer_url(),
            "--initial-advertise-peer-urls=" + m.peer_url(),
            "--initial-cluster=" + initial_cluster,
            std::string("--initial-cluster-state=") + state,
            "--initial-cluster-token=" + token_,
            "--heartbeat-interval=10",
            "--election-timeout=100",
        };
        if (options_.tls) {
            args.push_back("--cert-file=" + options_.cert_file);
            args.push_back("--key-file=" + options_.key_file);
            if (!options_.trusted_ca_file.empty()) args.push_back("--trusted-ca-file=" + options_.trusted_ca_file);
            if (options_.client_cert_auth) args.push_back("--client-cert-auth");
        }
        args.insert(args.end(), options_.extra_args.begin(), options_.extra_args.end());
        return args;
    }

    void spawn_member(int i, const char* state) {
        auto& s = state_at(i);
        const auto args = arguments(i, state);
        const detail::fd_owner log(::open(s.log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
        if (log.get() < 0) throw std::runtime_error(detail::errno_text("open " + s.log));
        std::string banner = "[etcd_support] starting " + members_[static_cast<std::size_t>(i)].name + ":";
        for (const auto& a : args) banner += " " + a;
        banner += "\n";
        (void)!::write(log.get(), banner.data(), banner.size());
        const std::string dir = s.dir;
        const std::string path = s.log;
        s = member_state{};
        s.dir = dir;
        s.log = path;
        s.scanned = detail::file_size(s.log);
        if (options_.wrapper.empty()) {
            s.pid = detail::spawn(program_, args, env_, log.get());
        } else {
            auto wrapped = options_.wrapper;
            wrapped.insert(wrapped.end(), args.begin(), args.end());
            s.pid = detail::spawn(options_.wrapper.front(), wrapped, env_, log.get());
        }
    }

    /// Reads what member i logged since the last scan; notes what its complete lines tell.
    void scan(int i) const {
        auto& s = state_at(i);
        const std::string more = detail::read_from(s.log, s.scanned);
        s.scanned += static_cast<off_t>(more.size());
        s.partial += more;
        std::size_t begin = 0;
        for (std::size_t end; (end = s.partial.find('\n', begin)) != std::string::npos; begin = end + 1) {
            note(s, std::string_view(s.partial).substr(begin, end - begin));
        }
        s.partial.erase(0, begin);
    }

    static void note(member_state& s, std::string_view line) {
        const auto has = [&](std::string_view text) { return line.find(text) != std::string_view::npos; };
        // etcd 3.4 with its default logger (capnslog) / with --logger=zap.
        if (has("ready to serve client requests") || has("serving client traffic")) s.serving_clients = true;
        if (has("listening for peers on") || has("serving peer traffic")) s.serving_peers = true;
        if (has("address already in use")) s.port_taken = true;
        // raft: "raft.node: <id> elected leader <id> at term <n>", "raft.node: <id> changed leader
        // from <id> to <id> at term <n>", "raft.node: <id> lost leader <id> at term <n>".
        constexpr std::string_view node = "raft.node: ";
        const auto at = line.find(node);
        if (at == std::string_view::npos) return;
        const auto hex = [](std::string_view text) {
            std::size_t n = 0;
            while (n < text.size() && std::isxdigit(static_cast<unsigned char>(text[n])) != 0) ++n;
            return std::string(text.substr(0, n));
        };
        const std::string_view rest = line.substr(at + node.size());
        s.id = hex(rest);
        const auto after = [&](std::string_view text) {
            const auto p = rest.find(text);
            return p == std::string_view::npos ? std::string() : hex(rest.substr(p + text.size()));
        };
        if (rest.find(" elected leader ") != std::string_view::npos) {
            s.leader = after(" elected leader ");
            s.leader_seen = true;
        } else if (rest.find(" changed leader from ") != std::string_view::npos) {
            s.leader = after(" to ");
            s.leader_seen = true;
        } else if (rest.find(" lost leader ") != std::string_view::npos) {
            s.leader.clear();
        }
    }

    void await_ready(const std::vector<int>& which, std::chrono::steady_clock::time_point deadline) {
        const auto pending = [&] {
            for (int i : which) {
                const auto& s = states_[static_cast<std::size_t>(i)];
                if (!s.serving_clients || !s.leader_seen) return i;
            }
            return -1;
        };
        await(which, deadline, pending, "it serving clients (\"ready to serve client requests\") and a leader");
    }

    /// Awaits until pending() returns -1 (else the index of a member it waits for), looking again
    /// whenever the log of a member of `watched` changes (inotify) or one dies (pidfd). Throws
    /// detail::start_failure when a watched member dies first, and at the deadline unless
    /// !throw_at_deadline (returns false then).
    template <class Pending>
    bool await(const std::vector<int>& watched, std::chrono::steady_clock::time_point deadline, Pending pending,
               std::string_view what, bool throw_at_deadline = true) {
        const detail::fd_owner inotify(::inotify_init1(IN_NONBLOCK | IN_CLOEXEC));
        std::vector<detail::fd_owner> pidfds;
        bool events = inotify.get() >= 0;
        for (int i : watched) {
            if (inotify.get() >= 0 && ::inotify_add_watch(inotify.get(), state_at(i).dir.c_str(), IN_MODIFY) < 0) {
                events = false;
            }
            pidfds.emplace_back(static_cast<int>(::syscall(SYS_pidfd_open, state_at(i).pid, 0U)));
            if (pidfds.back().get() < 0) events = false;
        }
        for (;;) {
            if (inotify.get() >= 0) {  // drain: the logs are read anyway
                char buffer[4096];
                while (::read(inotify.get(), buffer, sizeof buffer) > 0) {
                }
            }
            int died = -1;
            for (int i : watched) {
                if (!running(i) && died < 0) died = i;  // before the scan: its log is complete then
                scan(i);
            }
            const int waiting = pending();
            if (waiting < 0) return true;
            if (died >= 0) {
                const auto& s = state_at(died);
                throw detail::start_failure(failure(died, detail::describe_status(s.last_status), what), s.port_taken);
            }
            const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
            if (left.count() <= 0) {
                if (!throw_at_deadline) return false;
                const auto waited = std::to_string(options_.ready_timeout.count());
                throw detail::start_failure(failure(waiting, "got nowhere in " + waited + " ms", what), false);
            }
            std::vector<pollfd> fds;
            if (inotify.get() >= 0) fds.push_back({inotify.get(), POLLIN, 0});
            for (const auto& p : pidfds) {
                if (p.get() >= 0) fds.push_back({p.get(), POLLIN, 0});
            }
            // Without inotify or pidfds (old kernels), look again every 20 ms instead.
            const auto wait = events ? left : std::min(left, std::chrono::milliseconds(20));
            if (::poll(fds.data(), fds.size(), static_cast<int>(wait.count())) < 0 && errno != EINTR) {
                throw std::runtime_error(detail::errno_text("poll"));
            }
        }
    }

    std::string failure(int i, const std::string& why, std::string_view what) const {
        return "etcd_support: etcd member " + members_[static_cast<std::size_t>(i)].name + " " + why + " awaiting " +
               std::string(what) + "; the tail of its log " + log_file(i) + ":\n" + log_tail(i);
    }

    void stop_all() noexcept {
        for (int i = 0; i < static_cast<int>(states_.size()); ++i) {
            try {
                kill(i);
            } catch (...) {
            }
        }
    }

    void shutdown() noexcept {
        stop_all();
        if (!root_.empty()) {
            std::error_code ignored;
            std::filesystem::remove_all(root_, ignored);
            root_.clear();
        }
    }

    options options_;
    std::string program_;
    std::vector<std::string> env_;
    std::string root_;
    std::string token_;
    std::vector<member_info> members_;
    mutable std::vector<member_state> states_;
};

}  // namespace etcd_support
