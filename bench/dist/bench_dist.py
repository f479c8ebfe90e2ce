#!/usr/bin/env python3
"""Latency of elastic::dist's collectives beside PyTorch's gloo ProcessGroup, on one store.

    cmake -S bench -B build/bench -G Ninja -DCMAKE_BUILD_TYPE=Release && cmake --build build/bench
    python3 bench/dist/bench_dist.py [--worlds 2,4,8,16,32,64] [--gloo-worlds 2,4,8,16,32,64]
                                     [--iterations 100] [--bench build/bench/dist-bench]

For each world size it starts our TCP store (`dist-bench serve`), then that many processes of
`dist-bench run` (elastic::dist through the store), then as many Python processes that run the same
operations through torch.distributed's gloo backend, rendezvousing on the same store (gloo's own
TCP pairs carry the data). Rank 0 of each reports the mean time per operation of a back-to-back
loop. Prints a Markdown table, microseconds per operation, ours / gloo.

Each PyTorch process takes about 240 MB: 64 of them need 15 GB (--gloo-worlds to leave some out).
"""
from __future__ import annotations

import argparse
import os
import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]

GLOO_WORKER = r'''
import os, sys, time, datetime
import torch, torch.distributed as dist
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, False,
                      datetime.timedelta(seconds=300))
dist.init_process_group("gloo", store=dist.PrefixStore("gloo-bench", store), rank=rank, world_size=world)
iterations = int(sys.argv[1])
big = max(3, iterations // 10)
kib = torch.full((1024,), 7, dtype=torch.uint8)
mib = torch.full((1 << 20,), 7, dtype=torch.uint8)
gathered = [torch.empty_like(kib) for _ in range(world)]
scalar = torch.tensor([1.0 * rank], dtype=torch.float64)
floats = torch.ones(1 << 18, dtype=torch.float32)

def per_operation_us(n, op):
    for _ in range(3):
        op()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(n):
        op()
    dist.barrier()
    return (time.perf_counter() - t0) * 1e6 / n

rows = [
    ("barrier", per_operation_us(iterations, lambda: dist.barrier())),
    ("broadcast_1KiB", per_operation_us(iterations, lambda: dist.broadcast(kib, 0))),
    ("broadcast_1MiB", per_operation_us(big, lambda: dist.broadcast(mib, 0))),
    ("all_gather_1KiB", per_operation_us(iterations, lambda: dist.all_gather(gathered, kib))),
    ("all_reduce_scalar", per_operation_us(iterations, lambda: dist.all_reduce(scalar))),
    ("all_reduce_1MiB", per_operation_us(big, lambda: dist.all_reduce(floats))),
]
if rank == 0:
    for name, us in rows:
        print(f"{name} {us:.1f}", flush=True)
dist.destroy_process_group()
'''

OPERATIONS = ["barrier", "broadcast_1KiB", "broadcast_1MiB", "all_gather_1KiB", "all_reduce_scalar",
              "all_reduce_1MiB"]


def run_world(command: list[str], world: int, port: int) -> dict[str, float]:
    """Starts `world` ranks of `command`; returns rank 0's figures."""
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                   LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   TORCHELASTIC_RESTART_COUNT="0", OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE if rank == 0 else subprocess.DEVNULL,
                                      text=True))
    out, _ = procs[0].communicate()
    codes = [procs[0].returncode] + [p.wait() for p in procs[1:]]
    if any(codes):
        sys.exit(f"bench_dist: {' '.join(command[:2])} with {world} ranks: exit codes {codes}")
    figures = {}
    for line in out.splitlines():
        name, us = line.split()
        figures[name] = float(us)
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worlds", default="2,4,8,16,32,64")
    parser.add_argument("--gloo-worlds", default="2,4,8,16,32,64")
    parser.add_argument("--iterations", type=int, default=100)
    parser.add_argument("--bench", default=str(ROOT / "build/bench/dist-bench"))
    parser.add_argument("--python", default="/usr/bin/python3", help="an interpreter that imports torch")
    args = parser.parse_args()
    worlds = [int(w) for w in args.worlds.split(",")]
    gloo_worlds = {int(w) for w in args.gloo_worlds.split(",") if w}
    if not os.access(args.bench, os.X_OK):
        sys.exit(f"bench_dist: no {args.bench}; build it: cmake -S bench -B build/bench -G Ninja "
                 "-DCMAKE_BUILD_TYPE=Release && cmake --build build/bench")
    results: dict[tuple[str, int], tuple[float, float | None]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        gloo_script = pathlib.Path(tmp) / "gloo_worker.py"
        gloo_script.write_text(GLOO_WORKER)
        for world in worlds:
            server = subprocess.Popen([args.bench, "serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            try:
                port = int(server.stdout.readline().split()[1])
                ours = run_world([args.bench, "run", str(args.iterations)], world, port)
                gloo = (run_world([args.python, str(gloo_script), str(args.iterations)], world, port)
                        if world in gloo_worlds else {})
            finally:
                server.stdin.close()
                server.wait()
            for op in OPERATIONS:
                results[(op, world)] = (ours[op], gloo.get(op))
            print(f"bench_dist: {world} ranks done", file=sys.stderr, flush=True)
    print(f"`python3 bench/dist/bench_dist.py --iterations {args.iterations}`: µs per operation, "
          "elastic::dist / gloo (— : not run)\n")
    print("| operation | " + " | ".join(f"{w} ranks" for w in worlds) + " |")
    print("|---|" + "---:|" * len(worlds))
    for op in OPERATIONS:
        cells = []
        for w in worlds:
            ours, gloo = results[(op, w)]
            cells.append(f"{ours:,.0f} / " + ("—" if gloo is None else f"{gloo:,.0f}"))
        print(f"| {op} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
