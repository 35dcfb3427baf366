#!/usr/bin/env bash
# scripts/gpu-bundle.sh on this build: the bundle holds what the GPU run needs and stays under
# its size limit; its binaries run with an empty environment; its run script lists both runs'
# stages (decisive first, limits within the budget, beside their stand-in durations), refuses
# bad arguments, fails fast and clearly without a GPU (exit 3, the other stages NOT RUN), gives
# the verdicts and exit codes of passed, failed, timed-out and starved stages (stages faked
# with PDSERVE_PLUMBING_FAKE) with the output layout (verdicts.txt, STAGE.log,
# details.tar.gz), and both runs' plumbing works end to end on the CPU (--plumbing-check:
# make-model, pdserve-generate runs and their comparisons; the second run's PD stages: 1P1D
# over UCX tcp and sm equal to a colocated node, and the KV path's figures, from the bundle's
# node binaries and UCX modules).
set -uo pipefail
build_dir=$1
source_dir=$2
limit_mib=32
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export TMPDIR=$work  # where run.sh and run-gpu-tests.sh unpack the bundle: gone with the test
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
# The binaries and libraries travel packed; run.sh and run-gpu-tests.sh unpack them.
packed=$(tar -tzf "$bundle/binaries.tar.gz" 2>/dev/null | sed 's|^\./||')
has() { [[ -e "$bundle/$1" ]] || grep -qx "$1" <<<"$packed"; }
[[ -z $(ls -d "$bundle/bin" "$bundle/lib" 2>/dev/null) ]] || fail "the bundle carries bin/ or lib/ unpacked"
for file in run.sh run-gpu-tests.sh bundle-env.sh gpu-tests.txt cuda-libraries.txt binaries.tar.gz \
            bin/pdserve-generate bin/pdserve-make-model bin/pdserve-bench-gpu \
            bin/cuda_backend_test bin/cuda_strict_test bin/cuda_engine_test bin/cuda_fp8_linear_test \
            bin/device_sampler_test bin/pdserve-proxy bin/pdserve-prefill bin/pdserve-decode \
            bin/pdserve-bench-kv-transfer; do
  has "$file" || fail "bundle lacks $file"
done
for test in cuda_backend_test cuda_strict_test cuda_engine_test device_sampler_test cuda_fp8_linear_test; do
  grep -qx "$test" "$bundle/gpu-tests.txt" || fail "gpu-tests.txt lacks $test"
done
# The FP8 test comes last, after issue #28's decisive tests, in the gpu_tests stage.
[[ $(tail -1 "$bundle/gpu-tests.txt") == cuda_fp8_linear_test ]] ||
  fail "gpu-tests.txt does not end with cuda_fp8_linear_test: $(tr '\n' ' ' <"$bundle/gpu-tests.txt")"
# Every binary the sanitizer stage runs is in the bundle.
while read -r _ binary _; do
  has "bin/$binary" || fail "the sanitizer stage runs $binary, which the bundle lacks"
done < <(grep -E '^(memcheck|racecheck) ' "$bundle/run-gpu-tests.sh")
grep -q '^libcudart\.so\.[0-9]' "$bundle/cuda-libraries.txt" && grep -q '^libcublas\.so\.[0-9]' "$bundle/cuda-libraries.txt" &&
  grep -q '^libcublasLt\.so\.[0-9]' "$bundle/cuda-libraries.txt" ||
  fail "cuda-libraries.txt: $(tr '\n' ' ' <"$bundle/cuda-libraries.txt")"
[[ ! -e $bundle/src ]] || fail "the bundle copies sources (the checkout travels anyway)"
if grep -qE '^lib/(libcublas|libcudart|libc\.so)' <<<"$packed"; then
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
tar -czf "$work/env-check/binaries.tar.gz" -T /dev/null  # (nothing to unpack)
touch "$work/site/nvidia/__init__.py" "$work/site/nvidia/cu13/lib/libpdserve_only_in_pip.so.1"
printf 'libpdserve_only_in_pip.so.1\n' >"$work/env-check/cuda-libraries.txt"
found=$(PYTHONPATH=$work/site bash -c "source '$work/env-check/bundle-env.sh' && echo \$LD_LIBRARY_PATH")
[[ $found == *"$work/site/nvidia/cu13/lib"* ]] || fail "bundle-env.sh misses nvidia/*/lib: $found"
if ls /usr/local/cuda*/lib64/libcudart.so.* >/dev/null 2>&1; then
  found=$(bash -c "source '$bundle/bundle-env.sh' && echo \$LD_LIBRARY_PATH")
  [[ $found == *"/usr/local/cuda"* ]] || fail "bundle-env.sh misses /usr/local/cuda*: $found"
fi

# Binaries start with an empty environment (only the bundle's libraries, through run.sh; TMPDIR:
# where it unpacks them).
env -i PDSERVE_REPO="$source_dir" TMPDIR="$TMPDIR" "$bundle/run.sh" pdserve-bench-gpu --help >/dev/null 2>&1 ||
  fail "run.sh pdserve-bench-gpu --help under env -i"
env -i PDSERVE_REPO="$source_dir" TMPDIR="$TMPDIR" "$bundle/run.sh" pdserve-make-model --help >/dev/null 2>&1 ||
  fail "run.sh pdserve-make-model --help under env -i"

# The run script: its stage lists (decisive first), bad arguments, and no GPU.
run_tests=$bundle/run-gpu-tests.sh
export PDSERVE_REPO=$source_dir
stages_of() { "$run_tests" --list "$@" 2>&1 | awk 'NR > 1 && !/^budget/ { printf "%s ", $1 }'; }
[[ $(stages_of) == "preflight model gpu_tests generate hf " ]] || fail "first run's stages: $(stages_of)"
[[ $(stages_of --second) == "preflight pd kvpath bench sanitizer " ]] || fail "second run's stages: $(stages_of --second)"
"$run_tests" --list | grep -q '^budget 360s' || fail "the first run's budget is not 360 s"
"$run_tests" --list --second | grep -q '^budget 300s' || fail "the second run's budget is not 300 s"
# Every stage's limit and stand-in duration are printed; the limits fit the budget.
for run in "" --second; do
  sum=$("$run_tests" --list $run | awk 'NR > 1 && !/^budget/ { if ($2 !~ /^[0-9]+s$/ || $3 !~ /^[0-9]+s$/) bad = 1; sum += $2 } END { print bad ? "bad" : sum }')
  budget=$("$run_tests" --list $run | awk '/^budget/ { print $2 + 0 }')
  [[ $sum != bad && $sum -le $((budget - 5)) ]] || fail "--list $run: limits sum to $sum of a ${budget}s budget"
done
"$run_tests" "$work/o1" --skip nonsense >/dev/null 2>&1
[[ $? -eq 2 ]] || fail "an unknown stage is not exit 2"
"$run_tests" >/dev/null 2>&1
[[ $? -eq 2 ]] || fail "no OUT folder is not exit 2"

# expect_verdicts OUT LINE...: verdicts.txt holds each "STAGE RESULT" in this order, one per stage.
expect_verdicts() {
  local dir=$1 got want
  shift
  got=$(grep -v '^#' "$dir/verdicts.txt" 2>/dev/null | sed -E 's/^([a-z_]+) (PASS|FAIL|TIMEOUT|NOT RUN|SKIP) .*/\1 \2/' | paste -sd ',')
  want=$(IFS=,; echo "$*")
  [[ $got == "$want" ]] || fail "$dir: verdicts '$got', expected '$want'"
}
# expect_files OUT NAME...: OUT holds exactly these files.
expect_files() {
  local dir=$1 got want
  shift
  got=$(cd "$dir" && find . -type f | sed 's|^\./||' | sort | paste -sd ' ')
  want=$(printf '%s\n' "$@" | sort | paste -sd ' ')
  [[ $got == "$want" ]] || fail "$dir holds '$got', expected '$want'"
}

start=$(date +%s)
CUDA_VISIBLE_DEVICES='' PATH=/usr/bin:/bin timeout 120 "$run_tests" "$work/no-gpu" >"$work/no-gpu.out" 2>&1
code=$?
seconds=$(($(date +%s) - start))
if [[ $code -eq 3 ]] && grep -q 'error: no usable CUDA device' "$work/no-gpu.out" && [[ $seconds -le 30 ]]; then
  pass "without a GPU: exit 3 in ${seconds}s: $(grep 'error:' "$work/no-gpu.out")"
else
  fail "without a GPU: exit $code after ${seconds}s: $(cat "$work/no-gpu.out")"
fi
expect_verdicts "$work/no-gpu" "preflight FAIL" "model NOT RUN" "gpu_tests NOT RUN" "generate NOT RUN" "hf NOT RUN"
expect_files "$work/no-gpu" verdicts.txt preflight.log details.tar.gz

# The exit codes and verdicts of passed, failed, timed-out and starved stages, with stages
# replaced by PDSERVE_PLUMBING_FAKE (honoured only with --plumbing-check).
fake() {  # fake NAME EXPECTED_EXIT BUDGET FAKES [RUN-ARGS...]
  local start code seconds
  start=$(date +%s)
  CUDA_VISIBLE_DEVICES='' PDSERVE_GPU_WORK=$work/fake-work PDSERVE_PLUMBING_FAKE=$4 timeout 60 \
    "$run_tests" "$work/$1" --plumbing-check --budget-s "$3" "${@:5}" >"$work/$1.out" 2>&1
  code=$?
  seconds=$(($(date +%s) - start))
  [[ $code -eq $2 ]] || fail "$1: exit $code, expected $2: $(cat "$work/$1.out")"
  [[ $seconds -le $(($3 + 10)) ]] || fail "$1: took ${seconds}s of a ${3}s budget"
}
all_pass=preflight=pass,model=pass,gpu_tests=pass,generate=pass,hf=pass
fake fake-pass 0 360 "$all_pass"
expect_verdicts "$work/fake-pass" "preflight PASS" "model PASS" "gpu_tests PASS" "generate PASS" "hf PASS"
expect_files "$work/fake-pass" verdicts.txt details.tar.gz preflight.log model.log gpu_tests.log generate.log hf.log
fake fake-fail 1 360 "${all_pass/model=pass/model=fail}"
expect_verdicts "$work/fake-fail" "preflight PASS" "model FAIL" "gpu_tests PASS" "generate PASS" "hf PASS"
# A hanging stage (its command under timeout, in a process group of its own) is stopped when
# the budget ends (14 s less the 5 s reserve and what the stages before it took: 5 to 9 s under
# load): TIMEOUT, the stages after it NOT RUN, and none of its processes left.
fake fake-hang 4 14 "${all_pass/gpu_tests=pass/gpu_tests=hang}"
expect_verdicts "$work/fake-hang" "preflight PASS" "model PASS" "gpu_tests TIMEOUT" "generate NOT RUN" "hf NOT RUN"
grep -q '^gpu_tests TIMEOUT [0-9]*s (limit [5-9]s; stand-in' "$work/fake-hang/verdicts.txt" ||
  fail "fake-hang: the hanging stage's limit is not what was left of the budget: $(cat "$work/fake-hang/verdicts.txt")"
if pgrep -f 'sleep 100000' >/dev/null; then fail "fake-hang: the hanging stage outlived its limit"; fi
# No time for any stage: all NOT RUN, exit 5.
fake fake-starved 5 6 "$all_pass"
expect_verdicts "$work/fake-starved" "preflight NOT RUN" "model NOT RUN" "gpu_tests NOT RUN" "generate NOT RUN" "hf NOT RUN"
# The same for the second run, its PD stages among them.
second_pass=preflight=pass,pd=pass,kvpath=pass,bench=pass,sanitizer=pass
fake fake2-pass 0 300 "$second_pass" --second
expect_verdicts "$work/fake2-pass" "preflight PASS" "pd PASS" "kvpath PASS" "bench PASS" "sanitizer PASS"
expect_files "$work/fake2-pass" verdicts.txt details.tar.gz preflight.log pd.log kvpath.log bench.log sanitizer.log
fake fake2-fail 1 300 "${second_pass/pd=pass/pd=fail}" --second
expect_verdicts "$work/fake2-fail" "preflight PASS" "pd FAIL" "kvpath PASS" "bench PASS" "sanitizer PASS"
fake fake2-hang 4 14 "${second_pass/kvpath=pass/kvpath=hang}" --second
expect_verdicts "$work/fake2-hang" "preflight PASS" "pd PASS" "kvpath TIMEOUT" "bench NOT RUN" "sanitizer NOT RUN"
if pgrep -f 'sleep 100000' >/dev/null; then fail "fake2-hang: the hanging stage outlived its limit"; fi
fake fake2-starved 5 6 "$second_pass" --second
expect_verdicts "$work/fake2-starved" "preflight NOT RUN" "pd NOT RUN" "kvpath NOT RUN" "bench NOT RUN" "sanitizer NOT RUN"
CUDA_VISIBLE_DEVICES='' PDSERVE_PLUMBING_FAKE=preflight=pass PATH=/usr/bin:/bin timeout 60 "$run_tests" "$work/no-fake" \
  >/dev/null 2>&1
[[ $? -eq 3 ]] || fail "PDSERVE_PLUMBING_FAKE is honoured outside the plumbing check"

# The stages' plumbing on the CPU: every stage that can run here passes, the others skip.
CUDA_VISIBLE_DEVICES='' PDSERVE_GPU_WORK=$work/plumbing-work timeout 300 "$run_tests" "$work/plumbing" \
  --plumbing-check >"$work/plumbing.out" 2>&1
code=$?
verdicts=$work/plumbing/verdicts.txt
for expected in "preflight PASS" "model PASS" "gpu_tests SKIP" "generate PASS"; do
  grep -q "^$expected " "$verdicts" 2>/dev/null || fail "plumbing check: no '$expected' in the verdicts"
done
grep -q '^hf \(SKIP\|PASS\) ' "$verdicts" || fail "plumbing check: hf neither skipped nor passed"
grep -q 'cuda32: 2/2 prompts equal ids' "$verdicts" || fail "plumbing check: cpu float32 twice gave other ids"
[[ $code -eq 0 ]] || fail "plumbing check exit $code"
expect_files "$work/plumbing" verdicts.txt details.tar.gz preflight.log model.log gpu_tests.log generate.log hf.log
listing=$(tar -tzf "$work/plumbing/details.tar.gz")  # not piped into grep -q: pipefail
grep -q 'details/generate.jsonl' <<<"$listing" || fail "details.tar.gz lacks the comparison records"
CUDA_VISIBLE_DEVICES='' PDSERVE_GPU_WORK=$work/plumbing-work timeout 400 "$run_tests" "$work/plumbing2" \
  --second --plumbing-check >"$work/plumbing2.out" 2>&1
code=$?
expect_verdicts "$work/plumbing2" "preflight PASS" "pd PASS" "kvpath PASS" "bench SKIP" "sanitizer SKIP"
[[ $code -eq 0 ]] || fail "second run's plumbing check exit $code"
expect_files "$work/plumbing2" verdicts.txt details.tar.gz preflight.log pd.log kvpath.log bench.log sanitizer.log
for transport in tcp sm; do
  grep -q "^pd PASS .*$transport: 1P1D over UCX $transport.* 32 answers identical to the colocated node" \
    "$work/plumbing2/verdicts.txt" || fail "second run: the pd stage's verdict lacks 1P1D over $transport"
done
grep -q '^kvpath PASS .*sm: TTFT .*first token -> KV landed.*tcp: TTFT' "$work/plumbing2/verdicts.txt" ||
  fail "second run: the kvpath stage's verdict lacks the transports' figures"
grep -q 'details/kvpath.json' <<<"$(tar -tzf "$work/plumbing2/details.tar.gz")" ||
  fail "second run: details.tar.gz lacks kvpath.json"
grep -Eq '^bench SKIP .*each of its [1-9][0-9]* runs exits 2 without a device \(its flags parsed\)' "$work/plumbing2/verdicts.txt" ||
  fail "second run: pdserve-bench-gpu did not reach the device check with the bench stage's flags"
if [[ $failures -ne 0 ]]; then
  echo "--- plumbing output"; cat "$work/plumbing.out" "$work/plumbing2.out"
  tail -30 "$work/plumbing"/*.log "$work/plumbing2"/*.log 2>/dev/null
fi
cat "$verdicts" "$work/plumbing2/verdicts.txt"
echo "gpu bundle: $failures failure(s)"
[[ $failures -eq 0 ]]
