#!/usr/bin/env python3
"""The chaos harness: real elasticrun agents on loopback, a seeded random schedule of faults, and
the invariants a job must keep whatever happens to it.

  chaos.py --elasticrun PATH --worker PATH [--schedules K] [--seed S] [--agents MAX]
           [--duration SECONDS] [--workdir DIR] [--keep]

Schedule s (seed S+s) starts N agents (3 <= N <= MAX) of one job, `--nnodes=2:N`, one worker each
(tests/programs/chaos_worker.cpp: a step is an all_gather over elastic::dist that needs every
rank, logged with its group, world, rank and CLOCK_MONOTONIC time). For `--duration` seconds it
injects, at random moments (mid-round included), one fault after another:

  kill    SIGKILL of an agent; a new agent takes its place 0.5-3 s later (see below)
  host    the same, for the agent that hosts the rendezvous store (listens on the endpoint)
  stop    SIGSTOP of an agent for 0.3-6 s (around the 3 s lease timeout), then SIGCONT
  crash   SIGKILL of a worker
  leave   SIGTERM of an agent (it leaves the job); a new agent joins 0.5-3 s later
  cut     (--netns only) an agent's link down for 1-8 s: it is cut off from every other, the
          store's host included, or is the host cut off from the job

Each agent has an address of its own (127.0.0.<slot+1> on loopback, its machine's with --netns)
and is given the list of every slot's address as --rdzv-endpoint, the first slot's first: its
idle store listens at its entry, the store moves to a listed member when its host is lost, and a
replacement agent (on its predecessor's address) finds the job where it moved. --no-list gives the
first endpoint only, the benchmark's view of the limit without a list: a newcomer started after
the store moved hosts a fresh store at the endpoint, and may start the job a second time.

With --netns (root and iproute2's `ip`), each agent runs in a network namespace of its own, its
"machine", joined to the others through a bridge in one more namespace; the job is
`--nnodes=1:N`, so a part cut off alone could form a group by itself, which the majority rule
must stop. A replacement agent starts on its predecessor's machine (its address). The harness
removes its namespaces when it ends, and any left by an earlier run that was killed.

Then it checks:
  1. no worker saw a wrong gather (an entry naming another group, step or rank), and each
     group's logged ranks are distinct and inside its world, its world one size;
  2. never two groups of the job trained at once: no two groups each log two steps inside the
     other's span of steps;
  3. within RECOVER_BOUND of the last fault, the job trains again (a group takes three steps after
     it) or every agent has exited, each with a documented code (0, 250; 143 after its SIGTERM);
  4. a SIGKILLed agent's workers are gone ORPHAN_BOUND_NS after the kill; SIGTERM ends each agent
     still running within TERM_BOUND; LEFTOVER_BOUND after the last agent ended no process of the
     schedule (found by a variable in its environment) runs.

A failing schedule prints the command that replays it (the faults' order, targets and delays;
the kernel's timing is not under the seed's control). Exits 1 when any schedule broke an
invariant. bench/chaos/bench_chaos.py runs many and prints the figures.
"""
import argparse
import ctypes
import dataclasses
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

JOIN_TIMEOUT = 20  # s: a part below MIN exits 250 this long after it lost the others (a newcomer
# that waits for a move that never completes: its search, then one round, so twice this long)
LEASE = (1, 3)  # keep_alive_interval, keep_alive_max_attempt: a lease lasts 3 s
RECOVER_BOUND = 2 * JOIN_TIMEOUT + 20  # s after the last fault: trains again, or every agent exited
TERM_BOUND = 40  # s for an agent to end after SIGTERM
ORPHAN_BOUND_NS = 3 * 10**9  # a SIGKILLed agent's workers are gone by then (their own timeout: 8 s)
LEFTOVER_BOUND = 5  # s after the last agent ended
DOCUMENTED = {0, 250}  # an agent's own end (docs/exit-codes.md); 143 only after our SIGTERM


def free_port():
    """A port below the ephemeral range: nothing dials out from it meanwhile."""
    lo = 20000
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo = int(f.read().split()[0])
    except OSError:
        pass
    if lo <= 10002:  # no room below the range: the kernel's pick
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randint(10000, max(10001, lo - 1))
        s = socket.socket()
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", port))
            return port
        except OSError:
            continue
        finally:
            s.close()
    raise RuntimeError("no free port below the ephemeral range")


def die_with_harness():
    """In the agent before it runs: SIGKILL when the harness dies (a timeout's SIGKILL, ^C), so that
    no job outlives it; the agent's death watcher then stops its workers."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(1, signal.SIGKILL, 0, 0, 0) != 0:  # PR_SET_PDEATHSIG
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")


def now():
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


def processes():
    """The pids of every process, as /proc lists them."""
    return [entry for entry in os.listdir("/proc") if entry.isdigit()]


def children(pid, exe=None):
    """The direct children of pid; with exe, only those running that program (the agent's workers,
    not its death watcher)."""
    found = []
    for entry in processes():
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[1]) != pid:
            continue
        try:
            if exe is not None and os.path.realpath(f"/proc/{entry}/exe") != os.path.realpath(exe):
                continue
        except OSError:
            continue
        found.append(int(entry))
    return found


def marked(mark):
    """Processes whose environment carries CHAOS_MARK=mark."""
    needle = f"CHAOS_MARK={mark}".encode()
    found = []
    for entry in processes():
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"/proc/{entry}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if needle in env and state != "Z":
            found.append(int(entry))
    return found


def proc_address(ipv4):
    """An IPv4 address as /proc/net/tcp spells it (the 32-bit value in host order, in hex)."""
    return "".join(f"{int(octet):02X}" for octet in reversed(ipv4.split(".")))


def listens(pid, port, address=None):
    """Whether process pid holds a listening TCP socket on port (and IPv4 address, if given), in
    its own network namespace."""
    inodes = set()
    want = proc_address(address) if address else None
    for table in ("tcp", "tcp6"):
        try:
            with open(f"/proc/{pid}/net/{table}") as f:
                next(f)
                for line in f:
                    cols = line.split()
                    local, local_port = cols[1].rsplit(":", 1)
                    if cols[3] == "0A" and int(local_port, 16) == port and want in (None, local):
                        inodes.add(cols[9])
        except OSError:
            continue
    if not inodes:
        return False
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:  # a descriptor closed during the scan is no listener
            if os.readlink(f"/proc/{pid}/fd/{fd}")[8:-1] in inodes:
                return True
        except OSError:
            continue
    return False


class Machines:
    """Network namespaces as machines: slot i is `<prefix>-<i>` with address 10.201.0.<i+1>,
    its veth's other end on a bridge in namespace `<prefix>-hub`. cut(i)/mend(i) take that end
    down and up. remove() kills whatever runs in them and deletes them."""

    def __init__(self, ip, slots):
        self.ip = ip
        self.prefix = f"elchaos{os.getpid()}"
        self.hub = f"{self.prefix}-hub"
        self.made = []
        try:
            self.sh("netns", "add", self.hub)
            self.made.append(self.hub)
            self.sh("-n", self.hub, "link", "add", "br0", "type", "bridge")
            self.sh("-n", self.hub, "link", "set", "br0", "up")
            for i in range(slots):
                ns = self.ns(i)
                self.sh("netns", "add", ns)
                self.made.append(ns)
                self.sh("-n", self.hub, "link", "add", f"h{i}", "type", "veth", "peer", "name", "eth0", "netns", ns)
                self.sh("-n", self.hub, "link", "set", f"h{i}", "master", "br0", "up")
                self.sh("-n", ns, "addr", "add", f"{self.addr(i)}/24", "dev", "eth0")
                self.sh("-n", ns, "link", "set", "eth0", "up")
                self.sh("-n", ns, "link", "set", "lo", "up")
        except BaseException:
            self.remove()
            raise

    def sh(self, *args):
        r = subprocess.run([self.ip, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"{self.ip} {' '.join(args)}: {r.stdout.strip()}")
        return r.stdout

    def ns(self, i):
        return f"{self.prefix}-{i}"

    @staticmethod
    def addr(i):
        return f"10.201.0.{i + 1}"

    def cut(self, i):
        self.sh("-n", self.hub, "link", "set", f"h{i}", "down")

    def mend(self, i):
        self.sh("-n", self.hub, "link", "set", f"h{i}", "up")

    def remove(self):
        remove_namespaces(self.ip, self.made)
        self.made = []


def remove_namespaces(ip, names):
    for ns in names:
        r = subprocess.run([ip, "netns", "pids", ns], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        for pid in r.stdout.split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        subprocess.run([ip, "netns", "del", ns], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def remove_stale_namespaces(ip):
    """Namespaces of an earlier harness that was killed before it could remove them."""
    r = subprocess.run([ip, "netns", "list"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    stale = []
    for line in r.stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        owner = name[len("elchaos"):].split("-")[0] if name.startswith("elchaos") else ""
        if owner.isdigit() and not os.path.exists(f"/proc/{owner}"):
            stale.append(name)
    remove_namespaces(ip, stale)


def netns_usable():
    """iproute2's ip when this process may make namespaces, else None and why."""
    ip = shutil.which("ip") or next((p for p in ("/usr/sbin/ip", "/sbin/ip") if os.access(p, os.X_OK)), None)
    if ip is None:
        return None, "iproute2's `ip` is not installed"
    if os.geteuid() != 0:
        return None, "network namespaces need root"
    probe = f"elchaos{os.getpid()}-probe"
    r = subprocess.run([ip, "netns", "add", probe], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        return None, f"`ip netns add` failed: {r.stdout.strip()}"
    subprocess.run([ip, "netns", "del", probe], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return ip, ""


@dataclasses.dataclass
class Agent:
    index: int
    slot: int  # its machine (--netns), else its place in the job
    proc: subprocess.Popen
    termed: bool = False  # we sent SIGTERM
    killed: bool = False  # we sent SIGKILL


@dataclasses.dataclass
class Outcome:
    seed: int
    agents: int
    faults: list
    violations: list
    recovered_s: float | None  # last fault -> a group's first step after it
    steps: int
    groups: int
    ended: str = ""  # every agent exited before the job trained again: their codes


class Schedule:
    def __init__(self, args, seed, workdir):
        self.args = args
        self.seed = seed
        self.rng = random.Random(seed)
        self.dir = os.path.join(workdir, f"schedule-{seed}")
        shutil.rmtree(self.dir, ignore_errors=True)  # an earlier run's log would be checked again
        os.makedirs(self.dir)
        self.log = os.path.join(self.dir, "steps.log")
        self.mark = f"chaos-{os.getpid()}-{seed}"
        self.port = free_port()
        self.n = self.rng.randint(3, max(3, args.agents))
        self.machines = Machines(args.ip, self.n) if args.netns else None
        self.agents = []
        self.store_moved = False  # a fault hit the agent that hosts the store at the first endpoint
        self.faults = []  # (monotonic ns at its end, text)
        self.violations = []
        self.orphans = []  # (deadline ns, pid): a SIGKILLed agent's workers, gone by then
        self.ended = ""

    def spawn(self, slot):
        index = len(self.agents)
        env = dict(os.environ)
        env.update(CHAOS_LOG=self.log, CHAOS_MARK=self.mark, CHAOS_STEP_MS="50", CHAOS_TIMEOUT_MS="8000")
        conf = (f"join_timeout={JOIN_TIMEOUT},last_call_timeout=1,keep_alive_interval={LEASE[0]},"
                f"keep_alive_max_attempt={LEASE[1]}")
        listed = range(1 if self.args.no_list else self.n)
        endpoint = ",".join(f"{self.addr(i)}:{self.port}" for i in listed)
        cmd = [self.args.elasticrun, f"--nnodes={1 if self.machines else 2}:{self.n}", "--nproc-per-node=1",
               "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}", f"--rdzv-id=chaos-{self.seed}",
               f"--local-addr={self.addr(slot)}", f"--rdzv-conf={conf}", "--max-restarts=100000",
               "--monitor-interval=0.1", self.args.worker]
        if self.machines:
            cmd = [self.args.ip, "netns", "exec", self.machines.ns(slot)] + cmd  # ip execs the agent: same pid
        with open(os.path.join(self.dir, f"agent{index}.log"), "wb") as out:
            proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True, preexec_fn=die_with_harness)
        self.agents.append(Agent(index, slot, proc))

    def addr(self, slot):
        """Slot `slot`'s address: its machine's, or one of its own on loopback."""
        return Machines.addr(slot) if self.machines else f"127.0.0.{slot + 1}"

    def live(self):
        return [a for a in self.agents if a.proc.poll() is None]

    def fault(self):
        live = self.live()  # faults come one after another: none is stopped now
        if not live:
            return None
        kinds = ["kill"] * 3 + ["stop"] * 2 + ["crash"] * 2 + ["leave"] * 2 + ["host"] + (["cut"] * 3 if self.machines else [])
        kind = self.rng.choice(kinds)
        # Only a "host" fault aims at the store's host at the first endpoint (no idle store
        # listens there: the first entry is no member's). Once it is hit the store may move to a
        # member, which the harness cannot tell apart from the idle stores; a store at the first
        # endpoint after that is a fresh one (the job started again there once it had ended).
        hosting = [a for a in live if listens(a.proc.pid, self.port, self.addr(0))]
        others = [a for a in live if self.store_moved or a not in hosting]
        target = self.rng.choice(others or live)
        if kind == "host":
            if hosting:
                target = hosting[0]
            else:
                kind = "kill"
        text = f"{kind} agent{target.index}"
        if kind != "crash" and target in hosting and not self.store_moved:
            # The store may move now: a newcomer finds it through the list (without one, it would
            # host a fresh store at the endpoint and may start the job again beside the moved one).
            self.store_moved = True
            text += " (the store's host)"
        # The fault's moment: its signal, or the SIGCONT that ends a stop. A replacement agent's
        # arrival is no fault: the job may train again before it or with it.
        if kind in ("kill", "host", "leave"):
            if target.proc.poll() is not None:  # it ended on its own: its code counts
                return text + " (it had already exited)"
            workers = children(target.proc.pid, self.args.worker)
            target.killed = kind != "leave"
            target.termed = kind == "leave"
            target.proc.send_signal(signal.SIGTERM if kind == "leave" else signal.SIGKILL)
            self.faults.append((now(), text))
            if target.killed:
                # Its death watcher stops its workers at once; their own timeout would take 8 s.
                self.orphans += [(now() + ORPHAN_BOUND_NS, pid) for pid in workers]
            self.pause(self.rng.uniform(0.5, 3))
            self.spawn(target.slot)
        elif kind == "stop":
            target.proc.send_signal(signal.SIGSTOP)
            self.pause(self.rng.uniform(0.3, 6))
            target.proc.send_signal(signal.SIGCONT)
            self.faults.append((now(), text))
        elif kind == "cut":
            self.machines.cut(target.slot)
            self.pause(self.rng.uniform(1, 8))
            self.machines.mend(target.slot)
            self.faults.append((now(), text))
        elif kind == "crash":
            workers = children(target.proc.pid, self.args.worker)
            if workers:
                try:
                    os.kill(self.rng.choice(sorted(workers)), signal.SIGKILL)
                except ProcessLookupError:
                    pass
            self.faults.append((now(), text if workers else f"crash agent{target.index} (no worker yet)"))
        return text

    def pause(self, seconds):
        time.sleep(seconds)  # the schedule's own clock: a fault's duration, not a synchronisation
        self.check_orphans()

    def check_orphans(self):
        """A SIGKILLed agent's workers still alive ORPHAN_BOUND after the kill escaped it."""
        t = now()
        due = [(d, pid) for d, pid in self.orphans if d <= t]
        self.orphans = [(d, pid) for d, pid in self.orphans if d > t]
        left = set(marked(self.mark)) if due else set()
        for _, pid in due:
            if pid in left:
                self.violations.append(f"worker {pid} outlived its SIGKILLed agent by {ORPHAN_BOUND_NS / 1e9:.0f} s")
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def steps(self):
        lines = []
        try:
            with open(self.log) as f:
                for line in f:
                    lines.append(line.split())
        except FileNotFoundError:
            pass
        return lines

    def run(self):
        try:
            return self.run_faults()
        except Exception as e:  # noqa: BLE001 - a harness error is this schedule's failure, with its seed
            self.violations.append(f"the harness failed: {type(e).__name__}: {e}")
            return self.outcome(None)
        finally:
            for a in self.agents:
                if a.proc.poll() is None:
                    a.proc.kill()
                    a.proc.wait()
            if self.machines:
                self.machines.remove()

    def outcome(self, recovered):
        lines = [s for s in self.steps() if len(s) == 7 and s[0] == "step"]
        return Outcome(self.seed, self.n, [t for _, t in self.faults], self.violations, recovered, len(lines),
                       len({s[1] for s in lines}), self.ended)

    def run_faults(self):
        for slot in range(self.n):
            self.spawn(slot)
        end = time.monotonic() + self.args.duration
        self.pause(self.rng.uniform(1, 3))
        while time.monotonic() < end:
            if self.fault() is None:
                break
            self.pause(self.rng.uniform(0.2, 3))
        last_fault = self.faults[-1][0] if self.faults else now()
        recovered = self.await_recovery(last_fault)
        self.end_agents()
        self.check_leftovers()
        self.check_log()
        return self.outcome(recovered)

    def agent_code_ok(self, a, code):
        """An agent's exit code is one the docs name for how it ended."""
        if a.killed:
            return True
        if a.termed:
            # 143 once its handlers are in place; before that (a SIGTERM right after its start) the
            # signal's default action ends it.
            return code in DOCUMENTED | {128 + signal.SIGTERM, -signal.SIGTERM}
        return code in DOCUMENTED

    def await_recovery(self, last_fault):
        deadline = time.monotonic() + RECOVER_BOUND
        recovered = None
        while time.monotonic() < deadline:
            self.check_orphans()
            trained = self.trained_after(last_fault)
            if trained is not None:
                recovered = (trained - last_fault) / 1e9
                break
            if not self.live():
                break
            time.sleep(0.1)  # polling the shared log; no event announces a step
        for a in self.agents:
            code = a.proc.poll()
            if code is not None and not self.agent_code_ok(a, code):
                self.violations.append(f"agent{a.index} exited {code}: no documented end for a job under faults "
                                       f"(see {self.dir}/agent{a.index}.log)")
        if recovered is None and self.live():
            self.violations.append(f"the job did not train again within {RECOVER_BOUND} s of the last fault, "
                                   f"and {len(self.live())} agents still run")
        elif recovered is None:
            self.ended = ", ".join(f"agent{a.index} {a.proc.returncode}" for a in self.agents if not a.killed)
        return recovered

    def trained_after(self, t):
        """When a group that went on to train three steps after t took its first step after t."""
        after = {}  # group -> {step: first ns}
        for s in self.steps():
            try:
                if len(s) == 7 and s[0] == "step" and int(s[5]) > t:
                    steps = after.setdefault(s[1], {})
                    steps[int(s[4])] = min(steps.get(int(s[4]), int(s[5])), int(s[5]))
            except ValueError:
                continue  # check_steps reports it
        firsts = [min(steps.values()) for steps in after.values() if len(steps) >= 3]
        return min(firsts) if firsts else None

    def end_agents(self):
        for a in self.live():
            a.termed = True
            a.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + TERM_BOUND  # one bound for all: they end side by side
        for a in self.agents:
            try:
                code = a.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.violations.append(f"agent{a.index} still ran {TERM_BOUND} s after SIGTERM (a hang; see "
                                       f"{self.dir}/agent{a.index}.log)")
                a.proc.kill()
                a.proc.wait()
                continue
            if not self.agent_code_ok(a, code):
                self.violations.append(f"agent{a.index} exited {code} (see {self.dir}/agent{a.index}.log)")

    def check_leftovers(self):
        # Every agent has ended: whatever of the schedule still runs, once a worker's stop (its
        # SIGTERM, then SIGKILL after the agent's shutdown timeout) is over, escaped it.
        deadline = time.monotonic() + LEFTOVER_BOUND
        left = marked(self.mark)
        while left and time.monotonic() < deadline:
            time.sleep(0.1)  # polling /proc: no event announces another process's end
            left = marked(self.mark)
        if left:
            self.violations.append(f"processes left behind {LEFTOVER_BOUND} s after the last agent ended: {left}")
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def check_log(self):
        self.violations += check_steps(self.steps())


def check_steps(lines):
    """The violations of invariants 1 and 2 in the workers' log lines (each a list of fields)."""
    violations = []
    groups = {}  # group -> {"world": set, "ranks": {step: set}, "times": [ns]}
    for s in lines:
        if not s:
            continue
        if s[0] == "bad":
            violations.append(f"a worker saw a wrong gather: {' '.join(s)}")
            continue
        if s[0] == "error":
            continue  # a worker whose store went away with its agent: the agent's business
        try:
            if s[0] != "step" or len(s) != 7:
                raise ValueError
            group, world, rank, step, ns = s[1], int(s[2]), int(s[3]), int(s[4]), int(s[5])
        except ValueError:
            violations.append(f"an unreadable log line: {' '.join(s)}")
            continue
        g = groups.setdefault(group, {"world": set(), "ranks": {}, "times": []})
        g["world"].add(world)
        if not 0 <= rank < world:
            violations.append(f"group {group}: rank {rank} outside its world of {world}")
        seen = g["ranks"].setdefault(step, set())
        if rank in seen:
            violations.append(f"group {group}: two workers with rank {rank} at step {step}")
        seen.add(rank)
        g["times"].append(ns)
    for group, g in groups.items():
        if len(g["world"]) != 1:
            violations.append(f"group {group}: worlds {sorted(g['world'])}")
    spans = {k: (min(g["times"]), max(g["times"])) for k, g in groups.items()}
    names = sorted(spans)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            (a0, a1), (b0, b1) = spans[a], spans[b]
            a_in_b = sum(1 for t in groups[a]["times"] if b0 < t < b1)
            b_in_a = sum(1 for t in groups[b]["times"] if a0 < t < a1)
            # Two steps of each (every rank logs each step) inside the other's span: both trained.
            if a_in_b >= 2 * max(groups[a]["world"]) and b_in_a >= 2 * max(groups[b]["world"]):
                violations.append(f"groups {a} and {b} trained at the same time")
    return violations


def self_test():
    """The checks fire on logs that break them, and stay quiet on one that does not."""
    def steps(group, world, first_ns, count, gap=100):
        return [["step", group, str(world), str(r), str(k), str(first_ns + k * gap + r), "1"]
                for k in range(count) for r in range(world)]
    cases = [
        ("two groups one after the other", steps("a", 2, 0, 10) + steps("b", 3, 2000, 10), None),
        ("two groups at once", steps("a", 2, 0, 10) + steps("b", 2, 450, 10), "trained at the same time"),
        ("one step of the old group after the new one's first",
         steps("a", 2, 0, 10) + steps("b", 2, 850, 10), None),
        ("two steps of the old group after the new one's first",
         steps("a", 2, 0, 10) + steps("b", 2, 760, 10), "trained at the same time"),
        ("a half-written line", steps("a", 2, 0, 2) + [["step", "a", "2", "1", "1x"]], "unreadable"),
        ("two workers with one rank", steps("a", 2, 0, 3) + [["step", "a", "2", "1", "1", "105", "9"]],
         "two workers with rank 1"),
        ("a rank outside the world", [["step", "a", "2", "2", "0", "1", "1"]], "outside its world"),
        ("two worlds in one group", steps("a", 2, 0, 2) + [["step", "a", "3", "2", "5", "1000", "1"]],
         "worlds [2, 3]"),
        ("a wrong gather", [["bad", "a", "0", "rank", "1", "sent", "'0'"]], "wrong gather"),
    ]
    failed = 0
    for name, lines, expected in cases:
        got = check_steps(lines)
        ok = (not got) if expected is None else any(expected in v for v in got)
        print(f"self-test: {name}: {'ok' if ok else 'WRONG'} ({'; '.join(got) or 'no violation'})")
        failed += not ok
    return 1 if failed else 0


def run_schedules(args):
    # SIGTERM (a CTest timeout, pkill) unwinds like ^C, so that each schedule's finally removes
    # its agents and namespaces.
    signal.signal(signal.SIGTERM, interrupted)
    if args.netns:
        remove_stale_namespaces(args.ip)
    workdir = args.workdir or tempfile.mkdtemp(prefix="elastic-chaos-")
    outcomes = []
    for i in range(args.schedules):
        seed = args.seed + i
        print(f"schedule seed={seed}: starting", flush=True)
        schedule = Schedule(args, seed, workdir)
        outcome = schedule.run()
        outcomes.append(outcome)
        status = "ok" if not outcome.violations else "VIOLATED"
        if outcome.recovered_s is not None:
            end = f"trained again {outcome.recovered_s:.2f} s after the last fault"
        else:
            end = f"every agent ended ({outcome.ended})"
        print(f"schedule seed={seed} agents={outcome.agents} groups={outcome.groups} steps={outcome.steps}, "
              f"{end}: {status}\n  faults: {', '.join(outcome.faults) or 'none'}", flush=True)
        if outcome.violations:
            for v in outcome.violations:
                print(f"  violated: {v}")
            replay = [os.path.join(os.path.dirname(os.path.abspath(__file__)), "chaos.py"),
                      "--elasticrun", args.elasticrun, "--worker", args.worker, "--seed", str(seed),
                      "--schedules", "1", "--agents", str(args.agents), "--duration", str(args.duration)]
            replay += ["--netns"] if args.netns else []
            replay += ["--no-list"] if args.no_list else []
            print(f"  replay (the same faults, targets and delays; the kernel's timing may differ): "
                  f"python3 {' '.join(replay)}\n  logs: {schedule.dir}", flush=True)
        elif not args.keep:
            shutil.rmtree(schedule.dir, ignore_errors=True)
    if not args.keep and not args.workdir and all(not o.violations for o in outcomes):
        shutil.rmtree(workdir, ignore_errors=True)
    return outcomes


def parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--elasticrun")
    p.add_argument("--worker", help="the chaos-worker program")
    p.add_argument("--schedules", type=int, default=3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--agents", type=int, default=5, help="at most this many agents (at least 3)")
    p.add_argument("--duration", type=float, default=15, help="seconds of faults per schedule")
    p.add_argument("--workdir", help="keep each schedule's logs here")
    p.add_argument("--keep", action="store_true", help="keep the logs of schedules that passed")
    p.add_argument("--self-test", action="store_true", help="check the checks on made-up logs, run nothing")
    p.add_argument("--no-list", action="store_true",
                   help="give the agents the first endpoint only, no --rdzv-endpoint list (a known limit: a "
                        "newcomer after the store moved may start the job again beside the moved store)")
    p.add_argument("--netns", action="store_true",
                   help="each agent on a machine of its own (a network namespace), with link cuts; "
                        "exits 77 (skipped) when this process cannot make namespaces")
    return p


def interrupted(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def main():
    args = parser().parse_args()
    if args.self_test:
        return self_test()
    args.ip = None
    if args.netns:
        args.ip, why = netns_usable()
        if args.ip is None:
            print(f"chaos: skipped: {why}")
            return 77
    for flag, path in (("--elasticrun", args.elasticrun), ("--worker", args.worker)):
        if path is None or not os.access(path, os.X_OK):
            print(f"chaos: {flag} {path or '(missing)'}: no program to run there", file=sys.stderr)
            return 2
    outcomes = run_schedules(args)
    bad = [o for o in outcomes if o.violations]
    times = [o.recovered_s for o in outcomes if o.recovered_s is not None]
    print(f"chaos: {len(outcomes)} schedules, {len(bad)} violated"
          + (f", trained again after the last fault in median {statistics.median(times):.2f} s, "
             f"max {max(times):.2f} s" if times else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
