#!/usr/bin/env python3
"""The elastic membership benchmark: N elasticrun agents (processes) on this machine, c10d over
loopback (or etcd-v3 on a one-member etcd, --backend etcd-v3), `--nnodes=MIN:N`, one trivial
worker each. Two figures:

  node loss   all N workers run; kill -9 one agent (not the store's host); the figure is the
              kill -> the last of the N-1 survivors' new workers running (world N-1); the first
              survivor's is shown too.
  scale-up    N-1 agents run a round of N-1 (round 0 formed by last_call_timeout); start one
              more; the figure is just before spawning it -> every one of the N workers of the new
              round running (the newcomer's first worker and every old agent's new one, world N).

"Running" is the moment a worker prints `running <attempt> <rank> <CLOCK_MONOTONIC ns>` (the
agent-worker test program with AGENT_WORKER_DO=*:running+world+hang: `world` prints the worker's
WORLD_SIZE after the stamp, so a line is counted only for a worker of the expected round), read
on the same monotonic clock as this script's stamp.

  /usr/bin/python3 bench/rendezvous/bench_elastic.py --build build/h-bench [--sizes 4,64,256]
        [--scaleup-sizes 4,64] [--repeat 3] [--keep-alive-interval S] [--last-call S]
        [--keep-logs] [--loglevel INFO]

On 2 cores, 256 agents need --keep-alive-interval 5 (the default 1 s x 5 attempts lets the
saturated agents miss their heartbeats and end with 250) and --last-call 20 (so that the
scale-up's round 0 forms with all N-1 at once); docs/rendezvous.md has the measured table.

The first agent hosts the rendezvous store (`--rdzv-conf is_host=true`), the others join it
(`is_host=false`); the store's host is never the one killed. Every run ends by SIGKILLing every
agent and reaping it; worker processes seen (by the pid of their `world` line) that outlive
their agent are reported and killed.
"""
import argparse
import os
import resource
import selectors
import shutil
import shlex
import signal
import socket
import statistics
import sys
import tempfile
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
    def __init__(self, index, pid, stdout):
        self.index = index
        self.pid = pid
        self.stdout = stdout
        self.buf = b""
        self.runs = []  # [ns, world or None], one per worker start, in order
        self.ended = False


class Job:
    """The agents of one run, their stdout pipes, and what their workers printed."""

    def __init__(self, cmd_for, env, logdir):
        self.cmd_for = cmd_for
        self.env = env
        self.logdir = logdir
        self.agents = []
        self.worker_pids = set()
        self.sel = selectors.DefaultSelector()
        self.devnull = os.open(os.devnull, os.O_RDWR)

    def spawn(self, is_host):
        index = len(self.agents)
        cmd = self.cmd_for(is_host)
        r, w = os.pipe()
        err = os.open(os.path.join(self.logdir, f"agent{index}.stderr"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        # os.posix_spawn (vfork-like in glibc): subprocess.Popen costs ~10x more per process here.
        pid = os.posix_spawn(cmd[0], cmd, self.env, file_actions=[
            (os.POSIX_SPAWN_DUP2, self.devnull, 0), (os.POSIX_SPAWN_DUP2, w, 1), (os.POSIX_SPAWN_DUP2, err, 2)])
        os.close(w)
        os.close(err)
        agent = Agent(index, pid, os.fdopen(r, "rb", buffering=0))
        os.set_blocking(r, False)
        self.sel.register(agent.stdout, selectors.EVENT_READ, agent)
        self.agents.append(agent)
        return agent

    def _read(self, agent):
        chunk = agent.stdout.read()
        if chunk is None:
            return
        if not chunk:
            self.sel.unregister(agent.stdout)
            agent.ended = True
            return
        agent.buf += chunk
        while b"\n" in agent.buf:
            line, agent.buf = agent.buf.split(b"\n", 1)
            parts = line.split()
            if len(parts) == 4 and parts[0] == b"running":
                agent.runs.append([int(parts[3]), None])
            elif len(parts) == 8 and parts[0] == b"world" and agent.runs:
                agent.runs[-1][1] = int(parts[1])
                self.worker_pids.add(int(parts[7]))

    def wait_until(self, done, timeout, what):
        deadline = time.monotonic() + timeout
        while not done():
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(f"timed out after {timeout} s waiting for {what}")
            for key, _ in self.sel.select(timeout=left):
                self._read(key.data)
            for a in self.agents:
                if a.ended and a.pid is not None and not getattr(a, "expected_end", False):
                    raise RuntimeError(f"agent {a.index} ended its output unexpectedly while waiting for {what}"
                                       f" (stderr: {os.path.join(self.logdir, f'agent{a.index}.stderr')})")

    def kill(self, agent):
        agent.expected_end = True
        os.kill(agent.pid, signal.SIGKILL)
        os.waitpid(agent.pid, 0)
        agent.pid = None

    def close(self):
        """SIGKILL every agent and reap it; then kill any worker that outlived its agent."""
        for a in self.agents:
            if a.pid is not None:
                a.expected_end = True
                os.kill(a.pid, signal.SIGKILL)
        for a in self.agents:
            if a.pid is not None:
                os.waitpid(a.pid, 0)
                a.pid = None
        for a in self.agents:
            if not a.ended:
                self.sel.unregister(a.stdout)
            a.stdout.close()
        os.close(self.devnull)
        # The agent's workers die with it (PDEATHSIG); check rather than trust, giving the signal
        # 5 s to act. A pid counts only if it is still a live agent-worker (not a reused pid of
        # someone else's process, not a zombie).
        def alive(pid):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if b"agent-worker" not in f.read().split(b"\0")[0]:
                        return False
                with open(f"/proc/{pid}/stat", "rb") as f:
                    return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
            except (FileNotFoundError, ProcessLookupError):
                return False
        live = [pid for pid in self.worker_pids if alive(pid)]
        deadline = time.monotonic() + 5
        while live and time.monotonic() < deadline:
            time.sleep(0.05)
            live = [pid for pid in live if alive(pid)]
        orphans = 0
        for pid in live:
            try:
                os.kill(pid, signal.SIGKILL)
                orphans += 1
            except ProcessLookupError:
                pass
        if orphans:
            print(f"WARNING: {orphans} worker(s) outlived their SIGKILLed agent (killed now)", file=sys.stderr)


def wall_clock():
    """Now as HH:MM:SS.micros UTC, comparable with the agents' log lines."""
    ns = time.time_ns()
    return time.strftime("%H:%M:%S", time.gmtime(ns // 10**9)) + f".{ns // 1000 % 10**6:06d}"


def settled(agents, world, after=0):
    """Every agent has a worker that started after `after` in a round of `world` nodes."""
    return all(any(ns > after and w == world for ns, w in a.runs) for a in agents)


def first_run(agent, world, after):
    return min(ns for ns, w in agent.runs if ns > after and w == world)


def node_loss_once(job, n, timeout):
    host = job.spawn(True)
    for _ in range(n - 1):
        job.spawn(False)
    job.wait_until(lambda: settled(job.agents, n), timeout, f"all {n} workers running (world {n})")
    victim = job.agents[-1]
    survivors = [a for a in job.agents if a is not victim]
    assert host in survivors
    t0 = time.monotonic_ns()
    job.t0_wall = wall_clock()
    job.kill(victim)
    job.wait_until(lambda: settled(survivors, n - 1, t0), timeout,
                   f"the {n - 1} survivors' new workers running (world {n - 1})")
    stamps = [first_run(a, n - 1, t0) for a in survivors]
    extra = sum(max(0, sum(1 for ns, _ in a.runs if ns > t0) - 1) for a in survivors)
    return (max(stamps) - t0) / 1e6, (min(stamps) - t0) / 1e6, extra


def scale_up_once(job, n, timeout):
    job.spawn(True)
    for _ in range(n - 2):
        job.spawn(False)
    # Round 0 forms last_call_timeout after MIN arrivals; agents slower than that are admitted by
    # scale-up restarts. Measure from a settled job: all N-1 agents in one round of N-1.
    job.wait_until(lambda: settled(job.agents, n - 1), timeout, f"all {n - 1} workers running (world {n - 1})")
    old = list(job.agents)
    before = sum(len(a.runs) for a in old)
    t0 = time.monotonic_ns()
    job.t0_wall = wall_clock()
    job.spawn(False)
    job.wait_until(lambda: settled(job.agents, n, t0), timeout, f"all {n} workers running (world {n})")
    stamps = [first_run(a, n, t0) for a in job.agents]
    extra = sum(len(a.runs) for a in old) - before - len(old)
    return (max(stamps) - t0) / 1e6, (min(stamps) - t0) / 1e6, extra


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--build", required=True, help="a build tree with test-programs/")
    parser.add_argument("--sizes", default="4,64,256", help="node-loss sizes N")
    parser.add_argument("--scaleup-sizes", default="4,64", help="scale-up sizes N (N-1 running, one joins)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--min-nodes", type=int, default=2, help="MIN of --nnodes=MIN:N")
    parser.add_argument("--keep-alive-interval", default="", help="--rdzv-conf keep_alive_interval (default: the agent's, 1 s)")
    parser.add_argument("--last-call", default="1", help="--rdzv-conf last_call_timeout in s (scale-up's round 0)")
    parser.add_argument("--timeout", type=float, default=300, help="give up a wait after this many s")
    parser.add_argument("--keep-logs", action="store_true",
                        help="keep every run's agents' stderr (the path and t0 on the wall clock go to stderr)")
    parser.add_argument("--loglevel", default="WARNING", help="the agents' LOGLEVEL (INFO shows the store's lease losses)")
    parser.add_argument("--backend", default="c10d", choices=["c10d", "etcd-v3"],
                        help="etcd-v3: the agents' rendezvous on a one-member etcd this script starts")
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # 2 pipes + a log file per agent here
    elasticrun = os.path.join(args.build, "test-programs", "agent-elasticrun")
    if os.path.exists(os.path.join(args.build, "bin", "elasticrun")):
        elasticrun = os.path.join(args.build, "bin", "elasticrun")
    worker = os.path.join(args.build, "test-programs", "agent-worker")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "TORCHELASTIC_"))}
    env["OMP_NUM_THREADS"] = "1"
    env["LOGLEVEL"] = args.loglevel
    env["AGENT_WORKER_DO"] = "*:running+world+hang"

    etcd = etcd_local.LocalEtcd().__enter__() if args.backend == "etcd-v3" else None
    runs = [0]

    def cmd_maker(n, port, conf):
        runs[0] += 1
        run_id = f"bench{runs[0]}"

        def cmd_for(is_host):
            if etcd:
                # No agent hosts anything; a job id per run (a killed run's keys wait for its leases).
                return [elasticrun, "--rdzv-backend=etcd-v3", f"--rdzv-endpoint={etcd.endpoint}", f"--rdzv-id={run_id}",
                        f"--nnodes={min(args.min_nodes, n)}:{n}" if args.min_nodes < n else f"--nnodes={n}",
                        "--nproc-per-node=1"] + (["--rdzv-conf=" + ",".join(conf)] if conf else []) + [worker]
            c = conf + [f"is_host={'true' if is_host else 'false'}"]
            return [elasticrun, "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=bench",
                    f"--nnodes={min(args.min_nodes, n)}:{n}" if args.min_nodes < n else f"--nnodes={n}",
                    "--nproc-per-node=1", "--rdzv-conf=" + ",".join(c), worker]
        return cmd_for

    keep_alive = [f"keep_alive_interval={args.keep_alive_interval}"] if args.keep_alive_interval else []
    benches = [
        ("node loss", "kill -9 -> all survivors running", node_loss_once, keep_alive,
         [int(s) for s in args.sizes.split(",") if s]),
        ("scale-up", "spawn -> all N running", scale_up_once, keep_alive + [f"last_call_timeout={args.last_call}"],
         [int(s) for s in args.scaleup_sizes.split(",") if s]),
    ]
    print("command: /usr/bin/python3 " + shlex.join(sys.argv))
    print("agents:  " + " ".join(cmd_maker(4, "PORT", benches[1][3])(False)).replace(worker, "agent-worker")
          .replace(elasticrun, "elasticrun") + "  (N=4 scale-up; the first agent: is_host=true)")
    print("load average before: %.2f %.2f %.2f" % os.getloadavg())
    print()
    print("| event | agents | median ms (last) | min ms | max ms | median ms (first) | extra restarts | repeats |")
    print("|---|---|---|---|---|---|---|---|")
    for name, _, once, conf, sizes in benches:
        for n in sizes:
            values = []
            for _ in range(args.repeat):
                logdir = tempfile.mkdtemp(prefix="bench-elastic-")
                job = Job(cmd_maker(n, free_port(), conf), env, logdir)
                try:
                    values.append(once(job, n, args.timeout))
                except RuntimeError as e:
                    print(f"{name} N={n}: {e}; the agents' stderr is kept in {logdir}", file=sys.stderr)
                    logdir = None
                finally:
                    job.close()
                if logdir and args.keep_logs:
                    print(f"{name} N={n}: t0 at {job.t0_wall} (UTC), the agents' stderr in {logdir}", file=sys.stderr)
                elif logdir:
                    shutil.rmtree(logdir)
            if not values:
                print(f"| {name} | {n} | failed | | | | | 0 of {args.repeat} |", flush=True)
                continue
            last = [v[0] for v in values]
            first = statistics.median(v[1] for v in values)
            extra = sum(v[2] for v in values)
            print(f"| {name} | {n} | {statistics.median(last):.1f} | {min(last):.1f} | {max(last):.1f} "
                  f"| {first:.1f} | {extra} | {len(values)} of {args.repeat} |", flush=True)
    print()
    print("load average after: %.2f %.2f %.2f" % os.getloadavg())
    if etcd:
        etcd.__exit__(None, None, None)


if __name__ == "__main__":
    sys.exit(main())
