#!/usr/bin/python3
"""Runs ctest with the given arguments, then prints one closing line that CI reads,
'N passed, N failed, N skipped', and exits with ctest's exit code.

CTest's own summary counts a skipped test as passed ("100% tests passed" with the CUDA tests
skipped); this line does not. The counts come from ctest's JUnit report:
  * passed: status "run";
  * skipped: a test that reported itself skipped (SKIP_RETURN_CODE, e.g. the CUDA tests' 77
    without a device; SKIP_REGULAR_EXPRESSION, e.g. GTEST_SKIP's "[  SKIPPED ]") or one marked
    DISABLED;
  * failed: everything else, including a test that could not start (ctest counts it failed,
    while its JUnit report files it as not run).
Usage: scripts/ctest_summary.py [ctest arguments...]
"""
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ElementTree

# The <skipped message> CTest writes for a test that skipped itself (cmCTestTestHandler).
SELF_SKIP_MESSAGES = ("SKIP_RETURN_CODE=", "SKIP_REGULAR_EXPRESSION_MATCHED")


def outcome(testcase):
    status = testcase.get("status")
    if status == "run":
        return "passed"
    if status == "disabled":
        return "skipped"
    skipped = testcase.find("skipped")
    if status == "notrun" and skipped is not None and \
            skipped.get("message", "").startswith(SELF_SKIP_MESSAGES):
        return "skipped"
    return "failed"


def summary_line(junit_path):
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    for testcase in ElementTree.parse(junit_path).getroot().iter("testcase"):
        counts[outcome(testcase)] += 1
    return f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped"


def main(ctest_args):
    with tempfile.TemporaryDirectory(prefix="ctest-summary-") as folder:
        junit = os.path.join(folder, "results.xml")
        code = subprocess.run(["ctest", *ctest_args, "--output-junit", junit], check=False).returncode
        sys.stdout.flush()
        try:
            line = summary_line(junit)
        except (OSError, ElementTree.ParseError) as error:
            print(f"ctest_summary: no test results to count ({error})", file=sys.stderr)
            return code if code != 0 else 1
    print(line, flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
