#!/usr/bin/env python3
"""What the watchdog costs, measured (docs/watchdog.md, "Costs").

    python3 bench/watchdog/bench_watchdog.py --bin build/bench [--seconds 10]

1. ns per heartbeat(), progress() and section, watched and not (watchdog-bench calls);
2. the agent's CPU while 16 workers send a heartbeat every millisecond, with and without
   --watchdog (utime+stime of elasticrun from /proc, over the run's wall time);
3. detection latency: from a worker's last heartbeat to the agent's "hung:" line, minus the
   limit, for several limits (watchdog-bench stall under --watchdog=beat=L,dump=0).
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import threading
import time


def calls(bench: str) -> None:
    for env in ({}, {"BENCH_NOT_WATCHED": "1"}):
        out = subprocess.run([bench, "calls"], env={**os.environ, **env}, check=True, capture_output=True, text=True)
        print(out.stdout.strip())


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def agent_cpu(elasticrun: str, bench: str, seconds: int, watchdog: bool) -> float:
    args = [elasticrun, "--standalone", "--nproc-per-node=16"]
    if watchdog:
        args.append("--watchdog=beat=1s")
    args += [bench, "worker", "1000", str(seconds)]
    start = time.monotonic()
    p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    last = 0.0
    while p.poll() is None:
        try:
            last = cpu_seconds(p.pid)
        except (OSError, IndexError):
            pass
        time.sleep(0.2)
    wall = time.monotonic() - start
    if p.returncode != 0:
        sys.exit(f"elasticrun exited {p.returncode}")
    return 100.0 * last / wall


def latency(elasticrun: str, bench: str, limit_ms: int) -> float:
    args = [elasticrun, "--standalone", "--nproc-per-node=1", f"--watchdog=beat={limit_ms}ms,dump=0", bench, "stall",
            "50"]
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stalled: list[int] = []

    def read_out() -> None:
        assert p.stdout is not None
        for line in p.stdout:
            m = re.search(r"stalled (\d+)", line)
            if m:
                stalled.append(int(m.group(1)))

    t = threading.Thread(target=read_out)
    t.start()
    found = None
    assert p.stderr is not None
    for line in p.stderr:
        if "hung:" in line and found is None:
            found = time.time_ns()
    p.wait()
    t.join()
    if found is None or not stalled:
        sys.exit("no hang found, or no stall printed")
    return (found - stalled[0]) / 1e6 - limit_ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bin", default="build/bench", help="where watchdog-bench and elasticrun are")
    parser.add_argument("--elasticrun", default=None)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--runs", type=int, default=5)
    a = parser.parse_args()
    bench = os.path.join(a.bin, "watchdog-bench")
    elasticrun = a.elasticrun or os.path.join(a.bin, "elasticrun")
    print("## per call")
    calls(bench)
    print(f"\n## agent CPU, 16 workers, a heartbeat every 1 ms for {a.seconds} s")
    for watchdog in (False, True):
        pct = agent_cpu(elasticrun, bench, a.seconds, watchdog)
        print(f"{'with --watchdog=beat=1s' if watchdog else 'without --watchdog':28} {pct:6.2f} % of one core")
    print(f"\n## detection latency beyond the limit (median of {a.runs}, ms)")
    for limit in (100, 1000, 5000):
        values = [latency(elasticrun, bench, limit) for _ in range(a.runs)]
        print(f"beat={limit}ms{'':8} median {statistics.median(values):7.1f}   max {max(values):7.1f}")


if __name__ == "__main__":
    main()
