// Coroutines a test spawns beside each other, without losing their exceptions: a detached spawn
// drops a throw, and the test then passes on whatever state the coroutine left behind.
#pragma once

#include <doctest/doctest.h>

#include <exception>
#include <string>
#include <utility>
#include <vector>

namespace spawn_support {

/// Records the exceptions of the coroutines spawned with its completion handler; check() fails
/// the test once for each, with its message.
///
///     spawn_support::spawn_errors errors;
///     asio::co_spawn(ctx, work(), errors.handler());
///     ctx.run();
///     errors.check();
class spawn_errors {
public:
    /// A co_spawn completion handler: records the coroutine's exception (its result, if any, is
    /// dropped), then calls `then()` whether it threw or not.
    template <class Then = void (*)()>
    auto handler(Then then = [] {}) {
        return [this, then = std::move(then)](std::exception_ptr e, auto&&...) mutable {
            if (e) errors_.push_back(std::move(e));
            then();
        };
    }

    /// Fails the test for each recorded exception.
    void check() const {
        for (const auto& e : errors_) {
            try {
                std::rethrow_exception(e);
            } catch (const std::exception& x) {
                FAIL_CHECK("a spawned coroutine threw: " << std::string(x.what()));
            } catch (...) {
                FAIL_CHECK("a spawned coroutine threw something that is not a std::exception");
            }
        }
    }

    [[nodiscard]] bool empty() const noexcept { return errors_.empty(); }

private:
    std::vector<std::exception_ptr> errors_;
};

}  // namespace spawn_support
