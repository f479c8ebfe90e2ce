#!/usr/bin/env bash
# The single header as a vendoring user takes it: single_include/elastic.hpp alone in a fresh
# directory, the launcher (main.cpp) and the worker (worker.cpp) of docs/building.md
# ("Vendoring the single header") and the compile line given there, run exactly as written for
# the launcher and with the worker's file and name for the worker (read from the document, so the
# two cannot drift apart). The launcher must answer --version, and run the worker on two ranks
# that agree on their sum. The worker defines ELASTIC_NO_LAUNCHER: no CLI11 header may reach its
# compile (the preprocessor's dependency list, with the line's flags, says which headers do).
#
#     tools/check_vendoring.sh [CXX]     # CXX replaces the line's g++ (default: the line as is)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
line=$(grep -m1 -E '^    g\+\+ -std=c\+\+20 -Ivendored ' docs/building.md | sed 's/^    //')
[[ -n $line ]] || { echo "check_vendoring: no compile line in docs/building.md" >&2; exit 1; }
if [[ $# -ge 1 ]]; then line="$1${line#g++}"; fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/vendored"
cp single_include/elastic.hpp "$work/vendored/"
# The programs of the document's section, byte for byte.
extract() {  # extract NAME: the fenced block after "<!-- vendoring NAME -->"
    sed -n "/^<!-- vendoring $1 -->\$/,/^\`\`\`\$/p" docs/building.md | sed '1,2d;$d' >"$work/$1"
    [[ -s $work/$1 ]] || { echo "check_vendoring: no $1 in docs/building.md" >&2; exit 1; }
}
extract main.cpp
extract worker.cpp
worker_line=${line/main.cpp -o main/worker.cpp -o worker}
[[ $worker_line != "$line" ]] || { echo "check_vendoring: the line has no 'main.cpp -o main'" >&2; exit 1; }
cd "$work"
echo "check_vendoring: $line"
echo "check_vendoring: $worker_line"
# The two compile at once (two cores, one file each).
eval "$line" & launcher_pid=$!
eval "$worker_line" & worker_pid=$!
rc=0
wait "$launcher_pid" || rc=1
wait "$worker_pid" || rc=1
((rc == 0)) || { echo "check_vendoring: a compile line failed" >&2; exit 1; }
grep -q '^#define ELASTIC_NO_LAUNCHER' worker.cpp \
    || { echo "check_vendoring: the worker does not define ELASTIC_NO_LAUNCHER" >&2; exit 1; }
# The line up to its source file, then -M: every header the worker's compile opens.
deps=$(eval "${worker_line%% worker.cpp *} -M worker.cpp")
if grep -q '/CLI/' <<<"$deps"; then
    echo "check_vendoring: CLI11 reaches a worker that defines ELASTIC_NO_LAUNCHER:" >&2
    grep -o '[^ ]*/CLI/[^ ]*' <<<"$deps" | head -5 >&2
    exit 1
fi
grep -q 'elastic\.hpp' <<<"$deps" || { echo "check_vendoring: -M listed no elastic.hpp" >&2; exit 1; }
echo "check_vendoring: no CLI11 header reaches the worker"
out=$(./main --version)
[[ $out == "main (elastic) "* ]] || { echo "check_vendoring: ./main --version printed '$out'" >&2; exit 1; }
echo "check_vendoring: $out"
out=$(./main --standalone --nproc-per-node=2 ./worker 2>&1) || {
    echo "check_vendoring: ./main --standalone --nproc-per-node=2 ./worker failed:" >&2
    echo "$out" >&2
    exit 1
}
for rank in 0 1; do
    grep -qx "worker $rank of 2: sum 3" <<<"$out" || {
        echo "check_vendoring: no 'worker $rank of 2: sum 3' in:" >&2
        echo "$out" >&2
        exit 1
    }
done
echo "check_vendoring: the launcher ran the worker on 2 ranks"
