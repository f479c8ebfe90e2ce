#!/usr/bin/env python3
"""Inline include/elastic.hpp and every project header it reaches into one file.

Deterministic: the output depends only on the headers' bytes. Project headers (those under
include/, named as "elastic/..." or <elastic/...>) are inlined once, at their first inclusion;
`#pragma once` is dropped. A system or third-party include that no preprocessor conditional
surrounds is written once, in a block right after elastic/detail/config.hpp (which sets the macros
Asio reads and includes nothing itself); the conditional ones (the separately compiled bodies',
the launcher's) stay where they stand. The hoisting is for g++: with the includes scattered, its
garbage collector ran at a costlier point and a trivial file compiled with
ELASTIC_SEPARATE_COMPILATION took 0.45 s (12%) longer (bench/compile_time.py). Every
header's first line is its licence (`// SPDX-License-Identifier: MIT`, LICENSE): one without it
stops the tool; the single header carries the line once, at its top.

A header whose first inclusion sits inside a preprocessor conditional would vanish for every later
includer whenever the condition is false, so the tool refuses it, with one exception: the
launcher guard, `#ifndef ELASTIC_NO_LAUNCHER` (the command line and elastic::run, which a
worker-only file leaves out). A header first inlined inside that guard may later be included
only inside the same guard.

    tools/amalgamate.py                     # writes single_include/elastic.hpp
    tools/amalgamate.py --output FILE       # writes FILE instead
    tools/amalgamate.py --check             # exit 1 if the committed file is stale
"""
import argparse
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
INCLUDE = os.path.join(ROOT, "include")
DEFAULT_OUT = os.path.join(ROOT, "single_include", "elastic.hpp")

INCLUDE_RE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]')
PRAGMA_ONCE_RE = re.compile(r"^\s*#\s*pragma\s+once\b")
SPDX = "// SPDX-License-Identifier: MIT\n"
IF_RE = re.compile(r"^\s*#\s*if(?:n?def)?\b")
ELSE_RE = re.compile(r"^\s*#\s*(?:else|elif)\b")
ENDIF_RE = re.compile(r"^\s*#\s*endif\b")
LAUNCHER_GUARD_RE = re.compile(r"^\s*#\s*ifndef\s+ELASTIC_NO_LAUNCHER\s*$")
CONFIG = "elastic/detail/config.hpp"
VERSION_RE = re.compile(r'^#define ELASTIC_VERSION_STRING "([^"]+)"', re.M)


def project_path(name):
    """The header's path under include/ if `name` is one of ours, else None."""
    if name != "elastic.hpp" and not name.startswith("elastic/"):
        return None
    path = os.path.join(INCLUDE, name)
    return path if os.path.isfile(path) else None


def inline(name, seen, out, launcher_only, hoisted, guarded=False):
    """Append header `name` to `out` unless already seen. `guarded`: this inclusion sits inside
    the launcher guard; a header first inlined so is recorded in `launcher_only`. An external
    include outside every conditional goes to `hoisted` (header name to line; the first
    occurrence is kept) instead."""
    path = project_path(name)
    if path is None:
        sys.exit(f"amalgamate: {name} is not a header under include/")
    if name in seen:
        return
    seen.add(name)
    if guarded:
        launcher_only.add(name)
    out.append(f"// ---- begin {name} ----\n")
    # The preprocessor conditionals open at this line of this file: "launcher" for the then
    # branch of the launcher guard, "other" for anything else (the guard's #else included).
    conditionals = []
    with open(path, encoding="utf-8") as f:
        lines = f.readlines()
    if not lines or lines[0] != SPDX:
        sys.exit(f"amalgamate: {path} does not start with '{SPDX.strip()}' (LICENSE)")
    for line in lines[1:]:
        if PRAGMA_ONCE_RE.match(line):
            continue
        if IF_RE.match(line):
            conditionals.append("launcher" if LAUNCHER_GUARD_RE.match(line) else "other")
        elif ELSE_RE.match(line) and conditionals:
            conditionals[-1] = "other"
        elif ENDIF_RE.match(line) and conditionals:
            conditionals.pop()
        m = INCLUDE_RE.match(line)
        if m and project_path(m.group(1)) is not None:
            inner = m.group(1)
            in_guard = guarded or "launcher" in conditionals
            # Only the first inclusion is kept: one inside #if would vanish from the single
            # header whenever the condition is false, for every later includer too.
            if "other" in conditionals and inner not in seen:
                sys.exit(f"amalgamate: {path} includes {inner} inside #if before anything "
                         "includes it unconditionally; include it earlier from include/elastic.hpp")
            if inner in launcher_only and not in_guard:
                sys.exit(f"amalgamate: {path} includes {inner} outside #ifndef "
                         "ELASTIC_NO_LAUNCHER, but its first inclusion is inside that guard: "
                         "the single header would lack it when ELASTIC_NO_LAUNCHER is defined")
            inline(inner, seen, out, launcher_only, hoisted, in_guard)
            continue
        if m and (m.group(1) == "elastic.hpp" or m.group(1).startswith("elastic/")):
            sys.exit(f"amalgamate: {path} includes {m.group(1)}, which does not exist")
        if m and not guarded and not conditionals:
            if name == CONFIG:
                sys.exit(f"amalgamate: {path} includes {m.group(1)}: the hoisted includes follow it, "
                         "so it must include nothing")
            if m.group(1) not in hoisted:
                hoisted[m.group(1)] = line.strip() + "\n"
            continue
        out.append(line if line.endswith("\n") else line + "\n")
    out.append(f"// ---- end {name} ----\n")


def unreachable(seen):
    """Headers under include/elastic/ that the umbrella never reaches: the single header would
    silently lack them, so a program that builds against include/ fails against it."""
    missing = []
    for dirpath, _, files in os.walk(os.path.join(INCLUDE, "elastic")):
        for f in files:
            if f.endswith(".hpp"):
                name = os.path.relpath(os.path.join(dirpath, f), INCLUDE).replace(os.sep, "/")
                if name not in seen:
                    missing.append(name)
    return sorted(missing)


def generate():
    with open(os.path.join(INCLUDE, "elastic", "detail", "config.hpp"), encoding="utf-8") as f:
        version = VERSION_RE.search(f.read()).group(1)
    body = []
    seen = set()
    hoisted = {}
    inline("elastic.hpp", seen, body, set(), hoisted)
    config_end = f"// ---- end {CONFIG} ----\n"
    if config_end not in body:
        sys.exit(f"amalgamate: include/elastic.hpp does not include {CONFIG}")
    at = body.index(config_end) + 1
    body[at:at] = ["// The system and third-party headers the rest includes unconditionally.\n", *hoisted.values()]
    missing = unreachable(seen)
    if missing:
        sys.exit("amalgamate: include/elastic.hpp does not reach " + ", ".join(missing) +
                 " (include it from its layer's umbrella header)")
    banner = (
        SPDX +
        "// elastic " + version + " — single-header distribution.\n"
        "// GENERATED FILE — DO NOT EDIT. Made by tools/amalgamate.py from include/elastic.hpp;\n"
        "// edit the headers under include/ and run the tool again.\n"
        "//\n"
        "// WHAT A PROGRAM USING THIS FILE NEEDS (docs/building.md, \"Vendoring the single header\"):\n"
        "//   C++20; on the include path: standalone Asio 1.22+, fmt, nlohmann/json, CLI11 (header-only),\n"
        "//   OpenSSL's and http-parser's headers; LINK fmt, OpenSSL and http-parser:\n"
        "//   -lfmt -lssl -lcrypto -lhttp_parser -pthread.\n"
        "//   On Debian 12 (libasio-dev libfmt-dev nlohmann-json3-dev libcli11-dev libssl-dev\n"
        "//   libhttp-parser-dev):\n"
        "//       g++ -std=c++20 -I<this file's directory> main.cpp -lfmt -lssl -lcrypto -lhttp_parser -pthread\n"
        "//   A worker may #define ELASTIC_NO_LAUNCHER before including this file: it leaves out the\n"
        "//   command line and elastic::run, and then needs no CLI11.\n"
        "//   Separate compilation: define ELASTIC_SEPARATE_COMPILATION in every file of the program,\n"
        "//   and in exactly one of them also ELASTIC_IMPL_SOURCE before including this file.\n"
        "// Licence: MIT (the LICENSE file beside the sources; keep this notice with the file).\n"
        "//\n"
        "#pragma once\n"
        "#define ELASTIC_AMALGAMATED 1\n"
    )
    return banner + "".join(body)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("output", nargs="?", help="file to write (default single_include/elastic.hpp)")
    ap.add_argument("--output", dest="output_opt", help="file to write")
    ap.add_argument("--check", action="store_true", help="compare with the committed file")
    args = ap.parse_args()
    text = generate()
    if args.check:
        try:
            with open(DEFAULT_OUT, encoding="utf-8") as f:
                current = f.read()
        except FileNotFoundError:
            current = None
        if current != text:
            print("single_include/elastic.hpp is stale: run tools/amalgamate.py and commit it",
                  file=sys.stderr)
            return 1
        print("single_include/elastic.hpp is up to date")
        return 0
    out = args.output_opt or args.output or DEFAULT_OUT
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    tmp = out + ".tmp"
    with open(tmp, "w", encoding="utf-8", newline="\n") as f:
        f.write(text)
    os.replace(tmp, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
