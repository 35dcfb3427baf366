#!/usr/bin/env bash
# Builds pdserve, finds a Qwen3 model (a real one in the local Hugging Face cache, or a
# synthetic Qwen3-0.6B-shape checkpoint it writes once), starts a disaggregated cluster on the
# CPU (proxy + 1 prefill + 1 decode node, KV over UCX tcp: configs/1p1d-cpu.json), sends one
# chat request through the proxy, prints the answer with its TTFT / TPOT split, and stops the
# cluster. Usage: scripts/quickstart.sh [--model DIR|hub-id] [--topology configs/X.json]
set -euo pipefail
cd "$(dirname "$0")/.."
preset=${PDSERVE_PRESET:-default}

cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset" -j "$(nproc)" \
  --target pdserve-proxy pdserve-prefill pdserve-decode pdserve-make-model
build_dir=build
[[ "$preset" == default ]] || build_dir=build-$preset

model=""
topology=configs/1p1d-cpu.json
while [[ $# -gt 0 ]]; do
  case "$1" in
    --model) model=$2; shift 2 ;;
    --topology) topology=$2; shift 2 ;;
    *) echo "quickstart: unknown argument $1" >&2; exit 2 ;;
  esac
done
if [[ -z "$model" ]]; then
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
echo "quickstart: model $model, topology $topology"

proxy_port=$(/usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["proxy"]["port"])' "$topology")
log_dir=$(mktemp -d)
tools/cluster/pdserve-cluster "$topology" --model "$model" --build-dir "$build_dir" --log-dir "$log_dir" \
  > "$log_dir/launcher.out" &
launcher=$!
trap 'kill -INT $launcher 2>/dev/null; wait $launcher 2>/dev/null || true' EXIT
for _ in $(seq 600); do
  grep -q ready "$log_dir/launcher.out" 2>/dev/null && break
  if ! kill -0 $launcher 2>/dev/null; then
    echo "quickstart: the cluster failed to start; logs in $log_dir" >&2; cat "$log_dir"/*.log >&2; exit 1
  fi
  sleep 0.5
done
cat "$log_dir/launcher.out"

/usr/bin/python3 - "http://127.0.0.1:$proxy_port" <<'PY'
import json, sys, time, urllib.request
base = sys.argv[1]
body = {"messages": [{"role": "user", "content": "Explain KV cache in one sentence."}],
        "max_tokens": 32, "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
request = urllib.request.Request(base + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", "X-Pdserve-Timeline": "1"})
start = time.monotonic(); first = None; text = []; usage = {}
with urllib.request.urlopen(request, timeout=600) as response:
    for raw in response:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        if "error" in chunk:
            sys.exit(f"quickstart: error: {chunk['error']}")
        usage = chunk.get("usage") or usage
        for choice in chunk.get("choices", []):
            piece = choice["delta"].get("content") or choice["delta"].get("reasoning_content") or ""
            if piece and first is None:
                first = time.monotonic()
            text.append(piece)
end = time.monotonic()
tokens = usage.get("completion_tokens", 0)
ttft = (first or end) - start
tpot = (end - start - ttft) / (tokens - 1) if tokens > 1 else 0.0
print("answer:", "".join(text))
print(f"prompt_tokens={usage.get('prompt_tokens')} completion_tokens={tokens} "
      f"TTFT={ttft * 1000:.1f} ms (prefill node) TPOT={tpot * 1000:.1f} ms (decode node) "
      f"E2E={(end - start) * 1000:.1f} ms")
timeline = usage.get("pdserve_timeline") or {}
kv = timeline.get("kv_transfer")
if kv:
    exposed = kv.get("exposed_ms")
    print(f"KV transfer: {kv['bytes'] / 1e6:.1f} MB in {kv['blocks']} blocks, {kv['layers_overlapped']} of "
          f"{kv['layers']} layers sent during the prefill's forward"
          + (f", {exposed:.1f} ms left after it" if exposed is not None else "")
          + " (all spans: usage.pdserve_timeline, docs/TRACING.md)")
PY
