#!/usr/bin/python3
"""Prompt-copying workloads for pdserve-bench-spec-decode (issue #30), and n-gram's acceptance
on them, computed offline.

Random weights never copy from their prompt, so prompt lookup's acceptance on a synthetic model
says nothing about copying text. Here the text is real and tokenized with the real Qwen3
tokenizer (configs/models/qwen3-tokenizer, Hugging Face `tokenizers`); each workload is a prompt
and the reference output a model would be expected to write:
  code-rename: a source file of this repository and an instruction to rename a variable; the
               reference is the whole file with the variable renamed;
  code-comment: another source file and an instruction to reword one comment; the reference is
               the file with that comment changed;
  summary-quotes: a section of docs/SPECULATIVE.md and an instruction to summarise it quoting
               it; the reference quotes the first sentence of each step, with a few words of
               its own around each quote.
For every position i of the reference, prompt lookup (vLLM's rule, as
common/engine/spec_decode/ngram_proposer.cpp: n from max down to min, earliest match, at most
k tokens, at most reference length - i - 1 so that the bonus token fits) proposes p_i tokens
from prompt + reference[:i], of which the reference accepts a_i (the longest common prefix).
Walking the reference as a greedy target would (i += a_i + 1) gives the workload's acceptance.
The JSON written holds the prompt's token ids and p_i, a_i at every position:
pdserve-bench-spec-decode --profile replays exactly that acceptance in the engine.

Usage: copy_workload.py --out profile.json [--k 4 --min 1 --max 3]
"""
import argparse
import json
import os
import re
import sys

from tokenizers import Tokenizer

SOURCE_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOKENIZER = os.path.join(SOURCE_DIR, "configs/models/qwen3-tokenizer/tokenizer.json")


def read(path):
    with open(os.path.join(SOURCE_DIR, path), encoding="utf-8") as f:
        return f.read()


def code_rename():
    source = read("common/engine/spec_decode/ngram_proposer.cpp")
    edited = re.sub(r"\bcount\b", "num_proposed", source)
    assert edited != source
    instruction = ("Rename the local variable `count` to `num_proposed` in this file. "
                   "Reply with the whole file and nothing else.\n\n")
    return instruction + source, edited


def code_comment():
    source = read("common/engine/spec_decode/adaptive_speculation.cpp")
    first_comment = re.search(r"^\s*// (.*)$", source, re.MULTILINE)
    assert first_comment is not None
    edited = source.replace(first_comment.group(1),
                            "Reworded: " + first_comment.group(1).lower(), 1)
    instruction = ("Reword the first comment of this file, keep everything else as it is. "
                   "Reply with the whole file.\n\n")
    return instruction + source, edited


def summary_quotes():
    doc = read("docs/SPECULATIVE.md")
    section = doc[doc.index("## How a step works"):doc.index("## When speculation turns itself off")]
    steps = re.findall(r"^\d+\. \*\*(.+?)\*\*(.+?)(?=^\d+\. |\Z)", section, re.MULTILINE | re.DOTALL)
    assert len(steps) >= 4
    lines = []
    for number, (title, body) in enumerate(steps, 1):
        text = " ".join(body.split())
        sentence = text[:text.index(". ") + 1] if ". " in text else text
        lines.append(f"Step {number}, {title.strip(' :').lower()}: the document says \"{sentence.strip(': ')}\"")
    instruction = ("Summarise the following section, quoting its own words for each step.\n\n")
    return instruction + section, "\n".join(lines) + "\n"


WORKLOADS = {"code-rename": code_rename, "code-comment": code_comment, "summary-quotes": summary_quotes}


def ngram_lookup(tokens, min_n, max_n, max_tokens):
    """vLLM's prompt lookup: the longest suffix n-gram (max_n down to min_n) found earlier in
    `tokens`, earliest occurrence; the up to max_tokens tokens after it."""
    length = len(tokens)
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        if max_tokens <= 0:
            break
        suffix = tokens[length - n:]
        for start in range(0, length - n):
            if tokens[start:start + n] == suffix:
                return tokens[start + n:start + n + max_tokens]
    return []


def profile(prompt_ids, reference_ids, k, min_n, max_n):
    proposed, accepted = [], []
    for i in range(len(reference_ids)):
        context = prompt_ids + reference_ids[:i]
        proposal = ngram_lookup(context, min_n, max_n, min(k, len(reference_ids) - i - 1))
        hits = 0
        while hits < len(proposal) and proposal[hits] == reference_ids[i + hits]:
            hits += 1
        proposed.append(len(proposal))
        accepted.append(hits)
    # The greedy path: each step emits its accepted drafts and one token of the target's.
    steps = drafted = taken = i = 0
    while i < len(reference_ids):
        steps += 1
        drafted += proposed[i]
        taken += accepted[i]
        i += accepted[i] + 1
    return proposed, accepted, {"steps": steps, "draft_tokens": drafted, "accepted_tokens": taken,
                                "acceptance": taken / drafted if drafted else 0.0,
                                "tokens_per_step": len(reference_ids) / steps}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--min", type=int, default=1, dest="min_n")
    parser.add_argument("--max", type=int, default=3, dest="max_n")
    args = parser.parse_args()
    tokenizer = Tokenizer.from_file(TOKENIZER)
    out = {"k": args.k, "prompt_lookup_min": args.min_n, "prompt_lookup_max": args.max_n, "workloads": []}
    for name, build in WORKLOADS.items():
        prompt, reference = build()
        prompt_ids = tokenizer.encode(prompt, add_special_tokens=False).ids
        reference_ids = tokenizer.encode(reference, add_special_tokens=False).ids
        proposed, accepted, path = profile(prompt_ids, reference_ids, args.k, args.min_n, args.max_n)
        out["workloads"].append({"name": name, "prompt_ids": prompt_ids, "reference_tokens": len(reference_ids),
                                 "proposed": proposed, "accepted": accepted, "path": path})
        print(f"workload={name} prompt_tokens={len(prompt_ids)} reference_tokens={len(reference_ids)} "
              f"steps={path['steps']} draft_tokens={path['draft_tokens']} accepted={path['accepted_tokens']} "
              f"acceptance={path['acceptance']:.3f} tokens_per_step={path['tokens_per_step']:.2f}", flush=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(out, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
