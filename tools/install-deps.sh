#!/usr/bin/env bash
# Install the Debian packages elastic needs, only those missing. Run as root on Debian 12.
#   tools/install-deps.sh build   # compilers and the libraries the headers use
#   tools/install-deps.sh test    # that, plus what the test suite runs against (PyTorch, etcd)
#                                 # and clang-format-14 for tools/check_format.sh
set -euo pipefail
what=${1:-test}

packages=(cmake ninja-build g++ clang libclang-rt-14-dev python3
          libasio-dev libfmt-dev doctest-dev nlohmann-json3-dev libcli11-dev libssl-dev libhttp-parser-dev)
if [[ $what == test ]]; then
  packages+=(python3-torch libtorch-dev libgloo-dev etcd-server etcd-client iproute2 procps clang-format-14
             python3-prometheus-client)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  if [[ $(id -u) != 0 ]]; then
    echo "install-deps: missing Debian packages: ${missing[*]} (run as root to install them)" >&2
    exit 1
  fi
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
