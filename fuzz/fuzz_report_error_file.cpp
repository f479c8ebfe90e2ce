// libFuzzer target for the error-file reader and everything downstream of it: any bytes a worker
// leaves at TORCHELASTIC_ERROR_FILE must give a parsed or malformed result (never a throw or a
// crash), and a parsed one must format into a summary and an agent error file.
// (Meant for fuzz/fuzz_report_error_file.cpp; seeds in corpus/report_error_file/.)
#include "elastic/report.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const std::string_view bytes(reinterpret_cast<const char*>(data), size);
    const auto read = elastic::parse_error_file(bytes, "/fuzz/error.json");
    if (read.status == elastic::error_file_status::absent) {
        std::abort();  // bytes were given: they parse or they are malformed
    }
    if (read.status == elastic::error_file_status::malformed &&
        elastic::detail::report::valid_utf8(read.problem) != read.problem) {
        std::abort();  // the reason must be printable and JSON-safe
    }
    elastic::worker_failure f;
    f.status = elastic::exit_status::from_signal(static_cast<int>(size % 70));
    f.error_file = read;
    elastic::stderr_tail tail(4, 64);
    tail.feed(bytes);
    f.stderr_tail = tail.snapshot();
    const std::vector<elastic::worker_failure> fs{f};
    const auto summary = elastic::format_summary("fuzz", fs, {.utc = true});
    (void)summary;
    (void)elastic::failure_time(f);
    // The agent's copy must serialise (strict UTF-8 in nlohmann's dump) and read back.
    const auto doc = elastic::agent_error_document(f).dump();
    if (!elastic::parse_error_file(doc).parsed()) {
        std::abort();
    }
    return 0;
}
