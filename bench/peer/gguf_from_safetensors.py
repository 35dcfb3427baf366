#!/usr/bin/env python3
"""Converts a Qwen3 checkpoint directory (config.json, model.safetensors, tokenizer.json, as
pdserve-make-model writes them) to a GGUF file that llama.cpp loads, with the `gguf` package
only: no transformers, no PyTorch.

  gguf_from_safetensors.py CHECKPOINT_DIR OUT.gguf [--outtype bf16|f32|q8_0]

Matrices are written in the chosen type (bf16: the checkpoint's bf16 bits unchanged, or
float32 rounded to nearest even; f32: exact widening), 1-D norm weights in float32 as
llama.cpp's own converter does. q8_0 (llama.cpp's 8-bit format, the closest to FP8: int8 codes
with an f16 scale per 32 values, quantized by the gguf package) quantizes the decoder layers'
projections only and keeps the embeddings and lm_head in bf16: the tensors Qwen's -FP8
checkpoints (and pdserve-make-model --fp8) store in FP8, so both engines read the same bytes
per step. A tied checkpoint writes no output.weight (llama.cpp then
uses token_embd). The tokenizer is the byte-level BPE of tokenizer.json ("gpt2" model, "qwen2"
pre-tokenizer), padded with unused [PADn] tokens up to the model's vocab_size.
"""
import argparse
import json
import os
import struct
import sys

import numpy as np
import gguf

HF_TO_GGUF = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def fail(message):
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def read_safetensors(path):
    """Name -> (dtype string, shape, numpy view of the raw data) for every tensor of one file."""
    with open(path, "rb") as handle:
        (header_len,) = struct.unpack("<Q", handle.read(8))
        header = json.loads(handle.read(header_len))
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + header_len)
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        raw = data[begin:end]
        dtype = info["dtype"]
        if dtype == "BF16":
            values = raw.view(np.uint16)
        elif dtype == "F32":
            values = raw.view(np.float32)
        elif dtype == "F16":
            values = raw.view(np.float16)
        else:
            fail(f"{path}: tensor {name} has dtype {dtype}; expected BF16, F16 or F32")
        tensors[name] = (dtype, tuple(info["shape"]), values.reshape(info["shape"]))
    return tensors


def to_float32(dtype, values):
    if dtype == "BF16":
        return (values.astype(np.uint32) << 16).view(np.float32)
    return values.astype(np.float32)


def to_bf16_bits(dtype, values):
    """bf16 bits: unchanged from a bf16 checkpoint, else float32 rounded to nearest even."""
    if dtype == "BF16":
        return np.ascontiguousarray(values)
    bits = to_float32(dtype, values).view(np.uint32)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    nan = (bits & 0x7FFFFFFF) > 0x7F800000
    return np.where(nan, (bits >> 16) | 0x40, rounded).astype(np.uint16)


def tokenizer_config(checkpoint_dir):
    path = os.path.join(checkpoint_dir, "tokenizer_config.json")
    if not os.path.exists(path):
        return {}
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def add_tokenizer(writer, checkpoint_dir, config):
    with open(os.path.join(checkpoint_dir, "tokenizer.json"), encoding="utf-8") as handle:
        tokenizer = json.load(handle)
    model = tokenizer["model"]
    if model.get("type") != "BPE":
        fail("tokenizer.json: expected a BPE model")
    vocab_size = config["vocab_size"]
    tokens = [f"[PAD{i}]" for i in range(vocab_size)]
    types = [gguf.TokenType.UNUSED] * vocab_size
    for text, token_id in model["vocab"].items():
        if token_id < vocab_size:
            tokens[token_id] = text
            types[token_id] = gguf.TokenType.NORMAL
    for added in tokenizer.get("added_tokens", []):
        if added["id"] < vocab_size:
            tokens[added["id"]] = added["content"]
            types[added["id"]] = gguf.TokenType.CONTROL if added.get("special") else gguf.TokenType.USER_DEFINED
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    eos = config.get("eos_token_id")
    if isinstance(eos, list):
        eos = eos[0]
    if eos is not None:
        writer.add_eos_token_id(eos)
    pad = tokenizer_config(checkpoint_dir).get("pad_token")
    if isinstance(pad, dict):
        pad = pad.get("content")
    if pad is not None and pad in tokens:
        writer.add_pad_token_id(tokens.index(pad))
    if config.get("bos_token_id") is not None:
        writer.add_bos_token_id(config["bos_token_id"])
    writer.add_add_bos_token(False)


def convert(checkpoint_dir, out_path, outtype):
    with open(os.path.join(checkpoint_dir, "config.json"), encoding="utf-8") as handle:
        config = json.load(handle)
    if config.get("model_type") != "qwen3":
        fail(f"{checkpoint_dir}: model_type {config.get('model_type')!r} is not qwen3")
    shards = sorted(f for f in os.listdir(checkpoint_dir) if f.endswith(".safetensors"))
    if not shards:
        fail(f"{checkpoint_dir}: no .safetensors file")
    tensors = {}
    for shard in shards:
        tensors.update(read_safetensors(os.path.join(checkpoint_dir, shard)))

    writer = gguf.GGUFWriter(out_path, "qwen3")
    layers = config["num_hidden_layers"]
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    writer.add_name("pdserve synthetic qwen3")
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(layers)
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_freq_base(float(config["rope_theta"]))
    writer.add_layer_norm_rms_eps(float(config["rms_norm_eps"]))
    writer.add_file_type({"bf16": gguf.LlamaFileType.MOSTLY_BF16, "f32": gguf.LlamaFileType.ALL_F32,
                          "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[outtype])
    add_tokenizer(writer, checkpoint_dir, config)

    def add(gguf_name, hf_name, projection=False):
        if hf_name not in tensors:
            fail(f"{checkpoint_dir}: tensor {hf_name} is missing")
        dtype, shape, values = tensors.pop(hf_name)
        if len(shape) == 1 or outtype == "f32":
            writer.add_tensor(gguf_name, np.ascontiguousarray(to_float32(dtype, values)))
        elif outtype == "q8_0" and projection:
            q8 = gguf.GGMLQuantizationType.Q8_0
            writer.add_tensor(gguf_name, gguf.quants.quantize(to_float32(dtype, values), q8), raw_dtype=q8)
        else:
            writer.add_tensor(gguf_name, to_bf16_bits(dtype, values), raw_dtype=gguf.GGMLQuantizationType.BF16)

    add("token_embd.weight", "model.embed_tokens.weight")
    for layer in range(layers):
        for hf, short in HF_TO_GGUF.items():
            add(f"blk.{layer}.{short}.weight", f"model.layers.{layer}.{hf}.weight", projection=True)
    add("output_norm.weight", "model.norm.weight")
    if "lm_head.weight" in tensors:
        if config.get("tie_word_embeddings", False):
            tensors.pop("lm_head.weight")  # tied: the same values as token_embd
        else:
            add("output.weight", "lm_head.weight")
    elif not config.get("tie_word_embeddings", False):
        fail(f"{checkpoint_dir}: untied model without lm_head.weight")
    if tensors:
        fail(f"{checkpoint_dir}: unexpected tensors {sorted(tensors)[:5]}")

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint_dir")
    parser.add_argument("out")
    parser.add_argument("--outtype", choices=["bf16", "f32", "q8_0"], default="bf16")
    args = parser.parse_args()
    if not os.path.isdir(args.checkpoint_dir):
        fail(f"{args.checkpoint_dir} is not a directory")
    convert(args.checkpoint_dir, args.out, args.outtype)


if __name__ == "__main__":
    main()
