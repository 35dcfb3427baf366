"""Tests of bench/serving/tier_study.py's plumbing (the KV-tier workload study, issue #32): what
it makes of the nodes' /metrics (pool and per-tier hit rates whatever the tier series are
called, in tokens or blocks; prefill tokens computed; the working set from the server's
prompt_tokens; the 429 retries of the 1P1D runs), and what it refuses before any run (exit 2): an unknown configuration or
topology, a model folder without tokenizer files, a build whose nodes lack a tier flag.
No cluster is started: the study itself is docs/PERF.md's. Run by CTest (label bench)."""

import json
import os
import stat
import subprocess
import sys
import tempfile
import types
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "bench", "serving", "tier_study.py")
sys.path.insert(0, os.path.dirname(SCRIPT))
import tier_study  # noqa: E402

BLOCK = 16
BYTES_PER_TOKEN = 16384


def args(**overrides):
    values = dict(block_size=BLOCK, turns=2, conversations=2)
    values.update(overrides)
    return types.SimpleNamespace(**values)


def result(requests):
    return {"completed": len(requests), "failed": 0, "good_requests": len(requests), "goodput": 1.5,
            "ttft_ms": {"p50": 100, "p90": 200, "p99": 300, "mean": 120},
            "tpot_ms": {"p50": 10, "p90": 20}, "duration_s": 9.0, "total_input_tokens": 0,
            "requests": requests}


def request(prompt_tokens, output_tokens=16, success=True):
    return {"prompt_tokens": prompt_tokens, "output_tokens": output_tokens, "success": success}


class SummaryTest(unittest.TestCase):
    def test_hit_rates_per_tier_whatever_the_series_are_called(self):
        before = {"proxy": {"pdserve:proxy_prefix_index_keys": 5},
                  "decode": {'vllm:prefix_cache_queries_total{model_name="m"}': 1000,
                             'vllm:prefix_cache_hits_total{model_name="m"}': 500,
                             "pdserve:kv_cache_blocks_total": 200}}
        after = {"proxy": {"pdserve:proxy_prefix_index_keys": 9},
                 "decode": {'vllm:prefix_cache_queries_total{model_name="m"}': 3000,
                            'vllm:prefix_cache_hits_total{model_name="m"}': 1300,
                            'pdserve:kv_tier_hit_blocks_total{tier="host"}': 20,
                            'pdserve:kv_tier_hit_tokens_total{tier="disk"}': 100,
                            'pdserve:kv_tier_bytes_total{tier="host",direction="offload"}': 4096,
                            "pdserve:kv_cache_blocks_total": 200}}
        # Conversation 0 ends at 600 + 16 tokens, conversation 1 at 700 + 16; the system prompt is 400.
        requests = [request(500), request(600), request(520), request(700)]
        record = tier_study.summarize({"topology": "colocated", "config": "host+disk"}, result(requests),
                                      before, after, args(), BYTES_PER_TOKEN, 400)
        self.assertAlmostEqual(record["pool_hit_rate"], 800 / 2000)
        self.assertAlmostEqual(record["tier_hit_rates"]["host"], 20 * BLOCK / 2000)
        self.assertAlmostEqual(record["tier_hit_rates"]["disk"], 100 / 2000)
        self.assertEqual(record["tier_series"]['pdserve:kv_tier_bytes_total{tier="host",direction="offload"}'], 4096)
        # Misses less the tier reloads: the tokens some node computed.
        self.assertEqual(record["prefill_tokens_computed"], 2000 - 800 - 20 * BLOCK - 100)
        self.assertEqual(record["working_set_blocks"], -(-(400 + 216 + 316) // BLOCK))
        self.assertEqual(record["pool_blocks"], 200)
        self.assertEqual(record["ttft_ms"]["p90"], 200)
        self.assertEqual(record["retries_429"], 0)

    def test_an_aggregate_hit_series_beside_the_per_tier_ones_is_not_counted_twice(self):
        before = {"decode": {'vllm:prefix_cache_queries_total{model_name="m"}': 0,
                             'vllm:prefix_cache_hits_total{model_name="m"}': 0}}
        after = {"decode": {'vllm:prefix_cache_queries_total{model_name="m"}': 2000,
                            'vllm:prefix_cache_hits_total{model_name="m"}': 800,
                            'pdserve:kv_tier_hit_blocks_total{tier="host"}': 20,
                            'pdserve:kv_tier_hit_blocks_total{tier="disk"}': 5,
                            'vllm:external_prefix_cache_hits_total{model_name="m"}': 25 * BLOCK}}
        requests = [request(500), request(600), request(520), request(700)]
        record = tier_study.summarize({"topology": "colocated", "config": "host+disk"}, result(requests),
                                      before, after, args(), BYTES_PER_TOKEN, 400)
        self.assertEqual(record["prefill_tokens_computed"], 2000 - 800 - 25 * BLOCK)
        self.assertAlmostEqual(record["tier_hit_rates"]["disk"], 5 * BLOCK / 2000)

    def test_disaggregated_kv_received_is_not_computed_and_no_tier_series_means_none(self):
        before = {"prefill": {"vllm:prefix_cache_queries_total": 0, "vllm:prefix_cache_hits_total": 0},
                  "decode": {"vllm:prefix_cache_queries_total": 0, "vllm:prefix_cache_hits_total": 0,
                             "pdserve:kv_transfer_bytes_total": 0}}
        after = {"prefill": {"vllm:prefix_cache_queries_total": 900, "vllm:prefix_cache_hits_total": 300},
                 "decode": {"vllm:prefix_cache_queries_total": 1000, "vllm:prefix_cache_hits_total": 100,
                            "pdserve:kv_transfer_bytes_total": 600 * BYTES_PER_TOKEN}}
        refused_twice = dict(result([request(10), request(20)]), retries_429=2)
        record = tier_study.summarize({"topology": "1p1d", "config": "off"}, refused_twice,
                                      before, after, args(turns=1), BYTES_PER_TOKEN, 0)
        self.assertEqual(record["retries_429"], 2)
        self.assertEqual(record["tier_hit_rates"], {})
        self.assertAlmostEqual(record["pool_hit_rate"], 400 / 1900)
        # The prefill node computed its 600 misses; the decode node received them, computing 300.
        self.assertEqual(record["prefill_tokens_computed"], 600 + 900 - 600)

    def test_the_bench_client_retries_a_429_as_a_real_client_does(self):
        # A disaggregated decode node answers 429 while its pool has no room for a prompt's KV:
        # the 1P1D rows run only when pdserve-bench-serving sends such a request again.
        study = args(system_words=8, input_words=4, output_len=4, request_rate=1.0, max_concurrency=0, seed=1,
                     retry_429=300.0)
        command = tier_study.bench_command("http://127.0.0.1:1", study, "bench.json")
        self.assertEqual(command[command.index("--retry-429") + 1], "300.0")
        self.assertIn("--retry-429", subprocess.run([command[0], "--help"], capture_output=True, text=True,
                                                    timeout=30).stdout, "the bench client lacks --retry-429")

    def test_the_table_row_shows_every_figure(self):
        record = {"topology": "1p1d", "config": "host", "pool_hit_rate": 0.5, "tier_hit_rates": {"host": 0.25},
                  "prefill_tokens_computed": 1234, "ttft_ms": {"p50": 10.4, "p90": 20.6}, "goodput": 0.5,
                  "good_requests": 3, "completed": 4, "failed": 1, "retries_429": 7, "working_set_blocks": 800,
                  "pool_blocks": 200}
        with tempfile.TemporaryFile("w+") as sink:
            stdout, sys.stdout = sys.stdout, sink
            try:
                tier_study.table([record])
            finally:
                sys.stdout = stdout
            sink.seek(0)
            row = sink.read().splitlines()[-1]
        self.assertEqual(row, "| 1p1d | host | 50 % | host 25 % | 1234 | 10 / 21 | 0.50 | 3 / 4 / 1 | 7 | 800 / 200 |")


class RefusalTest(unittest.TestCase):
    def run_study(self, *extra, build=None):
        env = dict(os.environ, BUILD_DIR=build or os.path.join(REPO, "build"))
        return subprocess.run([sys.executable, SCRIPT, *extra], capture_output=True, text=True, env=env,
                              timeout=60)

    def setUp(self):
        self.directory = tempfile.TemporaryDirectory()
        self.model = os.path.join(self.directory.name, "model")
        os.makedirs(self.model)
        with open(os.path.join(self.model, "tokenizer_config.json"), "w") as handle:
            json.dump({}, handle)

    def tearDown(self):
        self.directory.cleanup()

    def fake_build(self, help_text):
        """A build folder whose node binaries print `help_text` for --help."""
        build = os.path.join(self.directory.name, "build")
        for binary in ("decode_node/pdserve-decode", "prefill_node/pdserve-prefill"):
            path = os.path.join(build, binary)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as handle:
                handle.write(f"#!/bin/sh\necho '{help_text}'\n")
            os.chmod(path, os.stat(path).st_mode | stat.S_IEXEC)
        return build

    def test_bad_arguments_exit_2_naming_them(self):
        out = os.path.join(self.directory.name, "out")
        for extra, part in ((["--configs", "off,ssd"], "'ssd'"), (["--topologies", "2p2d"], "'2p2d'"),
                            (["--pool-ratio", "0"], "--pool-ratio"), (["--retry-429", "-1"], "--retry-429")):
            completed = self.run_study(self.model, out, *extra)
            self.assertEqual(completed.returncode, 2, completed.stderr)
            self.assertIn(part, completed.stderr)
        completed = self.run_study(self.directory.name, out)
        self.assertEqual(completed.returncode, 2)
        self.assertIn("tokenizer_config.json", completed.stderr)
        self.assertFalse(os.path.exists(out), "nothing runs before the input is checked")

    def test_a_build_without_the_tier_flags_is_refused_before_any_run(self):
        build = self.fake_build("--kv-cache-memory-gib --block-size")
        out = os.path.join(self.directory.name, "out")
        for config, flag in (("host", "--kv-offload-host-gib"), ("host+disk", "--kv-offload-host-gib")):
            completed = self.run_study(self.model, out, "--configs", f"off,{config}", build=build)
            self.assertEqual(completed.returncode, 2, completed.stderr)
            self.assertIn(flag, completed.stderr)
            self.assertIn(config, completed.stderr)
        self.assertFalse(os.path.exists(out))
        build = self.fake_build("--kv-offload-host-gib --kv-offload-disk-dir")
        completed = self.run_study(self.model, out, "--configs", "host+disk", build=build)
        self.assertEqual(completed.returncode, 2)
        self.assertIn("--kv-offload-disk-gib", completed.stderr)

    def test_a_build_with_the_tier_flags_passes_the_check(self):
        build = self.fake_build("--kv-offload-host-gib --kv-offload-disk-dir --kv-offload-disk-gib")
        saved = tier_study.BUILD
        tier_study.BUILD = build
        try:
            for config in tier_study.CONFIGS:
                tier_study.check_tier_flags(config)  # exits 2 on a missing flag
        finally:
            tier_study.BUILD = saved


if __name__ == "__main__":
    unittest.main()
