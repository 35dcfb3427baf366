"""Writes the goldens of the FP8 per-token-group activation quantization (tests/kernels_gpu/
fp8_linear_plan_test.cpp checks kernels/fp8_activation_quant.h against them): numpy in float32
and ml_dtypes' float8_e4m3fn, following vLLM's per_token_group_quant_fp8 (groups of 128 along
k; scale = max(amax, 1e-10) / 448; q = clip(x / scale, -448, 448) cast to e4m3). Usage:
fp8_group_quant_goldens.py [OUT] (stdout when absent). The `fp8_group_quant_goldens_current`
test checks the committed file is this script's output."""
import sys

import ml_dtypes
import numpy as np

F8 = ml_dtypes.float8_e4m3fn
GROUP = 128


def quantize(x):
    m, k = x.shape
    groups = -(-k // GROUP)
    q = np.zeros((m, k), dtype=np.uint8)
    scales = np.zeros((groups, m), dtype=np.float32)  # cuBLASLt's VEC128 layout
    for g in range(groups):
        part = x[:, g * GROUP:(g + 1) * GROUP]
        amax = np.max(np.abs(part), axis=1).astype(np.float32)
        scale = np.maximum(amax, np.float32(1e-10)) / np.float32(448.0)
        scales[g] = scale
        scaled = np.clip(part / scale[:, None], np.float32(-448), np.float32(448))
        q[:, g * GROUP:(g + 1) * GROUP] = scaled.astype(F8).view(np.uint8)
    return q, scales


def cases():
    rng = np.random.default_rng(20261128)
    # Rows of different magnitudes, an all-zero row, one outlier that crushes its group.
    mixed = (rng.standard_normal((4, 320)) * np.array([[1e-3], [1.0], [30.0], [0.0]]))
    mixed[1, 5] = 900.0
    yield mixed.astype(np.float32)
    # A k without a partial group, activations as bf16 gives them (rounded to bf16).
    bf16 = (rng.standard_normal((5, 256)) * 3).astype(ml_dtypes.bfloat16).astype(np.float32)
    yield bf16
    # Only a partial group: tiny magnitudes (the scale normalizes each group, its small
    # elements still reach e4m3 subnormals), and an even ramp up to the group's maximum.
    tail = rng.standard_normal((2, 100)).astype(np.float32) * np.float32(1e-20)
    tail[1] = np.arange(100, dtype=np.float32) * np.float32(448.0 / 99.0)
    yield tail


def bits_row(values):
    return " ".join(f"{b:08x}" for b in np.asarray(values, dtype=np.float32).view(np.uint32))


def main():
    lines = [f"# ml_dtypes {ml_dtypes.__version__} float8_e4m3fn; written by "
             "tests/reference/fp8_group_quant_goldens.py",
             "# case M K, then M lines 'x' float32 bits, groups lines 'scale' (one per row), "
             "M lines 'q' codes"]
    for x in cases():
        q, scales = quantize(x)
        lines.append(f"case {x.shape[0]} {x.shape[1]}")
        lines += ["x " + bits_row(row) for row in x]
        lines += ["scale " + bits_row(row) for row in scales]
        lines += ["q " + " ".join(str(c) for c in row) for row in q]
    text = "\n".join(lines) + "\n"
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as out:
            out.write(text)
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()
