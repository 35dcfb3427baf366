"""Float64 numpy reference forward of a Qwen3 checkpoint, FP8 ones included: the oracle of
tests/model/fp8_oracle_test.py.

An F8_E4M3 weight is dequantized exactly as its format defines: ml_dtypes' float8_e4m3fn value
of each code times the float32 value of its `weight_scale_inv` (one per block of
quantization_config's weight_block_size) or `weight_scale` (a scalar or one per output row).
Everything else is upcast exactly; the forward pass follows qwen3_model.py (Hugging Face
semantics) in numpy float64. Runs with the project venv's python (numpy, ml_dtypes); the
Debian torch 1.13 of qwen3_model.py has no float8 dtype. With per-layer KV scales, forward
also reads K and V back through an FP8 E4M3 KV cache (fp8_kv_roundtrip).
"""

import json
import math
import os
import struct

import ml_dtypes
import numpy as np

_DTYPES = {
    "BF16": ml_dtypes.bfloat16,
    "F16": np.float16,
    "F32": np.float32,
    "F8_E4M3": ml_dtypes.float8_e4m3fn,
}


def read_tensors(model_dir: str) -> dict:
    """Every tensor of model.safetensors (or its shards) as a numpy array of its own dtype."""
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index, encoding="utf-8") as handle:
            files = sorted(set(json.load(handle)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    tensors = {}
    for name in files:
        with open(os.path.join(model_dir, name), "rb") as handle:
            data = handle.read()
        (length,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8:8 + length])
        base = 8 + length
        for tensor, entry in header.items():
            if tensor == "__metadata__":
                continue
            begin, end = entry["data_offsets"]
            array = np.frombuffer(data[base + begin:base + end], dtype=_DTYPES[entry["dtype"]])
            tensors[tensor] = array.reshape(entry["shape"])
    return tensors


def dequantize(codes: np.ndarray, scale: np.ndarray, block) -> np.ndarray:
    """code value x its block's scale, in float64."""
    values = codes.astype(np.float64)
    scale = scale.astype(np.float64)
    rows, cols = values.shape
    if block is not None:
        expanded = np.repeat(np.repeat(scale, block[0], axis=0), block[1], axis=1)
        return values * expanded[:rows, :cols]
    if scale.size == 1:
        return values * scale.reshape(())
    return values * scale.reshape(rows, 1)


def load_weights(model_dir: str):
    """(config dict, float64 weights by name); FP8 weights dequantized, scale tensors consumed."""
    with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as handle:
        config = json.load(handle)
    quantization = config.get("quantization_config")
    block = quantization.get("weight_block_size") if quantization else None
    raw = read_tensors(model_dir)
    weights = {}
    for name, array in raw.items():
        if name.endswith("_scale_inv") or name.endswith("_scale"):
            continue
        if array.dtype == ml_dtypes.float8_e4m3fn:
            scale = raw.get(name + "_scale_inv", raw.get(name + "_scale"))
            if scale is None:
                raise ValueError(f"FP8 tensor {name} has no scale")
            weights[name] = dequantize(array, scale, block)
        else:
            weights[name] = array.astype(np.float64)
    return config, weights


def rms_norm(x, weight, eps):
    return weight * (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps))


def rope(x, positions, head_dim, theta):
    inv_freq = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    angles = positions[:, None].astype(np.float64) * inv_freq[None, :]
    angles = np.concatenate([angles, angles], axis=-1)[:, None, :]
    half = head_dim // 2
    rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * np.cos(angles) + rotated * np.sin(angles)


def fp8_kv_roundtrip(x: np.ndarray, scale: float) -> np.ndarray:
    """What an FP8 KV cache (vLLM's fp8_e4m3 with a per-layer scale) gives back for x: x / scale
    saturated to +-448 (vLLM's quantizer clips), rounded to the nearest float8_e4m3fn by
    ml_dtypes, times scale."""
    codes = np.clip(x / scale, -448.0, 448.0).astype(ml_dtypes.float8_e4m3fn)
    return codes.astype(np.float64) * scale


def forward(config: dict, weights: dict, token_ids: list, kv_scales=None) -> np.ndarray:
    """Logits [len(token_ids), vocab] of the whole sequence fed from position 0. `kv_scales`:
    (k scales, v scales), one per layer, for an FP8 KV cache: every token's K (after its norm
    and RoPE) and V are read back through fp8_kv_roundtrip, the current token's too (the cache
    is written before attention reads it)."""
    heads = config["num_attention_heads"]
    kv_heads = config["num_key_value_heads"]
    head_dim = config.get("head_dim", config["hidden_size"] // heads)
    eps = config["rms_norm_eps"]
    theta = config["rope_theta"]
    tokens = len(token_ids)
    positions = np.arange(tokens)
    hidden = weights["model.embed_tokens.weight"][np.array(token_ids)]
    for layer in range(config["num_hidden_layers"]):
        w = lambda suffix: weights[f"model.layers.{layer}.{suffix}"]  # noqa: E731
        x = rms_norm(hidden, w("input_layernorm.weight"), eps)
        q = (x @ w("self_attn.q_proj.weight").T).reshape(tokens, heads, head_dim)
        k = (x @ w("self_attn.k_proj.weight").T).reshape(tokens, kv_heads, head_dim)
        v = (x @ w("self_attn.v_proj.weight").T).reshape(tokens, kv_heads, head_dim)
        q = rope(rms_norm(q, w("self_attn.q_norm.weight"), eps), positions, head_dim, theta)
        k = rope(rms_norm(k, w("self_attn.k_norm.weight"), eps), positions, head_dim, theta)
        if kv_scales is not None:
            k = fp8_kv_roundtrip(k, kv_scales[0][layer])
            v = fp8_kv_roundtrip(v, kv_scales[1][layer])
        group = heads // kv_heads
        out = np.empty((tokens, heads, head_dim))
        causal = np.triu(np.ones((tokens, tokens), dtype=bool), 1)
        for h in range(heads):
            scores = q[:, h, :] @ k[:, h // group, :].T / math.sqrt(head_dim)
            scores[causal] = -np.inf
            scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
            out[:, h, :] = (scores / scores.sum(axis=-1, keepdims=True)) @ v[:, h // group, :]
        hidden = hidden + out.reshape(tokens, heads * head_dim) @ w("self_attn.o_proj.weight").T
        x = rms_norm(hidden, w("post_attention_layernorm.weight"), eps)
        gate = x @ w("mlp.gate_proj.weight").T
        up = x @ w("mlp.up_proj.weight").T
        hidden = hidden + (gate / (1.0 + np.exp(-gate)) * up) @ w("mlp.down_proj.weight").T
    hidden = rms_norm(hidden, weights["model.norm.weight"], eps)
    head = weights.get("lm_head.weight", weights["model.embed_tokens.weight"])
    if config.get("tie_word_embeddings", False):
        head = weights["model.embed_tokens.weight"]
    return hidden @ head.T
