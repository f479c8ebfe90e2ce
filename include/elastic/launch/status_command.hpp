// SPDX-License-Identifier: MIT
// `elasticrun status`: what the agents of this user on this machine say of their jobs, read
// from their status files (docs/status.md), as a table or as JSON.
#pragma once

#include "elastic/agent/status.hpp"
#include "elastic/detail/config.hpp"

#include <string>
#include <string_view>

namespace elastic::inline v0::detail::launch {

/// `elasticrun status [--rdzv-id=ID] [--json]` (this machine's agents) or `elasticrun status
/// --rdzv-endpoint=HOST:PORT --rdzv-id=ID [--rdzv-conf=...] [--json]` (every agent of the job,
/// from its rendezvous store); argv[0] is "status". Returns the exit code: 0 when an agent was
/// found, 1 when none was (or the store could not be read), 2 for bad arguments.
[[nodiscard]] ELASTIC_DECL int status_command(int argc, const char* const* argv, std::string_view launcher);

}  // namespace elastic::inline v0::detail::launch

#if ELASTIC_DETAIL_BODIES

#include "elastic/launch/values.hpp"
#include "elastic/rendezvous/etcd_rendezvous.hpp"
#include "elastic/rendezvous/tcp_rendezvous.hpp"
#include "elastic/store/client.hpp"
#include "elastic/store/concepts.hpp"
#include "elastic/store/etcd_client.hpp"
#include "elastic/store/etcd_store.hpp"
#include "elastic/store/lease.hpp"

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include "elastic/detail/format.hpp"
#include <nlohmann/json.hpp>

#include <cstdio>
#include <exception>
#include <memory>
#include <optional>
#include <vector>

namespace elastic::inline v0::detail::launch {

/// Every agent's status the job's rendezvous store holds (publish_status()), in the order they
/// first published. An agent whose lease the store no longer holds is shown "finished" when it
/// was finishing, else "gone" (it died, was cut off, or ended on a failure or a signal).
template <::elastic::store Store>
asio::awaitable<std::vector<agent_status>> read_job_statuses(Store& store, std::string run_id) {
    using keys = store_rendezvous<Store>;
    std::vector<agent_status> out;
    std::vector<std::string> count_key{keys::job_key(run_id, "status/count")};
    if (!co_await store.check(std::move(count_key))) co_return out;
    const auto count = detail::to_integer(co_await store.get(keys::job_key(run_id, "status/count"))).value_or(0);
    // At most 100,000 agents are read (a forged counter must not make this run for ever).
    for (long long i = 0; i < std::min<long long>(count, 100000); ++i) {
        const auto key = keys::job_key(run_id, detail::format("status/{}", i));
        std::vector<std::string> one{key};
        if (!co_await store.check(std::move(one))) continue;  // counted, not yet written
        std::vector<std::string> get{key};
        auto values = co_await store.multi_get(std::move(get));
        if (values.empty() || values.front().size() > (1u << 20)) continue;
        auto s = parse_status_json(values.front());
        if (!s) continue;
        // A lease name must be one an agent holds (host:pid:tag), not one of the store's own keys.
        bool alive = !s->lease.empty() && s->lease.rfind("__", 0) != 0 && s->lease.find('/') == std::string::npos;
        if (alive) {
            std::vector<std::string> lease{lease_key(keys::job_key(run_id, "nodes"), s->lease)};
            alive = co_await store.check(std::move(lease));
        }
        if (!alive) s->state = s->state == "finishing" ? "finished" : "gone";
        out.push_back(std::move(*s));
    }
    co_return out;
}

/// read_job_statuses on `store` run to its end on `io`: the agents into `agents`, or its error.
template <class Store>
std::exception_ptr read_statuses_with(asio::io_context& io, Store& store, const std::string& run_id,
                                      std::vector<agent_status>& agents) {
    std::exception_ptr failed;
    asio::co_spawn(io, read_job_statuses(store, run_id), [&](std::exception_ptr e, std::vector<agent_status> got) {
        failed = e;
        agents = std::move(got);
    });
    io.run();
    return failed;
}

ELASTIC_DECL int status_command(int argc, const char* const* argv, std::string_view launcher) {
    bool json = false;
    std::optional<std::string> run_id;
    std::optional<std::string> endpoint;
    std::optional<std::string> conf;
    auto backend = rendezvous_backend::c10d;
    const auto usage = detail::format(
        "usage: {0} status [--rdzv-id=ID] [--json]\n"
        "       {0} status --rdzv-endpoint=HOST:PORT --rdzv-id=ID [--rdzv-conf=KEY=VALUE,...] [--json]\n\n"
        "Shows the elasticrun agents of this user on this machine, or with --rdzv-endpoint every agent of the\n"
        "job whose rendezvous store is there: each one's job, round, state and restarts, and each worker's\n"
        "state, last heartbeat, progress and section (--watchdog).\n\n"
        "  --rdzv-id=ID          only the agents of this run id (needed with --rdzv-endpoint)\n"
        "  --rdzv-endpoint=H:P   the job's rendezvous store, as the agents were given it (a list: the\n"
        "                        first entry that answers)\n"
        "  --rdzv-backend=B      c10d (default), static or etcd-v3, as the agents were given it\n"
        "  --rdzv-conf=...       secret_file and read_timeout (etcd-v3: read_timeout, protocol, cacert,\n"
        "                        cert, key), as the agents were given them (or the secret in\n"
        "                        $ELASTIC_RDZV_SECRET)\n"
        "  --json                one JSON array of the agents' status objects (docs/status.md)\n",
        launcher);
    for (int i = 1; i < argc; ++i) {
        const std::string_view arg = argv[i];
        if (arg == "--json") {
            json = true;
        } else if (arg == "-h" || arg == "--help") {
            std::fputs(usage.c_str(), stdout);
            return 0;
        } else if (arg.rfind("--rdzv-id=", 0) == 0 || arg.rfind("--rdzv_id=", 0) == 0) {
            run_id = std::string(arg.substr(10));
        } else if ((arg == "--rdzv-id" || arg == "--rdzv_id") && i + 1 < argc) {
            run_id = argv[++i];
        } else if (arg.rfind("--rdzv-endpoint=", 0) == 0 || arg.rfind("--rdzv_endpoint=", 0) == 0) {
            endpoint = std::string(arg.substr(16));
        } else if ((arg == "--rdzv-endpoint" || arg == "--rdzv_endpoint") && i + 1 < argc) {
            endpoint = argv[++i];
        } else if (arg == "--rdzv-backend=static" || arg == "--rdzv_backend=static") {
            backend = rendezvous_backend::static_;
        } else if (arg == "--rdzv-backend=c10d" || arg == "--rdzv_backend=c10d") {
            backend = rendezvous_backend::c10d;
        } else if (arg == "--rdzv-backend=etcd-v3" || arg == "--rdzv_backend=etcd-v3") {
            backend = rendezvous_backend::etcd_v3;
        } else if (arg.rfind("--rdzv-conf=", 0) == 0 || arg.rfind("--rdzv_conf=", 0) == 0) {
            conf = std::string(arg.substr(12));
        } else if ((arg == "--rdzv-conf" || arg == "--rdzv_conf") && i + 1 < argc) {
            conf = argv[++i];
        } else {
            std::fprintf(stderr, "%.*s status: unknown argument '%.*s'\n%s", static_cast<int>(launcher.size()),
                         launcher.data(), static_cast<int>(arg.size()), arg.data(), usage.c_str());
            return 2;
        }
    }
    const auto say = [launcher](const std::string& line) {
        std::fprintf(stderr, "%.*s status: %s\n", static_cast<int>(launcher.size()), launcher.data(), line.c_str());
    };
    std::vector<agent_status> agents;
    std::string where;
    if (endpoint) {
        if (!run_id) {
            say("--rdzv-endpoint needs --rdzv-id: a store may hold several jobs");
            return 2;
        }
        // The agents' --rdzv-endpoint, a list included: the first entry that answers (the store
        // may have moved to a later one); etcd-v3: the cluster's members.
        std::vector<store_client_options> tries;
        std::optional<etcd_options> etcd;
        try {
            auto settings = conf ? parse_rendezvous_settings(*conf, "--rdzv-conf", backend) : rendezvous_settings{};
            auto env = current_environment();
            if (backend != rendezvous_backend::etcd_v3) {
                load_rendezvous_secret(settings, env, [&](std::string_view line) { say(std::string(line)); });
            }
            rendezvous_parameters etcd_params;
            etcd_params.settings = settings;
            for (const auto entry : detail::split(*endpoint, ',')) {
                const auto at = parse_host_port(detail::trim(entry), "--rdzv-endpoint");
                store_client_options options;
                options.host = at.host;
                options.port = at.port.value_or(default_rendezvous_port(backend));
                options.secret = settings.secret;
                options.timeout = settings.read_timeout;
                options.connect_timeout = std::chrono::seconds(10);
                options.dialect = client_dialect::current;
                tries.push_back(std::move(options));
                if (tries.size() == 1) etcd_params.endpoint = at;
                else etcd_params.successor_endpoints.push_back(at);
            }
            if (backend == rendezvous_backend::etcd_v3) etcd = etcd_options_for(etcd_params);
        } catch (const usage_error& e) {
            say(e.what());
            return 2;
        }
        std::string why;
        bool read = false;
        if (etcd) {
            asio::io_context io;
            auto client = std::make_shared<etcd_client>(io.get_executor(), *etcd);
            etcd_store_options options;
            options.prefix = std::string(etcd_rendezvous::key_prefix);
            options.timeout = etcd->request_timeout;
            etcd_store store(client, options);
            where = detail::format("the etcd cluster at {}", client->describe());
            const auto failed = read_statuses_with(io, store, *run_id, agents);
            try {
                if (failed) std::rethrow_exception(failed);
                read = true;
            } catch (const std::exception& e) {
                why = detail::format("cannot read {}: {}", where, e.what());
            }
            tries.clear();
        }
        for (const auto& options : tries) {
            where = detail::format("the rendezvous store at {}:{}", options.host, options.port);
            asio::io_context io;
            tcp_store_client store(io.get_executor(), options);
            const auto failed = read_statuses_with(io, store, *run_id, agents);
            if (!failed) {
                read = true;
                break;
            }
            try {
                std::rethrow_exception(failed);
            } catch (const std::exception& e) {
                why += detail::format("{}cannot read {}: {}", why.empty() ? "" : "; ", where, e.what());
            }
        }
        if (!read) {
            say(why);
            return 1;
        }
    } else {
        const auto dirs = status_directories();
        std::string places;
        for (const auto& d : dirs) places += (places.empty() ? "" : ", ") + d.string();
        where = detail::format("this machine (status files in {})", places);
        std::vector<std::string> notes;
        agents = read_statuses(dirs, &notes);
        for (const auto& note : notes) say(note);
        if (run_id) std::erase_if(agents, [&](const agent_status& a) { return a.run_id != *run_id; });
    }
    if (json) {
        auto array = nlohmann::json::array();
        for (const auto& a : agents) array.push_back(nlohmann::json::parse(status_json(a)));
        std::fputs((array.dump(2) + "\n").c_str(), stdout);
    } else if (!agents.empty()) {
        std::fputs(status_table(agents, detail::agent::unix_ms()).c_str(), stdout);
    }
    if (agents.empty()) {
        say(detail::format("no agent{} {}", run_id ? detail::format(" of run '{}'", *run_id) : std::string(),
                           endpoint ? "published its status in " + where : "of this user runs on " + where));
        return 1;
    }
    return 0;
}

}  // namespace elastic::inline v0::detail::launch

#endif  // ELASTIC_DETAIL_BODIES
