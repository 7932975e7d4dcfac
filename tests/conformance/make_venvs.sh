#!/usr/bin/env bash
# Creates the two venvs the conformance tests check emitted lines in, from the
# lock files in tests/conformance/locks/:
#   .venv-vllm033/  vLLM 0.33.0's parser (trimmed), plus Mooncake 0.3.13.post1's
#                   pure-Python config loader from its wheel
#   .venv-dyn161/   Dynamo 1.6.1 with the vLLM 0.31.0 it pins
# Idempotent: a venv is kept while its stamp matches its pins (the lock file's
# requirement lines, comments aside, and the Mooncake wheel for the vLLM venv).
# The stamp is written once the venv imports what the tests need (that import
# takes 10-20 s, too long to repeat on every run).
# Usage: bash tests/conformance/make_venvs.sh
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
locks="$repo/tests/conformance/locks"
mooncake_wheel=mooncake-transfer-engine==0.3.13.post1
# Where venv_vllm_check.py looks for mooncake/mooncake_config.py.
mooncake_dir=mooncake-0.3.13.post1
export VLLM_TARGET_DEVICE=cpu

stamp_of() {  # lock-file [extra-pin...]
  { grep -Ev '^[[:space:]]*(#|$)' "$1"; printf '%s\n' "${@:2}"; } | sha256sum | cut -d' ' -f1
}

current() {  # venv stamp
  [ -x "$1/bin/python" ] && [ "$(cat "$1/.stamp" 2>/dev/null)" = "$2" ]
}

step() {  # message: progress on stderr, with the seconds since the script started
  printf '[make_venvs %4ds] %s\n' "$SECONDS" "$*" >&2
}

create() {  # venv lock-file
  rm -rf "$1"
  python3 -m venv "$1"
  step "installing $(grep -cEv '^[[:space:]]*(#|$)' "$2") pinned packages from $(basename "$2") into $1 (the first time: about 15-20 min on 2 cores; pip's cache, ~/.cache/pip, keeps the wheels, so a rebuild is quicker)"
  # pip prints one line per package it collects and installs: the progress
  "$1/bin/pip" install --no-deps --progress-bar off -r "$2" \
    > >(grep --line-buffered -E '^(Collecting|Installing|Successfully)' >&2)
}

finish() {  # venv stamp python-import-statement
  step "checking that $1 imports what the tests need (10-20 s)"
  "$1/bin/python" -c "$3" >/dev/null
  echo "$2" > "$1/.stamp"
  step "made $1"
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
  "$1/bin/python" -c 'import sys, zipfile
zipfile.ZipFile(sys.argv[1]).extract("mooncake/mooncake_config.py", sys.argv[2])' \
    "$tmp"/*.whl "$1/$mooncake_dir"
  rm -rf "$tmp"
}

make_vllm() {
  local venv="$repo/.venv-vllm033" lock="$locks/vllm033.txt" stamp
  stamp=$(stamp_of "$lock" "$mooncake_wheel")
  if current "$venv" "$stamp"; then
    step "kept $venv (its stamp matches the lock file)"
    return
  fi
  create "$venv" "$lock"
  trim_vllm "$venv"
  add_mooncake_loader "$venv"
  finish "$venv" "$stamp" "import vllm.entrypoints.common.cli_args, vllm.distributed.mooncake_store"
}

make_dynamo() {
  local venv="$repo/.venv-dyn161" lock="$locks/dyn161-vllm031.txt" stamp
  stamp=$(stamp_of "$lock")
  if current "$venv" "$stamp"; then
    step "kept $venv (its stamp matches the lock file)"
    return
  fi
  create "$venv" "$lock"
  finish "$venv" "$stamp" "import dynamo.vllm.args, dynamo.frontend.main, dynamo.router.args"
}

make_vllm
make_dynamo
