#!/usr/bin/python3
"""pdserve-cluster --proxies 2 on stand-in binaries (fake_cluster_binary.py): two proxies
start, every node is given both (--proxy twice) and registers with each, "ready" waits for
every node at every proxy, and the state file names both proxies. A proxy killed with SIGKILL
is reported and leaves the state file while the launcher keeps the cluster up; killing the
last one stops the launcher (exit 1). Seconds, no model.

Environment: PDSERVE_SOURCE_DIR.
"""
import glob
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

from stand_in_build import install_stand_ins

SOURCE = os.environ["PDSERVE_SOURCE_DIR"]


def on_deadline(_signum, _frame):
    raise AssertionError("the test passed its 50 s deadline")


def main():
    signal.signal(signal.SIGALRM, on_deadline)
    signal.alarm(50)
    with tempfile.TemporaryDirectory(prefix="pdserve-launcher-proxies-") as directory:
        install_stand_ins(directory)
        topology = os.path.join(directory, "topology.json")
        with open(topology, "w") as handle:
            json.dump({"proxy": {"port": 0}, "prefill": [{"port": 0}], "decode": [{"port": 0}]}, handle)
        argv_dir = os.path.join(directory, "argv")
        os.makedirs(argv_dir)
        state_path = os.path.join(directory, "state.json")
        launcher = subprocess.Popen(
            [os.path.join(SOURCE, "tools/cluster/pdserve-cluster"), topology, "--model", directory,
             "--build-dir", directory, "--proxies", "2", "--state-file", state_path,
             "--log-dir", os.path.join(directory, "logs")],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env=dict(os.environ, FAKE_ARGV_DIR=argv_dir, PDSERVE_CLUSTER_TOKEN="t"))
        try:
            line = launcher.stdout.readline()
            while line and "ready" not in line:
                line = launcher.stdout.readline()
            expect("ready" in line, "the launcher exited before the cluster was ready")
            state = read(state_path)
            expect(sorted(state) == ["decode-0", "prefill-0", "proxy", "proxy-1"], f"state file: {state}")
            proxies = [state["proxy"]["url"], state["proxy-1"]["url"]]
            for path in glob.glob(os.path.join(argv_dir, "*.json")):
                argv = read(path)
                given = [argv[i + 1] for i, arg in enumerate(argv) if arg == "--proxy"]
                expect(given == proxies, f"{os.path.basename(path)}: --proxy {given}, expected {proxies}")
            for proxy in proxies:
                with urllib.request.urlopen(proxy + "/cluster", timeout=5) as response:
                    listed = {n["url"] for n in json.loads(response.read())["nodes"]}
                expect(len(listed) == 2, f"{proxy} lists {listed}, expected both nodes")
            print(f"ok: ready with both proxies in the state file, every node registered with each", flush=True)

            os.kill(state["proxy-1"]["pid"], signal.SIGKILL)
            line = launcher.stdout.readline()
            while line and "proxy-1 exited" not in line:
                line = launcher.stdout.readline()
            expect("the other proxies serve" in line, f"the launcher on proxy-1's death: {line!r}")
            # Polled: the launcher rewrites its state file after that line, and a file gives no event.
            deadline = time.monotonic() + 10
            while "proxy-1" in read(state_path) and time.monotonic() < deadline:
                time.sleep(0.05)
            expect(sorted(read(state_path)) == ["decode-0", "prefill-0", "proxy"], "proxy-1 is still in the state file")
            expect(launcher.poll() is None, "the launcher stopped when one of two proxies died")
            print("ok: a killed proxy is reported and leaves the state file; the cluster stays up", flush=True)

            os.kill(state["proxy"]["pid"], signal.SIGKILL)
            expect(launcher.wait(timeout=30) == 1, f"exit code {launcher.returncode} after the last proxy died")
            print("ok: the launcher stops (exit 1) when the last proxy dies", flush=True)
        finally:
            if launcher.poll() is None:
                launcher.send_signal(signal.SIGINT)
                launcher.wait(timeout=30)
        print("all checks passed", flush=True)


def read(path):
    with open(path) as handle:
        return json.load(handle)


def expect(condition, message):
    if not condition:
        raise AssertionError(message)


if __name__ == "__main__":
    sys.exit(main())
