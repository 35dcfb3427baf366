#!/usr/bin/python3
"""Writes a pdserve-golden-logits-v1 file: float64 Qwen3 logits for a prompt and greedy decode.

Run with /usr/bin/python3 (Debian python3-torch). See README.md in this folder for the format.
"""

import argparse
import json
import os
import sys

import torch

from qwen3_model import Qwen3Reference
from safetensors_reader import Checkpoint, CheckpointError
from seeded_ids import probe_ids

GOLDEN_FORMAT = "pdserve-golden-logits-v1"
TOP_K = 16
PROBE_COUNT = 256
PROBE_SEED = 20250607
REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SAFETENSORS_DTYPE_NAMES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32",
                           "F64": "float64"}


def summarize_logits(logits: torch.Tensor, probes: torch.Tensor) -> dict:
    """Top-k (ties broken by lower id), probe values and logsumexp of one float64 logit row."""
    order = torch.sort(logits, descending=True, stable=True).indices[:TOP_K]
    return {
        "top_ids": order.tolist(),
        "top_logits": logits[order].tolist(),
        "probe_logits": logits[probes].tolist(),
        "logsumexp": torch.logsumexp(logits, dim=0).item(),
    }


def run_reference(model: Qwen3Reference, prompt: list, decode_steps: int,
                  probes: list) -> tuple:
    """Prefills `prompt`, then feeds back its own greedy token `decode_steps` times."""
    probe_index = torch.tensor(probes)
    cache = model.new_cache()
    prompt_logits = model.forward(prompt, cache)
    prompt_positions = [{"position": position, **summarize_logits(row, probe_index)}
                        for position, row in enumerate(prompt_logits)]
    steps = []
    next_token = int(torch.argmax(prompt_logits[-1]))
    for step in range(decode_steps):
        position = len(prompt) + step
        logits = model.forward([next_token], cache)[0]
        summary = summarize_logits(logits, probe_index)
        greedy = summary["top_ids"][0]
        steps.append({"position": position, "input_token": next_token, "greedy_token": greedy,
                      **summary, "margin": summary["top_logits"][0] - summary["top_logits"][1]})
        next_token = greedy
    return prompt_positions, steps


def checkpoint_dtype_name(model_dir: str) -> str:
    with Checkpoint(model_dir) as checkpoint:
        dtypes = {checkpoint.dtype_of(name) for name in checkpoint.names()}
    if len(dtypes) != 1:
        raise CheckpointError(f"{model_dir}: mixed tensor dtypes {sorted(dtypes)}")
    return SAFETENSORS_DTYPE_NAMES[dtypes.pop()]


def repo_relative(path: str) -> str:
    absolute = os.path.abspath(path)
    if os.path.commonpath([absolute, REPO_ROOT]) != REPO_ROOT:
        raise CheckpointError(f"{path}: source config must live inside the repository "
                              f"{REPO_ROOT}")
    return os.path.relpath(absolute, REPO_ROOT)


def write_golden(path: str, golden: dict) -> None:
    """JSON with one prompt position / decode step per line; floats as float64 repr."""
    lines = ["{"]
    scalar_keys = [key for key in golden if key not in ("prompt_positions", "decode_steps")]
    for key in scalar_keys:
        lines.append(f"  {json.dumps(key)}: {json.dumps(golden[key])},")
    for key, last in (("prompt_positions", False), ("decode_steps", True)):
        entries = ",\n".join(f"    {json.dumps(entry)}" for entry in golden[key])
        lines.append(f"  {json.dumps(key)}: [\n{entries}\n  ]" + ("" if last else ","))
    lines.append("}")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("\n".join(lines) + "\n")


def parse_ids(text: str) -> list:
    try:
        ids = [int(part) for part in text.split(",")]
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers: {error}")
    if not ids:
        raise argparse.ArgumentTypeError("prompt must hold at least one id")
    return ids


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", required=True, help="HF folder: config.json + safetensors")
    parser.add_argument("--prompt-ids", required=True, type=parse_ids, help="e.g. 1,2,3")
    parser.add_argument("--decode-steps", type=int, default=16)
    parser.add_argument("--out", required=True, help="golden JSON to write")
    parser.add_argument("--source-config", required=True,
                        help="config.json given to pdserve-make-model (inside the repo)")
    parser.add_argument("--seed", type=int, required=True,
                        help="seed given to pdserve-make-model")
    args = parser.parse_args()
    if args.decode_steps < 0:
        parser.error("--decode-steps must be >= 0")

    try:
        model = Qwen3Reference.from_checkpoint(args.model, torch.float64)
        config = model.config
        probes = probe_ids(PROBE_COUNT, config.vocab_size, PROBE_SEED)
        prompt_positions, steps = run_reference(model, args.prompt_ids, args.decode_steps,
                                                probes)
        golden = {
            "format": GOLDEN_FORMAT,
            "model": {"config": repo_relative(args.source_config), "seed": args.seed,
                      "layers": config.num_layers, "dtype": checkpoint_dtype_name(args.model),
                      "tie": "tie" if config.tie_word_embeddings else "untie"},
            "prompt_ids": args.prompt_ids,
            "probe_ids": probes,
            "prompt_positions": prompt_positions,
            "decode_steps": steps,
        }
        write_golden(args.out, golden)
    except CheckpointError as error:
        print(f"qwen3_reference: error: {error}", file=sys.stderr)
        return 2
    except OSError as error:
        print(f"qwen3_reference: error: cannot write {args.out}: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
