"""Writes the FP8 E4M3 goldens of tests/core/float8_test.cpp from ml_dtypes (the independent
implementation JAX uses): every code's float value, and the code ml_dtypes gives for a set of
float32 inputs (every value, every midpoint between neighbours and one ulp either side, the
specials, random floats across the range). Usage: fp8_e4m3_goldens.py [OUT] (stdout when
absent). The `fp8_goldens_current` test checks the committed file is this script's output."""
import sys

import ml_dtypes
import numpy as np

F8 = ml_dtypes.float8_e4m3fn


def bits(values):
    return np.asarray(values, dtype=np.float32).view(np.uint32)


def main():
    codes = np.arange(256, dtype=np.uint8)
    decoded = codes.view(F8).astype(np.float32)

    finite = np.unique(decoded[np.isfinite(decoded)].astype(np.float64))
    mids = (finite[:-1] + finite[1:]) / 2  # exact in float32: one more mantissa bit
    mids32 = mids.astype(np.float32)
    inputs = [decoded[np.isfinite(decoded)], mids32,
              np.nextafter(mids32, np.float32(np.inf)), np.nextafter(mids32, np.float32(-np.inf)),
              np.array([np.inf, -np.inf, np.nan, 464, 465, 480, 1e30, -1e30, 0.0, -0.0,
                        2.0**-10, 2.0**-10 * 1.0001, 3 * 2.0**-11, 2.0**-6 - 2.0**-10, 1e-45],
                       dtype=np.float32)]
    rng = np.random.default_rng(20261128)
    inputs.append((rng.standard_normal(2000) * rng.choice([1e-3, 1, 50, 400], 2000))
                  .astype(np.float32))
    inputs.append(rng.integers(0, 2**32, 500, dtype=np.uint64).astype(np.uint32)
                  .view(np.float32))
    encode_in = np.concatenate([np.asarray(x, dtype=np.float32) for x in inputs])
    with np.errstate(invalid="ignore"):  # NaN and out-of-range inputs: NaN codes, as wanted
        encoded = encode_in.astype(F8).view(np.uint8)

    lines = [f"# ml_dtypes {ml_dtypes.__version__} float8_e4m3fn; written by "
             "tests/reference/fp8_e4m3_goldens.py",
             "# decode: code float32_bits (NaN as its bits)"]
    lines += [f"decode {c} {b:08x}" for c, b in zip(codes, bits(decoded))]
    lines.append("# encode: float32_bits code")
    lines += [f"encode {b:08x} {c}" for b, c in zip(bits(encode_in), encoded)]
    text = "\n".join(lines) + "\n"
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as out:
            out.write(text)
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()
