// SPDX-License-Identifier: MIT
// elastic::dist for types nlohmann::json converts (to_json/from_json): with this header and
// <nlohmann/json.hpp> included, such a type is serializable, carried as CBOR (exact for numbers,
// compact for text).
#pragma once

#include "elastic/dist/codec.hpp"

#include <nlohmann/json_fwd.hpp>

#include <concepts>
#include <string>
#include <type_traits>

namespace elastic::inline v0::dist {

namespace detail {

// nlohmann::json, named through T so that nothing of it is needed before a type is checked: this
// header costs only json_fwd.hpp, and a program that converts its types to JSON has included
// <nlohmann/json.hpp> by then.
template <class T>
using json_of = std::conditional_t<(sizeof(T) > 0), nlohmann::json, void>;

// A type nlohmann converts both ways, and not one elastic::dist already carries itself, nor a
// pointer or a view (string_view, span): what they point to does not travel.
template <class T>
concept json_convertible = !builtin<T>::value && !std::is_pointer_v<T> &&
                           !(std::is_trivially_copyable_v<T> && requires(const T& v) { v.data(); }) &&
                           requires(json_of<T> & j, const T& v) {
    j = v;
    { j.template get<T>() } -> std::same_as<T>;
};

}  // namespace detail

/// nlohmann::json itself, and any type with to_json/from_json that elastic::dist does not carry
/// already, travel as CBOR.
template <class T>
struct codec<T, std::enable_if_t<std::is_same_v<T, nlohmann::json> || detail::json_convertible<T>>> {
    using json = detail::json_of<T>;
    static void encode(writer& w, const T& value) {
        const json j = value;
        const auto cbor = json::to_cbor(j);
        w.size(cbor.size());
        w.bytes(cbor.data(), cbor.size());
    }
    static T decode(reader& r) {
        const auto n = r.size(1);
        const auto bytes = r.view(n);
        // nlohmann refuses some CBOR by exception even when asked not to (a forged array size):
        // either way it is a store_error like any other undecodable value.
        try {
            auto j = json::from_cbor(bytes.begin(), bytes.end(), true, false);
            if (j.is_discarded()) r.fail("a CBOR document (nlohmann::json)");
            if constexpr (std::is_same_v<T, json>) return j;
            else return j.template get<T>();
        } catch (const typename json::exception& e) {
            r.fail(std::string("a value from its CBOR (") + e.what() + ")");
        }
    }
};

}  // namespace elastic::inline v0::dist
