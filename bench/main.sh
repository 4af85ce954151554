#!/usr/bin/env bash
# The main job in one command, on a fresh machine:
#   bench/main.sh [--quick] [--out DIR] [any bench/run.py option]
# Installs the package as a user gets it (sdist -> wheel, tests/venvs.sh) with its [bench],
# [torch] and [bench-peers] extras (SPDL, torchdata, Grain: the loaders it is compared with)
# into build/test-envs/torch (the one torch venv the tests use too), and MXNet 1.9.1 with the
# [mxnet] extra into build/test-envs/mxnet (the tests' MXNet venv: numpy 1.23.5, which torch's
# environment does not share); then runs bench/run.py, which runs the sections with MXNet rows
# (Gluon's DataLoader, mx.io.PrefetchingIter) in the MXNet venv. Each venv is reused while
# still valid and only the package is reinstalled when the sources changed.
#   PYTHON=python3.11   the interpreter that makes the venvs (default: a Python 3.11 if found;
#                       MXNet 1.9.1 needs Python <= 3.11: with a newer one the MXNet rows say so).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
source "$root/tests/venvs.sh"
pf_lock
py="${PYTHON:-$(pf_find_python 3.11)}"
py="${py:-python3}"
pf_sdist
mx=()
if "$py" -c 'import sys; sys.exit(sys.version_info[:2] > (3, 11))'; then
    pf_env mxnet "$py" test,mxnet
    mx=(--mx-python "$PF_VENV/bin/python")
fi
pf_env bench "$py" bench,torch,bench-peers
cd "$root"
exec "$PF_VENV/bin/python" "$here/run.py" "${mx[@]}" "$@"
