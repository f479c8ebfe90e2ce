// libFuzzer target for elastic::dist's codec (dist/codec.hpp, dist/json.hpp): arbitrary bytes, as
// a rank that wrote another type or a forged key would leave them, decoded as several types.
// Either a store_error says why (never another exception), or the value encodes and decodes back
// to itself; a count larger than the bytes behind it never allocates.
#include <elastic/dist/codec.hpp>
#include <elastic/dist/json.hpp>

#include <nlohmann/json.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

namespace fuzz_dist_codec {

namespace dist = elastic::dist;

struct user {
    std::string name;
    std::vector<std::pair<std::int32_t, double>> points;
    void serialize(dist::writer& w) const {
        w(name);
        w(points);
    }
    static user deserialize(dist::reader& r) {
        user u;
        u.name = r.read<std::string>();
        u.points = r.read<std::vector<std::pair<std::int32_t, double>>>();
        return u;
    }
};

// Decodes `bytes` as a T: refused with a store_error, or a value whose bytes decode back to the
// same bytes (compared as bytes: a NaN equals itself, a map's repeated key was dropped once).
template <class T>
void one(std::string_view bytes) {
    std::string again;
    try {
        again = dist::encode(dist::decode<T>(bytes));
    } catch (const elastic::store_error&) {
        return;
    }
    if (dist::encode(dist::decode<T>(again)) != again) std::abort();
}

}  // namespace fuzz_dist_codec

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    using namespace fuzz_dist_codec;
    const std::string_view bytes(reinterpret_cast<const char*>(data), size);
    one<std::vector<std::string>>(bytes);
    one<std::map<std::string, std::vector<std::int64_t>>>(bytes);
    one<std::tuple<std::int32_t, std::optional<std::string>, std::array<std::uint16_t, 3>>>(bytes);
    one<std::vector<user>>(bytes);
    one<std::optional<std::vector<std::optional<std::u16string>>>>(bytes);
    one<nlohmann::json>(bytes);
    one<std::vector<std::map<std::string, int>>>(bytes);  // through dist's own map
    return 0;
}
