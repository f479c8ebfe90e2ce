// SPDX-License-Identifier: MIT
// The signals the agent receives, as awaitable events; the agent's process-wide dispositions.
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/detail/coro.hpp"
#include "elastic/process/sys.hpp"

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <asio/signal_set.hpp>
#include <asio/use_awaitable.hpp>

#include <array>
#include <csignal>
#include <initializer_list>

namespace elastic::inline v0 {

/// The signals torchrun turns into a stop of its workers (and forwards to them): SIGINT,
/// SIGTERM, SIGHUP, SIGQUIT.
inline constexpr std::array<int, 4> forwarded_signals{SIGINT, SIGTERM, SIGHUP, SIGQUIT};

/// Makes the agent's process-wide signal dispositions fit for supervising children (idempotent;
/// `spawn` calls it too): SIGPIPE ignored, so writing to a dead worker's pipe is an EPIPE error
/// rather than the agent's death; SIGXFSZ ignored, so a log file past the file-size limit is an
/// EFBIG write error (reported) rather than the agent's death; SIGCHLD not ignored (nor SA_NOCLDWAIT), or the kernel would
/// reap the workers itself and their exit status would be lost.
ELASTIC_DECL void prepare_agent_signals() noexcept;

/// Signals delivered to the agent, one `co_await next()` at a time (Asio's signal_set: a
/// handler that writes to a self-pipe, so the wait is an ordinary event).
///
/// While one exists, the signals it holds no longer have their default action (SIGINT no longer
/// kills the agent): the agent decides, typically by stopping its workers with the same signal.
/// Children never inherit the handler: `spawn` resets every disposition in the child.
class signal_events {
public:
    /// Catches `signals` (by default the forwarded ones).
    explicit signal_events(const asio::any_io_executor& executor,
                           std::initializer_list<int> signals = {SIGINT, SIGTERM, SIGHUP, SIGQUIT})
        : set_(executor) {
        prepare_agent_signals();
        for (int sig : signals) set_.add(sig);
    }

    /// The next signal received (signals that arrive while nobody waits are queued by Asio).
    /// Cancellable; throws asio::system_error(operation_aborted) when cancelled.
    template <class Defer = void>
    asio::awaitable<int> next() {
        co_return co_await set_.async_wait(detail::use_awaitable<Defer>);
    }

    /// Cancels a pending `next`.
    ELASTIC_DECL void cancel();

private:
    asio::signal_set set_;
};

}  // namespace elastic::inline v0

#if ELASTIC_DETAIL_BODIES

namespace elastic::inline v0 {

ELASTIC_DECL void prepare_agent_signals() noexcept { detail::process::prepare_agent_signals(); }

}  // namespace elastic::inline v0

namespace elastic::inline v0 {

ELASTIC_DECL void signal_events::cancel() {
    asio::error_code ignored;
    set_.cancel(ignored);
}

}  // namespace elastic::inline v0

#endif  // ELASTIC_DETAIL_BODIES
