// elastic::env(): every rule of docs/environment.md, table-driven over worker_env::from, and the
// same contract read by real child processes (tests/programs/env_print.cpp, examples/worker.cpp).
#include <elastic/env.hpp>

#include <doctest/doctest.h>

#include "env_support.hpp"

#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace test_env {

using vars = std::map<std::string, std::string>;

// A row of the success table: the variables and every field they must produce.
struct good_row {
    const char* name;
    vars variables;
    elastic::worker_env expected;
};

elastic::worker_env make(elastic::env_source source, int rank, int local_rank, int world, int local_world, int node,
                         int nodes) {
    elastic::worker_env e;
    e.source = source;
    e.rank = rank;
    e.local_rank = local_rank;
    e.world_size = world;
    e.local_world_size = local_world;
    e.node_rank = node;
    e.node_count = nodes;
    e.role_rank = rank;
    e.role_world_size = world;
    return e;
}

void check_equal(const elastic::worker_env& got, const elastic::worker_env& want) {
    CHECK(elastic::to_string(got.source) == std::string(elastic::to_string(want.source)));
    CHECK(got.launched() == want.launched());
    CHECK(got.rank == want.rank);
    CHECK(got.local_rank == want.local_rank);
    CHECK(got.world_size == want.world_size);
    CHECK(got.local_world_size == want.local_world_size);
    CHECK(got.node_rank == want.node_rank);
    CHECK(got.node_count == want.node_count);
    CHECK(got.role_rank == want.role_rank);
    CHECK(got.role_world_size == want.role_world_size);
    CHECK(got.role_name == want.role_name);
    CHECK(got.master_addr == want.master_addr);
    CHECK(got.master_port == want.master_port);
    CHECK(got.restart_count == want.restart_count);
    CHECK(got.max_restarts == want.max_restarts);
    CHECK(got.run_id == want.run_id);
    CHECK(got.use_agent_store == want.use_agent_store);
    CHECK(got.error_file == want.error_file);
}

std::vector<good_row> good_rows() {
    using elastic::env_source;
    std::vector<good_row> rows;
    rows.push_back({"nothing set: rank 0 of 1, not launched", {}, {}});

    auto full = make(env_source::torchrun, 5, 1, 8, 2, 2, 4);
    full.role_rank = 3;
    full.role_world_size = 6;
    full.role_name = "trainer";
    full.master_addr = "node0.example";
    full.master_port = 29500;
    full.restart_count = 2;
    full.max_restarts = 3;
    full.run_id = "job7";
    full.use_agent_store = true;
    full.error_file = "/logs/attempt_2/1/error.json";
    rows.push_back({"every torchrun variable",
                    {{"RANK", "5"},
                     {"LOCAL_RANK", "1"},
                     {"GROUP_RANK", "2"},
                     {"ROLE_RANK", "3"},
                     {"ROLE_NAME", "trainer"},
                     {"WORLD_SIZE", "8"},
                     {"LOCAL_WORLD_SIZE", "2"},
                     {"GROUP_WORLD_SIZE", "4"},
                     {"ROLE_WORLD_SIZE", "6"},
                     {"MASTER_ADDR", "node0.example"},
                     {"MASTER_PORT", "29500"},
                     {"TORCHELASTIC_RESTART_COUNT", "2"},
                     {"TORCHELASTIC_MAX_RESTARTS", "3"},
                     {"TORCHELASTIC_RUN_ID", "job7"},
                     {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                     {"TORCHELASTIC_ERROR_FILE", "/logs/attempt_2/1/error.json"}},
                    full});

    rows.push_back({"RANK and WORLD_SIZE only: the local pair is the single-node one",
                    {{"RANK", "3"}, {"WORLD_SIZE", "4"}},
                    make(env_source::torchrun, 3, 3, 4, 4, 0, 1)});
    rows.push_back(
        {"composer's NODE_RANK is the node rank",
         {{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"}, {"NODE_RANK", "1"}},
         make(env_source::torchrun, 3, 1, 4, 2, 1, 2)});
    rows.push_back({"GROUP_RANK and NODE_RANK may both be set when equal",
                    {{"RANK", "3"},
                     {"WORLD_SIZE", "4"},
                     {"LOCAL_RANK", "1"},
                     {"LOCAL_WORLD_SIZE", "2"},
                     {"NODE_RANK", "1"},
                     {"GROUP_RANK", "1"}},
                    make(env_source::torchrun, 3, 1, 4, 2, 1, 2)});
    rows.push_back({"no node rank: global rank / local world size, node count rounded up",
                    {{"RANK", "5"}, {"WORLD_SIZE", "7"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"}},
                    make(env_source::torchrun, 5, 1, 7, 2, 2, 4)});
    rows.push_back({"sizes near INT_MAX: the node count is rounded up without overflow",
                    {{"RANK", "2147483646"},
                     {"WORLD_SIZE", "2147483647"},
                     {"LOCAL_RANK", "0"},
                     {"LOCAL_WORLD_SIZE", "1073741824"}},
                    make(env_source::torchrun, 2147483646, 0, 2147483647, 1073741824, 1, 2)});
    auto agent_store_false = make(env_source::torchrun, 0, 0, 1, 1, 0, 1);
    rows.push_back({"USE_AGENT_STORE=False; an empty TORCHELASTIC_ERROR_FILE (logs to /dev/null)",
                    {{"RANK", "0"},
                     {"WORLD_SIZE", "1"},
                     {"TORCHELASTIC_USE_AGENT_STORE", "False"},
                     {"TORCHELASTIC_ERROR_FILE", ""}},
                    agent_store_false});
    auto restart_only = make(env_source::torchrun, 1, 1, 2, 2, 0, 1);
    restart_only.restart_count = 1;
    rows.push_back({"a TORCHELASTIC_* variable counts as launched",
                    {{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"TORCHELASTIC_RESTART_COUNT", "1"}},
                    restart_only});

    elastic::worker_env endpoint_only;
    endpoint_only.master_addr = "10.0.0.1";
    endpoint_only.master_port = 1;
    endpoint_only.error_file = "/tmp/e.json";
    rows.push_back({"MASTER_ADDR, MASTER_PORT and the error file alone do not mean launched",
                    {{"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "1"}, {"TORCHELASTIC_ERROR_FILE", "/tmp/e.json"}},
                    endpoint_only});

    auto slurm = make(env_source::slurm, 5, 1, 8, 2, 2, 4);
    slurm.master_addr = "gpu07";
    slurm.run_id = "4242";
    rows.push_back({"Slurm: srun's variables, master from the first host of the step",
                    {{"SLURM_PROCID", "5"},
                     {"SLURM_LOCALID", "1"},
                     {"SLURM_NODEID", "2"},
                     {"SLURM_NTASKS", "8"},
                     {"SLURM_NTASKS_PER_NODE", "2"},
                     {"SLURM_NNODES", "4"},
                     {"SLURM_STEP_NODELIST", "gpu[07-10],cpu1"},
                     {"SLURM_JOB_ID", "4242"}},
                    slurm});
    auto slurm_list = make(env_source::slurm, 6, 0, 8, 2, 3, 4);
    slurm_list.master_addr = "explicit";
    slurm_list.master_port = 12345;
    rows.push_back({"Slurm: tasks per node from the step list; MASTER_ADDR wins over the nodelist",
                    {{"SLURM_PROCID", "6"},
                     {"SLURM_LOCALID", "0"},
                     {"SLURM_NODEID", "3"},
                     {"SLURM_STEP_NUM_TASKS", "8"},
                     {"SLURM_NTASKS", "16"},
                     {"SLURM_STEP_TASKS_PER_NODE", "2(x4)"},
                     {"SLURM_STEP_NODELIST", "n[1-4]"},
                     {"MASTER_ADDR", "explicit"},
                     {"MASTER_PORT", "12345"}},
                    slurm_list});
    auto srun_elasticrun = make(env_source::torchrun, 1, 1, 4, 4, 0, 1);
    rows.push_back({"any torchrun variable switches the fallbacks off (srun elasticrun)",
                    {{"RANK", "1"},
                     {"WORLD_SIZE", "4"},
                     {"SLURM_PROCID", "0"},
                     {"SLURM_LOCALID", "0"},
                     {"SLURM_NTASKS", "2"},
                     {"SLURM_NTASKS_PER_NODE", "1"},
                     {"OMPI_COMM_WORLD_RANK", "0"},
                     {"OMPI_COMM_WORLD_SIZE", "2"}},
                    srun_elasticrun});
    auto step_list = make(env_source::slurm, 2, 0, 5, 2, 1, 3);
    rows.push_back({"Slurm: the step's per-node list wins over SLURM_NTASKS_PER_NODE",
                    {{"SLURM_PROCID", "2"},
                     {"SLURM_LOCALID", "0"},
                     {"SLURM_NODEID", "1"},
                     {"SLURM_STEP_NUM_TASKS", "5"},
                     {"SLURM_NTASKS_PER_NODE", "4"},
                     {"SLURM_STEP_TASKS_PER_NODE", "2(x2),1"},
                     {"SLURM_STEP_NUM_NODES", "3"}},
                    step_list});
    rows.push_back({"Open MPI: mpirun's variables, node = rank / local size",
                    {{"OMPI_COMM_WORLD_RANK", "3"},
                     {"OMPI_COMM_WORLD_SIZE", "4"},
                     {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                     {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}},
                    make(env_source::open_mpi, 3, 1, 4, 2, 1, 2)});
    rows.push_back({"Open MPI wins over an inherited SLURM_PROCID (mpirun inside sbatch)",
                    {{"OMPI_COMM_WORLD_RANK", "3"},
                     {"OMPI_COMM_WORLD_SIZE", "4"},
                     {"SLURM_PROCID", "0"},
                     {"SLURM_LOCALID", "0"},
                     {"SLURM_NTASKS", "1"},
                     {"SLURM_NTASKS_PER_NODE", "1"}},
                    make(env_source::open_mpi, 3, 3, 4, 4, 0, 1)});
    return rows;
}

// A row of the error table: the message must contain every piece, and variables() list these.
struct bad_row {
    vars variables;
    std::vector<std::string> message_has;
    std::vector<std::string> names;
};

std::vector<bad_row> bad_rows() {
    return {
        {{{"RANK", "3"}, {"WORLD_SIZE", "2"}},
         {"RANK=3", "WORLD_SIZE=2", "not less than", "0 to WORLD_SIZE-1"},
         {"RANK", "WORLD_SIZE"}},
        {{{"RANK", "2"}, {"WORLD_SIZE", "2"}}, {"RANK=2", "WORLD_SIZE=2"}, {"RANK", "WORLD_SIZE"}},
        {{{"RANK", "abc"}, {"WORLD_SIZE", "2"}}, {"RANK='abc'", "not an integer"}, {"RANK"}},
        {{{"RANK", ""}, {"WORLD_SIZE", "2"}}, {"RANK=''", "not an integer"}, {"RANK"}},
        {{{"RANK", "1.5"}, {"WORLD_SIZE", "2"}}, {"RANK='1.5'", "not an integer"}, {"RANK"}},
        {{{"RANK", " 1"}, {"WORLD_SIZE", "2"}}, {"RANK=' 1'", "not an integer"}, {"RANK"}},
        {{{"RANK", "+1"}, {"WORLD_SIZE", "2"}}, {"RANK='+1'", "not an integer"}, {"RANK"}},
        {{{"RANK", "0"}, {"WORLD_SIZE", "two"}}, {"WORLD_SIZE='two'", "not an integer"}, {"WORLD_SIZE"}},
        {{{"RANK", "-1"}, {"WORLD_SIZE", "2"}}, {"RANK=-1", "negative"}, {"RANK"}},
        {{{"RANK", "0"}, {"WORLD_SIZE", "99999999999"}}, {"WORLD_SIZE=99999999999", "out of range"}, {"WORLD_SIZE"}},
        {{{"RANK", "0"}, {"WORLD_SIZE", "0"}}, {"WORLD_SIZE=0", "1 or more"}, {"WORLD_SIZE"}},
        {{{"WORLD_SIZE", "2"}}, {"RANK is not set", "WORLD_SIZE=2"}, {"RANK", "WORLD_SIZE"}},
        {{{"RANK", "0"}}, {"WORLD_SIZE is not set", "RANK=0"}, {"WORLD_SIZE", "RANK"}},
        {{{"LOCAL_RANK", "0"}}, {"WORLD_SIZE is not set", "LOCAL_RANK=0"}, {"WORLD_SIZE", "LOCAL_RANK"}},
        {{{"TORCHELASTIC_RUN_ID", "x"}},
         {"WORLD_SIZE is not set", "TORCHELASTIC_RUN_ID=x"},
         {"WORLD_SIZE", "TORCHELASTIC_RUN_ID"}},
        {{{"RANK", "0"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "2"}},
         {"LOCAL_RANK=2", "LOCAL_WORLD_SIZE=2", "not less than"},
         {"LOCAL_RANK", "LOCAL_WORLD_SIZE"}},
        {{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "4"}},
         {"LOCAL_WORLD_SIZE=4", "exceeds", "WORLD_SIZE=2"},
         {"LOCAL_WORLD_SIZE", "WORLD_SIZE"}},
        {{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "1"}},
         {"LOCAL_WORLD_SIZE is not set", "LOCAL_RANK=1", "both or neither"},
         {"LOCAL_WORLD_SIZE", "LOCAL_RANK"}},
        {{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_WORLD_SIZE", "2"}},
         {"LOCAL_RANK is not set", "LOCAL_WORLD_SIZE=2"},
         {"LOCAL_RANK", "LOCAL_WORLD_SIZE"}},
        {{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "70000"}},
         {"MASTER_PORT=70000", "1-65535"},
         {"MASTER_PORT"}},
        {{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "0"}}, {"MASTER_PORT=0", "1-65535"}, {"MASTER_PORT"}},
        {{{"MASTER_PORT", "65536"}}, {"MASTER_PORT=65536", "1-65535"}, {"MASTER_PORT"}},
        {{{"MASTER_PORT", "http"}}, {"MASTER_PORT='http'", "not an integer"}, {"MASTER_PORT"}},
        {{{"MASTER_ADDR", ""}}, {"MASTER_ADDR", "empty"}, {"MASTER_ADDR"}},
        {{{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"GROUP_RANK", "1"}, {"NODE_RANK", "0"}},
         {"GROUP_RANK=1", "NODE_RANK=0", "disagree"},
         {"GROUP_RANK", "NODE_RANK"}},
        {{{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"GROUP_RANK", "2"}, {"GROUP_WORLD_SIZE", "2"}},
         {"GROUP_RANK=2", "GROUP_WORLD_SIZE=2"},
         {"GROUP_RANK", "GROUP_WORLD_SIZE"}},
        {{{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"NODE_RANK", "1"}},
         {"NODE_RANK=1", "node count 1", "GROUP_WORLD_SIZE is unset"},
         {"NODE_RANK"}},
        {{{"RANK", "0"}, {"WORLD_SIZE", "4"}, {"ROLE_RANK", "4"}},
         {"ROLE_RANK=4", "ROLE_WORLD_SIZE is unset"},
         {"ROLE_RANK"}},
        {{{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"TORCHELASTIC_USE_AGENT_STORE", "maybe"}},
         {"TORCHELASTIC_USE_AGENT_STORE='maybe'", "not a boolean"},
         {"TORCHELASTIC_USE_AGENT_STORE"}},
        {{{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"TORCHELASTIC_RESTART_COUNT", "-2"}},
         {"TORCHELASTIC_RESTART_COUNT=-2", "negative"},
         {"TORCHELASTIC_RESTART_COUNT"}},
        {{{"SLURM_PROCID", "4"}, {"SLURM_LOCALID", "0"}, {"SLURM_NTASKS", "4"}, {"SLURM_NTASKS_PER_NODE", "4"}},
         {"SLURM_PROCID=4", "SLURM_NTASKS=4"},
         {"SLURM_PROCID", "SLURM_NTASKS"}},
        {{{"SLURM_PROCID", "0"}},
         {"SLURM_NTASKS is not set", "SLURM_PROCID=0", "srun"},
         {"SLURM_NTASKS", "SLURM_PROCID"}},
        {{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}},
         {"SLURM_LOCALID is not set", "SLURM_PROCID=0"},
         {"SLURM_LOCALID", "SLURM_PROCID"}},
        {{{"SLURM_PROCID", "0"}, {"SLURM_LOCALID", "0"}, {"SLURM_NTASKS", "2"}},
         {"SLURM_NTASKS_PER_NODE is not set", "local world size is unknown"},
         {"SLURM_NTASKS_PER_NODE", "SLURM_PROCID"}},
        {{{"SLURM_PROCID", "1"}, {"SLURM_LOCALID", "2"}, {"SLURM_NTASKS", "4"}, {"SLURM_NTASKS_PER_NODE", "2"}},
         {"SLURM_LOCALID=2", "SLURM_NTASKS_PER_NODE=2"},
         {"SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"}},
        {{{"SLURM_PROCID", "1"},
          {"SLURM_LOCALID", "0"},
          {"SLURM_NODEID", "5"},
          {"SLURM_NTASKS", "4"},
          {"SLURM_TASKS_PER_NODE", "2(x2)"}},
         {"SLURM_TASKS_PER_NODE='2(x2)'", "node 5"},
         {"SLURM_TASKS_PER_NODE", "SLURM_NODEID"}},
        {{{"OMPI_COMM_WORLD_RANK", "4"}, {"OMPI_COMM_WORLD_SIZE", "4"}},
         {"OMPI_COMM_WORLD_RANK=4", "OMPI_COMM_WORLD_SIZE=4"},
         {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"}},
        {{{"OMPI_COMM_WORLD_RANK", "0"}},
         {"OMPI_COMM_WORLD_SIZE is not set", "mpirun"},
         {"OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK"}},
    };
}

std::string describe(const vars& variables) {
    std::string out;
    for (const auto& [name, value] : variables) out += name + "='" + value + "' ";
    return out;
}

std::map<std::string, std::string> parse_lines(const std::string& text) {
    std::map<std::string, std::string> out;
    std::istringstream in(text);
    std::string line;
    while (std::getline(in, line)) {
        const auto eq = line.find('=');
        if (eq != std::string::npos) out[line.substr(0, eq)] = line.substr(eq + 1);
    }
    return out;
}

}  // namespace test_env

TEST_CASE("env: valid environments give every field its documented value") {
    for (const auto& row : test_env::good_rows()) {
        CAPTURE(row.name);
        test_env::check_equal(elastic::worker_env::from(row.variables), row.expected);
    }
}

TEST_CASE("env: invalid environments throw env_error naming the variables, values and rule") {
    for (const auto& row : test_env::bad_rows()) {
        const std::string input = test_env::describe(row.variables);
        CAPTURE(input);
        bool threw = false;
        try {
            (void)elastic::worker_env::from(row.variables);
        } catch (const elastic::env_error& error) {
            threw = true;
            const std::string message = error.what();
            CAPTURE(message);
            CHECK(message.rfind("invalid worker environment: ", 0) == 0);
            for (const auto& piece : row.message_has) {
                CAPTURE(piece);
                CHECK(message.find(piece) != std::string::npos);
            }
            CHECK(error.variables() == row.names);
        }
        CHECK(threw);
    }
}

TEST_CASE("env: worker_env::from takes any string map, e.g. one with a transparent comparator") {
    const std::map<std::string, std::string, std::less<>> variables{{"RANK", "1"}, {"WORLD_SIZE", "2"}};
    const auto e = elastic::worker_env::from(variables);
    CHECK(e.rank == 1);
    CHECK(e.world_size == 2);
    CHECK(e.launched());
}

TEST_CASE("env: env_error is an elastic::error") {
    CHECK_THROWS_AS((void)elastic::worker_env::from({{"RANK", "3"}, {"WORLD_SIZE", "2"}}), elastic::error);
}

TEST_CASE("env: Slurm hostlists and tasks-per-node lists") {
    using elastic::detail::slurm_first_host;
    using elastic::detail::slurm_tasks_on_node;
    CHECK(slurm_first_host("node1") == "node1");
    CHECK(slurm_first_host("node1,node2") == "node1");
    CHECK(slurm_first_host("gpu[07-09,12],cpu1") == "gpu07");
    CHECK(slurm_first_host("gpu[12,07-09]") == "gpu12");
    CHECK(slurm_first_host("rack[1-2]-n[01-04]") == "rack1-n01");
    CHECK(slurm_first_host("a-b[3]") == "a-b3");
    CHECK(slurm_first_host("") == "");
    CHECK(slurm_first_host("broken[1-2") == "");
    CHECK(slurm_tasks_on_node("4", 0) == 4);
    CHECK(slurm_tasks_on_node("4", 1) == std::nullopt);
    CHECK(slurm_tasks_on_node("2(x3),1", 0) == 2);
    CHECK(slurm_tasks_on_node("2(x3),1", 2) == 2);
    CHECK(slurm_tasks_on_node("2(x3),1", 3) == 1);
    CHECK(slurm_tasks_on_node("2(x3),1", 4) == std::nullopt);
    CHECK(slurm_tasks_on_node("2(y3)", 0) == std::nullopt);
    CHECK(slurm_tasks_on_node("x", 0) == std::nullopt);
    CHECK(slurm_tasks_on_node("-2", 0) == std::nullopt);  // found by fuzz_env
    CHECK(slurm_tasks_on_node("2(x0),1", 0) == std::nullopt);
    CHECK(slurm_tasks_on_node("2(x-1),1", 0) == std::nullopt);
}

TEST_CASE("env: a real child reads its real environment, once, as worker_env::from does") {
    env_support::temp_dir dir;
    const std::string program = ELASTIC_TEST_PROGRAM_DIR "/env-print";
    const test_env::vars launched{{"RANK", "5"},
                                  {"LOCAL_RANK", "1"},
                                  {"GROUP_RANK", "2"},
                                  {"WORLD_SIZE", "8"},
                                  {"LOCAL_WORLD_SIZE", "2"},
                                  {"GROUP_WORLD_SIZE", "4"},
                                  {"ROLE_NAME", "trainer"},
                                  {"MASTER_ADDR", "127.0.0.1"},
                                  {"MASTER_PORT", "29500"},
                                  {"TORCHELASTIC_RESTART_COUNT", "1"},
                                  {"TORCHELASTIC_MAX_RESTARTS", "3"},
                                  {"TORCHELASTIC_RUN_ID", "run"},
                                  {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                                  {"SLURM_PROCID", "0"}};
    const auto child = env_support::run_child(program, {}, launched, dir.path());
    REQUIRE(child.exited);
    CHECK(child.exit_code == 0);
    const auto seen = test_env::parse_lines(child.out);
    CHECK(seen.at("source") == "torchrun");
    CHECK(seen.at("launched") == "1");
    CHECK(seen.at("rank") == "5");
    CHECK(seen.at("local_rank") == "1");
    CHECK(seen.at("world_size") == "8");
    CHECK(seen.at("local_world_size") == "2");
    CHECK(seen.at("node_rank") == "2");
    CHECK(seen.at("node_count") == "4");
    CHECK(seen.at("role_rank") == "5");
    CHECK(seen.at("role_world_size") == "8");
    CHECK(seen.at("role_name") == "trainer");
    CHECK(seen.at("master_addr") == "127.0.0.1");
    CHECK(seen.at("master_port") == "29500");
    CHECK(seen.at("restart_count") == "1");
    CHECK(seen.at("max_restarts") == "3");
    CHECK(seen.at("run_id") == "run");
    CHECK(seen.at("use_agent_store") == "1");
    CHECK(seen.at("error_file") == "<none>");

    const auto alone = env_support::run_child(program, {}, {}, dir.path());
    REQUIRE(alone.exited);
    CHECK(alone.exit_code == 0);
    const auto defaults = test_env::parse_lines(alone.out);
    CHECK(defaults.at("source") == "defaults");
    CHECK(defaults.at("launched") == "0");
    CHECK(defaults.at("rank") == "0");
    CHECK(defaults.at("world_size") == "1");
    CHECK(defaults.at("local_rank") == "0");
    CHECK(defaults.at("local_world_size") == "1");
    CHECK(defaults.at("node_rank") == "0");

    const auto slurm = env_support::run_child(program, {},
                                              {{"SLURM_PROCID", "3"},
                                               {"SLURM_LOCALID", "1"},
                                               {"SLURM_NODEID", "1"},
                                               {"SLURM_NTASKS", "4"},
                                               {"SLURM_NTASKS_PER_NODE", "2"},
                                               {"SLURM_STEP_NODELIST", "host[3-4]"}},
                                              dir.path());
    REQUIRE(slurm.exited);
    const auto from_slurm = test_env::parse_lines(slurm.out);
    CHECK(from_slurm.at("source") == "slurm");
    CHECK(from_slurm.at("rank") == "3");
    CHECK(from_slurm.at("node_rank") == "1");
    CHECK(from_slurm.at("master_addr") == "host3");

    const auto bad = env_support::run_child(
        program, {}, {{"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "2"}, {"RANK", "0"}, {"WORLD_SIZE", "2"}}, dir.path());
    REQUIRE(bad.exited);
    CHECK(bad.exit_code == 1);
    CHECK(bad.out.find("LOCAL_RANK=2 is not less than LOCAL_WORLD_SIZE=2") != std::string::npos);
}

TEST_CASE("env: the example worker reports rank 0 of 1 alone and fails on RANK=3 WORLD_SIZE=2") {
    env_support::temp_dir dir;
    const std::string example = ELASTIC_TEST_PROGRAM_DIR "/env-example";

    const auto alone = env_support::run_child(example, {}, {}, dir.path());
    REQUIRE(alone.exited);
    CHECK(alone.exit_code == 0);
    CHECK(alone.out.find("rank 0 of 1") != std::string::npos);
    CHECK(alone.out.find("not launched") != std::string::npos);
    CHECK(alone.err.empty());

    const std::string error_file = dir / "logs/attempt_0/3/error.json";
    const auto bad = env_support::run_child(
        example, {}, {{"RANK", "3"}, {"WORLD_SIZE", "2"}, {"TORCHELASTIC_ERROR_FILE", error_file}}, dir.path());
    REQUIRE(bad.exited);
    CHECK(bad.exit_code == 1);
    CHECK(bad.out.empty());
    CHECK(bad.err.find("elastic::env_error: invalid worker environment: RANK=3 is not less than "
                       "WORLD_SIZE=2") != std::string::npos);
    const std::string written = env_support::read_file(error_file);
    CHECK(written.find("RANK=3") != std::string::npos);
    CHECK(written.find("WORLD_SIZE=2") != std::string::npos);
}
