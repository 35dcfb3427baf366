#!/usr/bin/python3
"""The cache-aware routing study of docs/PERF.md (issue #20): pdserve-bench-serving through a
2P2D cluster on the CPU backend, cache-aware (the proxy's default weights) against cache-unaware
(`--route-prefix-weight 0`, placement by load alone), and a load step with the autoscaler.

Usage: /usr/bin/python3 scripts/routing_study.py MODEL OUT_DIR [--repeats N] [--part routing|loadstep|plot|all]

  routing   For each repeat, each workload and each policy (the two policies alternate, the
            first one swapping every repeat): a fresh 2P2D cluster (cold caches), /metrics of
            every process scraped before and after the run, one pdserve-bench-serving JSON
            (OUT_DIR/routing/POLICY_WORKLOAD_rN.json) and a line of routing.jsonl: prefix
            hit rates (decode pool, prefill pool, and as the proxy routed), KV bytes the decode
            nodes received, prefill placements, TTFT/TPOT percentiles, goodput.
            Workloads: `multiturn` (chat conversations, each turn sending the history) and
            `sysprompt` (random token-id prompts after one shared 384-token prefix).
  loadstep  A 1P1D cluster with `pdserve-cluster --autoscale 1:2` under a low -> high -> low
            request rate (one bench run per phase, OUT_DIR/loadstep/PHASE.json), GET
            /cluster/advice sampled every second (loadstep/samples.jsonl: each pool's routed
            nodes, the recommendation), the launcher's autoscale decisions (loadstep/decisions.txt).
  plot      Figures of both (PNG and SVG) into OUT_DIR/figures, and the tables of docs/PERF.md
            on stdout.

Every process (the nodes, the proxy, the benchmark client) shares this machine's cores; the
load average is recorded with every run. Knobs (environment): BUILD_DIR (build).
Exit codes: 0 done, 1 a run failed, 2 bad arguments.
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request

SOURCE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.path.abspath(os.environ.get("BUILD_DIR", os.path.join(SOURCE, "build")))
TOKEN = "routing-study"
AUTH = {"Authorization": "Bearer " + TOKEN}
POLICIES = {"cache-aware": [], "cache-unaware": ["--route-prefix-weight", "0"]}
# Objectives for goodput and the advice, loose enough for a machine whose 2 cores serve every
# process of the cluster and other engineers' builds.
SLO_TTFT_MS, SLO_TPOT_MS = 2000, 300
SLO = ["--slo-ttft-ms", str(SLO_TTFT_MS), "--slo-tpot-ms", str(SLO_TPOT_MS)]
WORKLOADS = {
    # 8 conversations of 4 turns (32 requests): 48-word user messages, 16-token answers.
    "multiturn": ["--endpoint", "/v1/chat/completions", "--dataset-name", "multiturn", "--num-turns", "4",
                  "--num-prompts", "8", "--input-len", "48", "--output-len", "16", "--request-rate", "0.5",
                  "--max-concurrency", "4", "--seed", "20"],
    # 32 prompts: the same 384-token prefix, then 32 tokens of their own; 16-token answers.
    "sysprompt": ["--num-prompts", "32", "--shared-prefix-len", "384", "--input-len", "32",
                  "--output-len", "16", "--request-rate", "1", "--seed", "20"],
}
# Low -> high -> low: (phase, request rate, prompts).
PHASES = [("before", 0.5, 15), ("during", 2, 80), ("after", 0.5, 30)]
LOADSTEP_WORKLOAD = ["--input-len", "128", "--output-len", "32", "--range-ratio", "0.5"]


def http(url, headers=None, timeout=10):
    request = urllib.request.Request(url, headers=headers or {})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return response.read().decode()


def scrape(url):
    """{series: value} of a /metrics page (labels kept in the name)."""
    values = {}
    for line in http(url + "/metrics").splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


def total(scrapes, prefix):
    """Sum over processes of every series whose name starts with `prefix` (any labels)."""
    return sum(value for metrics in scrapes for name, value in metrics.items()
               if name == prefix or name.startswith(prefix + "{"))


def load_average():
    with open("/proc/loadavg") as handle:
        return [float(field) for field in handle.read().split()[:3]]


class Cluster:
    """tools/cluster/pdserve-cluster on a topology written to `directory`; every process on
    port 0 (the state file names their URLs)."""

    def __init__(self, topology, model, directory, name, extra=()):
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, f"topology-{name}.json")
        with open(path, "w") as handle:
            json.dump(topology, handle)
        self.state_file = os.path.join(directory, f"state-{name}.json")
        self.log = open(os.path.join(directory, f"launcher-{name}.log"), "w")
        self.process = subprocess.Popen(
            [os.path.join(SOURCE, "tools/cluster/pdserve-cluster"), path, "--model", model,
             "--build-dir", BUILD, "--ucx-tls", "tcp", "--log-dir", os.path.join(directory, f"logs-{name}"),
             "--state-file", self.state_file, *extra],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env=dict(os.environ, PDSERVE_CLUSTER_TOKEN=TOKEN))
        self.lines = []
        ready = threading.Event()

        def follow():
            for line in self.process.stdout:
                self.log.write(line)
                self.log.flush()
                self.lines.append((time.monotonic(), line.rstrip("\n")))
                if "ready" in line:
                    ready.set()
            ready.set()

        self.follower = threading.Thread(target=follow, daemon=True)
        self.follower.start()
        ready.wait(300)
        if self.process.poll() is not None or not os.path.exists(self.state_file):
            raise RuntimeError(f"the cluster did not start; see {directory}")
        with open(self.state_file) as handle:
            self.proxy = json.load(handle)["proxy"]["url"]

    def urls(self):
        """The proxy's and every node's URL, as the state file has them now."""
        with open(self.state_file) as handle:
            return {name: entry["url"] for name, entry in json.load(handle).items()}

    def stop(self):
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.follower.join(timeout=10)
        self.log.close()


def node_args(decode_kv_gib):
    return {"node_args": ["--threads", "1", "--max-model-len", "4096", "--heartbeat-interval-ms", "200",
                          "--kv-transfer-timeout-ms", "20000"],
            "prefill": [{"port": 0, "args": ["--kv-cache-memory-gib", "0.25"]}],
            "decode": [{"port": 0, "args": ["--kv-cache-memory-gib", str(decode_kv_gib)]}]}


def bench(proxy, args, result, label, log):
    command = [os.path.join(BUILD, "bench/serving/pdserve-bench-serving"), "--base-url", proxy,
               "--label", label, *SLO, *args, "--result-json", result]
    with open(log, "w") as handle:
        handle.write(" ".join(command) + "\n")
        handle.flush()
        code = subprocess.run(command, stdout=handle, stderr=subprocess.STDOUT).returncode
    if code not in (0, 1):  # 1: some requests failed, which the result records
        raise RuntimeError(f"pdserve-bench-serving exited {code}; see {log}")
    with open(result) as handle:
        return json.load(handle)


def routing(model, out, repeats):
    directory = os.path.join(out, "routing")
    os.makedirs(directory, exist_ok=True)
    records = open(os.path.join(out, "routing.jsonl"), "a")
    for repeat in range(repeats):
        order = list(POLICIES) if repeat % 2 == 0 else list(reversed(POLICIES))
        for workload, args in WORKLOADS.items():
            for policy in order:
                topology = node_args(0.25)
                topology["prefill"] *= 2
                topology["decode"] *= 2
                topology["proxy"] = {"port": 0, "args": ["--tokenizer", model, *POLICIES[policy]]}
                name = f"{policy}_{workload}_r{repeat}"
                load_before = load_average()
                cluster = Cluster(topology, model, os.path.join(directory, "logs"), name)
                try:
                    urls = cluster.urls()
                    before = {name_: scrape(url) for name_, url in urls.items()}
                    started = time.time()
                    result = bench(cluster.proxy, args, os.path.join(directory, name + ".json"),
                                   f"{policy} {workload}", os.path.join(directory, "logs", name + ".bench.txt"))
                    elapsed = time.time() - started
                    after = {name_: scrape(url) for name_, url in urls.items()}
                finally:
                    cluster.stop()
                record = summarize_routing(policy, workload, repeat, result, before, after)
                record.update(elapsed_s=elapsed, load_average_before=load_before, load_average_after=load_average())
                records.write(json.dumps(record) + "\n")
                records.flush()
                print(f"routing_study: {name}: {json.dumps(record)}", flush=True)
    records.close()


def summarize_routing(policy, workload, repeat, result, before, after):
    def delta(role, series):
        names = [name for name in after if name.startswith(role)]
        return (total([after[name] for name in names], series) -
                total([before[name] for name in names], series))

    record = {"policy": policy, "workload": workload, "repeat": repeat}
    for pool in ("decode", "prefill"):
        queries = delta(pool, "vllm:prefix_cache_queries_total")
        hits = delta(pool, "vllm:prefix_cache_hits_total")
        record[f"{pool}_prefix_queries"] = queries
        record[f"{pool}_prefix_hits"] = hits
        record[f"{pool}_hit_rate"] = hits / queries if queries else None
    queried = delta("proxy", 'pdserve:proxy_prefix_query_blocks_total{pool="decode"}')
    record["proxy_decode_hit_rate"] = (delta("proxy", 'pdserve:proxy_prefix_hit_blocks_total{pool="decode"}') / queried
                                       if queried else None)
    record["kv_bytes_received"] = delta("decode", "pdserve:kv_transfer_bytes_total")
    record["placements"] = {placement: delta("proxy", f'pdserve:proxy_prefill_placements_total{{placement="{placement}"}}')
                            for placement in ("remote", "local", "cached")}
    for key in ("completed", "failed", "good_requests", "goodput", "request_throughput", "duration_s"):
        record[key] = result[key]
    for metric in ("ttft_ms", "tpot_ms", "e2e_ms"):
        record[metric] = {key: result[metric][key] for key in ("p50", "p90", "p99", "mean")}
    record["total_input_tokens"] = result["total_input_tokens"]
    return record


def loadstep(model, out):
    directory = os.path.join(out, "loadstep")
    os.makedirs(directory, exist_ok=True)
    topology = node_args(0.25)
    topology["proxy"] = {"port": 0, "args": ["--tokenizer", model, "--advice-window-s", "20", *SLO]}
    cluster = Cluster(topology, model, os.path.join(directory, "logs"), "loadstep",
                      ["--autoscale", "1:2", "--autoscale-interval", "2", "--autoscale-up-polls", "2",
                       "--autoscale-down-polls", "5", "--autoscale-cooldown", "10"])
    start = time.monotonic()
    stopping = threading.Event()
    samples = open(os.path.join(directory, "samples.jsonl"), "w")

    def sample():
        while not stopping.is_set():
            try:
                advice = json.loads(http(cluster.proxy + "/cluster/advice", AUTH))
                samples.write(json.dumps({
                    "t_s": round(time.monotonic() - start, 2),
                    "load_average": load_average()[0],
                    "nodes": {pool: advice["load"][pool]["nodes"] for pool in ("prefill", "decode")},
                    "recommendation": advice["recommendation"],
                    "slo": advice["slo"],
                    "arrival_rate": advice["workload"].get("arrival_rate"),
                }) + "\n")
                samples.flush()
            except (OSError, ValueError, KeyError) as error:
                print(f"routing_study: advice sample failed: {error!r}", file=sys.stderr, flush=True)
            stopping.wait(1.0)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    phases = []
    try:
        for phase, rate, prompts in PHASES:
            began = time.monotonic() - start
            result = bench(cluster.proxy, [*LOADSTEP_WORKLOAD, "--num-prompts", str(prompts), "--request-rate", str(rate),
                                           "--seed", str(30 + len(phases))],
                           os.path.join(directory, phase + ".json"), phase, os.path.join(directory, "logs", phase + ".bench.txt"))
            phases.append({"phase": phase, "rate": rate, "start_s": round(began, 2),
                           "end_s": round(time.monotonic() - start, 2), "completed": result["completed"],
                           "failed": result["failed"], "good_requests": result["good_requests"],
                           "slo_attainment": result["good_requests"] / (result["completed"] + result["failed"]),
                           "ttft_ms": result["ttft_ms"], "tpot_ms": result["tpot_ms"],
                           "load_average": load_average()})
            print(f"routing_study: load step {phase}: {json.dumps(phases[-1])}", flush=True)
        time.sleep(40)  # the scale-down after the last phase
    finally:
        stopping.set()
        sampler.join(timeout=15)
        samples.close()
        cluster.stop()
    with open(os.path.join(directory, "decisions.txt"), "w") as handle:
        for when, line in cluster.lines:
            if "autoscale" in line:
                handle.write(f"{when - start:8.1f} s  {line}\n")
    with open(os.path.join(directory, "phases.json"), "w") as handle:
        json.dump(phases, handle, indent=1)


def mean(values):
    values = [value for value in values if value is not None]
    return sum(values) / len(values) if values else float("nan")


def read_jsonl(path):
    with open(path) as handle:
        return [json.loads(line) for line in handle if line.strip()]


def routing_table(records):
    print("| workload | policy | runs | decode prefix hit rate | prefill prefix hit rate | KV received (MiB) "
          "| placements remote / cached | TTFT p50 / p90 (ms) | TPOT p50 (ms) | goodput (req/s) | good / done |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for workload in WORKLOADS:
        for policy in POLICIES:
            runs = [r for r in records if r["workload"] == workload and r["policy"] == policy]
            if not runs:
                continue

            def each(key, scale=1.0, digits=0):
                return " / ".join(f"{r[key] * scale:.{digits}f}" if r[key] is not None else "-" for r in runs)

            ttft = " , ".join("%.0f / %.0f" % (r["ttft_ms"]["p50"], r["ttft_ms"]["p90"]) for r in runs)
            tpot = " / ".join("%.0f" % r["tpot_ms"]["p50"] for r in runs)
            good = " , ".join("%d/%d" % (r["good_requests"], r["completed"]) for r in runs)
            remote = mean([r["placements"]["remote"] for r in runs])
            cached = mean([r["placements"]["cached"] for r in runs])
            print(f"| {workload} | {policy} | {len(runs)} | {each('decode_hit_rate', 100)} % "
                  f"| {each('prefill_hit_rate', 100)} % | {each('kv_bytes_received', 2 ** -20, 1)} "
                  f"| {remote:.0f} / {cached:.0f} | {ttft} | {tpot} | {each('goodput', 1, 2)} | {good} |")
    print()


def plot(out):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("routing_study: plotting needs Debian's python3-matplotlib (run with /usr/bin/python3)", file=sys.stderr)
        return 1
    figures = os.path.join(out, "figures")
    os.makedirs(figures, exist_ok=True)
    written = []

    def save(figure, name):
        for extension in ("png", "svg"):
            path = os.path.join(figures, f"{name}.{extension}")
            figure.savefig(path, dpi=110, bbox_inches="tight")
            written.append(path)
        plt.close(figure)

    routing_file = os.path.join(out, "routing.jsonl")
    if os.path.exists(routing_file):
        records = read_jsonl(routing_file)
        routing_table(records)
        panels = [("decode prefix-cache hit rate (%)", lambda r: 100 * (r["decode_hit_rate"] or 0)),
                  ("KV received by decode nodes (MiB)", lambda r: r["kv_bytes_received"] / 2 ** 20),
                  ("TTFT p50 (ms)", lambda r: r["ttft_ms"]["p50"]),
                  ("TTFT p90 (ms)", lambda r: r["ttft_ms"]["p90"]),
                  (f"goodput (req/s, TTFT<={SLO_TTFT_MS} ms, TPOT<={SLO_TPOT_MS} ms)", lambda r: r["goodput"])]
        figure, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.6))
        colors = {"cache-aware": "tab:blue", "cache-unaware": "tab:orange"}
        for axis, (title, value) in zip(axes, panels):
            for w, workload in enumerate(WORKLOADS):
                for p, policy in enumerate(POLICIES):
                    values = [value(r) for r in records if r["workload"] == workload and r["policy"] == policy]
                    if not values:
                        continue
                    x = w + (p - 0.5) * 0.36
                    axis.bar(x, mean(values), width=0.34, color=colors[policy], alpha=0.55,
                             label=policy if w == 0 else None)
                    axis.plot([x] * len(values), values, "k.", markersize=5)
            axis.set_xticks(range(len(WORKLOADS)), list(WORKLOADS))
            axis.set_title(title, fontsize=9)
            axis.grid(axis="y", alpha=0.3)
        axes[0].legend(fontsize=8)
        figure.suptitle("2P2D on the CPU: cache-aware vs cache-unaware routing (bars: mean, dots: each run)", fontsize=10)
        save(figure, "routing_policies")

    samples_file = os.path.join(out, "loadstep", "samples.jsonl")
    phases_file = os.path.join(out, "loadstep", "phases.json")
    if os.path.exists(samples_file) and os.path.exists(phases_file):
        samples = read_jsonl(samples_file)
        with open(phases_file) as handle:
            phases = json.load(handle)
        print("| phase | rate (req/s) | from - to (s) | done / failed | SLO attainment | TTFT p50 / p90 (ms) "
              "| TPOT p50 / p90 (ms) | nodes P / D seen (min-max) |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- |")
        for phase in phases:
            inside = [s for s in samples if phase["start_s"] <= s["t_s"] <= phase["end_s"]]
            seen = {pool: (min(s["nodes"][pool] for s in inside), max(s["nodes"][pool] for s in inside))
                    for pool in ("prefill", "decode")} if inside else None
            print(f"| {phase['phase']} | {phase['rate']} | {phase['start_s']:.0f} - {phase['end_s']:.0f} "
                  f"| {phase['completed']} / {phase['failed']} | {100 * phase['slo_attainment']:.0f} % "
                  f"| {phase['ttft_ms']['p50']:.0f} / {phase['ttft_ms']['p90']:.0f} "
                  f"| {phase['tpot_ms']['p50']:.0f} / {phase['tpot_ms']['p90']:.0f} "
                  f"| {seen['prefill'][0]}-{seen['prefill'][1]} / {seen['decode'][0]}-{seen['decode'][1]} |"
                  if seen else "| - |")
        print()
        figure, (top, bottom) = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
        times = [s["t_s"] for s in samples]
        for pool, color in (("prefill", "tab:green"), ("decode", "tab:purple")):
            top.step(times, [s["nodes"][pool] for s in samples], where="post", color=color, label=f"{pool} nodes")
            top.step(times, [(s["recommendation"] or {}).get(f"{pool}_nodes") for s in samples], where="post",
                     color=color, linestyle=":", alpha=0.7, label=f"{pool} advice")
        most = max([s["nodes"][pool] for s in samples for pool in ("prefill", "decode")] +
                   [(s["recommendation"] or {}).get(f"{pool}_nodes") or 0 for s in samples for pool in ("prefill", "decode")])
        top.set_ylabel("nodes")
        top.set_ylim(0, most + 1.5)
        top.legend(fontsize=8, ncol=4, loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
        for phase in phases:
            for axis in (top, bottom):
                axis.axvspan(phase["start_s"], phase["end_s"], alpha=0.08 if phase["rate"] < 1 else 0.2, color="tab:red")
            top.text(phase["start_s"] + 1, most + 1, f"{phase['phase']}: {phase['rate']} req/s", fontsize=8)
            with open(os.path.join(out, "loadstep", phase["phase"] + ".json")) as handle:
                result = json.load(handle)
            done = [r for r in result["requests"] if r["success"]]
            starts = [phase["start_s"] + r["start_ms"] / 1000 for r in done]
            bottom.scatter(starts, [r["ttft_ms"] for r in done], s=6,
                           c=["tab:blue" if r["ttft_ms"] <= SLO_TTFT_MS else "tab:red" for r in done])
        bottom.axhline(SLO_TTFT_MS, color="k", linestyle="--", linewidth=0.8, label="TTFT SLO")
        bottom.set_yscale("log")
        bottom.set_ylabel("TTFT (ms), by send time")
        bottom.set_xlabel("time since the cluster was ready (s)")
        bottom.legend(fontsize=8)
        figure.suptitle("Load step on 1P1D with pdserve-cluster --autoscale 1:2 (CPU, 2 cores shared by every process)",
                        fontsize=10, y=1.02)
        save(figure, "loadstep_autoscale")
    for path in written:
        print(path)
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model")
    parser.add_argument("out")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--part", choices=("routing", "loadstep", "plot", "all"), default="all")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    if args.part != "plot" and not os.path.isfile(os.path.join(args.model, "config.json")):
        parser.error(f"{args.model} is not a model directory (no config.json)")
    os.makedirs(args.out, exist_ok=True)
    try:
        if args.part in ("routing", "all"):
            routing(args.model, args.out, args.repeats)
        if args.part in ("loadstep", "all"):
            loadstep(args.model, args.out)
    except (RuntimeError, OSError) as error:
        print(f"routing_study: {error}", file=sys.stderr)
        return 1
    if args.part in ("plot", "all"):
        return plot(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
