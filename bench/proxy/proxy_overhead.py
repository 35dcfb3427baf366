#!/usr/bin/python3
"""What pdserve-proxy adds to a request's latency.

Starts one colocated pdserve-decode node (a synthetic model, 2 layers by default) and a
pdserve-proxy with that node as its static decode node, then runs the same closed-loop
pdserve-bench-serving workload (streaming, short prompts and outputs) against the node directly
and through the proxy, alternating ROUNDS times so that drift in the machine's load hits both
alike. Prints TTFT and E2E p50/p99 of each path and their difference, and the proxy's own
routing histogram (arrival to the upstream request), and, per request, what the proxy added
according to its aligned timeline (proxy.request minus decode.request), as Markdown.

Usage: bench/proxy/proxy_overhead.py --build-dir build [--num-prompts 300] [--rounds 2]
       [--concurrency 1] [--output-len 4] [--input-len 16] [--out FILE.md]
Exit codes: 0 measured, 1 a run failed, 2 bad input (missing binaries).
"""
import argparse
import json
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

SOURCE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(SOURCE, "configs/models/qwen3-0.6b/config.json")


def start_on_port_zero(argv, log, env=None, timeout=120):
    """Starts a server with --port 0; returns (process, the URL it announces on stdout)."""
    process = subprocess.Popen(argv + ["--port", "0"], stdout=subprocess.PIPE, stderr=log, text=True, env=env)
    deadline = time.monotonic() + timeout
    for line in process.stdout:
        log.write(line)
        log.flush()
        match = re.search(r" on (http://[0-9.]+:[0-9]+)", line)
        if match:
            # Keep draining stdout so that the server never blocks on a full pipe.
            threading.Thread(target=lambda: [log.write(rest) for rest in process.stdout], daemon=True).start()
            return process, match.group(1)
        if time.monotonic() > deadline:
            break
    process.kill()
    raise RuntimeError(f"{argv[0]} did not announce its address")


def wait_healthy(url, process, timeout=120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{url}: the process exited with {process.returncode}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up within {timeout} s")


def histogram_quantiles(metrics_text, name, quantiles):
    """Upper bucket bounds holding each quantile of a Prometheus histogram (seconds)."""
    buckets = []
    for line in metrics_text.splitlines():
        if line.startswith(name + "_bucket{"):
            bound = line.split('le="', 1)[1].split('"', 1)[0]
            buckets.append((float("inf") if bound == "+Inf" else float(bound), float(line.rsplit(" ", 1)[1])))
    if not buckets or buckets[-1][1] == 0:
        return None, {}
    total = buckets[-1][1]
    return int(total), {q: next(bound for bound, count in buckets if count >= q * total) for q in quantiles}


def run_bench(binary, base_url, args, result):
    command = [binary, "--base-url", base_url, "--num-prompts", str(args.num_prompts), "--input-len",
               str(args.input_len), "--output-len", str(args.output_len), "--range-ratio", "0",
               "--max-concurrency", str(args.concurrency), "--seed", "11", "--result-json", result]
    completed = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if completed.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited {completed.returncode}: {completed.stderr[-500:]}")
    with open(result) as handle:
        return json.load(handle)


def merged_percentiles(runs, field):
    values = sorted(r[field] for run in runs for r in run["requests"] if r["success"])
    def pick(q):
        return values[min(len(values) - 1, int(q * len(values)))]
    return {"p50": pick(0.50), "p99": pick(0.99), "count": len(values)}


def span(timeline, name):
    return next((s for s in timeline["spans"] if s["name"] == name), None)


def timeline_overheads(runs):
    """Per request, from the proxy's aligned timeline: what the proxy added in total (its
    request span minus the decode node's) and before the node saw the request."""
    added, before = [], []
    for run in runs:
        for record in run["requests"]:
            timeline = record.get("timeline")
            if not record["success"] or not timeline:
                continue
            outer, inner = span(timeline, "proxy.request"), span(timeline, "decode.request")
            if outer and inner:
                added.append((outer["end_ms"] - outer["start_ms"]) - (inner["end_ms"] - inner["start_ms"]))
                before.append(inner["start_ms"] - outer["start_ms"])
    return added, before


def quantile(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--build-dir", default="build")
    parser.add_argument("--num-prompts", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--input-len", type=int, default=16)
    parser.add_argument("--output-len", type=int, default=4)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--out", help="also write the Markdown here")
    args = parser.parse_args()
    load_before = " ".join(f"{x:.2f}" for x in os.getloadavg())
    binaries = {name: os.path.join(args.build_dir, path) for name, path in (
        ("decode", "decode_node/pdserve-decode"), ("proxy", "proxy/pdserve-proxy"),
        ("bench", "bench/serving/pdserve-bench-serving"), ("make_model", "tools/make_model/pdserve-make-model"))}
    for path in binaries.values():
        if not os.access(path, os.X_OK):
            print(f"proxy_overhead: {path} is missing: build it first", file=sys.stderr)
            return 2

    with tempfile.TemporaryDirectory(prefix="pdserve-proxy-overhead-") as directory:
        model = os.path.join(directory, "model")
        subprocess.run([binaries["make_model"], "--config", CONFIG, "--layers", str(args.layers), "--out", model,
                        "--seed", "7"], check=True, stdout=subprocess.DEVNULL)
        log = open(os.path.join(directory, "processes.log"), "w")
        node, node_url = start_on_port_zero([binaries["decode"], "--model", model, "--threads", "1",
                                             "--kv-cache-memory-gib", "0.25"], log)
        proxy, proxy_url = start_on_port_zero([binaries["proxy"], "--decode", node_url], log,
                                              env=dict(os.environ, PDSERVE_CLUSTER_TOKEN=os.urandom(16).hex()))
        try:
            wait_healthy(node_url, node)
            wait_healthy(proxy_url, proxy)
            runs = {"direct": [], "proxy": []}
            for round_index in range(args.rounds):
                for path, url in (("direct", node_url), ("proxy", proxy_url)):
                    result = os.path.join(directory, f"{path}-{round_index}.json")
                    runs[path].append(run_bench(binaries["bench"], url, args, result))
            with urllib.request.urlopen(proxy_url + "/metrics", timeout=5) as response:
                proxy_metrics = response.read().decode()
        except RuntimeError as error:
            print(f"proxy_overhead: {error}", file=sys.stderr)
            return 1
        finally:
            for process in (proxy, node):
                process.send_signal(signal.SIGTERM)
                process.wait(timeout=30)

    lines = [f"- date: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}; machine: {platform.node()}, "
             f"{os.cpu_count()} cores, load average before/after {load_before} / "
             f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}",
             f"- command: {' '.join(sys.argv)}",
             f"- workload: {args.rounds} x {args.num_prompts} requests per path, closed loop at concurrency "
             f"{args.concurrency}, {args.input_len}-token prompts, {args.output_len} output tokens, streaming, "
             f"{args.layers}-layer synthetic Qwen3-0.6B-shaped model, 1 compute thread",
             "",
             "| metric | direct p50 | proxy p50 | +p50 | direct p99 | proxy p99 | +p99 |",
             "|---|---|---|---|---|---|---|"]
    for field in ("ttft_ms", "e2e_ms"):
        direct, proxied = merged_percentiles(runs["direct"], field), merged_percentiles(runs["proxy"], field)
        lines.append(f"| {field} | {direct['p50']:.2f} | {proxied['p50']:.2f} | {proxied['p50'] - direct['p50']:+.2f} "
                     f"| {direct['p99']:.2f} | {proxied['p99']:.2f} | {proxied['p99'] - direct['p99']:+.2f} |")
    added, before = timeline_overheads(runs["proxy"])
    if added:
        lines.append(f"- per request, from the timelines ({len(added)} requests): proxy.request - decode.request "
                     f"p50 {quantile(added, 0.5):.3f} ms, p99 {quantile(added, 0.99):.3f} ms, max {max(added):.3f} ms; "
                     f"proxy arrival -> decode arrival p50 {quantile(before, 0.5):.3f} ms, "
                     f"p99 {quantile(before, 0.99):.3f} ms")
    for name in ("pdserve:proxy_routing_seconds", "pdserve:proxy_time_to_first_byte_seconds"):
        count, quantiles = histogram_quantiles(proxy_metrics, name, (0.5, 0.99))
        if count:
            lines.append(f"- {name} ({count} observations): p50 <= {quantiles[0.5] * 1000:g} ms, "
                         f"p99 <= {quantiles[0.99] * 1000:g} ms (bucket upper bounds)")
    lines.append("- limit: proxy p99 overhead < 1 ms")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "a") as handle:
            handle.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
