#!/usr/bin/env python3
"""The layering check: no header under include/ includes one from a layer above its own.

    python3 tools/check_layers.py            # exit 1, naming each offending #include

Layers, lowest first (docs/architecture.md):

    base        error.hpp, usage_error.hpp, version.hpp, env.hpp, record.hpp, watchdog.hpp, detail/
    process     process/
    store       store/                    (base, process)
    report      report/                   (base, process)
    worker      dist.hpp, dist/           (base, store)
    rendezvous  rendezvous/               (base, process, store, report)
    policy      policy/                   (base, process, store, report, rendezvous)
    agent       agent/                    (everything below)
    launch      launch/, run.hpp          (everything below)
    all         impl/                     (everything: the definitions of separate compilation)

An umbrella header (store.hpp, policy.hpp, ...) belongs to its folder's layer; elastic.hpp
includes everything. KNOWN lists the includes that still cross upwards, each one a debt with
its reason: the check fails on any crossing not listed, and on a listed one that is gone (so
the list only shrinks).
"""
from __future__ import annotations

import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
INCLUDE = ROOT / "include"

BELOW = {
    "base": set(),
    "process": {"base"},
    "store": {"base", "process"},
    "report": {"base", "process"},
    "worker": {"base", "store"},
    "rendezvous": {"base", "process", "store", "report"},
    "policy": {"base", "process", "store", "report", "rendezvous"},
    "agent": {"base", "process", "store", "report", "worker", "rendezvous", "policy"},
    "launch": {"base", "process", "store", "report", "worker", "rendezvous", "policy", "agent"},
    "all": {"base", "process", "store", "report", "worker", "rendezvous", "policy", "agent", "launch"},
}

FOLDERS = {"process", "store", "report", "rendezvous", "policy", "agent", "launch"}
TOP = {
    "error.hpp": "base",
    "usage_error.hpp": "base",
    "version.hpp": "base",
    "env.hpp": "base",
    "record.hpp": "base",
    "watchdog.hpp": "base",
    "dist.hpp": "worker",
    "run.hpp": "launch",
}

# (including file, included file): crossings still to remove, each with its reason. The check
# fails on a listed crossing that is gone, so the list only shrinks.
KNOWN: set[tuple[str, str]] = set()

INCLUDE_LINE = re.compile(r'^\s*#\s*include\s*[<"]elastic/([^">]+)[">]', re.M)
# Any other include of a project header (relative, or the umbrella): refused outright.
OTHER_PROJECT_INCLUDE = re.compile(r'^\s*#\s*include\s*(?:"[^"]*\.\./[^"]*"|[<"]elastic\.hpp[">])', re.M)


def layer_of(relative: str) -> str:
    """The layer of a header named relative to include/elastic/ ("store/client.hpp")."""
    if relative == "../elastic.hpp":
        return "all"
    parts = relative.split("/")
    if len(parts) == 1:
        name = parts[0]
        if name in TOP:
            return TOP[name]
        folder = name.removesuffix(".hpp")
        if folder in FOLDERS:
            return folder
        raise SystemExit(f"check_layers: {relative} has no layer: add it to TOP in tools/check_layers.py")
    if parts[0] == "detail":
        return "base"
    if parts[0] == "dist":
        return "worker"
    if parts[0] == "impl":
        return "all"
    if parts[0] in FOLDERS:
        return parts[0]
    raise SystemExit(f"check_layers: include/elastic/{parts[0]}/ has no layer: add it to tools/check_layers.py")


def main() -> int:
    headers = sorted((INCLUDE / "elastic").rglob("*.hpp")) + [INCLUDE / "elastic.hpp"]
    crossings: set[tuple[str, str]] = set()
    lines: dict[tuple[str, str], str] = {}
    for path in headers:
        if path == INCLUDE / "elastic.hpp":
            relative = "../elastic.hpp"
        else:
            relative = path.relative_to(INCLUDE / "elastic").as_posix()
        mine = layer_of(relative)
        text = path.read_text()
        for match in OTHER_PROJECT_INCLUDE.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            key = (relative, match.group(0).strip())
            crossings.add(key)
            lines[key] = f"include/elastic/{relative}:{line}: include project headers as \"elastic/...\""
        for match in INCLUDE_LINE.finditer(text):
            target = match.group(1)
            theirs = layer_of(target)
            if theirs == mine or theirs in BELOW[mine]:
                continue
            crossings.add((relative, target))
            line = text.count("\n", 0, match.start()) + 1
            lines[(relative, target)] = f"include/elastic/{relative}:{line}: the {mine} layer includes " \
                                        f"elastic/{target} from the {theirs} layer above it"
    new = sorted(crossings - KNOWN)
    gone = sorted(KNOWN - crossings)
    for key in new:
        print(lines[key], file=sys.stderr)
    for including, included in gone:
        print(f"tools/check_layers.py: include/elastic/{including} no longer includes elastic/{included}: "
              f"remove the pair from KNOWN", file=sys.stderr)
    if new:
        print(f"check_layers: {len(new)} include(s) cross upwards; a lower layer takes a narrow value type "
              f"instead of including a higher one (see the layers in tools/check_layers.py)", file=sys.stderr)
    if new or gone:
        return 1
    print(f"check_layers: {len(headers)} headers; no new upward include ({len(KNOWN)} known, listed in "
          f"tools/check_layers.py)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
