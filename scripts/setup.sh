#!/usr/bin/env bash
# Installs pdserve's build and test dependencies: Debian 12 packages (needs root or sudo; among
# them the tools tests run: `prometheus` (tests/metrics/prometheus_test.py), `ip`, `tc` and `ss`
# of iproute2 (tests/netfault), `curl` (tests/conformance), `systemd-analyze` (tests/deploy)) and
# one Python virtual environment with the pinned packages of python/requirements.txt (the
# official `openai` client, Hugging Face's tokenizer and chat-template code, schemathesis,
# aiperf), a second venv with the pinned lm-eval harness (python/lmeval-requirements.txt), and
# the source of the xgrammar grammar engine (its sdist, fetched with pip and
# pinned, into third_party/; CMake builds its C++ core). Safe to run again: it installs only
# what is missing and repairs a broken venv.
# The venv lives in $PDSERVE_VENV (default: .venv in the repository root).
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

packages=(
  build-essential cmake ninja-build pkg-config git
  libgtest-dev libgmock-dev libbenchmark-dev
  nlohmann-json3-dev libcli11-dev libpcre2-dev libutf8proc-dev libopenblas-dev libxxhash-dev
  libboost-dev libboost-system-dev libucx-dev ucx-utils libssl-dev
  python3 python3-venv python3-torch python3-numpy python3-matplotlib curl procps
  systemd prometheus iproute2
)

missing=()
for pkg in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done

if ((${#missing[@]})); then
  sudo_cmd=()
  [[ $(id -u) -eq 0 ]] || sudo_cmd=(sudo)
  echo "setup: installing ${missing[*]}"
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "setup: all Debian packages present"
fi

# The venv is built from Debian's interpreter (/usr/bin/python3), not whatever python3 comes
# first on PATH, so that it matches the pinned wheels. A stamp holding the requirements'
# hash tells an up-to-date venv from one that is stale or half-installed.
venv=${PDSERVE_VENV:-$repo/.venv}
requirements=$repo/python/requirements.txt
want=$(sha256sum "$requirements" | cut -d' ' -f1)
stamp=$venv/.pdserve-requirements
if [[ -x $venv/bin/python && -f $stamp && $(cat "$stamp") == "$want" ]] &&
   "$venv/bin/python" -c 'import openai, tokenizers, transformers, schemathesis, jsonschema' 2>/dev/null; then
  echo "setup: Python environment $venv up to date"
else
  echo "setup: installing the Python environment $venv (python/requirements.txt)"
  if [[ -e $venv && ! -f $venv/pyvenv.cfg ]]; then
    echo "setup: $venv exists and is not a Python venv; move it or set PDSERVE_VENV" >&2
    exit 2
  fi
  rm -rf "$venv"
  /usr/bin/python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-input -r "$requirements"
  echo "$want" >"$stamp"
fi

# lm-eval, the evaluation harness users point at vLLM (tests/lmeval), in a venv of its own
# ($PDSERVE_LMEVAL_VENV, default .venv-lmeval) with every package pinned by
# python/lmeval-requirements.txt, so that its pins never move the main venv's. Its API models
# (local-completions, local-chat-completions) import no PyTorch: lm-eval[api] plus
# transformers for the Hugging Face tokenizer backend, no CUDA wheels. The float64 reference
# its test compares with runs on Debian's python3-torch (installed above).
lmeval_venv=${PDSERVE_LMEVAL_VENV:-$repo/.venv-lmeval}
lmeval_requirements=$repo/python/lmeval-requirements.txt
lmeval_want=$(sha256sum "$lmeval_requirements" | cut -d' ' -f1)
lmeval_stamp=$lmeval_venv/.pdserve-requirements
if [[ -x $lmeval_venv/bin/python && -f $lmeval_stamp && $(cat "$lmeval_stamp") == "$lmeval_want" ]] &&
   "$lmeval_venv/bin/python" -c 'import lm_eval, transformers' 2>/dev/null; then
  echo "setup: lm-eval environment $lmeval_venv up to date"
else
  echo "setup: installing the lm-eval environment $lmeval_venv (python/lmeval-requirements.txt)"
  if [[ -e $lmeval_venv && ! -f $lmeval_venv/pyvenv.cfg ]]; then
    echo "setup: $lmeval_venv exists and is not a Python venv; move it or set PDSERVE_LMEVAL_VENV" >&2
    exit 2
  fi
  rm -rf "$lmeval_venv"
  /usr/bin/python3 -m venv "$lmeval_venv"
  "$lmeval_venv/bin/python" -m pip install -q --disable-pip-version-check --no-input \
    -r "$lmeval_requirements"
  echo "$lmeval_want" >"$lmeval_stamp"
fi

# xgrammar (Apache-2.0), the structured-output grammar engine: its sdist carries the C++ core
# that cmake/xgrammar.cmake builds (its Python bindings are not used). Fetched by the venv's pip
# from the index pip is configured with, pinned by version and sha256, and unpacked into
# third_party/ (not committed). Only xgrammar comes as source: the build tools pip runs to read
# the sdist's metadata come as wheels (with --no-binary :all: pip would compile cmake first).
xgrammar_version=0.2.8
xgrammar_sha256=8305646fd2b319d6c3003f51a1665e54cbbe9cba1fb636bc41d0b46434ccbb80
xgrammar_dir=$repo/third_party/xgrammar-$xgrammar_version
if [[ -f $xgrammar_dir/.pdserve-sha256 && $(cat "$xgrammar_dir/.pdserve-sha256") == "$xgrammar_sha256" ]]; then
  echo "setup: xgrammar $xgrammar_version present"
else
  echo "setup: fetching the xgrammar $xgrammar_version sdist with pip"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  "$venv/bin/python" -m pip download -q --disable-pip-version-check --no-input --no-deps \
    --no-binary xgrammar --dest "$tmp" "xgrammar==$xgrammar_version"
  sdist=$tmp/xgrammar-$xgrammar_version.tar.gz
  if [[ ! -f $sdist || $(sha256sum "$sdist" | cut -d' ' -f1) != "$xgrammar_sha256" ]]; then
    echo "setup: pip gave no xgrammar-$xgrammar_version.tar.gz with the pinned sha256" >&2
    exit 2
  fi
  rm -rf "$xgrammar_dir"
  mkdir -p "$repo/third_party"
  tar -xzf "$sdist" -C "$repo/third_party"
  echo "$xgrammar_sha256" >"$xgrammar_dir/.pdserve-sha256"
fi
