#!/usr/bin/env python3
"""The rendezvous benchmark: N elasticrun agents (processes) on this machine, c10d over loopback
(and etcd-v3 on a one-member etcd with --etcd-sizes), one trivial worker each; the figure is the
first agent's start -> every worker running. For etcd-v3 it also counts the requests etcd served
from the first agent's start to the agents' exit (SIGTERM once every worker runs), per agent (its
/metrics).

"Running" is the moment a worker prints `running <attempt> <rank> <CLOCK_MONOTONIC ns>` (the
agent-worker test program with AGENT_WORKER_DO=*:running+hang), read on the same monotonic
clock as this script's stamp taken just before the first agent is spawned. The time to spawn
the agents themselves is part of the figure (and shown apart as "spawned"). The CPU column is
the user and system time of the agents and their workers (each agent reaps its own), from
their start to their exit after SIGTERM, divided by N.

With --floor-sizes, the same N agents and workers start as N one-node --standalone jobs (each
agent hosts its own store): the processes' cost without a shared rendezvous, beside which the
rendezvous's share of the figure shows; and as N copies of bench/agent/spawn_floor.c (a C
program that only vforks and execs one worker and awaits it, which then exits): the floor under
any launcher on this machine.

  /usr/bin/python3 bench/rendezvous/bench_rendezvous.py --build build/bench [--sizes 2,8,64,256,1024]
        [--repeat 3] [--torchrun-sizes 2,8] [--etcd-sizes 2,8,64,256] [--floor-sizes 256,1024]
        [--rdzv-conf keep_alive_interval=5]

torchrun 1.13 runs as bench/agent/torchrun_patched.py (Debian's under Python 3.11 needs one
function patched, PLATFORM.md) with --rdzv_backend=c10d, --no_python and the same worker.
"""
import argparse
import os
import resource
import selectors
import signal
import socket
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import etcd_local  # noqa: E402


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Agent:
    def __init__(self, pid, stdout):
        self.pid = pid
        self.stdout = stdout


RUNS = [0]


def run_once(cmd_for, n, env, worker_do="*:running+hang"):
    env = dict(env, AGENT_WORKER_DO=worker_do)
    port = free_port()
    procs = []
    RUNS[0] += 1
    cmd = cmd_for(n, port)
    devnull = os.open(os.devnull, os.O_RDWR)
    usage0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    # os.posix_spawn (vfork-like in glibc): subprocess.Popen costs ~10x more per process here,
    # which at 1024 agents would measure Python, not the rendezvous.
    t0 = time.monotonic_ns()
    for node in range(n):
        r, w = os.pipe()
        pid = os.posix_spawn(cmd[0], cmd, env, file_actions=[
            (os.POSIX_SPAWN_DUP2, devnull, 0), (os.POSIX_SPAWN_DUP2, w, 1), (os.POSIX_SPAWN_DUP2, devnull, 2)])
        os.close(w)
        procs.append(Agent(pid, os.fdopen(r, "rb", buffering=0)))
    spawned = time.monotonic_ns()
    os.close(devnull)
    sel = selectors.DefaultSelector()
    for p in procs:
        os.set_blocking(p.stdout.fileno(), False)
        sel.register(p.stdout, selectors.EVENT_READ, [p, b""])
    stamps = []
    try:
        while len(stamps) < n:
            events = sel.select(timeout=120)
            if not events:
                raise RuntimeError(f"only {len(stamps)} of {n} workers running after 120 s")
            for key, _ in events:
                p, buf = key.data
                chunk = key.fileobj.read()
                if not chunk:
                    sel.unregister(key.fileobj)
                    raise RuntimeError("an agent ended before its worker ran")
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    parts = line.split()
                    if len(parts) == 4 and parts[0] == b"running":
                        stamps.append(int(parts[3]))
                        sel.unregister(key.fileobj)
                        break
                key.data[1] = buf
    finally:
        for p in procs:
            os.kill(p.pid, signal.SIGTERM)
        for p in procs:
            os.waitpid(p.pid, 0)
            p.stdout.close()
    usage1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    # The agents' CPU and their workers' (each agent reaps its own), start to SIGTERM and exit.
    cpu_ms = ((usage1.ru_utime - usage0.ru_utime) + (usage1.ru_stime - usage0.ru_stime)) * 1e3
    return (max(stamps) - t0) / 1e6, (spawned - t0) / 1e6, cpu_ms / n


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--build", required=True, help="a build tree with test-programs/")
    parser.add_argument("--sizes", default="2,8,64,256,1024")
    parser.add_argument("--torchrun-sizes", default="2,8")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--etcd-sizes", default="", help="etcd-v3 on a one-member etcd: these sizes too")
    parser.add_argument("--rdzv-conf", default="",
                        help="passed to every elasticrun c10d and --standalone agent (the etcd-v3 runs have "
                        "their own), e.g. keep_alive_interval=5 for 4096 agents")
    parser.add_argument("--floor-sizes", default="",
                        help="these sizes also as N one-node --standalone jobs started at once: the same "
                             "processes without a shared rendezvous")
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # 3 pipes per agent here
    elasticrun = os.path.join(args.build, "test-programs", "agent-elasticrun")
    if os.path.exists(os.path.join(args.build, "bin", "elasticrun")):
        elasticrun = os.path.join(args.build, "bin", "elasticrun")
    worker = os.path.join(args.build, "test-programs", "agent-worker")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "TORCHELASTIC_"))}
    env["OMP_NUM_THREADS"] = "1"
    env["LOGLEVEL"] = "WARNING"

    conf = [f"--rdzv-conf={args.rdzv_conf}"] if args.rdzv_conf else []
    launchers = {
        "elasticrun": (lambda n, port: [elasticrun, "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
                                        "--rdzv-id=bench", f"--nnodes={n}", "--nproc-per-node=1"] + conf + [worker],
                       [int(s) for s in args.sizes.split(",") if s]),
    }
    floor_sizes = [int(s) for s in args.floor_sizes.split(",") if s]
    if floor_sizes:
        launchers["elasticrun, N one-node jobs"] = (
            lambda n, port: [elasticrun, "--standalone", "--nproc-per-node=1"] + conf + [worker], floor_sizes)
        sys.path.insert(0, os.path.join(HERE, "..", "agent"))
        import bench_agent  # noqa: E402
        spawn_floor = bench_agent.compile_c(args.build, "spawn_floor")
        # Its worker exits once it said "running" (spawn-floor awaits it; nothing would stop it).
        launchers["no launcher: C, vfork"] = (lambda n, port: [spawn_floor, "1", worker], floor_sizes)
    if os.path.exists("/usr/bin/torchrun") and args.torchrun_sizes:
        launchers["torchrun 1.13"] = (
            lambda n, port: ["/usr/bin/python3", os.path.join(HERE, "..", "agent", "torchrun_patched.py"),
                             "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{port}", "--rdzv_id=bench",
                             f"--nnodes={n}", "--nproc_per_node=1", "--monitor_interval=0.1", "--no_python", worker],
            [int(s) for s in args.torchrun_sizes.split(",") if s])

    etcd_sizes = [int(s) for s in args.etcd_sizes.split(",") if s]
    etcd = etcd_local.LocalEtcd().__enter__() if etcd_sizes else None
    if etcd:
        # A job id per run: each run's agents are killed, and their keys wait for their leases.
        launchers["elasticrun etcd-v3"] = (
            lambda n, port: [elasticrun, "--rdzv-backend=etcd-v3", f"--rdzv-endpoint={etcd.endpoint}",
                             f"--rdzv-id=bench{RUNS[0]}", f"--nnodes={n}", "--nproc-per-node=1",
                             "--rdzv-conf=keep_alive_interval=5", worker], etcd_sizes)

    print("| launcher | agents | median ms (start -> all running) | min ms | max ms | spawning the agents ms "
          "| CPU ms per agent and its worker | etcd requests per agent |")
    print("|---|---|---|---|---|---|---|---|")
    try:
        for name, (cmd, sizes) in launchers.items():
            for n in sizes:
                repeat = args.repeat
                if name.startswith("torchrun") or n >= 1024:
                    repeat = 1
                values = []
                requests = []
                for _ in range(repeat):
                    before = etcd.requests() if etcd and "etcd" in name else None
                    values.append(run_once(cmd, n, env, "*:running" if name.startswith("no launcher") else
                                           "*:running+hang"))
                    if before is not None:
                        after = etcd.requests()
                        requests.append({k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)})
                totals = [v[0] for v in values]
                spawn = statistics.median(v[1] for v in values)
                cpu = statistics.median(v[2] for v in values)
                per_agent = "–"
                if requests:
                    last = requests[-1]
                    per_agent = f"{sum(last.values()) / n:.1f} (" + ", ".join(
                        f"{k} {v / n:.1f}" for k, v in sorted(last.items(), key=lambda kv: -kv[1])) + ")"
                print(f"| {name} | {n} | {statistics.median(totals):.1f} | {min(totals):.1f} | {max(totals):.1f} "
                      f"| {spawn:.1f} | {cpu:.1f} | {per_agent} |", flush=True)
    finally:
        if etcd:
            etcd.__exit__(None, None, None)


if __name__ == "__main__":
    sys.exit(main())
