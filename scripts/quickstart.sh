#!/usr/bin/env bash
# Builds pdserve, finds a Qwen3 model (a real one in the local Hugging Face cache, or a
# synthetic Qwen3-0.6B-shape checkpoint it writes once), and generates an answer on the CPU.
# Usage: scripts/quickstart.sh [--model DIR|hub-id] [extra pdserve-generate flags...]
set -euo pipefail
cd "$(dirname "$0")/.."
preset=${PDSERVE_PRESET:-default}

cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset" -j "$(nproc)" --target pdserve-generate pdserve-make-model
build_dir=build
[[ "$preset" == default ]] || build_dir=build-$preset

model=""
if [[ "${1:-}" == "--model" ]]; then
  model=$2
  shift 2
else
  hub_cache=${HF_HUB_CACHE:-${HF_HOME:-$HOME/.cache/huggingface}/hub}
  for id in Qwen3-0.6B Qwen3-1.7B Qwen3-4B Qwen3-8B; do
    if [[ -d "$hub_cache/models--Qwen--$id/snapshots" ]]; then model=Qwen/$id; break; fi
  done
fi
if [[ -z "$model" ]]; then
  model=${PDSERVE_MODEL_CACHE:-$HOME/.cache/pdserve/models}/qwen3-0.6b-synthetic
  if [[ ! -f "$model/config.json" ]]; then
    echo "quickstart: no Qwen3 in the Hugging Face cache; writing a synthetic Qwen3-0.6B-shape checkpoint"
    echo "quickstart: (random weights: the text is gibberish, the numbers are real) to $model"
    "$build_dir/tools/make_model/pdserve-make-model" --config configs/models/qwen3-0.6b/config.json \
      --out "$model" --seed 1
  fi
fi

echo "quickstart: model $model"
"$build_dir/tools/generate/pdserve-generate" --model "$model" \
  --prompt "Explain KV cache in one sentence." --max-new-tokens 32 --temperature 0 --show-stats "$@"
