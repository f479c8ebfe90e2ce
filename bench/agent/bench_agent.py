#!/usr/bin/env python3
"""The agent's benchmark: elasticrun (and Debian's torchrun 1.13 beside it, when installed).

  start    launcher started -> all N workers running, N = 1, 4, 8, 16 (standalone)
  restart  a worker's failure -> every worker of the replacement group running (N = 4, 8)
  floor    the same workers started with no launcher: by a minimal C program (spawn_floor.c:
           vfork and execve, nothing else) and straight from this script (Popen); what any
           launcher pays for the workers' own exec and start-up on this machine

Two workers: agent-worker (tests/programs/agent_worker.cpp, a C++ program linked like a user's
trainer with the library's dependencies) and tiny-worker (tiny_worker.c, the smallest C
program that prints the line), which leaves the launcher's own cost in view. The two C programs
are compiled into <build>/bench-agent/ with `cc -O2` on the first run.

"Running" is the moment a worker prints `running <attempt> <rank> <CLOCK_MONOTONIC ns>` (the
agent-worker test program, tests/programs/agent_worker.cpp, with AGENT_WORKER_DO), so the
clock is read inside the workers, on the same monotonic clock as this script's start stamp.
For the restart figure, rank 0 of attempt 0 stamps and exits 1 at once; the figure is the
last replacement's stamp minus that one.

  /usr/bin/python3 bench/agent/bench_agent.py --build build/bench [--repeat 10] [--no-torchrun]
                                              [--workers agent-worker,tiny-worker]

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


# What each worker is told to do: run and wait; run and exit; rank 0 of attempt 0 fails.
BEHAVIOUR = {
    "agent-worker": {"hang": ("AGENT_WORKER_DO", "*:running+hang"),
                     "exit": ("AGENT_WORKER_DO", "*:running"),
                     "fail0": ("AGENT_WORKER_DO", "a0r0:running+exit1;a0:running+hang;*:running+hang")},
    "tiny-worker": {"hang": ("TINY_WORKER_DO", "hang"),
                    "exit": ("TINY_WORKER_DO", "exit"),
                    "fail0": ("TINY_WORKER_DO", "fail0")},
}


def told(env, worker, what):
    name, value = BEHAVIOUR[os.path.basename(worker)][what]
    return dict(env, **{name: value})


def start_once(launcher_cmd, n, env, worker):
    env = told(env, worker, "hang")
    t0, proc = launch(launcher_cmd(n, 0), env)
    try:
        lines = read_running(proc, lambda ls: len(ls) >= n)
        return (max(ns for _, _, ns in lines) - t0) / 1e6
    finally:
        finish(proc)


def restart_once(launcher_cmd, n, env, worker):
    env = told(env, worker, "fail0")
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
        wenv = dict(told(env, worker, "exit"), RANK=str(rank), TORCHELASTIC_RESTART_COUNT="0")
        procs.append(subprocess.Popen([worker], env=wenv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL))
    stamps = []
    for p in procs:
        stamps.append(int(p.stdout.readline().split()[3]))
        p.wait()
    return (max(stamps) - t0) / 1e6


def floor_once(floor, worker, n, env):
    """The floor by a minimal C program: vfork and execve of N workers, nothing else."""
    t0 = time.monotonic_ns()
    proc = subprocess.Popen([floor, str(n), worker], env=told(env, worker, "exit"), stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)
    stamps = [int(line.split()[3]) for line in proc.stdout.read().decode().splitlines()
              if line.startswith("running ")]
    if proc.wait() != 0 or len(stamps) != n:
        raise RuntimeError(f"spawn-floor: {len(stamps)} of {n} workers ran, exit {proc.returncode}")
    return (max(stamps) - t0) / 1e6


def compile_c(build, name):
    """Compiles bench/agent/<name>.c into <build>/bench-agent/<name with dashes> once."""
    out_dir = os.path.join(build, "bench-agent")
    os.makedirs(out_dir, exist_ok=True)
    source = os.path.join(HERE, name + ".c")
    target = os.path.join(out_dir, name.replace("_", "-"))
    if not os.path.exists(target) or os.path.getmtime(target) < os.path.getmtime(source):
        subprocess.run(["cc", "-O2", "-Wall", "-Wextra", "-Werror", "-o", target, source], check=True)
    return target


def measure(name, fn, repeat):
    values = [fn() for _ in range(repeat)]
    return name, statistics.median(values), min(values), max(values)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--build", required=True, help="a build tree with test-programs/")
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--no-torchrun", action="store_true")
    parser.add_argument("--workers", default="agent-worker,tiny-worker",
                        help="which workers, comma-separated: agent-worker, tiny-worker")
    args = parser.parse_args()
    elasticrun = os.path.join(args.build, "test-programs", "agent-elasticrun")
    if os.path.exists(os.path.join(args.build, "bin", "elasticrun")):
        elasticrun = os.path.join(args.build, "bin", "elasticrun")
    workers = []
    for kind in args.workers.split(","):
        if kind == "agent-worker":
            workers.append(os.path.join(args.build, "test-programs", "agent-worker"))
        elif kind == "tiny-worker":
            workers.append(compile_c(args.build, "tiny_worker"))
        else:
            parser.error(f"--workers: unknown worker '{kind}' (agent-worker, tiny-worker)")
    floor = compile_c(args.build, "spawn_floor")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "TORCHELASTIC_"))}
    env["OMP_NUM_THREADS"] = "1"  # no warning banner in either launcher

    launchers = {
        "elasticrun": lambda n, restarts, worker: [elasticrun, "--standalone", f"--nproc-per-node={n}",
                                                   f"--max-restarts={restarts}", worker],
    }
    have_torchrun = os.path.exists("/usr/bin/torchrun") and not args.no_torchrun
    if have_torchrun:
        launchers["torchrun 1.13"] = lambda n, restarts, worker: [
            "/usr/bin/python3", os.path.join(HERE, "torchrun_patched.py"), "--standalone",
            f"--nproc_per_node={n}", f"--max_restarts={restarts}", "--monitor_interval=0.1",
            "--no_python", worker]

    rows = []
    for worker in workers:
        kind = os.path.basename(worker)
        for n in (1, 4, 8, 16):
            rows.append((kind, "(no launcher: C, vfork)", f"start -> {n} running") +
                        measure("floor", lambda: floor_once(floor, worker, n, env), args.repeat)[1:])
            rows.append((kind, "(no launcher: Popen)", f"start -> {n} running") +
                        measure("direct", lambda: direct_once(worker, n, env), args.repeat)[1:])
        for name, cmd in launchers.items():
            if name != "elasticrun" and kind != "agent-worker":
                continue  # torchrun's seconds of start-up hide any worker's
            repeat = args.repeat if name == "elasticrun" else max(3, args.repeat // 3)
            for n in (1, 4, 8, 16):
                rows.append((kind, name, f"start -> {n} running") +
                            measure(name, lambda: start_once(lambda n, r: cmd(n, r, worker), n, env, worker),
                                    repeat)[1:])
            for n in (4, 8):
                rows.append((kind, name, f"failure -> {n} replaced") +
                            measure(name, lambda: restart_once(lambda n, r: cmd(n, r, worker), n, env, worker),
                                    repeat)[1:])
    print("| worker | launcher | what | median ms | min ms | max ms |")
    print("|---|---|---|---|---|---|")
    for kind, name, what, med, lo, hi in rows:
        print(f"| {kind} | {name} | {what} | {med:.2f} | {lo:.2f} | {hi:.2f} |")


if __name__ == "__main__":
    sys.exit(main())
