#!/usr/bin/env bash
# The main job in one command, on a fresh machine:
#   bench/main.sh [--quick] [--out DIR] [any bench/run.py option]
# Makes a venv (default bench/out/venv, or $BENCH_VENV), installs this checkout
# with its [bench] extra (pip builds the core), then runs bench/run.py.
#   BENCH_MX=1        also install the [mxnet] extra (mxnet 1.9.1, numpy 1.23.5;
#                     Python <= 3.11): adds the mx.io.PrefetchingIter rows and the
#                     Module.fit section. Use a separate BENCH_VENV for it.
#   BENCH_NO_INSTALL=1  reuse the venv as it is (no rebuild).
#   PYTHON=python3.11   the interpreter that makes the venv.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
py="${PYTHON:-python3}"
if [[ "${BENCH_MX:-0}" == 1 ]]; then
    venv="${BENCH_VENV:-$here/out/venv-mx}"; extras="bench,mxnet"
else
    venv="${BENCH_VENV:-$here/out/venv}"; extras="bench"
fi
if [[ ! -x "$venv/bin/python" ]]; then
    echo "bench: creating $venv" >&2
    "$py" -m venv "$venv"
fi
if [[ "${BENCH_NO_INSTALL:-0}" != 1 ]]; then
    echo "bench: installing $root[$extras] into $venv (builds the core)" >&2
    "$venv/bin/python" -m pip install -q "$root[$extras]"
fi
cd "$root"
exec "$venv/bin/python" "$here/run.py" "$@"
