#!/usr/bin/env python3
"""Compile time of the headers users include, as the budget in docs/building.md counts it.

    python3 bench/compile_time.py [--compiler g++] [--runs 1] [--check]

Each case is a small translation unit compiled with `-std=c++20 -O0 -c` (the flags of the
project's build, no precompiled headers); the figure is the compiler's user CPU time, which
another job on the machine changes far less than the wall time, and its peak memory. Cases marked
"separate" are compiled with -DELASTIC_SEPARATE_COMPILATION (docs/building.md). --check exits 1
when a checked case is over its budget; a budget that is not met yet is shown and reported, but
not checked (docs/building.md gives the gap); --checked-only skips the unchecked cases. Run it on
a quiet machine for figures worth writing down; the budgets have a margin for the noise that
remains.

The budgets are seconds on the machine where they were set. A slower machine compiles everything
slower, so the script first times a reference unit (Asio and fmt alone, nothing of elastic's) and
scales the budgets by how much longer it takes here than REFERENCE_SECONDS, never below 1: the
check then fails on a change that costs compile time, not on a slower machine.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent

SEPARATE = ["-DELASTIC_SEPARATE_COMPILATION"]
DIST = '#include <elastic/dist.hpp>\nint main() { return 0; }\n'
LAUNCHER = ('#include <elastic/run.hpp>\n#include <elastic/policy.hpp>\n'
            'int main(int argc, char** argv) {\n'
            '    return elastic::run(argc, argv, elastic::max_restarts(3));\n}\n')
SINGLE = '#include <elastic.hpp>\nint main() { return 0; }\n'
SINGLE_WORKER = ('#define ELASTIC_NO_LAUNCHER\n#include <elastic.hpp>\n'
                 'int main() { return elastic::env().rank; }\n')
REFERENCE = ('#include <asio.hpp>\n#include <fmt/format.h>\n#include <string>\n#include <vector>\n'
             'int main() { return 0; }\n')
# The reference unit's user CPU on the machine where the budgets were set. Derived, not measured
# there: the same tree's single header (separate) took 3.17 s there and 4.31 s on a machine where
# the reference takes 2.12 s, so 2.12 x 3.17 / 4.31.
REFERENCE_SECONDS = 1.56

# name, translation unit, extra flags, budget in seconds of user CPU (None: measured, no budget),
# checked (--check fails on it; False: a budget not met yet). A unit that includes <elastic.hpp>
# alone is compiled against single_include/, the others against include/.
CASES = [
    ("elastic/env.hpp (a worker)", '#include <elastic/env.hpp>\nint main() { return elastic::env().rank; }\n',
     [], None, False),
    ("elastic/record.hpp (a worker)", '#include <elastic/record.hpp>\nint main() { return 0; }\n', [], None, False),
    ("elastic/dist.hpp", DIST, [], 2.0, False),
    ("elastic/dist.hpp, separate", DIST, SEPARATE, 2.0, True),
    # Met (1.5 s on the build machine), but not with the margin the noise of a shared machine needs.
    ("elastic/policy.hpp", '#include <elastic/policy.hpp>\nint main() { return 0; }\n', [], 2.0, False),
    ("elastic/store.hpp", '#include <elastic/store.hpp>\nint main() { return 0; }\n', [], None, False),
    ("a custom launcher: elastic/run.hpp + a policy", LAUNCHER, [], 6.0, False),
    ("a custom launcher, separate", LAUNCHER, SEPARATE, 6.0, True),
    ("the single header, a trivial file", SINGLE, [], 4.0, False),
    ("the single header, a trivial file, separate", SINGLE, SEPARATE, 4.0, True),
    ("the single header, a worker (ELASTIC_NO_LAUNCHER)", SINGLE_WORKER, [], None, False),
    ("the single header, a worker (ELASTIC_NO_LAUNCHER), separate", SINGLE_WORKER, SEPARATE, None, False),
]


def compile_once(compiler: str, source: pathlib.Path, include: list[str], tmp: str) -> tuple[float, int]:
    """User CPU seconds and peak resident KiB of one compile (its own rusage, from wait4)."""
    errors = pathlib.Path(tmp) / "stderr.txt"
    with open(errors, "w") as err:
        child = subprocess.Popen(
            [compiler, "-std=c++20", "-O0", "-DASIO_STANDALONE", "-DASIO_HAS_CO_AWAIT=1", *include, "-c",
             str(source), "-o", os.devnull],
            stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(child.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"compile_time: {source.name} does not compile:\n{errors.read_text()[:4000]}")
    return usage.ru_utime, usage.ru_maxrss


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--compiler", default="g++")
    parser.add_argument("--runs", type=int, default=1, help="compile each case N times; the smallest counts")
    parser.add_argument("--check", action="store_true", help="exit 1 when a checked case is over its budget")
    parser.add_argument("--checked-only", action="store_true", help="compile only the checked cases (CI)")
    args = parser.parse_args()

    over = []
    with tempfile.TemporaryDirectory() as tmp:
        reference_source = pathlib.Path(tmp) / "reference.cpp"
        reference_source.write_text(REFERENCE)
        reference = min(compile_once(args.compiler, reference_source, [], tmp)[0] for _ in range(max(1, args.runs)))
        scale = max(1.0, reference / REFERENCE_SECONDS)
        print(f"reference unit (Asio and fmt alone): {reference:.2f} s user CPU, {REFERENCE_SECONDS:.2f} s where "
              f"the budgets were set: budgets x {scale:.2f}")
        print()
        print("| translation unit | user CPU s | budget s | peak memory MiB |")
        print("|---|---:|---:|---:|")
        for name, text, flags, budget, checked in CASES:
            if args.checked_only and not checked:
                continue
            source = pathlib.Path(tmp) / "case.cpp"
            source.write_text(text)
            single = "#include <elastic.hpp>" in text
            include = ["-I" + str(ROOT / ("single_include" if single else "include")), *flags]
            best = None
            peak = 0
            case_scale = scale
            best_ratio = None
            for _ in range(max(1, args.runs)):
                seconds, rss = compile_once(args.compiler, source, include, tmp)
                best = seconds if best is None else min(best, seconds)
                peak = max(peak, rss)
                if budget is not None and checked:
                    # A budget is judged against the reference compiled right beside it, so a
                    # shared machine's load that comes and goes weighs on both alike.
                    beside = compile_once(args.compiler, reference_source, [], tmp)[0]
                    ratio = seconds / beside
                    if best_ratio is None or ratio < best_ratio:
                        best_ratio = ratio
                        case_scale = max(1.0, beside / REFERENCE_SECONDS)
                        best = seconds
            scale_shown = case_scale
            if budget is not None:
                budget *= case_scale
            shown = "—" if budget is None else f"{budget:.1f}" + ("" if checked else " (not checked)")
            print(f"| {name} | {best:.2f} | {shown} | {peak / 1024:.0f} |", flush=True)
            if budget is not None and best > budget:
                over.append((checked, f"{name}: {best:.2f} s over its budget of {budget:.1f} s (scaled x {scale_shown:.2f})"
                                      + ("" if checked else " (not checked)")))
    for _, line in over:
        print(f"compile_time: {line}", file=sys.stderr)
    return 1 if args.check and any(checked for checked, _ in over) else 0


if __name__ == "__main__":
    sys.exit(main())
