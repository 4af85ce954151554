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

from support import GIL_BOUND, Rand, ScriptedMeter

faulthandler.enable()

# The Ctrl-C tests (SPEC §4) need Python's own SIGINT handler, here and in the
# processes they start. A shell starts a background job (`bash tests/run.sh &`,
# nohup, a CI step) with SIGINT ignored, and Python then leaves it ignored:
# interrupt_main() does nothing and a real SIGINT never arrives, so those tests
# hung until their timeout. A child started from here inherits the default.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_finish(session):
    """What collection imported (numpy, torch, mxnet: some 170 000 objects with torch) is moved
    out of the garbage collector's reach: no_leaks' gc.collect() then runs over what each test
    made, in microseconds rather than 50-100 ms a call (two a test, some 0.5 s a test under load),
    and still frees all of that."""
    gc.freeze()


@pytest.fixture(autouse=True)
def no_leaks():
    """SPEC §5: after each test no thread, core, pool, block or copy helper
    outlives its prefetcher (the counters come from the compiled core)."""
    from prefetch._core import _live_counts

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


@pytest.fixture
def gil_bound(monkeypatch):
    """Loaders made in the test measure a GIL-bound dataset[i] on 2 CPUs: the
    GIL gauge's meter is scripted, so the verdict is the test's whatever
    else the machine runs."""
    import prefetch._core as core

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(core, "_METER", ScriptedMeter(GIL_BOUND))


@pytest.fixture
def rand():
    seed = int(os.environ.get("PREFETCH_SEED", random.randrange(2**32)))
    print(f"PREFETCH_SEED={seed}", file=sys.stderr)
    return Rand(seed)
