#!/usr/bin/python3
"""GET /metrics of a real 1P1D cluster (pdserve-proxy, pdserve-prefill, pdserve-decode on the tiny
model), read with an independent parser of the Prometheus text format (prometheus_client's):

1. Before any request, every node exports vLLM's series (names, types, the model_name and engine
   labels, vLLM's bucket boundaries) where it has the quantity, and pdserve's own; every series
   is there at zero. The proxy exports no vllm: series (docs/METRICS.md: a dashboard's sum over
   all targets would count each request twice) and its own pdserve:proxy_* series at zero.
2. After streamed requests of known prompt and output lengths: the request and token counts
   are exact, and a sum over all nodes counts each request's prefill once.

Environment: PDSERVE_BUILD_DIR, PDSERVE_SOURCE_DIR (set by CTest); the project's venv.
"""
import concurrent.futures
import json
import os
import sys

from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, os.path.join(os.environ.get("PDSERVE_SOURCE_DIR", "."), "tests/python"))
import pdserve_testing as t  # noqa: E402

# vLLM v1's buckets (vllm/v1/metrics/loggers.py).
TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
TOKEN_LATENCY_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
                         5.0, 7.5, 10.0, 20.0, 40.0, 80.0]
REQUEST_LATENCY_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                           50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]

NUM_REQUESTS = 6
PROMPT_LEN = 12
OUTPUT_LEN = 5


def buckets_1_2_5(max_value):
    out, scale = [], 1
    while True:
        for mantissa in (1, 2, 5):
            if mantissa * scale > max_value:
                return out
            out.append(float(mantissa * scale))
        scale *= 10


def scrape(url):
    """{family name: Metric} of GET url/metrics, parsed by prometheus_client (counters lose _total)."""
    status, text = t.http("GET", url + "/metrics", timeout=10)
    t.expect_equal(status, 200, f"GET {url}/metrics")
    return {family.name: family for family in text_string_to_metric_families(text)}


def vllm_families(max_model_len):
    """name -> (type, buckets or None): vLLM's series a decode node exports."""
    token_counts = buckets_1_2_5(max_model_len)
    return {
        "vllm:num_requests_running": ("gauge", None),
        "vllm:num_requests_waiting": ("gauge", None),
        "vllm:kv_cache_usage_perc": ("gauge", None),
        "vllm:prefix_cache_queries": ("counter", None),
        "vllm:prefix_cache_hits": ("counter", None),
        "vllm:num_preemptions": ("counter", None),
        "vllm:prompt_tokens": ("counter", None),
        "vllm:generation_tokens": ("counter", None),
        "vllm:request_success": ("counter", None),
        "vllm:time_to_first_token_seconds": ("histogram", TTFT_BUCKETS),
        "vllm:inter_token_latency_seconds": ("histogram", TOKEN_LATENCY_BUCKETS),
        "vllm:time_per_output_token_seconds": ("histogram", TOKEN_LATENCY_BUCKETS),
        "vllm:request_time_per_output_token_seconds": ("histogram", TOKEN_LATENCY_BUCKETS),
        "vllm:e2e_request_latency_seconds": ("histogram", REQUEST_LATENCY_BUCKETS),
        "vllm:request_queue_time_seconds": ("histogram", REQUEST_LATENCY_BUCKETS),
        "vllm:request_prefill_time_seconds": ("histogram", REQUEST_LATENCY_BUCKETS),
        "vllm:request_decode_time_seconds": ("histogram", REQUEST_LATENCY_BUCKETS),
        "vllm:request_inference_time_seconds": ("histogram", REQUEST_LATENCY_BUCKETS),
        "vllm:request_prompt_tokens": ("histogram", token_counts),
        "vllm:request_generation_tokens": ("histogram", token_counts),
    }


PREFILL_VLLM = ["vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                "vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:num_preemptions",
                "vllm:request_prefill_time_seconds"]

DECODE_PDSERVE = {
    "pdserve:kv_cache_blocks_total": "gauge", "pdserve:kv_cache_blocks_used": "gauge",
    "pdserve:kv_cache_blocks_cached": "gauge", "pdserve:node_info": "gauge", "pdserve:node_state": "gauge",
    "pdserve:remote_prefill_time_seconds": "histogram", "pdserve:kv_wait_time_seconds": "histogram",
    "pdserve:kv_transfer_time_seconds": "histogram", "pdserve:kv_transfer_bytes": "counter",
    "pdserve:kv_checksum_mismatches": "counter", "pdserve:kv_refetches": "counter",
    "pdserve:remote_prefill_fallbacks": "counter", "pdserve:remote_prefills_served_from_cache": "counter",
    "pdserve:http_requests": "counter", "pdserve:kv_import_hold_expired": "counter",
}
PREFILL_PDSERVE = {
    "pdserve:kv_cache_blocks_total": "gauge", "pdserve:kv_cache_blocks_used": "gauge",
    "pdserve:kv_cache_blocks_cached": "gauge", "pdserve:node_info": "gauge", "pdserve:node_state": "gauge",
    "pdserve:prefill_requests": "counter", "pdserve:prefill_cancels": "counter",
    "pdserve:prefill_prompt_tokens": "counter", "pdserve:prefill_queue_time_seconds": "histogram",
    "pdserve:kv_transfer_time_seconds": "histogram", "pdserve:kv_transfer_bytes": "counter",
    "pdserve:kv_descriptor_refused": "counter",
}
PROXY_PDSERVE = {
    "pdserve:proxy_retries": "counter", "pdserve:proxy_upstream_failures": "counter",
    "pdserve:proxy_stream_resumes": "counter", "pdserve:proxy_prefill_placements": "counter",
    "pdserve:proxy_prefix_query_blocks": "counter", "pdserve:proxy_prefix_hit_blocks": "counter",
    "pdserve:proxy_prefix_tier_hit_blocks": "counter", "pdserve:proxy_tiered_index_keys": "gauge",
    "pdserve:proxy_routing_seconds": "histogram", "pdserve:proxy_time_to_first_byte_seconds": "histogram",
    "pdserve:proxy_e2e_request_latency_seconds": "histogram",
    "pdserve:proxy_prompt_tokenize_seconds": "histogram",
    "pdserve:proxy_time_to_first_token_seconds": "histogram",
    "pdserve:proxy_time_per_output_token_seconds": "histogram",
    "pdserve:proxy_inter_token_latency_seconds": "histogram",
    "pdserve:proxy_prefill_queue_time_seconds": "histogram", "pdserve:proxy_prefill_time_seconds": "histogram",
    "pdserve:proxy_kv_transfer_time_seconds": "histogram", "pdserve:proxy_decode_queue_time_seconds": "histogram",
    "pdserve:proxy_prefix_index_keys": "gauge", "pdserve:cluster_advice_nodes": "gauge",
    "pdserve:proxy_tokenizer_fetch_failures": "counter", "pdserve:proxy_tokenizer_mismatch": "counter",
    "pdserve:cluster_pool_nodes": "gauge",
}


def check_family(families, name, typ, buckets, labels):
    """The family exists with this type; each of its series carries `labels` (when given) and, for a
    histogram, exactly `buckets` (when given) then +Inf."""
    t.expect(name in families, f"{name} is not exported")
    family = families[name]
    t.expect_equal(family.type, typ, f"type of {name}")
    t.expect(family.samples, f"{name} has no series")
    for sample in family.samples:
        if labels is not None:
            own = {k: v for k, v in sample.labels.items() if k not in ("le", "finished_reason")}
            t.expect_equal(own, labels, f"labels of {sample.name}")
    if typ == "histogram" and buckets is not None:
        bounds = [s.labels["le"] for s in family.samples if s.name == name + "_bucket"]
        t.expect_equal([float(b) for b in bounds], [*buckets, float("inf")], f"buckets of {name}")


def expect_all_zero(families, names, where):
    for name in names:
        for sample in families[name].samples:
            t.expect_equal(sample.value, 0.0, f"{where}: {sample.name}{sample.labels} at start")


def value(families, name, suffix="", **labels):
    """The sum of the family's samples named name+suffix whose labels include `labels`."""
    return sum(s.value for s in families[name].samples
               if s.name == name + suffix and all(s.labels.get(k) == v for k, v in labels.items()))


def expect_up(families, where):
    states = {s.labels["state"]: s.value for s in families["pdserve:node_state"].samples}
    t.expect_equal(states, {"up": 1.0, "draining": 0.0}, f"{where}: pdserve:node_state")


def main():
    t.set_deadline(150)
    model = t.make_model()
    target = t.start_1p1d(model)
    proxy_url = target.url
    decode_url = target.decode.match.group(2)
    prefill_url = target.processes[2].match.group(2)
    served = target.name
    max_model_len = t.get_json(proxy_url + "/v1/models")["data"][0]["max_model_len"]
    labels = {"model_name": served, "engine": "0"}
    expected_vllm = vllm_families(max_model_len)

    def decode_at_start():
        families = scrape(decode_url)
        for name, (typ, buckets) in expected_vllm.items():
            check_family(families, name, typ, buckets, labels)
        for name, typ in DECODE_PDSERVE.items():
            check_family(families, name, typ, None, None)
        reasons = sorted(s.labels["finished_reason"] for s in families["vllm:request_success"].samples)
        t.expect_equal(reasons, ["length", "stop"], "vllm:request_success_total finished_reason values")
        t.expect_equal([s.labels for s in families["pdserve:node_info"].samples],
                       [{"role": "decode", "model_name": served}], "pdserve:node_info")
        zero = [n for n in expected_vllm] + [n for n in DECODE_PDSERVE
                                             if not n.startswith("pdserve:kv_cache_blocks")
                                             and n not in ("pdserve:node_info", "pdserve:node_state",
                                                           "pdserve:http_requests")]
        expect_all_zero(families, zero, "decode")
        expect_up(families, "decode")
        t.expect(value(families, "pdserve:kv_cache_blocks_total") > 0, "the decode node's KV pool size")

    def prefill_at_start():
        families = scrape(prefill_url)
        for name in PREFILL_VLLM:
            typ, buckets = expected_vllm[name]
            check_family(families, name, typ, buckets, labels)
        for name, typ in PREFILL_PDSERVE.items():
            check_family(families, name, typ, None, None)
        # Counted once per request, by its decode node.
        for name in set(expected_vllm) - set(PREFILL_VLLM):
            t.expect(name not in families, f"{name} is exported by the prefill node")
        t.expect_equal([s.labels for s in families["pdserve:node_info"].samples],
                       [{"role": "prefill", "model_name": served}], "pdserve:node_info")
        zero = PREFILL_VLLM + [n for n in PREFILL_PDSERVE
                               if not n.startswith("pdserve:kv_cache_blocks")
                               and n not in ("pdserve:node_info", "pdserve:node_state")]
        expect_all_zero(families, zero, "prefill")
        expect_up(families, "prefill")

    def proxy_at_start():
        families = scrape(proxy_url)
        vllm = [name for name in families if name.startswith("vllm:")]
        t.expect_equal(vllm, [], "vllm: series on the proxy")
        for name, typ in PROXY_PDSERVE.items():
            check_family(families, name, typ, None, None)
        t.expect_equal(sorted(s.labels["placement"] for s in families["pdserve:proxy_prefill_placements"].samples),
                       ["cached", "local", "remote"], "placement values")
        zero = [n for n in PROXY_PDSERVE if not n.startswith("pdserve:cluster_")]
        expect_all_zero(families, zero, "proxy")

    def counts_after_requests():
        def one(i):
            body = {"model": served, "prompt": [(7 * i + k) % 200 + 1 for k in range(PROMPT_LEN)],
                    "max_tokens": OUTPUT_LEN, "ignore_eos": True, "temperature": 0, "stream": True}
            status, text = t.http("POST", proxy_url + "/v1/completions", body, timeout=60)
            t.expect_equal(status, 200, f"HTTP status ({text[:300]})")
        with concurrent.futures.ThreadPoolExecutor(max_workers=3) as pool:
            list(pool.map(one, range(NUM_REQUESTS)))
        # The engine publishes its token counters after each step, and a step streams its
        # tokens before that: a scrape right after the last stream ends may miss that step's.
        t.wait_until(lambda: value(scrape(decode_url), "vllm:generation_tokens", "_total")
                     >= NUM_REQUESTS * OUTPUT_LEN, 10, "the last step's tokens published")
        decode = scrape(decode_url)
        prefill = scrape(prefill_url)
        t.expect_equal(value(decode, "vllm:request_success", "_total", finished_reason="length"),
                       NUM_REQUESTS, "requests finished by length")
        t.expect_equal(value(decode, "vllm:request_success", "_total", finished_reason="stop"), 0,
                       "requests finished by stop")
        t.expect_equal(value(decode, "vllm:prompt_tokens", "_total"), NUM_REQUESTS * PROMPT_LEN,
                       "vllm:prompt_tokens_total")
        t.expect_equal(value(decode, "vllm:generation_tokens", "_total"), NUM_REQUESTS * OUTPUT_LEN,
                       "vllm:generation_tokens_total")
        for name in ("vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds",
                     "vllm:request_queue_time_seconds", "vllm:request_decode_time_seconds",
                     "vllm:request_time_per_output_token_seconds", "vllm:request_prompt_tokens"):
            t.expect_equal(value(decode, name, "_count"), NUM_REQUESTS, f"{name}_count")
        t.expect_equal(value(decode, "vllm:request_prompt_tokens", "_sum"), NUM_REQUESTS * PROMPT_LEN,
                       "vllm:request_prompt_tokens_sum")
        t.expect_equal(value(decode, "vllm:request_generation_tokens", "_sum"), NUM_REQUESTS * OUTPUT_LEN,
                       "vllm:request_generation_tokens_sum")
        t.expect_equal(value(decode, "vllm:inter_token_latency_seconds", "_count"),
                       NUM_REQUESTS * (OUTPUT_LEN - 1), "vllm:inter_token_latency_seconds_count")
        # Each request's prefill once, on the node that did it.
        prefills = (value(decode, "vllm:request_prefill_time_seconds", "_count")
                    + value(prefill, "vllm:request_prefill_time_seconds", "_count"))
        t.expect_equal(prefills, NUM_REQUESTS, "vllm:request_prefill_time_seconds_count over both nodes")
        remote = value(prefill, "pdserve:prefill_requests", "_total")
        t.expect_equal(value(decode, "pdserve:remote_prefill_time_seconds", "_count"), remote,
                       "remote prefills seen by the decode node")

    failed = t.run_checks([
        ("decode node: vLLM and pdserve series at zero from the start", decode_at_start),
        ("prefill node: its vLLM and pdserve series at zero from the start", prefill_at_start),
        ("proxy: no vllm: series, its own at zero from the start", proxy_at_start),
        ("exact request and token counts after streamed requests", counts_after_requests),
    ])
    t.finish(failed, target)


if __name__ == "__main__":
    main()
