#!/usr/bin/python3
"""Two pdserve-proxy replicas in front of one 1P1D cluster (2-layer synthetic model, UCX over
tcp), started by `pdserve-cluster --proxies 2`: every node registers with both, and either
proxy serves any request. A bounded load of greedy requests is split across the two proxies
(non-streaming, and one long stream per proxy); once the stream through the second proxy is
under way and answers have come back from both, the second proxy is killed with SIGKILL.

Asserts: the state file names both proxies and each lists both nodes up; every request sent to
the surviving proxy succeeds, before and after the kill, with the answer of a colocated node;
a request sent to the dead proxy either completed before the kill (with that same answer) or
failed with a connection error (never an HTTP error or an SSE error event), and at least one
did (the kill hit requests in flight); those requests, sent again to the survivor as a client
retrying through a Service would, succeed at once; the launcher keeps the cluster up without
the dead proxy (it leaves the state file); the survivor still routes to both nodes after the
heartbeat timeout; no KV block is left in use. Before the load: prompts cached through one
proxy appear in the other's prefix index (the nodes report their caches to both).

Environment: PDSERVE_BUILD_DIR, PDSERVE_SOURCE_DIR.
"""
import concurrent.futures
import http.client
import json
import os
import signal
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pd_e2e_test import (AUTH, Cluster, check_no_blocks_in_use, make_model, metric,  # noqa: E402
                         reference_answers, topology, workload)

DEADLINE_S = 240  # below the CTest TIMEOUT: the cleanup is ours
CONNECTION_ERRORS = (ConnectionError, http.client.HTTPException, urllib.error.URLError, TimeoutError)


def cluster_nodes(proxy):
    with urllib.request.urlopen(urllib.request.Request(proxy + "/cluster", headers=AUTH), timeout=10) as answer:
        return json.loads(answer.read())["nodes"]


def send(proxy, request, on_first_chunk=None):
    """(text, finish reason, completion tokens) of a completion, streamed or not. An HTTP error
    status or an SSE error event raises AssertionError; a connection that fails raises one of
    CONNECTION_ERRORS."""
    body = json.dumps(request).encode()
    call = urllib.request.Request(proxy + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
    try:
        response = urllib.request.urlopen(call, timeout=120)
    except urllib.error.HTTPError as error:
        raise AssertionError(f"HTTP {error.code}: {error.read()[:300]!r}") from None
    with response:
        if not request.get("stream"):
            answer = json.loads(response.read())
            return answer["choices"][0]["text"], answer["choices"][0]["finish_reason"], \
                answer["usage"]["completion_tokens"]
        text, finish, tokens = "", None, 0
        for raw in response:
            line = raw.decode().strip()
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                return text, finish, tokens
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise AssertionError(f"an SSE error event: {chunk}")
            for choice in chunk.get("choices", []):
                text += choice.get("text", "")
                finish = choice.get("finish_reason") or finish
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            if on_first_chunk is not None:
                on_first_chunk()
                on_first_chunk = None
        raise http.client.IncompleteRead(b"", None)  # the stream ended without [DONE]


def main():
    signal.alarm(DEADLINE_S)
    with tempfile.TemporaryDirectory(prefix="pdserve-proxies-") as directory:
        model = make_model(directory)
        requests = workload(31, 24)
        # One long stream per proxy (about 5 s of decoding): in flight when the proxy dies.
        streams = [dict(requests[i], max_tokens=48, stream=True, stream_options={"include_usage": True})
                   for i in (0, 1)]
        reference = reference_answers(model, requests + [dict(requests[i], max_tokens=48) for i in (0, 1)], directory)
        expected = {i: reference[i] for i in range(len(requests))}
        expected.update({len(requests) + k: reference[len(requests) + k] for k in (0, 1)})
        jobs = list(enumerate(requests)) + [(len(requests) + k, s) for k, s in enumerate(streams)]

        spec = topology(1, 1, extra=["--heartbeat-interval-ms", "200"])
        spec["proxy"]["args"] = ["--tokenizer", model]  # cache-aware placement at both
        spec["proxies"] = 2
        cluster = Cluster(spec, model, "tcp", directory, "proxies")
        try:
            run(cluster, jobs, expected)
        except BaseException:
            for root, _, files in os.walk(directory):
                for name in sorted(files):
                    if name.endswith(".log"):
                        with open(os.path.join(root, name), errors="replace") as handle:
                            print(f"---- {name}\n{handle.read()[-2500:]}", file=sys.stderr)
            raise
        finally:
            code = cluster.stop()
        if code != 0:
            raise AssertionError(f"the launcher exited {code} on Ctrl-C")
        print("all checks passed", flush=True)


def run(cluster, jobs, expected):
    survivor, doomed = cluster.state["proxy"]["url"], cluster.state["proxy-1"]["url"]
    node_urls = {cluster.url("prefill", 0), cluster.url("decode", 0)}
    for proxy in (survivor, doomed):
        up = {n["url"] for n in cluster_nodes(proxy) if n["state"] == "up"}
        if up != node_urls:
            raise AssertionError(f"{proxy} lists {up} up, expected both nodes {node_urls}")
    print(f"ok: both proxies ({survivor}, {doomed}) in the state file, each routing to both nodes", flush=True)

    # The nodes report their prefix caches to both proxies: what requests through one proxy
    # cached shows in the other's index too.
    keys = "pdserve:proxy_prefix_index_keys"
    before = metric(doomed, keys)
    longest = sorted(jobs[:-2], key=lambda job: -len(job[1]["prompt"]))[:3]
    for index, request in longest:
        if send(survivor, request) != expected[index]:
            raise AssertionError(f"request {index} through {survivor} before the load")
    # Polled: the heartbeats reach the other proxy on their own schedule, seen only on its /metrics.
    deadline = time.monotonic() + 10
    while not metric(doomed, keys) > before or metric(doomed, keys) != metric(survivor, keys):
        if time.monotonic() > deadline:
            raise AssertionError(f"the proxies' prefix indexes differ: {metric(survivor, keys)} keys at "
                                 f"{survivor}, {metric(doomed, keys)} at {doomed} (was {before})")
        time.sleep(0.05)
    print(f"ok: prefixes cached through one proxy are in the other's index ({metric(doomed, keys):.0f} keys at both)",
          flush=True)

    lock = threading.Lock()
    changed = threading.Condition(lock)  # notified when a stream starts or an answer is back
    done = {survivor: 0, doomed: 0}
    streaming = {survivor: threading.Event(), doomed: threading.Event()}
    killed = threading.Event()
    outcomes = {}  # job index -> (proxy, "ok" answer | exception, sent after the kill)

    def stream_started(proxy):
        with changed:
            streaming[proxy].set()
            changed.notify_all()

    def client(index, request):
        proxy = doomed if index % 2 else survivor
        after_kill = killed.is_set()
        try:
            answer = send(proxy, request, on_first_chunk=lambda: stream_started(proxy))
            result = ("ok", answer)
        except Exception as error:  # noqa: BLE001 - classified below
            result = ("error", error)
        with changed:
            outcomes[index] = (proxy, result, after_kill)
            if result[0] == "ok":
                done[proxy] += 1
            changed.notify_all()

    # The streams first, then the rest, 4 clients per proxy.
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=10)
    stream_jobs = [job for job in jobs if job[1].get("stream")]
    futures = [pool.submit(client, *job) for job in stream_jobs]
    futures += [pool.submit(client, *job) for job in jobs if not job[1].get("stream")]

    def ready_to_kill():  # called with the lock held
        return all(event.is_set() for event in streaming.values()) and min(done.values()) >= 2

    with changed:
        if not changed.wait_for(ready_to_kill, timeout=120):
            raise AssertionError(f"no answers from both proxies with both streams under way: {done}")
    os.kill(cluster.state["proxy-1"]["pid"], signal.SIGKILL)
    killed.set()
    with lock:
        print(f"ok: killed {doomed} with SIGKILL, {done} answers back, both streams under way", flush=True)
    # At once: the survivor answers a new request.
    first = send(survivor, jobs[2][1])
    if first != expected[2]:
        raise AssertionError(f"the first request after the kill: {first!r}, expected {expected[2]!r}")
    for future in futures:
        future.result(timeout=150)
    pool.shutdown()

    failed_at_doomed = []
    for index, (proxy, (kind, value), after_kill) in sorted(outcomes.items()):
        if kind == "ok":
            if value != expected[index]:
                raise AssertionError(f"request {index} via {proxy}: {value!r}, expected {expected[index]!r}")
            continue
        if proxy == survivor:
            raise AssertionError(f"request {index} to the surviving proxy failed "
                                 f"({'after' if after_kill else 'before'} the kill): {value!r}")
        if not isinstance(value, CONNECTION_ERRORS):
            raise AssertionError(f"request {index} to the killed proxy failed with {value!r}, not a connection error")
        failed_at_doomed.append(index)
    at_survivor = sum(1 for proxy, _, _ in outcomes.values() if proxy == survivor)
    stream_index = len(jobs) - 1  # the stream sent to the doomed proxy
    if stream_index not in failed_at_doomed:
        raise AssertionError("the stream through the killed proxy was not cut: the kill hit no request in flight")
    print(f"ok: all {at_survivor} requests to the survivor answered as the colocated node; of the killed proxy's "
          f"{len(outcomes) - at_survivor}, {len(failed_at_doomed)} failed with connection errors "
          f"(the stream among them), the rest answered as the colocated node", flush=True)

    # A client retrying through a Service lands on the survivor.
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as retry:
        answers = list(retry.map(lambda i: send(survivor, dict(jobs[i][1])), failed_at_doomed))
    for index, answer in zip(failed_at_doomed, answers):
        if answer != expected[index]:
            raise AssertionError(f"request {index} retried on the survivor: {answer!r}, expected {expected[index]!r}")
    print(f"ok: the {len(failed_at_doomed)} failed requests, sent again to the survivor, answered in full", flush=True)

    if cluster.process.poll() is not None:
        raise AssertionError(f"the launcher exited ({cluster.process.returncode}) when one of two proxies died")
    with open(os.path.join(os.path.dirname(cluster.launcher_log.name), "state-proxies.json")) as handle:
        state = json.load(handle)
    if "proxy-1" in state or "proxy" not in state:
        raise AssertionError(f"the state file after the kill: {sorted(state)}")
    # The nodes' heartbeats to the dead proxy fail; those to the survivor go on: through its
    # heartbeat timeout (3 s) after the kill, it lists both nodes up at every look. (What would
    # take a node down is that timeout running out, so the test watches it run out.)
    window_end = time.monotonic() + 3.5
    while time.monotonic() < window_end:
        up = {n["url"] for n in cluster_nodes(survivor) if n["state"] == "up"}
        if up != node_urls:
            raise AssertionError(f"after the kill the survivor lists {up} up, expected {node_urls}")
        time.sleep(0.1)
    if send(survivor, jobs[3][1]) != expected[3]:
        raise AssertionError("a request to the survivor 3.5 s after the kill")
    check_no_blocks_in_use(cluster)
    print("ok: the launcher kept the cluster up without the dead proxy; the survivor still routes to both nodes",
          flush=True)


if __name__ == "__main__":
    main()
