"""pdserve's CPU forward of a synthetic FP8 checkpoint against a float64 numpy reference of the
dequantized weights (tests/reference/fp8_reference.py: ml_dtypes' float8_e4m3fn x block
scale), at each depth (a model cut to its first L layers: pdserve-make-model generates every
tensor from its name, so the cut models share those layers), plus the FP8 model's greedy
agreement with its bf16 source, measured and printed (not asserted: quantization may flip a
near tie). Then the FP8 KV cache with a checkpoint's per-layer k_scale / v_scale, against the
same reference reading K and V back through e4m3 (fp8_kv_scales_check.py, which states its bound).

Stated bounds (pdserve-generate's logits rows, teacher-forced on pdserve's own greedy ids),
max |logit - reference| / max |reference logit| at every depth: 1e-5 at a float32 level (avx2,
or portable on a CPU without AVX2; measured 2.0e-7 and 2.4e-7 on 2026-11-28), 1e-2 at
avx512_bf16, whose linear layers round activations to bf16 (2^-9 relative; measured 2.8e-3 and
4.2e-3, the class of the bf16-weight goldens at that level). The FP8 quantization itself is on
both sides: the reference dequantizes the very codes and scales pdserve reads.
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

BUILD = os.environ["PDSERVE_BUILD_DIR"]
SOURCE = os.environ["PDSERVE_SOURCE_DIR"]
sys.path.insert(0, os.path.join(SOURCE, "tests/reference"))
import fp8_reference  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fp8_kv_scales_check as kv_scales  # noqa: E402

CONFIG = os.path.join(SOURCE, "tests/data/reference/configs/hd64_gqa4.json")
MAKE_MODEL = os.path.join(BUILD, "tools/make_model/pdserve-make-model")
GENERATE = os.path.join(BUILD, "tools/generate/pdserve-generate")
# 24 tokens: the prompt's prefill runs the FP8 linear kernels' decode-once path (16 rows or
# more, kernels/linear_problem.h), the decode steps after it the in-register path.
PROMPT = [9707, 1879, 11, 419, 374, 264, 1273, 13] * 3
NEW_TOKENS = 6
SEED = 31


def cpu_flags():
    with open("/proc/cpuinfo", encoding="utf-8") as handle:
        for line in handle:
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    return set()


def levels():
    """(PDSERVE_CPU_ISA, relative bound) for the float32 level and, if present, avx512_bf16."""
    flags = cpu_flags()
    chosen = [("avx2" if "avx2" in flags else "portable", 1e-5)]
    if "avx512_bf16" in flags:
        chosen.append(("avx512_bf16", 1e-2))
    return chosen


def run(*args):
    done = subprocess.run(args, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        sys.exit(f"{args[0]} failed ({done.returncode}): {done.stderr}")
    return done.stdout


def make_model(work, layers, fp8):
    out = os.path.join(work, f"{'fp8' if fp8 else 'bf16'}-{layers}")
    run(MAKE_MODEL, "--config", CONFIG, "--out", out, "--seed", str(SEED), "--layers", str(layers),
        "--dtype", "bfloat16", *(["--fp8"] if fp8 else []))
    return out


def generate_args(model, *extra):
    return [GENERATE, "--model", model, "--prompt-ids", ",".join(map(str, PROMPT)), "--max-new-tokens",
            str(NEW_TOKENS), "--temperature", "0", "--ignore-eos", "--print-ids", "--threads", "2", *extra]


def generate(model, work, level, *extra):
    logits_path = os.path.join(work, "logits.npy")
    os.environ["PDSERVE_CPU_ISA"] = level
    stdout = run(*generate_args(model, "--logits-out", logits_path, *extra))
    return json.loads(stdout.strip().splitlines()[-1]), np.load(logits_path).astype(np.float64)


def relative_error(logits, reference):
    return np.abs(logits - reference).max() / np.abs(reference).max()


def main():
    failures = []
    with tempfile.TemporaryDirectory(prefix="pdserve-fp8-kv-scales-") as work:
        level = levels()[0][0]  # the float32 level: the bf16 one's rounding would hide the scales
        failures += kv_scales.check(work, make_model(work, 3, True), PROMPT,
                                    lambda model, *extra: generate(model, work, level, *extra), relative_error)
        failures += kv_scales.check_refusals(work, make_model(work, 1, True), generate_args)
    with tempfile.TemporaryDirectory(prefix="pdserve-fp8-oracle-") as work:
        for layers in (1, 3):
            fp8_dir = make_model(work, layers, True)
            bf16_dir = make_model(work, layers, False)
            config, weights = fp8_reference.load_weights(fp8_dir)
            for level, bound in levels():
                ids, logits = generate(fp8_dir, work, level)
                # Row s of --logits-out: after feeding PROMPT + ids[:s] (position P - 1 + s).
                sequence = PROMPT + ids[:-1]
                reference = fp8_reference.forward(config, weights, sequence)[len(PROMPT) - 1:]
                error = np.abs(logits - reference).max()
                scale = np.abs(reference).max()
                print(f"{level}, layers {layers}: max |pdserve - float64| = {error:.3e}, max "
                      f"|logit| = {scale:.3e}, relative {error / scale:.2e} (bound {bound:g})")
                if not error <= bound * scale:
                    failures.append(f"{level}, layers {layers}: relative error {error / scale:.2e}")
                bf16_ids, bf16_logits = generate(bf16_dir, work, level)
                agree = sum(a == b for a, b in zip(ids, bf16_ids))
                print(f"{level}, layers {layers}: greedy FP8 {ids} vs bf16 source {bf16_ids}: "
                      f"{agree}/{len(ids)} equal; first-step logits differ by up to "
                      f"{np.abs(logits[0] - bf16_logits[0]).max():.3e}")
    if failures:
        sys.exit("FAIL: " + "; ".join(failures))
    print("PASS")


if __name__ == "__main__":
    main()
