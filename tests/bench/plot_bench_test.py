"""Tests of scripts/plot_bench.py: the figures are written (PNG and SVG, with the labels, rates
and span names they should show), the committed real run in docs/figures re-plots, output is
reproducible, and bad input exits 2 with a message that names the file and the field.

Run by CTest (label bench) with Debian's /usr/bin/python3, which needs python3-matplotlib."""

import copy
import json
import os
import subprocess
import sys
import tempfile
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "scripts", "plot_bench.py")
FIXTURE = os.path.join(REPO, "tests", "bench", "data", "with_timeline.json")
REAL_RUNS = os.path.join(REPO, "docs", "figures")
FIGURES = ["latency_cdf", "p90_vs_rate", "goodput_vs_rate"]


def setUpModule():
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise RuntimeError(f"{sys.executable} has no matplotlib: install python3-matplotlib "
                           "(bash scripts/setup.sh does)") from None


def run_script(*args, env=None):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True,
                          env=env, timeout=300)


def read(path):
    with open(path, "rb") as file:
        return file.read()


class PlotBenchTest(unittest.TestCase):
    def setUp(self):
        self.directory = tempfile.TemporaryDirectory()
        self.tmp = self.directory.name
        with open(FIXTURE, encoding="utf-8") as file:
            self.fixture = json.load(file)

    def tearDown(self):
        self.directory.cleanup()

    def write(self, name, data):
        path = os.path.join(self.tmp, name)
        with open(path, "w", encoding="utf-8") as file:
            file.write(data if isinstance(data, str) else json.dumps(data))
        return path

    def variant(self, name, label, rate, with_timelines=True):
        data = copy.deepcopy(self.fixture)
        data["label"] = label
        data["config"]["request_rate"] = rate
        if not with_timelines:
            for record in data["requests"]:
                record.pop("timeline", None)
        return self.write(name, data)

    def expect_figure(self, out, stem, *texts):
        png, svg = os.path.join(out, stem + ".png"), os.path.join(out, stem + ".svg")
        self.assertTrue(read(png).startswith(b"\x89PNG\r\n\x1a\n"), png)
        svg_text = read(svg).decode("utf-8")
        self.assertIn("<svg", svg_text)
        for text in texts:
            self.assertIn(text, svg_text, f"{svg} should show '{text}'")

    def test_two_labels_at_three_rates(self):
        files = [self.variant(f"{label}_{rate}.json", label, rate, with_timelines=(rate == 1))
                 for label in ("topo-A", "topo-B") for rate in (4, 1, 2)]
        files.append(self.variant("burst.json", "topo-A", None))  # all at once: no rate
        out = os.path.join(self.tmp, "figures")
        result = run_script(out, *files, "--slowest", "2")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.expect_figure(out, "latency_cdf", "topo-A @ 4 req/s", "topo-B @ 1 req/s",
                           "topo-A @ all at once", "SLO 100 ms", "SLO 40 ms")
        self.expect_figure(out, "p90_vs_rate", "topo-A", "topo-B", "request rate (req/s)")
        self.expect_figure(out, "goodput_vs_rate", "topo-A", "topo-B", "TTFT &lt;= 100 ms")
        # Only the rate-1 files have timelines; two requests of each are shown.
        for label in ("topo-A", "topo-B"):
            self.expect_figure(out, f"waterfall_{label}_1", "kv_transfer", "prefill_queue",
                               f"{label} @ 1 req/s: the 2 slowest requests")
        self.assertNotIn("waterfall_topo-A_4.png", os.listdir(out))
        self.assertIn("burst.json: request rate inf", result.stdout)
        self.assertIn("topo-B_4.json: no request has a timeline", result.stdout)
        self.assertEqual(result.stdout.count("left out of the rate plots"), 1)

    def test_output_is_reproducible(self):
        path = self.variant("run.json", "same", 3)
        first, second = os.path.join(self.tmp, "one"), os.path.join(self.tmp, "two")
        self.assertEqual(run_script(first, path).returncode, 0)
        self.assertEqual(run_script(second, path).returncode, 0)
        self.assertEqual(sorted(os.listdir(first)), sorted(os.listdir(second)))
        for name in os.listdir(first):
            self.assertEqual(read(os.path.join(first, name)), read(os.path.join(second, name)),
                             name)

    def test_committed_real_runs_replot(self):
        runs = sorted(os.path.join(REAL_RUNS, name) for name in os.listdir(REAL_RUNS)
                      if name.endswith(".json"))
        self.assertGreaterEqual(len(runs), 3, "docs/figures should hold the runs it plots")
        out = os.path.join(self.tmp, "real")
        result = run_script(out, *runs)
        self.assertEqual(result.returncode, 0, result.stderr)
        for stem in FIGURES:
            self.expect_figure(out, stem)

    def expect_bad_input(self, args, *fragments):
        result = run_script(os.path.join(self.tmp, "out"), *args)
        self.assertEqual(result.returncode, 2, f"{args}: {result.stderr}")
        for fragment in fragments:
            self.assertIn(fragment, result.stderr, args)

    def test_bad_input_exits_2_naming_the_problem(self):
        self.expect_bad_input([self.write("text.json", "not json")], "text.json: not JSON")
        self.expect_bad_input([self.write("list.json", "[1, 2]")], "list.json: expected a JSON object")
        self.expect_bad_input([os.path.join(self.tmp, "missing.json")], "missing.json: cannot read")

        def broken(name, change):
            data = copy.deepcopy(self.fixture)
            change(data)
            return self.write(name, data)

        cases = [
            (lambda d: d.pop("requests"), "missing 'requests'"),
            (lambda d: d["config"].pop("request_rate"), "config: missing 'request_rate'"),
            (lambda d: d["config"].update(request_rate="fast"), "config.request_rate: expected"),
            (lambda d: d["ttft_ms"].pop("p90"), "ttft_ms: missing 'p90'"),
            (lambda d: d.update(label=7), "label: expected a string"),
            (lambda d: d["requests"][1].pop("ttft_ms"), "requests[1]: missing 'ttft_ms'"),
            (lambda d: d["requests"][0].update(itl_ms=[1, "x"]), "requests[0].itl_ms: expected"),
            (lambda d: d["requests"][0].update(success="yes"), "requests[0].success: expected"),
            (lambda d: d["requests"][0]["timeline"]["spans"][2].update(end_ms=-1),
             "requests[0].timeline.spans[2]: end_ms -1 is before start_ms"),
            (lambda d: d["requests"][2].update(timeline={"route": 1}),
             "requests[2].timeline: expected a list of spans"),
            (lambda d: d["requests"][1]["timeline"][0].pop("name"),
             "requests[1].timeline.spans[0]: missing 'name'"),
            (lambda d: [r.update(success=False) for r in d["requests"]], "no completed request"),
        ]
        for k, (change, fragment) in enumerate(cases):
            self.expect_bad_input([self.write("good.json", self.fixture), broken(f"bad{k}.json", change)],
                                  f"bad{k}.json", fragment)

        # Arguments: no files, no arguments, a bad --slowest.
        for args in ([], ["--slowest", "0", FIXTURE]):
            self.expect_bad_input(args)
        result = run_script()
        self.assertEqual(result.returncode, 2)
        self.assertIn("usage:", result.stderr)
        self.assertFalse(os.path.exists(os.path.join(self.tmp, "out")), "no output on bad input")

    def test_missing_matplotlib_is_named(self):
        shadow = os.path.join(self.tmp, "shadow", "matplotlib")
        os.makedirs(shadow)
        self.write(os.path.join("shadow", "matplotlib", "__init__.py"), "raise ImportError('gone')")
        env = dict(os.environ, PYTHONPATH=os.path.dirname(shadow))
        result = run_script(os.path.join(self.tmp, "out"), FIXTURE, env=env)
        self.assertEqual(result.returncode, 1)
        self.assertIn("apt-get install python3-matplotlib", result.stderr)


if __name__ == "__main__":
    unittest.main()
