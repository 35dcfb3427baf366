"""Forged KV descriptors, end to end (issue #34), with the real binaries behind two proxies.

A holder of the cluster token POSTs prefill work to a real prefill node (registered with two
pdserve-proxy replicas, as the decode node is) whose `kv.descriptor`:
- names a UCX worker address that is no registered decode node's: 0xff bytes, the real one
  with its first or last byte changed, a truncated copy. Before the allowlist the address went
  to UCX, and the first two aborted the prefill node (SIGABRT in ucp_address_unpack). Now each
  work is refused with 403 before the prefill runs, counted in
  pdserve:kv_descriptor_refused_total, and the prefill node keeps serving;
- names the real decode node's worker but a wrong pool (base, size, key), or the real pool
  with blocks past its end. Before the handshake the prefill node put KV wherever the
  descriptor said and the decode node died with SIGSEGV in ucp_put_handler. Now each is refused
  before any put: the work's stream ends in `kv_failed` naming the refusal, counted too, and
  the decode node stays up, serves the next request and still takes KV from the same prefill
  node.
Then a second decode node registers with the second proxy only, after the prefill node last
read its proxies: its first work is admitted (the prefill node refreshes its list from both
proxies once before refusing), and its text is the locally prefilled one.

The decode node's real descriptor is taken from the work it sends to a stand-in prefill node
(an HTTP server of this test that answers 503: the decode node then prefills locally).
"""
import base64
import http.server
import json
import os
import struct
import sys
import threading

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
import pdserve_testing as t  # noqa: E402

t.set_deadline(240)
TOKEN_ENV = {"PDSERVE_CLUSTER_TOKEN": t.CLUSTER_TOKEN}
PROMPT = "The quick brown fox jumps over the lazy dog, " * 3


def parse_descriptor(text):
    """kv_transfer/descriptor.cpp's format: PDKV, version, base, bytes, address, key."""
    raw = base64.b64decode(text)
    assert raw[:5] == b"PDKV\x01", raw[:5]
    base, size = struct.unpack_from("<QQ", raw, 5)
    position = 21
    blobs = []
    for _ in range(2):
        (length,) = struct.unpack_from("<I", raw, position)
        blobs.append(raw[position + 4:position + 4 + length])
        position += 4 + length
    return {"base": base, "bytes": size, "address": blobs[0], "rkey": blobs[1]}


def serialize_descriptor(d):
    out = b"PDKV\x01" + struct.pack("<QQ", d["base"], d["bytes"])
    for blob in (d["address"], d["rkey"]):
        out += struct.pack("<I", len(blob)) + blob
    return base64.b64encode(out).decode()


class StandIn(http.server.BaseHTTPRequestHandler):
    """Takes one prefill work and refuses it (the decode node then prefills locally)."""
    works = []

    def do_POST(self):  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.path == "/internal/v1/prefill":
            StandIn.works.append(json.loads(body))
        answer = json.dumps({"error": {"message": "stand-in", "type": "server_error"}}).encode()
        self.send_response(503)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args):
        pass


def completion(decode_url, prefill_url):
    body = {"prompt": PROMPT, "max_tokens": 4, "temperature": 0}
    headers = dict(t.cluster_headers(), **{"X-Pdserve-Prefill": prefill_url})
    status, text = t.http("POST", decode_url + "/v1/completions", body, headers)
    t.expect_equal(status, 200, f"a completion through the decode node ({text[:300]})")
    return json.loads(text)["choices"][0]["text"]


def events_of(text):
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def start_proxy(name):
    return t.Process(name, [t.BINARIES["proxy"], "--port", "0"], r"pdserve-proxy: listening on (http://\S+)",
                     env=TOKEN_ENV)


def registered(proxy_url, count):
    """Whether `count` nodes are up at the proxy."""
    nodes = t.get_json(proxy_url + "/cluster", headers=t.cluster_headers())["nodes"]
    return sum(node["state"] == "up" for node in nodes) == count


def main():
    model = t.make_model()
    proxies = [start_proxy("proxy-a"), start_proxy("proxy-b")]
    proxy_urls = [proxy.match.group(1) for proxy in proxies]
    node = ["--model", model, "--port", "0", "--ucx-tls", "tcp", *t.DEFAULT_NODE_ARGS]
    both = ["--proxy", ",".join(proxy_urls)]
    decode = t.Process("decode", [t.BINARIES["decode"], *node, *both], t.SERVING_LINE, env=TOKEN_ENV)
    prefill = t.Process("prefill", [t.BINARIES["prefill"], *node, *both],
                        r"pdserve-prefill: prefilling (\S+) on (http://\S+)", env=TOKEN_ENV)
    stand_in = http.server.ThreadingHTTPServer(("127.0.0.1", 0), StandIn)
    threading.Thread(target=stand_in.serve_forever, daemon=True).start()
    processes = [decode, prefill, *proxies]
    decode_url, prefill_url = decode.match.group(2), prefill.match.group(2)
    failed = 0
    try:
        for url in proxy_urls:
            t.wait_until(lambda: registered(url, 2), 60, f"both nodes registered with {url}")

        def capture_work():
            local = completion(decode_url, f"http://127.0.0.1:{stand_in.server_address[1]}")
            t.expect_equal(len(StandIn.works), 1, "prefill works the stand-in got")
            capture_work.local_text = local

        failed += t.run_checks([("the decode node's prefill work, captured by a stand-in", capture_work)])
        if failed:
            return failed, processes
        work = StandIn.works[0]
        real = parse_descriptor(work["kv"]["descriptor"])
        block_bytes = real["bytes"] // work["kv"]["num_blocks"]  # every layer's K and V of a block

        def forged(name, descriptor=None, num_blocks=None, first_id=None):
            body = json.loads(json.dumps(work))
            body["request_id"] = "forged-" + name
            if descriptor is not None:
                body["kv"]["descriptor"] = serialize_descriptor(descriptor)
            if num_blocks is not None:
                body["kv"]["num_blocks"] = num_blocks
            if first_id is not None:
                body["kv"]["block_ids"] = list(range(first_id, first_id + len(body["kv"]["block_ids"])))
            return body

        address = real["address"]
        # Given to UCX 1.13, the first two abort the prefill node (ucp_address_unpack: "Assertion
        # `*addr_version == UCP_OBJECT_VERSION_V2' failed"); the others fail ucp_ep_create.
        unregistered = [
            ("a worker address of 0xff bytes", forged("ff", dict(real, address=b"\xff" * len(address)))),
            ("the worker address with its first byte changed",
             forged("first", dict(real, address=bytes([address[0] ^ 0xff]) + address[1:]))),
            ("a truncated worker address", forged("truncated", dict(real, address=address[:len(address) // 2]))),
            ("the worker address with its last byte changed",
             forged("last", dict(real, address=address[:-1] + bytes([address[-1] ^ 0xff])))),
        ]
        pool_blocks = work["kv"]["num_blocks"]
        forgeries = [
            ("a wrong pool base", forged("base", dict(real, base=real["base"] - 64 * block_bytes)),
             "pool base address"),
            ("a pool 16 times the real one, blocks past its end",
             forged("size", dict(real, bytes=16 * real["bytes"]), 16 * pool_blocks, 8 * pool_blocks),
             "pool size"),
            ("another key", forged("rkey", dict(real, rkey=bytes(b ^ 0x55 for b in real["rkey"]))), "remote key"),
            ("the real descriptor, blocks past the pool", forged("blocks", None, 16 * pool_blocks, 8 * pool_blocks),
             "outside a pool"),
        ]

        def check_unregistered_workers():
            for name, body in unregistered:
                status, text = t.http("POST", prefill_url + "/internal/v1/prefill", body, t.cluster_headers())
                t.expect(prefill.process.poll() is None, f"{name}: the prefill node died:\n{prefill.log()[-3000:]}")
                t.expect_equal(status, 403, f"{name}: HTTP status ({text[:300]})")
                error = json.loads(text)["error"]
                t.expect_equal(error["code"], "kv_peer_not_registered", f"{name}: the error's code")
                t.expect("not that of a decode node registered" in error["message"], f"{name}: {error['message']}")
            t.expect_equal(t.metric(prefill_url, "pdserve:kv_descriptor_refused_total"), float(len(unregistered)),
                           "pdserve:kv_descriptor_refused_total on the prefill node")
            t.expect_equal(t.metric(prefill_url, "pdserve:prefill_requests_total"), 0.0,
                           "work admitted to the engine (a refused one never is)")
            t.expect_equal(t.http("GET", prefill_url + "/health")[0], 200, "the prefill node's /health")

        def check_forgeries():
            for name, body, named in forgeries:
                status, text = t.http("POST", prefill_url + "/internal/v1/prefill", body, t.cluster_headers())
                t.expect(status == 200 or 400 <= status < 500, f"{name}: HTTP {status}: {text[:300]}")
                if status == 200:
                    last = events_of(text)[-1]
                    t.expect_equal(last["event"], "kv_failed", f"{name}: the stream's last event ({text[-500:]})")
                    t.expect(named in last["error"], f"{name}: the refusal names '{named}': {last['error']}")
                t.expect(decode.process.poll() is None, f"{name}: the decode node died:\n{decode.log()[-3000:]}")
            t.expect_equal(t.metric(prefill_url, "pdserve:kv_descriptor_refused_total"),
                           float(len(unregistered) + len(forgeries)),
                           "pdserve:kv_descriptor_refused_total on the prefill node")
            t.expect("refused" in decode.log(), "the decode node logs the claims it refused")

        def check_decode_node_still_serves():
            t.expect_equal(t.http("GET", decode_url + "/health")[0], 200, "the decode node's /health")
            remote = completion(decode_url, prefill_url)
            t.expect_equal(remote, capture_work.local_text, "the text prefilled remotely against locally")
            t.expect(t.metric(prefill_url, "pdserve:kv_transfer_bytes_total") > 0,
                     "KV went from the prefill node to the decode node after the forgeries")

        def check_new_decode_node_at_one_proxy():
            sent = t.metric(prefill_url, "pdserve:kv_transfer_bytes_total")
            refused = t.metric(prefill_url, "pdserve:kv_descriptor_refused_total")
            late = t.Process("decode-late", [t.BINARIES["decode"], *node, "--proxy", proxy_urls[1]], t.SERVING_LINE,
                             env=TOKEN_ENV)
            processes.append(late)
            t.wait_until(lambda: registered(proxy_urls[1], 3), 60, "the late decode node registered with proxy b")
            remote = completion(late.match.group(2), prefill_url)
            t.expect_equal(remote, capture_work.local_text, "the late decode node's text against a local prefill")
            t.expect(t.metric(prefill_url, "pdserve:kv_transfer_bytes_total") > sent,
                     "KV went from the prefill node to the late decode node")
            t.expect_equal(t.metric(prefill_url, "pdserve:kv_descriptor_refused_total"), refused,
                           "refusals after the late decode node's work")

        failed += t.run_checks([
            ("unregistered worker addresses are refused before UCX sees them; the prefill node serves on",
             check_unregistered_workers),
            ("forged descriptors are refused before any put, and counted", check_forgeries),
            ("the decode node stays up and takes KV from the same prefill node", check_decode_node_still_serves),
            ("a decode node registered a moment ago, at one proxy only, gets KV", check_new_decode_node_at_one_proxy),
        ])
        return failed, processes
    finally:
        stand_in.shutdown()


failed, processes = main()
for process in processes:
    process.stop()


class _Logs:
    def logs(self):
        return "\n".join(f"--- {p.name}\n{p.log()}" for p in processes)


t.finish(failed, _Logs())
