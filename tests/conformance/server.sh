# shellcheck shell=bash
# Sourced by the shell conformance tests: a private temp dir with the tiny synthetic model,
# pdserve-decode servers on port 0 that are always killed when the script exits (success,
# failure or signal), a script-wide deadline, and assertion helpers. Binaries come from the
# environment set by tests/conformance/CMakeLists.txt.
set -euo pipefail

: "${PDSERVE_DECODE:?run via ctest}" "${PDSERVE_MAKE_MODEL:?run via ctest}" "${PDSERVE_TINY_CONFIG:?run via ctest}"
# shellcheck disable=SC2034  # used by the scripts that source this file
PYTHON=/usr/bin/python3  # the system interpreter, not the pyenv python3 on PATH
WORK_DIR=$(mktemp -d "${TMPDIR:-/tmp}/pdserve-conformance.XXXXXX")
SERVER_PIDS=()
CHILD_PIDS=()  # other long-running children, killed on exit too
FAILURES=0

cleanup() {
  local pid
  for pid in "${SERVER_PIDS[@]}" "${CHILD_PIDS[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  [[ -n ${DEADLINE_PID:-} ]] && kill "$DEADLINE_PID" 2>/dev/null
  rm -rf "$WORK_DIR"
}
trap cleanup EXIT
trap 'echo "FAIL: terminated (the script deadline or a signal)" >&2; exit 1' INT TERM

# Sends this script SIGTERM (so its EXIT trap kills the servers) after $1 seconds: below the
# CTest TIMEOUT, so that the cleanup is ours. The timer holds none of the script's output
# pipes, so a finished test is not kept waiting for it.
set_deadline() {
  (sleep "$1" && kill -TERM "$$") </dev/null >/dev/null 2>&1 &
  DEADLINE_PID=$!
}

make_model() {
  MODEL_DIR=$WORK_DIR/model
  timeout 60 "$PDSERVE_MAKE_MODEL" --config "$PDSERVE_TINY_CONFIG" --out "$MODEL_DIR" --seed 7 --untie >/dev/null
}

# start_server VAR [pdserve-decode flags...]: starts a server and stores its base URL in VAR.
start_server() {
  local var=$1
  shift
  local log=$WORK_DIR/$var
  : >"$log.out"
  "$PDSERVE_DECODE" --model "$MODEL_DIR" --port 0 --threads 1 --kv-cache-memory-gib 0.25 "$@" \
    >"$log.out" 2>"$log.err" &
  local pid=$!
  SERVER_PIDS+=("$pid")
  local url=""
  # Polled: the server's stdout goes to a file (nothing blocks on it), and a file gives no event.
  for _ in $(seq 600); do  # 60 s
    url=$(sed -n 's|^pdserve-decode: serving .* on \(http://[^ ]*\) (device cpu)$|\1|p' "$log.out")
    [[ -n $url ]] && break
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "pdserve-decode $* exited before serving:" >&2
      cat "$log.err" >&2
      exit 1
    fi
    sleep 0.1
  done
  [[ -n $url ]] || { echo "pdserve-decode $* did not start within 60 s" >&2; exit 1; }
  printf -v "$var" '%s' "$url"
}

# stop_servers: SIGTERM to every server; each must exit 0 within 15 s (a clean shutdown).
stop_servers() {
  local pid code ok=0
  for pid in "${SERVER_PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${SERVER_PIDS[@]}"; do
    # Polled: bash's wait has no deadline, and a server that hangs on SIGTERM must not hang the test.
    for _ in $(seq 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then
      echo "  server $pid still running 15 s after SIGTERM"
      ok=1
      continue
    fi
    code=0
    wait "$pid" || code=$?
    if ((code != 0)); then
      echo "  server $pid exited with $code after SIGTERM"
      ok=1
    fi
  done
  SERVER_PIDS=()
  return "$ok"
}

# interruptible COMMAND...: bash runs its traps only once a foreground command has ended, so a
# long command runs in the background and is waited for: `wait` returns at once on a signal.
interruptible() {
  "$@" &
  CHILD_PIDS+=($!)
  wait "$!"
}

pass() { echo "ok   $1"; }
fail() {
  echo "FAIL $1"
  FAILURES=$((FAILURES + 1))
}

# check NAME COMMAND...: runs one check, reporting it; a failing check does not stop the script.
check() {
  local name=$1
  shift
  if "$@"; then pass "$name"; else fail "$name"; fi
}

finish() {
  if ((FAILURES > 0)); then
    echo "$FAILURES check(s) failed"
    local err
    for err in "$WORK_DIR"/*.err; do
      echo "--- $(basename "$err")"
      tail -n 20 "$err"
    done
    exit 1
  fi
  echo "all checks passed"
}
