// SPDX-License-Identifier: MIT
// Internals: the one thread that forks every child, so PR_SET_PDEATHSIG means "the agent died".
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/process/error.hpp"
#include "elastic/process/sys.hpp"

#include <condition_variable>
#include <csignal>
#include <mutex>
#include <thread>

#include <pthread.h>

namespace elastic::inline v0::detail::process {

/// Runs callables on a dedicated thread that lives as long as the process.
///
/// Why a thread of our own: PR_SET_PDEATHSIG fires when the *thread* that forked the child exits,
/// not the process (that is how Linux defines it). Forking on the caller's thread would tie every
/// worker's life to whichever thread happened to call spawn — an io_context thread of a pool that
/// shrinks, a std::thread the user joins — and the workers would be SIGKILLed when it ends. This
/// thread is started on first use, detached and never stopped, so it ends only with the process:
/// the parent death signal then means exactly "the agent died".
///
/// The thread blocks every signal, so it never runs a signal handler (Asio's included), and the
/// children it forks start with every signal blocked: a signal that arrives between fork and exec
/// stays pending until the child has reset the dispositions, and then acts by default instead of
/// running the agent's handler in the child.
///
/// The object is deliberately leaked: a detached thread must never touch a destroyed mutex during
/// static destruction at exit.
class spawner {
public:
    static ELASTIC_DECL spawner& instance();

    /// Runs `f()` on the spawner thread and returns when it has returned. Callers are serialized.
    template <class F>
    void run(F& f) {
        std::lock_guard serial(callers_);
        std::unique_lock lock(mutex_);
        job_ = [](void* arg) { (*static_cast<F*>(arg))(); };
        arg_ = &f;
        done_ = false;
        cv_.notify_all();
        cv_.wait(lock, [this] { return done_; });
    }

    spawner(const spawner&) = delete;
    spawner& operator=(const spawner&) = delete;

private:
    spawner() {
        // Start the thread with every signal blocked (it inherits the creator's mask), then give
        // the creating thread its own mask back.
        sigset_t all;
        sigset_t old;
        ::sigfillset(&all);
        ::pthread_sigmask(SIG_SETMASK, &all, &old);
        try {
            std::thread(&spawner::loop, this).detach();
        } catch (...) {
            ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
            throw;
        }
        ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
    }

    ELASTIC_DECL void loop();

    std::mutex callers_;
    std::mutex mutex_;
    std::condition_variable cv_;
    void (*job_)(void*) = nullptr;
    void* arg_ = nullptr;
    bool done_ = false;
};

}  // namespace elastic::inline v0::detail::process

#if ELASTIC_DETAIL_BODIES

namespace elastic::inline v0::detail::process {

ELASTIC_DECL spawner& spawner::instance() {
    static spawner* const self = new spawner();  // leaked on purpose, see above
    return *self;
}

ELASTIC_DECL void spawner::loop() {
    std::unique_lock lock(mutex_);
    for (;;) {
        cv_.wait(lock, [this] { return job_ != nullptr; });
        job_(arg_);
        job_ = nullptr;
        done_ = true;
        cv_.notify_all();
    }
}

}  // namespace elastic::inline v0::detail::process

#endif  // ELASTIC_DETAIL_BODIES
