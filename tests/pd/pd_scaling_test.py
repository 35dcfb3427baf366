#!/usr/bin/python3
"""Scaling a live cluster on real processes (2-layer synthetic model, UCX over tcp).

scale: a closed-loop streaming pdserve-bench-serving run goes through the proxy while a second
decode and a second prefill node join (started later with --proxy) and the first two are then
drained (POST /cluster/nodes/ID/drain, nodes started with --exit-when-drained). Asserts: no
failed request, every node got work while it was up, the drained nodes exited 0 and left
/cluster (their ids answer 410 Gone), no KV block in use on the survivors, GET /cluster/advice
describes the pools, and greedy answers for fixed prompts equal a colocated node's.

backpressure: a decode node that holds at most 2 sequences behind the proxy, 8 concurrent
requests: each is answered in full or refused with 429 and an OpenAI error body; the node
stays up and holds no KV block afterwards.

cancel: 24 streaming clients hang up while their prompts are still queued on
the prefill node: the decode node asks the prefill node to abort them (the prefill node counts
the cancels) and gets their KV blocks back within 15 s (about 1-6 s), not after the transfer
timeout + grace (32 s).

Environment: PDSERVE_BUILD_DIR, PDSERVE_SOURCE_DIR. Argument: the phase (or "all").
"""
import concurrent.futures
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pd_e2e_test import (BUILD, TOKEN, complete, expect_same, http,  # noqa: E402
                         make_model, metric, reference_answers, run_all)

AUTH = {"Authorization": "Bearer " + TOKEN}
NODE_ARGS = ["--threads", "1", "--kv-cache-memory-gib", "0.25", "--max-model-len", "4096",
             "--heartbeat-interval-ms", "200", "--ucx-tls", "tcp", "--kv-transfer-timeout-ms", "10000"]


class Processes:
    """Started processes on port 0, each logging to DIR/NAME.log; all stopped on exit."""

    LISTENING = re.compile(r"pdserve-(?:proxy: listening on|prefill: prefilling \S+ on|decode: serving \S+ on) "
                           r"(http://\S+)")

    def __init__(self, log_dir):
        self.log_dir = log_dir
        self.running = {}

    def start(self, name, command):
        """Starts `command` (which must listen on port 0); returns the URL it announces."""
        log = open(os.path.join(self.log_dir, name + ".log"), "w")
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, text=True,
                                   env=dict(os.environ, PDSERVE_CLUSTER_TOKEN=TOKEN))
        self.running[name] = process
        url = []

        def copy_stdout():
            for line in process.stdout:
                log.write(line)
                log.flush()
                match = self.LISTENING.match(line)
                if match and not url:
                    url.append(match.group(1))

        threading.Thread(target=copy_stdout, daemon=True).start()
        wait_for(f"{name} to listen", lambda: url or process.poll() is not None, timeout=60)
        if not url:
            raise AssertionError(f"{name} exited with {process.returncode} before listening")
        return url[0]

    def stop_all(self):
        for process in self.running.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.running.values():
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def wait_for(what, predicate, timeout=120):
    """Polls `predicate` until it holds: for the states of other processes (an address printed,
    a node registered, a counter on /metrics), which give the test no event to wait on."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def cluster_nodes(proxy):
    return json.loads(http("GET", proxy + "/cluster", headers=AUTH)[1])["nodes"]


def node_id(proxy, url):
    for node in cluster_nodes(proxy):
        if node["url"] == url and node["state"] == "up":
            return node["id"]
    return None


def start_proxy(processes, name):
    # The advice must see every request of the run, however slow the machine makes it.
    return processes.start(name, [os.path.join(BUILD, "proxy/pdserve-proxy"), "--port", "0",
                                  "--advice-window-s", "900"])


def start_node(processes, name, role, model, proxy, extra=(), node_args=NODE_ARGS):
    """Starts a node with --proxy; returns (url, id) once the proxy routes to it."""
    binary = os.path.join(BUILD, f"{'decode' if role == 'decode' else 'prefill'}_node/pdserve-{role}")
    url = processes.start(name, [binary, "--model", model, "--port", "0", "--proxy", proxy] + node_args +
                          list(extra))
    wait_for(f"{name} to register", lambda: node_id(proxy, url) is not None)
    return url, node_id(proxy, url)


def work_done(url):
    """Prompt tokens a node served: a decode node's vllm:prompt_tokens_total, a prefill node's own
    counter (the other is absent: 0)."""
    return metric(url, "vllm:prompt_tokens_total") + metric(url, "pdserve:prefill_prompt_tokens_total")


def check_no_blocks_in_use(urls):
    for url in urls:
        wait_for(f"{url} to free its KV blocks", lambda: metric(url, "vllm:kv_cache_usage_perc") == 0,
                 timeout=15)


def fixed_requests():
    return [{"prompt": [1000 + 37 * i + j for j in range(5 + 11 * i)], "max_tokens": 12, "temperature": 0,
             "ignore_eos": True} for i in range(4)]


def check_advice(proxy, minimum_requests):
    """GET /cluster/advice reflects the 1P1D cluster left and the requests the proxy recorded."""
    advice = json.loads(http("GET", proxy + "/cluster/advice", headers=AUTH)[1])
    pools, workload, capacity = advice["load"], advice["workload"], advice["capacity"]
    if pools["prefill"]["nodes"] != 1 or pools["decode"]["nodes"] != 1 or not advice["explanation"]:
        raise AssertionError(f"/cluster/advice does not describe the cluster: {advice}")
    if workload["requests"] < minimum_requests or workload["failed"] != 0:
        raise AssertionError(f"/cluster/advice saw {workload['requests']} requests ({workload['failed']} failed), "
                             f"expected at least {minimum_requests} and none failed: {advice}")
    recommendation = advice["recommendation"]
    if capacity["prefill_tokens_per_s_per_node"] <= 0 or not recommendation["prefill_nodes"] \
            or not recommendation["decode_nodes"]:
        raise AssertionError(f"/cluster/advice measured no capacity: {advice}")
    print(f"ok: /cluster/advice: {advice['explanation']}", flush=True)


def phase_scale(model, log_dir):
    requests = fixed_requests()
    reference = reference_answers(model, requests, log_dir)
    processes = Processes(log_dir)
    try:
        proxy = start_proxy(processes, "proxy")
        prefill0, prefill0_id = start_node(processes, "prefill-0", "prefill", model, proxy, ["--exit-when-drained"])
        decode0, decode0_id = start_node(processes, "decode-0", "decode", model, proxy, ["--exit-when-drained"])
        result = os.path.join(log_dir, "bench.json")
        bench = subprocess.Popen(
            [os.path.join(BUILD, "bench/serving/pdserve-bench-serving"), "--base-url", proxy,
             "--num-prompts", "48", "--input-len", "24", "--output-len", "32", "--max-concurrency", "4",
             "--seed", "5", "--request-timeout", "120", "--result-json", result],
            stdout=open(os.path.join(log_dir, "bench.log"), "w"), stderr=subprocess.STDOUT)
        wait_for("the first nodes to get work", lambda: work_done(decode0) > 0 and work_done(prefill0) > 0)

        prefill1, _ = start_node(processes, "prefill-1", "prefill", model, proxy)
        decode1, _ = start_node(processes, "decode-1", "decode", model, proxy)
        wait_for("the nodes that joined to get work", lambda: work_done(decode1) > 0 and work_done(prefill1) > 0)
        if bench.poll() is not None:
            raise AssertionError("the benchmark ended before the first nodes could be drained; make it longer")
        print("ok: a decode and a prefill node joined under load and got work", flush=True)

        for node in (decode0_id, prefill0_id):
            status, body = http("POST", f"{proxy}/cluster/nodes/{node}/drain", {}, AUTH)
            if status != 200:
                raise AssertionError(f"drain {node}: HTTP {status} {body}")
        for name in ("decode-0", "prefill-0"):
            code = processes.running[name].wait(timeout=120)
            if code != 0:
                raise AssertionError(f"{name} exited with {code} after its drain (expected 0)")
        left = {node["id"] for node in cluster_nodes(proxy)}
        if left & {decode0_id, prefill0_id}:
            raise AssertionError(f"drained nodes still in /cluster: {left}")
        status, body = http("POST", f"{proxy}/cluster/nodes/{decode0_id}/heartbeat", {"load": {}}, AUTH)
        if status != 410 or '"error"' not in body:
            raise AssertionError(f"a retired id's heartbeat: expected 410 with an error body, got {status} {body}")
        print("ok: the drained nodes finished their requests, exited 0 and left /cluster (410 for their ids)",
              flush=True)

        if bench.wait(timeout=300) != 0:
            raise AssertionError(f"the benchmark failed; see {result}")
        with open(result) as handle:
            summary = json.load(handle)
        if summary["failed"] != 0 or summary["completed"] != 48:
            errors = {r["error"] for r in summary["requests"] if not r["success"]}
            raise AssertionError(f"{summary['failed']} failed requests while scaling: {errors}")
        print(f"ok: 48 streamed requests, none failed, while nodes joined and drained "
              f"(E2E p99 {summary['e2e_ms']['p99']:.0f} ms)", flush=True)

        check_no_blocks_in_use([decode1, prefill1])
        check_advice(proxy, minimum_requests=48)
        got = [complete(proxy, request) for request in requests]
        expect_same(reference, got, "greedy answers after scaling")
        check_no_blocks_in_use([decode1, prefill1])
    finally:
        processes.stop_all()


def phase_backpressure(model, log_dir):
    processes = Processes(log_dir)
    try:
        proxy = start_proxy(processes, "bp-proxy")
        prefill, _ = start_node(processes, "bp-prefill", "prefill", model, proxy)
        decode, _ = start_node(processes, "bp-decode", "decode", model, proxy, ["--max-num-seqs", "2"])
        request = {"prompt": list(range(2000, 2040)), "max_tokens": 48, "temperature": 0, "ignore_eos": True}
        with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
            answers = list(pool.map(lambda _: http("POST", proxy + "/v1/completions", request, timeout=120),
                                    range(8)))
        statuses = [status for status, _ in answers]
        for status, body in answers:
            if status == 200:
                if json.loads(body)["usage"]["completion_tokens"] != 48:
                    raise AssertionError(f"a truncated answer under backpressure: {body[:300]}")
            elif status != 429 or "rate_limit_error" not in body:
                raise AssertionError(f"expected 200 or 429 with an OpenAI error body, got {status}: {body[:300]}")
        if statuses.count(429) == 0 or statuses.count(200) < 2:
            raise AssertionError(f"a decode node holding 2 sequences answered 8 concurrent requests: {statuses}")
        if processes.running["bp-decode"].poll() is not None:
            raise AssertionError("the decode node died under backpressure")
        if metric(proxy, "pdserve:proxy_retries_total") == 0:
            raise AssertionError("the proxy never retried a refused request")
        check_no_blocks_in_use([decode, prefill])
        if run_all(proxy, [request])[0][2] != 48:
            raise AssertionError("the node does not serve after the burst")
        print(f"ok: backpressure: {statuses.count(200)} answered, {statuses.count(429)} refused with 429; "
              "the node stayed up and holds no KV block", flush=True)
    finally:
        processes.stop_all()


def leave_early(url, request, after_s):
    """A streaming completion whose client hangs up after `after_s` seconds, as one that leaves.
    The stay is the behaviour under test (a client that gives up while its prompt queues);
    phase_cancel checks that the prefill node got cancels, so the clients left in time."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    body = json.dumps(dict(request, stream=True)).encode()
    with socket.create_connection((host, int(port)), timeout=30) as connection:
        connection.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: " + host.encode() +
                           b"\r\nContent-Type: application/json\r\nContent-Length: " +
                           str(len(body)).encode() + b"\r\n\r\n" + body)
        time.sleep(after_s)


def phase_cancel(model, log_dir):
    """Issue #15 item 6: clients that leave before their KV lands. The decode node tells the
    prefill node, which aborts their work and says so; the blocks come back as soon as the
    prefill node's current forward step ends, not after the transfer timeout plus grace
    (30 s + 2 s here)."""
    processes = Processes(log_dir)
    node_args = [arg if arg != "10000" else "30000" for arg in NODE_ARGS]  # --kv-transfer-timeout-ms
    try:
        proxy = start_proxy(processes, "cancel-proxy")
        prefill, _ = start_node(processes, "cancel-prefill", "prefill", model, proxy, node_args=node_args)
        decode, _ = start_node(processes, "cancel-decode", "decode", model, proxy, node_args=node_args)
        # Prompts queue on the one-thread prefill node; every client leaves while they do. (Short
        # ones: the prefill node aborts between forward steps, and on one loaded CPU thread a step
        # of long prompts lasts seconds.)
        requests = [{"prompt": [3000 + 97 * i + j for j in range(200)], "max_tokens": 8, "temperature": 0}
                    for i in range(24)]
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(requests)) as pool:
            list(pool.map(lambda request: leave_early(proxy, request, 0.5), requests))
        left_at = time.monotonic()
        wait_for("the decode node to free the blocks of the clients that left",
                 lambda: metric(decode, "vllm:kv_cache_usage_perc") == 0, timeout=60)
        freed_after = time.monotonic() - left_at
        if freed_after > 15:
            raise AssertionError(f"the blocks of clients that left came back after {freed_after:.1f} s "
                                 "(the transfer timeout + grace is 32 s)")
        # Issue #34 item 3: every hold ended on a confirmation, none at its deadline.
        expired = metric(decode, "pdserve:kv_import_hold_expired_total")
        if expired != 0:
            raise AssertionError(f"{expired:.0f} imports held their blocks until the hold deadline "
                                 "(see the decode node's log: 'freed at the hold deadline')")
        cancels = metric(prefill, "pdserve:prefill_cancels_total")
        if cancels == 0:
            raise AssertionError("no client left before its KV landed (the prefill node got no cancel): "
                                 "make the prompts longer")
        check_no_blocks_in_use([decode, prefill])
        if run_all(proxy, [{"prompt": [5, 6, 7], "max_tokens": 4, "temperature": 0}])[0][2] != 4:
            raise AssertionError("the cluster does not serve after the clients left")
        print(f"ok: {cancels:.0f} imports cancelled by clients that left; their blocks came back "
              f"{freed_after:.1f} s after the last one left", flush=True)
    finally:
        processes.stop_all()


def main():
    phase = sys.argv[1] if len(sys.argv) > 1 else "all"
    with tempfile.TemporaryDirectory(prefix="pdserve-scaling-") as directory:
        model = make_model(directory)
        try:
            if phase in ("scale", "all"):
                phase_scale(model, directory)
            if phase in ("backpressure", "all"):
                phase_backpressure(model, directory)
            if phase in ("cancel", "all"):
                phase_cancel(model, directory)
        except Exception:
            for name in sorted(os.listdir(directory)):
                if name.endswith(".log"):
                    with open(os.path.join(directory, name), errors="replace") as handle:
                        print(f"---- {name}\n{handle.read()[-3000:]}", file=sys.stderr)
            raise


if __name__ == "__main__":
    main()
