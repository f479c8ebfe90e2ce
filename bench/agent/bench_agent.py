#!/usr/bin/env python3
"""The agent's benchmark: elasticrun (and Debian's torchrun 1.13 beside it, when installed).

  start    launcher started -> all N workers running, N = 1, 4, 8, 16 (standalone)
  restart  a worker's failure -> every worker of the replacement group running (N = 4, 8)
  floor    the same workers started straight from this script (Popen), no launcher: what any
           launcher pays for the workers' own exec and start-up on this machine

"Running" is the moment a worker prints `running <attempt> <rank> <CLOCK_MONOTONIC ns>` (the
agent-worker test program, tests/programs/agent_worker.cpp, with AGENT_WORKER_DO), so the
clock is read inside the workers, on the same monotonic clock as this script's start stamp.
For the restart figure, rank 0 of attempt 0 stamps and exits 1 at once; the figure is the
last replacement's stamp minus that one.

  /usr/bin/python3 bench/agent/bench_agent.py --build build/bench [--repeat 10] [--no-torchrun]

torchrun runs as bench/agent/torchrun_patched.py (Debian's 1.13 under Python 3.11 needs one
function patched, PLATFORM.md), with --no_python and the same worker binary, and at
--monitor_interval=0.1 for the restart figure (its default, 5 s, would dominate).
"""
import argparse
import os
import signal
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def launch(cmd, env):
    t0 = time.monotonic_ns()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    return t0, proc


def read_running(proc, want):
    """Reads stdout until `want(lines)` holds; returns the parsed 'running' lines."""
    lines = []
    while not want(lines):
        raw = proc.stdout.readline()
        if not raw:
            raise RuntimeError("launcher ended before its workers were running")
        parts = raw.decode().split()
        if len(parts) == 4 and parts[0] == "running":
            lines.append((int(parts[1]), int(parts[2]), int(parts[3])))
    return lines


def finish(proc):
    proc.send_signal(signal.SIGTERM)
    proc.stdout.read()
    proc.wait()


def start_once(launcher_cmd, n, env):
    env = dict(env, AGENT_WORKER_DO="*:running+hang")
    t0, proc = launch(launcher_cmd(n, 0), env)
    try:
        lines = read_running(proc, lambda ls: len(ls) >= n)
        return (max(ns for _, _, ns in lines) - t0) / 1e6
    finally:
        finish(proc)


def restart_once(launcher_cmd, n, env):
    env = dict(env, AGENT_WORKER_DO="a0r0:running+exit1;a0:running+hang;*:running+hang")
    _, proc = launch(launcher_cmd(n, 1), env)
    try:
        lines = read_running(proc, lambda ls: sum(1 for a, _, _ in ls if a == 1) >= n)
        failed = next(ns for a, r, ns in lines if a == 0 and r == 0)
        replaced = max(ns for a, _, ns in lines if a == 1)
        return (replaced - failed) / 1e6
    finally:
        finish(proc)


def direct_once(worker, n, env):
    """The floor: the same N workers started straight from this script, no launcher."""
    procs = []
    t0 = time.monotonic_ns()
    for rank in range(n):
        wenv = dict(env, AGENT_WORKER_DO="*:running", RANK=str(rank), TORCHELASTIC_RESTART_COUNT="0")
        procs.append(subprocess.Popen([worker], env=wenv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL))
    stamps = []
    for p in procs:
        stamps.append(int(p.stdout.readline().split()[3]))
        p.wait()
    return (max(stamps) - t0) / 1e6


def measure(name, fn, repeat):
    values = [fn() for _ in range(repeat)]
    return name, statistics.median(values), min(values), max(values)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--build", required=True, help="a build tree with test-programs/")
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--no-torchrun", action="store_true")
    args = parser.parse_args()
    elasticrun = os.path.join(args.build, "test-programs", "agent-elasticrun")
    if os.path.exists(os.path.join(args.build, "bin", "elasticrun")):
        elasticrun = os.path.join(args.build, "bin", "elasticrun")
    worker = os.path.join(args.build, "test-programs", "agent-worker")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "TORCHELASTIC_"))}
    env["OMP_NUM_THREADS"] = "1"  # no warning banner in either launcher

    launchers = {
        "elasticrun": lambda n, restarts: [elasticrun, "--standalone", f"--nproc-per-node={n}",
                                           f"--max-restarts={restarts}", worker],
    }
    have_torchrun = os.path.exists("/usr/bin/torchrun") and not args.no_torchrun
    if have_torchrun:
        launchers["torchrun 1.13"] = lambda n, restarts: [
            "/usr/bin/python3", os.path.join(HERE, "torchrun_patched.py"), "--standalone",
            f"--nproc_per_node={n}", f"--max_restarts={restarts}", "--monitor_interval=0.1",
            "--no_python", worker]

    rows = []
    for n in (1, 4, 8, 16):
        rows.append(("(no launcher)", f"start -> {n} running") +
                    measure("direct", lambda: direct_once(worker, n, env), args.repeat)[1:])
    for name, cmd in launchers.items():
        repeat = args.repeat if name == "elasticrun" else max(3, args.repeat // 3)
        for n in (1, 4, 8, 16):
            rows.append((name, f"start -> {n} running") +
                        measure(name, lambda: start_once(cmd, n, env), repeat)[1:])
        for n in (4, 8):
            rows.append((name, f"failure -> {n} replaced") +
                        measure(name, lambda: restart_once(cmd, n, env), repeat)[1:])
    print(f"| launcher | what | median ms | min ms | max ms |")
    print(f"|---|---|---|---|---|")
    for name, what, med, lo, hi in rows:
        print(f"| {name} | {what} | {med:.2f} | {lo:.2f} | {hi:.2f} |")


if __name__ == "__main__":
    sys.exit(main())
