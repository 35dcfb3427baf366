#!/usr/bin/python3
"""Figures from pdserve-bench-serving --result-json files (docs/PLOTS.md).

    /usr/bin/python3 scripts/plot_bench.py OUT_DIR FILE.json...

Writes PNG and SVG into OUT_DIR:
  latency_cdf        TTFT, TPOT, ITL and E2E CDFs, one curve per file
  p90_vs_rate        TTFT p90 and TPOT p90 against request rate, one line per label
  goodput_vs_rate    goodput against request rate, one line per label
  waterfall_<file>   timeline spans of the --slowest N requests of each file that has timelines

Bad input (no files, a file that is not a benchmark result) prints the reason on stderr and
exits 2; a missing matplotlib (Debian: python3-matplotlib) exits 1.
"""

import argparse
import json
import math
import os
import sys
from dataclasses import dataclass, field

EXIT_BAD_INPUT = 2
EXIT_MISSING_DEPENDENCY = 1
UNLABELLED = "(no label)"


class BadInput(Exception):
    """A file that cannot be plotted; the message names the file and the field."""


@dataclass
class Timeline:
    index: int  # position of the request in the file
    ttft_ms: float
    e2e_ms: float
    spans: list  # (name, start_ms, end_ms), relative to the arrival at the proxy


@dataclass
class Run:
    path: str
    label: str  # the --label, or UNLABELLED
    name: str  # for legends: the label, or the file name when there is none
    rate: float  # offered requests/s; math.inf when all were sent at once
    slo_ttft_ms: float  # None when not set
    slo_tpot_ms: float
    ttft_p90: float
    tpot_p90: float
    goodput: float
    request_throughput: float  # completed requests/s
    ttft: list = field(default_factory=list)  # ms, over completed requests
    tpot: list = field(default_factory=list)
    itl: list = field(default_factory=list)
    e2e: list = field(default_factory=list)
    timelines: list = field(default_factory=list)


def is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def need(obj, key, where, check, expected):
    """obj[key] when check(obj[key]) holds; otherwise BadInput naming where.key."""
    if not isinstance(obj, dict) or key not in obj:
        raise BadInput(f"{where}: missing '{key}'")
    value = obj[key]
    if not check(value):
        raise BadInput(f"{where}.{key}: expected {expected}, got {json.dumps(value)[:80]}")
    return value


def number_or_null(value):
    return value is None or is_number(value)


def read_spans(timeline, where):
    """The spans of a server timeline: a list of spans, or an object with a "spans" list."""
    spans = timeline.get("spans") if isinstance(timeline, dict) else timeline
    if not isinstance(spans, list):
        raise BadInput(f"{where}: expected a list of spans or an object with \"spans\"")
    result = []
    for j, span in enumerate(spans):
        span_where = f"{where}.spans[{j}]"
        name = need(span, "name", span_where, lambda v: isinstance(v, str), "a string")
        start = need(span, "start_ms", span_where, is_number, "a number")
        end = need(span, "end_ms", span_where, is_number, "a number")
        if end < start:
            raise BadInput(f"{span_where}: end_ms {end} is before start_ms {start}")
        result.append((name, start, end))
    return result


def read_run(path):
    try:
        with open(path, encoding="utf-8") as file:
            data = json.load(file)
    except OSError as error:
        raise BadInput(f"{path}: cannot read: {error.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise BadInput(f"{path}: not JSON: {error}") from None
    if not isinstance(data, dict):
        raise BadInput(f"{path}: expected a JSON object (a pdserve-bench-serving --result-json)")

    label = data.get("label")
    if label is not None and not isinstance(label, str):
        raise BadInput(f"{path}: label: expected a string or null")
    config = need(data, "config", path, lambda v: isinstance(v, dict), "an object")
    rate = need(config, "request_rate", f"{path}: config", number_or_null, "a number or null")
    slo = need(data, "slo", path, lambda v: isinstance(v, dict), "an object")

    def summary(key):
        return need(data, key, path, lambda v: isinstance(v, dict), "an object")

    run = Run(
        path=path,
        label=label or UNLABELLED,
        name=label or os.path.basename(path),
        rate=math.inf if rate is None else rate,
        slo_ttft_ms=need(slo, "ttft_ms", f"{path}: slo", number_or_null, "a number or null"),
        slo_tpot_ms=need(slo, "tpot_ms", f"{path}: slo", number_or_null, "a number or null"),
        ttft_p90=need(summary("ttft_ms"), "p90", f"{path}: ttft_ms", is_number, "a number"),
        tpot_p90=need(summary("tpot_ms"), "p90", f"{path}: tpot_ms", is_number, "a number"),
        goodput=need(data, "goodput", path, is_number, "a number"),
        request_throughput=need(data, "request_throughput", path, is_number, "a number"),
    )

    requests = need(data, "requests", path, lambda v: isinstance(v, list), "a list")
    for i, record in enumerate(requests):
        where = f"{path}: requests[{i}]"
        if not isinstance(record, dict):
            raise BadInput(f"{where}: expected an object")
        success = need(record, "success", where, lambda v: isinstance(v, bool), "true or false")
        need(record, "start_ms", where, is_number, "a number")
        tokens = need(record, "output_tokens", where,
                      lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer")
        ttft = need(record, "ttft_ms", where, is_number, "a number")
        e2e = need(record, "e2e_ms", where, is_number, "a number")
        itl = need(record, "itl_ms", where,
                   lambda v: isinstance(v, list) and all(map(is_number, v)), "a list of numbers")
        if not success:
            continue
        run.ttft.append(ttft)
        run.e2e.append(e2e)
        run.itl.extend(itl)
        if tokens > 1:  # TPOT = (E2E - TTFT) / (output tokens - 1), as the benchmark defines it
            run.tpot.append((e2e - ttft) / (tokens - 1))
        if record.get("timeline") is not None:
            spans = read_spans(record["timeline"], f"{where}.timeline")
            run.timelines.append(Timeline(i, ttft, e2e, spans))
    if not run.ttft:
        raise BadInput(f"{path}: no completed request to plot")
    return run


def note(message):
    print(f"note: {message}")


def save(figure, out_dir, stem):
    for extension in ("png", "svg"):
        path = os.path.join(out_dir, f"{stem}.{extension}")
        # No date in the metadata: the same input gives the same files. A tight box keeps the
        # legends placed outside the axes.
        figure.savefig(path, metadata={"Date": None}, bbox_inches="tight")
        print(path)


def rate_text(rate):
    return "all at once" if math.isinf(rate) else f"{rate:g} req/s"


@dataclass
class Slo:
    """The objectives every file shares (None: not set, or the files differ)."""
    ttft_ms: float
    tpot_ms: float


def shared_slo(runs):
    def shared(attribute, name):
        values = {getattr(run, attribute) for run in runs}
        if len(values) > 1:
            note(f"the files have different {name} objectives {sorted(values, key=str)}; "
                 "no objective line drawn")
            return None
        return values.pop()

    return Slo(shared("slo_ttft_ms", "TTFT"), shared("slo_tpot_ms", "TPOT"))


@dataclass
class Style:
    """One color per label, the same in every figure; within a label, one line style per rate."""
    colors: dict
    dashes: dict  # run path -> line style

    @staticmethod
    def of(plt, runs):
        colors, dashes, rank = {}, {}, {}
        for run in runs:  # sorted by label, then rate
            colors.setdefault(run.label, plt.get_cmap("tab10")(len(colors) % 10))
            dashes[run.path] = ["-", "--", ":", "-."][rank.get(run.label, 0) % 4]
            rank[run.label] = rank.get(run.label, 0) + 1
        return Style(colors, dashes)


SLO_LINE = {"color": "black", "linestyle": (0, (1, 2)), "linewidth": 1.2}


def plot_cdfs(plt, runs, slo, style, out_dir):
    figure, axes = plt.subplots(2, 2, figsize=(10, 7), layout="constrained")
    panels = [("ttft", "TTFT", slo.ttft_ms, "requests"), ("tpot", "TPOT", slo.tpot_ms, "requests"),
              ("itl", "ITL", None, "token gaps"), ("e2e", "E2E latency", None, "requests")]
    for axis, (attribute, title, objective, unit) in zip(axes.flat, panels):
        every_value = []
        for run in runs:
            values = sorted(getattr(run, attribute))
            if not values:
                continue
            every_value.extend(values)
            # Starts at 0 on the smallest value, steps up 1/n at each value.
            fractions = [k / len(values) for k in range(len(values) + 1)]
            axis.step([values[0]] + values, fractions, where="post",
                      color=style.colors[run.label], linestyle=style.dashes[run.path],
                      label=f"{run.name} @ {rate_text(run.rate)}")
        # Latencies under load span decades: a log axis keeps the fast runs readable.
        if every_value and min(every_value) > 0 and max(every_value) / min(every_value) > 50:
            axis.set_xscale("log")
        axis.set_title(f"{title} CDF")
        if objective is not None:
            axis.axvline(objective, **SLO_LINE)
            axis.set_title(f"{title} CDF (dotted: SLO {objective:g} ms)")
        axis.set_xlabel(f"{title} (ms)")
        axis.set_ylabel(f"fraction of {unit}")
        axis.set_ylim(0, 1.02)
        axis.grid(True, alpha=0.3)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0), ncol=2,
                  fontsize="small")
    save(figure, out_dir, "latency_cdf")
    plt.close(figure)


def runs_by_label(runs):
    """{label: runs sorted by rate}, leaving out (with a note) runs with no finite rate."""
    groups = {}
    for run in runs:
        if math.isinf(run.rate):
            note(f"{run.path}: request rate inf (all at once); left out of the rate plots")
            continue
        groups.setdefault(run.label, []).append(run)
    for label, group in groups.items():
        group.sort(key=lambda run: run.rate)
        rates = [run.rate for run in group]
        if len(set(rates)) < len(rates):
            note(f"label '{label}' has several files at the same rate; each is a point")
    return groups


def plot_p90_against_rate(plt, groups, slo, style, out_dir):
    figure, axes = plt.subplots(1, 2, figsize=(10, 4), layout="constrained")
    panels = [("ttft_p90", "TTFT p90", slo.ttft_ms), ("tpot_p90", "TPOT p90", slo.tpot_ms)]
    for axis, (attribute, title, objective) in zip(axes, panels):
        for label, group in groups.items():
            axis.plot([run.rate for run in group], [getattr(run, attribute) for run in group],
                      marker="o", color=style.colors[label], label=label)
        if objective is not None:
            axis.axhline(objective, **SLO_LINE, label=f"SLO {objective:g} ms")
        axis.set_title(f"{title} against request rate")
        axis.set_xlabel("request rate (req/s)")
        axis.set_ylabel(f"{title} (ms)")
        axis.set_ylim(bottom=0)
        axis.grid(True, alpha=0.3)
        axis.legend(fontsize="small")
    save(figure, out_dir, "p90_vs_rate")
    plt.close(figure)


def plot_goodput_against_rate(plt, groups, slo, style, out_dir):
    figure, axis = plt.subplots(figsize=(9, 4.5), layout="constrained")
    highest = 0
    for label, group in groups.items():
        rates = [run.rate for run in group]
        highest = max(highest, max(rates))
        axis.plot(rates, [run.goodput for run in group], marker="o", color=style.colors[label],
                  label=f"{label}: goodput")
        # The gap down from throughput is the completed requests that missed an objective.
        axis.plot(rates, [run.request_throughput for run in group], marker=".",
                  color=style.colors[label], linestyle="--", linewidth=1,
                  label=f"{label}: throughput")
    # Goodput cannot exceed the offered load for long: the diagonal is the ideal.
    axis.plot([0, highest], [0, highest], color="grey", linestyle=":", label="offered rate")
    objectives = [f"TTFT <= {slo.ttft_ms:g} ms" if slo.ttft_ms else "",
                  f"TPOT <= {slo.tpot_ms:g} ms" if slo.tpot_ms else ""]
    objectives = " and ".join(text for text in objectives if text)
    axis.set_title("Goodput against request rate\n" + (
        f"(completed with {objectives})" if objectives else "(no SLO: every completed request)"))
    axis.set_xlabel("request rate (req/s)")
    axis.set_ylabel("requests/s")
    axis.set_xlim(left=0)
    axis.set_ylim(bottom=0)
    axis.grid(True, alpha=0.3)
    axis.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1))
    save(figure, out_dir, "goodput_vs_rate")
    plt.close(figure)


def plot_waterfall(plt, run, slowest, out_dir, stem):
    shown = sorted(run.timelines, key=lambda timeline: timeline.e2e_ms, reverse=True)[:slowest]
    names = []  # every span name, in order of first appearance: one lane each
    for timeline in shown:
        for name, _, _ in timeline.spans:
            if name not in names:
                names.append(name)
    colors = {name: plt.get_cmap("tab20")(k % 20) for k, name in enumerate(names)}  # 11 span names
    lane = 0.8 / len(names) if names else 0.8
    figure, axis = plt.subplots(figsize=(10, 1.2 + 0.45 * len(shown)), layout="constrained")
    for row, timeline in enumerate(shown):  # the slowest request on top
        top = len(shown) - 1 - row + 0.4
        for name, start, end in timeline.spans:
            lane_top = top - names.index(name) * lane
            axis.broken_barh([(start, end - start)], (lane_top - lane, lane), color=colors[name])
        axis.plot([timeline.ttft_ms], [top - 0.4], marker="v", color="black", linestyle="none")
        axis.plot([timeline.e2e_ms], [top - 0.4], marker="|", color="black", markersize=14,
                  linestyle="none")
    axis.set_yticks([len(shown) - 1 - row for row in range(len(shown))])
    axis.set_yticklabels([f"request {timeline.index}" for timeline in shown])
    handles = [plt.Rectangle((0, 0), 1, 1, color=colors[name]) for name in names]
    handles += [plt.Line2D([], [], marker="v", color="black", linestyle="none"),
                plt.Line2D([], [], marker="|", color="black", markersize=14, linestyle="none")]
    axis.legend(handles, names + ["TTFT at the client", "E2E at the client"], fontsize="small",
                loc="upper left", bbox_to_anchor=(1.01, 1))
    axis.set_xlabel("ms since the request reached the proxy")
    axis.set_xlim(left=0)
    axis.set_title(f"{run.name} @ {rate_text(run.rate)}: the {len(shown)} slowest requests")
    axis.grid(True, axis="x", alpha=0.3)
    save(figure, out_dir, stem)
    plt.close(figure)


def waterfall_stems(runs):
    """waterfall_<file name>, made unique when two files share a name."""
    stems, used = [], set()
    for run in runs:
        base = "waterfall_" + os.path.splitext(os.path.basename(run.path))[0]
        stem, k = base, 2
        while stem in used:
            stem, k = f"{base}_{k}", k + 1
        used.add(stem)
        stems.append(stem)
    return stems


def main(argv):
    parser = argparse.ArgumentParser(
        description="Figures (PNG and SVG) from pdserve-bench-serving --result-json files.")
    parser.add_argument("out_dir", metavar="OUT_DIR", help="where the figures go (created)")
    parser.add_argument("files", metavar="FILE.json", nargs="+", help="benchmark results")
    parser.add_argument("--slowest", type=int, default=10, metavar="N",
                        help="requests in each waterfall (default 10)")
    args = parser.parse_args(argv)  # exits 2 on bad arguments
    if args.slowest < 1:
        parser.error("--slowest must be at least 1")
    try:
        runs = [read_run(path) for path in args.files]
    except BadInput as error:
        print(f"plot_bench.py: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot_bench.py: matplotlib is missing: apt-get install python3-matplotlib "
              "(scripts/setup.sh installs it)", file=sys.stderr)
        return EXIT_MISSING_DEPENDENCY
    # Text stays text in the SVGs (searchable, smaller); fixed ids make the output reproducible.
    plt.rcParams.update({"svg.fonttype": "none", "svg.hashsalt": "pdserve", "figure.dpi": 100})
    try:
        os.makedirs(args.out_dir, exist_ok=True)
    except OSError as error:
        print(f"plot_bench.py: cannot create {args.out_dir}: {error.strerror}", file=sys.stderr)
        return EXIT_BAD_INPUT

    runs.sort(key=lambda run: (run.label, run.rate))
    slo, style = shared_slo(runs), Style.of(plt, runs)
    plot_cdfs(plt, runs, slo, style, args.out_dir)
    groups = runs_by_label(runs)
    if groups:
        plot_p90_against_rate(plt, groups, slo, style, args.out_dir)
        plot_goodput_against_rate(plt, groups, slo, style, args.out_dir)
    else:
        note("no file has a finite request rate; no rate plots")
    for run, stem in zip(runs, waterfall_stems(runs)):
        if run.timelines:
            plot_waterfall(plt, run, args.slowest, args.out_dir, stem)
        else:
            note(f"{run.path}: no request has a timeline (usage.pdserve_timeline); no waterfall")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
