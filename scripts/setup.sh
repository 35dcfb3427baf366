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

# Each venv is built from Debian's interpreter (/usr/bin/python3), not whatever python3 comes
# first on PATH, so that it matches the pinned wheels. A stamp holding the requirements'
# hash tells an up-to-date venv from one that is stale or half-installed.
# ensure_venv WHAT DIR REQUIREMENTS VARIABLE IMPORTS: DIR holds REQUIREMENTS and imports IMPORTS,
# or is made anew (VARIABLE names the setting that moves it).
ensure_venv() {
  local what=$1 dir=$2 requirements=$3 variable=$4 imports=$5
  local want stamp
  want=$(sha256sum "$requirements" | cut -d' ' -f1)
  stamp=$dir/.pdserve-requirements
  if [[ -x $dir/bin/python && -f $stamp && $(cat "$stamp") == "$want" ]] &&
     "$dir/bin/python" -c "import $imports" 2>/dev/null; then
    echo "setup: $what $dir up to date"
    return
  fi
  echo "setup: installing the $what $dir (${requirements#"$repo"/})"
  if [[ -e $dir && ! -f $dir/pyvenv.cfg ]]; then
    echo "setup: $dir exists and is not a Python venv; move it or set $variable" >&2
    exit 2
  fi
  rm -rf "$dir"
  /usr/bin/python3 -m venv "$dir"
  "$dir/bin/python" -m pip install -q --disable-pip-version-check --no-input -r "$requirements"
  echo "$want" >"$stamp"
}

venv=${PDSERVE_VENV:-$repo/.venv}
ensure_venv "Python environment" "$venv" "$repo/python/requirements.txt" PDSERVE_VENV \
  "openai, tokenizers, transformers, schemathesis, jsonschema, ml_dtypes"

# lm-eval, the evaluation harness users point at vLLM (tests/lmeval), in a venv of its own
# ($PDSERVE_LMEVAL_VENV, default .venv-lmeval) with every package pinned by
# python/lmeval-requirements.txt, so that its pins never move the main venv's. Its API models
# (local-completions, local-chat-completions) import no PyTorch: lm-eval[api] plus
# transformers for the Hugging Face tokenizer backend, no CUDA wheels. The float64 reference
# its test compares with runs on Debian's python3-torch (installed above).
ensure_venv "lm-eval environment" "${PDSERVE_LMEVAL_VENV:-$repo/.venv-lmeval}" \
  "$repo/python/lmeval-requirements.txt" PDSERVE_LMEVAL_VENV "lm_eval, transformers"

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
