#!/usr/bin/env bash
# The peer benchmark in one command (issue #18), from a fresh clone too: installs pdserve's
# dependencies (scripts/setup.sh: only what is missing), builds the pdserve binaries it needs
# (cpu preset, or $PDSERVE_BUILD_DIR), the peer venv (setup_peer.sh), then runs peer_bench.py.
# Usage: bench/peer/run.sh [peer_bench.py flags]   e.g. --serving, --repeats 3, --rows 1,4
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${PDSERVE_BUILD_DIR:-$root/build-cpu}
venv=${PDSERVE_PEER_VENV:-$root/bench/peer/.venv}
"$root/scripts/setup.sh"
if [[ ! -f $build/CMakeCache.txt ]]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPDSERVE_CUDA=OFF
fi
cmake --build "$build" -j "$(nproc)" --target pdserve-bench-cpu pdserve-make-model \
  pdserve-generate pdserve-decode pdserve-bench-serving
"$root/bench/peer/setup_peer.sh" "$venv"
exec "$venv/bin/python" "$root/bench/peer/peer_bench.py" --build-dir "$build" \
  --llama-bin "$venv/llama-build/bin" "$@"
