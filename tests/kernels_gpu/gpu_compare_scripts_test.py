"""The comparison scripts of the GPU run (scripts/gpu/compare_runs.py, hf_compare.py), on the
CPU: the strict and report rules on crafted runs, and hf_compare's teacher forcing and greedy
loop on a small causal model with a KV cache (Debian's PyTorch; transformers is not needed:
the GPU machine has it), whose logits pdserve-like runs are built from. Run with
/usr/bin/python3 (numpy, python3-torch)."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

import numpy as np

SOURCE = os.environ.get("PDSERVE_SOURCE_DIR") or os.path.join(os.path.dirname(__file__), "..", "..")
sys.path.insert(0, os.path.join(SOURCE, "scripts", "gpu"))
import compare_runs  # noqa: E402
import hf_compare  # noqa: E402

VOCAB = 2000


def greedy_run(rows):
    """ids and logits of a greedy run whose rows are `rows`."""
    rows = np.asarray(rows, dtype=np.float64)
    return [int(i) for i in rows.argmax(axis=1)], rows


class CompareRuns(unittest.TestCase):
    def setUp(self):
        rng = np.random.default_rng(5)
        self.rows = rng.normal(size=(8, VOCAB))
        self.ids, _ = greedy_run(self.rows)

    def test_identical_runs_agree(self):
        result = compare_runs.compare(self.ids, self.rows, self.ids, self.rows.copy(), "strict")
        self.assertTrue(result["ok"], result)
        self.assertTrue(result["equal_ids"])
        self.assertEqual(result["worst_row_error"], 0.0)

    def test_a_tie_may_break_either_way_in_strict_mode(self):
        rows = self.rows.copy()
        top = np.argsort(-rows[3])
        rows[3, top[1]] = rows[3, top[0]] - 1e-4  # a near tie on the reference
        candidate = rows.copy()
        candidate[3, top[1]] += 2e-4  # float noise flips it
        ref_ids, _ = greedy_run(rows)
        cand_ids, _ = greedy_run(candidate)
        cand_ids[4:] = [(i + 1) % VOCAB for i in cand_ids[4:]]  # diverged afterwards
        result = compare_runs.compare(ref_ids, rows, cand_ids, candidate, "strict")
        self.assertTrue(result["ok"], result)
        self.assertEqual(result["first_difference"], 3)
        self.assertEqual(result["rows_compared"], 4, "rows after the difference are not compared")
        self.assertEqual(result["candidate_rank_in_reference"], 1)

    def test_a_clear_preference_overturned_fails_strict_and_passes_report_in_top_k(self):
        order = np.argsort(-self.rows[2])
        self.rows[2, order[0]] += 2.0  # the reference's choice is clear
        candidate = self.rows.copy()
        candidate[2, order[2]] = self.rows[2, order[0]] + 1.0  # yet the third choice wins
        cand_ids, _ = greedy_run(candidate)
        strict = compare_runs.compare(self.ids, self.rows, cand_ids, candidate, "strict",
                                      max_row_error=10)
        self.assertFalse(strict["ok"])
        self.assertIn("not a tie", strict["problems"][0])
        report = compare_runs.compare(self.ids, self.rows, cand_ids, candidate, "report",
                                      max_row_error=10)
        self.assertTrue(report["ok"], report)
        candidate[2, order[-1]] = self.rows[2, order[0]] + 5.0  # the reference's last choice wins
        cand_ids, _ = greedy_run(candidate)
        report = compare_runs.compare(self.ids, self.rows, cand_ids, candidate, "report",
                                      max_row_error=10)
        self.assertFalse(report["ok"])
        self.assertIn("ranks", report["problems"][0])

    def test_row_errors_are_per_row(self):
        rows = self.rows.copy()
        rows[5] *= 1e-3
        candidate = rows.copy()
        candidate[5] *= 1.01  # 1% off in a row 1000x smaller than the others
        result = compare_runs.compare(self.ids, rows, self.ids, candidate, "strict")
        self.assertFalse(result["ok"])
        self.assertEqual(result["worst_row"], 5)
        self.assertAlmostEqual(result["worst_row_error"], 0.01, places=6)

    def test_command_line_and_files(self):
        with tempfile.TemporaryDirectory() as folder:
            paths = {}
            for name, rows in (("ref", self.rows), ("cand", self.rows + 1e-7)):
                ids, _ = greedy_run(rows)
                with open(os.path.join(folder, name + ".json"), "w") as handle:
                    handle.write(json.dumps(ids) + "\n")
                np.save(os.path.join(folder, name + ".npy"), rows.astype(np.float32))
                paths[name] = [os.path.join(folder, name + ".json"), os.path.join(folder, name + ".npy")]
            script = os.path.join(SOURCE, "scripts", "gpu", "compare_runs.py")
            record = os.path.join(folder, "out.jsonl")
            done = subprocess.run([sys.executable, script, "--mode", "strict", "--reference", *paths["ref"],
                                   "--candidate", *paths["cand"], "--label", "t", "--json", record],
                                  capture_output=True, text=True, timeout=60)
            self.assertEqual(done.returncode, 0, done.stdout + done.stderr)
            self.assertIn("t: ok [strict] 8 tokens, ids equal", done.stdout)
            self.assertTrue(json.loads(open(record).read())["ok"])
            np.save(paths["cand"][1], self.rows[:5].astype(np.float32))  # wrong row count
            done = subprocess.run([sys.executable, script, "--mode", "strict", "--reference", *paths["ref"],
                                   "--candidate", *paths["cand"]], capture_output=True, text=True,
                                  timeout=60)
            self.assertEqual(done.returncode, 2)
            self.assertIn("error:", done.stderr)


class TinyCausalModel:
    """A causal language model with a KV cache, shaped like transformers' output: the logits
    at a position depend on every token up to it (a decayed running sum of embeddings)."""

    def __init__(self, torch):
        self.torch = torch
        generator = torch.Generator().manual_seed(3)
        self.embedding = torch.randn(VOCAB, 16, generator=generator, dtype=torch.float64)
        self.head = torch.randn(16, VOCAB, generator=generator, dtype=torch.float64)

    def __call__(self, input_ids, past_key_values=None, use_cache=False):
        torch = self.torch
        state = past_key_values if past_key_values is not None else torch.zeros(16, dtype=torch.float64)
        states = []
        for token in input_ids[0].tolist():
            state = 0.7 * state + self.embedding[token]
            states.append(state)
        logits = torch.stack(states) @ self.head

        class Output:
            pass

        output = Output()
        output.logits = logits.unsqueeze(0)
        output.past_key_values = state if use_cache else None
        return output


class HfCompare(unittest.TestCase):
    def setUp(self):
        try:
            import torch
        except ImportError:  # Debian's python3-torch is a test dependency (scripts/setup.sh)
            self.fail("/usr/bin/python3 lacks torch (apt install python3-torch)")
        self.model = TinyCausalModel(torch)
        self.prompt = [3, 14, 15, 9, 26]

    def test_teacher_forcing_gives_the_rows_the_greedy_loop_picked_from(self):
        ids = hf_compare.greedy_ids(self.model, self.prompt, 12, "cpu")
        rows = hf_compare.teacher_forced_logits(self.model, self.prompt, ids, "cpu")
        self.assertEqual(rows.shape, (12, VOCAB))
        self.assertEqual([int(i) for i in rows.argmax(axis=1)], ids)
        result = hf_compare.compare_teacher_forced(ids, rows.copy(), rows, True, 1e-3, 2e-3)
        self.assertTrue(result["ok"], result)
        self.assertEqual(result["differing_positions"], [])

    def test_a_wrong_pdserve_row_and_token_are_caught(self):
        ids = hf_compare.greedy_ids(self.model, self.prompt, 10, "cpu")
        rows = hf_compare.teacher_forced_logits(self.model, self.prompt, ids, "cpu")
        pdserve_rows = rows.copy()
        pdserve_ids = list(ids)
        order = np.argsort(-rows[6])
        rows[6, order[0]] += 2.0  # transformers' choice is clear
        pdserve_rows[6, order[3]] = rows[6, order[0]] + 0.5  # yet pdserve picks the 4th
        pdserve_ids[6] = int(order[3])
        strict = hf_compare.compare_teacher_forced(pdserve_ids, pdserve_rows, rows, True, 1.0, 2e-3)
        self.assertFalse(strict["ok"])
        self.assertEqual(strict["differing_positions"][0]["position"], 6)
        self.assertEqual(strict["differing_positions"][0]["rank_in_hf"], 3)
        report = hf_compare.compare_teacher_forced(pdserve_ids, pdserve_rows, rows, False, 1.0, 2e-3)
        self.assertTrue(report["ok"], report)  # within transformers' top 5
        tight = hf_compare.compare_teacher_forced(ids, rows * 1.01, rows, True, 1e-3, 2e-3)
        self.assertFalse(tight["ok"])
        self.assertIn("error", tight["problems"][0])

    def test_runs_on_files_as_the_gpu_run_writes_them(self):
        with tempfile.TemporaryDirectory() as folder:
            prompts = [self.prompt, [7]]
            for index, prompt in enumerate(prompts):
                ids = hf_compare.greedy_ids(self.model, prompt, 6, "cpu")
                rows = hf_compare.teacher_forced_logits(self.model, prompt, ids, "cpu")
                with open(os.path.join(folder, f"prompt-{index}.ids.json"), "w") as handle:
                    handle.write(json.dumps(ids) + "\n")
                np.save(os.path.join(folder, f"prompt-{index}.logits.npy"), rows.astype(np.float32))

            class Args:
                device = "cpu"
                tie_margin = 2e-3
                f32_row_error = 1e-3
                bf16_row_error = 0.1

            records = hf_compare.compare_run(self.model, prompts, folder, "tiny", True, Args)
            self.assertEqual(len(records), 2)
            self.assertTrue(all(record["ok"] for record in records), records)


if __name__ == "__main__":
    unittest.main()
