#!/usr/bin/python3
"""The GPU topologies in configs/ (issue #14 item 3), started by pdserve-cluster against
stand-in binaries (fake_cluster_binary.py) that record their command lines: configs/1p1d-1gpu.json
puts both nodes on cuda:0 with --gpu-memory-utilization shares that fit the one GPU together,
configs/1p1d-2gpu.json puts the prefill node on cuda:0 and the decode node on cuda:1, and
every --device value is one parse_device takes (cpu, cuda, cuda:N). Seconds, no GPU.

Environment: PDSERVE_SOURCE_DIR.
"""
import glob
import json
import os
import re
import signal
import subprocess
import sys
import tempfile

from stand_in_build import install_stand_ins

SOURCE = os.environ["PDSERVE_SOURCE_DIR"]
DEVICE = re.compile(r"^(cpu|cuda|cuda:[0-9]+)$")


def flag(argv, name):
    values = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == name]
    if len(values) != 1:
        raise AssertionError(f"{name} given {len(values)} times in {argv}")
    return values[0]


def launch(directory, config):
    """Starts the cluster of `config` on the stand-ins; returns {role: argv} once it is ready."""
    argv_dir = os.path.join(directory, "argv-" + os.path.basename(config))
    os.makedirs(argv_dir)
    launcher = subprocess.Popen(
        [os.path.join(SOURCE, "tools/cluster/pdserve-cluster"), config, "--model", directory,
         "--build-dir", directory, "--port-offset", "0", "--log-dir", os.path.join(directory, "logs")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=dict(os.environ, FAKE_ADVICE=os.path.join(directory, "advice.json"),
                 FAKE_FAIL=os.path.join(directory, "fail"), FAKE_ARGV_DIR=argv_dir,
                 PDSERVE_CLUSTER_TOKEN="t"))
    output = []
    try:
        for line in launcher.stdout:
            output.append(line)
            if "ready" in line:
                break
        else:
            raise AssertionError(f"{config}: the cluster did not start:\n{''.join(output)}")
        nodes = {}
        for path in glob.glob(os.path.join(argv_dir, "*.json")):
            with open(path) as handle:
                nodes.setdefault(os.path.basename(path).split("-")[0], []).append(json.load(handle))
        return nodes
    finally:
        launcher.send_signal(signal.SIGINT)
        launcher.wait(timeout=30)


def main():
    signal.alarm(100)  # below the CTest TIMEOUT
    with tempfile.TemporaryDirectory(prefix="pdserve-gpu-topologies-") as directory:
        install_stand_ins(directory)
        with open(os.path.join(directory, "advice.json"), "w") as handle:
            json.dump({"prefill_nodes": 1, "decode_nodes": 1, "requests": 0}, handle)

        one = launch(directory, os.path.join(SOURCE, "configs/1p1d-1gpu.json"))
        if sorted(one) != ["decode", "prefill"] or any(len(v) != 1 for v in one.values()):
            raise AssertionError(f"1p1d-1gpu: expected one prefill and one decode node, got {one}")
        shares = 0.0
        for role, (argv,) in one.items():
            if flag(argv, "--device") != "cuda:0":
                raise AssertionError(f"1p1d-1gpu: the {role} node is not on cuda:0: {argv}")
            shares += float(flag(argv, "--gpu-memory-utilization"))
            if flag(argv, "--kv-transfer-path") not in ("auto", "staged"):
                raise AssertionError(f"1p1d-1gpu: the {role} node cannot stage its KV: {argv}")
        if not 0 < shares <= 0.95:
            raise AssertionError(f"1p1d-1gpu: the nodes' --gpu-memory-utilization add up to {shares}")
        print(f"ok: 1p1d-1gpu: both nodes on cuda:0, {shares:.2f} of its memory together", flush=True)

        two = launch(directory, os.path.join(SOURCE, "configs/1p1d-2gpu.json"))
        devices = {role: flag(argv, "--device") for role, (argv,) in two.items()}
        if devices != {"prefill": "cuda:0", "decode": "cuda:1"}:
            raise AssertionError(f"1p1d-2gpu: expected prefill on cuda:0 and decode on cuda:1, got {devices}")
        print("ok: 1p1d-2gpu: prefill on cuda:0, decode on cuda:1", flush=True)

        for config in glob.glob(os.path.join(SOURCE, "configs/*.json")):
            with open(config) as handle:
                topology = json.load(handle)
            argvs = [topology.get("node_args", [])] + [n.get("args", []) for r in ("prefill", "decode")
                                                      for n in topology.get(r, [])]
            for argv in argvs:
                for i, arg in enumerate(argv[:-1]):
                    if arg == "--device" and not DEVICE.match(argv[i + 1]):
                        raise AssertionError(f"{config}: --device {argv[i + 1]} is no device name")
        print("ok: every --device in configs/ is cpu, cuda or cuda:N", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
