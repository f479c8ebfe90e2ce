// Tests of the launch configuration's pieces: value parsers, ${local_rank} substitution, program
// resolution on real files, --nproc-per-node resolution (with a fake nvidia-smi), validate().
#include "elastic/launch/config.hpp"
#include "elastic/launch/nproc.hpp"
#include "elastic/agent/program.hpp"
#include "elastic/launch/values.hpp"

#include "launch_support.hpp"

#include <doctest/doctest.h>

#include <sched.h>
#include <stdlib.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <functional>
#include <tuple>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace test_config {

using namespace std::chrono_literals;
using elastic::environment;
using elastic::host_port;
using elastic::launch_config;
using elastic::node_range;
using elastic::usage_error;
using launch_support::temp_dir;

/// The message of the usage_error `f` throws (fails the case if it throws none).
template <class F>
std::string error_of(F&& f) {
    try {
        f();
    } catch (const usage_error& e) {
        return e.what();
    }
    FAIL("expected a usage_error");
    return {};
}

TEST_CASE("launch: --nnodes N and MIN:MAX") {
    CHECK(elastic::parse_node_range("4", "--nnodes") == node_range{4, 4});
    CHECK(elastic::parse_node_range("1:4", "--nnodes") == node_range{1, 4});
    CHECK(elastic::parse_node_range("2:2", "--nnodes") == node_range{2, 2});
    for (const char* bad : {"3:2", "0", "0:1", "-1:2", "1:", ":2", "", "a", "1:2:3", "1.5", "99999999999"}) {
        CAPTURE(bad);
        const auto message = error_of([&] { (void)elastic::parse_node_range(bad, "--nnodes"); });
        CHECK(message.find(elastic::detail::launch::show("--nnodes", bad)) == 0);
        CHECK(message.find("MIN:MAX") != std::string::npos);
    }
}

TEST_CASE("launch: host[:port] endpoints, IPv6 in brackets") {
    const std::vector<std::pair<std::string, host_port>> good = {
        {"node0", {"node0", {}}},
        {"node0:29400", {"node0", 29400}},
        {"10.0.0.1:0", {"10.0.0.1", 0}},
        {"[::1]", {"::1", {}}},
        {"[fe80::1%eth0]:65535", {"fe80::1%eth0", 65535}},
        {" host.example.com:1 ", {"host.example.com", 1}},
    };
    for (const auto& row : good) {
        const auto& text = row.first;
        const auto& expected = row.second;
        CAPTURE(text);
        const auto parsed = elastic::parse_host_port(text, "--rdzv-endpoint");
        CHECK(parsed == expected);
        CHECK(elastic::parse_host_port(elastic::to_string(parsed), "x") == parsed);  // round trip
    }
    for (const char* bad : {"", "::1", "fe80::1:29400", "h:", "h:65536", "h:-1", "h:x", "[::1", "[::1]x", "[host]:1",
                            ":1", "a b", "h/x:1", "[]:1"}) {
        CAPTURE(bad);
        const auto message = error_of([&] { (void)elastic::parse_host_port(bad, "--rdzv-endpoint"); });
        CHECK(message.find("--rdzv-endpoint=") == 0);
    }
    CHECK(elastic::to_string(host_port{"::1", 5}) == "[::1]:5");
}

TEST_CASE("launch: --rdzv-conf is typed per backend") {
    using elastic::rendezvous_backend;
    auto c10d = elastic::parse_rendezvous_settings(
        "join_timeout=1, last_call_timeout=0.25,close_timeout=3,read_timeout=4,is_host=YES,store_type=TCP",
        "--rdzv-conf", rendezvous_backend::c10d);
    CHECK(c10d.join_timeout == 1s);
    CHECK(c10d.last_call_timeout == 250ms);
    CHECK(c10d.close_timeout == 3s);
    CHECK(c10d.read_timeout == 4s);
    CHECK(c10d.is_host == true);
    CHECK(c10d.timeout == 900s);
    CHECK(elastic::parse_rendezvous_settings("", "--rdzv-conf", rendezvous_backend::c10d) ==
          elastic::rendezvous_settings{});
    CHECK(elastic::parse_rendezvous_settings("timeout=60", "--rdzv-conf", rendezvous_backend::static_).timeout == 60s);
    CHECK(elastic::parse_rendezvous_settings("protocol=http,join_timeout=9", "--rdzv-conf", rendezvous_backend::etcd_v3)
              .join_timeout == 9s);
    const auto tls = elastic::parse_rendezvous_settings("protocol=HTTPS,cacert=/ca.pem,cert=/c.pem,key=/k.pem",
                                                        "--rdzv-conf", rendezvous_backend::etcd_v3);
    CHECK(tls.tls);
    CHECK(tls.cacert == "/ca.pem");
    CHECK(tls.cert == "/c.pem");
    CHECK(tls.key == "/k.pem");
    const auto etcd_keep = elastic::parse_rendezvous_settings("keep_alive_interval=2,keep_alive_max_attempt=4",
                                                              "--rdzv-conf", rendezvous_backend::etcd_v3);
    CHECK(etcd_keep.keep_alive_interval == 2s);
    CHECK(etcd_keep.keep_alive_max_attempt == 4);
}

TEST_CASE("launch: --rdzv-conf errors name the key") {
    using elastic::rendezvous_backend;
    const std::vector<std::tuple<std::string, rendezvous_backend, std::string>> bad = {
        {"join_timeout", rendezvous_backend::c10d, "not key=value"},
        {"join_timeout=", rendezvous_backend::c10d, "not key=value"},
        {"=1", rendezvous_backend::c10d, "not key=value"},
        {"join_timeout=1,", rendezvous_backend::c10d, "not key=value"},
        {"join_timeout=1,join_timeout=2", rendezvous_backend::c10d, "given twice"},
        {"join_timeout=-1", rendezvous_backend::c10d, "join_timeout=-1"},
        {"join_timeout=0", rendezvous_backend::c10d, "> 0"},
        {"is_host=2", rendezvous_backend::c10d, "boolean"},
        {"is_host=1", rendezvous_backend::etcd_v3, "does not read 'is_host'"},
        {"join_timeout=1", rendezvous_backend::static_, "does not read 'join_timeout'"},
        {"store_type=file", rendezvous_backend::c10d, "not implemented"},
        {"store_type=redis", rendezvous_backend::c10d, "tcp"},
        {"use_libuv=perhaps", rendezvous_backend::c10d, "boolean"},
        {"protocol=gopher", rendezvous_backend::etcd_v3, "http or https"},
        {"cacert=/x", rendezvous_backend::etcd_v3, "add protocol=https"},
        {"protocol=https,cert=/c", rendezvous_backend::etcd_v3, "cert and key go together"},
        {"protocol=https,ssl_cert=/c", rendezvous_backend::etcd_v3, "torchrun's etcd keys"},
        {"protocol=https", rendezvous_backend::c10d, "does not read 'protocol'"},
        {"rank=0", rendezvous_backend::static_, "--node-rank"},
        {"mystery=1", rendezvous_backend::c10d, "does not read 'mystery'"},
    };
    for (const auto& row : bad) {
        const auto& text = std::get<0>(row);
        const auto backend = std::get<1>(row);
        const auto& expected = std::get<2>(row);
        CAPTURE(text);
        const auto message = error_of([&] { (void)elastic::parse_rendezvous_settings(text, "--rdzv-conf", backend); });
        CHECK_MESSAGE(message.find(expected) != std::string::npos, message);
        CHECK(message.find("--rdzv-conf") == 0);
    }
}

TEST_CASE("launch: -r/-t stream selections, local rank filters, signals, durations, booleans") {
    using elastic::std_streams;
    CHECK(elastic::parse_stream_selection("0", "-r").for_rank(5) == std_streams::none);
    CHECK(elastic::parse_stream_selection("3", "-r").for_rank(5) == std_streams::all);
    const auto per_rank = elastic::parse_stream_selection("0:1,1:2,12:3", "-r");
    CHECK(per_rank.for_rank(0) == std_streams::out);
    CHECK(per_rank.for_rank(1) == std_streams::err);
    CHECK(per_rank.for_rank(12) == std_streams::all);
    CHECK(per_rank.for_rank(2) == std_streams::none);  // not named: none, as torchrun
    for (const char* bad : {"4", "-1", "", "a", "0:", ":1", "0:1,", "0:1,1", "0:4", "0:1:2", "x:1"}) {
        CAPTURE(bad);
        CHECK(error_of([&] { (void)elastic::parse_stream_selection(bad, "--redirects"); }).find("--redirects=") == 0);
    }

    CHECK(elastic::parse_local_ranks("", "f").empty());
    CHECK(elastic::parse_local_ranks("0, 2,2", "f") == std::set<int>{0, 2});
    CHECK(error_of([] { (void)elastic::parse_local_ranks("0,-1", "--local-ranks-filter"); }).find("'-1'") !=
          std::string::npos);

    CHECK(elastic::parse_signals("SIGTERM,SIGINT,SIGHUP,SIGQUIT", "s") ==
          std::vector<int>{SIGTERM, SIGINT, SIGHUP, SIGQUIT});
    CHECK(elastic::parse_signals("usr1, SIGUSR2 ,sigusr1", "s") == std::vector<int>{SIGUSR1, SIGUSR2});
    CHECK(elastic::signal_to_string(SIGUSR1) == "SIGUSR1");
    for (const char* bad : {"SIGKILL", "SIGSTOP", "SIGCHLD", "SIGSEGV", "15", "", "SIGTERM,"}) {
        CAPTURE(bad);
        CHECK(error_of([&] {
                  (void)elastic::parse_signals(bad, "--signals-to-handle");
              }).find("--signals-to-handle=") == 0);
    }
    CHECK(error_of([] { (void)elastic::parse_signals("SIGKILL", "s"); }).find("cannot be trapped") !=
          std::string::npos);

    CHECK(elastic::parse_seconds("30", "t", false) == 30s);
    CHECK(elastic::parse_seconds(" 0.1 ", "t", false) == 100ms);
    CHECK(elastic::parse_seconds("0", "t", true) == 0s);
    for (const char* bad : {"0", "-1", "", "1s", "nan", "inf", "1e3", "1e10", "10000000000"}) {
        CAPTURE(bad);
        CHECK(error_of([&] {
                  (void)elastic::parse_seconds(bad, "--monitor-interval", false);
              }).find("--monitor-interval=") == 0);
    }

    for (const char* yes : {"1", "true", "T", "Yes", "y"}) {
        CHECK(elastic::parse_boolean(yes, "b"));
    }
    for (const char* no : {"0", "FALSE", "f", "no", "N"}) {
        CHECK_FALSE(elastic::parse_boolean(no, "b"));
    }
    CHECK(elastic::parse_flag_variable(" 1 ", "PET_X"));
    CHECK_FALSE(elastic::parse_flag_variable("0", "PET_X"));
    CHECK(elastic::parse_flag_variable("-3", "PET_X"));  // bool(int("-3")) is True
    CHECK(error_of([] { (void)elastic::parse_flag_variable("true", "PET_X"); }).find("PET_X=true") == 0);

    CHECK(elastic::parse_integer("7", "n", 0) == 7);
    CHECK(error_of([] { (void)elastic::parse_integer("99999999999", "--max-restarts", 0); }).find(">= 0") !=
          std::string::npos);
    CHECK(elastic::parse_log_level("warn", "LOGLEVEL") == elastic::log_level::warning);
}

TEST_CASE("launch: ${local_rank} substitution matches Python's Template.safe_substitute") {
    // Expected values produced by python3: string.Template(arg).safe_substitute(local_rank=3).
    const std::vector<std::pair<std::string, std::string>> table = {
        {"${local_rank}", "3"},
        {"$local_rank", "3"},
        {"--x=${local_rank}.log", "--x=3.log"},
        {"$local_ranks", "$local_ranks"},
        {"$$", "$"},
        {"$${local_rank}", "${local_rank}"},
        {"${LOCAL_RANK}", "${LOCAL_RANK}"},
        {"$LOCAL_RANK", "$LOCAL_RANK"},
        {"$", "$"},
        {"a$", "a$"},
        {"${local_rank", "${local_rank"},
        {"${other}", "${other}"},
        {"$1", "$1"},
        {"$local_rank.txt", "3.txt"},
        {"x${local_rank}${local_rank}", "x33"},
        {"", ""},
        {"${ local_rank}", "${ local_rank}"},
        {"$$$local_rank", "$3"},
        {"${_x}", "${_x}"},
        {"$-", "$-"},
    };
    for (const auto& row : table) {
        const auto& arg = row.first;
        const auto& expected = row.second;
        CAPTURE(arg);
        CHECK(elastic::substitute_local_rank(arg, 3) == expected);
    }
    CHECK(elastic::substitute_local_rank("gpu${local_rank}", 12) == "gpu12");
    elastic::worker_command command{
        elastic::program_kind::executable, "/bin/x${local_rank}", {"x${local_rank}", "--rank=${local_rank}", "$$HOME"}};
    CHECK(command.argv_for(7) == std::vector<std::string>{"x${local_rank}", "--rank=7", "$HOME"});
}

TEST_CASE("launch: programs are resolved as execvp does, on real files") {
    temp_dir dir;
    const auto a = dir / "a";
    const auto b = dir / "b";
    std::filesystem::create_directories(a);
    std::filesystem::create_directories(b);
    dir.write("a/tool", "#!/bin/sh\n", 0644);  // first on PATH but not executable: skipped
    dir.write("b/tool", "#!/bin/sh\n", 0755);
    dir.write("a/only", "#!/bin/sh\n", 0600);
    environment env{{"PATH", a + ":" + b}};
    CHECK(elastic::find_executable("tool", env, "program") == b + "/tool");
    CHECK(error_of([&] {
              (void)elastic::find_executable("only", env, "program");
          }).find(a + "/only is not executable") != std::string::npos);
    CHECK(error_of([&] { (void)elastic::find_executable("none", env, "program"); }).find("not found on PATH") !=
          std::string::npos);
    CHECK(error_of([&] { (void)elastic::find_executable("", env, "program"); }).find("empty") != std::string::npos);
    // No PATH at all: glibc's default /bin:/usr/bin.
    CHECK(elastic::find_executable("sh", environment{}, "program") == "/bin/sh");
    // An empty PATH entry is the current directory (restored after: the directory is removed
    // at the end of the case, and later cases spawn processes that inherit the directory).
    {
        const auto before = std::filesystem::current_path();
        std::filesystem::current_path(b);
        CHECK(elastic::find_executable("tool", environment{{"PATH", "/nonexistent:"}}, "program") == "./tool");
        CHECK(elastic::find_executable("./tool", environment{}, "program") == "./tool");
        std::filesystem::current_path(before);
    }

    elastic::worker_program program;
    program.target = b + "/tool";
    program.args = {"--help"};
    const auto command = elastic::resolve_program(program, env);
    CHECK(command.kind == elastic::program_kind::executable);
    CHECK(command.argv == std::vector<std::string>{b + "/tool", "--help"});

    // A script: its interpreter must be runnable, the script readable.
    program.target = dir.write("train.py", "print(1)\n", 0644);
    program.python = b + "/tool";
    const auto script = elastic::resolve_program(program, env);
    CHECK(script.kind == elastic::program_kind::python_script);
    CHECK(script.path == b + "/tool");
    CHECK(script.argv == std::vector<std::string>{b + "/tool", "-u", program.target, "--help"});
    program.python = "python3-nowhere";
    CHECK(error_of([&] { (void)elastic::resolve_program(program, env); }).find("PYTHON_EXEC python3-nowhere") !=
          std::string::npos);

    program = {};
    program.kind = elastic::program_kind::python_module;
    program.target = "pkg.sub_mod.train";
    program.python = "tool";
    CHECK(elastic::resolve_program(program, env).argv ==
          std::vector<std::string>{"tool", "-u", "-m", "pkg.sub_mod.train"});
    for (const char* bad : {"pkg..x", ".x", "x.", "9x", "a-b", "a/b"}) {
        program.target = bad;
        CHECK(error_of([&] { (void)elastic::resolve_program(program, env); }).find("not a Python module name") !=
              std::string::npos);
    }
    program = {};
    CHECK(error_of([&] { (void)elastic::resolve_program(program, env); }).find("no program") != std::string::npos);
}

TEST_CASE("launch: --nproc-per-node=cpu|gpu|auto, from CUDA_VISIBLE_DEVICES or a real nvidia-smi -L") {
    temp_dir dir;
    cpu_set_t set;
    CPU_ZERO(&set);
    REQUIRE(::sched_getaffinity(0, sizeof set, &set) == 0);
    const int cpus = CPU_COUNT(&set);
    CHECK(elastic::count_cpus() == cpus);

    const environment no_gpu{{"PATH", dir.path()}};  // no nvidia-smi there
    CHECK(elastic::count_gpus(no_gpu).count == 0);
    CHECK(elastic::resolve_nproc_per_node("cpu", "--nproc-per-node", no_gpu) == cpus);
    CHECK(elastic::resolve_nproc_per_node("auto", "--nproc-per-node", no_gpu) == cpus);
    CHECK(elastic::resolve_nproc_per_node(" 6 ", "--nproc-per-node", no_gpu) == 6);
    const auto none = error_of([&] { (void)elastic::resolve_nproc_per_node("gpu", "--nproc-per-node", no_gpu); });
    CHECK(none.find("--nproc-per-node=gpu: no GPU") == 0);

    const std::vector<std::pair<std::string, int>> visible = {
        {"0,1", 2}, {"", 0}, {"-1", 0}, {"0,-1,2", 1}, {"GPU-8f2e,MIG-1a", 2}, {" 3 , 1 ", 2}, {"x,0", 0}};
    for (const auto& row : visible) {
        const auto& value = row.first;
        const int count = row.second;
        CAPTURE(value);
        const environment env{{"PATH", dir.path()}, {"CUDA_VISIBLE_DEVICES", value}};
        CHECK(elastic::count_gpus(env).count == count);
        if (count > 0) {
            CHECK(elastic::resolve_nproc_per_node("gpu", "n", env) == count);
            CHECK(elastic::resolve_nproc_per_node("auto", "n", env) == count);
        } else {
            CHECK(error_of([&] {
                      (void)elastic::resolve_nproc_per_node("gpu", "n", env);
                  }).find("CUDA_VISIBLE_DEVICES") != std::string::npos);
        }
    }

    // A real child process standing in for nvidia-smi.
    dir.write("nvidia-smi",
              "#!/bin/sh\n[ \"$1\" = -L ] || exit 3\n"
              "echo 'GPU 0: NVIDIA A100 (UUID: GPU-1)'\necho 'GPU 1: NVIDIA A100 (UUID: GPU-2)'\n"
              "echo '  MIG 1g.5gb Device 0: (UUID: MIG-3)'\necho 'GPU 2: NVIDIA A100 (UUID: GPU-4)'\n",
              0755);
    const environment smi{{"PATH", dir.path()}};
    CHECK(elastic::count_gpus(smi).count == 3);
    CHECK(elastic::resolve_nproc_per_node("gpu", "n", smi) == 3);
    CHECK(elastic::resolve_nproc_per_node("auto", "n", smi) == 3);
    // CUDA_VISIBLE_DEVICES, when set, wins over nvidia-smi.
    CHECK(elastic::count_gpus(environment{{"PATH", dir.path()}, {"CUDA_VISIBLE_DEVICES", "1"}}).count == 1);

    // A failing nvidia-smi (as on a machine whose driver is gone) counts no GPU.
    dir.write("nvidia-smi", "#!/bin/sh\necho 'GPU 0: ghost'\nexit 9\n", 0755);
    CHECK(elastic::count_gpus(smi).count == 0);
    CHECK(elastic::resolve_nproc_per_node("auto", "n", smi) == cpus);
}

TEST_CASE("launch: a launch_config filled in C++ passes validate() under the command line's rules") {
    temp_dir dir;
    const auto program = launch_support::write_program(dir, "worker");
    const environment env{{"PATH", "/usr/bin:/bin"}};
    launch_config config;
    config.program.target = program;
    CHECK_NOTHROW(config.validate(env));

    launch_config standalone = config;
    elastic::use_standalone(standalone);
    CHECK_NOTHROW(standalone.validate(env));
    CHECK(standalone.rendezvous_endpoint() == host_port{"localhost", 0});
    const auto id = standalone.rdzv_id;
    REQUIRE(id.size() == 36);
    CHECK(id[8] == '-');
    CHECK(id[13] == '-');
    CHECK(id[14] == '4');
    CHECK(std::string{"89ab"}.find(id[19]) != std::string::npos);
    CHECK(elastic::random_run_id() != elastic::random_run_id());

    launch_config elastic_job = config;
    elastic_job.rdzv_backend = elastic::rendezvous_backend::c10d;
    elastic_job.nnodes = {2, 8};
    elastic_job.nproc_per_node = 4;
    elastic_job.node_rank = 7;
    elastic_job.rdzv_endpoint = host_port{"head", {}};
    CHECK_NOTHROW(elastic_job.validate(env));
    CHECK(elastic_job.rendezvous_endpoint() == host_port{"head", 29400});
    CHECK(elastic_job.world_size(8) == 32);

    const std::vector<std::pair<std::function<void(launch_config&)>, std::string>> bad = {
        // clang-format off
        {[](launch_config& c) { c.nproc_per_node = 0; }, "--nproc-per-node=0"},
        {[](launch_config& c) { c.nnodes = {3, 2}; }, "--nnodes=3:2"},
        {[](launch_config& c) { c.nnodes = {0, 2}; }, "--nnodes=0:2"},
        {[](launch_config& c) { c.nnodes = {1, 4}; }, "static rendezvous has a fixed membership"},
        {[](launch_config& c) { c.nnodes = {70000, 70000}, c.nproc_per_node = 70000; }, "world size"},
        {[](launch_config& c) { c.role.clear(); }, "--role"},
        {[](launch_config& c) { c.rdzv_id.clear(); }, "--rdzv-id"},
        {[](launch_config& c) { c.node_rank = 1; }, "--node-rank=1"},
        {[](launch_config& c) { c.rdzv_backend = elastic::rendezvous_backend::c10d, c.master_addr = "h"; }, "static"},
        {[](launch_config& c) { c.rdzv_endpoint = host_port{"h", 1}, c.master_port = 1; }, "give one"},
        {[](launch_config& c) { c.rdzv_endpoint = host_port{"h", {}}; }, "needs a port"},
        {[](launch_config& c) { c.rdzv_endpoint = host_port{"h h", 1}; }, "bad host"},
        {[](launch_config& c) { c.master_addr = "a/b"; }, "--master-addr=a/b"},
        {[](launch_config& c) { c.local_addr = ""; }, "--local-addr"},
        {[](launch_config& c) { c.nnodes = {2, 2}, c.master_port = 0; }, "port 0"},
        {[](launch_config& c) { c.rdzv_conf.join_timeout = 0s; }, "join_timeout"},
        {[](launch_config& c) { c.max_restarts = -1; }, "--max-restarts=-1"},
        {[](launch_config& c) { c.shutdown_timeout = -1s; }, "--shutdown-timeout"},
        {[](launch_config& c) { c.monitor_interval = -1ms; }, "--monitor-interval"},
        {[](launch_config& c) { c.signals_to_handle.clear(); }, "--signals-to-handle"},
        {[](launch_config& c) { c.signals_to_handle = {SIGKILL}; }, "cannot be trapped"},
        {[](launch_config& c) { c.log_dir = std::filesystem::path{}; }, "--log-dir"},
        {[](launch_config& c) { c.log_dir = c.program.target; }, "not a directory"},
        {[](launch_config& c) { c.redirects.per_rank[1] = elastic::std_streams::out; }, "--redirects names local rank 1"},
        {[](launch_config& c) { c.tee.every_rank = static_cast<elastic::std_streams>(9); }, "--tee"},
        {[](launch_config& c) { c.local_ranks_filter = {4}; }, "--local-ranks-filter names local rank 4"},
        {[](launch_config& c) { c.log_line_prefix_template = "[$host]"; }, "'host'"},
        {[](launch_config& c) { c.program.target.clear(); }, "no program"},
        {[](launch_config& c) { c.program.target += "-missing"; }, "does not exist"},
        // clang-format on
    };
    for (const auto& row : bad) {
        const auto& mutate = row.first;
        const auto& expected = row.second;
        CAPTURE(expected);
        launch_config broken = config;
        mutate(broken);
        const auto message = error_of([&] { broken.validate(env); });
        CHECK_MESSAGE(message.find(expected) != std::string::npos, message);
    }
    // Accepted: /dev/null as the log directory, a new directory, templates with known placeholders.
    config.log_dir = "/dev/null";
    CHECK_NOTHROW(config.validate(env));
    CHECK(config.logs_disabled());
    config.log_dir = dir / "logs-to-create";
    config.log_line_prefix_template = "$$[${rank}:$local_rank ${role_name}]";
    CHECK_NOTHROW(config.validate(env));
    CHECK_FALSE(config.logs_disabled());
}

TEST_CASE("launch: describe() gives torchrun's startup banner layout") {
    launch_config config;
    config.program.target = "./train";
    config.program.args = {"--lr=1"};
    config.rdzv_backend = elastic::rendezvous_backend::c10d;
    config.nnodes = {2, 4};
    config.nproc_per_node = 8;
    config.rdzv_id = "job";
    config.rdzv_conf.last_call_timeout = 2500ms;
    config.redirects = elastic::parse_stream_selection("0:3,1:1", "-r");
    config.signals_to_handle = {SIGTERM, SIGUSR1};
    const auto text = elastic::describe(config);
    CHECK(text.rfind("Starting elastic agent with launch configs:\n", 0) == 0);
    for (const char* line :
         {"  entrypoint           : ./train --lr=1\n", "  min_nodes            : 2\n", "  max_nodes            : 4\n",
          "  nproc_per_node       : 8\n", "  run_id               : job\n", "  rdzv_backend         : c10d\n",
          "  rdzv_endpoint        : localhost:29400\n",
          "  rdzv_configs         : join_timeout=600, last_call_timeout=2.5, close_timeout=30, "
          "read_timeout=60\n",
          "  redirects            : 0:3,1:1\n", "  signals_to_handle    : SIGTERM,SIGUSR1\n",
          "  monitor_interval     : 0.1 (unused: exits are events)\n"}) {
        CHECK_MESSAGE(text.find(line) != std::string::npos, line);
    }
}

TEST_CASE("launch: current_environment() reads the process environment") {
    REQUIRE(::setenv("ELASTIC_LAUNCH_TEST_VARIABLE", "a=b c", 1) == 0);
    const auto env = elastic::current_environment();
    REQUIRE(env.count("ELASTIC_LAUNCH_TEST_VARIABLE") == 1);
    CHECK(env.at("ELASTIC_LAUNCH_TEST_VARIABLE") == "a=b c");
}

}  // namespace test_config
