#!/usr/bin/env bash
# The main job (README's first command): build the launcher and the example trainer (Release,
# build/demo), then run
#     elasticrun --standalone --nproc-per-node=4 trainer --steps=5
# Extra arguments replace the launcher's options and program: tools/demo.sh --nproc-per-node=2 ...
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install-deps.sh build
cmake -S . -B build/demo -G Ninja -DCMAKE_BUILD_TYPE=Release -DELASTIC_BUILD_TESTS=OFF \
  -DELASTIC_HEADER_CHECKS=OFF >/dev/null
cmake --build build/demo -j "$(nproc)" --target elasticrun example-trainer
bin=build/demo/bin
if (($#)); then
  args=("$@")
else
  args=(--standalone --nproc-per-node=4 "$bin/trainer" --steps=5)
fi
echo "+ $bin/elasticrun ${args[*]}"
exec "$bin/elasticrun" "${args[@]}"
