"""The C in csrc/ alone (no Python.h), under ThreadSanitizer and ASan+UBSan:
single-thread ring/pool semantics plus a multi-threaded producer/consumer/
returner fuzz with split copies (csrc/test_pf.c). The ASan+UBSan build is
also the debug build (PF_DEBUG asserts on), so both builds are checked; and
the debug build must abort on misuse of the ring (SPEC §4: nothing is lost
or handed out twice; issue 9: real asserts)."""
import os
import pathlib
import random
import signal
import subprocess

import pytest

CSRC = pathlib.Path(__file__).resolve().parents[2] / "csrc"
SOURCES = ["test_pf.c", "pf_sync.c", "pf_ring.c", "pf_pool.c", "pf_copy.c"]


DEBUG = ["-DPF_DEBUG=1", "-UNDEBUG"]


def build(tmp_path, sanitizer, extra=()):
    exe = tmp_path / f"test_pf_{sanitizer.replace(',', '_')}"
    cc = os.environ.get("CC", "gcc")
    r = subprocess.run([cc, "-std=c11", "-O1", "-g", "-Wall", "-Wextra", "-Werror", "-pthread",
                        f"-fsanitize={sanitizer}", "-fno-omit-frame-pointer", "-fno-sanitize-recover=all",
                        *extra, "-o", str(exe), *[str(CSRC / s) for s in SOURCES]],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return exe


def build_and_run(tmp_path, sanitizer, iterations, extra=()):
    exe = build(tmp_path, sanitizer, extra)
    seed = int(os.environ.get("PREFETCH_SEED", random.randrange(1, 2**32)))
    env = dict(os.environ, TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1",
               ASAN_OPTIONS="detect_leaks=1:halt_on_error=1", UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1")
    env.pop("LD_PRELOAD", None)
    r = subprocess.run([str(exe), str(iterations), str(seed)], capture_output=True, text=True,
                       timeout=240, env=env)
    assert r.returncode == 0 and "test_pf: ok" in r.stdout, f"seed={seed}\n{r.stdout}\n{r.stderr}"
    assert "WARNING: ThreadSanitizer" not in r.stderr and "runtime error" not in r.stderr, r.stderr


@pytest.mark.timeout(300)
@pytest.mark.full
def test_csrc_under_thread_sanitizer(tmp_path):
    build_and_run(tmp_path, "thread", 3000)


@pytest.mark.timeout(300)
@pytest.mark.full
def test_csrc_under_address_and_undefined_sanitizers(tmp_path):
    build_and_run(tmp_path, "address,undefined", 20000, DEBUG)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("misuse", ["release-without-acquire", "publish-without-reserve", "two-consumers"])
@pytest.mark.full
def test_csrc_debug_build_asserts_on_ring_misuse(tmp_path, misuse):
    exe = build(tmp_path, "undefined", DEBUG)
    r = subprocess.run([str(exe), "misuse", misuse], capture_output=True, text=True, timeout=60)
    assert r.returncode == -signal.SIGABRT and "Assertion" in r.stderr, (r.returncode, r.stdout, r.stderr)


def test_csrc_has_no_python_dependency():
    """The core C compiles standalone: no Python.h, no PyObject."""
    for name in SOURCES + ["pf_sync.h", "pf_ring.h", "pf_pool.h", "pf_copy.h"]:
        text = (CSRC / name).read_text()
        assert "Python.h" not in text and "PyObject" not in text, name
