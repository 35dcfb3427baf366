#!/usr/bin/python3
"""End to end: the per-request timeline (usage.pdserve_timeline) of a real decode node, with its
prompts prefilled by a real prefill node over UCX (the X-Pdserve-Prefill header and the cluster
token, as the proxy sends them) and prefilled locally (no header); completions and chat, streamed
and not. Checks what must hold whatever the machine's speed:
- spans nested and ordered: prefill.queue before its chunks, chunks before kv.transfer's end,
  kv.transfer's end before decode.kv_wait's end, which is before decode.steps; every span inside
  decode.request; the prefill node's spans inside prefill.request;
- prefill.chunk prompt_tokens add up to the prompt (fresh random prompts: nothing cached);
- KV bytes = blocks x the pool's block bytes (from the layout the prefill node prints);
- one tokens_ms entry per completion token, ttft = the first, tpot = (e2e - ttft) / (n - 1);
- ttft and e2e within what this client measured itself (the node's clock starts after the
  client sent the request and its tokens leave before the client reads them);
- the caller's traceparent's trace id; the SSE comment line with X-Pdserve-Timeline: 1;
- the nodes' histograms and byte counters agree with the timelines.
The prefill node's spans are aligned by the NTP-style estimate; on one host both use the same
monotonic clock, so the only error is the asymmetry of the two one-way delays, at most half the
round trip, which the timeline shows as prefill.request's start - prefill.remote's start.

Environment: PDSERVE_BUILD_DIR, PDSERVE_SOURCE_DIR.
"""
import http.server
import json
import math
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pd_e2e_test import BUILD, make_model, metric  # noqa: E402

TOKEN = "timeline-secret"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"
EPS = 0.01  # ms: rounding of the printed floats
ELEMENT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
rng = random.Random(11)


def start_node(command, log_path):
    """Starts a node on port 0; returns (process, its URL, its first stdout line)."""
    process = subprocess.Popen(command + ["--port", "0", "--threads", "1", "--kv-cache-memory-gib", "0.25",
                                          "--cluster-token", TOKEN, "--ucx-tls", "tcp"],
                               stdout=subprocess.PIPE, stderr=open(log_path, "w"), text=True)
    line = process.stdout.readline()
    match = re.search(r"on (http://[0-9.]+:[0-9]+)", line)
    if not match:
        process.kill()
        raise AssertionError(f"{command[0]} did not start: {line!r}; see {log_path}")
    return process, match.group(1), line


def block_bytes_from(line):
    """Bytes of one KV block (K and V, every layer) from '2 layers x 16 tokens x 8 kv heads x 128 float32'."""
    match = re.search(r"(\d+) layers x (\d+) tokens x (\d+) kv heads x (\d+) (\w+)", line)
    if not match:
        raise AssertionError(f"no KV layout in {line!r}")
    layers, block_size, heads, head_dim = (int(match.group(i)) for i in range(1, 5))
    return 2 * layers * block_size * heads * head_dim * ELEMENT_BYTES[match.group(5)], block_size, layers


def post(url, path, body, headers):
    """Sends a request; returns (status, parsed body or SSE lines, ms to the first data chunk with
    content, ms to the end), all measured here."""
    data = json.dumps(body).encode()
    request = urllib.request.Request(url + path, data=data, method="POST",
                                     headers=dict(headers, **{"Content-Type": "application/json"}))
    sent = time.monotonic()
    first_content_ms = None
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            if not body.get("stream"):
                payload = json.loads(response.read().decode())
                return response.status, payload, None, (time.monotonic() - sent) * 1000
            lines = []
            for raw in response:
                line = raw.decode().rstrip("\n")
                if not line:
                    continue
                if first_content_ms is None and line.startswith("data: {") and '"choices":[{' in line:
                    first_content_ms = (time.monotonic() - sent) * 1000
                lines.append(line)
            return response.status, lines, first_content_ms, (time.monotonic() - sent) * 1000
    except urllib.error.HTTPError as error:
        raise AssertionError(f"HTTP {error.code}: {error.read().decode()[:300]}")


def spans_of(timeline, name):
    return [s for s in timeline["spans"] if s["name"] == name]


def one(timeline, name):
    found = spans_of(timeline, name)
    if len(found) != 1:
        raise AssertionError(f"expected one {name} span, got {len(found)}: {timeline['spans']}")
    return found[0]


def expect(condition, message, timeline):
    if not condition:
        raise AssertionError(message + "\ntimeline: " + json.dumps(timeline, indent=1))


def check_common(t, what, completion_tokens, client_first_ms, client_end_ms, trace_id=None):
    expect(t["version"] == 1 and t["origin"] == "decode", f"{what}: version/origin", t)
    if trace_id:
        expect(t["trace_id"] == trace_id, f"{what}: trace id of the caller's traceparent", t)
    expect(re.fullmatch(r"[0-9a-f]{32}", t["trace_id"]) is not None, f"{what}: trace id format", t)
    tokens = t["tokens_ms"]
    expect(len(tokens) == completion_tokens == t["output_tokens"],
           f"{what}: {len(tokens)} token times for {completion_tokens} completion tokens", t)
    expect(all(a <= b for a, b in zip(tokens, tokens[1:])), f"{what}: token times in order", t)
    ttft, e2e = t["ttft_ms"], t["e2e_ms"]
    expect(abs(ttft - tokens[0]) <= EPS and e2e + EPS >= tokens[-1], f"{what}: ttft/e2e vs tokens", t)
    if completion_tokens >= 2:
        expect(abs(t["tpot_ms"] - (e2e - ttft) / (completion_tokens - 1)) <= EPS, f"{what}: tpot formula", t)
    else:
        expect(t["tpot_ms"] is None, f"{what}: no tpot for one token", t)
    # The node's t = 0 is after this client sent the request; its tokens leave before we read them.
    expect(0 < ttft and e2e <= client_end_ms, f"{what}: e2e {e2e:.2f} ms > client {client_end_ms:.2f} ms", t)
    if client_first_ms is not None:
        expect(ttft <= client_first_ms, f"{what}: ttft {ttft:.2f} ms > client's {client_first_ms:.2f} ms", t)
    expect(client_end_ms - e2e < 250, f"{what}: node e2e {e2e:.2f} ms far below the client's {client_end_ms:.2f}", t)
    expect(t["sync"]["head_sent_ms"] <= client_end_ms, f"{what}: head sent after the client's end", t)
    request = one(t, "decode.request")
    expect(request["start_ms"] == 0 and abs(request["end_ms"] - e2e) <= EPS, f"{what}: decode.request", t)
    for span in t["spans"]:
        expect(span["start_ms"] <= span["end_ms"] + EPS, f"{what}: {span['name']} ends before it starts", t)
        expect(span["args"]["index"] == 0, f"{what}: index", t)
    steps = spans_of(t, "decode.steps")
    if completion_tokens >= 2:
        expect(len(steps) == 1 and steps[0]["args"]["tokens"] == completion_tokens - 1
               and steps[0]["end_ms"] <= e2e + EPS, f"{what}: decode.steps", t)
    return steps[0] if steps else None


def check_chunks(t, what, chunks, prompt_tokens, node):
    expect(chunks, f"{what}: no prefill.chunk", t)
    expect(all(c["node"] == node for c in chunks), f"{what}: chunks on {node}", t)
    expect(sum(c["args"]["prompt_tokens"] for c in chunks) == prompt_tokens,
           f"{what}: chunk prompt tokens add up to {prompt_tokens}", t)
    expect(all(c["args"]["batch_tokens"] >= c["args"]["prompt_tokens"] for c in chunks), f"{what}: batch", t)
    expect(all(a["end_ms"] <= b["start_ms"] + EPS for a, b in zip(chunks, chunks[1:])), f"{what}: chunk order", t)
    queue = [s for s in spans_of(t, "prefill.queue") if s["node"] == node]
    expect(len(queue) == 1 and queue[0]["end_ms"] <= chunks[0]["start_ms"] + EPS,
           f"{what}: prefill.queue before its chunks", t)
    return queue[0]


def check_colocated(t, what, prompt_tokens, completion_tokens, decode_url):
    node = "decode " + decode_url
    steps = None
    if completion_tokens >= 2:
        steps = one(t, "decode.steps")
    chunks = spans_of(t, "prefill.chunk")
    check_chunks(t, what, chunks, prompt_tokens, node)
    expect(chunks[-1]["end_ms"] <= t["ttft_ms"] + EPS, f"{what}: the first token after the prompt", t)
    if steps:
        expect(chunks[-1]["end_ms"] <= steps["start_ms"] + EPS, f"{what}: decode steps after the prompt", t)
    expect(not spans_of(t, "prefill.remote") and "kv_transfer" not in t, f"{what}: nothing remote", t)


def check_disaggregated(t, what, prompt_tokens, completion_tokens, prefill_url, block_bytes, block_size):
    node = "prefill " + prefill_url
    remote = one(t, "prefill.remote")
    expect(remote["args"]["prefill_url"] == prefill_url, f"{what}: prefill_url", t)
    request = one(t, "prefill.request")
    # The alignment's worst error: half the round trip, as estimated.
    tolerance = request["start_ms"] - remote["start_ms"] + EPS
    expect(tolerance >= 0, f"{what}: the prefill node received the work before it was sent", t)
    on_prefill = [s for s in t["spans"] if s["node"] == node]
    expect({s["name"] for s in on_prefill} == {"prefill.request", "prefill.queue", "prefill.chunk", "kv.transfer"},
           f"{what}: prefill node spans", t)
    for span in on_prefill:
        expect(request["start_ms"] - EPS <= span["start_ms"] and span["end_ms"] <= request["end_ms"] + EPS,
               f"{what}: {span['name']} inside prefill.request", t)
    chunks = [s for s in spans_of(t, "prefill.chunk")]
    check_chunks(t, what, chunks, prompt_tokens, node)
    transfer = one(t, "kv.transfer")
    kv_wait = one(t, "decode.kv_wait")
    expect(chunks[-1]["end_ms"] <= transfer["end_ms"] + EPS, f"{what}: chunks before kv.transfer's end", t)
    expect(transfer["end_ms"] <= kv_wait["end_ms"] + tolerance,
           f"{what}: kv.transfer ends after decode.kv_wait (tolerance {tolerance:.3f} ms)", t)
    expect(abs(kv_wait["start_ms"] - remote["end_ms"]) <= EPS, f"{what}: kv_wait starts at the first token", t)
    expect(remote["end_ms"] <= t["ttft_ms"] + EPS, f"{what}: the first token leaves after it arrived", t)
    if completion_tokens >= 2:
        steps = one(t, "decode.steps")
        expect(kv_wait["end_ms"] <= steps["start_ms"] + EPS, f"{what}: decode.steps after the KV", t)
    kv = t["kv_transfer"]
    blocks = math.ceil(prompt_tokens / block_size)
    expect(kv["blocks"] == blocks and kv["bytes"] == blocks * block_bytes,
           f"{what}: {kv['bytes']} bytes for {kv['blocks']} blocks of {block_bytes} (expected {blocks})", t)
    args = transfer["args"]
    expect(args["bytes"] == kv["bytes"] and args["blocks"] == kv["blocks"] and args["layers"] == kv["layers"]
           and args["layers_overlapped"] == kv["layers_overlapped"], f"{what}: kv.transfer args", t)
    expect(abs(transfer["end_ms"] - transfer["start_ms"] - kv["ms"]) <= EPS, f"{what}: kv ms", t)
    if kv["layers_overlapped"] == 0:
        expect(kv["ms"] <= 0 or abs(kv["gb_per_s"] - kv["bytes"] / kv["ms"] / 1e6) <= 1e-6 * kv["gb_per_s"] + 1e-9,
               f"{what}: gb_per_s", t)
    else:
        expect(kv["gb_per_s"] is None and "gb_per_s" not in args, f"{what}: no bandwidth for an overlapped transfer", t)
    last_chunk_end = max(s["end_ms"] for s in t["spans"] if s["name"] == "prefill.chunk")
    expect(abs(kv["exposed_ms"] - max(0.0, transfer["end_ms"] - last_chunk_end)) <= EPS, f"{what}: exposed_ms", t)
    return kv["bytes"]


def timeline_of(payload, stream, include_usage):
    if not stream:
        return payload["usage"]["pdserve_timeline"], payload["usage"]["completion_tokens"]
    data = [json.loads(line[6:]) for line in payload if line.startswith("data: {")]
    if payload[-1] != "data: [DONE]":
        raise AssertionError(f"the stream did not end with [DONE]: {payload[-3:]}")
    comments = [line for line in payload if line.startswith(": pdserve_timeline ")]
    if include_usage:
        usage = data[-1]["usage"]
        if comments:
            raise AssertionError("a timeline comment beside the usage chunk")
        return usage["pdserve_timeline"], usage["completion_tokens"]
    if len(comments) != 1 or payload[-2] != comments[0]:
        raise AssertionError(f"expected one timeline comment just before [DONE]: {payload[-3:]}")
    timeline = json.loads(comments[0][len(": pdserve_timeline "):])
    return timeline, len(timeline["tokens_ms"])


class RefusingPrefillNode(http.server.BaseHTTPRequestHandler):
    """A prefill node that records the headers of the work it gets and refuses it (503), so
    that the decode node moves on to the next prefill node."""
    seen = []

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        RefusingPrefillNode.seen.append(dict(self.headers))
        body = b'{"error": {"message": "busy", "type": "server_error", "code": 503}}'
        self.send_response(503)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def check_traceparent_and_failover(decode_url, prefill_url):
    """The work reaches the first prefill node with a child traceparent of the caller's trace;
    refused there, it goes to the next one, which the timeline names."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), RefusingPrefillNode)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    refusing_url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        headers = {"X-Pdserve-Prefill": f"{refusing_url},{prefill_url}", "Authorization": "Bearer " + TOKEN,
                   "traceparent": TRACEPARENT, "X-Pdserve-Timeline": "1"}
        body = {"prompt": [rng.randrange(1000, 100000) for _ in range(40)], "max_tokens": 3, "temperature": 0,
                "ignore_eos": True}
        _, payload, _, _ = post(decode_url, "/v1/completions", body, headers)
    finally:
        server.shutdown()
    if len(RefusingPrefillNode.seen) != 1:
        raise AssertionError(f"the refusing prefill node got {len(RefusingPrefillNode.seen)} requests")
    sent = {k.lower(): v for k, v in RefusingPrefillNode.seen[0].items()}.get("traceparent", "")
    match = re.fullmatch(r"00-([0-9a-f]{32})-([0-9a-f]{16})-01", sent)
    if not match or match.group(1) != TRACE_ID or match.group(2) in ("0" * 16, TRACEPARENT.split("-")[2]):
        raise AssertionError(f"the prefill work's traceparent {sent!r} is not a child of {TRACEPARENT}")
    timeline = payload["usage"]["pdserve_timeline"]
    if one(timeline, "prefill.remote")["args"]["prefill_url"] != prefill_url:
        raise AssertionError(f"the timeline does not name the prefill node that answered: {timeline['spans']}")
    print(f"ok: prefill work carried traceparent {sent}; refused, it went to {prefill_url}", flush=True)
    return timeline["kv_transfer"]["bytes"]


def run(decode_url, prefill_url, block_bytes, block_size):
    remote_headers = {"X-Pdserve-Prefill": prefill_url, "Authorization": "Bearer " + TOKEN}
    transferred = 0
    remote_requests = 0
    cases = []
    for remote in (True, False):
        for stream, include_usage in ((False, False), (True, True), (True, False)):
            cases.append(("completion", remote, stream, include_usage))
    cases.append(("chat", True, True, True))
    cases.append(("chat", False, False, False))
    for kind, remote, stream, include_usage in cases:
        what = (f"{kind} {'disaggregated' if remote else 'colocated'} "
                f"{'stream' + (' +usage' if include_usage else ' comment') if stream else 'whole'}")
        # Remote requests of one token end before their KV lands (no transfer to check); the
        # fresh-trace request below has one token, prefilled here.
        max_tokens = rng.choice([2, 6, 12] if remote else [1, 6, 12]) if kind == "completion" else 5
        body = {"max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": stream}
        if include_usage:
            body["stream_options"] = {"include_usage": True}
        headers = {"traceparent": TRACEPARENT, "X-Pdserve-Timeline": "1"}
        if remote:
            headers.update(remote_headers)
        if kind == "completion":
            prompt = [rng.randrange(1000, 100000) for _ in range(rng.choice([20, 33, 70]))]
            body["prompt"] = prompt
            path = "/v1/completions"
        else:
            body["messages"] = [{"role": "user", "content": " ".join(
                f"word{rng.randrange(10**6)}" for _ in range(12))}]
            path = "/v1/chat/completions"
        status, payload, first_ms, end_ms = post(decode_url, path, body, headers)
        timeline, completion_tokens = timeline_of(payload, stream, include_usage)
        prompt_tokens = (len(body["prompt"]) if kind == "completion"
                         else (payload["usage"] if not stream else
                               [json.loads(l[6:]) for l in payload if l.startswith("data: {")][-1]["usage"]
                               )["prompt_tokens"])
        check_common(timeline, what, completion_tokens, first_ms, end_ms, TRACE_ID)
        if remote:
            transferred += check_disaggregated(timeline, what, prompt_tokens, completion_tokens, prefill_url,
                                               block_bytes, block_size)
            remote_requests += 1
        else:
            check_colocated(timeline, what, prompt_tokens, completion_tokens, decode_url)
        print(f"ok: {what}: {prompt_tokens} prompt + {completion_tokens} tokens, ttft {timeline['ttft_ms']:.1f} "
              f"ms, e2e {timeline['e2e_ms']:.1f} ms (client {end_ms:.1f} ms)"
              + (f", KV {timeline['kv_transfer']['bytes']} B in {timeline['kv_transfer']['ms']:.2f} ms"
                 if remote else ""), flush=True)

    transferred += check_traceparent_and_failover(decode_url, prefill_url)
    remote_requests += 1

    # A request without a traceparent gets a fresh trace.
    _, payload, _, _ = post(decode_url, "/v1/completions", {"prompt": [5, 6, 7], "max_tokens": 1},
                            {"X-Pdserve-Timeline": "1"})
    fresh = payload["usage"]["pdserve_timeline"]["trace_id"]
    # The timeline is opt-in.
    _, payload, _, _ = post(decode_url, "/v1/completions", {"prompt": [5, 6, 7], "max_tokens": 1}, {})
    if "pdserve_timeline" in payload["usage"]:
        raise AssertionError("a timeline nobody asked for")
    if fresh == TRACE_ID or not re.fullmatch(r"[0-9a-f]{32}", fresh):
        raise AssertionError(f"no fresh trace id without traceparent: {fresh}")

    checks = [(metric(decode_url, "pdserve:kv_transfer_bytes_total"), transferred, "decode bytes"),
              (metric(prefill_url, "pdserve:kv_transfer_bytes_total"), transferred, "prefill bytes"),
              (metric(decode_url, "pdserve:remote_prefill_time_seconds_count"), remote_requests, "remote prefills"),
              (metric(decode_url, "pdserve:kv_wait_time_seconds_count"), remote_requests, "kv waits"),
              (metric(prefill_url, "pdserve:kv_transfer_time_seconds_count"), remote_requests, "prefill transfers"),
              (metric(decode_url, "vllm:request_prefill_time_seconds_count"),
               sum(1 for case in cases if not case[1]) + 2, "local prefills")]
    for got, expected, what in checks:
        if got != expected:
            raise AssertionError(f"/metrics {what}: {got}, expected {expected}")
    print(f"ok: node metrics agree with the timelines ({transferred} KV bytes, {remote_requests} remote prefills)",
          flush=True)


def check_proxy_timeline(t, what, client_first_ms, client_end_ms):
    """A timeline as pdserve-proxy gives it: on the proxy's clock, its spans added, sync dropped."""
    expect(t["origin"] == "proxy" and "sync" not in t and t["trace_id"] == TRACE_ID, f"{what}: origin/sync/trace", t)
    request, route, decode = one(t, "proxy.request"), one(t, "proxy.route"), one(t, "decode.request")
    expect(request["start_ms"] == 0 and abs(request["end_ms"] - t["e2e_ms"]) <= EPS, f"{what}: proxy.request", t)
    expect(t["e2e_ms"] <= client_end_ms, f"{what}: e2e above the client's {client_end_ms:.2f} ms", t)
    # The one-way delay estimate: the node's arrival sits between the request sent and the head back.
    one_way = decode["start_ms"] - route["end_ms"]
    expect(one_way >= -EPS, f"{what}: the decode node received the request before it was sent", t)
    for span in t["spans"]:
        expect(span["start_ms"] <= span["end_ms"] + EPS, f"{what}: {span['name']} ends before it starts", t)
        if span["node"] != "proxy":
            expect(route["end_ms"] - EPS <= span["start_ms"] and span["end_ms"] <= request["end_ms"] + EPS,
                   f"{what}: {span['name']} outside the proxy's exchange", t)
    expect(t["ttft_ms"] <= t["e2e_ms"] + EPS, f"{what}: ttft after e2e", t)
    if client_first_ms is not None:
        expect(t["ttft_ms"] <= client_first_ms + one_way + EPS,
               f"{what}: ttft {t['ttft_ms']:.2f} ms > client's {client_first_ms:.2f} ms", t)
    if t["output_tokens"] >= 2:
        expect(abs(t["tpot_ms"] - (t["e2e_ms"] - t["ttft_ms"]) / (t["output_tokens"] - 1)) <= EPS, f"{what}: tpot", t)


def check_trace_events(events, what):
    """Chrome trace events: named processes and threads, X events with ts/dur, TTFT inside E2E."""
    processes = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    threads = {(e["pid"], e["tid"]) for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    names = set(processes.values())
    if not {"requests", "proxy"} <= names or not any(n.startswith("decode http://") for n in names):
        raise AssertionError(f"{what}: trace processes {sorted(names)}")
    slices = [e for e in events if e["ph"] == "X"]
    for e in slices:
        if e["pid"] not in processes or (e["pid"], e["tid"]) not in threads or e["dur"] < 0:
            raise AssertionError(f"{what}: trace event without names or with a negative duration: {e}")
        if e["args"]["trace_id"] != TRACE_ID:
            raise AssertionError(f"{what}: trace event of another trace: {e}")
    e2e = [e for e in slices if e["name"] == "E2E"]
    ttft = [e for e in slices if e["name"] == "TTFT"]
    for total in e2e:
        inner = [e for e in ttft if (e["pid"], e["tid"]) == (total["pid"], total["tid"])]
        if len(inner) != 1 or inner[0]["ts"] < total["ts"] or inner[0]["ts"] + inner[0]["dur"] > total["ts"] + total["dur"]:
            raise AssertionError(f"{what}: TTFT not nested in E2E: {total} {inner}")
    return len(e2e)


def check_proxy(decode_url, prefill_url, directory):
    """Through pdserve-proxy: a client gets a timeline only when it asks (X-Pdserve-Timeline: 1),
    without node addresses unless it holds the cluster token; the timeline (in usage or the
    comment) is on the proxy's clock; GET /trace and --trace-file hold every request, the proxy's
    histograms count them."""
    trace_file = os.path.join(directory, "trace.json")
    log = os.path.join(directory, "proxy.log")
    proxy = subprocess.Popen([os.path.join(BUILD, "proxy/pdserve-proxy"), "--port", "0", "--cluster-token", TOKEN,
                              "--decode", decode_url, "--prefill", prefill_url, "--trace-file", trace_file],
                             stdout=subprocess.PIPE, stderr=open(log, "w"), text=True)
    try:
        match = re.search(r"on (http://[0-9.]+:[0-9]+)", proxy.stdout.readline())
        if not match:
            raise AssertionError(f"pdserve-proxy did not start; see {log}")
        proxy_url = match.group(1)
        ids = []
        for stream, include_usage in ((False, False), (True, True), (True, False)):
            what = f"proxy {'stream' + (' +usage' if include_usage else ' comment') if stream else 'whole'}"
            body = {"prompt": [rng.randrange(1000, 100000) for _ in range(70)], "max_tokens": 6, "temperature": 0,
                    "ignore_eos": True, "stream": stream}
            if include_usage:
                body["stream_options"] = {"include_usage": True}
            # Not asked: no timeline at all, neither in usage nor as a comment.
            _, quiet, _, _ = post(proxy_url, "/v1/completions", body, {"traceparent": TRACEPARENT})
            if "pdserve_timeline" in json.dumps(quiet) or (stream and quiet[-1] != "data: [DONE]"):
                raise AssertionError(f"{what}: a timeline nobody asked for, or no [DONE]: {quiet[-3:]}")
            ids.append(json.loads(next(line for line in quiet if line.startswith("data: {"))[6:])["id"]
                       if stream else quiet["id"])
            # Asked without the cluster token: no node address.
            _, redacted, _, _ = post(proxy_url, "/v1/completions", body,
                                     {"traceparent": TRACEPARENT, "X-Pdserve-Timeline": "1"})
            timeline, _ = timeline_of(redacted, stream, include_usage)
            if "127.0.0.1" in json.dumps(redacted) or one(timeline, "decode.request")["node"] != "decode":
                raise AssertionError(f"{what}: node addresses reached a client without the token: {timeline}")
            ids.append(timeline["request_id"])
            # Asked by a cluster token holder: the whole timeline.
            _, payload, first_ms, end_ms = post(proxy_url, "/v1/completions", body,
                                                {"traceparent": TRACEPARENT, "X-Pdserve-Timeline": "1",
                                                 "Authorization": "Bearer " + TOKEN})
            if stream and payload[-1] != "data: [DONE]":
                raise AssertionError(f"{what}: no [DONE]: {payload[-3:]}")
            timeline, _ = timeline_of(payload, stream, include_usage)
            check_proxy_timeline(timeline, what, first_ms, end_ms)
            ids.append(timeline["request_id"])
            print(f"ok: {what}: ttft {timeline['ttft_ms']:.1f} ms, e2e {timeline['e2e_ms']:.1f} ms "
                  f"(client {end_ms:.1f} ms)", flush=True)
        for request_id in ids:
            trace_request = urllib.request.Request(f"{proxy_url}/trace?request_id={request_id}",
                                                   headers={"Authorization": "Bearer " + TOKEN})
            with urllib.request.urlopen(trace_request, timeout=30) as response:
                if check_trace_events(json.loads(response.read().decode())["traceEvents"], request_id) != 1:
                    raise AssertionError(f"/trace?request_id={request_id}: not one request")
        with open(trace_file) as handle:
            text = handle.read()
        # JSON Array Format without the closing bracket: every line but the first is one event and a comma.
        if check_trace_events(json.loads(text.rstrip().rstrip(",") + "]"), "--trace-file") != len(ids):
            raise AssertionError(f"--trace-file does not hold {len(ids)} requests")
        counted = metric(proxy_url, "pdserve:proxy_time_to_first_token_seconds_count")
        if counted != len(ids):
            raise AssertionError(f"proxy TTFT histogram counted {counted} of {len(ids)} requests")
        print(f"ok: proxy /trace, --trace-file and histograms hold the {len(ids)} requests", flush=True)
        # One log line per finished request, naming its nodes.
        with open(log, encoding="utf-8") as handle:
            logged = re.findall(r"request (\S+) finished on decode-\d+ \(prefill prefill-\d+\): HTTP 200, "
                                r"prefilled \d+ tokens \(the rest cached\), output 6 tokens, TTFT \d+ ms, TPOT \d+ ms, e2e \d+ ms",
                                handle.read())
        if sorted(logged) != sorted(ids):
            raise AssertionError(f"the proxy's request log lines name {sorted(logged)}, not {sorted(ids)}:\n"
                                 + "\n".join(line for line in open(log, encoding="utf-8") if "finished on" in line))
        print(f"ok: the proxy logged one line per request", flush=True)
    finally:
        proxy.send_signal(signal.SIGTERM)
        try:
            proxy.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proxy.kill()


def main():
    with tempfile.TemporaryDirectory(prefix="pdserve-timeline-") as directory:
        model = make_model(directory)
        nodes = []
        try:
            prefill, prefill_url, line = start_node(
                # No proxy to learn the decode node from: any KV peer, on purpose.
                [os.path.join(BUILD, "prefill_node/pdserve-prefill"), "--model", model,
                 "--insecure-unregistered-kv-peers"],
                os.path.join(directory, "prefill.log"))
            nodes.append(prefill)
            block_bytes, block_size, _ = block_bytes_from(line)
            decode, decode_url, _ = start_node(
                [os.path.join(BUILD, "decode_node/pdserve-decode"), "--model", model, "--kv-transfer"],
                os.path.join(directory, "decode.log"))
            nodes.append(decode)
            run(decode_url, prefill_url, block_bytes, block_size)
            check_proxy(decode_url, prefill_url, directory)
        except Exception:
            for name in ("prefill.log", "decode.log", "proxy.log"):
                path = os.path.join(directory, name)
                if os.path.exists(path):
                    with open(path, errors="replace") as handle:
                        print(f"---- {name}\n{handle.read()[-3000:]}", file=sys.stderr)
            raise
        finally:
            for process in nodes:
                process.send_signal(signal.SIGTERM)
            for process in nodes:
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    process.kill()


if __name__ == "__main__":
    main()
