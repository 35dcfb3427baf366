#!/usr/bin/env bash
# With every CUDA device hidden, the gpu test binary must report itself skipped (exit 77,
# "SKIPPED: no CUDA device") and pdserve-bench-gpu must exit 2 naming the missing device;
# a bad argument exits 2 too. Runs on machines with and without a GPU.
set -u
build_dir=$1
fail=0

expect() {  # expect NAME WANTED_CODE PATTERN COMMAND...
  local name=$1 wanted=$2 pattern=$3
  shift 3
  local output code
  output=$(CUDA_VISIBLE_DEVICES= "$@" 2>&1)
  code=$?
  if [[ $code -ne $wanted ]]; then
    echo "FAIL $name: exit $code, wanted $wanted"; echo "$output"; fail=1; return
  fi
  if ! grep -q -- "$pattern" <<<"$output"; then
    echo "FAIL $name: output lacks '$pattern'"; echo "$output"; fail=1; return
  fi
  echo "ok $name"
}

for test in cuda_backend_test cuda_strict_test cuda_engine_test cuda_fp8_linear_test; do
  expect "$test skips" 77 "SKIPPED: no CUDA device" "$build_dir/tests/kernels_gpu/$test"
done
expect "bench without device" 2 "error: --device cuda: .*CUDA" \
  "$build_dir/bench/gpu/pdserve-bench-gpu" --repeats 1
expect "bench with FP8 weights without device" 2 "error: --device cuda: .*CUDA" \
  "$build_dir/bench/gpu/pdserve-bench-gpu" --weights fp8 --repeats 1
expect "bench bad argument" 2 "repeats" "$build_dir/bench/gpu/pdserve-bench-gpu" --repeats 0
expect "bench bad weights" 2 "weights" "$build_dir/bench/gpu/pdserve-bench-gpu" --weights int4
exit $fail
