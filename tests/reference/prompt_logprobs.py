#!/usr/bin/python3
"""The float64 reference's prompt logprobs: for each prompt (token ids, one JSON list per line
on stdin), the log-softmax of the logits at position p - 1 at the prompt token p, for p >= 1,
and the `--top` best tokens there (ties to the lower id). Writes one JSON object per prompt:
{"logprobs": [float, ...], "top": [[[id, logprob], ...], ...]} (both one entry per position
p >= 1). The oracle of the serving tests' prompt logprobs and of the lm-eval test.

Run with /usr/bin/python3 (Debian python3-torch): prompt_logprobs.py --model DIR [--top N].
"""

import argparse
import json
import sys

import torch

from qwen3_model import Qwen3Reference


def prompt_logprobs(model: Qwen3Reference, prompt: list, top: int) -> dict:
    logits = model.forward(prompt, model.new_cache())
    logprobs = torch.log_softmax(logits, dim=-1)
    tokens = torch.tensor(prompt[1:])
    positions = torch.arange(len(prompt) - 1)
    result = {"logprobs": logprobs[positions, tokens].tolist(), "top": []}
    for row in logprobs[:-1]:
        order = torch.sort(row, descending=True, stable=True).indices[:top]
        result["top"].append([[int(token), row[token].item()] for token in order])
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="checkpoint folder")
    parser.add_argument("--top", type=int, default=0, help="alternatives per position")
    args = parser.parse_args()
    model = Qwen3Reference.from_checkpoint(args.model, torch.float64)
    for line in sys.stdin:
        if line.strip():
            print(json.dumps(prompt_logprobs(model, json.loads(line), args.top)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
