#!/usr/bin/python3
"""End to end, issue #32 item 2: a disaggregated decode node's host KV tier serves the prefix it
already has before it asks for remote prefill, on real processes (pdserve-proxy, pdserve-prefill,
pdserve-decode over UCX tcp on loopback).

The decode node has a 16-block pool and a host tier (--kv-offload-host-gib); the prefill node a
pool large enough to keep every prompt. Request A (a 64-token prefix P + 20 tokens) is prefilled
remotely; three unrelated prompts then push P out of the decode node's pool, after it was
offloaded to its host tier. Request B (P + 20 other tokens) must be served by reloading P's 4
blocks from the host tier (pdserve:kv_tier_hit_blocks_total{tier="host"},
vllm:external_prefix_cache_hits_total) and importing only the rest: the KV bytes received are
2 of A's 6 blocks, and the prefill node found P in its own pool, so it computed only the
remainder. A's and B's greedy outputs equal pdserve-generate's (the oracle).

Environment: PDSERVE_BUILD_DIR, PDSERVE_SOURCE_DIR (set by CTest).
"""
import json
import os
import random
import re
import sys

sys.path.insert(0, os.path.join(os.environ.get("PDSERVE_SOURCE_DIR", "."), "tests/python"))
import pdserve_testing as t  # noqa: E402

MAX_TOKENS = 8
BLOCK = 16
PREFIX_BLOCKS = 4
# float32 KV: 2 layers x (K, V) x 2 KV heads x 16 x 4 bytes = 512 bytes a token, 8 KiB a block.
KV = ("--kv-cache-dtype", "float32")
POOL_BLOCKS = 16
POOL_GIB = f"{(POOL_BLOCKS + 0.5) * BLOCK * 512 / 2 ** 30:.9f}"
HOST_TIER_GIB = f"{1 / 1024:.9f}"  # 128 blocks: holds every block of the test


def series(url, name, labels=""):
    """The value of `name{labels}` (labels as written, e.g. 'tier="host"'; '' for an
    unlabelled series or the sum of a labelled one's series)."""
    status, text = t.http("GET", url + "/metrics", timeout=10)
    t.expect_equal(status, 200, f"GET {url}/metrics")
    values = []
    for line in text.splitlines():
        match = re.match(re.escape(name) + r"(\{[^}]*\})? (\S+)$", line)
        if match and labels in (match.group(1) or ""):
            values.append(float(match.group(2)))
    t.expect(values, f"{name}{{{labels}}} is not in {url}/metrics")
    return sum(values)


def start_cluster(model):
    """proxy + a prefill node with a pool that keeps every prompt + a decode node with a small
    pool and a host tier."""
    token = {"PDSERVE_CLUSTER_TOKEN": t.CLUSTER_TOKEN}
    proxy = t.Process("proxy", [t.BINARIES["proxy"], "--port", "0"], r"pdserve-proxy: listening on (http://\S+)",
                      env=token)
    proxy_url = proxy.match.group(1)
    common = ["--model", model, "--port", "0", "--proxy", proxy_url, "--ucx-tls", "tcp", "--threads", "1",
              "--max-model-len", "160", *KV]
    prefill = t.Process("prefill", [t.BINARIES["prefill"], *common, "--kv-cache-memory-gib", "0.25"],
                        r"pdserve-prefill: prefilling (\S+) on (http://\S+)", env=token)
    decode = t.Process("decode", [t.BINARIES["decode"], *common, "--kv-cache-memory-gib", POOL_GIB,
                                  "--kv-offload-host-gib", HOST_TIER_GIB], t.SERVING_LINE, env=token)
    t.wait_until(lambda: sum(n["state"] == "up" for n in t.get_json(proxy_url + "/cluster",
                                                                   headers=t.cluster_headers())["nodes"]) == 2,
                 60, "both nodes registered with the proxy")
    return t.Target("1p1d", proxy_url, decode.match.group(1), [proxy, decode, prefill], decode), prefill


def complete(target, prompt):
    status, body = t.http("POST", target.url + "/v1/completions",
                          {"model": target.name, "prompt": prompt, "max_tokens": MAX_TOKENS,
                           "temperature": 0, "ignore_eos": True}, timeout=120)
    t.expect_equal(status, 200, f"HTTP status ({body[:300]})")
    return json.loads(body)["choices"][0]["text"]


def main():
    t.set_deadline(240)
    model = t.make_model()
    rng = random.Random(31)

    def tokens(count):
        return [rng.randrange(1000, 100000) for _ in range(count)]

    prefix = tokens(PREFIX_BLOCKS * BLOCK)
    first, second = prefix + tokens(20), prefix + tokens(20)
    # 7 blocks each with their answers: the three take the 10 blocks A left unused, then A's.
    fillers = [tokens(100) for _ in range(3)]
    oracle = {id(p): t.generate_greedy(model, p, MAX_TOKENS, KV) for p in (first, second)}
    target, prefill = start_cluster(model)
    decode_url = target.decode.match.group(2)
    prefill_url = prefill.match.group(2)

    def a_decode_nodes_host_tier_serves_the_prefix_before_remote_prefill():
        t.expect_equal(series(decode_url, "pdserve:kv_cache_blocks_total"), POOL_BLOCKS, "decode pool blocks")
        t.expect_equal(complete(target, first), oracle[id(first)], "greedy text of A")
        bytes_of_a = series(decode_url, "pdserve:kv_transfer_bytes_total")
        t.expect(bytes_of_a > 0, "A's KV was not transferred")
        for filler in fillers:
            complete(target, filler)
        # A's 5 full blocks and the first two fillers' 6 each are offloaded at the start of the
        # next request's steps; sealed (checksummed), they are hits.
        t.wait_until(lambda: series(decode_url, "pdserve:kv_tier_blocks", 'tier="host"') >= 5 + 2 * 6, 30,
                     "A's and the fillers' blocks sealed in the decode node's host tier")
        t.expect_equal(series(decode_url, "pdserve:kv_tier_offloads_skipped_total"), 0, "offloads skipped")
        pool_hits = series(decode_url, "vllm:prefix_cache_hits_total")
        received = series(decode_url, "pdserve:kv_transfer_bytes_total")
        prefill_hits = series(prefill_url, "vllm:prefix_cache_hits_total")

        t.expect_equal(complete(target, second), oracle[id(second)], "greedy text of B")
        t.expect_equal(series(decode_url, "pdserve:kv_tier_hit_blocks_total", 'tier="host"'), PREFIX_BLOCKS,
                       "blocks reloaded from the decode node's host tier")
        t.expect_equal(series(decode_url, "vllm:external_prefix_cache_hits_total"), PREFIX_BLOCKS * BLOCK,
                       "tokens reloaded from the tiers")
        t.expect_equal(series(decode_url, "pdserve:kv_tier_reloads_total", 'outcome="landed"'), 1, "landed reloads")
        t.expect_equal(series(decode_url, "vllm:prefix_cache_hits_total") - pool_hits, 0,
                       "B's pool hits on the decode node (P should have left its pool)")
        t.expect_equal(series(decode_url, "pdserve:kv_transfer_bytes_total") - received, bytes_of_a * 2 / 6,
                       "KV bytes of B received (its 2 blocks after P, of A's 6)")
        t.expect_equal(series(prefill_url, "vllm:prefix_cache_hits_total") - prefill_hits, PREFIX_BLOCKS * BLOCK,
                       "prompt tokens of B the prefill node found in its pool (it computed only the rest)")
        t.expect_equal(series(decode_url, "pdserve:remote_prefill_fallbacks_total"), 0, "local prefill fallbacks")

    failed = t.run_checks([("a decode node's host tier serves the prefix before remote prefill",
                            a_decode_nodes_host_tier_serves_the_prefix_before_remote_prefill)])
    t.finish(failed, target)


if __name__ == "__main__":
    main()
