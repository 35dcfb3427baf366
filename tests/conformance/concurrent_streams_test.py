"""64 concurrent streaming clients of the official `openai` Python client (argument: colocated |
1p1d), each with its own prompt (16 distinct prompts of 1 to ~300 tokens, four sharing a long
prefix so the prefix cache is hit), greedy with ignore_eos and a fixed max_tokens: each
receives exactly the text pdserve-generate prints for that prompt. A small per-step token
budget forces chunked prefill mixed with decodes. Afterwards no KV block is left in use.
"""
import concurrent.futures
import os
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
import openai  # noqa: E402
import pdserve_testing as t  # noqa: E402

t.set_deadline(280)
TARGET = sys.argv[1] if len(sys.argv) > 1 else "colocated"
CLIENTS = 64
MAX_TOKENS = 32


def build_prompts():
    words = ["cache", "block", "prefill", "decode", "token", "stream", "batch", "queue", "ünïcödé",
             "北京", "42", "serving", "latency", "throughput", "scheduler", "kernel"]
    shared_prefix = "You are a careful assistant. Answer briefly and precisely. " * 6
    prompts = ["Hi", "The quick brown fox jumps", "1 2 3 4 5 6 7 8 9", "¿Qué tal? 你好！"]
    prompts += [f"{shared_prefix}Question {i}: what is a {words[i]}?" for i in range(4)]
    for i in range(8):
        length = 4 + i * i * 4  # 4 to 200 words
        prompts.append(" ".join(words[(k * (i + 3) + i) % len(words)] for k in range(length)))
    return prompts


prompts = build_prompts()
model_dir = t.make_model()
# Two pdserve-generate runs at a time: the machine has two cores.
with concurrent.futures.ThreadPoolExecutor(2) as pool:
    expected = list(pool.map(lambda p: t.generate_greedy(model_dir, p, MAX_TOKENS), prompts))
target = t.start_target(TARGET, model_dir, ["--max-num-batched-tokens", "256", "--max-num-seqs", "64"])
client = openai.OpenAI(base_url=target.url + "/v1", api_key="x", max_retries=0, timeout=120)
decode_url = target.decode.match.group(2)


def stream_one(index):
    stream = client.completions.create(model=target.name, prompt=prompts[index % len(prompts)],
                                       max_tokens=MAX_TOKENS, temperature=0, stream=True,
                                       stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    text, finish_reason, usage = "", None, None
    for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            text += choice.text
            finish_reason = choice.finish_reason or finish_reason
    return index, text, finish_reason, usage


def concurrent_streams():
    peak = {"running": 0}
    done = threading.Event()

    def sample():
        while not done.is_set():
            peak["running"] = max(peak["running"], t.metric(decode_url, "vllm:num_requests_running"))
            time.sleep(0.05)  # the sampling period: /metrics is the only view of the batch

    sampler = threading.Thread(target=sample)
    sampler.start()
    start = time.monotonic()
    try:
        with concurrent.futures.ThreadPoolExecutor(CLIENTS) as pool:
            results = list(pool.map(stream_one, range(CLIENTS)))
    finally:
        done.set()
        sampler.join()
    seconds = time.monotonic() - start
    mismatches = [r for r in results if r[1] != expected[r[0] % len(prompts)]]
    for index, text, _, _ in mismatches[:4]:
        print(f"client {index}: got {text!r}\n   expected {expected[index % len(prompts)]!r}")
    t.expect(not mismatches, f"{len(mismatches)} of {CLIENTS} streams differ from pdserve-generate")
    for index, _, finish_reason, usage in results:
        t.expect_equal(finish_reason, "length", f"client {index} finish_reason")
        t.expect_equal(usage.completion_tokens if usage else None, MAX_TOKENS, f"client {index} usage")
    print(f"     {CLIENTS * MAX_TOKENS} tokens in {seconds:.2f} s ({CLIENTS * MAX_TOKENS / seconds:.0f} tokens/s), "
          f"peak running {peak['running']:.0f}")
    t.expect(peak["running"] > 1, "the streams were never batched together")


def prefix_cache_hit():
    t.expect(t.metric(decode_url, "vllm:prefix_cache_hits_total") > 0, "no prefix-cache hit on the decode node")


def no_block_left():
    t.wait_until(lambda: t.metric(decode_url, "pdserve:kv_cache_blocks_used") == 0, 10, "no KV block in use")
    for name in ("vllm:kv_cache_usage_perc", "vllm:num_requests_running", "vllm:num_requests_waiting"):
        t.expect_equal(t.metric(decode_url, name), 0, name)


failed = t.run_checks([
    (f"{CLIENTS} concurrent streams each equal pdserve-generate for their prompt", concurrent_streams),
    ("the shared prefix hit the prefix cache", prefix_cache_hit),
    ("once idle, no KV block is in use", no_block_left),
])
exit_code = target.stop()
if exit_code != 0:
    print(f"exit code {exit_code} after SIGTERM")
    failed += 1
t.finish(failed, target, f"concurrent stream checks against {TARGET}")
