#!/usr/bin/env bash
# The topology study of docs/PERF.md: the same seeded workload through the proxy of each
# topology (colocated, 1P1D, 2P1D, 1P2D from configs/) at several request rates, one
# pdserve-bench-serving JSON per (topology, rate), then the plots.
# Usage: scripts/topology_study.sh MODEL OUT_DIR [RATE...]   (default rates: 1 2 4)
# Knobs (environment): BUILD_DIR (build), NUM_PROMPTS (40), INPUT_LEN (192), OUTPUT_LEN (32),
# SLO_TTFT_MS (1500), SLO_TPOT_MS (150), PORT_OFFSET (300), TOPOLOGIES ("colocated 1p1d 2p1d 1p2d").
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ $# -lt 2 ]]; then
  echo "usage: scripts/topology_study.sh MODEL OUT_DIR [RATE...]" >&2
  exit 2
fi
model=$1
out=$2
shift 2
rates=("$@")
[[ ${#rates[@]} -gt 0 ]] || rates=(1 2 4)
build=${BUILD_DIR:-build}
if [[ ! -f "$build/CMakeCache.txt" ]]; then
  echo "topology_study: no build in $build (run scripts/quickstart.sh or scripts/test.sh first)" >&2
  exit 2
fi
cmake --build "$build" --target pdserve-proxy pdserve-prefill pdserve-decode pdserve-bench-serving >/dev/null
port_offset=${PORT_OFFSET:-300}
mkdir -p "$out/logs"

for topology in ${TOPOLOGIES:-colocated 1p1d 2p1d 1p2d}; do
  [[ -f configs/$topology-cpu.json ]] || { echo "topology_study: no configs/$topology-cpu.json" >&2; exit 2; }
  config=configs/$topology-cpu.json
  label=$(tr a-z A-Z <<<"$topology")
  [[ $topology == colocated ]] && label=colocated
  proxy_port=$(( $(/usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["proxy"]["port"])' "$config") + port_offset ))
  tools/cluster/pdserve-cluster "$config" --model "$model" --build-dir "$build" \
    --port-offset "$port_offset" --log-dir "$out/logs/$topology" > "$out/logs/$topology.launcher" 2>&1 &
  launcher=$!
  for _ in $(seq 600); do
    grep -q ready "$out/logs/$topology.launcher" && break
    kill -0 $launcher 2>/dev/null || { cat "$out/logs/$topology.launcher" >&2; exit 1; }
    sleep 0.5
  done
  for rate in "${rates[@]}"; do
    echo "topology_study: $label at $rate req/s (load average $(cut -d' ' -f1-3 /proc/loadavg))"
    "$build/bench/serving/pdserve-bench-serving" --base-url "http://127.0.0.1:$proxy_port" \
      --label "$label" --num-prompts "${NUM_PROMPTS:-40}" --input-len "${INPUT_LEN:-192}" \
      --output-len "${OUTPUT_LEN:-32}" --range-ratio 0.5 --request-rate "$rate" \
      --seed $((500 + ${rate%.*})) --slo-ttft-ms "${SLO_TTFT_MS:-1500}" \
      --slo-tpot-ms "${SLO_TPOT_MS:-150}" --result-json "$out/${topology}_rate$rate.json" |
      tail -n 25
  done
  kill -INT $launcher
  wait $launcher || true
done
/usr/bin/python3 scripts/plot_bench.py "$out/figures" "$out"/*.json
