// A minimal native worker: prints what the environment contract gives it, under elastic::record
// so that a bad environment or any failure leaves torchelastic's error file and a non-zero exit.
#include <elastic/env.hpp>
#include <elastic/record.hpp>

#include <cstdio>
#include <string>

namespace {

int worker_main() {
    // Throws elastic::env_error naming the variables when the launcher's values break a rule;
    // record() turns that into the error file, a message on stderr and exit status 1.
    const elastic::worker_env& env = elastic::env();
    const std::string master = env.master_addr.value_or("<unset>") + ":" +
                               (env.master_port ? std::to_string(*env.master_port) : "<unset>");
    const std::string launcher = env.launched() ? std::string("launched by ") + elastic::to_string(env.source)
                                                : std::string("not launched (single-rank defaults)");
    std::printf("worker: rank %d of %d (local rank %d of %d) on node %d of %d\n", env.rank, env.world_size,
                env.local_rank, env.local_world_size, env.node_rank, env.node_count);
    std::printf("worker: master %s, restart %d of at most %d, %s\n", master.c_str(), env.restart_count,
                env.max_restarts, launcher.c_str());
    return 0;
}

}  // namespace

int main() { return elastic::record(worker_main); }
