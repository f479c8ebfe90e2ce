#!/usr/bin/env python3
"""Which of elastic's headers the single header's compile time goes to.

    python3 bench/compile_profile.py [--compiler g++] [--separate] [--runs 1] [--top 25]

Compiles, with `-std=c++20 -O0 -c` like bench/compile_time.py, first a file that includes only
the third-party and standard headers the single header parses in the chosen mode (Asio, fmt,
OpenSSL, the standard library; nlohmann/json and CLI11 where the mode's preprocessor conditions
include them: a conditional include is hoisted only when the preprocessor, run once over the
whole single header, takes it), then that file followed by single_include/elastic.hpp cut after
each of its files in turn. Each file is charged the user CPU time its cut adds to the previous
one: its own parse, and whatever its code makes the compiler instantiate or emit (a template is
charged to the file whose code uses it first). --separate defines ELASTIC_SEPARATE_COMPILATION.
--runs N compiles each cut N times and keeps the smallest time, so that noise makes fewer
negative differences. About a hundred compiles per run: minutes, and figures worth reading only
on a quiet machine; a difference under 0.1 s is noise.
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
FLAGS = ["-std=c++20", "-O0", "-DASIO_STANDALONE", "-DASIO_HAS_CO_AWAIT=1"]
INCLUDE = re.compile(r"\s*#\s*include\s*<([^>]+)>")
OPENS = re.compile(r"\s*#\s*if")
CLOSES = re.compile(r"\s*#\s*endif")


def user_cpu(compiler: str, source: pathlib.Path, tmp: str) -> float:
    """User CPU seconds of one compile (its own rusage, from wait4)."""
    errors = pathlib.Path(tmp) / "stderr.txt"
    with open(errors, "w") as err:
        child = subprocess.Popen([compiler, *FLAGS, "-c", str(source), "-o", os.devnull],
                                 stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(child.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"compile_profile: {source.name} does not compile:\n{errors.read_text(errors='replace')[:4000]}")
    return usage.ru_utime


def best_of(runs: int, compiler: str, source: pathlib.Path, tmp: str) -> float:
    return min(user_cpu(compiler, source, tmp) for _ in range(max(1, runs)))


def parsed_headers(compiler: str, source: pathlib.Path) -> list[str]:
    """The paths of the headers the preprocessor opens for `source` (-H), conditions evaluated."""
    done = subprocess.run([compiler, *FLAGS, "-E", "-H", str(source), "-o", os.devnull],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, errors="replace")
    if done.returncode != 0:
        sys.exit(f"compile_profile: {source.name} does not preprocess:\n{done.stderr[:4000]}")
    return [m.group(1) for line in done.stderr.splitlines() if (m := re.match(r"\.+ (\S+)$", line))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--compiler", default="g++")
    parser.add_argument("--separate", action="store_true", help="define ELASTIC_SEPARATE_COMPILATION")
    parser.add_argument("--runs", type=int, default=1, help="compile each cut N times; the smallest counts")
    parser.add_argument("--top", type=int, default=25, help="how many of the costliest files to list")
    args = parser.parse_args()

    lines = SINGLE.read_text().splitlines(keepends=True)
    define = "#define ELASTIC_SEPARATE_COMPILATION 1\n" if args.separate else ""
    cuts = [(i + 1, m.group(1)) for i, line in enumerate(lines) if (m := re.match(r"// ---- end (\S+) ----", line))]

    with tempfile.TemporaryDirectory() as tmp:
        source = pathlib.Path(tmp) / "cut.cpp"
        # The baseline holds the includes whose header the preprocessor opens in this mode,
        # wherever they stand: one under `#if ELASTIC_DETAIL_BODIES` is left out with --separate,
        # and one under a false condition is hoisted only when another include parses it anyway.
        source.write_text(define + "".join(lines) + "\nint main() { return 0; }\n")
        opened = parsed_headers(args.compiler, source)
        spelled = sorted({m.group(1) for line in lines if (m := INCLUDE.match(line))})
        taken = [name for name in spelled if any(path.endswith("/" + name) for path in opened)]
        head = define + "".join(f"#include <{name}>\n" for name in taken)

        source.write_text(head + "int main() { return 0; }\n")
        base = best_of(args.runs, args.compiler, source, tmp)
        costs = []
        previous = base
        for count, (end, name) in enumerate(cuts, 1):
            # A cut inside a conditional block (the launcher's `#ifndef ELASTIC_NO_LAUNCHER`)
            # closes it.
            depth = sum(1 if OPENS.match(line) else -1 if CLOSES.match(line) else 0 for line in lines[:end])
            source.write_text(head + "".join(lines[:end]) + "#endif\n" * depth + "\nint main() { return 0; }\n")
            seconds = best_of(args.runs, args.compiler, source, tmp)
            costs.append((seconds - previous, name))
            previous = seconds
            print(f"\r{count}/{len(cuts)} {name:<60}", end="", file=sys.stderr, flush=True)
        print(file=sys.stderr)

    mode = "separate compilation" if args.separate else "header-only"
    runs = f", smallest of {args.runs} runs" if args.runs > 1 else ""
    print(f"single header, {mode}, {args.compiler} -O0{runs}: {previous:.2f} s user CPU in all")
    print(f"| file | user CPU s |\n|---|---:|\n| third-party and standard headers | {base:.2f} |")
    for seconds, name in sorted(costs, reverse=True)[:args.top]:
        print(f"| {name} | {seconds:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
