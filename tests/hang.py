"""The harness of the never-hang tests (SPEC §2, §4): each case runs in its
own interpreter (its own process group) under a hard timeout, so a hang fails
the test instead of the run. PRELUDE gives every case the helpers that tell
when a thread waits inside next(), by watching its frame, never by sleeping.
"""
import os
import select
import signal
import subprocess
import sys
import tempfile
import textwrap

import pytest

HARD_TIMEOUT = 45   # below pytest-timeout's 60 s, so this test reports the hang itself

PRELUDE = textwrap.dedent("""
    import gc, os, signal, sys, threading, warnings
    import numpy as np
    from prefetch import ClosedError, Prefetcher
    # CPython 3.12+ warns about fork() in a threaded process; forking is the point here.
    warnings.filterwarnings("ignore", "This process .* is multi-threaded", DeprecationWarning)
    MAIN = threading.main_thread().ident

    def next_(p):
        # next(p) inside a Python frame of its own: Prefetcher.__next__ may be C and
        # show no frame, so this frame is what tells that a thread waits in next().
        return next(p)

    def blocked_in_next(ident=MAIN):
        frame = sys._current_frames().get(ident)
        return frame is not None and frame.f_code.co_name == "next_"

    def in_join(ident=MAIN):
        # Thread `ident` joins a thread (close() joining the worker): Thread.join's
        # frames are its innermost.
        frame = sys._current_frames().get(ident)
        return frame is not None and frame.f_code.co_name in ("join", "_wait_for_tstate_lock")

    def when_blocked(action, ident=MAIN):
        # Run action() on a helper thread once thread `ident` waits inside next().
        def run():
            while not blocked_in_next(ident):
                threading.Event().wait(0.001)
            action()
        t = threading.Thread(target=run, daemon=True)
        t.start()
        return t

    class Stuck:
        # Yields `ready` batches, then blocks in next() until `release` is set (maybe never).
        def __init__(self, ready=0, then=()):
            self.ready, self.then = ready, list(then)
            self.entered, self.release = threading.Event(), threading.Event()
        def __iter__(self):
            for i in range(self.ready):
                yield np.full(3, i)
            self.entered.set()
            self.release.wait()
            yield from self.then
""")


def spawn(code):
    env = dict(os.environ, PYTHONFAULTHANDLER="1")
    # stderr goes to a file, not a pipe: a child that writes a lot there (a sanitizer
    # report, say) must not block while the test reads its stdout line by line.
    err = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen([sys.executable, "-c", PRELUDE + textwrap.dedent(code)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err,
                            text=True, env=env, cwd=tempfile.gettempdir(), start_new_session=True)
    proc.err_file = err
    return proc


def finish(proc, timeout=HARD_TIMEOUT):
    """Wait for `proc`; on a hang kill its whole process group (forked children too) and fail."""
    try:
        out, _ = proc.communicate(timeout=timeout)
        hung = False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        hung = True
    with proc.err_file as f:
        f.seek(0)
        err = f.read()
    if hung:
        pytest.fail(f"hung for {timeout} s (killed)\n--- stdout\n{out}\n--- stderr\n{err}")
    return proc.returncode, out, err


def run_case(code, timeout=HARD_TIMEOUT):
    return finish(spawn(code), timeout)


def assert_ok(result, stdout):
    rc, out, err = result
    assert rc == 0, f"rc={rc}\n--- stdout\n{out}\n--- stderr\n{err}"
    assert out.split() == stdout.split(), f"--- stdout\n{out}\n--- stderr\n{err}"
    assert "Fatal Python error" not in err and "Sanitizer" not in err, err
    return err


def sigint_when_ready(proc, marker="blocked"):
    """Send a real SIGINT to `proc` once it prints `marker` (its consumer is in next())."""
    ready, _, _ = select.select([proc.stdout], [], [], HARD_TIMEOUT)
    if not ready:   # never got there: kill it here, or it would outlive the test
        os.killpg(proc.pid, signal.SIGKILL)
    line = proc.stdout.readline() if ready else ""
    if line.strip() != marker:
        rc, out, err = finish(proc)
        pytest.fail(f"no {marker!r} line: rc={rc}\n--- stdout\n{line}{out}\n--- stderr\n{err}")
    proc.send_signal(signal.SIGINT)
