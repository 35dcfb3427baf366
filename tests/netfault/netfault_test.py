#!/usr/bin/python3
"""Real network faults (issue #15, label netfault; needs root): the proxy, two prefill and two
decode nodes each in its own network namespace with its own address, joined by veth pairs and a
bridge; each node binds its address and advertises it (--advertise-host); KV over UCX tcp on the
namespace's eth0 only. The test client stays in the root namespace, on its own veth.

1. Baseline: greedy answers of a colocated pdserve-decode (root namespace, loopback).
2. Every node link delayed 20 ms ± 5 ms, 1% loss, 1 Gbit/s (tc netem, or link_emulator.py
   with the same parameters where the kernel has no sch_netem): concurrent requests, streaming
   and not, all equal the baseline.
3. Under that load, a decode node's link goes down for 5 s while KV bytes are in flight to it
   (seen in a prefill namespace's socket queues), then comes back; later, the same for a prefill
   node sending KV. Every request ends within its deadline with the baseline's answer or a clear
   error (an SSE error event, or a 5xx with an OpenAI error body): no hang, no wrong answer.
4. After each heal: the node is up again, the workload equals the baseline, and no KV block
   stays in use on any node.

Fails (never skips) when namespaces cannot be made. Everything it made is removed on every exit
path, and leftovers of earlier runs that died are removed first.
"""
import concurrent.futures
import http.client
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
import pdserve_testing as t  # noqa: E402

t.set_deadline(300)
STARTED = time.monotonic()
HERE = os.path.dirname(os.path.abspath(__file__))
PREFIX = "pdnf"  # namespaces pdnf-PID-ROLE, links pdnfPID..., so a dead run's leftovers are found
PID = os.getpid()
DELAY_MS, JITTER_MS, LOSS, RATE_BPS = 20, 5, 0.01, 1e9
PARTITION_S = 5
DECODE_DETECT_S = 5  # the proxy's heartbeat timeout (3 s), its 250 ms expiry tick, and margin
REQUEST_DEADLINE_S = 70  # each client request, measured by the client
NODE_ARGS = ["--threads", "1", "--kv-cache-memory-gib", "0.25", "--max-model-len", "4096"]
# A heartbeat call may take its whole 2 s timeout (a SYN lost twice at 1% loss), after which the
# node waits one interval: 2 intervals + 2 s must stay under the proxy's heartbeat timeout, or one
# unlucky call drops a healthy node (with 500 ms and 2 s, a third of the runs did).
# A KV transfer's deadline runs from the start of its prompt's forward, and one transfer past it
# fails every transfer to that decode node (its endpoint is closed): 20 s is room for a loaded
# 2-core machine (10 s was not, at a load average of 8).
CLUSTER_NODE_ARGS = ["--ucx-tls", "tcp", "--kv-transfer-timeout-ms", "20000", "--heartbeat-interval-ms", "250"]
# The proxy's stream idle timeout must exceed the decode node's wait for KV after the first token
# (--kv-transfer-timeout-ms + 2 s grace): else a prefill node's fault ends the stream as a decode
# node's failure, and the proxy marks that healthy decode node down.
# Placement by load alone: the workload repeats its prompts, so cache-aware placement (the default)
# would prefill them on the decode nodes holding them, and a healed prefill node would get no work
# to show that it serves again.
PROXY_ARGS = ["--heartbeat-timeout-ms", "3000", "--first-byte-timeout-s", "30", "--stream-idle-timeout-s", "25",
              "--request-timeout-s", "60", "--no-cache-aware-routing"]
DECODE_ARGS = ["--prefill-timeout-ms", "20000"]
ROLES = ["proxy", "prefill-0", "prefill-1", "decode-0", "decode-1"]


def sh(*argv, check=True):
    result = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} exited {result.returncode}: {result.stderr.strip()}")
    return result


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def dead_run(pid):
    """Whether names made by the run with this pid are leftovers (ours too: nothing is made yet)."""
    return pid == PID or not pid_alive(pid)


def remove_leftovers():
    """Namespaces and links of earlier runs whose test process is gone (killed, crashed)."""
    for line in sh("ip", "netns", "list").stdout.splitlines():
        match = re.match(rf"({PREFIX}-(\d+)-\S+)", line)
        if match and dead_run(int(match.group(2))):
            for pid in sh("ip", "netns", "pids", match.group(1), check=False).stdout.split():
                os.kill(int(pid), 9)
            sh("ip", "netns", "delete", match.group(1), check=False)
            print(f"removed namespace {match.group(1)} of a dead run", flush=True)
    for line in sh("ip", "-o", "link", "show").stdout.splitlines():
        match = re.match(rf"\d+: ({PREFIX}(\d+)[a-z]\d*)[@:]", line)
        if match and dead_run(int(match.group(2))):
            sh("ip", "link", "delete", match.group(1), check=False)
            print(f"removed link {match.group(1)} of a dead run", flush=True)


class Lab:
    """One namespace per role, each with lo and eth0 (a veth whose other end is a bridge port).
    The bridge is link_emulator.py, which also shapes the links when the kernel has no netem;
    the client's veth end in the root namespace holds .1."""

    def __init__(self):
        self.namespaces, self.host_ends, self.ips = {}, {}, {}
        self.emulator = None
        self.use_netem = False
        self.subnet = self._free_subnet()
        t.add_cleanup(self.teardown)
        client_end, client_port = f"{PREFIX}{PID}c", f"{PREFIX}{PID}s"
        sh("ip", "link", "add", client_end, "type", "veth", "peer", "name", client_port)
        sh("ip", "addr", "add", f"{self.subnet}.1/24", "dev", client_end)
        sh("ip", "link", "set", client_end, "up")
        sh("ip", "link", "set", client_port, "up")
        ports = [client_port]
        for index, role in enumerate(ROLES):
            namespace = f"{PREFIX}-{PID}-{role}"
            host_end, inner = f"{PREFIX}{PID}h{index}", f"{PREFIX}{PID}n{index}"
            sh("ip", "netns", "add", namespace)
            self.namespaces[role] = namespace
            sh("ip", "-n", namespace, "link", "set", "lo", "up")
            sh("ip", "link", "add", host_end, "type", "veth", "peer", "name", inner)
            self.host_ends[role] = host_end
            sh("ip", "link", "set", inner, "netns", namespace)
            sh("ip", "-n", namespace, "link", "set", inner, "name", "eth0")
            self.ips[role] = f"{self.subnet}.{index + 2}"
            sh("ip", "-n", namespace, "addr", "add", f"{self.ips[role]}/24", "dev", "eth0")
            sh("ip", "-n", namespace, "link", "set", "eth0", "up")
            sh("ip", "link", "set", host_end, "up")
            ports.append(f"{host_end}:shaped")
        probe = sh("tc", "-n", self.namespaces["proxy"], "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms",
                   check=False)
        self.use_netem = probe.returncode == 0
        if self.use_netem:
            sh("tc", "-n", self.namespaces["proxy"], "qdisc", "del", "dev", "lo", "root")
        self.emulator = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "link_emulator.py"), "--delay-ms", str(DELAY_MS), "--jitter-ms",
             str(JITTER_MS), "--loss", str(LOSS), "--rate-bps", str(RATE_BPS), "--seed", "15", *ports])
        t.wait_until(lambda: self.reachable(), 20, "every namespace answers through the bridge")

    @staticmethod
    def _free_subnet():
        taken = sh("ip", "-4", "-o", "addr", "show").stdout + sh("ip", "-4", "route", "show").stdout
        for offset in range(200):
            subnet = f"10.213.{(PID + offset) % 200 + 20}"
            if subnet + "." not in taken:
                return subnet
        raise AssertionError("no free 10.213.x.0/24 subnet for the namespaces")

    def reachable(self):
        """Port 9 of every namespace refuses a connection (a RST back proves the path)."""
        for role in ROLES:
            with socket.socket() as probe:
                probe.settimeout(2)
                try:
                    probe.connect((self.ips[role], 9))
                except ConnectionRefusedError:
                    continue
        return True

    def exec(self, role, argv):
        return ["ip", "netns", "exec", self.namespaces[role], *argv]

    def shape(self):
        """Delay, jitter, loss and rate on every node's link (its namespace's egress), from now on."""
        if self.use_netem:
            for namespace in self.namespaces.values():
                sh("tc", "-n", namespace, "qdisc", "add", "dev", "eth0", "root", "netem", "delay", f"{DELAY_MS}ms",
                   f"{JITTER_MS}ms", "loss", f"{LOSS * 100:g}%", "rate", f"{RATE_BPS / 1e9:g}gbit")
        else:
            self.emulator.send_signal(signal.SIGUSR1)

    def set_link(self, role, up):
        sh("ip", "link", "set", self.host_ends[role], "up" if up else "down")

    def kv_in_flight(self, prefill_role, prefill_port, decode_ports):
        """Decode roles that a prefill node has unacknowledged bytes queued to over UCX: any
        connection between them but HTTP (the prefill node's port, or the decode node's)."""
        out = sh("ss", "-N", self.namespaces[prefill_role], "-tnH", "state", "established").stdout
        busy = set()
        for line in out.splitlines():
            fields = line.split()
            if len(fields) < 4 or int(fields[1]) == 0:
                continue
            local_port, (peer_ip, _, peer_port) = int(fields[2].rpartition(":")[2]), fields[3].rpartition(":")
            for role, port in decode_ports.items():
                if peer_ip == self.ips[role] and port != int(peer_port) and local_port != prefill_port:
                    busy.add(role)
        return busy

    def teardown(self):
        if self.emulator is not None and self.emulator.poll() is None:
            self.emulator.kill()
            self.emulator.wait()
        for namespace in self.namespaces.values():
            for pid in sh("ip", "netns", "pids", namespace, check=False).stdout.split():
                os.kill(int(pid), 9)
            sh("ip", "netns", "delete", namespace, check=False)
        for link in [*self.host_ends.values(), f"{PREFIX}{PID}c"]:
            if sh("ip", "link", "show", link, check=False).returncode == 0:
                sh("ip", "link", "delete", link, check=False)


# ---- the client (root namespace), with its own deadline per request

def split_url(url):
    host, port = re.match(r"http://([^:/]+):(\d+)", url).groups()
    return host, int(port)


def request(base, method, path, body=None, headers=None, timeout=10):
    host, port = split_url(base)
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request(method, path, None if body is None else json.dumps(body),
                     {"Content-Type": "application/json", **(headers or {})})
        response = conn.getresponse()
        return response.status, response.read().decode()
    finally:
        conn.close()


def get_json(base, path, headers=None):
    status, body = request(base, "GET", path, headers=headers)
    if status != 200:
        raise AssertionError(f"GET {base}{path}: HTTP {status}: {body[:300]}")
    return json.loads(body)


def metric(base, name, default=None):
    """An unlabelled series (or the first of a labelled one); `default` when it is absent (a
    counter that never counted), else an error."""
    status, text = request(base, "GET", "/metrics")
    if status != 200:
        raise AssertionError(f"GET {base}/metrics: HTTP {status}")
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    if default is None:
        raise AssertionError(f"{name} is not in {base}/metrics")
    return default


def is_clear_error(payload):
    error = payload.get("error") if isinstance(payload, dict) else None
    return isinstance(error, dict) and isinstance(error.get("message"), str) and error["message"] != ""


def complete(base, body, stream):
    """One completion; returns a dict: kind ok (text, finish, tokens), error (how, detail) or
    bad (what was wrong), with start, end and, for errors, when the error arrived."""
    start = time.monotonic()
    deadline = start + REQUEST_DEADLINE_S
    outcome = {"start": start, "stream": stream}
    host, port = split_url(base)
    conn = http.client.HTTPConnection(host, port, timeout=REQUEST_DEADLINE_S)
    try:
        payload = dict(body, stream=stream)
        if stream:
            payload["stream_options"] = {"include_usage": True}
        conn.request("POST", "/v1/completions", json.dumps(payload), {"Content-Type": "application/json"})
        response = conn.getresponse()
        if not stream or response.status != 200:
            text = response.read().decode()
            try:
                answer = json.loads(text)
            except ValueError:
                answer = None
            if response.status == 200 and answer and "choices" in answer:
                choice = answer["choices"][0]
                outcome.update(kind="ok", answer=(choice["text"], choice["finish_reason"],
                                                  answer["usage"]["completion_tokens"]))
            elif response.status >= 500 and is_clear_error(answer):
                outcome.update(kind="error", how=f"HTTP {response.status}", detail=answer["error"]["message"])
            else:
                outcome.update(kind="bad", detail=f"HTTP {response.status}: {text[:300]}")
        else:
            text, finish, tokens, done, error = "", None, None, False, None
            while time.monotonic() < deadline:
                conn.sock.settimeout(max(0.1, deadline - time.monotonic()))
                line = response.fp.readline()
                if not line:
                    break
                line = line.decode().strip()
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    done = True
                    break
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    error = chunk
                    outcome["error_at"] = time.monotonic()
                    continue
                for choice in chunk.get("choices", []):
                    text += choice.get("text", "")
                    finish = choice.get("finish_reason") or finish
                if chunk.get("usage"):
                    tokens = chunk["usage"]["completion_tokens"]
            if error is not None:
                outcome.update(kind="error" if is_clear_error(error) and done else "bad", how="SSE error event",
                               detail=error.get("error", {}).get("message", json.dumps(error)[:300]))
            elif done:
                outcome.update(kind="ok", answer=(text, finish, tokens))
            else:
                outcome.update(kind="bad", detail=f"the stream ended without [DONE] or an error event: {text!r}")
    except (OSError, http.client.HTTPException) as failure:
        outcome.update(kind="bad", detail=f"{type(failure).__name__}: {failure}")
    finally:
        conn.close()
    outcome["end"] = time.monotonic()
    if outcome["kind"] == "error" and "error_at" not in outcome:
        outcome["error_at"] = outcome["end"]
    if outcome["end"] - start > REQUEST_DEADLINE_S:
        outcome.update(kind="bad", detail=f"took {outcome['end'] - start:.1f} s (deadline {REQUEST_DEADLINE_S} s)")
    return outcome


def workload(count, seed):
    """Prompts long enough that their KV (16 KB a token) takes a while on a shaped link."""
    rng = random.Random(seed)
    return [{"prompt": [rng.randrange(1000, 100000) for _ in range(rng.choice([24, 75, 130, 260, 400]))],
             "max_tokens": rng.choice([4, 8, 16]), "temperature": 0, "ignore_eos": True} for _ in range(count)]


REQUESTS = workload(12, 15)


def check_outcome(index, outcome, baseline, allow_errors):
    if outcome["kind"] == "ok":
        t.expect_equal(outcome["answer"], baseline[index], f"request #{index} (stream={outcome['stream']})")
    elif outcome["kind"] == "error":
        t.expect(allow_errors, f"request #{index} failed with no fault injected: {outcome['how']}: "
                               f"{outcome['detail']}")
    else:
        raise AssertionError(f"request #{index} (stream={outcome['stream']}): {outcome['detail']}")


def run_workload(proxy, baseline, what):
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(REQUESTS)) as pool:
        futures = [pool.submit(complete, proxy, body, i % 2 == 0) for i, body in enumerate(REQUESTS)]
        outcomes = [f.result() for f in futures]
    for index, outcome in enumerate(outcomes):
        check_outcome(index, outcome, baseline, allow_errors=False)
    slowest = max(o["end"] - o["start"] for o in outcomes)
    print(f"ok: {what}: {len(outcomes)} concurrent requests (half streaming) equal the baseline; slowest "
          f"{slowest:.1f} s", flush=True)


# ---- the cluster

def start_cluster(lab, model):
    env = {"PDSERVE_CLUSTER_TOKEN": t.CLUSTER_TOKEN, "UCX_TLS": "tcp", "UCX_NET_DEVICES": "eth0"}
    ip = lab.ips["proxy"]
    proxy = t.Process("proxy", lab.exec("proxy", [t.BINARIES["proxy"], "--host", ip, "--port", "0", *PROXY_ARGS]),
                      r"pdserve-proxy: listening on (http://\S+)", env=env)
    proxy_url = proxy.match.group(1)
    t.expect(proxy_url.startswith(f"http://{ip}:"), f"the proxy listens on its own address: {proxy_url}")
    processes = {"proxy": proxy}
    for role in ROLES[1:]:
        kind = role.split("-")[0]
        argv = [t.BINARIES[kind], "--model", model, "--host", lab.ips[role], "--advertise-host", lab.ips[role],
                "--port", "0", "--proxy", proxy_url, *NODE_ARGS, *CLUSTER_NODE_ARGS,
                *(DECODE_ARGS if kind == "decode" else [])]
        pattern = SERVING_OR_PREFILLING[kind]
        processes[role] = t.Process(role, lab.exec(role, argv), pattern, env=env)
    urls = {role: processes[role].match.group(processes[role].match.lastindex) for role in ROLES}
    for role in ROLES[1:]:
        t.expect(urls[role].startswith(f"http://{lab.ips[role]}:"), f"{role} listens on its address: {urls[role]}")
    t.wait_until(lambda: registered(proxy_url) == {urls[r]: "up" for r in ROLES[1:]}, 60,
                 "every node registered with the proxy at its own address")
    return processes, urls


SERVING_OR_PREFILLING = {"decode": t.SERVING_LINE, "prefill": r"pdserve-prefill: prefilling (\S+) on (http://\S+)"}


def registered(proxy_url):
    return {n["url"]: n["state"] for n in get_json(proxy_url, "/cluster", t.cluster_headers())["nodes"]}


def blocks_used(urls):
    used = {role: metric(urls[role], "pdserve:kv_cache_blocks_used") for role in ROLES if role.startswith("decode")}
    used.update({role: metric(urls[role], "vllm:kv_cache_usage_perc") for role in ROLES
                 if role.startswith("prefill")})
    return used


def wait_no_blocks_in_use(urls, since, what):
    t.wait_until(lambda: not any(blocks_used(urls).values()), 40, f"{what}: no KV block in use on any node "
                 "(decode: pdserve:kv_cache_blocks_used, prefill: vllm:kv_cache_usage_perc)")
    print(f"ok: {what}: every node's KV blocks back to 0, {time.monotonic() - since:.1f} s after the heal",
          flush=True)


def partition(lab, urls, baseline, victim_kind):
    """Load from 6 clients; `victim_kind`'s link goes down for 5 s while KV is in flight."""
    proxy = urls["proxy"]
    decode_ports = {r: split_url(urls[r])[1] for r in ROLES if r.startswith("decode")}
    stop = threading.Event()
    outcomes = []
    answered = threading.Condition()  # notified at each outcome appended

    def client(worker):
        index = worker
        while not stop.is_set():
            outcome = complete(proxy, REQUESTS[index % len(REQUESTS)], (index + worker) % 2 == 0)
            outcome["index"] = index % len(REQUESTS)
            with answered:
                outcomes.append(outcome)
                answered.notify_all()
            index += 5

    counters = {name: metric(proxy, name, 0.0) for name in PROXY_COUNTERS}
    threads = [threading.Thread(target=client, args=(w,), daemon=True) for w in range(6)]
    for thread in threads:
        thread.start()
    victim = None
    end = time.monotonic() + 60
    while victim is None and time.monotonic() < end:
        for prefill in ("prefill-0", "prefill-1"):
            busy = lab.kv_in_flight(prefill, split_url(urls[prefill])[1], decode_ports)
            if busy:
                victim = prefill if victim_kind == "prefill" else sorted(busy)[0]
                break
    if victim is None:
        stop.set()
        raise AssertionError("no KV transfer was seen in flight within 60 s of load")
    down_at = time.monotonic()
    lab.set_link(victim, up=False)
    watching = threading.Event()
    not_up = []  # (seconds after the fault, role) for every /cluster poll that found a node not up

    def watch():
        while not watching.is_set():
            try:
                states = registered(proxy)
            except (OSError, AssertionError, ValueError) as error:
                states = {}
                not_up.append((time.monotonic() - down_at, f"the proxy's /cluster ({error})"))
            not_up.extend((time.monotonic() - down_at, r) for r in ROLES[1:] if states.get(urls[r]) != "up")
            time.sleep(0.1)  # the sampling period: /cluster is another process's state, with no event

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        time.sleep(PARTITION_S)  # the fault's length
    finally:
        lab.set_link(victim, up=True)
    healed_at = time.monotonic()
    dropped_after = next((at for at, r in not_up if r == victim), None)
    t.expect(dropped_after is not None, f"the proxy still routed to {victim} after {PARTITION_S} s of partition")
    t.wait_until(lambda: registered(proxy).get(urls[victim]) == "up", 30, f"{victim} registered again after the heal")
    back_after = time.monotonic() - healed_at
    # Load goes on on the healed cluster (as many requests sent after the heal ended as there
    # are clients), then every client ends within its deadline.
    with answered:
        if not answered.wait_for(lambda: sum(o["start"] > healed_at for o in outcomes) >= len(threads),
                                 2 * REQUEST_DEADLINE_S):
            stop.set()
            raise AssertionError(f"the load did not go on after the heal: {len(outcomes)} requests ended in all")
    stop.set()
    for thread in threads:
        thread.join(REQUEST_DEADLINE_S + 5)
        t.expect(not thread.is_alive(), "a client is still waiting past its deadline (a hang)")
    watching.set()
    watcher.join()
    others_down = sorted({(round(at, 1), r) for at, r in not_up if r != victim})
    t.expect(not others_down, f"the partition of {victim} took healthy nodes down too (s after the fault, node): "
                              f"{others_down[:10]}")
    problems = []
    for outcome in outcomes:
        try:
            check_outcome(outcome["index"], outcome, baseline, allow_errors=True)
        except AssertionError as error:
            problems.append(str(error))
    t.expect(not problems, f"{len(problems)} of {len(outcomes)} requests ended wrongly:\n" + "\n".join(problems[:10]))
    hit = [o for o in outcomes if o["start"] < healed_at and o["end"] > down_at]
    errors = [o for o in outcomes if o["kind"] == "error"]
    right = [o for o in hit if o["kind"] == "ok"]
    detect = [o["error_at"] - down_at for o in errors]
    if victim_kind == "decode":
        # The partitioned node's streams end when the proxy misses its heartbeats; an error
        # after that is a request on a healthy decode node that the fault reached.
        late = [f"{o['error_at'] - down_at:.1f} s: {o['detail']}" for o in errors
                if o["error_at"] - down_at > DECODE_DETECT_S]
        t.expect(not late, f"requests on the healthy decode node failed during {victim}'s partition: {late}")
    summary = {"victim": victim, "requests": len(outcomes), "in_flight_during_partition": len(hit),
               "right_answer": len(right), "errors": len(errors),
               "error_kinds": sorted({o["how"] for o in errors}),
               "error_after_s": [round(x, 1) for x in sorted(detect)],
               "proxy_dropped_node_after_s": round(dropped_after, 1),
               **{name.split(":")[1]: metric(proxy, name, 0.0) - counters[name] for name in PROXY_COUNTERS},
               "slowest_s": round(max(o["end"] - o["start"] for o in outcomes), 1),
               "registered_again_after_heal_s": round(back_after, 1)}
    print(f"ok: {victim} partitioned {PARTITION_S} s during a KV transfer: {json.dumps(summary)}", flush=True)
    for outcome in errors:
        print(f"     error seen by a client: {outcome['how']}: {outcome['detail']}", flush=True)
    return victim, healed_at


PROXY_COUNTERS = ("pdserve:proxy_retries_total", "pdserve:proxy_upstream_failures_total")
# What shows that a node did work: a prefill node's accepted work, a decode node's tokens.
WORK_COUNTER = {"prefill": "pdserve:prefill_requests_total", "decode": "vllm:generation_tokens_total"}


def main():
    if os.geteuid() != 0:
        raise SystemExit("FAIL: the netfault test needs root (network namespaces, veth, tc)")
    remove_leftovers()
    try:
        lab = Lab()
    except (AssertionError, OSError) as error:
        raise SystemExit(f"FAIL: cannot build the network namespaces of the test: {error}")
    print(f"namespaces up on {lab.subnet}.0/24; link shaping by "
          f"{'tc netem' if lab.use_netem else 'link_emulator.py (this kernel has no sch_netem)'}", flush=True)
    model = t.make_model(config=t.QWEN3_06B_CONFIG, layers=2)

    colocated = t.start_colocated(model, extra=("--max-model-len", "4096"))
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        baseline = list(pool.map(lambda body: complete(colocated.url, body, False), REQUESTS))
    for index, outcome in enumerate(baseline):
        t.expect(outcome["kind"] == "ok", f"colocated baseline #{index}: {outcome.get('detail')}")
    baseline = [outcome["answer"] for outcome in baseline]
    colocated.stop()
    print(f"ok: baseline of {len(REQUESTS)} requests from a colocated node", flush=True)

    processes, urls = start_cluster(lab, model)
    failed = 1
    try:
        lab.shape()
        run_workload(urls["proxy"], baseline, f"{DELAY_MS} ms ± {JITTER_MS} ms, {LOSS:.0%} loss, 1 Gbit/s links")
        decodes = [urls[r] for r in ROLES if r.startswith("decode")]
        transfers = sum(metric(u, "pdserve:kv_transfer_time_seconds_count") for u in decodes)
        t.expect(transfers >= len(REQUESTS), f"only {transfers:.0f} KV transfers for {len(REQUESTS)} requests")
        print(f"     KV transfers on the shaped links: {transfers:.0f}, mean "
              f"{sum(metric(u, 'pdserve:kv_transfer_time_seconds_sum') for u in decodes) / transfers:.2f} s, "
              f"{sum(metric(u, 'pdserve:kv_transfer_bytes_total') for u in decodes) / 1e6:.0f} MB", flush=True)
        wait_no_blocks_in_use(urls, time.monotonic(), "after the shaped workload")
        for kind in ("decode", "prefill"):
            victim, healed_at = partition(lab, urls, baseline, kind)
            # A node holding blocks of failed transfers gets no new work (routing prefers the
            # lowest KV usage), so the healed node is asked to serve once they are back.
            wait_no_blocks_in_use(urls, healed_at, f"after the {kind} partition")
            work_before = metric(urls[victim], WORK_COUNTER[kind], 0.0)
            run_workload(urls["proxy"], baseline, f"after the {kind} partition healed")
            t.expect(metric(urls[victim], WORK_COUNTER[kind], 0.0) > work_before,
                     f"the healed {victim} took no work from the workload after the heal")
        failed = 0
    except Exception:  # noqa: BLE001 - reported with the servers' logs, which are kept
        traceback.print_exc()
        print("\n".join(f"--- {name}\n{p.log()[-6000:]}" for name, p in processes.items()))
    print(f"netfault run: {time.monotonic() - STARTED:.0f} s", flush=True)
    t.finish(failed, what="netfault checks")


if __name__ == "__main__":
    main()
