#!/usr/bin/python3
"""Draws a Grafana dashboard's time-series panels from a Prometheus, without Grafana: each
panel's PromQL (the dashboard's variables substituted) through /api/v1/query_range, one
subplot per panel with its title, in the dashboard's order.

    /usr/bin/python3 scripts/render_dashboard.py configs/grafana/pdserve.json \\
        http://127.0.0.1:9090 OUT.png --start UNIX --end UNIX [--step 1] \\
        [--rate-interval 10s] [--var model_name=NAME] [--var instance=REGEX]

A variable not given takes its default: a custom variable its current value, a query variable
(model_name, instance) the first value Prometheus has for it, "All" the regex ".*". Needs
Debian's python3-matplotlib (scripts/setup.sh installs it). tests/metrics/grafana_dashboard_test.py
uses the functions below to run every expression against a real Prometheus.
"""
import argparse
import json
import math
import re
import sys
import urllib.error
import urllib.parse
import urllib.request

# Grafana's own interval variables, and what they become here.
RATE_INTERVAL_VARIABLES = ("$__rate_interval", "${__rate_interval}")


def panels(dashboard):
    """[(title, unit, [(expr, legend)])] of the dashboard's panels with targets, rows left out."""
    found = []
    for panel in dashboard["panels"]:
        if panel.get("type") == "row":
            continue
        unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "")
        targets = [(t["expr"], t.get("legendFormat", "")) for t in panel.get("targets", [])]
        found.append((panel["title"], unit, targets))
    return found


def variables(dashboard):
    """The dashboard's templating variables, {name: variable}, in order."""
    return {v["name"]: v for v in dashboard.get("templating", {}).get("list", [])}


def substitute(text, values, rate_interval):
    """`text` with $name / ${name} replaced by values[name], and $__rate_interval by rate_interval.
    Raises ValueError naming a variable that has no value."""
    for variable in RATE_INTERVAL_VARIABLES:
        text = text.replace(variable, rate_interval)

    def value(match):
        name = match.group(1) or match.group(2)
        if name not in values:
            raise ValueError(f"no value for ${name} in {text}")
        return values[name]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", value, text)


def label_values_query(definition):
    """label_values(SELECTOR, LABEL) (Grafana's, not PromQL) as (PromQL whose series carry the
    label's values, the label)."""
    match = re.fullmatch(r"\s*label_values\((.*),\s*(\w+)\s*\)\s*", definition)
    if not match:
        raise ValueError(f"not label_values(selector, label): {definition}")
    return f"group by ({match.group(2)}) ({match.group(1)})", match.group(2)


def api(prometheus, path, params):
    """The `data` of a Prometheus API answer; ValueError with Prometheus' error (a PromQL syntax
    error is a 400 naming it)."""
    url = f"{prometheus}{path}?{urllib.parse.urlencode(params)}"
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            answer = json.load(response)
    except urllib.error.HTTPError as error:
        answer = json.loads(error.read() or b"{}")
    if answer.get("status") != "success":
        raise ValueError(f"{params.get('query')}: {answer.get('errorType')}: {answer.get('error')}")
    return answer["data"]


def query(prometheus, promql, at):
    """[(labels, value)] of the instant vector (or scalar) at unix time `at`."""
    data = api(prometheus, "/api/v1/query", {"query": promql, "time": f"{at:.3f}"})
    if data["resultType"] == "scalar":
        return [({}, float(data["result"][1]))]
    return [(item["metric"], float(item["value"][1])) for item in data["result"]]


def query_range(prometheus, promql, start, end, step):
    """[(labels, [(time, value)])] of the range query."""
    data = api(prometheus, "/api/v1/query_range",
               {"query": promql, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"})
    return [(item["metric"], [(float(t), float(v)) for t, v in item["values"]]) for item in data["result"]]


def default_values(dashboard, prometheus, at, given):
    """A value for every variable: `given`, else the custom variable's current value, else the
    query variable's first value at `at` (".*" for one that includes All)."""
    values = {"DS_PROMETHEUS": "prometheus", **given}
    for name, variable in variables(dashboard).items():
        if name in values:
            continue
        if variable["type"] == "custom":
            values[name] = variable["current"]["value"]
        elif variable["type"] == "query":
            if variable.get("includeAll"):
                values[name] = variable.get("allValue", ".*")
                continue
            promql, label = label_values_query(substitute(variable["definition"], values, "1m"))
            found = sorted(labels[label] for labels, _ in query(prometheus, promql, at))
            if not found:
                raise ValueError(f"${name}: {variable['definition']} has no values")
            values[name] = found[0]
    return values


def legend(fmt, labels, promql):
    if not fmt:
        return promql if len(promql) < 40 else promql[:37] + "..."
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt)


# Grafana units this dashboard uses: (divisor, axis label).
UNITS = {"s": (1e-3, "ms"), "percentunit": (0.01, "%"), "GBs": (1, "GB/s"), "reqps": (1, "req/s"),
         "short": (1, "")}


def render(dashboard, prometheus, out, start, end, step, rate_interval, values, columns=3):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = panels(dashboard)
    rows = math.ceil(len(shown) / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(5.2 * columns, 3.1 * rows), squeeze=False)
    for index, (title, unit, targets) in enumerate(shown):
        axis = axes[index // columns][index % columns]
        divisor, label = UNITS.get(unit, (1, unit))
        for expr, fmt in targets:
            promql = substitute(expr, values, rate_interval)
            for labels, points in query_range(prometheus, promql, start, end, step):
                xs = [t - start for t, v in points if math.isfinite(float(v))]
                ys = [float(v) / divisor for t, v in points if math.isfinite(float(v))]
                axis.plot(xs, ys, linewidth=1.2, label=substitute(legend(fmt, labels, promql), values, rate_interval))
        axis.set_title(title, fontsize=9)
        axis.set_ylabel(label, fontsize=8)
        axis.tick_params(labelsize=7)
        axis.grid(alpha=0.3)
        axis.set_xlim(0, end - start)
        axis.set_ylim(bottom=0)
        if axis.lines:
            axis.legend(fontsize=6.5, loc="upper left", framealpha=0.7)
        else:
            axis.text(0.5, 0.5, "no data", ha="center", va="center", transform=axis.transAxes)
    for index in range(len(shown), rows * columns):
        axes[index // columns][index % columns].axis("off")
    for axis in axes[-1]:
        axis.set_xlabel("seconds", fontsize=8)
    figure.suptitle(f"{dashboard['title']}: " + ", ".join(f"{k}={v}" for k, v in values.items() if k != "DS_PROMETHEUS")
                    + f"; rate interval {rate_interval}", fontsize=10)
    figure.tight_layout(rect=(0, 0, 1, 0.98))
    figure.savefig(out, dpi=72)
    plt.close(figure)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dashboard")
    parser.add_argument("prometheus", help="base URL, e.g. http://127.0.0.1:9090")
    parser.add_argument("out", help="the PNG to write")
    parser.add_argument("--start", type=float, required=True, help="unix seconds")
    parser.add_argument("--end", type=float, required=True, help="unix seconds")
    parser.add_argument("--step", type=float, default=1.0, help="seconds between points")
    parser.add_argument("--rate-interval", default="10s", help="what $__rate_interval becomes")
    parser.add_argument("--var", action="append", default=[], metavar="NAME=VALUE")
    args = parser.parse_args()
    with open(args.dashboard, encoding="utf-8") as handle:
        dashboard = json.load(handle)
    given = dict(item.split("=", 1) for item in args.var)
    try:
        values = default_values(dashboard, args.prometheus.rstrip("/"), args.end, given)
        render(dashboard, args.prometheus.rstrip("/"), args.out, args.start, args.end, args.step,
               args.rate_interval, values)
    except (ValueError, OSError) as error:
        sys.exit(f"render_dashboard.py: {error}")
    print(args.out)


if __name__ == "__main__":
    main()
