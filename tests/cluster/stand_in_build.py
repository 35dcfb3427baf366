"""A build folder of stand-in binaries for pdserve-cluster's tests: fake_cluster_binary.py
where pdserve-cluster looks for pdserve-proxy, pdserve-prefill and pdserve-decode."""
import os
import shutil

HERE = os.path.dirname(os.path.abspath(__file__))


def install_stand_ins(build_dir):
    for sub, name in (("proxy", "pdserve-proxy"), ("prefill_node", "pdserve-prefill"),
                      ("decode_node", "pdserve-decode")):
        os.makedirs(os.path.join(build_dir, sub))
        shutil.copy(os.path.join(HERE, "fake_cluster_binary.py"), os.path.join(build_dir, sub, name))
