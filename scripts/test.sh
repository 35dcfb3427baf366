#!/usr/bin/env bash
# Configures, builds (warnings as errors) and runs the whole test suite with CTest; the last
# line counts the tests: 'N passed, N failed, N skipped' (scripts/ctest_summary.py), and the
# exit code is ctest's.
# Usage: scripts/test.sh [ctest arguments...]   e.g. scripts/test.sh -L tokenizer
set -euo pipefail
cd "$(dirname "$0")/.."
preset=${PDSERVE_PRESET:-default}
cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset" -j "$(nproc)"
exec /usr/bin/python3 scripts/ctest_summary.py --preset "$preset" -j "$(nproc)" "$@"
