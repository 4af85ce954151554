#!/usr/bin/env bash
# The main job in one command, on a fresh machine:
#   bench/main.sh [--quick] [--out DIR] [any bench/run.py option]
# Installs the package as a user gets it (sdist -> wheel, tests/venvs.sh) with its [bench] extra
# into build/test-envs/bench, then runs bench/run.py. The venv is reused while still valid and
# only the package is reinstalled when the sources changed.
#   BENCH_MX=1        also install the [mxnet] extra (mxnet 1.9.1, numpy 1.23.5; Python <= 3.11),
#                     in build/test-envs/bench-mx: adds the mx.io.PrefetchingIter rows and the
#                     Module.fit section.
#   PYTHON=python3.11   the interpreter that makes the venv (default: a Python 3.11 if found).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
source "$root/tests/venvs.sh"
pf_lock
py="${PYTHON:-$(pf_find_python 3.11)}"
py="${py:-python3}"
pf_sdist
if [[ "${BENCH_MX:-0}" == 1 ]]; then
    pf_env bench-mx "$py" bench,mxnet
else
    pf_env bench "$py" bench,torch
fi
cd "$root"
exec "$PF_VENV/bin/python" "$here/run.py" "$@"
