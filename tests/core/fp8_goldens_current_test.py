"""The committed FP8 goldens (tests/data/fp8_e4m3_ml_dtypes.txt) are exactly what ml_dtypes
gives today: tests/reference/fp8_e4m3_goldens.py rerun and compared byte for byte."""
import os
import subprocess
import sys

source = os.environ["PDSERVE_SOURCE_DIR"]
fresh = subprocess.run([sys.executable, os.path.join(source, "tests/reference/fp8_e4m3_goldens.py")],
                       check=True, capture_output=True, text=True, timeout=60).stdout
with open(os.path.join(source, "tests/data/fp8_e4m3_ml_dtypes.txt")) as committed:
    if committed.read() != fresh:
        sys.exit("tests/data/fp8_e4m3_ml_dtypes.txt differs from ml_dtypes' output: rerun "
                 "tests/reference/fp8_e4m3_goldens.py tests/data/fp8_e4m3_ml_dtypes.txt")
print("fp8 goldens match ml_dtypes")
