#!/usr/bin/env bash
# End-to-end checks of the command-line tools on a tiny synthetic checkpoint:
#   pdserve-generate reproduces the float64 reference's greedy tokens, honours seeds, prints
#   the stats line, and rejects bad input with exit code 2; pdserve-tokenize round-trips;
#   the servers' log options (--log-level, --log-format json), start-up lines and refused
#   cluster tokens.
# Usage: cli_test.sh BUILD_DIR SOURCE_DIR
set -uo pipefail
build=$1
source=$2
make_model=$build/tools/make_model/pdserve-make-model
generate=$build/tools/generate/pdserve-generate
tokenize=$build/tools/tokenize/pdserve-tokenize
decode=$build/decode_node/pdserve-decode
proxy=$build/proxy/pdserve-proxy
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
passes=0

pass() { passes=$((passes + 1)); echo "ok: $1"; }
fail() { failures=$((failures + 1)); echo "FAIL: $1"; }
expect_eq() { if [[ "$2" == "$3" ]]; then pass "$1"; else fail "$1: expected [$3], got [$2]"; fi; }
expect_exit() {  # name expected_code command...
  local name=$1 expected=$2
  shift 2
  "$@" >"$work/out" 2>"$work/err"
  local code=$?
  if [[ $code -eq $expected ]] && { [[ $expected -eq 0 ]] || grep -q '^error: ' "$work/err"; }; then
    pass "$name"
  else
    fail "$name: exit $code (expected $expected); stderr: $(head -c 300 "$work/err")"
  fi
}

golden=$source/tests/data/reference/tiny.json
model=$work/tiny
"$make_model" --config "$source/tests/data/reference/configs/tiny.json" --out "$model" --seed 7 \
  --layers 2 --dtype bfloat16 --tie >/dev/null || { echo "FAIL: make-model"; exit 1; }

# Greedy generation equals the reference's teacher-forced greedy tokens.
prompt_ids=$(python3 -c "import json,sys; print(','.join(map(str, json.load(open(sys.argv[1]))['prompt_ids'])))" "$golden")
expected=$(python3 -c "
import json, sys
g = json.load(open(sys.argv[1]))
print(json.dumps([s['greedy_token'] for s in g['decode_steps']], separators=(',', ':')))" "$golden")
got=$("$generate" --model "$model" --prompt-ids "$prompt_ids" --max-new-tokens 16 --temperature 0 \
  --ignore-eos --print-ids | tr -d ' ')
expect_eq "greedy ids match the float64 reference" "$got" "$expected"
got_chunked=$("$generate" --model "$model" --prompt-ids "$prompt_ids" --max-new-tokens 16 --temperature 0 \
  --ignore-eos --print-ids --max-prefill-tokens 7 --block-size 4 | tr -d ' ')
expect_eq "chunked prefill and another block size give the same tokens" "$got_chunked" "$expected"

# --logits-out: one float32 row per generated token, each token its row's argmax (greedy).
got_ids=$("$generate" --model "$model" --prompt-ids "$prompt_ids" --max-new-tokens 6 --temperature 0 \
  --ignore-eos --print-ids --logits-out "$work/logits.npy" | tr -d ' ')
if /usr/bin/python3 - "$work/logits.npy" "$got_ids" <<'PY'  # Debian's, with numpy
import json, sys
import numpy as np
logits = np.load(sys.argv[1])
ids = json.loads(sys.argv[2])
assert logits.dtype == np.float32 and logits.shape == (6, 151936), (logits.dtype, logits.shape)
assert [int(i) for i in logits.argmax(axis=1)] == ids, (logits.argmax(axis=1), ids)
PY
then pass "--logits-out rows give the greedy ids"; else fail "--logits-out"; fi
expect_exit "--logits-out unwritable" 2 "$generate" --model "$model" --prompt hi --max-new-tokens 2 \
  --logits-out "$work/no/such/dir/l.npy"

# Stats line and prompt length of a --show-stats run.
"$generate" --model "$model" --prompt "Explain KV cache in one sentence." --max-new-tokens 5 \
  --temperature 0 --ignore-eos --show-stats >"$work/out" 2>"$work/err"
if grep -Eq '^prompt_tokens=8 generated_tokens=5 ttft_ms=[0-9.]+ tpot_ms=[0-9.]+ tokens_per_second=[0-9.]+ device=cpu dtype=bfloat16 ' "$work/err"; then
  pass "stats line"
else
  fail "stats line: $(cat "$work/err")"
fi

# Seeds: same seed, same sample; the sampled ids are valid.
a=$("$generate" --model "$model" --prompt "Hello" --max-new-tokens 8 --temperature 1 --seed 5 --print-ids)
b=$("$generate" --model "$model" --prompt "Hello" --max-new-tokens 8 --temperature 1 --seed 5 --print-ids)
expect_eq "same seed, same output" "$a" "$b"

# Bad input: one clear message, exit code 2.
expect_exit "missing model" 2 "$generate" --model "$work/absent" --prompt hi
expect_exit "no prompt" 2 "$generate" --model "$model"
expect_exit "empty prompt" 2 "$generate" --model "$model" --prompt ""
expect_exit "negative temperature" 2 "$generate" --model "$model" --prompt hi --temperature -1
expect_exit "top_p zero" 2 "$generate" --model "$model" --prompt hi --top-p 0
expect_exit "top_p above one" 2 "$generate" --model "$model" --prompt hi --top-p 1.5
expect_exit "id outside vocabulary" 2 "$generate" --model "$model" --prompt-ids 1,2,999999
expect_exit "malformed ids" 2 "$generate" --model "$model" --prompt-ids 1,x
expect_exit "beyond max_position_embeddings" 2 "$generate" --model "$model" --prompt hi --max-new-tokens 40960
expect_exit "KV pool too small" 2 "$generate" --model "$model" --prompt hi --kv-cache-memory-gib 0.000001
expect_exit "float16 KV cache refused" 2 "$generate" --model "$model" --prompt hi --kv-cache-dtype float16
expect_exit "bfloat16 KV cache" 0 "$generate" --model "$model" --prompt hi --max-new-tokens 4 --kv-cache-dtype bfloat16
expect_exit "fp8 KV cache" 0 "$generate" --model "$model" --prompt hi --max-new-tokens 4 --kv-cache-dtype fp8
expect_exit "fp8_e4m3 KV cache" 0 "$generate" --model "$model" --prompt hi --max-new-tokens 4 --kv-cache-dtype fp8_e4m3
expect_exit "fp8_e5m2 KV cache refused" 2 "$generate" --model "$model" --prompt hi --kv-cache-dtype fp8_e5m2
grep -q 'fp8_e5m2 is not supported' "$work/err" && pass "fp8_e5m2 refusal says why" || fail "fp8_e5m2 refusal: $(head -c 300 "$work/err")"
expect_exit "unknown dtype" 2 "$generate" --model "$model" --prompt hi --dtype int8
expect_exit "cuda unavailable or not built" 2 "$generate" --model "$model" --prompt hi --device cuda
expect_exit "cuda:1 unavailable or not built" 2 "$generate" --model "$model" --prompt hi --device cuda:1
grep -q -- '--device cuda' "$work/err" && pass "cuda:1 refusal names the device" || fail "cuda:1 refusal: $(head -c 300 "$work/err")"
expect_exit "bad CUDA device index" 2 "$generate" --model "$model" --prompt hi --device cuda:x
expect_exit "device index on the cpu" 2 "$generate" --model "$model" --prompt hi --device cpu:0
# A dtype the CUDA path cannot compute in is refused before any device or weight is touched.
expect_exit "float16 compute on cuda refused" 2 "$generate" --model "$model" --prompt hi --device cuda \
  --dtype float16
grep -q 'error: --device cuda computes in bfloat16 (the default) or float32 (strict), not float16' "$work/err" ||
  fail "float16 on cuda: $(cat "$work/err")"
expect_exit "gpu memory utilization above one" 2 "$generate" --model "$model" --prompt hi --gpu-memory-utilization 1.5
expect_exit "gpu memory utilization zero" 2 "$generate" --model "$model" --prompt hi --gpu-memory-utilization 0
expect_exit "kv cache memory not positive" 2 "$generate" --model "$model" --prompt hi --kv-cache-memory-gib -1
expect_exit "unknown flag" 2 "$generate" --model "$model" --prompt hi --no-such-flag
expect_exit "help" 0 "$generate" --help

# pdserve-tokenize.
expect_eq "tokenize" "$(echo '"Explain KV cache in one sentence."' | "$tokenize" --model "$model")" \
  "[840,20772,84648,6500,304,825,11652,13]"
expect_eq "decode" "$(echo '[9707,1879]' | "$tokenize" --model "$model" --decode)" '"Hello world"'
expect_eq "chat render" \
  "$(echo '{"messages":[{"role":"user","content":"Hi"}],"add_generation_prompt":true,"enable_thinking":false}' | "$tokenize" --model "$model" --chat --render)" \
  '"<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"'
expect_eq "chat ids" \
  "$(echo '{"messages":[{"role":"user","content":"Hi"}],"add_generation_prompt":true}' | "$tokenize" --model "$model" --chat)" \
  "[151644,872,198,13048,151645,198,151644,77091,198]"
expect_exit "tokenize bad JSON" 2 bash -c "echo '{bad' | '$tokenize' --model '$model'"
expect_exit "decode bad id" 2 bash -c "echo '[-1]' | '$tokenize' --model '$model' --decode"

# Log options of the servers.
expect_exit "unknown log level" 2 "$proxy" --log-level loud
expect_exit "--tokenizer and --no-cache-aware-routing together" 2 "$proxy" --tokenizer "$work" \
  --no-cache-aware-routing
expect_exit "unknown log format" 2 "$decode" --model "$model" --log-format xml
# The KV path flags of the nodes.
prefill=$build/prefill_node/pdserve-prefill
expect_exit "unknown KV transfer path" 2 "$prefill" --model "$model" --kv-transfer-path zero-copy
expect_exit "fp8_e5m2 KV cache refused (prefill)" 2 env PDSERVE_CLUSTER_TOKEN=t "$prefill" --model "$model" --port 0 --proxy http://127.0.0.1:9 --kv-cache-dtype fp8_e5m2
expect_exit "fp8_e5m2 KV cache refused (decode)" 2 "$decode" --model "$model" --port 0 --kv-cache-dtype fp8_e5m2
# No proxy to learn its decode nodes' UCX workers from (issue #34): refused before the model loads.
expect_exit "prefill node without --proxy" 2 env PDSERVE_CLUSTER_TOKEN=t "$prefill" --model "$model" --port 0
grep -q -- '--insecure-unregistered-kv-peers' "$work/err" || fail "prefill without --proxy: stderr names no flag"
expect_exit "no staging memory" 2 "$decode" --model "$model" --kv-staging-mib 0
expect_exit "a decode node on an absent GPU" 2 "$decode" --model "$model" --device cuda:3 --port 0
expect_exit "decode gpu memory utilization" 2 "$decode" --model "$model" --port 0 --gpu-memory-utilization 1.01
# KV cache tiers (issue #32): a disk tier folder that is missing or read-only, or flags that do
# not go together, are refused before the model loads.
expect_exit "kv tier disk folder missing" 2 "$decode" --model "$model" --port 0 \
  --kv-offload-host-gib 0.01 --kv-offload-disk-dir "$work/no-such-folder" --kv-offload-disk-gib 1
expect_exit "kv tier disk folder missing (prefill)" 2 "$prefill" --model "$model" --port 0 \
  --insecure-no-cluster-token --proxy http://127.0.0.1:9 --kv-offload-host-gib 0.01 \
  --kv-offload-disk-dir "$work/no-such-folder" --kv-offload-disk-gib 1
mkdir -p "$work/read-only" && chmod 0555 "$work/read-only"
if [[ $(id -u) -ne 0 ]]; then  # root may write anywhere
  expect_exit "kv tier disk folder read-only" 2 "$decode" --model "$model" --port 0 \
    --kv-offload-host-gib 0.01 --kv-offload-disk-dir "$work/read-only" --kv-offload-disk-gib 1
fi
expect_exit "kv tier disk without host tier" 2 "$decode" --model "$model" --port 0 \
  --kv-offload-disk-dir "$work" --kv-offload-disk-gib 1
expect_exit "kv tier disk without its budget" 2 "$decode" --model "$model" --port 0 \
  --kv-offload-host-gib 0.01 --kv-offload-disk-dir "$work"
# A cluster token no request could present is refused at start (the timeout stops a process
# that took it and went on to serve).
expect_token_refused() {  # name command...
  local name=$1
  shift
  expect_exit "$name" 2 timeout 60 "$@"
  grep -q 'error: --cluster-token' "$work/err" || fail "$name: stderr names no --cluster-token"
}
expect_token_refused "whitespace-only cluster token (proxy)" "$proxy" --port 0 --cluster-token "   "
expect_token_refused "whitespace-only cluster token from the environment (prefill)" \
  env PDSERVE_CLUSTER_TOKEN=" " "$prefill" --model "$model" --port 0
expect_token_refused "cluster token with a line break (decode --proxy)" "$decode" --model "$model" \
  --port 0 --proxy http://127.0.0.1:9 --cluster-token $'secret\r\nX-Injected: 1'
expect_token_refused "cluster token with a trailing space (lone decode)" "$decode" --model "$model" \
  --port 0 --cluster-token "secret "
# With --log-format json every stderr line is one JSON object (ISO-8601 UTC time, level,
# source, message), and a node logs its warm-up and KV capacity before it serves.
"$decode" --model "$model" --port 0 --threads 1 --kv-cache-memory-gib 0.25 --log-format json \
  >"$work/node.out" 2>"$work/node.err" &
node_pid=$!
# Polled: the node's stdout goes to a file (nothing blocks on it), and a file gives no event.
for _ in $(seq 1 600); do
  grep -q "serving" "$work/node.out" 2>/dev/null && break
  kill -0 "$node_pid" 2>/dev/null || break
  sleep 0.1
done
kill -TERM "$node_pid" 2>/dev/null
wait "$node_pid"
if python3 - "$work/node.err" <<'PY'
import json, re, sys
lines = [line for line in open(sys.argv[1], encoding="utf-8").read().splitlines() if line]
entries = [json.loads(line) for line in lines]
assert all(set(e) == {"time", "level", "source", "message"} for e in entries), entries
assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", e["time"]) for e in entries), entries
messages = [e["message"] for e in entries]
warm = next(i for i, m in enumerate(messages) if re.match(r"warm-up: 2 tokens in \d+ ms; ready", m))
kv = next(i for i, m in enumerate(messages) if re.match(r"KV cache: \d+ blocks of 16 tokens = \d+ tokens; maximum concurrency at \d+ tokens per request: \d+\.\d\dx", m))
assert warm < kv, messages
PY
then pass "json log lines, warm-up and KV capacity"; else fail "json log lines: $(head -c 600 "$work/node.err")"; fi

echo "cli: $passes passed, $failures failed"
[[ $failures -eq 0 ]]
