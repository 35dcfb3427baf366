#!/usr/bin/python3
"""End to end, issue #15: KV integrity and the local prefill fallback on real processes
(pdserve-proxy, pdserve-prefill, pdserve-decode over UCX tcp on loopback).

1. A clean 1P1D cluster (checksums on by default): greedy outputs equal pdserve-generate's, every
   transfer verifies (no mismatch, no fallback), KV bytes did travel.
2. Its only prefill node killed (-9; the proxy, with a long heartbeat timeout, keeps naming it):
   the decode node prefills each request itself, same outputs, one fallback per request.
3. A 1P1D cluster whose decode node corrupts every landed block (PDSERVE_TEST_KV_CORRUPT_EVERY=1,
   test only): every transfer is caught by its checksum, counted, prefilled locally, and the
   outputs still equal pdserve-generate's.
4. The same with two prefill nodes: each mismatched transfer is fetched again from the other
   prefill node (counted as a re-fetch), whose KV is corrupted too, then prefilled locally.
After each phase no KV block stays in use on the decode node.

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
MISMATCHES = "pdserve:kv_checksum_mismatches_total"
FALLBACKS = "pdserve:remote_prefill_fallbacks_total"
REFETCHES = "pdserve:kv_refetches_total"


def start_cluster(name, decode_env=None, num_prefill=1):
    """proxy + `num_prefill` prefill nodes + one decode node, all on port 0. The proxy keeps routing to a node
    that stopped sending heartbeats for 10 minutes, so a killed prefill node stays in the
    X-Pdserve-Prefill list and the decode node meets it dead."""
    token = {"PDSERVE_CLUSTER_TOKEN": t.CLUSTER_TOKEN}
    proxy = t.Process(f"proxy-{name}", [t.BINARIES["proxy"], "--port", "0", "--heartbeat-timeout-ms", "600000"],
                      r"pdserve-proxy: listening on (http://\S+)", env=token)
    proxy_url = proxy.match.group(1)
    common = ["--model", MODEL, "--port", "0", "--proxy", proxy_url, "--ucx-tls", "tcp", *t.DEFAULT_NODE_ARGS]
    prefills = [t.Process(f"prefill-{name}-{i}", [t.BINARIES["prefill"], *common],
                          r"pdserve-prefill: prefilling (\S+) on (http://\S+)", env=token)
                for i in range(num_prefill)]
    decode = t.Process(f"decode-{name}", [t.BINARIES["decode"], *common], t.SERVING_LINE,
                       env=dict(token, **(decode_env or {})))
    t.wait_until(lambda: sum(n["state"] == "up" for n in t.get_json(proxy_url + "/cluster",
                                                                   headers=t.cluster_headers())["nodes"]) == num_prefill + 1,
                 60, "every node registered with the proxy")
    return t.Target(f"{num_prefill}p1d", proxy_url, decode.match.group(1), [proxy, decode, *prefills], decode), prefills[0]


def complete_all(target, prompts):
    def one(prompt):
        status, body = t.http("POST", target.url + "/v1/completions",
                              {"model": target.name, "prompt": prompt, "max_tokens": MAX_TOKENS,
                               "temperature": 0, "ignore_eos": True}, timeout=120)
        t.expect_equal(status, 200, f"HTTP status ({body[:300]})")
        return json.loads(body)["choices"][0]["text"]
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(prompts)) as pool:
        return list(pool.map(one, prompts))


def expect_oracle(texts):
    for prompt, text, expected in zip(PROMPTS, texts, ORACLE):
        t.expect_equal(text, expected, f"greedy text of a {len(prompt)}-token prompt")


def expect_no_block_used(decode_url):
    t.wait_until(lambda: t.metric(decode_url, "pdserve:kv_cache_blocks_used") == 0, 30,
                 "no KV block in use on the decode node")


def decode_url(target):
    return target.decode.match.group(2)


def main():
    global MODEL, PROMPTS, ORACLE
    t.set_deadline(540)
    MODEL = t.make_model()
    rng = random.Random(15)
    # Under one block, exactly one, one and a bit, several with a partial last block.
    PROMPTS = [[rng.randrange(1000, 100000) for _ in range(n)] for n in (3, 16, 17, 40, 75)]
    ORACLE = [t.generate_greedy(MODEL, prompt, MAX_TOKENS) for prompt in PROMPTS]
    failed = 0
    clean, prefill = start_cluster("clean")
    url = decode_url(clean)

    def clean_transfers_verify():
        expect_oracle(complete_all(clean, PROMPTS))
        t.expect_equal(t.metric(url, MISMATCHES), 0, "checksum mismatches")
        t.expect_equal(t.metric(url, FALLBACKS), 0, "local prefill fallbacks")
        t.expect(t.metric(url, "pdserve:kv_transfer_bytes_total") > 0, "no KV was transferred")
        expect_no_block_used(url)

    def dead_prefill_node_falls_back_to_a_local_prefill():
        prefill.process.kill()
        prefill.process.wait()
        expect_oracle(complete_all(clean, PROMPTS))
        t.expect_equal(t.metric(url, FALLBACKS), len(PROMPTS), "local prefill fallbacks")
        t.expect_equal(t.metric(url, MISMATCHES), 0, "checksum mismatches")
        expect_no_block_used(url)

    failed += t.run_checks([("clean transfers verify", clean_transfers_verify),
                            ("a dead prefill node falls back to a local prefill",
                             dead_prefill_node_falls_back_to_a_local_prefill)])
    if failed:
        print(clean.logs())
    clean.stop()

    corrupt, _ = start_cluster("corrupt", {"PDSERVE_TEST_KV_CORRUPT_EVERY": "1"})
    url = decode_url(corrupt)

    def corrupted_transfers_are_caught_and_prefilled_here():
        expect_oracle(complete_all(corrupt, PROMPTS))
        t.expect_equal(t.metric(url, MISMATCHES), len(PROMPTS), "checksum mismatches")
        t.expect_equal(t.metric(url, FALLBACKS), len(PROMPTS), "local prefill fallbacks")
        t.expect("KV checksum mismatch" in corrupt.decode.log(), "the mismatch is not logged")
        expect_no_block_used(url)

    failed += t.run_checks([("corrupted transfers are caught and prefilled here",
                             corrupted_transfers_are_caught_and_prefilled_here)])
    if failed:
        print(corrupt.logs())
    corrupt.stop()

    refetch, _ = start_cluster("refetch", {"PDSERVE_TEST_KV_CORRUPT_EVERY": "1"}, num_prefill=2)
    url = decode_url(refetch)

    def corrupted_transfers_are_fetched_again_from_the_other_prefill_node():
        expect_oracle(complete_all(refetch, PROMPTS))
        t.expect_equal(t.metric(url, REFETCHES), len(PROMPTS), "re-fetches")
        t.expect_equal(t.metric(url, MISMATCHES), 2 * len(PROMPTS), "checksum mismatches")
        t.expect_equal(t.metric(url, FALLBACKS), len(PROMPTS), "local prefill fallbacks")
        t.expect("trying the next prefill node" in refetch.decode.log(), "the re-fetch is not logged")
        expect_no_block_used(url)

    failed += t.run_checks([("corrupted transfers are fetched again from the other prefill node",
                             corrupted_transfers_are_fetched_again_from_the_other_prefill_node)])
    t.finish(failed, refetch)


if __name__ == "__main__":
    main()
