#!/usr/bin/python3
"""pdserve-cluster --autoscale on a real cluster (2-layer synthetic model, UCX over tcp): the
launcher follows GET /cluster/advice up and back down.

One prefill and one decode node whose KV holds about 5 sequences of the workload (short
prompts, 96 output tokens: decode-bound). Ten closed-loop clients keep the decode node full,
so the advice measures a decode pool at its capacity and, at 80% target utilization, asks for
2 decode nodes: the launcher adds one (--autoscale 1:2, 3 polls of 1 s, 10 s cool-down) and the
proxy routes to it. Then the load stops: as the advice's arrival rate falls (or its window
empties) it asks for 1 node, and the launcher drains what it added (the prefill pool may have
grown too, depending on the machine), each node exiting 0. Asserts
each step within a deadline, no request failed (429s from a full node are retried), the
/metrics gauges, and a clean stop (exit 0 on Ctrl-C).

Environment: PDSERVE_BUILD_DIR, PDSERVE_SOURCE_DIR.
"""
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pd_e2e_test import SOURCE, TOKEN, http, make_model, metric  # noqa: E402

AUTH = {"Authorization": "Bearer " + TOKEN}
TOPOLOGY = {
    "proxy": {"port": 0},
    "node_args": ["--threads", "1", "--max-model-len", "1024", "--heartbeat-interval-ms", "200",
                  "--kv-transfer-timeout-ms", "10000"],
    "prefill": [{"port": 0, "args": ["--kv-cache-memory-gib", "0.05"]}],
    # 40 blocks of 16 tokens: 5 sequences of 16 + 96 tokens.
    "decode": [{"port": 0, "args": ["--kv-cache-memory-gib", "0.01"]}],
}
CLIENTS = 10


def wait_for(what, predicate, timeout):
    """Polls `predicate` until it holds: for the states of other processes (the launcher's
    state file, /cluster, /metrics), which give the test no event to wait on."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


class Load:
    """Closed-loop clients until stop(); a 429 (the decode node is full) is retried."""

    def __init__(self, proxy):
        self.proxy, self.stopping, self.ok, self.errors = proxy, threading.Event(), 0, []
        self.threads = [threading.Thread(target=self.client, args=(i,), daemon=True) for i in range(CLIENTS)]
        for thread in self.threads:
            thread.start()

    def client(self, index):
        sent = 0
        while not self.stopping.is_set():
            request = {"prompt": [1000 + 131 * index + sent + j for j in range(16)], "max_tokens": 96,
                       "temperature": 0, "ignore_eos": True}
            sent += 1
            status, body = http("POST", self.proxy + "/v1/completions", request, timeout=120)
            if status == 200:
                self.ok += 1
            elif status == 429:
                time.sleep(0.2)  # a client's back-off before its retry (pacing, not a wait)
            else:
                self.errors.append(f"HTTP {status}: {body[:200]}")

    def stop(self):
        self.stopping.set()
        for thread in self.threads:
            thread.join(timeout=150)
            if thread.is_alive():
                raise AssertionError("a client's request did not end within 150 s of the load stopping")


def main():
    signal.alarm(540)  # below the CTest TIMEOUT: this script, not CTest, stops the cluster
    with tempfile.TemporaryDirectory(prefix="pdserve-autoscale-") as directory:
        model = make_model(directory)
        topology_path = os.path.join(directory, "topology.json")
        with open(topology_path, "w") as handle:
            json.dump(TOPOLOGY, handle)
        state_path = os.path.join(directory, "state.json")
        launcher_log = []
        launcher = subprocess.Popen(
            [os.path.join(SOURCE, "tools/cluster/pdserve-cluster"), topology_path, "--model", model,
             "--build-dir", os.environ["PDSERVE_BUILD_DIR"], "--ucx-tls", "tcp",
             "--log-dir", os.path.join(directory, "logs"), "--state-file", state_path,
             "--autoscale", "1:2", "--autoscale-interval", "1", "--autoscale-up-polls", "3",
             "--autoscale-down-polls", "3", "--autoscale-cooldown", "10"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env=dict(os.environ, PDSERVE_CLUSTER_TOKEN=TOKEN))

        ready = threading.Event()  # set on the launcher's "ready:" line, or when its output ends

        def read_launcher():
            for line in launcher.stdout:
                launcher_log.append(line)
                print("launcher: " + line, end="", flush=True)
                if "ready:" in line:
                    ready.set()
            ready.set()

        threading.Thread(target=read_launcher, daemon=True).start()
        load = None
        try:
            if not ready.wait(180) or not any("ready:" in line for line in launcher_log):
                raise AssertionError("the cluster was not ready within 180 s (or the launcher stopped)")

            def state():
                with open(state_path) as handle:
                    return json.load(handle)

            def up(role):
                nodes = json.loads(http("GET", state()["proxy"]["url"] + "/cluster", headers=AUTH)[1])["nodes"]
                return [n for n in nodes if n["role"] == role and n["state"] == "up"]

            proxy = state()["proxy"]["url"]
            load = Load(proxy)
            wait_for("the launcher to add a decode node under load",
                     lambda: "decode-1" in state() and len(up("decode")) == 2, 240)
            added = state()["decode-1"]
            if not any("autoscale: decode 1 -> 2" in line and "the advice asks for" in line for line in launcher_log):
                raise AssertionError("the launcher added a node without logging the decision and its reason")
            print(f"ok: decode-1 added under load at {added['url']}", flush=True)
            wait_for("the proxy to route work to the added node",
                     lambda: metric(added["url"], "vllm:generation_tokens_total") > 0, 60)
            print("ok: the added decode node generated tokens", flush=True)

            load.stop()
            if load.errors:
                raise AssertionError(f"{len(load.errors)} requests failed while scaling: {load.errors[:3]}")
            print(f"ok: {load.ok} requests answered while scaling, none failed", flush=True)

            # The prefill pool may have grown too (its advice depends on the machine): every added
            # node must be drained and gone.
            wait_for("every added node to be drained and to exit",
                     lambda: set(state()) == {"proxy", "prefill-0", "decode-0"}, 240)
            text = "".join(launcher_log)
            for name in re.findall(r"autoscale: (\S+) joined", text):
                if f"autoscale: draining {name}" not in text or f"{name} left the cluster (drained)" not in text:
                    raise AssertionError(f"{name} left without a logged drain, or not with exit code 0")
            wait_for("one node per pool again (MIN)", lambda: len(up("decode")) == 1 and len(up("prefill")) == 1, 30)
            gauges = {pool: metric(proxy, f'pdserve:cluster_pool_nodes{{pool="{pool}"}}')
                      for pool in ("prefill", "decode")}
            if gauges != {"prefill": 1, "decode": 1}:
                raise AssertionError(f"pdserve:cluster_pool_nodes after the drain: {gauges}")
            print("ok: after the load the launcher drained the added node back to 1:1", flush=True)
        finally:
            if load is not None:
                load.stopping.set()
            launcher.send_signal(signal.SIGINT)
            try:
                code = launcher.wait(timeout=60)
            except subprocess.TimeoutExpired:
                launcher.kill()
                raise AssertionError("the launcher did not stop within 60 s of Ctrl-C")
        if code != 0:
            raise AssertionError(f"the launcher exited with {code} on Ctrl-C")
        print("all checks passed", flush=True)


if __name__ == "__main__":
    main()
