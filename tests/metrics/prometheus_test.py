#!/usr/bin/python3
"""A real Prometheus (Debian's `prometheus` package) scrapes a 1P1D cluster on the tiny model every
second while pdserve-bench-serving sends a fixed load through the proxy; then the PromQL a vLLM
dashboard runs must agree with the benchmark's own figures:

- exactly: requests (sum of vllm:request_success_total, histogram _count series), prompt and
  generation tokens (vllm:prompt_tokens_total, vllm:generation_tokens_total, summed over every
  target: the proxy and the prefill node export none of them);
- the token counters' increase() over a window around the run, within the extrapolation that
  increase() may add at the window's ends (at most one scrape interval each);
- histogram_quantile(q, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket[...]))) and the
  same of vllm:request_time_per_output_token_seconds, q in {0.5, 0.9}, within bucket resolution:
  the estimate must lie in the bucket that holds the benchmark's q-quantile, allowing for each
  request's offset between where the benchmark measures (the client) and where the decode node
  does (from its arrival to its first or last token), which the response's timeline gives.

Environment: PDSERVE_BUILD_DIR, PDSERVE_SOURCE_DIR (set by CTest); the project's venv.
"""
import bisect
import json
import math
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.environ.get("PDSERVE_SOURCE_DIR", "."), "tests/python"))
import pdserve_testing as t  # noqa: E402
import pdserve_prometheus as p  # noqa: E402

BENCH = os.path.join(t.BUILD, "bench/serving/pdserve-bench-serving")
SCRAPE_INTERVAL_S = p.SCRAPE_INTERVAL_S
NUM_PROMPTS = 64
INPUT_LEN = 64
OUTPUT_LEN = 32
CONCURRENCY = 16
VOCAB = 1000  # prompt ids drawn from [0, VOCAB): any ids of the tiny model's vocabulary do

# vLLM's buckets (vllm/v1/metrics/loggers.py): what the node must use.
TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
TOKEN_LATENCY_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
                         5.0, 7.5, 10.0, 20.0, 40.0, 80.0]


def nearest_rank(samples, q):
    """The q-quantile as the ceil(q*N)-th smallest sample: the sample whose rank histogram_quantile
    looks for (it interpolates inside the bucket holding rank q*N)."""
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def bucket_of(value, buckets):
    """(lower, upper] of the bucket holding `value` (lower 0 for the first)."""
    index = bisect.bisect_left(buckets, value)
    t.expect(index < len(buckets), f"{value} is beyond the last bucket")
    return (buckets[index - 1] if index > 0 else 0.0), buckets[index]


def spans_of(record):
    timeline = record["timeline"]
    spans = timeline["spans"] if isinstance(timeline, dict) else timeline
    return {span["name"]: span for span in spans if span.get("args", {}).get("index", 0) == 0}


def node_bounds(record):
    """Bounds in seconds on the TTFT and TPOT the decode node recorded for this request (from its
    engine's timestamps), from the timeline the benchmark saved with it (times on the proxy's
    clock): {"ttft": (low, high), "tpot": (low, high)}.

    TTFT: the engine's arrival comes after the node's HTTP arrival (decode.request starts) and
    before the prefill work is posted (prefill.remote starts); its first token after the prefill
    node's first token arrived (prefill.remote ends) and before the node handed it to the client
    stream (tokens_ms[0]). TPOT: the node's token times are the hand-over times of the first and
    last token, each later than the engine's by a hand-over delay; the client's TPOT differs from
    the node's by the same kind of delays, so the node's lies within |client - timeline| of it."""
    spans = spans_of(record)
    tokens = record["timeline"]["tokens_ms"]
    arrival = spans["decode.request"]["start_ms"]
    remote = spans.get("prefill.remote")
    ttft_low = (remote["end_ms"] - remote["start_ms"]) / 1000.0 if remote else 0.0
    ttft_high = (tokens[0] - arrival) / 1000.0
    tpot = (tokens[-1] - tokens[0]) / (len(tokens) - 1) / 1000.0
    client_tpot = (record["e2e_ms"] - record["ttft_ms"]) / (record["output_tokens"] - 1) / 1000.0
    slack = abs(client_tpot - tpot)
    return {"ttft": (ttft_low, ttft_high), "tpot": (tpot - slack, tpot + slack)}


def main():
    p.require_prometheus()
    t.set_deadline(120)
    model = t.make_model()
    target = t.start_1p1d(model)
    decode_url = target.decode.match.group(2)
    prefill_url = target.processes[2].match.group(2)
    served = target.name
    prometheus = p.Prometheus([target.url, decode_url, prefill_url])
    selector = f'{{model_name="{served}"}}'

    # Every series exists at zero before the run: a rate over the run's window has a sample
    # before its first request.
    prometheus.wait_for_scrape_after(time.time(), "the cluster started")
    run_start = time.time()
    result_json = os.path.join(t.work_dir(), "bench.json")
    bench = subprocess.run(
        [BENCH, "--base-url", target.url, "--num-prompts", str(NUM_PROMPTS), "--input-len", str(INPUT_LEN),
         "--output-len", str(OUTPUT_LEN), "--max-concurrency", str(CONCURRENCY), "--vocab-size", str(VOCAB),
         "--seed", "3", "--result-json", result_json],
        capture_output=True, text=True, timeout=90)
    run_end = time.time()
    print(bench.stdout)
    t.expect_equal(bench.returncode, 0, f"pdserve-bench-serving exit code ({bench.stderr[-2000:]})")
    with open(result_json, encoding="utf-8") as handle:
        result = json.load(handle)
    records = [r for r in result["requests"] if r["success"]]
    # Until a scrape after the run's end has landed.
    t.wait_until(lambda: prometheus.scalar(f"sum(vllm:request_success_total{selector})") == result["completed"],
                 10, "the last requests scraped")
    prometheus.wait_for_scrape_after(run_end, "the run")
    at = time.time()
    # A window from a scrape before the run's first request to now.
    window_s = math.ceil(at - run_start + 2 * SCRAPE_INTERVAL_S)
    window = f"{window_s}s"
    print(f"run {run_end - run_start:.1f} s, window {window}")

    def exact_counts():
        t.expect_equal(result["completed"], NUM_PROMPTS, "requests the benchmark completed")
        t.expect_equal(prometheus.scalar(f"sum(vllm:request_success_total{selector})", at), NUM_PROMPTS,
                       "sum(vllm:request_success_total)")
        length = f'sum(vllm:request_success_total{{model_name="{served}",finished_reason="length"}})'
        t.expect_equal(prometheus.scalar(length, at), NUM_PROMPTS,
                       "requests finished by length (ignore_eos)")
        for name in ("vllm:time_to_first_token_seconds_count", "vllm:e2e_request_latency_seconds_count",
                     "vllm:request_time_per_output_token_seconds_count"):
            t.expect_equal(prometheus.scalar(f"sum({name}{selector})", at), NUM_PROMPTS, name)
        t.expect_equal(prometheus.scalar(f"sum(vllm:prompt_tokens_total{selector})", at),
                       result["total_input_tokens"], "sum(vllm:prompt_tokens_total) = the benchmark's input tokens")
        t.expect_equal(prometheus.scalar(f"sum(vllm:generation_tokens_total{selector})", at),
                       result["total_output_tokens"],
                       "sum(vllm:generation_tokens_total) = the benchmark's output tokens")
        t.expect_equal(prometheus.scalar(f"sum(vllm:request_prefill_time_seconds_count{selector})", at),
                       NUM_PROMPTS, "prefills counted once over all nodes")

    def token_rates():
        # increase() extrapolates the first and last samples in the window to its ends, by at most
        # one scrape interval each (the series has samples all along): the true increase times at
        # most window / (window - 2 intervals).
        most = window_s / (window_s - 2 * SCRAPE_INTERVAL_S)
        for name, total in (("vllm:prompt_tokens_total", result["total_input_tokens"]),
                            ("vllm:generation_tokens_total", result["total_output_tokens"])):
            increase = prometheus.scalar(f"sum(increase({name}{selector}[{window}]))", at)
            rate = prometheus.scalar(f"sum(rate({name}{selector}[{window}]))", at)
            print(f"{name}: increase {increase:.1f} (benchmark {total}), rate {rate:.2f}/s over {window}")
            t.expect(total - 1e-6 <= increase <= total * most + 1e-6,
                     f"increase({name}[{window}]) = {increase}, expected [{total}, {total * most:.1f}]")
            t.expect(abs(rate * window_s - increase) <= 1e-6 * increase, f"rate({name}) * window = increase")

    def quantiles():
        client = {"ttft": [r["ttft_ms"] / 1000.0 for r in records],
                  "tpot": [(r["e2e_ms"] - r["ttft_ms"]) / (r["output_tokens"] - 1) / 1000.0 for r in records]}
        bounds = [node_bounds(r) for r in records]
        for key, metric, buckets in (("ttft", "vllm:time_to_first_token_seconds", TTFT_BUCKETS),
                                     ("tpot", "vllm:request_time_per_output_token_seconds", TOKEN_LATENCY_BUCKETS)):
            for q in (0.5, 0.9):
                promql = f"histogram_quantile({q}, sum by (le) (rate({metric}_bucket{selector}[{window}])))"
                estimate = prometheus.scalar(promql, at)
                # histogram_quantile interpolates inside the bucket holding the node's rank-q sample;
                # that sample lies between the rank-q samples of the per-request lower and upper
                # bounds (order statistics keep the order), so the estimate lies between the lower
                # edge of the first's bucket and the upper edge of the second's.
                low = nearest_rank([b[key][0] for b in bounds], q)
                high = nearest_rank([b[key][1] for b in bounds], q)
                lowest = bucket_of(max(low, 1e-9), buckets)[0]
                highest = bucket_of(high, buckets)[1]
                bench_q = result[f"{key}_ms"][f"p{int(q * 100)}"] / 1000.0
                print(f"{key} p{int(q * 100)}: Prometheus {estimate * 1000:.2f} ms, benchmark {bench_q * 1000:.2f} ms; "
                      f"the node's rank-{q} sample in [{low * 1000:.2f}, {high * 1000:.2f}] ms; "
                      f"allowed [{lowest * 1000:g}, {highest * 1000:g}] ms")
                t.expect(lowest <= estimate <= highest,
                         f"{promql} = {estimate}, outside [{lowest}, {highest}] (benchmark {bench_q})")
                if key == "ttft":
                    # The client sees each first token after the node sent it.
                    t.expect(estimate <= bucket_of(nearest_rank(client[key], q), buckets)[1],
                             f"{promql} = {estimate} above the bucket of the benchmark's {bench_q}")

    failed = t.run_checks([
        ("request and token counts equal the benchmark's", exact_counts),
        ("increase() and rate() of the token counters", token_rates),
        ("histogram_quantile of TTFT and TPOT within bucket resolution of the benchmark", quantiles),
    ])
    t.finish(failed, target)


if __name__ == "__main__":
    main()
