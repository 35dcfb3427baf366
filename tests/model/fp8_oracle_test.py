"""pdserve's CPU forward of a synthetic FP8 checkpoint against a float64 numpy reference of the
dequantized weights (tests/reference/fp8_reference.py: ml_dtypes' float8_e4m3fn x block
scale), at each depth (a model cut to its first L layers: pdserve-make-model generates every
tensor from its name, so the cut models share those layers), plus the FP8 model's greedy
agreement with its bf16 source, measured and printed (not asserted: quantization may flip a
near tie).

Stated bounds (pdserve-generate's logits rows, teacher-forced on pdserve's own greedy ids):
max |logit - reference| <= 2e-3 * max |reference logit| at every depth. The CPU level's float32
(avx2) or bf16-rounded activations (avx512_bf16, 2^-9 relative) are the error; the FP8
quantization itself is in both sides.
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

CONFIG = os.path.join(SOURCE, "tests/data/reference/configs/hd64_gqa4.json")
MAKE_MODEL = os.path.join(BUILD, "tools/make_model/pdserve-make-model")
GENERATE = os.path.join(BUILD, "tools/generate/pdserve-generate")
PROMPT = [9707, 1879, 11, 419, 374, 264, 1273, 13]
NEW_TOKENS = 6
RELATIVE_BOUND = 2e-3
SEED = 31


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


def generate(model, work):
    logits_path = os.path.join(work, "logits.npy")
    stdout = run(GENERATE, "--model", model, "--prompt-ids", ",".join(map(str, PROMPT)),
                 "--max-new-tokens", str(NEW_TOKENS), "--temperature", "0", "--ignore-eos",
                 "--print-ids", "--threads", "2", "--logits-out", logits_path)
    return json.loads(stdout.strip().splitlines()[-1]), np.load(logits_path).astype(np.float64)


def main():
    failures = []
    with tempfile.TemporaryDirectory(prefix="pdserve-fp8-oracle-") as work:
        for layers in (1, 3):
            fp8_dir = make_model(work, layers, True)
            ids, logits = generate(fp8_dir, work)
            config, weights = fp8_reference.load_weights(fp8_dir)
            # Row s of --logits-out: after feeding PROMPT + ids[:s], i.e. position P - 1 + s.
            sequence = PROMPT + ids[:-1]
            reference = fp8_reference.forward(config, weights, sequence)[len(PROMPT) - 1:]
            error = np.abs(logits - reference).max()
            scale = np.abs(reference).max()
            print(f"layers {layers}: max |pdserve - float64| = {error:.3e}, max |logit| = "
                  f"{scale:.3e}, relative {error / scale:.2e} (bound {RELATIVE_BOUND:g})")
            if not error <= RELATIVE_BOUND * scale:
                failures.append(f"layers {layers}: relative error {error / scale:.2e}")
            bf16_ids, bf16_logits = generate(make_model(work, layers, False), work)
            agree = sum(a == b for a, b in zip(ids, bf16_ids))
            first = next((i for i, (a, b) in enumerate(zip(ids, bf16_ids)) if a != b), None)
            print(f"layers {layers}: greedy FP8 {ids} vs bf16 source {bf16_ids}: {agree}/"
                  f"{len(ids)} equal, first difference at {first}; first-step logits differ by "
                  f"up to {np.abs(logits[0] - bf16_logits[0]).max():.3e}")
    if failures:
        sys.exit("FAIL: " + "; ".join(failures))
    print("PASS")


if __name__ == "__main__":
    main()
