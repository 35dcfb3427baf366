#!/usr/bin/env python3
"""Compares two greedy runs of the same prompt (token ids and the float32 logits each token was
picked from, as `pdserve-generate --print-ids --logits-out` writes them, or as hf_compare.py
gets them from Hugging Face) and says whether they agree. numpy only.

Rows are comparable up to and including the first position where the ids differ (after it the
runs continue from different tokens). Per comparable row: the relative error
||candidate - reference|| / ||reference||. At the first difference: the reference's top-2
margin, the reference's logit gap from its token to the candidate's, and the candidate's rank
in the reference row.

A tie is judged against the noise of the whole row: the root-mean-square logit error there.
(The errors at the two tokens involved always explain a flip, so they prove nothing; a kernel
bug that moves one logit stands out against the rest of the row.)

  strict  (float32 against float32): the ids are equal, or the first difference is a tie: the
          reference's gap to the candidate's token is at most max(--tie-margin, 4 x that row's
          RMS logit error); and every row's error is within --max-row-error.
  report  (bf16 against float32): the rows' errors are within --max-row-error and at the first
          difference the candidate's token is among the reference's top --top-k.

Usage: compare_runs.py --reference IDS LOGITS --candidate IDS LOGITS --mode strict|report
                       [--label TEXT] [--json FILE (a line is appended)]
Exit status 0 when the runs agree, 1 when not, 2 for bad input.
"""
import argparse
import json
import sys

import numpy as np

DEFAULT_ROW_ERROR = {"strict": 1e-3, "report": 0.1}


def load_ids(path):
    with open(path, encoding="utf-8") as handle:
        ids = json.loads(handle.read().strip().splitlines()[-1])
    if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
        raise ValueError(f"{path}: not a JSON array of token ids")
    return ids


def load_logits(path, rows=None):
    logits = np.load(path)
    if logits.ndim != 2 or (rows is not None and logits.shape[0] != rows):
        raise ValueError(f"{path}: logits of shape {logits.shape}, expected ({rows}, vocab)")
    return logits.astype(np.float64)


def first_difference(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None


def row_errors(candidate, reference):
    """Per-row relative L2 error (absolute where a reference row is all zero)."""
    difference = np.linalg.norm(candidate - reference, axis=1)
    norm = np.linalg.norm(reference, axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        relative = np.where(norm > 0, difference / np.where(norm > 0, norm, 1), difference)
    relative[~np.isfinite(relative)] = np.inf
    return relative


def compare(reference_ids, reference_logits, candidate_ids, candidate_logits, mode,
            max_row_error=None, tie_margin=2e-3, top_k=5):
    """The comparison as a dict; its "ok" says whether the runs agree under `mode`."""
    if mode not in DEFAULT_ROW_ERROR:
        raise ValueError(f"unknown mode {mode}")
    if max_row_error is None:
        max_row_error = DEFAULT_ROW_ERROR[mode]
    count = min(len(reference_ids), len(candidate_ids))
    first = first_difference(reference_ids[:count], candidate_ids[:count])
    comparable = count if first is None else first + 1
    errors = row_errors(candidate_logits[:comparable], reference_logits[:comparable])
    result = {
        "mode": mode,
        "tokens": count,
        "equal_ids": first is None and len(reference_ids) == len(candidate_ids),
        "first_difference": first,
        "rows_compared": comparable,
        "worst_row_error": float(errors.max()) if comparable else 0.0,
        "worst_row": int(errors.argmax()) if comparable else None,
        "max_row_error": max_row_error,
    }
    problems = []
    if comparable and result["worst_row_error"] > max_row_error:
        problems.append(f"row {result['worst_row']} error {result['worst_row_error']:.3g} > "
                        f"{max_row_error:.3g}")
    if len(reference_ids) != len(candidate_ids):
        problems.append(f"{len(candidate_ids)} tokens against {len(reference_ids)}")
    if first is not None:
        row = reference_logits[first]
        order = np.argsort(-row, kind="stable")
        reference_token = reference_ids[first]
        candidate_token = candidate_ids[first]
        gap = float(row[reference_token] - row[candidate_token])
        rms_error = float(np.sqrt(np.mean((candidate_logits[first] - row) ** 2)))
        candidate_row = candidate_logits[first]
        candidate_order = np.argsort(-candidate_row, kind="stable")
        result.update({
            "reference_token": reference_token,
            "candidate_token": candidate_token,
            "reference_top2_margin": float(row[order[0]] - row[order[1]]),
            "candidate_top2_margin": float(candidate_row[candidate_order[0]] -
                                           candidate_row[candidate_order[1]]),
            "reference_gap_to_candidate": gap,
            "candidate_rank_in_reference": int(np.nonzero(order == candidate_token)[0][0]),
            "rms_logit_error_there": rms_error,
        })
        if mode == "strict":
            allowed = max(tie_margin, 4 * rms_error)
            result["tie_allowance"] = allowed
            if gap > allowed:
                problems.append(f"ids differ at {first} where the reference prefers its token by "
                                f"{gap:.3g} (> {allowed:.3g}: not a tie)")
        elif result["candidate_rank_in_reference"] >= top_k:
            problems.append(f"at {first} the candidate's token ranks "
                            f"{result['candidate_rank_in_reference']} in the reference (top {top_k} "
                            "expected)")
    result["problems"] = problems
    result["ok"] = not problems
    return result


def describe(label, result):
    text = (f"{label}: {'ok' if result['ok'] else 'FAIL'} [{result['mode']}] "
            f"{result['tokens']} tokens, ")
    if result["first_difference"] is None:
        text += "ids equal"
    else:
        text += (f"ids equal up to {result['first_difference']}, then reference "
                 f"{result['reference_token']} (top-2 margin {result['reference_top2_margin']:.4g}) "
                 f"vs {result['candidate_token']} (rank {result['candidate_rank_in_reference']}, "
                 f"gap {result['reference_gap_to_candidate']:.4g}, candidate margin "
                 f"{result['candidate_top2_margin']:.4g})")
    text += f"; worst row error {result['worst_row_error']:.3g} over {result['rows_compared']} rows"
    if result["problems"]:
        text += "; " + "; ".join(result["problems"])
    return text


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reference", nargs=2, metavar=("IDS", "LOGITS"), required=True)
    parser.add_argument("--candidate", nargs=2, metavar=("IDS", "LOGITS"), required=True)
    parser.add_argument("--mode", choices=sorted(DEFAULT_ROW_ERROR), required=True)
    parser.add_argument("--max-row-error", type=float)
    parser.add_argument("--tie-margin", type=float, default=2e-3)
    parser.add_argument("--top-k", type=int, default=5)
    parser.add_argument("--label", default="comparison")
    parser.add_argument("--json", help="append the result as one JSON line to this file")
    args = parser.parse_args(argv)
    try:
        reference_ids = load_ids(args.reference[0])
        candidate_ids = load_ids(args.candidate[0])
        reference_logits = load_logits(args.reference[1], len(reference_ids))
        candidate_logits = load_logits(args.candidate[1], len(candidate_ids))
        if reference_logits.shape[1] != candidate_logits.shape[1]:
            raise ValueError("the two runs' vocabularies differ")
    except (OSError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    result = compare(reference_ids, reference_logits, candidate_ids, candidate_logits, args.mode,
                     args.max_row_error, args.tie_margin, args.top_k)
    result["label"] = args.label
    print(describe(args.label, result))
    if args.json:
        with open(args.json, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(result) + "\n")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
