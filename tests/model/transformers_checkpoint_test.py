"""The checkpoint behind each transformers golden (tests/data/reference/transformers_*.json) is
byte for byte the file transformers' save_pretrained wrote: pdserve-make-model, given the
golden's config, seed, layers, dtype and tie, must reproduce its model.safetensors SHA-256
(tools/oracle/gen_transformers_golden.py recorded it). The golden test then loads that file with
transformers' own config.json and matches transformers' logits.

Environment (set by CTest): PDSERVE_BUILD_DIR, PDSERVE_SOURCE_DIR.
"""
import glob
import hashlib
import json
import os
import subprocess
import sys
import tempfile

BUILD = os.environ["PDSERVE_BUILD_DIR"]
SOURCE = os.environ["PDSERVE_SOURCE_DIR"]


def main():
    goldens = sorted(glob.glob(os.path.join(SOURCE, "tests/data/reference/transformers_*.json")))
    goldens = [g for g in goldens if not g.endswith(".config.json")]
    if not goldens:
        print("FAIL: no transformers golden in tests/data/reference")
        return 1
    failures = 0
    for path in goldens:
        with open(path) as handle:
            spec = json.load(handle)["model"]
        with tempfile.TemporaryDirectory() as out:
            subprocess.run([os.path.join(BUILD, "tools/make_model/pdserve-make-model"), "--config",
                            os.path.join(SOURCE, spec["config"]), "--out", out, "--seed", str(spec["seed"]),
                            "--layers", str(spec["layers"]), "--dtype", spec["dtype"], f"--{spec['tie']}"],
                           check=True, stdout=subprocess.DEVNULL)
            digest = hashlib.sha256()
            with open(os.path.join(out, "model.safetensors"), "rb") as handle:
                for block in iter(lambda: handle.read(1 << 22), b""):
                    digest.update(block)
        ok = digest.hexdigest() == spec["safetensors_sha256"]
        failures += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {os.path.basename(path)}: sha256 {digest.hexdigest()}"
              + ("" if ok else f", transformers wrote {spec['safetensors_sha256']}"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
