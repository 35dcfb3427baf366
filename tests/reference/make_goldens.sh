#!/usr/bin/env bash
# Regenerates the committed golden logits in tests/data/reference/: builds each synthetic
# checkpoint with pdserve-make-model, self-checks the float64 reference on it, then writes
# the golden. Usage: tests/reference/make_goldens.sh BUILD_DIR
set -euo pipefail

if [[ $# -ne 1 ]]; then
  echo "usage: $0 BUILD_DIR   (BUILD_DIR holds tools/make_model/pdserve-make-model)" >&2
  exit 2
fi
make_model="$1/tools/make_model/pdserve-make-model"
if [[ ! -x "$make_model" ]]; then
  echo "make_goldens: $make_model not found; build target pdserve-make-model first" >&2
  exit 2
fi

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
python=/usr/bin/python3 # Debian python3-torch; the pyenv python3 on PATH has no torch
out_dir="$repo/tests/data/reference"
model_seed=7
model_dtype=bfloat16
prompt_length=40 # spans three 16-token blocks
decode_steps=16

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# name | source config (repo-relative) | prompt seed | extra pdserve-make-model flags
cases=(
  "tiny|tests/data/reference/configs/tiny.json|101|--tie"
  "hd64_gqa4|tests/data/reference/configs/hd64_gqa4.json|102|--tie"
  "untied|tests/data/reference/configs/tiny.json|103|--untie"
  "qwen3_0_6b_2layers|configs/models/qwen3-0.6b/config.json|104|--tie --layers 2"
)

goldens=()
for entry in "${cases[@]}"; do
  IFS='|' read -r name config prompt_seed flags <<<"$entry"
  model="$work/$name"
  echo "== $name: $config $flags"
  # shellcheck disable=SC2086 # flags is a deliberate word list
  "$make_model" --config "$repo/$config" --out "$model" --seed "$model_seed" \
    --dtype "$model_dtype" $flags
  vocab=$("$python" -c 'import json, sys; print(json.load(open(sys.argv[1]))["vocab_size"])' \
    "$model/config.json")
  prompt=$("$python" "$here/seeded_ids.py" prompt --seed "$prompt_seed" \
    --count "$prompt_length" --vocab "$vocab")
  "$python" "$here/selfcheck.py" --skip-synthetic --model "$model"
  "$python" "$here/qwen3_reference.py" --model "$model" --prompt-ids "$prompt" \
    --decode-steps "$decode_steps" --source-config "$repo/$config" --seed "$model_seed" \
    --out "$out_dir/$name.json"
  goldens+=("$out_dir/$name.json")
  rm -rf "$model"
done

"$python" "$here/selfcheck.py" --skip-synthetic --golden "${goldens[@]}"
ls -l "${goldens[@]}"
