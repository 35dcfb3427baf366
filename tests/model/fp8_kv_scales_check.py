"""The whole-model FP8 KV-cache checks of fp8_oracle_test.py: a checkpoint that carries per-layer
`model.layers.{i}.self_attn.k_scale` / `v_scale` (float32 scalars, as vLLM's and ModelOpt's FP8
exports ship them), run with --kv-cache-dtype fp8, against fp8_reference.forward with the same
scales (K and V read back through float8_e4m3fn by ml_dtypes).

Stated bound, at the float32 level (avx2, or portable): max |logit - reference| / max |reference
logit| <= 1e-4. Both sides quantize the same K and V values, which agree to float32 rounding
(~1e-7 relative) before quantization; a value that lands within that distance of an e4m3
rounding boundary can round to the neighbouring code on one side only (an error of one e4m3 step
on that element, ~1e-4 of the logits at most for this model), so the bound is that of one flipped
code, not the 1e-5 of the weight-only check. The check can fail: the reference with every scale
1.0 (what pdserve would compute if it ignored the checkpoint's scales) must be more than ten times
the bound away from the scaled one, and pdserve must be within the bound of the scaled one.

Also: without --kv-cache-dtype fp8 the scales are ignored (logits bit-identical to the same
checkpoint without them), and a bad scale (0, negative, NaN, more than one value) is refused:
exit code 2 and the offending tensor's name on stderr.
"""
import json
import os
import shutil
import struct
import subprocess

import numpy as np

import fp8_reference

FP8_KV = ("--kv-cache-dtype", "fp8")
BOUND = 1e-4
# Per layer, near amax / 448 (the calibration of vLLM's exports) of this model's K (amax 2.9-3.3)
# and V (0.9-1.2), none clipping; different per layer and far from 1.0, so that ignoring them shows.
K_SCALES = [0.0081, 0.0123, 0.0069]
V_SCALES = [0.0037, 0.0058, 0.0091]


def scale_name(layer, half):
    return f"model.layers.{layer}.self_attn.{half}_scale"


def add_tensors(model_dir, tensors):
    """Rewrites model_dir/model.safetensors with float32 `tensors` (name -> numpy array) added."""
    path = os.path.join(model_dir, "model.safetensors")
    with open(path, "rb") as handle:
        data = handle.read()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + length])
    payload = bytearray(data[8 + length:])
    for name, array in tensors.items():
        raw = np.ascontiguousarray(array, dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(array.shape),
                        "data_offsets": [len(payload), len(payload) + len(raw)]}
        payload += raw
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as handle:
        handle.write(struct.pack("<Q", len(text)) + text + payload)


def with_scales(source, out, k_scales, v_scales):
    shutil.copytree(source, out)
    tensors = {}
    for layer, (k, v) in enumerate(zip(k_scales, v_scales)):
        tensors[scale_name(layer, "k")] = np.asarray(k, dtype=np.float32)
        tensors[scale_name(layer, "v")] = np.asarray(v, dtype=np.float32)
    add_tensors(out, tensors)
    return out


def check(work, fp8_dir, prompt, generate, relative_error):
    """generate(model, *extra) -> (greedy ids, float64 logits rows) of `prompt`, row s after
    prompt + ids[:s]; returns failure strings."""
    failures = []
    scaled_dir = with_scales(fp8_dir, os.path.join(work, "kv-scaled"), K_SCALES, V_SCALES)
    config, weights = fp8_reference.load_weights(fp8_dir)
    ids, logits = generate(scaled_dir, *FP8_KV)
    prompt_and_ids = prompt + ids[:-1]
    rows = slice(len(prompt) - 1, None)
    reference = fp8_reference.forward(config, weights, prompt_and_ids, (K_SCALES, V_SCALES))[rows]
    ones = [1.0] * len(K_SCALES)
    unit = fp8_reference.forward(config, weights, prompt_and_ids, (ones, ones))[rows]
    exact_kv = fp8_reference.forward(config, weights, prompt_and_ids)[rows]
    error = relative_error(logits, reference)
    separation = relative_error(unit, reference)
    print(f"fp8 KV with the checkpoint's scales: pdserve vs float64 reference relative {error:.2e} "
          f"(bound {BOUND:g}); the reference with scales 1.0 is {separation:.2e} away, without KV "
          f"quantization {relative_error(exact_kv, reference):.2e}")
    if not error <= BOUND:
        failures.append(f"fp8 KV with scales: relative error {error:.2e} > {BOUND:g}")
    if not separation > 10 * BOUND:
        failures.append(f"the scales change the reference by {separation:.2e} only: the check could "
                        "not tell them from 1.0")

    plain_ids, plain_logits = generate(fp8_dir)
    scaled_plain_ids, scaled_plain_logits = generate(scaled_dir)
    same = plain_ids == scaled_plain_ids and np.array_equal(plain_logits, scaled_plain_logits)
    print(f"auto KV dtype: logits with and without the scale tensors bit-identical: {same}")
    if not same:
        failures.append("without --kv-cache-dtype fp8 the checkpoint's k_scale/v_scale changed the logits")
    return failures


def check_refusals(work, one_layer_fp8_dir, generate_args):
    """A bad layer-0 k_scale: 0, negative, NaN, two values; generate_args(model, *extra) -> argv."""
    failures = []
    bad = {"zero": np.float32(0.0), "negative": np.float32(-0.5), "nan": np.float32(np.nan),
           "two-values": np.array([0.01, 0.02], dtype=np.float32)}
    name = scale_name(0, "k")
    for tag, value in bad.items():
        model = with_scales(one_layer_fp8_dir, os.path.join(work, f"bad-{tag}"), [value], [0.01])
        done = subprocess.run(generate_args(model, *FP8_KV), capture_output=True, text=True, timeout=300)
        message = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ""
        print(f"bad k_scale ({tag}): exit {done.returncode}: {message}")
        if done.returncode != 2 or name not in done.stderr:
            failures.append(f"bad k_scale ({tag}): exit {done.returncode}, stderr {done.stderr[-300:]!r}")
    return failures
