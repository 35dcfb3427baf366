#!/usr/bin/env python3
"""pdserve against Hugging Face transformers' own Qwen3ForCausalLM on the same checkpoint.

For each pdserve run (token ids and logits of `pdserve-generate --print-ids --logits-out`, one
pair of files per prompt) the model is loaded in the run's dtype on --device and:
  1. teacher-forced on prompt + pdserve's ids: transformers' logits at every generated
     position against pdserve's (per-row relative error), and every position where
     transformers' argmax is not pdserve's token, with transformers' margin there;
  2. generates greedily on its own: its ids against pdserve's (compare_runs.py's rules).
float32 runs are strict (TF32 off in PyTorch; a differing position must be a tie: margin at
most max(--tie-margin, 4 x the row's RMS logit error)); bfloat16 runs are reported, and
fail only if a row is off by more than --bf16-row-error or pdserve's token is outside
transformers' top 5.

Usage: hf_compare.py --model DIR --prompts PROMPTS.json --run DTYPE:DIR:LABEL [--run ...]
                     [--device cuda] [--json FILE]
  PROMPTS.json: a JSON list of prompts (lists of token ids); DIR holds prompt-I.ids.json and
  prompt-I.logits.npy for prompt I. Exit status 0 when every run agrees, 1 when not, 2 for bad
  input or a missing torch/transformers.
"""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_runs  # noqa: E402

TORCH_DTYPES = {"float32": "float32", "bfloat16": "bfloat16"}


def teacher_forced_logits(model, prompt, ids, device):
    """Row i: the logits the model gives at position len(prompt) - 1 + i of prompt + ids[:-1],
    i.e. those ids[i] was picked from (float64, [len(ids), vocab])."""
    import torch
    tokens = torch.tensor([list(prompt) + list(ids[:-1])], dtype=torch.long, device=device)
    with torch.no_grad():
        output = model(input_ids=tokens, use_cache=False)
    rows = output.logits[0, len(prompt) - 1:, :]
    return rows.float().cpu().numpy().astype(np.float64)


def greedy_ids(model, prompt, count, device):
    """`count` greedy tokens through the model's own KV cache."""
    import torch
    ids = []
    past = None
    inputs = torch.tensor([list(prompt)], dtype=torch.long, device=device)
    with torch.no_grad():
        for _ in range(count):
            output = model(input_ids=inputs, past_key_values=past, use_cache=True)
            past = output.past_key_values
            token = int(torch.argmax(output.logits[0, -1]))
            ids.append(token)
            inputs = torch.tensor([[token]], dtype=torch.long, device=device)
    return ids


def compare_teacher_forced(ids, pdserve_logits, hf_logits, strict, max_row_error, tie_margin,
                           top_k=5):
    """pdserve's rows and tokens against transformers' rows along pdserve's own tokens."""
    errors = compare_runs.row_errors(pdserve_logits, hf_logits)
    hf_top = hf_logits.argmax(axis=1)
    differing = []
    problems = []
    for position, token in enumerate(ids):
        if hf_top[position] == token:
            continue
        row = hf_logits[position]
        order = np.argsort(-row, kind="stable")
        margin = float(row[hf_top[position]] - row[token])
        rms_error = float(np.sqrt(np.mean((pdserve_logits[position] - row) ** 2)))
        rank = int(np.nonzero(order == token)[0][0])
        differing.append({"position": position, "pdserve": int(token), "hf": int(hf_top[position]),
                          "hf_margin": margin, "rank_in_hf": rank,
                          "rms_logit_error": rms_error})
        if strict and margin > max(tie_margin, 4 * rms_error):
            problems.append(f"position {position}: transformers prefers {int(hf_top[position])} "
                            f"over pdserve's {token} by {margin:.3g} (not a tie)")
        if not strict and rank >= top_k:
            problems.append(f"position {position}: pdserve's {token} ranks {rank} in transformers")
    worst = float(errors.max()) if len(errors) else 0.0
    if worst > max_row_error:
        problems.append(f"row {int(errors.argmax())} error {worst:.3g} > {max_row_error:.3g}")
    return {"worst_row_error": worst, "mean_row_error": float(errors.mean()) if len(errors) else 0.0,
            "positions": len(ids), "differing_positions": differing, "problems": problems,
            "ok": not problems}


def load_model(model_dir, dtype, device):
    """transformers' Qwen3ForCausalLM in `dtype` with eager attention, TF32 off."""
    import torch
    from transformers import Qwen3ForCausalLM
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    torch_dtype = getattr(torch, TORCH_DTYPES[dtype])
    model = Qwen3ForCausalLM.from_pretrained(model_dir, dtype=torch_dtype,
                                             attn_implementation="eager")
    return model.to(device).eval()


def compare_run(model, prompts, run_dir, label, strict, args):
    """Both comparisons for every prompt of one pdserve run; the records."""
    records = []
    for index, prompt in enumerate(prompts):
        ids = compare_runs.load_ids(os.path.join(run_dir, f"prompt-{index}.ids.json"))
        logits = compare_runs.load_logits(os.path.join(run_dir, f"prompt-{index}.logits.npy"),
                                          len(ids))
        hf_logits = teacher_forced_logits(model, prompt, ids, args.device)
        max_row_error = args.f32_row_error if strict else args.bf16_row_error
        forced = compare_teacher_forced(ids, logits, hf_logits, strict, max_row_error,
                                        args.tie_margin)
        hf_ids = greedy_ids(model, prompt, len(ids), args.device)
        # Transformers' rows along pdserve's ids are its own up to their first difference.
        free = compare_runs.compare(hf_ids, hf_logits, ids, logits,
                                    "strict" if strict else "report", max_row_error,
                                    args.tie_margin)
        record = {"label": label, "prompt": index, "prompt_tokens": len(prompt),
                  "teacher_forced": forced, "free_running": free,
                  "ok": forced["ok"] and free["ok"]}
        records.append(record)
        print(f"{label} prompt {index} ({len(prompt)} tokens): {'ok' if record['ok'] else 'FAIL'}; "
              f"teacher-forced worst row error {forced['worst_row_error']:.3g} "
              f"(mean {forced['mean_row_error']:.3g}), argmax differs at "
              f"{len(forced['differing_positions'])} of {forced['positions']} positions"
              + "".join(f" [{d['position']}: margin {d['hf_margin']:.4g}, rank {d['rank_in_hf']}]"
                        for d in forced["differing_positions"][:8])
              + "; " + compare_runs.describe("free-running greedy vs transformers", free)
              + ("; " + "; ".join(forced["problems"]) if forced["problems"] else ""),
              flush=True)
    return records


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--prompts", required=True)
    parser.add_argument("--run", action="append", required=True, metavar="DTYPE:DIR:LABEL")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tie-margin", type=float, default=2e-3)
    parser.add_argument("--f32-row-error", type=float, default=1e-3)
    parser.add_argument("--bf16-row-error", type=float, default=0.1)
    parser.add_argument("--json", help="write every record to this file")
    args = parser.parse_args(argv)
    runs = []
    for spec in args.run:
        parts = spec.split(":", 2)
        if len(parts) != 3 or parts[0] not in TORCH_DTYPES:
            print(f"error: --run {spec}: expected DTYPE:DIR:LABEL with DTYPE float32 or bfloat16",
                  file=sys.stderr)
            return 2
        runs.append(parts)
    try:
        with open(args.prompts, encoding="utf-8") as handle:
            prompts = json.load(handle)
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except (OSError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except ImportError as error:
        print(f"error: this python3 lacks PyTorch or transformers ({error})", file=sys.stderr)
        return 2
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, "
          f"device {args.device}", flush=True)
    records = []
    for dtype in TORCH_DTYPES:  # one model load per dtype
        mine = [run for run in runs if run[0] == dtype]
        if not mine:
            continue
        model = load_model(args.model, dtype, args.device)
        for _, run_dir, label in mine:
            records += compare_run(model, prompts, run_dir, label, dtype == "float32", args)
        del model
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(records, handle, indent=1)
    failed = [r for r in records if not r["ok"]]
    print(f"transformers comparison: {len(records) - len(failed)} of {len(records)} runs agree")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
