// SPDX-License-Identifier: MIT
// event_destination: the value of --event-log-handler (null, console, or file:PATH), parsed
// and printed; kept apart from the event sink so the launch configuration stays light.
#pragma once

#include "elastic/detail/config.hpp"

#include <optional>
#include <string>
#include <string_view>

namespace elastic::inline v0 {

/// The value of --event-log-handler. torch's handler names `null` (the default: events are
/// dropped) and `console` (torch's logging.StreamHandler: each event's JSON on stderr, one line),
/// plus elastic's `file:PATH`: appended to PATH as JSON lines (created 0644 when absent; a
/// relative PATH is the agent's working directory's).
struct event_destination {
    enum class kind { null, console, file };
    kind what = kind::null;
    std::string path;  ///< for kind::file

    /// Reads `null`, `console` or `file:PATH` (PATH not empty); nullopt for anything else.
    /// Surrounding blanks are ignored, as everywhere on torchrun's command line.
    [[nodiscard]] static std::optional<event_destination> parse(std::string_view text) {
        while (!text.empty() && (text.front() == ' ' || text.front() == '\t')) text.remove_prefix(1);
        while (!text.empty() && (text.back() == ' ' || text.back() == '\t')) text.remove_suffix(1);
        if (text == "null") return event_destination{};
        if (text == "console") return event_destination{kind::console, {}};
        constexpr std::string_view file_prefix = "file:";
        if (text.substr(0, file_prefix.size()) == file_prefix && text.size() > file_prefix.size()) {
            return event_destination{kind::file, std::string(text.substr(file_prefix.size()))};
        }
        return std::nullopt;
    }

    /// What --event-log-handler accepts, for messages and --help.
    static constexpr std::string_view accepted = "null, console or file:PATH";

    /// The option's text: `null`, `console`, `file:PATH`.
    [[nodiscard]] std::string to_string() const {
        switch (what) {
            case kind::console: return "console";
            case kind::file: return "file:" + path;
            case kind::null: break;
        }
        return "null";
    }

    friend bool operator==(const event_destination&, const event_destination&) = default;
};

}  // namespace elastic::inline v0
