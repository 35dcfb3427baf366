"""Encode throughput of Hugging Face's `tokenizers` (Rust, through its Python binding) on the
benchmark text, for comparison with pdserve-bench-tokenizer (docs/PERF.md, "Tokenizer"). One
thread, one call per document, best of N passes; encode in process CPU time, load in wall time.
  build/bench/tokenizer/pdserve-bench-tokenizer --dump-dir /tmp/tokbench
  .venv/bin/python tools/oracle/bench_tokenizer_oracle.py /tmp/tokbench [repeats]
"""
import os
import sys
import time

os.environ.setdefault("RAYON_NUM_THREADS", "1")  # one thread, as pdserve's benchmark
from tokenizers import Tokenizer  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def main():
    if len(sys.argv) < 2:
        print("usage: bench_tokenizer_oracle.py DUMP_DIR [REPEATS]", file=sys.stderr)
        return 2
    dump_dir = sys.argv[1]
    repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    start = time.perf_counter()
    tokenizer = Tokenizer.from_file(os.path.join(ROOT, "configs/models/qwen3-tokenizer/tokenizer.json"))
    print(f"hf-rust load: {(time.perf_counter() - start) * 1000:.1f} ms")
    for name in ("english", "cjk", "code"):
        with open(os.path.join(dump_dir, f"{name}.txt"), encoding="utf-8") as handle:
            documents = [d for d in handle.read().split("\f") if d]
        size = sum(len(d.encode()) for d in documents)
        best_wall = best_cpu = float("inf")
        tokens = 0
        for _ in range(repeats):
            wall, cpu = time.perf_counter(), time.process_time()
            tokens = sum(len(tokenizer.encode(d, add_special_tokens=False).ids) for d in documents)
            best_cpu = min(best_cpu, time.process_time() - cpu)
            best_wall = min(best_wall, time.perf_counter() - wall)
        mb = size / 1e6
        print(f"hf-rust encode {name:7}: {mb / best_wall:.2f} MB/s wall, {mb / best_cpu:.2f} MB/s CPU "
              f"({size} bytes, {tokens} tokens, best of {repeats})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
