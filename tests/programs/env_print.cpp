// Prints what elastic::env() reads from this process's real environment, one "key=value" per
// line, or "error: <message>" and exit 1 when it throws.
#include <elastic/env.hpp>

#include <cstdio>

int main() {
    try {
        const elastic::worker_env& e = elastic::env();
        // A second call must hand back the same object: the environment is read once.
        if (&elastic::env() != &e) return 3;
        std::printf("source=%s\nlaunched=%d\nrank=%d\nlocal_rank=%d\nworld_size=%d\n"
                    "local_world_size=%d\nnode_rank=%d\nnode_count=%d\nrole_rank=%d\n"
                    "role_world_size=%d\nrole_name=%s\nmaster_addr=%s\nmaster_port=%d\n"
                    "restart_count=%d\nmax_restarts=%d\nrun_id=%s\nuse_agent_store=%d\n"
                    "error_file=%s\n",
                    elastic::to_string(e.source), e.launched() ? 1 : 0, e.rank, e.local_rank, e.world_size,
                    e.local_world_size, e.node_rank, e.node_count, e.role_rank, e.role_world_size, e.role_name.c_str(),
                    e.master_addr ? e.master_addr->c_str() : "<none>", e.master_port ? int{*e.master_port} : 0,
                    e.restart_count, e.max_restarts, e.run_id.c_str(), e.use_agent_store ? 1 : 0,
                    e.error_file ? e.error_file->c_str() : "<none>");
        return 0;
    } catch (const elastic::env_error& error) {
        std::printf("error: %s\n", error.what());
        return 1;
    }
}
