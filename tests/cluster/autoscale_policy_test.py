#!/usr/bin/python3
"""pdserve-cluster's autoscaling policy (tools/cluster/autoscale_policy.py) on made-up
GET /cluster/advice answers: hysteresis, cool-down, bounds, idle and unknown advice, and
MIN:MAX parsing; and the launcher's exit code 2 for bad --autoscale flags (it stops before
starting anything).

Environment: PDSERVE_SOURCE_DIR.
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

TOOLS = os.path.join(os.environ["PDSERVE_SOURCE_DIR"], "tools/cluster")
sys.path.insert(0, TOOLS)
from autoscale_policy import AutoscalePolicy, combine_advice, parse_bounds  # noqa: E402


def advice(prefill_now, decode_now, prefill_wanted=None, decode_wanted=None, requests=10):
    """The fields of GET /cluster/advice that the policy reads."""
    return {"load": {"prefill": {"nodes": prefill_now}, "decode": {"nodes": decode_now}},
            "workload": {"requests": requests},
            "recommendation": {"prefill_nodes": prefill_wanted, "decode_nodes": decode_wanted}}


def actions(decisions):
    return [(d.pool, d.action) for d in decisions]


class PolicyTest(unittest.TestCase):
    def policy(self, **kwargs):
        options = dict(bounds={"prefill": (1, 3), "decode": (1, 3)}, up_polls=2, down_polls=3, cooldown_s=10)
        options.update(kwargs)
        return AutoscalePolicy(**options)

    def test_scales_up_after_consecutive_polls_only(self):
        policy = self.policy()
        self.assertEqual(actions(policy.decide(advice(1, 1, 1, 2), now=0)), [])
        # A poll that agrees with the pool size restarts the count.
        self.assertEqual(actions(policy.decide(advice(1, 1, 1, 1), now=1)), [])
        self.assertEqual(actions(policy.decide(advice(1, 1, 1, 3), now=2)), [])
        decisions = policy.decide(advice(1, 1, 1, 3), now=3)
        self.assertEqual(actions(decisions), [("decode", "up")])
        self.assertEqual((decisions[0].current, decisions[0].target), (1, 3))
        self.assertIn("asks for 3 decode nodes", decisions[0].reason)

    def test_scales_down_after_more_polls_than_up(self):
        policy = self.policy()
        for now in range(2):
            self.assertEqual(actions(policy.decide(advice(3, 2, 1, 2), now=now)), [])
        self.assertEqual(actions(policy.decide(advice(3, 2, 1, 2), now=2)), [("prefill", "down")])

    def test_cool_down_after_an_action(self):
        policy = self.policy()
        policy.decide(advice(1, 1, 1, 2), now=0)
        self.assertEqual(actions(policy.decide(advice(1, 1, 1, 2), now=1)), [("decode", "up")])
        policy.acted("decode", now=1)
        # Polls within the cool-down (until t=11) do not count, however many.
        for now in range(2, 11):
            self.assertEqual(actions(policy.decide(advice(1, 1, 1, 3), now=now)), [])
        self.assertEqual(actions(policy.decide(advice(1, 1, 1, 3), now=11)), [])
        self.assertEqual(actions(policy.decide(advice(1, 1, 1, 3), now=12)), [("decode", "up")])

    def test_cool_down_is_per_pool(self):
        policy = self.policy(up_polls=1)
        self.assertEqual(actions(policy.decide(advice(1, 1, 2, 2), now=0)), [("prefill", "up"), ("decode", "up")])
        policy.acted("decode", now=0)
        self.assertEqual(actions(policy.decide(advice(1, 1, 2, 2), now=1)), [("prefill", "up")])

    def test_bounds(self):
        policy = self.policy(up_polls=1, down_polls=1)
        # At MAX, more nodes wanted: nothing; at MIN, fewer wanted: nothing.
        self.assertEqual(actions(policy.decide(advice(3, 1, 5, 0), now=0)), [])
        # The target is clamped: 9 wanted with 2 up is one step up, and the reason says so.
        decisions = policy.decide(advice(1, 2, 1, 9), now=1)
        self.assertEqual(actions(decisions), [("decode", "up")])
        self.assertEqual(decisions[0].target, 3)
        self.assertIn("bounded to 1:3", decisions[0].reason)
        # Below MIN (a node died), the pool goes back up even if the advice wants fewer.
        policy = AutoscalePolicy({"decode": (2, 3)}, up_polls=1, down_polls=1, cooldown_s=0)
        self.assertEqual(actions(policy.decide(advice(0, 1, 1, 1), now=0)), [("decode", "up")])

    def test_only_named_pools_are_scaled(self):
        policy = AutoscalePolicy({"decode": (1, 3)}, up_polls=1, down_polls=1, cooldown_s=0)
        self.assertEqual(actions(policy.decide(advice(1, 1, 3, 3), now=0)), [("decode", "up")])

    def test_idle_goes_to_min_and_unknown_holds(self):
        policy = self.policy(up_polls=1, down_polls=2)
        idle = advice(2, 3, requests=0)
        self.assertEqual(actions(policy.decide(idle, now=0)), [])
        decisions = policy.decide(idle, now=1)
        self.assertEqual(actions(decisions), [("prefill", "down"), ("decode", "down")])
        self.assertIn("idle", decisions[0].reason)
        # Requests but no recommendation (a capacity not measured): no action, and the count restarts.
        policy = self.policy(up_polls=1, down_polls=2)
        policy.decide(idle, now=0)
        self.assertEqual(actions(policy.decide(advice(2, 3, requests=5), now=1)), [])
        self.assertEqual(actions(policy.decide(idle, now=2)), [])

    def test_advice_of_several_proxies_is_summed_over_the_busy_ones(self):
        # Each replica recommends nodes for the requests it served.
        combined = combine_advice([advice(1, 2, 1, 2, requests=6), advice(1, 2, 1, 3, requests=4),
                                   advice(1, 2, requests=0)])
        self.assertEqual(combined["recommendation"], {"prefill_nodes": 2, "decode_nodes": 5})
        self.assertEqual(combined["workload"]["requests"], 10)
        self.assertEqual(combined["load"]["decode"]["nodes"], 2)
        # A busy replica without a recommendation holds the pool; all idle is idle.
        held = combine_advice([advice(1, 1, 1, 2), advice(1, 1, None, 2)])
        self.assertEqual(held["recommendation"], {"prefill_nodes": None, "decode_nodes": 4})
        idle = combine_advice([advice(2, 3, requests=0), advice(2, 3, requests=0)])
        policy = self.policy(up_polls=1, down_polls=1)
        self.assertEqual(actions(policy.decide(idle, now=0)), [("prefill", "down"), ("decode", "down")])
        self.assertIs(combine_advice([held]), held)
        with self.assertRaises(ValueError):
            combine_advice([])

    def test_bad_parameters(self):
        with self.assertRaises(ValueError):
            self.policy(up_polls=0)
        with self.assertRaises(ValueError):
            self.policy(cooldown_s=-1)


class BoundsTest(unittest.TestCase):
    def test_parse(self):
        self.assertEqual(parse_bounds("1:3"), (1, 3))
        self.assertEqual(parse_bounds("0:1"), (0, 1))
        self.assertEqual(parse_bounds("2:2"), (2, 2))
        for bad in ("", "3", "1:", ":3", "a:b", "3:1", "0:0", "-1:2", "1:2:3", "1.5:3"):
            with self.assertRaises(ValueError, msg=bad):
                parse_bounds(bad)


class LauncherInputTest(unittest.TestCase):
    def launch(self, *flags):
        with tempfile.TemporaryDirectory() as directory:
            topology = os.path.join(directory, "topology.json")
            with open(topology, "w") as handle:
                json.dump({"proxy": {"port": 0}, "prefill": [{"port": 0}], "decode": [{"port": 0}, {"port": 0}]},
                          handle)
            return subprocess.run([os.path.join(TOOLS, "pdserve-cluster"), topology, "--model", directory,
                                   "--build-dir", directory, *flags], capture_output=True, text=True, timeout=30)

    def test_bad_flags_exit_2_with_a_reason(self):
        for flags, reason in [
                (["--autoscale", "3"], "--autoscale: '3' is not MIN:MAX"),
                (["--autoscale-decode", "2:1"], "--autoscale-decode: '2:1': MAX must be at least MIN"),
                (["--autoscale-decode", "0:2"], "the decode pool's MIN must be at least 1"),
                (["--autoscale", "1:1"], "the topology has 2 decode nodes, outside --autoscale 1:1"),
                (["--autoscale-prefill", "2:3"], "the topology has 1 prefill nodes, outside --autoscale-prefill 2:3"),
                (["--autoscale", "1:3", "--autoscale-interval", "0"], "'0' is not a positive number"),
                (["--autoscale", "1:3", "--autoscale-up-polls", "x"], "'x' is not a positive number")]:
            result = self.launch(*flags)
            self.assertEqual(result.returncode, 2, f"{flags}: {result.stderr}")
            self.assertIn(reason, result.stderr, flags)

    def test_good_flags_get_past_the_checks(self):
        # The next check is the binaries, missing from this build dir: still exit 2, another reason.
        result = self.launch("--autoscale", "1:3", "--autoscale-decode", "2:4")
        self.assertEqual(result.returncode, 2)
        self.assertIn("is missing: build first", result.stderr)


if __name__ == "__main__":
    unittest.main()
