#!/usr/bin/env bash
# Runs docs/quickstart.md as a reader would: in a fresh directory holding a copy of this
# repository named elastic, with HOME pointing inside it, every step of the page in order.
# The page marks its steps with HTML comments before a fenced block:
#   <!-- quickstart packages -->       every package the apt-get line names must be installed
#                                      (checked with dpkg-query: the check never installs)
#   <!-- quickstart file: PATH -->     the block is written to PATH
#   <!-- quickstart run -->            the block runs, line by line, in one bash (set -euo pipefail)
#                                      that every run block shares, so exports carry over
#   <!-- quickstart run together -->   each line of the block is started at once, as in its own
#                                      terminal; all must exit 0
#   <!-- quickstart output -->         each line of the block must begin some line that the
#                                      run block before it printed
# Fails on a step that fails, an output line that is missing, or a page with no steps.
#
#     tools/check_quickstart.sh [--keep]    # --keep leaves the work directory and prints it
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
page=$root/docs/quickstart.md
keep=0
[[ ${1:-} == --keep ]] && keep=1

work=$(mktemp -d /tmp/elastic-quickstart.XXXXXX)
cleanup() {
    if ((keep)); then echo "check_quickstart: kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
fail() { echo "check_quickstart: $*" >&2; exit 1; }

# The repository as a reader has it: the tracked and untracked files, no build trees.
mkdir "$work/elastic" "$work/home"
if git -C "$root" rev-parse --git-dir >/dev/null 2>&1; then
    git -C "$root" ls-files -z --cached --others --exclude-standard \
        | (cd "$root" && xargs -0 cp --parents -t "$work/elastic" 2>/dev/null || true)
else
    tar -C "$root" --exclude=./build -cf - . | tar -C "$work/elastic" -xf -
fi
[[ -f $work/elastic/CMakeLists.txt ]] || fail "could not copy the repository"

# Split the page into steps: each marker and the fenced block after it.
python3 - "$page" "$work/steps" <<'EOF'
import pathlib, re, sys
page, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
out.mkdir()
lines = page.read_text().splitlines()
i, n = 0, 0
while i < len(lines):
    m = re.fullmatch(r"<!-- quickstart (packages|run together|run|output|file: (\S+)) -->", lines[i])
    i += 1
    if not m:
        continue
    if i >= len(lines) or not lines[i].startswith("```"):
        sys.exit(f"check_quickstart: line {i}: a quickstart marker not followed by a fenced block")
    end = i + 1
    while end < len(lines) and lines[end] != "```":
        end += 1
    if end == len(lines):
        sys.exit(f"check_quickstart: line {i + 1}: an unclosed fenced block")
    kind = "file" if m.group(2) else m.group(1).replace(" ", "_")
    n += 1
    (out / f"{n:03d}.{kind}").write_text("\n".join(lines[i + 1:end]) + "\n")
    if m.group(2):
        (out / f"{n:03d}.path").write_text(m.group(2))
    i = end + 1
if n == 0:
    sys.exit("check_quickstart: no quickstart steps in the page")
EOF

# One bash for every run block, so the page's exports carry over; each block's output is kept
# apart for the output blocks that follow it.
script=$work/script.sh
{
    echo "set -euo pipefail"
    # Whatever a step left running (a node of a failed two-node step) dies with the script.
    echo 'trap '"'"'jobs=$(jobs -p); [[ -z $jobs ]] || { kill $jobs 2>/dev/null; wait; }'"'"' EXIT'
    echo "export HOME='$work/home'"
    echo "cd '$work'"
} >"$script"
runs=0
last_out=""
for step in "$work"/steps/*.*; do
    [[ $step == *.path ]] && continue
    kind=${step##*.}
    case $kind in
    packages)
        read -r -a words < <(grep -m1 'apt-get install' "$step" || true)
        ((${#words[@]})) || fail "the packages step names no apt-get install line"
        missing=()
        for w in "${words[@]}"; do
            [[ $w == apt-get || $w == install || $w == -* || $w == sudo ]] && continue
            dpkg-query -W -f='${Status}' "$w" 2>/dev/null | grep -q "install ok installed" || missing+=("$w")
        done
        ((${#missing[@]} == 0)) || fail "packages the page lists are not installed: ${missing[*]}"
        ;;
    file)
        path=$(cat "${step%.file}.path")
        printf 'mkdir -p "%s"\ncat >"%s" <<'"'"'QUICKSTART_EOF'"'"'\n' "$(dirname "$path")" "$path" >>"$script"
        cat "$step" >>"$script"
        echo "QUICKSTART_EOF" >>"$script"
        ;;
    run)
        runs=$((runs + 1))
        last_out=$work/out.$runs
        echo "exec >'$last_out' 2>&1" >>"$script"
        while IFS= read -r line; do
            [[ -n $line ]] && printf 'echo %q\n%s\n' "+ $line" "$line" >>"$script"
        done <"$step"
        echo "exec >>'$work/out.all' 2>&1" >>"$script"
        ;;
    run_together)
        runs=$((runs + 1))
        last_out=$work/out.$runs
        echo "exec >'$last_out' 2>&1" >>"$script"
        echo "pids=()" >>"$script"
        while IFS= read -r line; do
            [[ -n $line ]] && printf 'echo %q\n( %s ) & pids+=($!)\n' "+ $line &" "$line" >>"$script"
        done <"$step"
        # The first to fail stops the others, which would otherwise wait for it to join.
        echo 'for p in "${pids[@]}"; do wait -n || { kill "${pids[@]}" 2>/dev/null; exit 1; }; done' >>"$script"
        echo "exec >>'$work/out.all' 2>&1" >>"$script"
        ;;
    output)
        [[ -n $last_out ]] || fail "an output block before any run block"
        while IFS= read -r want; do
            [[ -z $want ]] && continue
            printf 'awk -v w=%q '"'"'index($0, w) == 1 { f = 1 } END { exit !f }'"'"' %q || { echo "check_quickstart: no line begins with: "%q; exit 1; }\n' \
                "$want" "$last_out" "$want" >>"$script"
        done <"$step"
        ;;
    esac
done
((runs > 0)) || fail "the page runs nothing"
# What the page installed is what it ran: the launcher on PATH is the one under $HOME/.local,
# and the trainer's build found the package there (not one of the system's).
cat >>"$script" <<'EOF'
[[ $(command -v elasticrun) == "$HOME/.local/bin/elasticrun" ]] || {
    echo "check_quickstart: elasticrun on PATH is $(command -v elasticrun), not the installed one"; exit 1; }
[[ -x $HOME/.local/bin/elastic-store && -f $HOME/.local/lib/cmake/elastic/elasticConfig.cmake ]] || {
    echo "check_quickstart: the install has no bin/elastic-store or lib/cmake/elastic/"; exit 1; }
found=0
while IFS= read -r cache; do
    grep -qx "elastic_DIR:PATH=$HOME/.local/lib/cmake/elastic" "$cache" || {
        echo "check_quickstart: $cache found elastic elsewhere: $(grep '^elastic_DIR' "$cache")"; exit 1; }
    found=1
done < <(find . -path ./elastic -prune -o -name CMakeCache.txt -print)
((found)) || { echo "check_quickstart: no project of the page used find_package(elastic)"; exit 1; }
EOF

echo "check_quickstart: running docs/quickstart.md in $work"
rc=0
bash "$script" >"$work/out.all" 2>&1 || rc=$?
if ((rc != 0)); then
    echo "check_quickstart: a step failed (exit $rc); its output:" >&2
    cat "$work"/out.* >&2
    exit 1
fi
for out in "$work"/out.[0-9]*; do tail -n 8 "$out"; done
echo "check_quickstart: every step of docs/quickstart.md passed"
