"""OpenTelemetry traces from pdserve-proxy (issue #19 item 3) against a real OTLP/HTTP receiver.

The receiver parses every POST /v1/traces body with opentelemetry-proto's json_format into an
ExportTraceServiceRequest (the protobuf definitions are the oracle for the JSON's shape), after
the one deviation the OTLP specification ("JSON Protobuf Encoding") makes from the protobuf JSON
mapping: trace and span ids are hex strings, not base64. A 1P1D
cluster exports to it; for each request the checks are: the span names, a tree whose every
parent exists, the root's parent is the client's traceparent span (when it sent one) and its
trace id the client's, children within their parent's time range, and the root's token counts
equal to the response's usage. Then the receiver answers slowly, then not at all: requests must
still succeed as fast as before and pdserve:otlp_spans_dropped_total must count the lost spans.
"""
import base64
import json
import os
import re
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
import pdserve_testing as t  # noqa: E402

t.set_deadline(200)
ALIGNMENT_TOLERANCE_NS = 10_000_000  # 10 ms: the one-way delays on a loaded test machine
CLIENT_TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN_ID = "b7ad6b7169203331"
SLOW_SECONDS = 6.0
POST_TIMEOUT_MS = 1000
ENGINE_SPANS = {"proxy.request", "proxy.route", "decode.request", "prefill.remote", "prefill.request",
                "prefill.queue", "prefill.chunk", "kv.transfer", "decode.kv_wait", "decode.queue",
                "decode.steps"}
# Every disaggregated request has these (decode.kv_wait only when the decode node waited).
REQUIRED_SPANS = ENGINE_SPANS - {"decode.kv_wait"}


ID_DIGITS = {"traceId": 32, "spanId": 16, "parentSpanId": 16}


def otlp_json_to_proto(body):
    """The ExportTraceServiceRequest of an OTLP/HTTP JSON body; ValueError for a malformed id."""
    def hex_ids_to_base64(node):
        if isinstance(node, list):
            for item in node:
                hex_ids_to_base64(item)
        elif isinstance(node, dict):
            for key, value in node.items():
                if key in ID_DIGITS:
                    if not re.fullmatch(f"[0-9a-f]{{{ID_DIGITS[key]}}}", value):
                        raise ValueError(f"{key} {value!r} is not {ID_DIGITS[key]} lowercase hex digits")
                    node[key] = base64.b64encode(bytes.fromhex(value)).decode()
                else:
                    hex_ids_to_base64(value)
    document = json.loads(body)
    hex_ids_to_base64(document)
    return json_format.Parse(json.dumps(document), ExportTraceServiceRequest())


class Receiver:
    """An OTLP/HTTP traces endpoint on a free port: keeps every span it parsed."""

    def __init__(self):
        self.spans = []  # (service.name, Span)
        self.errors = []
        self.slow = False
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if receiver.slow:
                    time.sleep(SLOW_SECONDS)
                try:
                    if self.path != "/v1/traces":
                        raise ValueError(f"POST to {self.path}")
                    if self.headers.get("Content-Type") != "application/json":
                        raise ValueError(f"Content-Type {self.headers.get('Content-Type')}")
                    request = otlp_json_to_proto(body)
                except Exception as error:  # noqa: BLE001 - reported by the checks
                    with receiver.lock:
                        receiver.errors.append(f"{type(error).__name__}: {error}")
                    self.send_response(400)
                    self.end_headers()
                    return
                with receiver.lock:
                    for resource_spans in request.resource_spans:
                        service = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
                        for scope_spans in resource_spans.scope_spans:
                            receiver.spans.extend((service.get("service.name"), s) for s in scope_spans.spans)
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *_args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()

    def trace(self, request_id):
        """The spans of the trace whose root has gen_ai.request.id = request_id."""
        with self.lock:
            spans = [s for _, s in self.spans]
        roots = [s for s in spans if s.name == "proxy.request" and attributes(s).get("gen_ai.request.id") == request_id]
        if not roots:
            return None
        return roots[0], [s for s in spans if s.trace_id == roots[0].trace_id]


def attributes(span):
    out = {}
    for attribute in span.attributes:
        value = attribute.value
        out[attribute.key] = getattr(value, value.WhichOneof("value"))
    return out


receiver = Receiver()
model_dir = t.make_model()
target = t.start_1p1d(model_dir, proxy_extra=[
    "--otlp-traces-endpoint", f"http://127.0.0.1:{receiver.port}", "--otlp-batch-delay-ms", "100",
    "--otlp-timeout-ms", str(POST_TIMEOUT_MS)])
t.add_cleanup(receiver.stop)
PROMPT = "The quick brown fox jumps over the lazy dog and keeps running far away"


def complete(stream=False, traceparent=None):
    """(response id, usage, seconds) of one completion through the proxy."""
    body = {"model": target.name, "prompt": PROMPT, "max_tokens": 6, "temperature": 0}
    if stream:
        body.update(stream=True, stream_options={"include_usage": True})
    request = urllib.request.Request(target.url + "/v1/completions", data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    if traceparent:
        request.add_header("traceparent", traceparent)
    start = time.monotonic()
    with urllib.request.urlopen(request, timeout=60) as response:
        text = response.read().decode()
    seconds = time.monotonic() - start
    if not stream:
        answer = json.loads(text)
        return answer["id"], answer["usage"], seconds
    events = [json.loads(line[6:]) for line in text.split("\n") if line.startswith("data: {")]
    return events[0]["id"], events[-1]["usage"], seconds


def check_trace(request_id, usage, client_span_id=None, client_trace_id=None):
    # Each process (proxy, decode, prefill) exports its spans in batches of its own: the trace is
    # checked once every span it must have has landed, not after a fixed pause.
    def complete_trace():
        found = receiver.trace(request_id)
        return found is not None and REQUIRED_SPANS <= {s.name for s in found[1]}

    t.wait_until(complete_trace, 20, f"the spans {sorted(REQUIRED_SPANS)} of {request_id} at the receiver")
    root, spans = receiver.trace(request_id)
    names = {s.name for s in spans}
    t.expect(names <= ENGINE_SPANS, f"unknown span names {names - ENGINE_SPANS}")
    t.expect_equal(len({s.span_id for s in spans}), len(spans), "distinct span ids")
    if client_trace_id:
        t.expect_equal(root.trace_id.hex(), client_trace_id, "trace id")
    t.expect_equal(root.parent_span_id.hex(), client_span_id or "", "the root's parent")
    by_id = {s.span_id: s for s in spans}
    for span in spans:
        t.expect(span.start_time_unix_nano <= span.end_time_unix_nano, f"{span.name} ends before it starts")
        if span is root:
            continue
        parent = by_id.get(span.parent_span_id)
        t.expect(parent is not None, f"{span.name}: parent {span.parent_span_id.hex()} is not in the trace")
        t.expect(parent.start_time_unix_nano - ALIGNMENT_TOLERANCE_NS <= span.start_time_unix_nano
                 and span.end_time_unix_nano <= parent.end_time_unix_nano + ALIGNMENT_TOLERANCE_NS,
                 f"{span.name} [{span.start_time_unix_nano}, {span.end_time_unix_nano}] is not within "
                 f"{parent.name} [{parent.start_time_unix_nano}, {parent.end_time_unix_nano}]")
    now_ns = time.time_ns()
    t.expect(now_ns - 120e9 < root.start_time_unix_nano < now_ns, "the root starts at the request's wall-clock time")
    root_attributes = attributes(root)
    t.expect_equal(root_attributes.get("gen_ai.usage.prompt_tokens"), usage["prompt_tokens"], "prompt tokens")
    t.expect_equal(root_attributes.get("gen_ai.usage.completion_tokens"), usage["completion_tokens"],
                   "completion tokens")
    t.expect(0 < root_attributes["gen_ai.latency.time_to_first_token"] <= root_attributes["gen_ai.latency.e2e"],
             "0 < TTFT <= E2E")


baseline_seconds = []


def test_traces():
    traceparent = f"00-{CLIENT_TRACE_ID}-{CLIENT_SPAN_ID}-01"
    request_id, usage, seconds = complete(traceparent=traceparent)
    baseline_seconds.append(seconds)
    check_trace(request_id, usage, CLIENT_SPAN_ID, CLIENT_TRACE_ID)
    request_id, usage, seconds = complete(stream=True)
    baseline_seconds.append(seconds)
    check_trace(request_id, usage)
    request_id, usage, seconds = complete()
    baseline_seconds.append(seconds)
    check_trace(request_id, usage)
    with receiver.lock:
        t.expect_equal(receiver.errors, [], "bodies the receiver could not parse")
        t.expect_equal({service for service, _ in receiver.spans}, {"pdserve-proxy"}, "service.name")
    t.expect_equal(t.metric(target.url, "pdserve:otlp_spans_dropped_total"), 0.0, "spans dropped")


def check_requests_unaffected(what):
    dropped_before = t.metric(target.url, "pdserve:otlp_spans_dropped_total")
    # A request that waited on the exporter would take at least one POST deadline longer.
    allowed = 2 * max(baseline_seconds) + POST_TIMEOUT_MS / 1000
    for _ in range(4):
        _, _, seconds = complete()
        t.expect(seconds < allowed, f"a request took {seconds:.2f} s with the receiver {what} "
                 f"(at most {allowed:.2f} s: the requests before took {baseline_seconds})")
    t.wait_until(lambda: t.metric(target.url, "pdserve:otlp_spans_dropped_total") > dropped_before,
                 SLOW_SECONDS + 10, f"spans dropped with the receiver {what}")


def test_slow_receiver():
    receiver.slow = True
    check_requests_unaffected("answering after the POST deadline")


def test_receiver_down():
    receiver.stop()
    check_requests_unaffected("down")


def test_stops_promptly():
    start = time.monotonic()
    code = target.stop()
    t.expect_equal(code, 0, "the cluster's exit code")
    t.expect(time.monotonic() - start < 10, "the proxy stopped within its flush deadline")


failed = t.run_checks([("spans of three requests", test_traces), ("a slow receiver", test_slow_receiver),
                       ("a receiver that is down", test_receiver_down), ("the proxy stops", test_stops_promptly)])
t.finish(failed, target)
