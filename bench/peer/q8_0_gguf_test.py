#!/usr/bin/env python3
"""CTest peer_q8_0_gguf: gguf_from_safetensors.py --outtype q8_0 on a small synthetic checkpoint
writes what llama.cpp reads as Q8_0 of the same weights (the peer benchmark's --weights fp8
pairs it with pdserve's FP8 checkpoint of the same seed).

Checks, in the peer venv: the decoder projections are Q8_0 and every other matrix bf16 (the
tensors Qwen's FP8 layout keeps unquantized); the gguf package's own Q8_0 dequantizer gives back
each projection within Q8_0's rounding (half a step of amax / 127 per 32-value block, plus the
f16 rounding of the scale: bound 0.562 steps, measured 0.537); and llama.cpp
(llama-cpp-python) loads the file and decodes greedily from it.
Environment: PDSERVE_BUILD_DIR (pdserve-make-model).
"""
import os
import subprocess
import sys
import tempfile

import gguf
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
from gguf_from_safetensors import read_safetensors, to_float32  # noqa: E402

PROJECTIONS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
HF = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
      "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
      "ffn_down": "mlp.down_proj"}
# Half a step of round-to-nearest, and the scale's own f16 rounding (2^-11 relative) on the
# largest code, 127 * 2^-11 = 0.062 steps, bound the error at 0.562 steps.
BOUND_STEPS = 0.5 + 127 * 2.0 ** -11


def main():
    build = os.environ["PDSERVE_BUILD_DIR"]
    failures = []
    with tempfile.TemporaryDirectory(prefix="pdserve-q8_0-") as work:
        model = os.path.join(work, "model")
        subprocess.run([os.path.join(build, "tools/make_model/pdserve-make-model"), "--config",
                        os.path.join(ROOT, "tests/data/reference/configs/hd64_gqa4.json"), "--out", model,
                        "--seed", "1", "--tokenizer-dir", os.path.join(ROOT, "configs/models/qwen3-tokenizer")],
                       check=True, capture_output=True)
        path = os.path.join(work, "model-q8_0.gguf")
        subprocess.run([sys.executable, os.path.join(HERE, "gguf_from_safetensors.py"), model, path,
                        "--outtype", "q8_0"], check=True)
        source = read_safetensors(os.path.join(model, "model.safetensors"))
        worst = 0.0
        for tensor in gguf.GGUFReader(path).tensors:
            parts = tensor.name.split(".")
            projection = len(parts) == 4 and parts[2] in PROJECTIONS
            expected = (gguf.GGMLQuantizationType.Q8_0 if projection else gguf.GGMLQuantizationType.F32
                        if len(tensor.shape) == 1 else gguf.GGMLQuantizationType.BF16)
            if tensor.tensor_type != expected:
                failures.append(f"{tensor.name}: {tensor.tensor_type.name}, expected {expected.name}")
            if not projection:
                continue
            dtype, _, values = source[f"model.layers.{parts[1]}.{HF[parts[2]]}.weight"]
            original = to_float32(dtype, values).astype(np.float64).reshape(-1, 32)
            decoded = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float64).reshape(-1, 32)
            step = np.abs(original).max(axis=1, keepdims=True) / 127
            worst = max(worst, float((np.abs(decoded - original) / np.where(step > 0, step, 1)).max()))
        print(f"Q8_0 projections: worst error {worst:.3f} steps (bound {BOUND_STEPS:.3f})")
        if not worst <= BOUND_STEPS:
            failures.append(f"Q8_0 round trip error {worst:.3f} steps > {BOUND_STEPS:.3f}")
        import llama_cpp  # the peer venv's; imported last so that the format checks run first
        # Without llama.cpp's weight repacking (extra buffer types): on a host that advertises AMX
        # but does not grant its tile state (a VM), its AMX Q8_0 kernel dies of SIGILL. Repacking
        # changes the layout in memory, not what the file holds, which is what this checks.
        bindings = llama_cpp.llama_cpp  # the module Llama reads its default parameters from
        default_params = bindings.llama_model_default_params

        def params_without_repacking():
            params = default_params()
            params.use_extra_bufts = False
            return params
        bindings.llama_model_default_params = params_without_repacking
        llm = llama_cpp.Llama(model_path=path, n_ctx=64, n_threads=2, verbose=False)
        tokens = []
        for token in llm.generate([9707, 1879, 11, 419], temp=0.0):
            tokens.append(token)
            if len(tokens) == 8:
                break
        print(f"llama.cpp greedy tokens from the Q8_0 file: {tokens}")
        if len(tokens) != 8:
            failures.append("llama.cpp produced no tokens from the Q8_0 file")
    if failures:
        sys.exit("FAIL: " + "; ".join(failures))
    print("PASS")


if __name__ == "__main__":
    main()
