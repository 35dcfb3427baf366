#!/usr/bin/env bash
# run-gpu-tests.sh OUT [--second] [--skip S1,S2] [--only S1,S2] [--budget-s N] [--list]
#                  [--plumbing-check]
#
# A GPU session of issue #28 in two commands, from a bundle made by scripts/gpu-bundle.sh and
# placed at the root of the repository checkout:
#   build-gpu-bundle/run-gpu-tests.sh OUT            the first run: budget 360 s; decisive first:
#                                                    preflight, model, gpu_tests, generate, hf
#   build-gpu-bundle/run-gpu-tests.sh OUT --second   the second run: budget 300 s; preflight,
#                                                    pd, kvpath, bench, sanitizer
# Each stage runs in its own process group under the limit min(its own limit, what is left of
# the budget), so no stage outlives the budget; a stage that cannot start (less than 5 s left,
# or no device) is written as NOT RUN. As each stage ends, OUT gets its log and its verdict:
#   verdicts.txt     one line per stage, appended as it ends: STAGE PASS / FAIL / TIMEOUT /
#                    NOT RUN / SKIP, seconds, its limit and stand-in duration, what it found
#   STAGE.log        the stage's output, with its command lines
#   bench-gpu.md     pdserve-bench-gpu's tables (the second run's bench stage)
#   details.tar.gz   at the end: comparison records, gtest XML, nvidia-smi, library resolution
# Exit status: 0 every stage passed; 1 a stage failed; 4 a stage timed out (none failed);
# 5 a stage did not run (none failed or timed out); 3 no usable CUDA device (the preflight
# fails in seconds, the rest is NOT RUN); 2 bad arguments. A stage left out with --skip or
# --only is SKIP and changes nothing.
#
# --plumbing-check runs the stages' plumbing where there is no GPU (CPU test gpu_bundle_script):
# the device runs become CPU runs on a 2-layer model, and stages that need the device or
# PyTorch report SKIP instead of FAIL. Only there, PDSERVE_PLUMBING_FAKE=STAGE=OUTCOME,...
# (pass, fail, hang) replaces a stage by that outcome, so the test can check the verdicts and
# exit codes of failed, timed-out and starved stages.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=${PDSERVE_REPO:-$(cd "$here/.." && pwd)}  # the checkout the bundle sits in
started=$(date +%s)

# ---- stages ---------------------------------------------------------------------------------
# Order: the decisive evidence first (the device opens, the kernels' tests, the engine's strict
# float32 ids against the CPU's, transformers), the model before the stages that read it.
# Limits (seconds) sum to at most each run's budget less its reserve. STAGE_STANDIN: seconds
# each stage took in --plumbing-check (2-layer model, CPU, 2 prompts x 12 tokens, the 2-core CI
# machine, 2026-11-28), printed beside the limits; gpu_tests, bench and sanitizer skip there
# (no device), hf too without transformers. The GPU's full-depth durations are not measured
# yet: the limits are estimates, to be replaced by the first run's seconds.
# The second run: correctness of the disaggregation (pd) before its cost (kvpath), both before
# the bench table and the sanitizer.
FIRST_STAGES=(preflight model gpu_tests generate hf)
SECOND_STAGES=(preflight pd kvpath bench sanitizer)
declare -A STAGE_LIMIT=([preflight]=20 [model]=40 [gpu_tests]=150 [generate]=90 [hf]=55
                        [pd]=65 [kvpath]=75 [bench]=95 [sanitizer]=40)
declare -A STAGE_STANDIN=([preflight]=0 [model]=4 [gpu_tests]=0 [generate]=13 [hf]=1
                          [pd]=67 [kvpath]=35 [bench]=0 [sanitizer]=1)
GPU_TEST_LIMIT=60  # each gpu test binary in the gpu_tests stage
# The plumbing check's stage limits are this many times the GPU's: its CPU stand-in runs the
# PD stages' nodes for real, slower than the GPU they stand in for (pd: 67 s against 65).
PLUMBING_SLOWDOWN=2
MIN_START=5        # a stage with fewer seconds of the budget left is NOT RUN
RESERVE=5          # seconds of the budget kept for packing details.tar.gz
declare -A STAGE_WHAT=(
  [preflight]="device, driver, libraries resolve, the device opens"
  [model]="pdserve-make-model: full-depth synthetic Qwen3-0.6B (28 layers, bf16)"
  [gpu_tests]="every gpu-label test binary (cuda_backend, cuda_strict, cuda_engine, device_sampler, cuda_fp8_linear), ${GPU_TEST_LIMIT}s each"
  [generate]="pdserve-generate cuda float32 == cpu float32 greedy ids (4 prompts x 64 tokens); bf16 margins"
  [hf]="transformers Qwen3ForCausalLM vs pdserve cuda float32 / bf16 and cpu float32"
  [pd]="1P1D on the one GPU (UCX tcp, then sm): 32 concurrent greedy requests == a colocated node, no KV block left in use"
  [kvpath]="full-depth 0.6B, 1k-token prompts: KV transfer GB/s beside cudaMemcpy D2H/H2D; 1P1D TTFT and first token -> KV landed (sm, tcp) beside colocated"
  [bench]="pdserve-bench-gpu, 0.6B and 8B shapes: decode batch 1/8/32/128 at context 1k and 4k, prefill 1k/4k/8k; 8B with FP8 weights: decode at 1k, prefill 4k"
  [sanitizer]="compute-sanitizer memcheck + racecheck on the kernel tests"
)
# PD nodes' device: the one GPU for every node (the CPU in the plumbing check).
PD_DEVICE=cuda:0
# ---- LATER STAGES GO HERE -------------------------------------------------------------------
# To add one:
# write a function stage_NAME below (it gets its time limit in $1, runs its commands through
# `run`, writes its files to "$work/NAME/", returns 0 / 1 / 77 = skipped, and calls
# `finding "..."` for its verdict), put NAME into FIRST_STAGES or SECOND_STAGES where it
# belongs, give it a STAGE_LIMIT (keep the sum within the budget), a STAGE_STANDIN and a
# STAGE_WHAT, and list in gpu-bundle.sh's BUNDLED_BINARIES any binary it needs.
# ----------------------------------------------------------------------------------------------

usage() {
  sed -n '2,30p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

out=""
budget=""
skip=","
only=""
plumbing=0
second=0
list=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --skip) skip=",${2:?},"; shift 2 ;;
    --only) only=",${2:?},"; shift 2 ;;
    --budget-s) budget=${2:?}; shift 2 ;;
    --second) second=1; shift ;;
    --plumbing-check) plumbing=1; shift ;;
    --list) list=1; shift ;;
    -h|--help) usage ;;
    -*) echo "error: unknown option $1" >&2; usage ;;
    *) [[ -z $out ]] || { echo "error: one OUT folder" >&2; usage; }; out=$1; shift ;;
  esac
done
if [[ $second -eq 1 ]]; then
  STAGES=("${SECOND_STAGES[@]}"); run_name=second; budget=${budget:-300}
else
  STAGES=("${FIRST_STAGES[@]}"); run_name=first; budget=${budget:-360}
fi
if [[ $list -eq 1 ]]; then
  printf '%-10s %6s %9s  %s\n' stage limit stand-in what
  for stage in "${STAGES[@]}"; do
    printf '%-10s %5ss %8ss  %s\n' "$stage" "${STAGE_LIMIT[$stage]}" "${STAGE_STANDIN[$stage]}" \
      "${STAGE_WHAT[$stage]}"
  done
  echo "budget ${budget}s (the $run_name run)"
  exit 0
fi
[[ -n $out ]] || { echo "error: name the OUT folder" >&2; usage; }
[[ $budget =~ ^[0-9]+$ ]] || { echo "error: --budget-s takes seconds" >&2; exit 2; }
for name in ${skip//,/ } ${only//,/ }; do
  [[ -n ${STAGE_LIMIT[$name]:-} ]] || { echo "error: no stage '$name' (--list)" >&2; exit 2; }
done
if [[ ! -d $repo/configs/models || ! -f $here/binaries.tar.gz ]]; then
  echo "error: $here is not a GPU bundle at the root of a pdserve checkout" \
       "(scripts/gpu-bundle.sh BUILD build-gpu-bundle)" >&2
  exit 2
fi

mkdir -p "$out"
out=$(cd "$out" && pwd)
verdicts=$out/verdicts.txt
log=/dev/null  # each stage's subshell sets its own: $out/STAGE.log
work=${PDSERVE_GPU_WORK:-${TMPDIR:-/tmp}/pdserve-gpu-run}
rm -rf "$work"
mkdir -p "$work/details"
rm -f "$out"/*.log "$out/verdicts.txt" "$out/details.tar.gz" "$out/bench-gpu.md"
: >"$verdicts"
exec 3>&1  # the terminal: stage lines and the verdicts; everything else goes to the logs
verdict() { echo "$*" >>"$verdicts"; echo "$*" >&3; }

# ---- the bundle's environment (bundle-env.sh: the libraries the binaries need) -----------------
# shellcheck source=bundle-env.sh
source "$here/bundle-env.sh"
export PDSERVE_SOURCE_DIR=$repo
export PDSERVE_ASSETS_DIR=$repo/configs/models
export PDSERVE_BINARY_DIR=$work/binary
export PYTHONUNBUFFERED=1
mkdir -p "$PDSERVE_BINARY_DIR"
bin=$PDSERVE_BUNDLE_BIN  # (bundle-env.sh unpacked it)
model=$work/qwen3-0.6b-synthetic
device=cuda
new_tokens=64
if [[ $plumbing -eq 1 ]]; then
  device=cpu
  PD_DEVICE=cpu
  new_tokens=12
fi

# The Python that has numpy (the comparisons), and the one with torch and transformers (hf):
# the GPU machine's python3 has all of them.
python_with() {
  local python
  for python in python3 /opt/torch/.venv/bin/python3 /usr/bin/python3; do
    command -v "$python" >/dev/null 2>&1 || continue
    if run 30 "$python" -c "import $1" >/dev/null 2>&1; then echo "$python"; return 0; fi
  done
  return 1
}

# ---- running stages (inside a stage's subshell) ------------------------------------------------
stage=""
stage_deadline=0
finding() { echo "$*" >>"$work/$stage.finding"; }
# run LIMIT COMMAND...: logs the command line, runs it under timeout (LIMIT, at most what is left
# of the stage) with its output in the stage's log; a timeout is noted for the verdict.
run() {
  local limit=$1 left code
  shift
  left=$((stage_deadline - $(date +%s)))
  [[ $left -lt $limit ]] && limit=$left
  [[ $limit -ge 1 ]] || limit=1
  echo "\$ $*" >>"$log"
  timeout --kill-after=5 "$limit" "$@" >>"$log" 2>&1
  code=$?
  if [[ $code -eq 124 || $code -eq 137 ]]; then
    echo "(timed out after ${limit}s)" >>"$log"
    : >"$work/$stage.timedout"
  fi
  return $code
}
elapsed() { echo $(($(date +%s) - started)); }
wanted() {
  [[ $skip != *",$1,"* ]] && { [[ -z $only ]] || [[ $only == *",$1,"* ]]; }
}
# descendants PID: the process ids under PID, its children's first.
descendants() {
  local child
  for child in $(pgrep -P "$1"); do
    echo "$child"
    descendants "$child"
  done
}
# alive PID...: whether any of them still runs.
alive() {
  local pid
  for pid in "$@"; do kill -0 "$pid" 2>/dev/null && return 0; done
  return 1
}
# The outcome PDSERVE_PLUMBING_FAKE gives STAGE (plumbing check only), or nothing.
fake_outcome() {
  [[ $plumbing -eq 1 ]] || return 0
  local item fakes=${PDSERVE_PLUMBING_FAKE:-}
  for item in ${fakes//,/ }; do
    [[ ${item%%=*} == "$1" ]] && echo "${item#*=}"
  done
  return 0
}

stage_preflight() {
  local limit=$1 code
  if ! run 20 nvidia-smi; then
    finding "nvidia-smi fails: no NVIDIA driver or GPU here"
    [[ $plumbing -eq 1 ]] || return 3
  else
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader \
      >"$work/details/gpu.txt" 2>&1
    finding "$(head -1 "$work/details/gpu.txt")"
  fi
  local binary
  for binary in "$bin"/*; do
    ldd "$binary" 2>&1 | sed "s|^|$(basename "$binary"): |" >>"$work/details/ldd.txt"
  done
  if grep -q 'not found' "$work/details/ldd.txt"; then
    finding "libraries not found: $(grep 'not found' "$work/details/ldd.txt" | awk '{print $1 $2}' | sort -u | tr '\n' ' ')(LD_LIBRARY_PATH=$LD_LIBRARY_PATH)"
    return 3
  fi
  # Which CUDA libraries resolved (cudart and cuBLAS 13 on a CUDA 13 machine).
  finding "$(grep -oE '(libcudart|libcublas)\.so\.[0-9]+ => [^ ]+' "$work/details/ldd.txt" | sort -u |
             sed 's/ => /: /' | paste -sd ' ')"
  # The bundle's own device probe: a gpu test binary that runs no test but opens the device.
  run "$limit" "$bin/cuda_strict_test" --gtest_filter=NoTestHasThisName
  code=$?
  [[ $code -eq 0 ]] && return 0
  if [[ $plumbing -eq 1 && $code -eq 77 ]]; then
    finding "no device (plumbing check)"
    return 0
  fi
  finding "the CUDA device does not open (exit $code, see the log)"
  return 3
}

stage_model() {
  local layers=()
  [[ $plumbing -eq 1 ]] && layers=(--layers 2)
  run "$1" "$bin/pdserve-make-model" --config "$repo/configs/models/qwen3-0.6b/config.json" \
    --out "$model" --seed 1 --dtype bfloat16 --tokenizer-dir "$repo/configs/models/qwen3-tokenizer" \
    "${layers[@]}" || return 1
  finding "$(du -sh "$model" | cut -f1) at $model"
}

stage_gpu_tests() {
  local limit=$1 deadline=$(($(date +%s) + $1)) failed=0 ran=0 skipped=0 name left code
  export PDSERVE_GPU_MODEL_DIR=$model  # the engine test reuses the model stage's checkpoint
  while read -r name; do
    [[ -n $name ]] || continue
    left=$((deadline - $(date +%s)))
    if [[ $left -lt 10 ]]; then finding "$name NOT RUN (no time left)"; failed=1; continue; fi
    [[ $left -gt $GPU_TEST_LIMIT ]] && left=$GPU_TEST_LIMIT
    run "$left" "$bin/$name" --gtest_output="xml:$work/details/$name.xml"
    code=$?
    case $code in
      0) ran=$((ran + 1)) ;;
      77) skipped=$((skipped + 1)); finding "$name skipped (no device)" ;;
      124|137) failed=1; finding "$name TIMEOUT" ;;
      *) failed=1; finding "$name FAILED (exit $code)" ;;
    esac
  done <"$here/gpu-tests.txt"
  finding "$ran passed, $skipped skipped of $(grep -c . "$here/gpu-tests.txt")"
  [[ $failed -eq 0 ]] || return 1
  [[ $ran -gt 0 || $plumbing -eq 0 ]] || return 77
}

# Seeded prompts of 1, 9, 64 and 250 tokens (2 short ones in the plumbing check).
write_prompts() {
  python3 - "$1" "$plumbing" <<'PY'
import json, random, sys
rng = random.Random(13)
lengths = [1, 9] if sys.argv[2] == "1" else [1, 9, 64, 250]
json.dump([[rng.randrange(151000) for _ in range(n)] for n in lengths], open(sys.argv[1], "w"))
PY
}

# generate_run DEADLINE LABEL ARGS...: every prompt through pdserve-generate into runs/LABEL/
# (prompt-I.ids.json, prompt-I.logits.npy) before DEADLINE (epoch seconds); its commands and
# errors go to runs/LABEL.log.
generate_run() {
  local deadline=$1 label=$2 index=0 ids left
  shift 2
  mkdir -p "$work/runs/$label"
  while read -r ids; do
    local target=$work/runs/$label/prompt-$index
    left=$((deadline - $(date +%s)))
    if [[ $left -lt 1 ]]; then
      echo "error: no time left for prompt $index" >>"$work/runs/$label.log"
      return 1
    fi
    echo "\$ pdserve-generate --model $model --prompt-ids ${ids:0:40}... $*" >>"$work/runs/$label.log"
    timeout --kill-after=10 "$left" "$bin/pdserve-generate" --model "$model" \
      --prompt-ids "$ids" --max-new-tokens "$new_tokens" --temperature 0 --ignore-eos \
      --print-ids --logits-out "$target.logits.npy" "$@" >"$target.ids.json" \
      2>>"$work/runs/$label.log" || return 1
    index=$((index + 1))
  done < <(python3 -c 'import json,sys; [print(",".join(map(str, p))) for p in json.load(open(sys.argv[1]))]' "$work/prompts.json")
}

stage_generate() {
  local limit=$1 failed=0 index count label mode deadline python
  deadline=$(($(date +%s) + limit - 20))  # 20 s kept for the comparisons
  [[ -d $model ]] || { finding "no model (the model stage did not run)"; return 1; }
  python=$(python_with numpy) || { finding "no python3 with numpy"; return 1; }
  write_prompts "$work/prompts.json"
  count=$(python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))))' "$work/prompts.json")
  # The CPU runs take the CPU's cores while the device runs take the GPU: side by side.
  generate_run "$deadline" cpu32 --device cpu --dtype float32 &
  local cpu_runs=$!
  # bf16: the CUDA default (on the plumbing check's CPU: bf16 weights, float32 compute).
  local bf16_args=(--device "$device")
  [[ $plumbing -eq 1 ]] && bf16_args+=(--dtype bfloat16)
  generate_run "$deadline" cuda32 --device "$device" --dtype float32 || failed=1
  [[ $failed -eq 0 ]] && { generate_run "$deadline" cuda16 "${bf16_args[@]}" || failed=2; }
  wait "$cpu_runs" || failed=3
  cat "$work/runs/"*.log >>"$log"
  case $failed in
    1) finding "the $device float32 runs failed (see the log)"; return 1 ;;
    2) finding "the $device bf16 runs failed (see the log)"; return 1 ;;
    3) finding "the cpu float32 runs failed (see the log)"; return 1 ;;
  esac
  for label in cuda32 cuda16; do
    mode=strict
    [[ $label == cuda16 ]] && mode=report
    for ((index = 0; index < count; index++)); do
      run 30 "$python" "$repo/scripts/gpu/compare_runs.py" --mode "$mode" \
        --label "$label vs cpu32, prompt $index" --json "$work/details/generate.jsonl" \
        --reference "$work/runs/cpu32/prompt-$index.ids.json" "$work/runs/cpu32/prompt-$index.logits.npy" \
        --candidate "$work/runs/$label/prompt-$index.ids.json" "$work/runs/$label/prompt-$index.logits.npy" ||
        failed=1
    done
  done
  finding "$("$python" - "$work/details/generate.jsonl" <<'PY'
import json, sys
records = [json.loads(line) for line in open(sys.argv[1])]
parts = []
for label in ("cuda32", "cuda16"):
    mine = [r for r in records if r["label"].startswith(label)]
    equal = sum(r["equal_ids"] for r in mine)
    worst = max((r["worst_row_error"] for r in mine), default=0)
    margins = ", ".join(f"p{r['label'].rsplit(' ', 1)[1]}@{r['first_difference']}:"
                        f"{r['reference_top2_margin']:.3g}" for r in mine if not r["equal_ids"])
    parts.append(f"{label}: {equal}/{len(mine)} prompts equal ids, worst row error {worst:.2g}"
                 + (f", first differences (cpu margin) {margins}" if margins else ""))
print("; ".join(parts))
PY
)"
  return $failed
}

stage_hf() {
  local limit=$1
  [[ -d $work/runs/cuda32 ]] || { finding "no pdserve runs (the generate stage did not run)"; return 1; }
  local python
  if ! python=$(python_with "numpy, torch, transformers"); then
    finding "no python3 with numpy, torch and transformers"
    [[ $plumbing -eq 1 ]] && return 77
    return 1
  fi
  local hf_device=cuda
  [[ $plumbing -eq 1 ]] && hf_device=cpu
  run "$limit" "$python" "$repo/scripts/gpu/hf_compare.py" --model "$model" \
    --prompts "$work/prompts.json" --device "$hf_device" --json "$work/details/hf.json" \
    --run "float32:$work/runs/cuda32:pdserve $device float32" \
    --run "bfloat16:$work/runs/cuda16:pdserve $device bf16" \
    --run "float32:$work/runs/cpu32:pdserve cpu float32"
  local code=$?
  finding "$(grep -a 'transformers comparison:' "$log" | tail -1)"
  return $code
}

# A build folder of wrappers in the layout tools/cluster/pdserve-cluster and the PD scripts
# expect (BUILD/proxy/pdserve-proxy, ...), each running the bundle's binary through run.sh.
pd_build_dir() {
  local path
  for path in proxy/pdserve-proxy prefill_node/pdserve-prefill decode_node/pdserve-decode \
              tools/make_model/pdserve-make-model; do
    mkdir -p "$work/build/$(dirname "$path")"
    printf '#!/usr/bin/env bash\nexec "%s/run.sh" %s "$@"\n' "$here" "$(basename "$path")" \
      >"$work/build/$path"
    chmod +x "$work/build/$path"
  done
  echo "$work/build"
}

# 1P1D on the one GPU: tests/pd/pd_e2e_test.py's tcp and sm phases (each: a colocated node's
# answers to 32 concurrent greedy requests, then the same through proxy -> prefill -> UCX ->
# decode, identical, every node took work and holds no KV block afterwards), each phase with
# half of the stage.
PD_PHASES=(tcp sm)
stage_pd() {
  local build index phase left failed=0 python
  build=$(pd_build_dir)
  python=$(command -v python3) || { finding "no python3"; return 1; }
  for ((index = 0; index < ${#PD_PHASES[@]}; index++)); do
    phase=${PD_PHASES[$index]}
    left=$(((stage_deadline - $(date +%s)) / (${#PD_PHASES[@]} - index)))
    if [[ $left -lt 5 ]]; then finding "$phase NOT RUN (no time left)"; failed=1; continue; fi
    run "$left" env PDSERVE_BUILD_DIR="$build" PDSERVE_SOURCE_DIR="$repo" \
      PDSERVE_E2E_NODE_ARGS="--device $PD_DEVICE" "$python" "$repo/tests/pd/pd_e2e_test.py" "$phase"
    case $? in
      0) finding "$phase: $(grep -a '^ok: 1P1D' "$log" | tail -1 | sed 's/^ok: //')" ;;
      124|137) failed=1; finding "$phase TIMEOUT" ;;
      *) failed=1; finding "$phase FAILED: $(grep -a '^FAIL:' "$log" | tail -1 | cut -c1-300)" ;;
    esac
  done
  return $failed
}

# What the KV transfer costs, on the full-depth 0.6B shape with 1k-token prompts (64 on the
# plumbing check's 2-layer CPU model): pdserve-bench-kv-transfer (direct and staged GB/s beside
# cudaMemcpy D2H/H2D; not ucx_perftest, whose tcp put_bw can stall for minutes), then bench/kv_transfer/kv_path_bench.py (1P1D over sm and tcp, KV sent
# layer by layer, beside a colocated node: TTFT, TPOT and first token -> KV landed).
stage_kvpath() {
  local build model=$work/kvpath/model python tokens=1024 requests=3 max_tokens=32 layers=() code
  build=$(pd_build_dir)
  python=$(command -v python3) || { finding "no python3"; return 1; }
  if [[ $plumbing -eq 1 ]]; then tokens=64; requests=1; max_tokens=4; layers=(--layers 2); fi
  run "$1" "$bin/pdserve-make-model" --config "$repo/configs/models/qwen3-0.6b/config.json" \
    --out "$model" --seed 7 --dtype bfloat16 "${layers[@]}" || { finding "pdserve-make-model failed"; return 1; }
  run "$1" "$bin/pdserve-bench-kv-transfer" --device "$PD_DEVICE" \
    --config "$repo/configs/models/qwen3-0.6b/config.json" --tokens "$tokens" --repeats 5 \
    --pool-blocks $((tokens / 16 + 8)) --no-perftest || { finding "pdserve-bench-kv-transfer failed (see the log)"; return 1; }
  run "$1" "$python" "$repo/bench/kv_transfer/kv_path_bench.py" --build-dir "$build" \
    --model "$model" --prompt-tokens "$tokens" --requests "$requests" --max-tokens "$max_tokens" \
    --transports sm,tcp --layerwise on --colocated --kv-gib 2 --threads 1 \
    --json "$work/details/kvpath.json" \
    --node-args "--device $PD_DEVICE --max-num-batched-tokens $((tokens + 64))"
  code=$?
  [[ $code -eq 0 ]] || { finding "kv_path_bench.py failed (exit $code, see the log)"; return 1; }
  finding "$("$python" - "$work/details/kvpath.json" <<'PY'
import json, sys
parts = []
for result in json.load(open(sys.argv[1])):
    m = result["median"]
    if result["tls"] == "colocated":
        parts.append(f"colocated TTFT {m['client_ttft_ms']:.1f} ms")
    else:
        parts.append(f"{result['tls']}: TTFT {m['client_ttft_ms']:.1f} ms, first token -> KV landed "
                     f"{m['cost_ms']:.1f} ms, transfer {m['gb_per_s']:.3g} GB/s")
print("; ".join(parts) + " (medians)")
PY
)"
}

# Issue #28's table: decode batch 1/8/32/128 at context 1k and 4k, prefill 1k/4k/8k (one
# pdserve-bench-gpu run per context; the 8k prefill's run repeats batch 1 at 1k), both shapes;
# then issue #31's FP8 weights on the 8B shape (decode at 1k, prefill 4k, beside the FP8 GEMM
# peak). PDSERVE_BENCH_ARGS replaces them by one run with those flags.
BENCH_RUNS=("--batches 1 8 32 128 --context 1024 --prompt 1024 --repeats 3"
            "--batches 1 8 32 128 --context 4096 --prompt 4096 --repeats 3"
            "--batches 1 --context 1024 --prompt 8192 --repeats 3"
            "--weights fp8 --shapes qwen3-8b --batches 1 8 32 128 --context 1024 --prompt 4096 --repeats 3")
stage_bench() {
  local code left runs=("${BENCH_RUNS[@]}") index failed=0 args no_device=0
  [[ -n ${PDSERVE_BENCH_ARGS:-} ]] && runs=("$PDSERVE_BENCH_ARGS")
  : >"$out/bench-gpu.md"
  for ((index = 0; index < ${#runs[@]}; index++)); do
    args=${runs[$index]}
    # Each run gets an equal share of what is left, so the later ones are not starved.
    left=$(((stage_deadline - $(date +%s)) / (${#runs[@]} - index)))
    if [[ $left -lt 5 ]]; then finding "pdserve-bench-gpu $args NOT RUN (no time left)"; failed=1; continue; fi
    echo "\$ $bin/pdserve-bench-gpu $args (limit ${left}s)" >>"$log"
    printf '\n## pdserve-bench-gpu %s\n\n' "$args" >>"$out/bench-gpu.md"
    # shellcheck disable=SC2086  # args: flags, split on spaces
    timeout --kill-after=5 "$left" "$bin/pdserve-bench-gpu" $args >>"$out/bench-gpu.md" 2>>"$log"
    code=$?
    if [[ $plumbing -eq 1 && $code -eq 2 ]] && tail -3 "$log" | grep -q 'no usable CUDA device'; then
      no_device=$((no_device + 1))
      continue
    fi
    case $code in
      0) ;;
      124|137) failed=1; : >"$work/$stage.timedout"; finding "pdserve-bench-gpu $args TIMEOUT" ;;
      *) failed=1; finding "pdserve-bench-gpu $args FAILED (exit $code)" ;;
    esac
  done
  if [[ $no_device -gt 0 && $no_device -eq ${#runs[@]} ]]; then
    finding "each of its $no_device runs exits 2 without a device (its flags parsed)"
    rm -f "$out/bench-gpu.md"
    return 77
  fi
  cat "$out/bench-gpu.md" >>"$log"
  finding "$(grep -c '^| decode\|^| prefill' "$out/bench-gpu.md") rows in bench-gpu.md"
  return $failed
}

stage_sanitizer() {
  local limit=$1 sanitizer failed=0 share
  sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer \
              /usr/local/cuda*/compute-sanitizer/compute-sanitizer 2>/dev/null | head -1)
  if [[ -z $sanitizer ]]; then
    finding "compute-sanitizer not found"
    [[ $plumbing -eq 1 ]] && return 77
    return 1
  fi
  share=$((limit / 5))  # each of the 5 runs below
  # Every kernel and both element types on small shapes (no model, no 32k contexts: the tools
  # slow kernels down 10-100x). The sampling kernel gets memcheck only: racecheck over its
  # radix selections on 152k-token rows would take minutes.
  local tool binary filter
  while read -r tool binary filter; do
    run "$share" "$sanitizer" --tool "$tool" --error-exitcode 99 --print-limit 20 \
      "$bin/$binary" --gtest_filter="$filter"
    case $? in
      0) ;;
      124|137) failed=1; finding "$tool on $binary: TIMEOUT" ;;
      99) failed=1; finding "$tool on $binary reports errors (see the log)" ;;
      *) failed=1; finding "$tool on $binary: the tests failed under it (see the log)" ;;
    esac
  done <<'RUNS'
memcheck cuda_backend_test CudaVsCpu.*:*CudaPagedAttention*decode_gqa2*:*CudaPagedAttention*prefill_chunks*
memcheck cuda_strict_test StrictFloat32.Norm*:Cases/PlantedAttention.*/decode_boundaries*:Cases/PlantedAttention.*/prefill_whole*
memcheck device_sampler_test CudaSampler.*
racecheck cuda_backend_test CudaVsCpu.RmsNorm*:*CudaPagedAttention*decode_mha_hd64*:*CudaPagedAttention*prefill_gqa16_hd256*
racecheck cuda_strict_test Cases/PlantedAttention.*/prefill_whole_prompt_actf32_kvbf16:Cases/PlantedAttention.*/mha_hd64_actbf16_kvf32_Cuda
RUNS
  [[ $failed -eq 0 ]] && finding "memcheck and racecheck clean"
  return $failed
}

# ---- the run ----------------------------------------------------------------------------------
# Each stage is a background job in its own process group (set -m), watched against its limit:
# past it the group gets TERM, then KILL, and the stage is TIMEOUT.
set -m
status=0
failed=0
timed_out=0
not_run=0
no_device=""
echo "# pdserve GPU run ($run_name): $(date -u +%FT%TZ), budget ${budget}s, bundle $here, work $work" \
  >>"$verdicts"
echo "# stage result seconds (limit; stand-in) findings" >>"$verdicts"
for stage in "${STAGES[@]}"; do
  limit=${STAGE_LIMIT[$stage]}
  [[ $plumbing -eq 1 ]] && limit=$((limit * PLUMBING_SLOWDOWN))
  standin=${STAGE_STANDIN[$stage]}
  if ! wanted "$stage"; then
    verdict "$stage SKIP 0s (not asked for)"
    continue
  fi
  left=$((budget - RESERVE - $(elapsed)))
  if [[ -n $no_device ]]; then
    verdict "$stage NOT RUN 0s (limit ${limit}s; stand-in ${standin}s): no usable CUDA device"
    not_run=1
    continue
  fi
  [[ $left -lt $limit ]] && limit=$left
  if [[ $limit -lt $MIN_START ]]; then
    verdict "$stage NOT RUN 0s (limit ${STAGE_LIMIT[$stage]}s; stand-in ${standin}s): ${left}s of the budget left"
    not_run=1
    continue
  fi
  echo "== $stage (limit ${limit}s): ${STAGE_WHAT[$stage]}" >&3
  stage_log=$out/$stage.log
  {
    echo "== $stage $(date -u +%T), limit ${limit}s: ${STAGE_WHAT[$stage]}"
    echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  } >"$stage_log"
  rm -f "$work/$stage.finding" "$work/$stage.timedout"
  mkdir -p "$work/$stage"
  stage_started=$(date +%s)
  stage_end=$((stage_started + limit))
  (
    set +m  # the stage's own background jobs stay in its process group
    log=$stage_log
    stage_deadline=$stage_end
    case $(fake_outcome "$stage") in
      pass) finding "faked: pass"; exit 0 ;;
      fail) finding "faked: fail"; exit 1 ;;
      # (under timeout, which moves itself to a process group of its own, as run's commands do)
      hang) finding "faked: hang"; timeout 100000 sleep 100000; exit 1 ;;
    esac
    "stage_$stage" "$limit"
  ) >>"$stage_log" 2>&1 3>&- &
  pid=$!
  while kill -0 "$pid" 2>/dev/null && [[ $(date +%s) -lt $stage_end ]]; do sleep 0.2; done
  if kill -0 "$pid" 2>/dev/null; then
    {  # (bash's "Terminated" notice for the job goes nowhere)
      # The group and every descendant: `timeout` moves itself and its command to a group of
      # their own, which a signal to the stage's group would miss.
      mapfile -t pids < <(descendants "$pid")
      kill -TERM -- "-$pid" "${pids[@]}"
      for _ in 1 2 3 4 5 6 7 8 9 10; do
        alive "${pids[@]}" || break  # (the stage's own shell stays a zombie until `wait`)
        sleep 0.5
      done
      kill -KILL -- "-$pid" "${pids[@]}"
      wait "$pid"
    } 2>/dev/null
    code=124
    echo "(the stage ran past its limit of ${limit}s and was stopped)" >>"$stage_log"
  else
    wait "$pid"
    code=$?
    [[ $code -ne 0 && -e $work/$stage.timedout ]] && code=124
  fi
  seconds=$(($(date +%s) - stage_started))
  case $code in
    0) result=PASS ;;
    77) if [[ $plumbing -eq 1 ]]; then result=SKIP; else result="NOT RUN"; not_run=1; fi ;;
    124|137) result=TIMEOUT; timed_out=1 ;;
    *) result=FAIL; failed=1 ;;
  esac
  stage_finding=$(awk 'NR > 1 { printf "; " } { printf "%s", $0 }' "$work/$stage.finding" 2>/dev/null)
  verdict "$stage $result ${seconds}s (limit ${limit}s; stand-in ${standin}s)${stage_finding:+: $stage_finding}"
  if [[ $stage == preflight && $code -eq 3 ]]; then
    no_device=$stage_finding
    echo "error: no usable CUDA device: $stage_finding" >&3
  fi
done
if [[ -n $no_device ]]; then status=3
elif [[ $failed -eq 1 ]]; then status=1
elif [[ $timed_out -eq 1 ]]; then status=4
elif [[ $not_run -eq 1 ]]; then status=5
fi

# ---- packing ----------------------------------------------------------------------------------
cp "$work/prompts.json" "$work/details/" 2>/dev/null
find "$work/details" -name '*.npy' -delete
timeout 30 tar -czf "$out/details.tar.gz" -C "$work" details >/dev/null 2>&1
echo "# total $(elapsed)s, exit $status" >>"$verdicts"
echo "total $(elapsed)s, exit $status (verdicts in $verdicts)" >&3
exit $status
