// What the sanitizer builds change for tests: the CPU ticks an idle measurement may be charged.
#pragma once

namespace test_sanitizer {

// Idle checks expect 0 CPU ticks. ThreadSanitizer's runtime wakes its own background thread
// every 100 ms and slows every instrumented instruction, so a TSan build may be charged one tick
// over a 2 s window; every other build must show none.
#if defined(__SANITIZE_THREAD__)
inline constexpr long idle_tick_tolerance = 1;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
inline constexpr long idle_tick_tolerance = 1;
#else
inline constexpr long idle_tick_tolerance = 0;
#endif
#else
inline constexpr long idle_tick_tolerance = 0;
#endif

}  // namespace test_sanitizer
