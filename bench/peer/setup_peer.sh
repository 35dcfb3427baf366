#!/usr/bin/env bash
# Creates the peer-benchmark venv: llama-cpp-python built from source by pip (its vendored
# llama.cpp, -march=native, with llama-bench, llama-batched-bench and llama-server built in the
# same CMake tree) and the gguf package, versions pinned in requirements.txt.
# Usage: bench/peer/setup_peer.sh [VENV]   (default: $PDSERVE_PEER_VENV or bench/peer/.venv)
# Safe to run again: an up-to-date venv (same requirements.txt, binaries present) is kept.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
venv=${1:-${PDSERVE_PEER_VENV:-$here/.venv}}
requirements=$here/requirements.txt
stamp=$venv/.pdserve-peer-requirements
want=$(sha256sum "$requirements" | cut -d' ' -f1)
tools=(llama-bench llama-batched-bench llama-server)
ready=1
[[ -f $stamp && $(cat "$stamp") == "$want" ]] || ready=0
for tool in "${tools[@]}"; do [[ -x $venv/llama-build/bin/$tool ]] || ready=0; done
if [[ $ready == 1 ]] && "$venv/bin/python" -c 'import llama_cpp, gguf' 2>/dev/null; then
  echo "setup_peer: $venv up to date"
  exit 0
fi
if [[ -e $venv && ! -f $venv/pyvenv.cfg ]]; then
  echo "error: $venv exists and is not a Python venv; move it or set PDSERVE_PEER_VENV" >&2
  exit 2
fi
echo "setup_peer: building $venv (llama-cpp-python from source: minutes to tens of minutes)"
# --clear: a venv that is not up to date is made anew (pip would keep an installed
# llama-cpp-python and never make the tools).
python3 -m venv --clear "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check pip==24.3.1
start=$(date +%s)
# pip passes --config-settings only to the requirements named on its command line, never to
# those of a -r file: so the two packages are named here, and requirements.txt pins them and
# their dependencies as constraints. The tools share the Python package's CMake build; the
# server's web UI is left out (it would be downloaded) and so are OpenSSL, tests and examples.
CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
CMAKE_ARGS="-DGGML_NATIVE=ON -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON \
-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF \
-DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_TOOLS_INSTALL=OFF" \
  "$venv/bin/python" -m pip install --disable-pip-version-check --no-cache-dir \
  --no-binary llama-cpp-python --config-settings="build-dir=$venv/llama-build" \
  -c "$requirements" llama-cpp-python gguf
for tool in "${tools[@]}"; do
  if [[ ! -x $venv/llama-build/bin/$tool ]]; then
    echo "error: the llama-cpp-python build made no $venv/llama-build/bin/$tool" >&2
    exit 2
  fi
done
echo "$want" >"$stamp"
echo "setup_peer: built in $(($(date +%s) - start)) s"
