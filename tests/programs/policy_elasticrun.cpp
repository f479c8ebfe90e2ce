// policy-elasticrun: elasticrun whose policy is make_default_policy(config) — the --restart-*
// options at work through the real agent. (elastic::run(argc, argv) is to call
// make_default_policy itself; until then the policy tests launch this program.)
#include "elastic/policy/from_config.hpp"
#include "elastic/run.hpp"

#include <cstdio>
#include <exception>
#include <string>
#include <variant>

int main(int argc, char** argv) {
    try {
        const auto env = elastic::current_environment();
        auto parsed = elastic::parse_launch_config(argc, argv, env);
        if (const auto* help = std::get_if<elastic::help_request>(&parsed)) {
            std::fputs(help->text.c_str(), stdout);
            return 0;
        }
        const auto& config = std::get<elastic::launch_config>(parsed);
        return elastic::run(config, elastic::make_default_policy(config), env, "policy-elasticrun");
    } catch (const elastic::usage_error& e) {
        std::fprintf(stderr, "policy-elasticrun: error: %s\n", e.what());
        return elastic::usage_error::exit_code();
    } catch (const std::exception& e) {
        std::fprintf(stderr, "policy-elasticrun: error: %s\n", e.what());
        return 1;
    }
}
