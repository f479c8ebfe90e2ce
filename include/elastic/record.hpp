// SPDX-License-Identifier: MIT
// elastic::record(main): torchelastic error files for uncaught exceptions, std::terminate and
// fatal signals, with a C++ backtrace taken where the exception was thrown.
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/detail/backtrace.hpp"
#include "elastic/watchdog.hpp"

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <exception>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <utility>

#include <cxxabi.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

namespace elastic::inline v0 {

/// The exit status of a process that `record` saw end with an uncaught exception: 1, as Python's.
/// A fatal signal is re-raised instead (the parent sees the signal itself), and `std::terminate`
/// without an exception ends in SIGABRT, as it would without `record`.
inline constexpr int uncaught_exception_exit_code = 1;

namespace detail {

inline constexpr int record_max_frames = 128;

// Everything the crash paths touch is allocated before the crash: the paths, the buffers, the
// alternate signal stack. The buffers live in .bss and cost no memory until a crash writes them.
struct record_state {
    std::atomic<int> phase{0};          // 0: nothing reported, 1: reporting, 2: reported
    std::atomic<long> reporter_tid{0};  // the thread writing the report
    std::atomic<bool> installed{false};
    bool has_error_file = false;
    char error_file[4096] = {};
    char scratch_path[4096 + 32] = {};
    char message[16 * 1024] = {};
    char callstack[64 * 1024] = {};
    alignas(16) char signal_stack[64 * 1024] = {};
};

inline record_state record_storage{};

// Buffered output to a file descriptor with write(2): unbounded, allocation-free, signal-safe.
class fd_writer {
public:
    explicit fd_writer(int fd) noexcept : fd_(fd) {}
    fd_writer(const fd_writer&) = delete;
    fd_writer& operator=(const fd_writer&) = delete;
    ~fd_writer() { flush(); }

    void put(char c) noexcept {
        if (size_ == sizeof(buffer_)) flush();
        buffer_[size_++] = c;
    }
    void put(const char* text, std::size_t size) noexcept {
        for (std::size_t i = 0; i < size; ++i) put(text[i]);
    }
    void put(const char* text) noexcept {
        if (text != nullptr) put(text, std::strlen(text));
    }
    void flush() noexcept {
        std::size_t done = 0;
        while (done < size_ && !failed_) {
            const ssize_t n = ::write(fd_, buffer_ + done, size_ - done);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) {
                failed_ = true;
            } else {
                done += static_cast<std::size_t>(n);
            }
        }
        size_ = 0;
    }
    [[nodiscard]] bool failed() const noexcept { return failed_; }

private:
    int fd_;
    char buffer_[4096];
    std::size_t size_ = 0;
    bool failed_ = false;
};

// torchelastic's error-file JSON, byte for byte as Python's json.dump writes it:
// {"message": {"message": "<T>: <what>", "extraInfo": {"py_callstack": "...", "timestamp": "<s>"}}}
template <class Sink>
void write_error_json(Sink& out, const char* message, std::size_t message_size, const char* callstack,
                      std::size_t callstack_size, std::int64_t timestamp) {
    out.put("{\"message\": {\"message\": \"");
    json_escape(out, message, message_size);
    out.put("\", \"extraInfo\": {\"py_callstack\": \"");
    json_escape(out, callstack, callstack_size);
    out.put("\", \"timestamp\": \"");
    char digits[24];
    fixed_writer number(digits, sizeof(digits));
    number.put_signed(timestamp);
    out.put(number.data(), number.size());
    out.put("\"}}}");
}

// Creates the missing parents of `path` (mkdir(2) only: signal-safe). The agent normally made
// them; a hand-set TORCHELASTIC_ERROR_FILE may point anywhere.
inline void make_parent_directories(char* path) noexcept {
    for (char* p = path + 1; *p != '\0'; ++p) {
        if (*p != '/') continue;
        *p = '\0';
        (void)::mkdir(path, 0755);
        *p = '/';
    }
}

// Writes the error file as "<path>.tmp.<pid>" and renames it over <path>, so a reader (the agent)
// sees the whole file or none. Returns 0 or the errno of the step that failed.
inline int write_error_file_atomically(const char* message, std::size_t message_size, const char* callstack,
                                       std::size_t callstack_size, std::int64_t timestamp) noexcept {
    auto& state = record_storage;
    fixed_writer temporary(state.scratch_path, sizeof(state.scratch_path));
    temporary.put(state.error_file);
    temporary.put(".tmp.");
    temporary.put_unsigned(static_cast<std::uintmax_t>(::getpid()));
    if (temporary.truncated()) return ENAMETOOLONG;
    make_parent_directories(state.scratch_path);
    const int fd = ::open(state.scratch_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return errno;
    bool failed = false;
    {
        fd_writer out(fd);
        write_error_json(out, message, message_size, callstack, callstack_size, timestamp);
        out.flush();
        failed = out.failed();
    }
    const int saved = errno;
    ::close(fd);
    if (failed) {
        ::unlink(state.scratch_path);
        return saved != 0 ? saved : EIO;
    }
    if (::rename(state.scratch_path, state.error_file) != 0) {
        const int error = errno;
        ::unlink(state.scratch_path);
        return error;
    }
    return 0;
}

// "elastic::v0::env_error" reads better as "elastic::env_error"; likewise std::__cxx11::.
inline void put_type_name(fixed_writer& out, const char* name) noexcept {
    struct rename {
        const char* from;
        const char* to;
    };
    static constexpr rename renames[] = {{"elastic::v0::", "elastic::"}, {"std::__cxx11::", "std::"}};
    while (*name != '\0') {
        bool renamed = false;
        for (const auto& r : renames) {
            const std::size_t length = std::strlen(r.from);
            if (std::strncmp(name, r.from, length) == 0) {
                out.put(r.to);
                name += length;
                renamed = true;
                break;
            }
        }
        if (!renamed) out.put(*name++);
    }
}

struct crash_report {
    const char* type = nullptr;  // "std::runtime_error", "SIGSEGV", ...
    const char* what = nullptr;  // what(), or the signal's description
    void* const* frames = nullptr;
    int frame_count = 0;
    int first_frame = 0;    // frames before it are the reporting machinery
    int exact_frame = -1;   // a frame whose pc is not a return address (signals)
    bool demangle = false;  // only outside signal handlers: it allocates
};

// Writes the report: the error file when TORCHELASTIC_ERROR_FILE was set, and a readable copy on
// stderr in every case. Signal-safe when `demangle` is false.
inline void write_report(const crash_report& report) noexcept {
    auto& state = record_storage;
    fixed_writer message(state.message, sizeof(state.message));
    put_type_name(message, report.type);
    message.put(": ");
    message.put(report.what);

    fixed_writer stack(state.callstack, sizeof(state.callstack));
    stack.put("C++ backtrace (most recent call first):\n");
    for (int i = report.first_frame; i < report.frame_count; ++i) {
        const auto pc = reinterpret_cast<std::uintptr_t>(report.frames[i]);
        // A return address points after the call: look up pc - 1 so a call that ends a function
        // is not attributed to the next one.
        const auto lookup = i == report.exact_frame || pc == 0 ? pc : pc - 1;
        put_frame(stack, i - report.first_frame, pc, symbolize(pc, lookup), report.demangle);
    }
    if (stack.truncated()) stack.put("  ... (truncated)\n");

    struct timespec now {};
    ::clock_gettime(CLOCK_REALTIME, &now);

    int file_error = 0;
    if (state.has_error_file) {
        file_error = write_error_file_atomically(message.data(), message.size(), stack.data(), stack.size(),
                                                 static_cast<std::int64_t>(now.tv_sec));
    }
    fd_writer err(STDERR_FILENO);
    err.put("elastic::record: ");
    err.put(message.data(), message.size());
    err.put('\n');
    err.put(stack.data(), stack.size());
    if (state.has_error_file) {
        if (file_error == 0) {
            err.put("elastic::record: error file written to ");
            err.put(state.error_file);
        } else {
            fixed_writer code(state.scratch_path, sizeof(state.scratch_path));
            code.put_unsigned(static_cast<std::uintmax_t>(file_error));
            err.put("elastic::record: could not write the error file ");
            err.put(state.error_file);
            err.put(" (errno ");
            err.put(code.data(), code.size());
            err.put(")");
        }
        err.put('\n');
    }
    err.flush();
}

// Claims the right to report. False when another report is under way or done; a second thread
// that crashes while the first reports then waits for the first to end the process.
inline bool begin_report() noexcept {
    auto& state = record_storage;
    int expected = 0;
    if (state.phase.compare_exchange_strong(expected, 1)) {
        state.reporter_tid.store(current_tid());
        return true;
    }
    if (expected == 1 && state.reporter_tid.load() != current_tid()) {
        for (;;) ::pause();
    }
    return false;
}

inline void restore_default_action(int signal_number) noexcept {
    struct sigaction action {};
    action.sa_handler = SIG_DFL;
    sigemptyset(&action.sa_mask);
    ::sigaction(signal_number, &action, nullptr);
}

inline const char* fatal_signal_name(int signal_number) noexcept {
    switch (signal_number) {
        case SIGSEGV: return "SIGSEGV";
        case SIGBUS: return "SIGBUS";
        case SIGFPE: return "SIGFPE";
        case SIGILL: return "SIGILL";
        case SIGABRT: return "SIGABRT";
        default: return "SIG?";
    }
}

inline const char* signal_description(int signal_number) noexcept {
    switch (signal_number) {
        case SIGSEGV: return "segmentation fault";
        case SIGBUS: return "bus error";
        case SIGFPE: return "arithmetic exception";
        case SIGILL: return "illegal instruction";
        case SIGABRT: return "aborted";
        default: return "fatal signal";
    }
}

inline constexpr int record_fatal_signals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};

// The handler of the fatal signals: report once, then re-raise with the default action so the
// parent sees the true signal (and a core is dumped where enabled). Signal-safe throughout.
inline void on_fatal_signal(int signal_number, siginfo_t* info, void* context) noexcept {
    const int saved_errno = errno;
    if (begin_report()) {
        void* frames[record_max_frames];
        const int count = capture_backtrace(frames, record_max_frames);
        // Frames above the interrupted instruction are this handler and the kernel's trampoline.
        const int first = interrupted_frame(frames, count, context);
        char what[160];
        fixed_writer text(what, sizeof(what));
        text.put(signal_description(signal_number));
        text.put(" (signal ");
        text.put_unsigned(static_cast<std::uintmax_t>(signal_number));
        text.put(") in PID ");
        text.put_unsigned(static_cast<std::uintmax_t>(::getpid()));
        if (signal_number != SIGABRT && info != nullptr && info->si_code > 0) {
            text.put(", fault address ");
            text.put_hex(reinterpret_cast<std::uintptr_t>(info->si_addr));
        }
        crash_report report;
        report.type = fatal_signal_name(signal_number);
        report.what = text.data();
        report.frames = frames;
        report.frame_count = count;
        report.first_frame = first;
        report.exact_frame = first >= 0 ? first : -1;
        if (report.first_frame < 0) report.first_frame = 0;
        write_report(report);
        record_storage.phase.store(2);
    }
    restore_default_action(signal_number);
    // Blocked until the handler returns; a fault then re-faults under the default action.
    ::raise(signal_number);
    errno = saved_errno;
}

inline std::string demangled(const char* name) {
    int status = 0;
    char* readable = abi::__cxa_demangle(name, nullptr, nullptr, &status);
    std::string out = readable != nullptr ? readable : name;
    std::free(readable);
    return out;
}

// Where the failure happened in a stack taken inside the terminate handler: just below the last
// frame of __cxa_throw, __cxa_rethrow, std::rethrow_exception, std::terminate or clang's
// __clang_call_terminate (ASan's interceptor of __cxa_throw shows up as one more such frame).
inline int first_frame_after_throw(void* const* frames, int count) noexcept {
    int first = 1;  // at least drop the handler itself
    for (int i = 0; i < count && i < 24; ++i) {
        const auto pc = reinterpret_cast<std::uintptr_t>(frames[i]);
        const frame_symbol symbol = symbolize(pc, pc - 1);
        if (symbol.function == nullptr) continue;
        for (const char* marker :
             {"__cxa_throw", "__cxa_rethrow", "rethrow_exception", "_ZSt9terminatev", "__clang_call_terminate"}) {
            if (std::strstr(symbol.function, marker) != nullptr) first = i + 1;
        }
    }
    return first < count ? first : 0;
}

// The terminate handler. An exception nobody catches makes the C++ runtime call terminate from
// inside __cxa_throw, *before* any unwinding (the search phase found no handler): the stack here
// still holds the throwing function. That is why record() never catches.
[[noreturn]] inline void on_terminate() noexcept {
    void* frames[record_max_frames];
    const int count = capture_backtrace(frames, record_max_frames);
    if (!begin_report()) {  // this thread failed while reporting: give up the standard way
        restore_default_action(SIGABRT);
        std::abort();
    }
    crash_report report;
    report.frames = frames;
    report.frame_count = count;
    report.demangle = true;
    const std::exception_ptr current = std::current_exception();
    if (current == nullptr) {
        report.type = "std::terminate";
        report.what = "called without an active exception";
        report.first_frame = first_frame_after_throw(frames, count);
        write_report(report);
        record_storage.phase.store(2);
        std::fflush(nullptr);
        restore_default_action(SIGABRT);
        std::abort();
    }
    const std::type_info* const type = abi::__cxa_current_exception_type();
    std::string type_name;
    std::string what;
    try {
        std::rethrow_exception(current);
    } catch (const std::exception& e) {
        type_name = demangled(typeid(e).name());
        what = e.what();
    } catch (...) {
        type_name = type != nullptr ? demangled(type->name()) : "<unknown type>";
        what = "(an exception that is not a std::exception carries no message)";
    }
    report.type = type_name.c_str();
    report.what = what.c_str();
    report.first_frame = first_frame_after_throw(frames, count);
    write_report(report);
    record_storage.phase.store(2);
    // No unwinding happened and other threads may still run: flush stdio and leave without
    // running static destructors under their feet.
    std::fflush(nullptr);
    std::_Exit(uncaught_exception_exit_code);
}

}  // namespace detail

/// Installs what `record` relies on, once per process: the terminate handler and the fatal-signal
/// handlers (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT) on an alternate stack, and under
/// elasticrun --watchdog the dump of every thread's stack on the watchdog's signal. Reads
/// TORCHELASTIC_ERROR_FILE now. Costs a few system calls; symbols are only read at a crash. Call it
/// yourself when you cannot wrap main (e.g. in a library's init); calling it again does nothing.
inline void install_error_handlers() {
    auto& state = detail::record_storage;
    if (state.installed.exchange(true)) return;
    if (const char* path = std::getenv("TORCHELASTIC_ERROR_FILE");
        path != nullptr && path[0] != '\0' && std::strlen(path) < sizeof(state.error_file)) {
        std::strcpy(state.error_file, path);
        state.has_error_file = true;
    }
    std::set_terminate(detail::on_terminate);

    // A stack overflow leaves no stack to run a handler on: give this thread an alternate one,
    // unless someone (ASan does) already did.
    stack_t current{};
    if (::sigaltstack(nullptr, &current) == 0 && (current.ss_flags & SS_DISABLE) != 0) {
        stack_t alternate{};
        alternate.ss_sp = state.signal_stack;
        alternate.ss_size = sizeof(state.signal_stack);
        alternate.ss_flags = 0;
        (void)::sigaltstack(&alternate, nullptr);
    }
    for (const int signal_number : detail::record_fatal_signals) {
        struct sigaction action {};
        action.sa_sigaction = detail::on_fatal_signal;
        action.sa_flags = SA_SIGINFO | SA_ONSTACK;
        sigemptyset(&action.sa_mask);
        ::sigaction(signal_number, &action, nullptr);
    }
    // Under elasticrun --watchdog: the page, and the stack dump on the watchdog's signal.
    (void)detail::watchdog::current();
}

/// Runs a worker's main under torchelastic's error reporting and returns what it returns (0 for a
/// void entry). An uncaught exception — here or in any thread — writes TORCHELASTIC_ERROR_FILE
/// (or, without it, stderr only) with "<type>: <what()>" and a backtrace from the throw site, then
/// exits with `uncaught_exception_exit_code`; std::terminate and fatal signals are reported too.
///
///     int main(int argc, char** argv) { return elastic::record(real_main, argc, argv); }
///
/// It deliberately has no try block: catching would unwind the stack before we could see it.
template <class Entry, class... Args>
int record(Entry&& entry, Args&&... args) {
    install_error_handlers();
    if constexpr (std::is_void_v<std::invoke_result_t<Entry, Args...>>) {
        std::forward<Entry>(entry)(std::forward<Args>(args)...);
        return 0;
    } else {
        return static_cast<int>(std::forward<Entry>(entry)(std::forward<Args>(args)...));
    }
}

}  // namespace elastic::inline v0
