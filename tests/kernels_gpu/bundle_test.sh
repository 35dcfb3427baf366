#!/usr/bin/env bash
# scripts/gpu-bundle.sh on this build: the bundle's binaries must run with an empty
# environment and only the bundle's library folder (and through run.sh).
set -euo pipefail
build_dir=$1
source_dir=$2
bundle=$(mktemp -d)
trap 'rm -rf "$bundle"' EXIT
"$source_dir/scripts/gpu-bundle.sh" "$build_dir" "$bundle/out"
for file in run.sh run-gpu-tests.sh bin/kernels_gpu_plan_test bin/pdserve-bench-gpu \
            src/configs/models/qwen3-8b/config.json src/tests/data/reference/configs/hd64_gqa4.json; do
  [[ -e "$bundle/out/$file" ]] || { echo "FAIL: bundle lacks $file"; exit 1; }
done
env -i LD_LIBRARY_PATH="$bundle/out/lib" "$bundle/out/bin/kernels_gpu_plan_test" \
  --gtest_filter='CudaAttentionPlan.*:DecodeGraphBuckets.*' > "$bundle/plan.log" 2>&1 ||
  { cat "$bundle/plan.log"; echo "FAIL: bundled test under env -i"; exit 1; }
env -i "$bundle/out/run.sh" pdserve-bench-gpu --help > /dev/null ||
  { echo "FAIL: run.sh pdserve-bench-gpu --help"; exit 1; }
echo "ok: bundle runs under env -i"
