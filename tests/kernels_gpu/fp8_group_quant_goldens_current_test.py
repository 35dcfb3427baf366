"""The committed FP8 activation-quantization goldens (tests/data/fp8_group_quant_ml_dtypes.txt)
are exactly what numpy and ml_dtypes give today: tests/reference/fp8_group_quant_goldens.py
rerun and compared byte for byte."""
import os
import subprocess
import sys

source = os.environ["PDSERVE_SOURCE_DIR"]
script = os.path.join(source, "tests/reference/fp8_group_quant_goldens.py")
fresh = subprocess.run([sys.executable, script], check=True, capture_output=True, text=True,
                       timeout=60).stdout
with open(os.path.join(source, "tests/data/fp8_group_quant_ml_dtypes.txt")) as committed:
    if committed.read() != fresh:
        sys.exit("tests/data/fp8_group_quant_ml_dtypes.txt differs from the oracle's output: "
                 "rerun tests/reference/fp8_group_quant_goldens.py "
                 "tests/data/fp8_group_quant_ml_dtypes.txt")
print("fp8 group-quantization goldens match numpy + ml_dtypes")
