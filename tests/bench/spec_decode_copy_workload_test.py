"""The prompt-copying workloads of pdserve-bench-spec-decode (issue #30, docs/SPECULATIVE.md
"Measuring on copying text"). copy_workload.py on the real Qwen3 tokenizer: its prompt lookup is
checked against an independent simulation written here from the rule's words (for each position,
the longest suffix n-gram, earliest earlier occurrence), and copying text must be mostly
accepted. Then the bench replays those profiles on a tiny model (batch 1 and 3): the replayed
drafts must be verified, partly accepted and not all accepted (the profile's wrong tokens are
rejected), and every speculative run's output must equal the run without speculation; misuse
(profile mode without a profile or an "off" run, an inconsistent profile) exits 2.
"""
import json
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
import pdserve_testing as t  # noqa: E402

sys.path.insert(0, os.path.join(t.SOURCE, "bench", "spec_decode_engine"))
import copy_workload  # noqa: E402

t.set_deadline(200)
BENCH = os.path.join(t.BUILD, "bench/spec_decode_engine/pdserve-bench-spec-decode")


def proposal_by_definition(tokens, min_n, max_n, k):
    """Prompt lookup spelled out differently: every earlier window per n, the first that equals
    the suffix wins; n tried from the largest down."""
    for n in range(max_n, min_n - 1, -1):
        if n >= len(tokens):
            continue
        suffix = tuple(tokens[-n:])
        windows = [start for start in range(len(tokens) - n) if tuple(tokens[start:start + n]) == suffix]
        if windows:
            return tokens[windows[0] + n:windows[0] + n + k]
    return []


def check_profiles(path):
    out = subprocess.run([sys.executable, os.path.join(t.SOURCE, "bench/spec_decode_engine/copy_workload.py"),
                          "--out", path], capture_output=True, text=True, timeout=120)
    t.expect_equal(out.returncode, 0, f"copy_workload.py: {out.stderr[-500:]}")
    profiles = json.load(open(path))
    t.expect_equal([w["name"] for w in profiles["workloads"]], ["code-rename", "code-comment", "summary-quotes"],
                   "workloads")
    for w in profiles["workloads"]:
        t.expect(all(0 <= a <= p <= 4 for p, a in zip(w["proposed"], w["accepted"])), f"{w['name']}: 0 <= a <= p <= k")
        # Copying text: most drafts are right (an edit or a quote leaves long copied runs).
        t.expect(w["path"]["acceptance"] > 0.4, f"{w['name']}: acceptance {w['path']['acceptance']}")
    # The script's lookup against the definition, on its own workload and on edge cases.
    prompt, reference = copy_workload.code_rename()
    tokens = [sum(map(ord, word)) % 50 for word in (prompt + reference).split()][:600]
    for end in range(1, len(tokens)):
        t.expect_equal(copy_workload.ngram_lookup(tokens[:end], 1, 3, 4),
                       proposal_by_definition(tokens[:end], 1, 3, 4), f"lookup at {end}")
    t.expect_equal(copy_workload.ngram_lookup([5, 6, 7, 5, 6, 8, 5, 6], 1, 3, 4), [7, 5, 6, 8], "earliest match")
    t.expect_equal(copy_workload.ngram_lookup([1, 2, 3], 1, 3, 4), [], "no match")
    return profiles


def check_replay(path):
    model = t.make_model()
    # No warm-up: every sequence starts at the rule's prior (k accepted), so its first decode
    # steps verify whatever the step times say later (the adaptive rule may then stop it).
    out = t.run([BENCH, "--model", model, "--profile", path, "--batch", "1,3", "--modes", "off,profile",
                 "--rounds", "1", "--max-tokens", "40", "--warmup-tokens", "0", "--threads", "1"], timeout=150)
    print(out, flush=True)
    rows = [dict(re.findall(r"(\w+)=(\S+)", line)) for line in out.splitlines() if " mode=" in line]
    t.expect_equal(len(rows), 3 * 2 * 2, "a line per workload, batch and mode")
    t.expect(all(row["same_as_off"] == "1" for row in rows), "every run's output equals the run without drafts")
    replayed = [r for r in rows if r["mode"] == "profile"]
    drafts = sum(int(r["draft_tokens"]) for r in replayed)
    accepted = sum(int(r["accepted"]) for r in replayed)
    # The right tokens are accepted, the wrong ones (a_i < p_i somewhere) rejected.
    t.expect(0 < accepted < drafts, f"replayed profiles: {accepted} of {drafts} draft tokens accepted")
    t.expect(len(re.findall(r"offline_ngram_acceptance=0\.\d+", out)) == 3, "the offline acceptance is printed")
    # Misuse exits 2 and says why.
    bad = os.path.join(t.work_dir(), "bad-profile.json")
    with open(bad, "w") as f:
        json.dump({"workloads": [{"name": "x", "prompt_ids": [1], "proposed": [1], "accepted": [2],
                                  "path": {"acceptance": 1.0}}]}, f)
    for args, expected in [(["--modes", "off,profile"], "needs --profile"),
                           (["--profile", path, "--modes", "profile"], "off before profile"),
                           (["--profile", bad, "--modes", "off,profile"], "accepted[i] <= proposed[i]")]:
        result = subprocess.run([BENCH, "--model", model, *args], capture_output=True, text=True, timeout=60)
        t.expect_equal(result.returncode, 2, f"exit code of {args}")
        t.expect(expected in result.stderr, f"{args}: {result.stderr[-300:]}")


def main():
    path = os.path.join(t.work_dir(), "copy-profile.json")
    failed = t.run_checks([("copy_workload.py's profiles", lambda: check_profiles(path)),
                           ("the bench replays them exactly", lambda: check_replay(path))])
    t.finish(failed)


if __name__ == "__main__":
    main()
