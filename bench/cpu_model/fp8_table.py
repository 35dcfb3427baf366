#!/usr/bin/env python3
"""Issue #31 item 6 in one command: CPU decode and prefill with FP8 vs bf16 weights, and FP8 vs
bf16 KV at long context, against this machine's read roofline measured in the same run.

  bench/cpu_model/fp8_table.py [--build-dir build] [--config configs/models/qwen3-0.6b/config.json]

Three variants of the same synthetic checkpoint (seed 1; the FP8 one is pdserve-make-model --fp8
of the same weights, Qwen's block-FP8 layout), each run by pdserve-bench-cpu --json:
  A  bf16 weights, bf16 KV: prefill --prefill, decode at every --batches x (--contexts and
     --kv-contexts) point;
  B  FP8 weights,  bf16 KV: the same rows;
  C  FP8 weights,  FP8 KV (--kv-cache-dtype fp8): decode at every --batches x --kv-contexts point
     (the long contexts, where the KV is a large part of what a step reads), against B's.
Runs alternate A B C, then C B A, --repeats times; each variant's best run counts. The ceilings
(pdserve-bench-cpu: multithreaded read bandwidth and memcpy of 1 GiB, OpenBLAS sgemm on the
model's GEMMs, the vdpbf16ps peak) are measured before and after the runs; the best read
bandwidth is the roofline. A decode row's roofline is batch x bandwidth / bytes one step reads
(weights + that variant's KV); a prefill row is held against sgemm (compute-bound). The
1-minute load average is printed beside every figure: speed-ups that the load could explain are
not speed-ups.
Exit status: 0, or 2 on bad usage or a failed command.
"""
import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CONFIG_06B = os.path.join(ROOT, "configs", "models", "qwen3-0.6b", "config.json")
VARIANTS = {
    "A": {"label": "bf16 weights, bf16 KV", "fp8": False, "kv": "bfloat16"},
    "B": {"label": "FP8 weights, bf16 KV", "fp8": True, "kv": "bfloat16"},
    "C": {"label": "FP8 weights, FP8 KV", "fp8": True, "kv": "fp8"},
}


def fail(message):
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def load_average():
    return os.getloadavg()[0]


def bench(binary, argv):
    """pdserve-bench-cpu's JSON records, each with the load average around it."""
    load = load_average()
    done = subprocess.run([binary, *argv, "--json"], capture_output=True, text=True)
    if done.returncode != 0:
        fail(f"{' '.join([binary, *argv])} exited {done.returncode}: {done.stderr.strip()[-500:]}")
    load = max(load, load_average())
    records = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    for record in records:
        record["load"] = load
    return records


def csv_ints(text, name):
    try:
        values = [int(v) for v in text.split(",") if v != ""]
    except ValueError:
        values = []
    if not values or min(values) < 0:
        fail(f"{name} {text!r}: expected comma-separated non-negative integers")
    return values


def model_config(args):
    """The config to build the checkpoints from: --config, cut to --layers if given."""
    if args.layers is None:
        return os.path.abspath(args.config)
    with open(args.config, encoding="utf-8") as handle:
        config = json.load(handle)
    config["num_hidden_layers"] = args.layers
    path = os.path.join(args.work_dir, f"config-{args.layers}layers.json")
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(config, handle, indent=1)
    return path


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build-dir", default=os.environ.get("PDSERVE_BUILD_DIR", os.path.join(ROOT, "build")))
    parser.add_argument("--config", default=CONFIG_06B, help="Qwen3 config.json of the shape")
    parser.add_argument("--layers", type=int, help="cut the shape to this many layers (a quick try)")
    parser.add_argument("--work-dir", default="/tmp/pdserve-fp8-table", help="checkpoints and the report")
    parser.add_argument("--threads", type=int, default=0, help="0: all cores")
    parser.add_argument("--repeats", type=int, default=2, help="rounds of A B C / C B A")
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--contexts", default="0,512,2048", help="decode contexts of the weights rows")
    parser.add_argument("--kv-contexts", default="2048", help="decode contexts of the KV rows")
    parser.add_argument("--prefill", type=int, default=512, help="prompt length of the prefill row")
    parser.add_argument("--prefill-repeats", type=int, default=3, help="timed prefills per run (the best counts)")
    parser.add_argument("--decode-steps", type=int, default=32)
    parser.add_argument("--isa", default="auto")
    args = parser.parse_args()
    if (min(args.repeats, args.prefill, args.prefill_repeats, args.decode_steps) < 1 or args.threads < 0
            or (args.layers is not None and args.layers < 1)):
        fail("--repeats, --prefill, --prefill-repeats, --decode-steps and --layers must be positive, "
             "--threads non-negative")
    batches = csv_ints(args.batches, "--batches")
    contexts = sorted(csv_ints(args.contexts, "--contexts"))
    kv_contexts = sorted(csv_ints(args.kv_contexts, "--kv-contexts"))
    binary = os.path.join(args.build_dir, "bench", "cpu_model", "pdserve-bench-cpu")
    if not os.access(binary, os.X_OK):
        fail(f"{binary} is missing: build the pdserve-bench-cpu target")
    os.makedirs(args.work_dir, exist_ok=True)
    config = model_config(args)
    shape = os.path.basename(os.path.dirname(os.path.abspath(args.config)))
    if args.layers:
        shape += f"-{args.layers}layers"
    dirs = {fp8: os.path.join(args.work_dir, f"{shape}-{'fp8' if fp8 else 'bf16'}") for fp8 in (False, True)}
    common = ["--config", config, "--threads", str(args.threads), "--isa", args.isa,
              "--decode-steps", str(args.decode_steps)]

    def variant_argv(key):
        variant = VARIANTS[key]
        argv = [*common, "--model-dir", dirs[variant["fp8"]], "--kv-cache-dtype", variant["kv"], "--no-ceilings"]
        if variant["fp8"]:
            argv.append("--fp8")  # how to write the checkpoint if the folder has none
        if key == "C":
            points = [f"{b}:{c}" for c in kv_contexts for b in batches]
            return argv + ["--prefill", "none", "--decode", ",".join(points)]
        points = [f"{b}:{c}" for c in sorted(set(contexts + kv_contexts)) for b in batches]
        return argv + ["--prefill", str(args.prefill), "--prefill-repeats", str(args.prefill_repeats),
                       "--decode", ",".join(points)]

    # Each checkpoint written once, outside the timed runs.
    for fp8, folder in dirs.items():
        bench(binary, [*common, "--model-dir", folder, "--no-ceilings", "--prefill", "none", "--decode", "none",
                       *(["--fp8"] if fp8 else [])])
    started = time.strftime("%Y-%m-%d %H:%M %Z")
    ceilings = [next(r for r in bench(binary, [*common, "--model-dir", dirs[False], "--prefill", "none",
                                               "--decode", "none"]) if r["kind"] == "ceilings")]
    runs = []
    for repeat in range(args.repeats):
        for key in ("A", "B", "C") if repeat % 2 == 0 else ("C", "B", "A"):
            for record in bench(binary, variant_argv(key)):
                record.update(variant=key, repeat=repeat)
                runs.append(record)
                print(f"[{record['load']:.1f}] {key} {record['kind']} {record.get('batch', '')}:"
                      f"{record.get('context', record.get('tokens'))} {record['tok_s']:.2f} tok/s", file=sys.stderr)
    ceilings.append(next(r for r in bench(binary, [*common, "--model-dir", dirs[False], "--prefill", "none",
                                                   "--decode", "none"]) if r["kind"] == "ceilings"))
    text = render(runs, ceilings, args, shape, started, batches, contexts, kv_contexts)
    print(text)
    with open(os.path.join(args.work_dir, "fp8_table.md"), "w", encoding="utf-8") as handle:
        handle.write(text)
    with open(os.path.join(args.work_dir, "fp8_table.json"), "w", encoding="utf-8") as handle:
        json.dump({"ceilings": ceilings, "runs": runs}, handle, indent=1)
    return 0


def best(runs, key, kind, **match):
    chosen = [r for r in runs if r["variant"] == key and r["kind"] == kind
              and all(r.get(k) == v for k, v in match.items())]
    return max(chosen, key=lambda r: r["tok_s"]) if chosen else None


def render(runs, ceilings, args, shape, started, batches, contexts, kv_contexts):
    read_gbs = max(c["read_gbs"] for c in ceilings)
    sgemm = max(c["sgemm_gflops"] for c in ceilings)

    def figure(record):
        if record["kind"] == "decode":
            roofline = record["batch"] * read_gbs * 1e9 / record["step_bytes"]
            share = f"{100 * record['tok_s'] / roofline:.0f}% of {roofline:.1f}"
        else:
            share = f"{100 * record['linear_gflops'] / sgemm:.0f}% of sgemm"
        return f"{record['tok_s']:.2f} ({share}; load {record['load']:.1f})"

    def table(title, first, second, rows):
        header = f"| row | {VARIANTS[first]['label']} tok/s | {VARIANTS[second]['label']} tok/s | ratio |"
        lines = ["", title, "", header, "| --- | --- | --- | --- |"]
        for name, kind, match in rows:
            a, b = best(runs, first, kind, **match), best(runs, second, kind, **match)
            if a and b:
                lines.append(f"| {name} | {figure(a)} | {figure(b)} | {b['tok_s'] / a['tok_s']:.2f} |")
        return lines

    weight_rows = [(f"prefill {args.prefill}", "prefill", {"tokens": args.prefill})]
    weight_rows += [(f"decode batch {b}, context {c}", "decode", {"batch": b, "context": c})
                    for b in batches for c in sorted(set(contexts + kv_contexts))]
    kv_rows = [(f"decode batch {b}, context {c}", "decode", {"batch": b, "context": c})
               for b in batches for c in kv_contexts]
    isa = runs[0]["isa"] if runs else "?"
    lines = [f"FP8 vs bf16 on the CPU, {shape} shape, {started} to {time.strftime('%H:%M %Z')}, level {isa}, "
             f"{runs[0]['threads'] if runs else '?'} threads, best of {args.repeats} alternating runs "
             f"(A B C / C B A), {args.decode_steps} decode steps",
             "",
             "Ceilings before / after: read bandwidth " + " / ".join(f"{c['read_gbs']:.1f}" for c in ceilings)
             + " GB/s, memcpy " + " / ".join(f"{c['memcpy_gbs']:.1f}" for c in ceilings)
             + " GB/s, OpenBLAS sgemm " + " / ".join(f"{c['sgemm_gflops']:.0f}" for c in ceilings)
             + " GFLOP/s, vdpbf16ps peak " + " / ".join(f"{c['bf16_dot_peak_gflops']:.0f}" for c in ceilings)
             + " GFLOP/s (load " + " / ".join(f"{c['load']:.1f}" for c in ceilings) + ")",
             f"Each figure: tokens/s (its share of the roofline: decode, batch x {read_gbs:.1f} GB/s / the bytes a "
             "step reads, in tokens/s; prefill, its linear layers' GFLOP/s over sgemm's; 1-minute load average)"]
    lines += table("Weights (KV bf16):", "A", "B", weight_rows)
    lines += table("KV cache at long context (FP8 weights):", "B", "C", kv_rows)
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
