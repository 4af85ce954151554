"""Shared fixtures: every test must leave no thread behind, and must fail
rather than hang (pytest-timeout, set in pyproject.toml, plus faulthandler)."""
import faulthandler
import gc
import os
import random
import signal
import sys
import threading

import pytest

faulthandler.enable()


@pytest.fixture(autouse=True)
def no_leaks():
    """SPEC §5: after each test no thread, core, pool, block or copy helper
    outlives its prefetcher (the counters come from the compiled core)."""
    from prefetch._ring import _live_counts

    gc.collect()
    threads_before = set(threading.enumerate())
    counts_before = _live_counts()
    yield
    gc.collect()
    leaked = [t for t in threading.enumerate() if t not in threads_before and t.is_alive()]
    for t in leaked:
        t.join(5)  # a close() that returned has already stopped it; this only bounds a failure
    leaked = [t.name for t in leaked if t.is_alive()]
    assert not leaked, f"threads left running: {leaked}"
    gc.collect()
    assert _live_counts() == counts_before


class Rand(random.Random):
    """A seeded Random whose repr shows the seed, so a failure can be replayed
    with PREFETCH_SEED=<seed>."""

    def __init__(self, seed):
        super().__init__(seed)
        self.seed_value = seed

    def __repr__(self):
        return f"Rand(seed={self.seed_value})"


@pytest.fixture
def rand():
    seed = int(os.environ.get("PREFETCH_SEED", random.randrange(2**32)))
    print(f"PREFETCH_SEED={seed}", file=sys.stderr)
    return Rand(seed)


def run_python(code, timeout=60, env=None):
    """Run `code` in a fresh interpreter; returns CompletedProcess (text)."""
    import subprocess
    import tempfile
    full_env = dict(os.environ, PYTHONFAULTHANDLER="1", **(env or {}))
    # Not the checkout: its prefetch/ has no compiled core when installed non-editable.
    # A session of its own, so a timeout kills forked grandchildren too.
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=full_env, cwd=tempfile.gettempdir(), start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
