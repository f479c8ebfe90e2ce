// The launcher's command line end to end: each of torchrun's options in its three spellings
// (dashed, underscored, PET_ variable) observed in what the real elasticrun (agent-elasticrun)
// gives its agent-worker processes, and bad input refused with one line and exit code 2.
// Not tagged concurrent: it starts a hundred short launches one after another and runs no
// concurrency of its own that the agent's tagged tests do not already run.
#include "agent_support.hpp"

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace test_agent_options {

using agent_support::count_files;
using agent_support::temp_dir;
using agent_support::with_worker;
using agent_support::worker_env;

TEST_CASE("agent: bad input is one line naming it, exit code 2, no worker started") {
    struct bad_case {
        std::vector<std::string> args;
        std::string names;
    };
    const std::vector<bad_case> cases{
        {{"--bogus"}, "--bogus"},
        {{"--nnodes=3:2"}, "--nnodes"},
        {{"--nproc-per-node=0"}, "--nproc-per-node"},
        {{"--rdzv-backend=c10d", "--rdzv-conf=join_timeout"}, "--rdzv-conf"},
        {{"--rdzv-backend=c10d", "--rdzv-conf=join_timeout=5,,x=1"}, "--rdzv-conf"},
        {{"--nnodes=1:2", "--rdzv-backend=static"}, "--nnodes=1:2"},
        {{"--rdzv-backend=c10d", "--rdzv-endpoint=localhost:0", "--rdzv-conf=is_host=false"}, "port 0"},
        {{"--log-dir=/etc/passwd"}, "--log-dir"},
        {{"-r", "4"}, "--redirects"},
        {{"--tee=0:7"}, "--tee"},
        {{"--local-ranks-filter=3"}, "--local-ranks-filter"},
        {{"--event-log-handler=syslog"}, "--event-log-handler"},
        {{"--start-method=thread"}, "--start-method"},
        {{"--role=" + std::string(256, 'r')}, "--role"},  // the rendezvous carries at most 255 bytes
    };
    temp_dir dir;
    for (const auto& c : cases) {
        CAPTURE(fmt::format("{}", fmt::join(c.args, " ")));
        auto r = agent_support::run(with_worker(c.args), worker_env(dir, "*:env"));
        CHECK(r.code == 2);
        CHECK(r.err.find(c.names) != std::string::npos);
        CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
        CHECK(r.out.empty());
    }
    {
        auto r = agent_support::run({"--nproc-per-node=2", (dir.path() / "no-such-program").string()},
                                    worker_env(dir, "*:env"));
        CHECK(r.code == 2);
        CHECK(r.err.find("no-such-program does not exist") != std::string::npos);
        CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
    }
    {
        // Executable files that execve refuses: bytes that are neither a binary nor a #! script,
        // and a script whose #! interpreter does not exist. The command line's fault: exit 2,
        // one line naming the file and why, and the rest of the group stopped.
        const auto garbage = dir.path() / "garbage";
        const auto orphan_script = dir.path() / "orphan-script";
        {
            std::ofstream(garbage, std::ios::binary) << std::string("\x7f\x01\x02 not an ELF\n\xff\xfe", 17);
            std::ofstream(orphan_script) << "#!/no/such/interpreter\necho hi\n";
        }
        for (const auto& p : {garbage, orphan_script}) {
            std::filesystem::permissions(p, std::filesystem::perms::owner_all);
        }
        const std::vector<std::pair<std::filesystem::path, std::string>> refused{
            {garbage, "neither a binary nor a #! script"}, {orphan_script, "check the path (or the #! interpreter)"}};
        for (const auto& entry : refused) {
            const std::string program = entry.first.string();  // not a structured binding: CAPTURE's lambda
            CAPTURE(program);
            auto r = agent_support::run({"--nproc-per-node=2", program}, worker_env(dir, "*:env"));
            CHECK(r.code == 2);
            CHECK(r.err.find("cannot execute '" + program + "'") != std::string::npos);
            CHECK(r.err.find(entry.second) != std::string::npos);
            CHECK(r.err.find("internal") == std::string::npos);
        }
    }
    CHECK(count_files(dir.path(), "env.") == 0);
}

// One option's observable effect on the workers, checked in its three spellings: dashed,
// underscored, and from its PET_ variable.
struct option_case {
    std::string dashed;              // "--nproc-per-node"
    std::string value;               // "2"; empty for a flag
    std::vector<std::string> extra;  // options the case needs besides
    std::function<void(const temp_dir&, const agent_support::result&)> check;
};

TEST_CASE("agent: every option of torchrun's table in its three spellings") {
    const auto env_of = [](const temp_dir& dir, int rank = 0) {
        return agent_support::read_env_file(dir.path() / fmt::format("env.0.{}", rank));
    };
    const auto port = std::to_string(agent_support::free_port());
    const std::vector<option_case> cases{
        // clang-format off
        {"--nproc-per-node", "2", {}, [&](const temp_dir& d, const auto&) { CHECK(count_files(d.path(), "env.0.") == 2); }},
        {"--nnodes", "1", {}, [&](const temp_dir& d, const auto&) { CHECK(env_of(d).at("GROUP_WORLD_SIZE") == "1"); }},
        {"--max-restarts", "3", {}, [&](const temp_dir& d, const auto&) {
             CHECK(env_of(d).at("TORCHELASTIC_MAX_RESTARTS") == "3");
         }},
        {"--rdzv-id", "job-17", {}, [&](const temp_dir& d, const auto&) { CHECK(env_of(d).at("TORCHELASTIC_RUN_ID") == "job-17"); }},
        {"--rdzv-backend", "c10d", {"--rdzv-endpoint=localhost:0"}, [&](const temp_dir& d, const auto&) {
             CHECK(env_of(d).at("MASTER_ADDR") == "127.0.0.1");
         }},
        {"--rdzv-endpoint", "127.0.0.1:0", {"--rdzv-backend=c10d"}, [&](const temp_dir& d, const auto&) {
             CHECK(env_of(d).at("MASTER_ADDR") == "127.0.0.1");
             CHECK(env_of(d).at("MASTER_PORT") != "0");
         }},
        {"--rdzv-conf", "join_timeout=5,last_call_timeout=1", {"--rdzv-backend=c10d", "--rdzv-endpoint=localhost:0"},
         [&](const temp_dir& d, const auto&) { CHECK(count_files(d.path(), "env.0.") == 1); }},
        {"--standalone", "", {}, [&](const temp_dir& d, const auto&) {
             CHECK(env_of(d).at("TORCHELASTIC_RUN_ID").size() == 36);
         }},
        {"--monitor-interval", "0.5", {}, [&](const temp_dir& d, const auto&) { CHECK(count_files(d.path(), "env.0.") == 1); }},
        {"--start-method", "fork", {}, [&](const temp_dir& d, const auto&) { CHECK(count_files(d.path(), "env.0.") == 1); }},
        {"--event-log-handler", "null", {}, [&](const temp_dir& d, const auto&) { CHECK(count_files(d.path(), "env.0.") == 1); }},
        {"--role", "trainer", {}, [&](const temp_dir& d, const auto&) { CHECK(env_of(d).at("ROLE_NAME") == "trainer"); }},
        {"--no-python", "", {}, [&](const temp_dir& d, const auto&) { CHECK(count_files(d.path(), "env.0.") == 1); }},
        {"--node-rank", "0", {}, [&](const temp_dir& d, const auto&) { CHECK(env_of(d).at("GROUP_RANK") == "0"); }},
        {"--master-addr", "127.0.0.1", {}, [&](const temp_dir& d, const auto&) { CHECK(env_of(d).at("MASTER_ADDR") == "127.0.0.1"); }},
        {"--master-port", port, {}, [&](const temp_dir& d, const auto&) { CHECK(env_of(d).at("MASTER_PORT") == port); }},
        {"--local-addr", "127.0.0.1", {}, [&](const temp_dir& d, const auto&) { CHECK(env_of(d).at("MASTER_ADDR") == "127.0.0.1"); }},
        {"--signals-to-handle", "SIGTERM,SIGUSR1", {}, [&](const temp_dir& d, const auto&) {
             CHECK(env_of(d).at("TORCHELASTIC_SIGNALS_TO_HANDLE") == "SIGTERM,SIGUSR1");
         }},
        {"--shutdown-timeout", "5", {}, [&](const temp_dir& d, const auto&) { CHECK(count_files(d.path(), "env.0.") == 1); }},
        {"--virtual-local-rank", "", {"--nproc-per-node=2"}, [&](const temp_dir& d, const auto&) {
             CHECK(env_of(d, 1).at("LOCAL_RANK") == "0");
             CHECK(env_of(d, 1).at("RANK") == "1");
             CHECK(env_of(d, 1).at("CUDA_VISIBLE_DEVICES") == "1");
         }},
        // clang-format on
    };
    for (const auto& c : cases) {
        for (int spelling = 0; spelling < 3; ++spelling) {
            std::string underscored = c.dashed;
            std::replace(underscored.begin() + 2, underscored.end(), '-', '_');
            CAPTURE(c.dashed);
            CAPTURE(spelling);
            temp_dir dir;
            auto env = worker_env(dir, "*:env");
            std::vector<std::string> args = c.extra;
            if (spelling < 2) {
                const auto& name = spelling == 0 ? c.dashed : underscored;
                args.push_back(c.value.empty() ? name : name + "=" + c.value);
            } else {
                std::string pet = "PET_" + underscored.substr(2);
                std::transform(pet.begin(), pet.end(), pet.begin(),
                               [](char ch) { return static_cast<char>(std::toupper(ch)); });
                env[pet] = c.value.empty() ? "1" : c.value;
            }
            auto r = agent_support::run(with_worker(args), env);
            INFO(r.err);
            REQUIRE(r.code == 0);
            c.check(dir, r);
        }
    }
    // -m and --run-path need Python; a module that prints the environment's RANK.
    {
        temp_dir dir;
        auto env = worker_env(dir, "");
        env["PYTHON_EXEC"] = ELASTIC_TORCH_PYTHON;
        for (const auto& args : std::vector<std::vector<std::string>>{{"-m", "platform"}, {"--module", "platform"}}) {
            auto r = agent_support::run(args, env);
            CHECK(r.code == 0);
            CHECK(!r.out.empty());
        }
        env["PET_MODULE"] = "1";
        auto r = agent_support::run({"platform"}, env);
        CHECK(r.code == 0);
        env.erase("PET_MODULE");
        const auto script = dir.path() / "print_rank.py";
        // One write(2) per line: print() under -u writes "rank", " " and "1" separately, and the
        // workers share the console.
        std::ofstream(script) << "import os\nos.write(1, ('rank %s\\n' % os.environ['RANK']).encode())\n";
        for (const auto& flag : {"--run-path", "--run_path"}) {
            r = agent_support::run({flag, "--nproc-per-node=2", script.string()}, env);
            INFO(r.out);
            INFO(r.err);
            CHECK(r.code == 0);
            CHECK(r.out.find("rank 1") != std::string::npos);
        }
        r = agent_support::run({"--nproc-per-node=2", script.string()}, env);
        INFO(r.out);
        INFO(r.err);
        CHECK(r.code == 0);
        CHECK(r.out.find("rank 0") != std::string::npos);
    }
}

TEST_CASE("agent: what torchrun accepts leniently runs, and the agent says what it ignored or changed") {
    temp_dir dir;
    // An abbreviated option, a key c10d does not read, quotes a script left, and zero for the
    // exit barrier: the job runs, and each leniency is one warning line.
    auto r = agent_support::run(with_worker({"--standalone", "--nproc=2", "--max_r=1", "--logs-specs=default",
                                             "--rdzv-conf='timeout=5,exit_barrier_timeout=0'"}),
                                worker_env(dir, "*:env"));
    INFO(r.err);
    REQUIRE(r.code == 0);
    CHECK(count_files(dir.path(), "env.0.") == 2);
    CHECK(agent_support::read_env_file(dir.path() / "env.0.1").at("TORCHELASTIC_MAX_RESTARTS") == "1");
    std::vector<std::string> warnings;
    std::istringstream lines(r.err);
    for (std::string line; std::getline(lines, line);) {
        if (line.rfind('W', 0) == 0 && line.find("--rdzv-conf") != std::string::npos) warnings.push_back(line);
    }
    REQUIRE(warnings.size() == 2);
    CHECK(warnings[0].find("--rdzv-conf: the quotes around its value were removed") != std::string::npos);
    CHECK(warnings[1].find("the c10d backend does not read the key 'timeout'; ignored") != std::string::npos);

    r = agent_support::run(with_worker({"--no=1"}), worker_env(dir, "*:env"));
    CHECK(r.code == 2);
    CHECK(r.err.find("ambiguous option: --no could match --no-python, --node-rank") != std::string::npos);
}

TEST_CASE("agent: a Python worker without its module: the agent names the interpreter that ran and PYTHON_EXEC") {
    temp_dir dir;
    const auto script = dir.path() / "needs_module.py";
    std::ofstream(script) << "import elastic_test_no_such_module\n";
    auto env = worker_env(dir, "");
    env.erase("PYTHON_EXEC");
    auto r = agent_support::run({script.string()}, env);
    INFO(r.err);
    CHECK(r.code == 1);
    CHECK(r.err.find("ModuleNotFoundError") != std::string::npos);
    CHECK(r.err.find("(PYTHON_EXEC unset: the first python3 on PATH) and it has no module "
                     "'elastic_test_no_such_module': set PYTHON_EXEC") != std::string::npos);

    env["PYTHON_EXEC"] = ELASTIC_TORCH_PYTHON;
    r = agent_support::run({script.string()}, env);
    CHECK(r.code == 1);
    CHECK(r.err.find(fmt::format("the workers ran with {} (PYTHON_EXEC) and it has no module", ELASTIC_TORCH_PYTHON)) !=
          std::string::npos);

    // Any other failure of a Python worker gets no such line.
    std::ofstream(script, std::ios::trunc) << "raise SystemExit(3)\n";
    r = agent_support::run({script.string()}, env);
    CHECK(r.code == 3);
    CHECK(r.err.find("PYTHON_EXEC") == std::string::npos);
}

}  // namespace test_agent_options
