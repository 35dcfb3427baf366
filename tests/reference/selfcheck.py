#!/usr/bin/python3
"""Self-checks of the float64 Qwen3 reference, run before trusting its goldens.

  /usr/bin/python3 tests/reference/selfcheck.py                      # synthetic checkpoints
  /usr/bin/python3 tests/reference/selfcheck.py --model DIR          # also a real HF folder
  /usr/bin/python3 tests/reference/selfcheck.py --golden tests/data/reference/*.json

Exits 1 and names the failed check on any mismatch.
"""

import argparse
import cmath
import json
import math
import os
import struct
import sys
import tempfile

import torch

from qwen3_model import (Qwen3Config, Qwen3Reference, apply_rope, causal_gqa_attention,
                         expected_tensor_shapes, rms_norm, rope_inv_freq)
from qwen3_reference import GOLDEN_FORMAT, PROBE_COUNT, TOP_K
from safetensors_reader import Checkpoint, CheckpointError, INDEX_FILE_NAME
from seeded_ids import prompt_ids

SYNTHETIC_CONFIG = {
    "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 16, "rope_theta": 1e6,
    "rms_norm_eps": 1e-6, "hidden_act": "silu", "attention_bias": False, "rope_scaling": None,
}
_TORCH_TO_TAG = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32"}


class CheckFailed(Exception):
    pass


def expect_close(name: str, actual: torch.Tensor, expected: torch.Tensor, rel: float) -> float:
    """Max |actual - expected| relative to max |expected|; raises when above `rel`."""
    error = ((actual - expected).abs().max() / expected.abs().max()).item()
    if not error <= rel:
        raise CheckFailed(f"{name}: relative error {error:.3e} > {rel:.1e}")
    print(f"  ok  {name}: relative error {error:.3e} (limit {rel:.0e})")
    return error


# ---------------------------------------------------------------- synthetic checkpoints


def tensor_bytes(tensor: torch.Tensor) -> bytes:
    """Little-endian raw bytes; bf16 goes through its int16 bit pattern (numpy has no bf16)."""
    if tensor.dtype == torch.bfloat16:
        return tensor.contiguous().view(torch.int16).numpy().astype("<i2").tobytes()
    return tensor.contiguous().numpy().astype(tensor.numpy().dtype.newbyteorder("<")).tobytes()


def write_safetensors(path: str, tensors: dict) -> None:
    header, blobs, offset = {}, [], 0
    for name, tensor in tensors.items():
        blob = tensor_bytes(tensor)
        header[name] = {"dtype": _TORCH_TO_TAG[tensor.dtype], "shape": list(tensor.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    header_bytes = json.dumps(header).encode("utf-8")
    with open(path, "wb") as handle:
        handle.write(struct.pack("<Q", len(header_bytes)) + header_bytes + b"".join(blobs))


def synthetic_weights(config: Qwen3Config, seed: int, dtype: torch.dtype) -> dict:
    generator = torch.Generator().manual_seed(seed)
    weights = {}
    for name, shape in expected_tensor_shapes(config).items():
        if name.endswith("norm.weight"):
            values = 1.0 + 0.1 * torch.randn(shape, generator=generator)
        else:
            values = 0.05 * torch.randn(shape, generator=generator)
        weights[name] = values.to(dtype)
    return weights


def write_checkpoint(folder: str, raw_config: dict, weights: dict, shards: int) -> None:
    with open(os.path.join(folder, "config.json"), "w", encoding="utf-8") as handle:
        json.dump(raw_config, handle)
    if shards == 1:
        write_safetensors(os.path.join(folder, "model.safetensors"), weights)
        return
    names = sorted(weights)
    weight_map = {}
    for shard in range(shards):
        shard_name = f"model-{shard + 1:05d}-of-{shards:05d}.safetensors"
        part = {name: weights[name] for name in names[shard::shards]}
        write_safetensors(os.path.join(folder, shard_name), part)
        weight_map.update({name: shard_name for name in part})
    with open(os.path.join(folder, INDEX_FILE_NAME), "w", encoding="utf-8") as handle:
        json.dump({"metadata": {}, "weight_map": weight_map}, handle)


# ---------------------------------------------------------------- independent naive forward


def naive_forward(config: Qwen3Config, weights: dict, tokens: list) -> torch.Tensor:
    """Scalar-style float64 forward: per-position, per-head loops, complex-number RoPE,
    explicit softmax. Shares no code with qwen3_model; slow, for tiny models only."""
    w = {name: tensor.to(torch.float64) for name, tensor in weights.items()}
    eps = config.rms_norm_eps

    def norm(vector, weight):
        mean_square = sum(float(x) ** 2 for x in vector) / len(vector)
        return weight * vector / math.sqrt(mean_square + eps)

    def rope(vector, position):
        half = config.head_dim // 2
        out = vector.clone()
        for i in range(half):
            frequency = config.rope_theta ** (-2.0 * i / config.head_dim)
            z = complex(vector[i], vector[i + half]) * cmath.exp(1j * position * frequency)
            out[i], out[i + half] = z.real, z.imag
        return out

    group = config.num_heads // config.num_kv_heads
    hidden = [w["model.embed_tokens.weight"][t].clone() for t in tokens]
    for layer in range(config.num_layers):
        p = f"model.layers.{layer}."
        keys, values, queries = [], [], []
        for position, h in enumerate(hidden):
            x = norm(h, w[p + "input_layernorm.weight"])
            q = (w[p + "self_attn.q_proj.weight"] @ x).reshape(config.num_heads, -1)
            k = (w[p + "self_attn.k_proj.weight"] @ x).reshape(config.num_kv_heads, -1)
            v = (w[p + "self_attn.v_proj.weight"] @ x).reshape(config.num_kv_heads, -1)
            queries.append([rope(norm(qh, w[p + "self_attn.q_norm.weight"]), position)
                            for qh in q])
            keys.append([rope(norm(kh, w[p + "self_attn.k_norm.weight"]), position) for kh in k])
            values.append(v)
        for position in range(len(hidden)):
            heads = []
            for head in range(config.num_heads):
                kv = head // group
                scores = [float(queries[position][head] @ keys[j][kv]) /
                          math.sqrt(config.head_dim) for j in range(position + 1)]
                top = max(scores)
                exps = [math.exp(s - top) for s in scores]
                total = sum(exps)
                heads.append(sum((e / total) * values[j][kv] for j, e in enumerate(exps)))
            hidden[position] = hidden[position] + w[p + "self_attn.o_proj.weight"] @ torch.cat(
                heads)
            x = norm(hidden[position], w[p + "post_attention_layernorm.weight"])
            gate = w[p + "mlp.gate_proj.weight"] @ x
            up = w[p + "mlp.up_proj.weight"] @ x
            swiglu = gate / (1.0 + torch.exp(-gate)) * up
            hidden[position] = hidden[position] + w[p + "mlp.down_proj.weight"] @ swiglu
    head = w["model.embed_tokens.weight"] if config.tie_word_embeddings else w["lm_head.weight"]
    return torch.stack([head @ norm(h, w["model.norm.weight"]) for h in hidden])


# ---------------------------------------------------------------- checks


def check_reader(folder: str) -> None:
    print("safetensors reader")
    values = torch.tensor([0.0, -0.0, 1.0, -2.5, 3.14159, 1e-30, 65504.0, 1e38])
    tensors = {f"t_{tag}": values.to(dtype) for dtype, tag in _TORCH_TO_TAG.items()
               if dtype != torch.float16}
    tensors["t_F16"] = values[:7].to(torch.float16)
    path = os.path.join(folder, "model.safetensors")
    write_safetensors(path, tensors)
    with Checkpoint(folder) as checkpoint:
        for name, tensor in tensors.items():
            loaded = checkpoint.load(name, torch.float64)
            if not torch.equal(loaded, tensor.to(torch.float64)):
                raise CheckFailed(f"reader: {name} round trip changed values")
    # The shift path must agree bit-for-bit with torch's own bfloat16 decoding.
    bits = torch.randint(-32768, 32767, (4096,), dtype=torch.int16)
    bits = bits[~torch.isnan(bits.view(torch.bfloat16))]
    via_torch = torch.frombuffer(bytearray(tensor_bytes(bits)), dtype=torch.bfloat16).double()
    write_safetensors(path, {"bits": bits.view(torch.bfloat16)})
    with Checkpoint(folder) as checkpoint:
        if not torch.equal(checkpoint.load("bits", torch.float64), via_torch):
            raise CheckFailed("reader: bf16 shift decoding differs from torch.frombuffer")
    print("  ok  exact round trip of bf16/f16/f32; bf16 decoding matches torch.frombuffer")

    header = json.dumps({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
    corruptions = {
        "truncated data": struct.pack("<Q", len(header)) + header + b"\0" * 8,
        "header length past end": struct.pack("<Q", 10 ** 6) + header,
        "not json": struct.pack("<Q", 3) + b"{x}",
        "byte count vs shape": struct.pack("<Q", len(header)) + header.replace(b"[4]", b"[5]")
        + b"\0" * 20,
        "unknown dtype": struct.pack("<Q", len(header)) + header.replace(b"F32", b"Q32")
        + b"\0" * 16,
        "short file": b"\1\0",
    }
    for label, content in corruptions.items():
        with open(path, "wb") as handle:
            handle.write(content)
        try:
            Checkpoint(folder).close()
        except CheckpointError as error:
            if "model.safetensors" not in str(error):
                raise CheckFailed(f"reader: error for {label} does not name the file: {error}")
            continue
        raise CheckFailed(f"reader: accepted a file with {label}")
    print(f"  ok  {len(corruptions)} corrupt files rejected with a message naming the file")
    os.remove(path)


def check_rope() -> None:
    print("rotary embedding")
    head_dim, theta = 128, 1e6
    inv_freq = rope_inv_freq(head_dim, theta, torch.float64)
    hf_formula = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).double()
                                  / head_dim))
    expect_close("inv_freq vs 1/theta^(2i/d)", inv_freq, hf_formula, 1e-15)
    x = torch.randn(5, 3, head_dim, dtype=torch.float64)
    positions = torch.tensor([0, 1, 7, 1000, 40959])
    rotated = apply_rope(x, positions, inv_freq)
    half = head_dim // 2
    z = torch.complex(x[..., :half], x[..., half:])
    phase = torch.polar(torch.ones(5, half, dtype=torch.float64),
                        positions.double()[:, None] * inv_freq[None, :])
    turned = z * phase[:, None, :]
    expect_close("apply_rope vs complex multiply", rotated,
                 torch.cat((turned.real, turned.imag), dim=-1), 1e-13)
    if not torch.equal(rotated[0], x[0]):
        raise CheckFailed("rope: position 0 must be the identity")
    norms_kept = (rotated.norm(dim=-1) - x.norm(dim=-1)).abs().max().item()
    if norms_kept > 1e-12:
        raise CheckFailed(f"rope: rotation changed vector norms by {norms_kept:.3e}")
    print("  ok  position 0 is identity; norms preserved")


def check_rms_norm() -> None:
    print("rms norm")
    x = torch.randn(4, 64, dtype=torch.float64) * 3
    ones = torch.ones(64, dtype=torch.float64)
    rms = rms_norm(x, ones, 0.0).pow(2).mean(dim=-1).sqrt()
    expect_close("unit weight gives unit rms", rms, torch.ones(4, dtype=torch.float64), 1e-14)


def check_attention() -> None:
    print("causal GQA attention")
    q = torch.randn(6, 8, 16, dtype=torch.float64)
    k = torch.randn(10, 2, 16, dtype=torch.float64)
    v = torch.randn(10, 2, 16, dtype=torch.float64)
    positions = torch.arange(4, 10)
    expected = torch.zeros(6, 8, 16, dtype=torch.float64)
    for t, position in enumerate(positions.tolist()):
        for head in range(8):
            kv_head = head // 4
            scores = k[:position + 1, kv_head] @ q[t, head] / 4.0
            weights = torch.exp(scores - scores.max())
            expected[t, head] = (weights / weights.sum()) @ v[:position + 1, kv_head]
    expect_close("batched vs per-head loop", causal_gqa_attention(q, k, v, positions),
                 expected.reshape(6, 128), 1e-14)


def full_sequence_logits(model: Qwen3Reference, tokens: list) -> torch.Tensor:
    return model.forward(tokens, model.new_cache())


def greedy_with_cache(model: Qwen3Reference, prompt: list, steps: int) -> tuple:
    """Prefill in chunks of 16 then cached greedy decode; returns (tokens, logits per position)."""
    cache = model.new_cache()
    rows = [model.forward(prompt[start:start + 16], cache) for start in range(0, len(prompt), 16)]
    tokens = list(prompt)
    for _ in range(steps):
        tokens.append(int(torch.argmax(rows[-1][-1])))
        rows.append(model.forward(tokens[-1:], cache))
    return tokens, torch.cat(rows)


def check_model(label: str, model_dir: str, naive: bool) -> None:
    print(f"model {label}")
    model = Qwen3Reference.from_checkpoint(model_dir, torch.float64)
    config = model.config
    prompt = prompt_ids(40, config.vocab_size, 99)
    tokens, cached = greedy_with_cache(model, prompt, 16)
    full = full_sequence_logits(model, tokens)[:-1]
    expect_close("chunked prefill + KV-cache decode vs full recompute", cached[:-1], full, 1e-12)

    changed = list(tokens)
    changed[30] = (changed[30] + 1) % config.vocab_size
    prefix = full_sequence_logits(model, changed)[:30]
    if not torch.equal(prefix, full[:30]):
        expect_close("causality: logits before a changed token", prefix, full[:30], 1e-13)
    else:
        print("  ok  causality: logits before a changed token are identical")

    model32 = Qwen3Reference.from_checkpoint(model_dir, torch.float32)
    expect_close("float32 vs float64", full_sequence_logits(model32, tokens)[:-1].double(),
                 full, 2e-5)

    if naive:
        with Checkpoint(model_dir) as checkpoint:
            raw = {name: checkpoint.load(name, torch.float64) for name in checkpoint.names()}
        expect_close("vectorized vs naive scalar forward", full[:20],
                     naive_forward(config, raw, tokens[:20]), 1e-12)


def check_synthetic_models(folder: str) -> None:
    cases = [("tied, bf16, 1 file", True, torch.bfloat16, 1),
             ("untied, f16, 3 shards", False, torch.float16, 3)]
    for index, (label, tied, dtype, shards) in enumerate(cases):
        raw_config = dict(SYNTHETIC_CONFIG, tie_word_embeddings=tied)
        config = Qwen3Config.from_dict(raw_config, label)
        case_dir = os.path.join(folder, f"case{index}")
        os.makedirs(case_dir)
        write_checkpoint(case_dir, raw_config, synthetic_weights(config, index, dtype), shards)
        check_model(label, case_dir, naive=True)


def check_golden(path: str) -> None:
    """Internal consistency a correct golden must have, whatever the model."""
    print(f"golden {path}")
    with open(path, encoding="utf-8") as handle:
        golden = json.load(handle)
    problems = []
    if golden["format"] != GOLDEN_FORMAT:
        problems.append("format tag")
    probes = golden["probe_ids"]
    if len(probes) != PROBE_COUNT or probes != sorted(set(probes)):
        problems.append("probe_ids not 256 distinct sorted ids")
    prompt = golden["prompt_ids"]
    positions = golden["prompt_positions"]
    if [p["position"] for p in positions] != list(range(len(prompt))):
        problems.append("prompt positions are not 0..len(prompt)-1")
    entries = positions + golden["decode_steps"]
    for entry in entries:
        logits = entry["top_logits"]
        if len(entry["top_ids"]) != TOP_K or logits != sorted(logits, reverse=True):
            problems.append(f"position {entry['position']}: top list not 16 descending")
        # logsumexp lies between the max logit and max + log(vocab); 1e7 bounds any vocab.
        if not logits[0] < entry["logsumexp"] <= logits[0] + math.log(1e7):
            problems.append(f"position {entry['position']}: logsumexp out of range")
        for probe, value in zip(probes, entry["probe_logits"]):
            in_top = probe in entry["top_ids"]
            if (in_top and value != logits[entry["top_ids"].index(probe)]) or \
                    (not in_top and value > logits[-1]):
                problems.append(f"position {entry['position']}: probe {probe} disagrees with "
                                "the top list")
    previous_best = positions[-1]["top_ids"][0]
    for step_index, step in enumerate(golden["decode_steps"]):
        if step["position"] != len(prompt) + step_index:
            problems.append(f"decode step {step_index}: position")
        if step["input_token"] != previous_best:
            problems.append(f"decode step {step_index}: input is not the previous greedy token")
        if step["greedy_token"] != step["top_ids"][0]:
            problems.append(f"decode step {step_index}: greedy token is not top 1")
        if step["margin"] != step["top_logits"][0] - step["top_logits"][1]:
            problems.append(f"decode step {step_index}: margin")
        previous_best = step["greedy_token"]
    if problems:
        raise CheckFailed(f"{path}: " + "; ".join(problems))
    margins = [step["margin"] for step in golden["decode_steps"]]
    print(f"  ok  {len(entries)} positions consistent; smallest decode margin "
          f"{min(margins) if margins else float('nan'):.3e}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", action="append", default=[], help="extra HF folder(s)")
    parser.add_argument("--golden", nargs="*", default=[], help="golden files to verify")
    parser.add_argument("--skip-synthetic", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    try:
        if not args.skip_synthetic:
            with tempfile.TemporaryDirectory() as folder:
                check_reader(folder)
                check_rope()
                check_rms_norm()
                check_attention()
                check_synthetic_models(folder)
        for model_dir in args.model:
            check_model(model_dir, model_dir, naive=False)
        for path in args.golden:
            check_golden(path)
    except (CheckFailed, CheckpointError) as error:
        print(f"selfcheck: FAILED: {error}", file=sys.stderr)
        return 1
    print("selfcheck: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
