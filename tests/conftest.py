"""Shared fixtures: every test must leave no thread behind, and must fail
rather than hang (pytest-timeout, set in pyproject.toml, plus faulthandler)."""
import faulthandler
import gc
import os
import random
import sys
import threading

import pytest

from support import Rand

faulthandler.enable()


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
def rand():
    seed = int(os.environ.get("PREFETCH_SEED", random.randrange(2**32)))
    print(f"PREFETCH_SEED={seed}", file=sys.stderr)
    return Rand(seed)
