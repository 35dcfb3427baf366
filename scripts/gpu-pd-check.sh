#!/usr/bin/env bash
# gpu-pd-check.sh BUNDLE OUT: issue #14 on a GPU machine (items 4-6), from the repository root
# (tools/cluster/pdserve-cluster, tests/pd and bench/kv_transfer come from the working tree,
# the binaries from BUNDLE, made by PDSERVE_BUNDLE_PD=1 scripts/gpu-bundle.sh at the repository
# root; see kv_transfer/README.md, "Running it on a GPU", for the build). Everything it prints and measures goes to OUT:
#   summary.txt                    one line per step: its exit status
#   machine.txt                    nvidia-smi, uptime (load), the UCX memory types
#   bench-kv-transfer-SHAPE.md     item 4: direct / staged GB/s beside cudaMemcpy D2H/H2D and
#                                  ucx_perftest, per model shape and prompt length
#   e2e-PHASE.log                  item 5: tests/pd/pd_e2e_test.py with CUDA nodes (1P1D on the
#                                  one GPU over UCX tcp and sm, 32 concurrent greedy requests
#                                  against a colocated CUDA node; staged phases; 2P2D with a
#                                  prefill node killed and decode nodes frozen/killed mid-stream,
#                                  no KV block left in use)
#   kvpath-SHAPE-TOKENS.md         item 6: TTFT, TPOT and the exposed transfer time (first
#                                  token -> KV landed) for disaggregated (sm, tcp) and colocated
#                                  nodes on the same GPU
# Environment (all optional):
#   DEVICE=cuda:0                  the GPU (both nodes share it)
#   STEPS="bench e2e kvpath"       which steps to run
#   SHAPES="qwen3-0.6b qwen3-8b"   model shapes (configs/models/*) for bench and kvpath
#   TOKENS="1024 8192"             prompt lengths for bench and kvpath
#   E2E_PHASES="tcp sm staged-tcp staged-sm 2p2d"
#   KV_GIB=8                       each node's KV pool in kvpath (GiB)
# A dry run on a CPU-only machine: DEVICE=cpu scripts/gpu-pd-check.sh BUNDLE OUT (checks the
# script, not the GPU). Exit status: 0 only if every step passed.
set -uo pipefail

if [[ $# -ne 2 ]]; then
  echo "usage: $0 BUNDLE OUT" >&2
  exit 2
fi
bundle=$(cd "$1" && pwd) || exit 2
out=$2
source_dir=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
out=$(cd "$out" && pwd)
device=${DEVICE:-cuda:0}
steps=${STEPS:-bench e2e kvpath}
shapes=${SHAPES:-qwen3-0.6b qwen3-8b}
tokens=${TOKENS:-1024 8192}
e2e_phases=${E2E_PHASES:-tcp sm staged-tcp staged-sm 2p2d}
kv_gib=${KV_GIB:-8}
for binary in pdserve-proxy pdserve-prefill pdserve-decode pdserve-make-model pdserve-bench-kv-transfer; do
  if [[ ! -x "$bundle/bin/$binary" ]]; then
    echo "error: $bundle/bin/$binary is missing: build it, then PDSERVE_BUNDLE_PD=1 scripts/gpu-bundle.sh" >&2
    exit 2
  fi
done

work=$(mktemp -d "${TMPDIR:-/tmp}/pdserve-gpu-pd.XXXXXX")
trap 'rm -rf "$work"' EXIT
# A build folder of wrappers in the layout pdserve-cluster and the tests expect, each running
# the bundle's binary with the bundle's libraries.
for path in proxy/pdserve-proxy prefill_node/pdserve-prefill decode_node/pdserve-decode \
  tools/make_model/pdserve-make-model bench/kv_transfer/pdserve-bench-kv-transfer; do
  mkdir -p "$work/build/$(dirname "$path")"
  printf '#!/usr/bin/env bash\nexec "%s/run.sh" %s "$@"\n' "$bundle" "$(basename "$path")" \
    > "$work/build/$path"
  chmod +x "$work/build/$path"
done

summary=$out/summary.txt
: > "$summary"
status=0
step() {  # NAME COMMAND...: runs it with its output in OUT/NAME, notes its exit status
  local name=$1
  shift
  echo "== $name: $*" >&2
  "$@" > "$out/$name" 2>&1
  local code=$?
  echo "$name: exit $code" | tee -a "$summary"
  [[ $code -eq 0 ]] || status=1
}

{
  date -u
  uptime
  nvidia-smi 2>&1 || echo "no nvidia-smi"
  # Which memory types the bundle's UCX addresses (the direct path needs "cuda").
  LD_LIBRARY_PATH="$bundle/lib" UCX_MODULE_DIR="$bundle/lib/ucx" ucx_info -d 2>/dev/null |
    grep -E "Memory domain|Component" || echo "ucx_info not installed: see bench-kv-transfer-*.md"
} > "$out/machine.txt" 2>&1

if [[ " $steps " == *" bench "* ]]; then
  for shape in $shapes; do
    # shellcheck disable=SC2086
    step "bench-kv-transfer-$shape.md" "$work/build/bench/kv_transfer/pdserve-bench-kv-transfer" \
      --device "$device" --config "$source_dir/configs/models/$shape/config.json" \
      --tokens $tokens --repeats 5 --pool-blocks 600
  done
fi

if [[ " $steps " == *" e2e "* ]]; then
  for phase in $e2e_phases; do
    step "e2e-$phase.log" env PDSERVE_BUILD_DIR="$work/build" PDSERVE_SOURCE_DIR="$source_dir" \
      PDSERVE_E2E_NODE_ARGS="--device $device" timeout 900 /usr/bin/python3 \
      "$source_dir/tests/pd/pd_e2e_test.py" "$phase"
  done
fi

if [[ " $steps " == *" kvpath "* ]]; then
  for shape in $shapes; do
    model=$work/models/$shape
    step "make-model-$shape.log" "$work/build/tools/make_model/pdserve-make-model" \
      --config "$source_dir/configs/models/$shape/config.json" --out "$model" --seed 7
    for n in $tokens; do
      step "kvpath-$shape-$n.md" timeout 1800 /usr/bin/python3 \
        "$source_dir/bench/kv_transfer/kv_path_bench.py" --build-dir "$work/build" --model "$model" \
        --prompt-tokens "$n" --requests 3 --max-tokens 32 --transports sm,tcp --layerwise on \
        --colocated --kv-gib "$kv_gib" --threads 1 \
        --node-args "--device $device --max-num-batched-tokens $((n + 64))"
    done
    rm -rf "$model"
  done
fi
echo "results in $out (summary.txt)" >&2
exit $status
