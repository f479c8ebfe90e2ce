#!/usr/bin/env python3
"""The docs point at things that exist.

  python3 tools/check_docs.py [--elasticrun PATH]

Checks README.md and docs/*.md:
  - every relative Markdown link [text](target) names a file of the repository, and its
    #anchor, when it has one, a heading of that file (GitHub's anchors: lower case, punctuation
    dropped, spaces to hyphens, -1, -2 ... for repeats);
  - every repository path written in backticks (`include/...`, `tests/...`, `bench/...` and the
    other top-level directories) exists, unless it is a pattern (`*`, `<name>`, `...`, `N`);
  - no page cites a file kept outside the repository (a design or platform note of the
    developers): the docs stand alone;
  - with --elasticrun, every long option that `elasticrun --help` lists appears in docs/cli.md.
Prints each problem as file:line and exits 1 when there is any.
"""
import argparse
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOP = ("include", "tests", "bench", "tools", "examples", "src", "docs", "fuzz", "cmake", "single_include", ".ci")
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
CODE = re.compile(r"`([^`\n]+)`")
FENCE = re.compile(r"^\s*(```|~~~)")
OUTSIDE = re.compile(r"\.\./shared|\b(DESIGN|PLATFORM|STYLE)\.md\b")


def slug(heading):
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)  # GitHub keeps letters, digits, _, - and spaces
    return s.replace(" ", "-")


def anchors(path):
    found = set()
    counts = {}
    in_fence = False
    with open(path, encoding="utf-8") as f:
        for line in f:
            if FENCE.match(line):
                in_fence = not in_fence
                continue
            if in_fence or not line.startswith("#"):
                continue
            base = slug(line.lstrip("#"))
            n = counts.get(base, 0)
            counts[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
    return found


def is_pattern(path):
    return any(c in path for c in "*<>{}$") or "..." in path or re.search(r"(^|/)N(/|$|\.)", path) is not None


checked = {"links": 0, "paths": 0, "options": 0}


def check_file(path, problems, anchor_cache):
    rel = os.path.relpath(path, ROOT)
    in_fence = False
    with open(path, encoding="utf-8") as f:
        lines = f.readlines()
    for number, line in enumerate(lines, 1):
        if OUTSIDE.search(line):
            problems.append(f"{rel}:{number}: cites a file outside the repository: {OUTSIDE.search(line).group(0)}")
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        for target in LINK.findall(line):
            if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
                continue
            checked["links"] += 1
            file_part, _, anchor = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
            if not os.path.exists(dest):
                problems.append(f"{rel}:{number}: the link ({target}) names {os.path.relpath(dest, ROOT)}, "
                                "which is not in the repository")
                continue
            if anchor and dest.endswith(".md"):
                if dest not in anchor_cache:
                    anchor_cache[dest] = anchors(dest)
                if anchor not in anchor_cache[dest]:
                    problems.append(f"{rel}:{number}: the link ({target}): {os.path.relpath(dest, ROOT)} has no "
                                    f"heading whose anchor is #{anchor}")
        for code in CODE.findall(line):
            token = code.split()[0] if code.split() else ""
            token = token.rstrip(".,;:)")
            if "/" not in token or not token.startswith(TOP) or is_pattern(token):
                continue
            checked["paths"] += 1
            candidate = token.split(":")[0]  # path:line
            if not os.path.exists(os.path.join(ROOT, candidate)):
                problems.append(f"{rel}:{number}: `{code}` names {candidate}, which is not in the repository")


def check_help(elasticrun, problems):
    out = subprocess.run([elasticrun, "--help"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if out.returncode != 0:
        problems.append(f"{elasticrun} --help exited {out.returncode}")
        return
    # The dashed spelling of each option (the underscored one is its alias).
    options = {o for o in re.findall(r"(?<![\w-])(--[a-z][a-z0-9_-]*)", out.stdout) if "_" not in o} - {"--help"}
    with open(os.path.join(ROOT, "docs", "cli.md"), encoding="utf-8") as f:
        cli = f.read()
    checked["options"] = len(options)
    for option in sorted(options):
        if not re.search(re.escape(option) + r"(?![a-z0-9-])", cli):
            problems.append(f"docs/cli.md: `elasticrun --help` lists {option}, which the page never mentions")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--elasticrun", help="also check that docs/cli.md names every option of this launcher's --help")
    args = p.parse_args()
    problems = []
    cache = {}
    pages = [os.path.join(ROOT, "README.md")] + sorted(
        os.path.join(ROOT, "docs", f) for f in os.listdir(os.path.join(ROOT, "docs")) if f.endswith(".md"))
    for page in pages:
        check_file(page, problems, cache)
    if args.elasticrun:
        check_help(args.elasticrun, problems)
    for problem in problems:
        print(problem)
    print(f"check_docs: {len(pages)} pages, {checked['links']} links, {checked['paths']} paths, "
          f"{checked['options']} --help options: {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
