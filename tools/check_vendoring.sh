#!/usr/bin/env bash
# The single header as a vendoring user takes it: single_include/elastic.hpp alone in a fresh
# directory, the one-file launcher of docs/building.md ("Vendoring the single header") and the
# compile line given there, run exactly as written (read from the document, so the two cannot
# drift apart). The program must link and answer --version.
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
# The program of the document's section, byte for byte.
sed -n '/^<!-- vendoring main.cpp -->$/,/^```$/p' docs/building.md | sed '1,2d;$d' >"$work/main.cpp"
[[ -s $work/main.cpp ]] || { echo "check_vendoring: no main.cpp in docs/building.md" >&2; exit 1; }
cd "$work"
echo "check_vendoring: $line"
eval "$line"
out=$(./main --version)
[[ $out == "main (elastic) "* ]] || { echo "check_vendoring: ./main --version printed '$out'" >&2; exit 1; }
echo "check_vendoring: $out"
