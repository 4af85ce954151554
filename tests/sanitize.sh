#!/usr/bin/env bash
# The Python test suite against an ASan+UBSan build of the core with csrc's debug asserts on
# (issue 5, issue 18; STYLE §6.7):
#   bash tests/sanitize.sh [pytest args]      (default args: -m "not stress" -k "not csrc_under";
#   also "not fork_with_threads" with a GCC older than 14: see below)
# 1. Copies the checkout (sources only: no build/, no *.so, no generated _core.c) to
#    build/sanitize/src, so setuptools cannot reuse an object built without the
#    sanitizers, and builds it there with PREFETCH_SANITIZE=1 PREFETCH_DEBUG=1
#    PREFETCH_WERROR=1 (-O0, csrc's PF_ASSERTs and the ring's one-thread-per-side asserts,
#    no compiler warning) into a fresh venv, build/sanitize/venv (PYTHON picks the
#    interpreter; default python3.11).
# 2. Checks that the built extension really is instrumented (__asan_init, __ubsan_*) and
#    has its asserts (__assert_fail).
# 3. Runs pytest with the sanitizer runtime preloaded (python itself is not
#    instrumented): PYTHONMALLOC=malloc so every Python allocation goes through ASan,
#    detect_leaks=0 (CPython frees little at exit), halt on the first error,
#    allocator_may_return_null=1 (tests/test_bad_input.py asks for a PiB: that must be
#    a MemoryError, not an ASan abort). Subprocess cases and forked children inherit
#    all of it. Output goes to build/sanitize/pytest.log, ASan reports also to
#    build/sanitize/logs/asan.<pid>.
#    pytest-timeout is 240 s a test, not 60: ASan at -O0 runs the deepest property test
#    (tests/core/test_property.py, nesting up to MAX_DEPTH) in 85-130 s on 2 shared cores.
# Fails if pytest fails, or if any process wrote a sanitizer report or failed an assert (an assert
# aborts its process: pytest itself, or a subprocess case, which then fails on its exit status).
# Triage only (never in CI): PREFETCH_UBSAN_SUPPRESSIONS=<file> passes a UBSan
# suppressions file (lines like "alignment:_core.c") to see past a known report.
# The csrc drivers run under ASan/UBSan/TSan in the ordinary pass already (test_csrc.py).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
work="${PREFETCH_SANITIZE_DIR:-$root/build/sanitize}"
py="${PYTHON:-python3.11}"
cc="${CC:-gcc}"

rm -rf "$work"
mkdir -p "$work/src" "$work/logs"
tar -C "$root" --exclude=./build --exclude=./.git --exclude=./.venv --exclude='*.so' \
    --exclude=./prefetch/_core.c --exclude='*.egg-info' --exclude=./bench/out -cf - . | tar -C "$work/src" -xf -

"$py" -m venv "$work/venv"
"$work/venv/bin/python" -m pip install -q --upgrade pip >/dev/null
PREFETCH_SANITIZE=1 PREFETCH_DEBUG=1 PREFETCH_WERROR=1 "$work/venv/bin/python" -m pip install -q --no-cache-dir "$work/src[test]"

# Find the built extension without importing it (it needs the preloaded runtime).
so="$(cd / && "$work/venv/bin/python" -I -c '
import glob, importlib.util, os
pkg = importlib.util.find_spec("prefetch").submodule_search_locations[0]
print(*glob.glob(os.path.join(pkg, "_core*.so")))')"
if ! grep -q __asan_init "$so" || ! grep -q __ubsan_handle "$so"; then
    echo "tests/sanitize.sh: $so is not built with -fsanitize=address,undefined" >&2
    exit 1
fi
if ! grep -q __assert_fail "$so"; then
    echo "tests/sanitize.sh: $so is built without its asserts (PREFETCH_DEBUG=1)" >&2
    exit 1
fi

asan_rt="$("$cc" -print-file-name=libasan.so)"
ubsan_rt="$("$cc" -print-file-name=libubsan.so)"
for rt in "$asan_rt" "$ubsan_rt"; do
    if [[ ! -e "$rt" ]]; then echo "tests/sanitize.sh: no sanitizer runtime $rt" >&2; exit 1; fi
done

# A child forked while another thread is inside ASan's allocator can wait forever on that
# allocator's lock in GCC 12's libasan (LLVM's runtime takes its locks around fork() only from
# LLVM 17, GCC 14): seen in CI as a child forked inside dataset[i] that never exited, stuck in
# __asan::AsanThread::Destroy -> SizeClassAllocator64::ReturnToAllocator -> Mutex::Lock, after our
# code had returned. The fork_with_threads tests run in every other lane; here only where the
# runtime is fork-safe.
marks="not stress"
if (( $("$cc" -dumpversion | cut -d. -f1) < 14 )); then marks="not stress and not fork_with_threads"; fi
if [[ $# -eq 0 ]]; then set -- -m "$marks" -k "not csrc_under"; fi
status=0
# -s: no output capture (conftest needs a real stderr for faulthandler), so a report the C runtime
# writes to fd 2 (UBSan's, or ASan's before it aborts) reaches the log even when it
# kills the pytest process itself. Subprocess cases capture their children's stderr
# and fail on their exit status; ASan also writes every report to logs/asan.<pid>.
(
    cd "$root"
    export PYTHONMALLOC=malloc
    export ASAN_OPTIONS="detect_leaks=0:halt_on_error=1:allocator_may_return_null=1:log_path=$work/logs/asan"
    export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1${PREFETCH_UBSAN_SUPPRESSIONS:+:suppressions=$PREFETCH_UBSAN_SUPPRESSIONS}"
    export LD_PRELOAD="$asan_rt $ubsan_rt"
    "$work/venv/bin/pytest" -c "$root/pyproject.toml" --rootdir "$root" "$root/tests" \
        -s --timeout=240 "$@" 2>&1 | tee "$work/pytest.log"
) || status=$?

if grep -qE "runtime error:|ERROR: AddressSanitizer|ERROR: LeakSanitizer|SUMMARY: (Address|Undefined)|Assertion .* failed" \
        "$work/pytest.log"; then
    echo "tests/sanitize.sh: sanitizer reports or failed asserts in $work/pytest.log" >&2
    status=1
fi
for f in "$work"/logs/*; do
    [[ -e "$f" ]] || continue
    echo "--- $f" >&2; cat "$f" >&2
    # allocator_may_return_null still logs a WARNING for each refused allocation: not an error.
    if grep -qE "ERROR|runtime error:" "$f"; then status=1; fi
done
if [[ $status -ne 0 ]]; then
    echo "tests/sanitize.sh: FAILED" >&2
    exit "$status"
fi
echo "tests/sanitize.sh: passed (ASan+UBSan, debug asserts on, no reports)" >&2
