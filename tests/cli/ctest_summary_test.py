"""Tests of scripts/ctest_summary.py (scripts/test.sh's last step) on a small CTest project
whose tests pass, fail, skip themselves (exit 77 with SKIP_RETURN_CODE, like the CUDA tests
without a device; "[  SKIPPED ]" with SKIP_REGULAR_EXPRESSION, like GTEST_SKIP), are disabled,
or cannot start. The closing line must count each where it belongs (a skip is not a pass, a
test that cannot start is a failure, as ctest itself counts it), agree with ctest's own
summary, and the exit code must be ctest's.

Run by CTest (label cli) with Debian's /usr/bin/python3."""

import os
import re
import subprocess
import sys
import tempfile
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "scripts", "ctest_summary.py")

FIXTURE = r"""
cmake_minimum_required(VERSION 3.20)
project(summary_fixture NONE)
enable_testing()
add_test(NAME passes COMMAND true)
add_test(NAME passes_too COMMAND true)
add_test(NAME fails COMMAND false)
add_test(NAME skips_by_exit_code COMMAND sh -c "exit 77")
set_tests_properties(skips_by_exit_code PROPERTIES SKIP_RETURN_CODE 77)
add_test(NAME skips_by_output COMMAND sh -c "echo '[  SKIPPED ] no device'")
set_tests_properties(skips_by_output PROPERTIES SKIP_REGULAR_EXPRESSION "\\[  SKIPPED \\]")
add_test(NAME disabled COMMAND true)
set_tests_properties(disabled PROPERTIES DISABLED TRUE)
add_test(NAME cannot_start COMMAND /no/such/test-binary)
"""
SUMMARY = re.compile(r"^(\d+) passed, (\d+) failed, (\d+) skipped$")


class CtestSummaryTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.folder = tempfile.TemporaryDirectory(prefix="ctest-summary-test-")
        source = os.path.join(cls.folder.name, "source")
        cls.build = os.path.join(cls.folder.name, "build")
        os.mkdir(source)
        with open(os.path.join(source, "CMakeLists.txt"), "w", encoding="utf-8") as file:
            file.write(FIXTURE)
        subprocess.run(["cmake", "-S", source, "-B", cls.build], check=True, capture_output=True,
                       timeout=120)

    @classmethod
    def tearDownClass(cls):
        cls.folder.cleanup()

    def summarize(self, *ctest_args):
        result = subprocess.run([sys.executable, SCRIPT, "--test-dir", self.build, *ctest_args],
                                capture_output=True, text=True, timeout=120)
        lines = result.stdout.splitlines()
        self.assertTrue(lines, result.stderr)
        match = SUMMARY.match(lines[-1])
        self.assertIsNotNone(match, f"last line {lines[-1]!r}")
        return tuple(int(n) for n in match.groups()), result

    def test_every_outcome_is_counted_where_it_belongs(self):
        counts, result = self.summarize()
        self.assertEqual(counts, (2, 2, 3))
        # ctest's own summary agrees: its failures, and the tests it reports as not run.
        failed_of = re.search(r"(\d+) tests failed out of (\d+)", result.stdout)
        self.assertIsNotNone(failed_of, result.stdout)
        self.assertEqual(int(failed_of.group(1)), counts[1])
        not_run = re.findall(r"^\s+\d+ - \S+ \((Skipped|Disabled)\)$", result.stdout, re.MULTILINE)
        self.assertEqual(len(not_run), counts[2], result.stdout)
        self.assertNotEqual(result.returncode, 0, "ctest's failure must be the exit code")

    def test_a_run_without_failures_exits_zero_and_still_counts_its_skips(self):
        counts, result = self.summarize("-R", "^(passes|skips_by_exit_code)$")
        self.assertEqual(counts, (1, 0, 1))
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)


if __name__ == "__main__":
    unittest.main()
