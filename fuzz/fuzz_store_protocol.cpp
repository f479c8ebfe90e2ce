// libFuzzer target for the store's request parser: dialect detection, then every request the
// bytes hold, parsed from arbitrary splits the way a connection receives them.
#include <elastic/store/wire.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

namespace {

[[noreturn]] void fail() { std::abort(); }

// What the parser promises, checked on every input: need_more never shrinks below what it has,
// complete consumes a sane size whose prefixes all need more, views stay inside the input,
// and re-encoding a complete request gives back its bytes.
void check_stream(elastic::wire::dialect d, std::string_view in, std::size_t split) {
    using elastic::wire::parse_status;
    const elastic::wire::limits lim{
        .max_key_size = 4096, .max_value_size = 65536, .max_keys_per_request = 256, .max_request_size = 1 << 20};
    elastic::wire::request req;
    while (!in.empty()) {
        // First offer a prefix (a partial read), then everything.
        const auto partial = in.substr(0, split % (in.size() + 1));
        const auto p = elastic::wire::parse_request(d, partial, req, lim);
        if (p.status == parse_status::need_more && p.size <= partial.size()) fail();
        if (p.status == parse_status::complete && (p.size == 0 || p.size > partial.size())) fail();
        const auto r = elastic::wire::parse_request(d, in, req, lim);
        if (r.status == parse_status::need_more) {
            if (r.size <= in.size()) fail();
            return;
        }
        if (r.status == parse_status::malformed) {
            if (r.reason.empty()) fail();
            return;
        }
        if (r.size == 0 || r.size > in.size()) fail();
        const auto whole = in.substr(0, r.size);
        const auto inside = [&](std::string_view v) {
            return v.empty() || (v.data() >= whole.data() && v.data() + v.size() <= whole.data() + whole.size());
        };
        if (!inside(req.key) || !inside(req.value) || !inside(req.expected)) fail();
        for (const auto k : req.keys)
            if (!inside(k)) fail();
        for (const auto v : req.values)
            if (!inside(v)) fail();
        std::string again;
        elastic::wire::encode_request(d, req, again);
        if (again != whole) fail();
        in.remove_prefix(r.size);
        split = split * 31 + 7;
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    if (size == 0) return 0;
    // The first byte picks the split points; the rest is what a connection sent.
    const std::size_t split = data[0];
    const std::string_view in(reinterpret_cast<const char*>(data) + 1, size - 1);
    using elastic::wire::detection;
    const auto d = elastic::wire::detect_dialect(in);
    if (d != elastic::wire::detect_dialect(in.substr(0, 5)) && in.size() >= 5) fail();
    if (d != detection::need_more)
        check_stream(d == detection::current ? elastic::wire::dialect::current : elastic::wire::dialect::legacy, in,
                     split);
    // Both dialects regardless of detection: the parser must hold up either way.
    check_stream(elastic::wire::dialect::legacy, in, split + 1);
    check_stream(elastic::wire::dialect::current, in, split + 2);
    return 0;
}
