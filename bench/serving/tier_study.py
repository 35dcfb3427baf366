#!/usr/bin/env python3
"""The KV-tier workload study of docs/PERF.md (issue #32, item 5): multi-turn chat whose working
set is several times a node's KV pool, on a colocated node and on 1P1D, with the KV tiers off,
host memory only, and host memory + disk.

Usage: .venv/bin/python bench/serving/tier_study.py MODEL OUT_DIR [--configs off,host,host+disk]
       [--topologies colocated,1p1d] [--repeats N] [--conversations 20] [--turns 8]
       [--system-words 256] [--input-words 32] [--output-len 16] [--pool-ratio 4]
       [--block-size 16] [--host-gib G] [--disk-gib G] [--max-concurrency C] [--retry-429 S]
       [--node-arg=FLAG ...]

Workload: pdserve-bench-serving's `multiturn` dataset (bench/serving/README.md): CONVERSATIONS
chat conversations of TURNS turns, every one starting with the same system message of
SYSTEM_WORDS words, each turn re-sending the whole history (earlier user messages and the
answers streamed to them) plus INPUT_WORDS new words, all conversations in flight at once (one
request each; --max-concurrency C: C of them), so their turns interleave and each
conversation's prefix must survive the others' between two of its turns. A request a node
refuses with HTTP 429 (a disaggregated decode node takes a prompt's KV only when its pool has
room for it now, so the 1P1D runs meet it whenever the in-flight conversations outgrow the
decode pool) is sent again as a real client does: pdserve-bench-serving --retry-429 honors the
answer's Retry-After for up to --retry-429 seconds (default 300) after the first send, its TTFT
counted from that first send, and the retries are in each record and the table. This, rather
than a larger decode pool, keeps every node's pool at 1/POOL_RATIO of the working set, so the
1P1D rows compare with the colocated ones and the decode node's tiers still matter. A request
still refused at its deadline fails, and no later turn of its conversation is sent. The KV pool
of every node is sized (--kv-cache-memory-gib,
with --block-size and --kv-cache-dtype float32) to 1/POOL_RATIO of the workload's working set
(the shared system prompt once plus every conversation's own tokens), counted with the model's
real Qwen3 tokenizer and chat template (Hugging Face `transformers`, from MODEL's
tokenizer files) before the run, and again from the server's prompt_tokens after it.

Configurations (each node gets the flags): off (no tier flags); host (--kv-offload-host-gib
HOST_GIB, default 2x the pool); host+disk (that plus --kv-offload-disk-dir OUT_DIR/disk-RUN and
--kv-offload-disk-gib DISK_GIB, default 8x the pool). A build whose nodes do not know the flags
is refused before any run, naming the flag (exit 2); a node that refuses them at start fails
the run with the node's error line (exit 1).

Per run (a fresh cluster from tools/cluster/pdserve-cluster, cold caches; /metrics of every
process scraped before and after): prefix hit rate of the pool (vllm:prefix_cache_hits_total /
queries_total), of each lower tier (whatever pdserve:kv_tier_* / offload / external prefix-cache
hit series the nodes export, per `tier` label; printed generically, so the tier store's names
need no change here), prefill tokens computed, TTFT p50/p90 and goodput. Records go to
OUT_DIR/tier_study.jsonl; the table of docs/PERF.md is printed at the end.
Exit codes: 0 done, 1 a run failed, 2 bad arguments or a configuration this build lacks.
"""
import argparse
import json
import math
import os
import random
import re
import subprocess
import sys
import time

SOURCE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(SOURCE, "scripts"))
from routing_study import BUILD, Cluster, load_average, scrape, total  # noqa: E402

CONFIGS = ("off", "host", "host+disk")
TOPOLOGIES = ("colocated", "1p1d")
TIER_FLAGS = {"host": ["--kv-offload-host-gib"],
              "host+disk": ["--kv-offload-host-gib", "--kv-offload-disk-dir", "--kv-offload-disk-gib"]}
# Objectives for goodput, loose enough for a machine whose 2 shared cores run every process.
SLO_TTFT_MS, SLO_TPOT_MS = 4000, 500
# A lower tier's hit series: a name about tiers, offload or external prefix caches that counts hits.
TIER_SERIES = re.compile(r"^(pdserve:kv_tier|vllm:[a-z_]*offload|[a-z]+:external_prefix_cache)")


def fail_input(message):
    print(f"tier_study: {message}", file=sys.stderr)
    sys.exit(2)


def multiturn_words():
    """The words pdserve-bench-serving's multiturn dataset draws from (bench/serving/workload.h)."""
    with open(os.path.join(SOURCE, "bench/serving/workload.h"), encoding="utf-8") as handle:
        text = handle.read()
    block = re.search(r"kMultiTurnWords\[\]\s*=\s*\{(.*?)\};", text, re.S)
    return re.findall(r'"([^"]+)"', block.group(1))


def kv_bytes_per_token(model):
    """K and V of every layer in float32 (the study runs with --kv-cache-dtype float32)."""
    with open(os.path.join(model, "config.json"), encoding="utf-8") as handle:
        config = json.load(handle)
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    return 2 * config["num_hidden_layers"] * config["num_key_value_heads"] * head_dim * 4


def working_set_tokens(model, args):
    """(system prompt tokens, one conversation's tokens at its end) with the real tokenizer and
    chat template, for a conversation of the study's shape (seeded words; an answer counted as
    OUTPUT_LEN words, one token each for these common words)."""
    from transformers import AutoTokenizer  # the venv's; import here so --help needs none
    tokenizer = AutoTokenizer.from_pretrained(model)
    words = multiturn_words()
    rng = random.Random(args.seed)

    def text(count):
        return " ".join(rng.choice(words) for _ in range(count))

    system = [{"role": "system", "content": text(args.system_words)}]
    messages = list(system)
    for _ in range(args.turns):
        messages.append({"role": "user", "content": text(args.input_words)})
        messages.append({"role": "assistant", "content": text(args.output_len)})

    def count(conversation):
        ids = tokenizer.apply_chat_template(conversation, tokenize=True)
        return len(ids["input_ids"] if hasattr(ids, "keys") else ids)  # transformers 5: a dict

    return count(system), count(messages)


def check_tier_flags(config):
    """Exit 2 when this build's nodes lack a flag of `config` (the tiers are not merged yet)."""
    help_text = ""
    for binary in ("decode_node/pdserve-decode", "prefill_node/pdserve-prefill"):
        path = os.path.join(BUILD, binary)
        if not os.path.exists(path):
            fail_input(f"{path} is missing: build the project first (BUILD_DIR={BUILD})")
        help_text += subprocess.run([path, "--help"], capture_output=True, text=True).stdout
    for flag in TIER_FLAGS.get(config, []):
        if flag not in help_text:
            fail_input(f"configuration '{config}' needs the nodes' {flag}, which this build's "
                       f"pdserve-decode / pdserve-prefill do not have (are the KV tiers merged?)")


def tier_args(config, run_dir, args, pool_gib):
    if config == "off":
        return []
    flags = ["--kv-offload-host-gib", f"{args.host_gib or 2 * pool_gib:.6f}"]
    if config == "host+disk":
        disk = os.path.join(run_dir, "disk")
        os.makedirs(disk, exist_ok=True)
        flags += ["--kv-offload-disk-dir", disk, "--kv-offload-disk-gib", f"{args.disk_gib or 8 * pool_gib:.6f}"]
    return flags


def topology(name, node_flags, args):
    nodes = {"port": 0, "args": []}
    return {"ucx_tls": "tcp",
            "node_args": ["--threads", "1", "--max-model-len", "4096", "--heartbeat-interval-ms", "200",
                          "--block-size", str(args.block_size), "--kv-cache-dtype", "float32",
                          "--kv-transfer-timeout-ms", "20000", *node_flags, *args.node_arg],
            "proxy": {"port": 0, "args": []},
            "prefill": [dict(nodes)] if name == "1p1d" else [],
            "decode": [dict(nodes)]}


def node_error(log_dir):
    """The first error line a node logged (a refused flag, a failed start), or ''."""
    for root, _, names in os.walk(log_dir):
        for name in sorted(names):
            with open(os.path.join(root, name), errors="replace") as handle:
                for line in handle:
                    if re.search(r"error|invalid|unknown|refus", line, re.I):
                        return f"{name}: {line.strip()}"
    return ""


def bench_command(proxy, args, result):
    return [os.path.join(BUILD, "bench/serving/pdserve-bench-serving"), "--base-url", proxy,
            "--endpoint", "/v1/chat/completions", "--dataset-name", "multiturn",
            "--num-prompts", str(args.conversations), "--num-turns", str(args.turns),
            "--shared-prefix-len", str(args.system_words), "--input-len", str(args.input_words),
            "--output-len", str(args.output_len), "--request-rate", str(args.request_rate),
            "--max-concurrency", str(args.max_concurrency or args.conversations), "--seed", str(args.seed),
            "--slo-ttft-ms", str(SLO_TTFT_MS), "--slo-tpot-ms", str(SLO_TPOT_MS),
            "--request-timeout", "900", "--retry-429", str(args.retry_429), "--result-json", result]


def delta(before, after, role, series):
    names = [name for name in after if name.startswith(role)]
    return total([after[n] for n in names], series) - total([before.get(n, {}) for n in names], series)


def tier_hits(before, after):
    """{tier: hits} of every lower-tier hit series the nodes export, with its unit."""
    hits = {}
    for process, metrics in after.items():
        if process.startswith("proxy"):
            continue
        for series, value in metrics.items():
            name = series.split("{", 1)[0]
            if not TIER_SERIES.match(name) or "hit" not in name:
                continue
            tier = re.search(r'tier="([^"]+)"', series)
            key = (tier.group(1) if tier else name, "blocks" if "block" in name else "tokens")
            hits[key] = hits.get(key, 0.0) + value - before.get(process, {}).get(series, 0.0)
    return hits


def tier_series(before, after):
    """Every tier-related series' change over the run, summed over the nodes (what exists)."""
    changes = {}
    for process, metrics in after.items():
        for series, value in metrics.items():
            if TIER_SERIES.match(series) or "kv_tier" in series or "offload" in series:
                changes[series] = changes.get(series, 0.0) + value - before.get(process, {}).get(series, 0.0)
    return changes


def summarize(run, result, before, after, args, bytes_per_token, system_tokens):
    queries = delta(before, after, "", "vllm:prefix_cache_queries_total")
    hits = delta(before, after, "", "vllm:prefix_cache_hits_total")
    received = delta(before, after, "decode", "pdserve:kv_transfer_bytes_total")
    reloaded = {}  # tokens per tier
    for (tier, unit), count in tier_hits(before, after).items():
        reloaded[tier] = reloaded.get(tier, 0.0) + (count * args.block_size if unit == "blocks" else count)
    tiers = {tier: tokens / queries if queries else None for tier, tokens in reloaded.items()}
    # The pool misses of every node, less what the decode node received from the prefill node:
    # the prompt tokens some node computed (a reload from a tier that the node does not count
    # as a pool hit is taken off by the tier hits). A series without a tier label (vLLM's
    # external_prefix_cache_hits_total) sums the per-tier ones where both exist: counted once.
    per_tier = [tokens for tier, tokens in reloaded.items() if ":" not in tier]
    computed = queries - hits - received / bytes_per_token - sum(per_tier or reloaded.values())
    records = result.get("requests", [])
    last_turns = [records[i] for i in range(args.turns - 1, len(records), args.turns)]
    own = sum(max(0, r["prompt_tokens"] + r["output_tokens"] - system_tokens) for r in last_turns if r["success"])
    pool_blocks = total([m for p, m in after.items() if p.startswith("decode")], "pdserve:kv_cache_blocks_total")
    return dict(run, prefix_queries=queries, pool_hit_rate=hits / queries if queries else None,
                tier_hit_rates=tiers, tier_series=tier_series(before, after),
                prefill_tokens_computed=round(computed), kv_bytes_received=received,
                working_set_blocks=math.ceil((system_tokens + own) / args.block_size),
                pool_blocks=pool_blocks, completed=result["completed"], failed=result["failed"],
                good_requests=result["good_requests"], goodput=result["goodput"],
                retries_429=result.get("retries_429", 0),
                ttft_ms={k: result["ttft_ms"][k] for k in ("p50", "p90", "p99", "mean")},
                tpot_ms={k: result["tpot_ms"][k] for k in ("p50", "p90")},
                duration_s=result["duration_s"], total_input_tokens=result["total_input_tokens"])


def table(records):
    print("| topology | tiers | pool hit rate | lower-tier hit rates | prefill tokens computed "
          "| TTFT p50 / p90 (ms) | goodput (req/s) | good / done / failed | 429 retries "
          "| working set / pool (blocks) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for record in records:
        tiers = ", ".join(f"{tier} {rate * 100:.0f} %" for tier, rate in sorted(record["tier_hit_rates"].items())
                          if rate is not None) or "-"
        pool = record["pool_hit_rate"]
        in_flight = record.get("conversations_in_flight")
        where = record["topology"] + (f", {in_flight} in flight" if in_flight else "")
        print(f"| {where} | {record['config']} | {pool * 100 if pool is not None else 0:.0f} % | {tiers} "
              f"| {record['prefill_tokens_computed']} | {record['ttft_ms']['p50']:.0f} / {record['ttft_ms']['p90']:.0f} "
              f"| {record['goodput']:.2f} | {record['good_requests']} / {record['completed']} / {record['failed']} "
              f"| {record.get('retries_429', 0)} | {record['working_set_blocks']} / {record['pool_blocks']:.0f} |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model")
    parser.add_argument("out")
    parser.add_argument("--configs", default="off,host,host+disk")
    parser.add_argument("--topologies", default="colocated,1p1d")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--conversations", type=int, default=20)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--system-words", type=int, default=256)
    parser.add_argument("--input-words", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=16)
    parser.add_argument("--request-rate", type=float, default=2.0)
    parser.add_argument("--max-concurrency", type=int, default=0,
                        help="conversations in flight (default: all of them)")
    parser.add_argument("--retry-429", type=float, default=300.0,
                        help="seconds a request answered 429 is sent again for (0: a 429 fails it)")
    parser.add_argument("--pool-ratio", type=float, default=4.0, help="working set / KV pool")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--host-gib", type=float, default=0.0, help="host tier (default: 2x the pool)")
    parser.add_argument("--disk-gib", type=float, default=0.0, help="disk tier (default: 8x the pool)")
    parser.add_argument("--node-arg", action="append", default=[], help="another node flag, as --node-arg=--flag")
    parser.add_argument("--seed", type=int, default=20)
    args = parser.parse_args()
    configs = args.configs.split(",")
    topologies = args.topologies.split(",")
    for name in configs:
        if name not in CONFIGS:
            fail_input(f"--configs: '{name}' is not one of {', '.join(CONFIGS)}")
    for name in topologies:
        if name not in TOPOLOGIES:
            fail_input(f"--topologies: '{name}' is not one of {', '.join(TOPOLOGIES)}")
    if min(args.conversations, args.turns, args.repeats, args.output_len, args.block_size) < 1 or \
            args.pool_ratio <= 0 or args.max_concurrency < 0 or not args.retry_429 >= 0:
        fail_input("--conversations, --turns, --repeats, --output-len and --block-size must be >= 1, "
                   "--pool-ratio > 0, --max-concurrency and --retry-429 >= 0")
    if not os.path.exists(os.path.join(args.model, "tokenizer_config.json")):
        fail_input(f"{args.model} has no tokenizer_config.json (a model folder, e.g. from pdserve-make-model)")
    for name in configs:
        check_tier_flags(name)

    system_tokens, conversation_tokens = working_set_tokens(args.model, args)
    working_set = system_tokens + args.conversations * (conversation_tokens - system_tokens)
    working_blocks = math.ceil(working_set / args.block_size)
    pool_blocks = math.ceil(working_blocks / args.pool_ratio)
    bytes_per_token = kv_bytes_per_token(args.model)
    pool_gib = pool_blocks * args.block_size * bytes_per_token / 2 ** 30
    print(f"tier_study: working set {working_set} tokens ({working_blocks} blocks of {args.block_size}; "
          f"system prompt {system_tokens}, a conversation {conversation_tokens} at its end, Qwen3 "
          f"tokenizer and chat template); KV pool {pool_blocks} blocks = {pool_gib:.4f} GiB per node", flush=True)
    os.makedirs(args.out, exist_ok=True)
    records_path = os.path.join(args.out, "tier_study.jsonl")
    records = []
    failed = False
    with open(records_path, "a") as sink:
        for repeat in range(args.repeats):
            order = configs if repeat % 2 == 0 else list(reversed(configs))  # A B, then B A
            for topology_name in topologies:
                for config in order:
                    name = f"{topology_name}_{config.replace('+', '-')}_r{repeat}"
                    run_dir = os.path.join(args.out, name)
                    os.makedirs(run_dir, exist_ok=True)
                    node_flags = ["--kv-cache-memory-gib", f"{pool_gib:.6f}", *tier_args(config, run_dir, args, pool_gib)]
                    run = {"topology": topology_name, "config": config, "repeat": repeat, "name": name,
                           "conversations_in_flight": args.max_concurrency or args.conversations,
                           "node_flags": node_flags, "load_average_before": load_average()}
                    try:
                        cluster = Cluster(topology(topology_name, node_flags, args), args.model, run_dir, name)
                    except RuntimeError as error:
                        print(f"tier_study: {name}: {error}; {node_error(run_dir) or 'no node error logged'}",
                              file=sys.stderr, flush=True)
                        failed = True
                        continue
                    try:
                        urls = cluster.urls()
                        before = {process: scrape(url) for process, url in urls.items()}
                        result_path = os.path.join(run_dir, "bench.json")
                        command = bench_command(cluster.proxy, args, result_path)
                        started = time.time()
                        with open(os.path.join(run_dir, "bench.txt"), "w") as log:
                            log.write(" ".join(command) + "\n")
                            log.flush()
                            code = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT).returncode
                        elapsed = time.time() - started
                        after = {process: scrape(url) for process, url in urls.items()}
                    finally:
                        cluster.stop()
                    if code not in (0, 1):  # 1: some requests failed, which the result records
                        print(f"tier_study: {name}: pdserve-bench-serving exited {code}; see {run_dir}/bench.txt",
                              file=sys.stderr, flush=True)
                        failed = True
                        continue
                    with open(result_path) as handle:
                        result = json.load(handle)
                    run.update(elapsed_s=round(elapsed, 1), load_average_after=load_average())
                    record = summarize(run, result, before, after, args, bytes_per_token, system_tokens)
                    records.append(record)
                    sink.write(json.dumps(record) + "\n")
                    sink.flush()
                    print(f"tier_study: {name}: {json.dumps(record)}", flush=True)
    print()
    table(records)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
