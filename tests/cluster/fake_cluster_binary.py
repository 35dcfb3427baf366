#!/usr/bin/python3
"""Stand-ins for pdserve-proxy, pdserve-prefill and pdserve-decode (by the name it is run
as), for testing pdserve-cluster's autoscaling loop without a model:
  * the proxy registers nodes, lists them (GET /cluster), drains them, and answers
    GET /cluster/advice with the recommendation in the JSON file $FAKE_ADVICE
    ({"prefill_nodes", "decode_nodes", "requests"}) and the nodes up per pool, appending what it
    answered as one line to $FAKE_ADVICE.reads (so that a test knows which advice was seen);
  * a node registers with every --proxy, and with --exit-when-drained exits 0 once drained at
    any (a proxy that stops answering is left alone); it exits 1
    at once while the file $FAKE_FAIL exists (a node that fails to start); with $FAKE_ARGV_DIR
    set it writes its command line there first (ROLE-PID.json); $FAKE_ANNOUNCE_LATE_S: it prints
    its address that long after it registered; $FAKE_ADVERTISE_HOST: it registers under that
    host instead of 127.0.0.1 (as with --advertise-host).
Each prints the line pdserve-cluster reads for its address.
"""
import json
import os
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ROLE = os.path.basename(sys.argv[0]).removeprefix("pdserve-")


def serve(handler):
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}"


def run_proxy():
    nodes = {}  # id -> {"id", "role", "url", "state"}
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def answer(self, body, status=200):
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            with lock:
                listed = list(nodes.values())
            if self.path == "/cluster":
                return self.answer({"nodes": listed})
            if self.path == "/cluster/advice":
                with open(os.environ["FAKE_ADVICE"]) as handle:
                    wanted = json.load(handle)
                with open(os.environ["FAKE_ADVICE"] + ".reads", "a") as reads:
                    reads.write(json.dumps(wanted, sort_keys=True) + "\n")
                up = {pool: sum(n["role"] == pool and n["state"] == "up" for n in listed)
                      for pool in ("prefill", "decode")}
                return self.answer({"load": {pool: {"nodes": count} for pool, count in up.items()},
                                    "workload": {"requests": wanted["requests"]},
                                    "recommendation": {"prefill_nodes": wanted["prefill_nodes"],
                                                       "decode_nodes": wanted["decode_nodes"]}})
            self.answer({"error": "not found"}, 404)

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            with lock:
                if self.path == "/cluster/nodes":
                    node_id = f"{body['role']}-{len(nodes)}"
                    nodes[node_id] = {"id": node_id, "role": body["role"], "url": body["url"], "state": "up"}
                    return self.answer({"id": node_id})
                node_id = self.path.removeprefix("/cluster/nodes/").removesuffix("/drain")
                if self.path.endswith("/drain") and node_id in nodes:
                    nodes[node_id]["state"] = "draining"
                    return self.answer({"id": node_id, "ok": True})
            self.answer({"error": "not found"}, 404)

    print(f"pdserve-proxy: listening on {serve(Handler)} (0 prefill, 0 decode static nodes)", flush=True)
    while True:
        time.sleep(1)


def post(url, body):
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=5) as response:
        return json.loads(response.read())


def run_node():
    if os.environ.get("FAKE_ARGV_DIR"):
        with open(os.path.join(os.environ["FAKE_ARGV_DIR"], f"{ROLE}-{os.getpid()}.json"), "w") as handle:
            json.dump(sys.argv[1:], handle)
    if os.path.exists(os.environ.get("FAKE_FAIL", "")):
        sys.exit(1)
    proxies = [sys.argv[i + 1] for i, arg in enumerate(sys.argv) if arg == "--proxy"]
    url = serve(BaseHTTPRequestHandler)
    announce = f"pdserve-{ROLE}: {'prefilling' if ROLE == 'prefill' else 'serving'} fake on {url} (device cpu)"
    late = float(os.environ.get("FAKE_ANNOUNCE_LATE_S", "0"))
    if late == 0:
        print(announce, flush=True)
    # Like a node given --advertise-host, it may register under another name than it announces.
    registered = url.replace("127.0.0.1", os.environ.get("FAKE_ADVERTISE_HOST", "127.0.0.1"))
    node_ids = {proxy: post(proxy + "/cluster/nodes", {"role": ROLE, "url": registered})["id"] for proxy in proxies}
    if late > 0:
        time.sleep(late)
        print(announce, flush=True)
    while True:
        time.sleep(0.1)
        for proxy, node_id in list(node_ids.items()):
            try:
                with urllib.request.urlopen(proxy + "/cluster", timeout=5) as response:
                    mine = [n for n in json.loads(response.read())["nodes"] if n["id"] == node_id]
            except OSError:
                del node_ids[proxy]  # a dead proxy
                continue
            if mine and mine[0]["state"] == "draining" and "--exit-when-drained" in sys.argv:
                sys.exit(0)


if __name__ == "__main__":
    run_proxy() if ROLE == "proxy" else run_node()
