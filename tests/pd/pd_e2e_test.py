#!/usr/bin/python3
"""End to end: proxy -> prefill -> UCX -> decode on real processes over loopback, launched
with tools/cluster/pdserve-cluster. Greedy outputs of 32 concurrent requests of mixed lengths
must be token-identical (same text, finish reason and usage) to a colocated pdserve-decode,
over UCX tcp (KV sent layer by layer) and shared memory (all layers after the forward,
--kv-layerwise off), both again on the staged path (--kv-transfer-path staged: KV through
bounded host staging buffers, as for a GPU pool on a UCX without CUDA memory, with landing
areas small enough that imports wait for them), with 1P1D and 2P2D (a shared system prompt
hitting the prefix caches); then faults: a decode node frozen (SIGSTOP) or killed mid-stream (its streams go on
on the other decode node, identical to uninterrupted runs, greedy and seeded), a dead
prefill node (the next one takes over), a client that leaves mid-flight, and bad cluster
calls. After each phase no KV block is left in use.

Environment: PDSERVE_BUILD_DIR, PDSERVE_SOURCE_DIR; PDSERVE_E2E_NODE_ARGS (optional): more
flags for every node and the colocated reference, e.g. "--device cuda:0" to run the phases on a
GPU (the pd stage of scripts/gpu/run-gpu-tests.sh --second). Argument: the phase to run (or "all").
"""
import concurrent.futures
import json
import os
import random
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

BUILD = os.environ["PDSERVE_BUILD_DIR"]
SOURCE = os.environ["PDSERVE_SOURCE_DIR"]
CONFIG = os.path.join(SOURCE, "configs/models/qwen3-0.6b/config.json")
TOKEN = "e2e-secret"
NODE_ARGS = shlex.split(os.environ.get("PDSERVE_E2E_NODE_ARGS", ""))
AUTH = {"Authorization": "Bearer " + TOKEN}


def http(method, url, body=None, headers=None, timeout=60):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def metric(base_url, name):
    _, text = http("GET", base_url + "/metrics")
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def make_model(directory):
    model = os.path.join(directory, "model")
    subprocess.run([os.path.join(BUILD, "tools/make_model/pdserve-make-model"), "--config", CONFIG,
                    "--layers", "2", "--out", model, "--seed", "7"], check=True, stdout=subprocess.DEVNULL)
    return model


def workload(seed, count, shared_prefix=0):
    rng = random.Random(seed)
    prefix = [rng.randrange(1000, 100000) for _ in range(shared_prefix)]
    requests = []
    for _ in range(count):
        length = rng.choice([3, 9, 16, 17, 40, 75, 130])
        prompt = prefix + [rng.randrange(1000, 100000) for _ in range(length)]
        requests.append({"prompt": prompt, "max_tokens": rng.choice([1, 2, 8, 20]), "temperature": 0,
                         "ignore_eos": True})
    return requests


def complete(base_url, request):
    status, body = http("POST", base_url + "/v1/completions", request, timeout=300)
    if status != 200:
        raise AssertionError(f"HTTP {status}: {body[:300]}")
    answer = json.loads(body)
    choice = answer["choices"][0]
    return choice["text"], choice["finish_reason"], answer["usage"]["completion_tokens"]


def run_all(base_url, requests):
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(requests)) as pool:
        return list(pool.map(lambda r: complete(base_url, r), requests))


class Cluster:
    """A cluster started by tools/cluster/pdserve-cluster, every process on port 0; the
    launcher's state file names each one's URL and pid."""

    def __init__(self, topology, model, ucx_tls, log_dir, name):
        self.topology = topology
        path = os.path.join(log_dir, f"topology-{name}.json")
        with open(path, "w") as handle:
            json.dump(topology, handle)
        state_file = os.path.join(log_dir, f"state-{name}.json")
        # The launcher's own lines (why it stopped, which node exited with which code) go to a
        # log next to the nodes' logs, so a failure's report shows them.
        self.launcher_log = open(os.path.join(log_dir, f"launcher-{name}.log"), "w")
        self.process = subprocess.Popen(
            [os.path.join(SOURCE, "tools/cluster/pdserve-cluster"), path, "--model", model,
             "--build-dir", BUILD, "--ucx-tls", ucx_tls, "--log-dir", os.path.join(log_dir, f"logs-{name}"),
             "--state-file", state_file],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env=dict(os.environ, PDSERVE_CLUSTER_TOKEN=TOKEN))
        line = self.process.stdout.readline()
        while line and "ready" not in line:
            self.launcher_log.write(line)
            line = self.process.stdout.readline()
        self.launcher_log.write(line)
        self.launcher_log.flush()
        # The rest goes on being copied while the cluster runs: a launcher blocked on a full
        # pipe would stop watching its nodes.
        self.copier = threading.Thread(target=self._copy_launcher_output, daemon=True)
        self.copier.start()
        if "ready" not in line:
            raise AssertionError(f"the cluster did not start; logs in {log_dir}")
        with open(state_file) as handle:
            self.state = json.load(handle)
        self.proxy = self.state["proxy"]["url"]

    def _copy_launcher_output(self):
        for line in self.process.stdout:
            self.launcher_log.write(line)
            self.launcher_log.flush()

    def url(self, role, index):
        return self.state[f"{role}-{index}"]["url"]

    def pid(self, role, index):
        return self.state[f"{role}-{index}"]["pid"]

    def pid_of_url(self, url):
        return next(entry["pid"] for entry in self.state.values() if entry["url"] == url)

    def nodes(self):
        return json.loads(http("GET", self.proxy + "/cluster", headers=AUTH)[1])["nodes"]

    def stop(self):
        self.process.send_signal(signal.SIGINT)
        try:
            code = self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise AssertionError("the launcher did not stop within 30 s of Ctrl-C")
        self.copier.join(timeout=5)
        return code


def topology(prefill, decode, extra=(), prefill_args=()):
    """Every process on port 0 (the launcher reads the address each one reports)."""
    return {"proxy": {"port": 0},
            "node_args": ["--kv-cache-memory-gib", "0.25", "--threads", "1", "--max-model-len", "4096",
                          "--kv-transfer-timeout-ms", "10000"] + list(extra) + NODE_ARGS,
            "prefill": [{"port": 0, "args": list(prefill_args)} for _ in range(prefill)],
            "decode": [{"port": 0} for _ in range(decode)]}


# What each role counts for every prompt it took: a node whose counter moved held KV blocks
# for it, so "no block in use" afterwards means they were released, not that none were taken.
WORK_COUNTERS = {"decode": "vllm:prompt_tokens_total", "prefill": "pdserve:prefill_prompt_tokens_total"}


def check_no_blocks_in_use(cluster, roles=("decode", "prefill"), killed=()):
    """Every node of `roles` took work and holds no KV block now; `killed`: the URLs of nodes the
    test killed itself (skipped). Any other node that does not answer died unasked: a failure."""
    for role in roles:
        for index in range(len(cluster.topology[role])):
            url = cluster.url(role, index)
            if url in killed:
                continue
            try:
                served = metric(url, WORK_COUNTERS[role])
            except OSError as error:
                raise AssertionError(f"{role} {url} died unasked: {error}") from error
            if served == 0:
                raise AssertionError(f"{role} {url} took no work ({WORK_COUNTERS[role]} is 0): "
                                     "its free pool proves nothing")
            # Polled: another process's state, which gives the test no event to wait on.
            deadline = time.monotonic() + 15
            while True:
                try:
                    used = metric(url, "vllm:kv_cache_usage_perc")
                except OSError as error:
                    raise AssertionError(f"{role} {url} died unasked: {error}") from error
                if used == 0:
                    break
                if time.monotonic() > deadline:
                    raise AssertionError(f"{role} {url} still holds KV blocks (usage {used})")
                time.sleep(0.2)


def expect_same(reference, got, what):
    mismatches = [i for i, (a, b) in enumerate(zip(reference, got)) if a != b]
    if mismatches:
        i = mismatches[0]
        raise AssertionError(f"{what}: {len(mismatches)} of {len(got)} answers differ from the colocated "
                             f"node; first #{i}: {got[i]!r} vs {reference[i]!r}")
    print(f"ok: {what}: {len(got)} answers identical to the colocated node", flush=True)


def reference_answers(model, requests, log_dir):
    """The answers of a colocated pdserve-decode (port 0) to `requests`."""
    node = subprocess.Popen([os.path.join(BUILD, "decode_node/pdserve-decode"), "--model", model, "--port", "0",
                             "--threads", "1", "--kv-cache-memory-gib", "0.25"] + NODE_ARGS,
                            stdout=subprocess.PIPE, stderr=open(os.path.join(log_dir, "colocated.log"), "w"),
                            text=True)
    try:
        line = node.stdout.readline()
        url = re.search(r" on (http://\S+) ", line)
        if url is None:
            raise AssertionError(f"the colocated node did not start: {line!r}")
        return run_all(url.group(1), requests)
    finally:
        node.send_signal(signal.SIGTERM)
        node.wait(timeout=30)


# The staged path with little staging memory: 8 MiB hold 32 blocks of this 2-layer model's
# float32 KV in a decode node's landing area (32 concurrent prompts of up to 9 blocks wait for
# them) and two 4 MiB send buffers on the prefill node.
STAGED_ARGS = ["--kv-transfer-path", "staged", "--kv-staging-mib", "8"]


def phase_transport(model, log_dir, ucx_tls, kv_layerwise, staged=False):
    requests = workload(1, 32)
    reference = reference_answers(model, requests, log_dir)
    name = ("staged-" if staged else "") + ucx_tls
    cluster = Cluster(topology(1, 1, extra=STAGED_ARGS if staged else (),
                               prefill_args=["--kv-layerwise", kv_layerwise]),
                      model, ucx_tls, log_dir, name)
    try:
        got = run_all(cluster.proxy, requests)
        path = "staged through host buffers" if staged else "direct"
        expect_same(reference, got,
                    f"1P1D over UCX {ucx_tls}, KV layer-wise {kv_layerwise}, {path}, 32 concurrent")
        prefills = metric(cluster.url("prefill", 0), "pdserve:prefill_requests_total")
        if prefills < len(requests):
            raise AssertionError(f"only {prefills} of {len(requests)} prompts went to the prefill node")
        if staged:
            for role in ("prefill", "decode"):
                with open(os.path.join(log_dir, f"logs-{name}", f"{role}-0.log"), errors="replace") as handle:
                    if "KV transfer: staged path" not in handle.read():
                        raise AssertionError(f"the {role} node did not take the staged path")
            print("ok: both nodes moved their KV through staging buffers", flush=True)
        check_no_blocks_in_use(cluster)
    finally:
        code = cluster.stop()
        if code != 0:
            raise AssertionError(f"the launcher exited with code {code} after Ctrl-C (see launcher-{name}.log)")
    print("ok: the launcher stopped the cluster cleanly on Ctrl-C", flush=True)


def phase_2p2d(model, log_dir):
    requests = workload(2, 32, shared_prefix=64)
    reference = reference_answers(model, requests, log_dir)
    spec = topology(2, 2)
    # The faults below check that every stream, resumed ones included, is prefilled on a
    # prefill node: placement by load, since cache-aware placement (the default) rightly
    # prefills a resumed stream on the decode node that has its prompt cached (pd_routing).
    spec["proxy"]["args"] = ["--no-cache-aware-routing"]
    cluster = Cluster(spec, model, "tcp", log_dir, "2p2d")
    try:
        # Two requests alone first, so each decode node has the shared prompt cached.
        got = run_all(cluster.proxy, requests[:1]) + run_all(cluster.proxy, requests[1:2])
        got += run_all(cluster.proxy, requests[2:])
        expect_same(reference, got, "2P2D with a shared 64-token system prompt")
        for role, counter in (("prefill", "pdserve:prefill_prompt_tokens_total"), ("decode", "vllm:prompt_tokens_total")):
            served = [metric(cluster.url(role, i), counter) for i in range(2)]
            if min(served) == 0:
                raise AssertionError(f"one {role} node got no work: {served}")
        hits = sum(metric(cluster.url("decode", i), "vllm:prefix_cache_hits_total") for i in range(2))
        if hits == 0:
            raise AssertionError("the decode nodes' prefix caches never hit on the shared prompt")
        print(f"ok: both pools shared the work; decode prefix-cache hits: {int(hits)} tokens not transferred",
              flush=True)
        check_no_blocks_in_use(cluster)
        faults(cluster, requests, reference)
    finally:
        cluster.stop()


def faults(cluster, requests, reference):
    proxy = cluster.proxy
    # Bad cluster calls.
    auth = {"Authorization": "Bearer " + TOKEN}
    checks = [
        (http("POST", proxy + "/cluster/nodes", {"role": "decode", "url": "http://127.0.0.1:1"}), 401),
        (http("POST", proxy + "/cluster/nodes", {"role": "decode", "url": "not a url"}, auth), 400),
        (http("POST", proxy + "/cluster/nodes", {"role": "chef", "url": "http://127.0.0.1:1"}, auth), 400),
        (http("POST", proxy + "/cluster/nodes", {"role": "decode", "url": cluster.url("decode", 0), "model": "m"}, auth), 409),
        (http("POST", proxy + "/cluster/nodes/nobody/heartbeat", {"load": {}}, auth), 404),
        (http("POST", proxy + "/cluster/nodes/nobody/drain", {}, auth), 404),
        (http("POST", cluster.url("prefill", 0) + "/internal/v1/prefill", {"request_id": "x"}), 401),
        (http("POST", cluster.url("prefill", 0) + "/internal/v1/prefill", {"request_id": "x"}, auth), 400),
        (http("POST", cluster.url("decode", 0) + "/v1/completions", {"prompt": [1, 2], "max_tokens": 1},
              {"X-Pdserve-Prefill": "http://127.0.0.1:1"}), 401),
    ]
    for (status, body), expected in checks:
        if status != expected or '"error"' not in body:
            raise AssertionError(f"expected HTTP {expected} with an error body, got {status}: {body[:200]}")
    print(f"ok: {len(checks)} bad cluster calls refused with the right status and an error body", flush=True)

    # A client that leaves while its request is in flight: no block stays in use. Each leaves
    # after its stream's first event, so its request surely held blocks when the client went.
    for _ in range(4):
        with socket.create_connection(("127.0.0.1", int(proxy.rsplit(":", 1)[1])), timeout=60) as conn:
            body = json.dumps({"prompt": requests[0]["prompt"] * 3, "max_tokens": 50, "stream": True}).encode()
            conn.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            received = b""
            while b"\ndata: " not in received:
                chunk = conn.recv(4096)
                if not chunk:
                    raise AssertionError(f"the proxy closed the stream before its first event: {received[:300]!r}")
                received += chunk
    check_no_blocks_in_use(cluster)
    print("ok: clients that left mid-flight left no KV block in use", flush=True)

    # A prefill node dies: the decode node tries the next one.
    killed = {cluster.url("prefill", 0)}
    os.kill(cluster.pid("prefill", 0), signal.SIGKILL)
    got = run_all(proxy, requests[:8])
    expect_same(reference[:8], got, "after kill -9 of a prefill node")

    # A decode node freezes (SIGSTOP: no byte, no heartbeat) or dies (kill -9) mid-stream: the
    # proxy continues each of its streams on the other decode node from the last event the
    # client got, so the client sees no error and the same text as an uninterrupted run.
    streams = long_streams(requests)
    uninterrupted = run_streams(proxy, streams)
    for outcome, stream in zip(uninterrupted, streams):
        if outcome["error"] is not None or outcome["finish"] != {i: "length" for i in range(stream.get("n", 1))}:
            raise AssertionError(f"an uninterrupted stream failed: {outcome['error']}")
    frozen_url = cut_streams(cluster, streams, uninterrupted, signal.SIGSTOP, "SIGSTOP")
    # Thawed, the node registers again and serves; it holds no block afterwards. Polled: the
    # proxy's /cluster is the only place that says so.
    deadline = time.monotonic() + 20
    while not any(n["url"] == frozen_url and n["state"] == "up" for n in cluster.nodes()):
        if time.monotonic() > deadline:
            raise AssertionError("the thawed decode node did not register again")
        time.sleep(0.2)
    got = run_all(proxy, requests[:8])
    expect_same(reference[:8], got, "after SIGSTOP and SIGCONT of a decode node mid-stream")
    check_no_blocks_in_use(cluster, roles=("decode",), killed=killed)

    victim_url = cut_streams(cluster, streams, uninterrupted, signal.SIGKILL, "kill -9")
    killed.add(victim_url)
    states = {n["url"]: n["state"] for n in cluster.nodes()}
    if states.get(victim_url, "down") != "down":
        raise AssertionError(f"the proxy still routes to the killed decode node: {states}")
    got = run_all(proxy, requests[:8])
    expect_same(reference[:8], got, "after kill -9 of a decode node mid-stream")
    check_no_blocks_in_use(cluster, roles=("decode",), killed=killed)


def long_streams(requests):
    """Long streamed requests: one greedy, two seeded and one seeded with n = 2, whose choices
    interleave in the stream (about 20 s each on this model)."""
    base = dict(requests[0], max_tokens=160, stream=True, stream_options={"include_usage": True})
    seeded = [dict(base, temperature=0.9, top_p=0.95, seed=seed) for seed in (11, 12, 13)]
    seeded[-1]["n"] = 2
    return [base] + seeded


def stream_text(base_url, request, start_delay=0.0, first_event=None):
    """Streams a request; returns its text and finish reason per choice index, usage, error
    event and the longest gap between two events (seconds). `first_event` (a threading.Event)
    is set when the first event arrives. `start_delay` staggers the streams' starts."""
    time.sleep(start_delay)
    req = urllib.request.Request(base_url + "/v1/completions", data=json.dumps(request).encode(),
                                 headers={"Content-Type": "application/json"})
    outcome = {"text": {}, "finish": {}, "usage": None, "error": None, "gap": 0.0}
    last = time.monotonic()
    with urllib.request.urlopen(req, timeout=150) as response:
        for raw in response:
            line = raw.decode().strip()
            if not line.startswith("data: "):
                if line.startswith(":"):
                    raise AssertionError(f"a comment reached the client: {line[:100]}")
                continue
            if first_event is not None:
                first_event.set()
            now = time.monotonic()
            outcome["gap"] = max(outcome["gap"], now - last)
            last = now
            data = line[6:]
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            if "error" in chunk:
                outcome["error"] = chunk
                continue
            if chunk.get("usage"):
                outcome["usage"] = chunk["usage"]["completion_tokens"]
            for choice in chunk.get("choices", []):
                index = choice["index"]
                outcome["text"][index] = outcome["text"].get(index, "") + choice.get("text", "")
                if choice.get("finish_reason"):
                    outcome["finish"][index] = choice["finish_reason"]
    return outcome


def run_streams(base_url, streams, stagger=0.0):
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(streams)) as pool:
        futures = [pool.submit(stream_text, base_url, r, i * stagger) for i, r in enumerate(streams)]
        return [f.result(timeout=200) for f in futures]


def cut_streams(cluster, streams, uninterrupted, sig, what):
    """Starts `streams` staggered (so each is cut at another point), stops the decode node
    with the most of them with `sig` once every stream has had its first event, and checks
    every stream against its uninterrupted run, and that every stream, resumed ones included,
    was prefilled on a prefill node. Returns the URL of the stopped node."""
    resumes_before = metric(cluster.proxy, "pdserve:proxy_stream_resumes_total")
    kv_sources = ("pdserve:remote_prefill_time_seconds_count", "pdserve:remote_prefill_fallbacks_total",
                  "pdserve:remote_prefills_served_from_cache_total")
    remote_before = {n["url"]: {name: metric(n["url"], name) for name in kv_sources}
                     for n in cluster.nodes() if n["role"] == "decode"}
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(streams)) as pool:
        started = [threading.Event() for _ in streams]
        futures = [pool.submit(stream_text, cluster.proxy, r, i * 0.4, started[i]) for i, r in enumerate(streams)]
        for i, event in enumerate(started):
            if not event.wait(60):
                raise AssertionError(f"{what}: stream {i} got no event within 60 s")
        victim = max((n for n in cluster.nodes() if n["role"] == "decode"),
                     key=lambda n: n["load"]["proxy_in_flight"])
        on_victim = victim["load"]["proxy_in_flight"]
        if on_victim == 0:
            raise AssertionError("the streams ended before the decode node could be stopped")
        pid = cluster.pid_of_url(victim["url"])
        os.kill(pid, sig)
        try:
            outcomes = [f.result(timeout=200) for f in futures]
        finally:
            if sig == signal.SIGSTOP:
                os.kill(pid, signal.SIGCONT)
    for i, (got, expected) in enumerate(zip(outcomes, uninterrupted)):
        if got["error"] is not None:
            raise AssertionError(f"{what}: stream {i} ended with an error event: {got['error']}")
        if (got["text"], got["finish"], got["usage"]) != (expected["text"], expected["finish"], expected["usage"]):
            differing = [k for k in expected["text"] if got["text"].get(k) != expected["text"][k]]
            first = differing[0] if differing else None
            got_text, expected_text = got["text"].get(first, ""), expected["text"].get(first, "")
            raise AssertionError(f"{what}: stream {i} differs from its uninterrupted run: "
                                 f"{got['usage']} tokens vs {expected['usage']}, finish {got['finish']} vs "
                                 f"{expected['finish']}; choices {differing} differ, choice {first}: "
                                 f"{len(got_text)} characters vs {len(expected_text)}, first difference at "
                                 f"{next((k for k, (a, b) in enumerate(zip(got_text, expected_text)) if a != b), None)}")
    # A stream whose head had not come yet (its first token still on the prefill node) is
    # simply sent to the other node; the others are resumed there.
    resumed = metric(cluster.proxy, "pdserve:proxy_stream_resumes_total") - resumes_before
    if resumed < 1:
        raise AssertionError(f"{what}: {on_victim} streams were on the stopped node, none was resumed")
    # Every stream ended on the other node; a resumed one imported prompt + delivered tokens,
    # or failed over to a local prefill, or found them all cached there (the uninterrupted run
    # of the same seeded stream may have left them, when the cut falls on a block boundary).
    survivor = next(url for url in remote_before if url != victim["url"])
    counted = {name: metric(survivor, name) - before for name, before in remote_before[survivor].items()}
    if sum(counted.values()) < len(streams):
        raise AssertionError(f"{what}: {len(streams)} streams ended on the other node, but only "
                             f"{counted} were prefilled remotely, failed over or served from its cache")
    print(f"ok: {what} of a decode node with {on_victim} of {len(streams)} streams (1 greedy, 2 seeded, 1 seeded with n = 2) "
          f"mid-stream: {int(resumed)} resumed on the other node, every stream identical to its "
          f"uninterrupted run, no error event; longest gap {max(o['gap'] for o in outcomes):.1f} s", flush=True)
    return victim["url"]


def main():
    phase = sys.argv[1] if len(sys.argv) > 1 else "all"
    with tempfile.TemporaryDirectory(prefix="pdserve-e2e-") as directory:
        model = make_model(directory)
        try:
            # Layer-by-layer KV sending on over tcp, off over shared memory: both against the
            # same colocated reference, at no extra cost.
            if phase in ("tcp", "all"):
                phase_transport(model, directory, "tcp", "on")
            if phase in ("sm", "all"):
                phase_transport(model, directory, "sm", "off")
            if phase in ("staged-tcp", "all"):
                phase_transport(model, directory, "tcp", "on", staged=True)
            if phase in ("staged-sm", "all"):
                phase_transport(model, directory, "sm", "off", staged=True)
            if phase in ("2p2d", "all"):
                phase_2p2d(model, directory)
        except Exception as error:
            # The failure first, then the logs (launcher and proxy before the nodes): a report
            # cut to its start and end still shows why.
            print(f"FAIL: {type(error).__name__}: {error}", file=sys.stderr, flush=True)
            logs = sorted((os.path.join(root, name) for root, _, files in os.walk(directory)
                           for name in files if name.endswith(".log")),
                          key=lambda path: (not os.path.basename(path).startswith(("launcher", "proxy")), path))
            for path in logs:
                with open(path, errors="replace") as handle:
                    tail = handle.read()[-2000:]
                print(f"---- {os.path.relpath(path, directory)}\n{tail}", file=sys.stderr)
            raise


if __name__ == "__main__":
    main()
