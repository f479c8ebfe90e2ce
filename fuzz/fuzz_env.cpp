// libFuzzer target for the worker environment (for fuzz/ as fuzz_env.cpp, seeds in
// fuzz/corpus/env/): input lines "NAME=VALUE" become the variables worker_env::from reads. Either
// env_error is thrown or every invariant of docs/environment.md holds. The Slurm list parsers and
// the error file's JSON escaping are fed the same bytes: escaping must always give a JSON string
// that parses back to the input when the input is valid UTF-8.
#include <elastic/env.hpp>
#include <elastic/record.hpp>

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>
#include <string_view>

namespace fuzz_env {

void check(bool condition) {
    if (!condition) std::abort();
}

struct string_sink {
    std::string text;
    void put(char c) { text.push_back(c); }
};

}  // namespace fuzz_env

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const std::string_view input(reinterpret_cast<const char*>(data), size);

    std::map<std::string, std::string> variables;
    std::string_view rest = input;
    while (!rest.empty()) {
        const auto newline = rest.find('\n');
        const std::string_view line = rest.substr(0, newline);
        rest = newline == std::string_view::npos ? std::string_view() : rest.substr(newline + 1);
        const auto equals = line.find('=');
        if (equals == std::string_view::npos) continue;
        variables[std::string(line.substr(0, equals))] = std::string(line.substr(equals + 1));
    }
    try {
        const auto e = elastic::worker_env::from(variables);
        fuzz_env::check(e.world_size >= 1 && e.rank >= 0 && e.rank < e.world_size);
        fuzz_env::check(e.local_world_size >= 1 && e.local_rank >= 0 && e.local_rank < e.local_world_size);
        fuzz_env::check(e.local_world_size <= e.world_size);
        fuzz_env::check(e.node_count >= 1 && e.node_rank >= 0 && e.node_rank < e.node_count);
        fuzz_env::check(e.role_world_size >= 1 && e.role_rank >= 0 && e.role_rank < e.role_world_size);
        fuzz_env::check(!e.master_port || *e.master_port >= 1);
        fuzz_env::check(!e.master_addr || !e.master_addr->empty());
        fuzz_env::check(e.restart_count >= 0 && e.max_restarts >= 0);
        fuzz_env::check(e.launched() == (e.source != elastic::env_source::defaults));
    } catch (const elastic::env_error& error) {
        fuzz_env::check(std::string_view(error.what()).rfind("invalid worker environment: ", 0) == 0);
        fuzz_env::check(!error.variables().empty());
    }

    (void)elastic::detail::slurm_first_host(input);
    for (int node = 0; node < 4; ++node) {
        if (const auto count = elastic::detail::slurm_tasks_on_node(input, node)) {
            fuzz_env::check(*count >= 0);
        }
    }

    fuzz_env::string_sink escaped;
    elastic::detail::json_escape(escaped, input.data(), input.size());
    for (const char c : escaped.text) fuzz_env::check(c >= 0x20 && c < 0x7f);  // ensure_ascii
    const auto parsed = nlohmann::json::parse("\"" + escaped.text + "\"", nullptr, false);
    fuzz_env::check(parsed.is_string());
    // Without a replacement character the input was valid UTF-8: it must come back unchanged.
    if (escaped.text.find("\\ufffd") == std::string::npos) {
        fuzz_env::check(parsed.get<std::string>() == input);
    }
    return 0;
}
