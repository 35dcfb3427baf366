"""Forged KV descriptors, end to end (issue #34 item 1), with the real binaries.

A holder of the cluster token POSTs prefill work to a real prefill node whose `kv.descriptor`
names the real decode node's UCX worker but a wrong pool (base, size, key), or the real pool
with blocks past its end. Before the handshake the prefill node put KV wherever the descriptor
said and the decode node died with SIGSEGV in ucp_put_handler. Now each is refused before any
put: the work's stream ends in `kv_failed` naming the refusal, the prefill node counts it in
pdserve:kv_descriptor_refused_total, and the decode node stays up, serves the next request and
still takes KV from the same prefill node.

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


def main():
    model = t.make_model()
    node = ["--model", model, "--port", "0", "--ucx-tls", "tcp", *t.DEFAULT_NODE_ARGS]
    decode = t.Process("decode", [t.BINARIES["decode"], *node, "--kv-transfer"], t.SERVING_LINE, env=TOKEN_ENV)
    prefill = t.Process("prefill", [t.BINARIES["prefill"], *node], r"pdserve-prefill: prefilling (\S+) on (http://\S+)",
                        env=TOKEN_ENV)
    stand_in = http.server.ThreadingHTTPServer(("127.0.0.1", 0), StandIn)
    threading.Thread(target=stand_in.serve_forever, daemon=True).start()
    processes = [decode, prefill]
    decode_url, prefill_url = decode.match.group(2), prefill.match.group(2)
    failed = 0
    try:
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

        def check_forgeries():
            for name, body, named in forgeries:
                status, text = t.http("POST", prefill_url + "/internal/v1/prefill", body, t.cluster_headers())
                t.expect(status == 200 or 400 <= status < 500, f"{name}: HTTP {status}: {text[:300]}")
                if status == 200:
                    last = events_of(text)[-1]
                    t.expect_equal(last["event"], "kv_failed", f"{name}: the stream's last event ({text[-500:]})")
                    t.expect(named in last["error"], f"{name}: the refusal names '{named}': {last['error']}")
                t.expect(decode.process.poll() is None, f"{name}: the decode node died:\n{decode.log()[-3000:]}")
            t.expect_equal(t.metric(prefill_url, "pdserve:kv_descriptor_refused_total"), float(len(forgeries)),
                           "pdserve:kv_descriptor_refused_total on the prefill node")
            t.expect("refused" in decode.log(), "the decode node logs the claims it refused")

        def check_decode_node_still_serves():
            t.expect_equal(t.http("GET", decode_url + "/health")[0], 200, "the decode node's /health")
            remote = completion(decode_url, prefill_url)
            t.expect_equal(remote, capture_work.local_text, "the text prefilled remotely against locally")
            t.expect(t.metric(prefill_url, "pdserve:kv_transfer_bytes_total") > 0,
                     "KV went from the prefill node to the decode node after the forgeries")

        failed += t.run_checks([
            ("forged descriptors are refused before any put, and counted", check_forgeries),
            ("the decode node stays up and takes KV from the same prefill node", check_decode_node_still_serves),
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
