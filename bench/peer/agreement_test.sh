#!/usr/bin/env bash
# CTest peer_greedy_agreement: llama.cpp (llama-cpp-python from the peer venv) and
# pdserve-generate produce the same 32 greedy tokens on small float32 synthetic models (the
# tiny golden shape, and head_dim 64 with 4 heads per KV head, which takes the AVX-512
# attention kernel): an independent implementation as a second oracle. Needs the pdserve build
# ($PDSERVE_BUILD_DIR) and the peer venv (bench/peer/setup_peer.sh).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${PDSERVE_BUILD_DIR:-$root/build-cpu}
venv=${PDSERVE_PEER_VENV:-$root/bench/peer/.venv}
if ! "$venv/bin/python" -c 'import llama_cpp, gguf' 2>/dev/null; then
  echo "error: the peer venv $venv is missing or broken: run 'bash bench/peer/setup_peer.sh'" >&2
  exit 2
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/pdserve-peer-agreement.XXXXXX")
trap 'rm -rf "$work"' EXIT
for shape in tiny:2 hd64_gqa4:3; do
  "$venv/bin/python" "$root/bench/peer/peer_bench.py" --agreement-only --build-dir "$build" \
    --work-dir "$work" --threads 2 \
    --agreement-config "$root/tests/data/reference/configs/${shape%%:*}.json" \
    --agreement-layers "${shape##*:}"
done
