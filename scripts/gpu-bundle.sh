#!/usr/bin/env bash
# gpu-bundle.sh BUILD_DIR OUT_DIR: what a GPU machine needs to run pdserve's GPU checks, and
# nothing more, in one folder that travels with the working tree (OUT_DIR at the repository
# root, named build-* so git ignores it: build-gpu-bundle). The tree and the bundle together
# must stay under the device machine's 64 MiB, so the bundle must stay under
# $PDSERVE_BUNDLE_LIMIT_MIB (default 32, so that the tree (about 26 MiB) and the bundle stay
# within 64 MiB; the FP8 and speculative-decoding code took it to 30 MiB on 2026-11-28): this
# script fails when it is larger.
#   OUT_DIR/binaries.tar.gz      bin/ and lib/ below, packed (about 50 MiB unpacked: the tree
#                                and the bundle would not fit unpacked); bundle-env.sh unpacks
#                                them once under TMPDIR
#     bin/                       BUNDLED_BINARIES and every gpu-label test binary of the build,
#                                stripped of every symbol not needed to link (--strip-unneeded)
#     lib/                 the shared libraries they need that a GPU machine lacks
#                                (Boost, PCRE2, utf8proc, OpenBLAS, gomp, UCX and its transport
#                                modules, ...), stripped the same way, each once; not
#                                glibc/libstdc++ nor CUDA, which come from the machine
#   OUT_DIR/gpu-tests.txt        the gpu-label test binaries (ctest -L gpu of BUILD_DIR)
#   OUT_DIR/cuda-libraries.txt   the CUDA sonames the binaries need (bundle-env.sh finds them)
#   OUT_DIR/bundle-env.sh        the library search (sourced by the two scripts below)
#   OUT_DIR/run.sh NAME ARGS...  one binary with the bundle's libraries and the checkout's assets
#   OUT_DIR/run-gpu-tests.sh OUT the GPU session's first run (360 s; --second: the second, 300 s,
#                                with the PD stages, which also run tests/pd/pd_e2e_test.py,
#                                bench/kv_transfer/kv_path_bench.py and tools/cluster from the
#                                checkout)
set -euo pipefail

# The tools the GPU stages run, besides the gpu-label tests: the first run's, then the second
# run's PD stages' (the nodes, the proxy and the KV transfer benchmark).
BUNDLED_BINARIES=(pdserve-generate pdserve-make-model pdserve-bench-gpu
                  pdserve-proxy pdserve-prefill pdserve-decode pdserve-bench-kv-transfer)

if [[ $# -ne 2 ]]; then
  echo "usage: $0 BUILD_DIR OUT_DIR" >&2
  exit 2
fi
build_dir=$(cd "$1" && pwd)
out_dir=$2
source_dir=$(cd "$(dirname "$0")/.." && pwd)
limit_mib=${PDSERVE_BUNDLE_LIMIT_MIB:-32}
if [[ ! -f "$build_dir/CMakeCache.txt" ]]; then
  echo "error: $build_dir is not a CMake build folder" >&2
  exit 2
fi
if ! grep -q -- '-DPDSERVE_WITH_CUDA=1' "$build_dir/build.ninja" 2>/dev/null; then
  echo "error: $build_dir is not a Ninja build with CUDA (configure with nvcc present)" >&2
  exit 2
fi

# The gpu-label tests as CTest knows them: executable paths (none takes arguments).
gpu_tests=()
mapfile -t gpu_tests < <(
  ctest --test-dir "$build_dir" -L gpu --show-only=json-v1 2>/dev/null | python3 -c '
import json, sys
for test in json.load(sys.stdin)["tests"]:
    command = test.get("command") or []
    if len(command) != 1:
        sys.exit("error: gpu test %s takes arguments; the bundle runs binaries alone" % test["name"])
    print(command[0])')
if [[ ${#gpu_tests[@]} -eq 0 ]]; then
  echo "error: ctest lists no gpu-label test in $build_dir" >&2
  exit 2
fi
binaries=("${gpu_tests[@]}")
for name in "${BUNDLED_BINARIES[@]}"; do
  path=$(find "$build_dir" -path "$build_dir/CMakeFiles" -prune -o -type f -name "$name" -perm -u+x -print | head -1)
  [[ -n $path ]] || { echo "error: $name is not built in $build_dir" >&2; exit 2; }
  binaries+=("$path")
done
for binary in "${binaries[@]}"; do
  [[ -x $binary ]] || { echo "error: $binary is not built (build the gpu tests first)" >&2; exit 2; }
done

rm -rf "$out_dir"
mkdir -p "$out_dir/bin" "$out_dir/lib"
out_dir=$(cd "$out_dir" && pwd)
for binary in "${binaries[@]}"; do
  strip --strip-unneeded -o "$out_dir/bin/$(basename "$binary")" "$binary"
done
for test in "${gpu_tests[@]}"; do basename "$test"; done >"$out_dir/gpu-tests.txt"

# Libraries every Linux with an NVIDIA driver has, and CUDA's own, which must be the machine's.
is_host_library() {
  case "$(basename "$1")" in
    ld-linux*|libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|libresolv.so*|\
    libstdc++.so*|libgcc_s.so*|libcuda.so*|libcudart.so*|libcublas*.so*|libnv*.so*) return 0 ;;
  esac
  return 1
}
copy_libraries_of() {
  local library
  while read -r library; do
    [[ -n "$library" && -f "$library" ]] || continue
    is_host_library "$library" && continue
    [[ -e "$out_dir/lib/$(basename "$library")" ]] && continue
    cp -L "$library" "$out_dir/lib/"
    strip --strip-unneeded "$out_dir/lib/$(basename "$library")" 2>/dev/null || true
  done < <(ldd "$1" 2>/dev/null | awk '/=> \// { print $3 }')
}
for binary in "$out_dir"/bin/*; do copy_libraries_of "$binary"; done
# The CUDA sonames the binaries were linked against (found on the GPU machine by bundle-env.sh).
for binary in "$out_dir"/bin/*; do
  readelf -d "$binary" | sed -n 's/.*Shared library: \[\(libcu[a-zA-Z]*\.so[.0-9]*\)\].*/\1/p'
done | grep -v '^libcuda\.so' | sort -u >"$out_dir/cuda-libraries.txt"
# UCX opens its transports (tcp, shared memory, verbs, ...) at run time from its module folder.
if ls "$out_dir"/lib/libucp.so* >/dev/null 2>&1; then
  ucx_module_dir=$(dpkg -L libucx0 2>/dev/null | grep -m1 -E '/ucx$' || true)
  if [[ -n "$ucx_module_dir" && -d "$ucx_module_dir" ]]; then
    mkdir -p "$out_dir/lib/ucx"
    # Each module once: its .so and .so.0 names stay links to it (cp -P), as UCX installs them.
    cp -P "$ucx_module_dir"/*.so* "$out_dir/lib/ucx/" 2>/dev/null || true
    find "$out_dir/lib/ucx" -type f -exec strip --strip-unneeded {} + 2>/dev/null || true
    for module in "$out_dir"/lib/ucx/*.so*; do copy_libraries_of "$module"; done
  fi
fi

# Packed: the binaries compress to about a fifth.
tar -C "$out_dir" -czf "$out_dir/binaries.tar.gz" bin lib
unpacked_mib=$(( ($(du -sb "$out_dir/bin" "$out_dir/lib" | awk '{ sum += $1 } END { print sum }') + (1 << 20) - 1) >> 20 ))
executables=$(ls "$out_dir/bin" | wc -l)
libraries=$(find "$out_dir/lib" -type f | wc -l)
rm -rf "$out_dir/bin" "$out_dir/lib"

cp "$source_dir/scripts/gpu/bundle-env.sh" "$source_dir/scripts/gpu/run-gpu-tests.sh" "$out_dir/"
cat >"$out_dir/run.sh" <<'RUN'
#!/usr/bin/env bash
# run.sh NAME ARGS...: bin/NAME with the bundle's libraries and the checkout's assets (the
# bundle sits at the root of a pdserve checkout, or PDSERVE_REPO names one).
set -euo pipefail
pdserve_bundle=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=bundle-env.sh
source "$pdserve_bundle/bundle-env.sh"
repo=${PDSERVE_REPO:-$(cd "$pdserve_bundle/.." && pwd)}
export PDSERVE_SOURCE_DIR=$repo
export PDSERVE_ASSETS_DIR=$repo/configs/models
export PDSERVE_BINARY_DIR="${PDSERVE_BINARY_DIR:-${TMPDIR:-/tmp}/pdserve-bundle}"
mkdir -p "$PDSERVE_BINARY_DIR"
name=$1
shift
exec "$PDSERVE_BUNDLE_BIN/$name" "$@"
RUN
chmod +x "$out_dir/run.sh" "$out_dir/run-gpu-tests.sh"

bytes=$(du -sb "$out_dir" | cut -f1)
mib=$(( (bytes + (1 << 20) - 1) >> 20 ))
echo "bundle: $out_dir ($mib MiB of $limit_mib; $executables executables and $libraries libraries, $unpacked_mib MiB unpacked)"
if [[ $bytes -gt $((limit_mib << 20)) ]]; then
  echo "error: the bundle is $mib MiB, over its limit of $limit_mib MiB; the largest files:" >&2
  find "$out_dir" -type f -printf '%s %P\n' | sort -rn | head -10 >&2
  exit 1
fi
