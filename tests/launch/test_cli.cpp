// Tests of torchrun's command line for elastic: every option in every spelling and through its
// PET_ variable, precedence, the program and its pass-through arguments, bad input, --help.
#include "elastic/launch/cli.hpp"

#include "launch_support.hpp"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <optional>
#include <chrono>
#include <csignal>
#include <functional>
#include <set>
#include <string>
#include <vector>

namespace test_cli {

using namespace std::chrono_literals;
using elastic::environment;
using elastic::launch_config;
using launch_support::parse;
using launch_support::temp_dir;
using launch_support::usage_error_of;

/// A temporary directory holding an executable program, a script and a fake interpreter, and an
/// environment whose PATH and PYTHON_EXEC point at them.
struct fixture {
    temp_dir dir;
    std::string program = launch_support::write_program(dir, "worker");
    std::string script = dir.write("train.py", "print('hello')\n", 0644);
    std::string python = launch_support::write_program(dir, "python");
    environment env{{"PATH", dir.path() + ":/usr/bin:/bin"}, {"PYTHON_EXEC", python}};
};

/// One row: an option's spellings, a good value, and what it must do to the configuration.
struct option_case {
    std::vector<std::string> spellings;
    std::string env;      ///< its PET_ variable
    std::string value;    ///< empty: a flag
    std::string program;  ///< "" = fixture's executable; "script", or a module name for -m
    std::function<void(const launch_config&, const fixture&)> check;
};

std::vector<option_case> option_cases() {
    return {
        // clang-format off
        {{"--nproc-per-node", "--nproc_per_node"}, "PET_NPROC_PER_NODE", "4", "",
         [](const launch_config& c, const fixture&) { CHECK(c.nproc_per_node == 4); }},
        {{"--nnodes"}, "PET_NNODES", "3", "",
         [](const launch_config& c, const fixture&) { CHECK(c.nnodes == elastic::node_range{3, 3}); }},
        {{"--rdzv-backend", "--rdzv_backend"}, "PET_RDZV_BACKEND", "c10d", "",
         [](const launch_config& c, const fixture&) { CHECK(c.rdzv_backend == elastic::rendezvous_backend::c10d); }},
        {{"--rdzv-endpoint", "--rdzv_endpoint"}, "PET_RDZV_ENDPOINT", "node0:1234", "",
         [](const launch_config& c, const fixture&) {
             REQUIRE(c.rdzv_endpoint.has_value());
             CHECK(*c.rdzv_endpoint == elastic::host_port{"node0", 1234});
             CHECK(c.rendezvous_endpoint() == elastic::host_port{"node0", 1234});
         }},
        {{"--rdzv-id", "--rdzv_id"}, "PET_RDZV_ID", "job-7", "",
         [](const launch_config& c, const fixture&) { CHECK(c.rdzv_id == "job-7"); }},
        {{"--rdzv-conf", "--rdzv_conf"}, "PET_RDZV_CONF", "timeout=5", "",
         [](const launch_config& c, const fixture&) { CHECK(c.rdzv_conf.timeout == 5s); }},
        {{"--standalone"}, "PET_STANDALONE", "", "",
         [](const launch_config& c, const fixture&) {
             CHECK(c.rdzv_backend == elastic::rendezvous_backend::c10d);
             CHECK(c.rendezvous_endpoint() == elastic::host_port{"localhost", 0});
             CHECK(c.rdzv_id.size() == 36);
             CHECK(c.nnodes == elastic::node_range{1, 1});
         }},
        {{"--max-restarts", "--max_restarts"}, "PET_MAX_RESTARTS", "3", "",
         [](const launch_config& c, const fixture&) { CHECK(c.max_restarts == 3); }},
        {{"--restart-backoff", "--restart_backoff"}, "PET_RESTART_BACKOFF", "1s:1min", "",
         [](const launch_config& c, const fixture&) {
             CHECK(c.restart_backoff == elastic::backoff_spec{1s, 1min});
         }},
        {{"--restart-window", "--restart_window"}, "PET_RESTART_WINDOW", "5/1h", "",
         [](const launch_config& c, const fixture&) { CHECK(c.restart_window == elastic::window_spec{5, 1h}); }},
        {{"--restart-on-exit", "--restart_on_exit"}, "PET_RESTART_ON_EXIT", "1,75-78,signals", "",
         [](const launch_config& c, const fixture&) {
             REQUIRE(c.restart_on_exit.has_value());
             CHECK(c.restart_on_exit->to_string() == "1,75-78,signals");
         }},
        {{"--restart-crash-guard", "--restart_crash_guard"}, "PET_RESTART_CRASH_GUARD", "30s:2", "",
         [](const launch_config& c, const fixture&) {
             CHECK(c.restart_crash_guard == elastic::crash_guard_spec{30s, 2});
         }},
        {{"--monitor-interval", "--monitor_interval"}, "PET_MONITOR_INTERVAL", "0.5", "",
         [](const launch_config& c, const fixture&) { CHECK(c.monitor_interval == 500ms); }},
        {{"--start-method", "--start_method"}, "PET_START_METHOD", "fork", "",
         [](const launch_config& c, const fixture&) { CHECK(c.program.kind == elastic::program_kind::automatic); }},
        {{"--role"}, "PET_ROLE", "trainer", "",
         [](const launch_config& c, const fixture&) { CHECK(c.role == "trainer"); }},
        {{"-m", "--module"}, "PET_MODULE", "", "pkg.train",
         [](const launch_config& c, const fixture& f) {
             CHECK(c.program.kind == elastic::program_kind::python_module);
             const auto command = elastic::resolve_program(c.program, f.env);
             CHECK(command.path == f.python);
             CHECK(command.argv == std::vector<std::string>{f.python, "-u", "-m", "pkg.train", "--lr=1"});
         }},
        {{"--no-python", "--no_python"}, "PET_NO_PYTHON", "", "",
         [](const launch_config& c, const fixture&) { CHECK(c.program.kind == elastic::program_kind::executable); }},
        {{"--run-path", "--run_path"}, "PET_RUN_PATH", "", "script",
         [](const launch_config& c, const fixture& f) {
             CHECK(c.program.kind == elastic::program_kind::python_script);
             CHECK(elastic::resolve_program(c.program, f.env).argv ==
                   std::vector<std::string>{f.python, "-u", f.script, "--lr=1"});
         }},
        {{"--log-dir", "--log_dir"}, "PET_LOG_DIR", "/dev/null", "",
         [](const launch_config& c, const fixture&) { CHECK(c.logs_disabled()); }},
        {{"-r", "--redirects"}, "PET_REDIRECTS", "3", "",
         [](const launch_config& c, const fixture&) { CHECK(c.redirects.for_rank(0) == elastic::std_streams::all); }},
        {{"-t", "--tee"}, "PET_TEE", "0:2", "",
         [](const launch_config& c, const fixture&) { CHECK(c.tee.for_rank(0) == elastic::std_streams::err); }},
        {{"--local-ranks-filter", "--local_ranks_filter"}, "PET_LOCAL_RANKS_FILTER", "0", "",
         [](const launch_config& c, const fixture&) { CHECK(c.local_ranks_filter == std::set<int>{0}); }},
        {{"--duplicate-stdout-filters", "--duplicate_stdout_filters"}, "PET_DUPLICATE_STDOUT_FILTERS", "loss,,x,NCCL", "",
         [](const launch_config& c, const fixture&) {
             CHECK(c.duplicate_stdout_filters == std::vector<std::string>{"loss,x", "NCCL"});
         }},
        {{"--duplicate-stderr-filters", "--duplicate_stderr_filters"}, "PET_DUPLICATE_STDERR_FILTERS", "NCCL", "",
         [](const launch_config& c, const fixture&) {
             CHECK(c.duplicate_stderr_filters == std::vector<std::string>{"NCCL"});
         }},
        {{"--node-rank", "--node_rank"}, "PET_NODE_RANK", "0", "",
         [](const launch_config& c, const fixture&) { CHECK(c.node_rank == 0); }},
        {{"--master-addr", "--master_addr"}, "PET_MASTER_ADDR", "10.1.2.3", "",
         [](const launch_config& c, const fixture&) {
             CHECK(c.rendezvous_endpoint() == elastic::host_port{"10.1.2.3", 29500});
         }},
        {{"--master-port", "--master_port"}, "PET_MASTER_PORT", "1234", "",
         [](const launch_config& c, const fixture&) {
             CHECK(c.rendezvous_endpoint() == elastic::host_port{"127.0.0.1", 1234});
         }},
        {{"--local-addr", "--local_addr"}, "PET_LOCAL_ADDR", "node7.example", "",
         [](const launch_config& c, const fixture&) { CHECK(c.local_addr == "node7.example"); }},
        {{"--signals-to-handle", "--signals_to_handle"}, "PET_SIGNALS_TO_HANDLE", "SIGTERM,SIGUSR1", "",
         [](const launch_config& c, const fixture&) {
             CHECK(c.signals_to_handle == std::vector<int>{SIGTERM, SIGUSR1});
         }},
        {{"--shutdown-timeout", "--shutdown_timeout"}, "PET_SHUTDOWN_TIMEOUT", "90", "",
         [](const launch_config& c, const fixture&) { CHECK(c.shutdown_timeout == 90s); }},
        {{"--virtual-local-rank", "--virtual_local_rank"}, "PET_VIRTUAL_LOCAL_RANK", "", "",
         [](const launch_config& c, const fixture&) { CHECK(c.virtual_local_rank); }},
        {{"--event-log-handler", "--event_log_handler"}, "PET_EVENT_LOG_HANDLER", "file:events.jsonl", "",
         [](const launch_config& c, const fixture&) {
             CHECK(c.event_log_handler == elastic::event_destination{elastic::event_destination::kind::file, "events.jsonl"});
         }},
        // clang-format on
    };
}

/// Options refused with a message; each with a value it is refused for.
struct refused_case {
    std::vector<std::string> spellings;
    std::string env;  ///< "" when torchrun has no PET_ form
    std::string value;
    std::string says;  ///< what the message must say besides the value
};

std::vector<refused_case> refused_cases() {
    return {
        {{"--logs-specs", "--logs_specs"}, "", "my_specs", "not implemented"},
        {{"--numa-binding", "--numa_binding"}, "", "node", "numactl '--cpunodebind=${local_rank}'"},
    };
}

std::string target_of(const option_case& row, const fixture& f) {
    return row.program.empty() ? f.program : row.program == "script" ? f.script : row.program;
}

TEST_CASE("launch: every option of torchrun's table is registered, in every spelling") {
    // torchrun-inventory.md section 1, newest main: the first spelling of each, then its aliases.
    const std::vector<std::string> torchrun = {"--nnodes",
                                               "--nproc-per-node",
                                               "--nproc_per_node",
                                               "--rdzv-backend",
                                               "--rdzv_backend",
                                               "--rdzv-endpoint",
                                               "--rdzv_endpoint",
                                               "--rdzv-id",
                                               "--rdzv_id",
                                               "--rdzv-conf",
                                               "--rdzv_conf",
                                               "--standalone",
                                               "--max-restarts",
                                               "--max_restarts",
                                               "--monitor-interval",
                                               "--monitor_interval",
                                               "--start-method",
                                               "--start_method",
                                               "--event-log-handler",
                                               "--event_log_handler",
                                               "--role",
                                               "-m",
                                               "--module",
                                               "--no-python",
                                               "--no_python",
                                               "--run-path",
                                               "--run_path",
                                               "--log-dir",
                                               "--log_dir",
                                               "-r",
                                               "--redirects",
                                               "-t",
                                               "--tee",
                                               "--local-ranks-filter",
                                               "--local_ranks_filter",
                                               "--duplicate-stdout-filters",
                                               "--duplicate_stdout_filters",
                                               "--duplicate-stderr-filters",
                                               "--duplicate_stderr_filters",
                                               "--node-rank",
                                               "--node_rank",
                                               "--master-addr",
                                               "--master_addr",
                                               "--master-port",
                                               "--master_port",
                                               "--local-addr",
                                               "--local_addr",
                                               "--logs-specs",
                                               "--logs_specs",
                                               "--numa-binding",
                                               "--numa_binding",
                                               "--signals-to-handle",
                                               "--signals_to_handle",
                                               "--shutdown-timeout",
                                               "--shutdown_timeout",
                                               "--virtual-local-rank",
                                               "--virtual_local_rank"};
    std::set<std::string> registered;
    for (const auto& spec : elastic::detail::launch::option_specs) {
        for (const auto name : elastic::detail::launch::split(spec.names, ',')) {
            registered.emplace(name);
        }
    }
    for (const auto& name : torchrun) {
        CHECK_MESSAGE(registered.count(name) == 1, name << " is not registered");
    }
    // ... and each one is exercised below, as accepted or as refused.
    std::set<std::string> tested;
    for (const auto& row : option_cases()) {
        tested.insert(row.spellings.begin(), row.spellings.end());
    }
    for (const auto& row : refused_cases()) {
        tested.insert(row.spellings.begin(), row.spellings.end());
    }
    for (const auto& name : torchrun) {
        CHECK_MESSAGE(tested.count(name) == 1, name << " has no test row");
    }
}

TEST_CASE("launch: every option in every spelling, as --opt=value, --opt value, and PET_*") {
    for (const auto& row : option_cases()) {
        fixture f;
        const auto target = target_of(row, f);
        for (const auto& spelling : row.spellings) {
            CAPTURE(spelling);
            if (row.value.empty()) {
                row.check(parse({spelling, target, "--lr=1"}, f.env), f);
                continue;
            }
            if (spelling.size() == 2) {  // -r3: a short option's value may be glued on
                row.check(parse({spelling + row.value, target, "--lr=1"}, f.env), f);
            } else {
                row.check(parse({spelling + "=" + row.value, target, "--lr=1"}, f.env), f);
            }
            row.check(parse({spelling, row.value, target, "--lr=1"}, f.env), f);
        }
        CAPTURE(row.env);
        auto env = f.env;
        env[row.env] = row.value.empty() ? "1" : row.value;
        row.check(parse({target, "--lr=1"}, env), f);
    }
}

TEST_CASE("launch: the command line wins over PET_* (a bad PET_ value is never read when the option is given)") {
    for (const auto& row : option_cases()) {
        fixture f;
        CAPTURE(row.env);
        auto env = f.env;
        env[row.env] = row.value.empty() ? "not-an-integer" : "@bad@";
        const auto target = target_of(row, f);
        if (row.value.empty()) {
            row.check(parse({row.spellings.back(), target, "--lr=1"}, env), f);
        } else {
            row.check(parse({row.spellings.back() + "=" + row.value, target, "--lr=1"}, env), f);
        }
    }
    fixture f;
    auto env = f.env;
    env["PET_NPROC_PER_NODE"] = "2";
    env["PET_MAX_RESTARTS"] = "5";
    const auto config = parse({"--nproc_per_node=3", f.program}, env);
    CHECK(config.nproc_per_node == 3);
    CHECK(config.max_restarts == 5);
}

TEST_CASE("launch: PET_ flags read as torchrun reads them: an integer, 0 is off") {
    fixture f;
    auto env = f.env;
    env["PET_STANDALONE"] = "0";
    CHECK(parse({f.program}, env).rdzv_backend == elastic::rendezvous_backend::static_);
    env["PET_STANDALONE"] = "2";
    CHECK(parse({f.program}, env).rdzv_backend == elastic::rendezvous_backend::c10d);
    env["PET_STANDALONE"] = "yes";
    CHECK(usage_error_of({f.program}, env).find("PET_STANDALONE=yes") != std::string::npos);
    env.erase("PET_STANDALONE");
    env["PET_NNODES"] = "";  // an empty variable counts as unset
    CHECK(parse({f.program}, env).nnodes == elastic::node_range{1, 1});
}

TEST_CASE("launch: defaults are torchrun's") {
    fixture f;
    const auto c = parse({f.program}, f.env);
    CHECK(c.nproc_per_node == 1);
    CHECK(c.nnodes == elastic::node_range{1, 1});
    CHECK(c.rdzv_backend == elastic::rendezvous_backend::static_);
    CHECK(c.rendezvous_endpoint() == elastic::host_port{"127.0.0.1", 29500});
    CHECK(c.rdzv_id == "none");
    CHECK(c.rdzv_conf == elastic::rendezvous_settings{});
    CHECK(c.rdzv_conf.join_timeout == 600s);
    CHECK(c.rdzv_conf.timeout == 900s);
    CHECK(!c.node_rank);
    CHECK(c.max_restarts == 0);
    CHECK(c.monitor_interval == 100ms);
    CHECK(c.shutdown_timeout == 30s);
    CHECK(c.exit_barrier_timeout == 300s);
    CHECK(c.signals_to_handle == std::vector<int>{SIGTERM, SIGINT, SIGHUP, SIGQUIT});
    CHECK(c.role == "default");
    CHECK(!c.log_dir);
    CHECK(c.redirects == elastic::stream_selection{});
    CHECK(c.tee == elastic::stream_selection{});
    CHECK(c.local_ranks_filter.empty());
    CHECK(c.log_line_prefix_template == "[${role_name}${local_rank}]:");
    CHECK(c.agent_log_level == elastic::log_level::warning);
    CHECK(!c.virtual_local_rank);
    CHECK(c.program.python == f.python);
}

TEST_CASE("launch: the program's arguments pass through untouched, even ones that look like options") {
    fixture f;
    const std::vector<std::string> args = {"--help", "-m", "--nproc-per-node=8", "--", "x${local_rank}", "", "--lr="};
    std::vector<std::string> argv = {"--nproc-per-node=2", f.program};
    argv.insert(argv.end(), args.begin(), args.end());
    const auto c = parse(argv, f.env);
    CHECK(c.nproc_per_node == 2);
    CHECK(c.program.kind == elastic::program_kind::automatic);
    CHECK(c.program.target == f.program);
    CHECK(c.program.args == args);
    const auto command = elastic::resolve_program(c.program, f.env);
    CHECK(command.argv_for(1) ==
          std::vector<std::string>{f.program, "--help", "-m", "--nproc-per-node=8", "--", "x1", "", "--lr="});

    // `--` ends the options: a program may then start with '-' (found on PATH here).
    const auto dashed = f.dir.write("-weird", "#!/bin/sh\n", 0755);
    const auto c2 = parse({"--max-restarts=1", "--", "-weird", "-x"}, f.env);
    CHECK(c2.max_restarts == 1);
    CHECK(c2.program.target == "-weird");
    CHECK(c2.program.args == std::vector<std::string>{"-x"});
    CHECK(elastic::resolve_program(c2.program, f.env).path == dashed);
}

TEST_CASE("launch: program kinds: an executable, a .py script, -m, --no-python, PATH lookup") {
    fixture f;
    {
        const auto c = parse({f.program, "a"}, f.env);
        const auto command = elastic::resolve_program(c.program, f.env);
        CHECK(command.kind == elastic::program_kind::executable);
        CHECK(command.path == f.program);
        CHECK(command.argv == std::vector<std::string>{f.program, "a"});
    }
    {
        const auto c = parse({f.script, "a"}, f.env);
        const auto command = elastic::resolve_program(c.program, f.env);
        CHECK(command.kind == elastic::program_kind::python_script);
        CHECK(command.path == f.python);
        CHECK(command.argv == std::vector<std::string>{f.python, "-u", f.script, "a"});
    }
    {
        // PYTHON_EXEC by name, found on PATH; default python3 when unset.
        auto env = f.env;
        env["PYTHON_EXEC"] = "python";
        const auto command = elastic::resolve_program(parse({f.script}, env).program, env);
        CHECK(command.path == f.python);
        CHECK(command.argv.front() == "python");
        env.erase("PYTHON_EXEC");
        CHECK(parse({"worker"}, env).program.python == "python3");
    }
    {
        // --no-python runs even a .py file directly: it must then be executable.
        const auto message = usage_error_of({"--no-python", f.script}, f.env);
        CHECK(message.find(f.script) != std::string::npos);
        CHECK(message.find("not executable") != std::string::npos);
        const auto exec_script = f.dir.write("run.py", "#!/bin/sh\n", 0755);
        const auto command = elastic::resolve_program(parse({"--no-python", exec_script}, f.env).program, f.env);
        CHECK(command.argv == std::vector<std::string>{exec_script});
    }
    {
        // A bare name is looked up on PATH like execvp.
        const auto command = elastic::resolve_program(parse({"worker"}, f.env).program, f.env);
        CHECK(command.path == f.program);
        CHECK(command.argv == std::vector<std::string>{"worker"});
    }
}

TEST_CASE("launch: --standalone as torchrun, and conflicting explicit options are errors") {
    fixture f;
    const auto a = parse({"--standalone", "--nproc-per-node=2", f.program}, f.env);
    const auto b = parse({"--standalone", f.program}, f.env);
    CHECK(a.rdzv_id != b.rdzv_id);
    CHECK(a.rdzv_id[14] == '4');  // UUID version 4
    CHECK(parse({"--standalone", "--nnodes=1", "--rdzv-backend=c10d", f.program}, f.env).nnodes ==
          elastic::node_range{1, 1});
    CHECK(parse({"--standalone", "--rdzv-conf=join_timeout=5", f.program}, f.env).rdzv_conf.join_timeout == 5s);
    CHECK(usage_error_of({"--standalone", "--nnodes=2", f.program}, f.env).find("--nnodes=2") != std::string::npos);
    CHECK(usage_error_of({"--standalone", "--rdzv-backend=static", f.program}, f.env).find("--rdzv-backend=static") !=
          std::string::npos);
    CHECK(usage_error_of({"--standalone", "--rdzv-endpoint=h:1", f.program}, f.env).find("--rdzv-endpoint") !=
          std::string::npos);
    CHECK(usage_error_of({"--standalone", "--rdzv-id=x", f.program}, f.env).find("--rdzv-id") != std::string::npos);
    CHECK(usage_error_of({"--standalone", "--master-port=5", f.program}, f.env).find("--master-port") !=
          std::string::npos);
    // From the environment, --standalone overrides them (a scheduler's blanket PET_ variables).
    auto env = f.env;
    env["PET_RDZV_ID"] = "from-env";
    env["PET_NNODES"] = "4";
    env["PET_RDZV_BACKEND"] = "static";
    const auto c = parse({"--standalone", f.program}, env);
    CHECK(c.rdzv_id != "from-env");
    CHECK(c.nnodes == elastic::node_range{1, 1});
    CHECK(c.rdzv_backend == elastic::rendezvous_backend::c10d);
}

TEST_CASE("launch: rendezvous options: elastic ranges, endpoints, IPv6, backends, master address rules") {
    fixture f;
    const auto c = parse({"--nnodes=1:4", "--rdzv-backend=c10d", "--rdzv-endpoint=[fe80::1]", "--rdzv-id=j",
                          "--rdzv-conf=join_timeout=10,last_call_timeout=2.5,is_host=false,store_type=tcp,use_libuv=1",
                          "--node-rank=3", f.program},
                         f.env);
    CHECK(c.nnodes == elastic::node_range{1, 4});
    CHECK(c.rendezvous_endpoint() == elastic::host_port{"fe80::1", 29400});
    CHECK(c.rdzv_conf.join_timeout == 10s);
    CHECK(c.rdzv_conf.last_call_timeout == 2500ms);
    CHECK(c.rdzv_conf.is_host == false);
    CHECK(c.node_rank == 3);
    CHECK(parse({"--rdzv-backend=etcd-v3", "--rdzv-endpoint=[::1]:2380", "--rdzv-conf=protocol=http", f.program}, f.env)
              .rendezvous_endpoint() == elastic::host_port{"::1", 2380});
    CHECK(parse({"--rdzv-backend=etcd-v3", f.program}, f.env).rendezvous_endpoint() ==
          elastic::host_port{"localhost", 2379});
    // PET_MASTER_ADDR/PORT from a scheduler are not errors with a dynamic backend; on the command line they are.
    auto env = f.env;
    env["PET_MASTER_ADDR"] = "10.0.0.1";
    env["PET_MASTER_PORT"] = "23456";
    const auto dynamic = parse({"--rdzv-backend=c10d", "--rdzv-endpoint=h:1", f.program}, env);
    CHECK(!dynamic.master_addr);
    CHECK(!dynamic.master_port);
    CHECK(parse({f.program}, env).rendezvous_endpoint() == elastic::host_port{"10.0.0.1", 23456});
    CHECK(usage_error_of({"--rdzv-backend=c10d", "--master-addr=h", f.program}, f.env).find("static") !=
          std::string::npos);
    CHECK(usage_error_of({"--rdzv-endpoint=h:1", "--master-port=2", f.program}, f.env).find("give one") !=
          std::string::npos);
    // c10d takes a list: the store's endpoint, then where it may move (ports defaulted), as
    // PET_RDZV_ENDPOINT too.
    const auto listed = parse({"--nnodes=2:3", "--rdzv-backend=c10d", "--rdzv-endpoint=a:1,[::1],c", f.program}, f.env);
    CHECK(listed.rendezvous_endpoint() == elastic::host_port{"a", 1});
    const auto params = listed.rendezvous();
    CHECK(params.endpoint == elastic::host_port{"a", 1});
    CHECK(params.successor_endpoints ==
          std::vector<elastic::host_port>{elastic::host_port{"::1", 29400}, elastic::host_port{"c", 29400}});
    env = f.env;
    env["PET_RDZV_ENDPOINT"] = "a:1,b:2";
    CHECK(parse({"--nnodes=2:3", "--rdzv-backend=c10d", f.program}, env).rendezvous().successor_endpoints ==
          std::vector<elastic::host_port>{elastic::host_port{"b", 2}});
    CHECK(parse({"--rdzv-backend=c10d", "--rdzv-endpoint=a:1", f.program}, f.env)
              .rendezvous()
              .successor_endpoints.empty());
    CHECK(listed.warnings.empty());
    // A fixed --nnodes: the store never moves, and the list is said to be unused.
    const auto fixed = parse({"--nnodes=2", "--rdzv-backend=c10d", "--rdzv-endpoint=a:1,b:2", f.program}, f.env);
    REQUIRE(fixed.warnings.size() == 1);
    CHECK(fixed.warnings[0].find("only the first endpoint is used") != std::string::npos);
}

TEST_CASE("launch: shutdown timeout falls back on TORCH_ELASTIC_SHUTDOWN_TIMEOUT, LOGLEVEL and the prefix template") {
    fixture f;
    auto env = f.env;
    env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] = "120";
    env["LOGLEVEL"] = "info";
    env["TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"] = "${role_name}:${rank}|";
    auto c = parse({f.program}, env);
    CHECK(c.shutdown_timeout == 120s);
    CHECK(c.agent_log_level == elastic::log_level::info);
    CHECK(c.log_line_prefix_template == "${role_name}:${rank}|");
    CHECK(parse({"--shutdown-timeout=0", f.program}, env).shutdown_timeout == 0s);
    env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] = "-1";
    CHECK(usage_error_of({f.program}, env).find("TORCH_ELASTIC_SHUTDOWN_TIMEOUT=-1") != std::string::npos);
    env.erase("TORCH_ELASTIC_SHUTDOWN_TIMEOUT");
    env["LOGLEVEL"] = "LOUD";
    CHECK(usage_error_of({f.program}, env).find("LOGLEVEL=LOUD") != std::string::npos);
    env["LOGLEVEL"] = "DEBUG";
    env["TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"] = "${host}";
    CHECK(usage_error_of({f.program}, env).find("'host'") != std::string::npos);
}

TEST_CASE("launch: refused options say so, on the command line and from PET_*") {
    for (const auto& row : refused_cases()) {
        fixture f;
        for (const auto& spelling : row.spellings) {
            CAPTURE(spelling);
            const auto message = usage_error_of({spelling + "=" + row.value, f.program}, f.env);
            CHECK(message.find(row.says) != std::string::npos);
            CHECK(message.find(row.value) != std::string::npos);
        }
        if (!row.env.empty()) {
            CAPTURE(row.env);
            auto env = f.env;
            env[row.env] = row.value;
            CHECK(usage_error_of({f.program}, env).find(row.env) != std::string::npos);
        }
    }
    fixture f;
    // torchrun has no PET_ form for these two: the variables are not read.
    auto env = f.env;
    env["PET_LOGS_SPECS"] = "x";
    env["PET_NUMA_BINDING"] = "node";
    CHECK(parse({f.program}, env).role == "default");
}

TEST_CASE("launch: bad input is one line naming the option and value, exit status 2") {
    fixture f;
    const auto p = f.program;
    struct bad {
        std::vector<std::string> args;
        std::string names;  ///< the message must contain this
    };
    const std::vector<bad> cases = {
        {{"--bogus", p}, "--bogus"},
        {{"--bogus=1", p}, "--bogus=1"},
        {{"-x", p}, "-x"},
        {{"--nproc-per-node", "4"}, "no program"},
        {{}, "no program"},
        {{"--nnodes=3:2", p}, "--nnodes=3:2"},
        {{"--nnodes=0", p}, "--nnodes=0"},
        {{"--nnodes=1:2:3", p}, "--nnodes=1:2:3"},
        {{"--nnodes=two", p}, "--nnodes=two"},
        {{"--nnodes=1:4", p}, "static"},  // an elastic range needs a dynamic backend
        {{"--nproc-per-node=0", p}, "--nproc-per-node=0"},
        {{"--nproc-per-node=-2", p}, "--nproc-per-node=-2"},
        {{"--nproc-per-node=many", p}, "--nproc-per-node=many"},
        {{"--nproc-per-node=", p}, "--nproc-per-node=''"},
        {{
             "--nnodes",
         },
         "--nnodes needs a value"},
        {{"--standalone=1", p}, "--standalone is a flag"},
        {{"-m=1", p}, "unrecognized option -=1"},
        {{"--rdzv-backend=etcd", p}, "etcd-v3"},
        {{"--rdzv-backend=etcd-v2", p}, "etcd-v2"},
        {{"--rdzv-backend=zookeeper", p}, "--rdzv-backend=zookeeper"},
        {{"--rdzv-endpoint=::1", p}, "brackets"},
        {{"--rdzv-endpoint=h:70000", p}, "--rdzv-endpoint=h:70000"},
        {{"--rdzv-endpoint=[::1", p}, "]"},
        {{"--rdzv-endpoint=h:x", p}, "--rdzv-endpoint=h:x"},
        {{"--rdzv-endpoint=h", p}, "needs a port"},  // static
        {{"--rdzv-endpoint=h:1,g:2", p}, "the static backend takes one endpoint"},
        {{"--rdzv-backend=c10d", "--rdzv-endpoint=h:1,,g:2", p}, "an empty endpoint"},
        {{"--rdzv-backend=c10d", "--rdzv-endpoint=h:1,", p}, "an empty endpoint"},
        {{"--rdzv-backend=c10d", "--rdzv-endpoint=h:1,g:x", p}, "g:x"},
        {{"--rdzv-backend=c10d", "--rdzv-endpoint=h:1,g:0", p}, "port 0"},
        {{"--rdzv-backend=c10d", "--rdzv-endpoint=h:1,bad_host!", p}, "bad host name"},
        {{"--rdzv-backend=c10d", "--rdzv-endpoint=h:1,0.0.0.0:2", p}, "names no host"},
        {{"--rdzv-backend=c10d", "--nnodes=2", "--rdzv-endpoint=h:0", p}, "port 0"},
        {{"--rdzv-conf=timeout", p}, "--rdzv-conf=timeout"},
        {{"--rdzv-conf=timeout=", p}, "key=value"},
        {{"--rdzv-conf==5", p}, "key=value"},
        {{"--rdzv-conf=timeout=5,timeout=6", p}, "twice"},
        {{"--rdzv-conf=timeout=abc", p}, "timeout=abc"},
        {{"--rdzv-conf=timeout=0", p}, "> 0"},
        {{"--rdzv-conf=rank=1", p}, "--node-rank"},
        {{"--rdzv-backend=c10d", "--rdzv-conf=is_host=maybe", p}, "is_host"},
        {{"--rdzv-backend=c10d", "--rdzv-conf=store_type=file", p}, "store_type=file"},
        {{"--rdzv-backend=etcd-v3", "--rdzv-conf=protocol=gopher", p}, "http or https"},
        {{"--rdzv-backend=etcd-v3", "--rdzv-conf=ssl_cert=/c", p}, "TLS"},
        {{"--rdzv-id=", p}, "--rdzv-id"},
        {{"--max-restarts=-1", p}, "--max-restarts=-1"},
        {{"--max-restarts=1.5", p}, "--max-restarts=1.5"},
        {{"--monitor-interval=-1", p}, "--monitor-interval=-1"},
        {{"--monitor-interval=fast", p}, "--monitor-interval=fast"},
        {{"--shutdown-timeout=-5", p}, "--shutdown-timeout=-5"},
        {{"--shutdown-timeout=inf", p}, "--shutdown-timeout=inf"},
        {{"--start-method=thread", p}, "--start-method=thread"},
        {{"--role=", p}, "--role"},
        {{"-r", "4", p}, "--redirects=4"},
        {{"--redirects=0:1,x", p}, "--redirects=0:1,x"},
        {{"--tee=0:5", p}, "--tee=0:5"},
        {{"--tee=0:1,0:2", p}, "twice"},
        {{"--nproc-per-node=2", "--tee=2:1", p}, "local rank 2"},
        {{"--local-ranks-filter=0,a", p}, "--local-ranks-filter=0,a"},
        {{"--local-ranks-filter=3", p}, "local rank 3"},
        {{"--node-rank=-1", p}, "--node-rank=-1"},
        {{"--node-rank=1", p}, "--node-rank=1"},  // nnodes 1: only rank 0
        {{"--master-port=65536", p}, "--master-port=65536"},
        {{"--master-addr=a b", p}, "--master-addr='a b'"},
        {{"--local-addr=x/y", p}, "--local-addr=x/y"},
        {{"--signals-to-handle=SIGKILL", p}, "SIGKILL"},
        {{"--signals-to-handle=SIGNOPE", p}, "SIGNOPE"},
        {{"--signals-to-handle=", p}, "--signals-to-handle"},
        {{"--log-dir", p, p}, "not a directory"},
        {{"-m", "--no-python", p}, "only one"},
        {{"--run-path", "-m", p}, "only one"},
        {{"-m", "not a module"}, "not a Python module name"},
        {{"-m", "1pkg"}, "not a Python module name"},
        {{f.dir / "missing"}, "does not exist"},
        {{f.dir / "missing.py"}, "does not exist"},
        {{f.dir.path()}, "is a directory"},
        {{f.dir.write("data.bin", "x", 0644)}, "not executable"},
        {{"no-such-program-anywhere"}, "not found on PATH"},
    };
    for (const auto& c : cases) {
        CAPTURE(c.names);
        const auto message = usage_error_of(c.args, f.env);
        CHECK_MESSAGE(message.find(c.names) != std::string::npos, message);
    }
    // A Python program whose interpreter is missing.
    auto env = f.env;
    env["PYTHON_EXEC"] = f.dir / "no-python";
    CHECK(usage_error_of({f.script}, env).find("PYTHON_EXEC") != std::string::npos);
    CHECK(usage_error_of({"-m", "pkg"}, env).find("PYTHON_EXEC") != std::string::npos);
    // From the environment the message names the variable.
    env = f.env;
    env["PET_NNODES"] = "3:2";
    CHECK(usage_error_of({f.program}, env).find("PET_NNODES=3:2") != std::string::npos);
    env["PET_NNODES"] = "1";
    env["PET_NPROC_PER_NODE"] = "0";
    CHECK(usage_error_of({f.program}, env).find("PET_NPROC_PER_NODE=0") != std::string::npos);
    // Rules between options name the variable too.
    env.erase("PET_NPROC_PER_NODE");
    env["PET_NNODES"] = "1:4";
    CHECK(usage_error_of({f.program}, env).find("PET_NNODES=1:4: the static rendezvous") == 0);
    env["PET_NNODES"] = "2";
    env["PET_NODE_RANK"] = "5";
    CHECK(usage_error_of({f.program}, env)
              .find("PET_NODE_RANK=5: must be from 0 to 1 (below the PET_NNODES maximum 2)") == 0);
    env.erase("PET_NODE_RANK");
    env["PET_TEE"] = "0:3,4:3";
    env["PET_NPROC_PER_NODE"] = "2";
    CHECK(usage_error_of({f.program}, env)
              .find("PET_TEE names local rank 4, but this node runs local ranks 0 to 1 (PET_NPROC_PER_NODE=2)") == 0);
    CHECK(usage_error_of({"--tee=5:1", f.program}, env).find("--tee names local rank 5") == 0);
    env.erase("PET_TEE");
    // A value with a newline or an escape sequence still makes a one-line message.
    env.erase("PET_NPROC_PER_NODE");
    env["PET_NNODES"] = "1\n2\x1b[31m";
    CHECK(usage_error_of({f.program}, env).find("PET_NNODES='1\\n2\\x1b[31m'") != std::string::npos);
    CHECK(usage_error_of({"-r"}, f.env).find("--redirects needs a value") != std::string::npos);
}

TEST_CASE("launch: the --restart-* options are off by default, refuse bad values by name, and show in the banner") {
    fixture f;
    const auto plain = parse({f.program}, f.env);
    CHECK(!plain.restart_backoff);
    CHECK(!plain.restart_window);
    CHECK(!plain.restart_on_exit);
    CHECK(!plain.restart_crash_guard);
    CHECK(elastic::describe(plain).find("restart_") == std::string::npos);
    CHECK(usage_error_of({"--restart-backoff=2s:1s", f.program}, f.env) ==
          "--restart-backoff=2s:1s: the cap (1s) is below the initial delay (2s)");
    CHECK(usage_error_of({"--restart-window=0/1h", f.program}, f.env).find("--restart-window=0/1h: ") == 0);
    CHECK(usage_error_of({"--restart-on-exit=1,x", f.program}, f.env).find("'x' is not an exit code") !=
          std::string::npos);
    CHECK(usage_error_of({"--restart-crash-guard=soon", f.program}, f.env).find("--restart-crash-guard=soon") == 0);
    auto env = f.env;
    env["PET_RESTART_WINDOW"] = "5 per hour";
    CHECK(usage_error_of({f.program}, env).find("PET_RESTART_WINDOW='5 per hour'") == 0);
    const auto all = parse({"--restart-backoff=0.5:30:1h", "--restart-window=3/10min", "--restart-on-exit=SIGKILL,1",
                            "--restart-crash-guard=1min", f.program},
                           f.env);
    const auto banner = elastic::describe(all);
    for (const char* line : {"  restart_backoff      : 500ms:30s:1h\n", "  restart_window       : 3/10min\n",
                             "  restart_on_exit      : 1,SIGKILL\n", "  restart_crash_guard  : 1min\n"}) {
        CHECK_MESSAGE(banner.find(line) != std::string::npos, line);
    }
    // Set in C++ and checked by validate(), as the command line would.
    auto config = all;
    config.restart_backoff->jitter = 1.5;
    CHECK_THROWS_AS(config.validate(f.env), elastic::usage_error);
    config = all;
    config.restart_window->period = 0ms;
    CHECK_THROWS_AS(config.validate(f.env), elastic::usage_error);
    config = all;
    config.restart_crash_guard->in_a_row = 0;
    CHECK_THROWS_AS(config.validate(f.env), elastic::usage_error);
    CHECK_NOTHROW(all.validate(f.env));
}

TEST_CASE("launch: an option given twice keeps the last value, as argparse does") {
    fixture f;
    CHECK(parse({"--nproc-per-node=2", "--nproc_per_node=5", f.program}, f.env).nproc_per_node == 5);
    CHECK(parse({"-r", "1", "--redirects=2", f.program}, f.env).redirects.every_rank == elastic::std_streams::err);
}

TEST_CASE("launch: --help is the golden text, and -h/--version return text instead of a configuration") {
    const std::string golden_path = ELASTIC_TEST_SOURCE_DIR "/tests/launch/golden/help.txt";
    const auto text = elastic::help_text();
    if (const char* update = std::getenv("ELASTIC_UPDATE_GOLDEN"); update != nullptr && std::string{update} == "1") {
        std::ofstream(golden_path, std::ios::binary | std::ios::trunc) << text;
    }
    CHECK(text == launch_support::read_file(golden_path));
    fixture f;
    for (const auto& args : std::vector<std::vector<std::string>>{{"--help"}, {"-h"}, {"--nnodes=2", "--help"}}) {
        const auto result = elastic::parse_launch_config(args, f.env);
        REQUIRE(std::holds_alternative<elastic::help_request>(result));
        CHECK(std::get<elastic::help_request>(result).text == text);
    }
    const auto version = elastic::parse_launch_config(std::vector<std::string>{"--version"}, f.env);
    REQUIRE(std::holds_alternative<elastic::help_request>(version));
    CHECK(std::get<elastic::help_request>(version).text.find(elastic::version_string) != std::string::npos);
    // Every line fits in 100 columns, and every option and PET_ variable is in it, but those
    // it does not list (group -1: --numa-binding, refused; docs/cli.md says why).
    for (const auto line : elastic::detail::launch::split(text, '\n')) {
        CHECK_MESSAGE(line.size() <= 100, line);
    }
    for (const auto& spec : elastic::detail::launch::option_specs) {
        for (const auto name : elastic::detail::launch::split(spec.names, ',')) {
            if (spec.group < 0 && name != "-h" && name != "--help") {
                CHECK_MESSAGE(text.find(std::string(name) + ",") == std::string::npos, name);
                continue;
            }
            CHECK_MESSAGE(text.find(name) != std::string::npos, name);
        }
        if (spec.has_env) {
            CHECK(text.find(elastic::detail::launch::env_name(spec)) != std::string::npos);
        }
    }
}

TEST_CASE("launch: parse_launch_config(argc, argv) skips argv[0] and names the launcher after it") {
    fixture f;
    const char* argv[] = {"elasticrun", "--nproc-per-node=3", f.program.c_str(), "x", nullptr};
    const auto result = elastic::parse_launch_config(4, argv, f.env);
    REQUIRE(std::holds_alternative<launch_config>(result));
    const auto& c = std::get<launch_config>(result);
    CHECK(c.nproc_per_node == 3);
    CHECK(c.program.args == std::vector<std::string>{"x"});

    const char* help[] = {"/opt/bin/mylauncher", "--help", nullptr};
    const auto text = std::get<elastic::help_request>(elastic::parse_launch_config(2, help, f.env)).text;
    CHECK(text.rfind("usage: mylauncher [options] program [args...]\n", 0) == 0);
    const char* none[] = {"/opt/bin/mylauncher", nullptr};
    try {
        (void)elastic::parse_launch_config(1, none, f.env);
        FAIL("expected a usage error");
    } catch (const elastic::usage_error& e) {
        CHECK(std::string{e.what()}.find("usage: mylauncher") != std::string::npos);
    }
}

}  // namespace test_cli

namespace test_cli {

/// torchrun 1.13's own parser (Debian's python3-torch), run on the same command lines: it prints,
/// per case, what it made of them as one JSON array.
constexpr const char* torchrun_parser_script = R"PY(
import contextlib, io, json, os, sys
from torch.distributed.run import parse_args, parse_min_max_nnodes
from torch.distributed.elastic.utils import macros
from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint
for name in [n for n in os.environ if n.startswith("PET_")]:
    del os.environ[name]
out = []
for case in json.load(open(sys.argv[1])):
    os.environ.update(case["env"])
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            a = parse_args(case["args"])
        lo, hi = parse_min_max_nnodes(a.nnodes)
        out.append({"ok": True, "script": a.training_script, "args": a.training_script_args,
                    "min": lo, "max": hi, "nproc": int(a.nproc_per_node), "rdzv_backend": a.rdzv_backend,
                    "rdzv_id": a.rdzv_id, "max_restarts": a.max_restarts, "role": a.role,
                    "node_rank": a.node_rank, "master_addr": a.master_addr, "master_port": a.master_port,
                    "module": a.module, "no_python": a.no_python, "standalone": a.standalone,
                    "monitor_ms": round(float(a.monitor_interval) * 1000), "log_dir": a.log_dir,
                    "substituted": macros.substitute(list(a.training_script_args), "3"),
                    "endpoint": list(parse_rendezvous_endpoint(a.rdzv_endpoint, 29400)) if a.rdzv_endpoint else None})
    except SystemExit as e:
        out.append({"ok": False, "code": e.code})
    for name in case["env"]:
        del os.environ[name]
print(json.dumps(out))
)PY";

TEST_CASE("launch: torchrun 1.13's own parser reads the same command lines the same way") {
    const std::string python = ELASTIC_TORCH_PYTHON;
    REQUIRE_MESSAGE(!python.empty(), "no Debian python3 with torch was found at configure time");
    fixture f;
    const auto p = f.program;
    const auto logs = f.dir / "logs";
    struct parity_case {
        std::vector<std::string> args;
        environment env;
    };
    // torchrun 1.13 knows only the underscored spellings.
    const std::vector<parity_case> cases = {
        {{"--nproc_per_node=2", p, "--help", "x${local_rank}", "-m", "--nnodes=5", "$$", "$local_rank.txt"}, {}},
        {{"--nnodes=2", "--nproc_per_node", "3", "--max_restarts=4", "--role=trainer", p}, {}},
        {{"--nnodes=1:4", "--rdzv_backend=c10d", "--rdzv_endpoint=[::1]:1234", "--rdzv_id=j", p, "a"}, {}},
        {{"--rdzv_backend=c10d", "--rdzv_endpoint=node0", p}, {}},
        {{"-m", "--nproc_per_node=1", "pkg.mod", "--x=${local_rank}"}, {}},
        {{"--no_python", p}, {}},
        {{"--standalone", p}, {}},
        {{"--node_rank=1", "--nnodes=2", "--master_addr=10.0.0.1", "--master_port=1234", p}, {}},
        {{"--monitor_interval=0.5", "--log_dir=" + logs, p}, {}},
        {{"--max_restarts=2", "--max_restarts=3", p}, {}},
        {{"-r3", "-t", "0:1", p}, {}},
        {{"--", p, "a"}, {}},
        {{"--nproc_per_node=2", p}, {{"PET_NPROC_PER_NODE", "3"}, {"PET_NNODES", "2"}, {"PET_MAX_RESTARTS", "7"}}},
        {{"pkg.mod"}, {{"PET_MODULE", "1"}}},
        {{p}, {{"PET_NO_PYTHON", "1"}, {"PET_STANDALONE", "0"}}},
        {{"--bogus", p}, {}},
        {{"--max_restarts=x", p}, {}},
        {{"--nnodes"}, {}},
        {{}, {}},
        {{"--standalone=1", p}, {}},
        // An abbreviation argparse takes.
        {{"--nproc=2", p}, {}},
        // The deliberate difference (docs/cli.md): a "--" right after the program reaches it
        // (argparse drops it from the REMAINDER).
        {{p, "--", "x"}, {}},
    };
    const std::size_t differences = 1;  // the last one
    nlohmann::json input = nlohmann::json::array();
    for (const auto& c : cases) {
        input.push_back({{"args", c.args}, {"env", c.env}});
    }
    f.dir.write("cases.json", input.dump(), 0644);
    f.dir.write("parse.py", torchrun_parser_script, 0644);
    const auto command = "'" + python + "' '" + (f.dir / "parse.py") + "' '" + (f.dir / "cases.json") + "' 2>/dev/null";
    std::string output;
    {
        FILE* pipe = ::popen(command.c_str(), "r");
        REQUIRE(pipe != nullptr);
        char buffer[4096];
        for (std::size_t n; (n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0;) {
            output.append(buffer, n);
        }
        REQUIRE(::pclose(pipe) == 0);
    }
    const auto theirs = nlohmann::json::parse(output);
    REQUIRE(theirs.size() == cases.size());
    {
        const auto& abbreviated = theirs[cases.size() - 2];
        CHECK(abbreviated["ok"].get<bool>());
        CHECK(abbreviated["nproc"] == 2);
        const auto& dashes = theirs[cases.size() - 1];
        CHECK(dashes["args"] == nlohmann::json{"x"});
        CHECK(parse(cases[cases.size() - 1].args, f.env).program.args == std::vector<std::string>{"--", "x"});
    }
    for (std::size_t i = 0; i + differences < cases.size(); ++i) {
        const auto& c = cases[i];
        const auto& t = theirs[i];
        CAPTURE(i);
        auto env = f.env;
        env.insert(c.env.begin(), c.env.end());
        std::optional<launch_config> ours;
        try {
            ours = std::get<launch_config>(elastic::parse_launch_config(c.args, env));
        } catch (const elastic::usage_error& e) {
            MESSAGE("ours: " << std::string{e.what()});
        }
        REQUIRE(ours.has_value() == t["ok"].get<bool>());
        if (!ours) {
            CHECK(t["code"] == 2);  // both: exit status 2
            continue;
        }
        const auto& o = *ours;
        CHECK(o.program.target == t["script"].get<std::string>());
        CHECK(o.program.args == t["args"].get<std::vector<std::string>>());
        CHECK(o.nnodes == elastic::node_range{t["min"].get<int>(), t["max"].get<int>()});
        CHECK(o.nproc_per_node == t["nproc"].get<int>());
        CHECK(o.max_restarts == t["max_restarts"].get<int>());
        CHECK(o.role == t["role"].get<std::string>());
        CHECK((o.program.kind == elastic::program_kind::python_module) == t["module"].get<bool>());
        CHECK((o.program.kind == elastic::program_kind::executable) == t["no_python"].get<bool>());
        if (t["standalone"].get<bool>()) {
            CHECK(o.rdzv_backend == elastic::rendezvous_backend::c10d);
            continue;  // torchrun 1.13 applies --standalone later, in config_from_args
        }
        CHECK(elastic::to_string(o.rdzv_backend) == t["rdzv_backend"].get<std::string>());
        CHECK(o.rdzv_id == t["rdzv_id"].get<std::string>());
        if (o.rdzv_backend == elastic::rendezvous_backend::static_) {
            CHECK(o.node_rank.value_or(0) == t["node_rank"].get<int>());
            CHECK(o.rendezvous_endpoint() ==
                  elastic::host_port{t["master_addr"].get<std::string>(),
                                     static_cast<std::uint16_t>(t["master_port"].get<int>())});
        }
        if (!t["endpoint"].is_null()) {
            CHECK(o.rendezvous_endpoint() ==
                  elastic::host_port{t["endpoint"][0].get<std::string>(),
                                     static_cast<std::uint16_t>(t["endpoint"][1].get<int>())});
        }
        if (std::find(c.args.begin(), c.args.end(), "--monitor_interval=0.5") != c.args.end()) {
            CHECK(o.monitor_interval.count() == t["monitor_ms"].get<long long>());
            CHECK(o.log_dir->string() == t["log_dir"].get<std::string>());
        }
        // ${local_rank}: the same substitution as torchrun's macros.substitute.
        const auto command_line = elastic::resolve_program(o.program, f.env);
        auto substituted = command_line.argv_for(3);
        const auto skip = command_line.argv.size() - o.program.args.size();
        substituted.erase(substituted.begin(), substituted.begin() + static_cast<std::ptrdiff_t>(skip));
        CHECK(substituted == t["substituted"].get<std::vector<std::string>>());
    }
}

TEST_CASE(
    "launch: a unique prefix of a long option is that option, as argparse takes it, and an ambiguous one is refused") {
    fixture f;
    CHECK(parse({"--nproc=2", f.program}, f.env).nproc_per_node == 2);
    CHECK(parse({"--nproc", "3", f.program}, f.env).nproc_per_node == 3);
    CHECK(parse({"--nproc_per=4", f.program}, f.env).nproc_per_node == 4);
    CHECK(parse({"--max_r=5", "--stand", f.program}, f.env).max_restarts == 5);
    CHECK(parse({"--stand", f.program}, f.env).rdzv_backend == elastic::rendezvous_backend::c10d);
    // A value is never read as an option, and nothing from the program on is touched.
    auto c = parse({"--role", "--nproc", f.program, "--nproc=7"}, f.env);
    CHECK(c.role == "--nproc");
    CHECK(c.nproc_per_node == 1);
    CHECK(c.program.args == std::vector<std::string>{"--nproc=7"});
    c = parse({"--", f.program, "--max_r=1"}, f.env);
    CHECK(c.program.args == std::vector<std::string>{"--max_r=1"});

    const auto message = usage_error_of({"--no=1", f.program}, f.env);
    CHECK(message == "ambiguous option: --no could match --no-python, --node-rank");
    CHECK(usage_error_of({"--r=1", f.program}, f.env).find("ambiguous option: --r could match --run-path, ") == 0);
    CHECK(usage_error_of({"--nprocs-per-node=1", f.program}, f.env).find("--nprocs-per-node") != std::string::npos);
}

TEST_CASE("launch: --rdzv-conf keys the backend does not read are ignored with a warning, as torchrun ignores them") {
    fixture f;
    auto c = parse({"--rdzv-backend=c10d", "--rdzv-conf=timeout=5,join_timeout=7,mystery=1", f.program}, f.env);
    CHECK(c.rdzv_conf.join_timeout == 7s);
    CHECK(c.rdzv_conf.timeout == elastic::rendezvous_settings{}.timeout);
    REQUIRE(c.warnings.size() == 1);
    CHECK(c.warnings[0].find("the c10d backend does not read the keys 'timeout', 'mystery'; ignored") !=
          std::string::npos);
    CHECK(c.warnings[0].find("it reads: join_timeout") != std::string::npos);

    // A value quoted twice by a script: the quotes go, the settings are read, a warning says so.
    c = parse({"--rdzv-backend=c10d", "--rdzv-conf='join_timeout=5,last_call_timeout=1'", f.program}, f.env);
    CHECK(c.rdzv_conf.join_timeout == 5s);
    CHECK(c.rdzv_conf.last_call_timeout == 1s);
    REQUIRE(c.warnings.size() == 1);
    CHECK(c.warnings[0] == "--rdzv-conf: the quotes around its value were removed (a script quoted it twice); read as "
                           "join_timeout=5,last_call_timeout=1");
    c = parse({"--rdzv-backend=c10d", "--rdzv-conf=join_timeout=\"5\"", f.program}, f.env);
    CHECK(c.rdzv_conf.join_timeout == 5s);
    CHECK(c.warnings.size() == 1);

    c = parse({"--rdzv-backend=c10d", "--rdzv-conf=join_timeout=5", f.program}, f.env);
    CHECK(c.warnings.empty());
    // Keys that would change what runs stay errors: TLS, and a rank that --node-rank sets.
    CHECK(usage_error_of({"--rdzv-backend=c10d", "--rdzv-conf=ssl_cert=/c", f.program}, f.env).find("TLS") !=
          std::string::npos);
    CHECK(usage_error_of({"--rdzv-conf=rank=1", f.program}, f.env).find("--node-rank") != std::string::npos);
}

TEST_CASE(
    "launch: zero where torchrun allows it (no last call, no wait at the exit barrier), and --logs-specs=default") {
    fixture f;
    const auto c = parse({"--rdzv-backend=c10d", "--rdzv-conf=last_call_timeout=0,exit_barrier_timeout=0",
                          "--logs-specs=default", f.program},
                         f.env);
    CHECK(c.rdzv_conf.last_call_timeout == 0s);
    CHECK(c.rdzv_conf.exit_barrier_timeout == 0s);
    CHECK(c.warnings.empty());
    CHECK(usage_error_of({"--rdzv-backend=c10d", "--rdzv-conf=join_timeout=0", f.program}, f.env)
              .find("join_timeout=0") != std::string::npos);
    CHECK(usage_error_of({"--logs_specs=mine", f.program}, f.env).find("--logs-specs=mine: not implemented") == 0);
}

TEST_CASE("launch: docs/cli.md states of every option as the launcher has them: no refusal it does not make") {
    // The table of "## Every option": | `--a`, `--b` (note) | PET_ | state | ... |
    std::ifstream in(ELASTIC_TEST_SOURCE_DIR "/docs/cli.md");
    REQUIRE(in);
    std::map<std::string, std::string> documented;  // every spelling in a row's first cell -> state
    bool in_table = false;
    for (std::string line; std::getline(in, line);) {
        if (line.rfind("## ", 0) == 0) in_table = line == "## Every option";
        if (!in_table || line.rfind("| `", 0) != 0) continue;
        std::vector<std::string> cells;
        for (std::size_t at = 1; at < line.size();) {
            const auto end = line.find(" |", at);
            if (end == std::string::npos) break;
            cells.push_back(line.substr(at + 1, end - at - 1));
            at = end + 2;
        }
        REQUIRE(cells.size() >= 3);
        const std::string state = cells[2].substr(0, cells[2].find_first_of(", "));
        for (std::size_t at = cells[0].find('`'); at != std::string::npos; at = cells[0].find('`', at)) {
            const auto end = cells[0].find('`', at + 1);
            REQUIRE(end != std::string::npos);
            documented[cells[0].substr(at + 1, end - at - 1)] = state;
            at = end + 1;
        }
    }
    using elastic::detail::launch::option_state;
    int checked = 0;
    for (const auto& spec : elastic::detail::launch::option_specs) {
        const auto names = elastic::detail::launch::split(spec.names, ',');
        if (std::find(names.begin(), names.end(), "--help") != names.end()) continue;
        const auto row = std::find_if(names.begin(), names.end(),
                                      [&](std::string_view n) { return documented.count(std::string(n)) != 0; });
        CAPTURE(spec.names);
        REQUIRE_MESSAGE(row != names.end(), "docs/cli.md has no row for it");
        const auto& state = documented.at(std::string(*row));
        const char* want = spec.state == option_state::implemented     ? "config"
                           : spec.state == option_state::compatibility ? "compat"
                                                                       : "refused";
        CHECK(state == want);
        ++checked;
    }
    CHECK(checked == static_cast<int>(elastic::detail::launch::option_specs.size()) - 1);
}

}  // namespace test_cli
