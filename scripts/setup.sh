#!/usr/bin/env bash
# Installs pdserve's build and test dependencies from Debian 12 packages (needs root or sudo).
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git
  libgtest-dev libgmock-dev libbenchmark-dev
  nlohmann-json3-dev libcli11-dev libpcre2-dev libutf8proc-dev libopenblas-dev
  libboost-dev libboost-system-dev libucx-dev ucx-utils
  python3 python3-torch python3-numpy python3-matplotlib curl procps
)

missing=()
# Node.js runs the oracle scripts in tools/oracle; a machine may already have it from another
# source (e.g. NodeSource, whose nodejs bundles npm and conflicts with Debian's npm).
command -v npm >/dev/null 2>&1 || packages+=(nodejs npm)
for pkg in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done

if ((${#missing[@]})); then
  sudo_cmd=()
  [[ $(id -u) -eq 0 ]] || sudo_cmd=(sudo)
  echo "setup: installing ${missing[*]}"
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "setup: all Debian packages present"
fi

# The npm packages of tools/oracle (golden-file generators and the `openai` client that the
# conformance tests drive), pinned by its package-lock.json; `npm ls` fails when any is missing.
oracle_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")/../tools/oracle" && pwd)
if npm ls --prefix "$oracle_dir" >/dev/null 2>&1; then
  echo "setup: all npm packages of tools/oracle present"
else
  echo "setup: installing the npm packages of tools/oracle"
  npm ci --prefix "$oracle_dir" --no-audit --no-fund --loglevel=error
fi
