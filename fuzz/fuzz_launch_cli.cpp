// libFuzzer target for the launch layer's command line: arbitrary arguments and PET_* variables
// must give a launch_config that validates again, help text, or a one-line usage_error; never a
// crash, a hang, or any other exception.
#include "elastic/launch/cli.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    // One argument per line; a line "PET_NAME=value" goes to the environment instead. PATH points
    // nowhere, so no program is found on it and no nvidia-smi is ever started.
    const std::string_view input{reinterpret_cast<const char*>(data), size};
    std::vector<std::string> args;
    elastic::environment env{{"PATH", "/nonexistent-elastic-fuzz"}};
    std::size_t start = 0;
    while (start <= input.size()) {
        auto end = input.find('\n', start);
        if (end == std::string_view::npos) {
            end = input.size();
        }
        const auto line = input.substr(start, end - start);
        const auto equals = line.find('=');
        if (line.rfind("PET_", 0) == 0 && equals != std::string_view::npos) {
            env[std::string{line.substr(0, equals)}] = std::string{line.substr(equals + 1)};
        } else if (line.find('\0') == std::string_view::npos) {  // argv strings hold no NUL
            args.emplace_back(line);
        }
        start = end + 1;
    }
    try {
        auto result = elastic::parse_launch_config(args, env);
        if (auto* config = std::get_if<elastic::launch_config>(&result)) {
            config->validate(env);  // what the parser returns must pass its own rules
        }
    } catch (const elastic::usage_error& e) {
        if (std::string_view{e.what()}.find('\n') != std::string_view::npos) {
            std::abort();  // usage errors are one line
        }
    }
    return 0;
}
