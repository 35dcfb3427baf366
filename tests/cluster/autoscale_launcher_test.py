#!/usr/bin/python3
"""pdserve-cluster's autoscaling loop against stand-in binaries (fake_cluster_binary.py: a
proxy whose GET /cluster/advice the test scripts, nodes that register and leave when drained):
up one node at a time to MAX and no further, a node that fails to start reported and the loop
going on, down to MIN by drains, an idle cluster held at MIN, the other pool untouched, and
a clean stop. Seconds, no model.

Environment: PDSERVE_SOURCE_DIR.
"""
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

from stand_in_build import install_stand_ins

SOURCE = os.environ["PDSERVE_SOURCE_DIR"]


def main():
    signal.alarm(100)  # below the CTest TIMEOUT
    with tempfile.TemporaryDirectory(prefix="pdserve-autoscale-loop-") as directory:
        install_stand_ins(directory)
        advice_path, fail_path = os.path.join(directory, "advice.json"), os.path.join(directory, "fail")

        def advise(decode_nodes, requests=10):
            with open(advice_path + ".tmp", "w") as handle:
                json.dump({"prefill_nodes": 1, "decode_nodes": decode_nodes, "requests": requests}, handle)
            os.replace(advice_path + ".tmp", advice_path)

        advise(1)
        topology = os.path.join(directory, "topology.json")
        with open(topology, "w") as handle:
            json.dump({"proxy": {"port": 0}, "prefill": [{"port": 0}], "decode": [{"port": 0}]}, handle)
        state_path = os.path.join(directory, "state.json")
        launcher = subprocess.Popen(
            [os.path.join(SOURCE, "tools/cluster/pdserve-cluster"), topology, "--model", directory,
             "--build-dir", directory, "--state-file", state_path, "--log-dir", os.path.join(directory, "logs"),
             "--autoscale-decode", "1:3", "--autoscale-interval", "0.2", "--autoscale-up-polls", "2",
             "--autoscale-down-polls", "2", "--autoscale-cooldown", "1"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env=dict(os.environ, FAKE_ADVICE=advice_path, FAKE_FAIL=fail_path, PDSERVE_CLUSTER_TOKEN="t"))
        log = []
        threading.Thread(target=lambda: [log.append(line) or print("launcher: " + line, end="", flush=True)
                                         for line in launcher.stdout], daemon=True).start()

        def wait_for(what, predicate, timeout=20):
            deadline = time.monotonic() + timeout
            while not predicate():
                if time.monotonic() > deadline:
                    raise AssertionError(f"not within {timeout} s: {what}")
                time.sleep(0.05)

        def logged(text):
            return any(text in line for line in log)

        def reads_of_current_advice():
            """How many times the launcher fetched the advice now in the file."""
            with open(advice_path) as handle:
                current = json.dumps(json.load(handle), sort_keys=True)
            try:
                with open(advice_path + ".reads") as handle:
                    return sum(line.strip() == current for line in handle)
            except FileNotFoundError:
                return 0

        # Polls the launcher needs to have made on an advice before a check that it did NOT act on
        # it: a cool-down's worth (1 s at 0.2 s), the polls that must agree (2), and one more, so
        # that it has decided and acted on the advice if it was going to.
        polls_to_act = 5 + 2 + 1

        def running():
            with open(state_path) as handle:
                return sorted(json.load(handle))

        try:
            wait_for("the cluster to be ready", lambda: logged("ready:"))
            # A node that fails to start is reported; the next try (after the cool-down) works.
            open(fail_path, "w").close()
            advise(3)
            wait_for("a failed start to be reported", lambda: logged("decode-1 failed to start (exited with code 1)"))
            os.remove(fail_path)
            wait_for("two nodes added, one at a time", lambda: logged("decode-3 joined"))
            expect(logged("decode-2 joined"), "decode-2 did not join before decode-3")
            # At MAX (3 up), the advice asking for 3 (and the clamp of a larger one) adds nothing.
            advise(9)
            wait_for("the launcher to poll the advice for 9", lambda: reads_of_current_advice() >= polls_to_act)
            expect(not logged("decode 3 -> 4") and not logged("decode-4"), "a node beyond MAX was started")
            expect(running() == ["decode-0", "decode-2", "decode-3", "prefill-0", "proxy"],
                   f"state file: {running()}")
            # Fewer wanted: drained one at a time, newest first, down to MIN.
            advise(1)
            wait_for("the pool drained to MIN", lambda: logged("decode-2 left the cluster (drained)"))
            expect(logged("decode-3 left the cluster (drained)"), "decode-3 was not drained first")
            wait_for("the state file to drop the drained nodes",
                     lambda: running() == ["decode-0", "prefill-0", "proxy"])
            # Idle (no request, no recommendation): MIN, so nothing to do; the prefill pool was never touched.
            advise(None, requests=0)
            wait_for("the launcher to poll the idle advice", lambda: reads_of_current_advice() >= polls_to_act)
            expect(not logged("draining decode-0") and not logged("prefill 1 ->"),
                   "the launcher went below MIN or scaled a pool without bounds")
        finally:
            launcher.send_signal(signal.SIGINT)
            code = launcher.wait(timeout=30)
        expect(code == 0, f"the launcher exited with {code} on Ctrl-C")
        print("all checks passed", flush=True)


def expect(condition, message):
    if not condition:
        raise AssertionError(message)


if __name__ == "__main__":
    sys.exit(main())
