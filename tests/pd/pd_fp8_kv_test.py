#!/usr/bin/python3
"""End to end, issue #31's done-when run: an FP8-weight checkpoint (pdserve-make-model --fp8,
Qwen's official block-FP8 layout) with an FP8 KV cache (--kv-cache-dtype fp8) across
disaggregation, on real processes (pdserve-proxy, pdserve-prefill, pdserve-decode over UCX tcp
on loopback).

1. A 1P1D cluster serving the FP8 checkpoint (F8_E4M3 projections with 128x128 block scales)
   with --kv-cache-dtype fp8 on both nodes: greedy outputs equal those of a colocated FP8-KV
   engine on the same checkpoint (pdserve-generate --kv-cache-dtype fp8, the oracle), the FP8 blocks travel
   (KV bytes sent) and every block's checksum verifies (no mismatch, no fallback).
2. A mismatched pair (fp8 prefill node, auto decode node): the prefill node refuses every work
   with 400 kv_layout_mismatch naming both dtypes, counted in pdserve:kv_layout_refused_total;
   the decode node prefills each request itself (its outputs equal pdserve-generate's with the
   auto KV dtype), and both nodes stay up.

Environment: PDSERVE_BUILD_DIR, PDSERVE_SOURCE_DIR (set by CTest).
"""
import concurrent.futures
import json
import os
import random
import sys

sys.path.insert(0, os.path.join(os.environ.get("PDSERVE_SOURCE_DIR", "."), "tests/python"))
import pdserve_testing as t  # noqa: E402

MAX_TOKENS = 8
FP8 = ("--kv-cache-dtype", "fp8")
FALLBACKS = "pdserve:remote_prefill_fallbacks_total"
MISMATCHES = "pdserve:kv_checksum_mismatches_total"
REFUSED = "pdserve:kv_layout_refused_total"


def start_cluster(name, prefill_extra, decode_extra):
    """proxy + one prefill node + one decode node, each node with its own extra arguments."""
    token = {"PDSERVE_CLUSTER_TOKEN": t.CLUSTER_TOKEN}
    proxy = t.Process(f"proxy-{name}", [t.BINARIES["proxy"], "--port", "0"],
                      r"pdserve-proxy: listening on (http://\S+)", env=token)
    proxy_url = proxy.match.group(1)
    common = ["--model", MODEL, "--port", "0", "--proxy", proxy_url, "--ucx-tls", "tcp", *t.DEFAULT_NODE_ARGS]
    prefill = t.Process(f"prefill-{name}", [t.BINARIES["prefill"], *common, *prefill_extra],
                        r"pdserve-prefill: prefilling (\S+) on (http://\S+)", env=token)
    decode = t.Process(f"decode-{name}", [t.BINARIES["decode"], *common, *decode_extra], t.SERVING_LINE,
                       env=token)
    t.wait_until(lambda: sum(n["state"] == "up" for n in t.get_json(proxy_url + "/cluster",
                                                                   headers=t.cluster_headers())["nodes"]) == 2,
                 60, "both nodes registered with the proxy")
    return t.Target("1p1d", proxy_url, decode.match.group(1), [proxy, decode, prefill], decode), prefill


def complete_all(target, prompts):
    def one(prompt):
        status, body = t.http("POST", target.url + "/v1/completions",
                              {"model": target.name, "prompt": prompt, "max_tokens": MAX_TOKENS,
                               "temperature": 0, "ignore_eos": True}, timeout=120)
        t.expect_equal(status, 200, f"HTTP status ({body[:300]})")
        return json.loads(body)["choices"][0]["text"]
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(prompts)) as pool:
        return list(pool.map(one, prompts))


def main():
    global MODEL
    t.set_deadline(420)
    MODEL = t.make_model("tiny-fp8", fp8=True)
    with open(os.path.join(MODEL, "config.json"), encoding="utf-8") as handle:
        quantization = json.load(handle)["quantization_config"]
    t.expect_equal(quantization["weight_block_size"], [128, 128], "the checkpoint's FP8 block size")
    with open(os.path.join(MODEL, "model.safetensors"), "rb") as handle:
        header = json.loads(handle.read(int.from_bytes(handle.read(8), "little")))
    t.expect_equal(header["model.layers.0.self_attn.q_proj.weight"]["dtype"], "F8_E4M3", "a projection's dtype")
    rng = random.Random(31)
    # Under one block, one and a bit, several with a partial last block.
    prompts = [[rng.randrange(1000, 100000) for _ in range(n)] for n in (5, 17, 75)]
    fp8_oracle = [t.generate_greedy(MODEL, prompt, MAX_TOKENS, FP8) for prompt in prompts]
    auto_oracle = [t.generate_greedy(MODEL, prompt, MAX_TOKENS) for prompt in prompts]
    print(f"fp8 KV vs auto KV greedy texts equal for {sum(a == b for a, b in zip(fp8_oracle, auto_oracle))}"
          f" of {len(prompts)} prompts (measured, not asserted)")
    failed = 0
    fp8, prefill = start_cluster("fp8", FP8, FP8)
    decode_url = fp8.decode.match.group(2)

    def fp8_blocks_travel_and_match_a_colocated_fp8_engine():
        for prompt, text, expected in zip(prompts, complete_all(fp8, prompts), fp8_oracle):
            t.expect_equal(text, expected, f"greedy text of a {len(prompt)}-token prompt")
        t.expect(t.metric(decode_url, "pdserve:kv_transfer_bytes_total") > 0, "no KV was transferred")
        t.expect_equal(t.metric(decode_url, MISMATCHES), 0, "checksum mismatches")
        t.expect_equal(t.metric(decode_url, FALLBACKS), 0, "local prefill fallbacks")
        t.expect("float8_e4m3fn" in prefill.log(), "the prefill node does not name its fp8 KV blocks")

    failed += t.run_checks([("fp8 blocks travel and match a colocated fp8 engine",
                             fp8_blocks_travel_and_match_a_colocated_fp8_engine)])
    if failed:
        print(fp8.logs())
    fp8.stop()

    mixed, prefill = start_cluster("mixed", FP8, ())
    decode_url = mixed.decode.match.group(2)
    prefill_url = prefill.match.group(2)

    def a_mismatched_pair_is_refused_and_prefilled_locally():
        for prompt, text, expected in zip(prompts, complete_all(mixed, prompts), auto_oracle):
            t.expect_equal(text, expected, f"greedy text of a {len(prompt)}-token prompt")
        t.expect_equal(t.metric(prefill_url, REFUSED), len(prompts), "works refused for their layout")
        t.expect_equal(t.metric(decode_url, FALLBACKS), len(prompts), "local prefill fallbacks")
        log = mixed.decode.log()
        # The decode node logs the answer's first 300 bytes: the message, naming both dtypes.
        t.expect("HTTP 400" in log and "float8_e4m3fn" in log and "--kv-cache-dtype" in log,
                 "the decode node's log does not say why the prefill node refused")
        for node in (prefill, mixed.decode):
            t.expect(node.process.poll() is None, f"{node.name} exited")
            t.expect_equal(t.http("GET", node.match.group(2) + "/health")[0], 200, f"{node.name} health")

    failed += t.run_checks([("a mismatched pair is refused and prefilled locally",
                             a_mismatched_pair_is_refused_and_prefilled_locally)])
    t.finish(failed, mixed)


if __name__ == "__main__":
    main()
