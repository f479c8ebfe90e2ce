#!/usr/bin/env bash
# What an idle agent costs: CPU time and wake-ups of `elasticrun --standalone` with workers that
# sleep, over windows of 10 s once they run (the scheduler's own counters, to the nanosecond).
#
#   bash bench/agent/idle_agent.sh [ELASTICRUN] [WORKERS] [WINDOWS]
#
# ELASTICRUN defaults to build/rel/bin/elasticrun, WORKERS to 8, WINDOWS to 3.
set -euo pipefail
bin=${1:-build/rel/bin/elasticrun}
workers=${2:-8}
windows=${3:-3}
out=$(mktemp -d)
trap 'kill "$agent" 2>/dev/null || true; wait "$agent" 2>/dev/null || true; rm -rf "$out"' EXIT
"$bin" --standalone --nproc-per-node="$workers" /bin/sleep 3600 >"$out/log" 2>&1 &
agent=$!
sleep 3  # the workers start
cpu() { awk '{s += $1} END {print s}' /proc/"$agent"/task/*/schedstat; }
wakeups() { awk '/^voluntary_ctxt_switches/ {s += $2} END {print s}' /proc/"$agent"/task/*/status; }
for w in $(seq "$windows"); do
  c0=$(cpu); s0=$(wakeups)
  sleep 10
  c1=$(cpu); s1=$(wakeups)
  printf 'window %d: %.2f ms of CPU, %d wake-ups in 10 s\n' "$w" "$(echo "($c1 - $c0) / 1000000" | bc -l)" $((s1 - s0))
done
