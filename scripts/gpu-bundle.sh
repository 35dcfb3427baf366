#!/usr/bin/env bash
# gpu-bundle.sh BUILD_DIR OUT_DIR: a self-contained folder to run pdserve's binaries and GPU
# tests on a machine that has the NVIDIA driver and CUDA runtime/cuBLAS but no build tools:
#   OUT_DIR/bin/       the pdserve-* executables and the kernels test executables (debug
#                      info stripped)
#   OUT_DIR/lib/       every shared library they need that is neither glibc/libstdc++ nor
#                      CUDA (UCX with its transport modules, Boost, PCRE2, utf8proc, OpenBLAS,
#                      gomp, ...), found with ldd
#   OUT_DIR/src/       configs/models and tests/data (the assets the tests read)
#   OUT_DIR/run.sh     run.sh NAME ARGS...: runs bin/NAME with the bundle's libraries
#   OUT_DIR/run-gpu-tests.sh [RESULTS_DIR]: the gpu-label test, the host-side tests and
#                      pdserve-bench-gpu, logs in RESULTS_DIR (default OUT_DIR/results)
set -euo pipefail

if [[ $# -ne 2 ]]; then
  echo "usage: $0 BUILD_DIR OUT_DIR" >&2
  exit 2
fi
build_dir=$(cd "$1" && pwd)
out_dir=$2
source_dir=$(cd "$(dirname "$0")/.." && pwd)
if [[ ! -f "$build_dir/CMakeCache.txt" ]]; then
  echo "error: $build_dir is not a CMake build folder" >&2
  exit 2
fi

rm -rf "$out_dir"
mkdir -p "$out_dir/bin" "$out_dir/lib" "$out_dir/src/configs" "$out_dir/src/tests"
out_dir=$(cd "$out_dir" && pwd)

# Executables: the tools and benchmarks, and the test binaries of the kernels areas.
mapfile -t binaries < <(
  find "$build_dir" -path "$build_dir/CMakeFiles" -prune -o -type f -perm -u+x \
    \( -name 'pdserve-*' -o -path '*/tests/kernels/*_test' -o -path '*/tests/kernels_gpu/*_test' \) \
    -print | sort)
if [[ ${#binaries[@]} -eq 0 ]]; then
  echo "error: no executables under $build_dir (build it first)" >&2
  exit 2
fi
for binary in "${binaries[@]}"; do
  # Only ELF files (skip scripts that match the names).
  if [[ $(head -c 4 "$binary" | od -An -c | tr -d ' ') != '177ELF' ]]; then continue; fi
  objcopy --strip-debug "$binary" "$out_dir/bin/$(basename "$binary")"
done

# Shared libraries: whatever ldd resolves, except the C/C++ runtime every Linux has and the
# CUDA driver/runtime/cuBLAS, which must come from the GPU machine's own installation.
is_host_library() {
  case "$(basename "$1")" in
    ld-linux*|libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|libresolv.so*|\
    libstdc++.so*|libgcc_s.so*|libcuda.so*|libcudart.so*|libcublas*.so*|libnv*.so*) return 0 ;;
  esac
  return 1
}
for binary in "$out_dir"/bin/*; do
  while read -r library; do
    [[ -n "$library" && -f "$library" ]] || continue
    is_host_library "$library" && continue
    cp -L -n "$library" "$out_dir/lib/"
  done < <(ldd "$binary" 2>/dev/null | awk '/=> \// { print $3 }')
done
# UCX opens its transports (tcp, shared memory, verbs, ...) at run time from its module folder.
ucx_module_dir=$(dpkg -L libucx0 2>/dev/null | grep -m1 -E '/ucx$' || true)
if [[ -n "$ucx_module_dir" && -d "$ucx_module_dir" ]]; then
  mkdir -p "$out_dir/lib/ucx"
  cp -L "$ucx_module_dir"/*.so* "$out_dir/lib/ucx/" 2>/dev/null || true
  for module in "$out_dir"/lib/ucx/*.so*; do
    while read -r library; do
      [[ -n "$library" && -f "$library" ]] || continue
      is_host_library "$library" && continue
      cp -L -n "$library" "$out_dir/lib/"
    done < <(ldd "$module" 2>/dev/null | awk '/=> \// { print $3 }')
  done
fi

cp -r "$source_dir/configs/models" "$out_dir/src/configs/"
cp -r "$source_dir/tests/data" "$out_dir/src/tests/"

cat > "$out_dir/run.sh" <<'RUN'
#!/usr/bin/env bash
# run.sh NAME ARGS...: bin/NAME with this bundle's libraries and assets.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
name=$1
shift
# The CUDA runtime and cuBLAS are the machine's: its own LD_LIBRARY_PATH, then the usual
# toolkit folders (the binaries' RUNPATH only names the build machine's).
cuda_dirs=$(ls -d /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda-*/lib64 2>/dev/null | paste -sd: -)
export LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}${cuda_dirs:+:$cuda_dirs}"
export UCX_MODULE_DIR="$here/lib/ucx"
export PDSERVE_SOURCE_DIR="$here/src"
export PDSERVE_ASSETS_DIR="$here/src/configs/models"
export PDSERVE_BINARY_DIR="${PDSERVE_BINARY_DIR:-${TMPDIR:-/tmp}/pdserve-bundle}"
mkdir -p "$PDSERVE_BINARY_DIR"
exec "$here/bin/$name" "$@"
RUN

cat > "$out_dir/run-gpu-tests.sh" <<'TESTS'
#!/usr/bin/env bash
# run-gpu-tests.sh [RESULTS_DIR]: the CUDA backend test (must not skip here), the host-side
# kernels tests, then pdserve-bench-gpu. Exit status: 0 only if every test passed.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
results=${1:-$here/results}
mkdir -p "$results"
: > "$results/summary.txt"
status=0
nvidia-smi > "$results/nvidia-smi.txt" 2>&1 || true
# Which libraries the GPU test resolves to, for a failure to start.
LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ldd "$here/bin/cuda_backend_test" \
  > "$results/ldd-cuda_backend_test.txt" 2>&1 || true
for test in cuda_backend_test kernels_gpu_plan_test kernels_test; do
  [[ -x "$here/bin/$test" ]] || continue
  "$here/run.sh" "$test" > "$results/$test.log" 2>&1
  code=$?
  echo "$test: exit $code" | tee -a "$results/summary.txt"
  [[ $code -eq 0 ]] || status=1
done
if [[ -x "$here/bin/pdserve-bench-gpu" ]]; then
  # PDSERVE_BENCH_ARGS: extra flags, split on spaces (e.g. "--shapes qwen3-0.6b --repeats 3").
  # shellcheck disable=SC2086
  "$here/run.sh" pdserve-bench-gpu ${PDSERVE_BENCH_ARGS:-} > "$results/bench-gpu.md" 2>&1
  echo "pdserve-bench-gpu: exit $?" | tee -a "$results/summary.txt"
fi
exit $status
TESTS
chmod +x "$out_dir/run.sh" "$out_dir/run-gpu-tests.sh"
echo "bundle: $out_dir ($(du -sh "$out_dir" | cut -f1); $(ls "$out_dir/bin" | wc -l) executables, $(ls "$out_dir/lib" | wc -l) libraries)"
