#!/usr/bin/python3
"""pdserve-cluster says "ready" only once every node is up at the proxy *and* it has read the
address each node announced, so the state file names every node's URL. The stand-in nodes
(fake_cluster_binary.py) register first and print their address a second later, under another
host name than they register with (as a node given --advertise-host does): a launcher that
counted registrations alone said "ready" with URLs it did not know yet, and one that matched
registered URLs to announced ones verbatim never became ready. Then its stdout is closed
before Ctrl-C: the launcher fails to print, and must still stop every process it started.
Seconds, no model.

Environment: PDSERVE_SOURCE_DIR.
"""
import json
import os
import select
import signal
import subprocess
import sys
import tempfile

from stand_in_build import install_stand_ins

SOURCE = os.environ["PDSERVE_SOURCE_DIR"]


def on_deadline(_signum, _frame):
    raise AssertionError("the launcher did not say ready within 50 s")


def main():
    # Below the CTest TIMEOUT, and raised here so that the finally below stops the launcher
    # (which stops its nodes).
    signal.signal(signal.SIGALRM, on_deadline)
    signal.alarm(50)
    with tempfile.TemporaryDirectory(prefix="pdserve-launcher-ready-") as directory:
        install_stand_ins(directory)
        topology = os.path.join(directory, "topology.json")
        with open(topology, "w") as handle:
            json.dump({"proxy": {"port": 0}, "prefill": [{"port": 0}], "decode": [{"port": 0}, {"port": 0}]},
                      handle)
        state_path = os.path.join(directory, "state.json")
        launcher = subprocess.Popen(
            [os.path.join(SOURCE, "tools/cluster/pdserve-cluster"), topology, "--model", directory,
             "--build-dir", directory, "--state-file", state_path, "--log-dir", os.path.join(directory, "logs")],
            stdout=subprocess.PIPE, text=True,
            env=dict(os.environ, FAKE_ANNOUNCE_LATE_S="1", FAKE_ADVERTISE_HOST="localhost",
                     PDSERVE_CLUSTER_TOKEN="t"))
        try:
            line = launcher.stdout.readline()
            while line and "ready" not in line:
                line = launcher.stdout.readline()
            expect("ready" in line, "the launcher exited before the cluster was ready")
            signal.alarm(0)
            with open(state_path) as handle:
                state = json.load(handle)
            expect(sorted(state) == ["decode-0", "decode-1", "prefill-0", "proxy"], f"state file: {state}")
            missing = [name for name, entry in state.items() if not (entry["url"] or "").startswith("http://")]
            expect(not missing, f"ready, but the state file names no URL for {missing}: {state}")
            print(f"ok: ready with every node's URL in the state file: {sorted(state)}", flush=True)
        finally:
            # Its reader gone, the launcher's "stopping" line fails (EPIPE); it must still stop
            # every process it started, which run in sessions of their own.
            launcher.stdout.close()
            launcher.send_signal(signal.SIGINT)
            launcher.wait(timeout=30)
        left = [name for name, entry in state.items() if alive(entry["pid"])]
        expect(not left, f"a launcher that lost its stdout left these running: {left}")
        print("ok: a launcher whose stdout was closed still stopped every process", flush=True)
        print("all checks passed", flush=True)


def alive(pid, seconds=20):
    """Whether `pid` still runs `seconds` from now. Waits on its pidfd, which turns readable when
    the process exits (a zombie has exited): an event, though the process is not our child."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return False
    try:
        return not select.select([pidfd], [], [], seconds)[0]
    finally:
        os.close(pidfd)


def expect(condition, message):
    if not condition:
        raise AssertionError(message)


if __name__ == "__main__":
    sys.exit(main())
