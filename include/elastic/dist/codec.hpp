// SPDX-License-Identifier: MIT
// elastic::dist's serialisation customisation point: the values a collective can carry (trivially
// copyable types, strings, vectors, arrays, pairs, tuples, optionals, maps of those, and user
// types with serialize/deserialize or a codec specialisation), encoded to bytes and back.
#pragma once

#include "elastic/store/errors.hpp"

#include "elastic/detail/format.hpp"

#include <algorithm>
#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace elastic::inline v0::dist {

/// Appends a value's bytes to a buffer. Values are written as the process holds them (native
/// byte order and layout), so every rank of a job must run on the same architecture and agree on
/// the types, as they do for a tensor's bytes.
class writer {
public:
    explicit writer(std::string& out) noexcept : out_(out) {}
    /// Appends `size` raw bytes.
    void bytes(const void* data, std::size_t size) { out_.append(static_cast<const char*>(data), size); }
    /// Appends a length or a count.
    void size(std::size_t n) {
        const auto v = static_cast<std::uint64_t>(n);
        bytes(&v, sizeof v);
    }
    /// Appends any serializable value (see `serializable`).
    template <class T>
    void operator()(const T& value);

private:
    std::string& out_;
};

/// Reads values back from bytes a writer produced. Reading past the end, or a length larger than
/// what is left, is a store_error naming the type: the bytes came from another type or another
/// program version.
class reader {
public:
    explicit reader(std::string_view in) noexcept : in_(in) {}
    /// Takes `size` raw bytes.
    void bytes(void* data, std::size_t size) {
        need(size, "bytes");
        if (size != 0) std::memcpy(data, in_.data(), size);
        in_.remove_prefix(size);
    }
    /// Takes a view of the next `size` bytes (valid while the input is).
    std::string_view view(std::size_t size) {
        need(size, "bytes");
        const auto v = in_.substr(0, size);
        in_.remove_prefix(size);
        return v;
    }
    /// Takes a length or a count written by writer::size, checked against the bytes left when
    /// each element needs at least `min_element` bytes.
    std::size_t size(std::size_t min_element = 0) {
        std::uint64_t v = 0;
        bytes(&v, sizeof v);
        if (min_element != 0 && v > in_.size() / min_element)
            fail(elastic::detail::format("a count of {} elements of at least {} bytes each", v, min_element));
        return static_cast<std::size_t>(v);
    }
    /// Takes any serializable value.
    template <class T>
    T read();

    [[nodiscard]] std::size_t remaining() const noexcept { return in_.size(); }

    [[noreturn]] void fail(const std::string& what) const {
        throw store_error(
            elastic::detail::format("elastic::dist: cannot decode {} with {} bytes left: the bytes were written "
                                    "for another type (every rank must pass the same type to a collective)",
                                    what, in_.size()));
    }

private:
    void need(std::size_t n, std::string_view what) const {
        if (n > in_.size()) fail(elastic::detail::format("{} {}", n, what));
    }

    std::string_view in_;
};

/// The customisation point for a type you cannot change: specialise
/// `template <> struct codec<T> { static void encode(writer&, const T&); static T decode(reader&); };`
/// (elastic/dist/json.hpp does so for types nlohmann::json can convert).
template <class T, class = void>
struct codec;

namespace detail {

template <class T>
concept has_codec = requires(writer& w, reader& r, const T& v) {
    codec<T>::encode(w, v);
    { codec<T>::decode(r) } -> std::same_as<T>;
};

template <class T>
concept has_members = requires(writer& w, reader& r, const T& v) {
    v.serialize(w);
    { T::deserialize(r) } -> std::same_as<T>;
};

template <class>
inline constexpr bool is_array_v = false;
template <class T, std::size_t N>
inline constexpr bool is_array_v<std::array<T, N>> = true;
template <class>
inline constexpr bool is_optional_v = false;
template <class T>
inline constexpr bool is_optional_v<std::optional<T>> = true;
template <class>
inline constexpr bool is_pair_v = false;
template <class A, class B>
inline constexpr bool is_pair_v<std::pair<A, B>> = true;
template <class>
inline constexpr bool is_tuple_v = false;
template <class... T>
inline constexpr bool is_tuple_v<std::tuple<T...>> = true;

// Copied as bytes: trivially copyable types, except pointers (meaningless in another process),
// views such as string_view or span (they point elsewhere), C arrays, and the standard templates
// this header takes apart element by element (a pair<const K, V> may be trivially copyable, but
// its padding must not travel, and an optional's flag is checked when read). A codec
// specialisation or members take precedence.
template <class T>
concept plain = std::is_trivially_copyable_v<T> && !std::is_pointer_v<T> && !std::is_member_pointer_v<T> &&
                !std::is_array_v<T> && !is_array_v<T> && !is_optional_v<T> && !is_pair_v<T> && !is_tuple_v<T> &&
                !requires(const T& v) {
    v.data();
};

// Traits, not concepts: containers are serializable when their elements are (a concept may not
// name itself). `builtin` is what this header carries without any codec specialisation.
template <class T>
struct is_serializable;
template <class T>
struct builtin : std::bool_constant<plain<T> || has_members<T>> {};
template <class C, class Tr, class A>
struct builtin<std::basic_string<C, Tr, A>> : std::bool_constant<plain<C>> {};
template <class T, class A>
struct builtin<std::vector<T, A>> : std::bool_constant<is_serializable<T>::value && !std::is_same_v<T, bool>> {};
template <class T, std::size_t N>
struct builtin<std::array<T, N>> : is_serializable<T> {};
template <class A, class B>
struct builtin<std::pair<A, B>> : std::bool_constant<is_serializable<A>::value && is_serializable<B>::value> {};
template <class... T>
struct builtin<std::tuple<T...>> : std::bool_constant<(is_serializable<T>::value && ...)> {};
template <class T>
struct builtin<std::optional<T>> : is_serializable<T> {};
template <class K, class V, class Cmp, class A>
struct builtin<std::map<K, V, Cmp, A>> : std::bool_constant<is_serializable<K>::value && is_serializable<V>::value> {};
template <class T>
struct is_serializable : std::bool_constant<builtin<T>::value || has_codec<T>> {};
template <class T>
struct is_serializable<const T> : is_serializable<T> {};  // a map's pair<const K, V>

// Elements a container copies in one block (not bool: each is checked to be 0 or 1 when read).
template <class T>
concept bulk = plain<T> && !has_members<T> && !has_codec<T> && !std::is_same_v<T, bool>;

// The fewest bytes a T's encoding takes (0: unknown, a user's serialize). A count read for a
// container must fit the bytes left at this size per element, so forged counts allocate nothing.
template <class T>
constexpr std::size_t min_size() {
    if constexpr (has_members<T> || has_codec<T>) return 0;
    else if constexpr (plain<T>) return sizeof(T);
    else if constexpr (is_pair_v<T>)
        return min_size<std::remove_const_t<typename T::first_type>>() + min_size<typename T::second_type>();
    else if constexpr (is_optional_v<T>) return 1;
    else if constexpr (is_tuple_v<T>) return []<std::size_t... I>(std::index_sequence<I...>) {
            return (std::size_t{0} + ... + min_size<std::tuple_element_t<I, T>>());
        }
    (std::make_index_sequence<std::tuple_size_v<T>>{});
    else if constexpr (is_array_v<T>) return std::tuple_size_v<T> * min_size<typename T::value_type>();
    else return sizeof(std::uint64_t);  // string, vector, map: their count
}

}  // namespace detail

/// What a collective can carry: trivially copyable types (not pointers or views; the bytes of a
/// struct travel as they are, so a pointer inside one arrives meaningless), std::basic_string,
/// std::vector (not of bool), std::array, std::pair, std::tuple, std::optional and std::map of
/// serializable types, and user types with `void serialize(dist::writer&) const` and
/// `static T deserialize(dist::reader&)`, or with a `codec<T>` specialisation.
template <class T>
concept serializable = detail::is_serializable<std::remove_cvref_t<T>>::value;

template <class T>
void writer::operator()(const T& value) {
    static_assert(serializable<T>, "elastic::dist: this type is not serializable (see dist::serializable)");
    if constexpr (detail::has_members<T>) {
        value.serialize(*this);
    } else if constexpr (detail::has_codec<T>) {
        codec<T>::encode(*this, value);
    } else if constexpr (detail::plain<T>) {
        bytes(&value, sizeof(T));
    } else if constexpr (requires { value.c_str(); }) {  // basic_string
        size(value.size());
        bytes(value.data(), value.size() * sizeof(typename T::value_type));
    } else if constexpr (detail::is_pair_v<T>) {
        (*this)(value.first);
        (*this)(value.second);
    } else if constexpr (detail::is_optional_v<T>) {
        const std::uint8_t has = value.has_value() ? 1 : 0;
        bytes(&has, 1);
        if (value) (*this)(*value);
    } else if constexpr (detail::is_tuple_v<T>) {
        std::apply([this](const auto&... e) { ((*this)(e), ...); }, value);
    } else if constexpr (requires { typename T::key_type; }) {  // map: key, value, key, value ...
        size(value.size());
        for (const auto& [k, v] : value) {
            (*this)(k);
            (*this)(v);
        }
    } else {  // array (no count: it is in the type), vector
        using E = typename T::value_type;
        if constexpr (!detail::is_array_v<T>) size(value.size());
        if constexpr (detail::bulk<E>) {
            if (!value.empty()) bytes(value.data(), value.size() * sizeof(E));
        } else {
            for (const auto& e : value) (*this)(e);
        }
    }
}

template <class T>
T reader::read() {
    static_assert(serializable<T>, "elastic::dist: this type is not serializable (see dist::serializable)");
    if constexpr (detail::has_members<T>) {
        return T::deserialize(*this);
    } else if constexpr (detail::has_codec<T>) {
        return codec<T>::decode(*this);
    } else if constexpr (std::is_same_v<T, bool>) {
        std::uint8_t b = 0;
        bytes(&b, 1);
        if (b > 1) fail("a bool (a byte other than 0 or 1)");
        return b == 1;
    } else if constexpr (detail::plain<T>) {
        static_assert(std::is_default_constructible_v<T>, "elastic::dist: a plain type must be default-constructible");
        T value{};
        bytes(&value, sizeof(T));
        return value;
    } else if constexpr (requires(T s) { s.c_str(); }) {
        using C = typename T::value_type;
        T s(size(sizeof(C)), C{});
        if (!s.empty()) bytes(s.data(), s.size() * sizeof(C));
        return s;
    } else if constexpr (detail::is_pair_v<T>) {
        auto a = read<std::remove_cv_t<typename T::first_type>>();
        auto b = read<std::remove_cv_t<typename T::second_type>>();
        return T(std::move(a), std::move(b));
    } else if constexpr (detail::is_optional_v<T>) {
        std::uint8_t has = 0;
        bytes(&has, 1);
        if (has > 1) fail("an optional's flag (a byte other than 0 or 1)");
        if (!has) return T{};
        return T(read<typename T::value_type>());
    } else if constexpr (detail::is_tuple_v<T>) {
        // Read in order into the tuple's elements (braced initialisation sequences the reads).
        return [this]<std::size_t... I>(std::index_sequence<I...>) {
            // this-> for clang, which otherwise takes the capture for unused
            return T{this->template read<std::remove_cv_t<std::tuple_element_t<I, T>>>()...};
        }
        (std::make_index_sequence<std::tuple_size_v<T>>{});
    } else if constexpr (detail::is_array_v<T>) {
        using E = typename T::value_type;
        T a{};
        if constexpr (std::tuple_size_v<T> == 0) return a;  // nothing written (data() may be null)
        else if constexpr (detail::bulk<E>) bytes(a.data(), std::tuple_size_v<T> * sizeof(E));
        else
            for (auto& e : a) e = read<E>();
        return a;
    } else if constexpr (requires { typename T::key_type; }) {  // map
        using K = typename T::key_type;
        using V = typename T::mapped_type;
        T m;
        const auto n = size(std::max<std::size_t>(1, detail::min_size<K>() + detail::min_size<V>()));
        for (std::size_t i = 0; i < n; ++i) {
            auto k = read<K>();
            auto v = read<V>();
            m.emplace_hint(m.end(), std::move(k), std::move(v));
        }
        return m;
    } else {  // vector
        using E = typename T::value_type;
        T v;
        if constexpr (detail::bulk<E>) {
            v.resize(size(sizeof(E)));
            if (!v.empty()) bytes(v.data(), v.size() * sizeof(E));
        } else {
            constexpr auto least = detail::min_size<E>();
            const auto n = size(std::max<std::size_t>(1, least));
            if (least != 0) v.reserve(n);  // at most sizeof(E) / least times the bytes left
            for (std::size_t i = 0; i < n; ++i) v.push_back(read<E>());
        }
        return v;
    }
}

/// The bytes of one value.
template <serializable T>
std::string encode(const T& value) {
    std::string out;
    writer w(out);
    w(value);
    return out;
}

/// A value back from encode's bytes; bytes left over, or too few, are a store_error.
template <serializable T>
T decode(std::string_view bytes) {
    reader r(bytes);
    auto value = r.template read<T>();
    if (r.remaining() != 0) r.fail("the end of a value (bytes left over)");
    return value;
}

}  // namespace elastic::inline v0::dist
