#!/usr/bin/env python3
"""pdserve's CPU backend against llama.cpp on this machine, both engines run alternately in one
run (issue #18). Run it through bench/peer/run.sh, which builds what it needs; this script runs
in the peer venv (llama-cpp-python, gguf).

What it does:
  1. writes the synthetic Qwen3-0.6B-shape checkpoint (pdserve-make-model, bf16, seed 1) and a
     float32 one for the agreement check, and converts both to GGUF (gguf_from_safetensors.py);
  2. measures this machine's ceilings (pdserve-bench-cpu: multithreaded read bandwidth,
     OpenBLAS sgemm on the model's GEMMs, the vdpbf16ps peak), before and after the rows;
  3. runs every row (prefill 512/2048, decode batch 1 at context 0/512/2048, decode batch 8 at
     context 512) with llama.cpp (llama-bench, llama-batched-bench) and pdserve
     (pdserve-bench-cpu) alternately, --repeats times, engine order swapped every repeat, and
     keeps each engine's best; the 1-minute load average is recorded beside every figure;
  4. checks that both engines' greedy tokens agree for 32 tokens on the float32 checkpoint
     (llama-cpp-python; pdserve-generate), KV caches in float32 on both sides;
  5. with --serving: pdserve-decode against llama-server under pdserve-bench-serving at 1, 8
     and 32 concurrent streams, servers alternating.
--weights fp8 (issue #31): pdserve reads the FP8 checkpoint of the same seed (pdserve-make-model
--fp8: Qwen's block-FP8 layout) and llama.cpp a Q8_0 GGUF of the same bf16 weights, its closest
format (gguf_from_safetensors.py --outtype q8_0: the same projections quantized, embeddings and
lm_head bf16 on both sides).
It prints markdown tables (and writes them with the raw measurements to --out).
Exit status: 0, or 1 when the greedy tokens disagree, 2 on bad usage or a failed command.
"""
import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CONFIG_06B = os.path.join(ROOT, "configs", "models", "qwen3-0.6b", "config.json")
TOKENIZER_DIR = os.path.join(ROOT, "configs", "models", "qwen3-tokenizer")

ROWS = [
    {"name": "prefill, 512-token prompt", "kind": "prefill", "tokens": 512},
    {"name": "prefill, 2048-token prompt", "kind": "prefill", "tokens": 2048},
    {"name": "decode, batch 1, context 0", "kind": "decode", "batch": 1, "context": 0},
    {"name": "decode, batch 1, context 512", "kind": "decode", "batch": 1, "context": 512},
    {"name": "decode, batch 1, context 2048", "kind": "decode", "batch": 1, "context": 2048},
    {"name": "decode, batch 8, context 512", "kind": "decode", "batch": 8, "context": 512},
]
DECODE_TOKENS = 32
# What each engine reads for --weights (the decoder projections; embeddings and lm_head stay bf16).
WEIGHTS = {"bf16": {"pdserve": "bf16", "llama.cpp": "BF16"},
           "fp8": {"pdserve": "FP8 E4M3, 128x128 block scales", "llama.cpp": "Q8_0"}}


def fail(message):
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def load_average():
    return os.getloadavg()[0]


def log(message):
    print(f"[{time.strftime('%H:%M:%S')} load {load_average():.2f}] {message}", file=sys.stderr, flush=True)


def run(cmd, timeout, env=None):
    log("$ " + " ".join(cmd))
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        fail(f"{cmd[0]} did not finish within {timeout} s")
    if done.returncode != 0:
        fail(f"{' '.join(cmd)} exited with {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    return done.stdout


def json_lines(text):
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


class Tools:
    """The binaries of both engines, each checked when first used."""

    PDSERVE = {
        "bench_cpu": "bench/cpu_model/pdserve-bench-cpu",
        "make_model": "tools/make_model/pdserve-make-model",
        "generate": "tools/generate/pdserve-generate",
        "decode": "decode_node/pdserve-decode",
        "bench_serving": "bench/serving/pdserve-bench-serving",
    }
    LLAMA = {"llama_bench": "llama-bench", "batched_bench": "llama-batched-bench", "llama_server": "llama-server"}

    def __init__(self, args):
        self.build = os.path.abspath(args.build_dir)
        self.llama_bin = os.path.abspath(args.llama_bin) if args.llama_bin else None
        self.threads = args.threads
        # llama.cpp's weight repacking (its "extra buffer types": AMX tiles for Q8_0 on CPUs that
        # advertise AMX) off, for hosts that advertise AMX but do not grant its tile state (a VM:
        # SIGILL at tilezero). Applied to every llama.cpp run of the benchmark, so rows compare alike.
        self.no_repack = args.llama_no_repack

    def __getattr__(self, key):
        if key in self.PDSERVE:
            path = os.path.join(self.build, self.PDSERVE[key])
            hint = "build it first (bench/peer/run.sh does)"
        elif key in self.LLAMA and self.llama_bin:
            path = os.path.join(self.llama_bin, self.LLAMA[key])
            hint = "bench/peer/setup_peer.sh builds it"
        else:
            raise AttributeError(key)
        if not os.access(path, os.X_OK):
            fail(f"{path} is missing: {hint}")
        return path


def make_model(tools, config, out, dtype, layers=None, fp8=False):
    """A synthetic checkpoint (pdserve-make-model, seed 1) and its GGUF of the same dtype; with
    `fp8`, its FP8 twin (`out`-fp8, --fp8: quantized from the same weights) for pdserve and a
    Q8_0 GGUF of `out` for llama.cpp. Returns (pdserve's checkpoint, llama.cpp's GGUF)."""
    folders = [(out, [])] + ([(out + "-fp8", ["--fp8"])] if fp8 else [])
    for folder, flags in folders:
        if not os.path.exists(os.path.join(folder, "config.json")):
            extra = ["--layers", str(layers)] if layers else []
            run([tools.make_model, "--config", config, "--out", folder, "--seed", "1", "--dtype", dtype,
                 "--tokenizer-dir", TOKENIZER_DIR] + extra + flags, timeout=1800)
    converter = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gguf_from_safetensors.py")
    outtype = "q8_0" if fp8 else "bf16" if dtype == "bfloat16" else "f32"
    gguf_path = f"{out}-{outtype}.gguf"
    if not os.path.exists(gguf_path):
        run([sys.executable, converter, out, gguf_path + ".tmp", "--outtype", outtype], timeout=1800)
        os.replace(gguf_path + ".tmp", gguf_path)
    return folders[-1][0], gguf_path


def measure_ceilings(tools, model_dir):
    out = run([tools.bench_cpu, "--model-dir", model_dir, "--threads", str(tools.threads), "--prefill", "none",
               "--decode", "none", "--json"], timeout=1800)
    for record in json_lines(out):
        if record["kind"] == "ceilings":
            record["load"] = load_average()
            return record
    fail("pdserve-bench-cpu printed no ceilings")


def pdserve_row(tools, model_dir, row):
    cmd = [tools.bench_cpu, "--model-dir", model_dir, "--threads", str(tools.threads), "--no-ceilings", "--json",
           "--decode-steps", str(DECODE_TOKENS)]
    if row["kind"] == "prefill":
        cmd += ["--prefill", str(row["tokens"]), "--decode", "none", "--prefill-repeats", "3"]
    else:
        cmd += ["--prefill", "none", "--decode", f"{row['batch']}:{row['context']}"]
    load = load_average()
    record = json_lines(run(cmd, timeout=3600))[-1]
    return {"tok_s": record["tok_s"], "load": max(load, load_average()), "raw": record}


def llama_row(tools, gguf_path, row):
    load = load_average()
    if row["kind"] == "decode" and row["batch"] > 1:
        context = row["batch"] * (row["context"] + DECODE_TOKENS) + 64
        out = run([tools.batched_bench, "-m", gguf_path, "-t", str(tools.threads), "-c", str(context),
                   "-b", "2048", "-ub", "512", "-npp", str(row["context"]), "-ntg", str(DECODE_TOKENS),
                   "-npl", str(row["batch"]), "--output-format", "jsonl"]
                  + (["--no-repack"] if tools.no_repack else []), timeout=3600)
        record = json_lines(out)[-1]
        tok_s = record["speed_tg"]
    else:
        if row["kind"] == "prefill":
            shape = ["-p", str(row["tokens"]), "-n", "0"]
        else:
            shape = ["-p", "0", "-n", str(DECODE_TOKENS), "-d", str(row["context"])]
        out = run([tools.llama_bench, "-m", gguf_path, "-t", str(tools.threads), "-r", "3", "-o", "jsonl"] + shape
                  + (["--repack", "0"] if tools.no_repack else []),
                  timeout=3600)
        record = json_lines(out)[-1]
        tok_s = max(record["samples_ts"])  # the best repetition, as pdserve's best
    return {"tok_s": tok_s, "load": max(load, load_average()), "raw": record}


def check_agreement(tools, f32_dir, f32_gguf, tokens=32):
    """Greedy tokens of both engines on the float32 checkpoint; returns (ours, theirs)."""
    prompt = [(i * 7919 + 13) % 150000 for i in range(24)]
    out = run([tools.generate, "--model", f32_dir, "--prompt-ids", ",".join(map(str, prompt)),
               "--max-new-tokens", str(tokens), "--temperature", "0", "--ignore-eos", "--print-ids",
               "--kv-cache-dtype", "float32", "--threads", str(tools.threads)], timeout=1800)
    ours = json.loads(out.strip().splitlines()[-1])
    from llama_cpp import Llama, GGML_TYPE_F32  # the peer venv's llama-cpp-python

    log(f"llama-cpp-python greedy on {f32_gguf}")
    llm = Llama(model_path=f32_gguf, n_ctx=256, n_threads=tools.threads, n_batch=256, type_k=GGML_TYPE_F32,
                type_v=GGML_TYPE_F32, verbose=False)
    theirs = []
    for token in llm.generate(prompt, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0):
        theirs.append(int(token))
        if len(theirs) == tokens:
            break
    return ours, theirs


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_ready(url, process, timeout=600):
    import urllib.request

    deadline = time.time() + timeout
    while time.time() < deadline:
        if process.poll() is not None:
            fail(f"server exited with {process.returncode} before it was ready ({url})")
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                if response.status == 200:
                    return
        except Exception:  # not listening yet
            pass
        time.sleep(1)
    fail(f"{url} not ready within {timeout} s")


def stop(process):
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def serving(tools, model_dir, gguf_path, work, args):
    """Item 4: the same streaming workload against each server, servers alternating."""
    results = []
    levels = [int(c) for c in args.concurrency.split(",")]
    context = max(levels) * (args.input_len + args.output_len) + 256
    for repeat in range(args.serving_repeats):
        order = ["pdserve", "llama.cpp"] if repeat % 2 == 0 else ["llama.cpp", "pdserve"]
        for engine in order:
            port = free_port()
            log_path = os.path.join(work, f"{engine}-server-{repeat}.log")
            if engine == "pdserve":
                cmd = [tools.decode, "--model", model_dir, "--port", str(port), "--threads", str(tools.threads)]
                ready = f"http://127.0.0.1:{port}/health"
            else:
                cmd = [tools.llama_server, "-m", gguf_path, "--port", str(port), "-t", str(tools.threads),
                       "-np", str(max(levels)), "-c", str(context), "--no-webui"]
                cmd += ["--no-repack"] if tools.no_repack else []
                ready = f"http://127.0.0.1:{port}/health"
            log("$ " + " ".join(cmd))
            with open(log_path, "w") as server_log:
                process = subprocess.Popen(cmd, stdout=server_log, stderr=subprocess.STDOUT)
            try:
                wait_ready(ready, process)
                for level in levels:
                    result_json = os.path.join(work, f"serving-{engine}-c{level}-r{repeat}.json")
                    prompts = max(level * args.waves, 2)
                    load = load_average()
                    run([tools.bench_serving, "--base-url", f"http://127.0.0.1:{port}",
                         "--num-prompts", str(prompts), "--input-len", str(args.input_len), "--output-len",
                         str(args.output_len), "--max-concurrency", str(level), "--seed", str(100 + level),
                         "--request-timeout", "1800", "--result-json", result_json], timeout=7200)
                    with open(result_json) as handle:
                        result = json.load(handle)
                    results.append({"engine": engine, "concurrency": level, "repeat": repeat,
                                    "load": max(load, load_average()), "result": result})
            finally:
                stop(process)
    return results


def shape_name(config):
    """qwen3-0.6b for configs/models/qwen3-0.6b/config.json, tiny for .../tiny.json."""
    path = os.path.abspath(config)
    return (os.path.basename(os.path.dirname(path)) if os.path.basename(path) == "config.json"
            else os.path.splitext(os.path.basename(path))[0])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build-dir", default=os.path.join(ROOT, "build-cpu"))
    parser.add_argument("--llama-bin", help="folder with llama-bench, llama-batched-bench, llama-server")
    parser.add_argument("--work-dir", default="/tmp/pdserve-peer")
    parser.add_argument("--out", default=None, help="folder for the tables and raw JSON (default: the work dir)")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--repeats", type=int, default=2, help="alternations per row")
    parser.add_argument("--rows", default="all", help="comma-separated row numbers (1-6), all or none")
    parser.add_argument("--config", default=CONFIG_06B, help="config.json of the benchmarked shape")
    parser.add_argument("--weights", choices=sorted(WEIGHTS), default="bf16",
                        help="bf16: both engines read bf16; fp8: pdserve FP8 (block 128x128) vs llama.cpp Q8_0")
    parser.add_argument("--llama-no-repack", action="store_true",
                        help="run llama.cpp without weight repacking (for hosts whose AMX is advertised but unusable)")
    parser.add_argument("--agreement-config", default=CONFIG_06B, help="config.json of the agreement model")
    parser.add_argument("--agreement-layers", type=int, default=4)
    parser.add_argument("--agreement-only", action="store_true", help="only the greedy-token agreement check")
    parser.add_argument("--serving", action="store_true", help="also run item 4 (servers under load)")
    parser.add_argument("--concurrency", default="1,8,32")
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--waves", type=int, default=2, help="requests per concurrency level = waves x level")
    parser.add_argument("--serving-repeats", type=int, default=1)
    args = parser.parse_args()
    if args.threads < 1 or args.repeats < 1 or args.agreement_layers < 1:
        fail("--threads, --repeats and --agreement-layers must be positive")
    try:
        rows = (ROWS if args.rows == "all" else [] if args.rows == "none"
                else [ROWS[int(r) - 1] for r in args.rows.split(",")])
    except (ValueError, IndexError):
        fail(f"--rows {args.rows!r}: expected all, none or numbers 1 to {len(ROWS)}")
    tools = Tools(args)
    os.makedirs(args.work_dir, exist_ok=True)
    out_dir = args.out or args.work_dir
    os.makedirs(out_dir, exist_ok=True)
    started = time.strftime("%Y-%m-%d %H:%M %Z")
    report = {"started": started, "threads": tools.threads, "cpu": cpu_name(), "rows": [], "serving": []}

    shape = shape_name(args.agreement_config)
    f32_dir, f32_gguf = make_model(tools, args.agreement_config,
                                   os.path.join(args.work_dir, f"{shape}-{args.agreement_layers}layers-f32"),
                                   "float32", args.agreement_layers)
    ours, theirs = check_agreement(tools, f32_dir, f32_gguf)
    agree = ours == theirs
    first_difference = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), None)
    report["agreement"] = {"pdserve": ours, "llama.cpp": theirs, "agree": agree, "first_difference": first_difference}
    agreement_line = (f"greedy agreement on float32 weights ({args.agreement_layers} layers of the {shape} shape, "
                      f"{len(ours)} tokens): {'identical' if agree else f'first difference at token {first_difference}'}")
    print(agreement_line)
    if not agree:
        print(f"pdserve:   {ours}\nllama.cpp: {theirs}")
    if args.agreement_only:
        return 0 if agree else 1

    if not args.llama_bin:
        fail("--llama-bin is required for the benchmark rows")
    model_dir, gguf_path = make_model(tools, args.config,
                                      os.path.join(args.work_dir, f"{shape_name(args.config)}-bf16"),
                                      "bfloat16", fp8=args.weights == "fp8")
    report["weights"] = WEIGHTS[args.weights]

    report["ceilings_before"] = measure_ceilings(tools, model_dir)
    for repeat in range(args.repeats if rows else 0):
        for row in rows:
            order = ["llama.cpp", "pdserve"] if repeat % 2 == 0 else ["pdserve", "llama.cpp"]
            for engine in order:
                if engine == "pdserve":
                    measured = pdserve_row(tools, model_dir, row)
                else:
                    measured = llama_row(tools, gguf_path, row)
                measured.update(engine=engine, row=row["name"], repeat=repeat)
                report["rows"].append(measured)
                log(f"{engine}: {row['name']}: {measured['tok_s']:.2f} tok/s")
    report["ceilings_after"] = measure_ceilings(tools, model_dir)
    if args.serving:
        report["serving"] = serving(tools, model_dir, gguf_path, args.work_dir, args)
    report["finished"] = time.strftime("%Y-%m-%d %H:%M %Z")

    text = render(report, rows, agreement_line, args)
    print(text)
    with open(os.path.join(out_dir, "peer_bench.md"), "w") as handle:
        handle.write(text)
    with open(os.path.join(out_dir, "peer_bench.json"), "w") as handle:
        json.dump(report, handle, indent=1)
    return 0 if agree else 1


def cpu_name():
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def best(report, engine, row_name):
    runs = [r for r in report["rows"] if r["engine"] == engine and r["row"] == row_name]
    return max(runs, key=lambda r: r["tok_s"]) if runs else None


def render(report, rows, agreement_line, args):
    ceilings = [report["ceilings_before"], report["ceilings_after"]]
    read_gbs = max(c["read_gbs"] for c in ceilings)
    lines = [
        f"pdserve vs llama.cpp, {report['started']} to {report['finished']}, {report['cpu']}, "
        f"{report['threads']} threads, best of {args.repeats} alternating runs per engine",
        "",
        f"Model: {shape_name(args.config)} shape; projections in {report['weights']['llama.cpp']} for llama.cpp, "
        f"{report['weights']['pdserve']} for pdserve",
        "",
        "Ceilings (measured before / after the rows): read bandwidth "
        + " / ".join(f"{c['read_gbs']:.1f}" for c in ceilings) + " GB/s; OpenBLAS sgemm on the model's GEMMs "
        + " / ".join(f"{c['sgemm_gflops']:.0f}" for c in ceilings) + " GFLOP/s; vdpbf16ps peak "
        + " / ".join(f"{c['bf16_dot_peak_gflops']:.0f}" for c in ceilings) + " GFLOP/s (load "
        + " / ".join(f"{c['load']:.1f}" for c in ceilings) + ")",
        "",
        "| row | llama.cpp tok/s (load) | pdserve tok/s (load) | pdserve / llama.cpp | limit |",
        "| --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        theirs = best(report, "llama.cpp", row["name"])
        ours = best(report, "pdserve", row["name"])
        if theirs is None or ours is None:
            continue
        if row["kind"] == "decode":
            # The bytes a step reads (weights + the batch's KV) at the run's best read bandwidth.
            roofline = row["batch"] * read_gbs * 1e9 / ours["raw"]["step_bytes"]
            limit = f"read roofline {roofline:.1f} tok/s; pdserve at {100 * ours['tok_s'] / roofline:.0f}%"
        else:
            sgemm = max(c["sgemm_gflops"] for c in ceilings)
            peak = max(c["bf16_dot_peak_gflops"] for c in ceilings)
            limit = (f"pdserve's linear layers at {ours['raw']['linear_gflops']:.0f} GFLOP/s "
                     f"(sgemm {sgemm:.0f}, vdpbf16ps peak {peak:.0f})")
        lines.append(f"| {row['name']} | {theirs['tok_s']:.1f} ({theirs['load']:.1f}) | {ours['tok_s']:.1f} "
                     f"({ours['load']:.1f}) | {ours['tok_s'] / theirs['tok_s']:.2f} | {limit} |")
    lines += ["", agreement_line]
    if report["serving"]:
        lines += ["", "Serving: pdserve-bench-serving, random token prompts, input "
                  f"{args.input_len} / output {args.output_len} tokens, {args.waves} waves per level",
                  "", "| streams | engine | output tok/s | TTFT mean / p99 (ms) | TPOT mean (ms) | load |",
                  "| --- | --- | --- | --- | --- | --- |"]
        for entry in report["serving"]:
            r = entry["result"]
            lines.append(f"| {entry['concurrency']} | {entry['engine']} | {r.get('output_throughput', 0):.1f} | "
                         f"{r.get('mean_ttft_ms', 0):.0f} / {r.get('p99_ttft_ms', 0):.0f} | "
                         f"{r.get('mean_tpot_ms', 0):.1f} | {entry['load']:.1f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
