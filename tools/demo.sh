#!/usr/bin/env bash
# The main job (README's first command): build the examples and run one.
# Builds into build/demo. Until the launcher lands it runs the example worker directly.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install-deps.sh build
cmake -S . -B build/demo -G Ninja -DCMAKE_BUILD_TYPE=Release -DELASTIC_BUILD_TESTS=OFF \
  -DELASTIC_HEADER_CHECKS=OFF >/dev/null
cmake --build build/demo -j "$(nproc)"
exec build/demo/bin/worker "$@"
