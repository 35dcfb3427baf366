"""bench/cpu_model/fp8_table.py (issue #31 item 6's measurement command) on the tiny shape, in a
few seconds: it exits 0 and prints both tables with every row and a roofline share per figure;
the bytes a decode step reads, as pdserve-bench-cpu accounts them, fall from bf16 to FP8 weights
(same KV) and from bf16 to FP8 KV (same weights) at every point (a property of the formats: 1
byte instead of 2); bad usage exits 2.
Environment: PDSERVE_BUILD_DIR, PDSERVE_SOURCE_DIR (set by CTest).
"""
import json
import os
import subprocess
import sys
import tempfile

BUILD = os.environ["PDSERVE_BUILD_DIR"]
SOURCE = os.environ["PDSERVE_SOURCE_DIR"]
SCRIPT = os.path.join(SOURCE, "bench/cpu_model/fp8_table.py")
CONFIG = os.path.join(SOURCE, "tests/data/reference/configs/tiny.json")


def main():
    failures = []
    with tempfile.TemporaryDirectory(prefix="pdserve-fp8-table-") as work:
        done = subprocess.run([sys.executable, SCRIPT, "--build-dir", BUILD, "--config", CONFIG, "--work-dir", work,
                               "--threads", "2", "--repeats", "1", "--prefill", "32", "--contexts", "0,32",
                               "--kv-contexts", "128", "--decode-steps", "2"],
                              capture_output=True, text=True, timeout=240)
        print(done.stdout)
        if done.returncode != 0:
            sys.exit(f"FAIL: fp8_table.py exited {done.returncode}: {done.stderr[-1000:]}")
        expected_rows = ["| prefill 32 |"] + [f"| decode batch {b}, context {c} |"
                                               for b in (1, 8) for c in (0, 32, 128)]
        for row in expected_rows:
            if row not in done.stdout:
                failures.append(f"no row {row!r}")
        if done.stdout.count("| decode batch") != 8 or done.stdout.count("% of ") < 2 * 9:
            failures.append("the tables do not have 6 + 2 decode rows, each figure with its roofline share")
        for part in ("Weights (KV bf16):", "KV cache at long context (FP8 weights):", "memcpy"):
            if part not in done.stdout:
                failures.append(f"no {part!r} in the report")
        with open(os.path.join(work, "fp8_table.json"), encoding="utf-8") as handle:
            runs = json.load(handle)["runs"]
        step_bytes = {(r["variant"], r["batch"], r["context"]): r["step_bytes"] for r in runs if r["kind"] == "decode"}
        for (variant, batch, context), value in step_bytes.items():
            if variant == "B" and not value < step_bytes[("A", batch, context)]:
                failures.append(f"FP8 weights read {value} bytes a step at {batch}:{context}, not fewer than bf16")
            if variant == "C" and not value < step_bytes[("B", batch, context)]:
                failures.append(f"FP8 KV reads {value} bytes a step at {batch}:{context}, not fewer than bf16 KV")
        bad = subprocess.run([sys.executable, SCRIPT, "--build-dir", BUILD, "--batches", "x"], capture_output=True,
                             text=True, timeout=60)
        if bad.returncode != 2 or "--batches" not in bad.stderr:
            failures.append(f"--batches x: exit {bad.returncode}, {bad.stderr!r}")
    if failures:
        sys.exit("FAIL: " + "; ".join(failures))
    print("PASS")


if __name__ == "__main__":
    main()
