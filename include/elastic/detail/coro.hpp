// SPDX-License-Identifier: MIT
// Coroutine primitives for code that runs on one thread (an executor's): a FIFO lock, a signal
// that wakes every waiter, a latch over a count of tasks, and settle() for racing an operation
// that may throw with `||`. The waits sleep on steady_timers that never expire by themselves;
// cancelling the timer is the wake-up.
//
// The classes are templates over an unused parameter, used through their aliases: g++ compiles
// every non-template inline coroutine in every file that sees it, a template's only where it
// is used (docs/building.md, "Compile time").
#pragma once

#include "elastic/detail/config.hpp"

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <asio/detached.hpp>
#include <asio/error.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <iterator>
#include <list>
#include <optional>
#include <system_error>
#include <type_traits>
#include <utility>
#include <variant>

namespace elastic::inline v0::detail {

/// asio::use_awaitable, and as_tuple of it, named through a template parameter. An operation
/// completed with them depends on `Defer`, so g++ compiles the operation's coroutine only where
/// the template that awaits it is used; with asio::use_awaitable it would compile it wherever
/// the template is seen (docs/building.md, "Compile time").
template <class Defer>
inline constexpr asio::use_awaitable_t<> use_awaitable{};
template <class Defer>
inline constexpr asio::experimental::as_tuple_t<asio::use_awaitable_t<>> as_tuple_awaitable{};
/// asio::detached, named the same way: a co_spawn completed with it compiles its entry point
/// only where the spawning template is used.
template <class Defer>
inline constexpr asio::detached_t detached{};

/// A FIFO lock for coroutines, taken without suspension when free. A queued waiter sleeps on
/// its own timer; unlock() hands the lock over by marking the first waiter granted and
/// cancelling its timer. Use it on one thread.
template <class Defer = void>
class basic_async_mutex {
public:
    explicit basic_async_mutex(const asio::any_io_executor& executor) : executor_(executor) {}
    basic_async_mutex(const basic_async_mutex&) = delete;
    basic_async_mutex& operator=(const basic_async_mutex&) = delete;

    /// Takes the lock, in turn. A waiter cancelled while queued leaves the queue and throws
    /// operation_aborted with `cancelled` as its message.
    asio::awaitable<void> lock(const char* cancelled = "cancelled while queued for the lock") {
        if (try_lock()) co_return;
        waiter w(executor_);
        w.timer.expires_at(asio::steady_timer::time_point::max());
        queue_.push_back(&w);
        const auto it = std::prev(queue_.end());
        co_await w.timer.async_wait(as_tuple_awaitable<Defer>);
        if (!w.granted) {  // cancelled by our caller while queued
            queue_.erase(it);
            throw std::system_error(asio::error::operation_aborted, cancelled);
        }
    }

    /// Takes the lock when it is free; whether it did.
    bool try_lock() noexcept {
        if (locked_) return false;
        locked_ = true;
        return true;
    }

    /// Releases the lock: to the first waiter, or free.
    void unlock() noexcept {
        if (queue_.empty()) {
            locked_ = false;
            return;
        }
        auto* next = queue_.front();
        queue_.pop_front();
        next->granted = true;
        next->timer.cancel();
    }

    [[nodiscard]] bool locked() const noexcept { return locked_; }

private:
    struct waiter {
        explicit waiter(const asio::any_io_executor& ex) : timer(ex) {}
        asio::steady_timer timer;
        bool granted = false;
    };

    asio::any_io_executor executor_;
    bool locked_ = false;
    std::list<waiter*> queue_;
};
using async_mutex = basic_async_mutex<>;

/// Wakes every coroutine that waits on it at each notify(); a waiter then checks what it
/// waits for and waits again if need be. A notify() with nobody waiting is lost. Use it on one
/// thread.
template <class Defer = void>
class basic_async_signal {
public:
    explicit basic_async_signal(const asio::any_io_executor& executor)
        : timer_(executor, asio::steady_timer::time_point::max()) {}

    /// Wakes every current waiter.
    void notify() noexcept { timer_.cancel(); }

    /// Completes at the next notify(), when the signal is destroyed, or when the caller is
    /// cancelled (it cannot tell which: check the cancellation state or what it waits for). It
    /// touches nothing of the signal once woken, so the signal may be gone by then.
    asio::awaitable<void> wait() { (void)co_await timer_.async_wait(as_tuple_awaitable<Defer>); }

private:
    asio::steady_timer timer_;
};
using async_signal = basic_async_signal<>;

/// Counts running tasks and lets one coroutine await the moment none is left (an event: the
/// last `done()` cancels the timer the waiter sleeps on; nothing polls).
template <class Defer = void>
class basic_task_latch {
public:
    explicit basic_task_latch(const asio::any_io_executor& executor) : timer_(executor) {
        timer_.expires_at(asio::steady_timer::time_point::max());
    }
    void add() noexcept { ++count_; }
    void done() noexcept {
        if (--count_ == 0) timer_.cancel();
    }
    [[nodiscard]] std::size_t count() const noexcept { return count_; }
    /// Counts chunks the tasks handled: lets a bounded wait tell a stream still flowing from one
    /// held open by a process that writes nothing.
    void progressed() noexcept { ++progress_; }
    [[nodiscard]] std::uint64_t progress() const noexcept { return progress_; }

    /// Returns once count() is 0, or when the await is cancelled (it may be awaited again then).
    /// One latch per attempt's streams.
    asio::awaitable<void> wait() {
        if (count_ == 0) co_return;
        co_await timer_.async_wait(as_tuple_awaitable<Defer>);
    }

private:
    asio::steady_timer timer_;
    std::size_t count_ = 0;
    std::uint64_t progress_ = 0;
};
using task_latch = basic_task_latch<>;

/// An operation's value or the exception it ended with. The agent races rendezvous and policy
/// operations against its signals with `||`; an exception escaping one side of `||` left the
/// agent waiting for ever in Asio 1.22 (found with a join timeout), so the operation's
/// exception is caught inside the race and rethrown after it.
template <class T>
struct settled {
    std::optional<T> value;
    std::exception_ptr error;

    T take() {
        if (error) std::rethrow_exception(error);
        return std::move(*value);
    }
};

/// Runs `op` to its end and returns its value or its exception (settled<std::monostate> for
/// awaitable<void>).
template <class T>
auto settle(asio::awaitable<T> op)
    -> asio::awaitable<settled<std::conditional_t<std::is_void_v<T>, std::monostate, T>>> {
    settled<std::conditional_t<std::is_void_v<T>, std::monostate, T>> out;
    try {
        if constexpr (std::is_void_v<T>) {
            co_await std::move(op);
            out.value.emplace();
        } else {
            out.value.emplace(co_await std::move(op));
        }
    } catch (...) {
        out.error = std::current_exception();
    }
    co_return out;
}

}  // namespace elastic::inline v0::detail
