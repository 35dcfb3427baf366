#!/usr/bin/python3
"""The TTFT cost of the KV transfer on a real 1P1D cluster (proxy, prefill and decode processes
on loopback, started with tools/cluster/pdserve-cluster), with the prefill node's
--kv-layerwise on and off.

For each UCX transport and layer-wise setting, one prompt of --prompt-tokens random tokens at a
time (a fresh prompt each time: no prefix-cache hit) is sent through the proxy with
--max-tokens (default 2) and streamed. From the request's timeline (usage.pdserve_timeline, on
the decode node's clock) it prints, per request and as medians:
  compute_ms   the prefill node's forward steps on the prompt (its prefill.chunk spans)
  ttft_ms      first token out of the decode node
  cost_ms      first token received -> KV landed at the decode node (decode.kv_wait): what
               the transfer adds after the first token
  second_ms    second token out of the decode node (ms after arrival)
  transfer_ms  the kv.transfer span (first put -> receiver's acknowledgement), GB/s, layers
               sent while the prefill's forward still ran
  client_ttft_ms, client_tpot_ms  as the client saw them (first streamed token; mean gap
               between the later ones), comparable with --colocated
--colocated also runs the same prompts on one colocated pdserve-decode (no proxy, no transfer)
with the same --node-args, for the client figures of the same model on the same device.
--node-args passes flags to every node, e.g. "--device cuda:0 --kv-cache-memory-gib 8" for GPU
nodes (whose KV then goes through the staging path on a UCX without CUDA memory support; the
nodes' logs say which path they took).
Exit status 2 on bad arguments or a cluster that does not start.

  bench/kv_transfer/kv_path_bench.py --build-dir build-kvpath --model /tmp/qwen3-0.6b
"""
import argparse
import json
import os
import random
import signal
import socket
import statistics
import re
import shlex
import subprocess
import sys
import tempfile
import time
import urllib.request

SOURCE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def stream_completion(base_url, prompt, max_tokens, want_timeline=True):
    """Streams one completion; returns its timeline (None when not asked for) and the client's
    token arrival times in ms after sending."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    headers = {"Content-Type": "application/json"}
    if want_timeline:
        headers["X-Pdserve-Timeline"] = "1"
    request = urllib.request.Request(base_url + "/v1/completions", data=json.dumps(body).encode(),
                                     headers=headers, method="POST")
    timeline = None
    arrivals = []
    sent = time.monotonic()
    with urllib.request.urlopen(request, timeout=600) as response:
        for raw in response:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[len("data: "):])
            if any(choice.get("text") for choice in event.get("choices", [])):
                arrivals.append((time.monotonic() - sent) * 1000)
            usage = event.get("usage") or {}
            if "pdserve_timeline" in usage:
                timeline = usage["pdserve_timeline"]
    if want_timeline and timeline is None:
        raise RuntimeError("the response carries no usage.pdserve_timeline")
    return timeline, arrivals


def client_figures(arrivals):
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]
    return {"client_ttft_ms": arrivals[0] if arrivals else 0.0,
            "client_tpot_ms": statistics.mean(gaps) if gaps else 0.0}


def figures(timeline):
    spans = timeline["spans"]

    def durations(name):
        return [s["end_ms"] - s["start_ms"] for s in spans if s["name"] == name]

    transfer = [s for s in spans if s["name"] == "kv.transfer"]
    kv = timeline.get("kv_transfer") or {}
    return {
        "compute_ms": sum(durations("prefill.chunk")),
        "ttft_ms": timeline["tokens_ms"][0],
        "cost_ms": sum(durations("decode.kv_wait")),
        "second_ms": timeline["tokens_ms"][1],
        # A field the timeline leaves null (no GB/s of a transfer too short to time) counts 0.
        "transfer_ms": transfer[0]["end_ms"] - transfer[0]["start_ms"] if transfer else kv.get("ms") or 0.0,
        "gb_per_s": kv.get("gb_per_s") or 0.0,
        "mb": (kv.get("bytes") or 0) / 1e6,
        "layers": kv.get("layers") or 0,
        "overlapped": kv.get("layers_overlapped") or 0,
    }


def ports_free(port_offset):
    for port in (8000, 8100, 8200):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port + port_offset))
            except OSError:
                return False
    return True


def node_args(args):
    return (["--kv-cache-memory-gib", str(args.kv_gib), "--threads", str(args.threads),
             "--max-model-len", str(args.prompt_tokens + args.max_tokens + 16)] + shlex.split(args.node_args))


def run_colocated(args, log_dir):
    """One pdserve-decode on port 0 with the nodes' flags; returns it and its URL."""
    log = open(os.path.join(log_dir, "colocated.log"), "w")
    process = subprocess.Popen([os.path.join(args.build_dir, "decode_node/pdserve-decode"), "--model", args.model,
                                "--port", "0"] + node_args(args), stdout=subprocess.PIPE, stderr=log, text=True)
    line = process.stdout.readline()
    url = re.search(r" on (http://\S+) ", line)
    if url is None:
        process.kill()
        print(f"error: the colocated node did not start; log in {log_dir}", file=sys.stderr)
        sys.exit(2)
    return process, url.group(1)


def run_cluster(args, tls, layerwise, log_dir, port_offset):
    topology = {"proxy": {"port": 8000},
                "node_args": node_args(args),
                "prefill": [{"port": 8100, "args": ["--kv-layerwise", layerwise]}],
                "decode": [{"port": 8200}]}
    path = os.path.join(log_dir, f"topology-{tls}-{layerwise}.json")
    with open(path, "w") as handle:
        json.dump(topology, handle)
    process = subprocess.Popen(
        [os.path.join(SOURCE, "tools/cluster/pdserve-cluster"), path, "--model", args.model,
         "--build-dir", args.build_dir, "--port-offset", str(port_offset), "--ucx-tls", tls,
         "--log-dir", os.path.join(log_dir, f"logs-{tls}-{layerwise}")],
        stdout=subprocess.PIPE, text=True)
    line = process.stdout.readline()
    while line and "ready" not in line:
        line = process.stdout.readline()
    if "ready" not in line:
        process.kill()
        print(f"error: the cluster did not start; logs in {log_dir}", file=sys.stderr)
        sys.exit(2)
    return process, f"http://127.0.0.1:{8000 + port_offset}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build-dir", required=True)
    parser.add_argument("--model", required=True, help="a model folder (pdserve-make-model output)")
    parser.add_argument("--prompt-tokens", type=int, default=1024)
    parser.add_argument("--requests", type=int, default=3, help="per setting (after one warm-up)")
    parser.add_argument("--transports", default="tcp,sm")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--kv-gib", type=float, default=1.0)
    parser.add_argument("--max-tokens", type=int, default=2, help="tokens generated per request (>= 2)")
    parser.add_argument("--node-args", default="", help="more flags for every node, e.g. \"--device cuda:0\"")
    parser.add_argument("--layerwise", default="on,off", help="--kv-layerwise settings to run")
    parser.add_argument("--colocated", action="store_true",
                        help="also time the prompts on one colocated pdserve-decode")
    parser.add_argument("--json", help="also write every figure there")
    args = parser.parse_args()
    if args.prompt_tokens < 16 or args.requests < 1 or args.max_tokens < 2 or not os.path.isdir(args.model):
        print("error: --prompt-tokens >= 16, --requests >= 1, --max-tokens >= 2 and an existing --model folder",
              file=sys.stderr)
        sys.exit(2)
    with open(os.path.join(args.model, "config.json")) as handle:
        num_layers = json.load(handle)["num_hidden_layers"]
    rng = random.Random(11)
    results = []
    port_offset = rng.randrange(20000, 40000, 1000)
    with tempfile.TemporaryDirectory(prefix="pdserve-kvpath-") as log_dir:
        if args.colocated:
            process, url = run_colocated(args, log_dir)
            try:
                rows = []
                for index in range(args.requests + 1):
                    prompt = [rng.randrange(1000, 100000) for _ in range(args.prompt_tokens)]
                    _, arrivals = stream_completion(url, prompt, args.max_tokens, want_timeline=False)
                    if index > 0:
                        rows.append(client_figures(arrivals))
                median = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
                results.append({"tls": "colocated", "layerwise": "-", "median": median, "rows": rows})
                print(f"colocated: client TTFT {median['client_ttft_ms']:.1f} ms, "
                      f"TPOT {median['client_tpot_ms']:.2f} ms", flush=True)
            finally:
                process.send_signal(signal.SIGTERM)
                process.wait(timeout=60)
        for tls in args.transports.split(","):
            for layerwise in args.layerwise.split(","):
                while not ports_free(port_offset):
                    port_offset += 1000
                process, proxy = run_cluster(args, tls, layerwise, log_dir, port_offset)
                try:
                    rows = []
                    for index in range(args.requests + 1):
                        prompt = [rng.randrange(1000, 100000) for _ in range(args.prompt_tokens)]
                        timeline, arrivals = stream_completion(proxy, prompt, args.max_tokens)
                        row = dict(figures(timeline), **client_figures(arrivals))
                        if row["layers"] != num_layers:  # another cluster answered on our ports
                            raise RuntimeError(f"the transfer carried {row['layers']} layers, "
                                               f"the model has {num_layers}")
                        if index == 0:
                            continue  # warm-up: first connection, first allocations
                        rows.append(row)
                        print(f"{tls:3} layerwise={layerwise:3} " +
                              " ".join(f"{k}={v:.1f}" for k, v in row.items()), flush=True)
                    median = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
                    results.append({"tls": tls, "layerwise": layerwise, "median": median, "rows": rows})
                finally:
                    process.send_signal(signal.SIGINT)
                    process.wait(timeout=60)
                port_offset += 1000
    print("\n| UCX | layer-wise | prefill compute ms | TTFT ms | first token -> KV landed ms "
          "| 2nd token ms | transfer ms | MB | GB/s | layers overlapped | client TTFT ms | client TPOT ms |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for result in results:
        m = result["median"]
        if result["tls"] == "colocated":
            print(f"| colocated | - | - | - | - | - | - | - | - | - | {m['client_ttft_ms']:.1f} "
                  f"| {m['client_tpot_ms']:.2f} |")
            continue
        print(f"| {result['tls']} | {result['layerwise']} | {m['compute_ms']:.0f} | {m['ttft_ms']:.0f} "
              f"| {m['cost_ms']:.1f} | {m['second_ms']:.0f} | {m['transfer_ms']:.1f} | {m['mb']:.1f} "
              f"| {m['gb_per_s']:.2f} | {m['overlapped']:.0f} / {m['layers']:.0f} "
              f"| {m['client_ttft_ms']:.1f} | {m['client_tpot_ms']:.2f} |")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=1)


if __name__ == "__main__":
    main()
