#!/usr/bin/env bash
# Creates the two venvs the conformance tests check emitted lines in, as
# ../shared/docs/VALIDATION.md prescribes:
#   .venv-vllm033/  vLLM 0.33.0's parser (trimmed), plus Mooncake 0.3.13.post1's
#                   pure-Python config loader from its wheel
#   .venv-dyn161/   Dynamo 1.6.1 with the vLLM 0.31.0 it pins
# Idempotent: a venv that exists and imports what the tests need is kept.
# Usage: bash tests/conformance/make_venvs.sh
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
locks="$repo/../shared/validation"
mooncake_wheel=mooncake-transfer-engine==0.3.13.post1
# Where venv_vllm_check.py looks for mooncake/mooncake_config.py.
mooncake_dir=mooncake-0.3.13.post1
export VLLM_TARGET_DEVICE=cpu

usable() {  # venv python-statement
  [ -x "$1/bin/python" ] && "$1/bin/python" -c "$2" >/dev/null 2>&1
}

create() {  # venv lock-file
  rm -rf "$1"
  python3 -m venv "$1"
  "$1/bin/pip" install --quiet --no-deps -r "$2"
}

# The compiled kernels and vendored GPU code are not needed to parse lines or
# build an engine config on CPU: 2.2 GB -> about 1.4 GB.
trim_vllm() {  # venv
  local pkg
  pkg=$("$1/bin/python" -c 'import os, importlib.util as u; print(os.path.dirname(u.find_spec("vllm").origin))')
  find "$pkg" -name '*.so' -delete
  rm -rf "$pkg/third_party" "$pkg/vllm-rs"
}

# Only mooncake/mooncake_config.py is taken: it imports nothing outside the
# standard library, while the package itself needs native libraries.
add_mooncake_loader() {  # venv
  local tmp
  tmp=$(mktemp -d)
  "$1/bin/pip" download --quiet --no-deps --only-binary=:all: -d "$tmp" "$mooncake_wheel"
  "$1/bin/python" -m zipfile -e "$tmp"/*.whl "$tmp/wheel"
  mkdir -p "$1/$mooncake_dir/mooncake"
  cp "$tmp/wheel/mooncake/mooncake_config.py" "$1/$mooncake_dir/mooncake/"
  rm -rf "$tmp"
}

make_vllm() {
  local venv="$repo/.venv-vllm033"
  if usable "$venv" "import vllm.entrypoints.common.cli_args" \
      && [ -f "$venv/$mooncake_dir/mooncake/mooncake_config.py" ]; then
    echo "kept $venv"
    return
  fi
  create "$venv" "$locks/lock-vllm033.txt"
  trim_vllm "$venv"
  add_mooncake_loader "$venv"
  echo "made $venv"
}

make_dynamo() {
  local venv="$repo/.venv-dyn161"
  if usable "$venv" "import dynamo.vllm.args, dynamo.frontend.main"; then
    echo "kept $venv"
    return
  fi
  create "$venv" "$locks/lock-dyn161-vllm031.txt"
  echo "made $venv"
}

make_vllm
make_dynamo
