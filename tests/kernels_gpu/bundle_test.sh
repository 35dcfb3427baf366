#!/usr/bin/env bash
# scripts/gpu-bundle.sh on this build: the bundle holds what the GPU run needs and stays under
# its size limit; its binaries run with an empty environment; its run script lists its stages,
# refuses bad arguments, fails fast and clearly without a GPU (exit 3, the summary and the log
# in OUT, at most 4 files), and its stages' plumbing works end to end on the CPU
# (--plumbing-check: make-model, pdserve-generate runs and their comparisons).
set -uo pipefail
build_dir=$1
source_dir=$2
limit_mib=40
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
fail() { failures=$((failures + 1)); echo "FAIL: $*"; }
pass() { echo "ok: $*"; }

bundle=$work/build-gpu-bundle
if ! PDSERVE_BUNDLE_LIMIT_MIB=$limit_mib "$source_dir/scripts/gpu-bundle.sh" "$build_dir" "$bundle" \
     >"$work/bundle.log" 2>&1; then
  cat "$work/bundle.log"
  echo "FAIL: scripts/gpu-bundle.sh"
  exit 1
fi
cat "$work/bundle.log"
for file in run.sh run-gpu-tests.sh bundle-env.sh gpu-tests.txt cuda-libraries.txt \
            bin/pdserve-generate bin/pdserve-make-model bin/pdserve-bench-gpu \
            bin/cuda_backend_test bin/cuda_strict_test bin/cuda_engine_test \
            bin/device_sampler_test; do
  [[ -e "$bundle/$file" ]] || fail "bundle lacks $file"
done
for test in cuda_backend_test cuda_strict_test cuda_engine_test device_sampler_test; do
  grep -qx "$test" "$bundle/gpu-tests.txt" || fail "gpu-tests.txt lacks $test"
done
# Every binary the sanitizer stage runs is in the bundle.
while read -r _ binary _; do
  [[ -x "$bundle/bin/$binary" ]] || fail "the sanitizer stage runs $binary, which the bundle lacks"
done < <(grep -E '^(memcheck|racecheck) ' "$bundle/run-gpu-tests.sh")
grep -q '^libcudart\.so\.[0-9]' "$bundle/cuda-libraries.txt" && grep -q '^libcublas\.so\.[0-9]' "$bundle/cuda-libraries.txt" ||
  fail "cuda-libraries.txt: $(tr '\n' ' ' <"$bundle/cuda-libraries.txt")"
[[ ! -e $bundle/src ]] || fail "the bundle copies sources (the checkout travels anyway)"
if [[ -n $(find "$bundle/lib" -name 'libcublas*' -o -name 'libcudart*' -o -name 'libc.so*') ]]; then
  fail "the bundle carries libraries the GPU machine has"
fi
bytes=$(du -sb "$bundle" | cut -f1)
if [[ $bytes -le $((limit_mib << 20)) ]]; then pass "bundle $((bytes >> 20)) MiB <= $limit_mib MiB"; else fail "bundle $bytes bytes > $limit_mib MiB"; fi
if PDSERVE_BUNDLE_LIMIT_MIB=1 "$source_dir/scripts/gpu-bundle.sh" "$build_dir" "$work/too-big" >"$work/big.log" 2>&1 ||
   ! grep -q 'over its limit of 1 MiB' "$work/big.log"; then
  fail "a bundle over its limit is not refused: $(tail -3 "$work/big.log")"
else
  pass "a bundle over its limit is refused"
fi

# bundle-env.sh finds a CUDA library that only a Python environment's nvidia/*/lib holds (as
# PyTorch's pip wheels install cuBLAS and cudart), and one under /usr/local/cuda*.
mkdir -p "$work/env-check" "$work/site/nvidia/cu13/lib"
cp "$bundle/bundle-env.sh" "$work/env-check/"
touch "$work/site/nvidia/__init__.py" "$work/site/nvidia/cu13/lib/libpdserve_only_in_pip.so.1"
printf 'libpdserve_only_in_pip.so.1\n' >"$work/env-check/cuda-libraries.txt"
found=$(PYTHONPATH=$work/site bash -c "source '$work/env-check/bundle-env.sh' && echo \$LD_LIBRARY_PATH")
[[ $found == *"$work/site/nvidia/cu13/lib"* ]] || fail "bundle-env.sh misses nvidia/*/lib: $found"
if ls /usr/local/cuda*/lib64/libcudart.so.* >/dev/null 2>&1; then
  found=$(bash -c "source '$bundle/bundle-env.sh' && echo \$LD_LIBRARY_PATH")
  [[ $found == *"/usr/local/cuda"* ]] || fail "bundle-env.sh misses /usr/local/cuda*: $found"
fi

# Binaries start with an empty environment (only the bundle's libraries, through run.sh).
env -i PDSERVE_REPO="$source_dir" "$bundle/run.sh" pdserve-bench-gpu --help >/dev/null 2>&1 ||
  fail "run.sh pdserve-bench-gpu --help under env -i"
env -i PDSERVE_REPO="$source_dir" "$bundle/run.sh" pdserve-make-model --help >/dev/null 2>&1 ||
  fail "run.sh pdserve-make-model --help under env -i"

# The run script: its stage list, bad arguments, and no GPU.
run_tests=$bundle/run-gpu-tests.sh
export PDSERVE_REPO=$source_dir
"$run_tests" --list >"$work/list" 2>&1 && grep -q '^generate ' "$work/list" && grep -q '^bench ' "$work/list" ||
  fail "--list: $(cat "$work/list")"
"$run_tests" "$work/o1" --skip nonsense >/dev/null 2>&1
[[ $? -eq 2 ]] || fail "an unknown stage is not exit 2"
"$run_tests" >/dev/null 2>&1
[[ $? -eq 2 ]] || fail "no OUT folder is not exit 2"

start=$(date +%s)
CUDA_VISIBLE_DEVICES= PATH=/usr/bin:/bin timeout 120 "$run_tests" "$work/no-gpu" >"$work/no-gpu.out" 2>&1
code=$?
seconds=$(($(date +%s) - start))
if [[ $code -eq 3 ]] && grep -q 'error: no usable CUDA device' "$work/no-gpu.out" && [[ $seconds -le 60 ]]; then
  pass "without a GPU: exit 3 in ${seconds}s: $(grep 'error:' "$work/no-gpu.out")"
else
  fail "without a GPU: exit $code after ${seconds}s: $(cat "$work/no-gpu.out")"
fi
files=$(find "$work/no-gpu" -type f | wc -l)
[[ $files -le 4 && -s $work/no-gpu/gpu-run.log && -s $work/no-gpu/summary.txt ]] ||
  fail "without a GPU OUT holds: $(ls "$work/no-gpu")"

# The stages' plumbing on the CPU: every stage that can run here passes, the others skip.
CUDA_VISIBLE_DEVICES= PDSERVE_GPU_WORK=$work/plumbing-work timeout 400 "$run_tests" "$work/plumbing" \
  --plumbing-check >"$work/plumbing.out" 2>&1
code=$?
summary=$work/plumbing/summary.txt
for expected in "preflight PASS" "model PASS" "gpu_tests SKIP" "generate PASS" "bench SKIP"; do
  grep -q "^$expected " "$summary" 2>/dev/null || fail "plumbing check: no '$expected' in the summary"
done
grep -q '^hf \(SKIP\|PASS\) ' "$summary" || fail "plumbing check: hf neither skipped nor passed"
grep -q '^sanitizer SKIP ' "$summary" || fail "plumbing check: sanitizer not skipped"
grep -q 'cuda32: 2/2 prompts equal ids' "$summary" || fail "plumbing check: cpu float32 twice gave other ids"
[[ $code -eq 0 ]] || fail "plumbing check exit $code"
files=$(find "$work/plumbing" -type f | wc -l)
[[ $files -le 4 ]] || fail "plumbing check left $files files in OUT: $(ls "$work/plumbing")"
listing=$(tar -tzf "$work/plumbing/details.tar.gz")  # not piped into grep -q: pipefail
grep -q 'details/generate.jsonl' <<<"$listing" || fail "details.tar.gz lacks the comparison records"
if [[ $failures -ne 0 ]]; then
  echo "--- plumbing output"; cat "$work/plumbing.out"; cat "$work/plumbing/gpu-run.log" 2>/dev/null | tail -60
fi
cat "$summary"
echo "gpu bundle: $failures failure(s)"
[[ $failures -eq 0 ]]
