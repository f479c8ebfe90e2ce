#!/usr/bin/env bash
# The whole test suite, every stage CI runs (README's second command; .ci/run calls it).
#   1. every C++ file follows .clang-format (tools/check_format.sh),
#      single_include/elastic.hpp matches what tools/amalgamate.py makes now, no header
#      includes one from a layer above its own (tools/check_layers.py), every docs/ link and path
#      resolves (tools/check_docs.py), and the single header
#      alone builds a launcher with docs/building.md's compile line (tools/check_vendoring.sh),
#      and the compile-time budgets that are met hold (bench/compile_time.py --check)
#   2. g++, -Werror with every warning, the multi-header tree: header checks, tests, examples,
#      docs/quickstart.md run step by step (tools/check_quickstart.sh), add_subdirectory and
#      single-header consumers
#   3. clang++, ASan+UBSan, the suite built against single_include/ with include/ off the path,
#      examples and test programs in separate compilation mode (the gcc stage builds them
#      header-only)
#   4. clang++, ThreadSanitizer, the test files tagged "concurrent"
#   5. clang++ libFuzzer targets, each run for ELASTIC_FUZZ_SECONDS (default 30), one per core at a time
# ELASTIC_STAGES="gcc asan" runs a subset; ELASTIC_JOBS sets the build's parallelism (default
# nproc) and ELASTIC_TEST_JOBS ctest's (default twice that); build trees live under build/ci-*.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
stages=${ELASTIC_STAGES:-"header gcc asan tsan fuzz"}
jobs=${ELASTIC_JOBS:-$(nproc)}
# Tests mostly wait on processes, sockets and timers: ctest at -j nproc leaves half the CPU idle.
test_jobs=${ELASTIC_TEST_JOBS:-$((2 * jobs))}
fuzz_seconds=${ELASTIC_FUZZ_SECONDS:-30}

t_all=$(date +%s)
declare -a report=()
stage() {  # stage NAME COMMAND...: run, time and record one stage
  local name=$1; shift
  echo "==== stage $name"
  local t0=$(date +%s)
  "$@"
  local dt=$(( $(date +%s) - t0 ))
  report+=("$(printf '%-8s %5ds' "$name" "$dt")")
  echo "==== stage $name: passed in ${dt}s"
}
has() { [[ " $stages " == *" $1 "* ]]; }

# Debug info is most of what a -O0 compile emits (the agent's file: an 83 MB object). A failure
# here is read from the test's output and the sanitizers' stack traces, which need file and line,
# not variables: the gcc stage builds without debug info, the clang stages with line tables only
# (up to a third off each compile; docs/building.md, "Keeping CI under its budget").
no_debug_info=-g0
line_tables=-gline-tables-only
configure() {  # configure DIR DEBUG_FLAGS ARGS...
  local dir=$1 debug=$2; shift 2
  cmake -S "$root" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="$debug" \
    "$@" >"$dir.configure.log" 2>&1 || { cat "$dir.configure.log"; return 1; }
}
passed_total=0
failed_total=0
run_ctest() {  # run_ctest DIR [ARGS...]: run, and add its counts to the run's totals
  local dir=$1; shift
  local rc=0
  (cd "$dir" && ctest -j "$test_jobs" --output-on-failure --timeout 600 "$@") 2>&1 \
    | tee "$dir/ctest.log" || rc=$?
  local line
  line=$(grep -E "tests passed, [0-9]+ tests? failed out of [0-9]+" "$dir/ctest.log" | tail -n 1)
  if [[ $line =~ ([0-9]+)\ tests?\ failed\ out\ of\ ([0-9]+) ]]; then
    failed_total=$((failed_total + BASH_REMATCH[1]))
    passed_total=$((passed_total + BASH_REMATCH[2] - BASH_REMATCH[1]))
  fi
  return $rc
}

stage_deps() { tools/install-deps.sh test; }

stage_header() {
  tools/check_format.sh
  python3 tools/amalgamate.py --check
  python3 tools/check_layers.py
  python3 tools/check_docs.py
  tools/check_vendoring.sh
  python3 bench/compile_time.py --check --checked-only --runs 3
}

stage_gcc() {
  local dir=build/ci-gcc
  mkdir -p build
  configure $dir $no_debug_info -DCMAKE_CXX_COMPILER=g++ -DELASTIC_CONSUMER_TESTS=ON -DELASTIC_LIBTORCH_EXAMPLE=ON
  cmake --build $dir -j "$jobs"
  run_ctest $dir
}

stage_asan() {
  local dir=build/ci-asan
  mkdir -p build
  configure $dir $line_tables -DCMAKE_CXX_COMPILER=clang++ -DELASTIC_SINGLE_HEADER=ON \
    -DELASTIC_HEADER_CHECKS=OFF -DELASTIC_SANITIZE=address,undefined -DELASTIC_PROGRAMS_COMPILED=ON
  cmake --build $dir -j "$jobs"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:strict_string_checks=1 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 run_ctest $dir
}

stage_tsan() {
  local dir=build/ci-tsan
  mkdir -p build
  configure $dir $line_tables -DCMAKE_CXX_COMPILER=clang++ -DELASTIC_HEADER_CHECKS=OFF \
    -DELASTIC_BUILD_EXAMPLES=OFF -DELASTIC_BUILD_PROGRAMS=OFF -DELASTIC_SANITIZE=thread \
    -DELASTIC_TEST_TAG=concurrent -DELASTIC_PROGRAMS_COMPILED=ON
  if [[ ! -f $dir/build.ninja ]] || ! grep -q elastic_tests $dir/build.ninja; then
    echo "no test file is tagged concurrent"; return 0
  fi
  cmake --build $dir -j "$jobs"
  TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 run_ctest $dir
}

stage_fuzz() {
  local dir=build/ci-fuzz
  if ! compgen -G "fuzz/fuzz_*.cpp" >/dev/null; then echo "no fuzz targets"; return 0; fi
  mkdir -p build
  configure $dir $line_tables -DCMAKE_CXX_COMPILER=clang++ -DELASTIC_BUILD_TESTS=OFF -DELASTIC_BUILD_PROGRAMS=OFF \
    -DELASTIC_BUILD_EXAMPLES=OFF -DELASTIC_HEADER_CHECKS=OFF -DELASTIC_FUZZ=ON \
    -DELASTIC_SANITIZE=address,undefined -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 $line_tables -DNDEBUG"
  cmake --build $dir -j "$jobs"
  # One fuzzer per core at a time: each is a single process bound by its own time limit.
  local bins=("$dir"/fuzz/fuzz_*) i bin pid
  for ((i = 0; i < ${#bins[@]}; i += jobs)); do
    local pids=() rc=0
    for bin in "${bins[@]:i:jobs}"; do
      fuzz_one "$dir" "$bin" & pids+=($!)
    done
    for pid in "${pids[@]}"; do
      wait "$pid" || rc=1
    done
    ((rc == 0)) || return 1
  done
}

fuzz_one() {  # fuzz_one DIR BIN: run one fuzzer for fuzz_seconds, seeded from fuzz/corpus/NAME
  local dir=$1 bin=$2
  local name=${bin##*/fuzz_}
  local corpus=$dir/corpus/$name
  mkdir -p "$corpus"
  local seeds=()
  [[ -d fuzz/corpus/$name ]] && seeds=(fuzz/corpus/$name)
  echo "fuzzing $name for ${fuzz_seconds}s"
  if ! "$bin" -max_total_time="$fuzz_seconds" -print_final_stats=1 "$corpus" "${seeds[@]}" \
      2>"$dir/$name.log"; then
    echo "fuzzer $name failed:"; tail -60 "$dir/$name.log"; return 1
  fi
  echo "$name: $(grep -E "stat::number_of_executed_units" "$dir/$name.log" || true)"
}

stage deps stage_deps
for s in header gcc asan tsan fuzz; do
  if has $s; then stage $s stage_$s; fi
done

echo
echo "stage times:"
printf '  %s\n' "${report[@]}"
echo "all stages passed in $(( $(date +%s) - t_all ))s"
echo "tests: ${passed_total} passed, ${failed_total} failed"
