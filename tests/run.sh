#!/usr/bin/env bash
# The test command (README; .ci/run calls it). Needs only Python >= 3.10 and a C compiler:
#   bash tests/run.sh [--matrix] [extra pytest args]
# 1. core: a fresh venv with numpy 2 (no MXNet), `pip install .[test]` builds
#    the core from source, then the whole suite (csrc under TSan/ASan included).
# 2. mxnet: a Python 3.11 venv with the [mxnet] extra (mxnet 1.9.1, numpy
#    1.23.5), the same suite again (the test_mx_* files run there).
# 3. --matrix: the core tests on every other CPython 3.10-3.13 found (SPEC §8).
# Stress tests (-m stress) run once, in the core environment, after its suite.
# Venvs live in build/test-envs (PREFETCH_ENVS to move them); each is made anew.
# Exits non-zero on the first failing environment; pytest-timeout bounds each test.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
envs="${PREFETCH_ENVS:-$root/build/test-envs}"
matrix=0
if [[ "${1:-}" == "--matrix" ]]; then matrix=1; shift; fi

find_python() {  # $1 = major.minor; prints an interpreter path or nothing
    for c in "python$1" "/root/.pyenv/versions/$1"*/bin/python3 "$HOME/.pyenv/versions/$1"*/bin/python3; do
        if command -v "$c" >/dev/null 2>&1 && "$c" -c "import sys; assert sys.version_info[:2] == tuple(map(int, '$1'.split('.')))" 2>/dev/null; then
            command -v "$c"; return
        fi
    done
}

pytest_in() {  # $1 = venv; rest: pytest args. The pytest script, not python -m pytest,
               # keeps the checkout's uncompiled prefetch/ off sys.path.
    local venv="$1"; shift
    (cd "$root" && "$venv/bin/pytest" -c "$root/pyproject.toml" --rootdir "$root" "$@")
}

run_env() {  # $1 = name, $2 = python, $3 = pip extras; rest: pytest args
    local name="$1" py="$2" extras="$3"; shift 3
    local venv="$envs/$name"
    echo "=== [$name] $("$py" --version) -> $venv" >&2
    rm -rf "$venv"
    "$py" -m venv "$venv"
    "$venv/bin/python" -m pip install -q --upgrade pip >/dev/null
    # The package is built from this checkout by pip (build isolation: Cython 3, numpy 2).
    "$venv/bin/python" -m pip install -q "$root[$extras]"
    pytest_in "$venv" "$@"
}

py311="$(find_python 3.11)"
run_env core "${PYTHON:-${py311:-python3}}" test "$root/tests" -m "not stress" "$@"
echo "=== [core] stress" >&2
pytest_in "$envs/core" "$root/tests" -m stress
if [[ -z "$py311" ]]; then
    echo "tests/run.sh: no Python 3.11 found: MXNet 1.9.1 needs one" >&2; exit 1
fi
run_env mxnet "$py311" "test,mxnet" "$root/tests" -m "not stress" "$@"
if [[ $matrix == 1 ]]; then
    for v in 3.10 3.12 3.13; do
        py="$(find_python $v)"
        if [[ -z "$py" ]]; then echo "tests/run.sh: Python $v not found, skipped" >&2; continue; fi
        run_env "core-$v" "$py" test "$root/tests/core" -m "not stress" "$@"
    done
fi
echo "tests/run.sh: all environments passed" >&2
