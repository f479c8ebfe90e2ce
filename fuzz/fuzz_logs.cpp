// libFuzzer target for the workers' output (for fuzz/ as fuzz_logs.cpp, seeds in fuzz/corpus/logs/):
// the bytes are a worker's stream, fed to line_relay in chunks whose size the first byte picks;
// the console copy must be the stream cut into prefixed records — every record starts with the
// prefix, ends at "\n", "\r\n" or a lone "\r" (or gets a "\n" at the end), and the records without
// their prefixes give back the stream. The same bytes are a prefix template for format_log_prefix.
#include <elastic/agent/log_tree.hpp>
#include <elastic/agent/output.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include <sys/mman.h>
#include <unistd.h>

namespace fuzz_logs {

void check(bool condition) {
    if (!condition) std::abort();
}

std::string relayed(std::string_view stream, std::size_t chunk, std::size_t max_line, const std::string& prefix) {
    const int fd = ::memfd_create("fuzz_logs", MFD_CLOEXEC);
    check(fd >= 0);
    {
        elastic::line_relay relay(fd, prefix, max_line);
        for (std::size_t at = 0; at < stream.size(); at += chunk) relay.feed(stream.substr(at, chunk));
        relay.flush();
    }
    std::string out(static_cast<std::size_t>(::lseek(fd, 0, SEEK_END)), '\0');
    check(::pread(fd, out.data(), out.size(), 0) == static_cast<ssize_t>(out.size()));
    ::close(fd);
    return out;
}

}  // namespace fuzz_logs

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    using fuzz_logs::check;
    if (size == 0) return 0;
    const std::size_t chunk = 1 + data[0] % 64;
    const std::string_view stream(reinterpret_cast<const char*>(data) + 1, size - 1);
    const std::string prefix = "[p]:";

    // No bound reached (a bound above the stream's size): exact records.
    const auto out = fuzz_logs::relayed(stream, chunk, stream.size() + 1, prefix);
    std::string back;
    std::size_t at = 0;
    while (at < out.size()) {
        check(out.compare(at, prefix.size(), prefix) == 0);
        at += prefix.size();
        const auto end = out.find_first_of("\n\r", at);
        check(end != std::string::npos);
        std::size_t stop = end + 1;
        if (out[end] == '\r' && stop < out.size() && out[stop] == '\n') ++stop;
        back.append(out, at, stop - at);
        at = stop;
    }
    // The stream back, plus the "\n" a partial last line gets.
    std::string expected(stream);
    if (!expected.empty() && expected.back() != '\n') expected += '\n';
    check(back == expected);

    // With a small bound: every record still starts with the prefix and the output ends a line.
    const auto cut = fuzz_logs::relayed(stream, chunk, 8, prefix);
    check(cut.empty() == stream.empty());
    check(cut.empty() || cut.back() == '\n');
    check(cut.rfind(prefix, 0) == 0 || cut.empty());

    // Any bytes as a template: no crash; without '$' the text is unchanged.
    const auto text = elastic::format_log_prefix(stream, "role", 3, 17);
    if (stream.find('$') == std::string_view::npos) check(text == stream);
    return 0;
}
