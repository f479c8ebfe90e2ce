#!/usr/bin/env bash
# Check that every C++ file of the tree follows .clang-format (CI's header stage runs this).
#   tools/check_format.sh          # list the files clang-format would change; exit 1 if any
#   tools/check_format.sh --fix    # reformat them in place
# single_include/elastic.hpp is not checked: it is generated from include/ (tools/amalgamate.py).
# CLANG_FORMAT names another binary; the style is written for clang-format 14, and other
# versions lay out some constructs differently.
set -euo pipefail
cd "$(dirname "$0")/.."
clang_format=${CLANG_FORMAT:-clang-format-14}

fix=0
case ${1:-} in
  --fix) fix=1 ;;
  "") ;;
  *) echo "usage: tools/check_format.sh [--fix]" >&2; exit 2 ;;
esac

if ! command -v "$clang_format" >/dev/null; then
  echo "check_format: $clang_format not found (Debian: apt-get install clang-format-14," \
       "or tools/install-deps.sh test)" >&2
  exit 1
fi

mapfile -t files < <(find include examples tests src bench fuzz -type f \
  \( -name '*.hpp' -o -name '*.cpp' -o -name '*.h' -o -name '*.cc' -o -name '*.ipp' \) 2>/dev/null | sort)

if ((fix)); then
  printf '%s\0' "${files[@]}" | xargs -0 -n 32 "$clang_format" -i --style=file
  echo "check_format: formatted ${#files[@]} files; regenerate the single header with" \
       "python3 tools/amalgamate.py if include/ changed"
  exit 0
fi

bad=()
for f in "${files[@]}"; do
  "$clang_format" --dry-run --Werror --style=file "$f" >/dev/null 2>&1 || bad+=("$f")
done
if ((${#bad[@]})); then
  echo "check_format: ${#bad[@]} of ${#files[@]} files do not follow .clang-format:" >&2
  printf '  %s\n' "${bad[@]}" >&2
  if ((${#bad[@]} <= 8)); then
    echo "fix them with: $clang_format -i ${bad[*]}" >&2
  else
    echo "fix them with: tools/check_format.sh --fix" >&2
  fi
  echo "then: python3 tools/amalgamate.py   (if a header under include/ changed)" >&2
  exit 1
fi
echo "check_format: ${#files[@]} files follow .clang-format"
