#!/usr/bin/python3
"""Cache-aware placement end to end (issues #20, #34): a proxy, one prefill node and two decode
nodes with small KV pools (each holds two of the four shared prefixes), run once cache-aware
(the default: no --tokenizer, the proxy fetches the tokenizer from the nodes that register) and
once cache-unaware (--no-cache-aware-routing). Each round sends one
request per prefix, staggered so that each is in flight when the next arrives, in an order
rotated every round: placement by load alone then sends a prefix to the other decode node
than last time, while cache-aware placement sends it back to the node that holds it (its
heartbeats report its prefix-cache keys). Checks, on the decode nodes' own counters: the
cache-aware run hits the decode prefix caches on the repeated prefixes, prefills them on the
decode node that holds them (placement "cached", in the metrics and in the request's timeline),
transfers next to no KV after the first round and at most 3/4 of the unaware run's bytes (which
has ranged 57-73 MiB against 21 MiB); the proxy's index holds keys for
both decode nodes and no more than its per-node bound.

Environment: PDSERVE_BUILD_DIR, PDSERVE_SOURCE_DIR.
"""
import concurrent.futures
import json
import os
import random
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pd_e2e_test import AUTH, Cluster, complete, http, make_model, metric  # noqa: E402

PREFIXES = 4
PREFIX_TOKENS = 320  # 20 blocks of 16
ROUNDS = 4
STAGGER_S = 0.05  # a prefill here takes longer: each request is in flight when the next comes
KEYS_PER_NODE = 4096


def topology(aware):
    # No --tokenizer either way: cache-aware placement is the default.
    policy = [] if aware else ["--no-cache-aware-routing"]
    return {"proxy": {"port": 0, "args": policy + ["--prefix-keys-per-node", str(KEYS_PER_NODE)]},
            # 2-layer Qwen3-0.6B shape, float32 KV: 256 KiB a block, so 15 MiB is 60 blocks:
            # two prefixes of 20 blocks and their requests' own blocks.
            "node_args": ["--kv-cache-memory-gib", str(15 / 1024), "--threads", "1", "--max-model-len", "1024",
                          "--heartbeat-interval-ms", "100", "--kv-transfer-timeout-ms", "10000"],
            "prefill": [{"port": 0}],
            "decode": [{"port": 0, "args": ["--local-prefill-max-tokens", "0"]} for _ in range(2)]}


def rounds_of_requests():
    rng = random.Random(20)
    prefixes = [[rng.randrange(1000, 100000) for _ in range(PREFIX_TOKENS)] for _ in range(PREFIXES)]
    rounds = []
    for number in range(ROUNDS):
        order = [(number + offset) % PREFIXES for offset in range(PREFIXES)]
        rounds.append([{"prompt": prefixes[index] + [rng.randrange(1000, 100000) for _ in range(9)],
                        "max_tokens": 24, "temperature": 0, "ignore_eos": True} for index in order])
    return rounds


def decode_sum(cluster, name):
    return sum(metric(cluster.url("decode", index), name) for index in range(2))


def wait_for_tokenizer(cluster):
    """The proxy fetches the tokenizer once the nodes registered; until then it places by load.
    Polled: the proxy's /metrics is the only place that says it has the tokenizer."""
    deadline = time.monotonic() + 60
    while metric(cluster.proxy, "pdserve:proxy_cache_aware_routing") != 1.0:
        if time.monotonic() > deadline:
            raise AssertionError("the proxy did not get the tokenizer from its nodes in 60 s")
        time.sleep(0.1)


def heartbeats_after(cluster, moment):
    """{decode node URL: when the proxy last heard from it} for those heard from after `moment`
    (time.monotonic()); from /cluster, which says how long ago each heartbeat arrived."""
    now = time.monotonic()
    return {node["url"]: now - node["last_heartbeat_ms_ago"] / 1000 for node in cluster.nodes()
            if node["role"] == "decode" and now - node["last_heartbeat_ms_ago"] / 1000 > moment}


def wait_for_fresh_heartbeats(cluster, since):
    """Waits until each decode node's heartbeat has reached the proxy twice after `since`: the
    first may have been composed before `since`, the next (sent after the first's answer) was
    not. Polled: the proxy's /cluster is the only place that shows a heartbeat's arrival."""
    deadline = time.monotonic() + 30
    first = {}
    while len(first) < 2:
        first = heartbeats_after(cluster, since)
        if time.monotonic() > deadline:
            raise AssertionError(f"no heartbeat from both decode nodes within 30 s: {cluster.nodes()}")
        time.sleep(0.02)
    # Later by more than half the heartbeat interval (100 ms): /cluster's millisecond rounding
    # never passes the first heartbeat off as the second.
    while not all(url in later and later[url] > first[url] + 0.05
                  for later in [heartbeats_after(cluster, since)] for url in first):
        if time.monotonic() > deadline:
            raise AssertionError(f"no second heartbeat from both decode nodes within 30 s: {cluster.nodes()}")
        time.sleep(0.02)


def run_policy(model, directory, aware):
    name = "aware" if aware else "unaware"
    cluster = Cluster(topology(aware), model, "tcp", directory, name)
    try:
        if aware:
            wait_for_tokenizer(cluster)
        nodes = cluster.nodes()
        blocks = [node["load"]["kv_blocks_total"] for node in nodes if node["role"] == "decode"]
        print(f"{name}: decode KV pools of {blocks} blocks", flush=True)
        for number, requests in enumerate(rounds_of_requests()):
            with concurrent.futures.ThreadPoolExecutor(len(requests)) as pool:
                futures = []
                for request in requests:
                    futures.append(pool.submit(complete, cluster.proxy, request))
                    time.sleep(STAGGER_S)
                for future in futures:
                    future.result()
            round_end = time.monotonic()
            if number == 0:
                first_round_bytes = decode_sum(cluster, "pdserve:kv_transfer_bytes_total")
            # The placement of the next round reads the blocks just cached from the heartbeats.
            wait_for_fresh_heartbeats(cluster, round_end)
        # One more repeat, asking for its timeline: the proxy's route says where it was prefilled.
        status, body = http("POST", cluster.proxy + "/v1/completions", rounds_of_requests()[0][0],
                            headers=dict(AUTH, **{"X-Pdserve-Timeline": "1"}), timeout=300)
        if status != 200:
            raise AssertionError(f"HTTP {status}: {body[:300]}")
        timeline = json.loads(body)["usage"]["pdserve_timeline"]
        routes = [span["args"] for span in timeline["spans"] if span["name"] == "proxy.route"]
        result = {
            "bytes": decode_sum(cluster, "pdserve:kv_transfer_bytes_total"),
            "first_round_bytes": first_round_bytes,
            "hits": decode_sum(cluster, "vllm:prefix_cache_hits_total"),
            "queries": decode_sum(cluster, "vllm:prefix_cache_queries_total"),
            "proxy_hit_blocks": metric(cluster.proxy, 'pdserve:proxy_prefix_hit_blocks_total{pool="decode"}'),
            "proxy_query_blocks": metric(cluster.proxy, 'pdserve:proxy_prefix_query_blocks_total{pool="decode"}'),
            "index_keys": metric(cluster.proxy, "pdserve:proxy_prefix_index_keys"),
            "node_keys": {node["id"]: node["prefix_cache"]["keys"] for node in cluster.nodes()},
            "placements": {placement: metric(cluster.proxy, f'pdserve:proxy_prefill_placements_total{{placement="{placement}"}}')
                           for placement in ("remote", "local", "cached")},
            "last_route": routes[-1],
            "tokenizer_in_use": metric(cluster.proxy, "pdserve:proxy_cache_aware_routing"),
            "tokenizer_fetch_failures": metric(cluster.proxy, "pdserve:proxy_tokenizer_fetch_failures_total"),
            "tokenizer_mismatches": metric(cluster.proxy, "pdserve:proxy_tokenizer_mismatch_total"),
        }
        print(f"{name}: {json.dumps(result)}", flush=True)
        return result
    finally:
        cluster.stop()


def main():
    with tempfile.TemporaryDirectory(prefix="pdserve-routing-") as directory:
        model = make_model(directory)
        try:
            aware = run_policy(model, directory, True)
            unaware = run_policy(model, directory, False)
        except Exception:
            for root, _, files in os.walk(directory):
                for name in files:
                    if name.endswith(".log"):
                        with open(os.path.join(root, name), errors="replace") as handle:
                            print(f"---- {name}\n{handle.read()[-3000:]}", file=sys.stderr)
            raise
    failures = []
    for result, what in ((aware, "cache-aware"), (unaware, "cache-unaware")):
        if not all(keys > 0 for keys in result["node_keys"].values()):
            failures.append(f"{what}: a node reported no prefix keys: {result['node_keys']}")
        if any(keys > KEYS_PER_NODE for keys in result["node_keys"].values()):
            failures.append(f"{what}: a node's keys exceed the bound: {result['node_keys']}")
    # Rounds 2..4 repeat each prefix: cache-aware placement finds it on its node (hits of at
    # least 20 blocks x 16 tokens per repeated request, as the decode nodes count them).
    repeated = (ROUNDS - 1) * PREFIXES
    if aware["hits"] < 0.9 * repeated * PREFIX_TOKENS:
        failures.append(f"cache-aware: decode prefix-cache hits {aware['hits']} < 90% of "
                        f"{repeated} x {PREFIX_TOKENS} tokens")
    if aware["proxy_hit_blocks"] < 0.9 * repeated * (PREFIX_TOKENS // 16):
        failures.append(f"cache-aware: the proxy found {aware['proxy_hit_blocks']} blocks on the chosen nodes")
    if aware["placements"]["cached"] < 0.9 * repeated:
        failures.append(f"cache-aware: {aware['placements']} placements, fewer than 90% of the {repeated} "
                        "repeats prefilled on the decode node holding them")
    if aware["last_route"].get("placement") != "cached":
        failures.append(f"cache-aware: the last repeat's proxy.route is {aware['last_route']}, not placed 'cached'")
    if aware["bytes"] > 1.1 * aware["first_round_bytes"]:
        failures.append(f"cache-aware transferred {aware['bytes'] - aware['first_round_bytes']:.0f} KV bytes "
                        f"after the first round (which moved {aware['first_round_bytes']:.0f})")
    if aware["bytes"] > 0.75 * unaware["bytes"]:
        failures.append(f"cache-aware transferred {aware['bytes']:.0f} KV bytes, more than 3/4 of the "
                        f"cache-unaware {unaware['bytes']:.0f}")
    if aware["tokenizer_fetch_failures"] or aware["tokenizer_mismatches"]:
        failures.append(f"cache-aware: {aware['tokenizer_fetch_failures']:.0f} failed tokenizer fetches, "
                        f"{aware['tokenizer_mismatches']:.0f} refused registrations")
    # --no-cache-aware-routing: no tokenizer, no prefix lookup, every prompt prefilled remotely.
    if unaware["tokenizer_in_use"] != 0 or unaware["proxy_query_blocks"] != 0:
        failures.append(f"--no-cache-aware-routing: tokenizer in use {unaware['tokenizer_in_use']}, "
                        f"{unaware['proxy_query_blocks']} prefix blocks looked up")
    if unaware["placements"]["cached"] or unaware["placements"]["local"]:
        failures.append(f"--no-cache-aware-routing: placements {unaware['placements']}, not all remote")
    if failures:
        raise AssertionError("\n".join(failures))
    print(f"cache-aware: {aware['bytes'] / 2**20:.1f} MiB of KV transferred vs {unaware['bytes'] / 2**20:.1f} MiB "
          f"cache-unaware; decode prefix hits {aware['hits']:.0f} vs {unaware['hits']:.0f} tokens")


if __name__ == "__main__":
    main()
