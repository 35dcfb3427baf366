"""Fuzzing the public API from its own OpenAPI description with schemathesis (argument:
colocated | 1p1d): GET /openapi.json of a colocated pdserve-decode, or of the proxy of a 1P1D
cluster, drives a bounded, seeded run of generated valid and invalid requests. Checked by
schemathesis on every response: no 5xx, a documented status code and content type, the body
valid against the documented schema (so every 4xx carries an OpenAI-style error body), invalid
requests refused with a 4xx, undocumented methods refused (405). Checked here afterwards: the
servers are alive and answering, and no KV block stays in use (nothing hung).

Environment (set by CTest): PDSERVE_BUILD_DIR, PDSERVE_SOURCE_DIR.
"""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
import pdserve_testing as t  # noqa: E402

t.set_deadline(420)
TARGET = sys.argv[1] if len(sys.argv) > 1 else "colocated"
EXAMPLES = 40  # per operation and phase
CHECKS = ["not_a_server_error", "status_code_conformance", "content_type_conformance",
          "response_schema_conformance", "negative_data_rejection", "unsupported_method"]

model_dir = t.make_model()
# A short context keeps every generated request small: anything longer is a 400.
target = t.start_target(TARGET, model_dir, ["--max-model-len", "96", "--max-num-seqs", "8"])
report = os.path.join(t.work_dir(), "schemathesis.json")
schemathesis = os.path.join(os.path.dirname(sys.executable), "schemathesis")


def document():
    spec = t.get_json(target.url + "/openapi.json")
    operations = sorted(f"{method.upper()} {path}" for path, methods in spec["paths"].items() for method in methods)
    t.expect_equal(operations, ["GET /health", "GET /metrics", "GET /openapi.json", "GET /ready", "GET /v1/models",
                                "GET /v1/models/{model}", "GET /version", "POST /detokenize", "POST /tokenize",
                                "POST /v1/chat/completions", "POST /v1/completions", "POST /v1/messages",
                                "POST /v1/messages/count_tokens", "POST /v1/responses"], "documented operations")
    t.expect_equal(spec["components"]["schemas"]["ModelName"].get("enum"), [target.name], "ModelName")


def fuzz():
    # No example database: the seed alone decides what runs, so a run in the build tree does
    # what a fresh clone's does. One worker: Debian 12's Python 3.11.2 can fail ast.parse run from two threads at once
    # ("AST constructor recursion depth mismatch", CPython gh-106905, fixed in 3.11.5), which
    # hypothesis does when it describes its strategies.
    result = subprocess.run(
        [schemathesis, "run", target.url + "/openapi.json", "--checks", ",".join(CHECKS),
         "--max-examples", str(EXAMPLES), "--seed", "20261123", "--generation-database", "none", "--workers", "1", "--request-timeout", "60",
         "--phases", "examples,coverage,fuzzing", "--suppress-health-check", "all", "--no-shrink",
         "--report", "json", "--report-json-path", report],
        capture_output=True, text=True, timeout=330, env=dict(os.environ, NO_COLOR="1"))
    tail = (result.stdout + result.stderr)[-6000:]
    if result.returncode != 0:
        raise AssertionError(f"schemathesis found failures (exit {result.returncode}):\n{tail}")
    summary = [line for line in result.stdout.splitlines() if "passed" in line or "cases" in line.lower()]
    print("     " + "\n     ".join(summary[-6:]), flush=True)


def still_serving():
    decode_url = target.decode.match.group(2)
    t.expect_equal(t.http("GET", target.url + "/health")[0], 200, "front door health")
    t.wait_until(lambda: t.metric(decode_url, "pdserve:kv_cache_blocks_used") == 0, 30,
                 "no KV block in use once the fuzzing ended")
    for process in target.processes:
        t.expect(process.process.poll() is None, f"{process.name} exited during the run")


failed = t.run_checks([
    ("GET /openapi.json describes the public operations and the served model", document),
    (f"schemathesis: {', '.join(CHECKS)}", fuzz),
    ("afterwards every process is alive and no KV block is in use", still_serving),
])
t.finish(failed, target, f"schemathesis checks against {TARGET}")
