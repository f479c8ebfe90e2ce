#!/usr/bin/env python3
"""Which of elastic's headers the single header's compile time goes to.

    python3 bench/compile_profile.py [--compiler g++] [--separate] [--top 25]

Compiles, with `-std=c++20 -O0 -c` like bench/compile_time.py, first a file that includes only
the third-party and standard headers the single header includes (Asio, fmt, nlohmann/json,
OpenSSL; CLI11 too unless --separate), then that file followed by single_include/elastic.hpp cut
after each of its files in turn. Each file is charged the user CPU time its cut adds to the
previous one: its own parse, and whatever its code makes the compiler instantiate or emit (a
template is charged to the file whose code uses it first). --separate defines
ELASTIC_SEPARATE_COMPILATION. About a hundred compiles: minutes, and figures worth reading only on
a quiet machine; a difference under 0.1 s is noise.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import re
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
SINGLE = ROOT / "single_include" / "elastic.hpp"


def user_cpu(compiler: str, source: pathlib.Path) -> float:
    """User CPU seconds of one compile (its own rusage, from wait4)."""
    child = subprocess.Popen([compiler, "-std=c++20", "-O0", "-DASIO_STANDALONE", "-DASIO_HAS_CO_AWAIT=1", "-c",
                              str(source), "-o", os.devnull], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(child.pid, 0)
    errors = child.stderr.read().decode(errors="replace") if child.stderr else ""
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"compile_profile: {source.name} does not compile:\n{errors[:4000]}")
    return usage.ru_utime


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--compiler", default="g++")
    parser.add_argument("--separate", action="store_true", help="define ELASTIC_SEPARATE_COMPILATION")
    parser.add_argument("--top", type=int, default=25, help="how many of the costliest files to list")
    args = parser.parse_args()

    lines = SINGLE.read_text().splitlines(keepends=True)
    external = sorted({line.strip() for line in lines if re.match(r"#include <", line)})
    if args.separate:
        external = [line for line in external if not line.startswith("#include <CLI/")]
    head = "".join(line + "\n" for line in external)
    if args.separate:
        head = "#define ELASTIC_SEPARATE_COMPILATION 1\n" + head
    cuts = [(i + 1, m.group(1)) for i, line in enumerate(lines) if (m := re.match(r"// ---- end (\S+) ----", line))]

    with tempfile.TemporaryDirectory() as tmp:
        source = pathlib.Path(tmp) / "cut.cpp"
        source.write_text(head + "int main() { return 0; }\n")
        base = user_cpu(args.compiler, source)
        costs = []
        previous = base
        for count, (end, name) in enumerate(cuts, 1):
            source.write_text(head + "".join(lines[:end]) + "\nint main() { return 0; }\n")
            seconds = user_cpu(args.compiler, source)
            costs.append((seconds - previous, name))
            previous = seconds
            print(f"\r{count}/{len(cuts)} {name:<60}", end="", file=sys.stderr, flush=True)
        print(file=sys.stderr)

    mode = "separate compilation" if args.separate else "header-only"
    print(f"single header, {mode}, {args.compiler} -O0: {previous:.2f} s user CPU in all")
    print(f"| file | user CPU s |\n|---|---:|\n| third-party and standard headers | {base:.2f} |")
    for seconds, name in sorted(costs, reverse=True)[:args.top]:
        print(f"| {name} | {seconds:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
