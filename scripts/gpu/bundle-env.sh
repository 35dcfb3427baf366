# Sourced by a GPU bundle's run.sh and run-gpu-tests.sh: unpacks the bundle's binaries and
# libraries (binaries.tar.gz: they travel packed, at about a fifth of their size) once, sets
# PDSERVE_BUNDLE_BIN to their folder, and puts the bundle's libraries and the machine's CUDA
# runtime and cuBLAS on LD_LIBRARY_PATH. The sonames the binaries need
# (cuda-libraries.txt, written by scripts/gpu-bundle.sh) are looked for under /usr/local/cuda*
# and in the nvidia/*/lib folders of Python environments (PyTorch's pip wheels carry them);
# the driver's libcuda comes from the system, or /usr/local/nvidia/lib64 where that exists.
# shellcheck shell=bash

pdserve_cuda_library_dirs() {
  local bundle=$1 wanted dir python site library
  local candidates=() found=()
  wanted=$(cat "$bundle/cuda-libraries.txt" 2>/dev/null)
  for dir in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
             /usr/local/cuda-*/lib64 /usr/local/cuda-*/targets/x86_64-linux/lib; do
    [[ -d $dir ]] && candidates+=("$dir")
  done
  for python in python3 /opt/torch/.venv/bin/python3; do
    command -v "$python" >/dev/null 2>&1 || continue
    while read -r site; do
      [[ -n $site ]] || continue
      for dir in "$site"/*/lib; do [[ -d $dir ]] && candidates+=("$dir"); done
    done < <(timeout 20 "$python" -c 'import nvidia; print("\n".join(nvidia.__path__))' 2>/dev/null)
  done
  for library in $wanted; do
    for dir in "${candidates[@]}"; do
      if [[ -e $dir/$library ]]; then
        [[ " ${found[*]} " == *" $dir "* ]] || found+=("$dir")
        break
      fi
    done
  done
  if [[ -d /usr/local/nvidia/lib64 ]]; then found+=(/usr/local/nvidia/lib64); fi
  (IFS=:; echo "${found[*]}")
}

# pdserve_unpack BUNDLE: the folder holding BUNDLE's bin/ and lib/, unpacked under TMPDIR once
# per archive content. Unpacked beside it and renamed into place, so that processes started
# together (a cluster's nodes, through run.sh) never see half an archive.
pdserve_unpack() {
  local archive=$1/binaries.tar.gz target staging
  target=${TMPDIR:-/tmp}/pdserve-bundle-$(cksum <"$archive" | cut -d' ' -f1)
  if [[ ! -d $target ]]; then
    staging=$(mktemp -d "$target.XXXXXX") || return 1
    if ! tar -xzf "$archive" -C "$staging"; then rm -rf "$staging"; return 1; fi
    mv -T "$staging" "$target" 2>/dev/null || rm -rf "$staging"  # (another process was first)
  fi
  echo "$target"
}

pdserve_bundle=${pdserve_bundle:-$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)}
pdserve_unpacked=$(pdserve_unpack "$pdserve_bundle") ||
  { echo "error: cannot unpack $pdserve_bundle/binaries.tar.gz under ${TMPDIR:-/tmp}" >&2; exit 2; }
export PDSERVE_BUNDLE_BIN=$pdserve_unpacked/bin
PDSERVE_CUDA_LIBRARY_DIRS=$(pdserve_cuda_library_dirs "$pdserve_bundle")
export LD_LIBRARY_PATH="$pdserve_unpacked/lib${PDSERVE_CUDA_LIBRARY_DIRS:+:$PDSERVE_CUDA_LIBRARY_DIRS}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# (if, not &&: a false test as the last command would fail a `set -e` script sourcing this)
if [[ -d $pdserve_unpacked/lib/ucx ]]; then export UCX_MODULE_DIR=$pdserve_unpacked/lib/ucx; fi
