#!/usr/bin/env bash
# Every HTTP error path of pdserve-decode, with curl: 400 (malformed JSON, wrong types, unknown
# fields under --strict-request-fields (served by default, as in vLLM), prompt + max_tokens
# beyond --max-model-len), 404 (model, route), 405, 413 (over
# --max-body-bytes, with and without Content-Length) and 429 + Retry-After when the waiting
# queue is full; each answer must carry an OpenAI error body {"error": {message, type, param,
# code}}. The servers keep answering afterwards and exit 0 on SIGTERM.
# shellcheck source=server.sh source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/server.sh"
set_deadline 150

make_model
start_server API --max-model-len 64 --max-body-bytes 4096 --strict-request-fields
start_server QUEUE --max-waiting 1 --max-num-seqs 1

# expect_error STATUS PARAM CODE CURL_ARGS...: the answer has this status and an OpenAI error
# body whose param and code are PARAM and CODE ("null" for JSON null, "*" for any value).
expect_error() {
  local want_status=$1 want_param=$2 want_code=$3
  shift 3
  local status
  status=$(curl -sS --max-time 30 -o "$WORK_DIR/body" -D "$WORK_DIR/headers" -w '%{http_code}' "$@") || return 1
  if [[ $status != "$want_status" ]]; then
    echo "  status $status, expected $want_status: $(head -c 300 "$WORK_DIR/body")"
    return 1
  fi
  "$PYTHON" - "$WORK_DIR/body" "$want_param" "$want_code" <<'EOF'
import json
import sys

path, want_param, want_code = sys.argv[1:]
try:
    body = json.load(open(path, encoding="utf-8"))
    error = body["error"]
    assert list(body) == ["error"], f"top-level keys {list(body)}"
    assert sorted(error) == ["code", "message", "param", "type"], f"error keys {sorted(error)}"
    assert isinstance(error["message"], str) and error["message"], "empty message"
    assert isinstance(error["type"], str) and error["type"], "empty type"
    for key, want in (("param", want_param), ("code", want_code)):
        got = error[key]
        assert got is None or isinstance(got, str), f"{key} is {got!r}"
        if want != "*":
            assert got == (None if want == "null" else want), f"{key} is {got!r}, expected {want}"
except (AssertionError, KeyError, TypeError, ValueError) as failure:
    print(f"  bad error body ({failure}): {open(path, encoding='utf-8', errors='replace').read()[:300]}")
    sys.exit(1)
EOF
}

# expect_completion CURL_ARGS...: a 200 with one choice and usage.
expect_completion() {
  local status
  status=$(curl -sS --max-time 30 -o "$WORK_DIR/body" -w '%{http_code}' "$@") || return 1
  [[ $status == 200 ]] || { echo "  status $status: $(head -c 300 "$WORK_DIR/body")"; return 1; }
  "$PYTHON" -c 'import json, sys; body = json.load(open(sys.argv[1])); assert len(body["choices"]) == 1 and body["usage"]["total_tokens"] > 0' \
    "$WORK_DIR/body"
}

header_value() {  # header_value NAME: the value of a header in the last answer, or empty
  tr -d '\r' <"$WORK_DIR/headers" | sed -n "s/^$1: *//Ip" | head -n 1
}

completions=$API/v1/completions
chat=$API/v1/chat/completions
json=(-H 'Content-Type: application/json')
model=$(curl -sS --max-time 10 "$API/v1/models" | "$PYTHON" -c 'import json,sys; print(json.load(sys.stdin)["data"][0]["id"])')
ids() { "$PYTHON" -c "import sys; print(','.join(str(100 + i) for i in range(int(sys.argv[1]))))" "$1"; }

check "malformed JSON: 400" expect_error 400 '*' '*' "${json[@]}" -d '{"prompt": "a",' "$completions"
check "JSON that is not an object: 400" expect_error 400 '*' '*' "${json[@]}" -d '[1, 2]' "$completions"
check "empty body: 400" expect_error 400 '*' '*' "${json[@]}" -X POST "$completions"
check "invalid UTF-8 in a string: 400" expect_error 400 '*' '*' "${json[@]}" \
  --data-binary $'{"prompt": "\xff\xfe"}' "$completions"
check "wrong type (max_tokens as a string): 400 naming max_tokens" expect_error 400 max_tokens null \
  "${json[@]}" -d '{"prompt": "a", "max_tokens": "8"}' "$completions"
check "wrong type (stream as a string): 400 naming stream" expect_error 400 stream null \
  "${json[@]}" -d '{"prompt": "a", "stream": "yes"}' "$completions"
check "wrong type (prompt as an object): 400 naming prompt" expect_error 400 prompt null \
  "${json[@]}" -d '{"prompt": {"text": "a"}}' "$completions"
check "wrong type (messages as a string): 400 naming messages" expect_error 400 messages null \
  "${json[@]}" -d '{"messages": "hi"}' "$chat"
check "missing prompt: 400 naming prompt" expect_error 400 prompt null "${json[@]}" -d '{"max_tokens": 4}' "$completions"
check "unknown field without --strict-request-fields: ignored and served (vLLM)" expect_completion \
  "${json[@]}" -d '{"prompt": "a", "max_tokens": 2, "frobnicate": 1}' "$QUEUE/v1/completions"
check "unknown field under --strict-request-fields: 400 naming it" expect_error 400 frobnicate null \
  "${json[@]}" -d '{"prompt": "a", "frobnicate": 1}' "$completions"
check "unknown chat field under --strict-request-fields: 400 naming it" expect_error 400 frobnicate null \
  "${json[@]}" -d '{"messages": [{"role": "user", "content": "a"}], "frobnicate": 1}' "$chat"
check "prompt + max_tokens beyond --max-model-len 64: 400" expect_error 400 max_tokens context_length_exceeded \
  "${json[@]}" -d "{\"prompt\": [$(ids 60)], \"max_tokens\": 5}" "$completions"
check "prompt of exactly --max-model-len tokens: 400" expect_error 400 prompt context_length_exceeded \
  "${json[@]}" -d "{\"prompt\": [$(ids 64)], \"max_tokens\": 1}" "$completions"
check "chat beyond --max-model-len: 400" expect_error 400 '*' context_length_exceeded \
  "${json[@]}" -d "{\"messages\": [{\"role\": \"user\", \"content\": \"$(printf 'word %.0s' $(seq 80))\"}]}" "$chat"
check "prompt + max_tokens of exactly --max-model-len: 200" expect_completion \
  "${json[@]}" -d "{\"prompt\": [$(ids 60)], \"max_tokens\": 4, \"ignore_eos\": true}" "$completions"
check "unknown model: 404" expect_error 404 model model_not_found \
  "${json[@]}" -d '{"model": "no-such-model", "prompt": "a"}' "$completions"
check "unknown chat model: 404" expect_error 404 model model_not_found \
  "${json[@]}" -d '{"model": "no-such-model", "messages": [{"role": "user", "content": "a"}]}' "$chat"
check "unknown route: 404" expect_error 404 null not_found "${json[@]}" -d '{}' "$API/v1/nothing"
check "unknown GET route: 404" expect_error 404 null not_found "$API/v2/models"
check "wrong method (GET /v1/completions): 405" expect_error 405 null method_not_allowed "$completions"
check "405 names the allowed method" test "$(header_value Allow)" = POST
check "wrong method (DELETE /v1/models): 405" expect_error 405 null method_not_allowed -X DELETE "$API/v1/models"
head -c 5000 /dev/zero | tr '\0' 'a' >"$WORK_DIR/big_prompt"
big_body=$WORK_DIR/big_body.json
printf '{"prompt": "%s"}' "$(cat "$WORK_DIR/big_prompt")" >"$big_body"
check "body over --max-body-bytes 4096: 413" expect_error 413 null request_too_large \
  "${json[@]}" --data-binary "@$big_body" "$completions"
check "chunked body over --max-body-bytes 4096: 413" expect_error 413 null request_too_large \
  "${json[@]}" -H 'Transfer-Encoding: chunked' --data-binary "@$big_body" "$completions"
check "after all those errors the server still answers" expect_completion \
  "${json[@]}" -d "{\"model\": \"$model\", \"prompt\": \"Hello\", \"max_tokens\": 4}" "$completions"

# Queue full: one running sequence and one waiting place, so of eight long streams fired at
# once at least one is turned away with 429 and Retry-After. The accepted streams are then cut
# off by killing their clients, and the server must serve again.
queue_dir=$WORK_DIR/queue
mkdir "$queue_dir"
curl_pids=()
for i in $(seq 8); do
  curl -sS --max-time 60 -N -o "$queue_dir/body$i" -D "$queue_dir/headers$i" "${json[@]}" \
    -d '{"prompt": "Tell me a long story", "max_tokens": 20000, "ignore_eos": true, "stream": true}' \
    "$QUEUE/v1/completions" 2>/dev/null &
  curl_pids+=($!)
  CHILD_PIDS+=($!)
done
answered_all() {
  local i
  for i in $(seq 8); do grep -q '^HTTP/1.1 [0-9]' "$queue_dir/headers$i" 2>/dev/null || return 1; done
}
# Polled: curl writes the status lines to files, which give no event.
for _ in $(seq 200); do answered_all && break; sleep 0.1; done  # 20 s
check "all eight queued requests got a status line" answered_all

# Each answer: 429 with a positive Retry-After and a rate_limit_error body, or a 200 stream.
# A stream's first event is a completion chunk (running), nothing yet (waiting), or (a race in
# the engine: its intake admits on the waiting count published by the previous step, then the
# scheduler refuses) an error event with the same rate_limit_error body. At most two streams
# may be live: one running and one waiting.
cat >"$WORK_DIR/queue_answers.py" <<'PY'
import json
import pathlib
import re
import sys

folder = pathlib.Path(sys.argv[1])
rejected = running = waiting = refused_in_stream = 0
problems = []


def rate_limit_body(error):
    return (sorted(error) == ["code", "message", "param", "type"] and error["message"]
            and error["type"] == "rate_limit_error" and error["code"] == "rate_limit_exceeded")


for i in range(1, 9):
    head = (folder / f"headers{i}").read_text().splitlines()
    body_path = folder / f"body{i}"  # curl creates it with the first body byte
    body = body_path.read_bytes().decode("utf-8", "replace") if body_path.exists() else ""
    status = int(head[0].split()[1])
    headers = {line.split(":", 1)[0].lower(): line.split(":", 1)[1].strip() for line in head[1:] if ":" in line}
    if status == 429:
        rejected += 1
        if not re.fullmatch(r"[1-9][0-9]*", headers.get("retry-after", "")):
            problems.append(f"request {i}: 429 without a positive Retry-After: {headers}")
        if not rate_limit_body(json.loads(body)["error"]):
            problems.append(f"request {i}: bad 429 body {body}")
    elif status == 200:
        if "\n\n" not in body:
            waiting += 1
            continue
        first = body.split("\n\n", 1)[0]
        event = json.loads(first[len("data: "):]) if first.startswith("data: ") else {}
        if "error" in event and rate_limit_body(event["error"]):
            refused_in_stream += 1
        elif event.get("object") == "text_completion" and event["choices"]:
            running += 1
        else:
            problems.append(f"request {i}: unexpected first event {first!r}")
    else:
        problems.append(f"request {i}: status {status}")

if len(sys.argv) > 2:  # "started": only asking whether a stream is running yet
    sys.exit(0 if running else 1)
print(f"  {running} running, {waiting} waiting, {rejected} rejected with 429, "
      f"{refused_in_stream} refused inside a 200 stream")
if running != 1 or waiting > 1 or rejected < 1:
    problems.append("expected one stream running, at most one waiting, and at least one 429")
for problem in problems:
    print("  " + problem)
sys.exit(1 if problems else 0)
PY
queue_full_answers() {
  local _
  for _ in $(seq 100); do  # 10 s for the running stream's first event (polled: curl's files give no event)
    "$PYTHON" "$WORK_DIR/queue_answers.py" "$queue_dir" started >/dev/null 2>&1 && break
    sleep 0.1
  done
  "$PYTHON" "$WORK_DIR/queue_answers.py" "$queue_dir"
}
check "queue full: 429 with Retry-After and an OpenAI error body" queue_full_answers

for pid in "${curl_pids[@]}"; do kill "$pid" 2>/dev/null || true; done
for pid in "${curl_pids[@]}"; do wait "$pid" 2>/dev/null || true; done

serves_again() {
  local _
  for _ in $(seq 50); do  # polled (an HTTP answer): the aborts land at the next engine step
    expect_completion "${json[@]}" -d '{"prompt": "Hello", "max_tokens": 4}' "$QUEUE/v1/completions" \
      >/dev/null && return 0
    sleep 0.2
  done
  expect_completion "${json[@]}" -d '{"prompt": "Hello", "max_tokens": 4}' "$QUEUE/v1/completions"
}
check "after its clients went away the queue-full server serves again" serves_again

check "SIGTERM: both servers exit 0" stop_servers
finish
