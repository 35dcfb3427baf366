"""A peer's benchmark client against a 1P1D cluster: NVIDIA's `aiperf` (the client of Dynamo's
benchmarks, the venv's `aiperf` CLI) runs a few dozen streaming completions at a fixed
concurrency with fixed input and output lengths, then `pdserve-bench-serving` runs the same
prompts (aiperf's own, from its inputs.json) at the same concurrency against the same cluster.
Both are compared with each other and with the cluster's own per-request timelines
(`GET /trace` on the proxy for aiperf's requests, `usage.pdserve_timeline` in bench-serving's
records for its own):

- aiperf completes every request with no error; its request count is what was asked;
- its input length (its own Hugging Face tokenization of the prompt) and the server's usage
  both equal the asked length, and so does bench-serving's; its output length and the server's
  usage, the timelines' `output_tokens` and bench-serving's are all the asked length;
- TTFT and TPOT agree within the tolerances below; the figures are printed side by side.

How aiperf measures (aiperf 0.13, src/aiperf/metrics/types): TTFT = first response with text -
request start; request latency = last response with text - request start; "inter token latency"
= (request latency - TTFT) / (output tokens - 1), which is TPOT as bench-serving and the
timelines define it. By default aiperf counts tokens by tokenizing the prompt and re-tokenizing
the streamed text; a random-weight model's text is gibberish that does not re-tokenize into the
tokens generated (16 generated tokens came back as 16 to 22), which would shift that divisor, so
the test passes --use-server-token-count (counts from the usage chunk, as bench-serving does)
and checks the client-side count itself: every prompt aiperf generated is INPUT_LEN tokens under
Hugging Face's `tokenizers` with the model's tokenizer.json, as pdserve's usage says. The
timelines are the server's view (proxy arrival to the token leaving the proxy, docs/TRACING.md),
so a client sees every request a little later than its timeline says: the connection, sending,
the client's own parsing and scheduling.

The cluster is the quickstart's shape (configs/1p1d-cpu.json: proxy, one prefill and one decode
node, KV over UCX tcp) on the tiny synthetic model, warmed up with a few requests first.

Tolerances. A loaded 2-core CI machine runs the three servers and the client at once, so the
numbers move from run to run; what must hold is how they relate.
- A client against the timelines of the very same requests (paired): the mean and the median
  TTFT within TTFT_ABS_MS + TTFT_REL of the timelines' (30 ms + 25%: the client's extra is a
  connection and a parse, about 1 to 12 ms on average here, but one scheduling stall of a
  Python process on 2 busy cores costs tens of ms); the mean and median TPOT within
  TPOT_ABS_MS + TPOT_REL (0.5 ms + 10%: both are a difference of two times over the same 15
  intervals, so fixed overheads cancel; seen within 3%; a divisor off by 3 tokens out of 16,
  20%, fails); and the median per-request "client TTFT - timeline TTFT"
  no lower than -SKEW_MS (2 ms): a client cannot see a token before the proxy sent it, up to the
  timeline's clock-alignment error (microseconds on loopback). A client that timed the response
  head as its first token fails here.
- aiperf against bench-serving: two runs one after the other, not the same requests, and the
  load differs between them: the server's own timelines of aiperf's requests showed from about
  1 to 4 times bench-serving's TTFT and TPOT (aiperf's processes take CPU from the nodes on 2
  cores, and so does whatever else the machine runs), so their raw figures are printed side by
  side but not compared. What is compared is what each client adds to the timelines of its own
  requests: mean TTFT minus the timelines' within TTFT_ABS_MS of each other (seen: aiperf 5 to
  12 ms, bench-serving 1 to 3 ms), mean TPOT over the timelines' within TPOT_REL of each other
  (seen: aiperf 0.97 to 0.99, bench-serving 1.00).
Token counts and request counts are exact.

Run by hand: PDSERVE_BUILD_DIR=build PDSERVE_SOURCE_DIR=. .venv/bin/python tests/bench/aiperf_test.py
"""
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
import pdserve_testing as t  # noqa: E402

t.set_deadline(270)
REQUESTS = 32
CONCURRENCY = 4
INPUT_LEN = 64
OUTPUT_LEN = 16

TTFT_ABS_MS, TTFT_REL = 30.0, 0.25
TPOT_ABS_MS, TPOT_REL = 0.5, 0.10
SKEW_MS = 2.0

AIPERF = os.path.join(os.path.dirname(sys.executable), "aiperf")
BENCH = os.path.join(t.BUILD, "bench/serving/pdserve-bench-serving")
if not os.access(AIPERF, os.X_OK):
    sys.exit(f"{AIPERF} is missing: run 'bash scripts/setup.sh' (it installs python/requirements.txt)")


def aiperf_env():
    """aiperf loads the tokenizer from the model folder; nothing may come from the network.
    HF_HUB_OFFLINE cannot say so: aiperf 0.13 then looks every tokenizer name up in the hub
    cache, local folders included, and fails. Instead an empty HF_HOME (no cache to use) and a
    hub endpoint on a closed local port (any download fails at once instead of fetching)."""
    env = dict(os.environ, HF_HOME=os.path.join(t.work_dir(), "hf-home"), HF_ENDPOINT="http://127.0.0.1:9",
               HF_HUB_DISABLE_TELEMETRY="1", DO_NOT_TRACK="1", TOKENIZERS_PARALLELISM="false")
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_CACHE", "HF_DATASETS_OFFLINE"):
        env.pop(name, None)
    return env


def run_aiperf(target, model_dir, artifacts):
    argv = [AIPERF, "profile", "--model", target.name, "--url", target.url, "--endpoint-type", "completions",
            "--streaming", "--tokenizer", model_dir, "--use-server-token-count",
            "--isl", str(INPUT_LEN), "--isl-stddev", "0", "--osl", str(OUTPUT_LEN), "--osl-stddev", "0",
            "--extra-inputs", "ignore_eos:true", "temperature:0",
            "--request-count", str(REQUESTS), "--concurrency", str(CONCURRENCY), "--random-seed", "7",
            "--artifact-dir", artifacts, "--export-level", "raw", "--ui-type", "none",
            "--no-server-metrics", "--no-gpu-telemetry",
            # The per-request timeline is opt-in; without the cluster token it has no node address.
            # "on", not "1": aiperf turns 1 into a number, which its config then refuses.
            "--header", "X-Pdserve-Timeline:on"]
    start = time.monotonic()
    result = subprocess.run(argv, capture_output=True, text=True, timeout=200, env=aiperf_env())
    with open(os.path.join(t.work_dir(), "aiperf.out"), "w", encoding="utf-8") as handle:
        handle.write(result.stdout + result.stderr)
    if result.returncode != 0:
        raise AssertionError(f"aiperf exited {result.returncode}:\n{(result.stdout + result.stderr)[-6000:]}")
    print(f"     aiperf ran {time.monotonic() - start:.1f} s", flush=True)


def read_jsonl(path):
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def stats(values):
    return {"n": len(values), "mean": statistics.fmean(values), "p50": statistics.median(values)}


def chrome_trace_timelines(trace):
    """request_id -> {ttft_ms, e2e_ms, tpot_ms, output_tokens, prompt_tokens} from /trace's events."""
    out = {}
    for event in trace["traceEvents"]:
        if event.get("ph") != "X":
            continue
        args = event.get("args", {})
        entry = out.setdefault(args.get("request_id"), {"prompt_tokens": 0})
        if event["name"] == "E2E":
            entry.update(e2e_ms=event["dur"] / 1000, tpot_ms=args.get("tpot_ms"),
                         output_tokens=args.get("output_tokens"))
        elif event["name"] == "TTFT":
            entry["ttft_ms"] = event["dur"] / 1000
        elif event["name"] == "prefill.chunk":
            entry["prompt_tokens"] += args.get("prompt_tokens", 0)
    return out


def close(actual, reference, abs_ms, rel, what):
    """|actual - reference| <= abs_ms + rel * reference."""
    limit = abs_ms + rel * reference
    t.expect(abs(actual - reference) <= limit,
             f"{what}: {actual:.2f} ms vs {reference:.2f} ms, apart by more than {limit:.2f} ms "
             f"({abs_ms} ms + {rel:.0%})")


model_dir = t.make_model()
target = t.start_1p1d(model_dir)
artifacts = os.path.join(t.work_dir(), "aiperf")
figures = {}  # filled by the checks, printed at the end


def warm_up():
    """A few requests first, so that neither client pays for the cluster's first ones (UCX
    connections between the nodes, first allocations)."""
    t.run([BENCH, "--base-url", target.url, "--model", target.name, "--num-prompts", str(2 * CONCURRENCY),
           "--max-concurrency", str(CONCURRENCY), "--input-len", str(INPUT_LEN), "--output-len", str(OUTPUT_LEN),
           "--request-timeout", "60"], timeout=90)


def aiperf_run():
    run_aiperf(target, model_dir, artifacts)


def aiperf_summary():
    with open(os.path.join(artifacts, "profile_export_aiperf.json"), encoding="utf-8") as handle:
        summary = json.load(handle)
    t.expect(summary.get("is_complete", True) and not summary.get("was_cancelled"), "aiperf's run was cut short")
    t.expect_equal(summary["request_count"]["avg"], REQUESTS, "aiperf request_count")
    t.expect_equal(summary.get("error_request_count", {}).get("avg", 0), 0, "aiperf error_request_count")
    t.expect_equal(summary.get("error_summary") or [], [], "aiperf error_summary")
    for name, expected in (("input_sequence_length", INPUT_LEN), ("output_sequence_length", OUTPUT_LEN),
                           ("usage_prompt_tokens", INPUT_LEN), ("usage_completion_tokens", OUTPUT_LEN)):
        metric = summary.get(name)
        t.expect(metric is not None, f"aiperf reported no {name}")
        t.expect_equal((metric["count"], metric["min"], metric["max"]), (REQUESTS, expected, expected),
                       f"aiperf {name} (count, min, max)")
    figures["aiperf"] = {"requests": int(summary["request_count"]["avg"]),
                         "errors": int(summary.get("error_request_count", {}).get("avg", 0)),
                         "input_tokens": int(summary["total_isl"]["avg"]),
                         "output_tokens": int(summary["total_osl"]["avg"])}
    figures["aiperf"]["ttft"] = {"mean": summary["time_to_first_token"]["avg"],
                                 "p50": summary["time_to_first_token"]["p50"]}
    figures["aiperf"]["tpot"] = {"mean": summary["inter_token_latency"]["avg"],
                                 "p50": summary["inter_token_latency"]["p50"]}


aiperf_records = {}  # aiperf's x_request_id -> {ttft_ms, tpot_ms, isl, osl, response_id, usage}


def aiperf_per_request():
    records = read_jsonl(os.path.join(artifacts, "profile_export.jsonl"))
    raw = read_jsonl(os.path.join(artifacts, "profile_export_raw.jsonl"))
    t.expect_equal(len(records), REQUESTS, "records in profile_export.jsonl")
    t.expect_equal(len(raw), REQUESTS, "records in profile_export_raw.jsonl")
    for record in records:
        t.expect(not record.get("error"), f"aiperf record with an error: {record.get('error')}")
        metrics = record["metrics"]
        aiperf_records[record["metadata"]["x_request_id"]] = {
            "ttft_ms": metrics["time_to_first_token"]["value"], "tpot_ms": metrics["inter_token_latency"]["value"],
            "isl": metrics["input_sequence_length"]["value"], "osl": metrics["output_sequence_length"]["value"]}
    for record in raw:
        ids, usage = set(), None
        for response in record["responses"]:
            for packet in response["packets"]:
                if packet["name"] != "data" or packet["value"] == "[DONE]":
                    continue
                chunk = json.loads(packet["value"])
                ids.add(chunk.get("id"))
                usage = chunk.get("usage") or usage
        t.expect_equal(len(ids), 1, "response ids in one aiperf request")
        t.expect(usage is not None, "an aiperf request without a usage chunk")
        entry = aiperf_records[record["metadata"]["x_request_id"]]
        entry.update(response_id=ids.pop(), usage=usage)
        t.expect_equal((usage["prompt_tokens"], usage["completion_tokens"]), (INPUT_LEN, OUTPUT_LEN),
                       "usage (prompt_tokens, completion_tokens) of an aiperf request")


def aiperf_prompts_tokenize():
    """aiperf's prompts, tokenized by Hugging Face's tokenizer of the model, are INPUT_LEN tokens."""
    import tokenizers  # noqa: PLC0415 - the venv's, only needed here
    tokenizer = tokenizers.Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    lengths = [len(tokenizer.encode(prompt, add_special_tokens=False).ids) for prompt in aiperf_prompts()]
    t.expect_equal(lengths, [INPUT_LEN] * REQUESTS, "Hugging Face token counts of aiperf's prompts")


def aiperf_prompts():
    with open(os.path.join(artifacts, "inputs.json"), encoding="utf-8") as handle:
        inputs = json.load(handle)
    prompts = [payload["prompt"] for session in inputs["data"] for payload in session["payloads"]]
    t.expect_equal(len(prompts), REQUESTS, "prompts in aiperf's inputs.json")
    return prompts


def aiperf_against_timelines():
    trace = t.get_json(target.url + f"/trace?last={REQUESTS}", headers=t.cluster_headers())
    timelines = chrome_trace_timelines(trace)
    by_response = {r["response_id"]: r for r in aiperf_records.values()}
    t.expect_equal(set(timelines), set(by_response), "request ids in the proxy's last traces vs aiperf's responses")
    for request_id, timeline in timelines.items():
        t.expect_equal(timeline["output_tokens"], OUTPUT_LEN, f"{request_id} timeline output_tokens")
        t.expect(timeline["prompt_tokens"] <= INPUT_LEN, f"{request_id}: the prefill computed more than the prompt")
        # The same request as aiperf saw it and as the usage chunk's timeline says.
        client, usage_timeline = by_response[request_id], by_response[request_id]["usage"]["pdserve_timeline"]
        t.expect_equal(usage_timeline["request_id"], request_id, "usage.pdserve_timeline.request_id")
        t.expect(abs(usage_timeline["ttft_ms"] - timeline["ttft_ms"]) < 0.01, f"{request_id}: /trace TTFT differs "
                 "from the usage chunk's")
    pairs = [(by_response[rid], timelines[rid]) for rid in timelines]
    compare_paired("aiperf", [c["ttft_ms"] for c, _ in pairs], [s["ttft_ms"] for _, s in pairs],
                   [c["tpot_ms"] for c, _ in pairs], [s["tpot_ms"] for _, s in pairs])
    figures["aiperf timelines"].update(input_tokens=sum(c["usage"]["prompt_tokens"] for c, _ in pairs),
                                       output_tokens=sum(s["output_tokens"] for _, s in pairs))


def compare_paired(client, client_ttft, server_ttft, client_tpot, server_tpot):
    """A client's TTFT/TPOT against the timelines of the very same requests."""
    figures[f"{client} timelines"] = {"requests": len(server_ttft), "ttft": stats(server_ttft),
                                      "tpot": stats(server_tpot)}
    lead = statistics.median(c - s for c, s in zip(client_ttft, server_ttft))
    figures[f"{client} timelines"]["client_lead_ms"] = lead
    # What the client adds to the server's figures: in ms for TTFT, as a ratio for TPOT.
    figures[client]["ttft_extra_ms"] = statistics.fmean(client_ttft) - statistics.fmean(server_ttft)
    figures[client]["tpot_ratio"] = statistics.fmean(client_tpot) / statistics.fmean(server_tpot)
    t.expect(lead >= -SKEW_MS, f"{client} sees the first token {-lead:.2f} ms (median) before the proxy's timeline "
             "says it was sent")
    for average in (statistics.fmean, statistics.median):
        name = "mean" if average is statistics.fmean else "median"
        close(average(client_ttft), average(server_ttft), TTFT_ABS_MS, TTFT_REL, f"{client} {name} TTFT vs timelines")
        close(average(client_tpot), average(server_tpot), TPOT_ABS_MS, TPOT_REL, f"{client} {name} TPOT vs timelines")


bench = {}


def bench_run():
    prompts = aiperf_prompts()
    prompt_file = os.path.join(t.work_dir(), "aiperf_prompts.jsonl")
    with open(prompt_file, "w", encoding="utf-8") as handle:
        for prompt in prompts:
            handle.write(json.dumps({"prompt": prompt, "output_len": OUTPUT_LEN}) + "\n")
    result_path = os.path.join(t.work_dir(), "bench.json")
    t.run([BENCH, "--base-url", target.url, "--model", target.name, "--dataset-path", prompt_file,
           "--num-prompts", str(REQUESTS), "--max-concurrency", str(CONCURRENCY), "--request-timeout", "120",
           "--result-json", result_path], timeout=150)
    with open(result_path, encoding="utf-8") as handle:
        bench.update(json.load(handle))


def bench_counts():
    t.expect_equal((bench["completed"], bench["failed"]), (REQUESTS, 0), "bench-serving (completed, failed)")
    t.expect_equal((bench["total_input_tokens"], bench["total_output_tokens"]),
                   (REQUESTS * INPUT_LEN, REQUESTS * OUTPUT_LEN), "bench-serving total (input, output) tokens")
    records = bench["requests"]
    for record in records:
        t.expect_equal(record["timeline"]["output_tokens"], OUTPUT_LEN, "bench request timeline output_tokens")
    figures["bench"] = {"requests": bench["completed"], "errors": bench["failed"],
                        "input_tokens": bench["total_input_tokens"], "output_tokens": bench["total_output_tokens"],
                        "ttft": {"mean": bench["ttft_ms"]["mean"], "p50": bench["ttft_ms"]["p50"]},
                        "tpot": {"mean": bench["tpot_ms"]["mean"], "p50": bench["tpot_ms"]["p50"]}}
    compare_paired("bench", [r["ttft_ms"] for r in records], [r["timeline"]["ttft_ms"] for r in records],
                   [(r["e2e_ms"] - r["ttft_ms"]) / (r["output_tokens"] - 1) for r in records],
                   [r["timeline"]["tpot_ms"] for r in records])
    figures["bench timelines"].update(input_tokens=sum(r["prompt_tokens"] for r in records),
                                      output_tokens=sum(r["timeline"]["output_tokens"] for r in records))


def aiperf_against_bench():
    """The two runs saw different loads (the raw figures are printed, not compared), so the
    clients are compared through what each adds to the timelines of its own requests."""
    a, b = figures["aiperf"], figures["bench"]
    t.expect(abs(a["ttft_extra_ms"] - b["ttft_extra_ms"]) <= TTFT_ABS_MS,
             f"mean TTFT minus the timelines': aiperf {a['ttft_extra_ms']:.2f} ms, bench-serving "
             f"{b['ttft_extra_ms']:.2f} ms, apart by more than {TTFT_ABS_MS} ms")
    t.expect(abs(a["tpot_ratio"] - b["tpot_ratio"]) <= TPOT_REL,
             f"mean TPOT over the timelines': aiperf {a['tpot_ratio']:.3f}, bench-serving {b['tpot_ratio']:.3f}, "
             f"apart by more than {TPOT_REL}")


def print_figures():
    columns = [c for c in ("aiperf", "aiperf timelines", "bench", "bench timelines") if c in figures]
    print(f"     {'':24}" + "".join(f"{c:>18}" for c in columns))

    def row(label, get):
        cells = []
        for column in columns:
            try:
                value = get(figures[column])
                cells.append(f"{value:>18.2f}" if isinstance(value, float) else f"{value!s:>18}")
            except (KeyError, TypeError):
                cells.append(f"{'-':>18}")
        print(f"     {label:24}" + "".join(cells))

    row("requests", lambda f: f["requests"])
    row("errors", lambda f: f["errors"])
    row("input tokens (total)", lambda f: f["input_tokens"])
    row("output tokens (total)", lambda f: f["output_tokens"])
    for metric in ("ttft", "tpot"):
        for stat in ("mean", "p50"):
            row(f"{metric.upper()} {stat} (ms)", lambda f, m=metric, s=stat: float(f[m][s]))
    row("TTFT - timelines, mean", lambda f: float(f["ttft_extra_ms"]))
    row("TTFT - timeline, median", lambda f: float(f["client_lead_ms"]))
    row("TPOT / timelines, mean", lambda f: float(f["tpot_ratio"]))


start = time.monotonic()
failed = t.run_checks([
    (f"warm-up: {2 * CONCURRENCY} requests (pdserve-bench-serving)", warm_up),
    (f"aiperf: {REQUESTS} streaming completions at concurrency {CONCURRENCY}, {INPUT_LEN} in / {OUTPUT_LEN} out",
     aiperf_run),
    ("aiperf's summary: request count, no error, exact input and output lengths (its own and the usage's)",
     aiperf_summary),
    ("aiperf's per-request records and raw responses: one response id each, usage exact", aiperf_per_request),
    (f"aiperf's prompts are {INPUT_LEN} tokens under Hugging Face's tokenizer", aiperf_prompts_tokenize),
    ("the proxy's traces of aiperf's requests: same ids and token counts; aiperf's TTFT/TPOT agree with them",
     aiperf_against_timelines),
    ("pdserve-bench-serving on aiperf's prompts at the same concurrency", bench_run),
    ("bench-serving: counts exact; its TTFT/TPOT agree with its requests' timelines", bench_counts),
    ("aiperf and bench-serving add the same to the timelines' TTFT and TPOT", aiperf_against_bench),
])
print_figures()
print(f"     checks took {time.monotonic() - start:.1f} s")
exit_code = target.stop()
if exit_code != 0:
    print(f"exit code {exit_code} after SIGTERM")
    failed += 1
t.finish(failed, target, "aiperf checks")
