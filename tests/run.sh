#!/usr/bin/env bash
# The test command (README; .ci/run calls it). Needs only Python >= 3.10 (3.11 for MXNet and the
# torch CPU wheel) and a C compiler:
#   bash tests/run.sh [--full] [--matrix] [--stress] [--no-pythons | --pythons] [-- pytest args]
# Two tiers:
#   (default)  the fast tier: every behaviour the package promises, tested once (a few minutes on
#              2 cores once the environments exist).
#   --full     the long tier (CI): also the tests marked `full` in the test files (pyproject.toml
#              registers the marker): the peers' own suites ported, with their controls (torch's,
#              torchdata's and Gluon's loaders), Lightning, Accelerate and torchrun, the C under
#              the sanitizers, the property tests, the benchmark's own tests.
# A flag this script does not know is an error naming the ones it does; pytest's own options go
# after `--` (a few common ones, -k/-x/-q/-p/--durations=N, are passed on as they are).
# The package is tested as a user gets it: the sdist is built from this checkout, pip builds a wheel
# from the sdist, each environment installs that wheel, and the tests run from the unpacked sdist
# (build/dist/src), so a file missing from the sdist fails here. Each test file runs once, in the
# environment it needs (tests/venvs.sh makes them):
#   core    Python 3.11 (or $PYTHON), numpy 2, no framework: tests/core, tests/csrc (the C under
#           TSan and ASan+UBSan), tests/mx/test_mx_optional.py (MXNet stays optional); then
#           `ruff check` on the checkout. (mypy --strict on a user snippet is a test: tests/core/test_typing.py.)
#   mxnet   Python 3.11, mxnet 1.9.1 + numpy 1.23.5: tests/mx, and the tests of tests/core that
#           need MXNet (test_bad_input.py's device checks).
#   torch   Python 3.11, numpy 2 + torch 2.13.0 (CPU): tests/pytorch, and the tests of tests/core
#           that need torch.
#   --matrix (CI): tests/core also in the mxnet environment (numpy 1.23.5), and on CPython 3.10,
#           3.12 and 3.13 (core-3.X), wherever found. (The torch environment's numpy 2 is the core
#           environment's: there it runs only the core tests that need torch.)
#   --no-pythons   with --matrix: leaves the other CPythons out, for a second tests/run.sh
#   --pythons      that runs only them (.ci/run runs the two side by side: under CI each takes
#                  its own lock, as they share no venv and the sdist is fixed for the run).
# Stress tests (tests/stress, -m stress) run in the core environment under CI or with --stress.
# Skipped tests are listed with their reasons (-rs).
# Venvs stay in build/test-envs (PREFETCH_ENVS moves them) and are reused while still valid; only
# the package is reinstalled when the sources changed. Under CI everything is made anew.
# The three environments' suites run one after the other.
# Exits non-zero when a step fails (2 for a flag it does not know); pytest-timeout bounds each test.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/tests/venvs.sh"
matrix=0
stress=$pf_ci
pythons=1   # 0: not the other CPythons; 2: only them
tier="not full"   # the tests' marker expression: the fast tier leaves out those marked `full`
pytest_args=()
flags="--full (the long tier), --matrix, --stress, --no-pythons, --pythons; pytest's options after --"
while [[ $# -gt 0 ]]; do
    case "$1" in
        --full) tier=""; shift ;;
        --matrix) matrix=1; shift ;;
        --stress) stress=1; shift ;;
        --no-pythons) pythons=0; shift ;;
        --pythons) pythons=2; shift ;;
        --) shift; pytest_args+=("$@"); break ;;
        -k|-p) pytest_args+=("$1" "$2"); shift 2 ;;
        -x|-q|-v|-s|-rs|--durations=*|--timeout=*) pytest_args+=("$1"); shift ;;
        *) echo "tests/run.sh: unknown tier or flag '$1'; the tiers: the fast one (no flag) and --full;" \
                "the flags: $flags" >&2
           exit 2 ;;
    esac
done
set -- "${pytest_args[@]}"
marks() {  # $1: "stress" or "not stress": that with the tier's marker expression
    if [[ -n "$tier" ]]; then echo "$1 and $tier"; else echo "$1"; fi
}
if [[ $pythons == 2 && $pf_ci == 1 ]]; then pf_lock .lock-pythons; else pf_lock; fi

pytest_in() {  # $1 = venv; rest: pytest args, paths relative to the unpacked sdist. The pytest
               # script, not python -m pytest, keeps the sdist's uncompiled prefetch/ off sys.path.
    local venv="$1"; shift
    (cd "$PF_SRC" && "$venv/bin/pytest" -c "$PF_SRC/pyproject.toml" --rootdir "$PF_SRC" "$@")
}

py311="$(pf_find_python 3.11)"
if [[ -z "$py311" ]]; then
    echo "tests/run.sh: no Python 3.11 found: MXNet 1.9.1 and the torch 2.13.0 CPU wheel need one" >&2
    exit 1
fi
pf_sdist

python_matrix() {  # tests/core on CPython 3.10, 3.12 and 3.13, wherever found
    local v py
    for v in 3.10 3.12 3.13; do
        py="$(pf_find_python $v)"
        if [[ -z "$py" ]]; then echo "tests/run.sh: Python $v not found, skipped" >&2; continue; fi
        pf_env "core-$v" "$py" test
        pytest_in "$PF_VENV" tests/core -m "$(marks "not stress")" -rs "$@"
    done
}
if [[ $pythons == 2 ]]; then
    python_matrix "$@"
    echo "tests/run.sh: tests/core passed on the other CPythons" >&2
    exit 0
fi

# The tests of tests/core that need a framework (they skip without it).
core_mx=(tests/core/test_bad_input.py "tests/core/test_docs.py::test_the_readmes_framework_examples_run_as_pasted[mxnet]")
core_torch=(tests/core/test_handover.py::test_arrays_sharing_memory_with_a_framework_tensor_are_copied
            "tests/core/test_docs.py::test_the_readmes_framework_examples_run_as_pasted[torch]")

# The three environments are made (or checked) one after the other, then their suites run one
# after the other.
pf_env core "${PYTHON:-$py311}" test
core_venv="$PF_VENV"
pf_env mxnet "$py311" test,mxnet
mx_venv="$PF_VENV"
if [[ $matrix == 1 ]]; then core_mx=(tests/core); fi
pf_env torch "$py311" test,torch
torch_venv="$PF_VENV"
if [[ -z "$tier" ]]; then pf_extra "$torch_venv" test-frameworks; fi

suite_core() {
    pytest_in "$core_venv" tests/core tests/csrc tests/mx/test_mx_optional.py -m "$(marks "not stress")" -rs "$@"
    if [[ $stress == 1 ]]; then
        echo "=== [core] stress"
        pytest_in "$core_venv" tests/stress -m stress -rs
    fi
    echo "=== [core] ruff check"
    (cd "$root" && "$PF_TOOLS/bin/ruff" check --no-cache .)
}
suite_mxnet() { pytest_in "$mx_venv" tests/mx "${core_mx[@]}" -m "$(marks "not stress")" -rs "$@"; }
suite_torch() { pytest_in "$torch_venv" tests/pytorch "${core_torch[@]}" -m "$(marks "not stress")" -rs "$@"; }

# One suite at a time: side by side on 2 cores they made the very load that the tests of
# timing and scheduling cannot stand, and the README's command failed where CI's passed.
times=()
for name in core mxnet torch; do
    echo "=== [$name] tests" >&2
    t0=$SECONDS
    "suite_$name" "$@"
    times+=("$name $((SECONDS - t0)) s")
done
echo "tests/run.sh: suites: ${times[*]}; $SECONDS s in all" >&2

if [[ $matrix == 1 && $pythons == 1 ]]; then python_matrix "$@"; fi
echo "tests/run.sh: all environments passed" >&2
