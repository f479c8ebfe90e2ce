#!/usr/bin/env python3
"""Chaos runs at length: the harness of tests/chaos/chaos.py (CI runs three of its schedules) for
as many schedules as asked, and the figures docs/rendezvous.md reports.

  /usr/bin/python3 bench/chaos/bench_chaos.py --build build/dev [--schedules 1000] [--seed 1]
        [--agents 8] [--duration 30] [--workdir DIR] [--netns] [--no-list]

Prints one line per schedule as it ends (a failing one with the command that replays it), then:
schedules run, faults injected by kind, invariant violations (the goal is 0) with their seeds,
how many schedules trained again and how many ended with every agent exited (too few nodes left
at the end of the faults), and the time from the last fault to
the first step of a group that trained on after it (median, 90th percentile, max).
docs/rendezvous.md ("Benchmark: chaos") has the measured table.
"""
import argparse
import collections
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "chaos"))

import chaos  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build", required=True, help="a build tree with the test programs")
    p.add_argument("--schedules", type=int, default=1000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--agents", type=int, default=8)
    p.add_argument("--duration", type=float, default=30)
    p.add_argument("--workdir")
    p.add_argument("--netns", action="store_true", help="agents on machines of their own, with link cuts (root)")
    p.add_argument("--no-list", action="store_true",
                   help="the first endpoint only, no --rdzv-endpoint list (the known limit without one)")
    args = p.parse_args()
    programs = os.path.join(args.build, "test-programs")
    run_args = chaos.parser().parse_args([
        "--elasticrun", os.path.join(programs, "agent-elasticrun"),
        "--worker", os.path.join(programs, "chaos-worker"),
        "--schedules", str(args.schedules), "--seed", str(args.seed), "--agents", str(args.agents),
        "--duration", str(args.duration)] + (["--workdir", args.workdir] if args.workdir else [])
        + (["--netns"] if args.netns else []) + (["--no-list"] if args.no_list else []))
    run_args.ip = None
    if args.netns:
        run_args.ip, why = chaos.netns_usable()
        if run_args.ip is None:
            print(f"bench_chaos: --netns: {why}", file=sys.stderr)
            return 2
    for path in (run_args.elasticrun, run_args.worker):
        if not os.access(path, os.X_OK):
            print(f"bench_chaos: {path} is no program (build the tests first)", file=sys.stderr)
            return 2
    outcomes = chaos.run_schedules(run_args)
    kinds = collections.Counter(f.split()[0] for o in outcomes for f in o.faults)
    bad = [o for o in outcomes if o.violations]
    times = sorted(o.recovered_s for o in outcomes if o.recovered_s is not None)
    print()
    ended = sum(1 for o in outcomes if o.recovered_s is None)
    print("| schedules | agents | faults | violations | trained again | every agent ended | last fault → training, "
          "median | p90 | max |")
    print("|---|---|---|---|---|---|---|---|---|")
    p90 = times[min(len(times) - 1, int(0.9 * len(times)))] if times else None
    fmt = (lambda t: "-" if t is None else f"{t:.2f} s")
    print(f"| {len(outcomes)} | 3–{args.agents} | {sum(kinds.values())} "
          f"({', '.join(f'{k} {v}' for k, v in sorted(kinds.items()))}) | {len(bad)} | {len(times)} | {ended} | "
          f"{fmt(statistics.median(times) if times else None)} | {fmt(p90)} | {fmt(times[-1] if times else None)} |")
    for o in bad:
        print(f"violated: seed {o.seed}: {'; '.join(o.violations)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
