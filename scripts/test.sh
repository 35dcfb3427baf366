#!/usr/bin/env bash
# Configures, builds (warnings as errors) and runs the whole test suite with CTest.
# Usage: scripts/test.sh [ctest arguments...]   e.g. scripts/test.sh -L tokenizer
set -euo pipefail
cd "$(dirname "$0")/.."
preset=${PDSERVE_PRESET:-default}
cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset" -j "$(nproc)"
ctest --preset "$preset" -j "$(nproc)" "$@"
