#!/usr/bin/python3
"""The Grafana dashboard (configs/grafana/pdserve.json) against real series: a real Prometheus
(Debian's, with configs/prometheus/prometheus.yml) scrapes a 1P1D cluster on the tiny model while
pdserve-bench-serving sends load through the proxy; then

- the dashboard's variable queries (label_values of model_name and instance) find the served
  model and both nodes;
- every panel target's PromQL, its variables substituted (the served model, instance All, each
  SLO variable's default and each of its options, $__rate_interval a window over the run), is
  valid (Prometheus parses it) and returns at least one series with a finite value;
- each node logs one line per finished request: the decode node's (TTFT, TPOT, e2e) and the
  prefill node's (prefill, KV transfer) for the same request ids.

With PDSERVE_DASHBOARD_PNG=PATH it also runs a longer load (three request rates) and draws the
dashboard's panels from that Prometheus into PATH with scripts/render_dashboard.py (Debian's
python3-matplotlib): how docs/figures/grafana_dashboard.png was made.

Environment: PDSERVE_BUILD_DIR, PDSERVE_SOURCE_DIR (set by CTest); the project's venv.
"""
import json
import math
import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.environ.get("PDSERVE_SOURCE_DIR", "."), "tests/python"))
sys.path.insert(0, os.path.join(os.environ.get("PDSERVE_SOURCE_DIR", "."), "scripts"))
import pdserve_testing as t  # noqa: E402
import pdserve_prometheus as p  # noqa: E402
import render_dashboard as dash  # noqa: E402

DASHBOARD = os.path.join(t.SOURCE, "configs/grafana/pdserve.json")
BENCH = os.path.join(t.BUILD, "bench/serving/pdserve-bench-serving")
PNG = os.environ.get("PDSERVE_DASHBOARD_PNG")
INPUT_LEN = 64
OUTPUT_LEN = 32
VOCAB = 1000  # prompt ids drawn from [0, VOCAB): any ids of the tiny model's vocabulary do
# (prompts, max concurrency, request rate or None for all at once) per benchmark run.
LOAD = [(48, 16, None)]
PICTURE_LOAD = [(40, 32, 2), (60, 32, 4), (90, 32, 8)]


def run_load(url, runs):
    """Runs the benchmark once per entry of `runs`; returns the requests completed."""
    completed = 0
    for index, (prompts, concurrency, rate) in enumerate(runs):
        result_json = os.path.join(t.work_dir(), f"bench{index}.json")
        argv = [BENCH, "--base-url", url, "--num-prompts", str(prompts), "--input-len", str(INPUT_LEN),
                "--output-len", str(OUTPUT_LEN), "--max-concurrency", str(concurrency),
                "--vocab-size", str(VOCAB), "--seed", str(11 + index), "--result-json", result_json]
        if rate is not None:
            argv += ["--request-rate", str(rate)]
        bench = subprocess.run(argv, capture_output=True, text=True, timeout=150)
        print(bench.stdout[-1500:])
        t.expect_equal(bench.returncode, 0, f"pdserve-bench-serving exit code ({bench.stderr[-2000:]})")
        with open(result_json, encoding="utf-8") as handle:
            result = json.load(handle)
        t.expect_equal(result["completed"], prompts, "requests the benchmark completed")
        completed += result["completed"]
    return completed


def main():
    p.require_prometheus()
    t.set_deadline(420 if PNG else 100)
    with open(DASHBOARD, encoding="utf-8") as handle:
        dashboard = json.load(handle)
    model = t.make_model()
    target = t.start_1p1d(model)
    decode_url = target.decode.match.group(2)
    prefill = target.processes[2]
    prefill_url = prefill.match.group(2)
    served = target.name
    prometheus = p.Prometheus([target.url, decode_url, prefill_url])

    # Every series exists at zero before the run: a rate over the run's window has a sample
    # before its first request.
    prometheus.wait_for_scrape_after(time.time(), "the cluster started")
    run_start = time.time()
    completed = run_load(target.url, PICTURE_LOAD if PNG else LOAD)
    run_end = time.time()
    t.wait_until(lambda: prometheus.scalar(f'sum(vllm:request_success_total{{model_name="{served}"}})') == completed,
                 10, "the last requests scraped")
    prometheus.wait_for_scrape_after(run_end, "the run")
    at = time.time()
    window = f"{math.ceil(at - run_start + 2 * p.SCRAPE_INTERVAL_S)}s"
    variables = dash.variables(dashboard)
    values = {"DS_PROMETHEUS": "prometheus", "model_name": served, "instance": variables["instance"]["allValue"]}
    slo_options = {name: [option["value"] for option in variable["options"]]
                   for name, variable in variables.items() if variable["type"] == "custom"}
    for name, options in slo_options.items():
        values[name] = variables[name]["current"]["value"]
        t.expect(values[name] in options, f"${name}'s default is one of its options")

    def variable_queries():
        found = {}
        for name in ("model_name", "instance"):
            promql, label = dash.label_values_query(dash.substitute(variables[name]["definition"], values, window))
            found[name] = sorted(labels[label] for labels, _ in prometheus.query(promql, at))
        t.expect_equal(found["model_name"], [served], "label_values(pdserve:node_info, model_name)")
        t.expect_equal(found["instance"], sorted([p.host_port(decode_url), p.host_port(prefill_url)]),
                       "the instances of the served model: its decode and prefill nodes")

    def every_target():
        checked = 0
        problems = []
        for title, _, targets in dash.panels(dashboard):
            for expr, legend in targets:
                # The SLO variables' defaults, then each of their other options.
                settings = [values] + [dict(values, **{name: option})
                                       for name, options in slo_options.items() if f"${name}" in expr
                                       for option in options if option != values[name]]
                for setting in settings:
                    promql = dash.substitute(expr, setting, window)
                    try:
                        series = dash.query(prometheus.url, promql, at)
                    except ValueError as error:
                        problems.append(f"{title} / {legend}: {error}")
                        continue
                    checked += 1
                    if not any(math.isfinite(value) for _, value in series):
                        problems.append(f"{title} / {legend}: {promql} returned "
                                        f"{'no series' if not series else 'no finite value: ' + str(series)}")
        print(f"{checked} queries of {sum(len(ts) for _, _, ts in dash.panels(dashboard))} panel targets")
        t.expect(not problems, "dashboard queries that failed:\n" + "\n".join(problems))

    def request_log_lines():
        decoded = re.findall(r"request (\S+) finished \(length\): prompt 64 tokens, output 32 tokens, "
                             r"TTFT \d+ ms, TPOT \d+ ms, e2e \d+ ms", target.decode.log())
        prefilled = re.findall(r"request (\S+) finished \(kv_sent\): prompt 64 tokens \(\d+ cached\), "
                               r"queue \d+ ms, prefill \d+ ms, KV transfer \d+ ms, [1-9]\d* bytes", prefill.log())
        t.expect_equal(len(decoded), completed, "the decode node's request lines")
        missing = sorted(set(decoded) - set(prefilled))
        t.expect(not missing and len(prefilled) == len(decoded),
                 f"the prefill node logged {len(prefilled)} of the {len(decoded)} requests "
                 f"(missing e.g. {missing[:3]})")

    checks = [
        ("the variable queries find the model and its nodes", variable_queries),
        ("every panel target is valid PromQL with a finite series", every_target),
        ("one log line per request on each node", request_log_lines),
    ]
    if PNG:
        def picture():
            subprocess.run(["/usr/bin/python3", os.path.join(t.SOURCE, "scripts/render_dashboard.py"), DASHBOARD,
                            prometheus.url, PNG, "--start", f"{run_start - 5:.3f}", "--end", f"{at:.3f}",
                            "--rate-interval", "5s", "--var", f"model_name={served}"], check=True, timeout=120)
            print(f"wrote {PNG} ({os.path.getsize(PNG)} bytes)")
        checks.append(("the dashboard drawn", picture))
    t.finish(t.run_checks(checks), target)


if __name__ == "__main__":
    main()
