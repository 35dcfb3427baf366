"""Closed by default, end to end (issue #15 items 3 and 5), with the real binaries:
- the proxy, a prefill node and a decode node that joins a cluster (--proxy or --kv-transfer)
  refuse to start without a cluster token (exit 2, the flag to use named) unless started with
  --insecure-no-cluster-token; a node listening on 0.0.0.0 refuses to register without
  --advertise-host;
- a decode node started alone without a token serves colocated: it ignores X-Pdserve-Prefill
  (no connection reaches the address it names: no SSRF);
- in a 1P1D cluster whose proxy has --api-key: the OpenAI API needs the key (or the cluster
  token), /cluster* and /trace need the cluster token, /health and /metrics are open; the
  per-request timeline is opt-in and carries no node address unless the caller holds the token.
"""
import json
import os
import socket
import subprocess
import sys
import threading

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
import pdserve_testing as t  # noqa: E402

t.set_deadline(240)
API_KEY = "client-key-for-the-test"
NO_TOKEN_ENV = {k: v for k, v in os.environ.items() if k != "PDSERVE_CLUSTER_TOKEN"}

model_dir = t.make_model()


def refuses_without_token(name, argv):
    """`argv` exits 2 within 60 s naming --insecure-no-cluster-token; nothing listens."""
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=NO_TOKEN_ENV)
    t.expect_equal(result.returncode, 2, f"{name}: exit code without a cluster token")
    t.expect("--insecure-no-cluster-token" in result.stderr, f"{name}: stderr names the flag: {result.stderr!r}")
    t.expect("listening" not in result.stdout and "serving" not in result.stdout,
             f"{name}: it started anyway: {result.stdout!r}")


def check_closed_by_default():
    node = ["--model", model_dir, "--port", "0", *t.DEFAULT_NODE_ARGS]
    refuses_without_token("pdserve-proxy", [t.BINARIES["proxy"], "--port", "0"])
    refuses_without_token("pdserve-prefill", [t.BINARIES["prefill"], *node])
    refuses_without_token("pdserve-decode --proxy", [t.BINARIES["decode"], *node, "--proxy", "http://127.0.0.1:9"])
    refuses_without_token("pdserve-decode --kv-transfer", [t.BINARIES["decode"], *node, "--kv-transfer"])
    # A wildcard listen address is no address to register: --advertise-host is needed.
    result = subprocess.run([t.BINARIES["decode"], *node, "--host", "0.0.0.0", "--proxy", "http://127.0.0.1:9"],
                            capture_output=True, text=True, timeout=60, env=dict(os.environ, PDSERVE_CLUSTER_TOKEN="x"))
    t.expect_equal(result.returncode, 2, "exit code of a node on 0.0.0.0 without --advertise-host")
    t.expect("--advertise-host" in result.stderr, f"stderr names --advertise-host: {result.stderr!r}")


def check_insecure_flag_starts_an_open_proxy():
    proxy = t.Process("open-proxy", [t.BINARIES["proxy"], "--port", "0", "--insecure-no-cluster-token"],
                      r"pdserve-proxy: listening on (http://\S+)", env={"PDSERVE_CLUSTER_TOKEN": ""})
    try:
        status, _ = t.http("GET", proxy.match.group(1) + "/cluster")
        t.expect_equal(status, 200, "GET /cluster of an open proxy")
        t.expect("--insecure-no-cluster-token" in proxy.log(), "the open proxy warns in its log")
    finally:
        proxy.stop()


def check_colocated_node_ignores_prefill_header():
    """A listener stands for an internal address; the node must never connect to it."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.settimeout(0.2)
    connections = []
    stop = threading.Event()

    def accept():
        while not stop.is_set():
            try:
                connections.append(listener.accept()[0])
            except OSError:
                pass

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    target = t.Process("colocated", [t.BINARIES["decode"], "--model", model_dir, "--port", "0",
                                     *t.DEFAULT_NODE_ARGS], t.SERVING_LINE, env={"PDSERVE_CLUSTER_TOKEN": ""})
    try:
        url = target.match.group(2)
        body = {"prompt": "The quick brown fox", "max_tokens": 4, "temperature": 0}
        plain_status, plain = t.http("POST", url + "/v1/completions", body)
        internal = f"http://127.0.0.1:{listener.getsockname()[1]}"
        status, answer = t.http("POST", url + "/v1/completions", body, {"X-Pdserve-Prefill": internal})
        t.expect_equal((plain_status, status), (200, 200), "statuses without and with X-Pdserve-Prefill")
        t.expect_equal(json.loads(answer)["choices"][0]["text"], json.loads(plain)["choices"][0]["text"],
                       "text with X-Pdserve-Prefill")
        t.expect_equal(len(connections), 0, "connections to the address in X-Pdserve-Prefill")
    finally:
        stop.set()
        target.stop()
        thread.join()
        listener.close()
        for connection in connections:
            connection.close()


def check_cluster_access(target):
    proxy = target.url
    key = {"Authorization": f"Bearer {API_KEY}"}
    body = {"model": target.name, "prompt": "The quick brown fox", "max_tokens": 4, "temperature": 0}
    for headers, expected in (({}, 401), ({"Authorization": "Bearer wrong"}, 401), (key, 200),
                              (t.cluster_headers(), 200)):
        status, text = t.http("POST", proxy + "/v1/completions", body, headers)
        t.expect_equal(status, expected, f"POST /v1/completions with {headers}")
        if status == 401:
            t.expect_equal(json.loads(text)["error"]["code"], "invalid_api_key", "the 401's error code")
    for path in ("/cluster", "/cluster/advice", "/trace"):
        for headers in ({}, key):
            status, text = t.http("GET", proxy + path, headers=headers)
            t.expect_equal(status, 401, f"GET {path} with {headers}")
            t.expect("127.0.0.1" not in text, f"GET {path} refused, yet names a node: {text}")
        status, _ = t.http("GET", proxy + path, headers=t.cluster_headers())
        t.expect_equal(status, 200, f"GET {path} with the cluster token")
    status, _ = t.http("POST", proxy + "/cluster/nodes", {"role": "decode", "url": "http://127.0.0.1:9"}, key)
    t.expect_equal(status, 401, "registration with a client key")
    for path in ("/health", "/metrics"):
        t.expect_equal(t.http("GET", proxy + path)[0], 200, f"GET {path} needs no credential")

    # The timeline: opt-in, and without node addresses or ids unless the caller holds the token.
    _, plain = t.http("POST", proxy + "/v1/completions", body, key)
    t.expect("pdserve_timeline" not in plain, f"a timeline nobody asked for: {plain}")
    _, redacted = t.http("POST", proxy + "/v1/completions", body, dict(key, **{"X-Pdserve-Timeline": "1"}))
    timeline = json.loads(redacted)["usage"]["pdserve_timeline"]
    t.expect("127.0.0.1" not in redacted and "decode-" not in redacted and "prefill-" not in redacted,
             f"node addresses or ids reached a client: {redacted}")
    nodes = {span["node"] for span in timeline["spans"]}
    t.expect_equal(nodes, {"proxy", "decode", "prefill"}, "the redacted timeline's nodes")
    _, whole = t.http("POST", proxy + "/v1/completions", body, dict(t.cluster_headers(), **{"X-Pdserve-Timeline": "1"}))
    t.expect("127.0.0.1" in whole, "the cluster token holder sees the node addresses")
    t.expect_equal(json.loads(whole)["choices"][0]["text"], json.loads(plain)["choices"][0]["text"],
                   "the same text whoever asks")


failed = t.run_checks([
    ("pdserve-proxy, -prefill and a cluster's -decode refuse to start without a cluster token",
     check_closed_by_default),
    ("--insecure-no-cluster-token starts an open proxy, with a warning", check_insecure_flag_starts_an_open_proxy),
    ("a lone decode node without a token ignores X-Pdserve-Prefill (no SSRF)",
     check_colocated_node_ignores_prefill_header),
])
target = t.start_1p1d(model_dir, proxy_extra=("--api-key", API_KEY))
try:
    failed += t.run_checks([("1P1D with --api-key: who may call what, and what the timeline shows",
                             lambda: check_cluster_access(target))])
finally:
    target.stop()
t.finish(failed, target)
